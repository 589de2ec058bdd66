"""The chain drafts inside the device cycle: MTP (docs/semantics.md 6.10) and the DFlash block
(6.11), as draft strategies of `EagleCycle`.

Both draft a chain (topk 1, D = S + 1), so the EAGLE cycle's verify, accept, commit, EOS cut,
emit and packed result serve them unchanged (`ops.chain_verify_rows` reads the S drafts from
`EagleState.kept_tokens`); each class replaces `draft` (what is written to kept_tokens and to the
draft K/V), and DFlash its greedy verify (`_verify_greedy`: the block op). Like EAGLE's draft they
are tensor functions of the running rows: no host reads, no loops over requests, inactive lanes
(q_lens 0) write only the sink, so the whole cycle is still captured as one graph per bucket.

Layout of the draft cache (n = the root's position, the draft prefix = n entries, x_t at draft
index t - 1):

- MTP: head j owns draft K/V layer j. Every head j < S runs the draft-extend over the same rows.
  Step 0 is head 0's root row; step i (1 <= i < S) is head i's single row (d_i, the hidden of the
  row that produced d_i, position n + i) at draft index n of layer i, which sees head i's prefix
  and itself only. Heads 1.. write their context K/V only, from one embedding concat and plan;
  on a GPU on a side stream beside head 0's forward, joined before step 1 (`SideStream`).
- DFlash: the head owns layer 0. After the draft-extend, one forward of the S block rows (the
  mask token id vocab_size, feature g = the hidden of the root's row, positions n + 1 .. n + S) at
  draft indices n .. n + S - 1, each row seeing the prefix and every block row (bidirectional).
"""

from __future__ import annotations

import torch

from specverify import ops
from specverify.engine.eagle_cycle import EagleCycle
from specverify.engine.side_stream import SideStream
from specverify.models import Batch
from specverify.models.layers import lane_rows, lone_query_mask


class MtpCycle(EagleCycle):
    """The EAGLE cycle with the MTP chain draft: one head (and draft K/V layer) per draft step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.beside = SideStream(self.cache.table.req_to_token.device)

    def draft(self, rows, tokens, q_lens, feats, kv_lens, req_ids, finished) -> None:
        heads = self.models.mtp
        plan, batch = self._extend(rows, tokens, q_lens, kv_lens, req_ids, finished)
        # The other heads' context, K/V only, with one embedding concat and plan for all of them: on
        # a GPU beside head 0's forward (nothing reads their layers before step 1).
        if self.S > 1:
            with self.beside.fork():
                context = heads[1].context_input(self.cache, batch, feats)
                for j in range(1, self.S):
                    heads[j].write_kv(self.cache, batch, feats, context=context)
        root = heads[0].forward(self.cache, batch, feats, at=plan.last)   # head 0 drafts d_1 from the root's row
        self.beside.join()
        # d_1 from the root's row; the row that produced it feeds step 1.
        self.steps(rows, root.logits[:, 0], root.scale[:, 0], root.hidden, plan, req_ids)

    def steps(self, rows, logits, scale, hidden, plan, req_ids) -> None:
        """d_1 from head 0's root-row logits [bs, V] (scale [bs, 1]), then steps 1..S-1, each token
        kept in its state row's column. hidden [bs, 1, H]: the row that produced d_1."""
        heads, kept = self.models.mtp, self.state.kept_tokens
        token = self._top1(logits, scale, (kept[:, 0], rows))               # [bs, 1] d_1, kept in its row
        sees_itself, no_parent = lone_query_mask(rows.shape[0], 1, rows.device)
        for step in range(1, self.S):
            # Head `step` runs d_step at position n + step, written at draft index n of its layer.
            batch = Batch(token, plan.ahead[:, step - 1:step], rows, plan.root, plan.live, sees_itself, no_parent, 0,
                          req_ids=req_ids, slots=plan.ahead_slots[:, :1])
            out = heads[step].forward(self.cache, batch, hidden)
            token = self._top1(out.logits[:, 0], out.scale[:, 0], (kept[:, step], rows))
            hidden = out.hidden

    def _top1(self, logits, scale, keep) -> torch.Tensor:
        """6.1 with k = 1 of logits [bs, V] (scale [bs, 1]) -> [bs, 1] int64, also written to
        keep's column at the lanes' rows."""
        return ops.draft_token(logits, self.profile, scale, keep)


class DFlashCycle(EagleCycle):
    """The EAGLE cycle with the DFlash block draft (one bidirectional forward of S mask rows) and
    the block op as its greedy verify."""

    def draft(self, rows, tokens, q_lens, feats, kv_lens, req_ids, finished) -> None:
        head, s = self.models.dflash, self.S
        bs = tokens.shape[0]
        plan, batch = self._extend(rows, tokens, q_lens, kv_lens, req_ids, finished)
        context = head.hidden_states(self.cache, batch, feats)
        root_hidden = lane_rows(context, plan.last)[:, 0]                                   # [bs, H] g
        mask_ids = torch.full((bs, s), self.models.config.vocab_size, dtype=torch.int64, device=tokens.device)
        bidirectional = torch.ones((bs, s, s), dtype=torch.bool, device=tokens.device)
        # The block rows at positions n + 1 .. n + S, after the root's prefix n.
        block = Batch(mask_ids, plan.ahead, rows, plan.root, plan.live * s,
                      bidirectional, torch.full_like(mask_ids, -1), 0, req_ids=req_ids, slots=plan.ahead_slots)
        out = head.forward(self.cache, block, root_hidden[:, None, :].expand(-1, s, -1))
        index = ops.draft_token(out.logits.reshape(bs * s, -1), self.profile, out.scale.reshape(bs * s, 1))
        self.state.kept_tokens[rows] = index.view(bs, s)

    def _verify_greedy(self, tree, predict: torch.Tensor):
        """Greedy verify by the block op (6.11), its result as the chain's accepted path."""
        correct, bonus = ops.dflash_correct_drafts_and_bonus(candidates=tree.tokens, target_predict=predict,
                                                             checked=self.checked)
        num_correct = correct.to(torch.int64)
        j = torch.arange(self.S + 1, device=num_correct.device)[None, :]
        accept = torch.where(j <= num_correct[:, None], j, -1)
        return accept, num_correct, bonus
