"""Houlsby bottleneck adapters in named sets ('global', 'private', 'local', ...) for BERT-family encoders.

One adapter (Houlsby et al., 2019; FedMCP Eq. 2):  A(h) = GeLU(h W_down + b_down) W_up + b_up.
Each encoder layer has two insertion sites, after the attention-output dense+dropout and after the
FFN-output dense+dropout, before the residual LayerNorm. A site holds one adapter per named set and
computes (FedMCP Eq. 3 is the case w_g = w_p = 1/2)

    h  <-  h + sum_s w_s A_s(h)

with the mixing weights w_s chosen per forward pass: ``with active(model, {'global': 1.0}): ...``.
Sets with weight 0 are not evaluated, so they get no gradient in that pass.

Implementation note: a site replaces the ``dropout`` submodule of ``BertSelfOutput``/``BertOutput``
(RoBERTa/ELECTRA have the same layout) by ``AdapterSite(dropout)``, which applies the original dropout
and then the adapters. No Hugging Face code is patched, backbone parameter names are unchanged, and
adapter parameters are named ``...output.dropout.adapters.<set>.{down,up}.{weight,bias}``.
Every adapter is plain ``nn.Linear`` + activation modules with no parameter shared across sets, which
is what Opacus' hooks mode needs. Calling one set twice per step (FedMCP's two passes) is fine for
Opacus: it accumulates the per-sample gradients of both calls.

For Opacus, every parameter with ``requires_grad`` must be used in each step: freeze the sets a step
does not use with ``set_trainable_sets``.
"""
from __future__ import annotations

import math
import re
import zlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU, "tanh": nn.Tanh, "swish": nn.SiLU}
_SET_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class AdapterConfig:
    """One adapter set's shape and initialisation.

    ``up_init_std=0`` (default) makes the adapter an exact identity at initialisation; Houlsby used a
    small non-zero std (1e-2), which is also allowed. The down-projection uses BERT's 0.02.
    """

    bottleneck: int = 16
    activation: str = "gelu"
    down_init_std: float = 0.02
    up_init_std: float = 0.0

    def __post_init__(self) -> None:
        if self.bottleneck < 1:
            raise ValueError(f"bottleneck must be >= 1, got {self.bottleneck}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}")
        if self.down_init_std < 0 or self.up_init_std < 0:
            raise ValueError("initialisation standard deviations must be >= 0")


