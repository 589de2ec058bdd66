"""The decoder loop: requests, batching, EOS, max_new_tokens, logprobs.

`generate(spec=None)` is plain cached target-only decoding: one prefill of every prompt, then one
batched decode step per token over the requests still running. Each request owns a row of the
slot table; its pages are freed when it finishes.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from specverify.engine.logprobs import LogprobChannel
from specverify.protocol.output import TokenLogprob
from specverify.engine.sampling import SamplingParams, choose_tokens, uniform_stream
from specverify import dtypes
from specverify.engine.spec_config import SpecConfig
from specverify.models import Batch, ModelCache, ModelConfig, Models, chain_mask
from specverify.platform import PlatformProfile, resolve
from specverify.validation import check_int, is_int


@dataclasses.dataclass
class GenerationOutput:
    tokens: list[list[int]]                          # emitted token ids per request
    logprobs: list[list[TokenLogprob]] | None = None  # per request, per token (logprobs > 0)
    accept_lengths: list[list[int]] | None = None    # per request, tokens emitted per spec step
    trace: list[list["CycleTrace"]] | None = None    # per request, per spec cycle (generate(trace=True))


@dataclasses.dataclass
class CycleTrace:
    """One speculative cycle of one request (docs/semantics.md 6.5), recorded with trace=True."""
    tree_tokens: list[int]      # [D] root first
    tree_parents: list[int]     # [D] -1 for the root and orphans
    accepted: list[int]         # [S+1] accepted node indices, root first, padded with -1
    emitted: list[int]          # tokens emitted this cycle, after the EOS / max_new_tokens cut


@dataclasses.dataclass
class Request:
    index: int                  # position in the prompt list (selects the uniform stream)
    prompt: list[int]
    max_new_tokens: int
    uniforms: torch.Tensor      # [max_new_tokens] float64
    row: int = -1               # slot-table row while running
    cached: int = 0             # tokens whose K/V are in the cache
    output: list[int] = dataclasses.field(default_factory=list)
    finished: bool = False

    @property
    def last_token(self) -> int:
        return self.output[-1]


def check_prompts(prompts: Sequence[Sequence[int]], max_new_tokens, vocab_size: int,
                  max_context: int) -> list[int]:
    """Validate prompts and per-request budgets; return max_new_tokens as a list.

    TypeError for a wrong type (a flat list of ids, a float / bool / str token id or budget),
    ValueError for a value out of its bound; both name the argument and the bound."""
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be a list of token-id lists, got {type(prompts).__name__}")
    if len(prompts) == 0:
        raise ValueError("prompts must be a non-empty list of token-id lists, got an empty list")
    for i, p in enumerate(prompts):
        if not isinstance(p, (list, tuple)):
            hint = " (a flat list of ids? wrap one prompt as [[1, 2, 3]])" if is_int(p) else ""
            raise TypeError(f"prompts[{i}] must be a list of token ids, got {type(p).__name__} {p!r}{hint}")
        if len(p) == 0:
            raise ValueError(f"prompts[{i}] is empty; every prompt needs at least one token")
        for j, t in enumerate(p):
            if not is_int(t):
                raise TypeError(f"prompts[{i}][{j}] must be an int token id, got {type(t).__name__} {t!r}")
            if not 0 <= t < vocab_size:
                raise ValueError(f"prompts[{i}] has token id {t} outside [0, {vocab_size})")
    if isinstance(max_new_tokens, (list, tuple)):
        budgets = list(max_new_tokens)
        if len(budgets) != len(prompts):
            raise ValueError(f"max_new_tokens has {len(budgets)} entries for {len(prompts)} prompts")
        names = [f"max_new_tokens[{i}]" for i in range(len(budgets))]
    elif is_int(max_new_tokens):
        budgets = [max_new_tokens] * len(prompts)
        names = [f"max_new_tokens[{i}]" for i in range(len(budgets))]   # the budget of request i
    else:
        raise TypeError(f"max_new_tokens must be an int or a list of ints (one per prompt), "
                        f"got {type(max_new_tokens).__name__} {max_new_tokens!r}")
    for i, (p, n, name) in enumerate(zip(prompts, budgets, names)):
        n = check_int(name, n, 1)
        if len(p) + n > max_context:
            raise ValueError(f"prompts[{i}]: prompt length {len(p)} + max_new_tokens {n} exceeds "
                             f"max_context {max_context}")
    return [int(n) for n in budgets]


def new_requests(prompts, budgets: list[int], seed: int, cls=None) -> list[Request]:
    return [(cls or Request)(i, [int(t) for t in p], n, uniform_stream(seed, i, n))
            for i, (p, n) in enumerate(zip(prompts, budgets))]


def extend_batch(reqs: list[Request], token_lists: list[list[int]], device) -> Batch:
    """A chain of new tokens per request, appended after what each request has cached."""
    q = max(len(t) for t in token_lists)
    ids = torch.zeros((len(reqs), q), dtype=torch.int64)
    for b, toks in enumerate(token_lists):
        ids[b, :len(toks)] = torch.tensor(toks, dtype=torch.int64)
    kv_lens = torch.tensor([r.cached for r in reqs], dtype=torch.int64)
    q_lens = torch.tensor([len(t) for t in token_lists], dtype=torch.int64)
    positions = kv_lens[:, None] + torch.arange(q)[None, :]
    mask, parents = chain_mask(len(reqs), q, "cpu")
    max_kv = int((kv_lens + q_lens).max())
    rows = torch.tensor([r.row for r in reqs], dtype=torch.int64)
    return Batch(ids.to(device), positions.to(device), rows.to(device), kv_lens.to(device),
                 q_lens.to(device), mask.to(device), parents.to(device), max_kv)


def run_extend(models: Models, cache: ModelCache, reqs: list[Request], token_lists: list[list[int]]):
    """Append `token_lists` to the requests' caches; return logits and scale of each last token."""
    for r, toks in zip(reqs, token_lists):
        cache.table.reserve(r.row, r.cached + len(toks))
    batch = extend_batch(reqs, token_lists, models.device)
    out = models.target.forward(cache, batch)
    last = batch.q_lens - 1
    ar = torch.arange(len(reqs), device=models.device)
    for r, toks in zip(reqs, token_lists):
        r.cached += len(toks)
    return out.logits[ar, last], out.scale[ar, last]


