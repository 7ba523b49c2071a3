"""Centralized: one model trained on the pooled data of all clients (an upper reference, not FL).

No secure aggregation is involved because no federated round happens; each 'round' is one pass
of local epochs over the pooled data, evaluated on every client's own test split.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from fl_algorithms.engine.sim import RoundRecord
from fl_algorithms.training.trainer import LocalTrainer


def run_centralized(*, trainer: LocalTrainer, rounds: int, epochs_per_round: int = 1,
                    evaluate: Callable[[LocalTrainer], Mapping[int, dict[str, float]]]) -> list[RoundRecord]:
    history = []
    for t in range(1, rounds + 1):
        t0 = time.perf_counter()
        trainer.train(epochs=epochs_per_round)
        metrics = {c: dict(m) for c, m in evaluate(trainer).items()}
        history.append(RoundRecord(round=t, cohort=[], contributors=[], metrics=metrics,
                                   seconds=time.perf_counter() - t0, secure_seconds=0.0, bytes_uploaded={}, clipped=0))
    return history
