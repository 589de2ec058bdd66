"""Naive EAGLE (issue 10): the fused verify + draft-extend cycle, captured vs eager vs unfused, and
naive EAGLE against target-only decoding.

Naive EAGLE is `SpecConfig(algorithm="naive_eagle")`: D = 2, S = 1, topk = 1. The target verifies
[root, draft], and the next draft token comes from a draft-extend over what was emitted. Three
ways to run one cycle are timed:

- fused graph: `SpecDecoder(..., fused=True)` with `cuda_graph=True`. The verify and the next
  draft-extend are one tensor function, captured as one CUDA graph per batch-size bucket;
- fused eager: the same function with `cuda_graph=False`, called eagerly on the same padded
  bucket buffers (so it computes what the graph replays);
- unfused eager: `fused=False`. The verify runs, the accept counts are read back to the host, then
  a draft-extend runs over exactly the emitted tokens, as an engine without the fusion would do.
  It always runs eagerly, since the mid-cycle readback cannot sit inside a graph.

The `small` preset (V=32000, H=512, 8 layers; bfloat16 compute and logits), greedy, no EOS, bs 1,
8 and 64, seeded random prompts of 16-63 tokens, 64 new tokens per request, page size 1, every
mode at bucket shapes (`pad_batches=True`). The decoders are driven step by step, with the
helpers of `bench_device_cycle.py`: after `start()` (the prefill, not timed) every CUDA-graph
bucket the run can meet is captured up front (reported apart), then `--warmup` untimed steps,
then `--sync-steps` steps counted under `torch.cuda.set_sync_debug_mode("warn")`, then every
remaining `step()` timed with CUDA events.

- ms per cycle = time of the timed steps run at the full batch (every request still running) /
  their number, for each mode. The issue's aim: the fused graph's cycle >= 2x faster than the
  unfused eager cycle (`unfused / fused graph`).
- tok/s = tokens emitted in the timed steps / their total time (the tail where requests finish
  included), for naive EAGLE (fused graph) and for target-only decoding (`TargetOnlyDecoder`,
  captured) at the same batch size and budget. Mean accept length = tokens emitted per request
  per cycle, over all cycles (1 or 2 here). The issue's aim: naive EAGLE faster than target-only
  wherever its mean accept length is >= 1.5.
- The three modes are greedy and must emit the same tokens. A mismatch is marked in the table
  and the script exits non-zero (after writing the report), as a run that raises does.

Drafts: the plain (unsteered) draft head, which almost never agrees with the target (accept
~1: the cycle's cost with nothing gained), and a draft steered to agreement 0.7 by
`tests/support/steering.py`, as `bench_device_cycle.py` steers (accept ~1.7). The steering needs
the target's greedy continuation: that target-only pre-run happens once, before anything is
timed, and its time is reported apart. The steering adds small kernels of its own to every draft
forward, so the plain rows time the engine's cycle alone.

Run on a GPU machine from the repository root:

    PYTHONPATH=. python3 benchmarks/bench_naive_eagle.py            # about a minute on an H100
    PYTHONPATH=. python3 benchmarks/bench_naive_eagle.py --quick    # 32 tokens, bs 1 and 64
    python3 benchmarks/bench_naive_eagle.py --cpu-smoke --out /tmp/x   # the CPU: tiny preset, no graphs
"""

from __future__ import annotations

import sys
import time

from _common import (CAPTURES_NOTE, add_decode_options, base_parser, closing_lines,  # puts the repo root on sys.path
                     comma_choices, device_and_preset, header, out_dir, resolve_decode_options, step_timing,
                     table, write_results)

import specverify  # noqa: E402
from bench_device_cycle import (PROMPT_LENS, _f, _yes, captured, drive, guarded, make_prompts,  # noqa: E402
                                release, run_target, steered_for, sync, sync_cells)
from specverify.engine.requests import new_requests  # noqa: E402
from specverify.engine.sampling import SamplingParams  # noqa: E402
from specverify.engine.spec_config import SpecConfig  # noqa: E402
from specverify.engine.speculative import SpecDecoder  # noqa: E402

