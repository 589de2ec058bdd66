"""Speculation that pays (issue 25): the aims table, measured.

Small preset (launch-bound, ~80 MB of bfloat16 weights) and medium preset (memory-bound, ~2.4 GB),
bfloat16 compute and logits, greedy, every decoder captured (`cuda_graph=True`, bucket shapes),
drafts steered to agreement 0.7 by tests/support/steering.py (the steering pre-run is untimed; a run
whose greedy tokens leave the pre-run's is made again, steered by its own: `run_on_path`).
Each run is driven as in bench_device_cycle.py: capture every bucket first, 2 warm-up steps, 3
sync-counting steps, then every step timed by CUDA events; ms / step = mean of the steps run at
the full batch, tok/s = tokens emitted in the timed steps / their time.

Rows of the table:
- target-only step, small, bs 1 / 8: ms per captured step;
- EAGLE S3 k1 and S3 k4 D8 cycle / target-only step, small, bs 1 / 8 (the ratio of ms per cycle to
  ms per target step at the same batch);
- speculative / target-only tok/s, small, S3 k1, bs 1 / 8; naive EAGLE / target-only, small, bs 1 / 64;
- medium target-only step at bs 1 vs its HBM bound: bytes of the weights one forward reads (every
  layer's projections and norms, the final norm and the lm_head; the embedding's few rows and the
  K/V of a short context are left out) / the device's peak bandwidth;
- medium speculative / target-only tok/s at bs 1 and 8: EAGLE S3 k1, MTP S3, DFlash B4.

    PYTHONPATH=. python3 benchmarks/bench_aims.py              # ~5 minutes on an H100
    PYTHONPATH=. python3 benchmarks/bench_aims.py --skip-medium
    PYTHONPATH=. python3 benchmarks/bench_aims.py --repeat 3    # every decoder 3 times in turn; figures from the median run
"""

from __future__ import annotations

import argparse
import sys
import time

from _common import graph_ms, header, out_dir, peak_bandwidth, step_timing, table, write_results  # repo root on sys.path

import torch  # noqa: E402

import specverify  # noqa: E402
from specverify.engine.device_state import extend_batch  # noqa: E402
from specverify.engine.side_stream import SideStream  # noqa: E402
from specverify.engine.spec_config import SpecConfig  # noqa: E402
from specverify.ops import draft_token, draft_topk  # noqa: E402
from specverify.platform import get_profile  # noqa: E402
from tests.support.steering import steer_logits_fused, steering_plan  # noqa: E402
from bench_device_cycle import make_prompts, pre_run_oracle, release, run_on_path, run_target  # noqa: E402

AGREEMENT = 0.7
SMALL_SPECS = {"EAGLE S3 k1": SpecConfig(num_steps=3, topk=1),
               "EAGLE S3 k4 D8": SpecConfig(num_steps=3, topk=4, num_draft_tokens=8),
               "naive EAGLE": SpecConfig(algorithm="naive_eagle")}
MEDIUM_SPECS = {"EAGLE S3 k1": SpecConfig(num_steps=3, topk=1),
                "MTP S3": SpecConfig(algorithm="mtp", num_steps=3),
                "DFlash B4": SpecConfig(algorithm="dflash", num_steps=3)}


