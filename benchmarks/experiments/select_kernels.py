"""What a row's selection costs in a captured step (issue 25): the draft's token argmax and the
benchmark's steering knob, each as it runs now (two kernels: a pass over vocabulary blocks, then a
per-row merge) against one program per row that loads the whole row at once.

A k1 cycle runs one argmax and one steering per draft forward (S = 3 of them) and one argmax over
the verify's D rows; each is [rows, V] logits. The candidates here are timing probes only (the row
maximum and its first index; the steering's scalar reads and its one store), not the engine's
kernels: they say whether a one-kernel form is worth building.

    PYTHONPATH=. python3 benchmarks/experiments/select_kernels.py [--rows 1 8 32] [--vocab 32000 128256]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from _common import graph_ms  # noqa: E402
from specverify.kernels.argmax import row_argmax  # noqa: E402
from tests.support.steering import steer_logits_fused, steering_plan  # noqa: E402


@triton.jit
def _argmax_one_kernel(x_ptr, out_ptr, vocab, s_x, BLOCK: tl.constexpr, CHUNKS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    best = float("-inf")
    first = vocab
    for c in tl.static_range(CHUNKS):
        cols = c * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * s_x + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
        m = tl.max(x, axis=0)
        i = tl.min(tl.where(x == m, cols, vocab), axis=0)
        take = m > best
        first = tl.where(take, i, first)
        best = tl.where(take, m, best)
    tl.store(out_ptr + row, first)


@triton.jit
def _steer_one_kernel(x_ptr, req_ptr, pos_ptr, tok_ptr, oracle_ptr, plan_ptr, vocab, s_x, s_o,
                      BLOCK: tl.constexpr, CHUNKS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    r = tl.load(req_ptr + row)
    p = tl.load(pos_ptr + row)
    tok = tl.load(tok_ptr + row)
    known = tl.load(oracle_ptr + r * s_o + p)
    decided = tl.load(plan_ptr + r * s_o + p)
    best = float("-inf")
    for c in tl.static_range(CHUNKS):
        cols = c * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * s_x + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
        best = tl.maximum(best, tl.max(x, axis=0))
    nxt = tl.maximum(decided, 0)
    tl.store(x_ptr + row * s_x + nxt, (best + 8.0).to(x_ptr.dtype.element_ty), mask=known == tok)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--vocab", type=int, nargs="+", default=[32000, 128256])
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print("| rows | V | argmax now (2 kernels), us | one program a row: block / warps -> us | "
          "steering now (2 kernels), us | one program a row -> us |")
    print("|---|---|---|---|---|---|")
    for vocab in args.vocab:
        for rows in args.rows:
            x = torch.randn((rows, vocab), device="cuda").to(torch.bfloat16)
            out = torch.empty((rows,), dtype=torch.int64, device="cuda")
            now = graph_ms(lambda: row_argmax(x)) * 1e3
            ones = []
            for block, warps in ((32768, 8), (32768, 16), (32768, 32), (8192, 8), (16384, 16)):
                if block > 4 * triton.next_power_of_2(vocab):
                    continue
                chunks = triton.cdiv(vocab, block)

                def one(block=block, warps=warps, chunks=chunks):
                    _argmax_one_kernel[(rows,)](x, out, vocab, x.stride(0), BLOCK=block, CHUNKS=chunks,
                                                num_warps=warps)
                one()
                assert torch.equal(out[:, None], row_argmax(x)), "probe argmax disagrees"
                ones.append(f"{block}/{warps} -> {graph_ms(one) * 1e3:.1f}")
            ctx = 256
            oracle = torch.randint(0, vocab, (rows, ctx + 1), device="cuda")
            oracle[:, -1] = -1
            plan = steering_plan(oracle, 0.7, 0)
            req = torch.arange(rows, device="cuda")
            pos = torch.full((rows, 1), 40, dtype=torch.int64, device="cuda")
            tok = oracle[:, 40:41].clone()
            logits = x.view(rows, 1, vocab)
            steer_now = graph_ms(lambda: steer_logits_fused(logits, req, pos, tok, oracle, plan, in_place=True)) * 1e3
            steers = []
            for block, warps in ((32768, 8), (32768, 16), (16384, 16)):
                if block > 4 * triton.next_power_of_2(vocab):
                    continue
                chunks = triton.cdiv(vocab, block)

                def steer(block=block, warps=warps, chunks=chunks):
                    _steer_one_kernel[(rows,)](x, req, pos, tok, oracle, plan, vocab, x.stride(0), oracle.stride(0),
                                               BLOCK=block, CHUNKS=chunks, num_warps=warps)
                steers.append(f"{block}/{warps} -> {graph_ms(steer) * 1e3:.1f}")
            print(f"| {rows} | {vocab} | {now:.1f} | {'; '.join(ones)} | {steer_now:.1f} | {'; '.join(steers)} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
