"""Draft-tree construction (docs/semantics.md section 6.2): a Triton kernel and a torch fallback.

`build_tree` turns the kept candidates of an EAGLE draft (their flat indices, tokens and the beams
chosen at every step) into the tree the verify step walks: tokens, parents, positions, the
ancestor mask and the linked form (first child / next sibling). Both implementations compute the
same integers; the tests hold them against each other and against trees written out by hand.

Conventions of this module (the contract leaves them implicit):

* Node j >= 1 holds kept candidate j - 1. Because a parent beam comes from an earlier step, its
  flat index, and so its node index, is smaller than its child's: parents precede children.
* A node's ancestor set is itself, its chain of parents up to -1, and the root. Its depth is the
  number of non-root nodes in that set: the usual depth for a node connected to the root, 1 for
  an orphan (which sees only the root and itself), one more than its parent's for a node whose
  parent is an orphan (a case only hand-built inputs reach: with well-ordered scores a kept
  child's parent beam always scores at least as high and comes first).
* `first_child` / `next_sibling` are exactly the parents array in linked form; an orphan is
  nobody's child and nobody's sibling.
"""

from __future__ import annotations

import functools

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from specverify.kernels.launch import check_launchable, check_tensor, pick_impl
from specverify.platform import capturing



@dataclass
class DraftTree:
    tokens: torch.Tensor        # [bs, D] int64, node 0 = the root (last verified token)
    parents: torch.Tensor       # [bs, D] int64, -1 for the root and orphans
    positions: torch.Tensor     # [bs, D] int64, L + depth
    mask: torch.Tensor          # [bs, D, D] bool, mask[b, j, a]: node j sees node a
    first_child: torch.Tensor   # [bs, D] int64, -1 = none
    next_sibling: torch.Tensor  # [bs, D] int64, -1 = none
    flat_index: torch.Tensor    # [bs, D] int64, b * D + j

    @property
    def bs(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_draft_tokens(self) -> int:
        return self.tokens.shape[1]

    @property
    def device(self) -> torch.device:
        return self.tokens.device


def _block(n: int) -> int:
    return max(triton.next_power_of_2(n), 2)


def _num_warps(block_d: int) -> int:
    return 4 if block_d <= 32 else 8 if block_d <= 64 else 16


# --------------------------------------------------------------------------------------------
# Triton kernel: one program per request, every node of the request in one vector


@triton.jit
def _build_tree_kernel(
    root_ptr, kept_flat_ptr, kept_tokens_ptr, beam_flat_ptr, seq_lens_ptr,
    tokens_ptr, parents_ptr, positions_ptr, mask_ptr, first_child_ptr, next_sibling_ptr, flat_index_ptr,
    num_draft, topk, num_steps,
    stride_root0, stride_kf0, stride_kf1, stride_kt0, stride_kt1,
    stride_bf0, stride_bf1, stride_bf2, stride_sl0,
    stride_tok0, stride_tok1, stride_par0, stride_par1, stride_pos0, stride_pos1,
    stride_mask0, stride_mask1, stride_mask2, stride_fc0, stride_fc1, stride_ns0, stride_ns1,
    stride_fi0, stride_fi1,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    node = tl.arange(0, BLOCK_D)                       # this program's nodes (rows)
    valid = node < num_draft
    drafted = valid & (node >= 1)                      # node j >= 1 holds kept entry j - 1

    flat = tl.load(kept_flat_ptr + b * stride_kf0 + (node - 1) * stride_kf1, mask=drafted, other=-1)
    tok = tl.load(kept_tokens_ptr + b * stride_kt0 + (node - 1) * stride_kt1, mask=drafted, other=0)
    root = tl.load(root_ptr + b * stride_root0)
    tok = tl.where(node == 0, root, tok)
    seq_len = tl.load(seq_lens_ptr + b * stride_sl0)

    # Parent beam of a candidate of step i >= 1: beam p of step i - 1, p = ((f - k) % k^2) // k.
    # (Validation keeps f below the candidate count; inside a graph capture it cannot, so an f past
    # the count reads nothing and leaves an orphan rather than reading past beam_flat.)
    first = drafted & (flat >= 0) & (flat < topk)
    later = drafted & (flat >= topk) & (flat < topk + (num_steps - 1) * topk * topk)
    rel = tl.where(later, flat - topk, 0)
    step = 1 + rel // (topk * topk)
    beam = (rel % (topk * topk)) // topk
    parent_flat = tl.load(beam_flat_ptr + b * stride_bf0 + (step - 1) * stride_bf1 + beam * stride_bf2,
                          mask=later, other=-1)

    # Its node: the kept entry with that flat index (only the D - 1 real entries are scanned).
    hit = (parent_flat[:, None] == flat[None, :]) & later[:, None] & drafted[None, :]
    found = tl.min(tl.where(hit, node[None, :], BLOCK_D), axis=1)
    parent = tl.where(later, tl.where(found < BLOCK_D, found, -1), tl.where(first, 0, -1))

    # Ancestor sets: self and root, then S hops up the parent chain (a chain has at most S nodes).
    sees = (node[None, :] == node[:, None]) | ((node[None, :] == 0) & valid[:, None])
    # (A while loop, not range(num_steps): see "Loop bounds" in launch.py.)
    anc = parent
    hop = 0
    while hop < num_steps:
        sees = sees | (node[None, :] == anc[:, None])
        up = tl.sum(tl.where(anc[:, None] == node[None, :], parent[None, :] + 1, 0), axis=1)
        anc = up - 1                                   # -1 when anc was -1 (no column matched)
        hop += 1
    depth = tl.sum(tl.where(sees & (node[None, :] >= 1), 1, 0), axis=1)

    # Linked form, children in ascending node order.
    is_child = parent[None, :] == node[:, None]
    first_child = tl.min(tl.where(is_child, node[None, :], BLOCK_D), axis=1)
    first_child = tl.where(first_child < BLOCK_D, first_child, -1)
    sibling = (parent[None, :] == parent[:, None]) & (parent[:, None] >= 0) & (node[None, :] > node[:, None])
    next_sibling = tl.min(tl.where(sibling, node[None, :], BLOCK_D), axis=1)
    next_sibling = tl.where(next_sibling < BLOCK_D, next_sibling, -1)

    tl.store(tokens_ptr + b * stride_tok0 + node * stride_tok1, tok.to(tl.int64), mask=valid)
    tl.store(parents_ptr + b * stride_par0 + node * stride_par1, parent.to(tl.int64), mask=valid)
    tl.store(positions_ptr + b * stride_pos0 + node * stride_pos1, (seq_len + depth).to(tl.int64), mask=valid)
    tl.store(first_child_ptr + b * stride_fc0 + node * stride_fc1, first_child.to(tl.int64), mask=valid)
    tl.store(next_sibling_ptr + b * stride_ns0 + node * stride_ns1, next_sibling.to(tl.int64), mask=valid)
    tl.store(flat_index_ptr + b * stride_fi0 + node * stride_fi1, (b * num_draft + node).to(tl.int64),
             mask=valid)
    tl.store(mask_ptr + b * stride_mask0 + node[:, None] * stride_mask1 + node[None, :] * stride_mask2,
             sees, mask=valid[:, None] & valid[None, :])


def _build_tree_triton(root_tokens, kept_flat, kept_tokens, beam_flat, seq_lens, topk, num_steps) -> DraftTree:
    bs, d = kept_flat.shape[0], kept_flat.shape[1] + 1
    device = kept_flat.device
    check_launchable(_build_tree_kernel, device)
    tree = _empty_tree(bs, d, device)
    if bs == 0:
        return tree
    block_d = _block(d)
    # beam_flat has no step columns when S == 1; nothing is read from it then.
    bf = beam_flat if beam_flat.numel() else torch.full((bs, 1, topk), -1, dtype=torch.int64, device=device)
    _build_tree_kernel[(bs,)](
        root_tokens, kept_flat, kept_tokens, bf, seq_lens,
        tree.tokens, tree.parents, tree.positions, tree.mask, tree.first_child, tree.next_sibling,
        tree.flat_index,
        d, topk, num_steps,
        root_tokens.stride(0), kept_flat.stride(0), kept_flat.stride(1),
        kept_tokens.stride(0), kept_tokens.stride(1),
        bf.stride(0), bf.stride(1), bf.stride(2), seq_lens.stride(0),
        tree.tokens.stride(0), tree.tokens.stride(1), tree.parents.stride(0), tree.parents.stride(1),
        tree.positions.stride(0), tree.positions.stride(1),
        tree.mask.stride(0), tree.mask.stride(1), tree.mask.stride(2),
        tree.first_child.stride(0), tree.first_child.stride(1),
        tree.next_sibling.stride(0), tree.next_sibling.stride(1),
        tree.flat_index.stride(0), tree.flat_index.stride(1),
        BLOCK_D=block_d, num_warps=_num_warps(block_d),
    )
    return tree


def _empty_tree(bs: int, d: int, device: torch.device) -> DraftTree:
    def i64():
        return torch.empty((bs, d), dtype=torch.int64, device=device)
    return DraftTree(tokens=i64(), parents=i64(), positions=i64(),
                     mask=torch.empty((bs, d, d), dtype=torch.bool, device=device),
                     first_child=i64(), next_sibling=i64(), flat_index=i64())


# --------------------------------------------------------------------------------------------
# torch fallback: vectorized over the batch, loops over depth only


def _build_tree_torch(root_tokens, kept_flat, kept_tokens, beam_flat, seq_lens, topk, num_steps) -> DraftTree:
    bs, d = kept_flat.shape[0], kept_flat.shape[1] + 1
    device = kept_flat.device
    node = torch.arange(d, device=device)                                      # [D]
    k2 = topk * topk

    first = (kept_flat >= 0) & (kept_flat < topk)                               # [bs, D-1] step 0
    later = (kept_flat >= topk) & (kept_flat < num_candidates(topk, num_steps))   # steps >= 1 (see the kernel)
    rel = torch.where(later, kept_flat - topk, torch.zeros_like(kept_flat))
    step = 1 + torch.div(rel, k2, rounding_mode="floor")
    beam = torch.div(rel % k2, topk, rounding_mode="floor")
    col = torch.where(later, (step - 1) * topk + beam, torch.zeros_like(rel))
    if beam_flat.numel():
        parent_flat = beam_flat.reshape(bs, (num_steps - 1) * topk).gather(1, col)
    else:                                                                      # S == 1: no step >= 1 candidates
        parent_flat = torch.full_like(kept_flat, -1)
    hit = (parent_flat[:, :, None] == kept_flat[:, None, :]) & later[:, :, None]   # [bs, D-1, D-1]
    found = torch.where(hit, node[None, None, 1:], d).amin(-1) if d > 1 else torch.empty_like(kept_flat)
    drafted_parent = torch.where(later, torch.where(found < d, found, -1), torch.where(first, 0, -1))
    parents = torch.cat([torch.full((bs, 1), -1, dtype=torch.int64, device=device), drafted_parent], dim=1)

    sees = (node[:, None] == node[None, :]) | (node[None, :] == 0)                # [D, D] self + root
    sees = sees.expand(bs, d, d).clone()
    anc = parents
    for _ in range(num_steps):
        sees |= node[None, None, :] == anc[:, :, None]
        anc = torch.where(anc >= 0, parents.gather(1, anc.clamp(min=0)), anc)
    depth = (sees[:, :, 1:]).sum(-1)

    is_child = parents[:, None, :] == node[None, :, None]                      # [bs, node, child]
    first_child = torch.where(is_child, node, d).amin(-1)
    first_child = torch.where(first_child < d, first_child, -1)
    sibling = ((parents[:, None, :] == parents[:, :, None]) & (parents[:, :, None] >= 0)
               & (node[None, None, :] > node[None, :, None]))
    next_sibling = torch.where(sibling, node, d).amin(-1)
    next_sibling = torch.where(next_sibling < d, next_sibling, -1)

    return DraftTree(
        tokens=torch.cat([root_tokens[:, None], kept_tokens], dim=1),
        parents=parents,
        positions=seq_lens[:, None] + depth,
        mask=sees,
        first_child=first_child,
        next_sibling=next_sibling,
        flat_index=torch.arange(bs, device=device)[:, None] * d + node[None, :],
    )


# --------------------------------------------------------------------------------------------
# Public wrappers


def num_candidates(topk: int, num_steps: int) -> int:
    """Entries of the score list per request: k + (S - 1) k^2."""
    return topk + (num_steps - 1) * topk * topk


def _validate_build(root_tokens, kept_flat, kept_tokens, beam_flat, seq_lens, topk, num_steps, checked=True):
    if not isinstance(topk, int) or topk < 1:
        raise ValueError(f"topk must be an int >= 1, got {topk!r}")
    if not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be an int >= 1, got {num_steps!r}")
    if not isinstance(kept_flat, torch.Tensor) or kept_flat.dim() != 2:
        raise ValueError(f"kept_flat must be a 2-D tensor [bs, D-1], got "
                         f"{list(kept_flat.shape) if isinstance(kept_flat, torch.Tensor) else type(kept_flat).__name__}")
    bs, d = kept_flat.shape[0], kept_flat.shape[1] + 1
    device = kept_flat.device
    check_tensor("kept_flat", kept_flat, (bs, d - 1), torch.int64, device)
    check_tensor("root_tokens", root_tokens, (bs,), torch.int64, device)
    check_tensor("kept_tokens", kept_tokens, (bs, d - 1), torch.int64, device)
    check_tensor("beam_flat", beam_flat, (bs, max(num_steps - 1, 0), topk), torch.int64, device)
    check_tensor("seq_lens", seq_lens, (bs,), torch.int64, device)
    count = num_candidates(topk, num_steps)
    if d - 1 > count:
        raise ValueError(f"kept_flat has {d - 1} entries per request (D - 1), more than the "
                         f"{count} candidates of topk={topk}, num_steps={num_steps}")
    if topk == 1 and d != num_steps + 1:
        raise ValueError(f"topk == 1 is a chain: D must be num_steps + 1 = {num_steps + 1}, got D = {d} "
                         f"(kept_flat has {d - 1} columns)")
    if not checked or capturing(device) or bs == 0:
        return
    # Value checks read the tensors back (one sync for all), so never inside a graph capture.
    checks = [
        ((kept_flat < 0) | (kept_flat >= count),
         f"kept_flat values must lie in [0, {count}) (the candidate count k + (S-1)k^2)"),
        (kept_flat[:, 1:] <= kept_flat[:, :-1],
         "kept_flat must be strictly ascending in every row (kept candidates sorted by flat index)"),
        (seq_lens < 0, "seq_lens must be >= 0"),
    ]
    if num_steps > 1:
        step = torch.arange(num_steps - 1, device=device)
        lo = torch.where(step == 0, 0, topk + (step - 1) * topk * topk)
        hi = torch.where(step == 0, topk, topk + step * topk * topk)
        checks += [
            (beam_flat[:, 0] != torch.arange(topk, device=device),
             f"beam_flat[:, 0] must be 0..{topk - 1}: step 0's beams are its candidates in order"),
            ((beam_flat < lo[None, :, None]) | (beam_flat >= hi[None, :, None]),
             "beam_flat[:, i] must hold flat indices of step i's candidates (step i >= 1: k + (i-1)k^2 .. k + i*k^2 - 1)"),
        ]
    _raise_first(checks)


def _raise_first(checks: list[tuple[torch.Tensor, str]]) -> None:
    """Raise ValueError(message) for the first check whose tensor has a True entry (one host sync)."""
    flags = torch.stack([bad.any() for bad, _ in checks]).tolist()
    for flag, (_, message) in zip(flags, checks):
        if flag:
            raise ValueError(message)


def build_tree(root_tokens: torch.Tensor, kept_flat: torch.Tensor, kept_tokens: torch.Tensor,
               beam_flat: torch.Tensor, seq_lens: torch.Tensor, *, topk: int, num_steps: int,
               impl: str = "auto", checked: bool = True) -> DraftTree:
    """The draft tree of section 6.2 from the kept candidates.

    root_tokens: [bs] int64, the last verified token of each request (node 0).
    kept_flat:   [bs, D-1] int64, flat indices of the kept candidates, ascending.
    kept_tokens: [bs, D-1] int64, their tokens.
    beam_flat:   [bs, max(S-1, 0), k] int64, flat index of beam p of step i (i = 0..S-2).
    seq_lens:    [bs] int64, L, tokens already in the cache (the root sits at position L).
    impl: "triton" | "torch" | "auto" (Triton on CUDA tensors, torch on the CPU).
    checked: also check the values (one device read); the decode cycle passes False unless its
    debug checks are on. Shapes and dtypes are always checked.
    """
    _validate_build(root_tokens, kept_flat, kept_tokens, beam_flat, seq_lens, topk, num_steps, checked)
    args = (root_tokens, kept_flat, kept_tokens, beam_flat, seq_lens, topk, num_steps)
    if pick_impl(impl, kept_flat.device) == "triton":
        return _build_tree_triton(*args)
    return _build_tree_torch(*args)


def chain_tree(root_tokens: torch.Tensor, draft_tokens: torch.Tensor, seq_lens: torch.Tensor) -> DraftTree:
    """The topk == 1 tree: a chain root -> draft 0 -> ... -> draft S-1 (D = S + 1).

    root_tokens: [bs] int64; draft_tokens: [bs, S] int64; seq_lens: [bs] int64. parents, mask,
    first_child and next_sibling are the same for every request: expanded views of one row, to read.
    """
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.dim() != 2:
        raise ValueError("draft_tokens must be a 2-D tensor [bs, S]")
    bs, s = draft_tokens.shape
    device = draft_tokens.device
    check_tensor("draft_tokens", draft_tokens, (bs, s), torch.int64, device)
    check_tensor("root_tokens", root_tokens, (bs,), torch.int64, device)
    check_tensor("seq_lens", seq_lens, (bs,), torch.int64, device)
    node = kept_chain_rows(s + 1, device)[0]
    return chain_tree_of(torch.cat([root_tokens[:, None], draft_tokens], dim=1), seq_lens[:, None] + node[None, :])


def chain_tree_of(tokens: torch.Tensor, positions: torch.Tensor) -> DraftTree:
    """The chain tree of tokens [bs, D] (the root, then the drafts) at positions [bs, D], e.g. the
    rows `ops.chain_verify_rows` reads from the request state."""
    bs, d = tokens.shape
    _, parents, mask, first_child, next_sibling = kept_chain_rows(d, tokens.device)
    # The fields every request shares are one row expanded (read-only views: no copy per request),
    # made once per (D, device): a captured cycle replays no kernel for them.
    return DraftTree(
        tokens=tokens,
        parents=parents.expand(bs, d),
        positions=positions,
        mask=mask.expand(bs, d, d),
        first_child=first_child.expand(bs, d),
        next_sibling=next_sibling.expand(bs, d),
        flat_index=_flat_index(bs, d, tokens.device),
    )


def chain_rows(d: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """The rows every request of a chain of d nodes (or d new tokens) shares: (node ids 0..d-1,
    parents -1..d-2, causal mask [d, d], first child, next sibling), made fresh."""
    node = torch.arange(d, device=device)
    after = node + 1
    return (node, node - 1, node[None, :] <= node[:, None], torch.where(after < d, after, -1),
            torch.full((d,), -1, dtype=torch.int64, device=device))


# The shared rows a captured step reads are made once per shape and device and handed out as
# expanded read-only views: the step replays no kernel for them. They are never evicted: a CUDA
# graph reads them by address and holds no reference, so a freed row would be read as whatever
# reuses its memory. The keys are few: a spec's D, a step's chain lengths, the batch sizes its
# lanes come in (a prefill's long chain is made fresh, `models.layers.chain_mask`).
kept_chain_rows = functools.lru_cache(maxsize=None)(chain_rows)


@functools.lru_cache(maxsize=None)
def _flat_index(bs: int, d: int, device: torch.device) -> torch.Tensor:
    return torch.arange(bs * d, device=device).view(bs, d)
