"""Adapter clients over a frozen backbone: FedMCP's global and private adapters and its baselines.

A client owns its adapter sets (in the top layers, `nlp_models.frozen_prefix.TopEncoder`) and its
heads (`nlp_models.classifiers.AdapterClassifier`) and trains on cached prefix states
(`nlp_models.frozen_prefix.CachedSplit`). A `MethodModel` says which adapter sets a method's clients
have, which of them train and which leave the client; `FEDMCP_MODEL`, `BASELINE_MODEL` and
`LOCAL_MODEL` are the ones of FedMCP's comparison (Zhao et al. 2024, Sec. V-B), `LORA_MODEL` its
FedLR baseline (LoRA through peft, `nlp_models.lora`; no adapters) and `MOON_MODEL` MOON's client
(the baselines' adapters plus frozen copies of the global and previous ones).

`AdapterTrainer` implements the LocalTrainer protocol (with FedProx's/Ditto's proximal term),
FedMCP's ``fit``/``load_adapter_set``, MOON's ``load_adapter_sets`` and FedRep's
``train_head``/``train_body``. `FullFineTuneTrainer` is FedAvg (Full FT): every backbone
weight trains and is uploaded. Both run `fl_algorithms.training.loop.run_epochs`, seeded per call,
under `TrainConfig.protocol` (default: Adam kept across rounds at `lr`, constant, no clipping: how
these clients trained before protocols were declared). `fedmcp_protocol` is FedMCP's declared protocol
(Zhao et al. 2024, Sec. V-C), every field cited, with the optimiser's lifetime selectable.

Both trainers report two evaluation points: ``accuracy`` is the model the engine evaluates (after
aggregation: the round's averaged shared parts under the client's own private parts and heads), and
``accuracy_before_aggregation`` (`BEFORE_AGGREGATION`) the model as the client's own last local run left
it (its just-trained shared parts), the personal model as trained locally. FedMCP's paper does not say
which of the two its Table I reports (issue 55), so both are kept.
"""
from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset, TensorDataset

from fl_algorithms.algorithms import moon
from fl_algorithms.algorithms.fedmcp import (FULL_MODEL, GLOBAL, GLOBAL_PART, HEAD_FULL, HEAD_GLOBAL, PRIVATE,
                                             REFERENCE, LossTerms)
from fl_algorithms.training.loop import run_epochs, seeded, tagged_seed
from fl_algorithms.training.protocol import FRESH, KEPT, OptimizerConfig, TrainingProtocol, kept_protocol
from fl_algorithms.training.trainer import flatten, unflatten_
from nlp_models.adapters import (AdapterConfig, attach_adapters, flatten_parameters, load_parameters_, load_set_,
                                 set_parameters, set_trainable_sets)
from nlp_models.classifiers import AdapterClassifier, FullModel, HeadsAndLabels, make_head
from nlp_models.data.cross_task import ClientData
from nlp_models.frozen_prefix import CachedSplit, TopEncoder, dummy_if_empty
from nlp_models.heads import TextClassifier
from nlp_models.lora import LoraSettings, add_lora, lora_parameters


@dataclass(frozen=True)
class TrainConfig:
    batch_size: int = 64
    lr: float = 5e-4
    eval_batch_size: int = 128
    dp: Any = None
    """A dp.opacus_client.DPSGDConfig for example-level DP-SGD, or None."""
    dp_delta: float = 1e-5
    backbone_dropout: bool = False
    """Dropout inside the frozen adapted layers (off by default; the classifier heads keep theirs)."""
    bf16: bool = False
    """bfloat16 autocast in the encoder layers (off under DP: Opacus' per-sample gradients stay float32)."""
    adapter_init_std: float = 1e-2
    """Std of every adapter's up-projection at initialisation: near identity, not exactly (Houlsby et
    al. 2019 use 1e-2). At 0 every adapter set starts as the exact identity, so FedMCP's global,
    private and averaged representations coincide, CKA sits at its maximum and L_c has no gradient."""
    protocol: TrainingProtocol | None = None
    """How the clients train (optimiser, its lifetime, schedule, clipping); None: Adam at `lr` kept across
    rounds, constant lr, no clipping (`kept_protocol`). Its lr must be `lr`."""

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.eval_batch_size < 1:
            raise ValueError("batch sizes must be positive")
        if not self.lr > 0:
            raise ValueError("lr must be positive")
        if not 0 <= self.adapter_init_std < 1:
            raise ValueError("adapter_init_std must be in [0, 1)")
        if self.protocol is not None and self.protocol.optimizer.lr != self.lr:
            raise ValueError(f"the protocol's lr {self.protocol.optimizer.lr:g} is not the config's lr {self.lr:g}")
        if self.dp is not None and self.protocol is not None and (self.protocol.scheduled
                                                                  or self.protocol.max_grad_norm is not None):
            raise ValueError("a protocol's lr schedule and gradient clipping are not applied under DP-SGD "
                             "(Opacus clips per example and builds its optimiser every round)")

    @property
    def training_protocol(self) -> TrainingProtocol:
        """`protocol`, or the kept Adam these clients ran before protocols were declared."""
        return self.protocol if self.protocol is not None else kept_protocol(OptimizerConfig(name="adam", lr=self.lr),
                                                                            name="kept-adam")


