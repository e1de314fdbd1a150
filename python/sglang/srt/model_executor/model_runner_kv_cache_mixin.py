"""Measure -> Plan -> Allocate for the KV cache of one rank.

Every consumer that lives beside the KV pool is a term of the plan, declared by its owner:
    weights             measured (bytes of the loaded tensors)
    activations         measured: peak of one profile forward at the chunked-prefill size
    attention workspace declared by the attention backend, linear in request slots
    logits / sampler    declared here: float32 rows of vocab size per running request
    req_to_token        formula (rows x (context_len + 4) x element size)
    encoder             measured by multimodal models at their largest input (or --encoder-mem-reserve)
    mm_embedding_cache  declared (--mm-embedding-cache-mb) by multimodal models
The pure planner (sglang.srt.mem_plan) solves for the largest KV pool that fits with all of them; this mixin only
measures and allocates what the plan says.
"""

from __future__ import annotations

import logging

import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

logger = logging.getLogger(__name__)

# Default chunked-prefill size on CPU: large enough that one chunk keeps both cores busy, small enough that the
# profile forward and the attention scores of one chunk stay in the hundreds of MiB for small models.
CPU_DEFAULT_CHUNKED_PREFILL_SIZE = 2048
# Request slots on CPU when --max-running-requests is unset. Upstream's rule (2048-4096 slots) is sized for GPUs; on
# CPU every slot costs a sampler row of vocab floats (~1.2 MiB for a 49k vocabulary), so 4096 slots would take GiBs of
# the budget from the KV pool for a batch no CPU decodes efficiently. GPUs keep upstream's rule.
CPU_DEFAULT_MAX_RUNNING_REQUESTS = 256
# float32 [rows, vocab] buffers the logits path and sampler keep alive at once per running request:
# logits, a softmax/log-softmax copy, sorted probs + int64 sort indices (top-p/top-k), the scattered result.
SAMPLER_VOCAB_ROW_BYTES = 4 + 4 + 4 + 8 + 4

KV_DTYPES = {
    "bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16,
    "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2,
}


