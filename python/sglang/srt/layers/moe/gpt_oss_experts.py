"""gpt-oss's routed experts: biased projections and a clamped SwiGLU (transformers' GptOssExperts / GptOssTopKRouter).

Routing: the router's logits (with its bias) [M, E] -> the top k logits per token -> softmax over those k only.
Expert e on a token x:
    g, u = x W_gate,e + b_gate,e , x W_up,e + b_up,e        (checkpoint: gate_up_proj [E, K, 2N], columns interleaved
                                                            gate 0, up 0, gate 1, up 1, ...; gate_up_proj_bias [E, 2N])
    g = min(g, limit); u = clamp(u, -limit, limit)          limit: swiglu_limit (7.0)
    h = (u + 1) * g * sigmoid(alpha * g)                     alpha: swiglu_alpha (1.702)
    y = h W_down,e + b_down,e                               (down_proj [E, N, K], down_proj_bias [E, K])
out = sum over the chosen experts of weight * y.

Held here de-interleaved, like FusedMoE's layout: w13_weight [E, 2N_r, K] (gate rows, then up rows), w13_bias
[E, 2N_r], w2_weight [E, K, N_r], w2_bias [E, K]. Tensor parallel splits the intermediate columns (N_r = N / tp;
the clamp and gate are per column, so a rank's partial sum is exact) and only rank 0 adds the down bias, so the
block's one all-reduce sums it once. mxfp4 checkpoints (<proj>_blocks / <proj>_scales, layers/moe/mxfp4.py) are
dequantized exactly into the same weights as they load. A torch path (one GEMM pair per expert hit); expert
parallelism is refused.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.distributed.parallel_state import get_ep_size
from sglang.srt.layers.linear import default_weight_loader
from sglang.srt.layers.moe.fused_moe_torch import row_pieces
from sglang.srt.layers.moe.moe_layer import FusedMoE
from sglang.srt.layers.moe.mxfp4 import GROUP, dequantize_mxfp4
from sglang.srt.layers.quantization import dense_linear
from sglang.srt.model_loader.weight_utils import materialize

# checkpoint name under a layer's mlp.experts -> (parameter, what the tensor is)
_EXPERT_TENSOR = re.compile(r"^(?P<prefix>.*\.mlp\.experts)\.(?P<proj>gate_up_proj|down_proj)"
                            r"(?P<part>_bias|_blocks|_scales)?$")
_PARAM = {"gate_up_proj": "w13", "down_proj": "w2"}


def gpt_oss_expert_target(name: str) -> Optional[Tuple[str, int, str]]:
    """(parameter, -1, checkpoint tensor kind) of an experts tensor, e.g. 'model.layers.0.mlp.experts.down_proj_bias'
    -> ('model.layers.0.mlp.experts.w2_bias', -1, 'down_proj_bias'); None for any other tensor."""
    m = _EXPERT_TENSOR.match(name)
    if m is None:
        return None
    part = m.group("part") or ""
    param = _PARAM[m.group("proj")] + ("_bias" if part == "_bias" else "_weight")
    return f"{m.group('prefix')}.{param}", -1, m.group("proj") + part


class GptOssExperts(FusedMoE):
    """A FusedMoE in layout, loading and workspace (the runner attaches the plan's workspace to every FusedMoE, so
    the planned term is what a start allocates), with its own loaders and forward: no fused_experts implementation
    takes the biases and the clamped SwiGLU, so the experts always run the torch path below and the attached
    workspace's buffers go unread. Dense under --quantization (the experts are built like the router)."""

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 swiglu_alpha: float, swiglu_limit: float):
        if get_ep_size() > 1:
            raise ValueError("gpt-oss experts are split by tensor parallelism only: use --ep-size 1")
        with dense_linear():
            super().__init__(num_experts, top_k, hidden_size, intermediate_size, renormalize=False,
                             reduce_results=False)
        n, e = self.intermediate_size, num_experts  # N_r: this rank's intermediate columns
        self.alpha, self.limit = swiglu_alpha, swiglu_limit
        self.w13_bias = nn.Parameter(torch.empty(e, 2 * n), requires_grad=False)
        self.w2_bias = nn.Parameter(torch.empty(e, hidden_size), requires_grad=False)
        for p in (self.w13_weight, self.w13_bias, self.w2_weight, self.w2_bias):
            p.weight_loader = self.weight_loader
        self._mxfp4: Dict[str, dict] = {}  # projection -> its blocks / scales seen so far (loaded once both are)
        self._loaded_tensors: set = set()

    def use_impl(self, impl: str) -> None:
        """The plan's implementation names the workspace it sized; this layer keeps its torch path (see the class)."""
        self.impl = impl

    def missing_shards(self) -> list:
        return [(-1, kind) for kind in self.missing_tensors()]

    # ------------------------------------------------------------------ loading
    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, kind: str, expert_id: int = -1) -> None:
        """Fill this rank's part of `param` from the whole-layer checkpoint tensor `kind` (gpt_oss_expert_target)."""
        proj, _, part = kind.partition("_proj")
        proj += "_proj"
        if part in ("_blocks", "_scales"):
            held = self._mxfp4.setdefault(proj, {})
            held[part] = loaded
            if len(held) == 2:
                self._load_mxfp4(proj, held.pop("_blocks"), held.pop("_scales"))
            return
        n, start = self.intermediate_size, self.layout.moe_tp_rank * self.intermediate_size
        if kind == "gate_up_proj":  # [E, K, 2N] interleaved: this rank's gate / up pairs are 2n adjacent columns
            self._set_w13(materialize(loaded.narrow(2, 2 * start, 2 * n)).transpose(1, 2))
        elif kind == "gate_up_proj_bias":  # [E, 2N]
            pairs = materialize(loaded.narrow(1, 2 * start, 2 * n))
            default_weight_loader(self.w13_bias, torch.cat([pairs[:, 0::2], pairs[:, 1::2]], dim=1))
        elif kind == "down_proj":  # [E, N, K]
            default_weight_loader(self.w2_weight, materialize(loaded.narrow(1, start, n)).transpose(1, 2))
        elif kind == "down_proj_bias":  # [E, K]; added once over the ranks
            bias = materialize(loaded)
            default_weight_loader(self.w2_bias, bias if self.tp_rank == 0 else torch.zeros_like(bias))
        else:
            raise ValueError(f"unknown gpt-oss experts tensor {kind!r}")
        self._loaded_tensors.add(kind)

    def _set_w13(self, interleaved: torch.Tensor) -> None:
        """interleaved [E, 2n, K] (rows gate 0, up 0, gate 1, ...) -> w13_weight (gate rows, then up rows)."""
        default_weight_loader(self.w13_weight, torch.cat([interleaved[:, 0::2], interleaved[:, 1::2]], dim=1))

    def _load_mxfp4(self, proj: str, blocks, scales) -> None:
        n, start = self.intermediate_size, self.layout.moe_tp_rank * self.intermediate_size
        dtype = self.w13_weight.dtype
        if proj == "gate_up_proj":  # blocks [E, 2N, K/32, 16]: output rows interleaved, this rank's 2n adjacent
            rows = (2 * start, 2 * n)
            self._set_w13(dequantize_mxfp4(materialize(blocks.narrow(1, *rows)),
                                           materialize(scales.narrow(1, *rows)), dtype))
        else:  # blocks [E, K, N/32, 16]: this rank's input columns are whole groups when n is a multiple of 32
            if n % GROUP == 0:
                groups = (start // GROUP, n // GROUP)
                w = dequantize_mxfp4(materialize(blocks.narrow(2, *groups)), materialize(scales.narrow(2, *groups)),
                                     dtype)
            else:
                w = dequantize_mxfp4(materialize(blocks), materialize(scales), dtype).narrow(2, start, n)
            default_weight_loader(self.w2_weight, w)
        self._loaded_tensors.add(proj)

    def missing_tensors(self) -> List[str]:
        """Checkpoint tensors of this layer not loaded (an mxfp4 projection with only its blocks or its scales seen
        counts as not loaded)."""
        want = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")
        return [k for k in want if k not in self._loaded_tensors]

    # ------------------------------------------------------------------ forward
    def route(self, router_logits: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """[M, E] -> (weights fp32 [M, k]: softmax over the chosen logits, ids [M, k])."""
        top, ids = torch.topk(router_logits, self.top_k, dim=-1)
        return torch.softmax(top.float(), dim=-1), ids

    def forward(self, hidden: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """hidden [M, K], router_logits [M, E] -> [M, K]: this rank's partial sum (the block all-reduces)."""
        weights, ids = self.route(router_logits)
        m, k = ids.shape
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        tokens = order // k  # token of each (token, choice) pair, grouped by expert
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        pair_weights = weights.reshape(-1)[order]
        out = torch.zeros(m, self.hidden_size, dtype=torch.float32, device=hidden.device)
        # reduced precision on a CPU: GEMMs of power-of-two row counts only (oneDNN keeps state per shape:
        # fused_moe_torch.py's note)
        pow2 = hidden.is_cpu and hidden.dtype != torch.float32
        begin = 0
        for e, count in enumerate(counts):
            for lo, hi in row_pieces(begin, begin + count, pow2):
                tok = tokens[lo: hi]
                out.index_add_(0, tok, self._expert(e, hidden[tok]).float() * pair_weights[lo: hi, None])
            begin += count
        return out.to(hidden.dtype)

    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e on rows x [m, K] -> [m, K] (this rank's columns; the down bias on rank 0 only)."""
        n = self.intermediate_size
        gate_up = F.linear(x, self.w13_weight[e], self.w13_bias[e])
        gate = gate_up[:, :n].clamp(max=self.limit)
        up = gate_up[:, n:].clamp(min=-self.limit, max=self.limit)
        return F.linear((up + 1) * gate * torch.sigmoid(self.alpha * gate), self.w2_weight[e], self.w2_bias[e])
