"""Where a captured step's wall time goes as the batch grows (issue 25): the aims run's EAGLE k1
cycle grew 0.15 ms from bs 1 to bs 8 while its kernels (kernel_sequence.py) grew 0.02 ms.

For each case (target-only; EAGLE S3 k1 with the plain head; the same with the head steered to
agreement 0.7, as the aims run it) and batch size: the mean wall time of a full-batch `step()`
(small preset, bfloat16, greedy, captured, bucket shapes, the aims' prompts and 64 new tokens),
split by wrapping the host's pieces with a clock: the replay call (`runner.run`), the page
reservation (`_reserve`), the readback's wait and copy (`readback.fetch`), and the rest (the host
loop over the lanes). Beside it: the step's graph replayed back to back (the device's own time),
and its kernels' total in a profiled replay, with the steering kernel's share.

    PYTHONPATH=. python3 benchmarks/experiments/step_anatomy.py [--bs 1 8] [--no-gc] [--trace]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from bench_device_cycle import make_prompts, precapture  # noqa: E402
from host_gap import launch_host_ms, timed_ms  # noqa: E402  (this directory is on the path)
from specverify.engine.requests import new_requests  # noqa: E402
from specverify.engine.sampling import SamplingParams  # noqa: E402
from specverify.engine.spec_config import SpecConfig  # noqa: E402
from specverify.engine.speculative import SpecDecoder  # noqa: E402
from specverify.engine.target_only import TargetOnlyDecoder  # noqa: E402
from specverify.kernels.cuda_graph import bucket_for  # noqa: E402
from specverify.models import build_models  # noqa: E402
from tests.support.steering import lookahead, oracle_sequences, steered_models  # noqa: E402

K1 = SpecConfig(num_steps=3, topk=1, cuda_graph=True)
NEW_TOKENS = 64


class Clock:
    """Wall time per named piece of a step (host clock; the readback's includes its wait)."""

    def __init__(self):
        self.total = collections.defaultdict(float)

    def wrap(self, obj, name: str, key: str) -> None:
        fn = getattr(obj, name)

        def timed(*a, **kw):
            start = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.total[key] += time.perf_counter() - start
        setattr(obj, name, timed)


def decoder(models, spec, prompts):
    if spec is None:
        dec = TargetOnlyDecoder(models, SamplingParams(), seed=0, eos_token_id=None, cuda_graph=True, pad_batches=True)
    else:
        dec = SpecDecoder(models, spec, SamplingParams(), seed=0, eos_token_id=None, pad_batches=True)
    dec.start(new_requests(prompts, [NEW_TOKENS] * len(prompts)))
    precapture(dec, len(prompts))
    for _ in range(2):
        dec.step()
    return dec


def kernel_us(graph, reps: int = 3) -> tuple[float, float, int]:
    """(kernel us per replay, of which the steering kernel's, kernels per replay)."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            graph.replay()
        torch.cuda.synchronize()
    evts = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
            and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    total = sum(e.time_range.end - e.time_range.start for e in evts) / reps
    steer = sum(e.time_range.end - e.time_range.start for e in evts if "steer" in e.name) / reps
    return total, steer, len(evts) // reps


def measure(models, spec, prompts, trace: bool, no_gc: bool) -> dict:
    bs = len(prompts)
    dec = decoder(models, spec, prompts)
    clock = Clock()
    clock.wrap(dec.runner, "run", "replay call")
    clock.wrap(dec, "_reserve", "reserve")
    clock.wrap(dec.readback, "fetch", "readback (wait + copy)")
    steps, wall = 0, 0.0
    if no_gc:
        gc.collect()
        gc.disable()
    while len(dec.running()) == bs and steps < 30:
        torch.cuda.synchronize()
        start = time.perf_counter()
        dec.step()
        torch.cuda.synchronize()
        wall += time.perf_counter() - start
        steps += 1
    gc.enable()
    pieces = {k: v / steps * 1e3 for k, v in clock.total.items()}
    pieces["rest of step()"] = wall / steps * 1e3 - sum(pieces.values())
    if trace and dec.running():     # before the bare replays below, which advance the state behind the host's back
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                dec.step()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14), file=sys.stderr, flush=True)
    graph = dec.runner.graphs[bucket_for(bs, dec.runner.buckets)]
    back_to_back = timed_ms(graph.replay, 30)
    kus, steer, count = kernel_us(graph)
    launch = launch_host_ms(graph, 20)          # the replay call alone, the device idle before it
    return {"steps": steps, "step ms": wall / steps * 1e3, "back-to-back ms": back_to_back, "kernel us": kus,
            "steer us": steer, "kernels": count, "replay() alone": launch, **pieces}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--no-gc", action="store_true", help="the measured steps with Python's garbage collector off")
    ap.add_argument("--trace", action="store_true", help="also print (stderr) the host-side profile of 5 steps")
    args = ap.parse_args()
    models = build_models("small", seed=0, device="cuda", compute_dtype="bfloat16", logits_dtype="bfloat16")
    prompts = make_prompts(max(args.bs), models.config.vocab_size, 0)
    oracle = oracle_sequences(models, prompts, lookahead(models, prompts, NEW_TOKENS, K1))
    steered = steered_models(models, prompts, NEW_TOKENS, agreement=0.7, spec=K1, oracle=oracle)
    cases = {"target-only": (models, None), "EAGLE S3 k1 plain": (models, K1), "EAGLE S3 k1 steered 0.7": (steered, K1)}
    cols = ["steps", "step ms", "back-to-back ms", "kernel us", "steer us", "kernels", "replay() alone", "replay call", "reserve",
            "readback (wait + copy)", "rest of step()"]
    print(f"| case | bs | {' | '.join(cols)} |\n|---|---|{'---|' * len(cols)}")
    for bs in args.bs:
        for name, (m, spec) in cases.items():
            print(f"== {name} bs {bs}", file=sys.stderr, flush=True)
            r = measure(m, dataclasses.replace(spec) if spec else None, prompts[:bs], args.trace, args.no_gc)
            cells = [f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols]
            print(f"| {name} | {bs} | {' | '.join(cells)} |", flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
