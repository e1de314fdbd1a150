"""The quantized KV pool: fp8 with per-(layer, KV head) scales, int8, int4 and int2_hadamard (mem_plan/kv_quant.py).

One buffer per field of the format, [layer_num, size + page_size, head_num, elems] (codes and per-token scales), and
for fp8 the fixed scales [layer_num, head_num] fp32 -- exactly the fields and bytes the plan charges (kv_quant.py,
specs.KVCellSpec). K/V are quantized on write (set_kv_buffer); readers dequantize only the rows they gather
(gather_kv), never a copy of the pool. Slots [0, page_size) are the dummy page (zero codes and scales: reads of it
are finite).

fp8 scales: 1.0 until calibrate_scales() sets scale = amax x FP8_SCALE_HEADROOM / fp8 max per (layer, KV head) from
the amax the pool recorded while `calibrating` (the model runner's startup calibration forward,
model_runner_kv_cache_mixin.calibrate_kv_scales). get_key_buffer / get_value_buffer give the raw fp8 view for the
GPU backends, which take the pool with unit scales (they do not read scales; the runner only calibrates for
torch_native).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from sglang.srt.mem_cache import kv_quant_codec as codec
from sglang.srt.mem_cache.memory_pool import KVCache
from sglang.srt.mem_plan.dtypes import torch_dtype
from sglang.srt.mem_plan.kv_quant import FP8_FORMATS, FP8_SCALE_HEADROOM, fixed_fields, token_fields
from sglang.srt.mem_plan.sizes import kv_pool_rows


class QuantizedKVPool(KVCache):
    def __init__(self, size: int, page_size: int, kv_format: str, compute_dtype: torch.dtype, head_num: int,
                 head_dim: int, layer_num: int, device: str = "cpu", v_head_dim: Optional[int] = None):
        self.size = size
        self.page_size = page_size
        self.kv_format = kv_format
        self.compute_dtype = compute_dtype  # what attention reads K/V in
        self.is_fp8 = kv_format in FP8_FORMATS
        self.dtype = codec.FP8_TORCH[kv_format] if self.is_fp8 else compute_dtype
        self.store_dtype = torch.uint8
        self.head_num = head_num
        self.head_dim = head_dim
        self.v_head_dim = v_head_dim or head_dim
        self.layer_num = layer_num
        self.device = device
        rows = kv_pool_rows(size, page_size)
        self.fields: Dict[str, torch.Tensor] = {}
        for f in token_fields(kv_format, head_dim, self.v_head_dim):
            buf = torch.empty((layer_num, rows, head_num, f.elems), dtype=torch_dtype(f.dtype), device=device)
            buf[:, :page_size].zero_()  # the dummy page; the rest is written before it is read
            self.fields[f.name] = buf
        self.fixed: Dict[str, torch.Tensor] = {
            f.name: torch.ones((layer_num, head_num), dtype=torch_dtype(f.dtype), device=device)
            for f in fixed_fields(kv_format)}
        self.k_buffer, self.v_buffer = self.fields["k"], self.fields["v"]
        self.calibrating = False
        self.calibration_amax: Dict[str, torch.Tensor] = {}
        self.scales_source = "unit (1.0)" if self.is_fp8 else "per token"

    # ------------------------------------------------------------------ sizes
    def mem_usage_bytes(self) -> int:
        """Every buffer, the dummy page and the fixed scales included (= the plan's kv_cache term)."""
        bufs = list(self.fields.values()) + list(self.fixed.values())
        return sum(t.numel() * t.element_size() for t in bufs)

    # ------------------------------------------------------------------ raw views (GPU backends, fp8 only)
    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        if not self.is_fp8:
            raise NotImplementedError(f"--kv-cache-dtype {self.kv_format}: read K/V through gather_kv")
        return self.k_buffer[layer_id].view(self.dtype)

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        if not self.is_fp8:
            raise NotImplementedError(f"--kv-cache-dtype {self.kv_format}: read K/V through gather_kv")
        return self.v_buffer[layer_id].view(self.dtype)

    # ------------------------------------------------------------------ write
    def _scale(self, part: str, layer_id: int) -> Optional[torch.Tensor]:
        return self.fixed[part + "_scale"][layer_id] if self.is_fp8 else None

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k: [N, head_num, head_dim], v: [N, head_num, v_head_dim] -> quantized into the slots loc."""
        for part, x in (("k", k), ("v", v)):
            if self.calibrating:
                amax = x.detach().float().abs().amax(dim=(0, 2))  # [head_num]
                key = f"{part}{layer_id}"
                prev = self.calibration_amax.get(key)
                self.calibration_amax[key] = amax if prev is None else torch.maximum(prev, amax)
            for name, value in codec.quantize(self.kv_format, x, part, self._scale(part, layer_id)).items():
                self.fields[name][layer_id].index_copy_(0, loc, value)

    # ------------------------------------------------------------------ read
    def rotation(self, part: str) -> Optional[torch.Tensor]:
        """R [D, D] fp32 when `part` is stored in a rotated basis (gather_kv(rotated=True) returns x @ R)."""
        if not codec.is_rotated(self.kv_format, part):
            return None
        return codec.rotation(self.head_dim if part == "k" else self.v_head_dim, self.device)

    def gather_kv(self, layer_id: int, index: torch.Tensor, dtype: torch.dtype,
                  rotated: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
        """The dequantized K [n, head_num, head_dim] and V [n, head_num, v_head_dim] of the slots `index` only."""
        out = []
        for part, dim in (("k", self.head_dim), ("v", self.v_head_dim)):
            got = {name: buf[layer_id].index_select(0, index) for name, buf in self.fields.items()
                   if name in (part, part + "_scale")}
            out.append(codec.dequantize(self.kv_format, got, part, dtype, self._scale(part, layer_id), rotated, dim))
        return out[0], out[1]

    # ------------------------------------------------------------------ fp8 scales
    def calibrate_scales(self, source: str) -> None:
        """fp8: scale = recorded amax x headroom / fp8 max per (layer, KV head); then stop recording."""
        self.calibrating = False
        if not self.is_fp8 or not self.calibration_amax:
            return
        fmax = torch.finfo(self.dtype).max
        for part in ("k", "v"):
            for layer_id in range(self.layer_num):
                amax = self.calibration_amax.get(f"{part}{layer_id}")
                if amax is not None:
                    scale = torch.clamp(amax * FP8_SCALE_HEADROOM / fmax, min=1e-8)
                    self.fixed[part + "_scale"][layer_id].copy_(scale)
        self.calibration_amax = {}
        self.scales_source = source

    def load_scales(self, k_scale: torch.Tensor, v_scale: torch.Tensor, source: str) -> None:
        """fp8 scales given per layer [layer_num] or per (layer, KV head) [layer_num, head_num] (a checkpoint's)."""
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            s = s.to(torch.float32).reshape(self.layer_num, -1).expand(self.layer_num, self.head_num)
            self.fixed[name].copy_(s)
        self.scales_source = source

    def scale_info(self) -> dict:
        info = {"kv_format": self.kv_format, "scales": self.scales_source}
        if self.is_fp8:
            info["k_scale_range"] = [float(self.fixed["k_scale"].min()), float(self.fixed["k_scale"].max())]
            info["v_scale_range"] = [float(self.fixed["v_scale"].min()), float(self.fixed["v_scale"].max())]
        return info


def create_kv_pool(kv_format: str, size: int, page_size: int, compute_dtype: torch.dtype, head_num: int,
                   head_dim: int, layer_num: int, device: str = "cpu", v_head_dim: Optional[int] = None) -> KVCache:
    """The pool for a --kv-cache-dtype format name (mem_plan/dtypes.resolve_kv_cache_dtype): the quantized pool for
    fp8 and the int formats, MHATokenToKVPool for a plain dtype."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_plan.kv_quant import is_quantized

    if is_quantized(kv_format):
        return QuantizedKVPool(size, page_size, kv_format, compute_dtype, head_num, head_dim, layer_num, device,
                               v_head_dim)
    return MHATokenToKVPool(size, page_size, torch_dtype(kv_format), head_num, head_dim, layer_num, device, v_head_dim)
