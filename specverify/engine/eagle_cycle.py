"""One EAGLE speculative cycle as one tensor function of the running rows.

Verify forward over each request's draft tree, accept (greedy or stochastic, with the counter
uniforms; with a sampling penalty on, over each node's penalized logits), KV and recurrent-state
commit, the EOS / max_new_tokens cut (and the penalty counts of what it lets through), the
draft-extend over the emitted tokens and the S-1 draft steps: everything reads and writes the persistent state
(`EagleState`, the caches), nothing reads the host or the device back, so on CUDA the whole
cycle is captured as one graph per batch-size bucket. The result is one packed int64 tensor per
lane, which the host copies back once.

Layout of one request (n = tokens whose target K/V are cached, the pending root token sits at
position n): target cache indices [0, n) hold x_0..x_{n-1}; a verify writes its D tree nodes at
[n, n+D) and the commit moves the accepted ones down to [n, n+a+1). The draft head's entry for
token x_t (paired with the target hidden state of x_{t-1}) sits at draft cache index t-1, so its
prefix is also n long; the draft-tree steps write their k beams per step into the region after
the prefix.
"""

from __future__ import annotations

import dataclasses

import torch

from specverify.engine.device_state import RequestState, extend_batch
from specverify.engine.penalties import PenaltyState, penalize, tree_counts
from specverify.engine.sampling import SamplingParams, dequantize, probs_from_z, sampling_probs
from specverify.engine.spec_config import SpecConfig
from specverify.engine.state_commit import commit_recurrent_states, tracking_step
from specverify.engine.uniforms import counter_uniforms
from specverify.kernels.draft_plan import DraftPlan
from specverify.kernels.tree import build_tree, chain_tree_of
from specverify.kernels.verify import target_predict, verify_greedy, verify_stochastic
from specverify.models import Batch, ModelCache, Models
from specverify.models.kv_cache import SINK_SLOT
from specverify.models.layers import lone_query_mask, no_parents
from specverify.ops import (accepted_tokens, chain_verify_rows, commit_accepted_kv, draft_plan, draft_token, draft_topk,
                            emit_tokens)
from specverify.platform import PlatformProfile
from specverify.spec.eagle import expand_search, finish_search, start_search


@dataclasses.dataclass
class EagleState:
    """Per slot-table row: the request state and the draft the next verify checks."""
    requests: RequestState
    kept_flat: torch.Tensor       # [R, D-1] int64 (topk > 1 only: a chain leaves it unwritten)
    kept_tokens: torch.Tensor     # [R, D-1] int64
    beam_flat: torch.Tensor       # [R, max(S-1, 0), k] int64 (topk > 1 only)

    @classmethod
    def empty(cls, rows: int, config: SpecConfig, device) -> "EagleState":
        d, s, k = config.draft_tokens, config.num_steps, config.topk
        i64 = dict(dtype=torch.int64, device=device)
        return cls(RequestState.empty(rows, device), torch.zeros((rows, d - 1), **i64),
                   torch.zeros((rows, d - 1), **i64), torch.zeros((rows, max(s - 1, 0), k), **i64))


def packed_width(config: SpecConfig) -> int:
    """Columns of a lane's packed result: emitted [W], taken, finished, tree tokens [D], tree
    parents [D], accepted nodes [W] (W = S + 1)."""
    return 3 * (config.num_steps + 1) + 2 + 2 * config.draft_tokens


