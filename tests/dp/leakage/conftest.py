"""A tiny text classifier with an untied embedding (EmbeddingBag + linear head), trained a few SGD
steps per client on known token sets: the synthetic embedding updates the leakage tests attack."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn

VOCAB, DIM, CLASSES = 2000, 8, 4


class BagClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.EmbeddingBag(VOCAB, DIM, mode="mean")
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(tokens))


@dataclass(frozen=True)
class ClientData:
    tokens: torch.Tensor
    labels: torch.Tensor

    @property
    def token_set(self) -> frozenset[int]:
        return frozenset(int(t) for t in self.tokens.unique())


def make_clients(n: int, *, seed: int, docs: int = 4, length: int = 8,
                 private: int = 0, common: int | None = None) -> dict[int, ClientData]:
    """n clients with `docs` documents of `length` tokens; `private` tokens per client are unique to
    it (taken from the top of the vocabulary), the rest are drawn from the first `common` ids."""
    g = torch.Generator().manual_seed(seed)
    pool = common or VOCAB - n * private
    out = {}
    for c in range(1, n + 1):
        toks = torch.randint(0, pool, (docs, length), generator=g)
        if private:
            own = torch.arange(VOCAB - c * private, VOCAB - (c - 1) * private)
            toks.view(-1)[:private] = own
        out[c] = ClientData(toks, torch.randint(0, CLASSES, (docs,), generator=g))
    return out


def initial_model(seed: int = 0) -> BagClassifier:
    torch.manual_seed(seed)
    return BagClassifier()


def embedding_update(base: BagClassifier, data: ClientData, *, steps: int = 2, lr: float = 0.5) -> np.ndarray:
    """Local SGD from `base` on one client's data; returns the flattened embedding update (V*D)."""
    model = BagClassifier()
    model.load_state_dict(base.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(data.tokens), data.labels).backward()
        opt.step()
    return (model.emb.weight.detach() - base.emb.weight.detach()).double().numpy().ravel()


@pytest.fixture(scope="module")
def ten_client_updates() -> tuple[dict[int, np.ndarray], dict[int, ClientData]]:
    base = initial_model()
    clients = make_clients(10, seed=1)
    return {c: embedding_update(base, d) for c, d in clients.items()}, clients


@pytest.fixture(scope="module")
def shadow_client_updates() -> list[tuple[np.ndarray, frozenset[int]]]:
    """12 SHADOW clients (other data, same model and training as `ten_client_updates`): the
    attacker's own simulation, with token sets it knows, for calibrating realistic attacks."""
    base = initial_model()
    return [(embedding_update(base, d), d.token_set) for d in make_clients(12, seed=7).values()]


@dataclass(frozen=True)
class BagToolkit:
    """The helpers above, handed to tests as a fixture (test modules cannot import a conftest)."""

    vocab: int = VOCAB
    dim: int = DIM
    make_clients = staticmethod(make_clients)
    initial_model = staticmethod(initial_model)
    embedding_update = staticmethod(embedding_update)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.vocab, self.dim)


@pytest.fixture(scope="session")
def bag() -> BagToolkit:
    return BagToolkit()


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """Tiny models: intra-op threads only add contention (30x slower on a loaded 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