FEDMCP_PROTOCOLS: Mapping[str, str] = {"fedmcp": KEPT, "fedmcp-fresh": FRESH}
"""FedMCP's declared protocols by name and the optimiser lifetime each names: 'fedmcp' keeps each client's
Adam across rounds (what every FedMCP run here did before protocols were declared); 'fedmcp-fresh' builds
it afresh at every local run. The paper is silent on the lifetime (issue 55 item 3)."""
FEDMCP_PAPER = "FedMCP (Zhao et al. 2024)"
BEFORE_AGGREGATION = "accuracy_before_aggregation"
"""Metric of the second evaluation point: the client's model as its own last local run left it."""


def fedmcp_protocol(name: str = "fedmcp", *, method: str = "fedmcp", lr: float = 5e-4, precision: str = "fp32",
                    fedrep_head_epochs: int = 10, dp: bool = False) -> TrainingProtocol:
    """FedMCP's training protocol (Sec. V-C) for the clients of `method` in FedMCP's comparison, every aspect
    cited: Adam at `lr` (the paper's 5e-4), constant, no clipping, one local epoch per round, evaluated after
    aggregation, last round; the lifetime named by `name` (`FEDMCP_PROTOCOLS`) and `precision` ('fp32' or
    'bf16', the encoder's autocast) are the two choices the paper leaves open. The baselines train under the
    same protocol (Sec. V-B: they keep FedMCP's architecture for a fair comparison)."""
    if name not in FEDMCP_PROTOCOLS:
        raise ValueError(f"unknown FedMCP training protocol {name!r}; choose from {', '.join(FEDMCP_PROTOCOLS)}")
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"FedMCP's precision must be 'fp32' or 'bf16', got {precision!r}")
    lifetime = FEDMCP_PROTOCOLS[name]
    paper_lr = lr == 5e-4
    lr_note = ("lr 5e-4 as Sec. V-C ('searched ... from {1e-3, 5e-4, 1e-4, 5e-5} and set 5e-4')" if paper_lr else
               f"lr {lr:g}: differs from Sec. V-C's 5e-4 (set by --lr)")
    if lifetime == KEPT:
        reason = ("the paper does not say (Sec. V-C names Adam only); kept across rounds is what every FedMCP run "
                  "here did before protocols were declared, so those results reproduce exactly")
        lifetime_cite = (f"{reason}. Issue 55: once L_a's gradient vanishes a kept Adam, whose second moment has "
                         "decayed with it, rescales mu x L_c to full-size steps; 'fedmcp-fresh' is the control")
    else:
        reason = ("the paper does not say; a fresh Adam every local run is the federated norm (client optimiser "
                  "state is not federated state: Reddi et al. 2021, Algorithm 2; FedNLP Sec. 2.2) and the control "
                  "for the kept Adam's rescaling of mu x L_c (issue 55)")
        lifetime_cite = (f"{reason}; Algorithm 1's LocalUpdate restarts each round from the received averaged "
                         "global adapter and keeps only the private adapter as client state")
    if method == "fedrep":
        work = (f"one epoch of the representation per round (Sec. V-C: 'training one epoch per round') after "
                f"{fedrep_head_epochs} epochs of FedRep's head step (FedRep's own schedule; a fresh lifetime builds "
                f"the optimiser for each of the two steps)")
    elif method == "ditto":
        work = ("one epoch of the global and one of the personal model per round (Ditto's two problems, one "
                "optimiser; a fresh lifetime builds it for each)")
    else:
        work = "one local epoch per round (Sec. V-C: 'The six clients participated in 25 communication rounds, " \
               "training one epoch per round'; Algorithm 1's E)"
    if precision == "fp32":
        precision_cite = ("fp32: the paper trained on a Tesla V100 (Sec. V-C), which has no bf16 arithmetic, and "
                          "names no mixed precision")
    else:
        precision_cite = ("bf16 autocast in the encoder's adapted layers (and in the frozen-prefix cache, computed on "
                          "the CPU, where that CPU runs bf16; adapters, heads, pooling, losses and CKA stay fp32): "
                          "differs from the paper (a V100, "
                          "Sec. V-C, has no bf16), for speed where bf16 is faster (a GPU from Ampere on, a CPU with AMX); L_c's CKAs "
                          "lie within about 1e-3 of 1, near bf16's resolution (issue 55)")
        if dp:
            precision_cite += "; under DP-SGD the adapted layers run fp32 (Opacus' per-sample gradients)"
    evaluation = ("after aggregation: each client's test split under the round's averaged global adapter with the "
                  "client's own private adapter and heads (the engine evaluates after the server's update); the "
                  "paper does not say which point Table I reports, so the model as the client's last local run left "
                  f"it (before aggregation) is reported beside it as '{BEFORE_AGGREGATION}'")
    return TrainingProtocol(
        name=name, optimizer=OptimizerConfig(name="adam", lr=lr), lifetime=lifetime, lifetime_reason=reason,
        local_epochs=1, precision=precision,
        cite={"optimizer": f"Adam (Sec. V-C: 'We used the Adam optimizer with a batch size of 64'), {lr_note}; "
                           "betas (0.9, 0.999), eps 1e-8 and no weight decay are not stated: Adam's defaults",
              "lifetime": lifetime_cite,
              "schedule": "constant lr: Sec. V-C gives one learning rate and no schedule",
              "warmup": "none: Sec. V-C names no warmup",
              "clipping": "none: Sec. V-C names no gradient clipping",
              "local_work": work,
              "evaluation": evaluation,
              "selection": "the last round: Sec. V-D's Fig. 3 follows the 25 rounds and the paper names no "
                           "validation-based selection for Table I",
              "precision": precision_cite})