NAIVE = SpecConfig(algorithm="naive_eagle")
# mode -> (cuda_graph, fused); the unfused form runs eagerly whatever cuda_graph says.
MODES = {"fused graph": (True, True), "fused eager": (False, True), "unfused eager": (False, False)}
BATCHES = (1, 8, 64)
QUICK_BATCHES = (1, 64)
SMOKE_BATCHES = (1, 2)
AGREEMENT = 0.7

# The aims.
AIM_FUSION = 2.0        # unfused eager ms/cycle >= 2x the fused graph's
AIM_ACCEPT = 1.5        # naive tok/s above target-only where the mean accept length >= 1.5
AIMS_TEXT = (f"the fused cycle (captured) >= {AIM_FUSION:g}x faster than the unfused one (verify, readback, "
             f"draft-extend); naive EAGLE tok/s above target-only wherever its mean accept length >= {AIM_ACCEPT:g}")


# -- running one mode --------------------------------------------------------------------------------

def run_naive(models, prompts, mode: str, args, device: str) -> dict:
    """One naive-EAGLE decode of `prompts` in `mode`, driven step by step and timed."""
    use_graph, fused = MODES[mode]

    def go():
        spec = SpecConfig(algorithm="naive_eagle", cuda_graph=use_graph)   # no graphs on the CPU
        dec = SpecDecoder(models, spec, SamplingParams(), seed=args.seed, eos_token_id=None, pad_batches=True,
                          fused=fused)
        reqs = new_requests(prompts, [args.max_new_tokens] * len(prompts))
        t0 = time.perf_counter()
        dec.start(reqs)
        sync(device)
        prefill_ms = (time.perf_counter() - t0) * 1e3
        res = drive(dec, reqs, len(prompts), args, device)
        accepts = [a for r in reqs for a in r.accept_lengths]
        res.update(prefill_ms=prefill_ms, graphs=dec.use_graphs, mean_accept=sum(accepts) / max(len(accepts), 1),
                   accepts=[list(r.accept_lengths) for r in reqs])
        return res
    res = guarded(go)
    release(device)
    return res


def said(m: dict) -> str:
    if "error" in m:
        return m["error"]
    return f"{_f(m['cycle_ms'], '{:.3f}')} ms/cycle, accept {m['mean_accept']:.2f}"


# -- report ----------------------------------------------------------------------------------------

def ratio(num, den):
    return num / den if num and den else None


