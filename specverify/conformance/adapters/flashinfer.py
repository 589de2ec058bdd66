"""FlashInfer's sampling ops (`flashinfer.sampling`) behind the registry's op interface.

    pytest --pyargs specverify.conformance --sv-impl specverify.conformance.adapters.flashinfer:IMPL
    pytest --pyargs specverify.conformance --sv-impl specverify.conformance.adapters.flashinfer:FROM_LOGITS

FlashInfer is imported, never copied; its kernels run on a CUDA device only (JIT-compiled on first
use). Two objects, because FlashInfer offers two routes from logits to a token and a registry op
has one method:

`IMPL`: the probabilities route (FlashInfer's softmax, then its renorm and *_from_probs kernels).
- sampling_probs <- `softmax(logits * scale, temperature)`, then `top_k_renorm_probs` (top_k > 0),
  then `top_p_renorm_probs` (top_p < 1): section 4's order, each step renormalizing. FlashInfer
  has no min-p renorm: a sample with min_p > 0 is unsupported.
- sample_from_probs (law) <- `sampling_from_probs`.
- sample_filtered (law) <- the same softmax, then by the filters the case uses:
  `top_k_top_p_sampling_from_probs(filter_apply_order="top_k_first")` (top-k and top-p),
  `top_k_sampling_from_probs`, `top_p_sampling_from_probs`, `sampling_from_probs` (none); with
  min_p > 0, the renorms of the other filters (as in sampling_probs), then
  `min_p_sampling_from_probs` (FlashInfer's own top_k_first path chains a renorm and a sampler
  the same way).
- verify_naive (law, draft_q mode) <- `chain_speculative_sampling` with one draft token.

`FROM_LOGITS`: the logits route.
- sampling_probs <- `top_k_mask_logits(logits * scale, top_k)` (top_k > 0), then
  `softmax(., temperature)`, then `top_p_renorm_probs` (top_p < 1); min_p > 0 unsupported.
- sample_filtered (law) <- z = logits * scale / temperature (torch, float32: the from-logits
  samplers take no temperature), then `top_k_top_p_sampling_from_logits(filter_apply_order=
  "top_k_first")` (top-p, with top_k = V when the case has no top-k: FlashInfer's mask keeps every
  logit when k >= V), `sampling_from_logits(top_k_mask_logits(z, k))` (top-k alone),
  `sampling_from_logits` (none); min_p > 0 unsupported (no from-logits min-p sampler).

Not mapped: `top_k_top_p_sampling_from_*(filter_apply_order="joint")` (top-p measured on the
probabilities before the top-k renorm: not section 4's order), `chain_speculative_sampling`'s
shortcut (FlashInfer always draws a rejection from max(p_0 - q, 0): `draft_p` mode is unsupported).

Conventions (read from FlashInfer 0.5.3's include/flashinfer/sampling.cuh):
- `topk_ties: keep_tied`. TopKRenormProbKernel / TopKMaskLogitsKernel search a pivot and keep
  `x > pivot`, which is every token with x >= the k-th largest value (counted with multiplicity).
- `topp_ties: keep_tied`. TopPRenormProbKernel keeps every p >= v, v the largest probability with
  sum(p[p >= v]) >= top_p; the rejection samplers accept a token t when sum(p[p > p_t]) < top_p:
  the same set, which is specverify's prefix extended to every token tied with its last one.
- `precision: float32`: FlashInfer computes in float32 (`__expf`, an approximate reciprocal), so
  its probabilities are compared by the float32 tolerance entry.
- verify_naive accepts when `u * q(d) < p_0(d)` with u in (0, 1] (curand_uniform): specverify's
  strict rule written as a product, with the same outcome at q(d) = 0; nothing to declare. Every
  op here that draws is `randomness: own` (curand Philox), judged by law; the adapter passes
  FlashInfer a torch generator seeded by `seed()`, since without one FlashInfer 0.5.3 builds a
  fresh default-seeded generator on every call and repeats the same draws call after call.
"""

from __future__ import annotations

