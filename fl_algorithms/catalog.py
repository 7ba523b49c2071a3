"""What exists, by name, with one line each: algorithms, protocols, DP mechanisms, tasks, partitions.

`python -m fl_algorithms --list` prints it. Entries name an importable object as 'module:attr' and
are resolved lazily, so listing imports nothing heavy; `check()` (run by the tests) imports every
entry, so a renamed module cannot leave a stale line here.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    name: str
    target: str
    """'module:attribute' of the implementing object."""
    description: str

    def load(self):
        module, _, attr = self.target.partition(":")
        return getattr(importlib.import_module(module), attr)


ALGORITHMS = (
    Entry("fedavg", "fl_algorithms.algorithms.fedavg:FedAvg", "FedAvg (McMahan et al. 2017): weighted mean of client updates"),
    Entry("fedprox", "fl_algorithms.algorithms.fedprox:FedProx", "FedProx (Li et al. 2020): FedAvg with a proximal term mu/2 ||w - w_t||^2"),
    Entry("fedopt", "fl_algorithms.algorithms.fedopt:FedOpt", "FedOPT (Reddi et al. 2021): server SGD-momentum / Adagrad / Adam / Yogi on the mean update"),
    Entry("fedavgm", "fl_algorithms.algorithms.fedopt:FedAvgM", "FedAvgM (Hsu et al. 2019; FedNLP's FedOPT): server SGD with momentum on the mean update"),
    Entry("fedadagrad", "fl_algorithms.algorithms.fedopt:FedAdagrad", "FedAdagrad (Reddi et al. 2021): server Adagrad (with momentum) on the mean update"),
    Entry("fedadam", "fl_algorithms.algorithms.fedopt:FedAdam", "FedAdam (Reddi et al. 2021): server Adam (no bias correction) on the mean update"),
    Entry("fedyogi", "fl_algorithms.algorithms.fedopt:FedYogi", "FedYogi (Reddi et al. 2021): server Yogi on the mean update"),
    Entry("local", "fl_algorithms.algorithms.local:Local", "Local: every client trains alone; nothing leaves the client"),
    Entry("centralized", "fl_algorithms.algorithms.centralized:run_centralized", "Centralized: pooled data, one model (an upper reference, not FL)"),
    Entry("fedrep", "fl_algorithms.algorithms.fedrep:FedRep", "FedRep (Collins et al. 2021): shared representation, private head per client"),
    Entry("fedmcp", "fl_algorithms.algorithms.fedmcp:FedMCP", "FedMCP (Zhao et al. 2024): global + private adapters, CKA model-contrastive term"),
    Entry("moon", "fl_algorithms.algorithms.moon:MOON", "MOON (Li et al. 2021): FedAvg + model-contrastive term toward the global model"),
    Entry("ditto", "fl_algorithms.algorithms.ditto:Ditto", "Ditto (Li et al. 2021): FedAvg global model + a private personal model per client"),
    Entry("adafedselectkd", "fl_algorithms.algorithms.adafedselectkd:AdaFedSelectKD", "AdaFedSelectKD (Feng et al.): global + local adapters, KL from the global adapter where its entropy is low"),
    Entry("adafedkd", "fl_algorithms.algorithms.adafedselectkd:AdaFedKD", "AdaFedKD (Feng et al.): AdaFedSelectKD distilling on every target token"),
    Entry("fedseit", "fl_algorithms.algorithms.fedseit:FedSeIT", "FedSeIT + SIT (Chaudhary et al. 2022): continual; top-K foreign adaptives by DP task descriptors, relayed sealed"),
    Entry("fedweit", "fl_algorithms.algorithms.fedseit:FedWeIT", "FedWeIT (Yoon et al. 2021): continual; B = secure FedAvg, other clients' adaptives summed in the kernel"),
    Entry("fedavg_b", "fl_algorithms.algorithms.fedseit:ContinualFedAvg", "continual FedAvg on the decomposed CNN's shared B alone (FedSeIT's baseline)"),
    Entry("local_continual", "fl_algorithms.algorithms.fedseit:LocalContinual", "continual learning on each client alone (FedSeIT's baseline)"),
    Entry("atc_assign", "fl_algorithms.algorithms.atc_assign:SecureAssign", "ATC's ASSIGN aggregation (issue 13, part): per-cluster FedAvg, k-means on centred update sketches with private assignments"),
    Entry("group_fedavg", "fl_algorithms.algorithms.group_fedavg:GroupFedAvg", "one FedAvg model per public group (task/domain): per-group broadcasts and sums"),
)

PROTOCOLS = (
    Entry("plain", "secagg.protocols.plain:PlainServer", "insecure baseline: the server sees every input (same encoding and interface)"),
    Entry("secagg", "secagg.protocols.secagg:SecAggServer", "SecAgg (Bonawitz et al. 2017): pairwise masks over the complete graph, Shamir-shared seeds"),
    Entry("secagg+", "secagg.protocols.secagg:SecAggPlusServer", "SecAgg+ (Bell et al. 2020): masks over a random Harary graph, O(N log N) (default)"),
    Entry("lightsecagg", "secagg.protocols.lightsecagg:LightSecAggServer", "LightSecAgg (So et al. 2022): Lagrange-coded masks, one-shot reconstruction over F_p"),
)

DP_MECHANISMS = (
    Entry("dp-sgd", "dp.opacus_client:OpacusClient", "Opacus DP-SGD on each client: example-level DP, per-client accountant, ledger debits"),
    Entry("skellam", "dp.distributed:DistributedDPEncoder", "distributed DP, Skellam noise added by clients before masking (client-level, default)"),
    Entry("discrete-gaussian", "dp.distributed:DistributedDPEncoder", "distributed DP with discrete Gaussian noise (client-level)"),
    Entry("central", "dp.central:CentralDPAggregator", "central Gaussian DP (trusts the aggregator: infinite epsilon against the server)"),
    Entry("sketch", "dp.sketches:DPSketcher", "DP summaries (noisy means/sketches) a server may compare clients by"),
    Entry("centroids", "dp.centroids:DPCentroids", "DP spherical k-means centres of a client's documents (example-level; FedSeIT's task descriptors)"),
)

TASKS = (
    Entry("toy", "fl_algorithms.tasks.toy:build", "softmax regression on Gaussian blobs with label skew (tests, deploy smoke runs)"),
    Entry("fednlp-bbc", "fl_algorithms.tasks.fednlp:build", "FedNLP BBC topics, MiniLM + adapters; each client builds its own shard (deploy_cli --task)"),
    Entry("bbc-domain-headlines", "fl_algorithms.tasks.summarization:SummaryClients", "headline from body over BBC business/politics/tech (+ tweets -> entities), frozen pre-trained generator with adapters"),
    Entry("atc-hetero", "fl_algorithms.tasks.hetero:build_clients", "ATC's 18 heterogeneous clients (1/3/3/2/5/4): classification, tagging, cloze QA, headline generation"),
    Entry("continual-text", "fl_algorithms.tasks.continual:build_tasks", "FedSeIT's continual clients: seeded sequences of 5 binary tasks from a pool of 10 offline tasks"),
    Entry("bbc-topics", "nlp_models.data.loaders:load_bbc_news", "BBC News topic classification (5 classes), shipped offline"),
    Entry("rt-sentiment", "nlp_models.data.loaders:load_rt_sentiment", "Rotten Tomatoes sentiment, shipped offline"),
    Entry("rt-subjectivity", "nlp_models.data.loaders:load_rt_subjectivity", "Rotten Tomatoes plot vs review (subjectivity), shipped offline"),
    Entry("debates", "nlp_models.data.loaders:load_debates_2016", "2016 US presidential debates, party of the speaker, shipped offline"),
    Entry("tweets-ner", "nlp_models.data.loaders:load_tweets_ner", "tweets named entities (BIO tags), shipped offline"),
    Entry("own-csv", "nlp_models.data.own:load_classification", "your own classification data: CSV, JSONL or a datasets.save_to_disk folder"),
)

PARTITIONS = (
    Entry("iid", "nlp_models.data.partition:iid_partition", "uniformly random equal shards"),
    Entry("dirichlet-label", "nlp_models.data.partition:dirichlet_label_skew", "per-class Dirichlet(alpha) label skew (FedNLP)"),
    Entry("dirichlet-quantity", "nlp_models.data.partition:dirichlet_quantity_skew", "Dirichlet(beta) skew of shard sizes"),
    Entry("feature-cluster", "nlp_models.data.partition:feature_cluster_skew", "k-means clusters of sentence embeddings as clients (FedNLP)"),
    Entry("natural", "nlp_models.data.partition:natural_partition", "one client per natural group (speaker, source, ...)"),
)

SECTIONS = {"algorithms": ALGORITHMS, "secure-aggregation protocols": PROTOCOLS, "DP mechanisms": DP_MECHANISMS,
            "tasks": TASKS, "partitions": PARTITIONS}


def render() -> str:
    lines = []
    for title, entries in SECTIONS.items():
        lines.append(f"{title}:")
        width = max(len(e.name) for e in entries)
        lines += [f"  {e.name:<{width}}  {e.description}" for e in entries]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def check() -> list[str]:
    """Entries whose target does not import (empty when the catalog is current)."""
    bad = []
    for entries in SECTIONS.values():
        for e in entries:
            try:
                e.load()
            except (ImportError, AttributeError) as exc:
                bad.append(f"{e.name} -> {e.target}: {exc}")
    return bad
