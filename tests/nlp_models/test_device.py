"""--device resolution and the deterministic-kernels switch."""
import os

import pytest
import torch

from nlp_models.device import deterministic_kernels, device_name, resolve_device


def test_resolve_device_is_explicit_about_a_missing_gpu():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="device must be one of"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            resolve_device("cuda")


def test_device_name_names_the_card(monkeypatch):
    assert device_name("cpu") == device_name(torch.device("cpu")) == "cpu"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert device_name("cuda") == "cuda:NVIDIA H200"


def test_deterministic_kernels_sets_what_cuda_reads(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.benchmark)
    try:
        deterministic_kernels()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.benchmark is False
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
        deterministic_kernels()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"  # a user's own setting is kept
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.benchmark = before[2]