from specverify.conformance.adapters import EngineMissing, Unsupported, require

DEFAULT_SEED = 0x5EED          # the generators' seed until the runner calls seed()


class _FlashInfer:
    conventions = {"topk_ties": "keep_tied", "topp_ties": "keep_tied", "precision": "float32"}
    op_conventions = {"sample_from_probs": {"randomness": "own"}, "sample_filtered": {"randomness": "own"},
                      "verify_naive": {"randomness": "own"}}
    route = ""

    def __init__(self):
        self._sampling = None
        self._seed = DEFAULT_SEED
        self._generators: dict = {}

    @property
    def name(self) -> str:
        try:
            import flashinfer
            version = flashinfer.__version__
        except ImportError:
            version = "(not installed)"
        return f"flashinfer {version}{self.route}"

    def load(self):
        """flashinfer.sampling, imported on first use; EngineMissing without it or without CUDA."""
        if self._sampling is None:
            sampling = require("flashinfer.sampling", "flashinfer-python")
            import torch
            if not torch.cuda.is_available():
                raise EngineMissing("flashinfer-python runs on a CUDA device; this machine has none")
            self._sampling = sampling
        return self._sampling

    def versions(self) -> dict:
        import importlib.metadata

        import flashinfer
        import torch
        found = {"flashinfer": flashinfer.__version__, "torch": torch.__version__, "cuda (torch)": torch.version.cuda}
        for dist in ("apache-tvm-ffi", "nvidia-cudnn-frontend"):
            try:
                found[dist] = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                pass
        return found

    def seed(self, value: int) -> None:
        """Seed the generators FlashInfer draws from (the law tests call this once per test)."""
        self._seed = int(value)
        self._generators = {}

    def _generator(self, device):
        """One torch generator per device, kept across calls so that its Philox offset advances
        (FlashInfer's get_seed_and_offset reads and bumps it)."""
        import torch
        key = str(device)
        if key not in self._generators:
            gen = torch.Generator(device=device)
            gen.manual_seed(self._seed)
            self._generators[key] = gen
        return self._generators[key]

    @staticmethod
    def _scaled(logits, scale):
        """float32(logits) * scale per row, contiguous: what FlashInfer's float32 kernels read."""
        return (logits.float() * scale.float()).contiguous()

    def _renorm_input(self, logits, scale, min_p):
        """The scaled float32 logits of sampling_probs; min-p has no FlashInfer renorm."""
        if min_p > 0.0:
            raise Unsupported("min_p renorm: flashinfer has none (only min_p_sampling_from_probs, which draws)")
        return self._scaled(logits, scale)


