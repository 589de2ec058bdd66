"""The hybrid (Mamba-like) model: tok/s of every speculative algorithm against target-only decoding
(issue 11).

The `small` preset with `hybrid=True`: 8 layers alternating recurrent (a causal conv window over the
q|k|v projections, then a gated state recurrence) and attention, bfloat16 compute and logits. Each
speculative cycle runs the verify over the draft, commits the accepted nodes' K/V and, through
`ops.mamba_state_scatter`, each request's recurrent state and conv window in all four recurrent
layers, then drafts the next cycle; all of it captured as one CUDA graph per batch-size bucket.

Algorithms (`SpecConfig`): EAGLE chain (S=3, topk 1), EAGLE tree (S=3, topk 2, D=6), MTP (one
head per step, S=3), DFlash (a block of B=4 drafted in one forward), naive EAGLE (D=2). Drafts are
steered towards the target's greedy continuation by `tests/support/steering.py` at agreement 0.7
(every algorithm's draft, the MTP heads and the DFlash block rows included), so the accept length
reflects the algorithm's shape, not random weights. Greedy, no EOS, bs 1, 8 and 64, seeded random
prompts of 16-63 tokens, 64 new tokens per request, page size 1, `pad_batches=True`. Each decoder
is driven as in `bench_device_cycle.py`: after `start()` every bucket is captured, then untimed
warm-up steps, sync-counting steps, and every remaining `step()` timed with CUDA events.

- tok/s = tokens emitted in the timed steps / their total time (the tail included); full-batch
  tok/s = the same over the steps while every request still ran.
- mean accept = tokens emitted per request per cycle.
- `same tokens` counts requests whose greedy output equals target-only decoding's (information:
  bfloat16 verify and decode shapes may round apart; the CPU tests hold losslessness exactly).

Run on a GPU machine from the repository root:

    PYTHONPATH=. python3 benchmarks/bench_hybrid.py            # a minute or two on an H100
    PYTHONPATH=. python3 benchmarks/bench_hybrid.py --quick    # 32 tokens, bs 1 and 64
    python3 benchmarks/bench_hybrid.py --cpu-smoke --out /tmp/x   # the CPU: tiny preset, no graphs
"""

from __future__ import annotations

import sys
import time

from _common import (CAPTURES_NOTE, add_decode_options, base_parser, closing_lines,  # puts the repo root on sys.path
                     comma_choices, device_and_preset, header, out_dir, resolve_decode_options, step_timing,
                     table, write_results)

import specverify  # noqa: E402
from bench_device_cycle import (PROMPT_LENS, _f, captured, make_prompts, run_spec, run_target,  # noqa: E402
                                steered_for, sync_cells)
from specverify.engine.spec_config import SpecConfig  # noqa: E402

ALGORITHMS = {
    "eagle S3 k1": SpecConfig(num_steps=3, topk=1),
    "eagle S3 k2 D6": SpecConfig(num_steps=3, topk=2, num_draft_tokens=6),
    "mtp S3": SpecConfig(algorithm="mtp", num_steps=3),
    "dflash B4": SpecConfig(algorithm="dflash", num_steps=3),
    "naive_eagle": SpecConfig(algorithm="naive_eagle"),
}
BATCHES = (1, 8, 64)
QUICK_BATCHES = (1, 64)
SMOKE_BATCHES = (1, 2)
AGREEMENT = 0.7


def ratio(num, den):
    return num / den if num and den else None


def result_rows(results: dict, target: dict) -> tuple[list, list, list, list[str], bool]:
    """Rows of the throughput, sync and detail tables, error notes, whether every run ran."""
    thr, syn, det, errors, ok = [], [], [], [], True
    for (name, bs), m in results.items():
        t = target.get(bs, {"error": "not run"})
        if "error" in m:
            errors.append(f"- {name}, bs={bs}: `{m['error']}`")
            ok = False
            thr.append([name, bs] + ["error"] * 8)
            continue
        tt = t.get("tok_s") if "error" not in t else None
        t_full = t.get("full_tok_s") if "error" not in t else None
        same = f"{sum(a == b for a, b in zip(m['tokens'], t['tokens']))}/{bs}" if "error" not in t else "-"
        thr.append([name, bs, _f(m["mean_accept"]), _f(m["tok_s"], "{:.0f}"), _f(tt, "{:.0f}"),
                    _f(ratio(m["tok_s"], tt), "{:.2f}x"), _f(m.get("full_tok_s"), "{:.0f}"), _f(t_full, "{:.0f}"),
                    _f(ratio(m.get("full_tok_s"), t_full), "{:.2f}x"), same])
        syn.append([name, bs] + sync_cells(m["syncs"]))
        det.append([name, bs, _f(m["prefill_ms"], "{:.1f}"), captured(m), _f(m["cycle_ms"], "{:.3f}"),
                    f"{m['full']} / {m['steps']}", _f(m["total_ms"], "{:.1f}")])
    for bs, t in target.items():
        if "error" in t:
            errors.append(f"- target-only, bs={bs}: `{t['error']}`")
            ok = False
            continue
        syn.append(["target-only", bs] + sync_cells(t["syncs"]))
        det.append(["target-only", bs, _f(t["prefill_ms"], "{:.1f}"), captured(t), _f(t["cycle_ms"], "{:.3f}"),
                    f"{t['full']} / {t['steps']}", _f(t["total_ms"], "{:.1f}")])
    return thr, syn, det, errors, ok


