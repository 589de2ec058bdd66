"""Latency of the paged attention kernel where a decode step meets it (issue 25): bs 1 and 8, one
query (decode) and four (a chain verify), 64 and 512 cached tokens, the small (4 KV heads x 64) and
medium (8 KV heads x 128) head shapes; every (BLOCK_N, num_warps, num_stages), each timed as 20
calls replayed from one CUDA graph (the host's launch cost out), against the torch path's result.

    PYTHONPATH=. python3 benchmarks/experiments/attn_latency_sweep.py
"""
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

from _common import graph_ms  # noqa: E402

from specverify.kernels.attention import paged_attention_impl  # noqa: E402

CALLS = 20


def case(bs, nq, ctx, nkv, hd, group=2):
    gen = torch.Generator(device="cuda").manual_seed(0)
    slots = 1 + bs * (ctx + nq)
    k = torch.randn((slots, nkv, hd), dtype=torch.bfloat16, device="cuda", generator=gen)
    v = torch.randn((slots, nkv, hd), dtype=torch.bfloat16, device="cuda", generator=gen)
    table = (1 + torch.randperm(bs * (ctx + nq), device="cuda", generator=gen)).view(bs, ctx + nq)
    q = torch.randn((bs, nq, nkv * group, hd), dtype=torch.bfloat16, device="cuda", generator=gen)
    mask = torch.tril(torch.ones((nq, nq), dtype=torch.bool, device="cuda")).expand(bs, nq, nq).contiguous()
    args = (q, k, v, table, torch.arange(bs, device="cuda"), torch.full((bs,), ctx, device="cuda"),
            torch.full((bs,), nq, device="cuda"), mask, 0, hd ** -0.5)
    return args


def main() -> None:
    for bs, nq, ctx, nkv, hd in ((1, 1, 64, 4, 64), (1, 4, 64, 4, 64), (8, 4, 64, 4, 64), (1, 1, 512, 4, 64),
                                 (1, 1, 64, 8, 128), (1, 4, 64, 8, 128)):
        args = case(bs, nq, ctx, nkv, hd)
        ref = paged_attention_impl(*args, impl="torch")
        rows = []
        for bn, nw, ns in itertools.product((16, 32, 64, 128), (1, 2, 4, 8), (1, 2, 3)):
            fn = lambda: paged_attention_impl(*args, block_n=bn, num_warps=nw, num_stages=ns)  # noqa: E731
            err = (fn() - ref).abs().max().item()
            rows.append((graph_ms(fn, CALLS) * 1e3, bn, nw, ns, err))
        rows.sort()
        default = next(r for r in rows if r[1:4] == (64, 4, 3))
        print(f"bs {bs} q {nq} ctx {ctx} kv heads {nkv} x {hd}: default {default[0]:.2f} us; best: "
              + "; ".join(f"{us:.2f} us (BLOCK_N {bn}, warps {nw}, stages {ns}, err {err:.1e})"
                          for us, bn, nw, ns, err in rows[:4]))


if __name__ == "__main__":
    main()
