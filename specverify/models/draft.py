"""The EAGLE-style draft head and its agreement knob.

The head reads, for each new token, the token's embedding and a hidden feature (the target's
final hidden state for the first draft step, the head's own output after that), fuses them with
`fc`, runs one attention layer over its own KV buffers (sharing the target's slot table), applies
its own final norm and the target's lm_head.

Agreement knob. A head with random weights almost never agrees with the target, which makes
acceptance "never". For tests and benchmarks the head can be steered: when the caller knows the
target's greedy next token for a row (`oracle_next`), the head makes that token its clear top
choice with probability `agreement` and removes it from its distribution otherwise. The choice is
a deterministic hash of (model seed, `oracle_keys` of the row), so a run is reproducible and the
same (request, position) gets the same fate in every run. `agreement=1.0` is the always-right
oracle, `0.0` the always-wrong oracle, `None` the plain head.
"""

from __future__ import annotations

import torch

from specverify.models import layers
from specverify.models.config import ModelConfig
from specverify.models.target import ForwardOutput, ModelCache, deliver_logits

_PEAK_MARGIN = 8.0   # logit margin that makes the steered token the unambiguous top choice

_M32 = 0xFFFFFFFF


def agreement_draw(seed: int, keys: torch.Tensor) -> torch.Tensor:
    """Deterministic uniform in [0, 1) per int64 key (a small 32-bit mixing hash)."""
    x = (keys.to(torch.int64) * 0x9E3779B1 + (seed & 0x7FFF) * 0x632BE5AB) & _M32
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & _M32
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & _M32
    x = x ^ (x >> 16)
    return x.to(torch.float64) / 2.0 ** 32


def steer(logits: torch.Tensor, oracle_next: torch.Tensor, oracle_keys: torch.Tensor,
          agreement: float, seed: int) -> torch.Tensor:
    """Apply the agreement knob to compute-dtype logits.

    logits: [..., V]; oracle_next: [...] int64 target greedy token, -1 where unknown;
    oracle_keys: [...] int64 identity of the decision (e.g. request id * max_context + position).
    """
    known = oracle_next >= 0
    target = oracle_next.clamp(min=0)[..., None]
    agree = agreement_draw(seed, oracle_keys) < agreement
    peak = logits.amax(-1, keepdim=True) + _PEAK_MARGIN
    sunk = torch.full_like(peak, float("-inf"))
    new_value = torch.where(agree[..., None], peak, sunk)
    steered = logits.scatter(-1, target, new_value)
    return torch.where(known[..., None], steered, logits)


class DraftHead:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], target_w: dict[str, torch.Tensor],
                 *, agreement: float | None, seed: int, dtype: torch.dtype, device="cpu"):
        if agreement is not None and not 0.0 <= agreement <= 1.0:
            raise ValueError(f"draft_agreement must be None or in [0, 1], got {agreement}")
        self.config = config
        self.agreement = agreement
        self.seed = seed
        self.w = {k: v.to(device=device, dtype=dtype) for k, v in weights.items()}
        # Shared with the target, as EAGLE heads share the embedding and lm_head.
        self.embed = target_w["embed"]
        self.lm_head = target_w["lm_head"]

    def forward(self, cache: ModelCache, batch: layers.Batch, features: torch.Tensor, *,
                oracle_next: torch.Tensor | None = None,
                oracle_keys: torch.Tensor | None = None) -> ForwardOutput:
        """features: [bs, q, H] hidden feature paired with each new token.

        oracle_next / oracle_keys: [bs, q] int64, used only when the head has an agreement knob.
        """
        cfg, w = self.config, self.w
        x = torch.cat([self.embed[batch.input_ids], features.to(self.embed.dtype)], dim=-1) @ w["fc"]
        n = layers.rmsnorm(x, w["layer.attn_norm"], cfg.norm_eps)
        x = x + layers.attention(n, w, "layer", batch, cache.draft_kv.k[0], cache.draft_kv.v[0],
                                 cache.table.req_to_token, num_heads=cfg.num_heads,
                                 num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, theta=cfg.rope_theta)
        x = x + layers.swiglu_mlp(x, w, "layer", cfg.norm_eps)
        logits = layers.rmsnorm(x, w["final_norm"], cfg.norm_eps) @ self.lm_head
        if self.agreement is not None and oracle_next is not None:
            if oracle_keys is None:
                raise ValueError("oracle_keys is required with oracle_next")
            logits = steer(logits, oracle_next, oracle_keys, self.agreement, self.seed)
        values, scale = deliver_logits(logits, cfg)
        return ForwardOutput(values, scale, x, [])
