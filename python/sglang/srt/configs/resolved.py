"""Settings resolved once: the functions that turn ServerArgs + the model's config.json into what a start runs with.

The server (ModelRunner and ModelConfig, which the Engine starts too) and `sglang plan` both call these, so the dry
run refuses what a start refuses, with the same message:
    device             resolve_device: 'auto' -> cuda where torch sees a GPU, else cpu; 'hip' -> cuda (ROCm torch)
    attention backend  resolve_backend (a live device; `sglang plan --device cpu` is this machine) or plan_backend
                       (a GPU preset: a server installed with its extra), both by backend_resolution.py's rule
    context length     resolve_context_len: --context-length up to the model's max_position_embeddings
    dtypes             the rules of mem_plan/dtypes.py (--dtype auto by device, --kv-cache-dtype auto = --dtype)
    model facts        resolve_model: config.json geometry + the three above, as the memory plan reads them; an
                       architecture the planner does not know is refused (mem_plan/arch_registry.py), one it plans
                       but this runtime does not serve is refused by a start with the words the plan notes
    tensor parallelism check_tp_sharding: the model splits over --tp-size ranks (and --ep-size expert groups:
                       check_ep_sharding), before any rank starts
    quantization       served_quantization (layers/quantization.resolve_quantization, with this machine's kernels),
                       planned_weight_format (the bytes `sglang plan` charges, plan-only formats included)
    fp32 kernels       use_fp32_kernels: fp32 layers take the kernels where --dtype auto chose float32
    fused CPU decode   fused_cpu_decode: whether torch_native's decode needs its gather workspace (and extends
                       through the fused kernel); scheduler_cpu_threads: the kernels' threads (the extend's scratch)
    Triton kv splits   --triton-attention-num-kv-splits as given (its default is ServerArgs'): build.attention_shape
Torch-free at import; resolve_device and the live-device checks import torch when called.
"""

from __future__ import annotations

import os
from typing import Callable, Optional

from sglang.srt.layers.attention import backend_resolution as br
from sglang.srt.mem_plan.arch_registry import check_served
from sglang.srt.mem_plan.build import ModelFacts
from sglang.srt.mem_plan.dtypes import resolve_kv_cache_dtype, resolve_model_dtype
from sglang.srt.mem_plan.kv_quant import is_quantized, mla_kv_dtype_error
from sglang.srt.mem_plan.model_shapes import ModelShape, model_shape_from_config
from sglang.srt.mem_plan.quantization_sizes import (PLAN_ONLY_QUANTIZATIONS, WeightFormat, gguf_expert_bits,
                                                    gguf_linear_type, gguf_matrix_formats, gguf_packed_vocab,
                                                    weight_format)

# Set to 1 to allow --context-length beyond the model's max_position_embeddings (upstream's variable name).
ALLOW_LONGER_CONTEXT_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"


def resolve_device(device: str) -> str:
    """--device: 'auto' is cuda when torch sees a GPU (CUDA or ROCm), else cpu; 'hip' is torch's 'cuda'."""
    if device != "auto":
        return "cuda" if device == "hip" else device
    return "cuda" if gpu_count() else "cpu"


def gpu_count() -> int:
    """GPUs torch sees (0 without a GPU build or device)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_backend(requested: Optional[str], device: str, mla: bool = False) -> br.BackendChoice:
    """The backend a start on this live device uses; ValueError before any weight loads when it cannot run here
    (a named backend is checked first, so the message names its device and package). mla: an MLA model."""
    from sglang.srt.layers.attention.attention_registry import check_attention_backend

    if requested is not None:
        check_attention_backend(requested, device)
    choice = br.resolve_attention_backend(requested, br.device_platform(device), mla=mla)
    check_attention_backend(choice.name, device)
    return choice


def plan_backend(requested: Optional[str], gpu_platform: Optional[str], mla: bool = False) -> br.BackendChoice:
    """What `sglang plan` charges: on a GPU preset, the backend a server installed with that GPU's extra resolves to;
    without one (--device cpu: this machine), exactly the server's resolve_backend."""
    if gpu_platform is None:
        return resolve_backend(requested, "cpu", mla)
    return br.resolve_attention_backend(requested, gpu_platform, installed=lambda module: True,
                                        installed_note=f"as a server installed with "
                                                       f"`pip install \"{br.GPU_EXTRAS[gpu_platform]}\"`", mla=mla)


