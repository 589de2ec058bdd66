"""The speculative cycle on the device (issue 9): captured cycle vs eager, speculative vs target-only
tok/s, syncs per cycle, and the paged attention kernel's HBM bandwidth.

The `small` preset (V=32000, H=512, 8 layers; bfloat16 compute and logits), greedy, EAGLE S=3 at
topk 1 (D=4) and topk 4 (D=8), bs 1, 8, 32 and 64, seeded random prompts of 16-63 tokens and 64
new tokens per request (no EOS). The decoders are driven step by step
(`SpecDecoder` / `TargetOnlyDecoder`, `start()` then `step()` until none runs):

1. After `start()` (the prefill, not timed) every CUDA-graph bucket the run can meet (the batch
   size's bucket and all smaller ones, as requests finish) is captured up front, as a serving
   engine does at start-up; its time is reported apart. Then `--warmup` steps (untimed), then
   `--sync-steps` steps under `torch.cuda.set_sync_debug_mode("warn")`, counting the sync
   warnings and `decoder.readback.count` (the designated readback lowers the mode around its own
   wait, so a warning is a sync that is not the readback), then every remaining step is timed with
   a pair of CUDA events around `decoder.step()` (synchronized before and after the timed region).
2. ms per cycle = total time of the timed steps run at the full batch (every request still
   running) / their number; graph = `SpecConfig(cuda_graph=True)`, eager =
   `SpecConfig(cuda_graph=False)`, both at bucket shapes (`pad_batches=True`), so the eager path
   computes what the graph replays; both must emit identical tokens.
3. tok/s = tokens emitted in the timed steps / their total time (the tail, where the batch
   shrinks as requests finish, included), for speculative decoding and for target-only decoding
   (`TargetOnlyDecoder`, itself graph-captured) at the same batch size and budget. Mean accept
   length = tokens emitted per request per cycle, over all cycles.
4. The attention kernel: `specverify.kernels.attention.paged_attention_impl`, decode (one query per
   request) at 8192 live tokens, bs 64, the small preset's head shape in bfloat16, page size 1 and
   16 with the pages in shuffled order (an allocator after churn) and a contiguous layout; achieved
   bandwidth = bytes read (K and V of the live lengths + the slot table, each once) / time per call,
   as a fraction of the device's peak HBM bandwidth.

Draft agreement: a random draft head almost never agrees with the target, so the draft is steered
by `tests/support/steering.py` (it proposes the target's greedy token with probability 0.7: mean
accept length ~2.5 for both trees). The steering needs the target's greedy continuation: the
benchmark runs that target-only pre-run once, before anything is timed, and reports its time
apart. The steering adds its own small kernels to every draft forward (test-side work a real draft
does not do), so each case also runs with the plain (unsteered) draft: its cycle time is the
engine's alone, and its accept length ~1 shows the other end of the throughput comparison.

Run on a GPU machine from the repository root:

    PYTHONPATH=. python3 benchmarks/bench_device_cycle.py           # ~1-3 minutes on an H100
    PYTHONPATH=. python3 benchmarks/bench_device_cycle.py --quick   # 48 tokens, bs 1, 8, 64
    python3 benchmarks/bench_device_cycle.py --smoke --out /tmp/x   # the CPU: tiny preset, no graphs
"""

from __future__ import annotations

import dataclasses
import gc
import math
import sys
import time
import traceback
import warnings

from _common import (CAPTURES_NOTE, base_parser, closing_lines, device_and_preset,  # puts the repo root on sys.path
                     header, out_dir, peak_bandwidth, step_timing, table, write_results)

import torch  # noqa: E402

import specverify  # noqa: E402
from specverify.engine.requests import new_requests  # noqa: E402
from specverify.engine.sampling import SamplingParams  # noqa: E402
from specverify.engine.spec_config import SpecConfig  # noqa: E402
from specverify.engine.speculative import SpecDecoder  # noqa: E402
from specverify.engine.target_only import TargetOnlyDecoder  # noqa: E402
from specverify.kernels.attention import paged_attention_impl  # noqa: E402
from specverify.kernels.cuda_graph import bucket_for  # noqa: E402
from tests.support.steering import (follows_oracle, lookahead, oracle_of_outputs, oracle_sequences,  # noqa: E402
                                    steered_models)

