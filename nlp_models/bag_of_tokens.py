"""A bag-of-token-embeddings classifier and its federated task, built so that the embedding-row
channel of research/dp_leakage.md Sec. 4.2 exists:

    logits = W h + b,   h = mean_{v in x} E[v]          (mean of nn.Embedding rows + linear head)

over the MiniLM WordPiece vocabulary (V = 30,522, no [CLS]/[SEP]), with the token embedding E
(V x D) trained and uploaded. With plain SGD (no momentum, no weight decay) a client's update of E
is non-zero exactly on the rows of tokens in its training data: the attacker's best case, stated
rather than hidden (AdamW with weight decay would touch every row; the research note shows top-k
row norms still recover the set then).

Data (`load_bag_task`): Rotten Tomatoes review snippets (rotten / fresh), exact duplicates dropped
(a duplicated text in both a member and a non-member set would blur membership inference), split
naturally by movie: whole movies are packed into K clients, so movie and actor names make
client-unique tokens as real clients have. Each client keeps 80% of its snippets for training and
20% for test (stratified); the test snippets are the non-members of membership inference.

Initialisation (identical for every setting): E starts from MiniLM's public word embeddings
projected on their top-D principal directions and scaled to mean row norm 1; the head from a
seeded nn.Linear. Starting from public pretrained weights is standard practice for DP NLP.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from nlp_models.data.loaders import load_rt_sentiment
from nlp_models.heads import classification_metrics

EMBEDDING_PART = "embedding"
HEAD_PART = "head"
PAD_ID = 0
"""[PAD] in MiniLM's vocabulary; padded positions are masked out of the mean, so its row never moves."""
SHARED_PARTS: dict[str, list[str]] = {EMBEDDING_PART: ["embedding.weight"], HEAD_PART: ["head.weight", "head.bias"]}
"""Both parts are uploaded: the embedding (the leaking channel) and the head."""
INITS = ("minilm_pca", "random")


class BagOfTokens(nn.Module):
    """Masked mean of trainable token embeddings, then a linear classifier.

    nn.Embedding rather than nn.EmbeddingBag: Opacus' ghost clipping has a per-sample norm
    sampler for Embedding (no B x V x D per-sample gradients), which makes DP-SGD ~10x faster here;
    the function is the same as EmbeddingBag(mode='mean').
    """

    def __init__(self, *, vocab_size: int, dim: int, num_labels: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, dim)
        self.head = nn.Linear(dim, num_labels)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask.unsqueeze(-1)
        pooled = (self.embedding(ids) * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)
        return self.head(pooled)


def pack(seqs: Sequence[np.ndarray], labels: Iterable[int]) -> dict[str, torch.Tensor]:
    """Padded ids [B, T] (T = longest in the batch), a 0/1 mask and labels."""
    width = max((len(x) for x in seqs), default=1)
    ids = np.full((len(seqs), width), PAD_ID, dtype=np.int64)
    mask = np.zeros((len(seqs), width), dtype=np.float32)
    for i, x in enumerate(seqs):
        ids[i, : len(x)] = x
        mask[i, : len(x)] = 1.0
    return {"ids": torch.from_numpy(ids), "mask": torch.from_numpy(mask),
            "labels": torch.as_tensor(np.asarray(list(labels), dtype=np.int64))}


def per_example_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """Cross-entropy per example; also takes Opacus' empty Poisson batch (a list of two empty tensors)."""
    if isinstance(batch, Mapping):
        ids, mask, labels = batch["ids"], batch["mask"], batch["labels"]
    else:  # opacus wrap_collate_with_empty: [zeros(0, len), zeros(0)]
        ids, mask, labels = torch.zeros(0, 1, dtype=torch.long), torch.zeros(0, 1), batch[-1].long()
    return F.cross_entropy(model(ids, mask), labels, reduction="none")


def mean_loss(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return per_example_loss(model, batch).mean()


def metrics(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]]) -> dict[str, float]:
    """Accuracy and mean loss, plus the example count (to pool accuracies over clients)."""
    return classification_metrics((model(b["ids"], b["mask"]), b["labels"]) for b in batches)


