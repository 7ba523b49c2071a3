"""FedOPT (Reddi et al., "Adaptive Federated Optimization", ICLR 2021).

The server treats the negative mean update as a pseudo-gradient and steps a server optimiser:

    g_t = -mean_i Delta_i
    SGD-momentum:  m_t = beta1 m_{t-1} + g_t;                          w_{t+1} = w_t - eta m_t
    Adam:          m_t = beta1 m + (1-beta1) g_t;  v_t = beta2 v + (1-beta2) g_t^2
    Yogi:          m_t as Adam;  v_t = v - (1-beta2) g_t^2 sign(v - g_t^2)
                   w_{t+1} = w_t - eta m_t / (sqrt(v_t) + tau)

as in the paper's Algorithm 2 (no bias correction). Clients run AdamW locally (FedNLP's choice).
"""
from __future__ import annotations

import numpy as np

from fl_algorithms.api import AggregateView
from fl_algorithms.algorithms.fedavg import FedAvg, State, params_of


class FedOpt(FedAvg):
    name = "fedopt"

    def __init__(self, *, server_optimizer: str = "adam", server_lr: float = 1e-2, beta1: float = 0.9,
                 beta2: float = 0.99, tau: float = 1e-3, local_epochs: int = 1) -> None:
        super().__init__(local_epochs=local_epochs)
        if server_optimizer not in ("sgdm", "adam", "yogi"):
            raise ValueError("server_optimizer must be 'sgdm', 'adam' or 'yogi'")
        self.server_optimizer, self.eta = server_optimizer, server_lr
        self.beta1, self.beta2, self.tau = beta1, beta2, tau

    def init_state(self, *, initial) -> State:
        state = super().init_state(initial=initial)
        for part, w in params_of(state).items():
            state[f"opt.m.{part}"] = np.zeros_like(w)
            # Yogi and Adam start from v_0 = tau^2 as in the paper's experiments.
            state[f"opt.v.{part}"] = np.full_like(w, self.tau**2)
        return state

    def server_update(self, *, state: State, view: AggregateView) -> State:
        new = dict(state)
        for part, w in params_of(state).items():
            g = -self.mean_update(view, part)
            m, v = state[f"opt.m.{part}"], state[f"opt.v.{part}"]
            if self.server_optimizer == "sgdm":
                m = self.beta1 * m + g
                step = m
            else:
                m = self.beta1 * m + (1 - self.beta1) * g
                g2 = g * g
                if self.server_optimizer == "adam":
                    v = self.beta2 * v + (1 - self.beta2) * g2
                else:
                    v = v - (1 - self.beta2) * g2 * np.sign(v - g2)
                step = m / (np.sqrt(v) + self.tau)
            new[f"params.{part}"] = (w - self.eta * step).astype(np.float32)
            new[f"opt.m.{part}"], new[f"opt.v.{part}"] = m.astype(np.float32), v.astype(np.float32)
        return new