def resolve_context_len(requested: Optional[int], max_position_embeddings: int) -> int:
    """--context-length, or the model's max_position_embeddings; above it only with ALLOW_LONGER_CONTEXT_ENV=1."""
    if requested is None:
        return max_position_embeddings
    if requested > max_position_embeddings and os.environ.get(ALLOW_LONGER_CONTEXT_ENV, "0") not in ("1", "true"):
        raise ValueError(
            f"--context-length={requested} exceeds the model's max_position_embeddings={max_position_embeddings}. "
            f"Use a value <= {max_position_embeddings}, or set {ALLOW_LONGER_CONTEXT_ENV}=1 to allow it "
            "(outputs past the trained length may be garbage)."
        )
    return requested


def resolve_model(config: dict, device: str, dtype: str = "auto", kv_cache_dtype: str = "auto",
                  context_length: Optional[int] = None, planning: bool = False) -> ModelFacts:
    """The model as a start with these flags holds it on `device` ('cpu' / 'cuda'): config.json's geometry, the
    context length and the canonical weight and KV dtypes. The weight format stays dense: the server measures the
    weights it loaded, `sglang plan` adds planned_weight_format. ValueError for a model_type the planner does not
    know; unless planning (`sglang plan`, which notes it), also for one this runtime does not serve."""
    shape = model_shape_from_config(config)
    if not planning:
        check_served(shape.text.model_type, shape.text.layer_kinds)
    dtype_name = resolve_model_dtype(dtype, device, shape.text.dtype)
    kv_dtype = resolve_kv_cache_dtype(kv_cache_dtype, dtype_name)
    if not planning and shape.text.is_mla and is_quantized(kv_dtype):
        raise ValueError(mla_kv_dtype_error(kv_cache_dtype))
    return ModelFacts(shape, resolve_context_len(context_length, shape.text.max_position_embeddings), dtype_name,
                      kv_dtype)


def fused_cpu_decode(model: ModelFacts, device: str) -> bool:
    """Whether torch_native decodes this model through a fused CPU kernel on `device` (then it declares no gather
    workspace): the bf16 / fp32 kernels over a plain pool, the kernel over the codes of a quantized pool (every format:
    cpu_kernel_ops.QUANT_KERNEL_FORMATS; below level avx512_bf16 they take the dequantizing gather). The server asks
    its device, `sglang plan --device cpu` this machine."""
    from sglang.srt.layers.attention.cpu_kernel_ops import fused_cpu_decode_available, fused_cpu_quant_ops
    from sglang.srt.mem_plan.dtypes import torch_dtype

    head_dim = model.shape.text.head_dim
    if is_quantized(model.kv_cache_dtype):
        return fused_cpu_quant_ops(device, torch_dtype(model.dtype), model.kv_cache_dtype, head_dim, head_dim) is not None
    kv = torch_dtype(model.kv_cache_dtype)
    return fused_cpu_decode_available(device, torch_dtype(model.dtype), kv, kv, head_dim, head_dim)


