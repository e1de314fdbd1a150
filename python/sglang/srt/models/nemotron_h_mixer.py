"""Nemotron-H's Mamba-2 mixer ("M" blocks): in_proj -> depthwise causal conv1d + silu over the x | B | C channels ->
the selective state-space scan (SSD) -> RMSNorm gated by silu(z), per group -> out_proj.

    in_proj   [z (nh hd) | x (nh hd) | B (ng N) | C (ng N) | dt (nh)] rows, one checkpoint tensor; each rank loads its
              slice of each of the five (heads and groups split over the ranks)
    conv1d    weight [conv_dim, 1, K] and bias over x | B | C, split the same way (this rank: x_r | B_r | C_r)
    dt_bias, A_log, D [nh]; norm.weight [nh hd] (its groups of nh hd / ng channels follow the B / C groups)
    out_proj  row-parallel over the nh hd channels (one all-reduce)

Per request the mixer keeps (mem_cache/linear_state_pool.py, this layer's linear_layer ordinal):
    conv_x   [nh_r, hd (K-1)] viewed [nh_r hd, K-1]: the last K-1 conv inputs of the x channels, oldest first
    conv_bc  [ng_r, 2 N (K-1)] viewed [2 ng_r N, K-1]: the same for the B then C channels
    ssm      [nh_r, hd N] viewed [nh_r, hd, N] (float32 unless the checkpoint names another dtype)
A forward reads request b's row req_pool_indices[b] (the zero state when its prefix length is 0: a new request or a
re-prefill after retraction), runs, and writes the new state back to the same row.

dt: softplus(dt + dt_bias) clamped below at time_step_min, as transformers' chunked path does; its one-token path does
not clamp, here both do, so decode equals a one-token extend (the clamp is below any softplus of a trained model's dt).
TP needs heads and groups divisible by tp (a rank never holds a part of a group).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.distributed.parallel_state import divide, get_tp_rank, get_tp_size
from sglang.srt.layers.attention.linear.causal_conv1d import causal_conv1d_decode, causal_conv1d_extend
from sglang.srt.layers.attention.linear.mamba2_ssd import ssd_decode, ssd_extend
from sglang.srt.layers.linear import MergedColumnParallelLinear, RowParallelLinear, default_weight_loader
from sglang.srt.model_executor.forward_batch_info import ForwardBatch


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


def _rank_slices(loaded: torch.Tensor, segments: list, rank: int, tp: int) -> torch.Tensor:
    """This rank's part of each consecutive segment (total sizes along dim 0) of a checkpoint tensor, concatenated."""
    parts, start = [], 0
    for total in segments:
        size = total // tp
        parts.append(loaded.narrow(0, start + rank * size, size))
        start += total
    return torch.cat([torch.as_tensor(p) for p in parts])


class GatedGroupRMSNorm(nn.Module):
    """y = weight * rmsnorm_per_group(x * silu(z)), in fp32 then rounded once to x's dtype (transformers'
    NemotronHRMSNormGated); groups of group_size channels."""

    def __init__(self, channels: int, group_size: int, eps: float):
        super().__init__()
        self.weight = _param(channels)
        self.group_size, self.eps = group_size, eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        h = x.float() * F.silu(z.float())
        g = h.view(*h.shape[:-1], -1, self.group_size)
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * g.view(h.shape).to(x.dtype)


class DepthwiseConv(nn.Module):
    """conv1d's weight [C_r, 1, K] and bias [C_r] of this rank's x | B | C channels (checkpoint layout)."""

    def __init__(self, channels: int, kernel: int, bias: bool, segments: list):
        super().__init__()
        self.segments = segments  # whole-model x, B, C channel counts
        self.weight = _param(channels, 1, kernel)
        self.weight.weight_loader = self.load
        self.bias = _param(channels) if bias else None
        if bias:
            self.bias.weight_loader = self.load

    def load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        default_weight_loader(param, _rank_slices(loaded, self.segments, get_tp_rank(), get_tp_size()))


class SegmentedColumnLinear(MergedColumnParallelLinear):
    """Column projections stored as ONE checkpoint tensor of consecutive segments (in_proj's z | x | B | C | dt; one
    segment for a plain column-parallel layer): each rank loads its slice of every segment. The class's loader, so
    a quantized layer (layers/quantization/linear_method.py) loads through it too."""

    def __init__(self, input_size: int, segments: list, bias: bool):
        super().__init__(input_size, segments, bias=bias)
        self.segments = segments

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id=None) -> None:
        if shard_id is not None:
            return super().weight_loader(param, loaded_weight, shard_id)
        start = 0
        for i, total in enumerate(self.segments):
            super().weight_loader(param, loaded_weight.narrow(0, start, total), i)
            start += total


