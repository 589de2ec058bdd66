"""Sampling penalties on the device: repetition, frequency, presence (docs/semantics.md section 7).

What a decoder keeps: per slot-table row, how often each token occurs in the request's output so
far (`counts`, the emitted tokens, the pending one included) and which tokens its prompt holds
(`prompt`). Both live in `PenaltyState`, allocated only when a penalty is active. Every function
here is a tensor function without host reads, Python loops over requests or list-built tensors,
so the decode cycles call them inside their captured graphs:

- `PenaltyState.start`   (prefill) the prompt's tokens, counts zeroed;
- `PenaltyState.record`  (every step) a scatter-add of the tokens a lane emitted;
- `tree_counts`          a verify tree's per-node output counts: the pre-cycle counts plus the draft
                         tokens on the path from the root to the node, read off the ancestor mask
                         (any [bs, D] tree: EAGLE's, or a 2-node chain root + one draft);
- `penalize`             the penalties on float64 dequantized logits, before temperature and the
                         filters.

The draft model gets no penalties: a proposal the penalized target disfavours is just accepted less.
"""

from __future__ import annotations

import dataclasses

import torch


def active(params) -> bool:
    """Does any penalty of these sampling parameters change a logit?"""
    return params.repetition_penalty != 1.0 or params.frequency_penalty != 0.0 or params.presence_penalty != 0.0


@dataclasses.dataclass
class PenaltyState:
    counts: torch.Tensor    # [R, V] int32 occurrences of each token in the output so far (pending token included)
    prompt: torch.Tensor    # [R, V] bool  the token occurs in the prompt (once is enough)

    @classmethod
    def empty(cls, rows: int, vocab: int, device) -> "PenaltyState":
        return cls(torch.zeros((rows, vocab), dtype=torch.int32, device=device),
                   torch.zeros((rows, vocab), dtype=torch.bool, device=device))

    def start(self, rows: torch.Tensor, ids: torch.Tensor, lens: torch.Tensor) -> None:
        """A prefill: rows [bs] int64 take the prompts ids [bs, width] (lens [bs] valid, the rest
        padding); their output counts start at zero."""
        bs, width = ids.shape
        vocab = self.prompt.shape[1]
        valid = torch.arange(width, device=ids.device)[None, :] < lens[:, None]
        seen = torch.zeros((bs, vocab + 1), dtype=torch.bool, device=ids.device)   # column V: padding's sink
        seen.scatter_(1, torch.where(valid, ids, vocab), True)
        self.prompt[rows] = seen[:, :vocab]
        self.counts[rows] = 0

    def record(self, rows: torch.Tensor, tokens: torch.Tensor, taken: torch.Tensor) -> None:
        """Add the tokens a step emitted: lane b appended tokens[b, :taken[b]] (rows [bs] int64,
        tokens [bs, W] int64 ids, taken [bs] int64 in [0, W]). A scatter-add into the flat counts,
        so lanes sharing a row (the pad row of padded lanes, which take nothing) stay exact."""
        vocab = self.counts.shape[1]
        w = tokens.shape[1]
        take = torch.arange(w, device=tokens.device)[None, :] < taken[:, None]
        flat = rows[:, None] * vocab + tokens.clamp(0, vocab - 1)
        self.counts.view(-1).scatter_add_(0, flat.reshape(-1), take.reshape(-1).to(torch.int32))

    def context(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(counts [bs, V] int32, prompt [bs, V] bool) of the lanes' rows (copies)."""
        return self.counts[rows], self.prompt[rows]


def tree_counts(counts: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Output counts of the context of every tree node's logits.

    counts [bs, V] int32: the output so far before the cycle (the root, node 0, is the pending token
    and already counted); tokens [bs, D] int64 the tree's tokens; mask [bs, D, D] bool, mask[b, j, a]
    = node a is node j or one of its ancestors. Node j's context adds the draft tokens of the nodes
    a >= 1 that mask[b, j, a] marks. Returns [bs, D, V] int32."""
    bs, d = tokens.shape
    vocab = counts.shape[1]
    drafts = tokens[:, None, 1:].expand(bs, d, d - 1).clamp(0, vocab - 1)      # [bs, D, D-1]
    path = torch.zeros((bs, d, vocab), dtype=torch.int32, device=tokens.device)
    path.scatter_add_(2, drafts, mask[:, :, 1:].to(torch.int32))
    return counts[:, None, :] + path


def penalize(z: torch.Tensor, counts: torch.Tensor, prompt: torch.Tensor, params) -> torch.Tensor:
    """The penalties of section 7 on float64 dequantized logits.

    z [..., V] float64; counts [..., V] int (output occurrences); prompt [..., V] bool; both
    broadcastable to z. params: the SamplingParams (repetition_penalty r, frequency_penalty f,
    presence_penalty p). For every token seen in the prompt or the output: z -> z / r if z > 0
    else z * r; then for every token with count c > 0: z -> (z - f * c) - p."""
    r, f, p = params.repetition_penalty, params.frequency_penalty, params.presence_penalty
    c = counts.to(torch.float64)
    out = c > 0
    if r != 1.0:
        z = torch.where(prompt | out, torch.where(z > 0, z / r, z * r), z)
    return torch.where(out, (z - f * c) - p, z)
