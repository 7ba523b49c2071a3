"""The client-side training contract algorithms rely on, and a PyTorch implementation of it.

Algorithms see a trainer only through `LocalTrainer`: shared parameters as named flat float
vectors, a local training call (with an optional FedProx proximal term), and evaluation. The
torch trainer keeps the model, the data and (optionally) the client's DP-SGD accountant, and trains
under a declared `TrainingProtocol` (`fl_algorithms.training.protocol`): its optimiser (rebuilt at the
start of every local run when the lifetime is 'fresh each round', else kept across rounds), and its
schedule and clipping (applied by `run_epochs`).
"""
from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from fl_algorithms.training.loop import run_epochs, seeded, sequence_seed
from fl_algorithms.training.memo import FirstRunMemo
from fl_algorithms.training.protocol import OptimizerConfig, TrainingProtocol, kept_protocol


class LocalTrainer(Protocol):
    num_examples: int

    def get_shared(self) -> dict[str, np.ndarray]: ...
    def set_shared(self, params: Mapping[str, np.ndarray]) -> None: ...
    def train(self, *, epochs: int, proximal: Mapping[str, np.ndarray] | None = None, mu: float = 0.0,
              round: int | None = None) -> dict[str, float]:
        """Local epochs (FedProx: + mu/2 ||w - proximal||^2 on the shared parameters); `round` is the
        global FL round, for trainers that account per round."""
        ...

    def evaluate(self, *, split: str = "test") -> dict[str, float]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


def flatten(params: Sequence[torch.Tensor]) -> np.ndarray:
    if not params:
        return np.zeros(0, dtype=np.float32)
    return torch.cat([p.detach().reshape(-1).float().cpu() for p in params]).numpy().copy()


def unflatten_(params: Sequence[torch.Tensor], vec: np.ndarray) -> None:
    total = sum(p.numel() for p in params)
    if vec.shape != (total,):
        raise ValueError(f"vector of shape {vec.shape} for {total} parameters")
    t = torch.from_numpy(np.ascontiguousarray(vec, dtype=np.float32))
    off = 0
    with torch.no_grad():
        for p in params:
            p.copy_(t[off : off + p.numel()].view_as(p))
            off += p.numel()


Batch = Mapping[str, torch.Tensor]
LossFn = Callable[[nn.Module, Batch], torch.Tensor]
MetricFn = Callable[[nn.Module, Iterable[Batch]], dict[str, float]]


