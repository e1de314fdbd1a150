"""KV cache formats and their bytes, written once: the plan charges them, the pool allocates them field by field.

Torch-free. A format is the list of per-token fields one KV head stores in each layer (codes and scales) plus the
fixed per-(layer, KV head) tensors (fp8 scales). The pool (mem_cache/memory_pool.py) allocates one buffer
[layers, rows, kv_heads, elems] per token field and one [layers, kv_heads] per fixed field; the plan's kv_cache term
is rows x cell_bytes + fixed_bytes with the same numbers (specs.KVCellSpec), so what is allocated is what was planned.

Per (token, KV head), head dim d (keys) and dv (values); bytes for d = dv = 64 in brackets (bf16: 256 B):

  bfloat16/float16  k, v in the model's 16-bit dtype                                          [256 B, 1.00x]
  float32           k, v in fp32                                                              [512 B]
  fp8_e4m3/e5m2     k, v one byte each (x / scale cast to fp8); fp32 scales per (layer, KV head) for K and V,
                    calibrated at startup from a forward of seeded random tokens (amax x headroom / fp8 max), a
                    fixed cost of layers x kv_heads x 8 B; a checkpoint's k_scale / v_scale when it has them
                                                                                              [128 B, 2.00x]
  int8              symmetric per token: k, v int8 codes, one fp16 scale (amax / 127) each        [132 B, 1.94x]
  int4              asymmetric per token over the head vector (KIVI's value rule): 4-bit codes two to a byte, an
                    fp16 (step, min) pair for K and for V. Keys are first multiplied channel-wise by a calibrated
                    query-aware multiplier w (fixed fp32, layers x kv_heads x d x 4 B: the channels queries weigh
                    most get the finest steps, KIVI's per-channel key insight without token groups) and turned by
                    a fixed orthonormal (randomised Hadamard) rotation (mem_cache/kv_quant_codec.py) [72 B, 3.56x]
  int2_hadamard     the >= 8x mode: K and V turned by the rotation (their coordinates ~ Gaussian), keys 2-bit
                    (4-level Lloyd-Max levels, four codes a byte), values ternary (3 levels, five trits a byte),
                    one log-scale byte per vector (2^(1/12) steps, +-2.9%)                      [31 B, 8.26x]

Per token, every byte the pool holds is above. Each request slot also keeps its last W tokens in bf16
(RECENT_WINDOW_TOKENS: int4 and int2_hadamard 16, fp8_e4m3 48, fp8_e5m2 56; a ring per running request, the kv_window term
(kv_window.py: rows for 1% of the budget); the default model at W = 16: 16 x (30 x 3 x 256 B + 8 B) = 368,768 B a slot):
attention reads a request's newest cached tokens there. The same ring also keeps the request's first SINK_TOKENS
tokens (4: attention sinks, the keys most queries weigh, so their error counts most; 4 x 30 x 3 x 256 B + 32 B =
92,192 B a slot on the default model), read in place of their codes. fp8's window exists where the backend reads rings (RING_BACKENDS: not
FlashInfer, whose kernel reads fp8 codes only; with it fp8 has no window and none is planned).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Tuple

from sglang.srt.mem_plan.dtypes import dtype_bytes

FP8_FORMATS = ("fp8_e4m3", "fp8_e5m2")
INT_FORMATS = ("int8", "int4", "int2_hadamard")
QUANTIZED_KV_FORMATS = FP8_FORMATS + INT_FORMATS
# a quantized format's quality gate (benchmark/bench_kv_quality.py, docs/kv_quantization.md): None = passes; a text =
# the measured failure, shown in --help and /server_info
KV_QUALITY_FLAGS = {  # benchmark/bench_kv_quality.py, default model in fp32 vs a bf16 KV (floor: fp32 KV 99.80%)
    "int2_hadamard": "capacity mode: top-1 82.7%, perplexity +17%, needle recall 0/6",
}  # int8 passes (top-1 99.6%, perplexity -0.05%); with their window and sinks int4 passes (top-1 97.4%, perplexity
# +0.5%), fp8_e4m3 (99.7%, -0.0%) and fp8_e5m2 (window 56: 99.5%, +0.2%; 48 without sinks: 98.1%); without a window
# (FlashInfer) fp8 fails top-1 (WINDOWLESS_QUALITY_FLAGS)
INT4_BITS, INT2_KEY_BITS, TRITS_PER_BYTE = 4, 2, 5
# recent window: each request slot keeps the K/V of its last RECENT_WINDOW_TOKENS[fmt] tokens in bf16 as well as their
# codes, and attention reads those tokens from there (the query weighs its nearest tokens most): a
# ring per running request, planned as the kv_window term (window_bytes_per_slot a row; rows: kv_window.py)
RECENT_WINDOW_TOKENS = {"fp8_e4m3": 48, "fp8_e5m2": 56, "int4": 16, "int2_hadamard": 16}
# the backends whose kernels read a window's ring (the CPU kernel, the torch path, Triton). FlashInfer's paged kernel
# reads the pool's fp8 codes only, so with it fp8 keeps no window: none is planned or allocated (recent_window)
RING_BACKENDS = ("torch_native", "triton")
# attention sinks: every format with a recent window also keeps each request's first SINK_TOKENS tokens in its ring, read
# in place of their codes (a request's first tokens draw most of the attention; fp8_e5m2's 2-bit mantissa on them cost
# it the top-1 gate: docs/kv_quantization.md)
SINK_TOKENS = 4
ROTATED_PARTS = {"fp8_e4m3": ("k",), "fp8_e5m2": ("k",), "int8": ("k",), "int4": ("k", "v"),
                 "int2_hadamard": ("k", "v")}  # the codec's rotated parts (kv_quant_codec.py)
# the attention backends that read a quantized format (check_kv_format_backend); AITER's prefill takes no fp8 KV
KV_FORMAT_BACKENDS = {**{f: ("torch_native", "triton", "flashinfer") for f in FP8_FORMATS},
                      **{f: ("torch_native", "triton") for f in INT_FORMATS}}
# torch_native decode reads a quantized pool in row groups of at most this many tokens (a plain pool: backends.
# DECODE_GATHER_TOKENS, 64k): the dequantized rows cost fp32 + the model dtype, so the declared transient stays small
QUANTIZED_DECODE_GATHER_TOKENS = 8192
FP8_SCALE_HEADROOM = 2.0  # fp8 scale = calibration amax x headroom / fp8 max: values up to 2x the amax stay in range
# int4 key multiplier w_c = (E[q_c^2] / E[k_c^2]) ^ INT4_KEY_SMOOTH_EXPONENT per channel (normalised to mean 1). 1/4
# minimises the logit error q.dk of a per-token uniform quantizer for the calibration's statistics (and halves the
# decode KL), but the 4k-token perplexity got worse (+14.7% vs +8.0% at w = 1); 1/8 keeps it (+8.1%) with a third
# less decode KL (docs/kv_quantization.md)
INT4_KEY_SMOOTH_EXPONENT = 0.125


@dataclass(frozen=True)
class KVField:
    """One buffer of the pool: `elems` elements of `dtype` per (token, KV head) (or per (layer, KV head) if fixed)."""

    name: str
    elems: int
    dtype: str

    @property
    def bytes(self) -> int:
        return self.elems * dtype_bytes(self.dtype)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def is_quantized(fmt: str) -> bool:
    return fmt in QUANTIZED_KV_FORMATS


def token_fields(fmt: str, head_dim: int, v_head_dim: int) -> Tuple[KVField, ...]:
    """The per-token fields of one KV head in one layer."""
    d, dv = head_dim, v_head_dim
    if fmt in FP8_FORMATS:
        return (KVField("k", d, "uint8"), KVField("v", dv, "uint8"))
    if fmt == "int8":
        return (KVField("k", d, "int8"), KVField("k_scale", 1, "float16"),
                KVField("v", dv, "int8"), KVField("v_scale", 1, "float16"))
    if fmt == "int4":
        if d % 2 or dv % 2:
            raise ValueError(f"--kv-cache-dtype int4 needs even head dims, got {d}/{dv}")
        return (KVField("k", d // 2, "uint8"), KVField("k_scale", 2, "float16"),
                KVField("v", dv // 2, "uint8"), KVField("v_scale", 2, "float16"))
    if fmt == "int2_hadamard":
        if d % 4:
            raise ValueError(f"--kv-cache-dtype int2_hadamard needs a head dim that is a multiple of 4, got {d}")
        return (KVField("k", d // 4, "uint8"), KVField("k_scale", 1, "uint8"),
                KVField("v", _cdiv(dv, TRITS_PER_BYTE), "uint8"), KVField("v_scale", 1, "uint8"))
    return (KVField("k", d, fmt), KVField("v", dv, fmt))  # a plain dtype (bfloat16, float16, float32)


def fixed_fields(fmt: str, head_dim: int = 0, v_head_dim: int = 0) -> Tuple[KVField, ...]:
    """Per-(layer, KV head) fields independent of the pool size: fp8's scales, int4's key channel multipliers."""
    if fmt in FP8_FORMATS:
        return (KVField("k_scale", 1, "float32"), KVField("v_scale", 1, "float32"))
    if fmt == "int4":
        return (KVField("k_smooth", head_dim, "float32"),)
    return ()


def token_bytes_per_head(fmt: str, head_dim: int, v_head_dim: int) -> int:
    """Bytes one (token, KV head, layer) costs, every scale byte included."""
    return sum(f.bytes for f in token_fields(fmt, head_dim, v_head_dim))


def fixed_bytes(fmt: str, num_layers: int, num_kv_heads: int, head_dim: int = 0, v_head_dim: int = 0) -> int:
    return num_layers * num_kv_heads * sum(f.bytes for f in fixed_fields(fmt, head_dim, v_head_dim))


def capacity_gain_vs_bf16(fmt: str, head_dim: int, v_head_dim: int) -> float:
    """How many more tokens the same bytes hold than a bf16 cache (the per-token ratio; fixed bytes excluded)."""
    return token_bytes_per_head("bfloat16", head_dim, v_head_dim) / token_bytes_per_head(fmt, head_dim, v_head_dim)


def recent_window(fmt: str, attention_backend: Optional[str] = None) -> int:
    """The recent tokens a request slot keeps uncompressed for this format (0: none), read by attention_backend
    (None: a backend that reads rings; one outside RING_BACKENDS gets no window)."""
    if attention_backend is not None and attention_backend not in RING_BACKENDS:
        return 0
    return RECENT_WINDOW_TOKENS.get(fmt, 0)


def sink_tokens(fmt: str, attention_backend: Optional[str] = None) -> int:
    """The first tokens of a request its ring keeps uncompressed (attention sinks; 0 where there is no window)."""
    return SINK_TOKENS if recent_window(fmt, attention_backend) else 0


def window_bytes_per_slot(fmt: str, num_layers: int, num_kv_heads: int, head_dim: int, v_head_dim: int,
                          attention_backend: Optional[str] = None) -> int:
    """One request slot's ring: (W + sinks) entries x (K and V rows of every layer and KV head in bf16 + the int64 pool
    slot each entry holds, which says whether it is still the request's token)."""
    w = recent_window(fmt, attention_backend) + sink_tokens(fmt, attention_backend)
    return w * (num_layers * num_kv_heads * (head_dim + v_head_dim) * dtype_bytes("bfloat16") + 8) if w else 0


