"""Every kernel of one captured step in launch order (issue 25): its duration in the replay, the idle
gap before it, and the engine source line that launched it (from an eager step of the same
decoder: a graph replays exactly the eager step's launches, in order, on one stream).

    PYTHONPATH=. python3 benchmarks/experiments/kernel_sequence.py [--case k1|k4|mtp|naive|target] [--bs 1] [--preset small]
        [--steered]     # the draft steered to agreement 0.7 as the aims benchmark runs it

Torch kernels are tied to their source by the profiler's Python stack of the launching op; a
Triton launch (the driver API, which the profiler does not tie to an op) by a hook on
`JITFunction.run` that records the caller's frame.
"""

from __future__ import annotations

import argparse
import dataclasses
import collections
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from bench_device_cycle import make_prompts, precapture  # noqa: E402
from specverify.engine.requests import new_requests  # noqa: E402
from specverify.engine.sampling import SamplingParams  # noqa: E402
from specverify.engine.spec_config import SpecConfig  # noqa: E402
from specverify.engine.speculative import SpecDecoder  # noqa: E402
from specverify.engine.target_only import TargetOnlyDecoder  # noqa: E402
from specverify.models import build_models  # noqa: E402
from tests.support.steering import steered_models  # noqa: E402

CASES = {"target": None, "k1": SpecConfig(num_steps=3, topk=1),
         "k4": SpecConfig(num_steps=3, topk=4, num_draft_tokens=8), "mtp": SpecConfig(algorithm="mtp", num_steps=3),
         "naive": SpecConfig(algorithm="naive_eagle")}


def _where(frames) -> str:
    """The two innermost engine / model frames of a stack, innermost first."""
    mine = [f for f in frames if not f.startswith(("kernels/", "ops/"))]
    return " < ".join(mine[:2]) if mine else "?"


def _short(frame: traceback.FrameSummary) -> str:
    return f"{frame.filename.split('specverify/')[-1]}:{frame.lineno} {frame.name}"


def make(models, spec, bs, graph):
    prompts = make_prompts(bs, models.config.vocab_size, 0)
    if spec is None:
        dec = TargetOnlyDecoder(models, SamplingParams(), seed=0, eos_token_id=None, cuda_graph=graph, pad_batches=True)
    else:
        dec = SpecDecoder(models, dataclasses.replace(spec, cuda_graph=graph), SamplingParams(), seed=0,
                          eos_token_id=None, pad_batches=True)
    dec.start(new_requests(prompts, [200] * bs))
    return dec


def eager_sources(dec) -> list[tuple[str, str]]:
    """(kernel name, source) of one eager step's device kernels, in launch order."""
    from triton.runtime.jit import JITFunction
    launches = []
    run = JITFunction.run

    def hooked(self, *a, **kw):
        stack = traceback.extract_stack()[:-1]
        launches.append((self.fn.__name__, _where([_short(f) for f in reversed(stack) if "specverify/" in f.filename])))
        return run(self, *a, **kw)

    JITFunction.run = hooked
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
            dec.step()
            torch.cuda.synchronize()
    finally:
        JITFunction.run = run
    by_id = {evt.id: evt for evt in prof.events() if evt.device_type == torch.autograd.DeviceType.CPU}
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                      and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()),
                     key=lambda e: e.time_range.start)
    triton = collections.deque(launches)
    out = []
    for k in kernels:
        op = by_id.get(getattr(k, "linked_correlation_id", -1))
        src = None
        while op is not None and not op.stack:
            op = op.cpu_parent
        if op is not None:
            stack = [f.replace("\\", "/") for f in op.stack]
            src = f"{op.name} @ " + _where([f.split("specverify/")[-1] for f in stack if "specverify/" in f])
        if src is None and triton and triton[0][0] in k.name:
            src = "triton @ " + triton.popleft()[1]
        out.append((k.name, src or "?"))
    return out


def replay_kernels(dec, steps: int = 3):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            dec.step()
        torch.cuda.synchronize()
    evts = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                   and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()),
                  key=lambda e: e.time_range.start)
    n = len(evts) // steps
    last = evts[-n:]                                            # the last replay
    rows, prev_end = [], None
    for e in last:
        gap = 0.0 if prev_end is None else e.time_range.start - prev_end
        rows.append((e.name, e.time_range.end - e.time_range.start, gap))
        prev_end = e.time_range.end
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default="k1", choices=sorted(CASES))
    ap.add_argument("--bs", type=int, default=1)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steered", action="store_true", help="steer the draft to agreement 0.7 (tests/support/steering.py)")
    args = ap.parse_args()
    models = build_models(args.preset, seed=0, device="cuda", compute_dtype="bfloat16", logits_dtype="bfloat16")
    spec = CASES[args.case]
    if args.steered and spec is not None:
        models = steered_models(models, make_prompts(args.bs, models.config.vocab_size, 0), 200, agreement=0.7,
                                spec=spec)
    eager = make(models, spec, args.bs, False)
    for _ in range(2):
        eager.step()
    src = eager_sources(eager)
    del eager
    graph = make(models, spec, args.bs, True)
    precapture(graph, args.bs)
    for _ in range(2):
        graph.step()
    rep = replay_kernels(graph)
    steered = " steered 0.7" if args.steered and spec is not None else ""
    print(f"# {args.preset} {args.case}{steered} bs {args.bs}: {len(rep)} kernels replayed, {len(src)} launched eager; "
          f"kernel us {sum(r[1] for r in rep):.1f}, gap us {sum(r[2] for r in rep):.1f}")
    print("| # | kernel | us | gap before | source (eager) |\n|---|---|---|---|---|")
    for i, (name, dur, gap) in enumerate(rep):
        s = src[i] if i < len(src) else ("?", "?")
        mark = "" if s[0] == name else f" (eager: {s[0][:40]})"
        print(f"| {i} | `{name[:60]}` | {dur:.1f} | {gap:.1f} | {s[1]}{mark} |")


if __name__ == "__main__":
    main()
