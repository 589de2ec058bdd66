"""Tree verification (docs/semantics.md sections 6.3 and 6.4).

Each verify has a Triton kernel (one program per request walking the linked tree) and a torch
fallback vectorized over the batch, which reads the parents array instead: children in sibling
order are the children in ascending node order. Greedy torch takes one step per depth. Stochastic
torch is one pass over the nodes in ascending order: a node's children all come after it
(build_tree guarantees parent < child), so a single pass sees every child of the current node
after the walk reaches it, in sibling order. Stochastic verify is float64 throughout.

All three outputs are node indices / counts / token ids in int64:
    accept_nodes [bs, S+1]  node indices of the accepted path, root (0) first, padded with -1
    num_correct  [bs]       n, the accepted draft nodes
    bonus        [bs]       the token emitted after them
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specverify import dtypes
from specverify.kernels.argmax import row_argmax
from specverify.kernels.launch import check_launchable, check_tensor, pick_impl
from specverify.kernels.tree import DraftTree, _block, _raise_first
from specverify.platform import capturing


def target_predict(logits: torch.Tensor) -> torch.Tensor:
    """Greedy token of every node: first maximal index of the float32 upcast.

    logits: [bs, D, V] any registry dtype (FP8: the fp8 values, before the positive scale) -> [bs, D] int64.
    """
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
        raise ValueError(f"logits must be a 3-D tensor [bs, D, V], got "
                         f"{list(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__}")
    dtypes.dtype_info(logits.dtype)                     # a registry dtype, else ValueError
    if logits.shape[-1] == 0:
        raise ValueError("logits must have a non-empty vocabulary dimension")
    bs, d, v = logits.shape
    return row_argmax(logits.reshape(bs * d, v))[:, 0].view(bs, d)      # the vocab-split kernel on CUDA


def _validate_tree(tree: DraftTree, num_steps: int) -> None:
    if not isinstance(tree, DraftTree):
        raise ValueError(f"tree must be a DraftTree, got {type(tree).__name__}")
    if not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be an int >= 1, got {num_steps!r}")
    if not isinstance(tree.tokens, torch.Tensor) or tree.tokens.dim() != 2:
        raise ValueError("tree.tokens must be a 2-D tensor [bs, D]")
    bs, d = tree.tokens.shape
    device = tree.tokens.device
    for name in ("tokens", "parents", "first_child", "next_sibling"):
        check_tensor(f"tree.{name}", getattr(tree, name), (bs, d), torch.int64, device)
    if d < 1:
        raise ValueError("tree must hold at least the root (D >= 1)")


def _empty_outputs(bs: int, num_steps: int, device: torch.device):
    return (torch.empty((bs, num_steps + 1), dtype=torch.int64, device=device),
            torch.empty((bs,), dtype=torch.int64, device=device),
            torch.empty((bs,), dtype=torch.int64, device=device))


# --------------------------------------------------------------------------------------------
# Greedy verify


@triton.jit
def _verify_greedy_kernel(
    tokens_ptr, first_child_ptr, next_sibling_ptr, predict_ptr,
    accept_ptr, num_correct_ptr, bonus_ptr,
    num_draft, num_steps,
    stride_tok0, stride_tok1, stride_fc0, stride_fc1, stride_ns0, stride_ns1, stride_tp0, stride_tp1,
    stride_acc0, stride_acc1, stride_nc0, stride_bon0,
    BLOCK_W: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    w = tl.arange(0, BLOCK_W)
    accepted = tl.where(w == 0, 0, -1).to(tl.int64)    # the path so far, root first

    target = tl.load(predict_ptr + b * stride_tp0)      # target_predict at the current node
    child = tl.load(first_child_ptr + b * stride_fc0)   # the child being tried
    cur = child * 0                                     # the current node (int64 0: the root)
    n = 0
    hops = 0                                            # every hop raises the node index: < D hops
    while (child >= 0) & (child < num_draft) & (n < num_steps) & (hops < num_draft):
        in_row = (child >= 0) & (child < num_draft)
        tok = tl.load(tokens_ptr + b * stride_tok0 + child * stride_tok1, mask=in_row, other=-1)
        down = tl.load(first_child_ptr + b * stride_fc0 + child * stride_fc1, mask=in_row, other=-1)
        side = tl.load(next_sibling_ptr + b * stride_ns0 + child * stride_ns1, mask=in_row, other=-1)
        hit = tok == target
        n = n + hit.to(tl.int32)
        cur = tl.where(hit, child, cur)
        accepted = tl.where(w == n, cur, accepted)       # slot n holds cur already unless it moved
        target = tl.load(predict_ptr + b * stride_tp0 + cur * stride_tp1)
        child = tl.where(hit, down, side)
        hops = hops + 1

    tl.store(accept_ptr + b * stride_acc0 + w * stride_acc1, accepted, mask=w < num_steps + 1)
    tl.store(num_correct_ptr + b * stride_nc0, n.to(tl.int64))
    tl.store(bonus_ptr + b * stride_bon0, target)


def _verify_greedy_triton(tree: DraftTree, predict: torch.Tensor, num_steps: int):
    bs, d = tree.tokens.shape
    device = tree.tokens.device
    check_launchable(_verify_greedy_kernel, device)
    accept, num_correct, bonus = _empty_outputs(bs, num_steps, device)
    if bs == 0:
        return accept, num_correct, bonus
    _verify_greedy_kernel[(bs,)](
        tree.tokens, tree.first_child, tree.next_sibling, predict,
        accept, num_correct, bonus,
        d, num_steps,
        tree.tokens.stride(0), tree.tokens.stride(1), tree.first_child.stride(0), tree.first_child.stride(1),
        tree.next_sibling.stride(0), tree.next_sibling.stride(1), predict.stride(0), predict.stride(1),
        accept.stride(0), accept.stride(1), num_correct.stride(0), bonus.stride(0),
        BLOCK_W=_block(num_steps + 1), num_warps=1,
    )
    return accept, num_correct, bonus


def _verify_greedy_torch(tree: DraftTree, predict: torch.Tensor, num_steps: int):
    bs, d = tree.tokens.shape
    device = tree.tokens.device
    node = torch.arange(d, device=device)
    parents = tree.parents
    # Node m matches when its token is the target's prediction at its parent.
    matches = (parents >= 0) & (tree.tokens == predict.gather(1, parents.clamp(min=0)))
    cur = torch.zeros(bs, dtype=torch.int64, device=device)
    alive = torch.ones(bs, dtype=torch.bool, device=device)
    columns = [cur]
    for _ in range(num_steps):
        hit = (parents == cur[:, None]) & matches & alive[:, None]
        nxt = torch.where(hit, node, d).amin(-1)
        alive = alive & (nxt < d)
        columns.append(torch.where(alive, nxt, -1))
        cur = torch.where(alive, nxt, cur)
    accept = torch.stack(columns, dim=1)
    num_correct = (accept[:, 1:] >= 0).sum(-1)
    bonus = predict.gather(1, cur[:, None])[:, 0]
    return accept, num_correct, bonus


def verify_greedy(tree: DraftTree, target_predict: torch.Tensor, *, num_steps: int,
                  impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Section 6.3: accept the first child (sibling order) whose token is the target's prediction.

    tree: DraftTree with D nodes; target_predict: [bs, D] int64 greedy token of every node.
    Returns (accept_nodes [bs, S+1] int64 padded with -1, num_correct [bs] int64, bonus [bs] int64).
    """
    _validate_tree(tree, num_steps)
    check_tensor("target_predict", target_predict, tuple(tree.tokens.shape), torch.int64, tree.device)
    if pick_impl(impl, tree.device) == "triton":
        return _verify_greedy_triton(tree, target_predict, num_steps)
    return _verify_greedy_torch(tree, target_predict, num_steps)


