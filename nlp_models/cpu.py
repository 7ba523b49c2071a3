"""CPU execution choices for small encoders: bfloat16 autocast where the CPU has it natively, and the
SDPA kernel to use when gradients flow.

Both are measured choices for a 2-core CPU budget, kept in one place so that every model (and the
frozen-prefix cache) makes the same one.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel


def fast_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AMX or AVX512-BF16); elsewhere bf16 is slower."""
    try:
        return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())
    except AttributeError:  # pragma: no cover - older torch
        return False


def cpu_autocast(enabled: bool) -> AbstractContextManager:
    """bfloat16 autocast for an encoder's matmuls; parameters, heads and losses stay float32."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


@contextmanager
def training_attention() -> Iterator[None]:
    """With gradients, use SDPA's math kernel: on CPU the fused kernel's backward measured about twice
    as slow for short sequences. Inference keeps the default kernel."""
    if not torch.is_grad_enabled():
        yield
        return
    with sdpa_kernel(SDPBackend.MATH):
        yield


__all__ = ["fast_bf16", "cpu_autocast", "training_attention"]
