"""EAGLE speculative decoding: prefill -> draft-extend -> draft -> verify -> commit, per cycle.

Layout of one request (n = tokens whose target K/V are cached, the pending root token sits at
position n):
- target cache indices [0, n) hold x_0..x_{n-1}; a verify writes its D tree nodes at [n, n+D)
  and the commit moves the accepted ones down to [n, n+a+1);
- the draft head's entry for token x_t (paired with the target hidden state of x_{t-1}) sits at
  draft cache index t-1, so its prefix is also n long; the draft-tree steps write their k beams
  per step into the region after the prefix.
"""

from __future__ import annotations

import dataclasses

import torch

from specverify.engine.generate import GenerationOutput, Request, emit_tokens, generate_target_only, new_requests
from specverify.engine.logprobs import logprob_records
from specverify.engine.sampling import SamplingParams, sampling_probs
from specverify.kernels.tree import DraftTree, build_tree
from specverify.kernels.verify import target_predict, verify_greedy, verify_stochastic
from specverify.models import Batch, ModelCache, Models, chain_mask
from specverify.ops import select_draft_topk
from specverify.platform import PlatformProfile
from specverify.spec.eagle import expand_search, finish_search, start_search


@dataclasses.dataclass(frozen=True)
class SpecConfig:
    algorithm: str = "eagle"
    num_steps: int = 3
    topk: int = 1
    num_draft_tokens: int | None = None   # D, root included; default S + 1 (the chain)
    page_size: int = 1
    cuda_graph: bool = True

    def __post_init__(self):
        if self.algorithm != "eagle":
            raise ValueError(f"algorithm must be 'eagle', got {self.algorithm!r}")
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")
        if self.topk < 1:
            raise ValueError(f"topk must be >= 1, got {self.topk}")
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        d = self.draft_tokens
        most = 1 + self.topk + (self.num_steps - 1) * self.topk ** 2
        if not 2 <= d <= most:
            raise ValueError(f"num_draft_tokens must be in [2, {most}] for topk={self.topk}, "
                             f"num_steps={self.num_steps}; got {d}")
        if self.topk == 1 and d != self.num_steps + 1:
            raise ValueError(f"topk == 1 needs num_draft_tokens == num_steps + 1 = {self.num_steps + 1}, got {d}")

    @property
    def draft_tokens(self) -> int:
        return self.num_draft_tokens if self.num_draft_tokens is not None else self.num_steps + 1


@dataclasses.dataclass
class DraftState:
    """What the draft phase hands to the next verify, for the running requests."""
    roots: torch.Tensor           # [bs] pending root token
    kept_flat: torch.Tensor       # [bs, D-1]
    kept_tokens: torch.Tensor     # [bs, D-1]
    beam_flat: torch.Tensor       # [bs, S-1, k]


@dataclasses.dataclass
class SpecRequest(Request):
    accept_lengths: list = dataclasses.field(default_factory=list)
    spec_gen: torch.Generator | None = None
    oracle: torch.Tensor | None = None      # [max_context] target greedy sequence, -1 beyond


