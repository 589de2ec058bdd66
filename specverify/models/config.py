"""Model configurations and presets (the shapes of docs/semantics.md section 1)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_context: int
    layer_kinds: tuple[str, ...]        # "attention" | "recurrent", one per layer
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    num_rec_heads: int = 2              # recurrent layers: heads, key dim, value dim
    rec_key_dim: int = 16
    rec_value_dim: int = 16
    rec_conv_width: int = 4             # recurrent layers: causal conv window over the q|k|v projections
    mtp_heads: int = 3                  # the MTP draft's heads (one per draft step)
    compute_dtype: str = "float32"      # dtype the optimized model computes in
    logits_dtype: str = "float32"       # dtype logits are delivered in (FP8 = quantized)
    logits_scale: float = 1.0           # static per-model FP8 logits scale
    logits_scale_mode: str = "static"   # "static" | "per_row"
    init_std: float = 1.0               # scale of the random weights (larger = peakier logits)

    def __post_init__(self):
        if len(self.layer_kinds) != self.num_layers:
            raise ValueError(f"layer_kinds has {len(self.layer_kinds)} entries, num_layers is {self.num_layers}")
        bad = [k for k in self.layer_kinds if k not in ("attention", "recurrent")]
        if bad:
            raise ValueError(f"layer_kinds entries must be 'attention' or 'recurrent', got {bad}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.rec_conv_width < 2:
            raise ValueError(f"rec_conv_width must be >= 2 (a window of earlier inputs), got {self.rec_conv_width}")
        if self.mtp_heads < 1:
            raise ValueError(f"mtp_heads must be >= 1, got {self.mtp_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @property
    def is_hybrid(self) -> bool:
        return "recurrent" in self.layer_kinds

    @property
    def rec_channels(self) -> int:
        """Channels of a recurrent layer's conv window: its q | k | v projections side by side."""
        return self.num_rec_heads * (2 * self.rec_key_dim + self.rec_value_dim)

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


def _layer_kinds(num_layers: int, hybrid: bool) -> tuple[str, ...]:
    # Hybrid models alternate recurrent and attention layers, starting with a recurrent one.
    if not hybrid:
        return ("attention",) * num_layers
    return tuple("recurrent" if i % 2 == 0 else "attention" for i in range(num_layers))


# The tiny hybrid has one layer more than the dense tiny model: recurrent, attention, recurrent, so
# a commit must keep two recurrent layers apart (seed 004's multi-layer swap is expressible).
TINY_HYBRID_LAYERS = 3


def preset(name: str, *, hybrid: bool = False) -> ModelConfig:
    """`tiny`: CPU tests (a 64-token generation well under a second). `small`: GPU benchmarks, a
    launch-bound target (~80 MB of bfloat16 weights). `medium`: GPU benchmarks and `gpu`-marked
    tests only, a memory-bound target (~2.5 GB of bfloat16 weights, 24 layers; its one-layer draft
    head and the lm_head it shares cost about a tenth of a target step per draft forward)."""
    if name == "tiny":
        layers = TINY_HYBRID_LAYERS if hybrid else 2
        return ModelConfig(vocab_size=389, hidden_size=64, num_layers=layers, num_heads=4, num_kv_heads=2,
                           head_dim=16, intermediate_size=96, max_context=512,
                           layer_kinds=_layer_kinds(layers, hybrid), init_std=1.0)
    if name == "small":
        return ModelConfig(vocab_size=32000, hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4,
                           head_dim=64, intermediate_size=1408, max_context=4096,
                           layer_kinds=_layer_kinds(8, hybrid), num_rec_heads=4, rec_key_dim=32,
                           rec_value_dim=64, init_std=1.0)
    if name == "medium":
        return ModelConfig(vocab_size=32000, hidden_size=2048, num_layers=MEDIUM_LAYERS, num_heads=16, num_kv_heads=8,
                           head_dim=128, intermediate_size=5632, max_context=2048,
                           layer_kinds=_layer_kinds(MEDIUM_LAYERS, hybrid), num_rec_heads=8, rec_key_dim=64,
                           rec_value_dim=128, init_std=1.0)
    raise ValueError(f"preset {name!r} is unknown; expected one of {PRESETS}")


PRESETS = ("tiny", "small", "medium")
GPU_ONLY_PRESETS = ("medium",)   # float64 masters of ~10 GB: never built for a CPU device
MEDIUM_LAYERS = 24


MAX_SEED = 2**32 - 1    # seeds are 32-bit: every derived generator seed stays inside torch's range


def check_build_args(*, preset, seed, hybrid, compute_dtype, logits_dtype, logits_scale, logits_scale_mode,
                     platform, device, compute_dtypes, logits_dtypes, scale_modes):
    """Validate `build_models` arguments up front (TypeError for types, ValueError for values).
    Returns the platform profile whose FP8 policy was enforced (None when none was named)."""
    from specverify.platform import PlatformProfile, check_device, check_fp8_format, resolve
    from specverify.validation import check_bool, check_choice, check_int, check_real

    check_choice("preset", preset, PRESETS)
    check_int("seed", seed, 0, MAX_SEED)
    check_bool("hybrid", hybrid)
    check_choice("compute_dtype", compute_dtype, compute_dtypes)
    check_choice("logits_dtype", logits_dtype, logits_dtypes)
    check_choice("logits_scale_mode", logits_scale_mode, scale_modes)
    if logits_scale is not None:
        # The scale is applied in float32: it must be a finite, positive float32 value.
        check_real("logits_scale", logits_scale, 0.0, FLOAT32_MAX, lo_open=True,
                   why="a static FP8 scale, finite and > 0 in float32")
        if float(_float32(logits_scale)) == 0.0:
            raise ValueError(f"logits_scale must be > 0 in float32, got {logits_scale!r} (rounds to 0)")
    if platform is not None and not isinstance(platform, (PlatformProfile, str)):
        raise TypeError(f"platform must be None, a profile name or a PlatformProfile, got {type(platform).__name__}")
    profile = resolve(platform) if platform is not None else None
    if profile is not None:
        check_fp8_format("logits_dtype", logits_dtype, profile)
    if device is not None:
        check_device(device)     # TypeError / ValueError / ProfileUnavailable naming `device`
    return profile


def check_preset_device(preset: str, device) -> None:
    """A GPU-only preset is refused for any other device (ValueError naming preset and device)."""
    if preset in GPU_ONLY_PRESETS and not str(device).startswith("cuda"):
        raise ValueError(f"preset {preset!r} is for GPU benchmarks and gpu-marked tests only (its float64 "
                         f"masters take ~10 GB and minutes to build); device is {str(device)!r}: pass "
                         f"device='cuda' or use preset 'tiny' or 'small'")


FLOAT32_MAX = 3.4028234663852886e38


def _float32(x):
    import struct
    try:
        return struct.unpack("<f", struct.pack("<f", float(x)))[0]
    except OverflowError:
        return float("inf")
