"""Qwen3-Next's Gated DeltaNet layer (transformers' Qwen3NextGatedDeltaNet semantics), on the linear-state pool.

Per token, with nk key heads of dk, nv = G * nk value heads of dv (G value heads per key head), K the conv kernel:
    in_proj_qkvz  [nk * (2 dk + 2 G dv), H]: grouped per key head j as (q_j, k_j, v_j of G heads, z_j of G heads)
    in_proj_ba    [nk * 2 G, H]: per key head j (b of its G value heads, a of its G value heads)
    conv1d        depthwise [C, K], C = 2 nk dk + nv dv over the channels q (all heads) | k | v, then silu
    decay         g = -exp(A_log) * softplus(a + dt_bias) <= 0, beta = sigmoid(b) (per value head)
    core          the gated delta rule over l2-normed q, k scaled by dk^-0.5 (layers/attention/linear/)
    output        out_proj(norm(o) * silu(z)), the norm an RMSNorm over one value head with weight [dv] (not 1 + w)
Both input projections run as one GEMM (in_proj: the qkvz rows, then the ba rows).

Tensor parallel (rank r of tp, heads split as the planner's arch_qwen3_next docstring says): the rank holds key heads
[r nk/tp, (r+1) nk/tp) and the value heads they serve. Both projections are grouped per key head, so its rows are
one contiguous block of each checkpoint tensor; the conv weight's rows come from three blocks (its q, k and v heads);
dt_bias / A_log are split by value heads; out_proj splits its input columns (one all-reduce); norm is replicated.

State (mem_cache/linear_state_pool.py, rows = fb.req_pool_indices, this layer's ordinal among the linear layers):
    conv_qk    [nk_r, 2 dk (K-1)] read as [2 nk_r dk, K-1]: the q then k channels' last K-1 conv inputs
    conv_v     [nv_r, dv (K-1)] read as [nv_r dv, K-1]
    recurrent  [nv_r, dk dv] read as [nv_r, dk, dv] fp32 (state[k, v], transformers' layout)
A request whose forward starts at position 0 (extend_prefix_lens_cpu == 0) starts from zeros whatever its row holds;
every other forward reads the row the previous one of the request wrote.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.distributed.parallel_state import divide, get_tp_rank, get_tp_size
from sglang.srt.layers.attention.linear.causal_conv1d import causal_conv1d_decode, causal_conv1d_extend
from sglang.srt.layers.attention.linear.gated_delta_rule import (decode_in_pool, gated_delta_rule_decode,
                                                              gated_delta_rule_decode_pool_, gated_delta_rule_extend)
from sglang.srt.layers.linear import MergedColumnParallelLinear, RowParallelLinear, default_weight_loader
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_loader.weight_utils import materialize


# The chunked delta rule's chunk (transformers' / FLA's 64). Every request is padded to whole chunks, so a batch of
# short extends (small prefill chunks, retraction re-prefills) takes the smallest power of two holding its longest
# one: any chunk size gives the same result (the chunked form equals the recurrence), only the padding differs.
MAX_DELTA_RULE_CHUNK_TOKENS = 64


def delta_rule_chunk_tokens(extend_lens) -> int:
    longest = max(extend_lens, default=1)
    return min(MAX_DELTA_RULE_CHUNK_TOKENS, 1 << max(0, longest - 1).bit_length())


class GatedRMSNorm(nn.Module):
    """transformers' Qwen3NextRMSNormGated over rows of one head: w * (x / rms(x)), normalised in fp32 and rounded to
    x's dtype before the weight, then times silu(z) in fp32, rounded once to x's dtype."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)
        self.variance_epsilon = eps
        self.hidden_size = hidden_size

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        # x, z: [M, hidden] -> [M, hidden] in x's dtype
        normed = F.rms_norm(x.float(), (self.hidden_size,), None, self.variance_epsilon).to(x.dtype)
        return (self.weight * normed * F.silu(z.float())).to(x.dtype)


def _sharded_loader(rows_of):
    """A weight_loader copying rows_of(checkpoint tensor), this rank's rows of a head-split tensor."""

    def load(param: nn.Parameter, loaded_weight) -> None:
        default_weight_loader(param, rows_of(loaded_weight))

    return load


