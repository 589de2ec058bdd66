"""Timing probe (issue 25): a norm-prologue matmul that loads each row's whole K at once (one load
round trip for x, the norm weight and the weight tile), at the draft head's shapes, against the
unfused pair and cuBLAS alone. A probe, not the engine's kernel.

    PYTHONPATH=. python3 benchmarks/experiments/norm_matmul_probe.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from _common import graph_ms  # noqa: E402
from specverify.kernels.fused_layers import add_rmsnorm_impl  # noqa: E402


@triton.jit
def _whole_k_kernel(x_ptr, r_ptr, g_ptr, wt_ptr, out_ptr, rows, n_cols, eps, s_xm, s_wn, s_om,
                    HIDDEN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    m = tl.arange(0, BLOCK_M)
    k = tl.arange(0, BLOCK_K)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    klive = k < HIDDEN
    nlive = n < n_cols
    wt = tl.load(wt_ptr + n[:, None] * s_wn + k[None, :], mask=nlive[:, None] & klive[None, :], other=0.0)
    live = (m < rows)[:, None] & klive[None, :]
    s = tl.load(x_ptr + m[:, None] * s_xm + k[None, :], mask=live, other=0.0)
    r = tl.load(r_ptr + m[:, None] * s_xm + k[None, :], mask=live, other=0.0)
    s = (s.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty).to(tl.float32)
    g = tl.load(g_ptr + k, mask=klive, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(s * s, axis=1) / HIDDEN + eps)
    a = (s * rstd[:, None] * g[None, :]).to(out_ptr.dtype.element_ty)
    acc = tl.dot(a, tl.trans(wt))
    tl.store(out_ptr + m[:, None] * s_om + n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(m < rows)[:, None] & nlive[None, :])


def main() -> None:
    print(f"# norm_matmul_probe on {torch.cuda.get_device_name()}")
    print("| K x N | rows | BLOCK_N | warps | unfused us | whole-K us | cuBLAS alone us | err / max |")
    print("|---|---|---|---|---|---|---|---|")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for k, n in ((512, 1024), (512, 2816), (512, 32000), (2048, 4096), (2048, 11264)):
        copies = max(2, min(64, (256 << 20) // (k * n * 2)))
        ws = [torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=gen) / k ** 0.5 for _ in range(copies)]
        wts = [w.t().contiguous() for w in ws]
        for rows in (1, 8):
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            r = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            g = torch.rand(k, device="cuda", dtype=torch.bfloat16, generator=gen) + 0.5
            a = add_rmsnorm_impl(x, r, g, 1e-6)[0]
            want = a.double() @ ws[0].double()

            def unfused():
                for w in ws:
                    add_rmsnorm_impl(x, r, g, 1e-6)[0] @ w

            def alone():
                for w in ws:
                    a @ w
            t_unf = graph_ms(unfused, 4) / copies * 1e3
            t_alone = graph_ms(alone, 4) / copies * 1e3
            for block_n in (16, 32, 64):
                for warps in (2, 4, 8):
                    out = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)

                    def fused():
                        for wt in wts:
                            _whole_k_kernel[(triton.cdiv(n, block_n),)](
                                x, r, g, wt, out, rows, n, 1e-6, x.stride(0), wt.stride(0), out.stride(0),
                                HIDDEN=k, BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=triton.next_power_of_2(k),
                                num_warps=warps)
                    try:
                        t = graph_ms(fused, 4) / copies * 1e3
                    except Exception as e:          # a tile too big for the registers / shared memory
                        print(f"| {k} x {n} | {rows} | {block_n} | {warps} | {t_unf:.1f} | failed: {type(e).__name__} | {t_alone:.1f} | - |")
                        continue
                    _whole_k_kernel[(triton.cdiv(n, block_n),)](
                        x, r, g, wts[0], out, rows, n, 1e-6, x.stride(0), wts[0].stride(0), out.stride(0),
                        HIDDEN=k, BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=triton.next_power_of_2(k), num_warps=warps)
                    err = (out.double() - want).abs().max().item() / want.abs().max().item()
                    print(f"| {k} x {n} | {rows} | {block_n} | {warps} | {t_unf:.1f} | {t:.1f} | {t_alone:.1f} | {err:.1e} |",
                          flush=True)


if __name__ == "__main__":
    main()
