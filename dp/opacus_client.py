"""Example-level DP-SGD on a client with Opacus, one accountant per client kept across FL rounds.

Each round: model.train(), a fresh optimizer from the caller's factory, `make_private` with
Poisson sampling (sample rate = expected batch / n_k), E local epochs, then the Opacus hooks are
removed so the model is a plain module again. The client's Opacus accountant persists across
rounds (`state_dict` / `load_state_dict`), and every round debits the ledger with an
example-level Poisson-subsampled Gaussian entry (z, q, steps). The example-level guarantee holds
against anyone who sees the update, so it is debited for both observers.

Hugging Face pitfalls handled (research/dp_leakage.md Sec. 1.3-1.4):
* batch-broadcast position_ids / token_type_ids break per-sample embedding gradients (opacus
  #841, #592): dict batches with input_ids get contiguous [B, T] position_ids and token_type_ids
  when the model's forward accepts them;
* ghost clipping does not support tied parameters: refused up front with the tied names;
* `hooks` is the default mode (right for adapters / LoRA);
* after a round, the trainable parameters must have moved, else the optimizer held stale
  parameters (opacus #820): raised as StaleParametersError.

Noise comes from torch's generator (Opacus without `secure_mode`, which needs the unmaintained
torchcsprng): research-grade, not hardened against floating-point attacks.
"""
from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import dp_accounting
import numpy as np
import torch
from dp_accounting import rdp
from opacus import PrivacyEngine
from opacus.accountants import RDPAccountant, create_accountant
from opacus.accountants.analysis import rdp as privacy_analysis
from opacus.utils.fast_gradient_clipping_utils import DPTensorFastGradientClipping
from torch import nn
from torch.utils.data import DataLoader, Dataset

from dp.ledger import GaussianMechanism, Ledger, Observer, PrivacyUnit
from dp.sampling import SamplingRecord

LossFn = Callable[[nn.Module, Any], torch.Tensor]
"""(model, batch) -> per-example losses of shape [B] (reduction='none')."""
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]

_GRAD_SAMPLE_MODES = ("hooks", "functorch", "ghost")


class StaleParametersError(RuntimeError):
    """No trainable parameter changed during a DP round (see opacus #820)."""


@dataclass(frozen=True)
class DPSGDConfig:
    max_grad_norm: float = 1.0
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    """Calibrate z once, for `planned_rounds` rounds of `local_epochs` epochs, then keep it."""
    planned_rounds: int = 1
    delta: float = 1e-5
    batch_size: int = 16
    """Expected batch size under Poisson sampling."""
    local_epochs: int = 1
    accountant: str = "rdp"
    """The per-client Opacus accountant: 'rdp' or 'prv' ('gdp' underestimates; refused)."""
    grad_sample_mode: str = "hooks"
    check_params_moved: bool = True
    fix_hf_inputs: bool = True

    def __post_init__(self) -> None:
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError("give exactly one of noise_multiplier and target_epsilon")
        if self.accountant not in ("rdp", "prv"):
            raise ValueError("accountant must be 'rdp' or 'prv' (GDP can underestimate epsilon)")
        if self.grad_sample_mode not in _GRAD_SAMPLE_MODES:
            raise ValueError(f"grad_sample_mode must be one of {_GRAD_SAMPLE_MODES}")
        if self.max_grad_norm <= 0 or self.batch_size < 1 or self.local_epochs < 1 or self.planned_rounds < 1:
            raise ValueError("need max_grad_norm > 0 and positive batch_size, local_epochs, planned_rounds")


@dataclass(frozen=True)
class DPSGDRoundReport:
    client_id: int
    round_id: int
    steps: int
    sample_rate: float
    noise_multiplier: float
    epsilon: float
    """Example-level epsilon after this round, from the ledger (dp_accounting)."""
    opacus_epsilon: float
    """The same from the client's Opacus accountant (cross-check)."""
    mean_loss: float
    unmoved: tuple[str, ...]
    """Trainable parameters that did not change (should be empty)."""


