"""Capture stress: many fresh decoders, each capturing its cycle graphs after eager work, counting
capture failures for the runner's capture discipline and for the previous runner's procedure.

The previous runner (before issue 9) warmed the function up twice on a throw-away side stream,
then captured on torch's default capture stream with the garbage collector running, and retried
once when the capture failed. This script repeats that procedure (without the retry) next to the
current one over the same workload, so a difference in failures points at the discipline.

    python benchmarks/experiments/capture_stress.py --rounds 40 [--out DIR]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from specverify.engine.requests import new_requests              # noqa: E402
from specverify.engine.sampling import SamplingParams            # noqa: E402
from specverify.engine.speculative import SpecDecoder            # noqa: E402
from specverify.engine.spec_config import SpecConfig             # noqa: E402
from specverify.kernels.cuda_graph import BucketGraphRunner      # noqa: E402
from specverify.models import build_models                       # noqa: E402


class PreviousProcedure(BucketGraphRunner):
    """The capture steps of the runner before issue 9, minus its retry."""

    def _capture(self, bucket: int) -> None:
        buf = self._fill(bucket, {})
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.fn(buf)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.outputs[bucket] = self.fn(buf)
        self.pool = graph.pool()
        self.graphs[bucket] = graph
        self.captures += 1


def one_round(models, runner_cls, seed: int) -> tuple[int, list[str]]:
    """Eager decoding first, then a graph decoder whose batch shrinks through the buckets."""
    prompts = [[(seed * 7 + i * 13 + j) % 300 + 1 for j in range(3 + i % 4)] for i in range(5)]
    budgets = [4 + 3 * i for i in range(5)]
    spec = SpecConfig(num_steps=3, topk=2, num_draft_tokens=5)
    eager = SpecDecoder(models, SpecConfig(num_steps=3, topk=2, num_draft_tokens=5, cuda_graph=False),
                        SamplingParams(), seed=seed, eos_token_id=None)
    reqs = new_requests(prompts, budgets)
    eager.start(reqs)
    while eager.running():
        eager.step()
    dec = SpecDecoder(models, spec, SamplingParams(), seed=seed, eos_token_id=None)
    dec.start(new_requests(prompts, budgets))
    dec.runner.__class__ = runner_cls
    errors = []
    while dec.running():
        try:
            dec.step()
        except RuntimeError as e:          # a failed capture
            errors.append(str(e).splitlines()[0])
            break
    return dec.runner.captures, errors


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    models = build_models("tiny", seed=1, device="cuda")
    report = {}
    for name, cls in (("current", BucketGraphRunner), ("previous", PreviousProcedure)):
        t0, captures, failures = time.time(), 0, []
        for i in range(args.rounds):
            gc.set_threshold(50, 5, 5)     # frequent collections: a collection inside a capture is likely
            n, errs = one_round(models, cls, i)
            captures += n
            failures += errs
        gc.set_threshold(700, 10, 10)
        report[name] = {"rounds": args.rounds, "captures": captures, "failures": len(failures),
                        "first_errors": sorted(set(failures))[:5], "seconds": round(time.time() - t0, 1)}
        print(name, json.dumps(report[name]), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "capture_stress.json"), "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
