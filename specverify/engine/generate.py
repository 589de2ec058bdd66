"""`generate`: the public entry of the optimized decoder. It checks every argument up front, then
hands the requests to the decoder the call asks for: `target_only.py` (spec=None) or
`speculative.py` (spec=SpecConfig(...)). Both keep their requests on the device and read one
packed result back per step.
"""

from __future__ import annotations

from typing import Sequence

from specverify.engine.logprobs import LogprobChannel
from specverify.engine.requests import GenerationOutput, check_prompts, new_requests
from specverify.engine.sampling import SamplingParams
from specverify.engine.spec_config import SpecConfig
from specverify.engine.speculative import generate_speculative
from specverify.engine.target_only import generate_target_only
from specverify.models import ModelConfig
from specverify.platform import PlatformProfile, check_fp8_format, resolve
from specverify.validation import check_int


def generate(models: Models, prompts: Sequence[Sequence[int]], *, spec=None, max_new_tokens,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
             seed: int = 0, eos_token_id: int | None = None, logprobs: int = 0,
             page_size: int = 1, platform=None, trace: bool = False, repetition_penalty: float = 1.0,
             frequency_penalty: float = 0.0, presence_penalty: float = 0.0) -> GenerationOutput:
    """Decode `prompts` with the optimized decoder.

    spec=None: cached target-only decoding (greedy when temperature == 0, else seeded sampling
    with the counter uniforms of docs/semantics.md section 4); page_size sets its KV page size.
    spec=SpecConfig(...): speculative decoding (the page size is spec.page_size); the output
    carries per-request accept lengths. platform: the profile whose policies apply (default:
    SPECVERIFY_PLATFORM or the native one). logprobs=N > 0 records, per emitted token, its
    logprob, rank and the N best alternatives. trace=True (speculative only) records every
    cycle's tree, accepted nodes and emitted tokens in `output.trace` (docs/semantics.md 6.5).
    repetition_penalty (1 = off), frequency_penalty and presence_penalty (0 = off): the sampling
    penalties of docs/semantics.md section 7, greedy included, for both algorithms (speculative
    decoding stays lossless); logprobs still report the raw distribution.
    """
    if not isinstance(trace, bool):
        raise TypeError(f"trace must be a bool, got {type(trace).__name__} {trace!r}")
    if trace and spec is None:
        raise ValueError("trace=True records speculative cycles; it needs spec=SpecConfig(...)")
    cfg = check_generate_args(models, spec=spec, seed=seed, logprobs=logprobs, eos_token_id=eos_token_id,
                              page_size=page_size, platform=platform)
    budgets = check_prompts(prompts, max_new_tokens, cfg.vocab_size, cfg.max_context)
    params = SamplingParams(temperature, top_k, top_p, min_p, repetition_penalty, frequency_penalty, presence_penalty)
    # numpy integers pass the checks; compute with Python ints (no fixed-width overflow).
    seed, logprobs = int(seed), int(logprobs)
    eos_token_id = None if eos_token_id is None else int(eos_token_id)
    reqs = new_requests(prompts, budgets)
    if spec is None:
        channel = LogprobChannel(len(reqs), logprobs, max_rows=1) if logprobs else None
        generate_target_only(models, reqs, params, seed=seed, eos_token_id=eos_token_id, channel=channel,
                             page_size=page_size, platform=platform)
        return GenerationOutput([r.output for r in reqs], logprobs_out(channel))
    check_spec_fit(cfg, spec, prompts, budgets)
    channel = LogprobChannel(len(reqs), logprobs, max_rows=spec.num_steps + 1) if logprobs else None
    traces = generate_speculative(models, reqs, spec, params, seed=seed, eos_token_id=eos_token_id,
                                  channel=channel, platform=platform, trace=trace)
    return GenerationOutput([r.output for r in reqs], logprobs_out(channel), [r.accept_lengths for r in reqs],
                            trace=traces)


def check_spec_fit(cfg: ModelConfig, spec: SpecConfig, prompts, budgets: list[int]) -> None:
    """A speculative decode needs topk distinct draft tokens and room for a cycle's draft region."""
    if spec.topk > cfg.vocab_size:
        raise ValueError(f"spec.topk {spec.topk} exceeds the vocabulary size {cfg.vocab_size} "
                         f"(the draft picks topk distinct tokens per step)")
    region = max(spec.draft_tokens, spec.draft_reach)     # what SpecDecoder.request_length reserves
    for i, (p, n) in enumerate(zip(prompts, budgets)):
        if len(p) + n + region + 1 > cfg.max_context:
            raise ValueError(f"prompts[{i}]: prompt length {len(p)} + max_new_tokens {n} + draft region "
                             f"{region + 1} exceeds max_context {cfg.max_context}")


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


def logprobs_out(channel: LogprobChannel | None) -> list[list[TokenLogprob]] | None:
    """What the output processor assembled from the message stream (None without logprobs)."""
    return None if channel is None else [res.logprobs for res in channel.close()]