def scheduler_cpu_threads(sa) -> int:
    """The CPU kernels' threads of one scheduler process, as its runner plans them (utils/cpu_threads.py): a data
    parallel replica's share of the cores, shared by the node's tensor-parallel ranks."""
    from sglang.srt.utils.cpu_threads import plan_cpu_threads, replica_num_threads

    ranks_per_node = max(1, sa.tp_size // sa.nnodes)
    return plan_cpu_threads(replica_num_threads(sa.num_threads, sa.dp_size), ranks_per_node, 0).num_threads


def cpu_kernels_available(device: str) -> bool:
    """Whether the sgl-kernel CPU kernels serve on `device` (they load, or build, here; SGLANG_CPU_KERNELS=0 turns
    them off): the server asks its device, `sglang plan --device cpu` this machine."""
    if not str(device).startswith("cpu"):
        return False
    from sglang.jit_kernel.cpu_ops import get_cpu_ops

    return get_cpu_ops() is not None


def use_fp32_kernels(dtype_flag: str, device: str, dtype_name: str) -> bool:
    """Whether fp32 layers run the CPU kernels' fp32 forms (jit_kernel/cpu_ops.set_fp32_kernels, set here): where
    --dtype auto resolved to float32 on a CPU (a level without bf16, mem_plan/dtypes.py). An explicit --dtype float32
    stays the torch reference path on every level. The runner and `sglang plan` both call this before they ask
    fused_cpu_decode, so the plan's gather workspace follows the same decision."""
    from sglang.jit_kernel.cpu_ops import set_fp32_kernels

    on = str(device).startswith("cpu") and dtype_flag == "auto" and dtype_name == "float32"
    set_fp32_kernels(on)
    return on


def check_tp_sharding(shape: ModelShape, tp_size: int, ep_size: int = 1) -> None:
    """ValueError naming the fix when the model cannot be split over tp_size ranks: attention heads, KV heads (split,
    or replicated when tp > KV heads), the dense MLP's intermediate size (where a layer has one) and the experts'
    intermediate sizes, or with ep_size expert groups (--ep-size) the experts over the groups and each expert's
    intermediate size over a group's tp / ep ranks; multimodal models this runtime serves run on one rank."""
    t, tp = shape.text, tp_size
    if tp == 1:
        return
    check_ep_sharding(shape, tp_size, ep_size)
    if shape.encoders and shape.arch.served:  # a planned-only model's towers are planned whole on every rank
        raise ValueError(f"--tp-size {tp}: multimodal models run on one rank only; use --tp-size 1.")
    if t.num_q_heads % tp:
        raise ValueError(f"--tp-size {tp} does not divide the model's {t.num_q_heads} attention heads; "
                         f"pick a divisor of {t.num_q_heads}.")
    if t.num_kv_heads % tp and tp % t.num_kv_heads:
        raise ValueError(f"--tp-size {tp} and the model's {t.num_kv_heads} KV heads: one must divide the other "
                         f"(KV heads are split, or replicated when tp > KV heads).")
    if len(t.sparse_layers) < t.num_layers and t.intermediate_size % tp:
        raise ValueError(f"--tp-size {tp} does not divide the model's intermediate size {t.intermediate_size}.")
    # MoE: each expert's intermediate columns are split over the tp / ep ranks of its expert group (every rank holds
    # every expert without --ep-size; layers/moe/moe_layer.py); the shared expert's over all the ranks
    if t.sparse_layers and ep_size == 1 and t.moe_intermediate_size % tp:
        raise ValueError(f"--tp-size {tp} does not divide the model's MoE intermediate size "
                         f"{t.moe_intermediate_size}.")
    if t.sparse_layers and t.shared_expert_intermediate_size % tp:
        raise ValueError(f"--tp-size {tp} does not divide the model's shared-expert intermediate size "
                         f"{t.shared_expert_intermediate_size}.")


def check_ep_sharding(shape: ModelShape, tp_size: int, ep_size: int) -> None:
    """--ep-size: ValueError naming the fix unless it divides --tp-size, the model has routed experts, ep_size divides
    their number E and tp / ep divides each expert's intermediate size (distributed/parallel_state.py's layout)."""
    if ep_size == 1:
        return
    t = shape.text
    if tp_size % ep_size:
        raise ValueError(f"--ep-size {ep_size} must divide --tp-size {tp_size}; use --tp-size {ep_size} --ep-size "
                         f"{ep_size}.")
    if not (t.sparse_layers and t.num_experts):
        raise ValueError(f"--ep-size {ep_size}: the model ({t.model_type}) has no routed experts to split; drop "
                         "--ep-size (its layers are tensor-parallel over --tp-size).")
    if t.num_experts % ep_size:
        divisors = [d for d in range(1, tp_size + 1) if not t.num_experts % d and not tp_size % d]
        raise ValueError(f"--ep-size {ep_size} does not divide the model's {t.num_experts} experts; use an --ep-size "
                         f"dividing both {t.num_experts} and --tp-size {tp_size}: {', '.join(map(str, divisors))}.")
    moe_tp = tp_size // ep_size
    if t.moe_intermediate_size % moe_tp:
        raise ValueError(f"--tp-size {tp_size} / --ep-size {ep_size} = {moe_tp} ranks per expert group does not "
                         f"divide the model's MoE intermediate size {t.moe_intermediate_size}; use --ep-size "
                         f"{tp_size} (whole experts per rank).")


def cpu_quant_kernels() -> bool:
    """Whether quant_linear runs on this CPU (builds or loads the kernels: called only where it decides)."""
    from sglang.srt.layers.quantization.linear_method import quant_kernels

    return quant_kernels() is not None


def check_cpu_quant_level(quantization: str) -> None:
    """ValueError where this CPU's level has no quantized GEMM (below avx2): every call would dequantize the weights,
    many times slower than serving them dense."""
    from sglang.jit_kernel.cpu_isa import QUANT_LEVEL, at_least, cpu_isa, cpu_isa_summary

    if not at_least(cpu_isa(), QUANT_LEVEL):
        raise ValueError(f"--quantization {quantization}: this CPU's level is {cpu_isa_summary()}, and the quantized "
                         f"GEMM needs {QUANT_LEVEL} (AVX2, FMA, F16C); without it every call would dequantize the "
                         "weights, many times slower than dense. Leave --quantization unset (a .gguf is then "
                         "dequantized once at load) or use --quantization none.")


def checkpoint_quant_config(model_path: Optional[str]) -> Optional[dict]:
    """config.json's quantization_config of a local model directory (None elsewhere)."""
    path = os.path.join(model_path, "config.json") if model_path and os.path.isdir(model_path) else ""
    if not os.path.isfile(path):
        return None
    import json

    with open(path) as f:
        return json.load(f).get("quantization_config")


def served_quantization(sa, gguf_path: Optional[str], device: str, dtype: str,
                        kernels: Callable[[], bool] = cpu_quant_kernels, hf_quant_config: Optional[dict] = None) -> str:
    """The linear layers' format the runtime serves: 'none' | 'gguf' | 'w8a8_int8' | 'fp8' (an fp8 block checkpoint
    on one GPU; layers/quantization); ValueError for flags it refuses. hf_quant_config: the checkpoint's
    quantization_config (read from --model-path's config.json when None). The kernels are asked only where they
    decide: unset --quantization, a .gguf, a CPU."""
    from sglang.srt.layers.quantization import resolve_quantization  # torch-free
    from sglang.srt.layers.quantization.fp8_block_config import is_fp8_block_checkpoint

    if hf_quant_config is None and gguf_path is None:
        hf_quant_config = checkpoint_quant_config(getattr(sa, "model_path", None))

    if sa.quantization in ("gguf", "w8a8_int8") and device == "cpu":
        check_cpu_quant_level(sa.quantization)
    decides = sa.quantization is None and gguf_path is not None and device == "cpu"
    # an explicit --dtype float32 asks for the exact dequantized reference; 'auto' resolving to float32 (a CPU level
    # without bf16: mem_plan/dtypes.py) keeps the blocks and runs fp32 activations through them
    explicit_fp32 = dtype == "float32" and sa.dtype != "auto"
    return resolve_quantization(sa.quantization, gguf_path is not None, device, explicit_fp32, sa.tp_size,
                                kernels() if decides else True, is_fp8_block_checkpoint(hf_quant_config))


def planned_weight_format(sa, hf_quant_config: Optional[dict], gguf_path: Optional[str], device: str, dtype: str,
                          kernels: Callable[[], bool] = cpu_quant_kernels) -> WeightFormat:
    """The format `sglang plan` charges the weights in: the served format, else (unset / none) the checkpoint's
    quantization_config; fp8, awq and gptq are sized for the dry run only (the CPU server refuses them), except an
    fp8 block checkpoint: dequantized at load, it is charged dense in the model dtype; served by the fp8 GEMM (one
    GPU), its blocks."""
    from sglang.srt.layers.quantization.fp8_block_config import is_fp8_block_checkpoint

    quant, fp8_blocks = sa.quantization, is_fp8_block_checkpoint(hf_quant_config)
    if quant not in PLAN_ONLY_QUANTIZATIONS or (fp8_blocks and quant == "fp8"):
        quant = served_quantization(sa, gguf_path, device, dtype, kernels, hf_quant_config or {})
        if quant in ("gguf", "w8a8_int8") or (quant == "none" and fp8_blocks):
            return served_weight_format(quant, gguf_path)
        quant = None if quant == "none" else quant
    return weight_format(quant, hf_quant_config)


def served_weight_format(quantization: str, gguf_path: Optional[str]) -> WeightFormat:
    """The format of a served (resolved) quantization, as the plan sizes it: for 'gguf' the file's linear type, its
    MoE experts' own bits (the runtime's MoE workspace depends on them: mem_plan/build.moe_workspace) and its packed
    vocabulary table (the loader packs the same one: model_loader/loader.py)."""
    if quantization == "none":
        return WeightFormat()
    gguf = quantization == "gguf"
    return weight_format(quantization, None, gguf_linear_type(gguf_path) if gguf else "",
                         gguf_expert_bits(gguf_path) if gguf else None,
                         gguf_packed_vocab(gguf_path) if gguf else ("", 0),
                         gguf_matrix_formats(gguf_path) if gguf else ())
