"""What a decode-size paged attention call spends its ~12 us on (issue 25): the engine's kernel
against variants of it that each drop one piece, all timed as 20 calls replayed from one CUDA
graph (bfloat16, the small preset's 8 query / 4 KV heads x 64):

- `engine`: `paged_attention_impl` as the model calls it (int8 mask, bfloat16 output);
- `copy`: a variant whose loop is skipped (loads q, stores zeros): the launch and the prologue;
- `dot`: the engine kernel's body as a copy (the baseline for the variants below);
- `no-mask`: no tree-mask load (every key seen);
- `no-table`: keys at slot t (no slot-table indirection);
- `bsum`: the products by broadcast and sum instead of `tl.dot` (BLOCK_M only the live rows);
- `no-pv`: no P.V product (a column sum of V in its place); `pv-bf16-mma` / `qk-bf16-mma`: that
  product on bfloat16 tensor cores (timing probes: not the engine's numerics);
- `sdpa`: torch's scaled_dot_product_attention over contiguous K / V (what the hardware does with a
  library kernel).

`_variant` repeats the engine kernel's online-softmax update on purpose: the probes switch its
pieces off one by one, and the engine's kernel carries no probe flags (nothing test-only lives in
`specverify/`). The inputs are attn_latency_sweep.py's.

    PYTHONPATH=. python3 benchmarks/experiments/attn_anatomy.py
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from _common import graph_ms  # noqa: E402
from attn_latency_sweep import case  # noqa: E402  (the sweep's decode-size inputs: this directory is on the path)

from specverify.kernels.attention import paged_attention_impl  # noqa: E402

CALLS = 20


@triton.jit
def _variant(q_ptr, k_ptr, v_ptr, out_ptr, table_ptr, kv_lens_ptr, q_lens_ptr, mask_ptr, num_q, group, scale,
             max_ctx, nkv,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr):
    # MODE 0: dot; 1: no mask; 2: no table; 3: broadcast-sum; 4: skip the loop; 5: no P.V product;
    # 6: P.V on bfloat16 tensor cores; 7: Q.K on bfloat16 tensor cores (timing probes only). q / out [bs, nq, nh, hd]
    # contiguous, k / v [slots, nkv, hd] contiguous, table [bs, max_ctx], mask [bs, nq, nq] int8.
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    kv_len = tl.load(kv_lens_ptr + b)
    q_len = tl.load(q_lens_ptr + b)
    live_len = kv_len + q_len
    nh = nkv * group
    m = tl.arange(0, BLOCK_M)
    j = m % num_q
    head = kvh * group + m // num_q
    row_ok = m < group * num_q
    row_live = row_ok & (j < q_len)
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + ((b * num_q + j[:, None]) * nh + head[:, None]) * HEAD_DIM + d[None, :],
                mask=row_live[:, None], other=0.0).to(tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    end = live_len
    if MODE == 4:
        end = 0
    for start in range(0, end, BLOCK_N):
        t = start + tl.arange(0, BLOCK_N)
        key_live = t < live_len
        if MODE == 2:
            slot = t
        else:
            slot = tl.load(table_ptr + b * max_ctx + t, mask=key_live, other=0)
        k = tl.load(k_ptr + (slot[:, None] * nkv + kvh) * HEAD_DIM + d[None, :], mask=key_live[:, None],
                    other=0.0).to(tl.float32)
        v = tl.load(v_ptr + (slot[:, None] * nkv + kvh) * HEAD_DIM + d[None, :], mask=key_live[:, None],
                    other=0.0).to(tl.float32)
        r = t - kv_len
        in_region = (r >= 0) & key_live
        if MODE == 1:
            seen = row_live[:, None] & key_live[None, :]
        else:
            tree = tl.load(mask_ptr + (b * num_q + j[:, None]) * num_q + r[None, :],
                           mask=row_live[:, None] & in_region[None, :], other=0)
            seen = row_live[:, None] & (((r < 0)[None, :] & key_live[None, :]) | (tree != 0))
        if MODE == 3:
            s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale
        elif MODE == 7:
            s = tl.dot(q.to(tl.bfloat16), tl.trans(k.to(tl.bfloat16))) * scale
        else:
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.where(seen, tl.exp(s - m_safe[:, None]), 0.0)
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if MODE == 3:
            pv = tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        elif MODE == 5:
            pv = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32) + tl.sum(v, axis=0)[None, :]
        elif MODE == 6:
            pv = tl.dot(p.to(tl.bfloat16), v.to(tl.bfloat16))
        else:
            pv = tl.dot(p, v, input_precision="ieee")
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    denom = tl.where(l_i > 0, l_i, 1.0)
    out = tl.where((l_i > 0)[:, None], acc / denom[:, None], 0.0)
    tl.store(out_ptr + ((b * num_q + j[:, None]) * nh + head[:, None]) * HEAD_DIM + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def main() -> None:
    modes = {"dot": 0, "no-mask": 1, "no-table": 2, "bsum": 3, "copy": 4, "no-pv": 5, "pv-bf16-mma": 6,
             "qk-bf16-mma": 7}
    print("| bs | q | ctx | engine | " + " | ".join(modes) + " | sdpa | bsum max err vs engine |")
    print("|---|---|---|---|" + "---|" * (len(modes) + 2))
    for bs, nq, ctx in ((1, 1, 64), (1, 4, 64), (8, 4, 64), (1, 1, 256), (8, 1, 256), (1, 4, 512), (64, 1, 128)):
        q, k, v, table, rows, kv_lens, q_lens, mask, _, scale = case(bs, nq, ctx)
        mask = mask.to(torch.int8)                       # as the model hands it to the kernel
        nkv, hd = k.shape[1], k.shape[2]
        group = q.shape[2] // nkv

        def engine():
            return paged_attention_impl(q, k, v, table, rows, kv_lens, q_lens, mask, 0, scale, out_dtype=q.dtype)

        cells = [graph_ms(engine, CALLS) * 1e3]
        outs = {}
        for name, mode in modes.items():
            out = torch.empty_like(q)
            block_m = max(16 if mode != 3 else 1, triton.next_power_of_2(group * nq))
            block_n = 64 if mode != 3 else 32

            def fn(out=out, mode=mode, block_m=block_m, block_n=block_n):
                _variant[(bs, nkv)](q, k, v, out, table, kv_lens, q_lens, mask, nq, group, scale, table.shape[1], nkv,
                                    HEAD_DIM=hd, BLOCK_M=block_m, BLOCK_N=block_n, MODE=mode)
            cells.append(graph_ms(fn, CALLS) * 1e3)
            fn()
            outs[name] = out
        kc = k[table.flatten()].view(bs, -1, nkv, hd).transpose(1, 2)        # [bs, nkv, T, hd]
        vc = v[table.flatten()].view(bs, -1, nkv, hd).transpose(1, 2)
        qc = q.transpose(1, 2)                                                # [bs, nh, nq, hd]
        kc = kc.repeat_interleave(group, 1).contiguous()
        vc = vc.repeat_interleave(group, 1).contiguous()
        cells.append(graph_ms(lambda: F.scaled_dot_product_attention(qc, kc, vc), CALLS) * 1e3)
        err = (outs["bsum"].float() - engine().float()).abs().max().item()
        print(f"| {bs} | {nq} | {ctx} | " + " | ".join(f"{c:.2f}" for c in cells) + f" | {err:.1e} |", flush=True)


if __name__ == "__main__":
    main()
