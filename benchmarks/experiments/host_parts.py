"""Where a captured step's host time goes, part by part (issue 25): target-only against EAGLE S3 k1.

host_gap.py measured the host's part of a step (its wall time less its graph's) as ~20 us for
target-only decoding and ~50 us for an EAGLE k1 cycle on an H100. This times each piece of
`step()` with the host clock, wrapping the decoder's own methods (nothing else is changed):
the table flush, the runner's call (input check + the graph launch), the page reservation that
runs while the graph does, the readback's pinned buffer, its copy and event, the wait, `tolist`,
and what `step()` does after the readback. Means over 200 steps, small preset, bs 1 and 8
(prompts of 40-54 tokens), bfloat16, greedy, captured.

    PYTHONPATH=. python3 benchmarks/experiments/host_parts.py      # ~1 minute on an H100
"""

from __future__ import annotations

import collections
import dataclasses
import time

import torch

import specverify
from specverify.engine import device_state
from specverify.engine.requests import new_requests
from specverify.engine.sampling import SamplingParams
from specverify.engine.spec_config import SpecConfig
from specverify.engine.speculative import SpecDecoder
from specverify.engine.target_only import TargetOnlyDecoder

STEPS = 200
CASES = {"target-only": None, "EAGLE S3 k1": SpecConfig(num_steps=3, topk=1)}
spent: dict[str, int] = collections.defaultdict(int)


def timed(name, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter_ns() - start
    return wrapper


def fetch_in_parts(self, packed):
    """Readback.fetch with a clock on each of its parts (the same calls, in the same order)."""
    t0 = time.perf_counter_ns()
    self.count += 1
    host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
    t1 = time.perf_counter_ns()
    host.copy_(packed, non_blocking=True)
    self._event.record()
    t2 = time.perf_counter_ns()
    self._event.synchronize()
    t3 = time.perf_counter_ns()
    out = host.tolist()
    t4 = time.perf_counter_ns()
    for name, a, b in (("fetch: pinned buffer", t0, t1), ("fetch: copy + event", t1, t2),
                       ("fetch: wait for the graph", t2, t3), ("fetch: tolist", t3, t4)):
        spent[name] += b - a
    return out


def decoder(models, spec):
    if spec is None:
        return TargetOnlyDecoder(models, SamplingParams(), seed=0, eos_token_id=None, cuda_graph=True,
                                 pad_batches=True)
    return SpecDecoder(models, dataclasses.replace(spec, cuda_graph=True), SamplingParams(), seed=0,
                       eos_token_id=None, pad_batches=True)


def main() -> None:
    models = specverify.build_models("small", compute_dtype="bfloat16", logits_dtype="bfloat16", device="cuda")
    vocab = models.target.config.vocab_size
    prompts = [[(7 * i + 3 + b) % vocab for i in range(40 + 2 * b)] for b in range(8)]
    device_state.Readback.fetch = fetch_in_parts
    print("| case | part | us a step |")
    print("|---|---|---|")
    for (name, spec), bs in ((case, bs) for bs in (1, 8) for case in CASES.items()):
        name = f"{name}, bs {bs}"
        dec = decoder(models, spec)
        dec.start(new_requests(prompts[:bs], [4 * STEPS + 64] * bs))
        for _ in range(5):
            dec.step()
        dec.cache.table.flush = timed("table flush (start and after reserving)", dec.cache.table.flush)
        dec.runner.run = timed("runner.run (inputs + graph launch)", dec.runner.run)
        dec._reserve = timed("reserve next pages (graph running)", dec._reserve)
        dec.run_step = timed("run_step", dec.run_step)
        spent.clear()
        torch.cuda.synchronize()
        start = time.perf_counter_ns()
        for _ in range(STEPS):
            dec.step()
        torch.cuda.synchronize()
        wall = time.perf_counter_ns() - start
        parts = dict(spent)
        parts["step() after run_step"] = wall - parts["run_step"]
        for part, ns in sorted(parts.items()):
            print(f"| {name} | {part} | {ns / STEPS / 1e3:.1f} |")
        print(f"| {name} | **step() wall** | {wall / STEPS / 1e3:.1f} |")


if __name__ == "__main__":
    main()
