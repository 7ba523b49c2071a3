"""A TorchTrainer whose local training is Opacus DP-SGD (example-level DP for each client).

The client's accountant lives in its `OpacusClient` and persists across rounds (and checkpoints);
every round debits the run's ledger and reports the client's example-level epsilon so far.
"""
from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from dp.opacus_client import LossFn, OpacusClient
from fl_algorithms.training.trainer import TorchTrainer


class DPTorchTrainer(TorchTrainer):
    def __init__(self, *, dp_client: OpacusClient, train_dataset: Dataset, per_example_loss: LossFn,
                 collate_fn: Callable | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
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
            model=self.model, optimizer_factory=lambda ps: self.optimizer_config.build(ps), dataset=self.train_dataset,
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
