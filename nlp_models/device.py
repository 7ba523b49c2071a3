"""Which torch device a run uses: `--device auto|cpu|cuda`, resolved once with a clear error.

torch is imported inside the functions: the examples' parsers read DEVICES, and `--help` must answer
before torch loads."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str) -> torch.device:
    """`auto` picks CUDA when a GPU is visible, else the CPU; `cuda` without a GPU is an error, not a
    silent fallback (a run that was meant for the GPU should not quietly take hours on a CPU)."""
    import torch

    if name not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {name!r}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no CUDA device here (use --device cpu or auto)")
    return torch.device(name)


def device_name(device: torch.device | str) -> str:
    """What ran a result, for its record: 'cpu', or 'cuda:' and the card's name (results from
    different devices agree only up to floating-point order, so tables say which ran what)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return device.type


def deterministic_kernels() -> None:
    """Ask for bit-reproducible kernels: deterministic algorithms where torch has them (a warning names
    any op that has none), cuBLAS's fixed workspace, no cuDNN autotuning. On a GPU, reductions otherwise
    differ from run to run, so two runs of one seed (or a secure run and its plaintext twin) drift
    apart; on the CPU this changes nothing measurable. Call it before the first CUDA operation."""
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False


__all__ = ["DEVICES", "deterministic_kernels", "device_name", "resolve_device"]