LORA = "lora"
"""The LoRA matrices as one unit of `MethodModel.trainable`/`shared` (and FedLR's shared part)."""


@dataclass(frozen=True)
class MethodModel:
    """Which adapter sets a method's clients have, which leave the client, and how they predict.

    With `lora` set, the top layers also carry LoRA (`nlp_models.lora`), whose matrices are the unit
    named `LORA` in `trainable` and in the sets of a `shared` part.
    """

    sets: tuple[str, ...]
    trainable: tuple[str, ...]
    shared: Mapping[str, tuple[str, ...]]
    heads: tuple[str, ...]
    predict_mixing: Mapping[str, float]
    predict_head: str
    lora: LoraSettings | None = None

    def __post_init__(self) -> None:
        if LORA in self.sets:
            raise ValueError(f"{LORA!r} names the LoRA matrices, not an adapter set")
        units = set(self.sets) | ({LORA} if self.lora is not None else set())
        named = set(self.trainable) | {unit for sets in self.shared.values() for unit in sets}
        if not named <= units:
            raise ValueError(f"trainable/shared name unknown units {sorted(named - units)}; known: {sorted(units)}")


FEDMCP_MODEL = MethodModel(sets=(GLOBAL, PRIVATE, REFERENCE), trainable=(GLOBAL, PRIVATE),
                           shared={GLOBAL_PART: (GLOBAL,)}, heads=(HEAD_FULL, HEAD_GLOBAL),
                           predict_mixing=FULL_MODEL, predict_head=HEAD_FULL)
# The baselines keep FedMCP's architecture (Sec. V-B: same adapters, same positions, outputs averaged);
# FedAvg and FedRep aggregate both adapters, as in Table I (1.16% communicated).
BASELINE_SETS = ("adapter1", "adapter2")
BASELINE_MODEL = MethodModel(sets=BASELINE_SETS, trainable=BASELINE_SETS, shared={"adapters": BASELINE_SETS},
                             heads=("head",), predict_mixing={s: 0.5 for s in BASELINE_SETS}, predict_head="head")
LOCAL_MODEL = replace(BASELINE_MODEL, shared={})
# FedLR: LoRA r = 8 on query/value of the adapted top layers instead of adapters; the LoRA matrices are shared.
LORA_MODEL = MethodModel(sets=(), trainable=(LORA,), shared={LORA: (LORA,)}, heads=("head",), predict_mixing={},
                         predict_head="head", lora=LoraSettings())
# MOON: the baselines' two adapters (trained, shared) plus frozen copies of the round's global adapters and
# of the client's adapters after its previous round (private), for z_glob and z_prev.
MOON_MODEL = MethodModel(sets=moon.LOCAL_SETS + moon.GLOBAL_SETS + moon.PREVIOUS_SETS, trainable=moon.LOCAL_SETS,
                         shared={moon.PART: moon.LOCAL_SETS}, heads=(moon.HEAD,), predict_mixing=moon.LOCAL,
                         predict_head=moon.HEAD)


