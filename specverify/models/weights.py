"""Deterministic float64 master weights for the target model and the EAGLE draft head.

Weights are plain dicts of float64 CPU tensors named as in docs/semantics.md, drawn in a fixed
order from one seeded generator, so the same seed gives the same model on every machine.
"""

from __future__ import annotations

import math

import torch

from specverify.models.config import ModelConfig


def _draw(gen: torch.Generator, shape: tuple[int, ...], std: float) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float64) * std


def _norm_weight(gen: torch.Generator, size: int) -> torch.Tensor:
    # RMSNorm gains near 1 so every layer contributes.
    return 1.0 + 0.1 * torch.randn((size,), generator=gen, dtype=torch.float64)


def _mlp(gen: torch.Generator, cfg: ModelConfig, prefix: str, out: dict) -> None:
    h, i = cfg.hidden_size, cfg.intermediate_size
    out[f"{prefix}.mlp_norm"] = _norm_weight(gen, h)
    out[f"{prefix}.w_gate"] = _draw(gen, (h, i), 1 / math.sqrt(h))
    out[f"{prefix}.w_up"] = _draw(gen, (h, i), 1 / math.sqrt(h))
    out[f"{prefix}.w_down"] = _draw(gen, (i, h), 0.5 / math.sqrt(i))


def _attention(gen: torch.Generator, cfg: ModelConfig, prefix: str, out: dict) -> None:
    h, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    out[f"{prefix}.attn_norm"] = _norm_weight(gen, h)
    out[f"{prefix}.wq"] = _draw(gen, (h, q), 1 / math.sqrt(h))
    out[f"{prefix}.wk"] = _draw(gen, (h, kv), 1 / math.sqrt(h))
    out[f"{prefix}.wv"] = _draw(gen, (h, kv), 1 / math.sqrt(h))
    out[f"{prefix}.wo"] = _draw(gen, (q, h), 0.5 / math.sqrt(q))


def _recurrent(gen: torch.Generator, cfg: ModelConfig, prefix: str, out: dict) -> None:
    h, nr, dk, dv = cfg.hidden_size, cfg.num_rec_heads, cfg.rec_key_dim, cfg.rec_value_dim
    out[f"{prefix}.attn_norm"] = _norm_weight(gen, h)
    out[f"{prefix}.wq"] = _draw(gen, (h, nr * dk), 1 / math.sqrt(h))
    out[f"{prefix}.wk"] = _draw(gen, (h, nr * dk), 1 / math.sqrt(h))
    out[f"{prefix}.wv"] = _draw(gen, (h, nr * dv), 1 / math.sqrt(h))
    # Causal conv taps over the q | k | v projections, oldest first: the current input's tap near 1.
    conv = _draw(gen, (cfg.rec_conv_width, cfg.rec_channels), 0.3)
    conv[-1] += 1.0
    out[f"{prefix}.conv"] = conv
    out[f"{prefix}.wa"] = _draw(gen, (h, nr), 1 / math.sqrt(h))
    out[f"{prefix}.ba"] = 1.0 + _draw(gen, (nr,), 0.5)   # decay gates mostly open: long memory
    out[f"{prefix}.wo"] = _draw(gen, (nr * dv, h), 0.5 / math.sqrt(nr * dv))


def target_weights(cfg: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator("cpu").manual_seed(seed)
    h, v = cfg.hidden_size, cfg.vocab_size
    out: dict[str, torch.Tensor] = {"embed": _draw(gen, (v, h), 1.0)}
    for i, kind in enumerate(cfg.layer_kinds):
        (_attention if kind == "attention" else _recurrent)(gen, cfg, f"layers.{i}", out)
        _mlp(gen, cfg, f"layers.{i}", out)
    out["final_norm"] = _norm_weight(gen, h)
    # lm_head spread sets how peaked the next-token distribution is.
    out["lm_head"] = _draw(gen, (h, v), cfg.init_std * 2.0 / math.sqrt(h))
    return out


def draft_weights(cfg: ModelConfig, seed: int, *, stream: int = 0x5EED) -> dict[str, torch.Tensor]:
    """EAGLE head: fc over [embed(token), target hidden] -> one attention layer -> own final norm.

    The head shares the target's embedding and lm_head, so it has none of its own. `stream`
    offsets the seed: the MTP and DFlash heads are heads of the same structure drawn apart.
    """
    gen = torch.Generator("cpu").manual_seed(seed + stream)
    h = cfg.hidden_size
    out: dict[str, torch.Tensor] = {"fc": _draw(gen, (2 * h, h), 1 / math.sqrt(2 * h))}
    _attention(gen, cfg, "layer", out)
    _mlp(gen, cfg, "layer", out)
    out["final_norm"] = _norm_weight(gen, h)
    return out


def mtp_weights(cfg: ModelConfig, seed: int) -> list[dict[str, torch.Tensor]]:
    """The MTP draft: `cfg.mtp_heads` heads, each shaped as the EAGLE head; head j runs draft step j."""
    return [draft_weights(cfg, seed, stream=0x3770 + 17 * j) for j in range(cfg.mtp_heads)]


def dflash_weights(cfg: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """The DFlash block draft: an EAGLE-shaped head plus `mask_embed` [H], the input embedding of
    the block's not-yet-known positions (token id `vocab_size` of the head's own table)."""
    out = draft_weights(cfg, seed, stream=0xDF1A)
    gen = torch.Generator("cpu").manual_seed(seed + 0xDF1B)
    out["mask_embed"] = _draw(gen, (cfg.hidden_size,), 1.0)
    return out
