"""Block-size sweep of the paged attention kernel (decode, bs 64, 8K context, bf16)."""
import sys, os
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import torch
from specverify.kernels.attention import paged_attention_impl
bs, ctx, nh, nkv, hd = 64, 8192, 8, 4, 64
dev = "cuda"
slots = 1 + bs * ctx
k = torch.randn((slots, nkv, hd), dtype=torch.bfloat16, device=dev)
v = torch.randn((slots, nkv, hd), dtype=torch.bfloat16, device=dev)
table = (1 + torch.randperm(bs * ctx, device=dev)).view(bs, ctx)
rows = torch.arange(bs, device=dev)
kv = torch.full((bs,), ctx - 1, device=dev)
ql = torch.ones(bs, dtype=torch.int64, device=dev)
q = torch.randn((bs, 1, nh, hd), dtype=torch.bfloat16, device=dev)
mask = torch.ones((bs, 1, 1), dtype=torch.bool, device=dev)
ref = paged_attention_impl(q, k, v, table, rows, kv, ql, mask, 0, 0.125, impl="torch")
for bn in (32, 64, 128, 256):
    out = paged_attention_impl(q, k, v, table, rows, kv, ql, mask, 0, 0.125, block_n=bn)
    err = (out - ref).abs().max().item()
    for _ in range(3):
        paged_attention_impl(q, k, v, table, rows, kv, ql, mask, 0, 0.125, block_n=bn)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(20):
        paged_attention_impl(q, k, v, table, rows, kv, ql, mask, 0, 0.125, block_n=bn)
    e.record(); torch.cuda.synchronize()
    us = s.elapsed_time(e) / 20 * 1e3
    gb = bs * ctx * nkv * hd * 2 * 2 / 1e9
    print(f"block_n {bn}: {us:.0f} us, {gb / us * 1e6 / 1e3:.2f} TB/s, err {err:.1e}")