def weight_bytes(cfg) -> int:
    """Bytes of bfloat16 weights one target forward reads (projections, norms, lm_head)."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h
    return 2 * (cfg.num_layers * per_layer + cfg.vocab_size * h + h)


def floors(models) -> dict:
    """What a bs-1 step of this target cannot go below on this device, measured: the forward's
    matmuls alone (the same weights, M = 1, one graph: cuBLAS's GEMV speed), and a plain copy of
    as many bytes (the bandwidth a streaming kernel reaches)."""
    w, cfg = models.target.w, models.config
    mats = []
    for i in range(cfg.num_layers):
        p = f"layers.{i}"
        mats += [w[f"{p}.wqkv"], w[f"{p}.wo"], w.get(f"{p}.w_gate_up", w[f"{p}.w_gate"]), w[f"{p}.w_down"]]
        if f"{p}.w_gate_up" not in w:
            mats.append(w[f"{p}.w_up"])
    mats.append(w["lm_head"])
    xs = [torch.randn((1, m.shape[0]), dtype=m.dtype, device=m.device) for m in mats]

    def gemms():
        for x, m in zip(xs, mats):
            x @ m
    nbytes = sum(m.numel() * m.element_size() for m in mats)
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    out = {"gemm_ms": graph_ms(gemms, reps=4), "copy_ms": graph_ms(lambda: dst.copy_(src), reps=4),
           "bytes": nbytes, "launches": len(mats)}
    del src, dst
    return out


FLOOR_CONTEXT = 48       # cached tokens of each request the forward floors run over
FLOOR_ALGORITHMS = ("eagle", "naive_eagle", "mtp")   # the cycles measured forward by forward (at their aims' batch sizes)


def forward_floors(models, spec: SpecConfig, bs: int) -> dict:
    """ms of the forwards alone, `bs` requests of FLOOR_CONTEXT cached tokens, one graph, no
    bookkeeping between them: a target-only step's one decode forward, and an EAGLE cycle's forwards
    (the verify over its D nodes, the draft-extend over S + 1 tokens, the S - 1 draft steps over k
    tokens each; chains, which cost what the trees cost; naive EAGLE, D = 2 and S = 1: a verify of
    2 tokens, whose attention reads the prefix as a chain here where the engine reads it through a
    slot list, and an extend of 2; MTP: head 0's extend with heads 1.. writing their context K/V
    over the same rows beside it, on a side stream as the engine does, then step j on head j).
    Their ratio is what the cycle / target-step ratio
    cannot go below on the device while the forwards stay as they are."""
    target, cfg = models.target, models.config
    mtp = spec.algorithm == "mtp"
    heads = models.mtp if mtp else [models.draft] * spec.num_steps
    head = heads[0]
    cache = target.new_cache(max_requests=bs + 1, page_size=1, draft_layers=len(heads) if mtp else 1)
    i64 = dict(dtype=torch.int64, device=target.device)
    rows = []
    for _ in range(bs):
        rows.append(cache.table.alloc_row())
        cache.table.reserve(rows[-1], FLOOR_CONTEXT + 16)
    cache.table.flush()
    rows = torch.tensor(rows, **i64)
    kv, req = torch.full((bs,), FLOOR_CONTEXT, **i64), torch.arange(bs, **i64)

    def batch(q: int):
        return extend_batch(rows, kv, torch.ones((bs, q), **i64), torch.full((bs,), q, **i64), req)
    d, s, k = spec.draft_tokens, spec.num_steps, spec.topk
    plain, verify, extend, step = batch(1), batch(d), batch(s + 1), batch(k)
    feats = [torch.zeros((bs, q, cfg.hidden_size), dtype=target.dtype, device=target.device) for q in (s + 1, k)]
    root = torch.full((bs,), s, **i64)                  # the extend's last lane: its logits are the ones read

    def target_forward():
        target.forward(cache, plain, commit_state=False)

    def verify_forward():
        target.forward(cache, verify, commit_state=False)

    def draft_step():
        head.forward(cache, step, feats[1])

    beside = SideStream(target.device)

    def cycle_forwards():
        verify_forward()
        if mtp and s > 1:
            with beside.fork():
                shared = heads[1].context_input(cache, extend, feats[0])
                for j in range(1, s):
                    heads[j].write_kv(cache, extend, feats[0], context=shared)
        head.forward(cache, extend, feats[0], at=root)
        beside.join()
        for j in range(1, s):
            heads[j].forward(cache, step, feats[1])

    # What a draft forward cannot cost less than as the head is built: its network up to its last
    # norm over a step's k tokens (`hidden_states`: the embedding concat, the fc matmul and its
    # decoder layer, attention on the tensor cores) and the lm_head matmul ([bs, H] @ lm_head, the
    # full vocabulary, one row per request).
    x = torch.zeros((bs, cfg.hidden_size), dtype=target.dtype, device=target.device)

    def head_network():
        head.hidden_states(cache, step, feats[1])

    out = {"target_ms": graph_ms(target_forward, reps=4), "cycle_ms": graph_ms(cycle_forwards, reps=4),
           "verify_ms": graph_ms(verify_forward, reps=4), "draft_step_ms": graph_ms(draft_step, reps=8),
           "network_ms": graph_ms(head_network, reps=8), "lm_head_ms": graph_ms(lambda: x @ head.lm_head, reps=8)}
    # The cycle's forwards with every draft forward at that least: its verify, then S of them (MTP's
    # S - 1 context writes run beside head 0's forward, on a side stream: not counted).
    out["least_cycle_ms"] = out["verify_ms"] + s * (out["network_ms"] + out["lm_head_ms"])
    # What each draft forward's logits then go through in these runs: the steering knob's kernels
    # (the aims' drafts are steered) and the draft's selection (6.1: the argmax for a chain, the
    # top-k for a tree), on [bs, V] logits, the fewest rows a draft forward selects from.
    out["select_ms"] = graph_ms(selection(head, x, k, bs), reps=8)
    out["least_select_cycle_ms"] = out["least_cycle_ms"] + s * out["select_ms"]
    return out


def selection(head, x: torch.Tensor, topk: int, bs: int):
    """One draft forward's steering and selection over its [bs, V] logits, as a callable: every
    request on the oracle path (each row's one steered entry stored), the device's profile."""
    profile = get_profile()
    logits = (x @ head.lm_head)[:, None, :].contiguous()                       # [bs, 1, V]
    vocab, i64 = logits.shape[-1], dict(dtype=torch.int64, device=logits.device)
    gen = torch.Generator(device=logits.device).manual_seed(0)
    oracle = torch.randint(0, vocab, (bs, FLOOR_CONTEXT + 2), generator=gen, **i64)
    oracle[:, -1] = -1
    plan = steering_plan(oracle, AGREEMENT, 0)
    req, pos = torch.arange(bs, **i64), torch.full((bs, 1), FLOOR_CONTEXT, **i64)
    tokens = oracle[:, FLOOR_CONTEXT:FLOOR_CONTEXT + 1].contiguous()

    def run():
        steer_logits_fused(logits, req, pos, tokens, oracle, plan, in_place=True)
        if topk == 1:
            draft_token(logits[:, 0], profile, None)
        else:
            draft_topk(logits[:, 0], topk, profile, None)
    return run


def measure(preset: str, specs: dict, plan: dict, args) -> dict:
    """{(name, bs): run result} for target-only ("target") and each spec at the batch sizes of `plan`."""
    t0 = time.perf_counter()
    models = specverify.build_models(preset, seed=args.seed, compute_dtype="bfloat16", logits_dtype="bfloat16",
                                     device="cuda")
    build_s = time.perf_counter() - t0
    top = max(b for sizes in plan.values() for b in sizes)
    prompts = make_prompts(top, models.config.vocab_size, args.seed)
    oracle, oracle_ms = pre_run_oracle(models, prompts, list(specs.values()), args, "cuda")
    out = {"build_s": build_s, "oracle_ms": oracle_ms, "config": models.config, "floors": floors(models),
           "forwards": {(name, bs): forward_floors(models, spec, bs) for name, spec in specs.items()
                        if spec.algorithm in FLOOR_ALGORITHMS for bs in plan[name]}}
    runs, oracles = {}, {}     # oracles: each speculative run's own, found by its first repeat (run_on_path)
    for rep in range(args.repeat):            # every decoder in turn, then again: drift meets them all
        for name, sizes in plan.items():
            for bs in sizes:
                t0 = time.perf_counter()
                if name == "target":
                    r = run_target(models, prompts[:bs], args, "cuda")
                else:
                    r, oracles[name, bs] = run_on_path(models, oracles.get((name, bs), oracle), prompts[:bs],
                                                       specs[name], args, "cuda")
                runs.setdefault((name, bs), []).append(r)
                print(f"{preset} repeat {rep} {name} bs {bs}: {r.get('cycle_ms')} ms/step, {r.get('tok_s')} tok/s, "
                      f"accept {r.get('mean_accept')}, steered runs {steered_runs(r)} {r.get('error', '')} "
                      f"({time.perf_counter() - t0:.1f} s)",
                      flush=True)
    for key, rs in runs.items():
        out[key] = median_run(rs)
    out["repeats"] = runs
    del models
    release("cuda")
    return out


def median_run(runs: list[dict]) -> dict:
    """Of one decoder's repeats, the run whose ms / step is the median (the lower middle of an even
    count); an error only when every repeat failed."""
    ok = sorted((r for r in runs if "error" not in r), key=lambda r: r["cycle_ms"])
    return ok[(len(ok) - 1) // 2] if ok else runs[0]


def repeat_rows(res: dict, preset: str) -> list:
    """Each decoder's ms / step in every repeat, and its cycle / target-step ratio against the
    target-only run of the same repeat and batch size."""
    rows = []
    for (name, bs), rs in res["repeats"].items():
        targets = res["repeats"].get(("target", bs), [])
        ms = [_ms(r) for r in rs]
        ratios = [_ratio(m, _ms(t)) for m, t in zip(ms, targets)]
        paired = "-" if name == "target" else " / ".join("-" if q is None else f"{q:.2f}x" for q in ratios)
        rows.append([preset, name, bs, " / ".join(_f(m, "{:.3f}") for m in ms), paired])
    return rows


def _ms(r) -> float | None:
    return None if "error" in r else r["cycle_ms"]


def _ratio(a, b):
    return None if a is None or b is None else a / b


def _f(x, fmt="{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def aims_rows(small: dict, medium: dict | None, peak: float | None) -> tuple[list, list[str]]:
    rows, errors = [], []

    def tok(res, name, bs, key="tok_s"):
        r = res[(name, bs)]
        if "error" in r:
            if key == "tok_s":
                errors.append(f"- {name} bs {bs}: {r['error']}")
            return None
        return r[key]

    def full(res, name, sizes):
        """The same tok/s ratios over the full-batch steps only (the steady state: no tail)."""
        ratios = [_ratio(tok(res, name, b, "full_tok_s"), tok(res, "target", b, "full_tok_s")) for b in sizes]
        return " / ".join(f"{_f(x)}x" for x in ratios)

    def verdict(ok):
        return "-" if ok is None else ("yes" if ok else "**no**")

    t1, t8 = _ms(small[("target", 1)]), _ms(small[("target", 8)])
    rows.append(["target-only step, small, bs 1 / 8", f"{_f(t1, '{:.3f}')} / {_f(t8, '{:.3f}')} ms", "<= 0.25 ms",
                 verdict(None if t1 is None or t8 is None else max(t1, t8) <= 0.25)])
    for name, aim in (("EAGLE S3 k1", 1.5), ("EAGLE S3 k4 D8", 1.9)):
        r1, r8 = (_ratio(_ms(small[(name, b)]), t) for b, t in ((1, t1), (8, t8)))
        acc = "/".join(_f(small[(name, b)].get("mean_accept")) for b in (1, 8))
        rows.append([f"{name} cycle / target-only step, small, bs 1 / 8 (accept {acc})",
                     f"{_f(r1)}x / {_f(r8)}x", f"<= {aim}x",
                     verdict(None if r1 is None or r8 is None else max(r1, r8) <= aim)])
    s1, s8 = (_ratio(tok(small, "EAGLE S3 k1", b), tok(small, "target", b)) for b in (1, 8))
    rows.append(["speculative / target-only tok/s, small, S3 k1, bs 1 / 8",
                 f"{_f(s1)}x / {_f(s8)}x (full batch: {full(small, 'EAGLE S3 k1', (1, 8))})", ">= 1.3x",
                 verdict(None if s1 is None or s8 is None else min(s1, s8) >= 1.3)])
    n1, n64 = (_ratio(tok(small, "naive EAGLE", b), tok(small, "target", b)) for b in (1, 64))
    rows.append(["naive EAGLE / target-only tok/s, small, bs 1 / 64",
                 f"{_f(n1)}x / {_f(n64)}x (full batch: {full(small, 'naive EAGLE', (1, 64))})", ">= 1.3x",
                 verdict(None if n1 is None or n64 is None else min(n1, n64) >= 1.3)])
    if medium is None:
        return rows, errors
    cfg = medium["config"]
    bound = weight_bytes(cfg) / (peak * 1e12) * 1e3 if peak else None
    m1 = _ms(medium[("target", 1)])
    rows.append([f"medium target-only step vs its HBM bound ({weight_bytes(cfg) / 1e9:.2f} GB at peak: "
                 f"{_f(bound, '{:.3f}')} ms), bs 1", f"{_f(m1, '{:.3f}')} ms = {_f(_ratio(m1, bound))}x",
                 "<= 1.3x the bound", verdict(None if m1 is None or bound is None else m1 / bound <= 1.3)])
    for name in MEDIUM_SPECS:
        ratios = [_ratio(tok(medium, name, b), tok(medium, "target", b)) for b in (1, 8)]
        acc = "/".join(_f(medium[(name, b)].get("mean_accept")) for b in (1, 8))
        cyc = "/".join(_f(_ratio(_ms(medium[(name, b)]), _ms(medium[("target", b)]))) for b in (1, 8))
        rows.append([f"medium: {name} / target-only tok/s, bs 1 / 8 (accept {acc}; cycle = {cyc} target steps)",
                     f"{_f(ratios[0])}x / {_f(ratios[1])}x (full batch: {full(medium, name, (1, 8))})", ">= 1.5x",
                     verdict(None if None in ratios else min(ratios) >= 1.5)])
    return rows, errors


def wall_floor(res: dict, bs: int, f: dict, key: str = "least_cycle_ms") -> float | None:
    """The least cycle (verify + S least draft forwards, device only; with key
    "least_select_cycle_ms", each draft forward's steering and selection too) plus what the
    measured target-only step at bs spends outside its forward, over that step: the wall-clock
    cycle / target-step ratio no cycle with these forwards goes below."""
    step = _ms(res[("target", bs)]) if ("target", bs) in res else None
    return None if step is None else (f[key] + step - f["target_ms"]) / step


TAIL_RUNS = (("small", "EAGLE S3 k1", 8, 1.3), ("small", "naive EAGLE", 64, 1.3), ("medium", "EAGLE S3 k1", 8, 1.5),
             ("medium", "MTP S3", 8, 1.5), ("medium", "DFlash B4", 8, 1.5))


def tail_rows(small: dict, medium: dict | None) -> list:
    rows = []
    for preset, name, bs, aim in TAIL_RUNS:
        res = small if preset == "small" else medium
        if res is None or "error" in res[(name, bs)] or "error" in res[("target", bs)]:
            continue
        r, t = res[(name, bs)], res[("target", bs)]
        whole, full = _ratio(r["tok_s"], t["tok_s"]), _ratio(r.get("full_tok_s"), t.get("full_tok_s"))
        cycle = _ratio(r["cycle_ms"], t["cycle_ms"])
        tokens = None if whole is None or cycle is None else whole * cycle
        f = res["forwards"].get((name, bs))
        rows.append([preset, name, bs, f"{_f(whole)}x / {_f(full)}x", f"{_f(cycle)}x", f"{_f(tokens)}", f">= {aim}x",
                     f"<= {_f(_ratio(tokens, aim))}x", "-" if f is None else f"{_f(wall_floor(res, bs, f))}x",
                     "-" if f is None else f"{_f(wall_floor(res, bs, f, 'least_select_cycle_ms'))}x"])
    return rows


def _forwards(small: dict | None, medium: dict | None):
    """(preset, cycle name, batch size, the preset's results, that cycle's forwards figures) of each
    measured preset."""
    for preset, res in (("small", small), ("medium", medium)):
        if res is not None:
            for (name, bs), f in res["forwards"].items():
                yield preset, name, bs, res, f


def detail_rows(res: dict, preset: str) -> list:
    rows = []
    for key, r in res.items():
        if not isinstance(key, tuple):
            continue
        name, bs = key
        if "error" in r:
            rows.append([preset, name, bs, "-", "-", "-", "-", "-", r["error"][:80], "-"])
            continue
        rows.append([preset, name, bs, r["full"], _f(r["cycle_ms"], "{:.3f}"), _f(r["tok_s"], "{:.0f}"),
                     _f(r.get("full_tok_s"), "{:.0f}"),
                     _f(r.get("mean_accept")), _f(r["syncs"]["readbacks"] / max(r["syncs"]["cycles"], 1)),
                     steered_runs(r)])
    return rows


def steered_runs(r: dict) -> str:
    """How many runs it took to steer by the run's own tokens: "-" for target-only, a count, and
    "off the oracle" if even the last run left it."""
    if "oracle_runs" not in r:
        return "-"
    return str(r["oracle_runs"]) + ("" if r["on_oracle"] else ", off the oracle")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="directory for the results file (default benchmarks/results)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--skip-medium", action="store_true", help="the small preset's rows only")
    ap.add_argument("--peak-tbps", type=float, help="peak HBM bandwidth in TB/s (default: from the device name)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1,
                    help="run every decoder this many times, in turn; each figure is from its median run")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error(f"--repeat must be >= 1, got {args.repeat}")
    args.agreement, args.warmup, args.sync_steps, args.quick, args.cpu_smoke = AGREEMENT, 2, 3, False, False
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_aims.py: needs a CUDA device")
    small = measure("small", SMALL_SPECS, {"target": (1, 8, 64), "EAGLE S3 k1": (1, 8), "EAGLE S3 k4 D8": (1, 8),
                                           "naive EAGLE": (1, 64)}, args)
    medium = None if args.skip_medium else measure(
        "medium", MEDIUM_SPECS, {"target": (1, 8), **{name: (1, 8) for name in MEDIUM_SPECS}}, args)
    peak, peak_src = peak_bandwidth(torch.cuda.get_device_name(), args.peak_tbps)
    rows, errors = aims_rows(small, medium, peak)
    lines = header("Speculation that pays: the aims of issue 25", False, {
        "Models": "`small` (V 32000, H 512, 8 layers) and `medium` (V 32000, H 2048, 24 layers, 16 / 8 heads x 128, "
                  "I 5632), bfloat16 compute and logits, seed " + str(args.seed),
        "Decoding": f"greedy, no EOS, {args.max_new_tokens} new tokens, prompts of 16-63 seeded random ids, page size 1, "
                    f"every decoder captured (`cuda_graph=True`, `pad_batches=True`)",
        "Draft": f"steered to agreement {AGREEMENT} (tests/support/steering.py; its target-only pre-run is set-up, "
                 f"untimed: small {small['oracle_ms']:.0f} ms" + ("" if medium is None else
                                                                 f", medium {medium['oracle_ms']:.0f} ms") + "). "
                 "A run whose tokens leave that oracle is made again, steered by its own tokens, until a run "
                 "emits its oracle (bench_device_cycle.run_on_path; \"steered runs\" below)",
        "Timing": step_timing(args),
        "HBM peak": f"{_f(peak, '{:.2f}')} TB/s ({peak_src})",
    })
    lines += ["## The aims", ""] + table(["figure", "now", "aim", "met"], rows)
    lines += ["", "## Every run", ""]
    lines += table(["preset", "decoder", "bs", "full-batch steps", "ms / step", "tok/s", "full-batch tok/s",
                    "mean accept", "readbacks / step", "steered runs"], detail_rows(small, "small") + ([] if medium is None else
                                                                         detail_rows(medium, "medium")))
    if args.repeat > 1:
        lines += ["", f"## Every repeat ({args.repeat} of each decoder, in turn)", ""]
        lines += table(["preset", "decoder", "bs", "ms / step, each repeat",
                        "cycle / target step, each repeat (against the same repeat's target run)"],
                       repeat_rows(small, "small") + ([] if medium is None else repeat_rows(medium, "medium")))
        lines += ["", "Every decoder ran once, in the table's order, then again, so a drift of the machine's speed "
                  "meets each of them. Each figure above is from the decoder's median run by ms / step (its "
                  "tok/s and accept from that run too)."]
    lines += ["", "## The tail (bs > 1): what the whole-run tok/s aims ask of the cycle", ""]
    lines += table(["preset", "decoder", "bs", "tok/s ratio, whole run / full batch", "cycle / target step",
                    "tokens a cycle over the whole run / a target step's", "aim", "cycle / target step the aim needs",
                    "least wall-clock cycle / target step",
                    "the same with each draft's steering and selection"], tail_rows(small, medium))
    lines += ["", "A static batch drains: once its first request finishes, a cycle costs the same for fewer "
              "tokens until the slowest request is done, where every target-only request finishes on the same "
              "step. The whole-run ratio is the full-batch one less that tail. The tokens a cycle emits over "
              "the whole run, against a target step's (the tok/s ratio times the cycle ratio), divided by the "
              "aim, is the cycle / target-step ratio at which the whole-run aim would be met; the last column "
              "(the section below) is the least any cycle with these forwards can cost, and the last the "
              "same with what each draft forward's logits go through in these runs (the steering knob's "
              "kernels and the draft's argmax or top-k), measured alone."]
    lines += ["", "## Floors (bs 1, measured on this device)", ""]
    frows = []
    for preset, res in (("small", small), ("medium", medium)):
        if res is None:
            continue
        f = res["floors"]
        frows.append([preset, f"{f['bytes'] / 1e9:.3f}", f["launches"], f"{f['gemm_ms']:.3f}",
                      f"{f['bytes'] / f['gemm_ms'] / 1e9:.2f}", f"{f['copy_ms']:.3f}",
                      f"{2 * f['bytes'] / f['copy_ms'] / 1e9:.2f}",
                      f"{_f(_ratio(f['gemm_ms'], f['bytes'] / (peak * 1e12) * 1e3 if peak else None))}x"])
    lines += table(["preset", "weight GB a forward reads", "matmuls", "the matmuls alone, ms (one graph)",
                    "their TB/s", "copy of the bytes (read + write), ms", "copy TB/s (read + write)", "matmuls / HBM bound"], frows)
    lines += ["", "The matmuls alone: every weight matmul of one bs-1 forward (x [1, K] @ W), nothing else, replayed "
              "from one CUDA graph: no decoder can read its weights faster through cuBLAS. The copy reads and "
              "writes the same bytes once each (its TB/s counts both)."]
    lines += ["", "## The forwards alone (one graph, measured on this device)", ""]
    rows = []
    for preset, name, bs, res, f in _forwards(small, medium):
        step = _ms(res[("target", bs)]) if ("target", bs) in res else None
        rows.append([preset, name, bs, f"{f['target_ms']:.3f}", _f(step, "{:.3f}"), f"{f['cycle_ms']:.3f}",
                     f"{_f(_ratio(f['cycle_ms'], step))}x", f"{_f(_ratio(f['cycle_ms'], f['target_ms']))}x"])
    lines += table(["preset", "cycle", "bs", "target forward alone, ms", "target-only step, ms",
                    "the cycle's forwards alone, ms", "floor of cycle / target step",
                    "the same on the device alone (over the target forward alone)"], rows)
    lines += ["", "The cycle's forwards alone: its verify forward over D nodes, its draft-extend over S + 1 tokens "
              "(the lm_head on its last token only, as the engine runs it) and its S - 1 draft steps, bs requests "
              "with 48 cached tokens each, replayed from one CUDA graph with "
              "nothing between them (no selection, accept, commit or tree build). Over the measured target-only "
              "step, the ratio a cycle cannot go below with these forwards, however little its bookkeeping costs. "
              "Over the target forward alone, the same ratio without any host time: what the cycle / target-step "
              "ratio tends to as the host's share of both steps shrinks."]
    lines += ["", "## What a draft forward cannot cost less than (one graph each, ms)", ""]
    rows = [[preset, name, bs, f"{f['target_ms']:.3f}", f"{f['verify_ms']:.3f}", f"{f['draft_step_ms']:.3f}",
             f"{f['network_ms']:.3f}", f"{f['lm_head_ms']:.3f}", f"{f['least_cycle_ms']:.3f}",
             f"{_f(_ratio(f['least_cycle_ms'], f['target_ms']))}x", f"{_f(wall_floor(res, bs, f))}x",
             f"{f['select_ms'] * 1e3:.1f}", f"{_f(wall_floor(res, bs, f, 'least_select_cycle_ms'))}x"]
            for preset, name, bs, res, f in _forwards(small, medium)]
    lines += table(["preset", "cycle", "bs", "target forward", "verify forward", "a draft step's forward",
                    "the head's network to its last norm (k tokens a request)", "lm_head matmul",
                    "verify + S x (network + lm_head)", "the same over the target forward",
                    "the same plus the target step's time outside its forward, over the target step",
                    "a draft forward's steering and selection, us", "the last but one with S of them"], rows)
    lines += ["", "A draft head's forward is its network up to its last norm (the embedding concat, the fc matmul, "
              "one decoder layer with its attention on the tensor cores: `DraftHead.hidden_states`) and the "
              "full-vocabulary lm_head, each measured here alone; its last norm and the argmax are left out, as if "
              "fused away for free. The last column is the device-only cycle / target ratio of a cycle whose draft "
              "forwards cost only that: a lower bound on the k1 cycle's ratio with this head's kernels (the k4 "
              "tree's steps run 4 tokens, so for it a looser one). An MTP cycle's S - 1 context writes (heads 1.. put "
              "the extend rows' K/V into their layers: `DraftHead.write_kv`) run beside head 0's forward, on a side "
              "stream, and are not counted. The last but one adds to it what the measured "
              "target-only step spends outside its forward (its argmax, emit, readback and host time; a cycle "
              "does all of that and more) and divides by that step: the least wall-clock cycle / target-step "
              "ratio. The last two: what one draft forward's logits go through in these runs, measured alone on "
              "[bs, V] logits (the steering knob's two kernels, tests/support/steering.py, then the selection: the "
              "argmax of a chain, the top-k of a tree), and the least wall-clock ratio with S of them added: "
              "still no accept, commit, emit or tree build."]
    if errors:
        lines += ["", "Errors:", ""] + errors
    write_results(lines, out_dir(args.out, False), "aims", False)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
