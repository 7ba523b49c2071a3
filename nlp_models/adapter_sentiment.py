"""An adapter-sized sentiment model and its federated task: frozen MiniLM with bottleneck adapters in
its top layer(s) and a linear head, on the Rotten Tomatoes snippets partitioned by movie; the twin
of `nlp_models.bag_of_tokens` for the privacy frontier (same corpus, same clients, same API).

    h_prefix = MiniLM layers[:L-k](x)                  frozen, computed once per example (cache)
    logits   = head(mean_pool(layers[L-k:](h_prefix; adapters)))

Only the adapters (Houlsby, two sites per adapted layer) and the head train and are uploaded:
with k = 1 and bottleneck 16, 2 x (384 x 16 + 16 + 16 x 384 + 384) + 384 x 2 + 2 = 26,146 values
in two parts, 'adapters' and 'head' (the bag model uploads 488k).

Data (`load_adapter_task`): the corpus loader and movie partition of `load_bag_task`
(`load_rt_sentiment(dedupe=True)`, `natural_partition`, `client_splits`), except that first a
`public_fraction` of the movies is set aside as `AdapterTask.public` (`split_off_public_groups`):
whole movies held by no client, which an attacker may use to simulate shadow clients
(`shadow_clients`). With public_fraction = 0 the clients are exactly the bag task's clients for the
same seed and client count; `movie_clients` is the one helper both tasks can share.

Caching (`cache_prefix`): the frozen prefix of every snippet is computed once per task load, in
length-sorted shards (`nlp_models.frozen_prefix.build_prefix_cache`, with a tqdm bar), and each split
(a client's train/test, the public split) keeps a `CachedSplit` padded only to its own longest
snippet. CHOICE: float16 storage, float32 compute (`suffix_forward` upcasts); no full N x 64 x 384
tensor is ever allocated. The whole corpus (12.7k snippets, mean 27 WordPiece tokens) costs about
0.5 GB instead of 1.25 GB at float32 padded to 64.

Device (`load_adapter_task(..., device=)`): the backbone, every cached split and every model of the task
live there; the prefix is computed there and kept as rows on the CPU only while the splits are cut.
Shared parameters, losses and metrics leave as CPU numbers, so the federated layers do not change.

Initialisation (deterministic given the seed): adapters near identity but not exactly (down
projection N(0, 0.02), up projection N(0, `adapter_init_std` = 0.01), Houlsby et al. 2019; an
exactly-zero up projection would give the down projection no gradient on the first step), the head a
seeded nn.Linear. Dropout is off in the adapted layer (as in the frozen prefix below it); the head
keeps `head_dropout`.
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pad_sequence
from tqdm.auto import tqdm

from nlp_models.adapters import AdapterConfig, attach_adapters
from nlp_models.backbone import BACKBONES, load_named_backbone
from nlp_models.classifiers import SuffixClassifier, make_head
from nlp_models.cpu import training_attention
from nlp_models.data.dataset import TextDataset
from nlp_models.data.partition import Partition, client_splits, movie_clients
from nlp_models.frozen_prefix import (CachedBatch, CachedSplit, TopEncoder, build_prefix_cache, dummy_if_empty,
                                      prefix_split)
from nlp_models.heads import classification_metrics

ADAPTERS_PART = "adapters"
HEAD_PART = "head"
ADAPTER_SET = "adapter"
CACHE_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
OPTIMIZERS = ("adam", "adamw", "sgd")
SHARD = 1024
"""Snippets per length-sorted shard of the prefix cache (the bar advances per shard)."""


# ---- the model ----------------------------------------------------------------------------------

def _trim(hidden: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut a batch to its longest snippet (Opacus' loader yields rows padded to the split's longest)."""
    length = max(int(mask.sum(dim=1).max()), 1)
    return hidden[:, :length], mask[:, :length]


def logits(model: nn.Module, batch: Sequence[torch.Tensor]) -> torch.Tensor:
    """Logits of a `CachedBatch` or of Opacus' [hidden, mask, labels] list, moved to the model's device
    (Opacus may build an empty batch on the CPU). An empty batch runs one dummy row and returns its
    logits cut to zero rows (`frozen_prefix.dummy_if_empty`: DP-SGD's empty-batch step)."""
    device = next(model.parameters()).device
    (hidden, mask, *_), empty = dummy_if_empty(batch)
    hidden, mask = _trim(hidden.to(device), mask.to(device))
    with training_attention(device):  # math SDPA kernel when gradients flow: faster backward on CPU
        out = model(hidden, mask)
    return out[:0] if empty else out


