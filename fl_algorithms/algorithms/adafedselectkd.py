"""AdaFedSelectKD and AdaFedKD (Feng et al., adapter-based federated selective knowledge distillation
for multi-domain summarisation): a frozen encoder-decoder with two adapter sets in its top decoder
layers, a global adapter A_g (the server's parameters, a "parameter container", not optimised) and a
local adapter A_l (the client's summariser, optimised).

For a target sequence y and each target position t (Sec. III-C, Eqs. 6-8):

    p_g,t = p(. | y_<t, x; A_g)          teacher, no gradient
    p_l,t = p(. | y_<t, x; A_l)          student
    H_t   = - sum_w p_g,t(w) log p_g,t(w)                                              (Eq. 7)
    m_t   = 1[H_t < tau]    (AdaFedSelectKD)        m_t = 1  (AdaFedKD)
    L     = mean_t CE(p_l,t, y_t)  +  lambda mean_t m_t KL(p_g,t || p_l,t)     lambda = 0.2 (Eqs. 6, 8)

The KL term is averaged over all target tokens (masked ones count as zero), so the selection removes
distillation rather than re-weighting the tokens that remain. Entropies are in nats. The paper's
tau = 5 was set for BART's 50,265-word vocabulary (maximum entropy ln 50,265 = 10.83 nats);
`scaled_threshold` rescales it by the ratio of maximum entropies, 5 x ln 30,522 / ln 50,265 = 4.77
for the BERT vocabulary of the MiniLM-based generator.

Server and uploads. The paper's global adapter "is only responsible for passing parameters and will
not be optimized": only A_l trains, and the server averages the clients' updates into the next round's
A_g, while each client keeps its own A_l (it is not overwritten by the server's parameters). Here the
upload is the client's A_l after local training, as a Masked delta against the round's A_g, so the
server's FedAvg gives A_g^{t+1} = weighted mean of the clients' A_l, and only that secure sum is ever
seen. A_l is the client's private state between rounds (A_g^0 in the first round).
NOTE: the issue that specified this module reads "only the global adapter is uploaded; the local
adapter never leaves the client"; since the paper's A_g is never optimised, that reading would upload
the server's own parameters back. We follow the paper; what leaves a client is its A_l inside a
secure sum, never in the clear.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch
from torch.nn import functional as F

from fl_algorithms.algorithms.fedavg import FedAvg
from fl_algorithms.api import ClientContext, Masked, Upload

GLOBAL, LOCAL = "global", "local"
"""Adapter-set names: A_g (the server's parameters) and A_l (the client's summariser)."""
ADAPTER_PART = "adapter"
"""The one shared part: the uploaded adapter (A_l as a delta against A_g)."""
LAMBDA = 0.2
PAPER_THRESHOLD = 5.0
PAPER_VOCAB = 50_265
"""BART's vocabulary, for which the paper chose tau = 5."""


def scaled_threshold(vocab_size: int, *, threshold: float = PAPER_THRESHOLD, paper_vocab: int = PAPER_VOCAB) -> float:
    """The paper's entropy threshold rescaled to a vocabulary of `vocab_size` words by the ratio of
    the maximum entropies ln(V) / ln(V_paper)."""
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be at least 2, got {vocab_size}")
    return threshold * math.log(vocab_size) / math.log(paper_vocab)


class DistillTerms(NamedTuple):
    """One batch's objective: `loss` (to minimise) and what the paper reports about it."""

    loss: torch.Tensor
    cross_entropy: float
    kl: float
    """The mean over target tokens of m_t KL(p_g,t || p_l,t) (before lambda)."""
    selected: int
    """Target tokens whose KL term counted (m_t = 1)."""
    tokens: int


def selective_kd_loss(student_logp: torch.Tensor, teacher_logp: torch.Tensor, target: torch.Tensor, *,
                      lam: float = LAMBDA, threshold: float | None, ignore_index: int = -100) -> DistillTerms:
    """Eqs. 6-8 on (B, T, V) log-probabilities of the local (student) and global (teacher) adapters.

    `threshold=None` is AdaFedKD (every token distils); otherwise AdaFedSelectKD keeps the KL term
    where the teacher's entropy is below `threshold` nats. Positions where `target == ignore_index`
    (padding) count nowhere. The teacher gets no gradient.
    """
    if student_logp.shape != teacher_logp.shape or student_logp.shape[:2] != target.shape:
        raise ValueError(f"shapes differ: student {tuple(student_logp.shape)}, teacher {tuple(teacher_logp.shape)}, "
                         f"target {tuple(target.shape)}")
    if lam < 0 or (threshold is not None and not threshold > 0):
        raise ValueError("need lambda >= 0 and a positive threshold (or None)")
    valid = target != ignore_index
    tokens = int(valid.sum())
    if tokens == 0:
        raise ValueError("no target tokens in the batch")
    teacher_logp = teacher_logp.detach()
    cross_entropy = F.nll_loss(student_logp[valid], target[valid])
    teacher_p = teacher_logp.exp()
    kl = (teacher_p * (teacher_logp - student_logp)).sum(-1)                   # KL(p_g || p_l) per token
    keep = valid
    if threshold is not None:
        entropy = -(teacher_p * teacher_logp).sum(-1)                          # Eq. 7, nats
        keep = valid & (entropy < threshold)
    kl_mean = (kl * keep).sum() / tokens
    loss = cross_entropy + lam * kl_mean
    return DistillTerms(loss, float(cross_entropy.detach()), float(kl_mean.detach()), int(keep.sum()), tokens)


