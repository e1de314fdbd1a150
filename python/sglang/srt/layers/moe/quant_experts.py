"""Quantized routed experts (--quantization gguf | w8a8_int8, CPU): a FusedMoE layer's w13 / w2 held as the CPU
kernel's block-quantized packed weights (fused_moe_cpu.QuantExpertWeights) instead of dense tensors.

    quant_experts_method(layer, device)   FusedMoE.__init__'s one call: None outside a quantization_config block
                                          (the layer builds dense weights), else the method, which has given the
                                          layer staging weights in their place

Loading takes the dense experts' checkpoint names and shards (moe_layer.expert_checkpoint_target):
    gguf       each expert's gate / up / down rows in packing.py's staging form (model_loader/gguf_weights.py cuts
               them from the file's stacked ffn_*_exps blocks)
    w8a8_int8  dense rows, quantized as they arrive (packing.staging_q8_blocks; a block is 32 weights of one row, so
               gate and up quantized apart are the fused weight's blocks)
into uint8 staging parameters w13_weight [E, 2N, K/32 * 36] and w2_weight [E, K, N/32 * 36]. The shard that
completes the layer packs both (pack_quant_experts: 4 bits where every block of the weight fits a nibble, else 8)
into the buffers w13_qweight / w2_qweight, the only copies kept; w13_weight / w2_weight then become plain attributes
holding the QuantExpertWeights views of those buffers, which FusedMoE.forward hands to fused_experts_cpu unchanged.
The layer's implementation is 'cpu' (fused_moe_cpu.py: the kernel for bf16 activations with K, N multiples of 32,
else a torch path dequantizing the routed experts per call); the plan sizes its workspace by the experts' bits
(mem_plan/moe_sizes.py) and their weights by mem_plan/quantization_sizes.py, equal to these buffers by test.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from torch import nn

from sglang.srt.layers.moe.dispatch import get_fused_experts
from sglang.srt.layers.moe.fused_moe_cpu import QuantExpertWeights, pack_quant_experts
from sglang.srt.layers.quantization import current_quantization, packing
from sglang.srt.mem_plan.moe_sizes import DENSE_EXPERT_BITS
from sglang.srt.mem_plan.quantization_sizes import cpu_record_bytes

GATE, UP, DOWN = "w1", "w3", "w2"  # moe_layer's shard ids
QUANT_EXPERTS_IMPL = "cpu"  # the only fused_experts entry that reads QuantExpertWeights
_HOST_DEVICES = ("cpu", "meta")  # meta: a build that allocates nothing (sized as on a CPU)


def _staging_bytes(cols: int) -> int:
    return -(-cols // packing.BLOCK) * packing.STAGING_BLOCK_BYTES


class QuantExpertsMethod:
    """The quantized experts of one FusedMoE layer (module docstring)."""

    PACKED_BUFFERS = ("w13_qweight", "w2_qweight")  # what the packed-weights cache holds (model_loader/loader.py)

    def __init__(self, method: str):
        self.method = method  # "gguf" | "w8a8_int8"

    # ---- weights
    def create_weights(self, layer: nn.Module, device: torch.device) -> None:
        """Give the layer (FusedMoE, which then builds no dense weights) its staging parameters on `device`."""
        if device.type not in _HOST_DEVICES:
            raise ValueError(f"--quantization {self.method}: quantized MoE experts run on CPUs only (the model is "
                             f"on {device.type}); use --quantization none")
        if layer.tp_size != 1:
            raise ValueError("--quantization: quantized MoE experts are not sharded over tp ranks; use --tp-size 1")
        e, n, k = layer.num_experts, layer.intermediate_size, layer.hidden_size
        layer.w13_weight = nn.Parameter(torch.empty(e, 2 * n, _staging_bytes(k), dtype=torch.uint8,
                                                    device=device), requires_grad=False)
        layer.w2_weight = nn.Parameter(torch.empty(e, k, _staging_bytes(n), dtype=torch.uint8, device=device),
                                       requires_grad=False)
        layer.w13_weight.weight_loader = self.weight_loader(layer)
        layer.w2_weight.weight_loader = self.weight_loader(layer)
        layer.register_buffer("w13_qweight", None)
        layer.register_buffer("w2_qweight", None)
        layer.impl, layer.fused_experts = QUANT_EXPERTS_IMPL, get_fused_experts(QUANT_EXPERTS_IMPL)

    def weight_loader(self, layer: nn.Module):
        def load(param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str, expert_id: int) -> None:
            if self.method == "gguf" and loaded_weight.dtype != torch.uint8:
                raise ValueError("--quantization gguf: FusedMoE got a dense expert tensor; the GGUF iterator must "
                                 "yield the staging form (model_loader/gguf_weights.py)")
            if self.method == "w8a8_int8":
                loaded_weight = packing.staging_q8_blocks(loaded_weight)
            n = layer.intermediate_size
            if shard_id in (GATE, UP):
                target = param.data[expert_id, (0 if shard_id == GATE else n): (n if shard_id == GATE else 2 * n)]
            elif shard_id == DOWN:
                target = param.data[expert_id]
            else:
                raise ValueError(f"unknown expert shard {shard_id!r}; expected {GATE}, {UP} or {DOWN}")
            if target.shape != loaded_weight.shape:
                raise ValueError(f"expert {expert_id} shard {shard_id}: staging {tuple(loaded_weight.shape)} does "
                                 f"not fit {tuple(target.shape)}")
            target.copy_(loaded_weight)
            layer._loaded.add((expert_id, shard_id))
            if len(layer._loaded) == 3 * layer.num_experts:
                self.pack(layer)

        return load

    def pack(self, layer: nn.Module) -> None:
        bits = 8 if self.method == "w8a8_int8" else None  # gguf: from the blocks
        w13 = pack_quant_experts(layer.w13_weight.data, layer.hidden_size, bits)
        w2 = pack_quant_experts(layer.w2_weight.data, layer.intermediate_size, bits)
        self._adopt(layer, w13.packed, w13.bits, w2.packed, w2.bits)

    def load_packed(self, layer: nn.Module, buffers: Dict[str, torch.Tensor]) -> None:
        """Take already packed experts (the packed-weights cache) instead of loading shards."""
        e, n, k = layer.num_experts, layer.intermediate_size, layer.hidden_size
        got = []
        for name, rows, cols in (("w13_qweight", 2 * n, k), ("w2_qweight", k, n)):
            packed = buffers[name]
            bits = 4 if packed.shape[-1] == cpu_record_bytes(4) else 8
            expected = (e, -(-rows // packing.TILE_ROWS), -(-cols // packing.BLOCK), cpu_record_bytes(bits))
            if tuple(packed.shape) != expected:
                raise ValueError(f"packed {name} {tuple(packed.shape)} does not fit this layer's {expected}")
            got += [packed.clone(), bits]
        self._adopt(layer, *got)
        layer._loaded.update((ex, s) for ex in range(e) for s in (GATE, UP, DOWN))

    @staticmethod
    def _adopt(layer: nn.Module, w13: torch.Tensor, w13_bits: int, w2: torch.Tensor, w2_bits: int) -> None:
        """The packed buffers replace the staging parameters; w13_weight / w2_weight become views of them."""
        del layer.w13_weight, layer.w2_weight
        layer.w13_qweight, layer.w2_qweight = w13, w2
        n, k = layer.intermediate_size, layer.hidden_size
        layer.w13_weight = QuantExpertWeights(layer.w13_qweight, w13_bits, 2 * n, k)
        layer.w2_weight = QuantExpertWeights(layer.w2_qweight, w2_bits, k, n)

    def unpacked_reason(self, layer: nn.Module) -> Optional[str]:
        """None once packed, else what is missing (layers/quantization/linear_method.finalize_quantized_layers)."""
        if layer.w13_qweight is not None:
            return None
        return f"got {len(layer._loaded)} of {3 * layer.num_experts} expert shards from the checkpoint"


def quant_experts_method(layer: nn.Module, device: torch.device) -> Optional[QuantExpertsMethod]:
    """FusedMoE.__init__'s hook: under --quantization, the method (its staging weights created on the layer), else
    None (the layer builds dense weights)."""
    method = current_quantization()
    if method == "none":
        return None
    quant = QuantExpertsMethod(method)
    quant.create_weights(layer, device)
    return quant


def expert_bits(layer: nn.Module) -> Tuple[int, int]:
    """(gate/up, down) bits of a layer's experts: DENSE_EXPERT_BITS for dense ones (the workspace spec's fields)."""
    w13, w2 = layer.w13_weight, layer.w2_weight
    if isinstance(w13, QuantExpertWeights):
        return w13.bits, w2.bits
    return DENSE_EXPERT_BITS, DENSE_EXPERT_BITS
