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

from specverify.engine.generate import (CycleTrace, GenerationOutput, Request, emit_tokens, extend_batch,
                                        logprobs_out, new_requests, pages_needed)
from specverify.engine.logprobs import LogprobChannel
from specverify.engine.spec_config import SpecConfig
from specverify.protocol.message import PREEMPTED
from specverify.engine.sampling import SamplingParams, sampling_probs
from specverify.kernels.tree import DraftTree, build_tree, chain_tree
from specverify.kernels.verify import target_predict, verify_greedy, verify_stochastic
from specverify.models import Batch, ModelCache, Models, chain_mask
from specverify.ops import draft_topk
from specverify.platform import PlatformProfile, resolve
from specverify.kernels.cuda_graph import BucketGraphRunner
from specverify.spec.eagle import expand_search, finish_search, start_search


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


class SpecDecoder:
    """Runs speculative cycles over a batch of requests; requests may finish or be aborted."""

    traces: list[list[CycleTrace]] | None = None   # per request index; set to record (trace=True)

    def __init__(self, models: Models, config: SpecConfig, params: SamplingParams, *,
                 eos_token_id: int | None, channel: LogprobChannel | None = None,
                 platform: PlatformProfile | None = None,
                 static_shapes: bool | None = None):
        """static_shapes: run the decode-time draft phase at fixed padded shapes (the CUDA-graph
        shapes). None = on CUDA devices only; True also on the CPU (to test the padded path)."""
        self.models, self.config, self.params = models, config, params
        self.eos, self.channel, self.platform = eos_token_id, channel, platform
        self.profile = resolve(platform)
        self.k, self.S, self.D = config.topk, config.num_steps, config.draft_tokens
        self.region = max(self.D, (self.S - 1) * self.k)   # cache entries past the prefix a cycle uses
        self.max_ctx = models.config.max_context
        self.dev = models.device
        self.static = self.dev.type == "cuda" if static_shapes is None else static_shapes

    # -- set-up -------------------------------------------------------------------------
    def start(self, reqs: list[SpecRequest]) -> None:
        self.reqs = reqs
        lengths = [len(r.prompt) + r.max_new_tokens + self.region + 1 for r in reqs]
        self.cache: ModelCache = self.models.target.new_cache(
            max_requests=len(reqs) + 1, page_size=self.config.page_size,
            num_pages=pages_needed(lengths, self.config.page_size))
        self.pad_row = self.cache.table.alloc_row()       # owns no page: padded lanes read and write the sink
        for r in reqs:
            r.row = self.cache.table.alloc_row()
        self._max_kv = self.max_ctx
        self.runner = self._make_runner()
        self.prefill(reqs)

    def running(self) -> list[SpecRequest]:
        return [r for r in self.reqs if not r.finished]

    def abort(self, r: SpecRequest) -> None:
        """Stop a request now; its pages go back to the pool at once, and the logprob stream
        reports it preempted."""
        if not r.finished:
            r.finished = True
            self.cache.table.free_row(r.row)
            if self.channel is not None:
                self.channel.signal(r.index, PREEMPTED)

    def _retire(self, reqs):
        for r in reqs:
            if r.finished:
                self.cache.table.free_row(r.row)

    # -- prefill ------------------------------------------------------------------------
    def prefill(self, reqs: list[SpecRequest]) -> None:
        t = self.models.target
        for r in reqs:
            self.cache.table.reserve(r.row, len(r.prompt) + self.region + 1)
        batch = extend_batch(reqs, [r.prompt for r in reqs], self.dev)         # nothing cached yet
        out = t.forward(self.cache, batch)
        ar = torch.arange(len(reqs), device=self.dev)
        last = batch.q_lens - 1
        emit_tokens(reqs, out.logits[ar, last], out.scale[ar, last], self.params, self.eos, self.channel)
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
        self.state = self.draft_phase(self._state_reqs, tokens, feats, [0] * len(live), static=False)

    # -- draft --------------------------------------------------------------------------
    def draft_phase(self, reqs, tokens: list[list[int]], feats: torch.Tensor, kv_lens: list[int], *,
                    static: bool) -> DraftState:
        """Draft-extend the new tokens, then run the S-step tree search. feats: [bs, q, H].

        static: pad to the fixed decode shapes (q = S+1, the whole context visible) and go through
        the bucketed runner, graph-captured when the config and platform allow it.
        """
        for r, toks, kv in zip(reqs, tokens, kv_lens):
            self.cache.table.reserve(r.row, min(kv + len(toks) + self.region + 1, self.max_ctx))
        q = self.S + 1 if static else max(len(t) for t in tokens)
        inputs = self._draft_inputs(reqs, tokens, feats, kv_lens, q)
        if static:
            self._max_kv = self.max_ctx
            out = self.runner.run(inputs)
        else:
            # Every draft entry lies below kv + len(t) + region, which the fit check keeps within
            # max_context; the bound must not pass the table's max_context columns.
            self._max_kv = min(max(kv + len(t) for kv, t in zip(kv_lens, tokens)) + self.region + self.k,
                               self.max_ctx)
            out = self._draft_fn(inputs)
        return DraftState(out["roots"], out["kept_flat"], out["kept_tokens"], out["beam_flat"])

    def _draft_inputs(self, reqs, tokens, feats, kv_lens, q) -> dict:
        bs = len(reqs)
        ids = torch.zeros((bs, q), dtype=torch.int64)
        for b, toks in enumerate(tokens):
            ids[b, :len(toks)] = torch.tensor(toks, dtype=torch.int64)
        inputs = {"tokens": ids, "kv_lens": torch.tensor(kv_lens), "q_lens": torch.tensor([len(t) for t in tokens]),
                  "rows": torch.tensor([r.row for r in reqs]), "req_ids": torch.tensor([r.index for r in reqs])}
        inputs = {k: v.to(self.dev) for k, v in inputs.items()}
        f = feats.new_zeros((bs, q, feats.shape[-1]))
        f[:, :min(q, feats.shape[1])] = feats[:, :q]
        inputs["feats"] = f
        return inputs

    def _make_runner(self) -> BucketGraphRunner:
        h = self.models.config.hidden_size
        i64 = dict(dtype=torch.int64, device=self.dev)
        pad = {"tokens": torch.zeros(self.S + 1, **i64), "kv_lens": torch.zeros((), **i64),
               "q_lens": torch.ones((), **i64), "rows": torch.full((), self.pad_row, **i64),
               "req_ids": torch.zeros((), **i64),
               "feats": torch.zeros(self.S + 1, h, dtype=self.models.target.dtype, device=self.dev)}
        graphs = self.config.cuda_graph and self.profile.cuda_graphs and self.dev.type == "cuda"
        return BucketGraphRunner(self._draft_fn, pad, use_graphs=graphs)

    def _draft_fn(self, inp: dict) -> dict:
        """The draft phase as a pure tensor function of its inputs: no host syncs, so it can be
        captured in a CUDA graph (the max_kv bound is fixed per shape)."""
        head, k = self.models.draft, self.k
        tokens, kv_lens, q_lens, rows = inp["tokens"], inp["kv_lens"], inp["q_lens"], inp["rows"]
        req_ids = inp["req_ids"]                                            # [bs] index in the prompt list
        bs, q = tokens.shape
        ar = torch.arange(bs, device=self.dev)
        mask, parents = chain_mask(bs, q, self.dev)
        # x_t sits at draft index t-1, position t.
        positions = kv_lens[:, None] + 1 + torch.arange(q, device=self.dev)[None, :]
        batch = Batch(tokens, positions, rows, kv_lens, q_lens, mask, parents, self._max_kv, req_ids=req_ids)
        out = head.forward(self.cache, batch, inp["feats"])
        last = (q_lens - 1).clamp(min=0)
        p0, idx0 = draft_topk(out.logits[ar, last], k, self.profile, out.scale[ar, last])
        prefix = kv_lens + q_lens                                           # draft prefix = root position
        roots = tokens[ar, last]
        search = start_search(p0, idx0, self.S)
        hidden = out.hidden[ar, last][:, None, :].expand(-1, k, -1)         # [bs, k, H]
        for step in range(1, self.S):
            pos = (prefix + step)[:, None].expand(-1, k)                    # beams sit at depth `step`
            region = (step - 1) * k
            dbatch = Batch(search.tokens, pos, rows, prefix, torch.full_like(prefix, k),
                           search.ancestors[:, :, :region + k], torch.full_like(pos, -1), self._max_kv, region,
                           req_ids=req_ids)
            dout = head.forward(self.cache, dbatch, hidden)
            p, idx = draft_topk(dout.logits.reshape(bs * k, -1), k, self.profile, dout.scale.reshape(bs * k, 1))
            parent = expand_search(search, step, p.view(bs, k, k), idx.view(bs, k, k))
            hidden = dout.hidden.gather(1, parent[:, :, None].expand(-1, -1, dout.hidden.shape[-1]))
        kept_flat, kept_tokens, beam_flat = finish_search(search, self.D)
        return {"roots": roots, "kept_flat": kept_flat, "kept_tokens": kept_tokens, "beam_flat": beam_flat}

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
        if self.k == 1:
            tree = chain_tree(st.roots, st.kept_tokens, n)
        else:
            tree = build_tree(st.roots, st.kept_flat, st.kept_tokens, st.beam_flat, n, topk=self.k, num_steps=self.S)
        rows = torch.tensor([r.row for r in reqs], device=self.dev)
        req_ids = torch.tensor([r.index for r in reqs], device=self.dev)
        batch = Batch(tree.tokens, tree.positions, rows, n, torch.full_like(n, self.D), tree.mask, tree.parents,
                      int(n.max()) + self.D, req_ids=req_ids)
        out = self.models.target.forward(self.cache, batch, commit_state=False)
        accept, num_correct, bonus = self._accept(reqs, tree, out)
        self._commit(reqs, rows, n, accept, out)
        new_tokens = self._emit(reqs, tree, accept, num_correct, bonus)
        if self.traces is not None:
            self._record(reqs, tree, accept)
        if self.channel is not None:
            self._send_logprobs(reqs, accept, out)
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
                                          [reqs[b].cached - len(new_tokens[b]) for b in cont], static=self.static)
            self._state_reqs = [reqs[b] for b in cont]

    def _record(self, reqs, tree: DraftTree, accept) -> None:
        """trace=True: one CycleTrace per running request (the only extra readbacks)."""
        tokens, parents, nodes = tree.tokens.tolist(), tree.parents.tolist(), accept.tolist()
        for b, r in enumerate(reqs):
            taken = r.accept_lengths[-1]
            self.traces[r.index].append(CycleTrace(tokens[b], parents[b], nodes[b], r.output[len(r.output) - taken:]))

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

    def _send_logprobs(self, reqs, accept, out) -> None:
        """Row a_j of the verify predicts emitted token j: one message row per emitted token."""
        taken = [r.accept_lengths[-1] for r in reqs]
        b = torch.repeat_interleave(torch.arange(len(reqs)), torch.tensor(taken)).to(self.dev)
        j = torch.cat([torch.arange(n) for n in taken]).to(self.dev)
        nodes = accept[b, j]
        tokens = torch.tensor([t for r, n in zip(reqs, taken) for t in r.output[len(r.output) - n:]], device=self.dev)
        self.channel.send([r.index for r in reqs], taken, out.logits[b, nodes], out.scale[b, nodes], tokens)

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