class SpecDecoder:
    """Runs speculative cycles over a batch of requests; requests may finish or be aborted."""

    def __init__(self, models: Models, config: SpecConfig, params: SamplingParams, *,
                 eos_token_id: int | None, num_logprobs: int, platform: PlatformProfile | None = None):
        self.models, self.config, self.params = models, config, params
        self.eos, self.num_logprobs, self.platform = eos_token_id, num_logprobs, platform
        self.k, self.S, self.D = config.topk, config.num_steps, config.draft_tokens
        self.region = max(self.D, (self.S - 1) * self.k)   # cache entries past the prefix a cycle uses
        self.max_ctx = models.config.max_context
        self.dev = models.device

    # -- set-up -------------------------------------------------------------------------
    def start(self, reqs: list[SpecRequest]) -> None:
        self.reqs = reqs
        self.cache: ModelCache = self.models.target.new_cache(max_requests=len(reqs), page_size=self.config.page_size)
        for r in reqs:
            r.row = self.cache.table.alloc_row()
        self.prefill(reqs)

    def running(self) -> list[SpecRequest]:
        return [r for r in self.reqs if not r.finished]

    def abort(self, r: SpecRequest) -> None:
        """Stop a request now; its pages go back to the pool at once."""
        if not r.finished:
            r.finished = True
            self.cache.table.free_row(r.row)

    def _retire(self, reqs):
        for r in reqs:
            if r.finished:
                self.cache.table.free_row(r.row)

    # -- prefill ------------------------------------------------------------------------
    def prefill(self, reqs: list[SpecRequest]) -> None:
        t = self.models.target
        for r in reqs:
            self.cache.table.reserve(r.row, len(r.prompt) + self.region + 1)
        batch = _chain_batch([r.prompt for r in reqs], [0] * len(reqs), [r.row for r in reqs], self.dev)
        out = t.forward(self.cache, batch)
        ar = torch.arange(len(reqs), device=self.dev)
        last = batch.q_lens - 1
        emit_tokens(reqs, out.logits[ar, last], out.scale[ar, last], self.params, self.eos, self.num_logprobs)
        for r in reqs:
            r.cached = len(r.prompt)
        self._retire(reqs)
        live = [b for b, r in enumerate(reqs) if not r.finished]
        if not live:
            return
        # Draft-extend over x_1..x_n with features h_0..h_{n-1}.
        tokens = [reqs[b].prompt[1:] + [reqs[b].last_token] for b in live]
        feats = out.hidden[torch.tensor(live, device=self.dev)]
        self._state_reqs = [reqs[b] for b in live]
        self.state = self.draft_phase(self._state_reqs, tokens, feats, [0] * len(live))

    # -- draft --------------------------------------------------------------------------
    def draft_phase(self, reqs, tokens: list[list[int]], feats: torch.Tensor, kv_lens: list[int]) -> DraftState:
        """Draft-extend the new tokens, then run the S-step tree search. feats: [bs, q, H]."""
        head = self.models.draft
        for r, toks, kv in zip(reqs, tokens, kv_lens):
            self.cache.table.reserve(r.row, min(kv + len(toks) + self.region + 1, self.max_ctx))
        batch = _chain_batch(tokens, kv_lens, [r.row for r in reqs], self.dev)
        batch.positions = batch.positions + 1          # x_t sits at draft index t-1, position t
        q = batch.input_ids.shape[1]
        oracle_next, oracle_keys = self._oracle(reqs, batch.positions, batch.input_ids, None)
        out = head.forward(self.cache, batch, feats[:, :q], oracle_next=oracle_next, oracle_keys=oracle_keys)
        ar = torch.arange(len(reqs), device=self.dev)
        last = batch.q_lens - 1
        p0, idx0 = select_draft_topk(out.logits[ar, last], self.k, platform=self.platform, scale=out.scale[ar, last])
        prefix = batch.kv_lens + batch.q_lens                               # draft prefix = new n
        search = start_search(p0, idx0, self.S)
        hidden = out.hidden[ar, last][:, None, :].expand(-1, self.k, -1)    # [bs, k, H]
        root_pos = prefix                                                   # position of the root
        on_path = self._root_on_path(reqs, root_pos, batch.input_ids[ar, last])
        beam_on = self._child_on_path(reqs, on_path[:, None], search.tokens, root_pos[:, None] + 1)
        for step in range(1, self.S):
            beams = search.tokens                                          # [bs, k] at depth `step`
            pos = (root_pos + step)[:, None].expand(-1, self.k)
            region = (step - 1) * self.k
            dbatch = Batch(beams, pos, batch.rows, prefix, torch.full_like(prefix, self.k),
                           search.ancestors[:, :, :region + self.k], torch.full_like(beams, -1),
                           int(prefix.max()) + region + self.k, region)
            nxt, keys = self._oracle_from(reqs, pos, beam_on)
            dout = head.forward(self.cache, dbatch, hidden, oracle_next=nxt, oracle_keys=keys)
            flat_logits = dout.logits.reshape(-1, dout.logits.shape[-1])
            p, idx = select_draft_topk(flat_logits, self.k, platform=self.platform,
                                       scale=dout.scale.reshape(-1, 1))
            parent = expand_search(search, step, p.view(-1, self.k, self.k), idx.view(-1, self.k, self.k))
            hidden = dout.hidden.gather(1, parent[:, :, None].expand(-1, -1, dout.hidden.shape[-1]))
            beam_on = self._child_on_path(reqs, beam_on.gather(1, parent), search.tokens, pos + 1)
        kept_flat, kept_tokens, beam_flat = finish_search(search, self.D)
        roots = batch.input_ids[ar, last]
        return DraftState(roots, kept_flat, kept_tokens, beam_flat)

    # -- the agreement oracle ------------------------------------------------------------
    def _oracle_table(self, reqs) -> torch.Tensor | None:
        if reqs[0].oracle is None:
            return None
        return torch.stack([r.oracle for r in reqs]).to(self.dev)          # [bs, max_ctx + 1]

    def _keys(self, reqs, pos):
        ids = torch.tensor([r.index for r in reqs], device=self.dev)[:, None]
        return ids * (self.max_ctx + 1) + pos + 1

    def _oracle(self, reqs, positions, tokens, _):
        """Extend rows: every token is on the committed path; next = oracle at position + 1."""
        table = self._oracle_table(reqs)
        if table is None:
            return None, None
        pos = positions.clamp(max=self.max_ctx - 1)
        nxt = table.gather(1, pos + 1)
        return nxt, self._keys(reqs, pos)

    def _root_on_path(self, reqs, root_pos, roots):
        table = self._oracle_table(reqs)
        if table is None:
            return torch.zeros_like(roots, dtype=torch.bool)
        return table.gather(1, root_pos.clamp(max=self.max_ctx)[:, None])[:, 0] == roots

    def _child_on_path(self, reqs, parent_on, tokens, pos):
        table = self._oracle_table(reqs)
        if table is None:
            return torch.zeros_like(tokens, dtype=torch.bool)
        return parent_on & (table.gather(1, pos.clamp(max=self.max_ctx)) == tokens)

    def _oracle_from(self, reqs, pos, on):
        table = self._oracle_table(reqs)
        if table is None:
            return None, None
        nxt = table.gather(1, (pos + 1).clamp(max=self.max_ctx))
        return torch.where(on, nxt, torch.full_like(nxt, -1)), self._keys(reqs, pos)

    # -- verify and commit -----------------------------------------------------------------
    def step(self) -> None:
        """One speculative cycle over the running requests."""
        reqs = self.running()
        if not reqs:
            return
        live = torch.tensor([b for b, r in enumerate(self._state_reqs) if not r.finished], device=self.dev)
        st = DraftState(*(x[live] for x in (self.state.roots, self.state.kept_flat, self.state.kept_tokens,
                                              self.state.beam_flat)))
        n = torch.tensor([r.cached for r in reqs], device=self.dev)
        for r in reqs:
            self.cache.table.reserve(r.row, r.cached + self.region + 1)
        tree = build_tree(st.roots, st.kept_flat, st.kept_tokens, st.beam_flat, n, topk=self.k, num_steps=self.S)
        rows = torch.tensor([r.row for r in reqs], device=self.dev)
        batch = Batch(tree.tokens, tree.positions, rows, n, torch.full_like(n, self.D), tree.mask, tree.parents,
                      int(n.max()) + self.D)
        out = self.models.target.forward(self.cache, batch, commit_state=False)
        accept, num_correct, bonus = self._accept(reqs, tree, out)
        self._commit(reqs, rows, n, accept, out)
        new_tokens = self._emit(reqs, tree, accept, num_correct, bonus)
        if self.num_logprobs:
            self._logprobs(reqs, accept, new_tokens, out)
        # Draft-extend over the accepted drafts and the bonus, fed by the target hidden states.
        ar = torch.arange(len(reqs), device=self.dev)
        feats = out.hidden[ar[:, None], accept.clamp(min=0)]               # [bs, W, H]
        cont = [b for b, r in enumerate(reqs) if not r.finished]
        self._retire(reqs)
        for b, r in enumerate(reqs):
            r.cached += len(new_tokens[b])
            if not r.finished:
                self.cache.table.shrink(r.row, r.cached)      # rejected nodes' pages go back
        if cont:
            sel = torch.tensor(cont, device=self.dev)
            self.state = self.draft_phase([reqs[b] for b in cont], [new_tokens[b] for b in cont], feats[sel],
                                          [reqs[b].cached - len(new_tokens[b]) for b in cont])
            self._state_reqs = [reqs[b] for b in cont]

    def _accept(self, reqs, tree: DraftTree, out):
        if self.params.greedy:
            return verify_greedy(tree, target_predict(out.logits), num_steps=self.S)
        bs, d, v = out.logits.shape
        probs = sampling_probs(out.logits.reshape(bs * d, v), out.scale.reshape(bs * d, 1), self.params)
        u = torch.stack([torch.rand(d + 1, dtype=torch.float64, generator=r.spec_gen) for r in reqs]).to(self.dev)
        return verify_stochastic(tree, probs.view(bs, d, v), u[:, :d], u[:, d], num_steps=self.S)

    def _commit(self, reqs, rows, n, accept, out) -> None:
        """Move accepted nodes' K/V down to [n, n+a+1) and keep their recurrent state."""
        w = accept.shape[1]
        live = accept >= 0
        j = torch.arange(w, device=self.dev)[None, :].expand_as(accept)
        table = self.cache.table.req_to_token
        src = table[rows[:, None], n[:, None] + accept.clamp(min=0)][live]
        dst = table[rows[:, None], n[:, None] + j][live]
        self.cache.kv.move(src, dst)
        last = accept.gather(1, (live.sum(1, keepdim=True) - 1))[:, 0]
        ar = torch.arange(len(reqs), device=self.dev)
        for r_layer, inter in enumerate(out.rec_states):
            buf = self.cache.states.state[r_layer]
            buf[rows] = inter[ar, last].to(buf.dtype)

    def _logprobs(self, reqs, accept, new_tokens, out) -> None:
        """Row a_j of the verify predicts emitted token j: record its logprobs."""
        for b, (r, toks) in enumerate(zip(reqs, new_tokens)):
            nodes = accept[b, :len(toks)]
            recs = logprob_records(out.logits[b, nodes], out.scale[b, nodes],
                                   torch.tensor(toks, device=self.dev), self.num_logprobs)
            r.logprobs.extend(recs[:len(r.output) - len(r.logprobs)])

    def _emit(self, reqs, tree, accept, num_correct, bonus) -> list[list[int]]:
        """Append each request's accepted drafts and bonus, cut at EOS / max_new_tokens.

        Returns the tokens that enter the sequence (the draft-extend input)."""
        toks = tree.tokens.gather(1, accept.clamp(min=0)).tolist()
        counts, bonuses = num_correct.tolist(), bonus.tolist()
        new = []
        for r, row, c, b in zip(reqs, toks, counts, bonuses):
            produced = row[1:c + 1] + [b]
            taken = []
            for t in produced:
                r.output.append(t)
                taken.append(t)
                if len(r.output) >= r.max_new_tokens or (self.eos is not None and t == self.eos):
                    r.finished = True
                    break
            r.accept_lengths.append(len(taken))
            new.append(produced)
        return new


