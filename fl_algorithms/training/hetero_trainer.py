"""ATC's heterogeneous clients: one model layout for classification, tagging, extractive QA and
headline generation, so that clients of different formulations can share (and securely sum) one part.

Every client holds, over the frozen offline MiniLM (bottom layers computed once, `frozen_prefix`):

    suffix   the top `adapter_layers` encoder layers with Houlsby adapters ('adapter', shared) and
             their own trainable LayerNorms ('norm', shared; FedBN keeps it local)
    head     the client's task head, local: linear over the mean-pooled states (classification), a
             token classifier (tagging), a start/end span head (QA); for generation the decoder below
    decoder  a BERT2BERT decoder warm-started from MiniLM (`nlp_models.seq2seq`), local: headline
             generator of generation clients and every client's denoising-reconstruction head
    lm       an MLM head (dense, GELU, LayerNorm, tied frozen word embeddings), local

`train` fits the task (FedProx's proximal term and ATC's contrastive term optional); `pretrain` runs
one ASSIGN objective (masked language modelling or denoising reconstruction, `nlp_models.pretraining`)
on the client's own training inputs; `represent` encodes the public synthetic inputs (CONTRAST).

SIMPLIFICATION relative to ATC (Sec. 3.2): the paper shares the whole encoder-decoder in ASSIGN; here
only the encoder's adapters and LayerNorms are federated, while the decoder and the MLM head stay on
the client (a 1-layer decoder is 2.5M parameters; K cluster-indexed blocks of it per client and round
cost more secure-sum time than a CPU run affords). The encoder below the adapters is frozen.

How the clients train is declared (`HeteroProtocol`, issue 55): `atc_paper_protocol` is the ATC paper's
(Sec. 4.3) as its public FederatedScope code runs it: AdamW (lr 5e-4, betas (0.9, 0.999), weight decay
0.01) built once per client and stage and kept across rounds, a linear warmup (10%) and decay spanning
the stage's steps, gradients clipped to norm 1.0. `kept_adamw_protocol` is this module's behaviour
before (AdamW at `HeteroConfig.lr`, kept across rounds and stages, constant lr, no clipping), named so
that older numbers stay reproducible. Contrastive rounds log the contrastive term's gradient norm
against the task loss's over the shared parameters (`HeteroTrainer.contrast_log`).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fl_algorithms.choices import ATC_TRAINING_PROTOCOLS
from fl_algorithms.tasks.hetero import HeteroClient
from fl_algorithms.tasks.qa import QASplit, encode as encode_qa, qa_loss, qa_metrics
from fl_algorithms.tasks.seq2seq import HeadlineSplit, headline_loss, headline_metrics
from fl_algorithms.tasks.tagging import TaggedSplit, encode_tagged, tagging_metrics, token_loss
from fl_algorithms.training.classification import classification_loss, classification_metrics
from fl_algorithms.training.loop import run_epochs, seeded, sequence_seed, tagged_seed
from fl_algorithms.training.protocol import KEPT, OptimizerConfig, TrainingProtocol, kept_protocol
from fl_algorithms.training.trainer import SeededTorchTrainer
from nlp_models.classifiers import adapted_top, make_head, seeded_module
from nlp_models.frozen_prefix import CachedSplit, build_prefix_cache, cache_splits, cache_texts, prefix_split
from nlp_models.heads import TokenClassifier, mean_pool
from nlp_models.pretraining import Corruptor
from nlp_models.seq2seq import (IGNORE_INDEX, Seq2SeqConfig, Seq2SeqModel, client_seq2seq, special_ids, tokenize_pairs,
                                warm_decoder)

METRIC = {"classification": "accuracy", "tagging": "span_f1", "qa": "f1", "generation": "rougeL"}
"""The headline metric of each formulation (the key in the client's `evaluate()` result)."""
SHARED = ("adapter", "norm")
SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class HeteroConfig:
    """The clients' shared model shape and optimiser (every client starts from the same seeded model)."""

    adapter_layers: int = 2
    bottleneck: int = 16
    max_length: int = 64
    """Tokens per input (text, sentence, question + passage, article body)."""
    max_target: int = 16
    decoder_layers: int = 1
    batch_size: int = 16
    lr: float = 1e-3
    """The `kept-adamw` protocol's lr (this module's lr before protocols were declared); the `atc-paper`
    protocol runs the paper's 5e-4."""
    pretrain_batches: int = 4
    """Corrupted batches (optimiser steps) per ASSIGN round, of the client's training inputs reshuffled
    each time; where they ask for more inputs than the client holds, the inputs are cycled (a fresh
    shuffle per pass)."""
    pretrain_length: int = 48
    """Tokens per pretraining input (the denoising decoder reconstructs all of them)."""
    contrast_weight: float = 1.0
    """Weight of ATC's contrastive term next to the task loss (the paper minimises their sum)."""
    contrast_temperature: float = 1.0
    """tau of Eq. 3 (the paper's 1.0)."""
    contrast_probe_every: int = 1
    """Measure the contrastive term's and the task loss's gradient norms (over the shared parameters) at
    every this-many-th step of a contrastive local run (1: every step; each probe costs two more
    backward passes)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.adapter_layers < 1 or self.bottleneck < 1 or self.decoder_layers < 1 or self.batch_size < 1:
            raise ValueError("adapter_layers, bottleneck, decoder_layers and batch_size must be positive")
        if not 8 <= self.max_length <= 512 or self.max_target < 2:
            raise ValueError("need 8 <= max_length <= 512 and max_target >= 2")
        if not self.lr > 0 or self.pretrain_batches < 1 or not 8 <= self.pretrain_length <= self.max_length:
            raise ValueError("need lr > 0, pretrain_batches >= 1 and 8 <= pretrain_length <= max_length")
        if self.contrast_weight < 0 or not self.contrast_temperature > 0:
            raise ValueError("need contrast_weight >= 0 and contrast_temperature > 0")
        if self.contrast_probe_every < 1:
            raise ValueError(f"contrast_probe_every must be at least 1, got {self.contrast_probe_every}")


# ---- the declared training protocol ----------------------------------------------------------------
LOCAL_RUN, STAGE = "local run", "stage"
SPANS = (LOCAL_RUN, STAGE)
"""How far a protocol's schedule and kept optimiser reach: LOCAL_RUN, each local run's schedule as
`run_epochs` applies it and one optimiser for every stage (this module's behaviour before); STAGE, the
schedule over all of a stage's steps and one optimiser per stage (FederatedScope's ATCTrainer)."""
STAGES = ("pretrain", "task", "finetune")
"""ASSIGN's pre-training runs, task training (every method's rounds, CONTRAST's included), and FedAvg+FT's
evaluation-time fine-tuning (a stage of its own: a fresh optimiser whose schedule spans its one run)."""
PROTOCOL_NAMES = ATC_TRAINING_PROTOCOLS
"""The declared protocols by name (`fl_algorithms.choices`, where the parsers read them)."""

_FS = "FederatedScope (the ATC paper's public code, federatedscope/nlp/hetero_tasks)"
_FS_TRAINER = "its trainer/trainer.py, ATCTrainer"
_EVALUATION = {
    "after aggregation": "the global model after aggregation (FedAvg, FedProx; FedBN with its own norms), on each "
                         "client's test split after the last round",
    "after local adaptation": "the global model after one local epoch of fine-tuning per client (FedAvg+FT), the "
                              "fine-tuned copy then discarded",
    "personal model": "each client's own model after the last round (ATC: w_i of Eq. 4, ASSIGN only: its cluster's "
                      "model, Ditto: v_k, Isolated: its local model)",
}


def atc_paper_protocol(*, local_epochs: int = 1, evaluation: str = "personal model") -> TrainingProtocol:
    """The ATC paper's client training (Sec. 4.3), as FederatedScope's ATCTrainer runs it, for every method
    of ATC's grid (the paper's baselines run the same configuration: config_fedavg.yaml). Its schedule
    and kept optimiser span a stage (`HeteroProtocol.span` = STAGE)."""
    return TrainingProtocol(
        name="atc-paper",
        optimizer=OptimizerConfig(name="adamw", lr=5e-4, weight_decay=0.01, betas=(0.9, 0.999)),
        lifetime=KEPT,
        lifetime_reason=f"{_FS}, {_FS_TRAINER}._hook_on_fit_start_init: a client's optimiser and scheduler are "
                        "built at its first local run (setup_optimizer_and_scheduler) and stored on its trainer's "
                        "context, then reused every later round; a new global model overwrites the parameters, "
                        "the AdamW moments and the schedule's position persist",
        schedule="linear", warmup_fraction=0.1, max_grad_norm=1.0, local_epochs=local_epochs, evaluation=evaluation,
        cite={
            "optimizer": "ATC Sec. 4.3: 'the learning rate is set to 5e-4, the optimizer is set to AdamW ... with "
                         "beta1 = 0.9, beta2 = 0.999 and weight decay of 0.01'; FederatedScope's baseline/"
                         "config_pretrain.yaml (ASSIGN), config_atc.yaml (CONTRAST) and config_fedavg.yaml (the "
                         "FedAvg baseline) all set AdamW, lr 5e-4, weight_decay 0.01: here every method of the grid",
            "lifetime": f"kept within a stage ({_FS_TRAINER}: built once per client, reused every round); a new "
                        "optimiser at each stage, because ASSIGN and CONTRAST are two FederatedScope runs "
                        "(run_pretrain.sh, then run_atc.sh, which loads only the model weights: "
                        "federate.atc_load_from)",
            "schedule": "linear decay to 0 at the stage's last step (ATC Sec. 4.3: 'The linear decay of the "
                        f"learning rate is applied'); {_FS_TRAINER}.setup_optimizer_and_scheduler: total_steps = "
                        "the steps of a round x federate.total_round_num, a LambdaLR stepped once per optimiser "
                        "step (scheduler/scheduler.py): the schedule spans the stage, not one round (span=stage)",
            "warmup": "10% of the stage's steps (ATC Sec. 4.3: 'warm-up proportion of 0.1'; FederatedScope: "
                      "warmup_steps = int(0.1 x total_steps)); here rounded up (TrainingProtocol.warmup_for), the "
                      "stage's first step at lr 0 as in FederatedScope's LambdaLR",
            "clipping": "total norm 1.0 before every step: FederatedScope's configs, grad.grad_clip 1.0; "
                        f"{_FS_TRAINER}._hook_on_batch_backward: clip_grad_norm_(model.parameters(), grad_clip) "
                        "(the paper's text does not state it)",
            "local_work": f"{local_epochs} local epoch(s) of task training per round for every method (issue 55: "
                          "equal local work; Ditto's global and personal problems share one epoch's batches); ASSIGN "
                          "runs HeteroConfig.pretrain_batches steps per round. Differs from the paper (Sec. 4.3: "
                          "ASSIGN 200 rounds x 50 steps at batch 64, CONTRAST 100 rounds x 200 steps at batch 32): "
                          "the CPU budget's clients hold 36 training examples at --quick, 300 at --full",
            "evaluation": f"{_EVALUATION[evaluation]}; the paper reports 'the average scores of all the belonging "
                          "clients' of each dataset (Sec. 4.1)",
            "selection": "the last round: FederatedScope's config_atc.yaml sets eval.freq 100000000, so its one "
                         "evaluation is after the last round (the paper's Table 2)",
            "precision": "fp32: neither the paper nor FederatedScope's ATC configs ask for mixed precision; fp32 on "
                         "the CPU and the GPU here",
        })


def kept_adamw_protocol(*, lr: float = 1e-3, local_epochs: int = 1,
                        evaluation: str = "personal model") -> TrainingProtocol:
    """AdamW (no weight decay) at `lr`, kept across rounds and stages, constant lr, no clipping: how ATC's
    grid trained before protocols were declared (named, so that its numbers stay reproducible)."""
    base = kept_protocol(OptimizerConfig(name="adamw", lr=lr), name="kept-adamw", local_epochs=local_epochs)
    cite = {**base.cite, "evaluation": _EVALUATION[evaluation],
            "selection": "the last round (as before: FederatedScope's one evaluation is after the last round)",
            "precision": "fp32 (as before)",
            "local_work": f"{local_epochs} local epoch(s) per round (as before: Ditto ran its global and its personal "
                          "problem one epoch each unless --ditto-work split-epoch)"}
    return replace(base, evaluation=evaluation, cite=cite)


@dataclass(frozen=True, kw_only=True)
class HeteroProtocol:
    """The declared protocol of ATC's clients: the `TrainingProtocol` of their task and ASSIGN steps, and
    how far its schedule and kept optimiser reach (`span`, which a TrainingProtocol, defined per local run,
    cannot say)."""

    training: TrainingProtocol
    span: str = LOCAL_RUN
    span_reason: str = "this module's behaviour before protocols were declared: one optimiser for every stage"

    def __post_init__(self) -> None:
        if self.span not in SPANS:
            raise ValueError(f"span must be one of {', '.join(map(repr, SPANS))}, got {self.span!r}")
        if not self.span_reason.strip():
            raise ValueError("span_reason must say why the schedule spans what it spans")

    def describe(self) -> str:
        return f"{self.training.describe()} span={self.span.replace(' ', '-')}"

    def record(self) -> dict[str, str]:
        """The span and its reason (beside `training.to_dict()` in a run's records)."""
        return {"span": self.span, "span_reason": self.span_reason}


def hetero_protocol(name: str, *, evaluation: str = "personal model", kept_lr: float = 1e-3,
                    local_epochs: int = 1) -> HeteroProtocol:
    """The protocol called `name` ('atc-paper' or 'kept-adamw', `PROTOCOL_NAMES`) for a method evaluated
    at `evaluation`; `kept_lr` is kept-adamw's lr (`HeteroConfig.lr`)."""
    if name == "atc-paper":
        return HeteroProtocol(training=atc_paper_protocol(local_epochs=local_epochs, evaluation=evaluation),
                              span=STAGE,
                              span_reason=f"{_FS_TRAINER}: total_steps = steps per round x total_round_num, one "
                                          "optimiser and scheduler per client per FederatedScope run (ASSIGN and "
                                          "CONTRAST are separate runs)")
    if name == "kept-adamw":
        return HeteroProtocol(training=kept_adamw_protocol(lr=kept_lr, local_epochs=local_epochs, evaluation=evaluation))
    raise ValueError(f"unknown ATC training protocol {name!r}; choose from {', '.join(PROTOCOL_NAMES)}")


@dataclass(frozen=True)
class _StageView:
    """What `run_epochs` and the trainer read of a protocol, with the schedule's position counted over a
    whole stage (`done` steps before this local run, `total` in the stage) instead of one local run."""

    protocol: TrainingProtocol
    done: int
    total: int

    def __getattr__(self, name: str) -> Any:
        if name in ("protocol", "done", "total"):
            raise AttributeError(name)
        return getattr(self.protocol, name)

    def lr_at(self, step: int, total_steps: int) -> float:
        del total_steps  # the local run's; the stage's is `total`
        return self.protocol.lr_at(min(self.done + step, self.total), self.total)


class MaskedLMHead(nn.Module):
    """BERT's MLM head over tied, frozen word embeddings: dense, GELU, LayerNorm, then the vocabulary."""

    def __init__(self, embeddings: nn.Embedding) -> None:
        super().__init__()
        hidden = embeddings.weight.shape[1]
        self.dense, self.norm = nn.Linear(hidden, hidden), nn.LayerNorm(hidden)
        self.bias = nn.Parameter(torch.zeros(embeddings.weight.shape[0]))
        self.embeddings = [embeddings]  # a list: not a submodule, so the frozen matrix is never a parameter

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        h = self.norm(F.gelu(self.dense(states)))
        return h @ self.embeddings[0].weight.T + self.bias


@dataclass(frozen=True)
class ContrastTargets:
    """ATC Eq. 3 for one client: the public inputs' representations its neighbours (positive) and its
    farthest clients (negative) produced, each a group mean from a secure sum, (M, H) arrays."""

    positive: np.ndarray
    negative: np.ndarray


class HeteroModel(nn.Module):
    """One client's model (see the module docstring); `forward` gives task logits for classification,
    tagging and QA, `loss`/`generate` the headline generator's, both from cached prefix states."""

    def __init__(self, *, formulation: str, suffix: nn.Module, head: nn.Module | None, decoder: Seq2SeqModel,
                 lm: MaskedLMHead) -> None:
        super().__init__()
        self.formulation, self.suffix, self.head, self.decoder, self.lm = formulation, suffix, head, decoder, lm

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        states = self.suffix(hidden, attention_mask)
        if self.formulation == "classification":
            return self.head(states, mean_pool(states, attention_mask))
        if self.formulation == "tagging":
            return self.head(states, None)
        if self.formulation == "qa":
            return self.head(states)
        raise TypeError("the generation model is used through loss() and generate()")

    def pooled(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, H) mean-pooled top-layer states: the representation CONTRAST compares."""
        return mean_pool(self.suffix(hidden, attention_mask), attention_mask)

    def loss(self, source: torch.Tensor, source_mask: torch.Tensor, target: torch.Tensor, *,
             source_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.decoder.loss(self.suffix(source, source_mask), source_mask, target, source_ids=source_ids)

    @torch.inference_mode()
    def generate(self, source: torch.Tensor, source_mask: torch.Tensor, *,
                 source_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.decoder.generate(self.suffix(source, source_mask), source_mask, source_ids=source_ids)


def _own_norms(suffix: nn.Module) -> None:
    """Give the adapted layers' LayerNorms the client's own trainable copies (the backbone's stay frozen)."""
    for module in suffix.modules():
        if isinstance(module, nn.LayerNorm):
            module.weight = nn.Parameter(module.weight.detach().clone())
            module.bias = nn.Parameter(module.bias.detach().clone())


def shared_parts(model: HeteroModel) -> dict[str, list[str]]:
    """'adapter': every adapter parameter of the suffix; 'norm': its LayerNorms (same names on every
    client whatever its formulation, so every client can be summed with every other)."""
    names = [n for n, p in model.named_parameters() if p.requires_grad and n.startswith("suffix.")]
    return {"adapter": [n for n in names if ".adapters." in n], "norm": [n for n in names if ".adapters." not in n]}


class HeteroTrainer(SeededTorchTrainer):
    """A client of any formulation: task training (+ FedProx, + ATC's contrastive term), ASSIGN
    pretraining and the public-input representation, over its own data only, under a declared
    `HeteroProtocol` (default: `kept-adamw` at `config.lr`, this trainer's behaviour before)."""

    def __init__(self, *, client: HeteroClient, model: HeteroModel, data: Mapping[str, Any], config: HeteroConfig,
                 backbone: nn.Module, pretrain_ids: tuple[torch.Tensor, torch.Tensor], public: CachedSplit,
                 corruptor: Corruptor, loss_fn: Callable, metric_fn: Callable,
                 protocol: HeteroProtocol | None = None) -> None:
        train = data["train"]
        declared = protocol if protocol is not None else hetero_protocol("kept-adamw", kept_lr=config.lr)
        super().__init__(client_id=client.client_id, seed=config.seed, model=model, shared=shared_parts(model),
                         train_batches=lambda: train.batches(config.batch_size, order=torch.randperm(len(train))),
                         eval_batches={s: (lambda d=data[s]: d.batches(64)) for s in ("validation", "test")},
                         num_examples=len(train), loss_fn=loss_fn, metric_fn=metric_fn, protocol=declared.training)
        self.declared = declared
        self.formulation, self.dataset, self.config, self.train_split = client.formulation, client.dataset, config, train
        self.metric = METRIC[client.formulation]
        self.backbone, self.split = backbone, prefix_split(backbone, config.adapter_layers)
        self.pretrain_ids, self.public, self.corruptor = pretrain_ids, public, corruptor
        self.stage_runs: dict[str, int] = {"finetune": 1}
        """Local runs planned per stage (`plan_stages`): a stage-long schedule needs its length."""
        self.stage: str | None = None
        self.stage_steps = 0
        self._forced_stage: str | None = None
        self.contrast_log: list[dict[str, float]] = []
        """One entry per contrastive local run: its round, the contrastive loss and the two gradient norms."""

    # ---- stages (a schedule and a kept optimiser that span a stage) ----------------------------
    def plan_stages(self, *, pretrain: int = 0, task: int, finetune: int = 1) -> None:
        """The number of local runs of each stage in this run (ASSIGN's rounds, the task rounds, FedAvg+FT's
        fine-tuning per evaluation): a stage-long schedule spans runs x the steps of one run."""
        if pretrain < 0 or task < 1 or finetune < 1:
            raise ValueError(f"need pretrain >= 0, task >= 1 and finetune >= 1 local runs, got {pretrain}, {task}, "
                             f"{finetune}")
        self.stage_runs = {"pretrain": pretrain, "task": task, "finetune": finetune}

    @contextmanager
    def as_stage(self, stage: str) -> Iterator[None]:
        """Train calls inside count as `stage` (FedAvg+FT's evaluation-time fine-tuning: 'finetune')."""
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
        before, self._forced_stage = self._forced_stage, stage
        try:
            yield
        finally:
            self._forced_stage = before

    @contextmanager
    def _staged(self, stage: str, *, steps_per_run: int) -> Iterator[dict[str, float]]:
        """Under a stage-long span: a new optimiser when the stage changes, and the protocol as the loop sees
        it with the schedule's position counted over the stage (the caller puts the run's 'steps' in the
        yielded dict). Under LOCAL_RUN: nothing changes (one optimiser for every stage, as before)."""
        done: dict[str, float] = {}
        if self.declared.span != STAGE:
            yield done
            return
        runs = self.stage_runs.get(stage, 0)
        if runs < 1:
            raise ValueError(f"a stage-long schedule needs the local runs of stage {stage!r}: call plan_stages first")
        if self.stage != stage:
            self.stage, self.stage_steps, self._optimizer = stage, 0, None
        declared = self.protocol
        self.protocol = _StageView(declared, done=self.stage_steps, total=runs * max(1, steps_per_run))  # type: ignore[assignment]
        try:
            yield done
        finally:
            self.protocol = declared
            self.stage_steps += int(done.get("steps", 0))

    def _task_steps(self, epochs: int) -> int:
        """Optimiser steps of one full local run of `epochs` epochs (the stage's unit)."""
        return math.ceil(len(self.train_split) / self.config.batch_size) * epochs

    @contextmanager
    def _epoch_share(self, share: tuple[int, int] | None, round: int | None) -> Iterator[None]:
        """With `share` (k, n): this run trains on batches k, k + n, k + 2n, ... of the round's one shuffle
        (drawn from (seed, client, round), so the n shares of a round split one epoch)."""
        if share is None:
            yield
            return
        k, n = share
        if not 0 <= k < n or round is None:
            raise ValueError(f"an epoch share (k, n) needs 0 <= k < n and the round, got {share}, round {round}")
        train, size = self.train_split, self.config.batch_size
        generator = torch.Generator().manual_seed(tagged_seed(self.seed, self.client_id, round, "epoch-share"))
        order = torch.randperm(len(train), generator=generator)
        before = self.train_batches
        self.train_batches = lambda: train.batches(size, order=order)[k::n]
        try:
            yield
        finally:
            self.train_batches = before

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "stage": self.stage, "stage_steps": self.stage_steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        if "stage" in state:
            self.stage, self.stage_steps = state["stage"], int(state["stage_steps"])
        if state.get("optimizer") is None and self.declared.span == STAGE:
            self._optimizer = None   # not another stage's optimiser (FedAvg+FT's fine-tuning one)

    # ---- task training ---------------------------------------------------------------------
    def train(self, *, epochs: int, proximal: Mapping[str, np.ndarray] | None = None, mu: float = 0.0,
              round: int | None = None, contrast: ContrastTargets | None = None,
              share: tuple[int, int] | None = None) -> dict[str, float]:
        """Local task training; `contrast` adds ATC's term (and logs its gradient against the task loss's),
        `share` (k, n) trains on the k-th of n interleaved shares of the round's epoch (Ditto's two problems
        in one epoch's budget)."""
        if share is not None and epochs != 1:
            raise ValueError(f"an epoch share splits one epoch; got epochs={epochs}")
        stage = self._forced_stage or "task"
        with self._epoch_share(share, round), self._staged(stage, steps_per_run=self._task_steps(epochs)) as done:
            metrics = (super().train(epochs=epochs, proximal=proximal, mu=mu, round=round) if contrast is None else
                       self._train_with_contrast(epochs=epochs, proximal=proximal, mu=mu, round=round, contrast=contrast))
            done["steps"] = metrics["steps"]
        return metrics

    def _train_with_contrast(self, *, epochs: int, proximal: Mapping[str, np.ndarray] | None, mu: float,
                             round: int | None, contrast: ContrastTargets) -> dict[str, float]:
        task_loss, weight = self.loss_fn, self.config.contrast_weight
        positive = torch.as_tensor(contrast.positive, dtype=torch.float32)
        negative = torch.as_tensor(contrast.negative, dtype=torch.float32)
        shared = [p for params in self._shared.values() for p in params]
        log: dict[str, list[float]] = {k: [] for k in ("loss", "cos_positive", "cos_negative", "contrast_grad_norm",
                                                       "task_grad_norm", "ratio")}
        step = 0

        def with_contrast(model: nn.Module, batch: Any) -> torch.Tensor:
            nonlocal step
            term, cos_pos, cos_neg = self._contrast_parts(positive, negative)   # first, as before (dropout's draws)
            task = task_loss(model, batch)
            weighted = weight * term
            log["loss"].append(float(term.detach()))
            log["cos_positive"].append(cos_pos)
            log["cos_negative"].append(cos_neg)
            if step % self.config.contrast_probe_every == 0:   # what each term alone asks of the shared parameters
                g_contrast = _grad_norm(weighted, shared)
                g_task = _grad_norm(task, shared)
                log["contrast_grad_norm"].append(g_contrast)
                log["task_grad_norm"].append(g_task)
                log["ratio"].append(g_contrast / g_task if g_task > 0 else float("inf"))
            step += 1
            return task + weighted

        self.loss_fn = with_contrast
        try:
            metrics = super().train(epochs=epochs, proximal=proximal, mu=mu, round=round)
        finally:
            self.loss_fn = task_loss
        entry = {"round": float(round) if round is not None else float("nan"),
                 **{k: float(np.mean(v)) if v else float("nan") for k, v in log.items()}, "probes": float(len(log["ratio"]))}
        self.contrast_log.append(entry)
        return {**metrics, "contrast_loss": entry["loss"], "contrast_grad_norm": entry["contrast_grad_norm"],
                "task_grad_norm": entry["task_grad_norm"], "contrast_task_grad_ratio": entry["ratio"]}

    def contrastive_loss(self, positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
        """ATC Eq. 3 on the public inputs k: -log e^{s(h_k, p_k)/tau} / (e^{s(h_k, p_k)/tau} + e^{s(h_k, n_k)/tau}),
        s the cosine, averaged over k (h: this client's representation, p / n: the group means). With
        tau = 1 it is log 2 where the positive and the negative are equally close."""
        return self._contrast_parts(positive, negative)[0]

    def _contrast_parts(self, positive: torch.Tensor, negative: torch.Tensor) -> tuple[torch.Tensor, float, float]:
        """(Eq. 3's loss, the mean cosine to the positives, the mean cosine to the negatives)."""
        h = self.model.pooled(self.public.hidden, self.public.attention_mask)
        device = h.device
        tau = self.config.contrast_temperature
        cos_pos = F.cosine_similarity(h, positive.to(device), dim=-1)
        cos_neg = F.cosine_similarity(h, negative.to(device), dim=-1)
        pos, neg = cos_pos / tau, cos_neg / tau
        loss = -(pos - torch.logsumexp(torch.stack([pos, neg]), dim=0)).mean()
        return loss, float(cos_pos.detach().mean()), float(cos_neg.detach().mean())

    @torch.no_grad()
    def represent(self) -> np.ndarray:
        """(M, H) this client's representations of the public synthetic inputs (dropout off), each row
        scaled to unit norm: the contrastive term compares directions only, and unit rows fit the secure
        sum's fixed-point range."""
        was = self.model.training
        self.model.eval()
        try:
            h = self.model.pooled(self.public.hidden, self.public.attention_mask).float()
            return F.normalize(h, dim=-1).cpu().numpy()
        finally:
            self.model.train(was)

    @torch.no_grad()
    def document_embeddings(self) -> np.ndarray:
        """(n, H) mean-pooled top-layer states of the client's training inputs under its current model
        (what its neighbour sketch summarises; never released as such)."""
        was = self.model.training
        self.model.eval()
        try:
            rows = []
            for batch in self.train_split.batches(self.config.batch_size):   # in order: no RNG drawn
                hidden, mask = _inputs_of(batch)
                rows.append(self.model.pooled(hidden, mask).float().cpu())
            return torch.cat(rows).numpy().astype(np.float64)
        finally:
            self.model.train(was)

    # ---- ASSIGN pretraining ----------------------------------------------------------------
    def pretrain(self, *, objective: str, round: int | None = None) -> dict[str, float]:
        """`pretrain_batches` steps of `objective` ('mlm' or 'denoise') on the client's own training
        inputs, corrupted afresh (seeded by run seed, client and call count); the inputs are cycled, a
        fresh shuffle per pass, where the steps ask for more than the client holds (one shuffle, as
        before, where they do not)."""
        ids, mask = self.pretrain_ids
        size = self.config.batch_size
        with seeded(sequence_seed(self.seed, self.client_id, self.calls)):
            seed = sequence_seed(self.seed, self.client_id, self.calls) % (2 ** 31)
            self.calls += 1
            wanted = self.config.pretrain_batches * size
            order = torch.randperm(ids.shape[0])[:wanted]
            while 0 < len(order) < wanted:
                order = torch.cat([order, torch.randperm(ids.shape[0])])[:wanted]
            corrupted = self.corruptor(objective, ids[order], mask[order], seed=seed)
            self.model.train()
            slices = [slice(start, start + size) for start in range(0, len(order), size)]
            with self._staged("pretrain", steps_per_run=len(slices)) as done:
                result = run_epochs(
                    batches=lambda: slices, optimizer=self.round_optimizer(), epochs=1, protocol=self.protocol,
                    loss=lambda rows: self._pretrain_loss(corrupted.input_ids[rows], corrupted.attention_mask[rows],
                                                          corrupted.labels[rows], objective))
                done["steps"] = result["steps"]
        return {"pretrain_loss": result["train_loss"] if slices else float("nan"), "pretrain_steps": result["steps"],
                "objective_mlm": float(objective == "mlm")}

    def _pretrain_loss(self, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor, objective: str) -> torch.Tensor:
        width = max(int(mask.sum(dim=1).max()), 1)
        ids, mask = ids[:, :width], mask[:, :width]
        device = self.public.hidden.device
        hidden = build_prefix_cache(self.backbone, ids.to(device), mask.to(device), split=self.split,
                                    progress=False).hidden
        model = self.model
        if objective == "mlm":                                    # vocabulary logits at the selected positions only
            labels = labels[:, :width].to(device)
            selected = labels != IGNORE_INDEX
            if not bool(selected.any()):
                return model.suffix(hidden, mask.to(device)).sum() * 0.0
            states = model.suffix(hidden, mask.to(device))[selected]
            return F.cross_entropy(model.lm(states), labels[selected])
        target = labels[:, 1:]                                    # the original body + [SEP]; [CLS] starts decoding
        length = max(int((target != IGNORE_INDEX).sum(dim=1).max()), 1)
        return model.loss(hidden, mask.to(device), target[:, :length].to(device), source_ids=ids.to(device))


def _grad_norm(loss: torch.Tensor, params: Sequence[nn.Parameter]) -> float:
    """The total norm of d loss / d params (the graph kept for the step's own backward)."""
    grads = torch.autograd.grad(loss, list(params), retain_graph=True, allow_unused=True)
    total = torch.zeros(())
    for g in grads:
        if g is not None:
            total = total + g.detach().float().pow(2).sum().cpu()
    return float(total.sqrt())


def _inputs_of(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(prefix states, mask) of any formulation's batch."""
    if hasattr(batch, "source"):
        return batch.source, batch.source_mask
    return batch.hidden, batch.attention_mask


# ---- building clients ----------------------------------------------------------------------------

def _client_data(client: HeteroClient, backbone: nn.Module, tokenizer: Any, config: HeteroConfig,
                 device: torch.device | str) -> dict[str, Any]:
    split = prefix_split(backbone, config.adapter_layers)
    parts = {name: getattr(client, name) for name in SPLITS}
    if client.formulation == "classification":
        return {name: cache_texts(backbone, tokenizer, [t for t, _ in rows], [y for _, y in rows],
                                  max_length=config.max_length, split=split).to(device)
                for name, rows in parts.items()}
    if client.formulation == "tagging":
        rows = [r for name in SPLITS for r in parts[name]]
        enc = encode_tagged([w for w, _ in rows], [t for _, t in rows], tokenizer=tokenizer, max_length=config.max_length)
        states = cache_splits(backbone, enc.input_ids, enc.attention_mask, enc.labels,
                              sizes={n: len(parts[n]) for n in SPLITS}, split=split, device=device)
        out, start = {}, 0
        for name in SPLITS:
            stop = start + len(parts[name])
            gold = tuple(tuple(client.label_names[t] for t in tags) for _, tags in parts[name])
            out[name] = TaggedSplit(states[name], enc.word_index[start:stop].clone(), gold)
            start = stop
        return out
    if client.formulation == "qa":
        rows = [e for name in SPLITS for e in parts[name]]
        enc = encode_qa(tokenizer, rows, max_length=config.max_length)
        states = cache_splits(backbone, enc.input_ids, enc.attention_mask, torch.stack([enc.starts, enc.ends], dim=1),
                              sizes={n: len(parts[n]) for n in SPLITS}, split=split, device=device)
        out, start = {}, 0
        for name in SPLITS:
            cut = slice(start, start + len(parts[name]))
            out[name] = QASplit(states[name], enc.context_mask[cut].to(device), enc.offsets[cut].to(device),
                                enc.truncated[cut].to(device), tuple(e.passage for e in parts[name]),
                                tuple((e.answer_text,) for e in parts[name]))
            start = cut.stop
        return out
    out = {}
    for name, rows in parts.items():
        ids, mask, target = tokenize_pairs(tokenizer, [b for b, _ in rows], [h for _, h in rows],
                                           max_source=config.max_length, max_target=config.max_target)
        states = build_prefix_cache(backbone, ids.to(device), mask.to(device), split=split, progress=False).hidden
        out[name] = HeadlineSplit(states, mask.to(device), ids.to(device), target.to(device), tuple(h for _, h in rows))
    return out


def _loss_and_metrics(formulation: str, client: HeteroClient, tokenizer: Any) -> tuple[Callable, Callable]:
    if formulation == "classification":
        return classification_loss, classification_metrics
    if formulation == "tagging":
        names = client.label_names
        return token_loss, lambda m, b: tagging_metrics(m, b, label_names=names)
    if formulation == "qa":
        return qa_loss, qa_metrics
    return headline_loss, lambda m, b: headline_metrics(m, b, tokenizer=tokenizer)


def public_inputs(texts: Sequence[str], *, backbone: nn.Module, tokenizer: Any, config: HeteroConfig,
                  device: torch.device | str = "cpu") -> CachedSplit:
    """The CONTRAST stage's synthetic inputs: public texts no client holds, cached through the frozen
    prefix (the same for every client: public)."""
    if not texts:
        raise ValueError("CONTRAST needs at least one public input")
    split = prefix_split(backbone, config.adapter_layers)
    return cache_texts(backbone, tokenizer, list(texts), [0] * len(texts), max_length=config.max_length,
                       split=split).to(device)


class HeteroFactory:
    """Builds every client's trainer over one frozen backbone (its frozen weights shared, not copied)."""

    def __init__(self, *, backbone: nn.Module, tokenizer: Any, config: HeteroConfig, public_texts: Sequence[str],
                 device: torch.device | str = "cpu") -> None:
        self.backbone, self.tokenizer, self.config, self.device = backbone.requires_grad_(False), tokenizer, config, device
        self.seq2seq = Seq2SeqConfig(decoder_layers=config.decoder_layers, max_source=config.max_length,
                                     max_target=config.max_target, seed=config.seed)
        self.template = warm_decoder(backbone, layers=config.decoder_layers, seed=config.seed).to(device)
        self.public = public_inputs(public_texts, backbone=backbone, tokenizer=tokenizer, config=config, device=device)
        self.corruptor = Corruptor(tokenizer)
        self._data: dict[int, dict[str, Any]] = {}

    def model(self, client: HeteroClient) -> HeteroModel:
        c, hidden = self.config, self.backbone.config.hidden_size
        suffix = adapted_top(self.backbone, adapter_layers=c.adapter_layers, bottleneck=c.bottleneck, seed=c.seed)
        _own_norms(suffix)
        head: nn.Module | None = None
        if client.formulation == "classification":
            head = make_head(hidden, len(client.label_names), seed=c.seed)
        elif client.formulation == "tagging":
            head = seeded_module(c.seed, lambda: TokenClassifier(hidden, len(client.label_names), dropout=0.1))
        elif client.formulation == "qa":
            head = seeded_module(c.seed, lambda: nn.Linear(hidden, 2, bias=False))
        decoder = client_seq2seq(self.backbone, self.template, config=self.seq2seq, ids=special_ids(self.tokenizer))
        lm = seeded_module(c.seed, lambda: MaskedLMHead(self.backbone.get_input_embeddings()))
        return HeteroModel(formulation=client.formulation, suffix=suffix, head=head, decoder=decoder, lm=lm).to(self.device)

    def data(self, client: HeteroClient) -> dict[str, Any]:
        if client.client_id not in self._data:
            self._data[client.client_id] = _client_data(client, self.backbone, self.tokenizer, self.config, self.device)
        return self._data[client.client_id]

    def trainer(self, client: HeteroClient, *, protocol: HeteroProtocol | None = None) -> HeteroTrainer:
        """A fresh client (seeded model, no optimiser yet) over its own cached data, training under
        `protocol` (default: `kept-adamw` at `config.lr`, as before protocols were declared)."""
        enc = self.tokenizer(list(client.texts), truncation=True, max_length=self.config.pretrain_length, padding="longest",
                             return_tensors="pt", return_token_type_ids=False)
        loss_fn, metric_fn = _loss_and_metrics(client.formulation, client, self.tokenizer)
        return HeteroTrainer(client=client, model=self.model(client), data=self.data(client), config=self.config,
                             backbone=self.backbone, pretrain_ids=(enc["input_ids"], enc["attention_mask"]), public=self.public,
                             corruptor=self.corruptor, loss_fn=loss_fn, metric_fn=metric_fn, protocol=protocol)


__all__ = ["METRIC", "SHARED", "LOCAL_RUN", "STAGE", "SPANS", "STAGES", "PROTOCOL_NAMES", "atc_paper_protocol",
           "kept_adamw_protocol", "HeteroProtocol", "hetero_protocol", "HeteroConfig", "MaskedLMHead",
           "ContrastTargets", "HeteroModel", "shared_parts", "HeteroTrainer", "public_inputs", "HeteroFactory"]