# fp8 read without its window (a backend outside RING_BACKENDS: FlashInfer), same gate, 2026-11-26
WINDOWLESS_QUALITY_FLAGS = {"fp8_e4m3": "fails top-1 (97.4% < 99%) without its window, perplexity +0.1% passes",
                            "fp8_e5m2": "fails top-1 (94.8% < 99%) without its window, perplexity +0.3% passes"}


def quality_flag(fmt: str, attention_backend: Optional[str] = None) -> str:
    """The format's quality-gate failure ("" = passes), as attention_backend reads it (None: with its window)."""
    if recent_window(fmt) and not recent_window(fmt, attention_backend):
        return WINDOWLESS_QUALITY_FLAGS.get(fmt, KV_QUALITY_FLAGS.get(fmt, ""))
    return KV_QUALITY_FLAGS.get(fmt, "")


def gather_elem_bytes(fmt: str, model_dtype: str) -> int:
    """Bytes per gathered K/V element of the torch path's per-request read: the stored dtype's, or for a quantized
    format its fp32 dequantization plus the copy in the model dtype (attention's declared transients, backends.py)."""
    if is_quantized(fmt):
        return 4 + dtype_bytes(model_dtype)
    return dtype_bytes(fmt)


def check_kv_format_backend(fmt: str, backend: str) -> None:
    """ValueError when the attention backend cannot read this KV format: the int formats are read by torch_native
    (its CPU kernel over the codes, else its dequantizing gather) and the Triton kernels (in-kernel); FlashInfer reads
    fp8, AITER none (no fp8 prefill)."""
    readers = KV_FORMAT_BACKENDS.get(fmt)
    if readers is not None and backend not in readers:
        raise ValueError(f"--kv-cache-dtype {fmt} is read by --attention-backend {' / '.join(readers)}, not by "
                         f"{backend}: use --attention-backend triton (GPU) or torch_native (CPU), or "
                         f"--kv-cache-dtype auto with {backend}.")


