"""Fresh clients' first local runs, computed once and shared by the runs of a grid that repeat them.

Runs of one grid unit (a task, partition and seed: FedAvg under SecAgg+, its plaintext twin, FedOPT)
start every client from the same model with the same seed and the same local objective, so each
client's first local run is the same computation in each of them where their clients train alike
(FedAvgM differs from FedAvg only on the server, the twin only in how the uploads are summed; under
FedNLP's protocol FedOPT's clients run AdamW and FedAvg's SGD, so only the twin shares FedAvg's).
`FirstRunMemo` keeps that run's outcome (the trainer's state after it and its metrics) under a digest
of everything the run reads that can differ between runs: the client and its seed, every trainable
parameter before the run (the broadcast model included), the epochs, the training protocol (its
optimiser, the optimiser's lifetime, the schedule and the clipping) and FedProx's anchor and mu. A
later run with the same digest restores the stored state instead of training: on a deterministic
device, bit for bit what it would have computed (tests compare whole runs with and without). An
optimiser that is fresh each round is not part of the stored state (it is rebuilt at the next run),
so the restore stays exact.

What the digest does not cover is the memo's scope: the client's data, frozen weights and loss,
so a memo serves one formulation instance (one set of clients) only.
"""
from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class FirstRunMemo:
    """Outcomes of fresh clients' first local runs by digest, with the training seconds they took."""

    runs: dict[bytes, tuple[dict[str, Any], dict[str, float], float]] = field(default_factory=dict)
    hits: int = 0
    reused_seconds: float = 0.0
    """Training seconds the restored runs took when they were computed (summed over hits)."""

    @staticmethod
    def digest(*, client_id: int, seed: int, model: torch.nn.Module, optimizer: Any, epochs: int,
               proximal: Mapping[str, np.ndarray] | None, mu: float) -> bytes:
        """Everything a fresh client's first run reads that differs between the runs of one grid unit."""
        h = hashlib.blake2b(digest_size=32)
        h.update(repr((client_id, seed, epochs, float(mu), repr(optimizer))).encode())
        for name, p in model.named_parameters():
            if p.requires_grad:
                h.update(name.encode())
                h.update(p.detach().cpu().contiguous().numpy().tobytes())
        if proximal is not None and mu > 0:
            for part in sorted(proximal):
                h.update(part.encode())
                h.update(np.ascontiguousarray(proximal[part]).tobytes())
        return h.digest()

    def restore(self, key: bytes) -> tuple[dict[str, Any], dict[str, float]] | None:
        """A copy of the stored (trainer state, metrics) for `key`, counted as a hit; None if absent."""
        found = self.runs.get(key)
        if found is None:
            return None
        state, metrics, seconds = found
        self.hits += 1
        self.reused_seconds += seconds
        return copy.deepcopy(state), dict(metrics)

    def store(self, key: bytes, state: dict[str, Any], metrics: Mapping[str, float], *, seconds: float) -> None:
        """Keep `state` (a copy no trainer holds, as `TorchTrainer.state_dict` returns) and `metrics`."""
        self.runs[key] = (state, dict(metrics), float(seconds))


__all__ = ["FirstRunMemo"]
