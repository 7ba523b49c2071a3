"""Paper behaviours pinned by exact expectations, each computed independently in the test.

* FedMCP (Zhao et al. 2024, Sec. IV-B): a client predicts with its full model, the frozen backbone with
  h <- h + 1/2 A_g(h) + 1/2 A_p(h), and that model's own classifier g1 (the one of L_a, Eq. 3); not with
  the global adapter alone, nor with g2 (the classifier of L_b, Eq. 4).
* ATC (Sec. 3, Eq. 4): w_n^(t+1) = w_n^t + sum_{i in C+_n} |D_i| / |D_C+_n| Delta w_i^t, checked on two
  groups whose weighted sums are worked out by hand below.
* FedSeIT's SIT (Sec. 2, "Similar Task Identification"; the foreign adaptives' attention alpha of Eq. 2):
  top-K foreign tasks by their descriptors' average cosine score, alpha^0 = score / sum of the top-K
  scores (the public reference's `--et-init-alphas`), on distinct descriptors that give clearly
  non-uniform alphas, and those alphas reach the client's model.
* AdaFedSelectKD (Feng et al., Sec. III-C, Eqs. 6-8): the global adapter A_g is a parameter container
  that is never optimised: after a client's local training with the real summarisation trainer its
  parameters are bit-identical to the broadcast.

Every model here is random-init and tiny (no download, no tokenizer, no corpus).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from dp.centroids import CentroidConfig, DPCentroids
from dp.ledger import Ledger
from dp.sketches import DPSketcher, SketchConfig
from fl_algorithms.algorithms.adafedselectkd import (ADAPTER_PART, GLOBAL as KD_GLOBAL, LOCAL as KD_LOCAL, AdaFedKD,
                                                     AdaFedSelectKD)
from fl_algorithms.algorithms.atc import ATC, ATCConfig
from fl_algorithms.algorithms.fedmcp import GLOBAL, GLOBAL_PART, HEAD_FULL, HEAD_GLOBAL, PRIVATE
from fl_algorithms.algorithms.fedseit import FedSeIT, Schedule, pack_adaptive
from fl_algorithms.api import ClientBroadcast, ClientContext, Relayed
from fl_algorithms.engine.peer_channel import PeerChannel, PeerDirectory
from fl_algorithms.engine.secure_sum import SecureAggregationConfig
from fl_algorithms.engine.sim import RunConfig, SimulationRunner
from fl_algorithms.training.continual_trainer import BASE_PART
from nlp_models.backbone import tiny_bert
from nlp_models.decomposed_cnn import DecomposedConfig, DecomposedTextCNN

# ---- FedMCP: which adapters and which head a client predicts with -----------------------------------

FEDMCP_LABELS = 4


def _fedmcp_trainer() -> Any:
    """A FedMCP client (FEDMCP_MODEL) over a 2-layer random BERT, its test split of 24 cached prefixes."""
    from fl_algorithms.training.adapter_trainer import FEDMCP_MODEL, AdapterTrainer, TrainConfig
    from nlp_models.data.cross_task import ClientData
    from nlp_models.frozen_prefix import CachedSplit, build_prefix_cache

    backbone = tiny_bert(vocab_size=64, layers=2, hidden=16, heads=2).requires_grad_(False).eval()
    g = torch.Generator().manual_seed(0)

    def split(n: int) -> CachedSplit:
        ids = torch.randint(3, 64, (n, 8), generator=g)
        mask = torch.ones_like(ids)
        mask[::3, 5:] = 0
        cache = build_prefix_cache(backbone, ids, mask, split=1, progress=False)
        return CachedSplit(cache.hidden, cache.attention_mask, torch.zeros(n, dtype=torch.long))

    data = ClientData(client_id=1, key="toy", title="toy", num_labels=FEDMCP_LABELS, split_layer=1,
                      splits={"train": split(8), "validation": split(4), "test": split(24)})
    return AdapterTrainer(data=data, backbone=backbone, spec=FEDMCP_MODEL, bottleneck=4, head_hidden=None,
                          config=TrainConfig(batch_size=8), seed=0)


def test_fedmcp_predicts_with_the_full_model_and_its_own_classifier_g1() -> None:
    """FedMCP Sec. IV-B: the personalised client model is the full model, whose two adapters' outputs are
    averaged, h <- h + 1/2 A_g(h) + 1/2 A_p(h), with its classifier g1 (phi_a of Eq. 3, "the classifier in
    the local model"); g2 (phi_b of Eq. 4) serves the backbone with A_g alone, the L_b regulariser (Sec.
    IV-C). The paper states no separate inference path; `fedmcp.py` declares "clients predict with the
    full model and g1", and this pins it. With A_g, A_p and both heads set to known, distinguishable
    values (g2 = -g1), the test labels are the predictions of (full model, g1): `evaluate` must score
    exactly 1, while every other pairing (A_g with g1 or g2, A_p alone, the full model with g2, the two
    adapters summed without the 1/2) is first shown to disagree with those labels."""
    from nlp_models.frozen_prefix import CachedSplit

    trainer = _fedmcp_trainer()
    size = trainer.get_shared()[GLOBAL_PART].size
    rng = np.random.default_rng(7)
    trainer.load_adapter_set(GLOBAL, rng.normal(0.0, 0.6, size).astype(np.float32))    # known, distinct A_g
    trainer.load_adapter_set(PRIVATE, rng.normal(0.0, 0.6, size).astype(np.float32))   # and A_p
    model, test = trainer.model, trainer.data.splits["test"]
    model.eval()
    batch = test.batch(torch.arange(len(test)))

    @torch.no_grad()
    def logits(mixing: Mapping[str, float], head: str) -> torch.Tensor:
        return model.classify(head, model.represent(batch, mixing=mixing))

    with torch.no_grad():   # g1 reads the full model's z1 around its mean; g2 = -g1 votes the opposite way
        g1, g2 = model.heads[HEAD_FULL].classifier, model.heads[HEAD_GLOBAL].classifier
        g1.weight.copy_(torch.randn(g1.weight.shape, generator=torch.Generator().manual_seed(5)))
        g1.bias.copy_(-g1.weight @ model.represent(batch, mixing={GLOBAL: 0.5, PRIVATE: 0.5}).mean(0))
        g2.weight.copy_(-g1.weight)
        g2.bias.copy_(-g1.bias)
    full = logits({GLOBAL: 0.5, PRIVATE: 0.5}, HEAD_FULL)
    expected = full.argmax(-1)
    top2 = full.topk(2, dim=-1).values
    assert float((top2[:, 0] - top2[:, 1]).min()) > 1e-4            # no near-tie: batching cannot flip one
    assert len(set(expected.tolist())) > 1                           # the head does not predict a constant
    others = [({GLOBAL: 1.0}, HEAD_FULL), ({GLOBAL: 1.0}, HEAD_GLOBAL), ({PRIVATE: 1.0}, HEAD_FULL),
              ({GLOBAL: 0.5, PRIVATE: 0.5}, HEAD_GLOBAL), ({GLOBAL: 1.0, PRIVATE: 1.0}, HEAD_FULL)]
    for mixing, head in others:
        agreement = float((logits(mixing, head).argmax(-1) == expected).float().mean())
        assert agreement < 1.0, f"{mixing} with {head} predicts like the full model with g1: the test could not tell"
    trainer.data.splits["test"] = CachedSplit(test.hidden, test.attention_mask, expected)
    assert trainer.evaluate(split="test")["accuracy"] == 1.0


# ---- ATC: Eq. 4, the |D|-weighted group update of C+ -----------------------------------------------

# Two groups of three clients, each client's C+ is its own group ({n} + its top-2 neighbours).
# Client: (|D_i|, Delta w_i) -- every round's local training adds Delta w_i to the model it starts from.
ATC_CLIENTS: dict[int, tuple[int, tuple[float, float]]] = {
    1: (1, (1.0, 0.0)), 2: (3, (0.0, 2.0)), 3: (4, (-1.0, 1.0)),       # group A
    4: (2, (2.0, 2.0)), 5: (2, (0.0, -2.0)), 6: (4, (0.5, 1.0)),       # group B
}
ATC_START = (0.5, -0.5)
# Eq. 4 by hand:
#   A: sum |D_i| Delta_i = 1*(1, 0) + 3*(0, 2) + 4*(-1, 1) = (-3, 10);  |D_C+| = 8  ->  (-0.375, 1.25)
#   B: sum |D_i| Delta_i = 2*(2, 2) + 2*(0, -2) + 4*(0.5, 1) = (6, 4);  |D_C+| = 8  ->  (0.75, 0.5)
#   (the unweighted means would be (0, 1) and (0.8333, 0.3333))
#   w^3 = w^2 + update: A (0.125, 0.75), B (1.25, 0.0);  w^4 = w^3 + update: A (-0.25, 2.0), B (2.0, 0.5)
ATC_EXPECTED = {
    2: {"A": (0.125, 0.75), "B": (1.25, 0.0)},
    3: {"A": (-0.25, 2.0), "B": (2.0, 0.5)},
}


class ToyATCTrainer:
    """An ATC client whose local training adds its fixed Delta w to the model it starts from, and which
    records the models it started training from and was evaluated with."""

    def __init__(self, n: int, delta: Sequence[float]) -> None:
        self.num_examples = n
        self.delta = np.asarray(delta, dtype=np.float32)
        self.w = np.asarray(ATC_START, dtype=np.float32)
        self.public = SimpleNamespace(hidden=np.zeros((2, 3), dtype=np.float32))
        self.started: list[np.ndarray] = []
        self.evaluated: list[np.ndarray] = []

    def get_shared(self) -> dict[str, np.ndarray]:
        return {"w": self.w.copy()}

    def set_shared(self, params: Mapping[str, np.ndarray]) -> None:
        self.w = np.asarray(params["w"], dtype=np.float32).copy()

    def train(self, *, epochs: int, round: int | None = None, contrast: Any = None) -> dict[str, float]:
        self.started.append(self.w.copy())
        self.w = self.w + self.delta
        return {"steps": 1.0}

    def represent(self) -> np.ndarray:
        return np.full(6, 0.01 * self.num_examples, dtype=np.float32)

    def evaluate(self, *, split: str = "test") -> dict[str, float]:
        self.evaluated.append(self.w.copy())
        return {"accuracy": 0.0}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass


def test_atc_contrast_rounds_apply_eq_4_the_size_weighted_mean_update_of_c_plus() -> None:
    """ATC Sec. 3, Eq. 4: w_n^(t+1) = w_n^t + sum_{i in C+_n} |D_i| / |D_C+_n| Delta w_i^t. Two CONTRAST
    rounds over two groups of three (C+_n = {n} + N_n, N_n its two group mates), through the secure sums:
    the model each client is evaluated with after a round, and starts the next round from, is its previous
    model plus its group's |D|-weighted mean update, with the numbers worked out by hand above."""
    groups = {"A": (1, 2, 3), "B": (4, 5, 6)}
    near = {i: tuple(j for j in members if j != i) for members in groups.values() for i in members}
    far = {i: tuple(j for j in groups["B" if i in groups["A"] else "A"][:2]) for i in near}
    algorithm = ATC(ATCConfig(assign_rounds=1, clusters=1, sketch_dim=4, min_size=3, top_k=2),
                    sketcher=DPSketcher(SketchConfig(epsilon=1.0, sketch_dim=4), dim=6))
    trainers = {c: ToyATCTrainer(n, delta) for c, (n, delta) in ATC_CLIENTS.items()}
    secure = SecureAggregationConfig(protocol="plain", clip=8.0, max_weight=100.0, max_clients=6, min_release_group=3)
    runner = SimulationRunner(algorithm=algorithm, trainers=trainers,
                              config=RunConfig(rounds=3, sampler="seeded", secure=secure))
    runner.state = {**runner.state, "near": near, "far": far}   # as if round 1's sketches had ranked them
    for round in (2, 3):
        record = runner.run_round(round)
        assert {tuple(m) for name, m in record.sums.items() if name.startswith("a")} == set(groups.values())
        for name, members in groups.items():
            for c in members:
                np.testing.assert_allclose(trainers[c].evaluated[-1], ATC_EXPECTED[round][name], atol=1e-4,
                                           err_msg=f"client {c} after round {round}")
    for name, members in groups.items():   # round 3 started from round 2's w^3, not from the cluster model
        for c in members:
            np.testing.assert_allclose(trainers[c].started, [ATC_START, ATC_EXPECTED[2][name]], atol=1e-4)


