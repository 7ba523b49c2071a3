"""A TorchTrainer whose local training is Opacus DP-SGD (example-level DP for each client).

The client's accountant lives in its `OpacusClient` and persists across rounds (and checkpoints);
every round debits the run's ledger and reports the client's example-level epsilon so far. The
protocol's optimiser is built by `OpacusClient` at every round (fresh each round, whatever the
protocol's lifetime says); its lr schedule and clipping are not applied (Opacus clips per example).
"""
from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from dp.opacus_client import DPSGDConfig, LossFn, OpacusClient, calibrate_noise_multiplier
from fl_algorithms.training.trainer import TorchTrainer


class DPTorchTrainer(TorchTrainer):
    def __init__(self, *, dp_client: OpacusClient, train_dataset: Dataset, per_example_loss: LossFn,
                 collate_fn: Callable | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self.protocol.scheduled or self.protocol.max_grad_norm is not None:
            raise ValueError("a protocol's lr schedule and gradient clipping are not applied under DP-SGD "
                             "(Opacus clips per example and builds its optimiser every round)")
        self.dp_client, self.train_dataset = dp_client, train_dataset
        self.per_example_loss, self.collate_fn = per_example_loss, collate_fn
        self._round = 0

    def train(self, *, epochs: int, proximal: Mapping[str, np.ndarray] | None = None, mu: float = 0.0,
              round: int | None = None) -> dict[str, float]:
        if proximal is not None and mu > 0:
            raise NotImplementedError("FedProx's proximal term is not combined with DP-SGD here; use FedAvg or FedOPT")
        if epochs != self.dp_client.config.local_epochs:
            raise ValueError(f"DP-SGD was configured for {self.dp_client.config.local_epochs} local epochs, "
                             f"the algorithm asks for {epochs}")
        self._round += 1
        report = self.dp_client.train_round(
            model=self.model, optimizer_factory=self.protocol.build_optimizer, dataset=self.train_dataset,
            loss_fn=self.per_example_loss, round_id=round if round is not None else self._round,
            collate_fn=self.collate_fn)
        return {"train_loss": report.mean_loss, "steps": float(report.steps), "epsilon": report.epsilon,
                "noise_multiplier": report.noise_multiplier}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "dp": self.dp_client.state_dict(), "dp_round": self._round}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.dp_client.load_state_dict(state["dp"])
        self._round = int(state["dp_round"])


def quiet_dp_libraries() -> None:
    """Silence known, stated notices of Opacus and dp_accounting that would otherwise repeat every client
    and round: the non-secure RNG (a program states it once itself), the full-backward-hook notice (frozen
    inputs: expected), and dp_accounting's dropped RDP orders (epsilon stays an upper bound)."""
    warnings.filterwarnings("ignore", module="opacus")
    warnings.filterwarnings("ignore", message=".*[Ss]ecure RNG.*")
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    logging.getLogger("absl").setLevel(logging.ERROR)


@lru_cache(maxsize=64)
def _noise_multiplier(target: float, delta: float, batches: int, steps: int) -> float:
    return calibrate_noise_multiplier(target_epsilon=target, delta=delta, sample_rate=1.0 / batches, steps=steps)


def calibrated_dpsgd_configs_for(train_sizes: Mapping[int, int], *, batch_size: int, target_epsilon: float,
                                 delta: float, max_grad_norm: float, local_epochs: int, planned_rounds: int,
                                 grad_sample_mode: str) -> dict[int, DPSGDConfig]:
    """Per-client DP-SGD configs at `target_epsilon` for a client sampled in all `planned_rounds` rounds,
    given each client's training-set size: z is calibrated once per distinct loader length (the z
    Opacus' client would solve for: planned_rounds x local epochs x batches steps at rate 1 / batches)."""
    configs = {}
    for c, size in train_sizes.items():
        batches = math.ceil(size / batch_size)
        z = _noise_multiplier(target_epsilon, delta, batches, planned_rounds * local_epochs * batches)
        configs[c] = DPSGDConfig(max_grad_norm=max_grad_norm, noise_multiplier=z, delta=delta, batch_size=batch_size,
                                 local_epochs=local_epochs, planned_rounds=planned_rounds,
                                 grad_sample_mode=grad_sample_mode)
    return configs