def per_example_loss(model: nn.Module, batch: Sequence[torch.Tensor]) -> torch.Tensor:
    """Cross-entropy per example, shape [B]."""
    out = logits(model, batch)
    return F.cross_entropy(out, batch[2].long().to(out.device), reduction="none")


def mean_loss(model: nn.Module, batch: Sequence[torch.Tensor]) -> torch.Tensor:
    return per_example_loss(model, batch).mean()


def metrics(model: nn.Module, batches: Iterable[CachedBatch]) -> dict[str, float]:
    """Accuracy and mean loss, plus the example count (to pool accuracies over clients)."""
    return classification_metrics((logits(model, b), b.labels) for b in batches)


def shared_parts(model: nn.Module) -> dict[str, list[str]]:
    """Parameter names of the two uploaded parts: every adapter (layer order, down.w, down.b, up.w,
    up.b; the order of `nlp_models.adapters.flatten_set`) and the head. Nothing else trains."""
    names = [n for n, _ in model.named_parameters()]
    return {ADAPTERS_PART: [n for n in names if f".adapters.{ADAPTER_SET}." in n],
            HEAD_PART: [n for n in names if n.startswith("head.")]}


def build_model(backbone: nn.Module, *, num_labels: int, adapter_layers: int, bottleneck: int,
                adapter_init_std: float, head_dropout: float, seed: int) -> SuffixClassifier:
    """Adapters in the top `adapter_layers` layers of the frozen `backbone` (whose weights it shares) + a
    linear head; seeded, so every call gives the same model.

    Like `nlp_models.classifiers.build_suffix_classifier`, but with a near-identity (not exact) adapter
    initialisation and no dropout in the adapted layers.
    """
    top = TopEncoder(backbone, split=prefix_split(backbone, adapter_layers), dropout=False, freeze=True)
    attach_adapters(top, {ADAPTER_SET: AdapterConfig(bottleneck=bottleneck, up_init_std=adapter_init_std)},
                    seed=seed)
    head = make_head(backbone.config.hidden_size, num_labels, dropout=head_dropout, seed=seed)
    return SuffixClassifier(suffix=top, head=head)


# ---- corpus split: public movies, then clients ----------------------------------------------------

# ---- the prefix cache ----------------------------------------------------------------------------

@dataclass(frozen=True)
class RowCache:
    """Each snippet's cached states, trimmed to its own length: (length_i, H) tensors by corpus index."""

    rows: tuple[torch.Tensor, ...]
    labels: torch.Tensor
    split: int

    def take(self, indices: Sequence[int] | np.ndarray) -> CachedSplit:
        """A `CachedSplit` of the rows `indices` (copies), padded to the longest of them."""
        idx = [int(i) for i in indices]
        if not idx:
            hidden = self.rows[0].new_zeros(0, 1, self.rows[0].shape[-1])
            return CachedSplit(hidden, torch.zeros(0, 1, dtype=torch.long), torch.zeros(0, dtype=torch.long))
        hidden = pad_sequence([self.rows[i] for i in idx], batch_first=True)
        lengths = torch.tensor([self.rows[i].shape[0] for i in idx])
        mask = (torch.arange(hidden.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)).long()
        return CachedSplit(hidden, mask, self.labels[idx].clone())


def cache_prefix(backbone: nn.Module, tokenizer: Any, texts: Sequence[str], labels: Sequence[int], *,
                 max_length: int, split: int, dtype: torch.dtype = torch.float16, progress: bool = True) -> RowCache:
    """Frozen states after `split` layers for every text ([CLS] ... [SEP], at most `max_length` tokens),
    computed once in length-sorted shards of `SHARD` and stored per row at its own length."""
    encoded = tokenizer(list(texts), truncation=True, max_length=max_length, padding="longest",
                        return_tensors="pt", return_token_type_ids=False)
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    lengths = mask.sum(dim=1)
    order = torch.argsort(lengths, descending=True, stable=True)
    rows: list[torch.Tensor | None] = [None] * len(texts)
    with tqdm(total=len(texts), desc=f"frozen prefix (layers 0-{split - 1})", unit="snippet",
              disable=None if progress else True) as bar:
        for shard in order.split(SHARD):
            width = int(lengths[shard].max())
            cache = build_prefix_cache(backbone, ids[shard, :width], mask[shard, :width], split=split,
                                       batch_size=64, progress=False, dtype=dtype, by_length=True)
            for j, i in enumerate(shard.tolist()):
                rows[i] = cache.hidden[j, : int(lengths[i])].clone()
            bar.update(len(shard))
    return RowCache(rows=tuple(rows), labels=torch.as_tensor(np.asarray(labels, dtype=np.int64)), split=split)


