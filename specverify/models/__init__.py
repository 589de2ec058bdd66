"""Tiny models, deterministic from a seed: the target LM, the EAGLE draft head, their caches."""

from __future__ import annotations

import dataclasses

import torch

from specverify import dtypes
from specverify.models.config import ModelConfig, check_build_args, check_preset_device, preset as preset_config
from specverify.models.draft import DraftHead
from specverify.models.kv_cache import CacheFullError, KVBuffers, SlotTable, StateBuffers
from specverify.models.layers import Batch, chain_mask
from specverify.models.target import ForwardOutput, ModelCache, TargetModel
from specverify.models.weights import dflash_weights, draft_weights, mtp_weights, target_weights
from specverify.platform import resolve

__all__ = ["Models", "build_models", "ModelConfig", "preset_config", "TargetModel", "DraftHead", "ModelCache",
           "ForwardOutput", "Batch", "chain_mask", "SlotTable", "KVBuffers", "StateBuffers",
           "CacheFullError"]


@dataclasses.dataclass
class Models:
    """A target model, its draft head and the float64 masters both were built from."""
    config: ModelConfig
    seed: int
    target_weights: dict[str, torch.Tensor]   # float64 CPU masters (what the reference reads)
    draft_weights: dict[str, torch.Tensor]
    target: TargetModel
    draft: DraftHead            # or any draft model with the same `forward(cache, batch, features)`
    mtp_weights: list[dict[str, torch.Tensor]] = dataclasses.field(default_factory=list)
    dflash_weights: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    mtp: list = dataclasses.field(default_factory=list)   # MTP heads, head j = draft step j (own K/V layer j)
    dflash: DraftHead | None = None                        # the DFlash block draft (K/V layer 0)

    @property
    def device(self) -> torch.device:
        return self.target.device


def build_models(preset: str = "tiny", *, seed: int = 0, hybrid: bool = False,
                 compute_dtype: str = "float32", logits_dtype: str = "float32",
                 logits_scale: float | None = None, logits_scale_mode: str = "static",
                 platform=None, device: str | None = None) -> Models:
    """Build the `preset` models ("tiny" or "small") deterministically from `seed`.

    The drafts: the plain EAGLE head (`draft`), the MTP heads (`mtp`, one per draft step) and the
    DFlash block head (`dflash`); each has float64 masters beside the target's. Tests steer it towards the target (an agreement rate)
    with a wrapper of their own (`tests/support/steering.py`), never through the engine.
    """
    profile = check_build_args(preset=preset, seed=seed, hybrid=hybrid, compute_dtype=compute_dtype,
                               logits_dtype=logits_dtype, logits_scale=logits_scale,
                               logits_scale_mode=logits_scale_mode, platform=platform, device=device,
                               compute_dtypes=dtypes.COMPUTE_DTYPES, logits_dtypes=dtypes.LOGITS_DTYPES,
                               scale_modes=dtypes.SCALE_MODES)
    seed = int(seed)
    cfg = preset_config(preset, hybrid=hybrid)
    changes = dict(compute_dtype=compute_dtype, logits_dtype=logits_dtype, logits_scale_mode=logits_scale_mode)
    if logits_scale is not None:
        changes["logits_scale"] = logits_scale
    cfg = cfg.replace(**changes)
    if device is None:
        device = (profile or resolve(None)).device
    check_preset_device(preset, device)
    tw, dw = target_weights(cfg, seed), draft_weights(cfg, seed)
    target = TargetModel(cfg, tw, device)
    draft = DraftHead(cfg, dw, target.w, dtype=target.dtype, device=device)
    mw, fw = mtp_weights(cfg, seed), dflash_weights(cfg, seed)
    mtp = [DraftHead(cfg, w, target.w, dtype=target.dtype, device=device, kv_layer=j) for j, w in enumerate(mw)]
    dflash = DraftHead(cfg, fw, target.w, dtype=target.dtype, device=device)
    return Models(cfg, seed, tw, dw, target, draft, mw, fw, mtp, dflash)