@dataclass(frozen=True)
class Examples:
    """Token-id sequences and labels of one client split."""

    ids: tuple[np.ndarray, ...]
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    def batch(self, rows: Sequence[int]) -> dict[str, torch.Tensor]:
        return pack([self.ids[i] for i in rows], self.labels[list(rows)])

    def batches(self, size: int, *, order: Sequence[int] | None = None) -> list[dict[str, torch.Tensor]]:
        order = list(range(len(self))) if order is None else list(order)
        return [self.batch(order[s: s + size]) for s in range(0, len(order), size)]

    def tokens(self) -> frozenset[int]:
        return frozenset(int(t) for seq in self.ids for t in seq)


class ExampleDataset(Dataset):
    """(ids, label) items for Opacus' Poisson data loader (batched by `collate`)."""

    def __init__(self, examples: Examples) -> None:
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.from_numpy(self.examples.ids[i].astype(np.int64)), int(self.examples.labels[i])


def collate(items: Sequence[tuple[torch.Tensor, int]]) -> dict[str, torch.Tensor]:
    return pack([x.numpy() for x, _ in items], [y for _, y in items])


# ---- the federated task ---------------------------------------------------------------------------

@dataclass(frozen=True)
class BagTaskConfig:
    num_clients: int = 40
    max_examples: int | None = None
    """Stratified cap on the (deduplicated) corpus; None keeps all 12.7k snippets."""
    max_length: int = 64
    """WordPiece tokens kept per snippet (snippets average 25)."""
    embed_dim: int = 16
    init: str = "minilm_pca"
    """'minilm_pca' (public pretrained rows, projected) or 'random' (nn.Embedding's N(0, 1))."""
    lr: float = 1.0
    """Client SGD learning rate (bag-of-embeddings models need large steps: each row gets 1/len)."""
    batch_size: int = 16
    test_fraction: float = 0.2
    public_fraction: float = 0.0
    """Share of the movies set aside whole as `BagTask.public`, held by no client: the public data an
    attacker may simulate shadow clients from. 0 keeps every movie for the clients."""
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.public_fraction < 1:
            raise ValueError("public_fraction must be in [0, 1)")
        if self.num_clients < 2:
            raise ValueError("need at least two clients")
        if self.init not in INITS:
            raise ValueError(f"init must be one of {INITS}")
        if self.embed_dim < 1 or self.max_length < 1 or self.batch_size < 1:
            raise ValueError("embed_dim, max_length and batch_size must be positive")
        if not self.lr > 0 or not 0 < self.test_fraction < 1:
            raise ValueError("need lr > 0 and 0 < test_fraction < 1")


@dataclass(frozen=True)
class BagClient:
    train: Examples
    test: Examples
    movies: int

    @property
    def token_set(self) -> frozenset[int]:
        """Every token id in the client's training data: what its embedding update can reveal."""
        return self.train.tokens()


@dataclass(frozen=True)
class BagTask:
    config: BagTaskConfig
    clients: Mapping[int, BagClient]
    """Client id (1..K) -> its data."""
    vocab_size: int
    num_labels: int
    label_names: tuple[str, ...]
    initial: Mapping[str, np.ndarray]
    """The initial shared parameters, one flat float32 vector per part."""
    public: Examples | None = None
    """Snippets of the public movies (BagTaskConfig.public_fraction), held by no client."""

    @property
    def embedding_shape(self) -> tuple[int, int]:
        return (self.vocab_size, self.config.embed_dim)

    def new_model(self) -> BagOfTokens:
        return BagOfTokens(vocab_size=self.vocab_size, dim=self.config.embed_dim, num_labels=self.num_labels)

    def token_sets(self) -> dict[int, frozenset[int]]:
        """Each client's training token set: the ground truth of token-recovery attacks."""
        return {c: d.token_set for c, d in self.clients.items()}

    def summary(self) -> dict[str, Any]:
        sizes = np.array([len(c.train) for c in self.clients.values()])
        sets = [c.token_set for c in self.clients.values()]
        owners: dict[int, int] = {}
        for s in sets:
            for t in s:
                owners[t] = owners.get(t, 0) + 1
        return {"clients": len(self.clients), "train_examples": int(sizes.sum()),
                "test_examples": int(sum(len(c.test) for c in self.clients.values())),
                "train_per_client_min_median_max": [int(sizes.min()), float(np.median(sizes)), int(sizes.max())],
                "tokens_per_client_median": float(np.median([len(s) for s in sets])),
                "distinct_tokens": len(owners), "client_unique_tokens": sum(1 for n in owners.values() if n == 1),
                "movies": int(sum(c.movies for c in self.clients.values())),
                "parameters": int(sum(v.size for v in self.initial.values()))}


