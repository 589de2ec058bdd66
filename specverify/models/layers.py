"""Building blocks shared by the target model and the draft head: norm, RoPE, cached attention,
the recurrent mixer and the MLP. Every function is batched and padded: a batch is `bs` requests of
up to `q` query tokens; `q_lens[b]` of them are live, the rest are padding that writes only to the
sink slot (and whose attention output is zero).
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from specverify.kernels.attention import paged_attention_impl
from specverify.kernels.fused_layers import (add_rmsnorm_impl, gather_lanes, rotary_kv_write_impl, rotate_half,
                                             runs_triton, silu_mul_impl)
from specverify.kernels.token_slots import token_slots_impl
from specverify.kernels.tree import chain_rows, kept_chain_rows
from specverify.ops import decode_attention_indexed
from specverify.models.kv_cache import SINK_SLOT


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # x * rsqrt(mean(x^2) + eps) * weight, as torch's fused op (one kernel on a GPU instead of five).
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                eps: float, at: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(normed, sum) of the residual stream x plus a sublayer's output (None: nothing to add): one
    fused kernel on a GPU (`ops.add_rmsnorm`'s kernel, unchecked: the model's own tensors), the add
    and torch's rms_norm elsewhere. at: one lane per request, as `lane_rows` (checked there): the
    rows x[b, at[b]] only, [bs, 1, H], read by the same kernel."""
    if at is not None:
        check_lanes(x, at)
    return add_rmsnorm_impl(x, residual, weight, eps, at=at)