def _chain_batch(token_lists, kv_lens, rows, device) -> Batch:
    """A chain of new tokens per request after kv_lens cached entries; positions kv_len + 1 + j
    for the draft head's shifted layout are set by the caller where needed."""
    q = max(len(t) for t in token_lists)
    ids = torch.zeros((len(token_lists), q), dtype=torch.int64)
    for b, toks in enumerate(token_lists):
        ids[b, :len(toks)] = torch.tensor(toks, dtype=torch.int64)
    kv = torch.tensor(kv_lens, dtype=torch.int64)
    ql = torch.tensor([len(t) for t in token_lists], dtype=torch.int64)
    mask, parents = chain_mask(len(token_lists), q, "cpu")
    positions = kv[:, None] + torch.arange(q)[None, :]
    return Batch(ids.to(device), positions.to(device), torch.tensor(rows).to(device), kv.to(device), ql.to(device),
                 mask.to(device), parents.to(device), int((kv + ql).max()))


SPEC_STREAM_SALT = 0x5BD1E995


def generate_speculative(models: Models, prompts, budgets: list[int], spec: SpecConfig, params: SamplingParams, *,
                         seed: int, eos_token_id, num_logprobs: int, platform=None) -> GenerationOutput:
    """Speculative decoding of every prompt; see `specverify.generate`."""
    cfg = models.config
    region = max(spec.draft_tokens, (spec.num_steps - 1) * spec.topk)
    for i, (p, n) in enumerate(zip(prompts, budgets)):
        if len(p) + n + region + 1 > cfg.max_context:
            raise ValueError(f"prompts[{i}]: prompt length {len(p)} + max_new_tokens {n} + draft region "
                             f"{region + 1} exceeds max_context {cfg.max_context}")
    reqs = new_requests(prompts, budgets, seed, cls=SpecRequest)
    for r in reqs:
        r.spec_gen = torch.Generator("cpu").manual_seed(seed * 1_000_003 + r.index + SPEC_STREAM_SALT)
    if models.draft.agreement is not None and params.greedy:
        attach_oracle(models, reqs, region)
    decoder = SpecDecoder(models, spec, params, eos_token_id=eos_token_id, num_logprobs=num_logprobs,
                          platform=platform)
    decoder.start(reqs)
    while decoder.running():
        decoder.step()
    return GenerationOutput([r.output for r in reqs], [r.logprobs for r in reqs] if num_logprobs else None,
                            [r.accept_lengths for r in reqs])


def attach_oracle(models: Models, reqs: list[SpecRequest], region: int) -> None:
    """Give each request the target's greedy sequence (prompt + continuation past its budget), so
    a draft head with an agreement knob knows the token it should propose."""
    ctx = models.config.max_context
    budgets = [min(r.max_new_tokens + region + 1, ctx - len(r.prompt)) for r in reqs]
    look = [Request(r.index, r.prompt, n, torch.zeros(n, dtype=torch.float64)) for r, n in zip(reqs, budgets)]
    generate_target_only(models, look, SamplingParams(), eos_token_id=None, num_logprobs=0, page_size=1)
    for r, lk in zip(reqs, look):
        seq = torch.full((ctx + 1,), -1, dtype=torch.int64)
        full = torch.tensor(r.prompt + lk.output, dtype=torch.int64)
        seq[:len(full)] = full
        r.oracle = seq
