"""Why `bench_hybrid.py` at bs 8 reports target-only tokens that differ from every speculative run's.

The hybrid bfloat16 run of 2026-11-23 (H100) found 2 of 8 requests at bs 8 with the target-only
tokens, for every EAGLE-style algorithm, while bs 64 agreed 64 of 64. Two questions:

1. Which decoder moves? Per request (the first 8 prompts), the first position at which each run's
   greedy tokens leave target-only decoding at bs 64: target-only and speculative (EAGLE S3 k1,
   captured and eager) at bs 8 and 64; hybrid bfloat16, hybrid float32, and the plain (attention
   only) bfloat16 model as the control.
2. Which op rounds differently with the batch? Each distinct weight of the bfloat16 targets
   multiplied by the same 64 random rows, all of them at once against the first bs alone
   (bs 1, 8, 32, the M of a target-only decode step at those batches): bit-equal or how many
   elements differ. cuBLAS may choose another kernel (another reduction order) for another M.

    PYTHONPATH=. python3 benchmarks/experiments/batch_variance.py [--out DIR]

Writes results/batch_variance-<device>.md (or under --out).
"""

from __future__ import annotations

import argparse
import os
import sys
import types
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from _common import DEFAULT_OUT, header, require_cuda, table, write_results  # noqa: E402  (puts the root on sys.path)

import torch  # noqa: E402

import specverify  # noqa: E402
from bench_device_cycle import make_prompts, run_spec, run_target, steered_for  # noqa: E402
from specverify.engine.spec_config import SpecConfig  # noqa: E402

REQUESTS = 8
GEMM_BATCHES = (1, 8, 32)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (None when equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def token_study(hybrid: bool, dtype: str, args) -> list[list[object]]:
    models = specverify.build_models("small", seed=0, hybrid=hybrid, compute_dtype=dtype, logits_dtype=dtype,
                                     device="cuda")
    prompts = make_prompts(64, models.config.vocab_size, 0)
    spec = SpecConfig(num_steps=3, topk=1)
    steered, _ = steered_for(models, prompts, [spec], args, "cuda")
    runs = {}
    for bs in (8, 64):
        runs[f"target-only bs {bs}"] = run_target(models, prompts[:bs], args, "cuda")
        runs[f"EAGLE S3 k1 captured bs {bs}"] = run_spec(steered, prompts[:bs], spec, True, args, "cuda")
        runs[f"EAGLE S3 k1 eager bs {bs}"] = run_spec(steered, prompts[:bs], spec, False, args, "cuda")
    baseline = runs["target-only bs 64"]["tokens"]
    model = f"{'hybrid' if hybrid else 'plain'} {dtype}"
    rows = []
    for name, res in runs.items():
        if "error" in res:
            rows.append([model, name, res["error"], "-"])
            continue
        firsts = [first_difference(a, b) for a, b in zip(res["tokens"][:REQUESTS], baseline[:REQUESTS])]
        rows.append([model, name, " ".join("=" if f is None else str(f) for f in firsts),
                     f"{sum(f is None for f in firsts)}/{REQUESTS}"])
    return rows


def weight_rows(target, model: str, batches=GEMM_BATCHES) -> list[list[object]]:
    """Each distinct weight of `target` times 64 random rows at once against its first bs rows
    alone, for bs in `batches`: [model, weight, shape, "bit-equal" or how many differ, ...]."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows, seen = [], set()
    for name, w in target.w.items():
        kind = name.split(".")[-1]
        if w.dim() != 2 or kind in ("embed", "conv") or (kind, tuple(w.shape)) in seen:
            continue   # the embedding is a lookup, the conv taps an elementwise product
        seen.add((kind, tuple(w.shape)))
        x = torch.randn(64, 1, w.shape[0], device="cuda", dtype=w.dtype, generator=gen)
        whole = x @ w
        cells = []
        for bs in batches:
            diff = int((x[:bs] @ w != whole[:bs]).sum())
            cells.append("bit-equal" if diff == 0 else f"**{diff} differ**")
        rows.append([model, name, f"{w.shape[0]} x {w.shape[1]}"] + cells)
    return rows


def gemm_study() -> list[list[object]]:
    rows = []
    for hybrid in (True, False):
        target = specverify.build_models("small", seed=0, hybrid=hybrid, compute_dtype="bfloat16",
                                         logits_dtype="bfloat16", device="cuda").target
        rows += weight_rows(target, "hybrid" if hybrid else "plain")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="directory for the results file (default benchmarks/results)")
    args = ap.parse_args(argv)
    require_cuda("batch_variance")
    decode = types.SimpleNamespace(max_new_tokens=64, warmup=2, sync_steps=0, seed=0, agreement=0.7)
    tokens = []
    for hybrid, dtype in ((True, "bfloat16"), (True, "float32"), (False, "bfloat16")):
        tokens += token_study(hybrid, dtype, decode)
    lines = header("Batch variance: which decoder moves at bs 8, and which GEMM", False, {
        "Setting": "the `small` preset, seed 0, the prompts of bench_hybrid.py, greedy, 64 new tokens, no EOS, "
                   "`pad_batches=True`, the draft steered to agreement 0.7",
    })
    lines += ["## First position leaving target-only bs 64 (requests 0-7; `=` none)", ""]
    lines += table(["model", "run", "first differing position per request", "equal"], tokens)
    lines += ["", "## x @ w: the first bs rows alone against all 64 rows at once (bfloat16)", ""]
    lines += table(["model", "weight", "shape"] + [f"bs {bs}" for bs in GEMM_BATCHES], gemm_study())
    write_results(lines, Path(args.out) if args.out else DEFAULT_OUT, "batch_variance", False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