# ---- FedSeIT: SIT's scores and the alphas they initialise -------------------------------------------

SIT_OWN = np.array([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
SIT_DESCRIPTORS = {
    "1:1": SIT_OWN,                                                       # the task being matched
    "1:2": SIT_OWN,                                                       # own future task: never a candidate
    "3:2": SIT_OWN,                                                       # not started yet: never a candidate
    "2:0": np.array([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]]),        # cosines 1, 0, 0, 1
    "3:0": np.array([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.0, 0.0]]),        # 1, 0, 0, 1/sqrt 2
    "1:0": np.array([[1.0, 0.0, 0.0, 0.5], [0.0, 0.0, 1.0, 0.0]]),        # 1/sqrt 1.25, 0, 0, 0
    "2:1": -SIT_OWN,                                                      # anti-parallel: ranked last
}


def _sit_score(a: np.ndarray, b: np.ndarray, threshold: float = 0.7) -> float:
    """The average over the n1 x n2 centre pairs of their cosine, counting a cosine only above
    `threshold` (written out pair by pair). On the candidates above every cosine is above 0.7 or
    exactly 0, so this is also the paper's plain average cosine."""
    total = 0.0
    for x in a:
        for y in b:
            cos = float(sum(p * q for p, q in zip(x, y)) / (math.sqrt(sum(p * p for p in x)) * math.sqrt(sum(q * q for q in y))))
            total += cos if cos > threshold else 0.0
    return total / (len(a) * len(b))


