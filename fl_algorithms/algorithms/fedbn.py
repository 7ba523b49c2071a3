"""FedBN (Li, Jiang, Zhang, Kamp and Dou, "FedBN: Federated Learning on Non-IID Features via Local
Batch Normalization", ICLR 2021), and FedAvg with local fine-tuning: two of ATC's Table 2 baselines.

    FedBN      FedAvg over every shared part except the normalisation layers, which each client keeps
               (here the LayerNorms of the adapted transformer layers: part 'norm'; a transformer has
               no batch norm, so this is FedBN's rule applied to its normalisation layers)
    FedAvg+FT  FedAvg; each client evaluates after `finetune_epochs` local epochs from the global model
               (the fine-tuned copy is thrown away: the next round starts from the global model again)
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fl_algorithms.algorithms.fedavg import FedAvg, State
from fl_algorithms.api import ClientContext


class FedBN(FedAvg):
    name = "fedbn"
    description = "FedBN (Li et al. 2021): FedAvg with the normalisation layers kept local"

    def __init__(self, *, local_parts: Sequence[str] = ("norm",), local_epochs: int = 1) -> None:
        super().__init__(local_epochs=local_epochs)
        if not local_parts:
            raise ValueError("FedBN needs at least one local (normalisation) part")
        self.local_parts = tuple(local_parts)

    def init_state(self, *, initial: Mapping[str, np.ndarray]) -> State:
        missing = set(self.local_parts) - set(initial)
        if missing:
            raise ValueError(f"the model has no parts {sorted(missing)} to keep local (it has {sorted(initial)})")
        return super().init_state(initial={k: v for k, v in initial.items() if k not in self.local_parts})


class FedAvgFT(FedAvg):
    name = "fedavg_ft"
    description = "FedAvg, evaluated after a few local fine-tuning epochs from the global model"

    def __init__(self, *, finetune_epochs: int = 1, local_epochs: int = 1) -> None:
        super().__init__(local_epochs=local_epochs)
        if finetune_epochs < 1:
            raise ValueError("finetune_epochs must be at least 1")
        self.finetune_epochs = finetune_epochs

    def evaluate(self, *, parameters: Mapping[str, np.ndarray], client: ClientContext, split: str) -> dict[str, float]:
        trainer = client.trainer
        saved = trainer.state_dict()
        if parameters:
            trainer.set_shared(parameters)
        try:
            trainer.train(epochs=self.finetune_epochs, round=client.round)
            return trainer.evaluate(split=split)
        finally:
            trainer.load_state_dict(saved)


__all__ = ["FedBN", "FedAvgFT"]
