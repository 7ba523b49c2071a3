"""Multi-domain summarisation clients for AdaFedSelectKD and its baselines (Feng et al.), on offline
stand-ins.

The paper adapts a pre-trained summariser (BART) to meeting domains with adapters in its top decoder
layers, everything else frozen. Here (stand-ins, stated in docs/results/adafedselectkd.md):

* the summariser is the BERT2BERT generator of `nlp_models.seq2seq` (frozen MiniLM encoder, 2-layer
  decoder warm-started from MiniLM, pointer-generator copy mixture), *pre-trained* on headline
  generation over the BBC topics that no client holds (sport, entertainment: public data), then frozen;
* the domains are the other three BBC topics (business, politics, tech; the paper's academic,
  committee and product meetings), the task "headline from article body";
* the fourth, very different client of the extreme setting (the paper adds SAMSum, chat dialogues) is
  tweets with their annotated entity mentions as target ("the entities this tweet is about"): a
  different register (informal, short, noisy) and a different output (a list of names, not a
  headline), the most distant generation task the offline corpora give.

Settings (Sec. IV-A): 'non_iid' (client k holds domain k, sizes as the corpus has them), 'iid_balanced'
(each client a third of every domain), 'non_iid_balanced' (one domain each, equal counts), 'extreme'
(non_iid plus the tweets client). Each client splits its rows 60/20/20 (train/validation/test).

Adapters follow the paper: Houlsby bottlenecks (down-projection, ReLU, up-projection, residual, the
block's LayerNorm) in the top `adapter_layers` decoder layers; the set named LOCAL is the client's
summariser (trained, evaluated); distillation clients add GLOBAL, the frozen teacher that receives the
server's parameters. Client optimiser: AdamW, weight decay 0.01, batch 16 (the paper's); lr 3e-3, not the paper's 2e-4
(see `SummarySettings.lr`); its lifetime and the round reported are the declared protocol's
(`fl_algorithms.experiments.summarization_grid.summary_protocol`, passed as `make_trainer(..., protocol=)`).
"""
from __future__ import annotations

import hashlib
import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from fl_algorithms.algorithms.adafedselectkd import ADAPTER_PART, GLOBAL, LOCAL
from fl_algorithms.choices import SUMMARY_LR, SUMMARY_SETTINGS
from fl_algorithms.experiments.parallel import file_lock
from fl_algorithms.tasks.seq2seq import HeadlineBatch, HeadlineSplit, encode_headlines, headline_loss, headline_metrics
from fl_algorithms.training.loop import run_epochs, seeded, sequence_seed, tagged_seed
from fl_algorithms.training.protocol import TrainingProtocol
from fl_algorithms.training.trainer import OptimizerConfig, SeededTorchTrainer, flatten
from nlp_models.adapters import AdapterConfig, active, flatten_set, load_set_, set_mixing, set_parameters, set_trainable_sets
from nlp_models.data.headlines import HeadlineCorpus, load_bbc_headlines
from nlp_models.data.partition import Partition, client_splits
from nlp_models.seq2seq import Seq2SeqConfig, Seq2SeqModel, client_seq2seq, special_ids, warm_decoder

DOMAINS = ("business", "politics", "tech")
"""The clients' domains (BBC topics), standing in for the paper's academic, committee and product meetings."""
PUBLIC_DOMAINS = ("sports", "entertainment")
"""BBC topics no client holds: the generator is pre-trained on them (the paper's pre-trained BART)."""
EXTREME_DOMAIN = "tweets"
SETTINGS = SUMMARY_SETTINGS
EVAL_BATCH = 64