def tied_parameters(model: nn.Module) -> list[tuple[str, str]]:
    """Pairs of parameter names that share one tensor (e.g. GPT-2's wte and lm_head)."""
    first: dict[int, str] = {}
    pairs = []
    for name, p in model.named_parameters(remove_duplicate=False):
        key = id(p)
        if key in first:
            pairs.append((first[key], name))
        else:
            first[key] = name
    return pairs


def fix_hf_batch(batch: Any, model: nn.Module) -> Any:
    """Give a dict batch with input_ids contiguous batch-sized position_ids and token_type_ids
    (if the model's forward takes them), so per-sample embedding gradients have batch size B."""
    if not isinstance(batch, Mapping) or "input_ids" not in batch:
        return batch
    ids = batch["input_ids"]
    if ids.dim() != 2:
        return batch
    accepted = inspect.signature(model.forward).parameters
    out = dict(batch)
    b, t = ids.shape
    if "position_ids" in accepted:
        pos = out.get("position_ids")
        out["position_ids"] = (torch.arange(t, device=ids.device).unsqueeze(0).repeat(b, 1) if pos is None
                               else pos.expand(b, -1).contiguous())
    if "token_type_ids" in accepted:
        tt = out.get("token_type_ids")
        out["token_type_ids"] = torch.zeros_like(ids) if tt is None else tt.expand(b, -1).contiguous()
    return out


def calibrate_noise_multiplier(*, target_epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """z for `steps` Poisson-subsampled Gaussian steps at `sample_rate`, by dp_accounting (RDP)."""
    return float(dp_accounting.calibrate_dp_mechanism(
        rdp.RdpAccountant,
        lambda z: dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(sample_rate, dp_accounting.GaussianDpEvent(z)), steps),
        target_epsilon, delta))


@lru_cache(maxsize=256)
def _opacus_rdp_step(q: float, z: float, alphas: tuple[float, ...]) -> np.ndarray:
    """One step's RDP curve by Opacus's analysis (`compute_rdp` is `steps` times this; fractional orders
    made it 0.5 s a call, every round, for every DP-SGD client)."""
    out = privacy_analysis.compute_rdp(q=q, noise_multiplier=z, steps=1, orders=list(alphas))
    out.setflags(write=False)
    return out


