"""Target-only generation (docs/semantics.md, section 5), one request at a time.

Every step recomputes the cache-free forward over the whole sequence so far and converts the
last row to the logits dtype. There is no speculation here: `spec` is accepted for signature
compatibility with the optimized decoder and ignored, because a lossless speculative decoder must
emit what target-only decoding emits.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from reference.logits import convert_logits, greedy_token
from reference.model import forward_logits
from reference.sampling import (
    apply_penalties,
    check_penalties,
    counter_uniform,
    first_max_index,
    penalties_active,
    sample_token,
)


@dataclass(frozen=True)
class TokenLogprob:
    """Logprob record of one emitted token (raw distribution: no temperature, no filters)."""

    token: int
    logprob: float  # log_softmax(dequantized float64 logits)[token]
    rank: int  # 1 + number of tokens whose logprob is strictly greater
    top: list  # the top-N (token, logprob) pairs, logprob descending then token ascending


@dataclass(frozen=True)
class ReferenceOutput:
    tokens: list  # list[list[int]]: the emitted tokens of each request (EOS included)
    logprobs: list | None  # list[list[TokenLogprob]] per request, or None when logprobs == 0


def log_softmax(z: list[float]) -> list[float]:
    m = max(z)
    log_total = math.log(sum(math.exp(x - m) for x in z))
    return [x - m - log_total for x in z]


def logprob_record(z, token: int, n: int) -> TokenLogprob:
    """The TokenLogprob of `token` over the dequantized float64 logits row z, with top-n pairs."""
    lp = log_softmax([float(x) for x in z])
    rank = 1 + sum(1 for x in lp if x > lp[token])
    order = sorted(range(len(lp)), key=lambda i: (-lp[i], i))
    top = [(i, lp[i]) for i in order[:n]]
    return TokenLogprob(token=token, logprob=lp[token], rank=rank, top=top)


# docs/semantics.md section 4: a positive temperature below this could overflow z / T in float64.
MIN_TEMPERATURE = 1e-200


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _validate(config, prompts, max_new_tokens, temperature, top_k, top_p, min_p, seed, eos_token_id, logprobs):
    """Check the arguments; return the per-request max_new_tokens list."""
    V = config.vocab_size
    if not isinstance(prompts, (list, tuple)):
        raise ValueError(f"prompts: expected a list of token-id lists, got {type(prompts).__name__}")
    for r, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompts[{r}]: empty prompt; each prompt needs at least 1 token")
        for x in prompt:
            if not _is_int(x) or not 0 <= x < V:
                raise ValueError(f"prompts[{r}]: token id {x!r} outside [0, {V})")
    if _is_int(max_new_tokens):
        per_request = [max_new_tokens] * len(prompts)
    elif isinstance(max_new_tokens, (list, tuple)):
        if len(max_new_tokens) != len(prompts):
            raise ValueError(
                f"max_new_tokens: list length {len(max_new_tokens)} != number of prompts {len(prompts)}"
            )
        per_request = list(max_new_tokens)
    else:
        raise ValueError(f"max_new_tokens: expected an int or a list of ints, got {type(max_new_tokens).__name__}")
    for r, m in enumerate(per_request):
        if not _is_int(m) or m < 1:
            raise ValueError(f"max_new_tokens: request {r} asks for {m!r}; must be an int >= 1")
        if len(prompts[r]) + m > config.max_context:
            raise ValueError(
                f"max_new_tokens: request {r} has prompt length {len(prompts[r])} + max_new_tokens {m}"
                f" > max_context {config.max_context}"
            )
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise ValueError(f"temperature: must be a real number, got {temperature!r}")
    if not (temperature == 0 or MIN_TEMPERATURE <= temperature < math.inf):
        raise ValueError(
            f"temperature: must be >= 0, and either 0 (greedy) or a finite number >= {MIN_TEMPERATURE!r};"
            f" got {temperature!r}"
        )
    if not _is_int(top_k) or top_k < 0:
        raise ValueError(f"top_k: must be an int >= 0, got {top_k!r}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p: must be in (0, 1], got {top_p!r}")
    if not 0 <= min_p < 1:
        raise ValueError(f"min_p: must be in [0, 1), got {min_p!r}")
    if not _is_int(seed):
        raise ValueError(f"seed: must be an int, got {seed!r}")
    if eos_token_id is not None and (not _is_int(eos_token_id) or not 0 <= eos_token_id < V):
        raise ValueError(f"eos_token_id: must be None or a token id in [0, {V}), got {eos_token_id!r}")
    if not _is_int(logprobs) or not 0 <= logprobs <= V:
        raise ValueError(f"logprobs: must be an int in [0, vocab_size={V}], got {logprobs!r}")
    return per_request


def generate(
    models,
    prompts,
    *,
    max_new_tokens,
    temperature=0.0,
    top_k=0,
    top_p=1.0,
    min_p=0.0,
    seed=0,
    eos_token_id=None,
    logprobs=0,
    spec=None,
    repetition_penalty=1.0,
    frequency_penalty=0.0,
    presence_penalty=0.0,
) -> ReferenceOutput:
    """Target-only decoding of every prompt with the float64 master weights.

    models: needs `models.config` and `models.target_weights` (float64 master tensors).
    prompts: list of non-empty token-id lists; max_new_tokens: int or one int per request (>= 1).
    temperature == 0 is greedy (first maximal index of the float32-upcast logits); otherwise the
    token is sampled per section 4; output token t of request r uses the uniform
    counter_uniform(seed, r, P_r - 1 + t, 0), P_r the prompt length (seed in [0, 2**32)).
    A request stops after emitting eos_token_id (EOS is part of its output).
    logprobs = N > 0: one TokenLogprob per emitted token: the token's log-softmax of the
    dequantized float64 logits (raw: temperature and filters are not applied), its rank
    (1 + count of tokens with strictly greater logprob) and the top-N (token, logprob) pairs
    ordered by logprob descending, then token index ascending.
    spec: ignored; the reference is always target-only.
    repetition_penalty (in [1e-18, 1e18], 1 = off), frequency_penalty, presence_penalty (in [-2, 2],
    0 = off): section 7. With any of them on, each row's dequantized logits are penalized by the
    prompt and the tokens emitted so far, then greedy takes the first maximal index of the
    penalized float64 values and sampling filters them; logprobs stay those of the raw row.
    Raises ValueError naming the argument and its bound for invalid input.
    """
    del spec  # the reference never speculates
    config = models.config
    weights = models.target_weights
    per_request = _validate(config, prompts, max_new_tokens, temperature, top_k, top_p, min_p, seed, eos_token_id, logprobs)
    penalties = check_penalties(repetition_penalty, frequency_penalty, presence_penalty)
    penalized = penalties_active(*penalties)

    all_tokens = []
    all_logprobs = []
    for r, prompt in enumerate(prompts):
        sequence = [int(x) for x in prompt]
        emitted = []
        records = []
        for t in range(per_request[r]):
            row = forward_logits(config, weights, sequence)[-1]  # [V] float64
            converted = convert_logits(config, row)
            z = converted.dequant
            if penalized:
                z = apply_penalties(z, prompt, emitted, *penalties)    # the output so far: `emitted`
            if temperature == 0:
                token = first_max_index(z) if penalized else greedy_token(converted.upcast)
            else:
                u = counter_uniform(seed, r, len(sequence) - 1, 0)   # len(sequence) - 1 = P_r - 1 + t
                token = sample_token(z, u, temperature, top_k, top_p, min_p)
            emitted.append(token)
            if logprobs > 0:
                records.append(logprob_record(converted.dequant, token, logprobs))
            sequence.append(token)
            if eos_token_id is not None and token == eos_token_id:
                break
        all_tokens.append(emitted)
        all_logprobs.append(records)
    return ReferenceOutput(tokens=all_tokens, logprobs=all_logprobs if logprobs > 0 else None)
