"""How much of a captured step is the host's (issue 25): the step's wall time against its graph
replayed back to back.

For the small preset at bs 1 (bfloat16, greedy, captured, bucket shapes), target-only and EAGLE S3
k1: the mean wall time of 30 `step()` calls (graph replay, the one readback, the host's loop over
the lanes), of 30 replays of the same graph with nothing between them, of 30 replays each followed
by a sync (what a step that must read its result back before the next launch pays at least), and
the host time of one `replay()` call on an idle device (the graph's launch). Their difference is what
the host adds to a step; the rest is the graph itself (its kernels and the gaps between them).
A cProfile of 30 steps says where the host's part goes.

    PYTHONPATH=. python3 benchmarks/experiments/host_gap.py       # ~1 minute on an H100
"""

from __future__ import annotations

import cProfile
import dataclasses
import io
import pstats
import time

import torch

import specverify
from specverify.engine.requests import new_requests
from specverify.engine.sampling import SamplingParams
from specverify.engine.spec_config import SpecConfig
from specverify.engine.speculative import SpecDecoder
from specverify.engine.target_only import TargetOnlyDecoder

STEPS = 30
CASES = {"target-only": None, "EAGLE S3 k1": SpecConfig(num_steps=3, topk=1)}


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


def main() -> None:
    models = specverify.build_models("small", compute_dtype="bfloat16", logits_dtype="bfloat16", device="cuda")
    prompt = [(7 * i + 3) % models.target.config.vocab_size for i in range(40)]
    for name, spec in CASES.items():
        dec = decoder(models, spec)
        dec.start(new_requests([prompt], [400]))
        for _ in range(5):
            dec.step()
        step_ms = timed_ms(dec.step)
        graph = dec.runner.graphs[1]
        replay_ms = timed_ms(graph.replay)
        synced_ms = timed_ms(lambda: (graph.replay(), torch.cuda.synchronize()))
        launch_ms = launch_host_ms(graph)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(STEPS):
            dec.step()
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(8)
        print(f"== {name}: step {step_ms:.3f} ms, back-to-back replay {replay_ms:.3f} ms, "
              f"the host's part {step_ms - replay_ms:.3f} ms; one replay then a sync {synced_ms:.3f} ms; "
              f"the replay() call alone {launch_ms:.3f} ms of host time")
        print(text.getvalue())


if __name__ == "__main__":
    main()
