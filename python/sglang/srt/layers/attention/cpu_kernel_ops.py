"""Which compiled CPU attention kernels serve a pool (sgl-kernel/csrc/cpu): torch_native takes them, `sglang plan`
asks the same questions (configs/resolved.py) so the plan declares the workspace the run will use."""

from __future__ import annotations

import torch

from sglang.jit_kernel.cpu_ops import get_ops_for_dtype

# the quantized formats the CPU kernel reads in place (their storage layouts are fixed: mem_plan/kv_quant.py)
QUANT_KERNEL_FORMATS = ("int8", "int4", "int2_hadamard", "fp8_e4m3", "fp8_e5m2")

# decode_attention / extend_attention take sliding_window=-1, sinks=None (fp32 [H]), logit_cap=0.0 and loc_map=None
# (int32 token-pool slot -> buffer slot: every req_to_token read and decode's write at out_cache_loc go through it),
# sgl-kernel/csrc/cpu/window_keys.h: windowed and sink layers may take the fused kernels (the quantized-pool kernel
# takes none of these).
WINDOW_KERNELS = True


def fused_cpu_decode_available(device, model_dtype, kv_dtype, kv_store_dtype, head_dim: int, v_head_dim) -> bool:
    """Whether decode runs through the fused CPU kernel (and so needs no gather workspace): `sglang plan` asks this
    too. bf16 model and pool from level avx512_bf16, fp32 ones from avx2."""
    ops = fused_cpu_decode_ops(device, model_dtype, kv_dtype, kv_store_dtype, head_dim, v_head_dim)
    return ops is not None


def fused_cpu_decode_ops(device, model_dtype, kv_dtype, kv_store_dtype, head_dim: int, v_head_dim):
    """The compiled module whose decode_attention serves this pool at this process's CPU level, or None."""
    if not (
        str(device).startswith("cpu")
        and model_dtype == kv_dtype == kv_store_dtype
        and model_dtype in (torch.bfloat16, torch.float32)
        and v_head_dim == head_dim
    ):
        return None
    ops = get_ops_for_dtype(model_dtype)
    return ops if ops is not None and head_dim in ops.decode_attention_head_dims() else None


def fused_cpu_quant_ops(device, model_dtype, kv_format: str, head_dim: int, v_head_dim):
    """The compiled module whose extend_attention_quant reads this quantized pool's codes (decode and extend), or
    None: a CPU, a format of QUANT_KERNEL_FORMATS, level avx512_vnni and up (jit_kernel/cpu_isa.KV_QUANT_LEVEL), a
    model dtype whose kernels serve here (bf16 from avx512_bf16; fp32 where set_fp32_kernels turned them on, as a start
    does where --dtype auto resolved to float32), a compiled head_dim."""
    from sglang.jit_kernel.cpu_ops import get_kv_quant_ops

    if not (str(device).startswith("cpu") and kv_format in QUANT_KERNEL_FORMATS and v_head_dim == head_dim):
        return None
    ops = get_kv_quant_ops() if get_ops_for_dtype(model_dtype) is not None else None  # it has extend_attention_quant
    if ops is None:
        return None
    return ops if head_dim in ops.decode_attention_head_dims() else None


