"""What do deterministic kernels cost the headline generator on a GPU?

    python -m benchmarks.deterministic_cost --device cuda            # MiniLM (the grid's model)
    python -m benchmarks.deterministic_cost --backbone tiny --steps 3  # seconds, any machine

The grid examples ask for deterministic kernels on a GPU (`nlp_models.device.deterministic_kernels`)
so that a secure run and its plaintext twin train bit for bit alike. The headline generator's round
on an H200 took 12.5-13.3 s with them (six runs sharing the card) against 3.9 s on an H100 without
them (eight runs sharing): card, load and kernels all differed, so that says nothing about the
kernels alone. This benchmark times the generator alone, in one process, with torch's deterministic
algorithms off and on in alternation (`--repeats` pairs, so drift of the machine hits both alike): a
training step (teacher-forced loss, backward, AdamW over the decoder) and a greedy decoding of one
batch, the two things a round does. cuBLAS's fixed workspace (`CUBLAS_WORKSPACE_CONFIG`) is set for
both modes, since it must be set before cuBLAS starts; only `torch.use_deterministic_algorithms` is
toggled. Inputs are random token ids (the timing does not depend on the text).

With `--profile` it also prints the CUDA (or CPU) operators that take the most time in each mode.

Ends with one line:

    deterministic_cost device=.. backbone=.. batch=.. step_ms_default=.. step_ms_deterministic=.. step_ratio=.. generate_ms_default=.. generate_ms_deterministic=.. generate_ratio=..
"""
from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from nlp_models.backbone import load_named_backbone
from nlp_models.cpu import set_torch_threads
from nlp_models.device import DEVICES, resolve_device
from nlp_models.seq2seq import IGNORE_INDEX, Seq2SeqConfig, Seq2SeqModel, build_seq2seq

MODES = ("default", "deterministic")


@dataclass(frozen=True)
class Inputs:
    """One batch as the trainer sees it: frozen encoder states, their mask and ids, and the targets."""

    source: torch.Tensor
    source_mask: torch.Tensor
    source_ids: torch.Tensor
    target: torch.Tensor


def random_inputs(model: Seq2SeqModel, *, batch: int, source: int, target: int, seed: int,
                  device: str) -> Inputs:
    """Random ids in the vocabulary's word range (ids 1000 and up: no special tokens), each body of
    full length, each target of random length with IGNORE_INDEX padding; states from the frozen encoder."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.decoder.config.vocab_size
    ids = torch.randint(1000, vocab, (batch, source), generator=g)
    mask = torch.ones_like(ids)
    lengths = torch.randint(2, target + 1, (batch,), generator=g)
    tgt = torch.randint(1000, vocab, (batch, target), generator=g)
    tgt[torch.arange(target)[None, :] >= lengths[:, None]] = IGNORE_INDEX
    ids, mask, tgt = ids.to(device), mask.to(device), tgt.to(device)
    with torch.inference_mode():
        states = model.encode(ids, mask)
    return Inputs(source=states.clone(), source_mask=mask, source_ids=ids, target=tgt)


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], *, repeats: int, device: str) -> float:
    """Mean milliseconds of `fn` over `repeats` calls (the device synchronised around them)."""
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    synchronize(device)
    return (time.perf_counter() - t0) / repeats * 1e3


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=DEVICES, default="auto")
    parser.add_argument("--backbone", choices=("minilm", "tiny"), default="minilm")
    parser.add_argument("--batch-size", type=int, default=16, help="the grid's batch (default 16)")
    parser.add_argument("--source", type=int, default=64, help="body tokens (the grid's 64)")
    parser.add_argument("--target", type=int, default=16, help="headline tokens (the grid's 16)")
    parser.add_argument("--steps", type=int, default=20, help="timed training steps per mode and repeat")
    parser.add_argument("--repeats", type=int, default=3, help="alternations of the two modes")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per mode first")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="print the top operators of each mode")
    args = parser.parse_args(argv)
    for name in ("batch_size", "steps", "repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0 or args.source < 8 or args.target < 2:
        parser.error("need --warmup >= 0, --source >= 8 and --target >= 2")
    try:
        args.device = str(resolve_device(args.device))
    except ValueError as error:  # --device cuda where torch sees no GPU
        parser.error(str(error))
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts, for both modes
    set_torch_threads(args.threads)
    device = args.device
    torch.backends.cudnn.benchmark = False
    backbone, tokenizer = load_named_backbone(args.backbone)
    torch.manual_seed(0)
    model = build_seq2seq(backbone, config=Seq2SeqConfig(max_source=args.source, max_target=args.target),
                          tokenizer=tokenizer).to(device)
    inputs = random_inputs(model, batch=args.batch_size, source=args.source, target=args.target, seed=0, device=device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-4)
    model.train()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        model.loss(inputs.source, inputs.source_mask, inputs.target, source_ids=inputs.source_ids).backward()
        optimizer.step()

    def generate() -> None:
        model.generate(inputs.source, inputs.source_mask, source_ids=inputs.source_ids)

    times: dict[str, dict[str, list[float]]] = {m: {"step": [], "generate": []} for m in MODES}
    try:
        for mode in MODES:  # warm both paths (kernels, allocator) before any timing
            torch.use_deterministic_algorithms(mode == "deterministic", warn_only=True)
            for _ in range(args.warmup):
                step()
            generate()
        for _ in range(args.repeats):
            for mode in MODES:
                torch.use_deterministic_algorithms(mode == "deterministic", warn_only=True)
                times[mode]["step"].append(timed(step, repeats=args.steps, device=device))
                times[mode]["generate"].append(timed(generate, repeats=1, device=device))
        if args.profile:
            for mode in MODES:
                torch.use_deterministic_algorithms(mode == "deterministic", warn_only=True)
                print(f"\n== {mode}: top operators of {args.steps} training steps")
                print(profile_table(step, steps=args.steps, device=device))
    finally:
        torch.use_deterministic_algorithms(False)
    means = {m: {k: float(np.mean(v)) for k, v in t.items()} for m, t in times.items()}
    print(f"\n{device} ({torch.cuda.get_device_name() if device.startswith('cuda') else 'cpu'}), "
          f"backbone {args.backbone}, batch {args.batch_size} x {args.source} -> {args.target} tokens, "
          f"{sum(p.numel() for p in model.parameters() if p.requires_grad):,} trainable parameters")
    for kind in ("step", "generate"):
        print(f"{kind:>9}: " + ", ".join(f"{m} {np.round(times[m][kind], 2).tolist()} ms" for m in MODES))
    summary: dict[str, Any] = {"device": device, "backbone": args.backbone, "batch": args.batch_size}
    for kind in ("step", "generate"):
        summary.update({f"{kind}_ms_{m}": round(means[m][kind], 3) for m in MODES})
        summary[f"{kind}_ratio"] = round(means["deterministic"][kind] / means["default"][kind], 3)
    print("deterministic_cost " + " ".join(f"{k}={v}" for k, v in summary.items()), flush=True)
    return summary


def profile_table(fn: Callable[[], Any], *, steps: int, device: str, rows: int = 12) -> str:
    """torch.profiler's table of the operators that took the most device (or CPU) time in `steps` calls."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            fn()
        synchronize(device)
    key = "cuda_time_total" if device.startswith("cuda") else "cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows)


if __name__ == "__main__":
    main()