class SummaryAdapterModel(Protocol):
    """What the objective needs: target log-probabilities with one adapter set active."""

    def adapter_log_probs(self, batch: Any, *, adapter: str) -> torch.Tensor:
        """(B, T, V) log p(y_t | y_<t, x) under teacher forcing with only `adapter` active."""

    def targets(self, batch: Any) -> torch.Tensor:
        """(B, T) target ids, -100 at padding."""


class DistillObjective:
    """Eq. 8 on one batch of a two-adapter client: CE of A_l plus lambda times the (selective) KL
    from A_g; `threshold=None` is AdaFedKD. Accumulates the selected-token share over a round."""

    def __init__(self, *, lam: float = LAMBDA, threshold: float | None) -> None:
        if lam < 0 or (threshold is not None and not threshold > 0):
            raise ValueError("need lambda >= 0 and a positive threshold (or None)")
        self.lam, self.threshold = lam, threshold
        self.selected = self.tokens = 0

    def __call__(self, model: SummaryAdapterModel, batch: Any) -> torch.Tensor:
        with torch.no_grad():
            teacher = model.adapter_log_probs(batch, adapter=GLOBAL)
        student = model.adapter_log_probs(batch, adapter=LOCAL)
        terms = selective_kd_loss(student, teacher, model.targets(batch), lam=self.lam, threshold=self.threshold)
        self.selected += terms.selected
        self.tokens += terms.tokens
        return terms.loss

    def reset(self) -> None:
        self.selected = self.tokens = 0

    @property
    def kd_token_share(self) -> float:
        """Share of target tokens whose KL term counted since the last reset (paper: 86-89%)."""
        return self.selected / self.tokens if self.tokens else float("nan")


class DistillTrainer(Protocol):
    """A two-adapter client trainer the algorithm can drive."""

    num_examples: int

    def load_adapter_set(self, name: str, vector: np.ndarray) -> None: ...
    def adapter_vector(self, name: str) -> np.ndarray: ...
    def fit(self, *, epochs: int, objective: Any, round: int | None = None) -> dict[str, float]: ...


class AdaFedSelectKD(FedAvg):
    """Server: FedAvg of the uploaded adapter. Client: A_g <- server's parameters, A_l trained with
    Eq. 8 (selective when `threshold` is set, AdaFedKD when it is None), A_l uploaded as a delta."""

    name = "adafedselectkd"

    def __init__(self, *, lam: float = LAMBDA, threshold: float | None, local_epochs: int = 1) -> None:
        super().__init__(local_epochs=local_epochs)
        self.lam, self.threshold = lam, threshold
        DistillObjective(lam=lam, threshold=threshold)  # validates

    def init_state(self, *, initial: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if set(initial) != {ADAPTER_PART}:
            raise ValueError(f"{self.name} shares exactly the part {ADAPTER_PART!r}, got {sorted(initial)}")
        return super().init_state(initial=initial)

    def client_update(self, *, broadcast: Mapping[str, np.ndarray], client: ClientContext
                      ) -> tuple[Upload, Mapping[str, Any]]:
        trainer: DistillTrainer = client.trainer
        received = broadcast[ADAPTER_PART]
        trainer.load_adapter_set(GLOBAL, received)                 # A_g <- the round's global parameters
        local = client.state.get(LOCAL)
        trainer.load_adapter_set(LOCAL, received if local is None else local)   # A_l: kept, A_g^0 the first time
        objective = DistillObjective(lam=self.lam, threshold=self.threshold)
        metrics = dict(trainer.fit(epochs=self.local_epochs, objective=objective, round=client.round))
        metrics["kd_token_share"] = objective.kd_token_share
        trained = trainer.adapter_vector(LOCAL)
        delta = trained - received                                 # A_l leaves only inside the secure sum
        upload = Upload(masked={ADAPTER_PART: Masked(delta, weight=trainer.num_examples)}, metrics=metrics)
        return upload, {**client.state, LOCAL: trained}

    def evaluate(self, *, parameters: Mapping[str, np.ndarray], client: ClientContext,
                 split: str) -> dict[str, float]:
        """The client's summariser is its A_l (A_g^t before its first round), not the server's A_g."""
        local = client.state.get(LOCAL)
        client.trainer.load_adapter_set(LOCAL, parameters[ADAPTER_PART] if local is None else local)
        return client.trainer.evaluate(split=split)


class AdaFedKD(AdaFedSelectKD):
    """AdaFedSelectKD without selection: every target token distils."""

    name = "adafedkd"

    def __init__(self, *, lam: float = LAMBDA, local_epochs: int = 1) -> None:
        super().__init__(lam=lam, threshold=None, local_epochs=local_epochs)


__all__ = ["GLOBAL", "LOCAL", "ADAPTER_PART", "LAMBDA", "PAPER_THRESHOLD", "PAPER_VOCAB", "scaled_threshold",
           "DistillTerms", "selective_kd_loss", "DistillObjective", "AdaFedSelectKD", "AdaFedKD"]
