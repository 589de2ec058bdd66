"""One full EAGLE cycle: `generate` with the draft phase in CUDA graphs against the eager path.

The `small` preset (V=32000, H=512, 8 layers; bfloat16 compute and logits), greedy, S=3 draft
steps at topk 1, draft agreement 0.7, on a fixed set of seeded random prompts. For each batch
size the whole `specverify.generate` call is timed with `SpecConfig(cuda_graph=True)` and with
`cuda_graph=False`, after one untimed warm-up call of each (its time is reported apart: it holds
any graph capture). Reported per batch size:

- ms per speculative cycle = call time / cycles, where cycles = the longest request's number of
  accept-length entries (the batch runs its cycles together);
- tokens/s = emitted tokens / call time; mean accept length = tokens emitted per request per cycle;
- the graph/eager speed-up, and whether both runs emitted identical tokens.

Draft agreement: a random draft head almost never agrees with the target, so the draft is
steered by the test-side wrapper of `tests/support/steering.py` (it proposes the target's greedy
token with probability 0.7). The wrapper needs the target's greedy continuation: the benchmark
runs that target-only pre-run itself, once per batch before the timed calls, and reports its time
apart; the engine holds no oracle, so the timed `generate` calls hold the prefill and the cycles
only.

Run on a GPU machine from the repository root:

    PYTHONPATH=. python3 benchmarks/bench_eagle_cycle.py            # ~1-2 minutes on an H100
    PYTHONPATH=. python3 benchmarks/bench_eagle_cycle.py --quick
    python3 benchmarks/bench_eagle_cycle.py --cpu-smoke             # tiny preset, no graphs
"""

from __future__ import annotations

import statistics
import sys
import time
import traceback

from _common import base_parser, header, out_dir, require_cuda, table, write_results  # puts the repo root on sys.path

import torch  # noqa: E402

import specverify  # noqa: E402
from specverify.engine.speculative import SpecConfig  # noqa: E402
from tests.support.steering import lookahead, oracle_sequences, steered_models  # noqa: E402

BATCHES = (1, 8, 32)
SMOKE_BATCHES = (1, 3)
NUM_STEPS, TOPK, AGREEMENT = 3, 1, 0.7
PROMPT_LENS = (16, 64)          # prompt lengths are drawn from [16, 64)


def make_prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    """n seeded random prompts of irregular lengths; a batch of bs takes the first bs of them."""
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(*PROMPT_LENS, (n,), generator=gen).tolist()
    return [torch.randint(0, vocab, (m,), generator=gen).tolist() for m in lens]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: str) -> tuple[float, object]:
    """(milliseconds, result) of one call."""
    sync(device)
    t0 = time.perf_counter()
    result = fn()
    sync(device)
    return (time.perf_counter() - t0) * 1e3, result


def run_mode(models, prompts, max_new: int, use_graph: bool, repeats: int, device: str) -> dict:
    """Warm-up call, then `repeats` timed calls of generate in one mode."""
    spec = SpecConfig(num_steps=NUM_STEPS, topk=TOPK, cuda_graph=use_graph)

    def call():
        return specverify.generate(models, prompts, spec=spec, max_new_tokens=max_new)
    try:
        first_ms, out = timed(call, device)
        times = [timed(call, device)[0] for _ in range(repeats)]
    except Exception as e:  # a failing mode is reported in the table, the other still runs
        traceback.print_exc()
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"}
    accepts = [a for per_req in out.accept_lengths for a in per_req]
    return {"first_ms": first_ms, "ms": statistics.median(times), "tokens": out.tokens,
            "accept_lengths": out.accept_lengths,
            "cycles": max(len(a) for a in out.accept_lengths),
            "emitted": sum(len(t) for t in out.tokens),
            "mean_accept": sum(accepts) / max(len(accepts), 1)}


def bench_batch(models, prompts, args, device: str) -> dict:
    """The steering pre-run (timed, set-up only), then both modes on the steered models."""
    spec = SpecConfig(num_steps=NUM_STEPS, topk=TOPK, cuda_graph=False)
    budgets = lookahead(models, prompts, args.max_new_tokens, spec)
    oracle_ms, oracle = timed(lambda: oracle_sequences(models, prompts, budgets), device)
    steered = steered_models(models, prompts, args.max_new_tokens, agreement=AGREEMENT, spec=spec, oracle=oracle)
    eager = run_mode(steered, prompts, args.max_new_tokens, False, args.repeats, device)
    graph = run_mode(steered, prompts, args.max_new_tokens, not args.cpu_smoke, args.repeats, device)
    return {"bs": len(prompts), "oracle_ms": oracle_ms, "eager": eager, "graph": graph}


def _ms(x: float) -> str:
    return f"{x:.2f}"


def _pair(e: dict, g: dict, fmt) -> str:
    """One figure of both modes: "x" when they agree, "eager / graph" when not, "-" where failed."""
    vals = [fmt(m) for m in (e, g) if "error" not in m]
    if not vals:
        return "-"
    return vals[0] if len(set(vals)) == 1 else " / ".join(vals)


