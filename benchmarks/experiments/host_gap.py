"""How much of a captured step is the host's (issue 25): the step's wall time against its graph
replayed back to back.

For a preset (--preset, default small; bfloat16, greedy, captured, bucket shapes), target-only, EAGLE
S3 k1, S3 k4 D8 and MTP S3 (--cases picks some) at each batch size asked for, with the plain draft head and (--steered) with the draft steered to
agreement 0.7 as the aims benchmark runs it (the steering's kernels are then in the graph): the mean
wall time of 30 `step()` calls (graph replay, the one readback, the host's loop over the lanes), of 30 replays of the same graph with nothing between them, of 30 replays each followed
by a sync (what a step that must read its result back before the next launch pays at least), and
the host time of one `replay()` call on an idle device (the graph's launch). Their difference is what
the host adds to a step; the rest is the graph itself (its kernels and the gaps between them).
A cProfile of 30 steps says where the host's part goes.

    PYTHONPATH=. python3 benchmarks/experiments/host_gap.py       # ~1 minute on an H100
    PYTHONPATH=. python3 benchmarks/experiments/host_gap.py --bs 1,8 --steered --no-profile
    PYTHONPATH=. python3 benchmarks/experiments/host_gap.py --preset medium --bs 8 --steered \
        --cases "target-only,EAGLE S3 k1,MTP S3"
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import pstats
import sys
import time
from pathlib import Path

import torch

import specverify
from specverify.engine.requests import new_requests
from specverify.engine.sampling import SamplingParams
from specverify.engine.spec_config import SpecConfig
from specverify.engine.speculative import SpecDecoder
from specverify.engine.target_only import TargetOnlyDecoder

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/
from bench_device_cycle import make_prompts  # noqa: E402
from tests.support.steering import steered_models  # noqa: E402

STEPS = 30
CASES = {"target-only": None, "EAGLE S3 k1": SpecConfig(num_steps=3, topk=1),
         "EAGLE S3 k4 D8": SpecConfig(num_steps=3, topk=4, num_draft_tokens=8),
         "MTP S3": SpecConfig(algorithm="mtp", num_steps=3)}
NEW_TOKENS = 400      # the budget of each request: every timed step runs at the full batch


def decoder(models, spec: SpecConfig | None):
    if spec is None:
        return TargetOnlyDecoder(models, SamplingParams(), seed=0, eos_token_id=None, cuda_graph=True,
                                 pad_batches=True)
    return SpecDecoder(models, dataclasses.replace(spec, cuda_graph=True), SamplingParams(), seed=0,
                       eos_token_id=None, pad_batches=True)


def timed_ms(fn, reps: int = STEPS) -> float:
    """Mean wall ms of `reps` calls of fn, back to back, between two syncs."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps * 1e3


def launch_host_ms(graph, reps: int = STEPS) -> float:
    """Host time of one `replay()` call (the graph launch), the device idle before it."""
    total = 0.0
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        graph.replay()
        total += time.perf_counter() - start
    torch.cuda.synchronize()
    return total / reps * 1e3


def measure(dec, bs: int, profile: bool) -> str:
    """One line of figures for a started decoder (and its cProfile when asked for)."""
    for _ in range(5):
        dec.step()
    step_ms = timed_ms(dec.step)
    graph = dec.runner.graphs[bs]
    replay_ms = timed_ms(graph.replay)
    synced_ms = timed_ms(lambda: (graph.replay(), torch.cuda.synchronize()))
    launch_ms = launch_host_ms(graph)
    line = (f"step {step_ms:.3f} ms, back-to-back replay {replay_ms:.3f} ms, the host's part "
            f"{step_ms - replay_ms:.3f} ms; one replay then a sync {synced_ms:.3f} ms; the replay() call "
            f"alone {launch_ms:.3f} ms of host time")
    if not profile:
        return line
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(STEPS):
        dec.step()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(8)
    return line + "\n" + text.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bs", default="1", help="comma-separated batch sizes (default 1)")
    ap.add_argument("--steered", action="store_true", help="also run every EAGLE case with the steered draft")
    ap.add_argument("--no-profile", action="store_true", help="leave out the cProfile of each case")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    args = ap.parse_args()
    cases = {name: CASES[name] for name in args.cases.split(",")}
    sizes = [int(b) for b in args.bs.split(",")]
    models = specverify.build_models(args.preset, compute_dtype="bfloat16", logits_dtype="bfloat16", device="cuda")
    prompts = make_prompts(max(sizes), models.config.vocab_size, 0)
    drafts = [("plain", models)]
    if args.steered:
        specs = [s for s in cases.values() if s is not None]
        drafts.append(("steered 0.7", steered_models(models, prompts, NEW_TOKENS, agreement=0.7, spec=specs)))
    for bs in sizes:
        for name, spec in cases.items():
            for draft, ms in drafts if spec is not None else drafts[:1]:
                dec = decoder(ms, spec)
                dec.start(new_requests(prompts[:bs], [NEW_TOKENS] * bs))
                label = name if spec is None else f"{name}, {draft} draft"
                print(f"== {label}, bs {bs}: {measure(dec, bs, not args.no_profile)}", flush=True)
                del dec
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