def _sit_expected(top_k: int = 3) -> list[tuple[int, int, float]]:
    scores = {(2, 0): _sit_score(SIT_OWN, SIT_DESCRIPTORS["2:0"]), (3, 0): _sit_score(SIT_OWN, SIT_DESCRIPTORS["3:0"]),
              (1, 0): _sit_score(SIT_OWN, SIT_DESCRIPTORS["1:0"]), (2, 1): _sit_score(SIT_OWN, SIT_DESCRIPTORS["2:1"])}
    assert scores[(2, 0)] == pytest.approx(0.5) and scores[(3, 0)] == pytest.approx((1 + 0.5 ** 0.5) / 4)
    assert scores[(1, 0)] == pytest.approx(1.25 ** -0.5 / 4) and scores[(2, 1)] == 0.0
    top = sorted(scores.items(), key=lambda kv: -kv[1])[:top_k]
    total = sum(s for _, s in top)
    return [(o, u, s / total) for (o, u), s in top]


def _fedseit(peers: PeerDirectory, *, run: str = "alpha") -> FedSeIT:
    descriptor = DPCentroids(CentroidConfig(epsilon=8.0, centres=2, iterations=2, projection_dim=4,
                                            max_centroid_noise=5.0), dim=4)
    return FedSeIT(schedule=Schedule(tasks=3, rounds_per_task=2), top_k=3, descriptor=descriptor, peers=peers, run=run)


