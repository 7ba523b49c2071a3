"""Kim-style text CNN with FedWeIT-decomposed kernels, for FedSeIT / FedWeIT federated continual learning.

A PyTorch port of the model layer of the public TF code of FedSeIT (RaiPranav/FCL-FedSeIT, commit
cec4a7f9: ``FedWeit/models/fedweit/{fedweit_local,fedweit_layers,fedweit_plus_layers}.py``,
``FedWeit/modules/config.py``); equations from the FedSeIT paper (Chaudhary et al., 2022).

Every conv kernel (one per kernel size F, shape NF x D x F, over frozen word embeddings) is decomposed
per task t (paper Eq. 1, with the reference's ``generate_mask = sigmoid``):

    theta_t = B ⊙ sigmoid(m_t) + A_t

B is shared by all tasks and is the only thing the server averages (FedAvg, here through secure
aggregation); m_t is a per-filter mask (a vector of NF, broadcast over the kernel, paper App. B);
A_t is a sparse task-adaptive kernel, exported to other clients. At evaluation A_t is hard-thresholded,
a -> a * [|a| > threshold] (the reference's ``l1_pruning``, applied when Keras' learning phase is 0).

Foreign knowledge, A^f_1..A^f_K from other clients' tasks (frozen), enters in one of two ways:

* FedWeIT (paper Eq. 4, ``DecomposableConv``):  theta_t = B ⊙ sigmoid(m_t) + A_t + sum_k alpha_k A^f_k;
  conv -> ReLU -> global max-pool per kernel size, concat, dropout, task head.
* FedSeIT (paper Eqs. 2-3, ``build_cnn_parallel`` with ``--concatenate-aw-kbs``): a separate
  convolution per foreign slot with kernel alpha_k A^f_k and its own bias,
      z_c = CNN(x; theta_t),   z^_k = ReLU(maxpool(conv(x; alpha_k A^f_k) + b_k)),
      z_f = ReLU(W_f [z^_1 ⊕ ... ⊕ z^_K] + b_f)      (per kernel size, only with ``projection``)
      z   = ReLU(W_c dropout([z_c ⊕ z_f]) + b_c),    y^ = softmax(W_head z + b_head).
  W_f, W_c and the head are local per task (``--dense-detached``: the paper's FedSeIT, no DLS).

Loss for task t (``FedWeITLocal.loss``; tf.nn.l2_loss(x) = ||x||^2 / 2 is kept):

    L = CE + wd * sum_l (||m_t||^2 + ||A_t||^2 [+ ||B||^2 if no earlier task] + ||W_local||^2) / 2
           + l1 * sum_l (|A_t| + sum_{i<t} |A_i| + |W_local|) + mask_l1 * sum_l |m_t|
           + drift * sum_{i<t} sum_l ||B ⊙ sigmoid(m_i) + A_i - theta_i^*||^2 / 2

theta_i^* is task i's kernel stored when task t started (``theta_snapshot``); m_i, A_i of earlier tasks
stay trainable so that they can absorb the change of B (paper Eq. 5: ||ΔB ⊙ m_i - ΔA_i||^2).

Deviations from the reference, stated:
* SIMPLIFICATION: CE is the batch mean. The reference returns a per-example vector loss, so TF
  differentiates its batch sum, i.e. batch_size x (mean CE + regularisers); Adam is (nearly)
  invariant to that constant factor.
* The task head is trained. The reference leaves it out of its hand-built trainable-variable list, so
  its head stays at the Glorot initialisation (``trainable_parameters`` lists what we train).
* Weight decay and L1 cover every local dense kernel (W_c and all W_f). The reference reaches only the
  first projection, because ``get_variable(..., [0])`` returns one of the three.
* The "foreign adaptives trainable" option (``--foreign-adaptives-trainable``, off by default) and the
  decomposed shared dense layer (FedSeIT+DLS, ``--fedweit-dense``) are not ported.
* Padding: an optional ``attention_mask`` zeroes the embeddings of padded positions, which is what the
  reference's all-zero padding row of its GloVe matrix does; MiniLM's [PAD] row is not zero.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from nlp_models.adapters import flatten_parameters, load_parameters_

MODES = ("fedweit", "fedseit")
# Keras VarianceScaling(truncated_normal): std = sqrt(scale / fan_in) / this, truncated at 2 std.
_KERAS_TRUNCATION = 0.87962566103423978


@dataclass(frozen=True)
class DecomposedConfig:
    """Shape, regularisation and foreign-knowledge wiring of the decomposed CNN (reference defaults)."""

    kernel_sizes: tuple[int, ...] = (3, 4, 5)
    """Conv kernel sizes F: paper Table 4; ``fedweit_global.py`` ``cnn_shapes``."""
    filters: int = 128
    """Filters NF per kernel size: paper Table 4; ``fs = 128`` in ``fedweit_global.py``."""
    num_classes: int = 4
    """Default head size: paper §3, |L_t| = 4 labels per task (SUBJ: 2); ``add_task`` can override."""
    dropout: float = 0.3
    """``Config.fedavg_abc_apd_parallel`` / ``fedavg_abc_apd_kim``; paper Table 4."""
    mode: str = "fedseit"
    """'fedseit' (``--model 5 --concatenate-aw-kbs``) or 'fedweit' (the reference's default ``--model 3``)."""
    projection: bool = False
    """FedSeIT's W_f (``--project-adaptives``, off by default in the parser; paper Eq. 3 uses it)."""
    foreign_slots: int = 3
    """K foreign adaptives per task: ``num_adapts = num_clients (3) * frac_clients (1)``; SIT: ``--et-top-k`` 3 or 5."""
    l1: float = 1e-3
    """lambda_1, L1 on A (``l1_hyp``): ``Config.fedavg_abc_apd_parallel``; paper Table 4."""
    threshold: float = 1e-3
    """Hard threshold on A at evaluation and export; the reference reuses ``l1_hyp`` (1e-3) for it."""
    mask_l1: float = 0.0
    """L1 weight on the mask and its evaluation threshold on sigmoid(m) (``mask_hyp = 0``: both inactive)."""
    drift: float = 1.0
    """lambda_2 (``--lambda-two``/``approx_hyp``). The code falls back to 100 when it is not given, but
    every published script passes 1 or 0.1 (paper Table 2); 1.0 is the paper's first setting."""
    weight_decay: float = 1e-4
    """``wd_rate``: ``Config.fedavg_abc_apd_parallel``."""
    adaptive_init: float = 0.2
    """A_t starts as ``adaptive_init * B`` (reference: ``shared / 5`` unless ``--adaptive-random``)."""
    init_scale: float = 1.0
    """Keras ``VarianceScaling()`` (scale 1, fan_in, truncated normal): B, masks, biases, alpha, local dense."""
    seed: int = 1
    """Initialisation seed (reference ``--random-seed`` default 1); equal seeds give equal initial B."""

    def __post_init__(self) -> None:
        sizes = tuple(self.kernel_sizes)
        if not sizes or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in sizes):
            raise ValueError(f"kernel_sizes must be a non-empty sequence of positive ints, got {self.kernel_sizes!r}")
        if len(set(sizes)) != len(sizes):
            raise ValueError(f"kernel_sizes must be distinct, got {sizes}")
        object.__setattr__(self, "kernel_sizes", sizes)
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.filters < 1:
            raise ValueError(f"filters must be >= 1, got {self.filters}")
        if self.num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {self.num_classes}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.foreign_slots < 0:
            raise ValueError(f"foreign_slots must be >= 0, got {self.foreign_slots}")
        if self.mode == "fedseit" and self.foreign_slots < 1:
            raise ValueError("mode 'fedseit' needs foreign_slots >= 1 (one foreign convolution per slot)")
        if self.projection and self.mode != "fedseit":
            raise ValueError("projection (W_f over the foreign features) exists only in mode 'fedseit'")
        for name in ("l1", "threshold", "mask_l1", "drift", "weight_decay", "adaptive_init"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be finite and >= 0, got {value}")
        if not math.isfinite(self.init_scale) or self.init_scale <= 0:
            raise ValueError(f"init_scale must be finite and > 0, got {self.init_scale}")


class DecomposedLoss(NamedTuple):
    """``loss`` is the differentiable total; the other fields are its value and its terms, for logging."""

    loss: Tensor
    total: float
    ce: float
    weight_decay: float
    sparsity: float
    drift: float


def _variance_scaling_(tensor: Tensor, fan_in: int, scale: float, generator: torch.Generator) -> Tensor:
    """Keras ``VarianceScaling(scale, 'fan_in', 'truncated_normal')`` in place."""
    std = math.sqrt(scale / max(1, fan_in)) / _KERAS_TRUNCATION
    with torch.no_grad():
        return nn.init.trunc_normal_(tensor, std=std, a=-2 * std, b=2 * std, generator=generator)


def _hard_threshold(weights: Tensor, threshold: float) -> Tensor:
    """The reference's ``l1_pruning``: keep entries with |w| > threshold (strictly), zero the rest."""
    return weights * (weights.abs() > threshold).to(weights.dtype)


def _l2(tensor: Tensor) -> Tensor:
    """tf.nn.l2_loss: sum(x^2) / 2."""
    return tensor.pow(2).sum() / 2


class _Task(nn.Module):
    """One task's local state: mask, adaptive, bias, alphas, foreign buffers, local dense layers, head."""

    def __init__(self, base: Mapping[str, Tensor], config: DecomposedConfig, num_classes: int,
                 generator: torch.Generator):
        super().__init__()
        nf, slots, scale = config.filters, config.foreign_slots, config.init_scale
        self.num_classes = num_classes
        self.mask = nn.ParameterDict()
        self.adaptive = nn.ParameterDict()
        self.bias = nn.ParameterDict()
        self.alpha = nn.ParameterDict()
        self.foreign_bias = nn.ParameterDict()
        self.projection = nn.ModuleDict()
        for name, b in base.items():
            # 1-D Keras shapes have fan_in = fan_out = length.
            self.mask[name] = nn.Parameter(_variance_scaling_(torch.empty(nf), nf, scale, generator))
            self.adaptive[name] = nn.Parameter(b.detach().clone() * config.adaptive_init)
            self.bias[name] = nn.Parameter(_variance_scaling_(torch.empty(nf), nf, scale, generator))
            if slots:
                self.alpha[name] = nn.Parameter(_variance_scaling_(torch.empty(slots), slots, scale, generator))
                # Zeros until set_foreign, as the reference's 'from_kb' variables.
                self.register_buffer(f"foreign_{name}", torch.zeros(slots, *b.shape))
            if config.mode == "fedseit":
                self.foreign_bias[name] = nn.Parameter(
                    _variance_scaling_(torch.empty(slots, nf), nf, scale, generator))
                if config.projection:
                    self.projection[name] = _local_linear(slots * nf, nf, scale, generator)
        width = len(base) * nf
        if config.mode == "fedseit":
            fused = 2 * width if config.projection else (slots + 1) * width
            self.fusion = _local_linear(fused, width, scale, generator)
        else:
            self.fusion = None
        self.head = nn.Linear(width, num_classes)
        with torch.no_grad():  # Keras Dense defaults: glorot_uniform kernel, zero bias.
            nn.init.xavier_uniform_(self.head.weight, generator=generator)
            nn.init.zeros_(self.head.bias)

    def foreign(self, name: str) -> Tensor:
        return getattr(self, f"foreign_{name}")

    def local_dense(self) -> list[Tensor]:
        """The local dense kernels (W_f per kernel size, W_c) that get weight decay and L1."""
        kernels = [layer.weight for layer in self.projection.values()]
        return kernels + ([self.fusion.weight] if self.fusion is not None else [])


def _local_linear(fan_in: int, fan_out: int, scale: float, generator: torch.Generator) -> nn.Linear:
    """The reference's ``DecomposableDenseSimple`` ('fully_local'): VarianceScaling kernel and bias."""
    layer = nn.Linear(fan_in, fan_out)
    _variance_scaling_(layer.weight, fan_in, scale, generator)
    _variance_scaling_(layer.bias, fan_out, scale, generator)
    return layer


class DecomposedTextCNN(nn.Module):
    """Kim CNN over frozen embeddings with theta_t = B ⊙ sigmoid(m_t) + A_t kernels and per-task heads.

    ``embeddings`` (vocab x dim) is kept as a frozen, non-persistent buffer (it is the caller's, e.g.
    MiniLM's 30522 x 384 token-embedding matrix). ``add_task`` creates a task and makes it current;
    ``forward`` runs the current task unless ``task_id`` is given.
    """

    def __init__(self, embeddings: Tensor, config: DecomposedConfig = DecomposedConfig()):
        super().__init__()
        if not isinstance(embeddings, Tensor) or embeddings.ndim != 2 or not embeddings.is_floating_point():
            raise ValueError("embeddings must be a 2-D floating-point tensor (vocab x dim)")
        if not torch.isfinite(embeddings).all():
            raise ValueError("embeddings must be finite")
        self.config = config
        self.register_buffer("embeddings", embeddings.detach().float(), persistent=False)
        dim = embeddings.shape[1]
        generator = torch.Generator().manual_seed(config.seed)
        self.base = nn.ParameterDict()
        for size in config.kernel_sizes:
            # Keras kernel (F, D, NF) is stored in torch's conv1d layout (NF, D, F); fan_in = F * D.
            kernel = torch.empty(config.filters, dim, size)
            self.base[f"conv{size}"] = nn.Parameter(
                _variance_scaling_(kernel, size * dim, config.init_scale, generator))
        self.tasks = nn.ModuleDict()
        self.dropout = nn.Dropout(config.dropout)
        self._current: int | None = None

    # ------------------------------------------------------------------ tasks

    @property
    def kernel_names(self) -> tuple[str, ...]:
        """Names of the decomposed kernels, in base-vector order ('conv3', 'conv4', 'conv5')."""
        return tuple(self.base.keys())

    @property
    def task_ids(self) -> tuple[int, ...]:
        """Known tasks, in the order they were added."""
        return tuple(int(key) for key in self.tasks.keys())

    @property
    def current_task(self) -> int:
        if self._current is None:
            raise KeyError("no task yet: call add_task first")
        return self._current

    @property
    def feature_dim(self) -> int:
        """Width of the concatenated pooled features fed to dropout (grows with K without projection)."""
        width = len(self.base) * self.config.filters
        if self.config.mode == "fedweit":
            return width
        return 2 * width if self.config.projection else (self.config.foreign_slots + 1) * width

    def _task(self, task_id: int | None) -> tuple[int, _Task]:
        task_id = self.current_task if task_id is None else task_id
        if isinstance(task_id, bool) or not isinstance(task_id, int):
            raise TypeError(f"task ids are ints, got {task_id!r}")
        key = str(task_id)
        if key not in self.tasks:
            raise KeyError(f"unknown task {task_id}; known tasks: {list(self.task_ids)}")
        return task_id, self.tasks[key]

    def add_task(self, task_id: int, *, num_classes: int | None = None) -> None:
        """Create task ``task_id`` (mask, A_t = adaptive_init * B, bias, alphas, head) and make it current."""
        if isinstance(task_id, bool) or not isinstance(task_id, int):
            raise TypeError(f"task ids are ints, got {task_id!r}")
        if task_id < 0:
            raise ValueError(f"task ids must be >= 0, got {task_id}")
        if str(task_id) in self.tasks:
            raise ValueError(f"task {task_id} already exists")
        classes = self.config.num_classes if num_classes is None else num_classes
        if classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {classes}")
        # Per-task stream: independent of how many tasks were added before, reproducible per seed.
        generator = torch.Generator().manual_seed(self.config.seed * 1_000_003 + task_id + 1)
        device = next(iter(self.base.values())).device
        self.tasks[str(task_id)] = _Task(self.base, self.config, classes, generator).to(device)
        self._current = task_id

    def set_task(self, task_id: int) -> None:
        """Make a known task current (KeyError if unknown)."""
        self._current, _ = self._task(task_id)

    def set_foreign(self, task_id: int, adaptives: Sequence[Mapping[str, Tensor]], *,
                    alphas: Sequence[float] | None = None) -> None:
        """Store foreign adaptives (``adaptive()`` dicts of other clients/tasks) as frozen buffers.

        Up to ``foreign_slots``; the remaining slots are zero, as in the reference. ``alphas`` (e.g. SIT's
        normalised scores, ``--et-init-alphas``) overwrite the first alphas of every kernel; the alphas
        stay trainable. The foreign tensors never train.
        """
        _, task = self._task(task_id)
        slots = self.config.foreign_slots
        if len(adaptives) > slots:
            raise ValueError(f"got {len(adaptives)} foreign adaptives, but foreign_slots is {slots}")
        if alphas is not None and len(alphas) != len(adaptives):
            raise ValueError(f"got {len(alphas)} alphas for {len(adaptives)} foreign adaptives")
        for index, adaptive in enumerate(adaptives):
            if set(adaptive) != set(self.kernel_names):
                raise ValueError(f"foreign adaptive {index} has keys {sorted(adaptive)}, "
                                 f"expected {sorted(self.kernel_names)}")
            for name, value in adaptive.items():
                if tuple(value.shape) != tuple(self.base[name].shape):
                    raise ValueError(f"foreign adaptive {index}[{name!r}] has shape {tuple(value.shape)}, "
                                     f"expected {tuple(self.base[name].shape)}")
                if not torch.isfinite(value).all():
                    raise ValueError(f"foreign adaptive {index}[{name!r}] is not finite")
        if not slots:
            return
        with torch.no_grad():
            for name in self.kernel_names:
                buffer = task.foreign(name)
                buffer.zero_()
                for index, adaptive in enumerate(adaptives):
                    buffer[index].copy_(adaptive[name].detach().to(buffer))
                if alphas is not None and adaptives:
                    task.alpha[name][: len(alphas)].copy_(torch.as_tensor(list(alphas)).to(task.alpha[name]))

    # ------------------------------------------------------------------ decomposition

    def _mask(self, task: _Task, name: str, hard_threshold: bool) -> Tensor:
        mask = torch.sigmoid(task.mask[name])
        return _hard_threshold(mask, self.config.mask_l1) if hard_threshold else mask

    def theta(self, task_id: int | None = None, *, hard_threshold: bool = False,
              include_foreign: bool = False) -> dict[str, Tensor]:
        """Task kernels B ⊙ sigmoid(m) + A (differentiable), optionally as at evaluation and with FedWeIT's
        alpha-weighted foreign sum; the drift term uses the plain form."""
        _, task = self._task(task_id)
        kernels = {}
        for name, base in self.base.items():
            adaptive = task.adaptive[name]
            if hard_threshold:
                adaptive = _hard_threshold(adaptive, self.config.threshold)
            kernel = base * self._mask(task, name, hard_threshold)[:, None, None] + adaptive
            if include_foreign and self.config.foreign_slots:
                kernel = kernel + torch.einsum("k,k...->...", task.alpha[name], task.foreign(name))
            kernels[name] = kernel
        return kernels

    def theta_snapshot(self, task_ids: Iterable[int] | None = None) -> dict[int, dict[str, Tensor]]:
        """Detached copies of theta_i (the reference's ``recover_prev_theta``), for ``task_loss(previous=)``.

        Take it when a new task starts, before training it; default: every task but the current one.
        """
        if task_ids is None:
            task_ids = [tid for tid in self.task_ids if tid != self._current]
        with torch.no_grad():
            return {tid: {name: value.detach().clone() for name, value in self.theta(tid).items()}
                    for tid in task_ids}

    def adaptive(self, task_id: int | None = None) -> dict[str, Tensor]:
        """A_t, hard-thresholded and detached: what a client exports (reference ``get_adapts``)."""
        _, task = self._task(task_id)
        return {name: _hard_threshold(value.detach(), self.config.threshold).clone()
                for name, value in task.adaptive.items()}

    # ------------------------------------------------------------------ forward

    def features(self, input_ids: Tensor, attention_mask: Tensor | None = None, *,
                 task_id: int | None = None) -> Tensor:
        """Concatenated pooled features [z_c ⊕ z_f] (batch x ``feature_dim``), before dropout."""
        _, task = self._task(task_id)
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must be batch x length, got shape {tuple(input_ids.shape)}")
        if input_ids.shape[1] < max(self.config.kernel_sizes):
            raise ValueError(f"sequences need >= {max(self.config.kernel_sizes)} tokens (valid convolution), "
                             f"got {input_ids.shape[1]}")
        x = F.embedding(input_ids, self.embeddings)
        if attention_mask is not None:
            x = x * attention_mask[..., None].to(x.dtype)
        x = x.transpose(1, 2)
        evaluating = not self.training
        kernels = self.theta(task_id, hard_threshold=evaluating, include_foreign=self.config.mode == "fedweit")
        local, foreign = [], []
        for name, kernel in kernels.items():
            local.append(F.relu(F.conv1d(x, kernel, task.bias[name])).amax(dim=-1))
            if self.config.mode == "fedseit":
                # One convolution per foreign slot, stacked along output channels (same input x).
                alpha_kernels = task.alpha[name][:, None, None, None] * task.foreign(name)
                pooled = F.conv1d(x, alpha_kernels.flatten(0, 1), task.foreign_bias[name].flatten()).amax(dim=-1)
                pooled = F.relu(pooled)
                if self.config.projection:
                    pooled = F.relu(task.projection[name](pooled))
                foreign.append(pooled)
        return torch.cat(local + foreign, dim=-1)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, *,
                task_id: int | None = None) -> Tensor:
        """Logits (batch x the task's classes); softmax is left to the loss."""
        _, task = self._task(task_id)
        z = self.dropout(self.features(input_ids, attention_mask, task_id=task_id))
        if task.fusion is not None:
            z = F.relu(task.fusion(z))
        return task.head(z)

    # ------------------------------------------------------------------ loss

    def task_loss(self, logits: Tensor, y: Tensor, *, task_id: int,
                  previous: Mapping[int, Mapping[str, Tensor]] | None = None) -> DecomposedLoss:
        """CE + weight decay + L1 sparsity + lambda_2 drift of earlier tasks' theta (see module docstring).

        ``previous`` maps earlier task ids to their stored theta (``theta_snapshot``); without it (task 0)
        B gets weight decay instead, as in the reference.
        """
        task_id, task = self._task(task_id)
        if logits.ndim != 2 or y.ndim != 1 or logits.shape[0] != y.shape[0]:
            raise ValueError(f"logits must be N x C and y of length N, got {tuple(logits.shape)} and {tuple(y.shape)}")
        if logits.shape[1] != task.num_classes:
            raise ValueError(f"task {task_id} has {task.num_classes} classes, logits have {logits.shape[1]}")
        previous = dict(previous or {})
        for tid, stored in previous.items():
            if tid == task_id:
                raise ValueError(f"previous must hold earlier tasks, not the current task {task_id}")
            self._task(tid)
            if set(stored) != set(self.kernel_names):
                raise ValueError(f"previous[{tid}] has keys {sorted(stored)}, expected {sorted(self.kernel_names)}")
        cfg = self.config
        zero = logits.new_zeros(())
        ce = F.cross_entropy(logits, y)
        decay, sparsity, drift = zero, zero, zero
        for name, base in self.base.items():
            mask, adaptive = task.mask[name], task.adaptive[name]
            decay = decay + _l2(mask) + _l2(adaptive)
            sparsity = sparsity + cfg.mask_l1 * mask.abs().sum() + cfg.l1 * adaptive.abs().sum()
            if not previous:
                decay = decay + _l2(base)
        for tid, stored in previous.items():
            _, earlier = self._task(tid)
            current = self.theta(tid)
            for name in self.kernel_names:
                if tuple(stored[name].shape) != tuple(current[name].shape):
                    raise ValueError(f"previous[{tid}][{name!r}] has shape {tuple(stored[name].shape)}, "
                                     f"expected {tuple(current[name].shape)}")
                drift = drift + _l2(current[name] - stored[name].to(current[name]))
                sparsity = sparsity + cfg.l1 * earlier.adaptive[name].abs().sum()
        for kernel in task.local_dense():
            decay = decay + _l2(kernel)
            sparsity = sparsity + cfg.l1 * kernel.abs().sum()
        decay, drift = cfg.weight_decay * decay, cfg.drift * drift
        total = ce + decay + sparsity + drift
        return DecomposedLoss(total, float(total.detach()), float(ce.detach()), float(decay.detach()),
                              float(sparsity.detach()), float(drift.detach()))

    def trainable_parameters(self, task_id: int | None = None) -> list[nn.Parameter]:
        """What training task t updates, as the reference: B; m_i, A_i of every task up to t; and t's
        bias, alphas, foreign biases, local dense layers and head (the head: see module docstring)."""
        task_id, task = self._task(task_id)
        params = list(self.base.values())
        for tid in self.task_ids:
            earlier = self.tasks[str(tid)]
            params += list(earlier.mask.values()) + list(earlier.adaptive.values())
            if tid == task_id:
                break
        params += list(task.bias.values()) + list(task.alpha.values()) + list(task.foreign_bias.values())
        params += list(task.projection.parameters())
        if task.fusion is not None:
            params += list(task.fusion.parameters())
        return params + list(task.head.parameters())

    # ------------------------------------------------------------------ the shared base B

    def base_parameters(self) -> list[nn.Parameter]:
        """The shared kernels B, in ``kernel_names`` order: all that the server aggregates (FedAvg)."""
        return list(self.base.values())

    @property
    def base_size(self) -> int:
        return sum(parameter.numel() for parameter in self.base.values())

    def base_vector(self) -> np.ndarray:
        """B as one new float32 vector (``kernel_names`` order, each kernel C-flattened as NF x D x F)."""
        return flatten_parameters(self.base_parameters())

    def load_base_vector(self, vector: np.ndarray, *, nonzero_only: bool = False) -> None:
        """Overwrite B from a flat vector (validated: 1-D, right length, finite).

        ``nonzero_only=True`` is the reference/paper client update ``B(n) = theta_G(n)`` for the non-zero
        entries n of the global vector only (zeros keep the local value; matters with sparse uploads).
        """
        values = np.asarray(vector)
        if nonzero_only and values.shape == (self.base_size,) and np.issubdtype(values.dtype, np.floating):
            values = np.where(values != 0, values, self.base_vector())
        load_parameters_(self.base_parameters(), values, what="base vector B")


__all__ = ["MODES", "DecomposedConfig", "DecomposedLoss", "DecomposedTextCNN"]
