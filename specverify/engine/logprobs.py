"""Per-token logprob records: the chosen token's logprob and rank, and the top-N alternatives."""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float                   # log-softmax of the raw (temperature-free) dequantized logits
    rank: int                        # 1 + number of tokens with a strictly greater logprob
    top: tuple[tuple[int, float], ...]  # N best (token, logprob): logprob descending, index ascending


def logprob_records(logits: torch.Tensor, scale: torch.Tensor, tokens: torch.Tensor, n: int) -> list[TokenLogprob]:
    """logits: [N, V]; scale: [N, 1]; tokens: [N] chosen ids; n >= 1 alternatives per row."""
    lp = torch.log_softmax(logits.to(torch.float64) * scale.to(torch.float64), dim=-1)
    chosen = lp.gather(-1, tokens[:, None])                              # [N, 1]
    rank = 1 + (lp > chosen).sum(-1)
    order = torch.sort(lp, dim=-1, descending=True, stable=True).indices[:, :n]
    top_lp = lp.gather(-1, order)
    rows = zip(tokens.tolist(), chosen[:, 0].tolist(), rank.tolist(), order.tolist(), top_lp.tolist())
    return [TokenLogprob(t, c, r, tuple(zip(ids, vals))) for t, c, r, ids, vals in rows]