class EagleCycle:
    def __init__(self, models: Models, cache: ModelCache, state: EagleState, config: SpecConfig,
                 params: SamplingParams, *, seed: int, eos_token_id: int | None, profile: PlatformProfile,
                 with_logits: bool = False, checked: bool = False):
        """with_logits: also return the target logits rows of the accepted nodes (logprobs).
        checked: run the value checks of the tree and verify kernels (each reads the device)."""
        self.models, self.cache, self.state, self.params = models, cache, state, params
        self.seed, self.eos, self.profile = seed, eos_token_id, profile
        self.k, self.S, self.D = config.topk, config.num_steps, config.draft_tokens
        self.track_interval = config.state_track_interval
        self.with_logits, self.checked = with_logits, checked

    # -- draft -------------------------------------------------------------------------------
    def draft(self, rows, tokens, q_lens, feats, kv_lens, req_ids, finished) -> None:
        """Draft-extend q_lens[b] tokens (features feats [bs, q, H]) after kv_lens[b] draft
        entries, then the S-step tree search; the kept candidates go to the state rows. Lanes
        `finished` write nothing to the caches."""
        head, k, st = self.models.draft, self.k, self.state
        bs = tokens.shape[0]
        plan, batch = self._extend(rows, tokens, q_lens, kv_lens, req_ids, finished)
        out = head.forward(self.cache, batch, feats, at=plan.last)        # the root's row only: [bs, 1, ...]
        if k == 1:
            self._draft_chain(rows, out, plan, req_ids)
            return
        p0, idx0 = draft_topk(out.logits[:, 0], k, self.profile, out.scale[:, 0])
        search = start_search(p0, idx0, self.S)
        hidden = out.hidden.expand(-1, k, -1)                               # [bs, k, H]
        beams = plan.live * k
        for step in range(1, self.S):
            pos = plan.ahead[:, step - 1, None].expand(-1, k)               # beams sit at depth `step`
            region = (step - 1) * k
            dbatch = Batch(search.tokens, pos, rows, plan.root, beams, search.ancestors[:, :, :region + k],
                           no_parents(bs, k, rows.device), region, req_ids=req_ids)
            dout = head.forward(self.cache, dbatch, hidden)
            p, idx = draft_topk(dout.logits.reshape(bs * k, -1), k, self.profile, dout.scale.reshape(bs * k, 1))
            _, hidden = expand_search(search, step, p.view(bs, k, k), idx.view(bs, k, k), dout.hidden)
        kept_flat, kept_tokens, beam_flat = finish_search(search, self.D)
        st.kept_flat[rows] = kept_flat
        st.kept_tokens[rows] = kept_tokens
        st.beam_flat[rows] = beam_flat

    def _extend(self, rows, tokens, q_lens, kv_lens, req_ids, finished) -> tuple[DraftPlan, Batch]:
        """The draft phase's plan (6.18) and its draft-extend: x_t at draft index t - 1, position t,
        the root (the last live token) at plan.root; finished lanes run no token. Every draft of
        the family (EAGLE, MTP, DFlash; the cycle's and the prefill's) starts here. The plan also
        reads the extend's slots and the S after the root (a chain step's, an MTP head's, the
        DFlash block's), so those forwards plan no slots of their own."""
        plan = draft_plan(q_lens=q_lens, kv_lens=kv_lens, finished=finished, width=tokens.shape[1],
                          num_steps=self.S, req_to_token=self.cache.table.req_to_token, rows=rows, sink=SINK_SLOT,
                          checked=self.checked)
        return plan, extend_batch(rows, kv_lens, tokens, plan.q_lens, req_ids, positions=plan.positions,
                                  slots=plan.slots)

    def _draft_chain(self, rows, out, plan, req_ids) -> None:
        """The search with topk 1: a chain. Each step's one beam is the argmax child of the last
        (its score and flat index are never read: only the tokens reach the next tree, `ops.chain_verify_rows`),
        so the S - 1 steps run the head on the last token and keep the head's hidden state; step s
        sees the draft prefix and the region entries 0..s-1, its own the last."""
        head, bs, kept = self.models.draft, rows.shape[0], self.state.kept_tokens
        # Each draft token goes into its state row's column by the selection itself (no cat, no scatter).
        token = draft_token(out.logits[:, 0], self.profile, out.scale[:, 0], (kept[:, 0], rows))   # [bs, 1]
        hidden = out.hidden                                                     # [bs, 1, H]
        for step in range(1, self.S):
            seen, no_parent = lone_query_mask(bs, step, rows.device)
            dbatch = Batch(token, plan.ahead[:, step - 1:step], rows, plan.root, plan.live, seen, no_parent, step - 1,
                           req_ids=req_ids, slots=plan.ahead_slots[:, step - 1:step])
            dout = head.forward(self.cache, dbatch, hidden)
            token = draft_token(dout.logits[:, 0], self.profile, dout.scale[:, 0], (kept[:, step], rows))
            hidden = dout.hidden

    # -- the cycle ------------------------------------------------------------------------------
    def __call__(self, inp: dict) -> dict:
        rs, st = self.state.requests, self.state
        rows = inp["rows"]
        if self.k == 1:
            # A chain: its rows read off the state in one op (6.19), its shared fields kept views.
            # With the slots its nodes write (6.19): the verify forward plans none of its own.
            chain = chain_verify_rows(rows=rows, seq_len=rs.seq_len, pending=rs.pending, finished=rs.finished,
                                      req_id=rs.req_id, drafts=st.kept_tokens, req_to_token=self.cache.table.req_to_token,
                                      sink=SINK_SLOT, checked=self.checked)
            n, req_ids, live, q_lens = chain.seq_lens, chain.req_ids, chain.live, chain.q_lens
            tree = chain_tree_of(chain.tokens, chain.positions)
            slots = chain.slots
        else:
            live = ~rs.finished[rows]
            n, req_ids, roots = rs.seq_len[rows], rs.req_id[rows], rs.pending[rows]
            tree = build_tree(roots, st.kept_flat[rows], st.kept_tokens[rows], st.beam_flat[rows], n, topk=self.k,
                              num_steps=self.S, checked=self.checked)
            q_lens = torch.where(live, self.D, 0)
            slots = None                              # the verify forward plans them
        batch = Batch(tree.tokens, tree.positions, rows, n, q_lens, tree.mask, tree.parents, req_ids=req_ids,
                      slots=slots)
        out = self.models.target.forward(self.cache, batch, commit_state=False)
        accept, num_correct, bonus = self._accept(tree, out, rows, req_ids, n)

        # The accepted drafts then the bonus (6.17), and the EOS / budget cut with the state update
        # (section 5, 6.15): one op each, the state written in place.
        produced, count = accepted_tokens(tree_tokens=tree.tokens, accept=accept, num_correct=num_correct, bonus=bonus,
                                          checked=self.checked)
        head, taken, finished = emit_tokens(produced=produced, count=count, rows=rows, seq_len=rs.seq_len,
                                            pending=rs.pending, emitted=rs.emitted, budget=rs.budget,
                                            finished=rs.finished, eos_token_id=self.eos, checked=self.checked)
        # The state rows hold the cycle's results now: what follows reads n and live, taken before.
        self._commit(rows, n, accept, num_correct, live, out, taken)
        if rs.penalty is not None:
            rs.penalty.record(rows, produced, taken)

        # Draft-extend over the accepted drafts and the bonus, fed by the target hidden states.
        if self.k == 1:
            # A chain's node at depth j is node j: its hidden rows in order, W = D of them (a row past
            # the path feeds a padded extend token, which writes only the sink and is never read).
            feats = out.hidden
        else:
            feats = out.hidden.gather(1, self._nodes(accept)[:, :, None].expand(-1, -1, out.hidden.shape[2]))
        self.draft(rows, produced, count, feats, n, req_ids, finished)

        packed = torch.cat([head, tree.tokens, tree.parents, accept], 1)
        result = {"packed": packed}
        if self.with_logits:
            ar = torch.arange(rows.shape[0], device=rows.device)
            nodes = self._nodes(accept)
            result["logits"] = out.logits[ar[:, None], nodes]                # [bs, W, V]
            result["scale"] = out.scale[ar[:, None], nodes]                  # [bs, W, 1]
        return result

    def _nodes(self, accept: torch.Tensor) -> torch.Tensor:
        """The tree node of each accepted depth [bs, W]."""
        return accept.clamp(min=0)                                         # past the path: the root's row

    def _accept(self, tree, out, rows, req_ids, n):
        penalty = self.state.requests.penalty
        bs, d, v = out.logits.shape
        if penalty is not None:
            z = self._penalized_logits(tree, out, rows, penalty)             # [bs, D, V] float64
            if self.params.greedy:
                return self._verify_greedy(tree, torch.argmax(z, dim=-1))
            probs = probs_from_z(z.reshape(bs * d, v), self.params)
        elif self.params.greedy:
            return self._verify_greedy(tree, target_predict(out.logits))
        else:
            probs = sampling_probs(out.logits.reshape(bs * d, v), out.scale.reshape(bs * d, 1), self.params)
        draws = torch.arange(d + 1, device=n.device)[None, :]
        u = counter_uniforms(self.seed, req_ids[:, None], n[:, None], draws)       # [bs, D + 1]
        return verify_stochastic(tree, probs.view(bs, d, v), u[:, :d].contiguous(), u[:, d].contiguous(),
                                 num_steps=self.S, checked=self.checked)

    def _verify_greedy(self, tree, predict: torch.Tensor):
        """6.3 over the tree with the target's greedy token after each node, predict [bs, D]:
        (accepted nodes [bs, S + 1], accepted drafts [bs], bonus [bs])."""
        return verify_greedy(tree, predict, num_steps=self.S)

    def _penalized_logits(self, tree, out, rows, penalty: PenaltyState) -> torch.Tensor:
        """Every node's dequantized target logits, penalized (section 7) by its own context: the
        output before the cycle (the root included) plus the drafts on the path to the node."""
        bs, d, v = out.logits.shape
        counts, prompt = penalty.context(rows)
        z = dequantize(out.logits.reshape(bs * d, v), out.scale.reshape(bs * d, 1)).view(bs, d, v)
        return penalize(z, tree_counts(counts, tree.tokens, tree.mask), prompt[:, None, :], self.params)

    def _commit(self, rows, n, accept, num_correct, live, out, taken) -> None:
        """Move accepted nodes' K/V down to [n, n+a+1) and keep the last one's recurrent state
        (and, with a tracking interval, the state at the last multiple among the `taken` tokens the
        EOS / budget cut lets through: a finishing request tracks only what it emitted)."""
        if self.k > 1:      # a chain's accepted path is its first nodes, already where they belong (6.16)
            commit_accepted_kv(kv=self.cache.kv.stacked, req_to_token=self.cache.table.req_to_token, rows=rows,
                               seq_lens=n, accept=accept, live=live, sink=SINK_SLOT, checked=self.checked)
        if out.rec_states is None:
            return                                                # no recurrent layers: nothing more to keep
        last = accept.gather(1, num_correct[:, None])[:, 0]       # the tree position of the last accepted node
        tracked = None if self.track_interval is None else tracking_step(
            path=accept, num_correct=torch.minimum(num_correct, taken - 1), seq_lens=n, interval=self.track_interval,
            live=live)
        commit_recurrent_states(states=self.cache.states, recurrent=out.rec_states, conv=out.conv_states, rows=rows,
                                steps=torch.where(live, last, -1), tracking_steps=tracked)
