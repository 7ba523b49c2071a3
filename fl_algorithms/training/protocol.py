"""The declared training protocol around an algorithm: what the papers fix besides the algorithm's equations.

An algorithm says what a client optimises and what the server does with the uploads; a paper's numbers
also depend on how the client optimises: which optimiser with which arguments, whether its state lives
across rounds or is built afresh each round, the learning-rate schedule and its warmup, gradient clipping,
how much local work a round does, where the model is evaluated, which round is reported, and the numeric
precision. `TrainingProtocol` declares all of them in one frozen object, with a citation (paper and
section, or the public code's file) or a stated reason for every field, so that a run's header,
`config.toml` and `results.json` say how it trained.

One place builds client optimisers (`TrainingProtocol.build_optimizer`, through `OptimizerConfig.build`)
and one loop applies the schedule and the clipping (`fl_algorithms.training.loop.run_epochs`); the
trainers (`TorchTrainer`, `AdapterTrainer`, `FullFineTuneTrainer`, ...) honour the lifetime through
`round_optimizer`, which rebuilds the optimiser at the start of every local run when it is fresh.

Presets (`PRESETS`; each builds the protocol of one algorithm at the experiment's learning rate):

    fednlp          FedNLP's (Lin et al., 2022): SGD for FedAvg and FedProx, AdamW for FedOPT's clients,
                    a fresh optimiser and a linear warmup-and-decay schedule every round, clip norm 1.0
    federated-norm  a fresh AdamW each round, constant lr, no clipping: the federated norm (and the
                    all-AdamW control row of a FedNLP grid)
    kept-adamw      AdamW kept across rounds, constant lr, no clipping: this toolkit's behaviour before
                    protocols were declared, so that older results can be reproduced and named
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where an optimiser is built: parsers read PRESETS before torch loads
    import torch
    from torch import nn

OPTIMIZERS = ("sgd", "adam", "adamw")
FRESH, KEPT = "fresh each round", "kept across rounds"
LIFETIMES = (FRESH, KEPT)
SCHEDULES = ("constant", "linear")
"""'constant': the base lr after any warmup; 'linear': warmup, then a linear decay to 0 at the round's
last step (transformers' get_linear_schedule_with_warmup, which FedNLP's trainer uses)."""
EVALUATION_POINTS = ("after aggregation", "after local adaptation", "personal model")
SELECTIONS = ("last round", "best validation round")
PRECISIONS = ("fp32", "bf16", "fp16")
CITED = ("optimizer", "lifetime", "schedule", "warmup", "clipping", "local_work", "evaluation", "selection",
         "precision")
"""The aspects of a protocol that each need a citation or a stated reason (`TrainingProtocol.cite`)."""


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """A client optimiser and its arguments; `build` is the one place that makes client optimisers."""

    name: str = "adamw"
    """'adamw', 'adam' or 'sgd'."""
    lr: float = 5e-4
    weight_decay: float = 0.0
    momentum: float = 0.0
    """SGD only."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam and AdamW only."""
    eps: float = 1e-8
    """Adam and AdamW only."""

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.name!r}; choose from {', '.join(OPTIMIZERS)}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"optimizer lr must be a positive number, got {self.lr}")
        if not self.weight_decay >= 0:
            raise ValueError(f"optimizer weight_decay must be non-negative, got {self.weight_decay}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"optimizer momentum must be in [0, 1), got {self.momentum}")
        if self.name != "sgd" and self.momentum != 0:
            raise ValueError(f"momentum is an SGD argument; {self.name} takes betas")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"optimizer betas must be two numbers in [0, 1), got {self.betas}")
        if not self.eps > 0:
            raise ValueError(f"optimizer eps must be positive, got {self.eps}")

    def build(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        import torch

        params = list(params)
        if self.name == "adamw":
            return torch.optim.AdamW(params, lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay)
        if self.name == "adam":
            return torch.optim.Adam(params, lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay)
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)

    def describe(self) -> str:
        extra = [f"wd={self.weight_decay:g}"] if self.weight_decay else []
        if self.name == "sgd" and self.momentum:
            extra.append(f"momentum={self.momentum:g}")
        if self.name != "sgd" and self.betas != (0.9, 0.999):
            extra.append(f"betas={self.betas[0]:g},{self.betas[1]:g}")
        return f"{self.name}(lr={self.lr:g}{''.join(', ' + e for e in extra)})"


