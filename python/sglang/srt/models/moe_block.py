"""SparseMoeBlock: the MLP of a MoE decoder layer, the shape Qwen2-MoE, Qwen3-MoE and Mixtral share.

    gate           ReplicatedLinear [E, hidden]: router logits [N, E] in the model dtype (routing: layers/moe/router.py)
    experts        FusedMoE: the top-k routed experts (layers/moe/moe_layer.py)
    shared_expert  Qwen2-MoE only: a dense gated MLP, scaled per token by sigmoid(shared_expert_gate(x)) [N, 1]
With tp ranks the experts and the shared expert each leave a partial sum over their intermediate columns; the block
adds them and all-reduces once (the gate's weights are replicated, so the sigmoid factor is the same on every rank).
Checkpoint names follow the attribute names: mlp.gate, mlp.experts.{e}.*, mlp.shared_expert.*, mlp.shared_expert_gate
(Mixtral's block_sparse_moe is renamed to mlp on load). With --quantization the routed experts
(layers/moe/quant_experts.py) and the shared expert are block-quantized; the router and the shared expert's gate stay
dense.
"""

from __future__ import annotations

import torch
from torch import nn

from sglang.srt.distributed.communication_op import tp_all_reduce
from sglang.srt.layers.linear import ReplicatedLinear
from sglang.srt.layers.moe.moe_layer import FusedMoE
from sglang.srt.layers.quantization import dense_linear
from sglang.srt.models.llama import LlamaMLP


class SparseMoeBlock(nn.Module):
    def __init__(self, hidden_size: int, num_experts: int, top_k: int, moe_intermediate_size: int, renormalize: bool,
                 shared_expert_intermediate_size: int = 0, hidden_act: str = "silu"):
        super().__init__()
        if hidden_act != "silu":
            raise ValueError(f"Unsupported expert activation {hidden_act!r}; only silu is supported.")
        with dense_linear():  # routers stay dense under --quantization (layers/quantization/__init__.py)
            self.gate = ReplicatedLinear(hidden_size, num_experts, bias=False)
        self.experts = FusedMoE(num_experts, top_k, hidden_size, moe_intermediate_size, renormalize,
                                reduce_results=False)
        self.shared_expert = self.shared_expert_gate = None
        if shared_expert_intermediate_size:
            self.shared_expert = LlamaMLP(hidden_size, shared_expert_intermediate_size, hidden_act,
                                          reduce_results=False)
            with dense_linear():
                self.shared_expert_gate = ReplicatedLinear(hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [N, hidden] -> router logits [N, E] -> [N, hidden]
        out = self.experts(x, self.gate(x))
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return tp_all_reduce(out)


def num_routed_experts(config) -> int:
    """E of a Qwen MoE config (transformers 5 stores qwen3_moe's num_experts as num_local_experts)."""
    return getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None) or 0


def is_sparse_layer(config, layer_id: int) -> bool:
    """The Qwen MoE rule (transformers' Qwen2Moe / Qwen3Moe decoder layers): experts unless the layer is listed in
    mlp_only_layers, or falls between decoder_sparse_step strides; mem_plan/arch_qwen_moe.sparse_layers agrees."""
    return (layer_id not in (getattr(config, "mlp_only_layers", None) or [])
            and num_routed_experts(config) > 0
            and (layer_id + 1) % getattr(config, "decoder_sparse_step", 1) == 0)


def check_experts_loaded(model: nn.Module) -> None:
    """ValueError naming the first expert projections no checkpoint tensor filled."""
    for name, module in model.named_modules():
        if isinstance(module, FusedMoE) and module.missing_shards():
            missing = module.missing_shards()
            raise ValueError(f"Checkpoint is missing expert weights of {name}: (expert, shard) {missing[:4]}"
                             f"{' ...' if len(missing) > 4 else ''}")