def parse_args(argv=None):
    ap = base_parser(__doc__, quick_help="32 new tokens, bs 1 and 64",
                     smoke_help="check the script on the CPU: tiny preset, bs 1 and 2, few tokens, no CUDA graphs")
    add_decode_options(ap, tokens=(64, 32, 10), batches=(BATCHES, QUICK_BATCHES, SMOKE_BATCHES), agreement=AGREEMENT,
                       sync_steps=(3, 1))
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS),
                    help=f"comma-separated rows to run (default all: {', '.join(ALGORITHMS)})")
    args = ap.parse_args(argv)
    resolve_decode_options(ap, args)
    args.algorithms = comma_choices(ap, "--algorithms", args.algorithms, tuple(ALGORITHMS))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device, preset = device_and_preset(args, "bench_hybrid")
    t_all = time.perf_counter()
    models = specverify.build_models(preset, seed=args.seed, hybrid=True, compute_dtype="bfloat16",
                                     logits_dtype="bfloat16", device=device)
    cfg = models.config
    prompts = make_prompts(max(args.batches), cfg.vocab_size, args.seed)
    specs = [ALGORITHMS[a] for a in args.algorithms]
    steered, oracle_ms = steered_for(models, prompts, specs, args, device)

    target, results = {}, {}
    for bs in sorted(set(args.batches)):
        batch = prompts[:bs]
        target[bs] = t = run_target(models, batch, args, device)
        print(f"  target-only bs={bs}: " + (t["error"] if "error" in t else f"{_f(t['tok_s'], '{:.0f}')} tok/s"),
              file=sys.stderr, flush=True)
        for name in args.algorithms:
            results[name, bs] = m = run_spec(steered, batch, ALGORITHMS[name], True, args, device)
            print(f"  {name} bs={bs}: " + (m["error"] if "error" in m else
                  f"{_f(m['tok_s'], '{:.0f}')} tok/s, accept {m['mean_accept']:.2f}"), file=sys.stderr, flush=True)

    thr, syn, det, errors, ok = result_rows(results, target)
    layers = " / ".join(k[:3] for k in cfg.layer_kinds)
    lines = header("Hybrid model: tok/s per speculative algorithm vs target-only", args.cpu_smoke, {
        "Aim (issue 11)": "hybrid-model tok/s per algorithm at bs 1, 8, 64 (a figure to record, no threshold)",
        "Model": f"`{preset}` preset, hybrid (layers {layers}; conv window {cfg.rec_conv_width}, {cfg.num_rec_heads} "
                 f"recurrent heads of {cfg.rec_key_dim} x {cfg.rec_value_dim}), V={cfg.vocab_size}, "
                 f"H={cfg.hidden_size}, bfloat16 compute and logits, seed {args.seed}",
        "Decoding": f"greedy, no EOS, max_new_tokens={args.max_new_tokens}, bs "
                    f"{', '.join(map(str, sorted(set(args.batches))))}, prompts of {PROMPT_LENS[0]}-"
                    f"{PROMPT_LENS[1] - 1} seeded random ids, page size 1, `pad_batches=True`, CUDA graphs on",
        "Drafts": f"steered to agreement {args.agreement:g} by tests/support/steering.py (target-only pre-run "
                  f"{oracle_ms:.0f} ms, once, untimed); the steering's kernels run in every draft forward",
        "Timing": step_timing(args),
        "Total run time": f"{time.perf_counter() - t_all:.0f} s",
    })
    lines += ["## Throughput", ""]
    lines += table(["algorithm", "bs", "mean accept", "tok/s", "target-only tok/s", "spec / target",
                    "full-batch tok/s", "full-batch target tok/s", "full-batch spec / target",
                    "same tokens as target-only"], thr)
    lines += ["", "## Syncs per cycle", ""]
    lines += table(["algorithm", "bs", "cycles counted", "sync warnings / cycle", "readbacks / cycle",
                    "where (first 4)"], syn)
    lines += ["", "## Where the time goes", ""]
    lines += table(["algorithm", "bs", "prefill ms", "captures / ms", "ms / full-batch cycle",
                    "timed full / all steps", "timed ms"], det)
    aims = [f"- recorded: {len([m for m in results.values() if 'error' not in m])} of {len(results)} algorithm x "
            f"batch rows ran"]
    lines += ["", CAPTURES_NOTE] + closing_lines(aims, args.cpu_smoke, errors)
    write_results(lines, out_dir(args.out, args.cpu_smoke), "hybrid", args.cpu_smoke)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
