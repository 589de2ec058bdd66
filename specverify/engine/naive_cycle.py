"""One naive-EAGLE cycle (D = 2, S = 1, topk = 1): target verify and the next draft-extend fused
in one tensor function, captured as one CUDA graph per batch-size bucket.

Per request with n cached tokens, pending root x_n and draft token d:
- verify: the target runs [x_n, d] at positions [n, n+1], each token a decode query over an
  explicit slot list (`ops.create_draft_kv_indices`: n+1 and n+2 slots, the query's own
  included) read by `ops.decode_attention_indexed`;
- accept: greedy (d == argmax at the root), exact sampling (d was drawn from the draft's q;
  accept with probability min(1, p(d)/q(d)), else draw from max(p - q, 0)), or the original
  inexact shortcut (SpecConfig.naive_sampling); the K/V of both verify tokens already sit at
  [n, n+2), so nothing moves: a rejected draft's entry is overwritten by the next cycle;
- draft-extend: always both rows, (e_0, h_n) and (e_1, h_{n+1}) at draft indices n and n+1, where
  e_0 is the first emitted token and e_1 the second (the bonus after an accepted draft; after a
  rejection, any token: its row is dropped); the next draft comes from the row of the last emitted token
  (the "save index": the second row if the draft was accepted, else the first). The second row of
  a rejected draft is computed and dropped, so the extend has one shape whatever was accepted.

It is a chain cycle of one draft, so its bookkeeping is the EAGLE chain cycle's step ops, one
kernel each on a GPU: `ops.chain_verify_rows` reads [x_n, d] off the request rows (6.19),
`verify_greedy` walks the greedy accept over the chain (6.3), `ops.accepted_tokens` makes
[e_0, e_1] (6.17: after a rejection e_1 is its padding, 0), `ops.emit_tokens` cuts and books them
(6.15) and `ops.draft_plan` places the extend (6.18).

The unfused form (`fused=False`) runs the verify, reads the accept counts back to the host, then
a draft-extend over exactly the emitted tokens, as an engine without the fusion does; it must
produce the same cycle.

Uniforms (docs/semantics.md 6.7), for a cycle whose root sits at position n: the draft token
drawn for it u(seed, r, n, 0), the accept coin u(seed, r, n, 1), the residual or bonus draw
u(seed, r, n, 2).
"""

from __future__ import annotations

import dataclasses

import torch

from specverify.engine.device_state import RequestState, extend_batch
from specverify.engine.eagle_cycle import packed_width
from specverify.engine.penalties import penalize, tree_counts
from specverify.engine.sampling import SamplingParams, dequantize, probs_from_z, sampling_probs
from specverify.engine.spec_config import SpecConfig
from specverify.engine.state_commit import commit_recurrent_states, tracking_step
from specverify.engine.uniforms import counter_uniforms
from specverify.kernels.tree import chain_tree_of
from specverify.kernels.verify import inverse_cdf, target_predict, verify_greedy, verify_naive
from specverify.models import Batch, ModelCache, Models
from specverify.models.kv_cache import SINK_SLOT
from specverify.models.layers import chain_offsets
from specverify.ops import (accepted_tokens, chain_verify_rows, create_draft_kv_indices, draft_plan, draft_token,
                            emit_tokens)
from specverify.platform import PlatformProfile

DRAFT_DRAW, COIN_DRAW, FINAL_DRAW = 0, 1, 2


@dataclasses.dataclass
class NaiveState:
    """Per slot-table row: the request state and the draft token the next verify checks."""
    requests: RequestState
    draft: torch.Tensor            # [R] int64
    draft_q: torch.Tensor          # [R, V] float64 the draft's distribution (exact sampling), else [R, 0]
    draft_p: torch.Tensor          # [R] float64 the draft's probability of its token (shortcut)

    @classmethod
    def empty(cls, rows: int, vocab: int, keep_q: bool, device) -> "NaiveState":
        return cls(RequestState.empty(rows, device), torch.zeros(rows, dtype=torch.int64, device=device),
                   torch.zeros((rows, vocab if keep_q else 0), dtype=torch.float64, device=device),
                   torch.ones(rows, dtype=torch.float64, device=device))


