"""fp8 block checkpoints (DeepSeek-V3 / Qwen3-FP8; transformers' FineGrainedFP8): reading their tensors.

config.json's quantization_config {quant_method: fp8, weight_block_size: [bn, bk], fmt: e4m3, activation_scheme:
dynamic} says every converted linear weight is stored as
    X.weight            float8_e4m3fn [rows, cols]
    X.weight_scale_inv  fp32 [ceil(rows / bn), ceil(cols / bk)]
and its value is weight[r, c] = float(X.weight[r, c]) * X.weight_scale_inv[r // bn, c // bk] (the name says
"inverse" because the quantizer divided by it). Modules named by modules_to_not_convert are stored dense.

Where no fp8 GEMM serves a weight (every CPU start; MoE experts) the pair is dequantized ONCE, as it is read, to the
model dtype: the product in fp32, one rounding. dequantized_fp8_weights wraps the checkpoint iterator and yields
`X.weight` dense in place of the pair, so every model's load_weights and every layer's weight_loader stay as they
are; with TP ranks a pair comes as an Fp8BlockSlice that reads (and dequantizes) only the rows / columns a rank's
loader narrows to. Where an fp8 GEMM serves a layer (fp8_block_linear.py, the GPU), `keep_fp8(name)` says so and
the pair is yielded as stored.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, Tuple, Union

import torch

from sglang.srt.layers.quantization.fp8_block_config import Fp8BlockFormat
from sglang.srt.mem_plan.checkpoint_modules import hf_not_converted, module_of
from sglang.srt.model_loader.weight_utils import CheckpointSlice

SCALE_SUFFIX = "_scale_inv"  # X.weight -> X.weight_scale_inv
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448


def _expand_scales(scale: torch.Tensor, fmt: Fp8BlockFormat, row0: int, col0: int, rows: int, cols: int):
    """The per-weight fp32 scales of the region [row0, row0 + rows) x [col0, col0 + cols); scale holds the block
    rows / columns from row0 // bn and col0 // bk on."""
    s = scale.float().repeat_interleave(fmt.block_n, 0).repeat_interleave(fmt.block_k, 1)
    r, c = row0 % fmt.block_n, col0 % fmt.block_k
    return s[r : r + rows, c : c + cols]


def dequantize_fp8_block(weight: torch.Tensor, scale: torch.Tensor, fmt: Fp8BlockFormat, dtype: torch.dtype,
                         row0: int = 0, col0: int = 0) -> torch.Tensor:
    """weight (fp8 [rows, cols], at row0 / col0 of its checkpoint tensor) times its block scales, in fp32, rounded
    once to dtype."""
    rows, cols = weight.shape
    want = (-(-(row0 % fmt.block_n + rows) // fmt.block_n), -(-(col0 % fmt.block_k + cols) // fmt.block_k))
    if tuple(scale.shape) != want:
        raise ValueError(f"fp8 block scales {tuple(scale.shape)} do not cover a [{rows}, {cols}] weight in "
                         f"[{fmt.block_n}, {fmt.block_k}] blocks (expected {want})")
    return (weight.float() * _expand_scales(scale, fmt, row0, col0, rows, cols)).to(dtype)


class Fp8BlockSlice:
    """An fp8 weight and its scales not read yet (TP ranks), read as the dense tensor it stands for: `narrow` reads
    only the fp8 rows / columns asked for and the scale blocks covering them (CheckpointSlice's interface)."""

    def __init__(self, weight: CheckpointSlice, scale: Union[CheckpointSlice, torch.Tensor], fmt: Fp8BlockFormat,
                 dtype: torch.dtype):
        self.weight, self.scale, self.fmt, self.dtype = weight, scale, fmt, dtype
        self.shape = weight.shape

    def dim(self) -> int:
        return len(self.shape)

    def _scales(self, rows: slice, cols: slice) -> torch.Tensor:
        s = self.scale
        return s[rows, cols] if isinstance(s, torch.Tensor) else s[(rows, cols)]

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        weight = self.weight.narrow(dim, start, length)
        block = self.fmt.block_n if dim == 0 else self.fmt.block_k
        blocks = slice(start // block, -(-(start + length) // block))
        scale = self._scales(blocks, slice(None)) if dim == 0 else self._scales(slice(None), blocks)
        row0, col0 = (start, 0) if dim == 0 else (0, start)
        return dequantize_fp8_block(weight, scale, self.fmt, self.dtype, row0, col0)

    def materialize(self) -> torch.Tensor:
        return self.narrow(0, 0, self.shape[0])

    def __getitem__(self, index) -> torch.Tensor:
        return self.materialize()[index]


def _read(t) -> torch.Tensor:
    return t.materialize() if isinstance(t, CheckpointSlice) else t


def is_fp8_tensor(t) -> bool:
    if isinstance(t, CheckpointSlice):  # one element read tells the stored dtype
        t = t[tuple(slice(0, 1) for _ in range(t.dim()))]
    return t.dtype == FP8_DTYPE


def _dequantized(weight, scale, fmt: Fp8BlockFormat, dtype: torch.dtype):
    if isinstance(weight, CheckpointSlice):
        return Fp8BlockSlice(weight, scale, fmt, dtype)
    return dequantize_fp8_block(weight, _read(scale), fmt, dtype)


def dequantized_fp8_weights(weights: Iterable[Tuple[str, object]], fmt: Fp8BlockFormat, dtype: torch.dtype,
                            keep_fp8: Callable[[str], bool] = lambda name: False) -> Iterator[Tuple[str, object]]:
    """The checkpoint's (name, tensor) pairs with every fp8 weight and its scales folded into one dense `X.weight`
    of dtype (module docstring); names keep_fp8 accepts pass as stored. A weight and its scales may come in any
    order (and from different shards); ValueError for an fp8 weight without scales, scales without a weight, or an
    fp8 weight of a module the config leaves unconverted."""
    weights_waiting, scales_waiting = {}, {}
    for name, tensor in weights:
        if name.endswith(SCALE_SUFFIX):
            base = name[: -len(SCALE_SUFFIX)]
            if keep_fp8(base):
                yield name, tensor
            elif base in weights_waiting:
                yield base, _dequantized(weights_waiting.pop(base), tensor, fmt, dtype)
            else:
                scales_waiting[base] = tensor
            continue
        if not is_fp8_tensor(tensor):
            yield name, tensor
            continue
        if hf_not_converted(module_of(name), fmt.not_converted):
            raise ValueError(f"checkpoint tensor {name} is fp8, and quantization_config.modules_to_not_convert "
                             f"{list(fmt.not_converted)} says its module is stored dense: the checkpoint and its "
                             "config disagree.")
        if keep_fp8(name):
            yield name, tensor
        elif name in scales_waiting:
            yield name, _dequantized(tensor, scales_waiting.pop(name), fmt, dtype)
        else:
            weights_waiting[name] = tensor
    if weights_waiting:
        name = next(iter(weights_waiting))
        raise ValueError(f"fp8 checkpoint tensor {name} has no weight{SCALE_SUFFIX} ({name}{SCALE_SUFFIX}); the "
                         "checkpoint is incomplete.")
    if scales_waiting:
        raise ValueError(f"checkpoint tensor {next(iter(scales_waiting))}{SCALE_SUFFIX} has no fp8 weight "
                         f"{next(iter(scales_waiting))}; the checkpoint is incomplete.")

