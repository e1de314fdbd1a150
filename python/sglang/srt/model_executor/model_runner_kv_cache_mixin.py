"""Measure -> Plan -> Allocate for the KV cache of one rank.

Every consumer that lives beside the KV pool is a term of the plan; the inputs are built by the same function as
`sglang plan` builds them (mem_plan/build.py), from the flags, the model's config.json geometry and what is measured
here:
    weights             measured (bytes of the loaded tensors; on CPU at least the RSS the load added)
    activations         measured: peak of one profile forward at the chunked-prefill size
                        (a CPU start of one rank reuses the peak an earlier start with identical inputs
                        measured: activation_cache.py; the plan's notes then name the cache file)
    encoder             measured by multimodal models at their largest input (or --encoder-mem-reserve)
    moe_workspace       declared (MoE models): allocated from the plan's spec before the profile forward
With tp ranks every rank measures and the plan charges each rank the tightest value: free memory MIN over the
ranks (measure.pre_load_free_bytes), weights and activations MAX over the ranks; so every rank computes the same
per-rank plan (its KV pool holds its KV heads) and the token indices rank 0 hands out are valid on every rank.
Everything else (KV cell, request slots, sampler rows, req_to_token, the attention backend's declared buffers, the
budget cap) is declared or formula, identical to the dry run byte for byte. Allocation uses the plan's numbers and
the same declarations, and check_allocation() asserts the tables and backend buffers match the plan exactly.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Optional

import torch

from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.mla_pool import create_mla_pool
from sglang.srt.mem_cache.quantized_kv_pool import create_kv_pool
from sglang.srt.mem_cache.swa_pool import SWAKVPool
from sglang.srt.model_executor.linear_state import (attach_linear_state, check_linear_served, kv_pool_layers,
                                                     linear_state_bytes, linear_state_info)
from sglang.srt.model_executor.windowed_kv import kv_allocator, windowed_kv_pool, windowed_pool_info
from sglang.srt.mem_plan import build as B
from sglang.srt.mem_plan.sizes import req_to_token_row_len
from sglang.srt.server_args_checks import CUDA_GRAPHS_WITH_TP
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

logger = logging.getLogger(__name__)


class ModelRunnerKVCacheMixin:
    moe_workspace = None  # MoE models: the fused-experts workspace (init_moe_workspace)

    # ------------------------------------------------------------------ facts
    def model_facts(self) -> B.ModelFacts:
        facts = self.model_config.facts
        if not facts.shape.text.num_experts:
            return facts
        # a MoE model's workspace depends on its experts' weight format (quantized experts: their bits,
        # mem_plan/build.moe_workspace), as the dry run sizes it; read after the load (a GGUF's header only, once),
        # so the header's parse does not move the RSS baseline the weights are measured against
        from sglang.srt.configs.resolved import served_weight_format

        fmt = served_weight_format(getattr(self, "quantization", "none"), getattr(self, "gguf_path", None))
        return dataclasses.replace(facts, weight_format=fmt)

    def device_facts(self) -> B.DeviceFacts:
        from sglang.srt.configs.resolved import cpu_kernels_available, fused_cpu_decode

        return B.DeviceFacts(self.device, self.pre_load_free_bytes, self.device_total_bytes,
                             fused_cpu_decode(self.model_facts(), self.device), cpu_kernels_available(self.device),
                             self.cpu_threads.num_threads if self.cpu_threads is not None else 1)

    def backend_inputs(self, num_reqs: int, cuda_graph_max_bs: int, num_branch_rows: int = 0):
        return B.backend_inputs(self.server_args, self.model_facts(), self.device_facts(), num_reqs, cuda_graph_max_bs,
                                num_branch_rows)

    def layer_pools(self):
        """The plan's split of this model's layers (mem_plan/layer_pools.py), computed as build_plan_inputs does."""
        from sglang.srt.mem_plan.layer_pools import split_kv_cell

        mc, sa, facts = self.model_config, self.server_args, self.model_facts()
        cell = mc.shape.kv_cell(mc.kv_cache_dtype_name, sa.tp_size, mc.dtype_name)
        return split_kv_cell(mc.shape.text, cell, sa.tp_size, facts.context_len, sa.page_size)[1]

    def _kv_pool(self, num_tokens: int, r2t: ReqToTokenPool, window_rows: int,
                 windowed_tokens: Optional[int] = None) -> MHATokenToKVPool:
        """The KV pool; a format's recent window (int4, fp8 where the backend reads rings) gets window_rows ring rows
        (+ the scratch row, mem_plan/kv_window.py), handed to r2t's requests while they run (attach_window). A model
        with windowed layers gets SWAKVPool: its windowed pool holds windowed_tokens (None: num_tokens, a scratch
        pool), or is the token pool without full layers."""
        from sglang.srt.mem_plan.kv_quant import recent_window
        from sglang.srt.mem_plan.kv_window import KV_WINDOW_SCRATCH_ROWS

        mc = self.model_config
        cell = mc.shape.kv_cell(mc.kv_cache_dtype_name, self.server_args.tp_size, mc.dtype_name)
        if cell.is_mla:  # one latent row per token and layer, replicated on every TP rank (mla_pool.py)
            return create_mla_pool(mc.kv_cache_dtype_name, num_tokens, self.server_args.page_size, mc.kv_cache_dtype,
                                   cell.kv_lora_rank, cell.qk_rope_head_dim, mc.num_hidden_layers, self.device)
        pools = self.layer_pools()
        if pools.windowed_layers:
            return windowed_kv_pool(self, pools, num_tokens, windowed_tokens, cell)
        check_linear_served(self, pools)  # linear layers: the full layers' KV only (model_executor/linear_state.py)
        windowed = recent_window(mc.kv_cache_dtype_name, self.server_args.attention_backend) and window_rows > 0
        pool = create_kv_pool(mc.kv_cache_dtype_name, num_tokens, self.server_args.page_size, mc.kv_cache_dtype,
                              cell.num_kv_heads_per_rank, mc.head_dim, kv_pool_layers(self, pools), self.device,
                              window_rows=window_rows + KV_WINDOW_SCRATCH_ROWS if windowed else 0,
                              window_req_rows=r2t.req_to_token.shape[0])
        if getattr(pool, "window", None) is not None:
            r2t.attach_window(pool.window)
        return pool

    def _attention_backend(self, r2t, kv, num_reqs: int, cuda_graph_max_bs: int, num_branch_rows: int = 0):
        from sglang.srt.layers.attention.attention_registry import create_attention_backend
        from sglang.srt.mem_plan.kv_quant import check_kv_format_backend

        check_kv_format_backend(self.model_config.kv_cache_dtype_name, self.server_args.attention_backend or
                                "torch_native")

        return create_attention_backend(self.server_args.attention_backend, model_config=self.model_config,
                                        req_to_token_pool=r2t, token_to_kv_pool=kv, device=self.device,
                                        inputs=self.backend_inputs(num_reqs, cuda_graph_max_bs, num_branch_rows))

    # ------------------------------------------------------------------ measure
    @torch.inference_mode()
    def profile_activation_bytes(self, num_tokens: int) -> int:
        """Peak extra memory of one prefill forward of num_tokens tokens (a real forward on a scratch pool, with a
        format's recent window in place: its per-layer copies and temporaries are activations too)."""
        from sglang.srt.mem_plan.measure import measure_peak

        mc = self.model_config
        page = self.server_args.page_size
        r2t = ReqToTokenPool(1, req_to_token_row_len(self.context_len), self.device)
        kv = self._kv_pool(num_tokens, r2t, 1)
        attach_linear_state(self, r2t, self.layer_pools())  # zero-filled: resident before the peak, as the K/V
        # the scratch pool's pages resident before the peak is measured (its torch.empty is backed page by page on a
        # CPU): the K/V the forward writes belong to the kv_cache term, not to the activations
        if isinstance(kv, SWAKVPool) or getattr(kv, "is_mla", False):
            kv.zero_()
        else:
            kv.k_buffer.zero_()
            kv.v_buffer.zero_()
        backend = self._attention_backend(r2t, kv, 1, 0)
        slots = torch.arange(page, page + num_tokens, dtype=torch.int64, device=self.device)
        row = r2t.alloc()  # the request's slot, and its ring row (a windowed format)
        r2t.req_to_token[row, :num_tokens] = slots
        ids = torch.randint(0, mc.vocab_size, (num_tokens,), dtype=torch.int64, device=self.device)
        fb = ForwardBatch(
            forward_mode=ForwardMode.EXTEND, batch_size=1, input_ids=ids,
            positions=torch.arange(num_tokens, dtype=torch.int64, device=self.device),
            req_pool_indices=torch.tensor([row], device=self.device),
            seq_lens=torch.tensor([num_tokens], device=self.device), out_cache_loc=slots,
            seq_lens_cpu=[num_tokens], extend_prefix_lens_cpu=[0], extend_seq_lens_cpu=[num_tokens],
            extend_prefix_lens=torch.tensor([0], device=self.device),
            extend_seq_lens=torch.tensor([num_tokens], device=self.device),
            req_to_token_pool=r2t, token_to_kv_pool=kv, attn_backend=backend, pooling=getattr(self, "pooling", None),
        )
        with measure_peak(self.device) as meter:
            backend.init_forward_metadata(fb)
            self.model.forward(ids, fb.positions, fb)
        del kv, r2t, backend, fb
        return meter.increase_bytes

    def graph_factory(self):
        """What captures decode graphs here: real CUDA graphs on a GPU, nothing on a CPU (decode runs eagerly)."""
        if not str(self.device).startswith("cuda"):
            return None
        from sglang.srt.model_executor.cuda_graph_runner import CudaGraphFactory

        return CudaGraphFactory()

    def _graph_runner(self, r2t, kv, backend, graph_bs: int):
        from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner

        return CudaGraphRunner(self.model.forward, backend, r2t, kv, graph_bs, self.device, self.graph_factory())

    def profile_cuda_graph_bytes(self, graph_bs: int) -> int:
        """Device memory of capturing the decode graphs up to graph_bs, on scratch pools (a dry capture before the
        plan: the graphs hold their activations and outputs, not the pools, so scratch pools measure the same)."""
        if graph_bs <= 0 or self.graph_factory() is None:
            return 0
        page = self.server_args.page_size
        r2t = ReqToTokenPool(graph_bs, req_to_token_row_len(self.context_len), self.device)
        kv = self._kv_pool(page, r2t, 1)  # every captured row reads and writes the dummy page only
        attach_linear_state(self, r2t, self.layer_pools())  # ... and the dummy state row
        backend = self._attention_backend(r2t, kv, graph_bs, graph_bs)
        runner = self._graph_runner(r2t, kv, backend, graph_bs)
        measured = runner.capture().measured_bytes
        del runner, backend, kv, r2t
        return measured

    def measured_terms(self, chunk: int) -> B.MeasuredTerms:
        from sglang.srt.distributed.communication_op import tp_max_int

        from sglang.srt.model_executor.activation_cache import activation_cache_applies, cpu_activation_peak

        mm = self.multimodal
        # a CPU start of one rank reuses the peak an earlier start with the same inputs measured (activation_cache.py)
        self.activation_measurement = cpu_activation_peak(self, chunk) if activation_cache_applies(self) else None
        if self.activation_measurement is not None:
            self.own_activation_bytes = self.activation_measurement.value_bytes
        else:
            self.own_activation_bytes = self.profile_activation_bytes(chunk)
        activation_bytes, activation_source = tp_max_int(self.own_activation_bytes), "measured"
        if str(self.device) == "cpu":
            formula = B.activation_formula_bytes(self.server_args, self.model_facts(), self.device_facts())
            activation_bytes, activation_source = B.cpu_activation_term(formula, activation_bytes)
            logger.info("Activation peak at chunk %d: %s %.1f MB, formula %.1f MB -> plan uses the %s",
                        chunk, self.activation_peak_source(), self.own_activation_bytes / 2**20, formula / 2**20,
                        activation_source)
        return B.MeasuredTerms(
            weight_bytes=tp_max_int(self.weight_bytes),
            activation_bytes=activation_bytes,
            cuda_graph_bytes=self.profile_cuda_graph_bytes(B.graph_batch_size(self.server_args, self.model_facts(),
                                                                              self.device_facts())),
            encoder_bytes=0 if mm.encoder_terms else mm.encoder_reserve_bytes,  # per-modality terms, or one shared
            encoder_detail=mm.encoder_reserve_detail,
            encoder_terms=mm.encoder_terms,
            sources={"weights": "measured", "activations": activation_source, "cuda_graphs": "measured",
                     "encoder": mm.encoder_reserve_source},
        )

    def activation_peak_source(self) -> str:
        """"measured", or "measured (cached <file>)" when an earlier start's measurement was reused."""
        m = getattr(self, "activation_measurement", None)
        return m.source if m is not None else "measured"

    def note_cached_measurement(self, plan, chunk: int):
        """The plan, with a note naming the cache file when the activation peak guarding it was not measured now."""
        m = getattr(self, "activation_measurement", None)
        if m is None or not m.cached:
            return plan
        from sglang.srt.mem_plan.measurement_cache import REMEASURE_ENV

        note = (f"Activation peak at chunk {chunk}: {m.value_bytes:,} B, measured (cached {m.path}) by an earlier "
                f"start with the same model, flags, code and machine; {REMEASURE_ENV}=1 measures it again.")
        return dataclasses.replace(plan, notes=plan.notes + (note,))

    # ------------------------------------------------------------------ plan + allocate
    def init_memory_pool(self) -> None:
        from sglang.srt.mem_plan import plan_memory

        sa = self.server_args
        model, device = self.model_facts(), self.device_facts()
        chunk = B.resolve_chunked_prefill_size(sa, device, self.context_len)
        self.init_moe_workspace()
        inputs = B.build_plan_inputs(sa, model, device, self.measured_terms(chunk),
                                     mm_embedding_cache_bytes=self.multimodal.mm_embedding_cache_bytes)
        B.log_cap_rule(inputs)
        self.memory_plan = plan = self.note_cached_measurement(plan_memory(inputs), chunk)
        logger.info("Memory plan:\n%s", plan.render_table())

        self.max_total_num_tokens = plan.max_total_num_tokens
        self.max_running_requests = plan.max_running_requests
        self.chunked_prefill_size = plan.chunked_prefill_size or chunk
        branch_rows = plan.speculative.branch_rows if plan.speculative is not None else 0  # a tree's side branches
        self.req_to_token_pool = ReqToTokenPool(plan.max_running_requests, req_to_token_row_len(self.context_len),
                                                self.device, branch_rows=branch_rows)
        self.token_to_kv_pool = self._kv_pool(plan.max_total_num_tokens, self.req_to_token_pool, plan.kv_window_rows,
                                              plan.windowed_tokens)
        attach_linear_state(self, self.req_to_token_pool, self.layer_pools(), plan.state_slots)
        self.calibrate_kv_scales()
        self.token_to_kv_pool_allocator = kv_allocator(self.token_to_kv_pool, plan, self.server_args.page_size,
                                                       self.layer_pools().window_tokens)
        self.attn_backend = self._attention_backend(self.req_to_token_pool, self.token_to_kv_pool,
                                                    plan.max_running_requests, plan.cuda_graph_max_bs, branch_rows)
        self.check_allocation()
        self.rank_memory = self.gather_rank_memory()
        self.init_cuda_graphs()
        logger.info(
            "KV cache is allocated. #tokens: %d, #request slots: %d, %.2f GiB, mem_fraction_static=%.3f (%s)",
            plan.max_total_num_tokens, plan.max_running_requests, self.token_to_kv_pool.mem_usage_bytes() / 2**30,
            plan.mem_fraction_static, plan.mem_fraction_static_source,
        )

    def calibrate_kv_scales(self) -> None:
        """fp8 KV: per-(layer, KV head) scales from a startup forward (kv_calibration.py); others: nothing."""
        from sglang.srt.model_executor.kv_calibration import calibrate_kv_scales

        calibrate_kv_scales(self)

    def kv_cache_info(self) -> dict:
        """For /server_info: the KV format, its bytes per token on this rank (every scale byte counted), and the
        capacity gain over a bf16 cache of the same budget (mem_plan/kv_quant.py)."""
        from sglang.srt.mem_plan.kv_quant import quality_flag, recent_window, sink_tokens

        mc, plan = self.model_config, self.memory_plan
        cell = mc.shape.kv_cell(mc.kv_cache_dtype_name, self.server_args.tp_size, mc.dtype_name)
        info = {"kv_cache_dtype": mc.kv_cache_dtype_name, "bytes_per_token": cell.cell_bytes,
                "fixed_bytes": cell.fixed_bytes, "bf16_bytes_per_token": cell.bf16_cell_bytes,
                "capacity_gain_vs_bf16": round(cell.bf16_cell_bytes / cell.cell_bytes, 4),
                "max_total_num_tokens": plan.max_total_num_tokens,
                "quality_flag": quality_flag(mc.kv_cache_dtype_name, self.server_args.attention_backend) or None,
                # the recent window and the sinks: tokens a request slot keeps in bf16 (its newest, its first), and
                # the ring's bytes (the kv_window term)
                "recent_window_tokens": recent_window(mc.kv_cache_dtype_name, self.server_args.attention_backend),
                "sink_tokens": sink_tokens(mc.kv_cache_dtype_name, self.server_args.attention_backend),
                "window_bytes": self.allocated_bytes()["kv_window"],
                # the ring rows running requests hold (mem_plan/kv_window.py), and the requests that started with
                # every row taken (they read their whole history through the codes)
                "window_rows": plan.kv_window_rows,
                "requests_without_window_row": (self.token_to_kv_pool.window.rows.num_without_row
                                                if getattr(self.token_to_kv_pool, "window", None) is not None else 0)}
        if cell.is_mla:  # the latent pool: one row of c_kv | k_pe per token and layer, the same on every rank
            info.update(pool_layout="mla_latent", row_width=cell.kv_lora_rank + cell.qk_rope_head_dim,
                        kv_lora_rank=cell.kv_lora_rank, qk_rope_head_dim=cell.qk_rope_head_dim)
        info.update(windowed_pool_info(self.token_to_kv_pool_allocator))  # sizes and pages in use (windowed layers)
        info.update(linear_state_info(self.req_to_token_pool))  # per-slot state of linear layers
        scale_info = getattr(self.token_to_kv_pool, "scale_info", None)
        if scale_info is not None:
            info.update(scale_info())
        return info

    def init_moe_workspace(self) -> None:
        """MoE models: allocate the fused-experts workspace the plan charges (mem_plan/build.moe_workspace) and give it
        to every MoE layer, before the profile forward, which runs in it (so the measured peak leaves it out)."""
        from sglang.srt.layers.moe.moe_layer import attach_moe_workspace

        spec = B.moe_workspace(self.server_args, self.model_facts(), self.device_facts())
        self.moe_workspace = attach_moe_workspace(self.model, spec, self.device)

    def gather_rank_memory(self) -> list:
        """What each TP rank measured and allocated (rank order), for /server_info; [this rank] at tp == 1."""
        from sglang.srt.distributed.communication_op import tp_all_gather_object

        mine = {"tp_rank": getattr(self, "tp_rank", 0), "pid": os.getpid(), "device": self.device,
                "pre_load_rss_bytes": getattr(self, "pre_load_rss_bytes", 0), "weight_bytes": self.weight_bytes,
                "activation_bytes": self.own_activation_bytes,
                "activation_source": self.activation_peak_source(), "allocated_bytes": self.allocated_bytes(),
                "max_total_num_tokens": self.max_total_num_tokens,
                "plan_total_bytes": self.memory_plan.total_bytes}
        return tp_all_gather_object(mine)

    def allocated_bytes(self) -> dict:
        """Bytes actually allocated for the planned tables, by plan term."""
        r2t = self.req_to_token_pool.req_to_token
        swa = self.token_to_kv_pool if isinstance(self.token_to_kv_pool, SWAKVPool) else None
        return {
            "req_to_token": r2t.numel() * r2t.element_size(),
            "kv_cache": self.token_to_kv_pool.mem_usage_bytes(),  # the dummy page included, as the plan charges it
            "kv_window": (self.token_to_kv_pool.window.mem_usage_bytes()
                          if getattr(self.token_to_kv_pool, "window", None) is not None else 0),
            "kv_windowed": swa.windowed_mem_usage_bytes() if swa is not None else 0,
            "kv_windowed_map": swa.map_mem_usage_bytes() if swa is not None else 0,
            "linear_state": linear_state_bytes(self.req_to_token_pool),
            "attention_workspace_persistent": self.attn_backend.allocated_bytes(),
            "moe_workspace": self.moe_workspace.allocated_bytes() if self.moe_workspace is not None else 0,
        }

    def check_allocation(self) -> None:
        """The pools and the backend hold exactly the bytes the plan charged for them."""
        plan, got = self.memory_plan, self.allocated_bytes()
        declared = self.attn_backend.declared_persistent_bytes()
        assert got["req_to_token"] == plan.bytes_of("req_to_token"), (got, plan.bytes_of("req_to_token"))
        assert got["kv_cache"] == plan.bytes_of("kv_cache"), (got, plan.bytes_of("kv_cache"))
        assert got["kv_window"] == plan.bytes_of("kv_window"), (got, plan.bytes_of("kv_window"))
        for term in ("kv_windowed", "kv_windowed_map", "linear_state"):  # windowed pool, its slot map, linear state
            assert got[term] == plan.bytes_of(term), (term, got, plan.bytes_of(term))
        assert got["moe_workspace"] == plan.bytes_of("moe_workspace"), (got, plan.bytes_of("moe_workspace"))
        assert got["attention_workspace_persistent"] == declared <= plan.bytes_of("attention_workspace"), (
            got, declared, plan.bytes_of("attention_workspace"))

    # ------------------------------------------------------------------ CUDA graphs (after allocation)
    def init_cuda_graphs(self) -> None:
        """Capture the decode graphs over the real pools and check their memory against the plan's term."""
        from sglang.srt.model_executor.cuda_graph_runner import check_graph_memory, graph_memory_error

        plan = self.memory_plan
        self.cuda_graph_runner, self.cuda_graph_capture, self.cuda_graph_check = None, None, None
        if plan.cuda_graph_max_bs <= 0 or self.graph_factory() is None:
            return
        runner = self._graph_runner(self.req_to_token_pool, self.token_to_kv_pool, self.attn_backend,
                                    plan.cuda_graph_max_bs)
        self.cuda_graph_capture = runner.capture()
        slack = plan.bytes_of("safety_margin") + plan.headroom_bytes
        self.cuda_graph_check = check = check_graph_memory(plan.bytes_of("cuda_graphs"),
                                                           self.cuda_graph_capture.measured_bytes, slack)
        if not check.fits:
            from sglang.srt.mem_plan import MemoryPlanError

            raise MemoryPlanError(graph_memory_error(check, plan.cuda_graph_max_bs))
        if check.excess_bytes:
            logger.warning("CUDA graphs took %d B more than planned; the safety margin absorbs it.",
                           check.excess_bytes)
        self.cuda_graph_runner = runner

    def cuda_graph_info(self) -> dict:
        """For /server_info: whether decode replays CUDA graphs, and their planned vs measured memory."""
        runner = getattr(self, "cuda_graph_runner", None)
        if runner is None:
            if self.graph_factory() is None:
                reason = f"{self.device}: no CUDA graphs here, decode runs eagerly"
            elif self.server_args.disable_cuda_graph:
                reason = "--disable-cuda-graph"
            elif self.server_args.tp_size > 1:
                reason = f"--tp-size {self.server_args.tp_size}: {CUDA_GRAPHS_WITH_TP}"
            elif self.moe_workspace is not None:
                reason = "the MoE experts' implementation cannot be captured (mem_plan/moe_sizes.py CAPTURABLE)"
            else:
                reason = f"--attention-backend {self.server_args.attention_backend} has no graphs"
            return {"enabled": False, "reason": reason}
        return {"enabled": True, "batch_sizes": runner.batch_sizes, "num_replays": runner.num_replays,
                "planned_bytes": self.cuda_graph_check.planned_bytes,
                "measured_bytes": self.cuda_graph_check.measured_bytes}