def test_sit_alphas_are_the_normalised_scores_of_distinct_descriptors() -> None:
    """FedSeIT Sec. 2 (SIT): the server scores each started foreign task (and the client's own earlier
    ones) by the average cosine of the task descriptors' centres (the reference's rectified-linear form:
    cosines above 0.7), keeps the top K = 3, and their scores, divided by their sum, are the initial
    attention alphas of Eq. 2. The three kept scores are 0.5, 0.4268 and 0.2236: alphas 0.4346, 0.3710,
    0.1944, far from the uniform 1/3."""
    chosen = _fedseit(PeerDirectory.generate([1, 2, 3])[0]).select(client=1, task=1, descriptors=SIT_DESCRIPTORS,
                                                                   started=1, round=2)
    expected = _sit_expected()
    assert [(int(o), int(u)) for o, u, _ in chosen] == [(o, u) for o, u, _ in expected] == [(2, 0), (3, 0), (1, 0)]
    np.testing.assert_allclose([a for *_, a in chosen], [a for *_, a in expected], rtol=1e-9)
    np.testing.assert_allclose([a for *_, a in expected], [0.434638, 0.370986, 0.194376], atol=1e-6)
    assert max(a for *_, a in chosen) - min(a for *_, a in chosen) > 0.2


class ToyContinualTrainer:
    """A continual client with a real decomposed CNN (4 filters, 3 foreign slots) that does not train, so
    the alphas its model holds after a round are the ones it was given."""

    def __init__(self, client_id: int, keys: Any) -> None:
        embeddings = torch.randn(20, 6, generator=torch.Generator().manual_seed(client_id))
        self.model = DecomposedTextCNN(embeddings, DecomposedConfig(filters=4, mode="fedseit", foreign_slots=3,
                                                                    seed=client_id))
        self.keys, self.num_examples = keys, 10

    def start_task(self, task: int) -> None:
        for t in range(task + 1):
            if t not in self.model.task_ids:
                self.model.add_task(t, num_classes=2)
        self.model.set_task(task)

    def adaptive(self, task: int) -> dict[str, torch.Tensor]:
        return self.model.adaptive(task)

    def set_foreign(self, task: int, adaptives: Sequence[Mapping[str, torch.Tensor]], *,
                    alphas: Sequence[float] | None = None) -> None:
        self.model.set_foreign(task, adaptives, alphas=alphas)

    def get_shared(self) -> dict[str, np.ndarray]:
        return {BASE_PART: self.model.base_vector()}

    def set_shared(self, params: Mapping[str, np.ndarray]) -> None:
        self.model.load_base_vector(params[BASE_PART])

    def train(self, *, epochs: int, round: int | None = None, proximal: Any = None, mu: float = 0.0) -> dict[str, float]:
        return {}