class ModelRunnerKVCacheMixin:
    # ------------------------------------------------------------------ specs
    def resolve_kv_cache_dtype(self) -> torch.dtype:
        name = self.server_args.kv_cache_dtype
        return self.dtype if name == "auto" else KV_DTYPES[name]

    def kv_cell_bytes(self) -> int:
        mc = self.model_config
        return MHATokenToKVPool.cell_size_bytes(
            mc.num_key_value_heads, mc.head_dim, mc.num_hidden_layers, self.resolve_kv_cache_dtype()
        )

    def resolve_chunked_prefill_size(self) -> int:
        from sglang.srt.mem_plan.tiers import tier_defaults

        size = self.server_args.chunked_prefill_size
        if size == -1:
            return self.context_len  # chunking disabled: one prefill may be a whole context
        if size is not None:
            return size
        if self.device == "cpu":
            return min(CPU_DEFAULT_CHUNKED_PREFILL_SIZE, self.context_len)
        total_mib = torch.cuda.get_device_properties(0).total_memory // 2**20
        return min(tier_defaults(total_mib, self.server_args.tp_size)[0], self.context_len)

    def resolve_max_running_requests(self):
        if self.server_args.max_running_requests is not None or self.device != "cpu":
            return self.server_args.max_running_requests
        return CPU_DEFAULT_MAX_RUNNING_REQUESTS

    def declared_workspace(self):
        """The attention backend's buffers and, for torch_native, the transient of one extend with a cached prefix
        and (without the fused CPU decode kernel) its decode gather."""
        from sglang.srt.layers.attention.torch_native_backend import (
            DECODE_GATHER_TOKENS,
            extend_attention_workspace_bytes,
            fused_cpu_decode_available,
        )
        from sglang.srt.mem_plan import WorkspaceSpec
        from sglang.srt.mem_plan.backends import AttentionShape, workspace_spec

        mc = self.model_config
        backend = self.server_args.attention_backend or "torch_native"
        shape = AttentionShape(
            num_q_heads=mc.num_attention_heads // self.server_args.tp_size,
            head_dim=mc.head_dim,
            context_len=self.context_len,
            architectures=(mc.architecture,),
            num_kv_splits=self.server_args.triton_attention_num_kv_splits,
        )
        spec = workspace_spec(backend, shape)
        if backend != "torch_native":
            return spec
        extend = extend_attention_workspace_bytes(
            mc.num_attention_heads, mc.num_key_value_heads, mc.head_dim, torch.tensor([], dtype=self.dtype).element_size(),
            self.resolve_chunked_prefill_size(), self.context_len,
        )
        spec = spec + WorkspaceSpec(fixed_bytes=extend, name="extend_attention")
        kv_dtype = self.resolve_kv_cache_dtype()
        if not fused_cpu_decode_available(self.device, self.dtype, kv_dtype, kv_dtype, mc.head_dim, mc.head_dim):
            kv_elem = torch.tensor([], dtype=kv_dtype).element_size()
            per_token_layer = mc.num_key_value_heads * 2 * mc.head_dim * kv_elem
            # gathered K/V (+ one contiguous copy inside SDPA) and float32 scores of one decode row group
            gather = DECODE_GATHER_TOKENS * (2 * per_token_layer + 4 * mc.num_attention_heads)
            spec = spec + WorkspaceSpec(fixed_bytes=gather, name="decode_gather")
        return spec

    # ------------------------------------------------------------------ measure
    @torch.inference_mode()
    def profile_activation_bytes(self, num_tokens: int) -> int:
        """Peak extra memory of one prefill forward of num_tokens tokens (a real forward on a scratch pool)."""
        from sglang.srt.layers.attention.attention_registry import create_attention_backend
        from sglang.srt.mem_plan.measure import measure_peak

        mc = self.model_config
        page = self.server_args.page_size
        r2t = ReqToTokenPool(1, self.context_len + 4, self.device)
        kv = MHATokenToKVPool(num_tokens, page, self.resolve_kv_cache_dtype(), mc.num_key_value_heads,
                              mc.head_dim, mc.num_hidden_layers, self.device)
        backend = create_attention_backend(self.server_args.attention_backend or "torch_native",
                                           model_config=mc, req_to_token_pool=r2t, token_to_kv_pool=kv,
                                           device=self.device)
        slots = torch.arange(page, page + num_tokens, dtype=torch.int64, device=self.device)
        r2t.req_to_token[1, :num_tokens] = slots
        ids = torch.randint(0, mc.vocab_size, (num_tokens,), dtype=torch.int64, device=self.device)
        fb = ForwardBatch(
            forward_mode=ForwardMode.EXTEND, batch_size=1, input_ids=ids,
            positions=torch.arange(num_tokens, dtype=torch.int64, device=self.device),
            req_pool_indices=torch.tensor([1], device=self.device),
            seq_lens=torch.tensor([num_tokens], device=self.device), out_cache_loc=slots,
            seq_lens_cpu=[num_tokens], extend_prefix_lens_cpu=[0], extend_seq_lens_cpu=[num_tokens],
            extend_prefix_lens=torch.tensor([0], device=self.device),
            extend_seq_lens=torch.tensor([num_tokens], device=self.device),
            req_to_token_pool=r2t, token_to_kv_pool=kv, attn_backend=backend,
        )
        with measure_peak(self.device) as meter:
            backend.init_forward_metadata(fb)
            self.model.forward(ids, fb.positions, fb)
        del kv, r2t, backend, fb
        return meter.increase_bytes

    # ------------------------------------------------------------------ plan + allocate
    def init_memory_pool(self) -> None:
        from sglang.srt.layers.attention.attention_registry import create_attention_backend
        from sglang.srt.mem_plan import PlanInputs, plan_memory

        sa = self.server_args
        mc = self.model_config
        chunk = self.resolve_chunked_prefill_size()
        activation_bytes = self.profile_activation_bytes(chunk)
        workspace = self.declared_workspace()
        encoder_bytes = int(getattr(self, "encoder_reserve_bytes", 0))
        cap_bytes = int(sa.max_total_memory_gb * 2**30) if sa.max_total_memory_gb else None

        inputs = PlanInputs(
            pre_load_free_bytes=self.pre_load_free_bytes,
            device_total_bytes=self.device_total_bytes,
            weight_bytes=self.weight_bytes,
            kv_cell_bytes=self.kv_cell_bytes(),
            context_len=self.context_len,
            page_size=sa.page_size,
            mem_fraction_static=sa.mem_fraction_static,
            max_running_requests=self.resolve_max_running_requests(),
            max_total_tokens=sa.max_total_tokens,
            cap_bytes=cap_bytes,
            chunked_prefill_size=chunk,
            activation_bytes=activation_bytes,
            workspace=workspace,
            logits_per_req_bytes=mc.vocab_size * SAMPLER_VOCAB_ROW_BYTES,
            req_to_token_elem_bytes=8,
            encoder_bytes=encoder_bytes,
            encoder_detail=getattr(self, "encoder_reserve_detail", ""),
            mm_cache_bytes=int(getattr(self, "mm_embedding_cache_bytes", 0)),
            cuda_graph_max_bs=0 if (self.device == "cpu" or sa.disable_cuda_graph) else sa.cuda_graph_max_bs,
            tp_size=sa.tp_size,
            sources={"weights": "measured", "activations": "measured", "attention_workspace": "declared", "logits": "declared",
                     "encoder": getattr(self, "encoder_reserve_source", "declared")},
        )
        self.memory_plan = plan = plan_memory(inputs)
        logger.info("Memory plan:\n%s", plan.render_table())

        self.max_total_num_tokens = plan.max_total_num_tokens
        self.max_running_requests = plan.max_running_requests
        self.chunked_prefill_size = plan.chunked_prefill_size or chunk
        self.req_to_token_pool = ReqToTokenPool(plan.max_running_requests, self.context_len + 4, self.device)
        self.token_to_kv_pool = MHATokenToKVPool(
            plan.max_total_num_tokens, sa.page_size, self.resolve_kv_cache_dtype(), mc.num_key_value_heads,
            mc.head_dim, mc.num_hidden_layers, self.device,
        )
        self.token_to_kv_pool_allocator = TokenToKVPoolAllocator(plan.max_total_num_tokens, sa.page_size)
        self.attn_backend = create_attention_backend(
            sa.attention_backend or "torch_native", model_config=mc, req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.token_to_kv_pool, device=self.device,
        )
        logger.info(
            "KV cache is allocated. #tokens: %d, #request slots: %d, %.2f GiB, mem_fraction_static=%.3f (%s)",
            plan.max_total_num_tokens, plan.max_running_requests, self.token_to_kv_pool.mem_usage_bytes() / 2**30,
            plan.mem_fraction_static, plan.mem_fraction_static_source,
        )