# ---- the federated task ----------------------------------------------------------------------------

@dataclass(frozen=True)
class AdapterTaskConfig:
    num_clients: int = 40
    max_examples: int | None = None
    """Stratified cap on the (deduplicated) corpus, before the public movies are set aside; None keeps all."""
    max_length: int = 64
    """WordPiece tokens kept per snippet, [CLS] and [SEP] included (snippets average 27)."""
    adapter_layers: int = 1
    """Adapted (trained) top layers; the layers below are frozen and cached."""
    bottleneck: int = 16
    adapter_init_std: float = 1e-2
    """Std of the adapters' up projection: near identity, not exactly (Houlsby et al. 2019)."""
    head_dropout: float = 0.1
    optimizer: str = "sgd"
    """Client optimiser: 'sgd' (plain, the default), 'adam' or 'adamw' (state kept across rounds as private
    client state)."""
    lr: float = 0.3
    """Measured with 100 clients, cohort 20, 5 local epochs: SGD at 0.3 reached 0.75 test accuracy in 10
    rounds with a falling test loss; Adam at 1e-3 / 2e-3 plateaued near 0.73-0.74 with a rising loss
    (stale moments of rarely sampled clients, local over-fitting)."""
    batch_size: int = 16
    test_fraction: float = 0.2
    public_fraction: float = 0.1
    """Share of the movies set aside (whole) as the public split, held by no client."""
    seed: int = 0
    backbone: str = "minilm"
    """'minilm' (all-MiniLM-L6-v2, offline) or 'tiny' (a seeded random 3-layer BERT, hidden 32: tests)."""
    cache_dtype: str = "float16"
    """Storage of the cached prefix; compute is float32 either way."""

    def __post_init__(self) -> None:
        checks = [
            (self.num_clients >= 2, "need at least two clients"),
            (self.max_length >= 3, "max_length must be at least 3"),
            (self.adapter_layers >= 1 and self.bottleneck >= 1, "adapter_layers and bottleneck must be positive"),
            (self.adapter_init_std >= 0 and 0 <= self.head_dropout < 1, "bad adapter_init_std or head_dropout"),
            (self.optimizer in OPTIMIZERS, f"optimizer must be one of {OPTIMIZERS}"),
            (self.lr > 0 and self.batch_size >= 1, "need lr > 0 and batch_size >= 1"),
            (0 < self.test_fraction < 1, "need 0 < test_fraction < 1"),
            (0 <= self.public_fraction < 1, "need 0 <= public_fraction < 1"),
            (self.backbone in BACKBONES, f"backbone must be one of {BACKBONES}"),
            (self.cache_dtype in CACHE_DTYPES, f"cache_dtype must be one of {tuple(CACHE_DTYPES)}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


@dataclass(frozen=True)
class AdapterClient:
    """One client's (or shadow client's) cached snippets, and where they sit in the corpus."""

    train: CachedSplit
    test: CachedSplit
    movies: int
    train_index: np.ndarray
    """Corpus indices (into `AdapterTask.corpus`) of the training snippets, in `train`'s row order."""
    test_index: np.ndarray


@dataclass(frozen=True)
class PublicSplit:
    """Snippets of whole movies that no client holds: an attacker's public data (shadow clients)."""

    examples: CachedSplit
    index: np.ndarray
    """Corpus indices, in `examples`' row order."""
    movies: int

    def __len__(self) -> int:
        return len(self.examples)


@dataclass(frozen=True, eq=False)
class AdapterTask:
    config: AdapterTaskConfig
    clients: Mapping[int, AdapterClient]
    """Client id (1..K) -> its data."""
    public: PublicSplit
    initial: Mapping[str, np.ndarray]
    """The initial shared parameters, one flat float32 vector per part ('adapters', 'head')."""
    num_labels: int
    label_names: tuple[str, ...]
    corpus: TextDataset = field(repr=False)
    """The deduplicated (capped) corpus that every index refers to."""
    backbone: nn.Module = field(repr=False)
    """The frozen encoder; every model shares its top-layer weights."""
    split: int = 0
    """Frozen, cached layers below the adapted ones."""
    seconds: Mapping[str, float] = field(default_factory=dict)
    """Load timings: 'data' (corpus, partition), 'backbone', 'cache' (frozen prefix)."""
    device: str = "cpu"
    """Where the backbone, the cached splits and every model of the task live."""

    def new_model(self) -> SuffixClassifier:
        """The seeded initial model (its shared parts equal `initial`), on the task's device."""
        return config_model(self.config, backbone=self.backbone, num_labels=self.num_labels).to(self.device)

    def cache_bytes(self) -> int:
        splits = [s for c in self.clients.values() for s in (c.train, c.test)] + [self.public.examples]
        return int(sum(s.hidden.numel() * s.hidden.element_size() for s in splits))

    def summary(self) -> dict[str, Any]:
        sizes = np.array([len(c.train) for c in self.clients.values()])
        return {"clients": len(self.clients), "train_examples": int(sizes.sum()),
                "test_examples": int(sum(len(c.test) for c in self.clients.values())),
                "train_per_client_min_median_max": [int(sizes.min()), float(np.median(sizes)), int(sizes.max())],
                "movies": int(sum(c.movies for c in self.clients.values())),
                "public_examples": len(self.public), "public_movies": self.public.movies,
                "parameters": int(sum(v.size for v in self.initial.values())),
                "parameters_per_part": {k: int(v.size) for k, v in self.initial.items()},
                "frozen_cached_layers": self.split, "adapter_layers": self.config.adapter_layers,
                "cache_mb": round(self.cache_bytes() / 2**20, 1), "cache_dtype": self.config.cache_dtype,
                "device": self.device,
                "load_seconds": {k: round(v, 2) for k, v in self.seconds.items()}}


def config_model(config: AdapterTaskConfig, *, backbone: nn.Module, num_labels: int) -> SuffixClassifier:
    """`build_model` with the config's shape, initialisation and seed."""
    return build_model(backbone, num_labels=num_labels, adapter_layers=config.adapter_layers,
                       bottleneck=config.bottleneck, adapter_init_std=config.adapter_init_std,
                       head_dropout=config.head_dropout, seed=config.seed)


def initial_parameters(model: nn.Module) -> dict[str, np.ndarray]:
    """The shared parts of `model` as flat float32 vectors."""
    named = dict(model.named_parameters())
    return {part: torch.cat([named[n].detach().reshape(-1).float().cpu() for n in names]).numpy().copy()
            for part, names in shared_parts(model).items()}


def build_adapter_task(config: AdapterTaskConfig, *, dataset: TextDataset, backbone: nn.Module, tokenizer: Any,
                       progress: bool = True, device: str | torch.device = "cpu") -> AdapterTask:
    """The task over a given corpus (with movie groups) and frozen backbone, on `device`: partition,
    cache, initialise. The backbone is moved to `device`."""
    t0 = time.perf_counter()
    device = str(torch.device(device))
    backbone.requires_grad_(False).eval().to(device)
    if config.max_length > backbone.config.max_position_embeddings:
        raise ValueError(f"max_length {config.max_length} exceeds the backbone's positions")
    split = prefix_split(backbone, config.adapter_layers)
    parts = movie_clients(dataset, num_clients=config.num_clients, test_fraction=config.test_fraction,
                          public_fraction=config.public_fraction, seed=config.seed)
    t1 = time.perf_counter()
    cache = cache_prefix(backbone, tokenizer, dataset.texts, dataset.label_array(), max_length=config.max_length,
                         split=split, dtype=CACHE_DTYPES[config.cache_dtype], progress=progress)
    clients = {number: AdapterClient(train=cache.take(s.train).to(device), test=cache.take(s.test).to(device),
                                     movies=movies, train_index=s.train, test_index=s.test)
               for number, (s, movies) in enumerate(zip(parts.clients, parts.movies), start=1)}
    public = PublicSplit(examples=cache.take(parts.public).to(device), index=parts.public, movies=parts.public_movies)
    del cache
    seconds = {"data": t1 - t0, "cache": time.perf_counter() - t1}
    initial = initial_parameters(config_model(config, backbone=backbone, num_labels=dataset.num_labels))
    return AdapterTask(config=config, clients=clients, public=public, initial=initial, num_labels=dataset.num_labels,
                       label_names=dataset.label_names, corpus=dataset, backbone=backbone, split=split,
                       seconds=seconds, device=device)


def load_adapter_task(config: AdapterTaskConfig = AdapterTaskConfig(), *, progress: bool = True,
                      device: str | torch.device = "cpu") -> AdapterTask:
    """Load the deduplicated Rotten Tomatoes corpus (as `load_bag_task`) and the backbone, then build
    on `device`."""
    from nlp_models.data.loaders import load_rt_sentiment

    t0 = time.perf_counter()
    data = load_rt_sentiment(max_examples=config.max_examples, seed=config.seed, dedupe=True)
    t1 = time.perf_counter()
    backbone, tokenizer = load_named_backbone(config.backbone)
    t2 = time.perf_counter()
    task = build_adapter_task(config, dataset=data, backbone=backbone, tokenizer=tokenizer, progress=progress,
                              device=device)
    return replace(task, seconds={"data": t1 - t0 + task.seconds["data"], "backbone": t2 - t1,
                                  "cache": task.seconds["cache"]})


def shadow_clients(task: AdapterTask, *, n_clients: int, examples_per_client: int,
                   seed: int) -> dict[int, AdapterClient]:
    """`n_clients` shadow clients (ids 1..n) on disjoint random subsets of `task.public`, each of
    `examples_per_client` snippets split train/test like a real client (`client_splits`, stratified,
    the task's test_fraction): what an attacker holding the public movies could simulate.

    SIMPLIFICATION: subsets are random snippets, not whole movies as real clients hold.
    """
    public = task.public
    total = n_clients * examples_per_client
    if n_clients < 1 or examples_per_client < 2:
        raise ValueError("need n_clients >= 1 and examples_per_client >= 2 (one train, one test)")
    if total > len(public):
        raise ValueError(f"{n_clients} x {examples_per_client} snippets exceed the {len(public)} public ones")
    chosen = np.random.default_rng(np.random.SeedSequence([seed, int.from_bytes(b"shadow", "big")])).permutation(
        len(public))[:total]
    partition = Partition(tuple(np.arange(k * examples_per_client, (k + 1) * examples_per_client)
                                for k in range(n_clients)), total, "shadow")
    tf = task.config.test_fraction
    labels = public.examples.labels.cpu().numpy()[chosen]
    out = {}
    for number, s in enumerate(client_splits(partition, ratios=(1 - tf, 0.0, tf), seed=seed, labels=labels), start=1):
        rows_train, rows_test = chosen[s.train], chosen[s.test]
        index = np.concatenate([public.index[rows_train], public.index[rows_test]])
        out[number] = AdapterClient(train=_rows(public.examples, rows_train), test=_rows(public.examples, rows_test),
                                    movies=len({task.corpus.groups[i] for i in index}),
                                    train_index=public.index[rows_train], test_index=public.index[rows_test])
    return out


def _rows(split: CachedSplit, rows: np.ndarray) -> CachedSplit:
    """Rows of a split (copies), trimmed to their longest snippet."""
    idx = torch.as_tensor(np.asarray(rows, dtype=np.int64))
    mask = split.attention_mask[idx]
    width = max(int(mask.sum(dim=1).max()), 1) if len(idx) else 1
    return CachedSplit(split.hidden[idx, :width].clone(), mask[:, :width].clone(), split.labels[idx].clone())


__all__ = ["ADAPTERS_PART", "HEAD_PART", "ADAPTER_SET", "BACKBONES", "CACHE_DTYPES", "OPTIMIZERS", "logits",
           "per_example_loss", "mean_loss", "metrics", "shared_parts", "build_model",
           "RowCache", "cache_prefix", "AdapterTaskConfig", "AdapterClient",
           "PublicSplit", "AdapterTask", "config_model", "initial_parameters", "build_adapter_task",
           "load_adapter_task", "shadow_clients"]