def rotated_parts(fmt: str) -> Tuple[str, ...]:
    """The parts ("k", "v") a format stores turned by its fixed rotation (mem_cache/kv_quant_codec.py)."""
    return ROTATED_PARTS.get(fmt, ())


def describe(fmt: str, head_dim: int, v_head_dim: int) -> str:
    """One line for the plan table and logs: bytes per (token, KV head, layer) and the gain over bf16."""
    per_head = token_bytes_per_head(fmt, head_dim, v_head_dim)
    text = f"{fmt}: {per_head} B per token, KV head and layer, {capacity_gain_vs_bf16(fmt, head_dim, v_head_dim):.2f}x bf16's tokens"
    flag = quality_flag(fmt)
    return text + (f" [quality gate: {flag}]" if flag else "")


def decode_gather_tokens(fmt: str, default: int) -> int:
    """torch_native's decode row-group bound for this format (the plan's decode_gather transient and the backend)."""
    return QUANTIZED_DECODE_GATHER_TOKENS if is_quantized(fmt) else default


# a checkpoint's fp8 KV scales (dequantization scales: x = fp8 code x scale), per layer or per (layer, KV head):
# model.layers.<i>.self_attn.k_scale / v_scale (also .self_attn.attn.k_scale, as some exporters nest them)
_KV_SCALE_NAME = re.compile(r"(?:^|\.)layers\.(\d+)\.self_attn\.(?:attn\.)?([kv])_scale$")