@dataclass(frozen=True, kw_only=True)
class TrainingProtocol:
    """How a client trains in every round, every aspect cited or reasoned (`cite`, keyed by `CITED`)."""

    name: str
    """The preset's name ('fednlp', 'federated-norm', 'kept-adamw', ...) or the experiment's."""
    optimizer: OptimizerConfig
    lifetime: str
    """FRESH ('fresh each round': rebuilt at the start of every local run) or KEPT ('kept across rounds')."""
    lifetime_reason: str
    schedule: str = "constant"
    warmup_fraction: float = 0.0
    """Warmup length as a fraction of a round's optimiser steps (rounded up, as FedNLP's trainer)."""
    warmup_steps: int = 0
    """Warmup length in steps; exclusive with `warmup_fraction`."""
    max_grad_norm: float | None = None
    """Gradients clipped to this total norm before every step; None: no clipping."""
    local_epochs: int | None = 1
    local_steps: int | None = None
    """Optimiser steps per round instead of epochs (exactly one of the two is set)."""
    evaluation: str = "after aggregation"
    selection: str = "last round"
    precision: str = "fp32"
    cite: Mapping[str, str] = field(default_factory=dict)
    """Per aspect of `CITED`: the paper's section (or the public code) it follows, or why it differs."""

    def __post_init__(self) -> None:
        if not self.name or not self.name.strip():
            raise ValueError("a training protocol needs a name")
        if not isinstance(self.optimizer, OptimizerConfig):
            raise TypeError(f"optimizer must be an OptimizerConfig, got {type(self.optimizer).__name__}")
        for value, allowed, what in ((self.lifetime, LIFETIMES, "lifetime"), (self.schedule, SCHEDULES, "schedule"),
                                     (self.evaluation, EVALUATION_POINTS, "evaluation"),
                                     (self.selection, SELECTIONS, "selection"),
                                     (self.precision, PRECISIONS, "precision")):
            if value not in allowed:
                raise ValueError(f"{what} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
        if not self.lifetime_reason.strip():
            raise ValueError("lifetime_reason must say why the optimiser is fresh or kept")
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError(f"warmup_fraction must be in [0, 1), got {self.warmup_fraction}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be non-negative, got {self.warmup_steps}")
        if self.warmup_fraction and self.warmup_steps:
            raise ValueError("give warmup_fraction or warmup_steps, not both")
        if self.max_grad_norm is not None and not (math.isfinite(self.max_grad_norm) and self.max_grad_norm > 0):
            raise ValueError(f"max_grad_norm must be a positive number or None, got {self.max_grad_norm}")
        if (self.local_epochs is None) == (self.local_steps is None):
            raise ValueError("set exactly one of local_epochs and local_steps")
        if any(n is not None and n < 1 for n in (self.local_epochs, self.local_steps)):
            raise ValueError("local_epochs and local_steps must be at least 1")
        cite = dict(self.cite)
        missing = [k for k in CITED if not str(cite.get(k, "")).strip()]
        unknown = sorted(set(cite) - set(CITED))
        if missing or unknown:
            raise ValueError(f"cite needs a citation or a stated reason for every aspect of {', '.join(CITED)}; "
                             f"missing {missing}, unknown {unknown}")
        object.__setattr__(self, "cite", {k: str(cite[k]) for k in CITED})  # a copy, in CITED order

    def __hash__(self) -> int:  # `cite` is a dict: hash the whole record instead
        return hash(json.dumps(self.to_dict(), sort_keys=True))

    # ---- what the trainers use --------------------------------------------------------------------
    @property
    def fresh(self) -> bool:
        """Whether the client optimiser is rebuilt at the start of every local run."""
        return self.lifetime == FRESH

    @property
    def scheduled(self) -> bool:
        """Whether the lr changes within a round (a warmup, or a decay)."""
        return self.schedule != "constant" or bool(self.warmup_fraction or self.warmup_steps)

    def build_optimizer(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        """The client optimiser over `params` (for a fresh lifetime, call at the start of every local run)."""
        return self.optimizer.build(params)

    def warmup_for(self, total_steps: int) -> int:
        """Warmup steps of a round of `total_steps` steps: `warmup_steps`, else ceil(fraction x total)."""
        return self.warmup_steps or math.ceil(total_steps * self.warmup_fraction)

    def lr_factor(self, step: int, total_steps: int) -> float:
        """The lr multiplier of a round's `step`-th optimiser step (0-based), as transformers' schedules
        with warmup compute it: step / warmup during the warmup (0 at the first step), then 1 (constant) or
        (total - step) / (total - warmup) (linear)."""
        warmup = self.warmup_for(total_steps)
        if step < warmup:
            return step / max(1, warmup)
        if self.schedule == "constant":
            return 1.0
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    def lr_at(self, step: int, total_steps: int) -> float:
        return self.optimizer.lr * self.lr_factor(step, total_steps)

    # ---- records ----------------------------------------------------------------------------------
    def describe(self) -> str:
        """One compact line for a run's header."""
        warmup = (f" warmup={self.warmup_steps}steps" if self.warmup_steps else
                  f" warmup={100 * self.warmup_fraction:g}%" if self.warmup_fraction else "")
        work = f"epochs={self.local_epochs}" if self.local_epochs is not None else f"steps={self.local_steps}"
        clip = "none" if self.max_grad_norm is None else f"{self.max_grad_norm:g}"
        return (f"protocol={self.name} optimizer={self.optimizer.describe()} {self.lifetime.replace(' ', '-')} "
                f"schedule={self.schedule}{warmup} clip={clip} {work} eval={self.evaluation.replace(' ', '-')} "
                f"select={self.selection.replace(' ', '-')} {self.precision}")

    def to_dict(self) -> dict[str, Any]:
        """Every field as JSON/TOML-ready values (None where unset; `config.toml` lists those under _none)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, OptimizerConfig):
                value = {g.name: (list(v) if isinstance(v := getattr(value, g.name), tuple) else v)
                         for g in fields(value)}
            elif isinstance(value, Mapping):
                value = dict(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainingProtocol:
        """The inverse of `to_dict` (a saved run's protocol)."""
        raw = dict(data)
        optimizer = dict(raw.pop("optimizer"))
        if "betas" in optimizer:
            optimizer["betas"] = tuple(optimizer["betas"])
        return cls(optimizer=OptimizerConfig(**optimizer), **raw)


# ---- presets -------------------------------------------------------------------------------------------
FEDNLP_TRAINER = "FedNLP's public trainer (training/tc_transformer_trainer.py, build_optimizer)"
FEDNLP_ARGS = "FedNLP's model/transformer/model_args.py"
COMMON_CITES = {
    "evaluation": "the global model after aggregation, on each client's test split (and pooled over them: "
                  "FedNLP's global test set, its server's test_on_the_server; FedNLP Sec. 4, Table 2)",
    "selection": "the last round: FedNLP's text does not say which round Table 2 reports (its trainer logs the "
                 "current and the best accuracy); the last round is the model a deployment would ship",
    "precision": "fp32: FedNLP's model_args.py sets fp16, but tc_transformer_trainer.py runs no autocast or "
                 "GradScaler, so its training is fp32",
}


def _local(local_epochs: int) -> str:
    return (f"{local_epochs} local epoch(s) per round (FedNLP Sec. 4: 'The local epoch number is set to 1 for all "
            "experiments'; another count is the experiment's stated choice)")


def fednlp_protocol(algorithm: str, *, lr: float, local_epochs: int = 1,
                    sgd_lr: float | None = None) -> TrainingProtocol:
    """FedNLP's protocol for `algorithm`: SGD (no momentum, no weight decay) for every algorithm but
    'fedopt', whose clients run AdamW (eps 1e-8, no weight decay); either built afresh with a linear
    warmup (6% of the round's steps) and decay every round, gradients clipped to norm 1.0. `lr` is
    AdamW's; `sgd_lr` SGD's (None: the same `lr` for both, as FedNLP's scripts pass one --lr; an
    experiment that chose each optimiser's lr on validation passes both, as FedNLP's paper reports
    per-method 'selected hyper-parameters')."""
    adamw = algorithm == "fedopt"
    optimizer = OptimizerConfig(name="adamw" if adamw else "sgd", lr=lr if adamw or sgd_lr is None else sgd_lr)
    one_lr = ("one client lr for every algorithm (its run_text_classification.sh --lr)" if sgd_lr is None else
              f"each optimiser's lr chosen on validation (SGD {sgd_lr:g}, AdamW {lr:g}): FedNLP Sec. 4 leaves 'the "
              f"selected hyper-parameters' to its supplementary material, while its public scripts pass one --lr; "
              f"an lr chosen for AdamW leaves SGD's adapters near their initialisation in a few local steps")
    which = ("FedOPT's ClientOpt is AdamW (FedNLP Sec. 2.2, App. F.3: 'we set the ClientOpt to be AdamW')" if adamw
             else "SGD: FedNLP Sec. 2.2 ('The original FedAvg algorithm implicitly sets SERVEROPT and CLIENTOPT to "
                  "be SGD') and App. F.3 ('assuming both client and server use the SGD optimizer'); FedProx adds "
                  "its proximal term to the same local SGD")
    return TrainingProtocol(
        name="fednlp", optimizer=optimizer, lifetime=FRESH,
        lifetime_reason="FedNLP's trainer builds the optimiser and its schedule at every local run (train_model "
                        "calls build_optimizer)",
        schedule="linear", warmup_fraction=0.06, max_grad_norm=1.0, local_epochs=local_epochs,
        cite={"optimizer": f"{which}; {FEDNLP_TRAINER}: AdamW(lr, eps=1e-8) if fl_algorithm == 'FedOPT' else "
                           f"SGD(lr); {one_lr}",
              "lifetime": f"{FEDNLP_TRAINER}, called by every train_model (FedNLP Sec. 2.2, Algorithm 1: "
                          f"ClientOpt runs each round's local steps from x^(t))",
              "schedule": f"{FEDNLP_TRAINER}: get_linear_schedule_with_warmup over the round's steps "
                          f"(len(train_dl) x epochs), rebuilt every round",
              "warmup": f"{FEDNLP_ARGS}: warmup_ratio 0.06, warmup_steps = ceil(0.06 x the round's steps)",
              "clipping": f"{FEDNLP_TRAINER.split(',')[0]}): clip_grad_norm_ to max_grad_norm before every step; "
                          f"{FEDNLP_ARGS}: max_grad_norm 1.0",
              "local_work": _local(local_epochs), **COMMON_CITES})


def federated_norm_protocol(algorithm: str, *, lr: float, local_epochs: int = 1,
                            sgd_lr: float | None = None) -> TrainingProtocol:
    """A fresh AdamW each round at a constant lr, no clipping, for every algorithm: the federated norm,
    and the all-AdamW control row beside FedNLP's protocol. (`algorithm` is accepted for a uniform
    preset signature; the protocol is the same for every algorithm.)"""
    del algorithm, sgd_lr  # the same AdamW for every algorithm
    return TrainingProtocol(
        name="federated-norm", optimizer=OptimizerConfig(name="adamw", lr=lr), lifetime=FRESH,
        lifetime_reason="the federated norm: client optimiser state is not part of the federated state (FedNLP "
                        "Sec. 2.2, Algorithm 1; Reddi et al. 2021, Algorithm 2: ClientOpt restarts from x^(t) each "
                        "round), and a sampled client may never have trained before",
        cite={"optimizer": "AdamW for every algorithm: FedNLP Sec. 2.2 sets AdamW as ClientOpt 'given that AdamW "
                           "is widely used in NLP'; the all-AdamW control beside FedNLP's SGD rows",
              "lifetime": "FedNLP Sec. 2.2, Algorithm 1 and Reddi et al. 2021, Algorithm 2 (each round's local run "
                          "starts the client optimiser afresh)",
              "schedule": "constant lr: differs from FedNLP's per-round linear schedule so that this control "
                          "differs from the old runs by the optimiser's lifetime alone",
              "warmup": "none (as the schedule: a constant lr)",
              "clipping": "none: differs from FedNLP's trainer (norm 1.0), as in this toolkit's runs before",
              "local_work": _local(local_epochs), **COMMON_CITES},
        local_epochs=local_epochs)


def kept_protocol(optimizer: OptimizerConfig, *, name: str | None = None, local_epochs: int = 1,
                  reason: str | None = None) -> TrainingProtocol:
    """`optimizer` built once per client and kept across rounds, constant lr, no clipping: how every
    trainer here trained before protocols were declared (a trainer given only an `OptimizerConfig` gets
    this, so that older results reproduce bit for bit)."""
    return TrainingProtocol(
        name=name or f"kept-{optimizer.name}", optimizer=optimizer, lifetime=KEPT,
        lifetime_reason=reason or "this toolkit's behaviour before protocols were declared: the client optimiser's "
                                  "state is kept as private client state across rounds; named so that older "
                                  "results can be reproduced",
        cite={"optimizer": f"{optimizer.name} at the experiment's lr: this toolkit's earlier default; FedNLP "
                           f"Sec. 2.2 names AdamW as FedOPT's ClientOpt only",
              "lifetime": "differs from FedNLP (fresh each round, its build_optimizer) and from the federated "
                          "norm: kept to reproduce earlier results",
              "schedule": "constant lr: this toolkit's earlier default (FedNLP: linear warmup and decay per round)",
              "warmup": "none: this toolkit's earlier default (FedNLP: 6% of a round's steps)",
              "clipping": "none: this toolkit's earlier default (FedNLP: norm 1.0)",
              "local_work": _local(local_epochs), **COMMON_CITES},
        local_epochs=local_epochs)


def fresh_protocol(optimizer: OptimizerConfig, *, name: str = "federated-norm", local_epochs: int = 1,
                   experiment: str = "this experiment") -> TrainingProtocol:
    """`optimizer` built afresh at every local run, constant lr, no clipping: the federated norm, for the
    experiments that reproduce no paper's training (the privacy frontier and the like). For plain SGD
    (no momentum, no weight decay) it is the same computation as a kept optimiser, which holds no state."""
    return TrainingProtocol(
        name=name, optimizer=optimizer, lifetime=FRESH,
        lifetime_reason="the federated norm: client optimiser state is not part of the federated state (Reddi et "
                        "al. 2021, Algorithm 2: ClientOpt restarts from x^(t) each round)",
        cite={"optimizer": f"{optimizer.describe()}: {experiment}'s own choice (it reproduces no paper's training)",
              "lifetime": "the federated norm (Reddi et al. 2021, Algorithm 2)",
              "schedule": "constant lr: no paper to follow; the fewest moving parts",
              "warmup": "none (a constant lr)",
              "clipping": "none in the optimiser (DP mechanisms clip what they need themselves)",
              "local_work": f"{local_epochs} local epoch(s) per round: {experiment}'s setting",
              "evaluation": "the global model after aggregation, on each client's test split",
              "selection": "the last round (no model selection)",
              "precision": "fp32"},
        local_epochs=local_epochs)


def kept_adamw_protocol(algorithm: str, *, lr: float, local_epochs: int = 1,
                        sgd_lr: float | None = None) -> TrainingProtocol:
    """AdamW kept across rounds for every algorithm: what the FedNLP examples ran before (named, so that
    those results can be reproduced)."""
    del algorithm, sgd_lr  # the same AdamW for every algorithm
    return kept_protocol(OptimizerConfig(name="adamw", lr=lr), name="kept-adamw", local_epochs=local_epochs)


@dataclass(frozen=True, kw_only=True)
class Preset:
    """A named protocol that depends on the algorithm and the experiment's client lr."""

    name: str
    summary: str
    build: Callable[..., TrainingProtocol]

    def for_algorithm(self, algorithm: str, *, lr: float, local_epochs: int = 1,
                      sgd_lr: float | None = None) -> TrainingProtocol:
        """The protocol of `algorithm` at the experiment's client `lr` (and `sgd_lr` for a preset's SGD
        clients, where it has any; the all-AdamW presets ignore it)."""
        return self.build(algorithm, lr=lr, local_epochs=local_epochs, sgd_lr=sgd_lr)


FEDNLP = Preset(name="fednlp", build=fednlp_protocol,
                summary="FedNLP's: SGD for FedAvg/FedProx, AdamW for FedOPT's clients; fresh each round, "
                        "linear warmup (6%) and decay, clip norm 1.0")
FEDERATED_NORM = Preset(name="federated-norm", build=federated_norm_protocol,
                        summary="a fresh AdamW each round, constant lr, no clipping (the all-AdamW control)")
KEPT_ADAMW = Preset(name="kept-adamw", build=kept_adamw_protocol,
                    summary="AdamW kept across rounds, constant lr, no clipping (this toolkit's runs before)")
PRESETS: dict[str, Preset] = {p.name: p for p in (FEDNLP, FEDERATED_NORM, KEPT_ADAMW)}


def preset(name: str) -> Preset:
    """The preset called `name` (a clear error naming the choices otherwise)."""
    if name not in PRESETS:
        raise ValueError(f"unknown training protocol {name!r}; choose from {', '.join(PRESETS)}")
    return PRESETS[name]


__all__ = ["OPTIMIZERS", "FRESH", "KEPT", "LIFETIMES", "SCHEDULES", "EVALUATION_POINTS", "SELECTIONS", "PRECISIONS",
           "CITED", "OptimizerConfig", "TrainingProtocol", "fednlp_protocol", "federated_norm_protocol",
           "kept_protocol", "kept_adamw_protocol", "fresh_protocol", "Preset", "FEDNLP", "FEDERATED_NORM", "KEPT_ADAMW", "PRESETS",
           "preset"]
