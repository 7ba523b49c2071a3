"""Clients, models and trainers for examples/fedmcp_secure.py (importable without side effects).

Cross-task, cross-silo (FedMCP Sec. V-A): each client is one real offline corpus and its own task,
capped to the smallest client and split 6:2:2 into train / validation / test.

Reuse of frozen work. The backbone is frozen, so everything below the lowest adapter is the same for
every method, round and seed: ``build_client_data`` runs embeddings + the bottom layers once per
example (in length-sorted chunks, so short texts are not padded to the longest) and every trainer
then runs only the top ``adapter_layers`` layers. The paper inserts adapters in every layer; we keep
its structure (global and private adapters at both sites of each adapted layer, outputs averaged) in
the top layers only, because a 10-minute CPU budget cannot backpropagate through all six layers for
five methods. ``--adapter-layers 6`` restores the paper's placement (no cache then).

Per-client models share the frozen top-layer weights (a deep copy with the frozen parameters in the
memo), so each client owns only its adapters and heads.
"""
from __future__ import annotations

import copy
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.data import Dataset, TensorDataset

from fl_algorithms.algorithms.fedmcp import (FULL_MODEL, GLOBAL, GLOBAL_PART, HEAD_FULL, HEAD_GLOBAL, PRIVATE, REFERENCE,
                                  LossTerms)
from fl_algorithms.training.trainer import flatten, unflatten_
from nlp_models.adapters import (_encoder_layers, active, attach_adapters, flatten_set, load_set_, set_parameters,
                                 set_trainable_sets)
from nlp_models.data.dataset import DatasetSplits, TextDataset, cap, train_validation_test
from nlp_models.data.loaders import LOADERS
from nlp_models.frozen_prefix import build_prefix_cache, suffix_forward
from nlp_models.heads import SequenceClassifier, TextClassifier, mean_pool

SPLITS = ("train", "validation", "test")


def fast_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AMX or AVX512-BF16); elsewhere bf16 is slower."""
    try:
        return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())
    except AttributeError:  # pragma: no cover - older torch
        return False


@contextmanager
def _attention_for_training() -> Iterator[None]:
    """With gradients, use SDPA's math kernel: on CPU the fused kernel's backward measured about twice
    as slow for these short sequences. Inference keeps the default kernel."""
    if not torch.is_grad_enabled():
        yield
        return
    with sdpa_kernel(SDPBackend.MATH):
        yield


def autocast(enabled: bool):
    """bfloat16 autocast for the frozen encoder's matmuls; parameters, heads and losses stay float32."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


# ---------------------------------------------------------------- clients and data

@dataclass(frozen=True)
class ClientTask:
    key: str
    """Loader name in nlp_models.data.loaders.LOADERS."""
    title: str
    options: Mapping[str, Any] | None = None

    def load(self) -> TextDataset:
        return LOADERS[self.key](**dict(self.options or {}))


CLIENT_TASKS = (
    ClientTask("rt_sentiment", "RT sentiment"),
    ClientTask("rt_subjectivity", "RT plot/review"),
    ClientTask("bbc_news", "BBC topic", {"max_chars": 2000}),  # 64-128 tokens need only the first lines
    ClientTask("debates_2016", "Debates party"),
)


def load_client_splits(*, cap_to: int | None, seed: int = 0,
                       tasks: Sequence[ClientTask] = CLIENT_TASKS) -> dict[str, DatasetSplits]:
    """Each task's corpus capped to min(smallest corpus, cap_to) (stratified), then split 6:2:2."""
    corpora = {task.key: task.load() for task in tasks}
    size = min(len(d) for d in corpora.values())
    if cap_to is not None:
        if cap_to < 10:
            raise ValueError(f"cap must be at least 10 examples per client, got {cap_to}")
        size = min(size, cap_to)
    return {key: train_validation_test(cap(d, size, seed=seed), seed=seed) for key, d in corpora.items()}


class CachedBatch(NamedTuple):
    hidden: torch.Tensor
    """(B, L, H) states after the frozen prefix (or token ids (B, L) for full fine-tuning)."""
    attention_mask: torch.Tensor
    labels: torch.Tensor


