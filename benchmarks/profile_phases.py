"""Where a decode step's time goes (issue 25): kernels per phase of one target-only step and of one
EAGLE cycle, captured and eager, with the torch profiler.

For each case (target-only step; EAGLE S3 k1 D4 and S3 k4 D8 cycles; bs 1 and 8) the script:

1. runs the decoder eager (`cuda_graph=False`, bucket shapes) with every phase of the forward and
   the cycle wrapped in a `record_function` scope (the wrappers live here, never in the engine:
   the model's and the cycle's functions are patched by name for the profiled step only), and
   attributes each device kernel to the innermost phase that launched it: kernels per phase and
   their summed device time;
2. runs the same decoder captured (`cuda_graph=True`) and profiles `--steps` replays: device
   kernels per step (the graph runs exactly what the eager step launched), the sum of their
   durations, the step's wall time by CUDA events, and the ten kernels with the most time.

The gap `wall - summed kernel time` is what a launch-bound step loses between kernels: a kernel
of this size finishes in a few microseconds, and a graph replay still spends ~2-3 us per node
from one kernel's end to the next one's start.

    PYTHONPATH=. python3 benchmarks/profile_phases.py            # small preset, bf16, bs 1 and 8
    PYTHONPATH=. python3 benchmarks/profile_phases.py --preset medium --batches 1
    python3 benchmarks/profile_phases.py --cpu-smoke              # the script itself, tiny, CPU
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import importlib
import sys

from _common import base_parser, header, out_dir, table, write_results  # puts the repo root on sys.path

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

import specverify  # noqa: E402
from specverify.engine.requests import new_requests  # noqa: E402
from specverify.engine.sampling import SamplingParams  # noqa: E402
from specverify.engine.spec_config import SpecConfig  # noqa: E402
from specverify.engine.speculative import SpecDecoder  # noqa: E402
from specverify.engine.target_only import TargetOnlyDecoder  # noqa: E402
from bench_device_cycle import make_prompts, precapture  # noqa: E402

PHASE = "phase:"
# (module, attribute path, phase label): wrapped when present, so one script profiles the tree
# before and after a fusion renames or adds a function. Innermost scope wins.
PHASES = (
    ("specverify.engine.device_decoder", "DeviceDecoder.run_step", "step (host: table, readback)"),
    ("specverify.engine.target_only", "TargetOnlyDecoder.step_fn", "target-only step (select, state)"),
    ("specverify.engine.eagle_cycle", "EagleCycle.__call__", "cycle (tree, cut, state, pack)"),
    ("specverify.engine.eagle_cycle", "EagleCycle._accept", "accept (verify)"),
    ("specverify.engine.eagle_cycle", "EagleCycle._commit", "commit (K/V move, states)"),
    ("specverify.engine.eagle_cycle", "EagleCycle.draft", "draft phase (select, search)"),
    ("specverify.models.target", "TargetModel.forward", "target forward (embed, residual, head)"),
    ("specverify.models.draft", "DraftHead.forward", "draft head (fc, residual, head)"),
    ("specverify.models.layers", "plan_attention", "plan (rotary, slots, mask)"),
    ("specverify.models.layers", "rmsnorm", "norm"),
    ("specverify.models.layers", "add_rmsnorm", "norm"),
    ("specverify.models.layers", "attention", "attention block (qkv, rope, cache, attn, wo)"),
    ("specverify.models.layers", "swiglu_mlp", "mlp (gate/up, act, down)"),
    ("specverify.models.layers", "recurrent", "recurrent block"),
)
CASES = (("target-only", None),
         ("EAGLE S3 k1 D4", SpecConfig(num_steps=3, topk=1)),
         ("EAGLE S3 k4 D8", SpecConfig(num_steps=3, topk=4, num_draft_tokens=8)))


_STACK: list[str] = []                      # the phases entered, innermost last
TRITON_LAUNCHES: collections.Counter = collections.Counter()
OUTSIDE = "outside every phase"


def _scoped(fn, label):
    @functools.wraps(fn)
    def wrapper(*a, **kw):
        _STACK.append(label)
        try:
            with record_function(PHASE + label):
                return fn(*a, **kw)
        finally:
            _STACK.pop()
    return wrapper


def _counting_launch(run):
    """A Triton kernel launch goes through the driver API, which the profiler does not tie to the
    op that launched it: count each launch against the innermost phase here."""
    @functools.wraps(run)
    def launch(self, *a, **kw):
        TRITON_LAUNCHES[_STACK[-1] if _STACK else OUTSIDE] += 1
        return run(self, *a, **kw)
    return launch


@contextlib.contextmanager
def phase_scopes():
    """Wrap every function of PHASES that exists in a record_function scope; undo on exit."""
    from triton.runtime.jit import JITFunction
    undo = [(JITFunction, "run", JITFunction.run)]
    JITFunction.run = _counting_launch(JITFunction.run)
    for module, path, label in PHASES:
        owner = importlib.import_module(module)
        *parents, name = path.split(".")
        for p in parents:
            owner = getattr(owner, p)
        fn = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if fn is None:
            continue
        undo.append((owner, name, fn))
        setattr(owner, name, _scoped(fn, label))
    try:
        yield
    finally:
        for owner, name, fn in reversed(undo):
            setattr(owner, name, fn)


def _device_events(prof):
    return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def _phase_of(evt) -> str:
    while evt is not None:
        if evt.name.startswith(PHASE):
            return evt.name[len(PHASE):]
        evt = evt.cpu_parent
    return OUTSIDE


def eager_phases(dec, steps: int) -> dict:
    """{phase: [torch kernels per step, their device us per step, Triton launches per step]} of
    `steps` eager steps."""
    totals = collections.defaultdict(lambda: [0, 0.0, 0])
    TRITON_LAUNCHES.clear()
    with phase_scopes(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            dec.step()
        torch.cuda.synchronize()
    for evt in prof.events():
        if evt.device_type != torch.autograd.DeviceType.CPU or not evt.kernels:
            continue
        phase = _phase_of(evt)
        for k in evt.kernels:
            totals[phase][0] += 1
            totals[phase][1] += k.duration
    for phase, n in TRITON_LAUNCHES.items():
        totals[phase][2] += n
    return {p: [n / steps, us / steps, t / steps] for p, (n, us, t) in totals.items()}


def graph_profile(dec, steps: int) -> dict:
    """Kernels per replayed step, their summed time, the wall time per step and the top ten."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for s, e in zip(starts, ends):
            s.record()
            dec.step()
            e.record()
        torch.cuda.synchronize()
    wall = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))[steps // 2]
    kernels = [e for e in _device_events(prof) if "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    copies = [e for e in _device_events(prof) if e not in kernels]
    by_name = collections.defaultdict(lambda: [0, 0.0])
    for e in kernels:
        by_name[e.name][0] += 1
        by_name[e.name][1] += e.device_time_total
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:10]
    return {"wall_ms": wall, "kernels": len(kernels) / steps, "copies": len(copies) / steps,
            "kernel_us": sum(e.device_time_total for e in kernels) / steps,
            "top": [(name, n / steps, us / steps) for name, (n, us) in top]}


def make_decoder(models, spec, graph: bool, prompts, max_new: int):
    if spec is None:
        dec = TargetOnlyDecoder(models, SamplingParams(), seed=0, eos_token_id=None, cuda_graph=graph,
                                pad_batches=True)
    else:
        dec = SpecDecoder(models, dataclasses.replace(spec, cuda_graph=graph), SamplingParams(), seed=0,
                          eos_token_id=None, pad_batches=True)
    dec.start(new_requests(prompts, [max_new] * len(prompts)))
    return dec


def profile_case(models, spec, bs: int, args) -> dict:
    prompts = make_prompts(bs, models.config.vocab_size, args.seed)
    max_new = 8 * (args.steps + 4)
    eager = make_decoder(models, spec, False, prompts, max_new)
    for _ in range(2):
        eager.step()                           # warm-up: Triton compiles, allocator settles
    phases = eager_phases(eager, args.steps)
    del eager
    graph = make_decoder(models, spec, True, prompts, max_new)
    precapture(graph, bs)
    for _ in range(2):
        graph.step()
    res = graph_profile(graph, args.steps)
    del graph
    torch.cuda.empty_cache()
    return {"phases": phases, **res}


def _short(name: str, width: int = 90) -> str:
    name = name.replace("|", "/")
    return name if len(name) <= width else name[:width - 3] + "..."


def report(results: dict, args) -> list[str]:
    lines = header(f"Where the time goes: kernels per phase ({args.preset} preset)", False, {
        "Model": f"`{args.preset}` preset, bfloat16 compute and logits, seed {args.seed}",
        "Decoding": "greedy, plain (unsteered) draft, page size 1, bucket shapes (`pad_batches=True`)",
        "Method": f"torch profiler (CUPTI); eager phases: {args.steps} eager steps with record_function scopes, each "
                  f"kernel attributed to the innermost phase; captured: {args.steps} graph replays, CUDA events",
    })
    lines += ["", "## Captured step: kernels, kernel time, wall time", ""]
    rows = []
    for (case, bs), r in results.items():
        gap = r["wall_ms"] * 1e3 - r["kernel_us"]
        rows.append([case, bs, f"{r['kernels']:.0f}", f"{r['copies']:.0f}", f"{r['kernel_us']:.0f}",
                     f"{r['wall_ms']:.3f}", f"{gap:.0f}", f"{gap / max(r['kernels'], 1):.2f}"])
    lines += table(["case", "bs", "kernels / step", "copies / step", "kernel us / step", "wall ms / step",
                    "gap us (wall - kernels)", "gap us / kernel"], rows)
    for (case, bs), r in results.items():
        lines += ["", f"## {case}, bs {bs}", "", "Eager, by phase (innermost scope; device us counts the torch "
                  "kernels only, a Triton launch is counted but not timed per phase):", ""]
        ph = sorted(r["phases"].items(), key=lambda kv: -(kv[1][0] + kv[1][2]))
        col = [sum(v[i] for v in r["phases"].values()) for i in range(3)]
        lines += table(["phase", "kernels / step (torch + Triton)", "torch kernels", "Triton launches",
                        "torch kernels' device us / step"],
                       [[p, f"{n + t:.0f}", f"{n:.0f}", f"{t:.0f}", f"{us:.0f}"] for p, (n, us, t) in ph]
                       + [["**total**", f"{col[0] + col[2]:.0f}", f"{col[0]:.0f}", f"{col[2]:.0f}", f"{col[1]:.0f}"]])
        lines += ["", "Captured, the ten kernels with the most time:", ""]
        lines += table(["kernel", "launches / step", "us / step"],
                       [[f"`{_short(n)}`", f"{c:.0f}", f"{us:.1f}"] for n, c, us in r["top"]])
    return lines


def parse_args(argv=None):
    ap = base_parser(__doc__, quick_help="bs 1 only", smoke_help="not supported: the profile needs CUDA")
    ap.add_argument("--preset", default="small", choices=("small", "medium"))
    ap.add_argument("--batches", default="1,8", help="comma-separated batch sizes (default 1,8)")
    ap.add_argument("--steps", type=int, default=5, help="profiled steps per mode (default 5)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stem", default=None, help="results file stem (default profile-<preset>)")
    args = ap.parse_args(argv)
    args.batches = (1,) if args.quick else tuple(int(b) for b in args.batches.split(","))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.cpu_smoke or not torch.cuda.is_available():
        sys.exit("profile_phases.py: needs a CUDA device (the profile reads device kernels)")
    models = specverify.build_models(args.preset, seed=args.seed, compute_dtype="bfloat16",
                                     logits_dtype="bfloat16", device="cuda")
    results = {}
    for case, spec in CASES:
        for bs in args.batches:
            results[(case, bs)] = profile_case(models, spec, bs, args)
            r = results[(case, bs)]
            print(f"{case} bs {bs}: {r['kernels']:.0f} kernels, {r['kernel_us']:.0f} us of kernels, "
                  f"{r['wall_ms']:.3f} ms wall", flush=True)
    write_results(report(results, args), out_dir(args.out, False), args.stem or f"profile-{args.preset}", False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