def test_sit_alphas_reach_the_foreign_adaptives_attention_in_the_clients_model() -> None:
    """FedSeIT Eq. 2, z^_i = CNN(x, alpha_i A_i): client 1 receives SIT's three rows (two relayed foreign
    adaptives, sealed, and its own task 0), and after its round the model's alpha of slot k is the k-th
    normalised score (for every kernel), next to the adaptive of the k-th selected task."""
    directory, keys = PeerDirectory.generate([1, 2, 3])
    algorithm = _fedseit(directory)
    chosen = algorithm.select(client=1, task=1, descriptors=SIT_DESCRIPTORS, started=1, round=2)
    owners = {c: ToyContinualTrainer(c, keys[c]) for c in (1, 2, 3)}
    for trainer in owners.values():
        trainer.start_task(1)
    inbox = []
    for sender in (2, 3):   # owners seal A_(sender, 0) to client 1 in round 3; the server relays it unread
        channel = PeerChannel(client_id=sender, keys=keys[sender], directory=directory, run="alpha",
                              purpose="fcl-foreign-adaptive")
        sealed = channel.seal(receiver=1, round=3, plaintext=pack_adaptive(0, owners[sender].adaptive(0),
                                                                            owners[sender].model.kernel_names))
        inbox.append(Relayed(sender=sender, round=3, ciphertext=sealed.ciphertext))
    client = owners[1]
    broadcast = ClientBroadcast(round=4, common={BASE_PART: client.get_shared()[BASE_PART]},
                                own={"foreign": np.asarray(chosen, dtype=np.float32).ravel()}, inbox=tuple(inbox))
    context = ClientContext(client_id=1, state={}, trainer=client, round=4, releases=algorithm.releases,
                            ledger=Ledger())
    upload, state = algorithm.client_update(broadcast=broadcast, client=context)
    assert upload.metrics["relays_received"] == 2 and upload.metrics["relays_rejected"] == 0
    assert state["foreign_keys"] == {"1": [[2, 0], [3, 0], [1, 0]]}
    expected = _sit_expected()
    task = client.model.tasks["1"]
    for name in client.model.kernel_names:
        np.testing.assert_allclose(task.alpha[name].detach().numpy(), [a for *_, a in expected], rtol=1e-6)
        for slot, (owner, other, _) in enumerate(expected):
            torch.testing.assert_close(task.foreign(name)[slot], owners[owner].adaptive(other)[name])


# ---- AdaFedSelectKD: A_g is never optimised -----------------------------------------------------------

KD_VOCAB = 48


