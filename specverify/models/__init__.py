"""Tiny models, deterministic from a seed: the target LM, the EAGLE draft head, their caches."""

from __future__ import annotations

import dataclasses

import torch

from specverify import dtypes
from specverify.models.config import ModelConfig, preset as preset_config
from specverify.models.draft import DraftHead
from specverify.models.kv_cache import CacheFullError, KVBuffers, SlotTable, StateBuffers
from specverify.models.layers import Batch, chain_mask
from specverify.models.target import ForwardOutput, ModelCache, TargetModel
from specverify.models.weights import draft_weights, target_weights
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
    draft: DraftHead

    @property
    def device(self) -> torch.device:
        return self.target.device


def build_models(preset: str = "tiny", *, seed: int = 0, draft_agreement: float | None = None,
                 hybrid: bool = False, compute_dtype: str = "float32", logits_dtype: str = "float32",
                 logits_scale: float | None = None, logits_scale_mode: str = "static",
                 platform=None, device: str | None = None) -> Models:
    """Build the `preset` models ("tiny" or "small") deterministically from `seed`.

    draft_agreement: None for the plain draft head, or a probability in [0, 1] that the head
    proposes the target's greedy token wherever the caller tells it that token (1.0 = always
    right oracle, 0.0 = always wrong oracle).
    """
    for arg, value, allowed in (("compute_dtype", compute_dtype, dtypes.COMPUTE_DTYPES),
                                ("logits_dtype", logits_dtype, dtypes.LOGITS_DTYPES)):
        if value not in allowed:
            raise ValueError(f"{arg} must be one of {allowed}, got {value!r}")
    cfg = preset_config(preset, hybrid=hybrid)
    changes = dict(compute_dtype=compute_dtype, logits_dtype=logits_dtype, logits_scale_mode=logits_scale_mode)
    if logits_scale is not None:
        changes["logits_scale"] = logits_scale
    cfg = cfg.replace(**changes)
    if device is None:
        device = resolve(platform).device
    tw, dw = target_weights(cfg, seed), draft_weights(cfg, seed)
    target = TargetModel(cfg, tw, device)
    draft = DraftHead(cfg, dw, target.w, agreement=draft_agreement, seed=seed, dtype=target.dtype, device=device)
    return Models(cfg, seed, tw, dw, target, draft)