def result_rows(results, target, aims: dict) -> tuple[list, list, list, list, list[str], bool]:
    """Rows of the cycle, throughput, sync and detail tables; error notes; whether all ran clean
    (no error, the three modes' tokens equal). Aim verdicts go to aims[name] as (row, figure, met)."""
    cyc, thr, syn, det, errors, ok = [], [], [], [], [], True
    for r in results:
        bs, runs = r["bs"], r["runs"]
        label = [r["draft"], bs]
        name = f"{r['draft']} bs {bs}"
        good = {mode: m for mode, m in runs.items() if "error" not in m}
        for mode, m in runs.items():
            if "error" in m:
                errors.append(f"- {r['draft']}, bs={bs}, {mode}: `{m['error']}`")
                ok = False
        ms = {mode: good[mode]["cycle_ms"] if mode in good else None for mode in MODES}
        g = good.get("fused graph")
        graphs = bool(g and g.get("graphs"))
        # The three modes must emit the same tokens (greedy); compared among those that ran.
        tokens = [m["tokens"] for m in good.values()]
        same_tokens = all(t == tokens[0] for t in tokens) if len(tokens) >= 2 else None
        accepts = [m["accepts"] for m in good.values()]
        same_accepts = all(a == accepts[0] for a in accepts) if len(accepts) >= 2 else None
        if same_tokens is False:
            ok = False
        fusion = ratio(ms["unfused eager"], ms["fused graph"])
        fusion_ok = None if fusion is None or not graphs else fusion >= AIM_FUSION
        if fusion_ok is not None:
            aims["fusion"].append((name, f"{fusion:.2f}x", fusion_ok))
        partial = "" if len(tokens) == len(MODES) else f" ({len(tokens)} of {len(MODES)} ran)"
        cyc.append(label + [_f(g.get("full"), "{}") if g else "error",
                            *(_f(ms[mode], "{:.3f}") for mode in MODES),
                            _f(ratio(ms["fused eager"], ms["fused graph"]), "{:.2f}x"),
                            _f(ratio(ms["unfused eager"], ms["fused eager"]), "{:.2f}x"),
                            _f(fusion, "{:.2f}x"), _yes(fusion_ok),
                            ("-" if same_tokens is None else "yes" if same_tokens else "**NO**") + partial,
                            "-" if same_accepts is None else "yes" if same_accepts else "no"])

        t = target.get(bs, {"error": "not run"})
        tt = t.get("tok_s") if "error" not in t else None
        acc, gt = (g["mean_accept"], g["tok_s"]) if g else (None, None)
        ut = good["unfused eager"]["tok_s"] if "unfused eager" in good else None
        speed = ratio(gt, tt)
        tp_ok = None if acc is None or acc < AIM_ACCEPT or speed is None else speed > 1.0
        if tp_ok is not None:
            aims["tok_s"].append((name, f"{speed:.2f}x at accept {acc:.2f}", tp_ok))
        agree = f"{sum(a == b for a, b in zip(g['tokens'], t['tokens']))}/{bs}" if g and "error" not in t else "-"
        g_full, t_full = (g.get("full_tok_s") if g else None), (t.get("full_tok_s") if "error" not in t else None)
        thr.append(label + [_f(acc), _f(gt, "{:.0f}"), _f(ut, "{:.0f}"), _f(tt, "{:.0f}"), _f(speed, "{:.2f}x"),
                            _f(g_full, "{:.0f}"), _f(t_full, "{:.0f}"), _f(ratio(g_full, t_full), "{:.2f}x"),
                            _f(t.get("cycle_ms") if "error" not in t else None, "{:.3f}"),
                            f"n/a (accept < {AIM_ACCEPT:g})" if acc is not None and acc < AIM_ACCEPT else _yes(tp_ok),
                            agree])

        for mode, m in good.items():
            syn.append(label + [mode] + sync_cells(m["syncs"]))
            det.append(label + [mode, _f(m["prefill_ms"], "{:.1f}"), captured(m), m["warmup"],
                                m["syncs"]["cycles"], f"{m['full']} / {m['steps']}", _f(m["total_ms"], "{:.1f}"),
                                f"{m['mean_accept']:.2f}"])
    return cyc, thr, syn, det, errors, ok


def target_rows(target: dict) -> tuple[list, list, list[str]]:
    syn, det, errors = [], [], []
    for bs, t in target.items():
        label = ["target-only", bs, "graph"]
        if "error" in t:
            errors.append(f"- target-only, bs={bs}: `{t['error']}`")
            continue
        syn.append(label + sync_cells(t["syncs"]))
        det.append(label + [_f(t["prefill_ms"], "{:.1f}"), captured(t), t["warmup"], t["syncs"]["cycles"],
                            f"{t['full']} / {t['steps']}", _f(t["total_ms"], "{:.1f}"), "-"])
    return syn, det, errors


def aim_lines(aims: dict) -> list[str]:
    """One line per aim: the rows that meet it, and the figures of those that miss."""
    out = []
    for key, what in (("fusion", f"fused graph cycle >= {AIM_FUSION:g}x faster than unfused eager"),
                      ("tok_s", f"naive EAGLE tok/s above target-only where mean accept >= {AIM_ACCEPT:g}")):
        rows = aims[key]
        if not rows:
            out.append(f"- {what}: not measured (no CUDA graphs, or no row it applies to)")
            continue
        missed = [f"{n} ({fig})" for n, fig, met in rows if not met]
        out.append(f"- {what}: met in {len(rows) - len(missed)} of {len(rows)} rows"
                   + (f"; missed: {'; '.join(missed)}" if missed else ""))
    return out + ["", "The steered rows' cycles include the steering's own kernels (test-side, in every draft "
                      "forward); the plain rows time the engine's cycle alone, and their accept length (~1) is the "
                      "case where speculation cannot pay."]


# -- main --------------------------------------------------------------------------------------------

