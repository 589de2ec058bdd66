"""Cache-free forward of the tiny target model (docs/semantics.md, section 1), in float64.

Every call recomputes everything from the token list: there is no KV cache and no recurrent
state carried between calls. Attention runs one query position and one head at a time; the
recurrent mixer runs one token and one head at a time. Shapes are noted beside each value.
"""

from __future__ import annotations

import math

import torch

F64 = torch.float64


def _w(weights: dict, name: str) -> torch.Tensor:
    """The master weight `name`, as a float64 CPU tensor (a copy-free view when it already is)."""
    if name not in weights:
        raise KeyError(f"weights: missing tensor {name!r}")
    return weights[name].to(device="cpu", dtype=F64)


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x**2) + eps) * w, the mean taken over the last dim."""
    # x: [T, H], w: [H]
    mean_sq = (x * x).mean(dim=-1, keepdim=True)  # [T, 1]
    return x / torch.sqrt(mean_sq + eps) * w


def silu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


def rope(x: torch.Tensor, positions: list, theta: float) -> torch.Tensor:
    """Rotate-half RoPE of head vectors x [T, hd]; row t is rotated by the angle of positions[t]."""
    T, hd = x.shape
    half = hd // 2
    j = torch.arange(half, dtype=F64)
    inv_freq = theta ** (-2.0 * j / hd)  # [hd/2]
    angle = torch.tensor(positions, dtype=F64)[:, None] * inv_freq[None, :]  # [T, hd/2]
    c, s = torch.cos(angle), torch.sin(angle)
    x1, x2 = x[:, :half], x[:, half:]  # the pairs (x[j], x[j + hd/2])
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=1)  # [T, hd]


def attention_mixer(config, weights: dict, i: int, n: torch.Tensor, positions: list) -> torch.Tensor:
    """Causal multi-head attention with grouped KV heads over the whole sequence n [T, H]."""
    T = n.shape[0]
    nh, nkv, hd = config.num_heads, config.num_kv_heads, config.head_dim
    if nh % nkv != 0:
        raise ValueError(f"config: num_heads {nh} is not a multiple of num_kv_heads {nkv}")
    group = nh // nkv
    q = n @ _w(weights, f"layers.{i}.wq")  # [T, nh*hd]
    k = n @ _w(weights, f"layers.{i}.wk")  # [T, nkv*hd]
    v = n @ _w(weights, f"layers.{i}.wv")  # [T, nkv*hd]
    heads = []
    for g in range(nh):
        kvh = g // group
        q_g = rope(q[:, g * hd:(g + 1) * hd], positions, config.rope_theta)  # [T, hd]
        k_g = rope(k[:, kvh * hd:(kvh + 1) * hd], positions, config.rope_theta)  # [T, hd]
        v_g = v[:, kvh * hd:(kvh + 1) * hd]  # [T, hd]
        out_g = []
        for t in range(T):
            # query t sees keys 0..t (sequence order)
            scores = (k_g[: t + 1] @ q_g[t]) / math.sqrt(hd)  # [t+1]
            probs = torch.softmax(scores, dim=0)  # [t+1]
            out_g.append(probs @ v_g[: t + 1])  # [hd]
        heads.append(torch.stack(out_g))  # [T, hd]
    concat = torch.cat(heads, dim=1)  # [T, nh*hd]
    return concat @ _w(weights, f"layers.{i}.wo")  # [T, H]


def recurrent_mixer(config, weights: dict, i: int, n: torch.Tensor) -> torch.Tensor:
    """Causal conv over the q|k|v projections, then S_t = a_t S_{t-1} + outer(k_t/sqrt(dk), v_t), y_t = q_t S_t."""
    return _recurrence(config, weights, i, n)[0]


def _conv_window(u: torch.Tensor, t: int, width: int) -> torch.Tensor:
    """The last `width` inputs up to row t of u [T, C], oldest first, zero rows before row 0."""
    rows = []
    for s in range(t - width + 1, t + 1):
        rows.append(u[s] if s >= 0 else torch.zeros(u.shape[1], dtype=F64))
    return torch.stack(rows)  # [width, C]


def _recurrence(config, weights: dict, i: int, n: torch.Tensor):
    """recurrent_mixer's output [T, H], the recurrent state after the last token [nr, dk, dv] and
    the conv window after it [W-1, C]."""
    T = n.shape[0]
    nr, dk, dv, W = config.num_rec_heads, config.rec_key_dim, config.rec_value_dim, config.rec_conv_width
    u = torch.cat([n @ _w(weights, f"layers.{i}.wq"), n @ _w(weights, f"layers.{i}.wk"),
                   n @ _w(weights, f"layers.{i}.wv")], dim=1)  # [T, C]: q | k | v
    conv = _w(weights, f"layers.{i}.conv")  # [W, C], oldest tap first
    c = torch.stack([silu((_conv_window(u, t, W) * conv).sum(dim=0)) for t in range(T)])  # [T, C]
    q, k, v = c[:, :nr * dk], c[:, nr * dk:2 * nr * dk], c[:, 2 * nr * dk:]
    a = torch.sigmoid(n @ _w(weights, f"layers.{i}.wa") + _w(weights, f"layers.{i}.ba"))  # [T, nr]
    heads, states = [], []
    for r in range(nr):
        S = torch.zeros(dk, dv, dtype=F64)
        out_r = []
        for t in range(T):
            q_t = q[t, r * dk:(r + 1) * dk]
            k_t = k[t, r * dk:(r + 1) * dk]
            v_t = v[t, r * dv:(r + 1) * dv]
            S = a[t, r] * S + torch.outer(k_t / math.sqrt(dk), v_t)
            out_r.append(q_t @ S)  # [dv]
        heads.append(torch.stack(out_r))  # [T, dv]
        states.append(S)
    concat = torch.cat(heads, dim=1)  # [T, nr*dv]
    window = _conv_window(u, T - 1, W)[1:]  # [W-1, C]: the inputs the next token's conv still sees
    return concat @ _w(weights, f"layers.{i}.wo"), torch.stack(states), window


def recurrent_states(config, weights: dict, tokens) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every recurrent layer's state after the last of `tokens`, in layer order: (recurrent state
    [nr, dk, dv], conv window [W-1, C]) float64, the recurrence re-run over exactly these tokens
    (what a decoder's state cache must hold once they are committed)."""
    tokens = [int(x) for x in tokens]
    if not tokens:
        raise ValueError("tokens: need at least 1 token")
    eps, out = config.norm_eps, []
    h = _w(weights, "embed")[tokens]
    positions = list(range(len(tokens)))
    for i, kind in enumerate(config.layer_kinds):
        n = rmsnorm(h, _w(weights, f"layers.{i}.attn_norm"), eps)
        if kind == "recurrent":
            mixed, state, window = _recurrence(config, weights, i, n)
            out.append((state, window))
            h = h + mixed
        else:
            h = h + attention_mixer(config, weights, i, n, positions)
        n = rmsnorm(h, _w(weights, f"layers.{i}.mlp_norm"), eps)
        h = h + (silu(n @ _w(weights, f"layers.{i}.w_gate")) * (n @ _w(weights, f"layers.{i}.w_up"))) @ \
            _w(weights, f"layers.{i}.w_down")
    return out


