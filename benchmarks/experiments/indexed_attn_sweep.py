"""Launch-parameter sweep of the indexed decode attention kernel on naive-EAGLE-shaped lists
(bs requests x 2 queries over L+1 and L+2 slots; small preset heads), bf16 cache."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import torch  # noqa: E402
import triton  # noqa: E402

from specverify.kernels.indexed_attention import _indexed_decode_kernel, decode_attention_indexed_impl  # noqa: E402

nh, nkv, hd, dev = 8, 4, 64, "cuda"


def lists(bs, ctx):
    slots = 1 + bs * (ctx + 2)
    table = (1 + torch.randperm(slots - 1, device=dev)).view(bs, ctx + 2)
    lens = torch.randint(ctx // 2, ctx, (bs,), device=dev)
    per = torch.stack([lens + 1, lens + 2], 1).flatten()                   # [2bs]
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64, device=dev), per.cumsum(0)])
    idx = torch.cat([table[b // 2, :int(per[b])] for b in range(2 * bs)])
    return slots, indptr, idx


def timeit(fn, n=50):
    for _ in range(3):
        fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / n * 1e3


for bs, ctx in ((64, 100), (64, 1000), (8, 100)):
    slots, indptr, idx = lists(bs, ctx)
    k = torch.randn((slots, nkv, hd), dtype=torch.bfloat16, device=dev)
    v = torch.randn((slots, nkv, hd), dtype=torch.bfloat16, device=dev)
    q = torch.randn((2 * bs, nh, hd), dtype=torch.bfloat16, device=dev)
    ref = decode_attention_indexed_impl(q, k, v, indptr, idx, 0.125, impl="torch")
    out = torch.empty((2 * bs, nh, hd), dtype=torch.float32, device=dev)
    print(f"bs {bs} ctx ~{ctx}: wrapper default {timeit(lambda: decode_attention_indexed_impl(q, k, v, indptr, idx, 0.125)):.1f} us")
    for bn in (16, 32, 64, 128):
        for warps in (1, 2, 4):
            for stages in (1, 2, 3):
                def go():
                    _indexed_decode_kernel[(2 * bs, nkv)](
                        q, k, v, out, indptr, idx, nh // nkv, 0.125, *q.stride(), *k.stride(), *v.stride(),
                        *out.stride(), indptr.stride(0), idx.stride(0), HEAD_DIM=hd, BLOCK_M=16, BLOCK_N=bn,
                        num_warps=warps, num_stages=stages)
                try:
                    us = timeit(go)
                    err = (out.to(torch.bfloat16).float() - ref.float()).abs().max().item()
                    print(f"  block_n {bn:3d} warps {warps} stages {stages}: {us:6.1f} us  err {err:.1e}")
                except Exception as ex:  # noqa: BLE001
                    print(f"  block_n {bn} warps {warps} stages {stages}: {type(ex).__name__}")