def kv_scale_name(name: str) -> Optional[Tuple[int, str]]:
    """(layer, "k" | "v") when a checkpoint tensor name is an fp8 KV scale, else None (the loader skips them: they
    are no model parameter; model_executor/kv_calibration.py hands them to the pool)."""
    m = _KV_SCALE_NAME.search(name)
    return (int(m.group(1)), m.group(2)) if m else None


def _help() -> str:
    gains = ", ".join(f"{f} {capacity_gain_vs_bf16(f, 64, 64):.2f}x" for f in ("fp8_e4m3", "int8", "int4", "int2_hadamard"))
    flags = "; ".join([f"{f}: {why}" for f, why in KV_QUALITY_FLAGS.items()]
                      + [f"{f} on flashinfer: {why}" for f, why in WINDOWLESS_QUALITY_FLAGS.items()])
    return ("KV cache dtype; 'auto' follows --dtype. Quantized formats (codes + scales, all planned; "
            "docs/kv_quantization.md): fp8_e4m3 / fp8_e5m2 with per-(layer, KV head) scales calibrated at startup, "
            "int8 per token (keys rotated), int4 per token asymmetric (rotated), int2_hadamard (int4 and int2_hadamard "
            "also keep each request slot's last 16 tokens and its first 4 in bf16, fp8 its last 48 (e5m2: 56) and "
            "first 4 except on flashinfer, rings for running requests within 1% of the budget); bf16 tokens per byte x "
            f"(head dim 64): {gains}. int formats need --attention-backend torch_native or triton."
            + (f" Quality gate on the default model: {flags}." if flags else ""))


KV_CACHE_DTYPE_HELP = _help()


def mla_kv_dtype_error(kv_cache_dtype: str) -> str:
    """Why a start refuses a quantized KV cache on an MLA model (resolved.resolve_model, before loading anything; the
    pool, mem_cache/mla_pool.py, checks it again). `sglang plan` still prices it: GPU runtimes serve fp8 latents."""
    return (f"--kv-cache-dtype {kv_cache_dtype}: an MLA model (DeepSeek V2/V3, Kimi-K2) caches one latent row per "
            f"token in the model dtype here; quantized latent rows are not served. Use --kv-cache-dtype auto.")
