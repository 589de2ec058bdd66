"""FlashInfer's sampling ops (`flashinfer.sampling`) behind the registry's op interface.

    pytest --pyargs specverify.conformance --sv-impl specverify.conformance.adapters.flashinfer:IMPL

FlashInfer is imported, never copied; its kernels run on a CUDA device only (JIT-compiled on first
use). The map:
- `sampling_probs` (deterministic, compared by the float32 tolerance: FlashInfer computes in float32,
  declared `precision: float32`) <- `softmax(logits * scale, temperature)`, then
  `top_k_renorm_probs`, then `top_p_renorm_probs`: the order of docs/semantics.md section 4. Its
  renorms cut at a probability value, so every token tied with the cut is kept: declared
  `topk_ties: keep_tied`, `topp_ties: keep_tied`. FlashInfer has no min-p renorm: a sample with
  min_p > 0 is unsupported.
- law ops, FlashInfer drawing its own uniforms (`randomness: own`, seeded per test through a torch
  generator): `sample_from_probs` <- `sampling_from_probs`; `sample_filtered` <- the temperature
  softmax, then `top_k_top_p_sampling_from_probs` (top-k first) / `top_k_sampling_from_probs` /
  `top_p_sampling_from_probs` / `min_p_sampling_from_probs` / `sampling_from_probs` by which
  filters the case uses (min-p together with another filter is unsupported: no FlashInfer call does
  both); `verify_naive` (exact mode) <- `chain_speculative_sampling` with one draft token.
- `top_k_mask_logits` maps onto no registry op (specverify masks probabilities, not logits).
"""

from __future__ import annotations

from specverify.conformance.adapters import EngineMissing, Unsupported, require


class FlashInferSampling:
    conventions = {"topk_ties": "keep_tied", "topp_ties": "keep_tied", "precision": "float32"}
    op_conventions = {"sample_from_probs": {"randomness": "own"}, "sample_filtered": {"randomness": "own"},
                      "verify_naive": {"randomness": "own"}}

    def __init__(self):
        self._sampling = None
        self._generator = None

    @property
    def name(self) -> str:
        try:
            import flashinfer
            return f"flashinfer {flashinfer.__version__}"
        except ImportError:
            return "flashinfer (not installed)"

    def load(self):
        if self._sampling is None:
            sampling = require("flashinfer.sampling", "flashinfer-python")
            import torch
            if not torch.cuda.is_available():
                raise EngineMissing("flashinfer-python runs on a CUDA device; this machine has none")
            self._sampling = sampling
        return self._sampling

    def versions(self) -> dict:
        import flashinfer
        import torch
        return {"flashinfer": flashinfer.__version__, "cuda (torch)": torch.version.cuda}

    def seed(self, value: int) -> None:
        import torch
        self._generator = torch.Generator(device="cuda").manual_seed(value)

    # -- deterministic --------------------------------------------------------------------------

    def _probs(self, logits, scale, temperature):
        z = (logits.float() * scale.float()).contiguous()
        return self.load().softmax(z, temperature=float(temperature))

    def sampling_probs(self, logits, scale, temperature, top_k, top_p, min_p):
        if min_p > 0.0:
            raise Unsupported("flashinfer has no min-p renorm (only min_p_sampling_from_probs)")
        fi = self.load()
        p = self._probs(logits, scale, temperature)
        if top_k > 0:
            p = fi.top_k_renorm_probs(p, int(top_k))
        if top_p < 1.0:
            p = fi.top_p_renorm_probs(p, float(top_p))
        return {"p": p.double()}

    # -- law ops: FlashInfer's own random numbers -----------------------------------------------

    def sample_from_probs(self, p):
        token = self.load().sampling_from_probs(p.float().contiguous(), generator=self._generator)
        return {"token": token.long()}

    def sample_filtered(self, logits, scale, temperature, top_k, top_p, min_p):
        fi = self.load()
        p = self._probs(logits, scale, temperature)
        gen = self._generator
        if min_p > 0.0:
            if top_k > 0 or top_p < 1.0:
                raise Unsupported("no flashinfer call applies min-p together with top-k / top-p")
            token = fi.min_p_sampling_from_probs(p, float(min_p), generator=gen)
        elif top_k > 0 and top_p < 1.0:
            token = fi.top_k_top_p_sampling_from_probs(p, int(top_k), float(top_p), filter_apply_order="top_k_first",
                                                       generator=gen)
        elif top_k > 0:
            token = fi.top_k_sampling_from_probs(p, int(top_k), generator=gen)
        elif top_p < 1.0:
            token = fi.top_p_sampling_from_probs(p, float(top_p), generator=gen)
        else:
            token = fi.sampling_from_probs(p, generator=gen)
        return {"token": token.long()}

    def verify_naive(self, probs, draft, mode):
        """The chain [root, draft] as FlashInfer's chain speculative sampling with one draft token:
        draft_probs [bs, 1, V] (q), draft_token_ids [bs, 1], target_probs [bs, 2, V] (p_0, p_1)."""
        import torch
        if "draft_q" not in mode:
            raise Unsupported("chain_speculative_sampling needs the draft's distribution (draft_q)")
        bs, _, vocab = probs.shape
        out, _, emitted = self.load().chain_speculative_sampling(
            mode["draft_q"].float().view(bs, 1, vocab).contiguous(), draft.to(torch.int32).view(bs, 1).contiguous(),
            probs.float().contiguous(), generator=self._generator)
        emitted = emitted.long()
        accepted = torch.where(emitted == 1, 1, -1)
        return {"accept_nodes": torch.stack([torch.zeros_like(accepted), accepted], dim=1),
                "num_correct": emitted, "bonus": out.long().gather(1, emitted.view(bs, 1)).view(bs)}


IMPL = FlashInferSampling()