SPEC_STREAM_SALT = 0x5BD1E995


def generate_speculative(models: Models, prompts, budgets: list[int], spec: SpecConfig, params: SamplingParams, *,
                         seed: int, eos_token_id, num_logprobs: int = 0, platform=None,
                         static_shapes: bool | None = None, trace: bool = False) -> GenerationOutput:
    """Speculative decoding of every prompt; see `specverify.generate`."""
    cfg = models.config
    if spec.topk > cfg.vocab_size:
        raise ValueError(f"spec.topk {spec.topk} exceeds the vocabulary size {cfg.vocab_size} "
                         f"(the draft picks topk distinct tokens per step)")
    region = max(spec.draft_tokens, (spec.num_steps - 1) * spec.topk)
    for i, (p, n) in enumerate(zip(prompts, budgets)):
        if len(p) + n + region + 1 > cfg.max_context:
            raise ValueError(f"prompts[{i}]: prompt length {len(p)} + max_new_tokens {n} + draft region "
                             f"{region + 1} exceeds max_context {cfg.max_context}")
    reqs = new_requests(prompts, budgets, seed, cls=SpecRequest)
    for r in reqs:
        r.spec_gen = torch.Generator("cpu").manual_seed(seed * 1_000_003 + r.index + SPEC_STREAM_SALT)
    channel = LogprobChannel(len(reqs), num_logprobs, max_rows=spec.num_steps + 1) if num_logprobs else None
    decoder = SpecDecoder(models, spec, params, eos_token_id=eos_token_id, channel=channel,
                          platform=platform, static_shapes=static_shapes)
    if trace:
        decoder.traces = [[] for _ in reqs]
    decoder.start(reqs)
    while decoder.running():
        decoder.step()
    return GenerationOutput([r.output for r in reqs], logprobs_out(channel), [r.accept_lengths for r in reqs],
                            trace=decoder.traces)

