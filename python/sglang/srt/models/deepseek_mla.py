"""DeepSeek's multi-head latent attention (MLA), always in the absorbed form: the KV cache holds one latent row per
token, [ c_kv (kv_lora_rank, after kv_a_layernorm) | k_pe (qk_rope_head_dim, after RoPE) ] (width L), and attention
is MQA over those rows for prefill and decode alike; the per-head keys and values are never materialised.

    q      = q_b_proj(q_a_layernorm(q_a_proj(x)))  (q_lora_rank set)  or  q_proj(x)       [N, H, nope + rope]
    latent = kv_a_proj_with_mqa(x) = [c_kv | k_pe];  c_kv = kv_a_layernorm(c_kv)          [N, kv_lora + rope]
    kv_b_proj.weight [H x (nope + v), kv_lora], per head: nope rows W_UK then v rows W_UV (held per head as
             [W_UK^T | W_UV] once loaded: KVBProjection.arrange)
    q_attn = [ q_nope @ W_UK  (per head: nope -> kv_lora) | rope(q_pe) ]                   [N, H, L]
    k      = [ c_kv | rope(k_pe) ]                                                         [N, 1, L]
    v      = k[..., :kv_lora]                                                              [N, 1, kv_lora]
    o      = attention(q_attn, k, v)  -> per head o_h @ W_UV^T  (kv_lora -> v)  -> o_proj  [N, hidden]
Since q_nope . k_nope_h = q_nope . (W_UK_h c_kv) = (q_nope W_UK_h) . c_kv and the values are W_UV_h c_kv, this is the
expanded attention exactly (transformers' DeepseekV2/V3Attention computes the expanded form).
softmax scale = (nope + rope)^-0.5, times mscale(factor, mscale_all_dim)^2 under YaRN with mscale_all_dim (V3).
RoPE: DeepSeek's rope dims are pairs (x0, x1), (x2, x3), ... each rotated by one frequency (V2 always; V3 unless
rope_interleave is false); the pairs are split into [evens | odds] first, then rotated half-split, as transformers
does -- q and k take the same layout, so their dot products are the interleaved rotation's.
Tensor parallel: heads split (q_proj / q_b_proj and kv_b_proj by output rows, o_proj by input columns); the
a-projections, their norms and the latent rows are the same on every rank (the latent pool is replicated).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from sglang.srt.configs.model_config import get_rope_parameters
from sglang.srt.distributed.parallel_state import divide, get_tp_rank, get_tp_size
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import (SMALL_M_ROWS, MergedColumnParallelLinear, ReplicatedLinear,
                                      RowParallelLinear, default_weight_loader, linear)
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.layers.rotary_embedding import get_rope
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_loader.weight_utils import materialize

# transformers' DeepseekV2RMSNorm default: q_a_layernorm and kv_a_layernorm are built without the config's eps
LATENT_NORM_EPS = 1e-6


class ColumnParallelLinear(MergedColumnParallelLinear):
    """One projection split over the ranks by output rows (rank r: rows [r n/tp, (r+1) n/tp))."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        super().__init__(input_size, [output_size], bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id=None) -> None:
        super().weight_loader(param, loaded_weight, 0)


