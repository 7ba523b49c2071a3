"""Execution choices for small encoders, per device: bfloat16 autocast where it is faster than float32,
and the SDPA kernel to use when gradients flow.

They are measured choices for a 2-core CPU budget (and the GPU's defaults elsewhere), kept in one
place so that every model (and the frozen-prefix cache) makes the same one.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from secagg.threads import MAX_THREADS_ENV, thread_cap


def fast_bf16(device: torch.device | str = "cpu") -> bool:
    """Whether bfloat16 autocast is faster than float32 on `device`: on a CPU, only with AMX tiles; on CUDA,
    a GPU with bf16 support (Ampere and later).

    AVX512-BF16 alone does not count: on this project's 2-core Xeon (AVX512-BF16, no AMX) two MiniLM
    layers took 88 ms for a training step of 16 x 40 tokens under bf16 autocast against 57 ms in float32,
    and inference was 1.4x slower too (2026-11-29). Runs saved while this rule also counted AVX512-BF16
    resume with the precision they recorded (`legacy_fast_bf16`)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    try:
        return bool(torch.cpu._is_amx_tile_supported())
    except AttributeError:  # pragma: no cover - older torch
        return False


def legacy_fast_bf16(device: torch.device | str = "cpu") -> bool:
    """What `fast_bf16` said before 2026-11-29 (a CPU with AMX *or* AVX512-BF16): how a run saved then,
    with precision 'auto' and no recorded protocol, ran."""
    if torch.device(device).type != "cpu":
        return fast_bf16(device)
    try:
        return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())
    except AttributeError:  # pragma: no cover - older torch
        return False


def set_torch_threads(threads: int) -> int:
    """torch's intra-op threads: `threads`, capped by $FEDSECURE_MAX_THREADS when set (`secagg.threads`, the
    one cap: an ATC example test asking for two threads beside another busy pytest worker took 190 s instead
    of 34 s, spinning in OpenMP's barriers). Returns the count set."""
    threads = thread_cap(threads)
    torch.set_num_threads(threads)
    return threads


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


__all__ = ["MAX_THREADS_ENV", "set_torch_threads", "fast_bf16", "legacy_fast_bf16", "bf16_autocast", "cpu_autocast", "training_attention"]
