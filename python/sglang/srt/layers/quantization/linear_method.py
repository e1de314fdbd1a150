"""QuantLinearMethod: the weights and the GEMM of one quantized LinearBase.

Loading: create_weights gives the layer a staging `weight` that the layer's own weight_loader fills shard by shard
(q/k/v, gate/up: the same row ranges as the dense path), in a staging form of packing.py for 'gguf' (the GGUF
iterator converts each tensor's blocks) or dense fp32 for 'w8a8_int8'. The staging weight takes the form of the first
shard (narrow, q6 or wide: packing.staging_kind); a shard of another form makes the weight and the shard wide (fp32
d, c per half block), so a merged q/k/v or gate/up of mixed types holds each exactly. When every row has arrived the
layer packs it (packing.pack, in packing.staging_format's format) into the buffer `qweight`, the only copy it keeps,
and drops the staging weight; `weight` is then None; `quant_format` is the format code, `quant_bits` its bits. finalize_quantized_layers() checks after loading that no layer was left unpacked. load_packed /
PACKED_BUFFERS / unpacked_reason are the interface the loader's packed-weights cache and that check use, shared with
the quantized MoE experts (layers/moe/quant_experts.py).
Forward: the quant_linear kernel (sgl-kernel/csrc/cpu/quant_gemm.h) when the CPU kernels are in use, else the torch
path: dequantize the packed weight to the input's dtype for this call and F.linear.
"""

from __future__ import annotations

import contextlib
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from torch import nn

from sglang.jit_kernel.cpu_ops import get_ops_for_dtype, get_quant_ops
from sglang.srt.layers.quantization import packing
from sglang.srt.mem_plan.quantization_sizes import cpu_record_bytes, format_bits

# every format code a packed weight may have, by its record bytes (all distinct)

def quant_kernels():
    """The compiled kernels when quant_linear runs here (CPU level avx2 and up: jit_kernel/cpu_isa.py), else None
    (torch path)."""
    return get_quant_ops()


@contextlib.contextmanager
def quant_forward_rule(decode: bool):
    """The quantized GEMMs' kernel rule for one forward of the model runner: a decode batch takes the dense AMX path
    (quant_gemm_amx_dense.h) from 32 rows, any other forward (a prefill, a verify) from 256, so a prompt's prefill
    gives the same bits whether its prefix was cached or not below that; the default (32) is back afterwards."""
    ops = quant_kernels()
    if ops is None or decode:
        yield
        return
    ops.set_quant_dense_prefill(True)
    try:
        yield
    finally:
        ops.set_quant_dense_prefill(False)


_KERNEL_DTYPES = (torch.bfloat16, torch.float32)  # what quant_kernels() serves, on a CPU


def quant_kernels_for(device: torch.device, dtype: torch.dtype):
    """quant_kernels() where they serve tensors of dtype on device (bf16 or fp32 on a CPU), else None (torch path)."""
    return quant_kernels() if device.type == "cpu" and dtype in _KERNEL_DTYPES else None


