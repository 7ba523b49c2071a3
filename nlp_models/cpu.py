"""Execution choices for small encoders, per device: bfloat16 autocast where the device multiplies
bfloat16 natively, and the SDPA kernel to use when gradients flow.

They are measured choices for a 2-core CPU budget (and the GPU's defaults elsewhere), kept in one
place so that every model (and the frozen-prefix cache) makes the same one.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel


def fast_bf16(device: torch.device | str = "cpu") -> bool:
    """Whether `device` multiplies bfloat16 natively: on a CPU, AMX or AVX512-BF16 (elsewhere bf16 is
    slower than float32); on CUDA, a GPU with bf16 support (Ampere and later)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    try:
        return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())
    except AttributeError:  # pragma: no cover - older torch
        return False


def bf16_autocast(enabled: bool, *, device: torch.device | str = "cpu") -> AbstractContextManager:
    """bfloat16 autocast for an encoder's matmuls on `device`; parameters, heads and losses stay float32."""
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=enabled)


def cpu_autocast(enabled: bool) -> AbstractContextManager:
    """`bf16_autocast` on the CPU."""
    return bf16_autocast(enabled, device="cpu")


@contextmanager
def training_attention(device: torch.device | str = "cpu") -> Iterator[None]:
    """With gradients on a CPU, use SDPA's math kernel: there the fused kernel's backward measured about
    twice as slow for short sequences. Inference, and every GPU pass, keeps the default kernel."""
    if not torch.is_grad_enabled() or torch.device(device).type != "cpu":
        yield
        return
    with sdpa_kernel(SDPBackend.MATH):
        yield


__all__ = ["fast_bf16", "bf16_autocast", "cpu_autocast", "training_attention"]
