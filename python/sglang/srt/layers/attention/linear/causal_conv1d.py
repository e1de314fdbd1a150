"""The depthwise causal conv1d with a carried window (Gated DeltaNet's and Mamba-2's short convolution).

y[t, c] = act(bias[c] + sum_{k < K} weight[c, k] * x[t - (K - 1) + k, c]), where inputs before the request's first
new token come from its conv state: the K - 1 most recent inputs (pre-activation), channel-major [C, K - 1], oldest
column first (linear_design.md's layout). A request with has_initial_state False sees zeros there. The new state is
the last K - 1 inputs of (old state ++ new tokens), so a request with fewer than K - 1 new tokens keeps the newest
old columns shifted left: a prompt cut anywhere, even inside the window, equals the whole prompt.

Math in fp32; y in x's dtype, the new state in conv_state's dtype. On a CUDA / ROCm device the Triton kernels
(triton_ops/causal_conv1d.py) run, elsewhere the torch forms below.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

_ACTIVATIONS = (None, "silu")


def _check_activation(activation: Optional[str]) -> None:
    if activation not in _ACTIVATIONS:
        raise ValueError(f"causal_conv1d activation must be one of {_ACTIVATIONS}, got {activation!r}")


def _uses_triton(x: torch.Tensor) -> bool:
    return x.device.type == "cuda"  # torch names ROCm devices "cuda" too


def causal_conv1d_extend(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                         conv_state: torch.Tensor, has_initial_state: torch.Tensor, extend_lens: List[int],
                         activation: Optional[str] = "silu") -> Tuple[torch.Tensor, torch.Tensor]:
    """x [N, C] (request b's extend_lens[b] tokens contiguous), weight [C, K], bias [C] | None, conv_state
    [B, C, K - 1], has_initial_state [B] bool -> (y [N, C] in x.dtype, new_state [B, C, K - 1])."""
    _check_activation(activation)
    if _uses_triton(x):
        from sglang.srt.layers.attention.triton_ops.causal_conv1d import causal_conv1d_extend_triton
        return causal_conv1d_extend_triton(x, weight, bias, conv_state, has_initial_state, extend_lens, activation)
    return causal_conv1d_extend_torch(x, weight, bias, conv_state, has_initial_state, extend_lens, activation)


def causal_conv1d_decode(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                         conv_state: torch.Tensor, activation: Optional[str] = "silu"
                         ) -> Tuple[torch.Tensor, torch.Tensor]:
    """One new token per request: x [B, C], conv_state [B, C, K - 1] -> (y [B, C], new_state [B, C, K - 1])."""
    _check_activation(activation)
    if _uses_triton(x):
        from sglang.srt.layers.attention.triton_ops.causal_conv1d import causal_conv1d_decode_triton
        return causal_conv1d_decode_triton(x, weight, bias, conv_state, activation)
    return causal_conv1d_decode_torch(x, weight, bias, conv_state, activation)


def _activate(y: torch.Tensor, activation: Optional[str]) -> torch.Tensor:
    return F.silu(y) if activation == "silu" else y


def causal_conv1d_extend_torch(x, weight, bias, conv_state, has_initial_state, extend_lens, activation="silu"):
    n_tokens, channels = x.shape
    batch = len(extend_lens)
    width = weight.shape[1] - 1  # the K - 1 carried columns
    assert conv_state.shape == (batch, channels, width), (conv_state.shape, batch, channels, width)
    assert sum(extend_lens) == n_tokens, (extend_lens, n_tokens)
    device = x.device
    lens = torch.tensor(extend_lens, dtype=torch.long, device=device)
    # One time-major sequence: request b's K - 1 state columns, then its tokens. A window ending at one of b's tokens
    # reaches back at most K - 1 rows, so it never crosses into request b - 1.
    seg_start = torch.cumsum(lens + width, 0) - (lens + width)
    tok_req = torch.repeat_interleave(torch.arange(batch, device=device), lens)
    tok_start = torch.cumsum(lens, 0) - lens
    tok_pos = seg_start[tok_req] + width + (torch.arange(n_tokens, device=device) - tok_start[tok_req])
    state_pos = (seg_start[:, None] + torch.arange(width, device=device)).reshape(-1)

    seq = torch.empty(n_tokens + batch * width, channels, dtype=torch.float32, device=device)
    # where, not a product: a stale row may hold anything (inf * 0 is nan)
    has = has_initial_state.to(device=device, dtype=torch.bool).view(batch, 1, 1)
    prior = torch.where(has, conv_state.float().transpose(1, 2), 0.0)
    seq[state_pos] = prior.reshape(batch * width, channels)
    seq[tok_pos] = x.float()

    w = weight.float()
    window_first = tok_pos - width  # the row of tap 0 of each token's window
    y = seq[window_first] * w[:, 0]
    for k in range(1, width + 1):
        y.addcmul_(seq[window_first + k], w[:, k])
    if bias is not None:
        y += bias.float()
    y = _activate(y, activation).to(x.dtype)

    last_pos = (seg_start + lens)[:, None] + torch.arange(width, device=device)  # the segment's last K - 1 rows
    new_state = seq[last_pos].transpose(1, 2).to(conv_state.dtype)
    return y, new_state


def causal_conv1d_decode_torch(x, weight, bias, conv_state, activation="silu"):
    w = weight.float()
    window = torch.cat([conv_state.float(), x.float().unsqueeze(-1)], dim=-1)  # [B, C, K]
    y = (window * w).sum(-1)
    if bias is not None:
        y += bias.float()
    y = _activate(y, activation).to(x.dtype)
    return y, window[:, :, 1:].to(conv_state.dtype)
