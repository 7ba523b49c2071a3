import pytest
import torch

from benchmarks import deterministic_cost


def test_times_both_modes_and_ends_with_the_result_line(capsys):
    out = deterministic_cost.main(["--backbone", "tiny", "--device", "cpu", "--steps", "1", "--repeats", "1",
                                   "--warmup", "0", "--batch-size", "2", "--source", "8", "--target", "4"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("deterministic_cost device=cpu backbone=tiny batch=2 step_ms_default=")
    fields = dict(item.split("=") for item in last.split()[1:])
    for kind in ("step", "generate"):
        default, deterministic = (float(fields[f"{kind}_ms_{m}"]) for m in deterministic_cost.MODES)
        assert default > 0 and deterministic > 0
        assert float(fields[f"{kind}_ratio"]) == pytest.approx(deterministic / default, rel=1e-2)
    assert out["step_ratio"] == float(fields["step_ratio"])
    assert not torch.are_deterministic_algorithms_enabled()  # left as it found it


@pytest.mark.parametrize(("bad", "message"), [
    (["--steps", "0"], "--steps must be at least 1"), (["--target", "1"], "--target >= 2"),
    (["--warmup", "-1"], "need --warmup >= 0"),
    pytest.param(["--device", "cuda"], "no CUDA device", marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="a GPU is there"))])
def test_rejects_bad_sizes(bad, message, capsys):
    # no message: argparse exits with status 2; the reason is asserted on stderr below
    with pytest.raises(SystemExit) as exit_info:
        deterministic_cost.main(["--backbone", "tiny", "--device", "cpu", *bad])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
