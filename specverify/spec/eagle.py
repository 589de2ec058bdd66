"""The EAGLE draft-tree search (docs/semantics.md 6.2), as plain functions over tensors.

`start_search` takes step 0's top-k, `expand_search` folds in each later step's top-k of every
beam, `finish_search` keeps the D-1 best candidates. The outputs feed `kernels.tree.build_tree`.
No host syncs: the whole search can run inside a captured CUDA graph.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from specverify.kernels.draft_search import expand_beams_impl, keep_candidates_impl


@dataclasses.dataclass
class TreeSearch:
    topk: int
    num_steps: int
    scores: torch.Tensor          # [bs, k] float32 path score of each beam
    tokens: torch.Tensor          # [bs, k] int64 token of each beam
    flat: torch.Tensor            # [bs, k] int64 flat candidate index of each beam
    ancestors: torch.Tensor       # [bs, k, (S-1)*k] bool: draft-region entries on each beam's path
    cand_scores: list             # per step: [bs, k] (step 0) or [bs, k*k] candidate scores
    cand_tokens: list             # per step: matching candidate tokens
    beam_flats: list              # per step 0..S-2: [bs, k] flat index of the beams chosen there


def _own_entry(beams: torch.Tensor, offset: int, region: int) -> torch.Tensor:
    """[k, region] bool: beam p's own draft-region entry offset + p (pure tensor ops, so no
    host-to-device copy happens inside a graph capture)."""
    return torch.arange(region, device=beams.device)[None, :] == (offset + beams)[:, None]


# Step 0's beam ids and own-entry rows are the same for every request and every cycle: made once per
# (k, region, device) and handed out as expanded read-only views, so a captured draft phase replays
# no kernel for them. Never evicted (a CUDA graph reads them by address); the keys are a spec's few.
@functools.lru_cache(maxsize=None)
def _step0_rows(k: int, region: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    beams = torch.arange(k, device=device)
    return beams, _own_entry(beams, 0, region)


def start_search(p0: torch.Tensor, index0: torch.Tensor, num_steps: int) -> TreeSearch:
    """Step 0: p0 / index0 [bs, k] are the top-k of the draft-extend's last row."""
    bs, k = p0.shape
    beams, own = _step0_rows(k, max(num_steps - 1, 1) * k, p0.device)
    anc = own.expand(bs, k, own.shape[1])                            # beam p of step 0 is entry p
    flat = beams.expand(bs, k)
    return TreeSearch(k, num_steps, p0, index0, flat, anc, [p0], [index0], [flat])


def expand_search(search: TreeSearch, step: int, p: torch.Tensor, index: torch.Tensor,
                  hidden: torch.Tensor | None = None, impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor | None]:
    """Step `step` >= 1: p / index [bs, k, k] are the top-k of each beam's draft row, hidden
    [bs, k, H] (optional) each beam's draft hidden state.

    Chooses the k best children as the new beams (`kernels.draft_search`: one kernel on a GPU);
    returns each new beam's parent beam [bs, k] and, when `hidden` is given, the parents' hidden
    states [bs, k, H] (what the next draft step reads).
    """
    bs, k = search.scores.shape
    feats = hidden if hidden is not None else search.scores.new_zeros((bs, k, 0))
    out = expand_beams_impl(search.scores, p, index, search.ancestors, feats, step, impl)
    search.cand_scores.append(out.cand_scores)
    search.cand_tokens.append(index.reshape(bs, k * k))
    search.scores, search.tokens, search.flat = out.scores, out.tokens, out.flat
    if step < search.num_steps - 1:
        search.ancestors = out.ancestors
        search.beam_flats.append(out.flat)
    return out.parent, (out.hidden if hidden is not None else None)


def finish_search(search: TreeSearch, num_draft_tokens: int, impl: str = "auto"):
    """Keep the D-1 best candidates, sorted by flat index (`ops.keep_candidates`: one kernel on a
    GPU).

    Returns kept_flat [bs, D-1], kept_tokens [bs, D-1], beam_flat [bs, S-1, k].
    """
    tokens = torch.cat(search.cand_tokens, dim=1)
    bs, k = search.tokens.shape
    if k == 1:
        # The chain shortcut: one candidate per step and D - 1 == S keeps every one of them.
        kept_flat = torch.arange(tokens.shape[1], device=tokens.device).expand(bs, -1)
        return kept_flat, tokens, torch.zeros((bs, max(search.num_steps - 1, 0), 1), dtype=torch.int64,
                                              device=tokens.device) + kept_flat[:, :-1, None]
    kept_flat, kept_tokens = keep_candidates_impl(torch.cat(search.cand_scores, dim=1), tokens, num_draft_tokens - 1,
                                                  impl)
    if search.num_steps > 1:
        beam_flat = torch.stack(search.beam_flats[:search.num_steps - 1], dim=1)
    else:
        beam_flat = torch.zeros((bs, 0, k), dtype=torch.int64, device=tokens.device)
    return kept_flat, kept_tokens, beam_flat
