"""vLLM's rejection sampler (`vllm/v1/sample/rejection_sampler.py`) behind the registry's op interface.

    pytest --pyargs specverify.conformance --sv-impl specverify.conformance.adapters.vllm:IMPL

Best effort: written against vLLM's source (the module-level `rejection_sample` and
`ops/topk_topp_sampler.random_sample`, stable across the v1 engine's releases), not yet run
against an installed vLLM (its wheel is too large for the GPU box). vLLM is imported, never copied.

- verify_greedy (chain trees only) <- `rejection_sample` with every request greedy (its
  `rejection_greedy_sample_kernel`);
- verify_naive (law, draft_q mode) <- `rejection_sample` with every request random and one draft
  token (`rejection_random_sample_kernel`, `sample_recovered_tokens`);
- sample_from_probs (law) <- `topk_topp_sampler.random_sample` (vLLM's draw without top-k / top-p).

How the adapter calls `rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len,
cu_num_draft_tokens, draft_probs, target_probs, bonus_token_ids, sampling_metadata)`:
- a batch of bs requests with the same number n of draft tokens: draft_token_ids [bs * n] int32,
  num_draft_tokens [n] * bs, cu_num_draft_tokens the int32 running sums, target_probs
  [bs * n, V] float32 (row i: the target at draft position i), draft_probs [bs * n, V] float32;
- `sampling_metadata` is a plain namespace with the four fields rejection_sample reads
  (all_greedy, all_random, temperature, generators): vLLM's SamplingMetadata has many more, and
  its constructor changes between releases. A vLLM that reads another field fails the sample with
  an AttributeError naming it.
- bonus_token_ids [bs, 1]: vLLM draws the bonus before the rejection sampler, with its sampler.
  The adapter does the same with vLLM's functions: the greedy sampler's argmax of the float32
  logits (verify_greedy), `random_sample` over p_1 (verify_naive).
- Output [bs, n + 1] int32, -1 (PLACEHOLDER_TOKEN_ID) after the first rejection: accepted drafts,
  then the correction (greedy: the target's argmax; random: the recovered token) or, when every
  draft is accepted, the bonus. The adapter converts it into accept_nodes / num_correct / bonus.

Conventions:
- verify_naive: `accept_rule: le` (vLLM accepts when `p_0(d) / q(d) >= u`, u = torch.rand in
  float64 on [0, 1)), `randomness: own`. Differences that no law case reaches: q(d) = 0 rejects
  (specverify accepts when p_0(d) > 0); the recovered token is argmax(max(p_0 - q, 0) / E) with E
  exponential (the same law as section 6.7's draw). vLLM has no shortcut mode (draft_p): its
  "no draft probs" path treats q as one-hot at d, which is draft_q mode with that q.
- Every draw uses torch's default generators (no per-request generator is passed): `seed()` seeds
  them with torch.manual_seed.
- verify_greedy: the argmax is torch's (`target_probs.argmax(dim=-1)`), as specverify's. vLLM's own
  caller hands rejection_sample the float32 softmax of the logits (all-greedy batches in older
  releases: the logits); the adapter hands it the float32 logits, whose argmax is the registry's
  greedy token (a softmax could merge float32 neighbours into a tie).
"""

from __future__ import annotations

import types

from specverify.conformance.adapters import Unsupported, require


