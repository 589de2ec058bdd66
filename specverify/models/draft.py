"""The EAGLE-style draft head.

The head reads, for each new token, the token's embedding and a hidden feature (the target's
final hidden state for the first draft step, the head's own output after that), fuses them with
`fc`, runs one attention layer over its own KV buffers (sharing the target's slot table), applies
its own final norm and the target's lm_head. Its attention takes its products on the TF32 tensor
cores where they stay exact (`ops.paged_attention`'s `tensor_cores`): a draft's rows are proposals,
which no other launch must round alike (docs/semantics.md 6.20). On a GPU, at a small hidden size
and decode-size batches, its attention norm runs inside its q|k|v projection's kernel and its MLP
norm (with the residual add) and its SiLU gate inside its gate|up projection's (`ops.norm_matmul`,
`gated=True`, 6.21).

`forward` is the whole head. It is split in two so a wrapper can work on the compute-dtype
logits before they are delivered in the logits dtype: `compute_logits` (the network) and
`deliver` (the conversion to the logits dtype, FP8 scale included). The engine sees a draft
model with `forward(cache, batch, features, at=None)`, `hidden_states` (the network without the
lm_head) and `write_kv` (the K/V of the new tokens and nothing else).
"""

from __future__ import annotations

import dataclasses

import torch

from specverify.kernels.fused_layers import embed_concat_impl
from specverify.kernels.norm_matmul import norm_matmul_impl
from specverify.models import layers
from specverify.models.config import ModelConfig
from specverify.models.target import ForwardOutput, ModelCache, deliver_logits
from specverify.platform import check_device


# Where the head's norms ride in their matmuls (`ops.norm_matmul`): its kernel holds a row's whole
# hidden size and pays at 512 (the small preset) on an H100, not at 2048 (the medium one), where the
# separate norm kernel and cuBLAS's matmul stay (benchmarks/results/norm_matmul-*.md); and rows up
# to a decode-size batch (a k1 cycle's draft-extend at bs 8 has 32).
NORM_MATMUL_HIDDEN = 512
NORM_MATMUL_ROWS = 64


@dataclasses.dataclass
class ContextInput:
    """`DraftHead.context_input`: the new tokens' [embedding | feature] rows [bs, q, 2H] and their
    attention plan, with what they were made from (the embedding, the rotary table's key)."""
    concat: torch.Tensor
    plan: layers.AttentionPlan
    embed: torch.Tensor
    rotary: tuple


