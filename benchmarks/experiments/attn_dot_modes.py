"""How the paged attention kernel computes its two products, and what that costs (issue 25;
docs/semantics.md 6.20): IEEE float32 products on the FMA units (`input_precision="ieee"`, the
kernel's path for float32 inputs and on ROCm) against the TF32 tensor cores with the probabilities
split into their TF32 part and the float32 rest (its path for bfloat16 / float16 on NVIDIA). Each
at decode sizes, bfloat16, timed as 20 calls replayed from one CUDA graph, with its largest error
against the float64 torch path.

    PYTHONPATH=. python3 benchmarks/experiments/attn_dot_modes.py
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

from _common import graph_ms  # noqa: E402

from attn_latency_sweep import case  # noqa: E402
from specverify.kernels import attention  # noqa: E402

CALLS = 20


def main() -> None:
    chosen = attention.tf32_exact
    for bs, nq, ctx, nkv, hd in ((1, 1, 64, 4, 64), (1, 4, 64, 4, 64), (8, 4, 64, 4, 64), (1, 1, 512, 4, 64),
                                 (1, 1, 128, 8, 128), (1, 4, 128, 8, 128), (8, 1, 128, 4, 64)):
        args = case(bs, nq, ctx, nkv, hd)
        ref = attention.paged_attention_impl(*(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point()
                                               else a for a in args), impl="torch")
        line = []
        for name, tf32 in (("ieee", False), ("tf32 split", True)):
            attention.tf32_exact = lambda dtype, tf32=tf32: tf32     # noqa: E731 - the path under test
            fn = lambda: attention.paged_attention_impl(*args)      # noqa: E731
            err = (fn().double() - ref).abs().max().item()
            line.append(f"{name} {graph_ms(fn, CALLS) * 1e3:.2f} us (err {err:.1e})")
        attention.tf32_exact = chosen
        print(f"bs {bs} q {nq} ctx {ctx} kv {nkv}x{hd}: " + "; ".join(line), flush=True)


if __name__ == "__main__":
    main()
