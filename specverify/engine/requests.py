"""Requests and what a decode returns: the host-side records every decoder shares.

A `Request` is the host's view of one prompt: its budget, the slot-table row it owns while it
runs, the tokens it emitted so far. The device holds the same facts in the decoders' persistent
state; the host copy is updated from the one readback per step.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from specverify.protocol.output import TokenLogprob
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


@dataclasses.dataclass(eq=False)     # a request is itself: compared (and removed from lists) by identity
class Request:
    index: int                  # position in the prompt list (keys its uniforms)
    prompt: list[int]
    max_new_tokens: int
    row: int = -1               # slot-table row while running
    cached: int = 0             # tokens whose K/V are in the cache
    output: list[int] = dataclasses.field(default_factory=list)
    finished: bool = False      # ended: stopped by EOS / max_new_tokens, or aborted
    aborted: bool = False
    accept_lengths: list[int] = dataclasses.field(default_factory=list)   # speculative only

    @property
    def last_token(self) -> int:
        return self.output[-1]


def prompt_label(i: int) -> str:
    return f"prompts[{i}]"


def budget_label(i: int) -> str:
    return f"max_new_tokens[{i}]"


def check_prompts(prompts: Sequence[Sequence[int]], max_new_tokens, vocab_size: int,
                  max_context: int, label=prompt_label, budget=budget_label) -> list[int]:
    """Validate prompts and per-request budgets; return max_new_tokens as a list.

    TypeError for a wrong type (a flat list of ids, a float / bool / str token id or budget),
    ValueError for a value out of its bound; both name the argument and the bound (label(i) and
    budget(i) name prompt i and its budget: `Engine.add_request` calls them "prompt" and
    "max_new_tokens")."""
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be a list of token-id lists, got {type(prompts).__name__}")
    if len(prompts) == 0:
        raise ValueError("prompts must be a non-empty list of token-id lists, got an empty list")
    for i, p in enumerate(prompts):
        if not isinstance(p, (list, tuple)):
            hint = " (a flat list of ids? wrap one prompt as [[1, 2, 3]])" if is_int(p) and label is prompt_label else ""
            raise TypeError(f"{label(i)} must be a list of token ids, got {type(p).__name__} {p!r}{hint}")
        if len(p) == 0:
            raise ValueError(f"{label(i)} is empty; every prompt needs at least one token")
        for j, t in enumerate(p):
            if not is_int(t):
                raise TypeError(f"{label(i)}[{j}] must be an int token id, got {type(t).__name__} {t!r}")
            if not 0 <= t < vocab_size:
                raise ValueError(f"{label(i)} has token id {t} outside [0, {vocab_size})")
    if isinstance(max_new_tokens, (list, tuple)):
        budgets = list(max_new_tokens)
        if len(budgets) != len(prompts):
            raise ValueError(f"max_new_tokens has {len(budgets)} entries for {len(prompts)} prompts")
    elif is_int(max_new_tokens):
        budgets = [max_new_tokens] * len(prompts)
    else:
        raise TypeError(f"max_new_tokens must be an int or a list of ints (one per prompt), "
                        f"got {type(max_new_tokens).__name__} {max_new_tokens!r}")
    for i, (p, n) in enumerate(zip(prompts, budgets)):
        n = check_int(budget(i), n, 1)
        if len(p) + n > max_context:
            raise ValueError(f"{label(i)}: prompt length {len(p)} + max_new_tokens {n} exceeds "
                             f"max_context {max_context}")
    return [int(n) for n in budgets]


def new_requests(prompts, budgets: list[int]) -> list[Request]:
    return [Request(i, [int(t) for t in p], n) for i, (p, n) in enumerate(zip(prompts, budgets))]


def pages_needed(lengths: list[int], page_size: int) -> int:
    """Pool size for requests that grow to `lengths` cache entries (page 0 is reserved)."""
    return 1 + sum(-(-n // page_size) for n in lengths)
