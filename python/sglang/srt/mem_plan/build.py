"""build_plan_inputs(): ServerArgs + model + device + measured terms -> PlanInputs. The one place both the model
runner (model_runner_kv_cache_mixin.py) and `sglang plan` (cli/plan.py) turn flags into plan inputs.

What differs between the two is only where the hardware facts and the measured terms come from:
    server      DeviceFacts from the device (measure.py); MeasuredTerms measured (weights, activation peak, encoder)
    sglang plan DeviceFacts from a GPU preset or `--device cpu [--total-memory-gb]`; MeasuredTerms from the declared
                formulas (formula_terms) or `--measured TERM=BYTES`
Every other input -- KV cell, request slots, chunk, graph batch, backend buffers, sampler rows, req_to_token, the
MoE workspace, the budget cap -- is resolved here from the same flags by the same code. Torch-free.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Optional

from sglang.srt.mem_plan.backends import GRAPH_BACKENDS, AttentionShape, BackendInputs, workspace_spec
from sglang.srt.mem_plan.budget import CPU_DEFAULT_AVAILABLE_SHARE, cpu_default_cap_bytes
from sglang.srt.mem_plan.dtypes import dtype_bytes
from sglang.srt.mem_plan.encoder import encoder_reservation_bytes
from sglang.srt.mem_plan.encoder_plan import formula_encoder_terms
from sglang.srt.mem_plan.inputs import PlanInputs
from sglang.srt.mem_plan.kv_quant import describe as describe_kv
from sglang.srt.mem_plan.kv_quant import decode_gather_tokens, gather_elem_bytes, rotated_parts, window_bytes_per_slot
from sglang.srt.mem_plan.layer_pools import split_kv_cell
from sglang.srt.mem_plan.model_shapes import CPU_LOAD_RESIDUAL_BYTES, CPU_PACKED_LOAD_RESIDUAL_BYTES, ModelShape
from sglang.srt.mem_plan.moe_sizes import (
    CAPTURABLE,
    MoEWorkspaceSpec,
    moe_impl_for,
    moe_workspace_bytes,
    moe_workspace_spec,
)
from sglang.srt.mem_plan.quantization_sizes import WeightFormat, quantized_weight_bytes
from sglang.srt.mem_plan.sizes import (
    REQ_TO_TOKEN_ELEM_BYTES,
    cuda_graph_logits_bytes,
    grammar_bitmask_bytes_per_slot,
    grammar_cache_budget_bytes,
    pooled_bytes_per_slot,
    sampler_bytes_per_slot,
    sampler_fixed_bytes,
)
from sglang.srt.mem_plan.spec_terms import build_spec_inputs
from sglang.srt.mem_plan.tiers import tier_defaults
from sglang.srt.mem_plan.units import GiB, MiB

logger = logging.getLogger(__name__)

# Default chunked-prefill size on CPU: large enough that one chunk keeps the cores busy, small enough that the
# profile forward and the attention scores of one chunk stay in the hundreds of MiB for small models.
CPU_DEFAULT_CHUNKED_PREFILL_SIZE = 2048
# Request slots on CPU when --max-running-requests is unset. Upstream's rule (2048-4096 slots) is sized for GPUs; on
# CPU every slot costs a sampler row of vocab entries (~1.2 MiB for a 49k vocabulary), so 4096 slots would take GiBs
# of the budget from the KV pool for a batch no CPU decodes efficiently. GPUs keep upstream's rule.
CPU_DEFAULT_MAX_RUNNING_REQUESTS = 256
# Declared CUDA-graph term for the dry run: the graphs' shared logits (sizes.cuda_graph_logits_bytes) plus upstream's
# reserve of 2 MiB per captured decode batch size for the rest of what the graphs hold.
CUDA_GRAPH_BYTES_PER_BS = 2 * MiB


@dataclass(frozen=True)
class DeviceFacts:
    """What the plan needs to know about the device (measured by the server, a preset for `sglang plan`)."""

    kind: str  # "cpu" or "cuda"
    pre_load_free_bytes: int  # free (CPU: available) memory before weights load, MIN over ranks
    total_bytes: Optional[int] = None  # memory.total (picks upstream's GPU tier defaults)
    fused_cpu_decode: bool = False  # the fused CPU decode kernel serves this model (torch_native needs no gather)
    cpu_kernels: bool = False  # the sgl-kernel CPU kernels load here (MoE experts run the CPU kernel: moe_sizes.py)
    cpu_threads: int = 1  # the CPU kernels' threads in one scheduler process (utils/cpu_threads.plan_cpu_threads)


@dataclass(frozen=True)
class ModelFacts:
    """The model as the plan sees it: config.json geometry + resolved context length and dtypes."""

    shape: ModelShape
    context_len: int
    dtype: str  # canonical weight dtype (mem_plan/dtypes.py)
    kv_cache_dtype: str
    weight_format: WeightFormat = WeightFormat()  # the linear layers' format (quantization_sizes.py)

    @property
    def has_encoder(self) -> bool:
        return bool(self.shape.encoders)


@dataclass(frozen=True)
class MeasuredTerms:
    """The terms the server measures and `sglang plan` computes by formula (or takes from --measured)."""

    weight_bytes: int
    activation_bytes: int
    cuda_graph_bytes: int = 0
    encoder_bytes: int = 0
    sources: dict = field(default_factory=dict)  # term -> measured / formula / declared
    encoder_detail: str = ""
    encoder_terms: tuple = ()  # encoder.EncoderTerm per modality (replaces encoder_bytes; encoder_plan.py)


def gpu_tier_defaults(sa, device: DeviceFacts) -> tuple[int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs) of upstream's tier for this GPU's memory.total (tiers.py)."""
    return tier_defaults(device.total_bytes // MiB if device.total_bytes else None, sa.tp_size)


def resolve_chunked_prefill_size(sa, device: DeviceFacts, context_len: int) -> int:
    size = sa.chunked_prefill_size
    if size == -1:
        return context_len  # chunking disabled: one prefill may be a whole context
    if size is not None:
        return size
    if device.kind == "cpu":
        return min(CPU_DEFAULT_CHUNKED_PREFILL_SIZE, context_len)
    return min(gpu_tier_defaults(sa, device)[0], context_len)


def resolve_max_running_requests(sa, device: DeviceFacts) -> Optional[int]:
    if sa.max_running_requests is not None or device.kind != "cpu":
        return sa.max_running_requests
    return CPU_DEFAULT_MAX_RUNNING_REQUESTS


def planned_attention_backend(sa) -> str:
    """The backend the plan charges: the resolved --attention-backend (the runner and `sglang plan` resolve it with
    configs/resolved.py before planning); an unresolved one would charge a guessed workspace."""
    if sa.attention_backend is None:
        raise ValueError("the attention backend must be resolved (configs/resolved.py) before it is planned")
    return sa.attention_backend


def resolve_cuda_graph_max_bs(sa, device: DeviceFacts) -> int:
    """G: 0 on a CPU, with --disable-cuda-graph, with a backend that has no graph decode path, or with --tp-size > 1
    (server_args_checks.CUDA_GRAPHS_WITH_TP says why; an explicit --cuda-graph-max-bs is refused there)."""
    if device.kind == "cpu" or sa.disable_cuda_graph or planned_attention_backend(sa) not in GRAPH_BACKENDS:
        return 0
    if sa.tp_size > 1:
        return 0
    if sa.cuda_graph_max_bs is not None:
        return sa.cuda_graph_max_bs
    return gpu_tier_defaults(sa, device)[1]


def graph_batch_size(sa, model: ModelFacts, device: DeviceFacts) -> int:
    """G for this model: resolve_cuda_graph_max_bs, or 0 for a MoE model whose fused-experts implementation cannot be
    captured (moe_sizes.CAPTURABLE)."""
    if model.shape.text.sparse_layers and not CAPTURABLE[moe_impl_for(device.kind)]:
        return 0
    return resolve_cuda_graph_max_bs(sa, device)


def resolve_cap(sa, device: DeviceFacts) -> tuple[Optional[int], str]:
    """(cap_bytes, what set it): --max-total-memory-gb, else on CPU without --mem-fraction-static the default share
    of available RAM (budget.CPU_DEFAULT_AVAILABLE_SHARE), else no cap."""
    if sa.max_total_memory_gb:
        return int(sa.max_total_memory_gb * GiB), "--max-total-memory-gb"
    if device.kind == "cpu" and sa.mem_fraction_static is None:
        return (cpu_default_cap_bytes(device.pre_load_free_bytes),
                f"the CPU default ({CPU_DEFAULT_AVAILABLE_SHARE:.0%} of available RAM)")
    return None, "none"


def attention_shape(sa, model: ModelFacts) -> AttentionShape:
    shape = model.shape.attention_shape(model.context_len, sa.tp_size, num_kv_splits=sa.triton_attention_num_kv_splits,
                                        model_dtype_bytes=dtype_bytes(model.dtype),
                                        kv_dtype_bytes=gather_elem_bytes(model.kv_cache_dtype, model.dtype))
    return dataclasses.replace(shape, decode_gather_tokens=decode_gather_tokens(model.kv_cache_dtype,
                                                                                shape.decode_gather_tokens),
                               kv_rotated_parts=len(rotated_parts(model.kv_cache_dtype)))


def backend_inputs(sa, model: ModelFacts, device: DeviceFacts, num_reqs: int, cuda_graph_max_bs: int,
                   num_branch_rows: int = 0) -> BackendInputs:
    """The inputs the attention backend is built with -- and, at R = G = 0, what its declared workspace is fitted
    from. The runner passes the plan's slot count, graph batch size and speculative branch rows."""
    return BackendInputs(attention_shape(sa, model), num_reqs, cuda_graph_max_bs,
                         max_extend_tokens=resolve_chunked_prefill_size(sa, device, model.context_len),
                         page_size=sa.page_size,
                         fused_cpu_decode=device.fused_cpu_decode, cpu_threads=device.cpu_threads,
                         num_branch_rows=num_branch_rows)


def draft_facts(model: ModelFacts, draft_shape: ModelShape) -> ModelFacts:
    """The draft as its attention backend sees it (model_executor/draft_runner.py builds its backend from this): its
    own geometry, the target's context (a draft reads the target's whole prefix), dtype and KV in the target's dtype."""
    return ModelFacts(draft_shape, model.context_len, model.dtype, model.dtype)


def draft_backend_inputs(sa, model: ModelFacts, device: DeviceFacts, draft_shape: ModelShape, num_rows: int):
    """The draft's attention backend inputs: unsharded (tp 1, on rank 0), sized for num_rows request-table rows
    (slots + a tree's branch rows, which a head's beam decodes in one batch), no graphs."""
    return backend_inputs(dataclasses.replace(sa, tp_size=1), draft_facts(model, draft_shape), device, num_rows, 0)


def draft_workspace_spec(sa, model: ModelFacts, device: DeviceFacts, draft_shape: ModelShape):
    """The persistent buffers of the draft's backend per request-table row (per_req_bytes) and fixed."""
    return workspace_spec(planned_attention_backend(sa), draft_backend_inputs(sa, model, device, draft_shape, 0),
                          persistent_only=True)


def activation_formula_bytes(sa, model: ModelFacts, device: DeviceFacts) -> int:
    """The declared activations of one forward at the chunk (model_shapes.activation_bytes, a MoE model's with the
    planned experts' implementation): the dry run's term, and on CPU the runner's too unless it measured more."""
    chunk = resolve_chunked_prefill_size(sa, device, model.context_len)
    moe = moe_workspace(sa, model, device)
    return model.shape.activation_bytes(chunk, sa.tp_size, model.dtype, device.kind,
                                        moe_impl=moe.impl if moe is not None else None)


def cpu_load_residual_bytes(fmt: WeightFormat) -> int:
    """What a CPU start's load adds beyond the tensors (model_shapes.py): less where the lm_head's table is packed."""
    packed = fmt.method == "gguf" and fmt.packed_vocab_bits > 0
    return CPU_PACKED_LOAD_RESIDUAL_BYTES if packed else CPU_LOAD_RESIDUAL_BYTES


def formula_terms(sa, model: ModelFacts, device: DeviceFacts) -> MeasuredTerms:
    """The dry run's stand-ins for the measured terms (declared formulas in model_shapes.py / encoder.py)."""
    shape, tp = model.shape, sa.tp_size
    encoder, detail, encoder_terms = 0, "", ()
    if sa.encoder_mem_reserve is not None:
        encoder = encoder_reservation_bytes(None, 1, sa.encoder_mem_reserve)
        detail = "--encoder-mem-reserve"
    else:
        encoder_terms = formula_encoder_terms(shape, sa, model.dtype, device.kind)
    return MeasuredTerms(
        weight_bytes=(quantized_weight_bytes(shape, model.weight_format, tp, dtype_bytes(model.dtype),
                                             getattr(sa, "ep_size", 1))
                      + (cpu_load_residual_bytes(model.weight_format) if device.kind == "cpu" else 0)),
        activation_bytes=activation_formula_bytes(sa, model, device),
        cuda_graph_bytes=formula_cuda_graph_bytes(graph_batch_size(sa, model, device), shape.text.vocab_size),
        encoder_bytes=encoder,
        sources={"weights": "formula", "activations": "formula", "cuda_graphs": "formula", "encoder": "declared"},
        encoder_detail=detail,
        encoder_terms=encoder_terms,
    )


def formula_cuda_graph_bytes(graph_bs: int, vocab_size: int) -> int:
    return graph_bs * CUDA_GRAPH_BYTES_PER_BS + cuda_graph_logits_bytes(graph_bs, vocab_size)


def cpu_activation_term(formula_bytes: int, measured_bytes: int) -> tuple[int, str]:
    """The activations term on CPU: (bytes, source).

    A CPU's activation peak is read as peak RSS, which moves by several MB between identical starts (glibc arenas,
    oneDNN scratch, thread timing): a plan built on it would give the same flags a different KV pool on each start
    and a dry run could never predict it. So the declared formula (fitted to cover that spread, model_shapes.py) is
    the term on both sides, and the startup measurement guards it: a peak above the formula replaces it (source
    "measured"), so the reservation never falls short of what was seen."""
    if measured_bytes <= formula_bytes:
        return formula_bytes, "formula"
    return measured_bytes, "measured"


def mm_embedding_cache_bytes(sa) -> int:
    """The image-embedding cache's byte budget (--mm-embedding-cache-mb): what the runner gives the cache."""
    return sa.mm_embedding_cache_mb * MiB


def mm_cache_bytes(sa, model: ModelFacts) -> int:
    """The image-embedding cache term: the cache's budget for models with encoders."""
    return mm_embedding_cache_bytes(sa) if model.has_encoder else 0


def grammar_terms(sa, model: ModelFacts, device: DeviceFacts) -> tuple[int, int]:
    """(bitmask bytes per request slot, compiled-grammar cache bytes) of the plan's memory; both 0 with
    --grammar-backend none. The bitmask's device rows are always charged; the compiled grammars live in host memory,
    which is the plan's memory only on a CPU (constrained/token_bitmask.py, GrammarBackend.planned_bytes)."""
    if getattr(sa, "grammar_backend", "none") == "none" or getattr(sa, "is_embedding", False):
        return 0, 0  # an embedding server (--is-embedding) builds no grammar backend
    cache = grammar_cache_budget_bytes(sa.grammar_cache_mb) if device.kind == "cpu" else 0
    return grammar_bitmask_bytes_per_slot(model.shape.text.vocab_size), cache


def moe_workspace(sa, model: ModelFacts, device: DeviceFacts) -> Optional[MoEWorkspaceSpec]:
    """The fused-experts workspace of one rank at the chunk size (moe_sizes.py); None for a dense model. The runner
    allocates exactly this before its profile forward. Quantized experts size it by their bits, so both sides need
    the served weight format in model.weight_format."""
    chunk = resolve_chunked_prefill_size(sa, device, model.context_len)
    return moe_workspace_spec(model.shape.text, chunk, sa.tp_size, model.dtype, device.kind, device.cpu_kernels,
                              getattr(sa, "ep_size", 1), model.weight_format.routed_expert_bits())


def cpu_replica_share(sa, device: DeviceFacts) -> DeviceFacts:
    """On CPU the --dp-size replicas of one server share the RAM: each plans from available / dp_size (the CPU default
    share and every cap then apply within it). On GPUs each replica has its own device: unchanged.
    Likewise the --tp-size ranks of one node (tp_size / nnodes of them): each rank plans from its share."""
    dp = getattr(sa, "dp_size", 1) * max(1, sa.tp_size // getattr(sa, "nnodes", 1))
    if device.kind != "cpu" or dp == 1:
        return device
    return dataclasses.replace(device, pre_load_free_bytes=device.pre_load_free_bytes // dp)


def build_plan_inputs(sa, model: ModelFacts, device: DeviceFacts, measured: MeasuredTerms,
                      mm_embedding_cache_bytes: Optional[int] = None) -> PlanInputs:
    """PlanInputs for this ServerArgs on this device with these measured terms (see the module docstring)."""
    device = cpu_replica_share(sa, device)
    cap_bytes, cap_source = resolve_cap(sa, device)
    graph_bs = graph_batch_size(sa, model, device)
    # the full layers' cell: the KV pool; sliding / chunked / linear layers go to their per-slot pools (layer_pools.py),
    # but a window or chunk that reaches the planned context is a full layer
    cell, layer_pools = split_kv_cell(model.shape.text, model.shape.kv_cell(model.kv_cache_dtype, sa.tp_size,
                                                                            model.dtype), sa.tp_size,
                                      model.context_len, sa.page_size)
    grammar_per_req, grammar_cache = grammar_terms(sa, model, device)
    moe = moe_workspace(sa, model, device)
    embedding = bool(getattr(sa, "is_embedding", False))
    return PlanInputs(
        pre_load_free_bytes=device.pre_load_free_bytes,
        device_total_bytes=device.total_bytes,
        weight_bytes=measured.weight_bytes,
        kv_cell_bytes=cell.cell_bytes,
        kv_fixed_bytes=cell.fixed_bytes,
        layer_pools=layer_pools,
        kv_window_row_bytes=(0 if cell.is_mla or not cell.kv_format or not cell.num_layers else window_bytes_per_slot(
            model.kv_cache_dtype, cell.num_layers, cell.num_kv_heads_per_rank, cell.head_dim,
            cell.v_head_dim or cell.head_dim, planned_attention_backend(sa))),
        kv_detail=(describe_kv(model.kv_cache_dtype, cell.head_dim, cell.v_head_dim or cell.head_dim)
                   if cell.kv_format and not cell.is_mla else ""),
        context_len=model.context_len,
        page_size=sa.page_size,
        mem_fraction_static=sa.mem_fraction_static,
        max_running_requests=resolve_max_running_requests(sa, device),
        max_total_tokens=sa.max_total_tokens,
        cap_bytes=cap_bytes,
        cap_source=cap_source,
        chunked_prefill_size=resolve_chunked_prefill_size(sa, device, model.context_len),
        activation_bytes=measured.activation_bytes,
        workspace=workspace_spec(planned_attention_backend(sa), backend_inputs(sa, model, device, 0, 0)),
        # an embedding server samples nothing: its logits term is the pooled fp32 row per slot (sizes.py)
        logits_bytes=0 if embedding else sampler_fixed_bytes(model.shape.text.vocab_size),
        logits_per_req_bytes=(pooled_bytes_per_slot(model.shape.text.hidden_size) if embedding
                              else sampler_bytes_per_slot(model.shape.text.vocab_size)),
        req_to_token_elem_bytes=REQ_TO_TOKEN_ELEM_BYTES,
        cuda_graph_bytes=measured.cuda_graph_bytes,
        cuda_graph_max_bs=graph_bs,
        encoder_bytes=measured.encoder_bytes,
        encoder_detail=measured.encoder_detail,
        encoder_terms=tuple(measured.encoder_terms),
        mm_cache_bytes=mm_cache_bytes(sa, model) if mm_embedding_cache_bytes is None else mm_embedding_cache_bytes,
        tp_size=sa.tp_size,
        grammar_per_req_bytes=grammar_per_req,
        grammar_cache_bytes=grammar_cache,
        moe_workspace_bytes=moe_workspace_bytes(moe),
        moe_workspace_detail=moe.describe() if moe is not None else "",
        sources=dict(measured.sources),
        speculative=build_spec_inputs(sa, model.shape, model.dtype, model.kv_cache_dtype, device.kind, graph_bs,
                                      formula_cuda_graph_bytes, model.weight_format,
                                      draft_workspace=lambda draft: draft_workspace_spec(sa, model, device, draft)),
    )


def log_cap_rule(inputs: PlanInputs) -> None:
    if inputs.cap_bytes is not None and inputs.cap_source != "--max-total-memory-gb":
        logger.info("Memory budget: %s = %.2f GiB of %.2f GiB available; --max-total-memory-gb or "
                    "--mem-fraction-static override it.", inputs.cap_source, inputs.cap_bytes / GiB,
                    inputs.pre_load_free_bytes / GiB)
