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




def mla_cpu_ops(device, model_dtype, kv_dtype, kv_store_dtype, head_dim: int, kv_lora_rank: int):
    """The compiled module whose mla_decode / mla_extend serve this MLA latent pool (rows [c_kv | k_pe] of width
    head_dim, V their first kv_lora_rank columns) at this process's CPU level, or None (the torch path): a CPU, model
    and pool of one dtype, bf16 from level avx512_bf16 or fp32 from avx2 where set_fp32_kernels turned the fp32 kernels
    on; kv_lora_rank a multiple of 16 below head_dim (any head_dim: V2/V3's 512 + 64 and the small test widths alike)."""
    if not (
        str(device).startswith("cpu")
        and model_dtype == kv_dtype == kv_store_dtype
        and model_dtype in (torch.bfloat16, torch.float32)
        and kv_lora_rank >= 16 and kv_lora_rank % 16 == 0 and kv_lora_rank < head_dim
    ):
        return None
    ops = get_ops_for_dtype(model_dtype)
    return ops if hasattr(ops, "mla_extend") else None


def mla_decode(ops, q, k_new, kv_cache, kv_lora_rank: int, req_to_token, req_pool_indices, seq_lens, out_cache_loc,
               scale: float) -> torch.Tensor:
    """MLA decode (sgl-kernel/csrc/cpu/mla_attention_op.h) with `ops` from mla_cpu_ops: writes the new latent rows
    k_new [B, 1, L] at out_cache_loc, then q [B, H, L] attends over each request's first seq_lens[b] rows of kv_cache
    [slots, 1, L] (through req_to_token) -> [B, H * kv_lora_rank]."""
    k_new = k_new if k_new.stride(-1) == 1 else k_new.contiguous()
    return ops.mla_decode(q, k_new, kv_cache, kv_lora_rank, req_to_token, req_pool_indices.to(torch.int64),
                          seq_lens.to(torch.int64), out_cache_loc.to(torch.int64), scale)


def mla_extend(ops, q, kv_cache, kv_lora_rank: int, req_to_token, req_pool_indices, prefix_lens, extend_lens,
               scale: float, k_new=None, out_cache_loc=None) -> torch.Tensor:
    """MLA extend: q [N, H, L] (the new tokens, request after request) attends causally over its request's rows,
    the cached prefix included; k_new / out_cache_loc where given are written to the pool first. -> [N, H * kv_lora]."""
    if k_new is not None and k_new.stride(-1) != 1:
        k_new = k_new.contiguous()
    return ops.mla_extend(q, kv_cache, kv_lora_rank, req_to_token, req_pool_indices.to(torch.int64),
                          prefix_lens.to(torch.int64), extend_lens.to(torch.int64), scale, k_new,
                          None if out_cache_loc is None else out_cache_loc.to(torch.int64))