def rows_for(results: list[dict]) -> tuple[list[list], list[list], list[str], bool]:
    """The main and the breakdown table rows, error notes, and whether all ran clean and matched."""
    main, detail, errors, ok = [], [], [], True
    for r in results:
        bs, e, g, o = r["bs"], r["eager"], r["graph"], r["oracle_ms"]
        for mode, m in (("eager", e), ("graph", g)):
            if "error" in m:
                errors.append(f"- bs={bs}, {mode}: `{m['error']}`")
                ok = False

        def col(m, fn):
            return "error" if "error" in m else fn(m)

        def per_cycle(m):
            return m["ms"] / m["cycles"]
        both = "error" not in e and "error" not in g
        same = both and e["tokens"] == g["tokens"]
        ok = ok and same
        main.append([bs, _pair(e, g, lambda m: str(m["cycles"])),
                     _pair(e, g, lambda m: f"{m['mean_accept']:.2f}"),
                     col(e, lambda m: _ms(per_cycle(m))), col(g, lambda m: _ms(per_cycle(m))),
                     f"{per_cycle(e) / per_cycle(g):.2f}x" if both else "-",
                     col(e, lambda m: f"{m['emitted'] / m['ms'] * 1e3:.0f}"),
                     col(g, lambda m: f"{m['emitted'] / m['ms'] * 1e3:.0f}"),
                     ("yes" if same else "**NO**") if both else "-"])
        detail.append([bs, col(e, lambda m: _ms(m["ms"])), col(g, lambda m: _ms(m["ms"])), _ms(o),
                       col(e, lambda m: _ms(m["first_ms"])), col(g, lambda m: _ms(m["first_ms"]))])
    return main, detail, errors, ok


def parse_args(argv=None):
    ap = base_parser(__doc__, quick_help="one timed call per mode, 32 new tokens",
                     smoke_help="check the script on the CPU: tiny preset, tiny batches, no CUDA graphs")
    ap.add_argument("--max-new-tokens", type=int, help="new tokens per request (default 64)")
    ap.add_argument("--repeats", type=int, help="timed calls per mode; the median is reported (default 3)")
    ap.add_argument("--seed", type=int, default=0, help="model and prompt seed")
    args = ap.parse_args(argv)
    quick = args.quick or args.cpu_smoke
    args.max_new_tokens = args.max_new_tokens or (12 if args.cpu_smoke else 32 if quick else 64)
    args.repeats = args.repeats or (1 if quick else 3)
    if args.max_new_tokens < 1 or args.repeats < 1:
        ap.error("--max-new-tokens and --repeats must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.cpu_smoke:
        require_cuda("bench_eagle_cycle")
    device = "cpu" if args.cpu_smoke else "cuda"
    preset = "tiny" if args.cpu_smoke else "small"
    batches = SMOKE_BATCHES if args.cpu_smoke else BATCHES
    t0 = time.perf_counter()
    models = specverify.build_models(preset, seed=args.seed, compute_dtype="bfloat16", logits_dtype="bfloat16",
                                     device=device)
    build_s = time.perf_counter() - t0
    prompts = make_prompts(max(batches), models.config.vocab_size, args.seed)
    results = []
    for bs in batches:
        results.append(bench_batch(models, prompts[:bs], args, device))
        r = results[-1]
        said = {m: f"{r[m]['ms']:.1f} ms" if "ms" in r[m] else r[m]["error"] for m in ("eager", "graph")}
        print(f"  bs={bs}: pre-run {r['oracle_ms']:.1f} ms, eager {said['eager']}, graph {said['graph']}",
              file=sys.stderr, flush=True)
    main_rows, detail_rows, errors, ok = rows_for(results)
    cfg = models.config
    graph_mode = ("`cuda_graph=False` (the CPU has no graphs: both columns are eager)" if args.cpu_smoke
                  else "`cuda_graph=True`")
    lines = header("One EAGLE cycle: CUDA-graph draft phase vs eager", args.cpu_smoke, {
        "Model": f"`{preset}` preset (V={cfg.vocab_size}, H={cfg.hidden_size}, {cfg.num_layers} layers), "
                 f"bfloat16 compute and logits, seed {args.seed}, built in {build_s:.1f} s",
        "Decoding": f"greedy, EAGLE S={NUM_STEPS} topk={TOPK}, steered draft agreement {AGREEMENT}, "
                    f"max_new_tokens={args.max_new_tokens}, prompts of {PROMPT_LENS[0]}-{PROMPT_LENS[1] - 1} "
                    f"seeded random ids",
        "Modes": f"eager = `cuda_graph=False`; graph = {graph_mode}",
        "Timing": f"whole `generate` call, wall clock with device syncs; one warm-up call per mode, "
                  f"then the median of {args.repeats} timed call(s)",
    })
    lines += table(["bs", "cycles", "mean accept", "eager ms/cycle", "graph ms/cycle", "graph speed-up",
                    "eager tok/s", "graph tok/s", "same tokens"], main_rows)
    lines += ["", "ms/cycle = generate call time / cycles (prefill included; the steering pre-run is set-up, "
              "not timed in the call); "
              "mean accept = tokens emitted per request per cycle (cycles and mean accept read "
              "eager / graph when the two differ)."]
    if errors:
        lines += ["", "Errors (the first line of each):", ""] + errors
    lines += ["", "## Where the time goes", ""]
    lines += table(["bs", "eager call ms", "graph call ms", "steering pre-run ms", "eager 1st call ms",
                    "graph 1st call ms"], detail_rows)
    lines += ["", "steering pre-run = the target-only greedy decode the test-side draft steering needs "
              "(tests/support/steering.py), run once per batch before the timed calls and not part of them. "
              "`1st call` is the untimed warm-up call, which holds any graph capture."]
    write_results(lines, out_dir(args.out, args.cpu_smoke), "eagle_cycle", args.cpu_smoke)
    if not ok:
        print("bench_eagle_cycle: a mode failed or the graph and eager runs emitted different tokens "
              "(see the table); the timings were recorded, but this is a correctness bug to chase in "
              "the tests", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