SPECS = (("S3 k1 D4", SpecConfig(num_steps=3, topk=1)),
         ("S3 k4 D8", SpecConfig(num_steps=3, topk=4, num_draft_tokens=8)))
BATCHES = (1, 8, 32, 64)
QUICK_BATCHES = (1, 8, 64)
SMOKE_BATCHES = (1, 2)
QUICK_PLAIN_BATCHES = (8,)      # --quick: the plain (unsteered) draft at this batch size only
PROMPT_LENS = (16, 64)          # prompt lengths are drawn from [16, 64)
AGREEMENT = 0.7

# The aims (the cycle-time one is `aim_ms`).
AIM_SPEEDUP = 5.0                        # captured >= 5x faster than eager
AIM_ACCEPT = 2.0                         # speculative tok/s > target-only when mean accept >= 2
AIMS_TEXT = ("captured cycle <= 1 ms at bs <= 8 and <= 2 ms at bs 64; captured >= 5x faster than eager; "
             "speculative tok/s above target-only whenever mean accept length >= 2")

# Peak HBM bandwidth (TB/s) by device name; --peak-tbps overrides.


def aim_ms(bs: int) -> float | None:
    """The captured cycle's aim: <= 1 ms at bs <= 8, <= 2 ms at bs 64 (none stated between)."""
    return 1.0 if bs <= 8 else 2.0 if bs == 64 else None


