"""The arguments of the optimized decoder's entry points (`generate`, `Engine`), checked up front:
every bad value is a TypeError or ValueError that names the argument and the bound it broke,
before anything is allocated or run."""

from __future__ import annotations

from specverify.engine.requests import prompt_label
from specverify.engine.spec_config import SpecConfig, cache_entries
from specverify.models import ModelConfig
from specverify.platform import PlatformProfile, check_fp8_format, resolve
from specverify.validation import check_int


def check_spec_fit(cfg: ModelConfig, spec: SpecConfig, prompts, budgets: list[int], label=prompt_label) -> None:
    """A speculative decode needs topk distinct draft tokens and room for a cycle's draft region
    (label(i) names prompt i in the message)."""
    if spec.topk > cfg.vocab_size:
        raise ValueError(f"spec.topk {spec.topk} exceeds the vocabulary size {cfg.vocab_size} "
                         f"(the draft picks topk distinct tokens per step)")
    for i, (p, n) in enumerate(zip(prompts, budgets)):
        need = cache_entries(spec, len(p), n)
        if need > cfg.max_context:
            raise ValueError(f"{label(i)}: prompt length {len(p)} + max_new_tokens {n} + draft region "
                             f"{need - len(p) - n} exceeds max_context {cfg.max_context}")


MAX_SEED = 2**32 - 1    # the counter uniforms take 32-bit seeds (docs/semantics.md section 4)


def check_generate_args(models, *, spec, seed, logprobs, eos_token_id, page_size, platform):
    """The non-prompt arguments of `generate`, checked up front; returns the model config."""
    cfg = getattr(models, "config", None)
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"models must be the Models that build_models returns, got {type(models).__name__}")
    if spec is not None and not isinstance(spec, SpecConfig):
        raise TypeError(f"spec must be None or a SpecConfig, got {type(spec).__name__} {spec!r} "
                        f"(build one: SpecConfig(num_steps=3, topk=2, num_draft_tokens=6))")
    check_int("seed", seed, 0, MAX_SEED)
    check_int("logprobs", logprobs, 0, cfg.vocab_size, why="top alternatives per token, 0 = off")
    if eos_token_id is not None:
        check_int("eos_token_id", eos_token_id)
        if not 0 <= eos_token_id < cfg.vocab_size:
            raise ValueError(f"eos_token_id {eos_token_id} is outside [0, {cfg.vocab_size}) (a token id of the vocabulary)")
    check_int("page_size", page_size, 1)
    if platform is not None and not isinstance(platform, (PlatformProfile, str)):
        raise TypeError(f"platform must be None, a profile name or a PlatformProfile, got {type(platform).__name__}")
    profile = resolve(platform)   # an unknown name is a ValueError here, on every path
    if platform is not None:
        check_fp8_format("models: logits dtype", cfg.logits_dtype, profile)
    return cfg