class DraftHead:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], target_w: dict[str, torch.Tensor],
                 *, dtype: torch.dtype, device="cpu", kv_layer: int = 0):
        """kv_layer: the layer of the cache's draft K/V buffers this head owns (an MTP draft has
        one head per step, each with its own layer)."""
        self.config = config
        self.device = check_device(device)
        self.kv_layer = kv_layer
        self.w = {k: v.to(device=self.device, dtype=dtype) for k, v in weights.items()}
        # Shared with the target, as EAGLE heads share the embedding and lm_head. A DFlash head
        # adds its mask embedding as one more row: token id vocab_size is "not known yet".
        self.embed = target_w["embed"]
        if "mask_embed" in self.w:
            self.embed = torch.cat([self.embed, self.w["mask_embed"][None, :]], 0)
        self.lm_head = target_w["lm_head"]
        self.rotary = layers.RotaryTable(config.max_context, config.head_dim, config.rope_theta, self.device)
        layers.fuse_qkv(self.w, "layer")
        if layers.fused_path(self.device, dtype):
            layers.fuse_mlp(self.w, "layer")
        # The attention and MLP norms ride in the matmuls they feed (`ops.norm_matmul`) where the
        # kernel pays: a hidden size up to NORM_MATMUL_HIDDEN, decode-size rows (`_fuses`).
        self.norm_matmul = layers.fused_path(self.device, dtype) and config.hidden_size <= NORM_MATMUL_HIDDEN
        if self.norm_matmul:
            for name in ("layer.wqkv", "layer.w_gate_up"):
                self.w[f"{name}_t"] = self.w[name].t().contiguous()

    def hidden_states(self, cache: ModelCache, batch: layers.Batch, features: torch.Tensor) -> torch.Tensor:
        """The head's network without its final norm and lm_head: writes the new tokens' K/V into
        the draft cache and returns the hidden [bs, q, H]. A draft-extend whose logits nobody reads
        (DFlash's context rows) calls this instead of `forward`, and pays for no full-vocabulary
        matmul."""
        x, mlp = self._layer(cache, batch, features)
        return x + mlp

    def context_input(self, cache: ModelCache, batch: layers.Batch, features: torch.Tensor) -> ContextInput:
        """What the new tokens' K/V writes of every head sharing this head's embedding and
        rotary table have in common (MTP's heads share the target's): the [embedding | feature]
        rows and the attention plan."""
        # One kernel on a GPU: `ops.embed_concat`.
        concat = embed_concat_impl(batch.input_ids, self.embed, features.to(self.embed.dtype))
        plan = layers.plan_attention(batch, cache.table.req_to_token, self.rotary, concat.dtype)
        return ContextInput(concat, plan, self.embed, self._rotary_key())

    def write_kv(self, cache: ModelCache, batch: layers.Batch, features: torch.Tensor, *,
                 context: ContextInput | None = None) -> None:
        """Only the new tokens' K/V into the head's draft cache layer, the values `forward` writes:
        the embedding concat, fc, the attention norm and the q / k / v projections with RoPE. A
        draft-extend that needs nothing but a head's context (an MTP head past the first) calls
        this, and runs no attention, MLP or lm_head. context: `context_input` of this batch and
        features, made once by any head with this head's embedding and rotary table (MTP's heads
        1.. share one); ValueError for another head's, or for another shape of batch."""
        cfg = self.config
        if context is None:
            context = self.context_input(cache, batch, features)
        elif context.embed is not self.embed or context.rotary != self._rotary_key():
            raise ValueError("context: made by a head with another embedding or rotary table than this head's")
        elif context.concat.shape[:2] != batch.input_ids.shape:
            raise ValueError(f"context: made for {tuple(context.concat.shape[:2])} new tokens (bs, q), this batch has "
                             f"{tuple(batch.input_ids.shape)}")
        x, qkv = self._projections(context.concat)          # x: the residual stream, unused here
        k_cache, v_cache = cache.draft_kv.k[self.kv_layer], cache.draft_kv.v[self.kv_layer]
        layers.write_kv(x, self.w, "layer", k_cache, v_cache, context.plan, num_heads=cfg.num_heads,
                        num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, qkv=qkv)

    def _rotary_key(self) -> tuple:
        """What the rotary table's values follow from."""
        cfg = self.config
        return cfg.max_context, cfg.head_dim, cfg.rope_theta

    def _fuses(self, x: torch.Tensor) -> bool:
        """Whether this forward's norms ride in their matmuls: the fused path at this hidden size,
        and x [bs, q, H] a decode-size batch (a prefill's draft-extend runs the separate kernels)."""
        return self.norm_matmul and x.shape[0] * x.shape[1] <= NORM_MATMUL_ROWS

    def _attention_input(self, cache: ModelCache, batch: layers.Batch, features: torch.Tensor):
        """(residual stream x [bs, q, H], its attention norm's q|k|v projections [bs, q, (Hq + 2
        Hkv) hd], the forward's attention plan)."""
        context = self.context_input(cache, batch, features)
        return *self._projections(context.concat), context.plan

    def _projections(self, concat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[embedding | feature] rows [bs, q, 2H] -> (residual stream x = fc's output, the q|k|v
        projections of its attention norm)."""
        x = concat @ self.w["fc"]
        eps = self.config.norm_eps
        if self._fuses(x):
            return x, norm_matmul_impl(x, None, self.w["layer.attn_norm"], self.w["layer.wqkv_t"], eps)[0]
        n, _ = layers.add_rmsnorm(x, None, self.w["layer.attn_norm"], eps)
        return x, n @ self.w["layer.wqkv"]

    def _layer(self, cache: ModelCache, batch: layers.Batch,
               features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's layer up to its last residual add: (residual stream [bs, q, H], MLP output);
        the hidden state is their sum."""
        cfg, w = self.config, self.w
        x, qkv, plan = self._attention_input(cache, batch, features)
        mixed = layers.attention(x, w, "layer", batch, cache.draft_kv.k[self.kv_layer], cache.draft_kv.v[self.kv_layer],
                                 cache.table.req_to_token, plan, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
                                 head_dim=cfg.head_dim, tensor_cores=True, qkv=qkv)
        if self._fuses(x):
            # The MLP norm and the SiLU gate both ride in the gate|up projection's kernel.
            act, x = norm_matmul_impl(x, mixed, w["layer.mlp_norm"], w["layer.w_gate_up_t"], cfg.norm_eps, gated=True)
            return x, act @ w["layer.w_down"]
        n, x = layers.add_rmsnorm(x, mixed, w["layer.mlp_norm"], cfg.norm_eps)
        return x, layers.swiglu_mlp(n, w, "layer")

    def compute_logits(self, cache: ModelCache, batch: layers.Batch, features: torch.Tensor, *,
                       at: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's network. features: [bs, q, H] hidden feature paired with each new token.

        Returns (logits [bs, q, V] in the compute dtype, hidden [bs, q, H]); writes the new
        tokens' K/V into the draft cache (every live token's, whatever `at` says).
        at: [bs] int64, the one query lane per request whose logits and hidden state are wanted
        (a draft-extend reads only its last token's): logits [bs, 1, V] and hidden [bs, 1, H], the
        lm_head run on those rows alone. Values in [0, q) (`ops.draft_plan`'s `last`)."""
        x, mlp = self._layer(cache, batch, features)
        # The last residual add rides in the final norm's kernel (its sum is the hidden state), and
        # with `at` so does the lane gather: the kernel reads request b's lane at[b] only.
        n, x = layers.add_rmsnorm(x, mlp, self.w["final_norm"], self.config.norm_eps, at=at)
        return n @ self.lm_head, x

    def deliver(self, logits: torch.Tensor, hidden: torch.Tensor) -> ForwardOutput:
        """Compute-dtype logits [bs, q, V] -> the forward's output in the logits dtype."""
        values, scale = deliver_logits(logits, self.config)
        return ForwardOutput(values, scale, hidden)

    def forward(self, cache: ModelCache, batch: layers.Batch, features: torch.Tensor, *,
                at: torch.Tensor | None = None) -> ForwardOutput:
        """features: [bs, q, H] hidden feature paired with each new token; at: as `compute_logits`."""
        return self.deliver(*self.compute_logits(cache, batch, features, at=at))