class BottleneckAdapter(nn.Module):
    """A(h) = act(h W_down + b_down) W_up + b_up; the residual is added by the site."""

    def __init__(self, hidden: int, config: AdapterConfig, *, generator: torch.Generator | None = None):
        super().__init__()
        self.down = nn.Linear(hidden, config.bottleneck)
        self.act = ACTIVATIONS[config.activation]()
        self.up = nn.Linear(config.bottleneck, hidden)
        with torch.no_grad():
            nn.init.normal_(self.down.weight, std=config.down_init_std, generator=generator)
            nn.init.zeros_(self.down.bias)
            nn.init.normal_(self.up.weight, std=config.up_init_std, generator=generator)
            nn.init.zeros_(self.up.bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.up(self.act(self.down(hidden_states)))


class AdapterSite(nn.Module):
    """Replaces an output block's dropout: h -> dropout(h), then h + sum_s w_s A_s(h)."""

    def __init__(self, dropout: nn.Module):
        super().__init__()
        self.dropout = dropout
        self.adapters = nn.ModuleDict()
        self.mixing: tuple[tuple[str, float], ...] = ()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.dropout(hidden_states)
        mixed = hidden_states
        for name, weight in self.mixing:
            mixed = mixed + weight * self.adapters[name](hidden_states)
        return mixed


# ---------------------------------------------------------------- attaching adapter sets

def _encoder_layers(backbone: nn.Module) -> nn.ModuleList:
    for candidate in (backbone, getattr(backbone, "base_model", None)):
        encoder = getattr(candidate, "encoder", None)
        if encoder is not None and isinstance(getattr(encoder, "layer", None), nn.ModuleList):
            return encoder.layer
    raise TypeError(f"{type(backbone).__name__} is not a BERT-family encoder (no encoder.layer list)")


def _output_blocks(backbone: nn.Module, layers: Sequence[int] | None = None) -> list[nn.Module]:
    """The attention-output and FFN-output blocks of the chosen layers (default all), in layer order."""
    blocks = []
    all_layers = _encoder_layers(backbone)
    chosen = set(range(len(all_layers))) if layers is None else set(layers)
    if not chosen <= set(range(len(all_layers))):
        raise ValueError(f"layers {sorted(chosen)} outside 0..{len(all_layers) - 1}")
    for index, layer in enumerate(all_layers):
        if index not in chosen:
            continue
        for block in (layer.attention.output, layer.output):
            if not all(hasattr(block, part) for part in ("dense", "dropout", "LayerNorm")):
                raise TypeError(f"layer {index}: {type(block).__name__} lacks dense/dropout/LayerNorm")
            blocks.append(block)
    return blocks


def adapter_sites(model: nn.Module) -> list[AdapterSite]:
    """All insertion sites in ``model`` (or any module wrapping it), in a fixed module order."""
    return [module for module in model.modules() if isinstance(module, AdapterSite)]


def _set_seed(seed: int, name: str) -> int:
    # Independent of the order in which sets are added, so clients that add sets differently agree.
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


def add_adapter_set(
    backbone: nn.Module, name: str, config: AdapterConfig | int = AdapterConfig(), *, seed: int | None = None,
    layers: Sequence[int] | None = None,
) -> nn.Module:
    """Add one named adapter set at every site of ``backbone`` (creating the sites on first use).

    ``config`` may be a bare bottleneck size. ``layers`` restricts the sets to some encoder layers
    (default: all), which lets a frozen prefix of the backbone be computed once and cached
    (``nlp_models.frozen_prefix``). Mixing weights are reset to the mean of all sets.
    """
    if not _SET_NAME.match(name):
        raise ValueError(f"adapter set name must be an identifier, got {name!r}")
    if isinstance(config, int):
        config = AdapterConfig(bottleneck=config)
    hidden = backbone.config.hidden_size
    generator = None
    if seed is not None:
        generator = torch.Generator().manual_seed(_set_seed(seed, name))
    for block in _output_blocks(backbone, layers):
        if not isinstance(block.dropout, AdapterSite):
            block.dropout = AdapterSite(block.dropout)
        site = block.dropout
        if name in site.adapters:
            raise ValueError(f"adapter set {name!r} already exists")
        reference = next(block.dense.parameters())
        adapter = BottleneckAdapter(hidden, config, generator=generator)
        site.adapters[name] = adapter.to(device=reference.device, dtype=reference.dtype)
    names = adapter_set_names(backbone)
    set_mixing(backbone, {set_name: 1.0 / len(names) for set_name in names})
    return backbone


def attach_adapters(
    backbone: nn.Module, sets: Mapping[str, AdapterConfig | int], *, seed: int | None = None,
    layers: Sequence[int] | None = None,
) -> nn.Module:
    """Add several named sets, e.g. ``attach_adapters(bert, {'global': 16, 'private': 16}, seed=0)``."""
    for name, config in sets.items():
        add_adapter_set(backbone, name, config, seed=seed, layers=layers)
    return backbone


def adapter_set_names(model: nn.Module) -> tuple[str, ...]:
    """Names of the adapter sets, in the order they were added."""
    sites = adapter_sites(model)
    return tuple(sites[0].adapters.keys()) if sites else ()


# ---------------------------------------------------------------- mixing weights

def set_mixing(model: nn.Module, weights: Mapping[str, float]) -> None:
    """Use h + sum_s weights[s] A_s(h) at every site from now on; unnamed sets get weight 0."""
    known = adapter_set_names(model)
    unknown = set(weights) - set(known)
    if unknown:
        raise KeyError(f"unknown adapter sets {sorted(unknown)}; known: {list(known)}")
    for name, weight in weights.items():
        if not math.isfinite(weight):
            raise ValueError(f"mixing weight for {name!r} must be finite, got {weight}")
    mixing = tuple((name, float(weights[name])) for name in known if name in weights and weights[name] != 0.0)
    for site in adapter_sites(model):
        site.mixing = mixing


def get_mixing(model: nn.Module) -> dict[str, float]:
    """Current mixing weights (sets with weight 0 omitted)."""
    sites = adapter_sites(model)
    return dict(sites[0].mixing) if sites else {}


@contextmanager
def active(model: nn.Module, weights: Mapping[str, float]) -> Iterator[None]:
    """Temporarily use the given mixing weights, e.g. ``with active(model, {'global': 1.0}):``."""
    previous = get_mixing(model)
    set_mixing(model, weights)
    try:
        yield
    finally:
        set_mixing(model, previous)


# ---------------------------------------------------------------- trainability

def _adapter_parameter_ids(model: nn.Module, names: tuple[str, ...] | None = None) -> set[int]:
    ids = set()
    for site in adapter_sites(model):
        for name, adapter in site.adapters.items():
            if names is None or name in names:
                ids.update(id(parameter) for parameter in adapter.parameters())
    return ids


def freeze_backbone(model: nn.Module) -> None:
    """Freeze every parameter of ``model`` except adapter parameters (which become trainable).

    Call it on the backbone (``TextClassifier.freeze_backbone`` does) to leave heads trainable.
    """
    adapter_ids = _adapter_parameter_ids(model)
    for parameter in model.parameters():
        parameter.requires_grad_(id(parameter) in adapter_ids)


def set_trainable_sets(model: nn.Module, names: tuple[str, ...] | list[str]) -> None:
    """Make exactly the named adapter sets trainable; other sets are frozen, non-adapter params untouched."""
    unknown = set(names) - set(adapter_set_names(model))
    if unknown:
        raise KeyError(f"unknown adapter sets {sorted(unknown)}")
    for site in adapter_sites(model):
        for name, adapter in site.adapters.items():
            adapter.requires_grad_(name in names)


def trainable_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) pairs with requires_grad, in module order."""
    return [(name, parameter) for name, parameter in model.named_parameters() if parameter.requires_grad]


def count_trainable(model: nn.Module) -> int:
    """Number of trainable scalars."""
    return sum(parameter.numel() for _, parameter in trainable_parameters(model))


# ---------------------------------------------------------------- one set as a flat vector

def set_parameters(model: nn.Module, name: str) -> list[nn.Parameter]:
    """One set's parameters in the fixed upload order: sites in layer order, then down.w, down.b, up.w, up.b."""
    sites = adapter_sites(model)
    if not sites or name not in sites[0].adapters:
        raise KeyError(f"no adapter set {name!r}; known: {list(adapter_set_names(model))}")
    return [parameter for site in sites for parameter in site.adapters[name].parameters()]


