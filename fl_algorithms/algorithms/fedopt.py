"""FedOPT (Reddi et al., "Adaptive Federated Optimization", ICLR 2021, Algorithm 2) and FedAvgM.

Clients train locally from x_t and upload Delta_i = x_i - x_t; the server averages them
(Delta_t = sum_i n_i Delta_i / sum_i n_i, a secure sum) and treats Delta_t as a pseudo-gradient
for a server optimiser. Algorithm 2, with m_{-1} = 0 and v_{-1} = tau^2:

    m_t = beta1 m_{t-1} + (1 - beta1) Delta_t
    FedAdagrad:  v_t = v_{t-1} + Delta_t^2
    FedAdam:     v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2
    FedYogi:     v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)
    x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)

FedAvgM (Hsu et al. 2019; the "FedOPT" of FedNLP, Lin et al. 2022: server SGD with momentum):

    m_t = beta1 m_{t-1} + Delta_t;   x_{t+1} = x_t + eta m_t

so beta1 = 0, eta = 1 is FedAvg exactly. No bias correction (as in the paper).

The code stores the descent direction g_t = -Delta_t and m in that sign (m_code = -m_paper) and
steps x -= eta * step; v depends on Delta_t^2 only, so it is the paper's v. Clients run their
trainer's local optimiser (AdamW in FedNLP). `FedOpt(server_optimizer=...)` picks the rule by
name; `FedAvgM`, `FedAdagrad`, `FedAdam` and `FedYogi` are the same class with the rule fixed.
"""
from __future__ import annotations

import numpy as np

from fl_algorithms.api import AggregateView
from fl_algorithms.algorithms.fedavg import FedAvg, State, params_of

SERVER_OPTIMIZERS = ("sgdm", "adagrad", "adam", "yogi")
"""'sgdm' is FedAvgM's server SGD with momentum; the others are Algorithm 2's adaptive rules."""


class FedOpt(FedAvg):
    name = "fedopt"
    description = "FedOPT (Reddi et al. 2021): server SGD-momentum / Adagrad / Adam / Yogi on the mean update"

    def __init__(self, *, server_optimizer: str = "adam", server_lr: float = 1e-2, beta1: float = 0.9,
                 beta2: float = 0.99, tau: float = 1e-3, local_epochs: int = 1) -> None:
        super().__init__(local_epochs=local_epochs)
        if server_optimizer not in SERVER_OPTIMIZERS:
            raise ValueError(f"server_optimizer must be one of {', '.join(map(repr, SERVER_OPTIMIZERS))}, "
                             f"got {server_optimizer!r}")
        if not server_lr > 0:
            raise ValueError(f"server_lr must be positive, got {server_lr}")
        if not (0 <= beta1 < 1 and 0 <= beta2 < 1):
            raise ValueError(f"beta1 and beta2 must be in [0, 1), got {beta1} and {beta2}")
        if not tau > 0:
            raise ValueError(f"tau must be positive (it bounds the adaptive step), got {tau}")
        self.server_optimizer, self.eta = server_optimizer, server_lr
        self.beta1, self.beta2, self.tau = beta1, beta2, tau

    @property
    def adaptive(self) -> bool:
        """Whether the rule keeps a second moment v (all but server SGD with momentum)."""
        return self.server_optimizer != "sgdm"

    def init_state(self, *, initial) -> State:
        state = super().init_state(initial=initial)
        for part, w in params_of(state).items():
            state[f"opt.m.{part}"] = np.zeros_like(w)
            if self.adaptive:
                # v_{-1} = tau^2, the paper's experiments' choice (Algorithm 2 asks v_{-1} >= tau^2).
                state[f"opt.v.{part}"] = np.full_like(w, self.tau**2)
        return state

    def server_update(self, *, state: State, view: AggregateView) -> State:
        new = dict(state)
        for part, w in params_of(state).items():
            g = -self.mean_update(view, part)
            m = state[f"opt.m.{part}"]
            if not self.adaptive:
                m = self.beta1 * m + g
                new[f"params.{part}"] = (w - self.eta * m).astype(np.float32)
                new[f"opt.m.{part}"] = m.astype(np.float32)
                continue
            v = state[f"opt.v.{part}"]
            m = self.beta1 * m + (1 - self.beta1) * g
            g2 = g * g
            if self.server_optimizer == "adagrad":
                v = v + g2
            elif self.server_optimizer == "adam":
                v = self.beta2 * v + (1 - self.beta2) * g2
            else:
                v = v - (1 - self.beta2) * g2 * np.sign(v - g2)
            new[f"params.{part}"] = (w - self.eta * m / (np.sqrt(v) + self.tau)).astype(np.float32)
            new[f"opt.m.{part}"], new[f"opt.v.{part}"] = m.astype(np.float32), v.astype(np.float32)
        return new


class FedAvgM(FedOpt):
    """Server SGD with momentum (FedNLP's FedOPT); beta1 = 0, server_lr = 1 is FedAvg."""

    name = "fedavgm"
    description = "FedAvgM (Hsu et al. 2019; FedNLP's FedOPT): server SGD with momentum on the mean update"

    def __init__(self, *, server_lr: float = 1.0, beta1: float = 0.9, local_epochs: int = 1) -> None:
        super().__init__(server_optimizer="sgdm", server_lr=server_lr, beta1=beta1, local_epochs=local_epochs)


class FedAdagrad(FedOpt):
    """Algorithm 2 with v_t = v_{t-1} + Delta_t^2."""

    name = "fedadagrad"
    description = "FedAdagrad (Reddi et al. 2021): server Adagrad (with momentum) on the mean update"

    def __init__(self, *, server_lr: float = 1e-2, beta1: float = 0.9, tau: float = 1e-3,
                 local_epochs: int = 1) -> None:
        super().__init__(server_optimizer="adagrad", server_lr=server_lr, beta1=beta1, tau=tau,
                         local_epochs=local_epochs)


class FedAdam(FedOpt):
    """Algorithm 2 with Adam's v (no bias correction)."""

    name = "fedadam"
    description = "FedAdam (Reddi et al. 2021): server Adam (no bias correction) on the mean update"

    def __init__(self, *, server_lr: float = 1e-2, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3,
                 local_epochs: int = 1) -> None:
        super().__init__(server_optimizer="adam", server_lr=server_lr, beta1=beta1, beta2=beta2, tau=tau,
                         local_epochs=local_epochs)


class FedYogi(FedOpt):
    """Algorithm 2 with Yogi's additive v (changes by (1 - beta2) Delta_t^2 per round at most)."""

    name = "fedyogi"
    description = "FedYogi (Reddi et al. 2021): server Yogi on the mean update"

    def __init__(self, *, server_lr: float = 1e-2, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3,
                 local_epochs: int = 1) -> None:
        super().__init__(server_optimizer="yogi", server_lr=server_lr, beta1=beta1, beta2=beta2, tau=tau,
                         local_epochs=local_epochs)
