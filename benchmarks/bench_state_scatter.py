"""The Mamba state commit (issue 11 item 3, `specverify.ops.mamba_state_scatter`): the Triton
scatter kernel against torch advanced indexing, on the device.

For every request r of the batch whose step is >= 0, the commit copies the state after its last
accepted draft node from the verify's intermediate cache into the request's slot of the state
cache, in every layer: dst[:, slot[r]] = src[:, r, step[r]]. Shapes: L = 32 layers, bs = 256
requests, a state of 16384 elements (16K) per layer, D = 4 draft nodes, S = 2 * bs slots (the
requests' slots a random subset), bfloat16. Two batches:

- all commit: every request has a step in [0, D);
- 25% skipped: a quarter of the requests have step -1 (they move no bytes).

Three ways are timed, each over `--iters` calls between two CUDA events after `--warmup` calls:

- triton: the kernel wrapper `kernels.state_scatter.state_scatter_impl(..., "triton")`, what the
  op runs on CUDA (the op's value checks are off there by default);
- torch fallback: the same wrapper with impl="torch": advanced indexing over the committing
  requests, found on the host (`nonzero`, one sync per call);
- torch indexing: the one-line `dst[:, slots] = src[:, arange(bs), steps]` with no skip handling,
  only for the all-commit batch, where it is correct (no host sync).

The speed-up is the faster torch time over the Triton time. Achieved bandwidth = bytes moved
(committing requests x L x state x element size, read once and written once) / time, and its
fraction of the device's peak HBM bandwidth (a table by device name: H100 SXM 3.35 TB/s, H200
4.8 TB/s; `--peak-tbps` otherwise; the report says when the figure is unknown). The issue's aims:
>= 1.5x over torch, >= 60% of peak. After timing, Triton's and the torch fallback's results are
compared bit for bit; a mismatch is marked in the table and the script exits non-zero.

Run on a GPU machine from the repository root:

    PYTHONPATH=. python3 benchmarks/bench_state_scatter.py            # seconds on an H100
    PYTHONPATH=. python3 benchmarks/bench_state_scatter.py --quick    # fewer iterations
    python3 benchmarks/bench_state_scatter.py --cpu-smoke --out /tmp/x   # the CPU: tiny sizes, Triton interpreted
"""

from __future__ import annotations

import os
import sys
import time

from _common import (base_parser, header, out_dir, peak_bandwidth, require_cuda, table,  # puts the repo root on sys.path
                     write_results)

import torch  # noqa: E402

# Peak HBM bandwidth (TB/s) by device name, first match wins; --peak-tbps overrides.
AIM_SPEEDUP = 1.5
AIM_PEAK = 0.60
AIMS_TEXT = f"Triton >= {AIM_SPEEDUP:g}x over torch advanced indexing, and >= {AIM_PEAK:.0%} of the peak HBM bandwidth"
SKIP_FRACTION = 0.25