class OpacusClient:
    """DP-SGD client state: its Opacus accountant and noise multiplier, persisted across rounds."""

    def __init__(self, *, client_id: int, config: DPSGDConfig, ledger: Ledger | None = None) -> None:
        self.client_id = int(client_id)
        self.config = config
        self.ledger = ledger
        self.accountant = create_accountant(mechanism=config.accountant)
        self.noise_multiplier: float | None = config.noise_multiplier
        self.rounds_done = 0

    def epsilon(self) -> float:
        """Example-level epsilon so far, from the Opacus accountant (RDP: Opacus's own analysis, with each
        (sample rate, noise multiplier)'s per-step curve cached, as `RDPAccountant.get_epsilon` computes it)."""
        if not self.accountant.history:
            return 0.0
        if isinstance(self.accountant, RDPAccountant):
            alphas = tuple(RDPAccountant.DEFAULT_ALPHAS)
            curve = sum(_opacus_rdp_step(q, z, alphas) * steps for z, q, steps in self.accountant.history)
            return float(privacy_analysis.get_privacy_spent(orders=list(alphas), rdp=curve, delta=self.config.delta)[0])
        return float(self.accountant.get_epsilon(delta=self.config.delta))

    def train_round(self, *, model: nn.Module, optimizer_factory: OptimizerFactory, dataset: Dataset,
                    loss_fn: LossFn, round_id: int, collate_fn: Callable | None = None) -> DPSGDRoundReport:
        cfg = self.config
        n = len(dataset)
        if n < 1:
            raise ValueError("empty dataset")
        if cfg.grad_sample_mode == "ghost":
            tied = tied_parameters(model)
            if tied:
                raise ValueError(f"ghost clipping does not support tied parameters {tied} (Opacus raises "
                                 "'Parameter tying is not supported'): use grad_sample_mode='hooks', untie, or freeze them")
        trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        if not trainable:
            raise ValueError("the model has no trainable parameters")
        loader = DataLoader(dataset, batch_size=cfg.batch_size, shuffle=False, collate_fn=collate_fn)
        sample_rate = 1.0 / len(loader)
        if self.noise_multiplier is None:
            self.noise_multiplier = calibrate_noise_multiplier(
                target_epsilon=cfg.target_epsilon, delta=cfg.delta, sample_rate=sample_rate,
                steps=cfg.planned_rounds * cfg.local_epochs * len(loader))
        before = {name: p.detach().clone() for name, p in trainable}

        model.train()  # before make_private: Opacus validates and hooks in train mode
        optimizer = optimizer_factory([p for _, p in trainable])
        engine = PrivacyEngine(accountant=cfg.accountant)
        engine.accountant = self.accountant
        made = engine.make_private(module=model, optimizer=optimizer, data_loader=loader,
                                   noise_multiplier=self.noise_multiplier, max_grad_norm=cfg.max_grad_norm,
                                   poisson_sampling=True, grad_sample_mode=cfg.grad_sample_mode,
                                   criterion=nn.CrossEntropyLoss())  # only checked (ghost): we pass per-example losses
        private_model, dp_optimizer, dp_loader = made[0], made[1], made[-1]
        steps, loss_sum, loss_count = 0, 0.0, 0
        try:
            for _ in range(cfg.local_epochs):
                for batch in dp_loader:
                    if cfg.fix_hf_inputs:
                        batch = fix_hf_batch(batch, model)
                    dp_optimizer.zero_grad()
                    per_example = loss_fn(private_model, batch)
                    if per_example.dim() != 1:
                        raise ValueError("loss_fn must return per-example losses of shape [B]")
                    if cfg.grad_sample_mode == "ghost":
                        DPTensorFastGradientClipping(private_model, dp_optimizer, per_example, "mean").backward()
                    else:
                        (per_example.sum() / max(per_example.shape[0], 1)).backward()
                    dp_optimizer.step()
                    steps += 1
                    loss_sum += float(per_example.detach().sum())
                    loss_count += per_example.shape[0]
        finally:
            private_model._close()  # remove hooks and per-sample attributes: a plain module again
        unmoved = tuple(name for name, p in trainable if torch.equal(before[name], p.detach()))
        if cfg.check_params_moved and steps and len(unmoved) == len(trainable):
            raise StaleParametersError(
                f"client {self.client_id}: no trainable parameter changed after {steps} DP steps; the optimizer "
                "probably holds stale parameters (opacus #820: move the model to its device before wrapping it)")
        if unmoved and cfg.check_params_moved:
            warnings.warn(f"client {self.client_id}: trainable parameters did not move: {list(unmoved)[:5]}",
                          stacklevel=2)
        self.rounds_done += 1
        epsilon = math.nan
        if self.ledger is not None and steps:
            mech = GaussianMechanism(noise_multiplier=self.noise_multiplier, sampling_rate=sample_rate,
                                     sensitivity=cfg.max_grad_norm)
            batches = SamplingRecord("poisson", len(dataset), sample_rate)  # Opacus draws Poisson batches
            for observer in (Observer.SERVER, Observer.OUTSIDER):
                self.ledger.debit(self.client_id, mech, unit=PrivacyUnit.EXAMPLE, observer=observer,
                                  round_id=round_id, summary_key="dp-sgd", count=steps, sampling=batches)
            epsilon = self.ledger.epsilon(self.client_id, unit=PrivacyUnit.EXAMPLE, observer=Observer.SERVER)
        return DPSGDRoundReport(client_id=self.client_id, round_id=round_id, steps=steps, sample_rate=sample_rate,
                                noise_multiplier=self.noise_multiplier, epsilon=epsilon,
                                opacus_epsilon=self.epsilon(), mean_loss=loss_sum / max(loss_count, 1),
                                unmoved=unmoved)

    def state_dict(self) -> dict[str, Any]:
        return {"accountant": self.accountant.state_dict(), "noise_multiplier": self.noise_multiplier,
                "rounds_done": self.rounds_done, "client_id": self.client_id}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if int(state["client_id"]) != self.client_id:
            raise ValueError("state belongs to another client")
        self.accountant.load_state_dict(dict(state["accountant"]))
        self.noise_multiplier = state["noise_multiplier"]
        self.rounds_done = int(state["rounds_done"])