@dataclass(frozen=True)
class CachedSplit:
    hidden: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    input_ids: torch.Tensor

    def __len__(self) -> int:
        return self.labels.shape[0]

    def batch(self, index: torch.Tensor, *, tokens: bool = False) -> CachedBatch:
        """Rows ``index`` trimmed to their longest text (dynamic padding; exact for the real tokens)."""
        mask = self.attention_mask[index]
        length = max(int(mask.sum(dim=1).max()), 1) if len(index) else 1
        source = self.input_ids if tokens else self.hidden
        return CachedBatch(source[index, :length], mask[:, :length], self.labels[index])

    def dataset(self) -> Dataset:
        """Per-example items (hidden, mask, label) for Opacus' Poisson-sampling loader."""
        return TensorDataset(self.hidden, self.attention_mask, self.labels)


@dataclass(frozen=True)
class ClientData:
    client_id: int
    key: str
    title: str
    num_labels: int
    splits: Mapping[str, CachedSplit]
    split_layer: int
    """Layers below this index are frozen and cached in ``CachedSplit.hidden``."""


def _encode_split(backbone: nn.Module, tokenizer, dataset: TextDataset, *, max_length: int, split_layer: int,
                  chunk: int = 64, bf16: bool = False) -> CachedSplit:
    encoded = tokenizer(list(dataset.texts), truncation=True, max_length=max_length, padding="max_length",
                        return_tensors="pt", return_token_type_ids=False)
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    lengths = mask.sum(dim=1)
    longest = int(lengths.max())
    ids, mask = ids[:, :longest].contiguous(), mask[:, :longest].contiguous()
    hidden = torch.zeros(ids.shape[0], longest, backbone.config.hidden_size)
    order = torch.argsort(lengths, descending=True, stable=True)
    for start in range(0, len(order), chunk):  # similar lengths together: little padding per chunk
        rows = order[start:start + chunk]
        width = int(lengths[rows].max())
        with autocast(bf16):
            cache = build_prefix_cache(backbone, ids[rows, :width], mask[rows, :width], split=split_layer,
                                       batch_size=chunk, progress=False)
        hidden[rows, :width] = cache.hidden
    labels = torch.tensor([int(y) for y in dataset.labels], dtype=torch.long)
    return CachedSplit(hidden=hidden, attention_mask=mask, labels=labels, input_ids=ids)


def build_client_data(backbone: nn.Module, tokenizer, splits: Mapping[str, DatasetSplits], *, max_length: int,
                      adapter_layers: int, tasks: Sequence[ClientTask] = CLIENT_TASKS, bf16: bool = False,
                      progress: Callable[[str], None] | None = None) -> list[ClientData]:
    """Tokenise every split once and cache the frozen prefix (the bottom L - adapter_layers layers)."""
    depth = len(_encoder_layers(backbone))
    if not 1 <= adapter_layers <= depth:
        raise ValueError(f"adapter_layers must be in 1..{depth}, got {adapter_layers}")
    split_layer = depth - adapter_layers
    titles = {task.key: task.title for task in tasks}
    clients = []
    for client_id, (key, parts) in enumerate(splits.items(), start=1):
        if progress is not None:
            progress(key)
        cached = {name: _encode_split(backbone, tokenizer, getattr(parts, name), max_length=max_length,
                                      split_layer=split_layer, bf16=bf16) for name in SPLITS}
        clients.append(ClientData(client_id=client_id, key=key, title=titles.get(key, key),
                                  num_labels=parts.train.num_labels, splits=cached, split_layer=split_layer))
    return clients


# ---------------------------------------------------------------- models

class _LayerHolder(nn.Module):
    def __init__(self, layers: nn.ModuleList):
        super().__init__()
        self.layer = layers


class TopEncoder(nn.Module):
    """The top ``len(layers)`` layers of a frozen backbone, sharing its frozen weights (no copy).

    Laid out like a BERT encoder (``.config``, ``.encoder.layer``) so that ``attach_adapters`` and
    ``suffix_forward`` work on it unchanged.
    """

    def __init__(self, backbone: nn.Module, *, split_layer: int, dropout: bool = False):
        super().__init__()
        layers = _encoder_layers(backbone)[split_layer:]
        if any(p.requires_grad for p in layers.parameters()):
            raise ValueError("freeze the backbone first: its layers are shared between clients")
        memo = {id(p): p for p in layers.parameters()}
        memo.update({id(b): b for b in layers.buffers()})
        self.config = backbone.config
        self.encoder = _LayerHolder(copy.deepcopy(layers, memo))
        if not dropout:
            # The frozen layers run without dropout, like the cached prefix below them. Their dropout
            # (attention probabilities and hidden states) drew a quarter of a CPU training step in
            # random numbers. Setting p = 0 (not eval mode) keeps the adapters in training mode for Opacus.
            for module in self.encoder.modules():
                if isinstance(module, nn.Dropout):
                    module.p = 0.0

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return suffix_forward(self, hidden, attention_mask, split=0)