class QuantLinearMethod:
    def __init__(self, method: str):
        self.method = method  # "gguf" | "w8a8_int8"

    # ---- weights
    def create_weights(self, layer: nn.Module) -> None:
        rows, cols = layer.output_size, layer.input_size
        if self.method == "gguf":
            staging = torch.empty(rows, -(-cols // packing.BLOCK) * packing.STAGING_BLOCK_BYTES, dtype=torch.uint8)
        else:
            staging = torch.empty(rows, cols, dtype=torch.float32)
        layer.weight = nn.Parameter(staging, requires_grad=False)
        layer.weight.weight_loader = self._loader(layer)
        layer.quant_format = layer.quant_bits = 0  # set when packed
        layer.register_buffer("qweight", None)
        layer._quant_rows_loaded = 0

    def _loader(self, layer: nn.Module):
        def load(param: nn.Parameter, loaded_weight, shard_id=None) -> None:
            if self.method == "gguf" and loaded_weight.dtype != torch.uint8:
                raise ValueError(f"--quantization gguf: {type(layer).__name__} got a dense tensor; the GGUF "
                                 "iterator must yield the staging form (model_loader/gguf_weights.py)")
            if self.method == "w8a8_int8":
                loaded_weight = loaded_weight.float()
            else:
                loaded_weight = self._match_staging(layer, loaded_weight)
            # layer.weight, not param: _match_staging may have replaced the parameter the caller looked up
            type(layer).weight_loader(layer, layer.weight, loaded_weight, shard_id)
            layer._quant_rows_loaded += loaded_weight.shape[0] if shard_id is not None else param.shape[0]
            if layer._quant_rows_loaded >= layer.output_size:
                self.pack(layer)

        return load

    @staticmethod
    def _match_staging(layer: nn.Module, shard: torch.Tensor) -> torch.Tensor:
        """The shard in the layer's staging form (packing.staging_kind). The first shard sets the form; a shard of
        another form than the rows already loaded makes both wide (exactly)."""
        cols = layer.input_size
        have, kind = packing.staging_kind(layer.weight, cols), packing.staging_kind(shard, cols)
        if have == kind:
            return shard
        loader = layer.weight.weight_loader
        if layer._quant_rows_loaded == 0:
            staging = torch.empty(layer.weight.shape[0], shard.shape[1], dtype=torch.uint8)
        else:
            staging = layer.weight.data if have == packing.WIDE else packing.widen(layer.weight.data, cols)
            shard = shard if kind == packing.WIDE else packing.widen(shard, cols)
        if staging is not layer.weight.data:
            layer.weight = nn.Parameter(staging, requires_grad=False)
            layer.weight.weight_loader = loader
        return shard

    def pack(self, layer: nn.Module) -> None:
        staging = layer.weight.data
        if self.method == "w8a8_int8":
            staging = packing.staging_q8_blocks(staging)
        fmt = packing.staging_format(staging, layer.input_size) if self.method == "gguf" else 8
        layer.qweight = packing.pack(staging, fmt)
        layer.quant_format, layer.quant_bits = fmt, format_bits(fmt)
        del layer.weight
        layer.register_parameter("weight", None)

    # names of the packed buffers and format fields the packed-weights cache holds per layer (model_loader/loader.py):
    # the format code is stored, not inferred from the record size (Q6_K's records are as long as Q8_0's)
    PACKED_BUFFERS = ("qweight", "quant_format")

    def load_packed(self, layer: nn.Module, buffers: Dict[str, torch.Tensor]) -> None:
        """Take an already packed weight (the packed-weights cache) instead of loading shards."""
        packed = buffers["qweight"]
        rows, cols = layer.output_size, layer.input_size
        fmt = int(buffers["quant_format"].item())
        expected = (-(-rows // packing.TILE_ROWS), -(-cols // packing.BLOCK), cpu_record_bytes(fmt))
        if tuple(packed.shape) != expected:
            raise ValueError(f"packed weight {tuple(packed.shape)} of format {fmt} does not fit a [{rows}, {cols}] "
                             f"layer {expected}")
        layer.qweight = packed.clone()
        layer.quant_format, layer.quant_bits = fmt, format_bits(fmt)
        layer._quant_rows_loaded = rows
        del layer.weight
        layer.register_parameter("weight", None)

    def unpacked_reason(self, layer: nn.Module) -> Optional[str]:
        """None once the layer is packed, else what is missing (finalize_quantized_layers)."""
        if layer.qweight is not None:
            return None
        return f"got {layer._quant_rows_loaded} of {layer.output_size} rows from the checkpoint"

    # ---- forward
    def apply(self, layer: nn.Module, x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        packed = layer.qweight
        if packed is None:
            raise RuntimeError(f"{type(layer).__name__} was never packed: its checkpoint tensors did not all load")
        x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])  # a decode step calls this ~4x a layer: no reshape
        # x.is_cpu, not quant_kernels_for's x.device.type: the same test, without building a device object per call
        ops = quant_kernels() if x2.is_cpu and x2.dtype in _KERNEL_DTYPES else None
        if ops is not None:
            out = ops.quant_linear(x2, packed, layer.output_size, layer.quant_format)
            if bias is not None:
                out = out + bias
        else:
            w = packing.unpack_dequantize(packed, layer.quant_format, layer.output_size, layer.input_size, x2.dtype)
            out = F.linear(x2, w.to(x2.device), bias)
        return out if x2 is x else out.reshape(*x.shape[:-1], layer.output_size)

    def apply_gated(self, layer: nn.Module, x: torch.Tensor, act: str) -> Optional[torch.Tensor]:
        """act(gate) * up of a merged [gate | up] layer in one kernel call (quant_linear_gated: the bits of apply, then
        silu_and_mul / gelu_tanh_and_mul), for bf16 rows [M, K] on a CPU with the bf16 kernels; else None (the caller
        runs the two steps)."""
        if not (x.dtype == torch.bfloat16 and x.is_cpu and x.dim() == 2) or layer.qweight is None:
            return None
        ops = get_ops_for_dtype(torch.bfloat16)  # the activation's kernels (level avx512_bf16 and up)
        if ops is None or quant_kernels() is None:
            return None
        return ops.quant_linear_gated(x, layer.qweight, layer.output_size, layer.quant_format, act)


def finalize_quantized_layers(model: nn.Module) -> int:
    """After load_weights: every quantized layer (linear layers, quantized MoE experts: layers/moe/quant_experts.py)
    must be packed. Returns how many are."""
    packed = 0
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is None:
            continue
        reason = method.unpacked_reason(module)
        if reason is not None:
            raise ValueError(f"quantized layer {name} {reason}")
        packed += 1
    return packed