# --------------------------------------------------------------------------------------------
# Stochastic verify (target-only tree sampling), float64
#
# The walk (which children are accepted) is a sequence of float64 additions and comparisons per
# request: the Triton kernel and the torch loop do the same additions in the same order, so they
# agree exactly. The bonus draw from the residual is torch in both cases.


@triton.jit
def _stochastic_walk_kernel(
    tokens_ptr, first_child_ptr, next_sibling_ptr, probs_ptr, coins_ptr,
    accept_ptr, num_correct_ptr,
    num_draft, vocab, num_steps,
    stride_tok0, stride_tok1, stride_fc0, stride_fc1, stride_ns0, stride_ns1,
    stride_p0, stride_p1, stride_p2, stride_c0, stride_c1,
    stride_acc0, stride_acc1, stride_nc0,
    BLOCK_W: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    w = tl.arange(0, BLOCK_W)
    accepted = tl.where(w == 0, 0, -1).to(tl.int64)

    u = tl.load(coins_ptr + b * stride_c0)               # the uniform of the current node
    acc = tl.zeros((), dtype=tl.float64)                 # target mass of the children visited so far
    child = tl.load(first_child_ptr + b * stride_fc0)
    cur = child * 0
    n = 0
    hops = 0
    while (child >= 0) & (child < num_draft) & (n < num_steps) & (hops < num_draft):
        in_row = (child >= 0) & (child < num_draft)
        tok = tl.load(tokens_ptr + b * stride_tok0 + child * stride_tok1, mask=in_row, other=0)
        tok = tl.minimum(tl.maximum(tok, 0), vocab - 1)
        p = tl.load(probs_ptr + b * stride_p0 + cur * stride_p1 + tok * stride_p2, mask=in_row, other=0.0)
        down = tl.load(first_child_ptr + b * stride_fc0 + child * stride_fc1, mask=in_row, other=-1)
        side = tl.load(next_sibling_ptr + b * stride_ns0 + child * stride_ns1, mask=in_row, other=-1)
        coin = tl.load(coins_ptr + b * stride_c0 + child * stride_c1, mask=in_row, other=0.0)
        acc = acc + p
        take = u < acc
        n = n + take.to(tl.int32)
        cur = tl.where(take, child, cur)
        accepted = tl.where(w == n, cur, accepted)       # slot n holds cur already unless it moved
        u = tl.where(take, coin, u)
        acc = tl.where(take, 0.0, acc)
        child = tl.where(take, down, side)
        hops = hops + 1

    tl.store(accept_ptr + b * stride_acc0 + w * stride_acc1, accepted, mask=w < num_steps + 1)
    tl.store(num_correct_ptr + b * stride_nc0, n.to(tl.int64))


def _stochastic_walk_triton(tree: DraftTree, probs: torch.Tensor, coins: torch.Tensor, num_steps: int):
    bs, d = tree.tokens.shape
    device = tree.device
    check_launchable(_stochastic_walk_kernel, device)
    accept, num_correct, _ = _empty_outputs(bs, num_steps, device)
    if bs == 0:
        return accept, num_correct
    _stochastic_walk_kernel[(bs,)](
        tree.tokens, tree.first_child, tree.next_sibling, probs, coins,
        accept, num_correct,
        d, probs.shape[2], num_steps,
        tree.tokens.stride(0), tree.tokens.stride(1), tree.first_child.stride(0), tree.first_child.stride(1),
        tree.next_sibling.stride(0), tree.next_sibling.stride(1),
        probs.stride(0), probs.stride(1), probs.stride(2), coins.stride(0), coins.stride(1),
        accept.stride(0), accept.stride(1), num_correct.stride(0),
        BLOCK_W=_block(num_steps + 1), num_warps=1,
    )
    return accept, num_correct


def _stochastic_walk_torch(tree: DraftTree, probs: torch.Tensor, coins: torch.Tensor, num_steps: int):
    bs, d = tree.tokens.shape
    device = tree.device
    rows = torch.arange(bs, device=device)
    w = torch.arange(num_steps + 1, device=device)
    parents = tree.parents
    tokens = tree.tokens.clamp(0, probs.shape[2] - 1)
    # q[b, m]: node m's token under its parent's distribution, the mass it adds when visited.
    q = probs[rows[:, None], parents.clamp(min=0), tokens]
    cur = torch.zeros(bs, dtype=torch.int64, device=device)
    n = torch.zeros(bs, dtype=torch.int64, device=device)
    u = coins[:, 0]
    acc = torch.zeros(bs, dtype=torch.float64, device=device)
    accept = torch.where(w == 0, 0, -1).expand(bs, num_steps + 1)
    for m in range(1, d):                                # ascending node order = sibling order
        visit = (parents[:, m] == cur) & (n < num_steps)
        acc = torch.where(visit, acc + q[:, m], acc)
        take = visit & (u < acc)
        n = n + take
        accept = torch.where(take[:, None] & (w == n[:, None]), m, accept)
        cur = torch.where(take, m, cur)
        u = torch.where(take, coins[:, m], u)
        acc = torch.where(take, 0.0, acc)
    return accept.contiguous(), n


def _residual_bonus(tree: DraftTree, probs: torch.Tensor, accept: torch.Tensor, n: torch.Tensor,
                    final: torch.Tensor, num_steps: int) -> torch.Tensor:
    """The bonus token drawn from the residual at the last accepted node.

    The walk ended there because every child was visited and rejected, or because the depth limit
    stopped it before any child was visited (then nothing is zeroed)."""
    bs, vocab = probs.shape[0], probs.shape[2]
    rows = torch.arange(bs, device=probs.device)
    cur = accept.gather(1, n[:, None])[:, 0]
    rejected = (tree.parents == cur[:, None]) & (n < num_steps)[:, None]
    rejected[:, 0] = False
    residual = torch.zeros((bs, vocab + 1), dtype=torch.float64, device=probs.device)   # column V: a sink
    residual[:, :vocab] = probs[rows, cur]
    residual.scatter_(1, torch.where(rejected, tree.tokens.clamp(0, vocab - 1), vocab), 0.0)
    return inverse_cdf(residual[:, :vocab], final)


def verify_stochastic(tree: DraftTree, target_probs: torch.Tensor, coins: torch.Tensor, final: torch.Tensor, *,
                      num_steps: int, impl: str = "auto", checked: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Section 6.4: sequential acceptance among siblings, bonus from the residual.

    tree: DraftTree with D nodes (parents before children, as build_tree makes them);
    target_probs: [bs, D, V] float64, each node's sampling distribution;
    coins: [bs, D] float64 in [0, 1), coins[b, j] is used at node j; final: [bs] float64 in [0, 1).
    impl: "triton" | "torch" | "auto" for the walk (identical float64 additions either way).
    checked: also check the values (one device read); the decode cycle passes False unless its
    debug checks are on. Shapes and dtypes are always checked.
    Returns (accept_nodes [bs, S+1] int64 padded with -1, num_correct [bs] int64, bonus [bs] int64).
    """
    _validate_tree(tree, num_steps)
    bs, d = tree.tokens.shape
    device = tree.device
    if not isinstance(target_probs, torch.Tensor) or target_probs.dim() != 3:
        raise ValueError("target_probs must be a 3-D tensor [bs, D, V]")
    vocab = target_probs.shape[2]
    check_tensor("target_probs", target_probs, (bs, d, vocab), torch.float64, device)
    check_tensor("coins", coins, (bs, d), torch.float64, device)
    check_tensor("final", final, (bs,), torch.float64, device)
    if vocab < 1:
        raise ValueError("target_probs must have a non-empty vocabulary dimension")
    use = pick_impl(impl, device)
    if checked and not capturing(device) and bs > 0:
        _raise_first([
            ((coins < 0) | (coins >= 1) | coins.isnan(), "coins must lie in [0, 1)"),
            ((final < 0) | (final >= 1) | final.isnan(), "final must lie in [0, 1)"),
            ((tree.tokens[:, 1:] < 0) | (tree.tokens[:, 1:] >= vocab),
             f"tree.tokens of draft nodes must lie in [0, {vocab}) (the vocab of target_probs)"),
        ])
    if use == "triton":
        accept, n = _stochastic_walk_triton(tree, target_probs, coins, num_steps)
    else:
        accept, n = _stochastic_walk_torch(tree, target_probs, coins, num_steps)
    return accept, n, _residual_bonus(tree, target_probs, accept, n, final, num_steps)


def inverse_cdf(residual: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """First index whose cumulative sum exceeds u * sum(residual); else the last index with
    residual > 0; else (an all-zero residual) V - 1. residual: [bs, V] float64; u: [bs] -> [bs].

    sum(residual) is the last value of the same cumulative sum (a left-to-right sum), so the
    threshold never lies above the sum the draw walks."""
    vocab = residual.shape[1]
    idx = torch.arange(vocab, device=residual.device)
    cumulative = torch.cumsum(residual, dim=-1)
    over = cumulative > (u * cumulative[:, -1])[:, None]
    first = torch.where(over, idx, vocab).amin(-1)
    last_positive = torch.where(residual > 0, idx, -1).amax(-1)
    fallback = torch.where(last_positive >= 0, last_positive, vocab - 1)
    return torch.where(first < vocab, first, fallback)


def verify_naive(target_probs: torch.Tensor, draft: torch.Tensor, coin: torch.Tensor, final: torch.Tensor, *,
                 draft_q: torch.Tensor | None = None, draft_p: torch.Tensor | None = None,
                 checked: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The naive-EAGLE accept step (docs/semantics.md 6.7) over the 2-node chain [root, draft].

    target_probs: [bs, 2, V] float64, p_0 (at the root) and p_1 (after the draft token);
    draft: [bs] int64 the draft token d; coin, final: [bs] float64 in [0, 1).
    Exactly one of
      draft_q [bs, V] float64: exact speculative sampling, d was drawn from q: accepted iff
        coin < p_0(d) / q(d) (IEEE division: q(d) = 0 accepts iff p_0(d) > 0); a rejection
        draws from max(p_0 - q, 0);
      draft_p [bs] float64: the original inexact shortcut, q(d) = draft_p: the same coin, and a
        rejection draws from p_0 itself (no residual);
    the bonus after an accepted draft is drawn from p_1. Both draws use `final` (inverse CDF, 6.4).
    checked: also check the values (one device read); shapes and dtypes are always checked.
    Returns (accept_nodes [bs, 2] int64 ([0, 1] or [0, -1]), num_correct [bs] int64, bonus [bs] int64).
    """
    if (draft_q is None) == (draft_p is None):
        raise ValueError("verify_naive: pass exactly one of draft_q (exact sampling) and draft_p (the shortcut)")
    if not isinstance(target_probs, torch.Tensor) or target_probs.dim() != 3 or target_probs.shape[1] != 2:
        raise ValueError("target_probs must be a 3-D tensor [bs, 2, V]")
    bs, _, vocab = target_probs.shape
    device = target_probs.device
    if vocab < 1:
        raise ValueError("target_probs must have a non-empty vocabulary dimension")
    check_tensor("target_probs", target_probs, (bs, 2, vocab), torch.float64, device)
    check_tensor("draft", draft, (bs,), torch.int64, device)
    check_tensor("coin", coin, (bs,), torch.float64, device)
    check_tensor("final", final, (bs,), torch.float64, device)
    if draft_q is not None:
        check_tensor("draft_q", draft_q, (bs, vocab), torch.float64, device)
    else:
        check_tensor("draft_p", draft_p, (bs,), torch.float64, device)
    if checked and not capturing(device) and bs > 0:
        _raise_first([
            ((coin < 0) | (coin >= 1) | coin.isnan(), "coin must lie in [0, 1)"),
            ((final < 0) | (final >= 1) | final.isnan(), "final must lie in [0, 1)"),
            ((draft < 0) | (draft >= vocab), f"draft must lie in [0, {vocab}) (the vocab of target_probs)"),
        ])
    p0, p1 = target_probs[:, 0], target_probs[:, 1]
    d = draft.clamp(0, vocab - 1)[:, None]
    p0d = p0.gather(1, d)[:, 0]
    if draft_q is not None:
        accepted = coin < p0d / draft_q.gather(1, d)[:, 0]
        rejected_draw = inverse_cdf((p0 - draft_q).clamp(min=0.0), final)
    else:
        accepted = coin < p0d / draft_p
        rejected_draw = inverse_cdf(p0, final)
    bonus = torch.where(accepted, inverse_cdf(p1, final), rejected_draw)
    num_correct = accepted.long()
    accept_nodes = torch.stack([torch.zeros_like(num_correct), torch.where(accepted, 1, -1)], 1)
    return accept_nodes, num_correct, bonus