def make_head(hidden: int, num_labels: int, *, mlp_hidden: int | None, seed: int) -> SequenceClassifier:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return SequenceClassifier(hidden, num_labels, dropout=0.1, mlp_hidden=mlp_hidden)


class _HeadsAndLabels(nn.Module):
    """Shared by the model variants: named heads over a pooled representation; labels are batch[2]."""

    heads: nn.ModuleDict

    def classify(self, head: str, representation: torch.Tensor) -> torch.Tensor:
        return self.heads[head](None, representation)

    @staticmethod
    def labels(batch: Sequence[torch.Tensor]) -> torch.Tensor:
        return batch[2]


class AdapterClassifier(_HeadsAndLabels):
    """Adapted top layers + named heads over cached prefix states; the FedMCP ``AdapterModel``."""

    def __init__(self, top: TopEncoder, heads: Mapping[str, nn.Module], *, bf16: bool = False):
        super().__init__()
        self.top = top
        self.heads = nn.ModuleDict(dict(heads))
        self.bf16 = bf16
        self.timer: dict[str, float] = defaultdict(float)

    def represent(self, batch: Sequence[torch.Tensor], *, mixing: Mapping[str, float]) -> torch.Tensor:
        start = time.perf_counter()
        hidden, mask = batch[0], batch[1]
        if mask.shape[0]:  # Opacus' loader yields fully padded rows: trim to the longest text
            length = max(int(mask.sum(dim=1).max()), 1)
            hidden, mask = hidden[:, :length], mask[:, :length]
        with active(self.top, mixing), autocast(self.bf16), _attention_for_training():
            states = self.top(hidden, mask)
        pooled = mean_pool(states.float(), mask)
        if self.training:  # evaluation is timed as a whole by the trainer
            self.timer["forward " + "+".join(sorted(mixing))] += time.perf_counter() - start
        return pooled


class FullModel(_HeadsAndLabels):
    """A whole (trainable) backbone + one head over token ids: FedAvg with full fine-tuning."""

    def __init__(self, classifier: TextClassifier, *, bf16: bool = False):
        super().__init__()
        self.classifier = classifier
        self.heads = classifier.heads
        self.bf16 = bf16
        self.timer: dict[str, float] = defaultdict(float)

    def represent(self, batch: Sequence[torch.Tensor], *, mixing: Mapping[str, float]) -> torch.Tensor:
        start = time.perf_counter()
        with autocast(self.bf16):
            states, _ = self.classifier.encode(batch[0], batch[1])
        pooled = mean_pool(states.float(), batch[1])
        if self.training:
            self.timer["forward full backbone"] += time.perf_counter() - start
        return pooled


class CrossEntropyObjective:
    """The plain supervised objective of the baselines: CE of one head under one adapter mixing."""

    def __init__(self, *, mixing: Mapping[str, float], head: str):
        self.mixing, self.head = dict(mixing), head

    def __call__(self, model, batch) -> LossTerms:
        logits = model.classify(self.head, model.represent(batch, mixing=self.mixing))
        per_example = F.cross_entropy(logits, model.labels(batch), reduction="none")
        return LossTerms(per_example, None, {"loss": float(per_example.detach().mean()) if len(per_example) else 0.0})


# ---------------------------------------------------------------- trainers

@dataclass(frozen=True)
class TrainConfig:
    batch_size: int = 64
    lr: float = 5e-4
    eval_batch_size: int = 128
    dp: Any = None
    """A dp.opacus_client.DPSGDConfig for example-level DP-SGD, or None."""
    dp_delta: float = 1e-5
    backbone_dropout: bool = False
    """Dropout inside the frozen adapted layers (off by default; the classifier heads keep theirs)."""
    bf16: bool = False
    """bfloat16 autocast in the encoder layers (off under DP: Opacus' per-sample gradients stay float32)."""

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.eval_batch_size < 1:
            raise ValueError("batch sizes must be positive")
        if not self.lr > 0:
            raise ValueError("lr must be positive")