def make_prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    """n seeded random prompts of irregular lengths; a batch of bs takes the first bs of them."""
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(*PROMPT_LENS, (n,), generator=gen).tolist()
    return [torch.randint(0, vocab, (m,), generator=gen).tolist() for m in lens]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def release(device: str) -> None:
    """Drop what a finished run left (its graphs, pools and caches) before the next one."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


class StepClock:
    """Times single calls: a pair of CUDA events on the device (read after the region), the host
    clock on the CPU."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.marks = []

    def time(self, fn) -> None:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            self.marks.append((start, end))
        else:
            t0 = time.perf_counter()
            fn()
            self.marks.append((time.perf_counter() - t0) * 1e3)

    def ms(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [s.elapsed_time(e) for s, e in self.marks]
        return list(self.marks)


# -- driving a decoder ------------------------------------------------------------------------------

def precapture(dec, bs: int) -> int:
    """Capture every bucket the run can meet (bucket(bs) and all below) before anything is timed.
    The runner's capture uses pad-row inputs only, as it does when `run` meets a new bucket."""
    runner = dec.runner
    if not runner.use_graphs:
        return 0
    dec.cache.table.flush()
    top = bucket_for(bs, runner.buckets)
    for b in runner.buckets:
        if b <= top and b not in runner.graphs:
            runner._capture(b)
    return runner.captures


def emitted(reqs) -> int:
    return sum(len(r.output) for r in reqs)


def count_syncs(dec, steps: int, device: str) -> dict:
    """Run up to `steps` steps under sync debug mode "warn": sync warnings and readbacks."""
    rb0, n = dec.readback.count, 0
    if device != "cuda":     # no sync debug mode on the CPU: the readbacks only
        for _ in range(steps):
            if dec.running():
                dec.step()
                n += 1
        return {"cycles": n, "warnings": None, "readbacks": dec.readback.count - rb0, "where": []}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                if dec.running():
                    dec.step()
                    n += 1
        finally:
            torch.cuda.set_sync_debug_mode(0)
    hits = [w for w in caught if "synchroniz" in str(w.message).lower()]
    where = sorted({f"{w.filename.rsplit('/', 1)[-1]}:{w.lineno}" for w in hits})
    return {"cycles": n, "warnings": len(hits), "readbacks": dec.readback.count - rb0, "where": where}


def drive(dec, reqs, bs: int, args, device: str) -> dict:
    """After `start()`: capture, warm up, count syncs, then time every remaining step."""
    t0 = time.perf_counter()
    captures = precapture(dec, bs)
    sync(device)
    capture_ms = (time.perf_counter() - t0) * 1e3
    warm = 0
    for _ in range(args.warmup):
        if dec.running():
            dec.step()
            warm += 1
    syncs = count_syncs(dec, args.sync_steps, device)
    clock, steps = StepClock(device), []
    sync(device)
    while dec.running():
        live, before = len(dec.running()), emitted(reqs)
        clock.time(dec.step)
        steps.append((live, emitted(reqs) - before))
    times = clock.ms()
    late = dec.runner.captures - captures if dec.runner.use_graphs else 0   # should be 0: all captured before
    full = [t for t, (live, _) in zip(times, steps) if live == bs]
    full_tokens = sum(n for (live, n) in steps if live == bs)
    total_ms = sum(times)
    return {"capture_ms": capture_ms, "captures": captures, "late_captures": late, "warmup": warm, "syncs": syncs,
            "steps": len(steps), "full": len(full), "total_ms": total_ms,
            "cycle_ms": sum(full) / len(full) if full else None,
            "tok_s": sum(n for _, n in steps) / total_ms * 1e3 if total_ms > 0 else None,
            "full_tok_s": full_tokens / sum(full) * 1e3 if full and sum(full) > 0 else None,
            "tokens": [list(r.output) for r in reqs]}


def steered_for(models, prompts, specs, args, device: str):
    """(models with every draft steered to args.agreement, ms of the steering's target-only greedy
    pre-run): the pre-run runs once, for the largest batch and the widest of `specs`' regions (a
    smaller batch takes a prefix of the prompts; the oracle is indexed by the place in the list)."""
    oracle, oracle_ms = pre_run_oracle(models, prompts, specs, args, device)
    return steered_models(models, prompts, args.max_new_tokens, agreement=args.agreement, spec=specs,
                          oracle=oracle), oracle_ms


def pre_run_oracle(models, prompts, specs, args, device: str) -> tuple[torch.Tensor, float]:
    """(the steering oracle of `prompts`, ms of its target-only greedy pre-run): the pre-run of
    `steered_for`, for callers that steer each run by an oracle of its own (`run_on_path`)."""
    t0 = time.perf_counter()
    oracle = oracle_sequences(models, prompts, lookahead(models, prompts, args.max_new_tokens, specs))
    sync(device)
    return oracle, (time.perf_counter() - t0) * 1e3


def run_on_path(models, oracle: torch.Tensor, prompts, spec: SpecConfig, args, device: str,
                tries: int = 3) -> tuple[dict, torch.Tensor]:
    """(`run_spec`'s result with every draft steered to args.agreement, the oracle that run used).

    The pre-run decodes all prompts in one batch; a run verifies S + 1 rows a request at its own
    batch. Where the target's matmuls round with their row count (cuBLAS picks its kernel by M: on
    an H200 the medium preset's down projection, K 5632, rounds otherwise at M 1, 4 and 8 than at
    64; results/oracle_drift-medium-nvidia-h200.md; on the H100s the runs stayed on it), a run
    leaves the oracle early and its drafts are then never steered (accept ~1, a figure of the
    oracle, not of the engine). Then the oracle's rows become that run's own tokens (the target's
    greedy continuation as this decoder computes it) and the run is made again, until a run emits
    exactly its oracle, at most `tries` runs. result["oracle_runs"]: the runs made;
    result["on_oracle"]: whether the last one emitted its oracle."""
    for n in range(1, tries + 1):
        steered = steered_models(models, prompts, args.max_new_tokens, agreement=args.agreement, spec=spec,
                                 oracle=oracle)
        res = run_spec(steered, prompts, spec, True, args, device)
        del steered
        if "error" in res:
            return res, oracle
        res.update(oracle_runs=n, on_oracle=follows_oracle(oracle, prompts, res["tokens"]))
        if res["on_oracle"]:
            break
        oracle = oracle_of_outputs(oracle, prompts, res["tokens"])
    return res, oracle


def guarded(fn) -> dict:
    """fn()'s result, or {"error": ...} (the other runs still go on)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a failing run is reported in the table
        traceback.print_exc()
        text = str(e).splitlines()[0][:160] if str(e) else ""
        return {"error": f"{type(e).__name__}: {text}"}


def run_spec(models, prompts, spec: SpecConfig, use_graph: bool, args, device: str) -> dict:
    def go():
        cfg = dataclasses.replace(spec, cuda_graph=use_graph)
        dec = SpecDecoder(models, cfg, SamplingParams(), seed=args.seed, eos_token_id=None, pad_batches=True)
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


def run_target(models, prompts, args, device: str) -> dict:
    def go():
        dec = TargetOnlyDecoder(models, SamplingParams(), seed=args.seed, eos_token_id=None, cuda_graph=True,
                                pad_batches=True)
        reqs = new_requests(prompts, [args.max_new_tokens] * len(prompts))
        t0 = time.perf_counter()
        dec.start(reqs)
        sync(device)
        prefill_ms = (time.perf_counter() - t0) * 1e3
        res = drive(dec, reqs, len(prompts), args, device)
        res.update(prefill_ms=prefill_ms, graphs=dec.use_graphs)
        return res
    res = guarded(go)
    release(device)
    return res


# -- the attention kernel ---------------------------------------------------------------------------

def attention_case(cfg, bs: int, ctx: int, page_size: int, shuffled: bool, iters: int, device: str,
                   seed: int) -> dict:
    """Decode attention (q = 1) of bs requests over ctx live tokens each; time per call and bytes."""
    nkv, nh, hd = cfg.num_kv_heads, cfg.num_heads, cfg.head_dim
    dt = torch.bfloat16
    gen = torch.Generator().manual_seed(seed)
    dgen = torch.Generator(device=device).manual_seed(seed)
    per_req = -(-ctx // page_size)
    num_pages = 1 + bs * per_req                         # page 0 is the sink, as in the slot table
    order = torch.randperm(num_pages - 1, generator=gen) + 1 if shuffled else torch.arange(1, num_pages)
    pages = order.view(bs, per_req)
    slots = (pages[:, :, None] * page_size + torch.arange(page_size)).reshape(bs, -1)[:, :ctx]
    req_to_token = slots.contiguous().to(device)         # [bs, ctx] int64, row b = request b
    num_slots = num_pages * page_size
    k = torch.randn((num_slots, nkv, hd), generator=dgen, device=device, dtype=dt)
    v = torch.randn((num_slots, nkv, hd), generator=dgen, device=device, dtype=dt)
    q = torch.randn((bs, 1, nh, hd), generator=dgen, device=device, dtype=dt)
    rows = torch.arange(bs, device=device)
    kv_lens = torch.full((bs,), ctx - 1, dtype=torch.int64, device=device)   # live length = ctx - 1 + 1
    q_lens = torch.ones(bs, dtype=torch.int64, device=device)
    mask = torch.ones((bs, 1, 1), dtype=torch.bool, device=device)
    scale = 1.0 / math.sqrt(hd)

    def call(impl="auto", n=bs):
        return paged_attention_impl(q[:n], k, v, req_to_token, rows[:n], kv_lens[:n], q_lens[:n], mask[:n], 0,
                                    scale, impl=impl)
    # A check of the first two requests against the torch path (benchmarks do not gate, they flag).
    n_chk = min(bs, 2)
    diff = (call(n=n_chk).float() - call("torch", n_chk).float()).abs().max().item()
    for _ in range(3):
        call()
    sync(device)
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            call()
        end.record()
        torch.cuda.synchronize()
        per_call_ms = start.elapsed_time(end) / iters
    else:
        t0 = time.perf_counter()
        for _ in range(iters):
            call()
        per_call_ms = (time.perf_counter() - t0) * 1e3 / iters
    kv_bytes = bs * ctx * nkv * hd * k.element_size() * 2
    table_bytes = bs * ctx * req_to_token.element_size()
    del k, v
    release(device)
    return {"page_size": page_size, "layout": "shuffled pages" if shuffled else "contiguous",
            "ms": per_call_ms, "bytes": kv_bytes + table_bytes, "kv_bytes": kv_bytes, "table_bytes": table_bytes,
            "max_diff": diff}


def bench_attention(cfg, args, device: str) -> list[dict]:
    cases = [(1, True), (16, True), (1, False)]
    return [guarded(lambda ps=ps, sh=sh: attention_case(cfg, args.attn_bs, args.attn_context, ps, sh,
                                                        args.attn_iters, device, args.seed))
            for ps, sh in cases]


# -- report -----------------------------------------------------------------------------------------

def _f(x, fmt="{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def _yes(ok: bool | None) -> str:
    return "-" if ok is None else ("yes" if ok else "**no**")


def cycle_rows(results, target, aims: dict) -> tuple[list, list, list, list, list[str], bool]:
    """Rows of the cycle, throughput, sync and detail tables; error notes; whether all ran clean.
    Each aim's verdicts go to aims[name] as (row label, figure, met)."""
    cyc, thr, syn, det, errors, ok = [], [], [], [], [], True
    for r in results:
        g, e, bs = r["graph"], r["eager"], r["bs"]
        t = target.get(bs, {"error": "not run"})
        label = [r["spec"], r["draft"], bs]
        name = f"{r['spec']} {r['draft']} bs {bs}"
        for mode, m in (("graph", g), ("eager", e)):
            if "error" in m:
                errors.append(f"- {r['spec']}, {r['draft']}, bs={bs}, {mode}: `{m['error']}`")
                ok = False
        both = "error" not in g and "error" not in e
        same = both and g["tokens"] == e["tokens"]
        ok = ok and (same or not both)
        gms = g.get("cycle_ms") if "error" not in g else None
        ems = e.get("cycle_ms") if "error" not in e else None
        speedup = ems / gms if gms and ems else None
        limit = aim_ms(bs)
        ms_ok = None if limit is None or gms is None or not g.get("graphs") else gms <= limit
        sp_ok = None if speedup is None or not g.get("graphs") else speedup >= AIM_SPEEDUP
        if ms_ok is not None:
            aims["ms"].append((name, f"{gms:.3f} ms", ms_ok))
        if sp_ok is not None:
            aims["speedup"].append((name, f"{speedup:.1f}x", sp_ok))
        cyc.append(label + [_f(g.get("full"), "{}") if "error" not in g else "error",
                            _f(gms, "{:.3f}"), _f(ems, "{:.3f}"), _f(speedup, "{:.1f}x"),
                            ("<= " + _f(limit, "{:g}") + " ms: " + _yes(ms_ok)) if limit else "-",
                            _yes(sp_ok), ("yes" if same else "**NO**") if both else "-"])
        acc = g.get("mean_accept") if "error" not in g else None
        gt, tt = (g.get("tok_s") if "error" not in g else None), (t.get("tok_s") if "error" not in t else None)
        ratio = gt / tt if gt and tt else None
        tp_ok = None if acc is None or acc < AIM_ACCEPT or ratio is None else ratio > 1.0
        if tp_ok is not None:
            aims["tok_s"].append((name, f"{ratio:.2f}x at accept {acc:.2f}", tp_ok))
        agree = None
        if "error" not in g and "error" not in t:
            agree = f"{sum(a == b for a, b in zip(g['tokens'], t['tokens']))}/{bs}"
        thr.append(label + [_f(acc), _f(gt, "{:.0f}"), _f(tt, "{:.0f}"), _f(ratio, "{:.2f}x"),
                            _f(t.get("cycle_ms") if "error" not in t else None, "{:.3f}"),
                            "n/a (accept < 2)" if acc is not None and acc < AIM_ACCEPT else _yes(tp_ok),
                            agree or "-"])
        for mode, m in (("graph", g), ("eager", e)):
            if "error" in m:
                continue
            s = m["syncs"]
            syn.append(label + [mode] + sync_cells(s))
            det.append(label + [mode, _f(m["prefill_ms"], "{:.1f}"), captured(m),
                                m["warmup"], s["cycles"], f"{m['full']} / {m['steps']}", _f(m["total_ms"], "{:.1f}")])
    return cyc, thr, syn, det, errors, ok


def sync_cells(s: dict) -> list:
    """cycles counted, sync warnings / cycle, readbacks / cycle, where the first warnings came from."""
    n = s["cycles"]
    per = (lambda x: _f(x / n)) if n else (lambda x: "-")
    return [n, "-" if s["warnings"] is None else per(s["warnings"]), per(s["readbacks"]),
            ", ".join(s["where"][:4]) or "-"]


def captured(m: dict) -> str:
    text = f"{m['captures']} / {m['capture_ms']:.0f}"
    return text + (f" (**+{m['late_captures']} while timed**)" if m["late_captures"] else "")


def target_rows(target: dict) -> tuple[list, list, list[str]]:
    syn, det, errors = [], [], []
    for bs, t in target.items():
        label = ["target-only", "-", bs, "graph"]
        if "error" in t:
            errors.append(f"- target-only, bs={bs}: `{t['error']}`")
            continue
        s = t["syncs"]
        syn.append(label + sync_cells(s))
        det.append(label + [_f(t["prefill_ms"], "{:.1f}"), captured(t),
                            t["warmup"], s["cycles"], f"{t['full']} / {t['steps']}", _f(t["total_ms"], "{:.1f}")])
    return syn, det, errors


def attention_rows(att: list[dict], peak: float | None, args) -> tuple[list, list[str], bool]:
    rows, errors, ok = [], [], True
    for a in att:
        if "error" in a:
            errors.append(f"- attention: `{a['error']}`")
            ok = False
            continue
        tbps = a["bytes"] / (a["ms"] * 1e-3) / 1e12
        close = a["max_diff"] <= 2e-2
        ok = ok and close
        rows.append([a["page_size"], a["layout"], f"{a['kv_bytes'] / 2**20:.1f} + {a['table_bytes'] / 2**20:.1f}",
                     f"{a['ms'] * 1e3:.1f}", f"{tbps:.2f}", _f(tbps / peak if peak else None, "{:.0%}"),
                     f"{a['max_diff']:.1e}" + ("" if close else " **off**")])
    return rows, errors, ok


def aim_lines(aims: dict) -> list[str]:
    """One line per aim: rows that meet it, and the figures of those that miss."""
    out = []
    for key, what in (("ms", "captured cycle <= 1 ms at bs <= 8, <= 2 ms at bs 64"),
                      ("speedup", f"captured >= {AIM_SPEEDUP:g}x faster than eager"),
                      ("tok_s", f"speculative tok/s above target-only where mean accept >= {AIM_ACCEPT:g}")):
        rows = aims[key]
        if not rows:
            out.append(f"- {what}: not measured (no CUDA graphs, or no row it applies to)")
            continue
        missed = [f"{n} ({fig})" for n, fig, met in rows if not met]
        out.append(f"- {what}: met in {len(rows) - len(missed)} of {len(rows)} rows"
                   + (f"; missed: {'; '.join(missed)}" if missed else ""))
    return out + ["", "The steered rows' cycles include the steering's own kernels (test-side, in every draft "
                      "forward); the plain rows time the engine's cycle alone."]


def parse_args(argv=None):
    ap = base_parser(__doc__, quick_help="48 new tokens, bs 1, 8 and 64",
                     smoke_help="check the script on the CPU: tiny preset, bs 1 and 2, few tokens, no CUDA graphs")
    ap.add_argument("--smoke", dest="cpu_smoke", action="store_true", help="the same as --cpu-smoke")
    ap.add_argument("--max-new-tokens", type=int, help="new tokens per request (default 64; 48 --quick; 12 --smoke)")
    ap.add_argument("--batches", help="comma-separated batch sizes (default 1,8,32,64)")
    ap.add_argument("--plain-batches", help="comma-separated batch sizes of the plain-draft rows "
                                            "(default: all of --batches; 8 with --quick; 'none' for none)")
    ap.add_argument("--agreement", type=float, default=AGREEMENT, help="steered draft agreement (default 0.7)")
    ap.add_argument("--warmup", type=int, help="untimed steps after the capture (default 2; 1 --smoke)")
    ap.add_argument("--sync-steps", type=int, help="steps counted under the sync debug mode (default 3; 2 --smoke)")
    ap.add_argument("--attn-context", type=int, help="live tokens per request of the attention section (default 8192)")
    ap.add_argument("--attn-bs", type=int, help="requests of the attention section (default 64)")
    ap.add_argument("--attn-iters", type=int, help="timed calls per attention case (default 20)")
    ap.add_argument("--peak-tbps", type=float, help="the device's peak HBM bandwidth in TB/s (default: from the name)")
    ap.add_argument("--seed", type=int, default=0, help="model and prompt seed")
    args = ap.parse_args(argv)
    smoke = args.cpu_smoke
    args.max_new_tokens = args.max_new_tokens or (12 if smoke else 48 if args.quick else 64)
    if args.batches:
        args.batches = tuple(int(b) for b in args.batches.split(","))
    else:
        args.batches = SMOKE_BATCHES if smoke else QUICK_BATCHES if args.quick else BATCHES
    if args.plain_batches == "none":
        args.plain_batches = ()
    elif args.plain_batches:
        args.plain_batches = tuple(int(b) for b in args.plain_batches.split(","))
    else:
        args.plain_batches = QUICK_PLAIN_BATCHES if args.quick and not smoke else args.batches
    args.warmup = 1 if smoke and args.warmup is None else 2 if args.warmup is None else args.warmup
    args.sync_steps = 2 if smoke and args.sync_steps is None else 3 if args.sync_steps is None else args.sync_steps
    args.attn_context = args.attn_context or (256 if smoke else 8192)
    args.attn_bs = args.attn_bs or (2 if smoke else 64)
    args.attn_iters = args.attn_iters or (3 if smoke else 20)
    if min(args.max_new_tokens, args.attn_context, args.attn_bs, args.attn_iters, *args.batches,
           *args.plain_batches) < 1 \
            or min(args.warmup, args.sync_steps) < 0:
        ap.error("sizes must be >= 1 (--warmup / --sync-steps >= 0)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device, preset = device_and_preset(args, "bench_device_cycle")
    t_all = time.perf_counter()
    t0 = time.perf_counter()
    models = specverify.build_models(preset, seed=args.seed, compute_dtype="bfloat16", logits_dtype="bfloat16",
                                     device=device)
    build_s = time.perf_counter() - t0
    cfg = models.config
    prompts = make_prompts(max(args.batches + args.plain_batches), cfg.vocab_size, args.seed)

    # The steering pre-run: once, for the largest batch (a smaller batch is a prefix of its prompts,
    # and the oracle is indexed by the request's place in the prompt list).
    steered, oracle_ms = steered_for(models, prompts, [s for _, s in SPECS], args, device)
    print(f"built {preset} in {build_s:.1f} s; steering pre-run {oracle_ms:.0f} ms", file=sys.stderr, flush=True)

    target, results = {}, []
    cases = []
    for bs in sorted(set(args.batches) | set(args.plain_batches)):
        drafts = ([(f"steered {args.agreement:g}", steered)] if bs in args.batches else []) + \
                 ([("plain", models)] if bs in args.plain_batches else [])
        cases += [(name, spec, draft, m, bs) for draft, m in drafts for name, spec in SPECS]
    for name, spec, draft, m, bs in cases:
        batch = prompts[:bs]
        if bs not in target:
            target[bs] = run_target(models, batch, args, device)
            t = target[bs]
            said = t["error"] if "error" in t else \
                f"{_f(t['cycle_ms'], '{:.3f}')} ms/step, {_f(t['tok_s'], '{:.0f}')} tok/s"
            print(f"  target-only bs={bs}: {said}", file=sys.stderr, flush=True)
        graph = run_spec(m, batch, spec, not args.cpu_smoke, args, device)
        eager = run_spec(m, batch, spec, False, args, device)
        results.append({"spec": name, "draft": draft, "bs": bs, "graph": graph, "eager": eager})
        said = {k: (v["error"] if "error" in v else f"{_f(v['cycle_ms'], '{:.3f}')} ms/cycle, "
                    f"accept {v['mean_accept']:.2f}") for k, v in (("graph", graph), ("eager", eager))}
        print(f"  {name} {draft} bs={bs}: graph {said['graph']}; eager {said['eager']}", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    att = bench_attention(cfg, args, device)
    att_s = time.perf_counter() - t0
    name = "cpu" if args.cpu_smoke else torch.cuda.get_device_name()
    peak, peak_src = (None, "the CPU: no HBM figure") if args.cpu_smoke else peak_bandwidth(name, args.peak_tbps)

    aims = {"ms": [], "speedup": [], "tok_s": []}
    cyc, thr, syn, det, errors, ok = cycle_rows(results, target, aims)
    tsyn, tdet, terrors = target_rows(target)
    arows, aerrors, aok = attention_rows(att, peak, args)
    errors += terrors + aerrors
    ok = ok and aok and not terrors
    graph_mode = ("`cuda_graph=True`, but the CPU has no graphs: both columns run the padded path eagerly"
                  if args.cpu_smoke else "`cuda_graph=True` (every bucket captured before timing)")
    lines = header("The speculative cycle on the device: captured vs eager, vs target-only, syncs, "
                   "attention bandwidth", args.cpu_smoke, {
        "Aims (issue 9)": AIMS_TEXT,
        "Model": f"`{preset}` preset (V={cfg.vocab_size}, H={cfg.hidden_size}, {cfg.num_layers} layers, "
                 f"{cfg.num_heads} heads / {cfg.num_kv_heads} KV heads x {cfg.head_dim}), bfloat16 compute and "
                 f"logits, seed {args.seed}, built in {build_s:.1f} s",
        "Decoding": f"greedy, no EOS, EAGLE {' and '.join(n for n, _ in SPECS)} (S steps, topk k, D draft tokens), "
                    f"max_new_tokens={args.max_new_tokens}, prompts of {PROMPT_LENS[0]}-{PROMPT_LENS[1] - 1} "
                    f"seeded random ids, page size 1",
        "Draft": f"steered to agreement {args.agreement:g} by tests/support/steering.py (target-only pre-run "
                 f"{oracle_ms:.0f} ms, once, untimed); `plain` rows: the unsteered draft head "
                 f"(bs {', '.join(map(str, args.plain_batches)) or 'none'})",
        "Modes": f"graph = {graph_mode}; eager = `cuda_graph=False`; both `pad_batches=True`",
        "Timing": step_timing(args),
        "Total run time": f"{time.perf_counter() - t_all:.0f} s",
    })
    lines += ["## Cycle: captured graph vs eager", ""]
    lines += table(["spec", "draft", "bs", "timed cycles", "graph ms/cycle", "eager ms/cycle", "speed-up",
                    "aim: graph ms", "aim: >= 5x", "same tokens"], cyc)
    lines += ["", "ms/cycle = time of the timed cycles run at the full batch (every request still running) / "
              "their number; one cycle = verify, accept, commit, EOS / budget cut, draft-extend and the S-1 draft "
              "steps, plus the host's page reservation and the one readback. `timed cycles` counts those "
              "full-batch cycles (graph run). The ms aim is stated for bs <= 8 and bs 64 only."]
    lines += ["", "## Throughput: speculative vs target-only (both captured)", ""]
    lines += table(["spec", "draft", "bs", "mean accept", "spec tok/s", "target-only tok/s", "spec / target",
                    "target-only ms/step", "aim: spec > target", "same tokens as target-only"], thr)
    lines += ["", "tok/s = tokens emitted in the timed steps / their total time (the tail where requests finish "
              "included); the speculative figures are the graph runs. mean accept = tokens emitted per request per "
              "cycle over the whole run. `same tokens as target-only` counts requests whose greedy speculative output "
              "equals the target-only one (information only: bfloat16 verify and decode shapes may round apart)."]
    lines += ["", "## Syncs per cycle", ""]
    lines += table(["spec", "draft", "bs", "mode", "cycles counted", "sync warnings / cycle", "readbacks / cycle",
                    "where (first 4)"], syn + tsyn)
    lines += ["", "sync warnings = warnings of `torch.cuda.set_sync_debug_mode(\"warn\")` over the counted steps: "
              "synchronizing calls other than the designated readback, whose wait lowers the mode itself "
              "(`-` on the CPU, which has no such mode); readbacks = `decoder.readback.count`. The aim is 0 and 1."]
    lines += ["", f"## Paged attention kernel: decode, bs {args.attn_bs}, {args.attn_context} live tokens", ""]
    lines += table(["page size", "layout", "MiB read (K+V + table)", "us / call", "TB/s", "of peak",
                    "max diff vs torch (2 requests)"], arows)
    lines += ["", f"`paged_attention_impl` with one query per request, {cfg.num_heads} heads / {cfg.num_kv_heads} KV "
              f"heads x {cfg.head_dim} in bfloat16, one layer; bytes = K and V of the live lengths plus the slot "
              f"table, each counted once (queries and outputs are < 0.1%); time per call over {args.attn_iters} calls "
              f"after 3 warm-up calls (the call's output allocation and mask cast included). Peak: "
              f"{_f(peak, '{:g} TB/s')} ({peak_src}). `shuffled pages`: the pool's pages in a random order "
              f"(page size 1 = every token its own slot anywhere); `contiguous`: each request's tokens in "
              f"consecutive slots (any page size). Section time {att_s:.1f} s."]
    lines += ["", "## Where the time goes", ""]
    lines += table(["spec", "draft", "bs", "mode", "prefill ms", "captures / ms", "warm-up steps", "sync steps",
                    "timed full / all steps", "timed ms"], det + tdet)
    lines += ["", CAPTURES_NOTE] + closing_lines(aim_lines(aims), args.cpu_smoke, errors)
    write_results(lines, out_dir(args.out, args.cpu_smoke), "device_cycle", args.cpu_smoke)
    if not ok:
        print("bench_device_cycle: a run failed, the graph and eager runs emitted different tokens, or the attention "
              "kernel disagreed with the torch path (see the tables); the timings were recorded, but this is a "
              "correctness bug to chase in the tests", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