class NemotronHMamba2Mixer(nn.Module):
    def __init__(self, config, linear_layer: int):
        super().__init__()
        tp = get_tp_size()
        self.linear_layer = linear_layer
        heads, self.head_dim = config.mamba_num_heads, config.mamba_head_dim
        groups, self.state_size = config.n_groups, config.ssm_state_size
        self.num_heads = divide(heads, tp, "Mamba heads (mamba_num_heads)")
        self.num_groups = divide(groups, tp, "Mamba B/C groups (n_groups)")
        self.inner = self.num_heads * self.head_dim  # x (and z) channels of this rank
        self.bc = self.num_groups * self.state_size  # B (and C) channels of this rank
        self.kernel = config.conv_kernel
        self.chunk_size = config.chunk_size
        self.dt_limit = (getattr(config, "time_step_min", 0.0) or 0.0, math.inf)
        bias = bool(getattr(config, "use_bias", False))
        inner_all, bc_all = heads * self.head_dim, groups * self.state_size
        self.in_proj_segments = [inner_all, inner_all, bc_all, bc_all, heads]
        self.in_proj = SegmentedColumnLinear(config.hidden_size, self.in_proj_segments, bias=bias)
        self.conv1d = DepthwiseConv(self.inner + 2 * self.bc, self.kernel, bool(config.use_conv_bias),
                                    [inner_all, bc_all, bc_all])
        self.dt_bias, self.A_log, self.D = _param(self.num_heads), _param(self.num_heads), _param(self.num_heads)
        for p in (self.dt_bias, self.A_log, self.D):
            p.weight_loader = self._load_per_head
        self.norm = GatedGroupRMSNorm(self.inner, inner_all // groups, config.layer_norm_epsilon)
        self.norm.weight.weight_loader = self._load_per_head
        self.out_proj = RowParallelLinear(inner_all, config.hidden_size, bias=bias)

    def _load_per_head(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        default_weight_loader(param, _rank_slices(loaded, [loaded.shape[0]], get_tp_rank(), get_tp_size()))

    def forward(self, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        # hidden [N, H] -> [N, H]
        n = hidden.shape[0]
        z, xbc, dt = self.in_proj(hidden).split([self.inner, self.inner + 2 * self.bc, self.num_heads], dim=-1)
        pool = fb.req_to_token_pool.linear_state
        rows = fb.req_pool_indices
        conv_x = pool.get("conv_x", self.linear_layer).view(-1, self.inner, self.kernel - 1)
        conv_bc = pool.get("conv_bc", self.linear_layer).view(-1, 2 * self.bc, self.kernel - 1)
        ssm = pool.get("ssm", self.linear_layer).view(-1, self.num_heads, self.head_dim, self.state_size)
        conv_state = torch.cat([conv_x[rows], conv_bc[rows]], dim=1)  # [B, C_r, K-1], channels x | B | C
        weight, bias = self.conv1d.weight.squeeze(1), self.conv1d.bias
        A = -torch.exp(self.A_log.float())
        if fb.forward_mode.is_decode():
            xbc, conv_state = causal_conv1d_decode(xbc, weight, bias, conv_state, "silu")
        else:
            lens = fb.extend_seq_lens_cpu
            has_state = torch.tensor([p > 0 for p in fb.extend_prefix_lens_cpu], device=hidden.device)
            xbc, conv_state = causal_conv1d_extend(xbc, weight, bias, conv_state, has_state, lens, "silu")
        conv_x.index_copy_(0, rows, conv_state[:, : self.inner].to(conv_x.dtype))
        conv_bc.index_copy_(0, rows, conv_state[:, self.inner:].to(conv_bc.dtype))
        x, B, C = xbc.split([self.inner, self.bc, self.bc], dim=-1)
        x = x.reshape(n, self.num_heads, self.head_dim)
        B = B.reshape(n, self.num_groups, self.state_size)
        C = C.reshape(n, self.num_groups, self.state_size)
        if fb.forward_mode.is_decode():
            y, state = ssd_decode(x, dt, A, B, C, self.D, ssm[rows], dt_bias=self.dt_bias, dt_limit=self.dt_limit)
        else:
            y, state = ssd_extend(x, dt, A, B, C, self.D, ssm[rows], has_state, lens, self.chunk_size,
                                  dt_bias=self.dt_bias, dt_limit=self.dt_limit)
        ssm.index_copy_(0, rows, state.to(ssm.dtype))
        return self.out_proj(self.norm(y.reshape(n, self.inner), z))
