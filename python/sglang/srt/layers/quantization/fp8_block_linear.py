"""Fp8BlockLinearMethod: an fp8 block checkpoint's linear layer held as stored and served by the block-fp8 GEMM
(--quantization fp8, resolved for an fp8 block checkpoint on a GPU: layers/quantization.resolve_quantization).

The layer holds what the checkpoint stores for its rows (what `sglang plan` charges: mem_plan/checkpoint_formats.py)
    weight            float8_e4m3fn [rows, cols]
    weight_scale_inv  fp32 [ceil(rows / bn), ceil(cols / bk)]
Both fill through the layer's own sharding: the weight by its weight_loader (q/k/v, gate/up row ranges, a rank's
rows or columns), the scales by the same ranges in block units. A range that does not start on a block boundary
(a merged gate/up of 320 rows each in 128-row blocks, a rank's split inside a block) cannot share the checkpoint's
scale rows, and is refused naming it. A layer modules_to_not_convert names is made dense (the model dtype) before
loading (keep_dense_layers).
Forward: fp8_block_gemm.block_fp8_linear on a GPU (and under the Triton interpreter); elsewhere (a CPU build that is
not interpreted) the weight is dequantized for the call.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.layers.quantization.fp8_block import FP8_DTYPE, SCALE_SUFFIX, dequantize_fp8_block, is_fp8_tensor
from sglang.srt.layers.quantization.fp8_block_config import Fp8BlockFormat
from sglang.srt.mem_plan.checkpoint_modules import hf_not_converted, module_of
from sglang.srt.mem_plan.quantization_sizes import MERGED_PROJECTIONS


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Fp8BlockLinearMethod:
    PACKED_BUFFERS = ()  # nothing for the GGUF packed-weights cache

    def __init__(self, block: tuple):
        self.fmt = Fp8BlockFormat(int(block[0]), int(block[1]))

    def create_weights(self, layer: nn.Module) -> None:
        rows, cols, bn, bk = layer.output_size, layer.input_size, self.fmt.block_n, self.fmt.block_k
        layer.dense_dtype = torch.get_default_dtype()  # the model dtype, for a layer the checkpoint stores dense
        layer.weight = nn.Parameter(torch.empty(rows, cols, dtype=FP8_DTYPE), requires_grad=False)
        layer.weight.weight_loader = self._weight_loader(layer)
        layer.weight_scale_inv = nn.Parameter(torch.empty(_cdiv(rows, bn), _cdiv(cols, bk), dtype=torch.float32),
                                              requires_grad=False)
        layer.weight_scale_inv.weight_loader = self._scale_loader(layer)
        layer.fp8_rows_loaded = 0

    def _weight_loader(self, layer: nn.Module):
        def load(param, loaded, shard_id=None) -> None:
            if is_fp8_tensor(loaded) != (layer.weight.dtype == FP8_DTYPE):
                raise ValueError(f"{type(layer).__name__} shard {shard_id}: the checkpoint tensor is "
                                 f"{'fp8' if is_fp8_tensor(loaded) else 'dense'}, the layer {layer.weight.dtype}: "
                                 "quantization_config.modules_to_not_convert must name exactly the modules stored "
                                 "dense")
            type(layer).weight_loader(layer, layer.weight, loaded, shard_id)
            layer.fp8_rows_loaded += loaded.shape[0] if shard_id is not None else layer.output_size

        return load

    @staticmethod
    def make_dense(layer: nn.Module) -> None:
        """A layer the checkpoint stores dense (modules_to_not_convert): the model dtype's weight, no scales."""
        loader = layer.weight.weight_loader
        layer.weight = nn.Parameter(torch.empty(layer.output_size, layer.input_size, dtype=layer.dense_dtype,
                                                device=layer.weight.device), requires_grad=False)
        layer.weight.weight_loader = loader
        del layer.weight_scale_inv
        layer.weight_scale_inv = None

    def _scale_loader(self, layer: nn.Module):
        def load(param, loaded, shard_id=None) -> None:
            dst_row, rows, src_row, dim, src_col = _shard_rows(layer, shard_id)
            bn, bk = self.fmt.block_n, self.fmt.block_k
            for what, value, block in (("row", dst_row, bn), ("row", src_row, bn), ("column", src_col, bk)):
                if value % block:
                    raise ValueError(f"{type(layer).__name__} shard {shard_id}: its {what} {value} is inside an fp8 "
                                     f"block of {block}, so it cannot take the checkpoint's block scales; serve the "
                                     "checkpoint dequantized (--quantization none) or with fewer --tp-size ranks.")
            if dim == 1:
                loaded = loaded.narrow(1, src_col // bk, param.shape[1])
            else:
                loaded = loaded.narrow(0, src_row // bn, _cdiv(rows, bn))
            param.data[dst_row // bn : dst_row // bn + loaded.shape[0]].copy_(loaded)

        return load

    def unpacked_reason(self, layer: nn.Module) -> Optional[str]:
        if layer.fp8_rows_loaded >= layer.output_size or layer.weight_scale_inv is None:
            return None
        return f"got {layer.fp8_rows_loaded} of {layer.output_size} rows from the checkpoint"

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if layer.weight_scale_inv is None:  # stored dense (modules_to_not_convert)
            out = F.linear(x2, layer.weight, bias)
        elif x2.is_cuda or _interpreted():
            from sglang.srt.layers.quantization.fp8_block_gemm import block_fp8_linear

            out = block_fp8_linear(x2, layer.weight, layer.weight_scale_inv, (self.fmt.block_n, self.fmt.block_k))
            out = out if bias is None else out + bias
        else:
            w = dequantize_fp8_block(layer.weight, layer.weight_scale_inv, self.fmt, x2.dtype)
            out = F.linear(x2, w, bias)
        return out.reshape(*shape[:-1], layer.output_size)


def _interpreted() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _shard_rows(layer: nn.Module, shard_id):
    """(first row of the shard in the layer, its rows, first row read from the checkpoint tensor, the sharded dim,
    first column read) of a checkpoint tensor loaded by the layer's weight_loader (layers/linear.py's ranges)."""
    rank = layer.tp_rank
    if hasattr(layer, "q_size") and shard_id is not None:  # QKVParallelLinear
        if shard_id == "q":
            return 0, layer.q_size, rank * layer.q_size, 0, 0
        offset = layer.q_size if shard_id == "k" else layer.q_size + layer.kv_size
        return offset, layer.kv_size, layer.kv_head_index * layer.head_size, 0, 0
    if hasattr(layer, "output_sizes") and shard_id is not None:  # MergedColumnParallelLinear
        size = layer.output_sizes[shard_id]
        return sum(layer.output_sizes[:shard_id]), size, rank * size, 0, 0
    if hasattr(layer, "reduce_results"):  # RowParallelLinear: this rank's input columns
        return 0, layer.output_size, 0, 1, rank * layer.input_size
    return 0, layer.output_size, 0, 0, 0


_SPLIT_PROJECTIONS = {}
for _hf, _merged in MERGED_PROJECTIONS.items():
    _SPLIT_PROJECTIONS.setdefault(_merged, []).append(_hf)


def keep_dense_layers(model: nn.Module, fmt: Fp8BlockFormat) -> int:
    """Make dense every fp8 layer whose checkpoint module (a merged layer: any of its parts) modules_to_not_convert
    names; returns how many."""
    count = 0
    for name, m in model.named_modules():
        if not isinstance(getattr(m, "quant_method", None), Fp8BlockLinearMethod):
            continue
        parent, _, proj = name.rpartition(".")
        names = [f"{parent}.{p}" for p in _SPLIT_PROJECTIONS.get(proj, ())] or [name]
        if any(hf_not_converted(n, fmt.not_converted) for n in names):
            m.quant_method.make_dense(m)
            count += 1
    return count


def fp8_kept_names(model: nn.Module, quantization: str) -> Callable[[str], bool]:
    """Which checkpoint tensors stay fp8 (X.weight and X.weight_scale_inv): those of the layers this method serves
    (quantization 'fp8'); every other fp8 tensor (MoE experts, ...) is dequantized at load (fp8_block.py)."""
    if quantization != "fp8":
        return lambda name: False
    served = {name for name, m in model.named_modules() if isinstance(getattr(m, "quant_method", None),
                                                                       Fp8BlockLinearMethod)
              and m.weight_scale_inv is not None}

    def kept(name: str) -> bool:
        module = module_of(name[: -len(SCALE_SUFFIX)] if name.endswith(SCALE_SUFFIX) else name)
        parent, _, proj = module.rpartition(".")
        merged = MERGED_PROJECTIONS.get(proj)
        return module in served or (merged is not None and f"{parent}.{merged}" in served)

    return kept
