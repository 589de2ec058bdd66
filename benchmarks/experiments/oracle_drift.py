"""Why the medium preset's steered drafts accepted ~nothing on an H200 (bench_aims, 2026-11-28 06:54).

There every steered draft of the medium preset had mean accept 1.00 at bs 1 and 1.23 at bs 8,
where the H100s give 2.25 / 2.45; the small preset was as on the H100s. The steering oracle is a
target-only greedy pre-run of all 8 prompts in one eager batch; a draft is steered only while the
run's tokens stay on it. Three questions, on the medium preset in bfloat16:

1. Which runs leave the pre-run, and where? Per request, the first position at which each run's
   greedy tokens differ from the pre-run's: target-only captured at bs 1 and 8, EAGLE S3 k1
   captured at bs 1 and 8 steered by the pre-run (with its mean accept).
2. Does steering each run by its own tokens (bench_device_cycle.run_on_path) find a fixed point:
   a run that emits exactly its oracle, and with what accept?
3. Which matmul rounds with its row count? Each distinct weight times 64 random rows at once
   against its first M rows alone, M = 1, 4, 8, 32 (a bs-1 decode, a bs-1 k1 verify, a bs-8
   decode, a bs-8 k1 verify).

    PYTHONPATH=. python3 benchmarks/experiments/oracle_drift.py [--out DIR]

Writes results/oracle_drift-<device>.md (or under --out).
"""

from __future__ import annotations

import argparse
import os
import sys
import types
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from _common import DEFAULT_OUT, header, require_cuda, table, write_results  # noqa: E402  (puts the root on sys.path)

import specverify  # noqa: E402
from batch_variance import first_difference, weight_rows  # noqa: E402
from bench_device_cycle import make_prompts, pre_run_oracle, run_on_path, run_spec, run_target  # noqa: E402
from specverify.engine.spec_config import SpecConfig  # noqa: E402
from tests.support.steering import steered_models  # noqa: E402

REQUESTS = 8
ROW_COUNTS = (1, 4, 8, 32)


def positions(tokens, oracle, prompts) -> str:
    """Each request's first position (counted from its first new token) leaving the oracle; `=` none."""
    firsts = [first_difference(list(t), oracle[r, len(p):len(p) + len(t)].tolist())
              for r, (t, p) in enumerate(zip(tokens, prompts))]
    return " ".join("=" if f is None else str(f) for f in firsts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="directory for the results file (default benchmarks/results)")
    ap.add_argument("--preset", default="medium")
    args = ap.parse_args(argv)
    require_cuda("oracle_drift")
    decode = types.SimpleNamespace(max_new_tokens=64, warmup=2, sync_steps=0, seed=0, agreement=0.7)
    models = specverify.build_models(args.preset, seed=0, compute_dtype="bfloat16", logits_dtype="bfloat16",
                                     device="cuda")
    prompts = make_prompts(REQUESTS, models.config.vocab_size, 0)
    spec = SpecConfig(num_steps=3, topk=1)
    oracle, _ = pre_run_oracle(models, prompts, [spec], decode, "cuda")
    steered = steered_models(models, prompts, decode.max_new_tokens, agreement=decode.agreement, spec=spec,
                             oracle=oracle)
    runs = []
    for bs in (1, 8):
        t = run_target(models, prompts[:bs], decode, "cuda")
        runs.append([f"target-only bs {bs}", "-", positions(t["tokens"], oracle, prompts), "-"])
        r = run_spec(steered, prompts[:bs], spec, True, decode, "cuda")
        runs.append([f"EAGLE S3 k1 bs {bs}, the pre-run's oracle", "1", positions(r["tokens"], oracle, prompts),
                     f"{r['mean_accept']:.2f}"])
        r, own = run_on_path(models, oracle, prompts[:bs], spec, decode, "cuda")
        runs.append([f"EAGLE S3 k1 bs {bs}, run_on_path", f"{r['oracle_runs']}"
                     + ("" if r["on_oracle"] else ", off its oracle"),
                     positions(r["tokens"], oracle, prompts), f"{r['mean_accept']:.2f}"])
    gemms = weight_rows(models.target, args.preset, ROW_COUNTS)
    lines = header(f"Steering oracle drift: the {args.preset} preset's greedy tokens by batch", False, {
        "Setting": f"the `{args.preset}` preset, seed 0, bfloat16 compute and logits, the prompts of bench_aims.py "
                   f"(8), greedy, 64 new tokens, no EOS, captured, `pad_batches=True`; the oracle: the target-only "
                   f"pre-run of all 8 prompts in one eager batch (tests/support/steering.py)",
    })
    lines += ["## First position leaving the pre-run (requests 0-7 of the run; `=` none)", ""]
    lines += table(["run", "runs made", "first differing position per request", "mean accept"], runs)
    lines += ["", "## x @ w: the first M rows alone against all 64 rows at once (bfloat16)", ""]
    lines += table(["model", "weight", "shape"] + [f"M {m}" for m in ROW_COUNTS], gemms)
    write_results(lines, Path(args.out) if args.out else DEFAULT_OUT, f"oracle_drift-{args.preset}", False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