def parse_args(argv=None):
    ap = base_parser(__doc__, quick_help="32 new tokens, bs 1 and 64",
                     smoke_help="check the script on the CPU: tiny preset, bs 1 and 2, few tokens, no CUDA graphs")
    ap.add_argument("--smoke", dest="cpu_smoke", action="store_true", help="the same as --cpu-smoke")
    add_decode_options(ap, tokens=(64, 32, 12), batches=(BATCHES, QUICK_BATCHES, SMOKE_BATCHES), agreement=AGREEMENT,
                       sync_steps=(3, 2))
    ap.add_argument("--drafts", default="steered,plain",
                    help="comma-separated drafts to run: steered, plain (default both)")
    args = ap.parse_args(argv)
    resolve_decode_options(ap, args)
    args.drafts = comma_choices(ap, "--drafts", args.drafts, ("steered", "plain"))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device, preset = device_and_preset(args, "bench_naive_eagle")
    t_all = time.perf_counter()
    t0 = time.perf_counter()
    models = specverify.build_models(preset, seed=args.seed, compute_dtype="bfloat16", logits_dtype="bfloat16",
                                     device=device)
    build_s = time.perf_counter() - t0
    cfg = models.config
    prompts = make_prompts(max(args.batches), cfg.vocab_size, args.seed)

    drafts, oracle_ms = [], None
    if "steered" in args.drafts:
        # The steering pre-run: once, for the largest batch (a smaller batch takes a prefix of the
        # prompts, and the oracle is indexed by the request's place in the prompt list).
        steered, oracle_ms = steered_for(models, prompts, NAIVE, args, device)
        drafts.append((f"steered {args.agreement:g}", steered))
    if "plain" in args.drafts:
        drafts.append(("plain", models))
    print(f"built {preset} in {build_s:.1f} s" + (f"; steering pre-run {oracle_ms:.0f} ms" if oracle_ms else ""),
          file=sys.stderr, flush=True)

    target, results = {}, []
    for bs in sorted(set(args.batches)):
        batch = prompts[:bs]
        target[bs] = t = run_target(models, batch, args, device)
        print(f"  target-only bs={bs}: " + (t["error"] if "error" in t else
              f"{_f(t['cycle_ms'], '{:.3f}')} ms/step, {_f(t['tok_s'], '{:.0f}')} tok/s"), file=sys.stderr, flush=True)
        for draft, m in drafts:
            runs = {mode: run_naive(m, batch, mode, args, device) for mode in MODES}
            results.append({"draft": draft, "bs": bs, "runs": runs})
            print(f"  naive {draft} bs={bs}: " + "; ".join(f"{mode} {said(r)}" for mode, r in runs.items()),
                  file=sys.stderr, flush=True)

    aims = {"fusion": [], "tok_s": []}
    cyc, thr, syn, det, errors, ok = result_rows(results, target, aims)
    tsyn, tdet, terrors = target_rows(target)
    errors += terrors
    ok = ok and not terrors
    graph_mode = ("`cuda_graph=True`, but the CPU has no graphs: it runs the padded path eagerly, like fused eager"
                  if args.cpu_smoke else "`cuda_graph=True` (every bucket captured before timing)")
    steer = (f"steered to agreement {args.agreement:g} by tests/support/steering.py (target-only pre-run "
             f"{oracle_ms:.0f} ms, once, untimed)" if oracle_ms is not None else None)
    lines = header("Naive EAGLE: the fused cycle captured vs eager vs unfused, and vs target-only", args.cpu_smoke, {
        "Aims (issue 10)": AIMS_TEXT,
        "Model": f"`{preset}` preset (V={cfg.vocab_size}, H={cfg.hidden_size}, {cfg.num_layers} layers, "
                 f"{cfg.num_heads} heads / {cfg.num_kv_heads} KV heads x {cfg.head_dim}), bfloat16 compute and "
                 f"logits, seed {args.seed}, built in {build_s:.1f} s",
        "Decoding": f"greedy, no EOS, `SpecConfig(algorithm=\"naive_eagle\")` (D=2, S=1, topk=1), "
                    f"max_new_tokens={args.max_new_tokens}, bs {', '.join(map(str, sorted(set(args.batches))))}, "
                    f"prompts of {PROMPT_LENS[0]}-{PROMPT_LENS[1] - 1} seeded random ids, page size 1",
        "Drafts": "; ".join(x for x in (steer, "`plain`: the unsteered draft head" if "plain" in args.drafts else None)
                            if x),
        "Modes": f"fused graph = `fused=True`, {graph_mode}; fused eager = `fused=True, cuda_graph=False`; "
                 f"unfused eager = `fused=False` (verify, accept counts read back, draft-extend over the emitted "
                 f"tokens; always eager); all `pad_batches=True`",
        "Timing": step_timing(args),
        "Total run time": f"{time.perf_counter() - t_all:.0f} s",
    })
    lines += ["## Cycle: fused graph vs fused eager vs unfused eager", ""]
    lines += table(["draft", "bs", "timed cycles", "fused graph ms", "fused eager ms", "unfused eager ms",
                    "eager / graph", "unfused / fused eager", "unfused / fused graph", f"aim: >= {AIM_FUSION:g}x",
                    "same tokens (3 modes)", "same accept lengths"], cyc)
    lines += ["", "ms = time of the timed cycles run at the full batch (every request still running) / their "
              "number; one cycle = the target verify of [root, draft], accept, commit, the budget cut, the "
              "draft-extend and the next draft token, plus the host's page reservation and the one readback "
              "(unfused: also the mid-cycle read of the accept counts). `timed cycles` counts the fused graph run's "
              "full-batch cycles. `eager / graph` is what the capture saves, `unfused / fused eager` what the "
              "fusion saves without a graph, `unfused / fused graph` both (the aim). `same tokens` must be yes "
              "(greedy); `same accept lengths` is information only (the unfused draft-extend has another shape, "
              "so a bfloat16 near-tie in the draft may round apart)."]
    lines += ["", "## Throughput: naive EAGLE vs target-only (both captured)", ""]
    lines += table(["draft", "bs", "mean accept", "naive tok/s (fused graph)", "unfused eager tok/s",
                    "target-only tok/s", "naive / target", "full-batch naive tok/s", "full-batch target tok/s",
                    "full-batch naive / target", "target-only ms/step",
                    f"aim: naive > target (accept >= {AIM_ACCEPT:g})", "same tokens as target-only"], thr)
    lines += ["", "tok/s = tokens emitted in the timed steps / their total time (the tail where requests finish "
              "included; the aim is judged on it). full-batch tok/s = the same over the timed steps run while every "
              "request was still running (the steady state, before the tail: a speculative run ends when its "
              "slowest request does, and a request whose draft stops agreeing runs alone at the bucket's cost). mean accept = tokens emitted per request per cycle over the whole fused graph run (at "
              "most 2). `same tokens as target-only` counts requests whose greedy naive output equals the "
              "target-only one (information only: bfloat16 verify and decode shapes may round apart)."]
    lines += ["", "## Syncs per cycle", ""]
    lines += table(["draft", "bs", "mode", "cycles counted", "sync warnings / cycle", "readbacks / cycle",
                    "where (first 4)"], syn + tsyn)
    lines += ["", "sync warnings = warnings of `torch.cuda.set_sync_debug_mode(\"warn\")` over the counted steps: "
              "synchronizing calls other than the designated readback (`-` on the CPU, which has no such mode); "
              "readbacks = `decoder.readback.count`. The fused modes should show 0 and 1; the unfused form's "
              "mid-cycle read of the accept counts is a sync of its own by design."]
    lines += ["", "## Where the time goes", ""]
    lines += table(["draft", "bs", "mode", "prefill ms", "captures / ms", "warm-up steps", "sync steps",
                    "timed full / all steps", "timed ms", "mean accept"], det + tdet)
    lines += ["", CAPTURES_NOTE] + closing_lines(aim_lines(aims), args.cpu_smoke, errors)
    write_results(lines, out_dir(args.out, args.cpu_smoke), "naive_eagle", args.cpu_smoke)
    if not ok:
        print("bench_naive_eagle: a run failed, or the fused graph, fused eager and unfused runs emitted different "
              "tokens (see the tables); the timings were recorded, but this is a correctness bug to chase in the "
              "tests", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
