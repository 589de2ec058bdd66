"""Where MTP's context writes can go cheaper (issue 25): the medium MTP S3 cycle at bs 8, steered 0.7,
captured, with heads 1..S-1's draft-extend K/V writes (`DraftHead.write_kv`) made five ways:

- engine:  as `MtpCycle.draft` does now (one concat and plan for heads 1.., on a side stream
           beside head 0's forward);
- base:    as the engine did before (8513623): after head 0's forward, each head its own
           embedding concat, plan, fc, norm, q|k|v and write;
- overlap: base's writes on a side stream, beside head 0's forward (forked after the plan, joined
           before the first draft step);
- shared:  heads 1.. with one concat and plan, their fc matmuls in one batched matmul, in order;
- both:    shared, on the side stream.

Each variant is its own decoder (its own capture); they step in turns, 5 timed steps a turn, and the
target-only step is timed beside them.

    PYTHONPATH=. python3 benchmarks/experiments/mtp_context.py [--bs 8] [--preset medium] [--turns 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from bench_device_cycle import make_prompts, precapture  # noqa: E402
from kernel_sequence import CASES, make  # noqa: E402
from specverify.engine.block_drafts import MtpCycle  # noqa: E402
from specverify.kernels.fused_layers import embed_concat_impl  # noqa: E402
from specverify.models import build_models  # noqa: E402
from specverify.models import layers  # noqa: E402
from tests.support.steering import steered_models  # noqa: E402

BASE_DRAFT = MtpCycle.draft


def _inner(head):
    return getattr(head, "inner", head)


def _context_writes(cycle, batch, feats, shared: bool):
    heads = [_inner(h) for h in cycle.models.mtp]
    if not shared:
        for j in range(1, cycle.S):
            cycle.models.mtp[j].write_kv(cycle.cache, batch, feats, context=None)
        return
    h0 = heads[0]
    concat = embed_concat_impl(batch.input_ids, h0.embed, feats.to(h0.embed.dtype))      # [bs, q, 2H]
    plan = layers.plan_attention(batch, cycle.cache.table.req_to_token, h0.rotary, concat.dtype)
    if not hasattr(cycle, "_fc_stack"):
        cycle._fc_stack = torch.stack([h.w["fc"] for h in heads[1:]], 0)                  # [S-1, 2H, H]
    bs, q, two_h = concat.shape
    xs = torch.bmm(concat.reshape(1, bs * q, two_h).expand(cycle.S - 1, -1, -1), cycle._fc_stack)
    for j, head in enumerate(heads[1:], start=1):
        cfg = head.config
        x = xs[j - 1].view(bs, q, -1)
        n, _ = layers.add_rmsnorm(x, None, head.w["layer.attn_norm"], cfg.norm_eps)
        layers.write_kv(x, head.w, "layer", cycle.cache.draft_kv.k[head.kv_layer], cycle.cache.draft_kv.v[head.kv_layer],
                        plan, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                        qkv=n @ head.w["layer.wqkv"])


def variant(shared: bool, overlap: bool):
    def draft(self, rows, tokens, q_lens, feats, kv_lens, req_ids, finished) -> None:
        heads = self.models.mtp
        plan, batch = self._extend(rows, tokens, q_lens, kv_lens, req_ids, finished)
        side = None
        if overlap:
            side = getattr(self, "_side", None) or torch.cuda.Stream()
            self._side = side
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                _context_writes(self, batch, feats, shared)
        root = heads[0].forward(self.cache, batch, feats, at=plan.last)
        if not overlap:
            _context_writes(self, batch, feats, shared)
        else:
            torch.cuda.current_stream().wait_stream(side)
        self.steps(rows, root.logits[:, 0], root.scale[:, 0], root.hidden, plan, req_ids)
    return draft


VARIANTS = {"engine": None, "base": variant(False, False), "overlap": variant(False, True),
            "shared": variant(True, False), "both": variant(True, True)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bs", type=int, default=8)
    ap.add_argument("--preset", default="medium")
    ap.add_argument("--turns", type=int, default=4)
    args = ap.parse_args()
    models = build_models(args.preset, seed=0, device="cuda", compute_dtype="bfloat16", logits_dtype="bfloat16")
    spec = CASES["mtp"]
    prompts = make_prompts(args.bs, models.config.vocab_size, 0)
    models = steered_models(models, prompts, 200, agreement=0.7, spec=spec)
    decs = {}
    for name, fn in VARIANTS.items():
        MtpCycle.draft = fn or BASE_DRAFT
        try:
            decs[name] = make(models, spec, args.bs, True)
            precapture(decs[name], args.bs)
        finally:
            MtpCycle.draft = BASE_DRAFT
    decs["target"] = make(models, None, args.bs, True)
    precapture(decs["target"], args.bs)
    for dec in decs.values():
        for _ in range(2):
            dec.step()
    times = {name: [] for name in decs}
    for _ in range(args.turns):
        for name, dec in decs.items():
            for _ in range(5):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                dec.step()
                end.record()
                torch.cuda.synchronize()
                times[name].append(start.elapsed_time(end))
    # The variants must decode alike: the same emitted tokens.
    outs = {name: [list(r.output) for r in dec.running()] for name, dec in decs.items() if name != "target"}
    same = all(o == outs["engine"] for o in outs.values())
    print(f"# {args.preset} MTP S3 steered 0.7 bs {args.bs}, {args.turns} turns of 5 steps; outputs alike: {same}")
    tgt = statistics.median(times["target"])
    print("| variant | median ms / step | mean | min | / target step |\n|---|---|---|---|---|")
    for name, t in times.items():
        print(f"| {name} | {statistics.median(t):.3f} | {statistics.mean(t):.3f} | {min(t):.3f} | "
              f"{statistics.median(t) / tgt:.3f}x |")


if __name__ == "__main__":
    main()
