"""The old capture failure on demand: a garbage collection inside the capture that finalizes an
earlier decoder's CUDA graphs.

A decoder holds its graph runner, and the runner holds the decoder's bound step function, so a
finished decoder is a reference cycle: only the cyclic garbage collector frees it, together
with its captured graphs, at whatever allocation happens to start a full collection. When that
allocation lies inside another decoder's capture, the old graph's destructor calls into CUDA in
the middle of the capture and invalidates it (capture_probe.py shows the mechanism alone).
In a normal process full collections are rare (Python waits until the survivors since the last
one reach a quarter of all long-lived objects), which is why the failure was seen once. Here the
collection is placed: automatic collection is held off (thresholds at 10^9, the collector still
enabled), and the second decoder's step function, when called inside the capture, runs one
collection if the collector is enabled, which is what an automatic collection triggered by an
allocation at that point would do.

Variants, each run in fresh processes:
- previous:                  the runner before issue 9 (capture_stress.PreviousProcedure),
                             an earlier decoder's graphs are garbage when the next one captures;
- previous, no dead graphs:  the same without the earlier decoder;
- previous, gc off:          the same as `previous` with only the collector switched off
                             around the capture;
- current:                   the runner of issue 9 (its capture discipline).

    python benchmarks/experiments/capture_repro.py [--rounds 4] [--out DIR]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))

VARIANTS = ["previous", "previous, no dead graphs", "previous, gc off", "current"]


HELD_OFF = 10 ** 9


def _collect_inside_capture(fn):
    """fn, plus one collection (if the collector is enabled) when called inside a capture."""
    import torch

    def step(inputs):
        if torch.cuda.is_current_stream_capturing() and gc.isenabled():
            gc.collect()
        return fn(inputs)
    return step


def _decode(models, runner_cls, seed: int, *, collect_in_capture: bool) -> None:
    from specverify.engine.requests import new_requests
    from specverify.engine.sampling import SamplingParams
    from specverify.engine.speculative import SpecDecoder
    from specverify.engine.spec_config import SpecConfig

    prompts = [[(seed * 7 + i * 13 + j) % 300 + 1 for j in range(3 + i % 4)] for i in range(3)]
    dec = SpecDecoder(models, SpecConfig(num_steps=3, topk=2, num_draft_tokens=5), SamplingParams(),
                      seed=seed, eos_token_id=None)
    dec.start(new_requests(prompts, [6, 9, 12]))
    dec.runner.__class__ = runner_cls
    if collect_in_capture:
        dec.runner.fn = _collect_inside_capture(dec.runner.fn)
    while dec.running():
        dec.step()
    assert dec.runner.captures > 0


def one(variant: str, seed: int) -> str:
    from capture_stress import PreviousProcedure
    from specverify.kernels.cuda_graph import BucketGraphRunner
    from specverify.models import build_models

    class PreviousGcOff(PreviousProcedure):
        def _capture(self, bucket: int) -> None:
            gc.disable()
            try:
                super()._capture(bucket)
            finally:
                gc.enable()

    cls = {"previous": PreviousProcedure, "previous, no dead graphs": PreviousProcedure,
           "previous, gc off": PreviousGcOff, "current": BucketGraphRunner}[variant]
    models = build_models("tiny", seed=1, device="cuda")
    gc.collect()
    gc.set_threshold(HELD_OFF, HELD_OFF, HELD_OFF)
    if variant != "previous, no dead graphs":
        _decode(models, cls, seed, collect_in_capture=False)   # leaves a cycle holding its graphs
    try:
        _decode(models, cls, seed + 1, collect_in_capture=True)
    except Exception as e:                    # noqa: BLE001 - the report names any failure
        return f"FAIL {type(e).__name__}: {str(e).strip().splitlines()[0][:120]}"
    return "ok"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default=None)
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(one(args.one[0], int(args.one[1])), flush=True)
        return
    jobs = [(v, s) for v in VARIANTS for s in range(args.rounds)]

    def child(job):
        r = subprocess.run([sys.executable, __file__, "--one", job[0], str(job[1])], capture_output=True,
                           text=True, timeout=400)
        lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
        return job, (lines[-1] if lines else f"CRASH rc={r.returncode}: {r.stderr.strip()[-300:]}")

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = dict(pool.map(child, jobs))
    import torch
    lines = [f"# Capture failure on demand ({torch.cuda.get_device_name()}, torch {torch.__version__})", "",
             "| variant | failed captures | first error |", "|---|---|---|"]
    summary = {}
    for v in VARIANTS:
        outs = [results[(v, s)] for s in range(args.rounds)]
        fails = [o for o in outs if o != "ok"]
        summary[v] = {"rounds": args.rounds, "failures": len(fails), "outcomes": outs}
        lines.append(f"| {v} | {len(fails)} / {args.rounds} | {fails[0] if fails else '-'} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "capture_repro.md"), "w") as f:
            f.write(text + "\n")
        with open(os.path.join(args.out, "capture_repro.json"), "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