@dataclass(frozen=True)
class SummarySettings:
    """The data setting, the generator's shape, the adapters and the optimisers."""

    setting: str = "non_iid"
    fraction: float = 1.0
    """Share of each domain's articles used (a seeded subset; the quick run uses less)."""
    extreme_examples: int = 400
    """Tweets (with at least one entity) the extreme setting's fourth client holds, before scaling by `fraction`."""
    max_source: int = 64
    max_target: int = 16
    decoder_layers: int = 2
    adapter_layers: int = 1
    """Top decoder layers that carry the adapters (the paper: the top decoder layers only)."""
    bottleneck: int = 64
    batch_size: int = 16
    lr: float = SUMMARY_LR
    """The paper's 2e-4 barely moves the adapters in the few epochs a CPU run has (validation ROUGE-L
    after 5 local epochs, 30% of the data, mean of 3 clients: 1e-3 0.142, 3e-3 0.151, from 0.121)."""
    weight_decay: float = 0.01
    pretrain_examples: int | None = None
    """Public (sports, entertainment) articles the generator is pre-trained on; None: all 897."""
    pretrain_epochs: int = 8
    pretrain_lr: float = 5e-4
    seed: int = 0
    pretrain_seed: int | None = None
    """Seed of the generator's pre-training (its public articles' order, the decoder's warm start, the
    batches); None: `seed`, a generator per seed (every run before 2026-11-29). A fixed value shares one
    pre-trained generator across seeds, as the paper's one public BART serves all its runs (Sec. IV-D,
    V-B: 'averaged over three random runs, with data randomly re-selected for each run'), so that seeds
    vary the clients' data and training only."""

    def __post_init__(self) -> None:
        checks = [
            (self.setting in SETTINGS, f"setting must be one of {', '.join(SETTINGS)}, got {self.setting!r}"),
            (0 < self.fraction <= 1, "fraction must be in (0, 1]"),
            (self.extreme_examples >= 10, "extreme_examples must be at least 10"),
            (1 <= self.adapter_layers <= self.decoder_layers, f"adapter_layers must be in 1..{self.decoder_layers}"),
            (self.bottleneck >= 1 and self.batch_size >= 1, "bottleneck and batch_size must be positive"),
            (self.lr > 0 and self.pretrain_lr > 0 and self.weight_decay >= 0, "learning rates must be positive"),
            (self.pretrain_examples is None or self.pretrain_examples >= 10, "pretrain_examples must be at least 10"),
            (self.pretrain_epochs >= 1 and self.seed >= 0, "pretrain_epochs >= 1 and seed >= 0"),
            (self.pretrain_seed is None or self.pretrain_seed >= 0, "pretrain_seed must be None or >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    def generator_config(self, **changes: Any) -> Seq2SeqConfig:
        return Seq2SeqConfig(decoder_layers=self.decoder_layers, max_source=self.max_source,
                             max_target=self.max_target, adapter_layers=self.adapter_layers, seed=self.seed, **changes)

    @property
    def generator_seed(self) -> int:
        """The seed the generator is pre-trained with: `pretrain_seed`, else `seed`."""
        return self.seed if self.pretrain_seed is None else self.pretrain_seed

    def pretraining_key(self, backbone: str) -> str:
        """What the pre-trained generator depends on, hashed: its cache file's name (the same for a seed's
        own generator and for another seed's run that borrows it through `pretrain_seed`)."""
        fields = {k: v for k, v in asdict(self).items() if k in ("max_source", "max_target", "decoder_layers",
                                                                  "pretrain_examples", "pretrain_epochs",
                                                                  "pretrain_lr")}
        fields["seed"] = self.generator_seed
        return hashlib.sha256(json.dumps({**fields, "backbone": backbone}, sort_keys=True).encode()).hexdigest()[:16]


def entity_spans(words: Sequence[str], tags: Sequence[str]) -> list[str]:
    """The entity mentions of one BIO-tagged sentence, in order (an I- tag without a B- opens a span)."""
    spans, current = [], []
    for word, tag in zip(words, tags, strict=True):
        if tag.startswith("B-") or (tag.startswith("I-") and not current):
            if current:
                spans.append(" ".join(current))
            current = [word]
        elif tag.startswith("I-"):
            current.append(word)
        else:
            if current:
                spans.append(" ".join(current))
            current = []
    if current:
        spans.append(" ".join(current))
    return spans


def entity_summaries(*, max_examples: int, seed: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(tweets, targets): tweets with at least one annotated entity, the target their entity mentions
    in order, joined by ' , ' (a seeded random subset of `max_examples`)."""
    from nlp_models.data.loaders import load_tweets_ner

    data = load_tweets_ner()
    texts, targets = [], []
    for words, tags in zip(data.words, data.labels):
        words = [html.unescape(w) for w in words]  # the corpus keeps HTML entities (&quot;, &amp;)
        spans = entity_spans(words, [data.label_names[t] for t in tags])
        if spans:
            texts.append(" ".join(words))
            targets.append(" , ".join(spans))
    keep = np.sort(np.random.default_rng(seed).permutation(len(texts))[:max_examples])
    return tuple(texts[i] for i in keep), tuple(targets[i] for i in keep)


def domain_corpus(settings: SummarySettings) -> HeadlineCorpus:
    """The clients' articles (the three domains; the tweets as a fourth 'topic' in the extreme setting),
    a seeded `fraction` of each domain."""
    news = load_bbc_headlines(topics=DOMAINS, seed=settings.seed)
    rng = np.random.default_rng(tagged_seed(settings.seed, "domains"))
    rows = []
    for d in range(len(DOMAINS)):
        members = np.flatnonzero(news.topic_array() == d)
        rows += sorted(rng.permutation(members)[:max(int(round(settings.fraction * len(members))), 10)].tolist())
    news = news.subset(rows)
    if settings.setting != "extreme":
        return news
    tweets, targets = entity_summaries(max_examples=max(int(round(settings.fraction * settings.extreme_examples)), 10),
                                       seed=settings.seed)
    return HeadlineCorpus(news.bodies + tweets, news.headlines + targets,
                          news.topics + (len(DOMAINS),) * len(tweets), DOMAINS + (EXTREME_DOMAIN,))


def domain_partition(corpus: HeadlineCorpus, *, setting: str, seed: int) -> tuple[HeadlineCorpus, Partition]:
    """The clients of `setting` (deterministic by seed): the rows of `corpus` they hold (the balanced
    settings leave some out) and their partition over those rows; client keys name the domains."""
    topics = corpus.topic_array()
    domains = [np.flatnonzero(topics == d) for d in range(len(corpus.topic_names))]
    rng = np.random.default_rng(tagged_seed(seed, setting))
    if setting in ("non_iid", "extreme"):
        clients, keys = domains, corpus.topic_names
    elif setting == "non_iid_balanced":
        size = min(len(d) for d in domains)
        clients, keys = [np.sort(rng.permutation(d)[:size]) for d in domains], corpus.topic_names
    elif setting == "iid_balanced":
        thirds = [np.array_split(rng.permutation(d)[:len(d) - len(d) % len(domains)], len(domains)) for d in domains]
        clients = [np.sort(np.concatenate([parts[k] for parts in thirds])) for k in range(len(domains))]
        keys = tuple(f"mixed{k + 1}" for k in range(len(domains)))
    else:
        raise ValueError(f"setting must be one of {', '.join(SETTINGS)}, got {setting!r}")
    used = np.sort(np.concatenate(clients))
    position = {int(row): i for i, row in enumerate(used)}
    partition = Partition(clients=tuple(np.asarray([position[int(r)] for r in c], dtype=np.int64) for c in clients),
                          n=len(used), method=setting, keys=tuple(keys))
    return corpus.subset(used), partition


class SummaryTrainer(SeededTorchTrainer):
    """One client's summariser: the frozen pre-trained generator with adapter sets in its top decoder
    layers. LOCAL trains and is what `evaluate` and `get_shared` use; GLOBAL, when present, is the
    frozen teacher of the distillation objective (`AdaFedSelectKD`'s `DistillTrainer`).

    `evaluated[split]` is the LOCAL adapter of the last evaluation of `split`: the model that score
    belongs to, whoever loaded it (A_l, the server's adapter, the client's own), so that best-round
    selection can keep exactly the model a round's validation score measured."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.evaluated: dict[str, np.ndarray] = {}

    def evaluate(self, *, split: str = "test") -> dict[str, float]:
        metrics = super().evaluate(split=split)
        self.evaluated[split] = self.adapter_vector(LOCAL)
        return metrics

    def adapter_vector(self, name: str) -> np.ndarray:
        return flatten_set(self.model.decoder, name)

    def load_adapter_set(self, name: str, vector: np.ndarray) -> None:
        load_set_(self.model.decoder, name, vector)

    def adapter_log_probs(self, batch: HeadlineBatch, *, adapter: str) -> torch.Tensor:
        with active(self.model.decoder, {adapter: 1.0}):
            return self.model.log_probs(batch.source, batch.source_mask, batch.target, source_ids=batch.source_ids)

    @staticmethod
    def targets(batch: HeadlineBatch) -> torch.Tensor:
        return batch.target

    def fit(self, *, epochs: int, objective: Any, round: int | None = None) -> dict[str, float]:
        """Local epochs minimising `objective(self, batch)` (seeded like `train`)."""
        with seeded(sequence_seed(self.seed, self.client_id, self.calls)):
            self.calls += 1
            self.model.train()
            return run_epochs(batches=self.train_batches, loss=lambda batch: objective(self, batch),
                              optimizer=self.round_optimizer(), epochs=epochs, protocol=self.protocol)


class SummaryClients:
    """The clients of one setting: corpus, partition, 60/20/20 splits, the pre-trained generator (cached
    on disk under `cache_dir`), and each client's trainer with one adapter (AdaFedAvg, Local,
    AdaCentralized) or two (AdaFedSelectKD, AdaFedKD)."""

    def __init__(self, settings: SummarySettings, *, backbone: str = "minilm", device: str = "cpu",
                 cache_dir: str | Path | None = None, progress: bool = False) -> None:
        from nlp_models.device import resolve_device

        self.settings, self.backbone_name = settings, backbone
        self.device = resolve_device(device)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.progress = progress
        self._data: dict[int, dict[str, HeadlineSplit]] = {}
        self.pretraining: dict[str, float] = {}

    @cached_property
    def backbone(self) -> tuple[nn.Module, Any]:
        from fl_algorithms.tasks.fednlp import load_named_backbone

        model, tokenizer = load_named_backbone(self.backbone_name, hf=True)  # EncoderDecoderModel needs transformers' BERT
        return model.requires_grad_(False).to(self.device), tokenizer

    @cached_property
    def _held(self) -> tuple[HeadlineCorpus, Partition]:
        return domain_partition(domain_corpus(self.settings), setting=self.settings.setting, seed=self.settings.seed)

    @property
    def corpus(self) -> HeadlineCorpus:
        """The rows some client holds."""
        return self._held[0]

    @property
    def partition(self) -> Partition:
        return self._held[1]

    @cached_property
    def splits(self):
        return client_splits(self.partition, seed=self.settings.seed)

    @property
    def num_clients(self) -> int:
        return len(self.partition.clients)

    @property
    def client_names(self) -> tuple[str, ...]:
        return tuple(self.partition.keys)

    def train_sizes(self) -> list[int]:
        return [len(split.train) for split in self.splits]

    def client_data(self, client_id: int) -> dict[str, HeadlineSplit]:
        """Client `client_id`'s splits, encoded once by the frozen encoder."""
        if not 1 <= client_id <= self.num_clients:
            raise ValueError(f"client id {client_id} is not in 1..{self.num_clients}")
        if client_id not in self._data:
            split = self.splits[client_id - 1]
            self._data[client_id] = {name: self._encode(getattr(split, name)) for name in ("train", "validation", "test")}
        return self._data[client_id]

    def _encode(self, rows: Sequence[int]) -> HeadlineSplit:
        encoder, tokenizer = self.backbone
        return encode_headlines(encoder, tokenizer, [self.corpus.bodies[i] for i in rows],
                                [self.corpus.headlines[i] for i in rows],
                                config=self.settings.generator_config(), device=self.device)

    # ---- the pre-trained generator -----------------------------------------------------------
    @cached_property
    def pretrained(self) -> dict[str, dict[str, torch.Tensor]]:
        """The generator's decoder and copy gate after pre-training on the public topics (from the
        cache when one is there)."""
        if self.cache_dir is None:
            state, self.pretraining = self._pretrain()
            return state
        path = self.cache_dir / f"generator-{self.settings.pretraining_key(self.backbone_name)}.pt"
        with file_lock(path.with_suffix(".lock")):  # grid workers wait for the first one's pre-training
            if path.exists():
                blob = torch.load(path, map_location="cpu", weights_only=True)
                self.pretraining = {k: float(v) for k, v in blob["metrics"].items()}
                return {"decoder": blob["decoder"], "copy_gate": blob["copy_gate"]}
            print(f"pre-training the generator once; it is cached as {path}", flush=True)
            state, self.pretraining = self._pretrain()
            partial = path.with_suffix(".tmp")
            torch.save({**state, "metrics": self.pretraining}, partial)
            partial.replace(path)
        return state

    def _pretrain(self) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, float]]:
        s = replace(self.settings, seed=self.settings.generator_seed)
        encoder, tokenizer = self.backbone
        public = load_bbc_headlines(topics=PUBLIC_DOMAINS, max_examples=s.pretrain_examples, seed=s.seed)
        model = client_seq2seq(encoder, warm_decoder(encoder, layers=s.decoder_layers, seed=s.seed),
                               config=s.generator_config(train="decoder"), ids=special_ids(tokenizer)).to(self.device)
        data = encode_headlines(encoder, tokenizer, public.bodies, public.headlines, config=model.config,
                                device=self.device)
        optimizer = OptimizerConfig(name="adamw", lr=s.pretrain_lr).build(p for p in model.parameters() if p.requires_grad)
        losses = []
        with seeded(tagged_seed(s.seed, "pretrain")) as generator:
            model.train()
            for _ in tqdm(range(s.pretrain_epochs), desc="pre-train generator", disable=None if self.progress else True):
                order = torch.randperm(len(data), generator=generator)
                result = run_epochs(batches=lambda: data.batches(s.batch_size, order=order),
                                    loss=lambda batch: headline_loss(model, batch), optimizer=optimizer, epochs=1)
                losses.append(result["train_loss"])
        state = {"decoder": {k: v.detach().cpu().clone() for k, v in model.decoder.state_dict().items()},
                 "copy_gate": {k: v.detach().cpu().clone() for k, v in model.copy_gate.state_dict().items()}}
        return state, {"pretrain_examples": float(len(data)), "pretrain_loss": float(losses[-1])}

    @cached_property
    def template(self) -> nn.Module:
        """The pre-trained decoder every client copies."""
        s, encoder = self.settings, self.backbone[0]
        decoder = warm_decoder(encoder, layers=s.decoder_layers, seed=s.seed)
        decoder.load_state_dict(self.pretrained["decoder"])
        return decoder.to(self.device)

    # ---- clients -------------------------------------------------------------------------------
    def model(self, *, distill: bool) -> Seq2SeqModel:
        """A fresh client generator: frozen, with LOCAL (and GLOBAL when `distill`) ReLU adapters in
        its top decoder layers, LOCAL trainable and active."""
        s = self.settings
        names = (GLOBAL, LOCAL) if distill else (LOCAL,)
        adapter = AdapterConfig(bottleneck=s.bottleneck, activation="relu")
        config = s.generator_config(train="adapters", adapters={name: adapter for name in names})
        model = client_seq2seq(self.backbone[0], self.template, config=config, ids=special_ids(self.backbone[1]))
        model.copy_gate.load_state_dict(self.pretrained["copy_gate"])
        set_trainable_sets(model.decoder, (LOCAL,))
        set_mixing(model.decoder, {LOCAL: 1.0})
        return model.to(self.device)

    def _trainer(self, client_id: int, *, distill: bool, data: Mapping[str, HeadlineSplit],
                 evaluation: Mapping[str, HeadlineSplit], protocol: TrainingProtocol | None = None) -> SummaryTrainer:
        s, tokenizer = self.settings, self.backbone[1]
        model = self.model(distill=distill)
        names = {id(p): n for n, p in model.named_parameters()}
        train = data["train"]
        return SummaryTrainer(
            client_id=client_id, seed=s.seed, model=model,
            shared={ADAPTER_PART: [names[id(p)] for p in set_parameters(model.decoder, LOCAL)]},
            train_batches=lambda: train.batches(s.batch_size, order=torch.randperm(len(train))),
            eval_batches={name: (lambda d=split: d.batches(EVAL_BATCH)) for name, split in evaluation.items()},
            num_examples=len(train), loss_fn=headline_loss,
            metric_fn=lambda m, batches: headline_metrics(m, batches, tokenizer=tokenizer),
            optimizer=OptimizerConfig(name="adamw", lr=s.lr, weight_decay=s.weight_decay), protocol=protocol)

    def make_trainer(self, client_id: int, *, distill: bool, protocol: TrainingProtocol | None = None) -> SummaryTrainer:
        """Client `client_id` over its own articles; evaluates on 'validation' and 'test'. `protocol` says
        how it trains (None: AdamW at `settings.lr` and weight decay kept across rounds, as before
        protocols were declared; `summarization_grid.summary_protocol` builds the declared ones)."""
        data = self.client_data(client_id)
        return self._trainer(client_id, distill=distill, data=data,
                             evaluation={"validation": data["validation"], "test": data["test"]}, protocol=protocol)

    def pooled_trainer(self, *, protocol: TrainingProtocol | None = None) -> SummaryTrainer:
        """AdaCentralized: one adapter over every client's training rows; evaluates on each client's
        splits as 'validation_K' and 'test_K' (`protocol` as `make_trainer`)."""
        splits = self.splits
        train = self._encode(np.concatenate([split.train for split in splits]))
        evaluation = {}
        for k in range(1, self.num_clients + 1):
            data = self.client_data(k)
            evaluation |= {f"validation_{k}": data["validation"], f"test_{k}": data["test"]}
        return self._trainer(0, distill=False, data={"train": train}, evaluation=evaluation, protocol=protocol)

    def initial(self) -> dict[str, np.ndarray]:
        """A_g^0: the adapter every client's LOCAL set starts from (identity at initialisation)."""
        return {ADAPTER_PART: flatten(set_parameters(self.model(distill=False).decoder, LOCAL))}


__all__ = ["DOMAINS", "PUBLIC_DOMAINS", "EXTREME_DOMAIN", "SETTINGS", "SummarySettings", "entity_spans", "entity_summaries",
           "domain_corpus", "domain_partition", "SummaryTrainer", "SummaryClients"]
