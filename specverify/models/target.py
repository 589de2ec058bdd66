"""The tiny decoder-only target LM with a paged KV cache (docs/semantics.md section 1).

One `forward` serves prefill / extend (a chain of new tokens), decode (one new token) and verify
(a tree of new tokens with an arbitrary ancestor mask). Logits come out in the configured logits
dtype; FP8 logits are quantized with the model's static or per-row scale.
"""

from __future__ import annotations

import dataclasses

import torch

from specverify import dtypes
from specverify.models import layers
from specverify.models.config import ModelConfig
from specverify.models.kv_cache import KVBuffers, SlotTable, StateBuffers
from specverify.ops import mamba_state_scatter
from specverify.platform import check_device


@dataclasses.dataclass
class ModelCache:
    """Everything a decode keeps between forwards: the slot table and the per-model buffers."""
    table: SlotTable
    kv: KVBuffers                  # target attention layers
    states: StateBuffers           # target recurrent layers (empty list when not hybrid)
    draft_kv: KVBuffers | None     # the draft head's single attention layer


@dataclasses.dataclass
class ForwardOutput:
    logits: torch.Tensor           # [bs, q, V] in the logits dtype
    scale: torch.Tensor            # [bs, q, 1] float32 dequantization scale (ones unless FP8)
    hidden: torch.Tensor           # [bs, q, H] final hidden state before the final norm
    # The intermediate caches of the recurrent layers (None without any): the state after each new
    # token, [L, bs, q, nr, dk, dv], and the conv window after each, [L, bs, q, W-1, C].
    rec_states: torch.Tensor | None = None
    conv_states: torch.Tensor | None = None


def deliver_logits(logits: torch.Tensor, cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Compute-dtype logits -> (logits in cfg.logits_dtype, float32 scale [..., 1]; a read-only
    view of one shared element where the logits carry no scale)."""
    return dtypes.to_logits_dtype(logits, cfg.logits_dtype, scale_mode=cfg.logits_scale_mode,
                                  static_scale=cfg.logits_scale, shared_ones=True)


class TargetModel:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], device="cpu"):
        self.config = config
        self.device = check_device(device)
        self.dtype = dtypes.dtype_info(config.compute_dtype).torch_dtype
        self.w = {k: v.to(device=self.device, dtype=self.dtype) for k, v in weights.items()}
        self.attn_layers = [i for i, k in enumerate(config.layer_kinds) if k == "attention"]
        self.rec_layers = [i for i, k in enumerate(config.layer_kinds) if k == "recurrent"]
        self.rotary = layers.RotaryTable(config.max_context, config.head_dim, config.rope_theta, self.device)
        for i in self.attn_layers:
            layers.fuse_qkv(self.w, f"layers.{i}")
        if layers.fused_path(self.device, self.dtype):
            for i in range(config.num_layers):
                layers.fuse_mlp(self.w, f"layers.{i}")

    def new_cache(self, *, max_requests: int, page_size: int = 1, num_pages: int | None = None,
                  with_draft: bool = True, draft_layers: int = 1) -> ModelCache:
        """draft_layers: the draft's K/V layers when with_draft (an MTP draft owns one per head)."""
        cfg = self.config
        if num_pages is None:
            num_pages = 1 + max_requests * (-(-cfg.max_context // page_size))
        table = SlotTable(max_requests=max_requests, max_context=cfg.max_context, num_pages=num_pages,
                          page_size=page_size, device=self.device)

        def kv(n):
            return KVBuffers(num_layers=n, num_slots=table.num_slots, num_kv_heads=cfg.num_kv_heads,
                             head_dim=cfg.head_dim, dtype=self.dtype, device=self.device)

        states = StateBuffers(num_layers=len(self.rec_layers), max_requests=max_requests,
                              state_shape=(cfg.num_rec_heads, cfg.rec_key_dim, cfg.rec_value_dim),
                              conv_shape=(cfg.rec_conv_width - 1, cfg.rec_channels),
                              dtype=self.dtype, device=self.device)
        return ModelCache(table, kv(len(self.attn_layers)), states, kv(draft_layers) if with_draft else None)

    def forward(self, cache: ModelCache, batch: layers.Batch, *, commit_state: bool = True) -> ForwardOutput:
        """Run the new tokens of `batch`; their K/V land in the cache at kv_lens + j.

        commit_state: write each request's recurrent state and conv window after its last live token
        back to the cache (prefill / decode), by `ops.mamba_state_scatter` as a verify's commit. A
        verify passes False and commits accepted states itself.
        """
        cfg, w = self.config, self.w
        h = w["embed"][batch.input_ids]                                    # [bs, q, H]
        plan = layers.plan_attention(batch, cache.table.req_to_token, self.rotary, h.dtype)   # shared by the layers
        rec_states = conv_states = None
        if self.rec_layers:       # written in place by the layers: the commit scatters from them as they are
            bs, q = batch.input_ids.shape
            rec_states = h.new_empty((len(self.rec_layers), bs, q, cfg.num_rec_heads, cfg.rec_key_dim,
                                      cfg.rec_value_dim))
            conv_states = h.new_empty((len(self.rec_layers), bs, q, cfg.rec_conv_width - 1, cfg.rec_channels))
        pending = None      # the last sublayer's output, added to h by the next fused add + norm
        for i in range(cfg.num_layers):
            h, pending = self.decoder_layer(i, h, pending, cache, batch, plan, rec_states, conv_states)
        if commit_state and rec_states is not None:
            # Each layer read only its own committed state above, so all commit here at once: the
            # state after each request's last new token (a lane without new tokens commits nothing).
            last = torch.where(batch.q_lens > 0, batch.q_lens - 1, -1)
            for dst, src in ((cache.states.stacked, rec_states), (cache.states.conv_stacked, conv_states)):
                mamba_state_scatter(dst=dst, src=src, dst_indices=batch.rows, step_indices=last, checked=False)
        n, h = layers.add_rmsnorm(h, pending, w["final_norm"], cfg.norm_eps)
        logits = n @ w["lm_head"]
        values, scale = deliver_logits(logits, cfg)
        return ForwardOutput(values, scale, h, rec_states, conv_states)

    def decoder_layer(self, i: int, h: torch.Tensor, pending: torch.Tensor | None, cache: ModelCache,
                      batch: layers.Batch, plan: layers.AttentionPlan, rec_states: torch.Tensor | None = None,
                      conv_states: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i of `forward` over the residual stream h [bs, q, H] and the previous layer's MLP
        output `pending` (None: nothing to add): (the stream with pending added, this layer's MLP
        output). A recurrent layer writes its states into rec_states / conv_states."""
        cfg, w, p = self.config, self.w, f"layers.{i}"
        n, h = layers.add_rmsnorm(h, pending, w[f"{p}.attn_norm"], cfg.norm_eps)
        if cfg.layer_kinds[i] == "attention":
            a = self.attn_layers.index(i)
            mixed = layers.attention(n, w, p, batch, cache.kv.k[a], cache.kv.v[a], cache.table.req_to_token,
                                     plan, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
                                     head_dim=cfg.head_dim)
        else:
            r = self.rec_layers.index(i)
            mixed = layers.recurrent(n, w, p, batch, cache.states.state[r], cache.states.conv[r],
                                     inter=rec_states[r], conv_inter=conv_states[r], num_heads=cfg.num_rec_heads,
                                     key_dim=cfg.rec_key_dim, value_dim=cfg.rec_value_dim)
        n, h = layers.add_rmsnorm(h, mixed, w[f"{p}.mlp_norm"], cfg.norm_eps)
        return h, layers.swiglu_mlp(n, w, p)
