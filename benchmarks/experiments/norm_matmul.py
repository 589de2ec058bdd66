"""What a draft head's norm costs beside the matmul it feeds, captured (issue 25): the unfused pair
(`add_rmsnorm`, then cuBLAS's matmul) against the one fused kernel (`ops.norm_matmul`), and the
matmul alone, at the draft head's shapes (its q|k|v, gate|up and, for scale, lm_head matmuls).

Each call reads another of several copies of its weights, so the copies together pass the L2 and a
call reads its weights from HBM as a forward's layers do. Times are per call, in a CUDA graph of
many calls (launch gaps included).

    PYTHONPATH=. python3 benchmarks/experiments/norm_matmul.py [--rows 1 8 32]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from _common import graph_ms  # noqa: E402
from specverify.kernels.fused_layers import add_rmsnorm_impl  # noqa: E402
from specverify.kernels.norm_matmul import MAX_HIDDEN, norm_matmul_triton  # noqa: E402

# (name, K, N) of the draft head's matmuls a norm feeds, on each preset (K past MAX_HIDDEN: not run).
SHAPES = {
    "small": [("qkv", 512, 1024), ("gate_up", 512, 2816), ("lm_head", 512, 32000)],
    "medium": [("qkv", 2048, 4096), ("gate_up", 2048, 11264), ("lm_head", 2048, 32000)],
}
FLUSH_BYTES = 256 << 20      # the weight copies of one shape together


def measure(k: int, n: int, rows: int, dtype=torch.bfloat16) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(0)
    copies = max(2, min(64, FLUSH_BYTES // (k * n * 2)))
    ws = [torch.randn(k, n, device="cuda", dtype=dtype, generator=gen) / k ** 0.5 for _ in range(copies)]
    wts = [w.t().contiguous() for w in ws]
    x = torch.randn(rows, k, device="cuda", dtype=dtype, generator=gen)
    r = torch.randn(rows, k, device="cuda", dtype=dtype, generator=gen)
    g = torch.rand(k, device="cuda", dtype=dtype, generator=gen) + 0.5
    a = add_rmsnorm_impl(x, r, g, 1e-6)[0]

    def unfused():
        for w in ws:
            add_rmsnorm_impl(x, r, g, 1e-6)[0] @ w

    def fused():
        for wt in wts:
            norm_matmul_triton(x, r, g, wt, 1e-6)

    def alone():
        for w in ws:
            a @ w
    want = a.double() @ ws[0].double()
    scale = want.abs().max().item()
    got = norm_matmul_triton(x, r, g, wts[0], 1e-6)[0].double()
    return {"unfused": graph_ms(unfused, 4) / copies * 1e3, "fused": graph_ms(fused, 4) / copies * 1e3,
            "matmul": graph_ms(alone, 4) / copies * 1e3, "fused_err": (got - want).abs().max().item() / scale,
            "cublas_err": ((a @ ws[0]).double() - want).abs().max().item() / scale}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    args = ap.parse_args()
    print(f"# norm_matmul on {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| preset | matmul | K x N | rows | norm + cuBLAS us | fused us | cuBLAS alone us | "
          "fused / unfused | max err / max (fused, cuBLAS) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for preset, shapes in SHAPES.items():
        for name, k, n in shapes:
            if k > MAX_HIDDEN:
                continue
            for rows in args.rows:
                m = measure(k, n, rows)
                print(f"| {preset} | {name} | {k} x {n} | {rows} | {m['unfused']:.1f} | {m['fused']:.1f} | "
                      f"{m['matmul']:.1f} | {m['fused'] / m['unfused']:.2f} | "
                      f"{m['fused_err']:.1e}, {m['cublas_err']:.1e} |", flush=True)


if __name__ == "__main__":
    main()