def _summary_trainer() -> Any:
    """The real AdaFedSelectKD client (`SummaryClients` builds its model and `SummaryTrainer`), over a
    random 1-layer BERT encoder and a decoder warm-started from it: nothing is downloaded or pre-trained."""
    from fl_algorithms.tasks.seq2seq import HeadlineSplit
    from fl_algorithms.tasks.summarization import SummaryClients, SummarySettings
    from nlp_models.seq2seq import encode_sources, warm_decoder

    settings = SummarySettings(decoder_layers=1, adapter_layers=1, bottleneck=4, batch_size=4, max_source=8,
                               max_target=4, lr=1e-2)
    encoder = tiny_bert(vocab_size=KD_VOCAB, layers=1, hidden=16, heads=2).requires_grad_(False).eval()
    clients = SummaryClients(settings, backbone="tiny")
    tokenizer = SimpleNamespace(cls_token_id=1, sep_token_id=2, pad_token_id=0)
    decoder = warm_decoder(encoder, layers=settings.decoder_layers, seed=settings.seed)
    gate = torch.nn.Linear(2 * encoder.config.hidden_size, 1)
    with torch.no_grad():   # a known copy gate: g = sigmoid(0) = 1/2 everywhere
        gate.weight.zero_()
        gate.bias.zero_()
    # what the cached properties would hold after loading the backbone and pre-training the generator
    clients.__dict__.update(backbone=(encoder, tokenizer),
                            pretrained={"decoder": decoder.state_dict(), "copy_gate": gate.state_dict()})
    g = torch.Generator().manual_seed(0)
    n = 8
    ids = torch.randint(3, KD_VOCAB, (n, 8), generator=g)
    mask = torch.ones_like(ids)
    mask[::2, 6:] = 0
    target = torch.randint(3, KD_VOCAB, (n, 4), generator=g)
    target[:, -1] = 2
    target[::3, 2:] = -100
    train = HeadlineSplit(encode_sources(encoder, ids, mask), mask, ids, target, ("",) * n)
    return clients._trainer(1, distill=True, data={"train": train}, evaluation={})


# The tiny teacher's token entropies lie in 3.2..3.4 nats (maximum ln 48 = 3.87): tau = 3.3 keeps some.
@pytest.mark.parametrize("algorithm", [AdaFedSelectKD(threshold=3.3), AdaFedKD()],
                         ids=["adafedselectkd", "adafedkd"])
def test_the_global_adapter_is_bit_identical_after_local_training_with_the_real_trainer(algorithm: AdaFedSelectKD
                                                                                        ) -> None:
    """AdaFedSelectKD Sec. III-B/C: the global adapter "is only responsible for passing parameters and will
    not be optimized"; only A_l minimises Eq. 8 (CE + lambda * selective KL from A_g's distribution,
    Eqs. 6-7). A client round with the real `SummaryTrainer` and the optimiser `SummaryClients` gives it
    leaves every tensor of A_g bit for bit as loaded from the broadcast, and every frozen weight as it was,
    while A_l moves."""
    trainer = _summary_trainer()
    initial = trainer.adapter_vector(KD_LOCAL)
    received = (initial + np.random.default_rng(3).normal(0.0, 0.3, initial.shape)).astype(np.float32)
    named = dict(trainer.model.named_parameters())
    teacher = [name for name in named if f".adapters.{KD_GLOBAL}." in name]
    backbone = {name: p.detach().clone() for name, p in named.items() if ".adapters." not in name}
    assert teacher and backbone
    at_fit: dict[str, torch.Tensor] = {}
    fit = trainer.fit

    def fit_from_the_loaded_teacher(**kwargs: Any) -> dict[str, float]:
        at_fit.update({name: named[name].detach().clone() for name in teacher})   # A_g as loaded this round
        return fit(**kwargs)

    trainer.fit = fit_from_the_loaded_teacher
    upload, state = algorithm.client_update(broadcast={ADAPTER_PART: received},
                                            client=ClientContext(client_id=1, state={KD_LOCAL: initial},
                                                                 trainer=trainer, round=1))
    assert set(at_fit) == set(teacher)
    for name in teacher:                                                    # A_g: every tensor, bit for bit
        assert named[name].dtype == at_fit[name].dtype and torch.equal(named[name], at_fit[name]), name
    after = trainer.adapter_vector(KD_GLOBAL)
    assert after.dtype == received.dtype and after.tobytes() == received.tobytes()     # = the broadcast
    for name, before in backbone.items():
        assert torch.equal(named[name], before), f"frozen weight {name} moved"
    assert not np.allclose(state[KD_LOCAL], initial, atol=1e-4)                        # A_l trained
    share = upload.metrics["kd_token_share"]                                           # distilling from A_g:
    assert share == 1.0 if algorithm.threshold is None else 0.0 < share < 1.0         # some tokens, or all
