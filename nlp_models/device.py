"""Which torch device a run uses: `--device auto|cpu|cuda`, resolved once with a clear error."""
from __future__ import annotations

import torch

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str) -> torch.device:
    """`auto` picks CUDA when a GPU is visible, else the CPU; `cuda` without a GPU is an error, not a
    silent fallback (a run that was meant for the GPU should not quietly take hours on a CPU)."""
    if name not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {name!r}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no CUDA device here (use --device cpu or auto)")
    return torch.device(name)


__all__ = ["DEVICES", "resolve_device"]