class TorchTrainer:
    """A LocalTrainer for a torch module with named groups of shared parameters.

    `shared` maps a part name (e.g. 'global_adapter') to the parameter names it contains; every
    other trainable parameter stays on the client (private). `loss_fn(model, batch)` returns the
    training loss; `metric_fn(model, batches)` evaluates. `protocol` says how the client trains; a
    trainer given only `optimizer` keeps it across rounds at a constant lr (`kept_protocol`: how every
    trainer trained before protocols were declared).
    """

    def __init__(self, *, model: nn.Module, shared: Mapping[str, Sequence[str]], train_batches: Callable[[], Iterable[Batch]],
                 eval_batches: Mapping[str, Callable[[], Iterable[Batch]]], num_examples: int, loss_fn: LossFn,
                 metric_fn: MetricFn, optimizer: OptimizerConfig = OptimizerConfig(),
                 protocol: TrainingProtocol | None = None) -> None:
        self.model = model
        named = dict(model.named_parameters())
        missing = [n for names in shared.values() for n in names if n not in named]
        if missing:
            raise KeyError(f"shared parameters not in the model: {missing[:5]}")
        self._shared = {part: [named[n] for n in names] for part, names in shared.items()}
        self.train_batches, self.eval_batches = train_batches, eval_batches
        self.num_examples = num_examples
        self.loss_fn, self.metric_fn = loss_fn, metric_fn
        self.protocol = protocol if protocol is not None else kept_protocol(optimizer)
        self._optimizer: torch.optim.Optimizer | None = None

    @property
    def optimizer_config(self) -> OptimizerConfig:
        return self.protocol.optimizer

    def trainable(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def optimizer(self) -> torch.optim.Optimizer:
        """The client's current optimiser (built by the protocol on first use)."""
        if self._optimizer is None:
            self._optimizer = self.protocol.build_optimizer(self.trainable())
        return self._optimizer

    def round_optimizer(self) -> torch.optim.Optimizer:
        """The optimiser of a new local run: rebuilt (empty state) when the protocol's lifetime is fresh
        each round, else the one kept across rounds."""
        if self.protocol.fresh:
            self._optimizer = None
        return self.optimizer()

    def get_shared(self) -> dict[str, np.ndarray]:
        return {part: flatten(ps) for part, ps in self._shared.items()}

    def set_shared(self, params: Mapping[str, np.ndarray]) -> None:
        for part, vec in params.items():
            unflatten_(self._shared[part], vec)

    def train(self, *, epochs: int, proximal: Mapping[str, np.ndarray] | None = None, mu: float = 0.0,
              round: int | None = None) -> dict[str, float]:
        """Local epochs; `round` is the global FL round (for accounting), unused here."""
        self.model.train()
        opt = self.round_optimizer()
        anchors = {}
        if proximal is not None and mu > 0:
            for part, vec in proximal.items():
                t = torch.from_numpy(np.ascontiguousarray(vec, dtype=np.float32))
                off = 0
                for p in self._shared[part]:
                    anchors[p] = t[off : off + p.numel()].view_as(p).to(p.device)
                    off += p.numel()

        def proximal_term() -> torch.Tensor:  # FedProx: + mu/2 ||w - w_global||^2 on the shared parameters
            return 0.5 * mu * sum(((p - a) ** 2).sum() for p, a in anchors.items())

        return run_epochs(batches=self.train_batches, loss=lambda batch: self.loss_fn(self.model, batch),
                          optimizer=opt, epochs=epochs, penalty=proximal_term if anchors else None,
                          protocol=self.protocol)

    def evaluate(self, *, split: str = "test") -> dict[str, float]:
        self.model.eval()
        with torch.inference_mode():
            return self.metric_fn(self.model, self.eval_batches[split]())

    def state_dict(self) -> dict[str, Any]:
        """Trainable parameters and optimiser state only (copies): frozen weights are not client
        state and would make every checkpoint as large as the backbone. An optimiser that is fresh
        each round is no state between rounds (None)."""
        kept = self._optimizer is not None and not self.protocol.fresh
        return {"trainable": {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad},
                "optimizer": copy.deepcopy(self._optimizer.state_dict()) if kept else None}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        named = dict(self.model.named_parameters())
        missing = set(state["trainable"]) - set(named)
        if missing:
            raise KeyError(f"checkpoint has parameters the model lacks: {sorted(missing)[:5]}")
        with torch.no_grad():
            for n, t in state["trainable"].items():
                named[n].copy_(t)
        if state.get("optimizer") is not None:
            self.optimizer().load_state_dict(copy.deepcopy(state["optimizer"]))


class SeededTorchTrainer(TorchTrainer):
    """A TorchTrainer whose every local run is seeded by (seed, client id, runs so far).

    The run counter is part of the checkpoint, so a resumed run repeats the uninterrupted one, and
    two runs that differ only in the aggregation protocol differ only by what the aggregation did.
    With `first_runs`, the client's first local run is looked up there and stored there (`FirstRunMemo`:
    runs of one grid unit that repeat it compute it once).
    """

    def __init__(self, *, client_id: int, seed: int, first_runs: FirstRunMemo | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.client_id, self.seed, self.calls = client_id, seed, 0
        self.first_runs = first_runs

    def train(self, *, epochs: int, proximal: Mapping[str, np.ndarray] | None = None, mu: float = 0.0,
              round: int | None = None) -> dict[str, float]:
        memo = self.first_runs if self.calls == 0 and self._optimizer is None else None
        key = None if memo is None else memo.digest(client_id=self.client_id, seed=self.seed, model=self.model,
                                                    optimizer=self.protocol, epochs=epochs,
                                                    proximal=proximal, mu=mu)
        if memo is not None and (found := memo.restore(key)) is not None:
            state, metrics = found
            self.load_state_dict(state)  # trainable parameters, optimiser state and the run count
            return metrics
        start = time.perf_counter()
        with seeded(sequence_seed(self.seed, self.client_id, self.calls)):
            self.calls += 1
            metrics = super().train(epochs=epochs, proximal=proximal, mu=mu, round=round)
        if memo is not None:
            memo.store(key, self.state_dict(), metrics, seconds=time.perf_counter() - start)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "calls": self.calls}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.calls = int(state["calls"])
