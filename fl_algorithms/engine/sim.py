"""Simulation runner: all clients in this process, every upload through the secure layer.

Each round: sample a cohort, broadcast, run client updates, secure-sum the Masked parts, update
the server state from the AggregateView alone, evaluate on the clients, checkpoint. A run killed
at any point resumes from the last completed round with nothing lost (atomic checkpoints of the
server state, client states, trainers and the RNG).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from fl_algorithms.api import Algorithm, ClientContext, Upload
from fl_algorithms.engine.secure_sum import SecureAggregationConfig, SecureAggregator, SecureRoundStats
from fl_algorithms.training.trainer import LocalTrainer


@dataclass(frozen=True)
class RunConfig:
    rounds: int = 10
    clients_per_round: int | None = None
    """Cohort size; None means every client every round."""
    seed: int = 0
    """Seeds cohort sampling and simulated dropouts (not any cryptographic randomness)."""
    dropout: float = 0.0
    """Simulated probability that a sampled client drops at the masked-input stage."""
    eval_split: str = "test"
    secure: SecureAggregationConfig = field(default_factory=SecureAggregationConfig)
    checkpoint_dir: str | None = None

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError("rounds must be at least 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError("dropout must be in [0, 1)")


@dataclass
class RoundRecord:
    round: int
    cohort: list[int]
    contributors: list[int]
    metrics: dict[int, dict[str, float]]
    seconds: float
    secure_seconds: float
    bytes_uploaded: dict[int, int]
    clipped: int

    def mean(self, key: str) -> float:
        vals = [m[key] for m in self.metrics.values() if key in m]
        return float(np.mean(vals)) if vals else float("nan")

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "RoundRecord":
        """Inverse of dataclasses.asdict after a JSON round trip (client ids come back as strings)."""
        return cls(**{**raw, "metrics": {int(k): v for k, v in raw["metrics"].items()},
                      "bytes_uploaded": {int(k): v for k, v in raw["bytes_uploaded"].items()}})


def sample_cohort(rng: np.random.Generator, clients: Iterable[int], size: int | None) -> list[int]:
    """A uniformly random cohort of `size` clients (all of them if size is None or too large)."""
    ids = sorted(clients)
    if size is None or size >= len(ids):
        return ids
    return sorted(int(c) for c in rng.choice(ids, size=size, replace=False))


class SimulationRunner:
    def __init__(self, *, algorithm: Algorithm, trainers: Mapping[int, LocalTrainer], config: RunConfig,
                 initial: Mapping[str, np.ndarray] | None = None,
                 on_round: Callable[[RoundRecord], None] | None = None, ledger=None, transcript=None) -> None:
        if not trainers:
            raise ValueError("no clients")
        if any(c <= 0 for c in trainers):
            raise ValueError("client ids must be positive")
        self.algorithm, self.trainers, self.config = algorithm, dict(trainers), config
        self.ledger = ledger
        self.aggregator = SecureAggregator(config.secure, ledger=ledger, transcript=transcript)
        first = next(iter(self.trainers.values()))
        self.initial = dict(initial) if initial is not None else first.get_shared()
        self.on_round = on_round
        self.state = algorithm.init_state(initial=self.initial)
        self.client_states: dict[int, dict[str, Any]] = {c: {} for c in self.trainers}
        self.history: list[RoundRecord] = []
        self.rng = np.random.default_rng(config.seed)

    # ---- checkpoints --------------------------------------------------------------------------
    @property
    def _ckpt(self) -> Path | None:
        return Path(self.config.checkpoint_dir) if self.config.checkpoint_dir else None

    def save(self) -> None:
        """Write the whole run state atomically: a crash leaves the previous checkpoint intact."""
        root = self._ckpt
        if root is None:
            return
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".tmp-{secrets.token_hex(4)}"
        tmp.mkdir()
        np.savez(tmp / "server_state.npz", **self.state)
        torch.save({"clients": self.client_states, "trainers": {c: t.state_dict() for c, t in self.trainers.items()},
                    "rng": self.rng.bit_generator.state}, tmp / "clients.pt")
        (tmp / "history.json").write_text(json.dumps([asdict(r) for r in self.history]))
        if self.ledger is not None:
            torch.save(self.ledger.state_dict(), tmp / "ledger.pt")
            self.ledger.write(tmp / "ledger.json")
        final = root / "latest"
        old = root / ".old"
        if old.exists():
            shutil.rmtree(old)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)

    def load(self) -> bool:
        """Restore from the last checkpoint, if any. Returns whether one was found."""
        root = self._ckpt
        if root is None:
            return False
        final = root / "latest"
        if not final.exists() and (root / ".old").exists():
            final = root / ".old"  # crashed between the two renames of save()
        if not final.exists():
            return False
        with np.load(final / "server_state.npz") as z:
            self.state = {k: z[k] for k in z.files}
        blob = torch.load(final / "clients.pt", weights_only=False)
        self.client_states = blob["clients"]
        for c, st in blob["trainers"].items():
            self.trainers[c].load_state_dict(st)
        self.rng.bit_generator.state = blob["rng"]
        if self.ledger is not None and (final / "ledger.pt").exists():
            self.ledger.load_state_dict(torch.load(final / "ledger.pt", weights_only=False))
        raw = json.loads((final / "history.json").read_text())
        self.history = [RoundRecord.from_json(r) for r in raw]
        return True

    # ---- rounds -------------------------------------------------------------------------------
    def sample(self) -> list[int]:
        return sample_cohort(self.rng, self.trainers, self.config.clients_per_round)

    def run_round(self, t: int) -> RoundRecord:
        t0 = time.perf_counter()
        cohort = self.sample()
        broadcast = self.algorithm.configure_round(round=t, state=self.state)
        uploads: dict[int, Upload] = {}
        for c in cohort:
            ctx = ClientContext(client_id=c, state=self.client_states[c], trainer=self.trainers[c], round=t)
            uploads[c], new_state = self.algorithm.client_update(broadcast=broadcast, client=ctx)
            self.client_states[c] = dict(new_state)
        drops = {c for c in cohort if self.rng.random() < self.config.dropout}
        stats = SecureRoundStats()
        contributors = cohort
        if any(u.masked or u.released for u in uploads.values()):
            view = self.aggregator.aggregate(round=t, uploads=uploads, drop_at={"masked": drops} if drops else None,
                                             stats=stats, population=sorted(self.trainers))
            self.state = self.algorithm.server_update(state=self.state, view=view)
            contributors = sorted(view.contributors)
        metrics = {}
        for c in sorted(self.trainers):
            m = dict(uploads[c].metrics) if c in uploads else {}
            m.update(self.evaluate_client(c))
            metrics[c] = m
        rec = RoundRecord(round=t, cohort=cohort, contributors=contributors, metrics=metrics,
                          seconds=time.perf_counter() - t0, secure_seconds=stats.seconds,
                          bytes_uploaded=stats.bytes_uploaded, clipped=stats.clipped)
        return rec

    def evaluate_client(self, c: int) -> dict[str, float]:
        """Client-side evaluation of the model the client would use (global parts + its own)."""
        trainer = self.trainers[c]
        shared = self.algorithm.shared_parameters(self.state)
        if shared:
            trainer.set_shared(shared)
        return trainer.evaluate(split=self.config.eval_split)

    def run(self, *, resume: bool = False, progress: bool = True, desc: str = "rounds") -> list[RoundRecord]:
        if resume:
            self.load()
        start = len(self.history) + 1
        bar = tqdm(range(start, self.config.rounds + 1), desc=desc, disable=not progress, leave=False)
        for t in bar:
            rec = self.run_round(t)
            self.history.append(rec)
            self.save()
            bar.set_postfix(acc=f"{rec.mean('accuracy'):.3f}")
            if self.on_round is not None:
                self.on_round(rec)
        return self.history
