"""Dtype names, their element sizes and the "auto" rules: the one table for weights and the KV cache.

Torch-free: names are strings here; `torch_dtype(name)` maps a canonical name to the torch dtype (lazy import).

    --dtype auto           CPU -> bfloat16 where the CPU has bf16 dot products (ISA level avx512_bf16 / amx,
                           jit_kernel/cpu_isa.py), else float32 (torch emulates bf16 GEMMs there; fp16 is unusable)
                           GPU -> the checkpoint's dtype when it is bfloat16/float16, else bfloat16
    --kv-cache-dtype auto  the resolved --dtype
fp8 KV caches are stored as uint8 views of one byte per element (memory_pool.py); fp8 scales and the int formats'
codes and scales are laid out in kv_quant.py.
"""

from __future__ import annotations

from typing import Optional

# canonical name -> bytes per element: weights, activations and KV, then the index and byte buffers the attention
# backends declare (backends.py)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1,
               "int32": 4, "int64": 8, "uint8": 1, "int8": 1}
# accepted spellings -> canonical name
DTYPE_ALIASES = {
    "float": "float32", "fp32": "float32", "bf16": "bfloat16", "half": "float16", "fp16": "float16",
    "fp8": "fp8_e4m3", "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2",
}
# --dtype choices (weights and activations) and --kv-cache-dtype choices, "auto" first
WEIGHT_DTYPE_CHOICES = ["auto", "bfloat16", "float32", "float16", "half", "float", "bf16", "fp32"]
KV_CACHE_DTYPE_CHOICES = ["auto", "bfloat16", "float32", "float16", "fp8_e4m3", "fp8_e5m2", "int8", "int4",
                          "int2_hadamard"]
# quantized KV formats that are not a torch dtype (codes + scales: mem_plan/kv_quant.py)
KV_INT_FORMATS = ("int8", "int4", "int2_hadamard")
_TORCH_NAMES = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}


def canonical_dtype(name: str) -> str:
    """'bf16' -> 'bfloat16', 'torch.float16' -> 'float16'; ValueError for an unknown name."""
    key = str(name).replace("torch.", "")
    key = DTYPE_ALIASES.get(key, key)
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {name!r}; known: {sorted(set(DTYPE_BYTES) | set(DTYPE_ALIASES))}")
    return key


def dtype_bytes(name: str) -> int:
    return DTYPE_BYTES[canonical_dtype(name)]


def resolve_model_dtype(dtype: str, device: str, checkpoint_dtype: Optional[str]) -> str:
    """The weight/activation dtype for --dtype on this device (rules in the module docstring)."""
    if dtype != "auto":
        if dtype not in WEIGHT_DTYPE_CHOICES:
            raise ValueError(f"--dtype={dtype!r} is not allowed; choose one of {', '.join(WEIGHT_DTYPE_CHOICES)}.")
        return canonical_dtype(dtype)
    if device == "cpu":
        from sglang.jit_kernel.cpu_isa import bf16_native

        return "bfloat16" if bf16_native() else "float32"
    try:
        ckpt = canonical_dtype(checkpoint_dtype) if checkpoint_dtype else None
    except ValueError:
        ckpt = None
    return ckpt if ckpt in ("bfloat16", "float16") else "bfloat16"


def resolve_kv_cache_dtype(kv_cache_dtype: Optional[str], model_dtype: str) -> str:
    """The KV format name: a canonical dtype, or one of KV_INT_FORMATS."""
    if kv_cache_dtype in KV_INT_FORMATS:
        return kv_cache_dtype
    return canonical_dtype(model_dtype if kv_cache_dtype in (None, "auto") else kv_cache_dtype)


def kv_compute_dtype(kv_format: str, model_dtype: str) -> str:
    """The dtype attention reads the KV cache in: the stored dtype, or the model's for the int formats (their
    codes are dequantized into it)."""
    return canonical_dtype(model_dtype) if kv_format in KV_INT_FORMATS else canonical_dtype(kv_format)


def torch_dtype(name: str):
    import torch

    canonical = canonical_dtype(name)
    return getattr(torch, _TORCH_NAMES.get(canonical, canonical))