class NaiveCycle:
    def __init__(self, models: Models, cache: ModelCache, state: NaiveState, config: SpecConfig,
                 params: SamplingParams, *, seed: int, eos_token_id: int | None, profile: PlatformProfile,
                 with_logits: bool = False, fused: bool = True):
        self.models, self.cache, self.state, self.params = models, cache, state, params
        self.seed, self.eos, self.profile = seed, eos_token_id, profile
        self.mode = "greedy" if params.greedy else config.naive_sampling
        self.with_logits, self.fused = with_logits, fused
        self.width = packed_width(config)
        self.track_interval = config.state_track_interval

    # -- the draft --------------------------------------------------------------------------------
    def draft(self, rows, tokens, q_lens, feats, kv_lens, req_ids, finished, last) -> None:
        """Draft-extend q_lens[b] tokens after kv_lens[b] draft entries and propose the next draft
        token from row last[b]. Lanes `finished` write nothing to the caches."""
        st = self.state
        # x_t sits at draft index t - 1, position t (6.18: the EAGLE draft-extend's plan, one kernel).
        plan = draft_plan(q_lens=q_lens, kv_lens=kv_lens, finished=finished, width=tokens.shape[1], num_steps=1,
                          req_to_token=self.cache.table.req_to_token, rows=rows, ahead_tokens=0, sink=SINK_SLOT,
                          checked=False)
        batch = extend_batch(rows, kv_lens, tokens, plan.q_lens, req_ids, positions=plan.positions, slots=plan.slots)
        out = self.models.draft.forward(self.cache, batch, feats, at=last)     # row last[b] only
        logits, scale = out.logits[:, 0], out.scale[:, 0]           # [bs, V], [bs, 1]
        if self.mode == "exact":
            q = sampling_probs(logits, scale, self.params)
            root = kv_lens + last + 1                                # the position of the next root
            u = counter_uniforms(self.seed, req_ids, root, torch.full_like(root, DRAFT_DRAW))
            st.draft[rows] = inverse_cdf(q, u)
            st.draft_q[rows] = q
            return
        index = draft_token(logits, self.profile, scale)
        st.draft[rows] = index[:, 0]
        if self.mode == "inexact_shortcut":
            # the original's topk_p: the draft softmax probability of its argmax token
            z = logits.to(torch.float64) * scale.to(torch.float64)
            st.draft_p[rows] = torch.softmax(z, -1).gather(1, index)[:, 0]

    # -- verify -------------------------------------------------------------------------------------
    def verify(self, inp: dict) -> dict:
        """Target verify, accept, the EOS / budget cut and the state update; returns what the
        draft-extend needs and the packed result."""
        rs, st = self.state.requests, self.state
        rows = inp["rows"]
        bs = rows.shape[0]
        # [root, d] read off the request rows in one op (6.19: a chain of one draft).
        table = self.cache.table.req_to_token
        chain = chain_verify_rows(rows=rows, seq_len=rs.seq_len, pending=rs.pending, finished=rs.finished,
                                  req_id=rs.req_id, drafts=st.draft[:, None], req_to_token=table, sink=SINK_SLOT,
                                  checked=False)
        n, req_ids, live, tokens = chain.seq_lens, chain.req_ids, chain.live, chain.tokens
        tree = chain_tree_of(tokens, chain.positions)
        kv_indptr = torch.empty(2 * bs + 1, dtype=torch.int64, device=rows.device)
        kv_indices = torch.empty(bs * (2 * table.shape[1] + 3), dtype=torch.int64, device=rows.device)
        index_list = create_draft_kv_indices(req_to_token=table, rows=rows, seq_lens=n, kv_indptr=kv_indptr,
                                             kv_indices=kv_indices, checked=False)
        batch = Batch(tokens, chain.positions, rows, n, chain.q_lens, tree.mask, tree.parents, req_ids=req_ids,
                      kv_index_list=index_list, slots=chain.slots)
        out = self.models.target.forward(self.cache, batch, commit_state=False)
        accept, num_correct, bonus = self._accept(out, rows, tree, n, req_ids)
        # [e0, e1]: the draft then the bonus after an accepted draft, the bonus then 0 after a
        # rejection (6.17); count = num_correct + 1 of them are real.
        produced, count = accepted_tokens(tree_tokens=tokens, accept=accept, num_correct=num_correct, bonus=bonus,
                                          checked=False)
        # The EOS / budget cut and the state update (section 5, 6.15): one op, in place.
        head, taken, finished = emit_tokens(produced=produced, count=count, rows=rows, seq_len=rs.seq_len,
                                            pending=rs.pending, emitted=rs.emitted, budget=rs.budget,
                                            finished=rs.finished, eos_token_id=self.eos, checked=False)
        # The state rows hold the cycle's results now: what follows reads n, live and tokens, taken before.
        if out.rec_states is not None:
            # The tracking slot only counts what the EOS / budget cut lets through (taken - 1 drafts).
            tracked = None if self.track_interval is None else tracking_step(
                path=chain_offsets(2, rows.device).expand(bs, 2), num_correct=taken - 1, seq_lens=n,
                interval=self.track_interval, live=live)
            commit_recurrent_states(states=self.cache.states, recurrent=out.rec_states, conv=out.conv_states,
                                    rows=rows, steps=torch.where(live, num_correct, -1),   # the state after the last kept node
                                    tracking_steps=tracked)
        if rs.penalty is not None:
            rs.penalty.record(rows, produced, taken)

        packed = torch.cat([head, tokens, tree.parents, accept], 1)
        result = {"packed": packed}
        if self.with_logits:
            ar = torch.arange(bs, device=rows.device)
            nodes = accept.clamp(min=0)
            result["logits"] = out.logits[ar[:, None], nodes]
            result["scale"] = out.scale[ar[:, None], nodes]
        extend = {"rows": rows, "produced": produced, "count": count, "num_correct": num_correct, "hidden": out.hidden,
                  "n": n, "req_ids": req_ids, "finished": finished, "verify_q_lens": chain.q_lens}
        return result, extend

    def _accept(self, out, rows, tree, n, req_ids):
        """(accept [bs, 2] the accepted nodes, -1 past them; num_correct [bs] 0 / 1; bonus [bs]): whether
        the draft is accepted, and the token emitted after the accepted nodes. With a penalty on,
        both target rows are penalized by their own context (the output so far; the draft token too
        for the second row); the draft is not."""
        bs, _, v = out.logits.shape
        tokens = tree.tokens
        penalty = self.state.requests.penalty
        if penalty is not None:
            counts, prompt = penalty.context(rows)
            z = dequantize(out.logits.reshape(bs * 2, v), out.scale.reshape(bs * 2, 1)).view(bs, 2, v)
            z = penalize(z, tree_counts(counts, tokens, tree.mask), prompt[:, None, :], self.params)
        if self.mode == "greedy":
            predict = target_predict(out.logits) if penalty is None else torch.argmax(z, dim=-1)   # [bs, 2]
            # A chain of one draft: 6.3's walk over [root, d] (one kernel on a GPU).
            return verify_greedy(tree, predict, num_steps=1)
        if penalty is None:
            p = sampling_probs(out.logits.reshape(bs * 2, v), out.scale.reshape(bs * 2, 1), self.params)
        else:
            p = probs_from_z(z.reshape(bs * 2, v), self.params)
        draws = torch.stack([torch.full_like(n, COIN_DRAW), torch.full_like(n, FINAL_DRAW)], 1)   # no host list
        u = counter_uniforms(self.seed, req_ids[:, None], n[:, None], draws)      # [bs, 2]
        coin, final = u[:, 0].contiguous(), u[:, 1].contiguous()
        if self.mode == "exact":
            shortcut = {"draft_q": self.state.draft_q[rows]}
        else:
            shortcut = {"draft_p": self.state.draft_p[rows]}
        accept, num_correct, bonus = verify_naive(p.view(bs, 2, v), tokens[:, 1], coin, final, checked=False,
                                                  **shortcut)
        return accept, num_correct, bonus

    # -- the cycle --------------------------------------------------------------------------------
    def __call__(self, inp: dict) -> dict:
        result, ext = self.verify(inp)
        if self.fused:
            # Both rows, one shape: e_0 with h_n, e_1 with h_{n+1} (after a rejection its row is
            # dropped); the next draft from row count - 1 = num_correct. The verify's q_lens (2 on
            # a lane live before the cycle) are the extend's: the plan zeroes the lanes it finished.
            self.draft(ext["rows"], ext["produced"], ext["verify_q_lens"], ext["hidden"][:, :2], ext["n"],
                       ext["req_ids"], ext["finished"], ext["num_correct"])
        else:
            # An engine without the fusion: the accept counts come back to the host, and the
            # draft-extend runs over exactly the emitted tokens.
            counts = ext["count"].tolist()
            width = max(counts)
            q_lens = torch.tensor(counts, dtype=torch.int64, device=ext["n"].device)
            self.draft(ext["rows"], ext["produced"][:, :width], q_lens, ext["hidden"][:, :width], ext["n"],
                       ext["req_ids"], ext["finished"], q_lens - 1)
        return result