def minilm_pca_embedding(dim: int) -> np.ndarray:
    """MiniLM's word embeddings (public weights, read offline) on their top-`dim` principal
    directions, scaled to mean row norm 1. Exact eigendecomposition, signs fixed: deterministic."""
    from safetensors import safe_open

    from nlp_models.backbone import minilm_path

    with safe_open(str(minilm_path() / "model.safetensors"), "np") as f:
        key = next(k for k in f.keys() if k.endswith("word_embeddings.weight"))
        w = f.get_tensor(key).astype(np.float64)
    if dim > w.shape[1]:
        raise ValueError(f"embed_dim {dim} exceeds MiniLM's {w.shape[1]}")
    w -= w.mean(axis=0)
    values, vectors = np.linalg.eigh(w.T @ w)
    top = vectors[:, np.argsort(values)[::-1][:dim]]
    top *= np.sign(top[np.abs(top).argmax(axis=0), np.arange(dim)])
    proj = w @ top
    proj /= np.linalg.norm(proj, axis=1).mean()
    return proj.astype(np.float32)


def initial_parameters(*, vocab_size: int, num_labels: int, config: BagTaskConfig) -> dict[str, np.ndarray]:
    """The shared parts of a seeded model (embedding from MiniLM's PCA rows if asked), as flat vectors."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = BagOfTokens(vocab_size=vocab_size, dim=config.embed_dim, num_labels=num_labels)
    if config.init == "minilm_pca":
        rows = minilm_pca_embedding(config.embed_dim)
        if rows.shape[0] != vocab_size:
            raise ValueError(f"MiniLM has {rows.shape[0]} word embeddings, the tokenizer {vocab_size} tokens")
        with torch.no_grad():
            model.embedding.weight.copy_(torch.from_numpy(rows))
    named = dict(model.named_parameters())
    return {part: torch.cat([named[n].detach().reshape(-1) for n in names]).numpy().copy()
            for part, names in SHARED_PARTS.items()}


def load_bag_task(config: BagTaskConfig = BagTaskConfig()) -> BagTask:
    """Load, deduplicate, partition by movie, tokenize; build the initial parameters."""
    from nlp_models.backbone import load_tokenizer

    from nlp_models.data.partition import movie_clients

    data = load_rt_sentiment(max_examples=config.max_examples, seed=config.seed, dedupe=True)
    labels = data.label_array()
    split = movie_clients(data, num_clients=config.num_clients, test_fraction=config.test_fraction,
                          public_fraction=config.public_fraction, seed=config.seed)
    tokenizer = load_tokenizer()
    encoded = tokenizer(list(data.texts), add_special_tokens=False, truncation=True,
                        max_length=config.max_length)["input_ids"]
    unk = tokenizer.unk_token_id
    ids = [np.asarray(e if e else [unk], dtype=np.int32) for e in encoded]

    def examples(rows: np.ndarray) -> Examples:
        return Examples(tuple(ids[i] for i in rows), labels[rows])

    clients = {number: BagClient(train=examples(s.train), test=examples(s.test), movies=movies)
               for number, (s, movies) in enumerate(zip(split.clients, split.movies), start=1)}
    public = examples(split.public) if len(split.public) else None
    vocab = len(tokenizer)
    return BagTask(config=config, clients=clients, vocab_size=vocab, num_labels=data.num_labels,
                   label_names=data.label_names,
                   initial=initial_parameters(vocab_size=vocab, num_labels=data.num_labels, config=config),
                   public=public)


__all__ = ["EMBEDDING_PART", "HEAD_PART", "PAD_ID", "SHARED_PARTS", "INITS", "BagOfTokens", "pack",
           "per_example_loss", "mean_loss", "metrics", "Examples", "ExampleDataset", "collate", "BagTaskConfig",
           "BagClient", "BagTask", "minilm_pca_embedding", "initial_parameters", "load_bag_task"]