def forward(config, weights: dict, tokens, positions=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the model over `tokens` (T ids); return (logits [T, V], hidden [T, H]), both float64.

    `positions` (T ints, default 0..T-1) only feed RoPE; the causal mask follows sequence order.
    `hidden` is the residual stream after the last layer, before the final norm.
    """
    tokens = [int(x) for x in tokens]
    T = len(tokens)
    if T == 0:
        raise ValueError("tokens: need at least 1 token")
    V = config.vocab_size
    for x in tokens:
        if not 0 <= x < V:
            raise ValueError(f"tokens: token id {x} outside [0, {V})")
    if positions is None:
        positions = list(range(T))
    positions = [int(p) for p in positions]
    if len(positions) != T:
        raise ValueError(f"positions: length {len(positions)} != number of tokens {T}")
    if len(config.layer_kinds) != config.num_layers:
        raise ValueError(f"config.layer_kinds: length {len(config.layer_kinds)} != num_layers {config.num_layers}")

    eps = config.norm_eps
    h = _w(weights, "embed")[tokens]  # [T, H]
    for i, kind in enumerate(config.layer_kinds):
        n = rmsnorm(h, _w(weights, f"layers.{i}.attn_norm"), eps)
        if kind == "attention":
            h = h + attention_mixer(config, weights, i, n, positions)
        elif kind == "recurrent":
            h = h + recurrent_mixer(config, weights, i, n)
        else:
            raise ValueError(f"config.layer_kinds[{i}]: {kind!r} is neither 'attention' nor 'recurrent'")
        n = rmsnorm(h, _w(weights, f"layers.{i}.mlp_norm"), eps)
        gate = silu(n @ _w(weights, f"layers.{i}.w_gate"))  # [T, I]
        up = n @ _w(weights, f"layers.{i}.w_up")  # [T, I]
        h = h + (gate * up) @ _w(weights, f"layers.{i}.w_down")
    hidden = h  # [T, H]
    logits = rmsnorm(h, _w(weights, "final_norm"), eps) @ _w(weights, "lm_head")  # [T, V]
    return logits, hidden


def forward_logits(config, weights: dict, tokens, positions=None) -> torch.Tensor:
    """float64 logits [T, V] of `forward`."""
    return forward(config, weights, tokens, positions)[0]


def tree_node_logits(config, weights: dict, prefix_tokens, node_tokens, parents) -> torch.Tensor:
    """float64 logits [N, V] for each node of a token tree, one cache-free forward per node.

    Node 0 is the root (parents[0] == -1); every other node i has a parent parents[i] in [0, N).
    Node i's row is the last row of the forward over prefix_tokens + the tokens on the path
    root .. i, so a node at depth d sits at position len(prefix_tokens) + d and sees the prefix,
    its ancestors and itself. The prefix may be empty.
    """
    prefix_tokens = [int(x) for x in prefix_tokens]
    node_tokens = [int(x) for x in node_tokens]
    parents = [int(p) for p in parents]
    N = len(node_tokens)
    if N == 0:
        raise ValueError("node_tokens: need at least the root node")
    if len(parents) != N:
        raise ValueError(f"parents: length {len(parents)} != number of nodes {N}")
    if parents[0] != -1:
        raise ValueError(f"parents[0]: the root's parent must be -1, got {parents[0]}")
    for i in range(1, N):
        if not 0 <= parents[i] < N or parents[i] == i:
            raise ValueError(f"parents[{i}]: {parents[i]} is not another node index in [0, {N})")
    rows = []
    for i in range(N):
        path = []
        node = i
        while node != -1:
            if len(path) > N:
                raise ValueError(f"parents: node {i} does not reach the root (cycle)")
            path.append(node_tokens[node])
            node = parents[node]
        path.reverse()  # root first
        logits = forward_logits(config, weights, prefix_tokens + path)
        rows.append(logits[-1])
    return torch.stack(rows)  # [N, V]