def _derive_seed(*parts: Any) -> int:
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


@dataclass(frozen=True)
class MethodModel:
    """Which adapter sets a method's clients have, which leave the client, and how they predict."""

    sets: tuple[str, ...]
    trainable: tuple[str, ...]
    shared: Mapping[str, tuple[str, ...]]
    heads: tuple[str, ...]
    predict_mixing: Mapping[str, float]
    predict_head: str


FEDMCP_MODEL = MethodModel(sets=(GLOBAL, PRIVATE, REFERENCE), trainable=(GLOBAL, PRIVATE),
                           shared={GLOBAL_PART: (GLOBAL,)}, heads=(HEAD_FULL, HEAD_GLOBAL),
                           predict_mixing=FULL_MODEL, predict_head=HEAD_FULL)
# The baselines keep FedMCP's architecture (Sec. V-B: same adapters, same positions, outputs averaged);
# FedAvg and FedRep aggregate both adapters, as in Table I (1.16% communicated).
BASELINE_SETS = ("adapter1", "adapter2")
BASELINE_MODEL = MethodModel(sets=BASELINE_SETS, trainable=BASELINE_SETS, shared={"adapters": BASELINE_SETS},
                             heads=("head",), predict_mixing={s: 0.5 for s in BASELINE_SETS}, predict_head="head")
LOCAL_MODEL = replace(BASELINE_MODEL, shared={})