class FlashInferSampling(_FlashInfer):
    """The probabilities route: FlashInfer's softmax, renorm and *_from_probs kernels."""

    # -- deterministic ------------------------------------------------------------------------

    def _filtered(self, p, top_k, top_p):
        fi = self.load()
        if top_k > 0:
            p = fi.top_k_renorm_probs(p, int(top_k))
        if top_p < 1.0:
            p = fi.top_p_renorm_probs(p, float(top_p))
        return p

    def sampling_probs(self, logits, scale, temperature, top_k, top_p, min_p):
        z = self._renorm_input(logits, scale, min_p)
        if z.shape[0] == 0:
            return {"p": z.double()}
        p = self.load().softmax(z, temperature=float(temperature))
        return {"p": self._filtered(p, top_k, top_p).double()}

    # -- law ops: FlashInfer's own random numbers -----------------------------------------------

    def sample_from_probs(self, p):
        import torch
        p = p.float().contiguous()
        if p.shape[0] == 0:
            return {"token": torch.zeros(0, dtype=torch.int64, device=p.device)}
        token = self.load().sampling_from_probs(p, generator=self._generator(p.device))
        return {"token": token.long()}

    def sample_filtered(self, logits, scale, temperature, top_k, top_p, min_p):
        import torch
        fi = self.load()
        z = self._scaled(logits, scale)
        if z.shape[0] == 0:
            return {"token": torch.zeros(0, dtype=torch.int64, device=z.device)}
        p = fi.softmax(z, temperature=float(temperature))
        gen = self._generator(p.device)
        if min_p > 0.0:
            # FlashInfer's min-p sampler after its own renorms: the composition its top_k_first
            # path uses (top_k_renorm_probs, then a *_sampling_from_probs kernel).
            token = fi.min_p_sampling_from_probs(self._filtered(p, top_k, top_p), float(min_p), generator=gen)
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
        draft_probs [bs, 1, V] (q), draft_token_ids [bs, 1], target_probs [bs, 2, V] (p_0, p_1).
        FlashInfer returns output_token_ids [bs, 2] ([d, bonus] when d is accepted, [residual
        draw, -1] when not) and the emitted draft count [bs]."""
        import torch
        if "draft_q" not in mode:
            raise Unsupported("chain_speculative_sampling has no shortcut mode: it needs the draft's distribution "
                              "(draft_q) and always draws a rejection from max(p_0 - q, 0)")
        bs, _, vocab = probs.shape
        if bs == 0:
            empty = torch.zeros(0, dtype=torch.int64, device=probs.device)
            return {"accept_nodes": empty.view(0, 2), "num_correct": empty, "bonus": empty}
        out, _, emitted = self.load().chain_speculative_sampling(
            mode["draft_q"].float().reshape(bs, 1, vocab).contiguous(),
            draft.to(torch.int32).reshape(bs, 1).contiguous(),
            probs.float().contiguous(), generator=self._generator(probs.device))
        out, emitted = out.long(), emitted.long()
        # The accepted node comes from the token FlashInfer emitted first (it must be d), the count
        # from FlashInfer's counter: if the two ever disagree, the law test's validity check says so.
        accepted = (emitted == 1) & (out[:, 0] == draft.long())
        nodes = torch.stack([torch.zeros_like(emitted), torch.where(accepted, 1, -1)], dim=1)
        bonus = out.gather(1, emitted.clamp(0, 1).view(bs, 1)).view(bs)
        return {"accept_nodes": nodes, "num_correct": emitted, "bonus": bonus}


class FlashInferFromLogits(_FlashInfer):
    """The logits route: top_k_mask_logits, sampling_from_logits, top_k_top_p_sampling_from_logits."""

    op_conventions = {"sample_filtered": {"randomness": "own"}}
    route = " (from logits)"

    def sampling_probs(self, logits, scale, temperature, top_k, top_p, min_p):
        z = self._renorm_input(logits, scale, min_p)
        if z.shape[0] == 0:
            return {"p": z.double()}
        fi = self.load()
        if top_k > 0:
            z = fi.top_k_mask_logits(z, int(top_k))
        p = fi.softmax(z, temperature=float(temperature))
        if top_p < 1.0:
            p = fi.top_p_renorm_probs(p, float(top_p))
        return {"p": p.double()}

    def sample_filtered(self, logits, scale, temperature, top_k, top_p, min_p):
        import torch
        if min_p > 0.0:
            raise Unsupported("flashinfer has no min-p sampler from logits (min_p_sampling_from_probs: the IMPL route)")
        z = (self._scaled(logits, scale) / float(temperature)).contiguous()
        if z.shape[0] == 0:
            return {"token": torch.zeros(0, dtype=torch.int64, device=z.device)}
        fi = self.load()
        gen = self._generator(z.device)
        if top_p < 1.0:
            k = int(top_k) if top_k > 0 else z.shape[1]      # k >= V: FlashInfer's mask keeps every logit
            token = fi.top_k_top_p_sampling_from_logits(z, k, float(top_p), filter_apply_order="top_k_first",
                                                        generator=gen)
        elif top_k > 0:
            token = fi.sampling_from_logits(fi.top_k_mask_logits(z, int(top_k)), generator=gen)
        else:
            token = fi.sampling_from_logits(z, generator=gen)
        return {"token": token.long()}


IMPL = FlashInferSampling()
FROM_LOGITS = FlashInferFromLogits()
