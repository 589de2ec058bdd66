"""`generate`: the public entry of the optimized decoder. It checks every argument up front, then
runs the requests through the scheduler (`serving.Engine`) over the decoder the call asks for:
`target_only.py` (spec=None) or `speculative.py` (spec=SpecConfig(...)). Both keep their
requests on the device and read one packed result back per step.
"""

from __future__ import annotations

from typing import Sequence

from specverify.engine.arguments import check_generate_args, check_spec_fit
from specverify.engine.requests import GenerationOutput, check_prompts, pages_needed
from specverify.engine.serving import MAX_RUNNING, Engine
from specverify.engine.spec_config import cache_entries
from specverify.validation import check_int


def generate(models: Models, prompts: Sequence[Sequence[int]], *, spec=None, max_new_tokens,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
             seed: int = 0, eos_token_id: int | None = None, logprobs: int = 0,
             page_size: int = 1, platform=None, trace: bool = False, repetition_penalty: float = 1.0,
             frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
             max_running: int | None = None) -> GenerationOutput:
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
    max_running=N (default: every prompt at once; on CUDA at most 256, the largest graph bucket): at
    most N requests decode at a time, and the next one (in prompt order) is admitted as soon as
    one finishes (docs/semantics.md section 8). The output is the same for every N: a request's uniforms are keyed by its index
    in `prompts`, and it finds nothing of the requests that used its row before.
    """
    if not isinstance(trace, bool):
        raise TypeError(f"trace must be a bool, got {type(trace).__name__} {trace!r}")
    if trace and spec is None:
        raise ValueError("trace=True records speculative cycles; it needs spec=SpecConfig(...)")
    cfg = check_generate_args(models, spec=spec, seed=seed, logprobs=logprobs, eos_token_id=eos_token_id,
                              page_size=page_size, platform=platform)
    budgets = check_prompts(prompts, max_new_tokens, cfg.vocab_size, cfg.max_context)
    if spec is not None:
        check_spec_fit(cfg, spec, prompts, budgets)
    if max_running is None:
        # Every prompt at once, where the steps run at live shapes; on CUDA at most the largest
        # graph bucket (the output is the same for every max_running).
        running = len(prompts) if models.device.type != "cuda" else min(len(prompts), MAX_RUNNING)
    else:
        running = min(check_int("max_running", max_running, 1, why="requests decoded at once"), len(prompts))
    # A pool for the `running` longest runs: admission never waits for pages.
    lengths = sorted(cache_entries(spec, len(p), n) for p, n in zip(prompts, budgets))
    page = page_size if spec is None else spec.page_size
    engine = Engine(models, spec=spec, max_running=running, num_pages=pages_needed(lengths[-running:], page),
                    temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                    eos_token_id=eos_token_id, logprobs=logprobs, page_size=page_size, platform=platform,
                    trace=trace, repetition_penalty=repetition_penalty, frequency_penalty=frequency_penalty,
                    presence_penalty=presence_penalty, max_requests=len(prompts))
    for p, n in zip(prompts, budgets):
        engine.add_request(p, n)
    engine.run()
    return engine.close()