class AdapterTrainer:
    """One client's adapters and heads over its cached prefix; implements the LocalTrainer protocol,
    FedMCP's ``fit``/``load_adapter_set`` and FedRep's ``train_head``/``train_body``.

    Without DP, Adam (one optimiser over all trainable adapters and heads) is kept across rounds like
    any private client state. With DP, every local pass is an Opacus DP-SGD round through
    ``dp.opacus_client.OpacusClient`` whose accountant persists across rounds; objectives with a
    batch-level term are refused (no per-example sensitivity bound).
    Batch order and dropout are seeded by (seed, client, call count), so a resumed run is exact.
    """

    def __init__(self, *, data: ClientData, top: TopEncoder, spec: MethodModel, bottleneck: int,
                 head_hidden: int | None, config: TrainConfig, seed: int) -> None:
        self.data, self.spec, self.config, self.seed = data, spec, config, seed
        self.client_id = data.client_id
        self.num_examples = len(data.splits["train"])
        attach_adapters(top, {name: bottleneck for name in spec.sets}, seed=seed)
        hidden = top.config.hidden_size
        heads = {name: make_head(hidden, data.num_labels, mlp_hidden=head_hidden,
                                 seed=_derive_seed(seed, data.client_id, name)) for name in spec.heads}
        self.model = AdapterClassifier(top, heads, bf16=config.bf16 and config.dp is None)
        set_trainable_sets(top, spec.trainable)
        self.timer = self.model.timer
        self.calls = 0
        self._optimizer: torch.optim.Optimizer | None = None
        self.dp_client = None
        if config.dp is not None:
            from dp.ledger import Ledger, LedgerConfig
            from dp.opacus_client import OpacusClient
            self.ledger = Ledger(LedgerConfig(delta=config.dp.delta))
            self.dp_client = OpacusClient(client_id=data.client_id, config=config.dp, ledger=self.ledger)

    # ---- parameters ---------------------------------------------------------------------------
    def _trainable_params(self) -> list[nn.Parameter]:
        adapters = [p for name in self.spec.trainable for p in set_parameters(self.model.top, name)]
        return adapters + [p for head in self.model.heads.values() for p in head.parameters()]

    def trainable_count(self) -> int:
        return sum(p.numel() for p in self._trainable_params())

    def shared_count(self) -> int:
        return sum(v.size for v in self.get_shared().values())

    def optimizer(self) -> torch.optim.Optimizer:
        if self._optimizer is None:
            self._optimizer = torch.optim.Adam(self._trainable_params(), lr=self.config.lr)
        return self._optimizer

    def get_shared(self) -> dict[str, np.ndarray]:
        return {part: np.concatenate([flatten_set(self.model.top, s) for s in sets])
                for part, sets in self.spec.shared.items()}

    def set_shared(self, params: Mapping[str, np.ndarray]) -> None:
        for part, vector in params.items():
            sets = self.spec.shared[part]
            sizes = [sum(p.numel() for p in set_parameters(self.model.top, s)) for s in sets]
            if np.asarray(vector).shape != (sum(sizes),):
                raise ValueError(f"part {part!r} needs {sum(sizes)} values, got shape {np.shape(vector)}")
            for s, piece in zip(sets, np.split(np.asarray(vector), np.cumsum(sizes)[:-1])):
                load_set_(self.model.top, s, piece)

    def load_adapter_set(self, name: str, vector: np.ndarray) -> None:
        if name not in self.spec.sets:
            raise KeyError(f"no adapter set {name!r}")
        load_set_(self.model.top, name, vector)

    def _freeze_all_but(self, *, sets: Sequence[str], heads: Sequence[str]) -> None:
        set_trainable_sets(self.model.top, tuple(sets))
        for name, head in self.model.heads.items():
            head.requires_grad_(name in heads)

    @contextmanager
    def _seeded(self, tag: str) -> Iterator[torch.Generator]:
        self.calls += 1
        seed = _derive_seed(self.seed, self.client_id, self.calls, tag)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # dropout masks and Opacus' noise/sampling
            yield torch.Generator().manual_seed(seed + 1)

    # ---- training -----------------------------------------------------------------------------
    def default_objective(self) -> CrossEntropyObjective:
        return CrossEntropyObjective(mixing=self.spec.predict_mixing, head=self.spec.predict_head)

    def train(self, *, epochs: int, proximal: Mapping[str, np.ndarray] | None = None, mu: float = 0.0,
              round: int | None = None) -> dict[str, float]:
        if proximal is not None and mu > 0:
            raise NotImplementedError("this trainer has no proximal term (FedProx is not part of this example)")
        return self.fit(epochs=epochs, objective=self.default_objective(), round=round)

    def fit(self, *, epochs: int, objective, round: int | None = None) -> dict[str, float]:
        """All trainable adapters and heads, ``epochs`` passes over the training split."""
        return self._run(objective, epochs=epochs, sets=self.spec.trainable, heads=tuple(self.model.heads), tag="fit",
                         round=round)

    def train_body(self, *, epochs: int, round: int | None = None) -> dict[str, float]:
        """FedRep's representation step: adapters trainable, heads frozen."""
        return self._run(self.default_objective(), epochs=epochs, sets=self.spec.trainable, heads=(), tag="body",
                         round=round)

    def train_head(self, *, epochs: int, round: int | None = None) -> dict[str, float]:
        """FedRep's head step with the adapters frozen. The representation is fixed during this step,
        so it is computed once (eval mode: encoder dropout off) and the head trains on it."""
        start = time.perf_counter()
        head = self.spec.predict_head
        self._freeze_all_but(sets=(), heads=(head,))
        train = self.data.splits["train"]
        reps = self._represent_split(train, mixing=self.spec.predict_mixing)
        self.model.train()
        module = self.model.heads[head]
        with self._seeded("head") as generator:
            if self.dp_client is not None:
                def per_example(m, batch):
                    return F.cross_entropy(m(None, batch[0]), batch[1], reduction="none")
                metrics = self._dp_round(module, TensorDataset(reps, train.labels), per_example, epochs=epochs,
                                         round=round, timer_key=None)  # timed as the head step
            else:
                optimizer, total, steps = self.optimizer(), 0.0, 0
                for _ in range(epochs):
                    for index in torch.randperm(len(train), generator=generator).split(self.config.batch_size):
                        optimizer.zero_grad(set_to_none=True)
                        loss = F.cross_entropy(module(None, reps[index]), train.labels[index])
                        loss.backward()
                        optimizer.step()
                        total, steps = total + float(loss.detach()), steps + 1
                metrics = {"train_loss": total / max(steps, 1), "steps": float(steps)}
        self._freeze_all_but(sets=self.spec.trainable, heads=tuple(self.model.heads))
        self.timer["fedrep head step"] += time.perf_counter() - start
        return metrics

    def _run(self, objective, *, epochs: int, sets: Sequence[str], heads: Sequence[str], tag: str,
             round: int | None) -> dict[str, float]:
        if epochs < 1:
            raise ValueError("epochs must be at least 1")
        self._freeze_all_but(sets=sets, heads=heads)
        self.model.train()
        train = self.data.splits["train"]
        try:
            with self._seeded(tag) as generator:
                if self.dp_client is not None:
                    def per_example(m, batch):
                        terms = objective(getattr(m, "_module", m), batch)
                        if terms.batch is not None:
                            raise ValueError("a batch-level loss term has no per-example sensitivity bound under "
                                             "DP-SGD; set its weight to 0 (FedMCP: mu = 0)")
                        return terms.per_example
                    return self._dp_round(self.model, train.dataset(), per_example, epochs=epochs, round=round)
                return self._plain_epochs(objective, train, epochs=epochs, generator=generator)
        finally:
            self._freeze_all_but(sets=self.spec.trainable, heads=tuple(self.model.heads))

    def _plain_epochs(self, objective, train: CachedSplit, *, epochs: int, generator: torch.Generator) -> dict[str, float]:
        optimizer = self.optimizer()
        sums: dict[str, float] = defaultdict(float)
        steps = 0
        for _ in range(epochs):
            for index in torch.randperm(len(train), generator=generator).split(self.config.batch_size):
                optimizer.zero_grad(set_to_none=True)
                terms = objective(self.model, train.batch(index))
                loss = terms.total()
                start = time.perf_counter()
                loss.backward()
                self.timer["backward"] += time.perf_counter() - start
                start = time.perf_counter()
                optimizer.step()
                self.timer["optimizer"] += time.perf_counter() - start
                steps += 1
                sums["train_loss"] += float(loss.detach())
                for key, value in terms.parts.items():
                    sums[key] += value
        return {**{k: v / max(steps, 1) for k, v in sums.items()}, "steps": float(steps)}

    def _dp_round(self, module: nn.Module, dataset: Dataset, per_example, *, epochs: int, round: int | None,
                  timer_key: str | None = "dp-sgd (clipping, noise, backward)") -> dict[str, float]:
        client = self.dp_client
        client.config = replace(client.config, local_epochs=epochs)  # OpacusClient reads epochs from its config
        forward_before = sum(v for k, v in self.timer.items() if k.startswith("forward"))
        start = time.perf_counter()
        report = client.train_round(model=module, optimizer_factory=lambda ps: torch.optim.Adam(ps, lr=self.config.lr),
                                    dataset=dataset, loss_fn=per_example,
                                    round_id=round if round is not None else self.calls)
        if timer_key is not None:  # the forward passes inside are already timed by the model
            forward = sum(v for k, v in self.timer.items() if k.startswith("forward")) - forward_before
            self.timer[timer_key] += time.perf_counter() - start - forward
        return {"train_loss": report.mean_loss, "steps": float(report.steps), "epsilon": report.opacus_epsilon,
                "noise_multiplier": report.noise_multiplier}

    def epsilon(self) -> float:
        return self.dp_client.epsilon() if self.dp_client is not None else float("nan")

    # ---- evaluation ---------------------------------------------------------------------------
    @torch.no_grad()
    def _represent_split(self, split: CachedSplit, *, mixing: Mapping[str, float]) -> torch.Tensor:
        self.model.eval()
        order = torch.argsort(split.attention_mask.sum(dim=1))
        reps = torch.empty(len(split), self.model.top.config.hidden_size)
        for index in order.split(self.config.eval_batch_size):
            reps[index] = self.model.represent(split.batch(index), mixing=mixing)
        return reps

    @torch.no_grad()
    def evaluate(self, *, split: str = "test") -> dict[str, float]:
        start = time.perf_counter()
        data = self.data.splits[split]
        reps = self._represent_split(data, mixing=self.spec.predict_mixing)
        predictions = self.model.classify(self.spec.predict_head, reps).argmax(dim=-1)
        self.timer["evaluation"] += time.perf_counter() - start
        return {"accuracy": float((predictions == data.labels).float().mean())}

    # ---- checkpoints --------------------------------------------------------------------------
    def _own_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()
                if ".adapters." in k or k.startswith("heads.")}

    def state_dict(self) -> dict[str, Any]:
        # A snapshot: Optimizer.state_dict() returns live tensors, and load_state_dict keeps Adam's
        # 'step' tensor by reference, so two trainers restored from one live dict would share it.
        state = {"model": self._own_state(), "calls": self.calls,
                 "optimizer": copy.deepcopy(self._optimizer.state_dict()) if self._optimizer is not None else None}
        if self.dp_client is not None:
            state["dp"] = self.dp_client.state_dict()
            state["ledger"] = self.ledger.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        missing, unexpected = self.model.load_state_dict(state["model"], strict=False)
        if unexpected or any(".adapters." in k or k.startswith("heads.") for k in missing):
            raise ValueError(f"checkpoint does not match this client's model ({unexpected or missing})")
        self.calls = int(state["calls"])
        if state.get("optimizer") is not None:
            self.optimizer().load_state_dict(state["optimizer"])
        if self.dp_client is not None and "dp" in state:
            self.dp_client.load_state_dict(state["dp"])
            self.ledger.load_state_dict(state["ledger"])