def emit_tokens(reqs: list[Request], logits: torch.Tensor, scale: torch.Tensor, params: SamplingParams,
                eos_token_id: int | None, channel: LogprobChannel | None) -> None:
    """Choose one token per request from its logits row and record it."""
    u = torch.stack([r.uniforms[len(r.output)] for r in reqs])
    tokens = choose_tokens(logits, scale, params, u)
    if channel is not None:
        channel.send([r.index for r in reqs], [1] * len(reqs), logits, scale, tokens)
    for r, t in zip(reqs, tokens.tolist()):
        r.output.append(t)
        r.finished = len(r.output) >= r.max_new_tokens or (eos_token_id is not None and t == eos_token_id)


def generate_target_only(models: Models, reqs: list[Request], params: SamplingParams, *,
                         eos_token_id: int | None, channel: LogprobChannel | None, page_size: int) -> None:
    cache = models.target.new_cache(max_requests=len(reqs), page_size=page_size, with_draft=False,
                                    num_pages=pages_needed([len(r.prompt) + r.max_new_tokens for r in reqs], page_size))
    for r in reqs:
        r.row = cache.table.alloc_row()
    logits, scale = run_extend(models, cache, reqs, [r.prompt for r in reqs])
    emit_tokens(reqs, logits, scale, params, eos_token_id, channel)
    running = [r for r in reqs if not _retire(cache, r)]
    while running:
        logits, scale = run_extend(models, cache, running, [[r.last_token] for r in running])
        emit_tokens(running, logits, scale, params, eos_token_id, channel)
        running = [r for r in running if not _retire(cache, r)]


def pages_needed(lengths: list[int], page_size: int) -> int:
    """Pool size for requests that grow to `lengths` cache entries (page 0 is reserved)."""
    return 1 + sum(-(-n // page_size) for n in lengths)


def _retire(cache: ModelCache, r: Request) -> bool:
    if r.finished:
        cache.table.free_row(r.row)
    return r.finished


def generate(models: Models, prompts: Sequence[Sequence[int]], *, spec=None, max_new_tokens,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
             seed: int = 0, eos_token_id: int | None = None, logprobs: int = 0,
             page_size: int = 1, platform=None, trace: bool = False) -> GenerationOutput:
    """Decode `prompts` with the optimized decoder.

    spec=None: cached target-only decoding (greedy when temperature == 0, else seeded sampling
    with the uniform stream of docs/semantics.md); page_size sets its KV page size.
    spec=SpecConfig(...): speculative decoding (the page size is spec.page_size); the output
    carries per-request accept lengths. platform: the profile whose policies apply (default:
    SPECVERIFY_PLATFORM or the native one). logprobs=N > 0 records, per emitted token, its
    logprob, rank and the N best alternatives. trace=True (speculative only) records every
    cycle's tree, accepted nodes and emitted tokens in `output.trace` (docs/semantics.md 6.5).
    """
    if not isinstance(trace, bool):
        raise TypeError(f"trace must be a bool, got {type(trace).__name__} {trace!r}")
    if trace and spec is None:
        raise ValueError("trace=True records speculative cycles; it needs spec=SpecConfig(...)")
    cfg = check_generate_args(models, spec=spec, seed=seed, logprobs=logprobs, eos_token_id=eos_token_id,
                              page_size=page_size, platform=platform)
    budgets = check_prompts(prompts, max_new_tokens, cfg.vocab_size, cfg.max_context)
    params = SamplingParams(temperature, top_k, top_p, min_p)
    # numpy integers pass the checks; compute with Python ints (no fixed-width overflow).
    seed, logprobs = int(seed), int(logprobs)
    eos_token_id = None if eos_token_id is None else int(eos_token_id)
    if spec is not None:
        from specverify.engine.speculative import generate_speculative
        return generate_speculative(models, prompts, budgets, spec, params, seed=seed, eos_token_id=eos_token_id,
                                    num_logprobs=logprobs, platform=platform, trace=trace)
    reqs = new_requests(prompts, budgets, seed)
    channel = LogprobChannel(len(reqs), logprobs, max_rows=1) if logprobs else None
    generate_target_only(models, reqs, params, eos_token_id=eos_token_id, channel=channel, page_size=page_size)
    return GenerationOutput([r.output for r in reqs], logprobs_out(channel))


MAX_SEED = 2**32 - 1    # 32-bit seeds: seed * 1_000_003 + r stays inside torch's generator range


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
    if platform is not None and dtypes.dtype_info(cfg.logits_dtype).is_fp8 and not profile.supports_fp8(cfg.logits_dtype):
        raise ValueError(f"logits dtype {cfg.logits_dtype!r} of these models is not an FP8 format of platform "
                         f"profile {profile.name!r} (it serves {profile.fp8_formats})")
    return cfg


def logprobs_out(channel: LogprobChannel | None) -> list[list[TokenLogprob]] | None:
    """What the output processor assembled from the message stream (None without logprobs)."""
    return None if channel is None else [res.logprobs for res in channel.close()]
