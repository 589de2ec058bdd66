"""Why a captured step's graph launch costs more host time inside `step()` than alone (issue 25):
step_anatomy.py timed `replay()` at ~0.03 ms on an idle device, but the replay call inside a step
(the input copy, then the launch) at 0.04-0.23 ms, with nothing of the device started meanwhile.

For the target-only step and the EAGLE S3 k1 cycle (small preset, bfloat16, bs 1, captured), the
host time of the launch and the wall time of the whole iteration, 40 iterations each, in these
contexts (the decoder's state advances on the device; nothing is read but the packed result):

- `alone`: sync, then `replay()`;
- `fill+replay`: the runner's input copy, then `replay()`;
- `step pattern`: fill, replay, then the readback as `step()` does it (a fresh pinned buffer, a
  non-blocking copy, an event, its wait, `tolist`);
- `kept buffer`: the same with one pinned buffer kept across iterations;
- `side stream`: the step pattern on a non-default stream (the readback event recorded there).

    PYTHONPATH=. python3 benchmarks/experiments/launch_context.py
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from bench_device_cycle import make_prompts, precapture  # noqa: E402
from specverify.engine.requests import new_requests  # noqa: E402
from specverify.engine.sampling import SamplingParams  # noqa: E402
from specverify.engine.spec_config import SpecConfig  # noqa: E402
from specverify.engine.speculative import SpecDecoder  # noqa: E402
from specverify.engine.target_only import TargetOnlyDecoder  # noqa: E402
from specverify.models import build_models  # noqa: E402

ITERS = 40


def make(models, spec):
    prompts = make_prompts(1, models.config.vocab_size, 0)
    if spec is None:
        dec = TargetOnlyDecoder(models, SamplingParams(), seed=0, eos_token_id=None, cuda_graph=True, pad_batches=True)
    else:
        dec = SpecDecoder(models, dataclasses.replace(spec, cuda_graph=True), SamplingParams(), seed=0,
                          eos_token_id=None, pad_batches=True)
    dec.start(new_requests(prompts, [4000 - 64]))
    precapture(dec, 1)
    for _ in range(3):
        dec.step()
    return dec


def run(dec, fill: bool, readback: str, stream=None) -> tuple[float, float]:
    runner = dec.runner
    graph, out = runner.graphs[1], runner.outputs[1]["packed"]
    rows = dec._rows
    kept = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
    event = torch.cuda.Event()
    launch = wall = 0.0
    torch.cuda.synchronize()
    for _ in range(ITERS):
        if readback == "none":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.cuda.stream(stream) if stream is not None else _null():
            if fill:
                runner._fill(1, {"rows": rows})
            graph.replay()
            t1 = time.perf_counter()
            if readback != "none":
                host = kept if readback == "kept" else torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
                host.copy_(out, non_blocking=True)
                event.record()
                event.synchronize()
                host.tolist()
        wall += time.perf_counter() - t0
        launch += t1 - t0
    torch.cuda.synchronize()
    return launch / ITERS * 1e3, wall / ITERS * 1e3


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def main() -> None:
    models = build_models("small", seed=0, device="cuda", compute_dtype="bfloat16", logits_dtype="bfloat16")
    side = torch.cuda.Stream()
    print("| case | context | launch host ms | iteration wall ms |\n|---|---|---|---|")
    for name, spec in (("target-only", None), ("EAGLE S3 k1", SpecConfig(num_steps=3, topk=1))):
        dec = make(models, spec)
        for label, kw in (("alone", dict(fill=False, readback="none")),
                          ("fill+replay", dict(fill=True, readback="none")),
                          ("step pattern", dict(fill=True, readback="fresh")),
                          ("kept buffer", dict(fill=True, readback="kept")),
                          ("side stream", dict(fill=True, readback="fresh", stream=side)),
                          ("step pattern again", dict(fill=True, readback="fresh"))):
            launch, wall = run(dec, **kw)
            print(f"| {name} | {label} | {launch:.3f} | {wall:.3f} |", flush=True)
        del dec
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
