"""Per-device execution choices (nlp_models.cpu): bf16 autocast follows the tensors' device, and the CPU's
math-kernel choice for training attention is not applied to a GPU."""
import pytest
import torch

from nlp_models import cpu


def test_bf16_autocast_follows_the_device_and_can_be_off():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with cpu.bf16_autocast(True, device="cpu"):
        assert (a @ b).dtype == torch.bfloat16
    with cpu.bf16_autocast(False, device=torch.device("cpu")):
        assert (a @ b).dtype == torch.float32
    with cpu.cpu_autocast(True):
        assert (a @ b).dtype == torch.bfloat16


def test_fast_bf16_on_cuda_needs_a_gpu():
    assert cpu.fast_bf16("cuda") == (torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def test_training_attention_pins_the_math_kernel_on_cpu_only(monkeypatch):
    entered = []

    def spy(backend):
        entered.append(backend)
        return torch.nn.attention.sdpa_kernel(backend)

    monkeypatch.setattr(cpu, "sdpa_kernel", spy)
    with cpu.training_attention("cpu"):
        pass
    with cpu.training_attention("cuda"):
        pass
    with torch.no_grad(), cpu.training_attention("cpu"):
        pass
    assert entered == [torch.nn.attention.SDPBackend.MATH]


def test_avx512_bf16_alone_no_longer_means_bf16_on_a_cpu_but_amx_does(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert not cpu.fast_bf16("cpu") and cpu.legacy_fast_bf16("cpu")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert cpu.fast_bf16("cpu") and cpu.legacy_fast_bf16("cpu")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert not cpu.fast_bf16("cpu") and not cpu.legacy_fast_bf16("cpu")


def test_thread_counts_are_capped_by_the_environment(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv(cpu.MAX_THREADS_ENV, raising=False)
        assert cpu.set_torch_threads(2) == 2 == torch.get_num_threads()
        monkeypatch.setenv(cpu.MAX_THREADS_ENV, "1")
        assert cpu.set_torch_threads(2) == 1 == torch.get_num_threads()
        monkeypatch.setenv(cpu.MAX_THREADS_ENV, "x")
        with pytest.raises(ValueError, match="FEDSECURE_MAX_THREADS"):
            cpu.set_torch_threads(2)
    finally:
        torch.set_num_threads(before)
