"""A toy `AdapterModel` for algorithm tests: a frozen base, named adapter sets mixed like adapter sites
(h + sum_s w_s A_s(h)), named heads; it records the mixing of every representation pass."""
import torch
from torch import nn


class ToyAdapterModel(nn.Module):
    def __init__(self, *, sets, heads, frozen=(), seed: int = 0, d: int = 6, hidden: int = 8, classes: int = 3):
        super().__init__()
        torch.manual_seed(seed)
        self.base = nn.Linear(d, hidden).requires_grad_(False)
        self.adapters = nn.ModuleDict({s: nn.Linear(hidden, hidden) for s in sets})
        for s in frozen:
            self.adapters[s].requires_grad_(False)
        self.heads = nn.ModuleDict({h: nn.Linear(hidden, classes) for h in heads})
        self.calls: list[dict[str, float]] = []

    def represent(self, batch, *, mixing):
        self.calls.append(dict(mixing))
        h = torch.tanh(self.base(batch["x"]))
        return h + sum(w * self.adapters[s](h) for s, w in mixing.items())

    def classify(self, head, representation):
        return self.heads[head](representation)

    def labels(self, batch):
        return batch["y"]
