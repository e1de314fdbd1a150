"""The quantized KV pool: fp8 with per-(layer, KV head) scales, int8, int4 and int2_hadamard (mem_plan/kv_quant.py).

One buffer per field of the format, [layer_num, size + page_size, head_num, elems] (codes and per-token scales), and
for fp8 the fixed scales [layer_num, head_num] fp32 -- exactly the fields and bytes the plan charges (kv_quant.py,
specs.KVCellSpec). K/V are quantized on write (set_kv_buffer); readers dequantize only the rows they gather
(gather_kv), never a copy of the pool. Slots [0, page_size) are the dummy page (zero codes and scales: reads of it
are finite).

Parts stored turned by the codec's fixed rotation R (x @ R: fp8 and int8 keys, int4 and int2_hadamard keys and values,
`turned_parts`; plain fp8 keys where the scales are a checkpoint's) are read in that basis by the kernels, which turn
the query once (and the output back for values); `rotation(part)` gives R or None.

int4's fixed field is the per-(layer, KV head) key channel multiplier k_smooth [layer_num, head_num, d] fp32, 1.0
until calibrate_scales() sets it from the key and query channel energies the same startup forward recorded (the
queries through record_query, which the calibration wraps around the attention backend; kv_quant_codec).

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
from sglang.srt.mem_cache.recent_window import RecentWindow
from sglang.srt.mem_plan.kv_quant import (FP8_FORMATS, FP8_SCALE_HEADROOM, INT4_KEY_SMOOTH_EXPONENT, fixed_fields,
                                          recent_window, rotated_parts, sink_tokens, token_fields)
from sglang.srt.mem_plan.sizes import kv_pool_rows


class QuantizedKVPool(KVCache):
    def __init__(self, size: int, page_size: int, kv_format: str, compute_dtype: torch.dtype, head_num: int,
                 head_dim: int, layer_num: int, device: str = "cpu", v_head_dim: Optional[int] = None,
                 window_rows: int = 0, window_req_rows: Optional[int] = None):
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
        # fp8 scales [layers, heads] and int4's key multipliers [layers, heads, d] start at 1.0 (until calibrated)
        self.fixed: Dict[str, torch.Tensor] = {
            f.name: torch.ones((layer_num, head_num) + ((f.elems,) if f.elems > 1 else ()), dtype=torch_dtype(f.dtype),
                               device=device)
            for f in fixed_fields(kv_format, head_dim, self.v_head_dim)}
        self.needs_calibration = self.is_fp8 or "k_smooth" in self.fixed
        # the parts the format would store turned that this pool stores plain: fp8 keys with a checkpoint's scales
        # (load_scales(keys_turned=False): those scales were measured on plain keys)
        self.plain_parts: set = set()
        self.k_buffer, self.v_buffer = self.fields["k"], self.fields["v"]
        self.calibrating = False
        self.calibration_amax: Dict[str, torch.Tensor] = {}
        self.scales_source = ("unit (1.0)" if self.is_fp8 else "per token, key multipliers 1.0 (not calibrated)"
                              if "k_smooth" in self.fixed else "per token")
        # the recent window (kv_quant.RECENT_WINDOW_TOKENS) and the attention sinks (SINK_TOKENS): window_rows ring
        # rows, handed to the running requests of window_req_rows request slots (mem_plan/kv_window.py; None: a ring
        # per request slot, window_rows of them)
        self.window = RecentWindow(window_rows, recent_window(kv_format), layer_num, head_num, head_dim,
                                   self.v_head_dim, device, sink_tokens(kv_format), window_req_rows) \
            if window_rows and recent_window(kv_format) else None

    @property
    def turned_parts(self) -> set:
        """The parts the codec stores turned (x @ R) and reads in that basis: the format's
        (kv_quant_codec.ROTATED_PARTS) less plain_parts."""
        return set(codec.ROTATED_PARTS.get(self.kv_format, ())) - self.plain_parts

    def key_turn(self, layer_id: int) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """(R, w) the stored keys of a layer were turned by, for a kernel that attends them as stored: int4's are
        (k * w) @ R always (the codec reads them back plain, so rotation("k") is None for it), int8 / fp8's k @ R
        unless plain; (None, None) for plain keys."""
        if self.kv_format == "int4":
            return codec.rotation(self.head_dim, self.device), self.fixed["k_smooth"][layer_id]
        return self.rotation("k"), None

    def stored_basis(self, layer_id: int, part: str, x: torch.Tensor) -> torch.Tensor:
        """Rows x [N, H, D] -> fp32 in the basis the part's codes are stored in (the kernels' basis: int4 keys
        (x * w) @ R, other turned parts x @ R, plain ones x): a forward's own new K/V, which the kernels attend as
        computed instead of reading their codes back."""
        x = x.float()
        if part == "k":
            turn, smooth = self.key_turn(layer_id)
            x = x if smooth is None else x * smooth[None]
        else:
            turn = self.rotation("v")
        return (x if turn is None else x @ turn).contiguous()

    def plain_basis(self, layer_id: int, part: str, x: torch.Tensor) -> torch.Tensor:
        """stored_basis undone: rows in the stored basis -> the plain fp32 rows (x @ R^T, int4 keys then / w)."""
        x = x.float()
        if part == "k":
            turn, smooth = self.key_turn(layer_id)
        else:
            turn, smooth = self.rotation("v"), None
        x = x if turn is None else x @ turn.T
        return x if smooth is None else x / smooth[None]

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

    def _smooth(self, part: str, layer_id: int) -> Optional[torch.Tensor]:
        w = self.fixed.get(part + "_smooth")
        return None if w is None else w[layer_id]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k: [N, head_num, head_dim], v: [N, head_num, v_head_dim] -> quantized into the slots loc."""
        for part, x in (("k", k), ("v", v)):
            if self.calibrating:
                self._record(part, layer_id, x.detach().float())
            fields = codec.quantize(self.kv_format, x, part, self._scale(part, layer_id), self._smooth(part, layer_id),
                                    part in self.turned_parts)
            for name, value in fields.items():
                self.fields[name][layer_id].index_copy_(0, loc, value)

    # ------------------------------------------------------------------ read
    def rotation(self, part: str) -> Optional[torch.Tensor]:
        """R [D, D] fp32 when `part` is stored in a rotated basis (gather_kv(rotated=True) returns x @ R)."""
        if part not in self.turned_parts:
            return None
        return codec.rotation(self.head_dim if part == "k" else self.v_head_dim, self.device)

    def gather_kv(self, layer_id: int, index: torch.Tensor, dtype: torch.dtype,
                  rotated: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
        """The dequantized K [n, head_num, head_dim] and V [n, head_num, v_head_dim] of the slots `index` only."""
        out = []
        for part, dim in (("k", self.head_dim), ("v", self.v_head_dim)):
            got = {name: buf[layer_id].index_select(0, index) for name, buf in self.fields.items()
                   if name in (part, part + "_scale")}
            out.append(codec.dequantize(self.kv_format, got, part, dtype, self._scale(part, layer_id), rotated, dim,
                                        self._smooth(part, layer_id), part in self.turned_parts))
        return out[0], out[1]

    # ------------------------------------------------------------------ calibration (fp8 scales, int4 key multipliers)
    def _accumulate(self, key: str, value: torch.Tensor, reduce_max: bool) -> None:
        prev = self.calibration_amax.get(key)
        self.calibration_amax[key] = value if prev is None else (torch.maximum(prev, value) if reduce_max else prev + value)

    def _record(self, part: str, layer_id: int, x: torch.Tensor) -> None:
        """While calibrating: fp8 keeps each head's amax; int4 each key channel's sum of squares (and the rows)."""
        if self.is_fp8:  # the amax of what is stored: turned keys' own
            r = self.rotation(part)
            self._accumulate(f"{part}{layer_id}", (x if r is None else x @ r).abs().amax(dim=(0, 2)), True)  # [head_num]
        elif part == "k":
            self._accumulate(f"k{layer_id}", torch.cat([x.pow(2).sum(0), torch.full_like(x[0, :, :1], x.shape[0])], -1), False)

    def record_query(self, layer_id: int, q: torch.Tensor) -> None:
        """While calibrating int4: each KV head's query channel sums of squares over its query heads. q [N, H, D]."""
        if not self.calibrating or "k_smooth" not in self.fixed:
            return
        n, h, d = q.shape
        q2 = q.detach().float().pow(2).view(n, self.head_num, h // self.head_num, d).sum((0, 2))  # [head_num, D]
        rows = torch.full_like(q2[:, :1], n * (h // self.head_num))
        self._accumulate(f"q{layer_id}", torch.cat([q2, rows], -1), False)

    def calibrate_scales(self, source: str) -> None:
        """fp8: scale = recorded amax x headroom / fp8 max per (layer, KV head); int4: key multiplier w = (E[q^2] /
        E[k^2]) ^ INT4_KEY_SMOOTH_EXPONENT per channel, normalised to mean 1 per (layer, KV head); then stop."""
        self.calibrating = False
        if not self.needs_calibration or not self.calibration_amax:
            return
        for layer_id in range(self.layer_num):
            if self.is_fp8:
                fmax = torch.finfo(self.dtype).max
                for part in ("k", "v"):
                    amax = self.calibration_amax.get(f"{part}{layer_id}")
                    if amax is not None:
                        self.fixed[part + "_scale"][layer_id].copy_(torch.clamp(amax * FP8_SCALE_HEADROOM / fmax, min=1e-8))
                continue
            k2, q2 = self.calibration_amax.get(f"k{layer_id}"), self.calibration_amax.get(f"q{layer_id}")
            if k2 is None or q2 is None:
                continue
            ek, eq = k2[:, :-1] / k2[:, -1:], q2[:, :-1] / q2[:, -1:]
            w = torch.where((ek > 0) & (eq > 0), (eq / ek.clamp_min(1e-30)) ** INT4_KEY_SMOOTH_EXPONENT, torch.ones_like(ek))
            self.fixed["k_smooth"][layer_id].copy_(w / w.mean(-1, keepdim=True))
        self.calibration_amax = {}
        self.scales_source = source

    def load_scales(self, k_scale: torch.Tensor, v_scale: torch.Tensor, source: str, keys_turned: bool = True) -> None:
        """fp8 scales given per layer [layer_num] or per (layer, KV head) [layer_num, head_num]: a checkpoint's
        (keys_turned=False: measured on plain keys, so the keys are stored plain), or the calibrated ones per layer."""
        if not keys_turned:
            self.plain_parts.add("k")
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            s = s.to(torch.float32).reshape(self.layer_num, -1).expand(self.layer_num, self.head_num)
            self.fixed[name].copy_(s)
        self.scales_source = source

    def scale_info(self) -> dict:
        # the parts stored turned (int4's keys too, which the codec turns with their multiplier and reads back plain)
        turned = sorted(set(rotated_parts(self.kv_format)) - self.plain_parts)
        info = {"kv_format": self.kv_format, "scales": self.scales_source, "turned_parts": turned}
        if "k_smooth" in self.fixed:
            info["k_smooth_range"] = [float(self.fixed["k_smooth"].min()), float(self.fixed["k_smooth"].max())]
        if self.is_fp8:
            info["k_scale_range"] = [float(self.fixed["k_scale"].min()), float(self.fixed["k_scale"].max())]
            info["v_scale_range"] = [float(self.fixed["v_scale"].min()), float(self.fixed["v_scale"].max())]
        return info


def create_kv_pool(kv_format: str, size: int, page_size: int, compute_dtype: torch.dtype, head_num: int,
                   head_dim: int, layer_num: int, device: str = "cpu", v_head_dim: Optional[int] = None,
                   window_rows: int = 0, window_req_rows: Optional[int] = None) -> KVCache:
    """The pool for a --kv-cache-dtype format name (mem_plan/dtypes.resolve_kv_cache_dtype): the quantized pool for
    fp8 and the int formats, MHATokenToKVPool for a plain dtype. window_rows: the ring rows of a format with a recent
    window (int4), the scratch row included; 0 = no window. window_req_rows: the req_to_token rows whose running
    requests the rows are handed to (ReqToTokenPool.attach_window); None = one ring per request slot (window_rows =
    the req_to_token rows)."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_plan.kv_quant import is_quantized

    if is_quantized(kv_format):
        return QuantizedKVPool(size, page_size, kv_format, compute_dtype, head_num, head_dim, layer_num, device,
                               v_head_dim, window_rows, window_req_rows)
    return MHATokenToKVPool(size, page_size, torch_dtype(kv_format), head_num, head_dim, layer_num, device, v_head_dim)