def fused_path(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a model on `device` computing in `dtype` runs the fused Triton layer kernels (CUDA,
    16 / 32-bit floats); elsewhere the layers run the torch ops they always ran."""
    return runs_triton("auto", device, dtype)


def fuse_mlp(w: dict, prefix: str) -> None:
    """Add `{prefix}.w_gate_up`, the gate and up projections side by side: one matmul, then
    `ops.silu_mul` (the fused path only)."""
    w[f"{prefix}.w_gate_up"] = torch.cat([w[f"{prefix}.w_gate"], w[f"{prefix}.w_up"]], dim=1)


def swiglu_mlp(n: torch.Tensor, w: dict, prefix: str) -> torch.Tensor:
    """The MLP of the normed input n: (silu(n W_gate) * (n W_up)) W_down."""
    fused = w.get(f"{prefix}.w_gate_up")
    if fused is not None:
        return gated_down(n @ fused, w, prefix)
    return (F.silu(n @ w[f"{prefix}.w_gate"]) * (n @ w[f"{prefix}.w_up"])) @ w[f"{prefix}.w_down"]


def gated_down(gate_up: torch.Tensor, w: dict, prefix: str) -> torch.Tensor:
    """The MLP's second half on the fused path: silu(gate) * up of gate_up = n `{prefix}.w_gate_up`
    (`ops.silu_mul`), then the down projection."""
    return silu_mul_impl(gate_up) @ w[f"{prefix}.w_down"]


class RotaryTable:
    """RoPE's cos / sin of every position a model can see, float64, built once per model.

    A forward looks its positions up once (`at`) and every attention layer reuses the result,
    instead of recomputing the angles per layer and per projection. The table holds exactly the
    values `cos(position * inv_freq)` a per-call computation in float64 gives."""

    def __init__(self, max_context: int, head_dim: int, theta: float, device):
        half = head_dim // 2
        inv_freq = theta ** (-torch.arange(half, dtype=torch.float64, device=device) * 2 / head_dim)
        self.size = max_context + 64           # padded lanes may sit a little past the last position
        angle = torch.arange(self.size, dtype=torch.float64, device=device)[:, None] * inv_freq
        self.cos, self.sin = angle.cos(), angle.sin()                      # [size, half]

    def at(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [bs, q] int64 -> (cos, sin) [bs, q, 1, half] in `dtype`."""
        idx = positions.clamp(0, self.size - 1)
        return self.cos[idx].to(dtype)[:, :, None, :], self.sin[idx].to(dtype)[:, :, None, :]


def rope(x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x: [bs, q, heads, hd]; rotary: (cos, sin) [bs, q, 1, hd/2] of x's positions, in x's dtype."""
    return rotate_half(x, *rotary)


@dataclasses.dataclass
class Batch:
    """Where a forward's query tokens sit in the cache. All tensors on the model's device."""
    input_ids: torch.Tensor     # [bs, q] int64 (padding: any valid id)
    positions: torch.Tensor     # [bs, q] int64 RoPE positions
    rows: torch.Tensor          # [bs] int64 request rows of the slot table
    kv_lens: torch.Tensor       # [bs] int64 prefix: cache entries every query sees
    q_lens: torch.Tensor        # [bs] int64 live query tokens
    tree_mask: torch.Tensor     # [bs, q, R] bool: query j sees region entry r (R = region + q)
    parents: torch.Tensor       # [bs, q] int64 index of each token's parent in the batch, -1 = prefix
    region: int = 0             # entries after the prefix written by earlier forwards (a draft
                                # tree's earlier steps); new tokens go to kv_lens + region + j
    req_ids: torch.Tensor | None = None   # [bs] int64 each row's request: its index in the prompt
                                          # list (padded rows of a graph bucket: 0). Engines carry
                                          # request identity in the batch; models may ignore it.
    kv_index_list: tuple[torch.Tensor, torch.Tensor] | None = None
    # (kv_indptr [bs*q + 1], kv_indices): when set, query token (b, j) is a decode query over the
    # slots kv_indices[kv_indptr[b*q + j] : kv_indptr[b*q + j + 1]] (its own slot included), in
    # place of the prefix + tree-mask rule (naive EAGLE's verify, ops.create_draft_kv_indices).
    slots: torch.Tensor | None = None   # [bs, q] int64 the slots `new_slots` gives, when the caller
                                        # read them already (a draft phase's plan, ops.draft_plan)

    @property
    def live(self) -> torch.Tensor:
        # [bs, q] bool
        q = self.input_ids.shape[1]
        return torch.arange(q, device=self.input_ids.device)[None, :] < self.q_lens[:, None]

    def new_slots(self, req_to_token: torch.Tensor) -> torch.Tensor:
        """[bs, q] token slots the new tokens write to; padding lanes write to the sink
        (`ops.token_slots`: one kernel on a GPU, none when the batch carries them)."""
        if self.slots is not None:
            return self.slots
        return token_slots_impl(req_to_token, self.rows, self.kv_lens, self.q_lens, self.input_ids.shape[1],
                                self.region, SINK_SLOT)


def check_lanes(x: torch.Tensor, at: torch.Tensor) -> None:
    """Raise a ValueError naming `at` unless it is an int64 [bs] tensor for x [bs, q, ...]."""
    if x.dim() < 2 or at.dtype != torch.int64 or at.shape != x.shape[:1]:
        raise ValueError(f"at must be an int64 [{x.shape[0]}] tensor (one lane per request of x [bs, q, ...]), "
                         f"got {at.dtype} {tuple(at.shape)} for x {tuple(x.shape)}")


def lane_rows(x: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """x [bs, q, ...] -> x[b, at[b]] as [bs, 1, ...]: one lane per request (at: [bs] int64 in
    [0, q)), one gather kernel on a GPU."""
    check_lanes(x, at)
    return gather_lanes(x, at)


def chain_mask(bs: int, q: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal tree mask [bs, q, q] and parents [bs, q] for a plain chain of new tokens."""
    _, parents, mask = _chain_rows(q, device)
    return mask.expand(bs, q, q), parents.expand(bs, q)


def chain_offsets(q: int, device) -> torch.Tensor:
    """[q] int64 0..q-1: each new token's offset after a lane's prefix (a chain's positions)."""
    return _chain_rows(q, device)[0]


def no_parents(bs: int, q: int, device) -> torch.Tensor:
    """[bs, q] of -1 (no token's parent is in the batch: a tree step's beams), a kept read-only row."""
    return _chain_rows(1, device)[1].expand(bs, q)


def lone_query_mask(bs: int, seen: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """One new token per lane that sees the `seen` region entries up to and including its own
    (a chain draft's step: the earlier drafts and itself) and has no parent in the batch: tree
    mask [bs, 1, seen] all True, parents [bs, 1] of -1: the last row of a chain of `seen` (seen >= 1)."""
    _, parents, mask = _chain_rows(seen, device)
    return mask[seen - 1].expand(bs, 1, seen), parents[:1].expand(bs, 1)


# A short chain's rows (a decode step's, a cycle's, a draft step's) are the kept ones of
# `kernels.tree` (made once, never evicted: captured steps read them by address); a longer chain's
# (a prefill's, eager) are made fresh each call, so the kept ones stay few and small.
KEPT_CHAIN = 64         # the longest chain whose rows are kept


def _chain_rows(q: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A chain of q new tokens: (offsets 0..q-1, parents -1..q-2, causal mask [q, q])."""
    device = torch.device(device)
    return (kept_chain_rows(q, device) if q <= KEPT_CHAIN else chain_rows(q, device))[:3]


@dataclasses.dataclass
class AttentionPlan:
    """What every attention layer of one forward shares, computed once per forward: the RoPE
    cos / sin of its positions, the slots its new tokens write, and the tree mask as the kernel
    reads it (int8). On the fused path the rotary kernel reads the tables itself at `positions`
    (flattened; it clamps them to the table), and `rotary` is None."""
    rotary: tuple[torch.Tensor, torch.Tensor] | None
    slots: torch.Tensor          # [bs * q] token slot of each new token (padding: the sink)
    tree_mask: torch.Tensor      # [bs, q, region + q] int8
    kv_index_list: tuple[torch.Tensor, torch.Tensor] | None = None   # Batch.kv_index_list
    positions: torch.Tensor | None = None                            # [bs * q] (fused path)
    tables: tuple[torch.Tensor, torch.Tensor] | None = None          # RotaryTable's (cos, sin) (fused path)


def plan_attention(batch: Batch, req_to_token: torch.Tensor, rotary: RotaryTable, dtype: torch.dtype) -> AttentionPlan:
    slots = batch.new_slots(req_to_token).flatten()
    # The kernels read the mask as int8: a bool mask is reinterpreted (same bytes), not copied.
    mask = batch.tree_mask.view(torch.int8) if batch.tree_mask.dtype == torch.bool else batch.tree_mask.to(torch.int8)
    if fused_path(req_to_token.device, dtype):
        # The rotary kernel reads the tables at the positions clamped to them (no clamp kernel here).
        return AttentionPlan(None, slots, mask, batch.kv_index_list, positions=batch.positions.flatten(),
                             tables=(rotary.cos, rotary.sin))
    return AttentionPlan(rotary.at(batch.positions, dtype), slots, mask, batch.kv_index_list)


def fuse_qkv(w: dict, prefix: str) -> None:
    """Add `{prefix}.wqkv`, the q / k / v projections side by side: one matmul instead of three."""
    w[f"{prefix}.wqkv"] = torch.cat([w[f"{prefix}.wq"], w[f"{prefix}.wk"], w[f"{prefix}.wv"]], dim=1)


def write_kv(x: torch.Tensor, w: dict, prefix: str, k_cache: torch.Tensor, v_cache: torch.Tensor,
             plan: AttentionPlan, *, num_heads: int, num_kv_heads: int, head_dim: int,
             qkv: torch.Tensor | None = None) -> torch.Tensor:
    """An attention layer's first half: the q / k / v projections of x [bs, q, H] (normed input),
    RoPE on the query and key heads, and the new tokens' K / V written at plan.slots. Returns the
    rotated query heads [bs, q, num_heads, head_dim]. A forward that needs only a layer's K / V (an
    MTP head's context rows) stops here. qkv: the projections when the caller has them already (the
    draft head's `ops.norm_matmul`); x then only gives the shape."""
    bs, q, _ = x.shape
    if qkv is None:
        qkv = x @ w[f"{prefix}.wqkv"]
    if plan.rotary is None:
        # Fused: RoPE on the query and key heads and the K / V write in one kernel.
        return rotary_kv_write_impl(qkv.view(bs * q, num_heads + 2 * num_kv_heads, head_dim), plan.positions,
                                    *plan.tables, k_cache, v_cache, plan.slots, num_heads).view(bs, q, num_heads, head_dim)
    qkv = qkv.view(bs, q, num_heads + 2 * num_kv_heads, head_dim)
    # RoPE on the query and key heads together, then the three apart (views).
    qk = rope(qkv[:, :, :num_heads + num_kv_heads], plan.rotary)
    qh, kh = qk[:, :, :num_heads], qk[:, :, num_heads:]
    vh = qkv[:, :, num_heads + num_kv_heads:]
    k_cache[plan.slots] = kh.reshape(-1, num_kv_heads, head_dim).to(k_cache.dtype)
    v_cache[plan.slots] = vh.reshape(-1, num_kv_heads, head_dim).to(v_cache.dtype)
    return qh


def attention(x: torch.Tensor, w: dict, prefix: str, batch: Batch, k_cache: torch.Tensor,
              v_cache: torch.Tensor, req_to_token: torch.Tensor, plan: AttentionPlan, *, num_heads: int,
              num_kv_heads: int, head_dim: int, tensor_cores: bool = False,
              qkv: torch.Tensor | None = None) -> torch.Tensor:
    # x: [bs, q, H] normed input; k_cache / v_cache: [slots, nkv, hd]; w holds `{prefix}.wqkv`.
    # qkv: x's q|k|v projections, when the caller made them (`write_kv`).
    # tensor_cores: the paged kernel's products on the TF32 tensor cores where they stay exact
    # (`ops.paged_attention`): for a draft head, whose rows no other launch must round alike. The
    # target's rows take the FMA units, as the indexed kernel does (docs/semantics.md 6.20).
    bs, q, _ = x.shape
    qh = write_kv(x, w, prefix, k_cache, v_cache, plan, num_heads=num_heads, num_kv_heads=num_kv_heads,
                  head_dim=head_dim, qkv=qkv)
    scale = 1.0 / math.sqrt(head_dim)
    if plan.kv_index_list is not None:
        # Every query token its own decode query over an explicit slot list (naive EAGLE's verify).
        kv_indptr, kv_indices = plan.kv_index_list
        out = decode_attention_indexed(qh.reshape(bs * q, num_heads, head_dim), k_cache, v_cache, kv_indptr,
                                       kv_indices, scale=scale, checked=False)
        return out.to(x.dtype).reshape(bs, q, num_heads * head_dim) @ w[f"{prefix}.wo"]
    # Paged attention over the slot pool: each request reads its live length from the device, so
    # the cost follows the live lengths (not max_context) also inside a captured graph. The kernel
    # stores its float32 result rounded to x's dtype (what `.to` would give).
    out = paged_attention_impl(qh, k_cache, v_cache, req_to_token, batch.rows, batch.kv_lens, batch.q_lens,
                               plan.tree_mask, batch.region, scale, out_dtype=x.dtype, tensor_cores=tensor_cores)
    return out.to(x.dtype).reshape(bs, q, num_heads * head_dim) @ w[f"{prefix}.wo"]


def recurrent(x: torch.Tensor, w: dict, prefix: str, batch: Batch, state: torch.Tensor, conv_state: torch.Tensor, *,
              inter: torch.Tensor, conv_inter: torch.Tensor, num_heads: int, key_dim: int,
              value_dim: int) -> torch.Tensor:
    """Short causal convolution, then a gated linear recurrence, over a tree of new tokens.

    x: [bs, q, H] normed input; state: [slots, nr, dk, dv] and conv_state: [slots, W-1, C] the
    committed states, read at the batch's rows (a request with no cached token starts from zeros).
    Each token's "previous token" is its parent in the batch (the last cached token for a root),
    so both the conv window and the recurrence run along the token's own ancestry.
    Writes the recurrent state after every new token into `inter` [bs, q, nr, dk, dv] and the conv
    window after every new token into `conv_inter` [bs, q, W-1, C] (the caller's intermediate
    caches, what a verify's commit scatters from); returns the mixer output [bs, q, H].
    """
    bs, q, _ = x.shape
    dq, dkv = num_heads * key_dim, 2 * num_heads * key_dim
    u = torch.cat([x @ w[f"{prefix}.wq"], x @ w[f"{prefix}.wk"], x @ w[f"{prefix}.wv"]], -1)   # [bs, q, C]
    taps = w[f"{prefix}.conv"]                                             # [W, C], oldest first
    gate = torch.sigmoid(x @ w[f"{prefix}.wa"] + w[f"{prefix}.ba"])        # [bs, q, nr]
    fresh = (batch.kv_lens == 0)[:, None, None]
    start = torch.where(fresh[..., None], 0, state[batch.rows].to(x.dtype))          # [bs, nr, dk, dv]
    window = torch.where(fresh, 0, conv_state[batch.rows].to(x.dtype))              # [bs, W-1, C]
    queries = x.new_empty((bs, q, num_heads, key_dim))
    ar = torch.arange(bs, device=x.device)
    for j in range(q):   # tokens in topological order: a parent precedes its children
        parent = batch.parents[:, j]
        has_parent = (parent >= 0)[:, None, None]
        full = torch.cat([torch.where(has_parent, conv_inter[ar, parent.clamp(min=0)], window), u[:, j, None]], 1)
        conv_inter[:, j] = full[:, 1:]
        c = F.silu((full * taps).sum(1))                                   # [bs, C]
        queries[:, j] = c[:, :dq].view(bs, num_heads, key_dim)
        kv = c[:, dq:dkv].view(bs, num_heads, key_dim) / math.sqrt(key_dim)
        vv = c[:, dkv:].view(bs, num_heads, value_dim)
        prev = torch.where(has_parent[..., None], inter[ar, parent.clamp(min=0)], start)
        inter[:, j] = gate[:, j, :, None, None] * prev + kv[:, :, :, None] * vv[:, :, None, :]
    y = torch.einsum("bqrk,bqrkv->bqrv", queries, inter).reshape(bs, q, num_heads * value_dim)
    return y @ w[f"{prefix}.wo"]