class FullFineTuneTrainer:
    """FedAvg (Full FT): every backbone parameter trains and is uploaded (the paper's 100% row).

    The clients of a simulation share one backbone object: every client_update loads the broadcast
    into it first, so only the heads and Adam states are per client. Runs on token ids, not on the
    cached prefix (a cached prefix would freeze the bottom layers: that is not full fine-tuning).
    """

    def __init__(self, *, data: ClientData, backbone: nn.Module, head_hidden: int | None, config: TrainConfig,
                 seed: int) -> None:
        if config.dp is not None:
            raise ValueError("DP-SGD is offered for the adapters only; full fine-tuning under DP is not supported")
        self.data, self.config, self.seed, self.client_id = data, config, seed, data.client_id
        self.num_examples = len(data.splits["train"])
        self.backbone = backbone
        head = make_head(backbone.config.hidden_size, data.num_labels, mlp_hidden=head_hidden,
                         seed=_derive_seed(seed, data.client_id, "head"))
        self.model = FullModel(TextClassifier(backbone, {"head": head}), bf16=config.bf16)
        self.timer = self.model.timer
        self.params = [p for p in backbone.parameters()]
        self.calls = 0
        self._optimizer: torch.optim.Optimizer | None = None
        self.objective = CrossEntropyObjective(mixing={}, head="head")

    def trainable_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def shared_count(self) -> int:
        return sum(p.numel() for p in self.params)

    def optimizer(self) -> torch.optim.Optimizer:
        if self._optimizer is None:
            self._optimizer = torch.optim.Adam(list(self.model.parameters()), lr=self.config.lr)
        return self._optimizer

    def get_shared(self) -> dict[str, np.ndarray]:
        return {"backbone": flatten(self.params)}

    def set_shared(self, params: Mapping[str, np.ndarray]) -> None:
        unflatten_(self.params, params["backbone"])

    def train(self, *, epochs: int, proximal=None, mu: float = 0.0, round: int | None = None) -> dict[str, float]:
        self.model.train()
        train = self.data.splits["train"]
        self.calls += 1
        seed = _derive_seed(self.seed, self.client_id, self.calls, "full")
        optimizer, total, steps = self.optimizer(), 0.0, 0
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            generator = torch.Generator().manual_seed(seed + 1)
            for _ in range(epochs):
                for index in torch.randperm(len(train), generator=generator).split(self.config.batch_size):
                    optimizer.zero_grad(set_to_none=True)
                    loss = self.objective(self.model, train.batch(index, tokens=True)).total()
                    start = time.perf_counter()
                    loss.backward()
                    optimizer.step()
                    self.timer["backward+optimizer"] += time.perf_counter() - start
                    total, steps = total + float(loss.detach()), steps + 1
        return {"train_loss": total / max(steps, 1), "steps": float(steps)}

    @torch.no_grad()
    def evaluate(self, *, split: str = "test") -> dict[str, float]:
        start = time.perf_counter()
        self.model.eval()
        data = self.data.splits[split]
        correct = 0
        for index in torch.argsort(data.attention_mask.sum(dim=1)).split(self.config.eval_batch_size):
            batch = data.batch(index, tokens=True)
            logits = self.model.classify("head", self.model.represent(batch, mixing={}))
            correct += int((logits.argmax(-1) == batch.labels).sum())
        self.timer["evaluation"] += time.perf_counter() - start
        return {"accuracy": correct / max(len(data), 1)}

    def epsilon(self) -> float:
        return float("nan")

    def state_dict(self) -> dict[str, Any]:
        return {"head": {k: v.clone() for k, v in self.model.heads.state_dict().items()}, "calls": self.calls,
                "optimizer": copy.deepcopy(self._optimizer.state_dict()) if self._optimizer is not None else None}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.model.heads.load_state_dict(state["head"])
        self.calls = int(state["calls"])
        if state.get("optimizer") is not None:
            self.optimizer().load_state_dict(state["optimizer"])