class VllmRejectionSampler:
    conventions: dict = {}
    op_conventions = {"verify_naive": {"randomness": "own", "accept_rule": "le"},
                      "sample_from_probs": {"randomness": "own"}}

    def __init__(self):
        self._rs = None

    @property
    def name(self) -> str:
        try:
            import vllm
            version = getattr(vllm, "__version__", "?")
        except ImportError:
            version = "(not installed)"
        return f"vllm {version} rejection sampler"

    def load(self):
        """vllm.v1.sample.rejection_sampler, imported on first use (EngineMissing without it)."""
        if self._rs is None:
            self._rs = require("vllm.v1.sample.rejection_sampler", "vllm")
        return self._rs

    def _random_sample(self):
        sampler = require("vllm.v1.sample.ops.topk_topp_sampler", "vllm")
        if not callable(getattr(sampler, "random_sample", None)):
            raise Unsupported("this vLLM has no vllm.v1.sample.ops.topk_topp_sampler.random_sample")
        return sampler.random_sample

    def versions(self) -> dict:
        import torch
        import vllm
        found = {"vllm": getattr(vllm, "__version__", "?"), "torch": torch.__version__,
                 "cuda (torch)": torch.version.cuda}
        try:
            import triton
            found["triton"] = triton.__version__
        except ImportError:
            pass
        return found

    def seed(self, value: int) -> None:
        import torch
        torch.manual_seed(int(value))          # every device's default generator

    # -- the call into rejection_sample --------------------------------------------------------

    def _reject(self, drafts, target, draft_probs, bonus, *, greedy: bool):
        """drafts [bs, n] int, target [bs, n, V] float32, draft_probs [bs, n, V] or None, bonus [bs]
        -> vLLM's output_token_ids [bs, n + 1] (int64)."""
        import torch
        rs = self.load()
        bs, n = drafts.shape
        vocab = target.shape[-1]
        device = target.device
        metadata = types.SimpleNamespace(
            all_greedy=greedy, all_random=not greedy, generators={},
            temperature=None if greedy else torch.ones(bs, dtype=torch.float32, device=device))
        out = rs.rejection_sample(
            drafts.to(torch.int32).reshape(bs * n).contiguous(), [n] * bs, n,
            (torch.arange(1, bs + 1, dtype=torch.int32, device=device) * n).contiguous(),
            None if draft_probs is None else draft_probs.float().reshape(bs * n, vocab).contiguous(),
            target.float().reshape(bs * n, vocab).contiguous(),
            bonus.to(torch.int32).reshape(bs, 1).contiguous(), metadata)
        return out.long()

    @staticmethod
    def _placeholder(rs) -> int:
        return int(getattr(rs, "PLACEHOLDER_TOKEN_ID", -1))

    # -- deterministic: the greedy chain --------------------------------------------------------

    def verify_greedy(self, tree, logits, steps, probs, coins, final):
        """A chain tree (node j's parent is j - 1: a topk == 1 draft) as vLLM's greedy rejection
        sampling of its D - 1 draft tokens; a branching tree is unsupported (vLLM verifies chains).
        probs, coins, final: the record's stochastic-verify arguments, unused by the greedy path."""
        import torch
        tokens, parents = tree["tokens"], tree["parents"]
        bs, d = tokens.shape
        chain = torch.arange(-1, d - 1, device=parents.device).expand(bs, d)
        if not bool((parents == chain).all()) or d - 1 > steps:
            raise Unsupported("vLLM's rejection sampler verifies chains: this draft tree branches")
        width = steps + 1
        if bs == 0:
            empty = torch.zeros(0, dtype=torch.int64, device=tokens.device)
            return {"accept_nodes": empty.view(0, width), "num_correct": empty, "bonus": empty}
        upcast = logits.float()
        bonus = upcast[:, d - 1].argmax(dim=-1)                 # vLLM's greedy sampler: logits.argmax(dim=-1)
        out = self._reject(tokens[:, 1:], upcast[:, : d - 1], None, bonus, greedy=True)
        return self._chain_outputs(out, width, self._placeholder(self.load()))

    @staticmethod
    def _chain_outputs(out, width: int, placeholder: int) -> dict:
        """vLLM's [bs, n + 1] rows -> accept_nodes [bs, width], num_correct, bonus. A row holds its
        accepted drafts, then one more token (the correction or the bonus), then placeholders."""
        import torch
        bs = out.shape[0]
        num_correct = (out != placeholder).sum(dim=1) - 1
        bonus = out.gather(1, num_correct.clamp(min=0).view(bs, 1)).view(bs)
        depth = torch.arange(width, device=out.device).expand(bs, width)
        nodes = torch.where(depth <= num_correct.view(bs, 1), depth, -1)
        return {"accept_nodes": nodes, "num_correct": num_correct, "bonus": bonus}

    # -- law ops: vLLM's own random numbers -----------------------------------------------------

    def sample_from_probs(self, p):
        import torch
        if p.shape[0] == 0:
            return {"token": torch.zeros(0, dtype=torch.int64, device=p.device)}
        return {"token": self._random_sample()(p.float().clone(), {}).long()}   # it divides p in place

    def verify_naive(self, probs, draft, mode):
        """The chain [root, draft]: one draft token per request, q = draft_q; the bonus after an
        accepted d drawn by vLLM's random_sample from p_1."""
        import torch
        if "draft_q" not in mode:
            raise Unsupported("vLLM needs the draft's distribution (draft_q): it has no shortcut mode")
        bs, _, vocab = probs.shape
        if bs == 0:
            empty = torch.zeros(0, dtype=torch.int64, device=probs.device)
            return {"accept_nodes": empty.view(0, 2), "num_correct": empty, "bonus": empty}
        target = probs.float()
        bonus = self._random_sample()(target[:, 1].clone(), {})
        out = self._reject(draft.view(bs, 1), target[:, :1], mode["draft_q"].float().view(bs, 1, vocab), bonus,
                           greedy=False)
        placeholder = self._placeholder(self.load())
        accepted = (out[:, 1] != placeholder).long()
        # The node from the emitted token (it must be d when accepted), the count from the bonus
        # slot: a disagreement fails the law test's validity check.
        nodes = torch.stack([torch.zeros_like(accepted),
                             torch.where((accepted == 1) & (out[:, 0] == draft.long()), 1, -1)], dim=1)
        return {"accept_nodes": nodes, "num_correct": accepted,
                "bonus": torch.where(accepted == 1, out[:, 1], out[:, 0])}


IMPL = VllmRejectionSampler()