class Qwen3NextGatedDeltaNet(nn.Module):
    def __init__(self, config, linear_layer: int):
        super().__init__()
        tp, rank = get_tp_size(), get_tp_rank()
        self.linear_layer = linear_layer
        nk, nv = config.linear_num_key_heads, config.linear_num_value_heads
        self.dk, self.dv, self.kernel = config.linear_key_head_dim, config.linear_value_head_dim, \
            config.linear_conv_kernel_dim
        if nv % nk:
            raise ValueError(f"linear_num_value_heads {nv} is not a multiple of linear_num_key_heads {nk}")
        self.group = nv // nk
        self.nk_r = divide(nk, tp, "linear_num_key_heads")
        self.nv_r = self.nk_r * self.group
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"Gated DeltaNet conv activation {config.hidden_act!r}: only silu is served")
        qkvz_rows = nk * (2 * self.dk + 2 * self.group * self.dv)
        self.in_proj = MergedColumnParallelLinear(config.hidden_size, [qkvz_rows, 2 * nv])
        self.qkvz_r, self.ba_r = self.in_proj.output_sizes
        self.qk_channels = 2 * self.nk_r * self.dk  # this rank's q and k conv channels, then nv_r * dv of v
        self.conv_channels = self.qk_channels + self.nv_r * self.dv

        key_dim, k_r, v_r = nk * self.dk, self.nk_r * self.dk, self.nv_r * self.dv

        def conv_rows(w):  # checkpoint [2 nk dk + nv dv, 1, K] -> this rank's q | k | v channels [C_r, K]
            parts = [w.narrow(0, rank * k_r, k_r), w.narrow(0, key_dim + rank * k_r, k_r),
                     w.narrow(0, 2 * key_dim + rank * v_r, v_r)]
            return torch.cat([p.reshape(p.shape[0], -1) for p in parts])

        def head_rows(w):
            return materialize(w).narrow(0, rank * self.nv_r, self.nv_r)

        self.conv1d_weight = nn.Parameter(torch.empty(self.conv_channels, self.kernel), requires_grad=False)
        self.conv1d_weight.weight_loader = _sharded_loader(conv_rows)
        self.dt_bias = nn.Parameter(torch.empty(self.nv_r), requires_grad=False)
        self.A_log = nn.Parameter(torch.empty(self.nv_r), requires_grad=False)
        self.dt_bias.weight_loader = self.A_log.weight_loader = _sharded_loader(head_rows)
        self.norm = GatedRMSNorm(self.dv, config.rms_norm_eps)
        self.out_proj = RowParallelLinear(nv * self.dv, config.hidden_size)
        self.scale = self.dk ** -0.5

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch: ForwardBatch
                ) -> torch.Tensor:
        n, dk, dv, nk_r, nv_r, group = hidden_states.shape[0], self.dk, self.dv, self.nk_r, self.nv_r, self.group
        qkvz, ba = self.in_proj(hidden_states).split([self.qkvz_r, self.ba_r], dim=-1)
        q, k, v, z = qkvz.view(n, nk_r, -1).split([dk, dk, group * dv, group * dv], dim=-1)
        b, a = ba.view(n, nk_r, 2 * group).split([group, group], dim=-1)
        mixed = torch.cat([q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1)], dim=-1)  # [N, C_r] conv order
        beta = b.reshape(n, nv_r).sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.reshape(n, nv_r).float() + self.dt_bias)  # [N, nv_r] fp32

        pool = forward_batch.req_to_token_pool.linear_state
        rows = forward_batch.req_pool_indices
        conv_qk = pool.get("conv_qk", self.linear_layer).view(-1, self.qk_channels, self.kernel - 1)
        conv_v = pool.get("conv_v", self.linear_layer).view(-1, nv_r * dv, self.kernel - 1)
        recurrent = pool.get("recurrent", self.linear_layer).view(-1, nv_r, dk, dv)
        conv_state = torch.cat([conv_qk[rows], conv_v[rows]], dim=1)  # [B, C_r, K-1]

        if forward_batch.forward_mode.is_decode():
            conv_out, conv_state = causal_conv1d_decode(mixed, self.conv1d_weight, None, conv_state, "silu")
            q, k, v = self._heads(conv_out, n)
            if decode_in_pool(recurrent, v):  # each request's state updated in its own pool row, no gather
                o = gated_delta_rule_decode_pool_(q, k, v, g, beta, recurrent, rows.tolist(), self.scale, True)
                state = None
            else:
                o, state = gated_delta_rule_decode(q, k, v, g, beta, recurrent[rows], self.scale, True)
        else:
            lens = forward_batch.extend_seq_lens_cpu
            has_state = torch.tensor([p > 0 for p in forward_batch.extend_prefix_lens_cpu], device=mixed.device)
            conv_out, conv_state = causal_conv1d_extend(mixed, self.conv1d_weight, None, conv_state, has_state, lens,
                                                        "silu")
            q, k, v = self._heads(conv_out, n)
            o, state = gated_delta_rule_extend(q, k, v, g, beta, recurrent[rows], has_state, lens, self.scale, True,
                                               chunk_size=delta_rule_chunk_tokens(lens))

        conv_qk.index_copy_(0, rows, conv_state[:, : self.qk_channels].to(conv_qk.dtype))
        conv_v.index_copy_(0, rows, conv_state[:, self.qk_channels:].to(conv_v.dtype))
        if state is not None:
            recurrent.index_copy_(0, rows, state.to(recurrent.dtype))

        # value head h of key head j is head j * G + h: z's [N, nk_r, G dv] rows are the value heads in that order
        out = self.norm(o.reshape(n * nv_r, dv), z.reshape(n * nv_r, dv))
        return self.out_proj(out.view(n, nv_r * dv))

    def _heads(self, conv_out: torch.Tensor, n: int):
        q, k, v = conv_out.split([self.nk_r * self.dk, self.nk_r * self.dk, self.nv_r * self.dv], dim=-1)
        return q.view(n, self.nk_r, self.dk), k.view(n, self.nk_r, self.dk), v.view(n, self.nv_r, self.dv)