class KVBProjection(nn.Module):
    """kv_b_proj's weight, this rank's heads [H_tp x (nope + v), kv_lora]: never run as a linear layer, only read
    through per-head matrices. Once loaded (arrange()), each head's block is rewritten in place as [W_UK^T (kv_lora x
    nope) | W_UV (v x kv_lora)]: the same bytes, no copy held, and both absorbed products then take one contiguous
    [out, in] matrix per head -- what the CPU GEMV / AMX kernels read (torch's bf16 bmm over the checkpoint's strided
    W_UK took 37% of a batch-1 decode step of a 1B V3). Kept dense under --quantization (the absorbed products need
    its values, not a quantized GEMM)."""

    def __init__(self, num_heads_tp: int, nope: int, v: int, kv_lora: int):
        super().__init__()
        self.num_heads, self.nope, self.v = num_heads_tp, nope, v
        self.weight = nn.Parameter(torch.empty(num_heads_tp * (nope + v), kv_lora), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        rows = param.shape[0]
        default_weight_loader(param, materialize(loaded_weight.narrow(0, get_tp_rank() * rows, rows)))

    def arrange(self) -> None:
        """Checkpoint layout [W_UK (nope x kv_lora) | W_UV] per head -> [W_UK^T | W_UV] per head, in place."""
        heads, kv_lora = self.num_heads, self.weight.shape[1]
        w = self.weight.data.view(heads, -1)[:, : self.nope * kv_lora]
        w.copy_(w.view(heads, self.nope, kv_lora).transpose(1, 2).reshape(heads, -1))
        self.arranged = True

    def w_uk_t(self) -> torch.Tensor:
        """W_UK^T per head [H_tp, kv_lora, nope]: q_nope_h @ W_UK_h == linear(q_nope_h, W_UK^T_h)."""
        kv_lora = self.weight.shape[1]
        return self.weight.view(self.num_heads, -1)[:, : self.nope * kv_lora].view(self.num_heads, kv_lora, self.nope)

    def w_uv(self) -> torch.Tensor:
        """W_UV per head [H_tp, v, kv_lora]: o_h @ W_UV_h^T == linear(o_h, W_UV_h)."""
        kv_lora = self.weight.shape[1]
        return self.weight.view(self.num_heads, -1)[:, self.nope * kv_lora:].view(self.num_heads, self.v, kv_lora)

    @staticmethod
    def per_head(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """[H, N, in] x per-head [H, out, in] -> [H, N, out]: x_h @ w_h^T. Few bf16 rows on a CPU: one kernel GEMV /
        AMX call per head (layers/linear.linear); otherwise one bmm."""
        if x.is_cpu and x.dtype == torch.bfloat16 and x.shape[1] <= SMALL_M_ROWS:
            return torch.stack([linear(x[h], w[h]) for h in range(x.shape[0])])
        return torch.bmm(x, w.transpose(1, 2))


def yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def mla_softmax_scale(config, rope: dict) -> float:
    """(nope + rope)^-0.5, times mscale^2 under a scaled rope with mscale_all_dim (transformers' yarn_apply_mscale:
    the YaRN temperature DeepSeek-V3 applies to the whole head, where cos / sin carry only mscale / mscale_all_dim)."""
    scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    mscale_all_dim = rope.get("mscale_all_dim") or 0
    if rope.get("rope_type", "default") != "default" and mscale_all_dim:
        m = yarn_mscale(rope["factor"], mscale_all_dim)
        scale *= m * m
    return scale


def rope_interleaved(config) -> bool:
    """V2's rope dims are always interleaved pairs; V3 declares rope_interleave (transformers' default: true)."""
    if getattr(config, "model_type", "") == "deepseek_v2":
        return True
    flag = getattr(config, "rope_interleave", None)
    return True if flag is None else bool(flag)


class DeepseekMLAttention(nn.Module):
    def __init__(self, config, layer_id: int):
        super().__init__()
        hidden = config.hidden_size
        total_heads = config.num_attention_heads
        self.num_heads = divide(total_heads, get_tp_size(), "number of attention heads")
        self.nope, self.rope_dim = config.qk_nope_head_dim, config.qk_rope_head_dim
        self.v_head_dim, self.kv_lora = config.v_head_dim, config.kv_lora_rank
        self.q_lora = getattr(config, "q_lora_rank", None) or 0
        bias = bool(getattr(config, "attention_bias", False))
        qk = self.nope + self.rope_dim
        if self.q_lora:
            self.q_a_proj = ReplicatedLinear(hidden, self.q_lora, bias=bias)
            self.q_a_layernorm = RMSNorm(self.q_lora, eps=LATENT_NORM_EPS)
            self.q_b_proj = ColumnParallelLinear(self.q_lora, total_heads * qk)
        else:
            self.q_proj = ColumnParallelLinear(hidden, total_heads * qk)
        self.kv_a_proj_with_mqa = ReplicatedLinear(hidden, self.kv_lora + self.rope_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.kv_lora, eps=LATENT_NORM_EPS)
        self.kv_b_proj = KVBProjection(self.num_heads, self.nope, self.v_head_dim, self.kv_lora)
        self.o_proj = RowParallelLinear(total_heads * self.v_head_dim, hidden, bias=bias)
        rope = get_rope_parameters(config)
        self.interleaved = rope_interleaved(config)
        self.rotary_emb = get_rope(self.rope_dim, self.rope_dim, config.max_position_embeddings, rope["rope_theta"],
                                   rope_parameters=rope)
        self.attn = RadixAttention(self.num_heads, self.kv_lora + self.rope_dim, mla_softmax_scale(config, rope),
                                   num_kv_heads=1, layer_id=layer_id, v_head_dim=self.kv_lora)

    def _rotate(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """x [N, h, rope] (a view) -> rotated, contiguous [N, h, rope]."""
        if self.interleaved:  # pairs (x0, x1), (x2, x3), ... -> [x0 x2 ... | x1 x3 ...]
            n, h, _ = x.shape
            x = x.unflatten(-1, (-1, 2)).transpose(-1, -2).reshape(n, h, self.rope_dim)
        else:
            x = x.contiguous()
        return self.rotary_emb(positions, x)[0]

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                forward_batch: ForwardBatch) -> torch.Tensor:
        n = hidden_states.shape[0]
        if self.q_lora:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
        else:
            q = self.q_proj(hidden_states)
        q = q.view(n, self.num_heads, self.nope + self.rope_dim)
        latent = self.kv_a_proj_with_mqa(hidden_states)  # [N, kv_lora + rope]
        c_kv = self.kv_a_layernorm(latent[:, : self.kv_lora].contiguous())
        k_pe = self._rotate(positions, latent[:, self.kv_lora:].unsqueeze(1))  # [N, 1, rope]
        q_pe = self._rotate(positions, q[..., self.nope:])  # [N, H, rope]
        # absorb W_UK into the query: [H, N, nope] @ [H, nope, kv_lora] -> [H, N, kv_lora]
        kv_b = self.kv_b_proj
        assert getattr(kv_b, "arranged", False), "kv_b_proj.arrange() runs once the weights are loaded"
        q_latent = kv_b.per_head(q[..., : self.nope].transpose(0, 1).contiguous(), kv_b.w_uk_t())
        q_attn = torch.cat((q_latent.transpose(0, 1), q_pe), dim=-1)  # [N, H, L]
        k = torch.cat((c_kv.unsqueeze(1), k_pe), dim=-1)  # [N, 1, L]
        o = self.attn(q_attn, k, k[..., : self.kv_lora], forward_batch)  # [N, H * kv_lora]
        # W_UV per head: [H, N, kv_lora] @ [H, kv_lora, v] -> [H, N, v] -> [N, H * v]
        o = kv_b.per_head(o.reshape(n, self.num_heads, self.kv_lora).transpose(0, 1).contiguous(), kv_b.w_uv())
        return self.o_proj(o.transpose(0, 1).reshape(n, self.num_heads * self.v_head_dim))