class CrossEntropyObjective:
    """The plain supervised objective of the baselines: CE of one head under one adapter mixing."""

    def __init__(self, *, mixing: Mapping[str, float], head: str) -> None:
        self.mixing, self.head = dict(mixing), head

    def __call__(self, model: HeadsAndLabels, batch: Any) -> LossTerms:
        logits = model.classify(self.head, model.represent(batch, mixing=self.mixing))
        per_example = F.cross_entropy(logits, model.labels(batch), reduction="none")
        return LossTerms(per_example, None, {"loss": float(per_example.detach().mean()) if len(per_example) else 0.0})


def _same(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    """Whether two shared-parameter dicts hold the same values (no aggregation happened in between)."""
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _two_points(trainer: Any, split: str, accuracy: Callable[[str], float]) -> dict[str, float]:
    """`accuracy` (the model as loaded: after aggregation) and `BEFORE_AGGREGATION` (the shared parts as the
    client's last local run left them, loaded for this evaluation only); the latter is omitted before any
    local run, and equals the former where nothing was aggregated in between (Local, Ditto's personal model)."""
    out = {"accuracy": accuracy(split)}
    trained = trainer._trained
    if trained is None:
        return out
    current = trainer.get_shared()
    if _same(current, trained):
        out[BEFORE_AGGREGATION] = out["accuracy"]
        return out
    trainer.set_shared(trained)
    try:
        out[BEFORE_AGGREGATION] = accuracy(split)
    finally:
        trainer.set_shared(current)
    return out


def _snapshot(optimizer: torch.optim.Optimizer | None) -> dict[str, Any] | None:
    # A copy: Optimizer.state_dict() returns live tensors, and load_state_dict keeps Adam's 'step'
    # tensor by reference, so two trainers restored from one live dict would share it.
    return copy.deepcopy(optimizer.state_dict()) if optimizer is not None else None


class AdapterTrainer:
    """One client's adapters and heads over its cached prefix.

    Without DP, one optimiser over all trainable adapters and heads, as `config.protocol` declares it
    (default: Adam kept across rounds like any private client state; a fresh one is rebuilt at the start
    of every local run: `train`, `fit`, `train_head`, `train_body`). With DP, every local pass is an
    Opacus DP-SGD round through
    ``dp.opacus_client.OpacusClient`` whose accountant persists across rounds; objectives with a
    batch-level term are refused (no per-example sensitivity bound).
    Batch order and dropout are seeded by (seed, client, call count), so a resumed run is exact.
    """

    def __init__(self, *, data: ClientData, backbone: nn.Module, spec: MethodModel, bottleneck: int,
                 head_hidden: int | None, config: TrainConfig, seed: int) -> None:
        self.data, self.spec, self.config, self.seed = data, spec, config, seed
        self.protocol = config.training_protocol
        self.client_id = data.client_id
        self.num_examples = len(data.splits["train"])
        top = TopEncoder(backbone, split=data.split_layer, dropout=config.backbone_dropout)
        if spec.lora is not None:
            add_lora(top, spec.lora, seed=seed)
        adapter = AdapterConfig(bottleneck=bottleneck, up_init_std=config.adapter_init_std)
        attach_adapters(top, {name: adapter for name in spec.sets}, seed=seed)
        hidden = top.config.hidden_size
        heads = {name: make_head(hidden, data.num_labels, mlp_hidden=head_hidden,
                                 seed=tagged_seed(seed, data.client_id, name)) for name in spec.heads}
        self.model = AdapterClassifier(top, heads, bf16=config.bf16 and config.dp is None)
        self._freeze_all_but(sets=spec.trainable, heads=spec.heads)
        self.timer = self.model.timer
        self.calls = 0
        self._optimizer: torch.optim.Optimizer | None = None
        self._trained: dict[str, np.ndarray] | None = None
        """The shared parts as the last local run left them (the 'before aggregation' evaluation point)."""
        self.dp_client = None
        if config.dp is not None:
            from dp.ledger import Ledger, LedgerConfig
            from dp.opacus_client import OpacusClient
            self.ledger = Ledger(LedgerConfig(delta=config.dp.delta))
            self.dp_client = OpacusClient(client_id=data.client_id, config=config.dp, ledger=self.ledger)

    # ---- parameters ---------------------------------------------------------------------------
    def _unit_params(self, units: Sequence[str]) -> list[nn.Parameter]:
        """The parameters of adapter sets (or of the LoRA matrices, `LORA`), concatenated in order."""
        return [p for unit in units
                for p in (lora_parameters(self.model.top) if unit == LORA else set_parameters(self.model.top, unit))]

    def _trainable_params(self) -> list[nn.Parameter]:
        body = self._unit_params(self.spec.trainable)
        return body + [p for head in self.model.heads.values() for p in head.parameters()]

    def trainable_count(self) -> int:
        return sum(p.numel() for p in self._trainable_params())

    def shared_count(self) -> int:
        return sum(v.size for v in self.get_shared().values())

    def optimizer(self) -> torch.optim.Optimizer:
        if self._optimizer is None:
            self._optimizer = self.protocol.build_optimizer(self._trainable_params())
        return self._optimizer

    def round_optimizer(self) -> torch.optim.Optimizer:
        """The optimiser of a new local run: rebuilt when the protocol's lifetime is fresh, else kept."""
        if self.protocol.fresh:
            self._optimizer = None
        return self.optimizer()

    def get_shared(self) -> dict[str, np.ndarray]:
        return {part: flatten_parameters(self._unit_params(sets)) for part, sets in self.spec.shared.items()}

    def set_shared(self, params: Mapping[str, np.ndarray]) -> None:
        for part, vector in params.items():
            self.load_adapter_sets(self.spec.shared[part], vector)

    def load_adapter_set(self, name: str, vector: np.ndarray) -> None:
        if name not in self.spec.sets:
            raise KeyError(f"no adapter set {name!r}")
        load_set_(self.model.top, name, vector)

    def load_adapter_sets(self, names: Sequence[str], vector: np.ndarray) -> None:
        """Load one vector laid out like a shared part (its units concatenated) into the units `names`:
        MOON loads the broadcast into its frozen copy of the global adapters this way."""
        unknown = set(names) - set(self.spec.sets) - ({LORA} if self.spec.lora is not None else set())
        if unknown:
            raise KeyError(f"no adapter sets {sorted(unknown)}")
        load_parameters_(self._unit_params(names), vector, what=f"adapter sets {tuple(names)}")

    def _freeze_all_but(self, *, sets: Sequence[str], heads: Sequence[str]) -> None:
        set_trainable_sets(self.model.top, tuple(s for s in sets if s != LORA))
        if self.spec.lora is not None:
            for p in lora_parameters(self.model.top):
                p.requires_grad_(LORA in sets)
        for name, head in self.model.heads.items():
            head.requires_grad_(name in heads)

    @contextmanager
    def _seeded(self, tag: str) -> Iterator[torch.Generator]:
        self.calls += 1
        with seeded(tagged_seed(self.seed, self.client_id, self.calls, tag)) as generator:
            yield generator  # torch's global RNG drives dropout and Opacus' noise/sampling

    # ---- training -----------------------------------------------------------------------------
    def default_objective(self) -> CrossEntropyObjective:
        return CrossEntropyObjective(mixing=self.spec.predict_mixing, head=self.spec.predict_head)

    def train(self, *, epochs: int, proximal: Mapping[str, np.ndarray] | None = None, mu: float = 0.0,
              round: int | None = None) -> dict[str, float]:
        """Supervised epochs; with `proximal` and mu > 0, plus mu/2 ||w - proximal||^2 over the shared
        parameters w (FedProx's term; Ditto's personal step). Refused under DP-SGD (not implemented on
        the Opacus path, where it would need its own sensitivity analysis)."""
        penalty = None
        if proximal is not None and mu > 0:
            if self.dp_client is not None:
                raise ValueError("the proximal term (FedProx, Ditto) is not implemented under DP-SGD")
            penalty = self._proximal_penalty(proximal, mu=mu)
        return self._run(self.default_objective(), epochs=epochs, sets=self.spec.trainable,
                         heads=tuple(self.model.heads), tag="fit", round=round, penalty=penalty)

    def _proximal_penalty(self, anchor: Mapping[str, np.ndarray], *, mu: float) -> Callable[[], torch.Tensor]:
        """mu/2 sum_parts ||w_part - anchor_part||^2, the anchors validated like any loaded vector."""
        pairs = []
        for part, vector in anchor.items():
            params = self._unit_params(self.spec.shared[part])
            copies = [torch.empty_like(p) for p in params]
            load_parameters_(copies, vector, what=f"proximal anchor of part {part!r}")
            pairs += zip(params, copies)
        return lambda: 0.5 * mu * sum(((p - a) ** 2).sum() for p, a in pairs)

    def fit(self, *, epochs: int, objective: Any, round: int | None = None) -> dict[str, float]:
        """All trainable adapters and heads, ``epochs`` passes over the training split. An objective with
        ``gradient_norms`` (FedMCP's) is first probed on the round's starting model (`probe`)."""
        probe = self.probe(objective) if hasattr(objective, "gradient_norms") and self.dp_client is None else {}
        metrics = self._run(objective, epochs=epochs, sets=self.spec.trainable, heads=tuple(self.model.heads),
                            tag="fit", round=round)
        return {**metrics, **probe}

    def probe(self, objective: Any) -> dict[str, float]:
        """The objective's gradient norms per term, w.r.t. the shared adapter sets, on the first
        `batch_size` training examples in stored order, in eval mode (no dropout, no RNG drawn, so the
        training that follows is unchanged) and without an optimiser step."""
        train = self.data.splits["train"]
        params = [p for sets in self.spec.shared.values() for p in self._unit_params(sets)]
        if not params or len(train) < 2:
            return {}
        was_training = self.model.training
        self.model.eval()
        self._freeze_all_but(sets=self.spec.trainable, heads=tuple(self.model.heads))
        try:
            return objective.gradient_norms(self.model, train.batch(torch.arange(min(self.config.batch_size, len(train)))),
                                            params)
        finally:
            self.model.train(was_training)

    def train_body(self, *, epochs: int, round: int | None = None) -> dict[str, float]:
        """FedRep's representation step: adapters trainable, heads frozen."""
        return self._run(self.default_objective(), epochs=epochs, sets=self.spec.trainable, heads=(), tag="body",
                         round=round)

    def train_head(self, *, epochs: int, round: int | None = None) -> dict[str, float]:
        """FedRep's head step with the adapters frozen. The representation is fixed during this step,
        so it is computed once (eval mode: encoder dropout off) and the head trains on it."""
        start = time.perf_counter()
        head = self.spec.predict_head
        self._freeze_all_but(sets=(), heads=(head,))
        train = self.data.splits["train"]
        reps = self._represent_split(train, mixing=self.spec.predict_mixing)
        self.model.train()
        module = self.model.heads[head]
        with self._seeded("head") as generator:
            if self.dp_client is not None:
                def per_example(m: nn.Module, batch: Sequence[torch.Tensor]) -> torch.Tensor:
                    return F.cross_entropy(m(None, batch[0]), batch[1], reduction="none")
                metrics = self._dp_round(module, TensorDataset(reps, train.labels), per_example, epochs=epochs,
                                         round=round, timer_key=None)  # timed as the head step
            else:
                metrics = run_epochs(
                    batches=lambda: torch.randperm(len(train), generator=generator).split(self.config.batch_size),
                    loss=lambda index: F.cross_entropy(module(None, reps[index]), train.labels[index]),
                    optimizer=self.round_optimizer(), epochs=epochs, protocol=self.protocol)
        self._freeze_all_but(sets=self.spec.trainable, heads=tuple(self.model.heads))
        self.timer["fedrep head step"] += time.perf_counter() - start
        self._trained = self.get_shared()
        return metrics

    def _run(self, objective: Any, *, epochs: int, sets: Sequence[str], heads: Sequence[str], tag: str,
             round: int | None, penalty: Callable[[], torch.Tensor] | None = None) -> dict[str, float]:
        if epochs < 1:
            raise ValueError("epochs must be at least 1")
        self._freeze_all_but(sets=sets, heads=heads)
        self.model.train()
        train = self.data.splits["train"]
        try:
            with self._seeded(tag) as generator:
                if self.dp_client is not None:
                    def per_example(m: nn.Module, batch: Sequence[torch.Tensor]) -> torch.Tensor:
                        batch, empty = dummy_if_empty(batch)  # an empty Poisson batch: its noise-only step
                        terms = objective(getattr(m, "_module", m), batch)
                        if terms.batch is not None:
                            raise ValueError("a batch-level loss term has no per-example sensitivity bound under "
                                             "DP-SGD; set its weight to 0 (FedMCP: mu = 0)")
                        return terms.per_example[:0] if empty else terms.per_example
                    metrics = self._dp_round(self.model, train.dataset(), per_example, epochs=epochs, round=round)
                else:
                    metrics = run_epochs(
                        batches=lambda: (train.batch(index) for index in
                                         torch.randperm(len(train), generator=generator).split(self.config.batch_size)),
                        loss=lambda batch: objective(self.model, batch), optimizer=self.round_optimizer(),
                        epochs=epochs, penalty=penalty, timer=self.timer, protocol=self.protocol)
        finally:
            self._freeze_all_but(sets=self.spec.trainable, heads=tuple(self.model.heads))
        self._trained = self.get_shared()
        return metrics

    def _dp_round(self, module: nn.Module, dataset: Dataset, per_example: Any, *, epochs: int, round: int | None,
                  timer_key: str | None = "dp-sgd (clipping, noise, backward)") -> dict[str, float]:
        client = self.dp_client
        client.config = replace(client.config, local_epochs=epochs)  # OpacusClient reads epochs from its config
        forward_before = sum(v for k, v in self.timer.items() if k.startswith("forward"))
        start = time.perf_counter()
        report = client.train_round(model=module, optimizer_factory=self.protocol.build_optimizer,
                                    dataset=dataset, loss_fn=per_example,
                                    round_id=round if round is not None else self.calls)
        if timer_key is not None:  # the forward passes inside are already timed by the model
            forward = sum(v for k, v in self.timer.items() if k.startswith("forward")) - forward_before
            self.timer[timer_key] += time.perf_counter() - start - forward
        return {"train_loss": report.mean_loss, "steps": float(report.steps), "epsilon": report.opacus_epsilon,
                "noise_multiplier": report.noise_multiplier}

    def epsilon(self) -> float:
        return self.dp_client.epsilon() if self.dp_client is not None else float("nan")

    # ---- evaluation ---------------------------------------------------------------------------
    @torch.no_grad()
    def _represent_split(self, split: CachedSplit, *, mixing: Mapping[str, float]) -> torch.Tensor:
        self.model.eval()
        order = torch.argsort(split.attention_mask.sum(dim=1))
        reps = torch.empty(len(split), self.model.top.config.hidden_size, device=split.hidden.device)
        for index in order.split(self.config.eval_batch_size):
            reps[index] = self.model.represent(split.batch(index), mixing=mixing)
        return reps

    @torch.no_grad()
    def _accuracy(self, split: str) -> float:
        data = self.data.splits[split]
        reps = self._represent_split(data, mixing=self.spec.predict_mixing)
        predictions = self.model.classify(self.spec.predict_head, reps).argmax(dim=-1)
        return float((predictions == data.labels).float().mean())

    def evaluate(self, *, split: str = "test") -> dict[str, float]:
        """Accuracy on `split` of the model as loaded (after aggregation: ``accuracy``) and of the model as
        the last local run left it (``accuracy_before_aggregation``, `BEFORE_AGGREGATION`)."""
        start = time.perf_counter()
        metrics = _two_points(self, split, self._accuracy)
        self.timer["evaluation"] += time.perf_counter() - start
        return metrics

    # ---- checkpoints --------------------------------------------------------------------------
    @staticmethod
    def _is_own(key: str) -> bool:
        """A client's own tensors: adapter sets (frozen copies included), LoRA matrices and heads."""
        return ".adapters." in key or ".lora_A." in key or ".lora_B." in key or key.startswith("heads.")

    def _own_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items() if self._is_own(k)}

    def state_dict(self) -> dict[str, Any]:
        state = {"model": self._own_state(), "calls": self.calls,
                 "optimizer": None if self.protocol.fresh else _snapshot(self._optimizer),
                 "trained": None if self._trained is None else {k: torch.from_numpy(v.copy())
                                                                for k, v in self._trained.items()}}
        if self.dp_client is not None:
            state["dp"] = self.dp_client.state_dict()
            state["ledger"] = self.ledger.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        missing, unexpected = self.model.load_state_dict(state["model"], strict=False)
        if unexpected or any(self._is_own(k) for k in missing):
            raise ValueError(f"checkpoint does not match this client's model ({unexpected or missing})")
        self.calls = int(state["calls"])
        if state.get("optimizer") is not None:
            self.optimizer().load_state_dict(state["optimizer"])
        trained = state.get("trained")  # absent from checkpoints made before two evaluation points
        self._trained = None if trained is None else {k: np.asarray(v.numpy() if torch.is_tensor(v) else v).copy()
                                                      for k, v in trained.items()}
        if self.dp_client is not None and "dp" in state:
            self.dp_client.load_state_dict(state["dp"])
            self.ledger.load_state_dict(state["ledger"])


