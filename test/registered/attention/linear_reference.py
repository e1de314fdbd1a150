"""fp64 references for the linear-attention kernels: plain per-token loops of the defining recurrences, written from
the definitions (not from the kernels' chunked algebra). Not a test file; test_gated_delta_rule.py,
test_causal_conv1d.py and linear_triton_cases.py import it."""

import math

import torch


def conv_reference(x, weight, bias, conv_state, has_initial_state, extend_lens, activation):
    """y[t] = act(bias + sum_k weight[:, k] * input[t - (K - 1) + k]); inputs before the first new token come from
    the request's state (zeros without one). Returns (y [N, C], new_state [B, C, K - 1]) in float64."""
    width = weight.shape[1] - 1
    w = weight.double()
    ys, states, start = [], [], 0
    for b, n in enumerate(extend_lens):
        history = [conv_state[b, :, j].double() if bool(has_initial_state[b]) else
                   torch.zeros(x.shape[1], dtype=torch.float64) for j in range(width)]
        for t in range(n):
            history.append(x[start + t].double())
            acc = torch.zeros(x.shape[1], dtype=torch.float64)
            for tap in range(width + 1):
                acc = acc + w[:, tap] * history[len(history) - 1 - width + tap]
            if bias is not None:
                acc = acc + bias.double()
            if activation == "silu":
                acc = acc / (1 + torch.exp(-acc))
            ys.append(acc)
        states.append(torch.stack(history[len(history) - width:], dim=-1))
        start += n
    y = torch.stack(ys) if ys else torch.zeros(0, x.shape[1], dtype=torch.float64)
    return y, torch.stack(states)


def gdr_reference(q, k, v, g, beta, initial_state, has_initial_state, extend_lens, scale, use_qk_l2norm):
    """Per request, token and value head h (query / key head h // (H / Hk)):
    S <- exp(g) S; S <- S + k (beta (v - S^T k))^T; o = S^T (scale q). Returns (o [N, H, dv], states) in float64."""
    n_heads, dk, dv = v.shape[1], q.shape[2], v.shape[2]
    group = n_heads // q.shape[1]
    outs, finals, start = [], [], 0
    for b, n in enumerate(extend_lens):
        per_head = []
        for h in range(n_heads):
            s = initial_state[b, h].double().clone() if bool(has_initial_state[b]) else \
                torch.zeros(dk, dv, dtype=torch.float64)
            per_head.append(s)
        for t in range(start, start + n):
            o_t = torch.zeros(n_heads, dv, dtype=torch.float64)
            for h in range(n_heads):
                qv, kv = q[t, h // group].double(), k[t, h // group].double()
                if use_qk_l2norm:
                    qv = qv / math.sqrt(float((qv * qv).sum()) + 1e-6)
                    kv = kv / math.sqrt(float((kv * kv).sum()) + 1e-6)
                s = per_head[h] * math.exp(float(g[t, h]))
                err = v[t, h].double() - s.T @ kv
                s = s + torch.outer(kv, float(beta[t, h]) * err)
                per_head[h] = s
                o_t[h] = s.T @ (scale * qv)
            outs.append(o_t)
        finals.append(torch.stack(per_head))
        start += n
    o = torch.stack(outs) if outs else torch.zeros(0, n_heads, dv, dtype=torch.float64)
    return o, torch.stack(finals)


def gdr_inputs(extend_lens, n_heads, n_qk_heads, dk, dv, seed, dtype=torch.float32):
    """Random q, k, v, g (log decay in [-1.5, 0]), beta in (0, 1), and per-request initial states."""
    gen = torch.Generator().manual_seed(seed)
    n = sum(extend_lens)
    q = torch.randn(n, n_qk_heads, dk, generator=gen).to(dtype)
    k = torch.randn(n, n_qk_heads, dk, generator=gen).to(dtype)
    v = torch.randn(n, n_heads, dv, generator=gen).to(dtype)
    g = (-1.5 * torch.rand(n, n_heads, generator=gen)).to(dtype)
    beta = torch.rand(n, n_heads, generator=gen).to(dtype)
    state = 0.5 * torch.randn(len(extend_lens), n_heads, dk, dv, generator=gen)
    return q, k, v, g, beta, state


def conv_inputs(extend_lens, channels, kernel, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(extend_lens), channels, generator=gen).to(dtype)
    weight = torch.randn(channels, kernel, generator=gen).to(dtype)
    bias = torch.randn(channels, generator=gen).to(dtype)
    state = torch.randn(len(extend_lens), channels, kernel - 1, generator=gen).to(dtype)
    return x, weight, bias, state
