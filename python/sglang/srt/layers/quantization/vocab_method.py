"""QuantVocabMethod: a vocabulary table [vocab, hidden] held as packed GGUF blocks (--quantization gguf).

A batch-1 decode step reads the whole lm_head, so its bytes count as much as a layer's: the GGUF file's own blocks
of it (Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0: the fp16 header's formats; mem_plan/quantization_sizes.gguf_packed_vocab
names the table) are loaded into the packed layout of the quantized linear layers (packing.py) and the logits are
the quant_linear kernel's, as for those layers. Where the embedding is tied to the lm_head (SmolLM2) the one packed
table serves both: the embedding lookup dequantizes only the looked-up rows from their blocks, each value d * u + c
computed in fp32 exactly as packing.unpack_dequantize does, then cast to the model dtype; no dense copy is kept. The
kernels do it in one call (quant_embedding, sgl-kernel/csrc/cpu/quant_embedding.h: bf16 or fp32); dequantize_rows is
the torch form (other dtypes, no kernels), which gathers the rows' bytes from the packed records.

Loading, the packed-weights cache and the unpacked check are QuantLinearMethod's (the table is one [vocab, hidden]
weight whose rows come in one tensor); the layer carries output_size = vocab rows and input_size = hidden.
Without the kernels (SGLANG_CPU_KERNELS=0, other CPUs) the logits dequantize the table per call, in slices of
TORCH_PATH_ROWS rows so the temporaries stay a few MiB.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.layers.quantization import packing
from sglang.srt.layers.quantization.linear_method import QuantLinearMethod, quant_kernels_for

# The torch path's embedding lookup dequantizes a few tokens at a time, each pass's tensors under torch's parallel grain
# (at::internal::GRAIN_SIZE elements), so its ~10 small operators run on the calling thread: on a busy 2-core
# machine an OpenMP hand-off waits for a descheduled thread (measured: 128 tokens in one pass 46-56 ms with 2
# threads there, 0.4 ms with 1).
TORCH_GRAIN_ELEMENTS = 32768
TORCH_PATH_ROWS = 1024  # vocabulary rows dequantized at a time by the torch path's logits (a multiple of 16)

_HEADER = 2 * packing.TILE_ROWS * 2  # fp16 d then fp16 c of each of the record's 16 rows
_GROUP_BYTES = packing.TILE_ROWS * 4  # a group: 4 bytes of each of the 16 rows


def _row_byte_offsets(bits: int) -> torch.Tensor:
    """int64 [16, 4 + bytes of u]: where row i of a record keeps its d (2 bytes), c (2) and its u bytes, in the order
    of its weights (8-bit: weight k in byte k; 4-bit: weights k and k + 16 in the low and high nibble of byte k)."""
    groups = packing.BLOCK * bits // 8 // 4
    arange = lambda n: torch.arange(n, device="cpu")  # noqa: E731 (first imported inside build_model's device)
    rows = arange(packing.TILE_ROWS)[:, None]
    d = 2 * rows + arange(2)
    c = _HEADER // 2 + d
    u = _HEADER + (arange(groups)[:, None] * _GROUP_BYTES + arange(4)).reshape(1, -1) + 4 * rows
    return torch.cat([d, c, u], dim=1)


_OFFSETS = {bits: _row_byte_offsets(bits) for bits in (4, 8)}


def dequantize_rows(packed: torch.Tensor, bits: int, ids: torch.Tensor, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows `ids` [N] of a packed [rows, cols] weight, dequantized: [N, cols] of dtype, equal to
    unpack_dequantize(packed, ...)[ids] (the same fp32 d * u + c) without dequantizing the other rows."""
    tiles, blocks, _ = packed.shape
    ids = ids.reshape(-1).to(torch.int64)
    offsets = _OFFSETS[bits].to(packed.device)[ids % packing.TILE_ROWS]  # [N, 4 + u bytes]
    recs = packed[(ids // packing.TILE_ROWS)[:, None, None], torch.arange(blocks, device=packed.device)[None, :, None],
                  offsets[:, None, :]]  # [N, blocks, 4 + u bytes]: the rows' own bytes only
    d = recs[..., 0:2].contiguous().view(torch.float16).float()  # [N, blocks, 1]
    c = recs[..., 2:4].contiguous().view(torch.float16).float()
    u = recs[..., 4:]
    if bits == 4:
        u = torch.cat([u & 0x0F, u >> 4], dim=-1)
    w = u.float() * d + c  # [N, blocks, 32]
    return w.reshape(ids.shape[0], blocks * packing.BLOCK)[:, :cols].to(dtype)


class QuantVocabMethod(QuantLinearMethod):
    def __init__(self):
        super().__init__("gguf")

    def create_weights(self, layer: nn.Module) -> None:
        layer.dtype = torch.get_default_dtype()  # what the embedding lookup returns (the model dtype)
        super().create_weights(layer)

    def _loader(self, layer: nn.Module):
        def load(param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
            if loaded_weight.dtype != torch.uint8 or loaded_weight.shape != param.shape:
                raise ValueError(f"--quantization gguf: the packed vocabulary table of {type(layer).__name__} takes "
                                 f"the staging form {tuple(param.shape)} uint8 (model_loader/gguf_weights.py), got "
                                 f"{tuple(loaded_weight.shape)} {loaded_weight.dtype}")
            with torch.no_grad():
                param.copy_(loaded_weight)
            layer._quant_rows_loaded = layer.output_size
            self.pack(layer)

        return load

    # ---- forward
    def embedding(self, layer: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [N] -> [N, hidden] of the model dtype: the looked-up rows dequantized from the packed table."""
        packed = self._packed(layer)
        ops = quant_kernels_for(packed.device, layer.dtype)
        if ops is not None:
            return ops.quant_embedding(input_ids, packed, layer.output_size, layer.input_size, layer.quant_format,
                                       out_fp32=layer.dtype == torch.float32)
        out = torch.empty(input_ids.shape[0], layer.input_size, dtype=layer.dtype, device=packed.device)
        step = max(1, TORCH_GRAIN_ELEMENTS // (packed.shape[1] * (packing.STAGING_BLOCK_BYTES)))
        for i in range(0, input_ids.shape[0], step):
            ids = input_ids[i : i + step]
            out[i : i + ids.shape[0]] = dequantize_rows(packed, layer.quant_bits, ids, layer.input_size, layer.dtype)
        return out

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x [M, hidden] -> logits [M, vocab] in fp32 (the lm_head): the kernel's fp32 sums as they are, not rounded
        to a bf16 x's dtype and widened again (for a decode batch of 32 on the Gemma 3 262k vocabulary that second pass
        over the logits cost ~7 ms a step); the torch path multiplies the fp32 table with x in fp32."""
        packed = self._packed(layer)
        ops = quant_kernels_for(x.device, x.dtype)
        if ops is not None:
            return ops.quant_linear(x.contiguous(), packed, layer.output_size, layer.quant_format, out_fp32=True,
                                     head=True)
        rows, tiles_per_pass = layer.output_size, TORCH_PATH_ROWS // packing.TILE_ROWS
        out = torch.empty(x.shape[0], rows, dtype=torch.float32, device=x.device)
        xf = x.float()
        for t0 in range(0, packed.shape[0], tiles_per_pass):
            r0 = t0 * packing.TILE_ROWS
            n = min(rows - r0, TORCH_PATH_ROWS)
            w = packing.unpack_dequantize(packed[t0 : t0 + tiles_per_pass], layer.quant_format, n, layer.input_size,
                                          torch.float32)
            out[:, r0 : r0 + n] = F.linear(xf, w.to(x.device))
        return out

    def argmax(self, layer: nn.Module, x: torch.Tensor) -> Optional[torch.Tensor]:
        """x [M, hidden] -> int64 [M]: each row's first maximum of apply(layer, x) (a NaN counting as the maximum),
        by the kernel that never writes the logits (quant_linear_argmax.h); None without the kernels."""
        ops = quant_kernels_for(x.device, x.dtype)
        if ops is None:
            return None
        return ops.quant_linear_argmax(x.contiguous(), self._packed(layer), layer.output_size, layer.quant_format)

    @staticmethod
    def _packed(layer: nn.Module) -> torch.Tensor:
        if layer.qweight is None:
            raise RuntimeError(f"{type(layer).__name__}: the packed vocabulary table never loaded")
        return layer.qweight