def set_size(model: nn.Module, name: str) -> int:
    """Length of ``flatten_set(model, name)``."""
    return sum(parameter.numel() for parameter in set_parameters(model, name))


def flatten_parameters(parameters: Sequence[torch.Tensor]) -> np.ndarray:
    """Parameters as one new float32 vector, in the given order."""
    if not parameters:
        return np.zeros(0, dtype=np.float32)
    with torch.no_grad():
        flat = torch.cat([parameter.detach().reshape(-1).float().cpu() for parameter in parameters])
    return flat.numpy().copy()


def load_parameters_(parameters: Sequence[torch.Tensor], vector: np.ndarray, *, what: str) -> None:
    """Overwrite `parameters` in place from one flat vector (validated: 1-D, right length, finite)."""
    values = np.asarray(vector)
    expected = sum(parameter.numel() for parameter in parameters)
    if values.ndim != 1 or values.shape[0] != expected:
        raise ValueError(f"{what} needs a 1-D vector of length {expected}, got shape {values.shape}")
    if not np.issubdtype(values.dtype, np.floating) or not np.all(np.isfinite(values)):
        raise ValueError(f"{what}: the vector must be finite floating point")
    source = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
    offset = 0
    with torch.no_grad():
        for parameter in parameters:
            size = parameter.numel()
            parameter.copy_(source[offset : offset + size].view_as(parameter))
            offset += size


def flatten_set(model: nn.Module, name: str) -> np.ndarray:
    """One set's parameters as a new float32 vector: what a client uploads through secure aggregation."""
    return flatten_parameters(set_parameters(model, name))


def load_set_(model: nn.Module, name: str, vector: np.ndarray) -> None:
    """Overwrite one set's parameters in place from a flat vector (validated: 1-D, right length, finite)."""
    load_parameters_(set_parameters(model, name), vector, what=f"set {name!r}")


class AdapterControl:
    """The adapter functions bound to one model: ``clf.adapters.active({'global': 1.0})``."""

    def __init__(self, model: nn.Module):
        self._model = model

    @property
    def names(self) -> tuple[str, ...]:
        return adapter_set_names(self._model)

    @property
    def mixing(self) -> dict[str, float]:
        return get_mixing(self._model)

    def active(self, weights: Mapping[str, float]):
        return active(self._model, weights)

    def set_mixing(self, weights: Mapping[str, float]) -> None:
        set_mixing(self._model, weights)

    def set_trainable(self, names: tuple[str, ...] | list[str]) -> None:
        set_trainable_sets(self._model, names)

    def flatten(self, name: str) -> np.ndarray:
        return flatten_set(self._model, name)

    def load_(self, name: str, vector: np.ndarray) -> None:
        load_set_(self._model, name, vector)

    def size(self, name: str) -> int:
        return set_size(self._model, name)