def parse_args(argv=None):
    ap = base_parser(__doc__, quick_help="20 timed iterations instead of 100",
                     smoke_help="check the script on the CPU: L 2, bs 4, a state of 64, Triton interpreted")
    ap.add_argument("--layers", type=int, help="L (default 32; 2 --cpu-smoke)")
    ap.add_argument("--bs", type=int, help="requests (default 256; 4 --cpu-smoke)")
    ap.add_argument("--state", type=int, help="state elements per layer (default 16384; 64 --cpu-smoke)")
    ap.add_argument("--steps", type=int, default=4, help="D, draft nodes per request (default 4)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--iters", type=int, help="timed calls per measurement (default 100; 20 --quick; 3 --cpu-smoke)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed calls before each measurement (default 5)")
    ap.add_argument("--block", type=int, help="the kernel's state chunk per program (default: the kernel's BLOCK)")
    ap.add_argument("--peak-tbps", type=float, help="the device's peak HBM bandwidth in TB/s (default: from the name)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    smoke = args.cpu_smoke
    args.layers = args.layers or (2 if smoke else 32)
    args.bs = args.bs or (4 if smoke else 256)
    args.state = args.state or (64 if smoke else 16384)
    args.iters = args.iters or (3 if smoke else 20 if args.quick else 100)
    if min(args.layers, args.bs, args.state, args.steps, args.iters) < 1 or args.warmup < 0:
        ap.error("sizes and --iters must be >= 1, --warmup >= 0")
    if args.block is not None and (args.block < 1 or args.block & (args.block - 1)):
        ap.error(f"--block must be a power of two, got {args.block}")
    return args


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_call(fn, args, device: str) -> float:
    """Milliseconds per call: CUDA events around args.iters calls (the host clock on the CPU)."""
    for _ in range(args.warmup):
        fn()
    sync(device)
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / args.iters
    t0 = time.perf_counter()
    for _ in range(args.iters):
        fn()
    return (time.perf_counter() - t0) * 1e3 / args.iters


def bench_batch(kind: str, args, device: str, impl_fn) -> dict:
    """One batch: caches and indices, the three timings, the bit-for-bit check."""
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(args.seed)
    num_slots = 2 * args.bs
    src = torch.randn((args.layers, args.bs, args.steps, args.state), generator=gen).to(device, dtype)
    dst = torch.randn((args.layers, num_slots, args.state), generator=gen).to(device, dtype)
    slots = torch.randperm(num_slots, generator=gen)[:args.bs]
    steps = torch.randint(0, args.steps, (args.bs,), generator=gen)
    if kind != "all commit":
        steps[torch.randperm(args.bs, generator=gen)[:round(SKIP_FRACTION * args.bs)]] = -1
    slots, steps = slots.to(device), steps.to(device)
    rows = torch.arange(args.bs, device=device)
    committing = int((steps >= 0).sum())
    block = {} if args.block is None else {"block": args.block}

    def triton_call():
        impl_fn(dst, src, slots, steps, "triton", **block)

    def fallback_call():
        impl_fn(dst, src, slots, steps, "torch")

    def indexing_call():
        dst[:, slots] = src[:, rows, steps]

    before = dst.clone()
    out = {"kind": kind, "committing": committing,
           "bytes": 2 * committing * args.layers * args.state * dst.element_size()}
    out["triton_ms"] = time_call(triton_call, args, device)
    out["fallback_ms"] = time_call(fallback_call, args, device)
    out["indexing_ms"] = time_call(indexing_call, args, device) if kind == "all commit" else None
    # Bit for bit: Triton against the torch fallback from the same starting cache.
    got = before.clone()
    impl_fn(got, src, slots, steps, "triton", **block)
    want = before.clone()
    impl_fn(want, src, slots, steps, "torch")
    sync(device)
    out["same"] = bool(torch.equal(got.view(torch.int16 if dst.element_size() == 2 else torch.int32),
                                   want.view(torch.int16 if dst.element_size() == 2 else torch.int32)))
    return out                                               # the caches go with this frame


def bench_batches(args, device: str, impl_fn) -> list[dict]:
    out = []
    for kind in ("all commit", f"{SKIP_FRACTION:.0%} skipped"):
        out.append(bench_batch(kind, args, device, impl_fn))
        if device == "cuda":
            torch.cuda.empty_cache()                         # the last batch's caches freed
    return out


def _f(x, fmt: str) -> str:
    return "-" if x is None else fmt.format(x)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.cpu_smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")       # before triton is imported
    else:
        require_cuda("bench_state_scatter")
    device = "cpu" if args.cpu_smoke else "cuda"
    from specverify.kernels.state_scatter import BLOCK, NUM_WARPS, state_scatter_impl

    t_all = time.perf_counter()
    results = bench_batches(args, device, state_scatter_impl)
    name = "cpu" if args.cpu_smoke else torch.cuda.get_device_name()
    peak, peak_src = (None, "the CPU: no HBM figure") if args.cpu_smoke else peak_bandwidth(name, args.peak_tbps)

    rows, missed, ok = [], [], True
    for r in results:
        best_torch = min(t for t in (r["fallback_ms"], r["indexing_ms"]) if t is not None)
        speedup = best_torch / r["triton_ms"]
        tbps = r["bytes"] / (r["triton_ms"] * 1e-3) / 1e12
        frac = tbps / peak if peak else None
        met = speedup >= AIM_SPEEDUP and (frac is not None and frac >= AIM_PEAK)
        if not met:
            missed.append(r["kind"])
        ok = ok and r["same"]
        rows.append([r["kind"], r["committing"], f"{r['bytes'] / 2**20:.0f}", f"{r['triton_ms'] * 1e3:.1f}",
                     f"{r['fallback_ms'] * 1e3:.1f}", _f(r["indexing_ms"] and r["indexing_ms"] * 1e3, "{:.1f}"),
                     f"{speedup:.2f}x", f"{tbps:.2f}", _f(frac, "{:.0%}"),
                     "yes" if met else "no" if peak else "unknown (no peak)", "yes" if r["same"] else "**NO**"])
    lines = header("Mamba state commit: the Triton scatter kernel vs torch advanced indexing", args.cpu_smoke, {
        "Aims (issue 11 item 3)": AIMS_TEXT,
        "Shapes": f"L={args.layers} layers, bs={args.bs} requests, state {args.state} elements per layer, "
                  f"D={args.steps} draft nodes, S={2 * args.bs} slots (the requests' slots a random subset), "
                  f"{args.dtype}; src [L, bs, D, state], dst [L, S, state], both contiguous",
        "Kernel": f"grid (state chunks, requests), BLOCK={args.block or BLOCK} elements per program and layer, "
                  f"num_warps={NUM_WARPS}, a loop over the layers",
        "Timing": f"CUDA events around {args.iters} calls after {args.warmup} warm-up calls (host clock on the CPU)",
        "Peak bandwidth": f"{_f(peak, '{:g} TB/s')} ({peak_src})",
        "Total run time": f"{time.perf_counter() - t_all:.1f} s",
    })
    lines += table(["batch", "committing requests", "MiB moved (read + write)", "triton us", "torch fallback us",
                    "torch indexing us", "speed-up (best torch / triton)", "triton TB/s", "of peak",
                    f"aims met (>= {AIM_SPEEDUP:g}x, >= {AIM_PEAK:.0%})", "triton == torch (bits)"], rows)
    lines += ["", "us = microseconds per call. MiB moved = committing requests x L x state x element size, read "
              "once from src and written once to dst (index reads not counted). torch fallback = the op's torch "
              "path (advanced indexing over the committing requests, found by a host read per call); torch "
              "indexing = `dst[:, slots] = src[:, arange(bs), steps]` with no skip handling, timed only where every "
              "request commits. The speed-up uses the faster of the two torch times.", ""]
    if peak is None:
        lines.append(f"- The device's peak bandwidth is unknown ({peak_src}): the fraction of peak and the "
                     f"bandwidth aim are not judged.")
    lines.append(f"- Aims ({AIMS_TEXT}): met in {len(results) - len(missed)} of {len(results)} batches"
                 + (f"; not met: {', '.join(missed)}" if missed else ""))
    if not ok:
        lines.append("- **Triton and the torch fallback disagree bit for bit**: chase it with "
                     "tests/test_state_scatter.py.")
    write_results(lines, out_dir(args.out, args.cpu_smoke), "state_scatter", args.cpu_smoke)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