class FullFineTuneTrainer:
    """FedAvg (Full FT): every backbone parameter trains and is uploaded (the paper's 100% row).

    The clients of a simulation share one backbone object: every client_update loads the broadcast
    into it first, so only the heads and Adam states are per client. Runs on token ids, not on the
    cached prefix (a cached prefix would freeze the bottom layers: that is not full fine-tuning). The
    optimiser as
    `config.protocol` declares it (default: Adam kept across rounds).
    """

    def __init__(self, *, data: ClientData, backbone: nn.Module, head_hidden: int | None, config: TrainConfig,
                 seed: int) -> None:
        if config.dp is not None:
            raise ValueError("DP-SGD is offered for the adapters only; full fine-tuning under DP is not supported")
        self.data, self.config, self.seed, self.client_id = data, config, seed, data.client_id
        self.protocol = config.training_protocol
        self.num_examples = len(data.splits["train"])
        self.backbone = backbone
        head = make_head(backbone.config.hidden_size, data.num_labels, mlp_hidden=head_hidden,
                         seed=tagged_seed(seed, data.client_id, "head"))
        self.model = FullModel(TextClassifier(backbone, {"head": head}), bf16=config.bf16)
        self.timer = self.model.timer
        self.params = list(backbone.parameters())
        self.calls = 0
        self._optimizer: torch.optim.Optimizer | None = None
        self._trained: dict[str, np.ndarray] | None = None
        """The backbone as this client's last local run left it (the 'before aggregation' evaluation point);
        not checkpointed (a whole backbone per client): a restored client reports that point again after its
        next local run."""
        self.objective = CrossEntropyObjective(mixing={}, head="head")

    def trainable_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def shared_count(self) -> int:
        return sum(p.numel() for p in self.params)

    def optimizer(self) -> torch.optim.Optimizer:
        if self._optimizer is None:
            self._optimizer = self.protocol.build_optimizer(self.model.parameters())
        return self._optimizer

    def round_optimizer(self) -> torch.optim.Optimizer:
        """The optimiser of a new local run: rebuilt when the protocol's lifetime is fresh, else kept."""
        if self.protocol.fresh:
            self._optimizer = None
        return self.optimizer()

    def get_shared(self) -> dict[str, np.ndarray]:
        return {"backbone": flatten(self.params)}

    def set_shared(self, params: Mapping[str, np.ndarray]) -> None:
        unflatten_(self.params, params["backbone"])

    def train(self, *, epochs: int, proximal: Mapping[str, np.ndarray] | None = None, mu: float = 0.0,
              round: int | None = None) -> dict[str, float]:
        self.model.train()
        train = self.data.splits["train"]
        self.calls += 1
        with seeded(tagged_seed(self.seed, self.client_id, self.calls, "full")) as generator:
            metrics = run_epochs(
                batches=lambda: (train.batch(index, tokens=True) for index in
                                 torch.randperm(len(train), generator=generator).split(self.config.batch_size)),
                loss=lambda batch: self.objective(self.model, batch).total(),  # a tensor: report train_loss only
                optimizer=self.round_optimizer(), epochs=epochs, timer=self.timer, protocol=self.protocol)
        self._trained = self.get_shared()
        return metrics

    @torch.no_grad()
    def _accuracy(self, split: str) -> float:
        self.model.eval()
        data = self.data.splits[split]
        correct = 0
        for index in torch.argsort(data.attention_mask.sum(dim=1)).split(self.config.eval_batch_size):
            batch = data.batch(index, tokens=True)
            logits = self.model.classify("head", self.model.represent(batch, mixing={}))
            correct += int((logits.argmax(-1) == batch.labels).sum())
        return correct / max(len(data), 1)

    def evaluate(self, *, split: str = "test") -> dict[str, float]:
        """Accuracy of the backbone as loaded (after aggregation) and as this client's last local run left it
        (`BEFORE_AGGREGATION`; the clients of a simulation share one backbone, so it is loaded, evaluated and
        the loaded one restored)."""
        start = time.perf_counter()
        metrics = _two_points(self, split, self._accuracy)
        self.timer["evaluation"] += time.perf_counter() - start
        return metrics

    def epsilon(self) -> float:
        return float("nan")

    def state_dict(self) -> dict[str, Any]:
        return {"head": {k: v.clone() for k, v in self.model.heads.state_dict().items()}, "calls": self.calls,
                "optimizer": None if self.protocol.fresh else _snapshot(self._optimizer)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.model.heads.load_state_dict(state["head"])
        self.calls = int(state["calls"])
        if state.get("optimizer") is not None:
            self.optimizer().load_state_dict(state["optimizer"])


__all__ = ["FEDMCP_PROTOCOLS", "BEFORE_AGGREGATION", "fedmcp_protocol",
           "TrainConfig", "LORA", "MethodModel", "FEDMCP_MODEL", "BASELINE_SETS", "BASELINE_MODEL", "LOCAL_MODEL",
           "LORA_MODEL", "MOON_MODEL", "CrossEntropyObjective", "AdapterTrainer", "FullFineTuneTrainer"]
