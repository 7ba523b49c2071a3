"""LoRA (Hu et al., 2022) on a client's adapted top layers, through peft: FedMCP's FedLR baseline.

A LoRA layer keeps the frozen weight W of a linear map and learns a low-rank update beside it,

    h = W x + (alpha / r) B A x,      A: r x d_in,  B: d_out x r,

here on the attention ``query`` and ``value`` projections of the top (adapted) encoder layers, with
r = 8, alpha = 16 and no LoRA dropout (`LoraSettings`). Injection goes through peft's public
``LoraConfig`` + ``inject_adapter_in_model`` into a client's `nlp_models.frozen_prefix.TopEncoder`:
peft replaces the client's own copies of the targeted ``nn.Linear`` modules by LoRA wrappers whose
``base_layer`` holds the backbone's frozen weight tensors (shared between clients, never copied, left
frozen and unmodified); other clients and the backbone itself keep their plain modules.

Initialisation is peft's standard one, made deterministic: A is Kaiming-uniform from the global RNG,
forked and seeded by `seed`; B = 0, so a freshly injected model computes exactly what the frozen
model computes. Unlike the adapters' exact identity (`AdapterConfig.up_init_std`), B = 0 is harmless
here: the gradient of B is non-zero as soon as A is (dL/dB = (alpha / r) dL/dh (A x)^T), so LoRA
trains from it, and FedAvg of LoRA starts from it.

FedLR here: every client trains its LoRA matrices (and its classifier) on cached frozen-prefix states,
and the server takes FedAvg of the LoRA matrices A and B (each averaged separately, as federated LoRA
usually does; the mean of B A products is not the product of the means) through secure aggregation.
SIMPLIFICATION: FedMCP's Table I lists FedLR among its baselines but gives neither its rank nor its
target modules or alpha; r = 8 on query/value follows LoRA's own choice of W_q and W_v, and LoRA sits
in the same top layers as the other methods' adapters (so the frozen-prefix cache applies). If the
paper's FedLR differs, this is our reading, not theirs.

peft is imported lazily (on first injection): importing this module costs nothing.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from nlp_models.adapters import flatten_parameters, load_parameters_

ADAPTER = "lora"
"""peft's adapter name: LoRA parameters are named ``...query.lora_A.lora.weight``."""


@dataclass(frozen=True)
class LoraSettings:
    """Rank, scale, dropout and target modules of LoRA (FedLR's defaults: r = 8, alpha = 16 on query/value)."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ("query", "value")

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"rank must be >= 1, got {self.rank}")
        if not self.alpha > 0:
            raise ValueError(f"alpha must be positive, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if not self.targets:
            raise ValueError("name at least one target module")


def add_lora(module: nn.Module, settings: LoraSettings = LoraSettings(), *, seed: int) -> nn.Module:
    """Inject LoRA into the target linear layers of `module`, in place; returns `module`.

    Seeded: A comes from a forked global RNG seeded with `seed`, B = 0. The trainability of the
    parameters already in `module` is left as it was (peft would freeze everything but LoRA).
    """
    from peft import LoraConfig, inject_adapter_in_model

    if lora_layers(module):
        raise ValueError("this module already carries LoRA")
    trainable = {parameter: parameter.requires_grad for parameter in module.parameters()}
    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=list(settings.targets), bias="none")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        inject_adapter_in_model(config, module, adapter_name=ADAPTER)
    for parameter, flag in trainable.items():
        parameter.requires_grad_(flag)
    for parameter in lora_parameters(module):
        parameter.requires_grad_(True)
    return module


def lora_layers(model: nn.Module) -> list[nn.Module]:
    """The LoRA-wrapped layers of `model`, in module order (none if peft was never used)."""
    if "peft" not in sys.modules:  # nothing can have been injected
        return []
    from peft.tuners.lora import LoraLayer

    return [module for module in model.modules() if isinstance(module, LoraLayer)]


def lora_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The LoRA matrices in the fixed upload order: layers in module order, then A, then B."""
    layers = lora_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} carries no LoRA layers")
    return [parameter for layer in layers for factor in (layer.lora_A, layer.lora_B)
            for parameter in factor[ADAPTER].parameters()]


def lora_size(model: nn.Module) -> int:
    """Number of LoRA scalars: the length of `flatten_lora(model)`."""
    return sum(parameter.numel() for parameter in lora_parameters(model))


def flatten_lora(model: nn.Module) -> np.ndarray:
    """The LoRA matrices as a new float32 vector: what a FedLR client uploads through secure aggregation."""
    return flatten_parameters(lora_parameters(model))


def load_lora_(model: nn.Module, vector: np.ndarray) -> None:
    """Overwrite the LoRA matrices in place from a flat vector (validated: 1-D, right length, finite)."""
    load_parameters_(lora_parameters(model), vector, what="LoRA")


__all__ = ["ADAPTER", "LoraSettings", "add_lora", "lora_layers", "lora_parameters", "lora_size", "flatten_lora",
           "load_lora_"]
