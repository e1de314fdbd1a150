"""ModelRunner: owns the model, the memory pools and the attention backend of one rank, and runs forwards.

Startup order (each step's memory is accounted in the plan, see model_runner_kv_cache_mixin.py):
    1. measure free memory before anything is loaded (pre_load_free_bytes)
    2. load the weights (weight_bytes measured from the loaded tensors; on CPU, at least the RSS the load added)
    3. multimodal models: profile the encoder at its largest input x encoder batch size (reservation, measured)
       and set up the processor, embedding cache and encoder admission (multimodal/runner_setup.py)
       profile one forward at the chunked-prefill size (activation peak, measured)
       GPU with a graph backend: capture the decode graphs on scratch pools (cuda_graphs, measured)
    4. plan (pure) -> allocate the request table, KV pool, allocator and attention backend
    5. capture the decode graphs over the real pools, checked against the plan (cuda_graph_runner.py)
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time

import torch

from sglang.srt.configs.resolved import resolve_backend, resolve_device, served_quantization, use_fp32_kernels
from sglang.srt.layers.quantization.linear_method import quant_forward_rule
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, move_to_device
from sglang.srt.model_executor.model_runner_kv_cache_mixin import ModelRunnerKVCacheMixin
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.cpu_threads import apply_cpu_threads, plan_cpu_threads

logger = logging.getLogger(__name__)


def _device_total_bytes(device: str) -> int:
    if device == "cpu":
        import psutil

        return int(psutil.virtual_memory().total)
    return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)


def _unique_tensor_bytes(model) -> int:
    """Bytes of the model's parameters and buffers, each storage counted once (tied weights share one)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        key = (t.untyped_storage().data_ptr(), t.device)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


class ModelRunner(ModelRunnerKVCacheMixin):
    cuda_graph_runner = None  # set by init_cuda_graphs() where decode replays graphs
    # a hidden-state draft head's features (ForwardBatch.capture_hidden: "last" / "aux"; draft_head.enable_capture):
    # set, every forward keeps them and captured_batch is the last forward's batch (its captured_hidden rows)
    capture_hidden = None
    captured_batch = None
    pooling = None  # --is-embedding: "last" / "mean" (configs/pooling.py); every forward then returns pooled rows

    def __init__(self, server_args: ServerArgs, tp_rank: int = 0):
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.mem_plan.measure import cpu_current_rss_bytes, pre_load_free_bytes, trim_cpu_heap
        from sglang.srt.model_loader import load_model, resolve_model_path

        started = time.perf_counter()
        self.startup_s = {}  # seconds per startup phase, for the scheduler's startup log line
        self.device = resolve_device(server_args.device)
        # the one resolution of the backend (`sglang plan` calls the same functions, configs/resolved.py); everything
        # after reads the resolved name from self.server_args
        self.attention_backend_choice = resolve_backend(server_args.attention_backend, self.device)
        requested_backend = server_args.attention_backend
        server_args = dataclasses.replace(server_args, attention_backend=self.attention_backend_choice.name)
        self.server_args = server_args
        # tensor parallel: join the group before anything is measured (measurements are reduced over the ranks)
        self.tp_rank, self.tp_size = tp_rank, server_args.tp_size
        ranks_per_node = server_args.tp_size // server_args.nnodes
        if self.tp_size > 1:
            from sglang.srt.distributed.parallel_state import init_tp_group

            init_tp_group(self.tp_size, tp_rank, server_args.dist_init_addr, self.device, server_args.ep_size)
        self.cpu_threads = None
        if self.device == "cpu":
            # the ranks of a node share its cores (utils/cpu_threads.py: affinity, cgroup quota, the HTTP process)
            self.cpu_threads = plan_cpu_threads(server_args.num_threads, ranks_per_node, tp_rank % ranks_per_node)
            apply_cpu_threads(self.cpu_threads)
        seed = server_args.random_seed if server_args.random_seed is not None else random.randint(0, 2**31 - 1)
        torch.manual_seed(seed)
        random.seed(seed)

        self.model_path = resolve_model_path(server_args, dense_linears=False)  # completed below where needed
        self.tokenizer_path = server_args.tokenizer_path or self.model_path
        self.model_config = ModelConfig.from_server_args(server_args, self.model_path)
        if self.model_config.shape.text.is_mla:  # the config read: an MLA model's GPU default differs (before weights)
            self.attention_backend_choice = resolve_backend(requested_backend, self.device, mla=True)
            server_args = dataclasses.replace(server_args, attention_backend=self.attention_backend_choice.name)
            self.server_args = server_args
        logger.info("Attention backend: %s (%s)", self.attention_backend_choice.name,
                    self.attention_backend_choice.reason)
        self.dtype = self.model_config.dtype
        if server_args.is_embedding:
            from sglang.srt.configs.pooling import resolve_pooling

            self.pooling = resolve_pooling(self.model_path)
            logger.info("Embedding server: %s pooling, L2-normalized", self.pooling)
        # fp32 layers take the CPU kernels' fp32 forms where --dtype auto chose float32 (a CPU level without bf16)
        self.fp32_kernels = use_fp32_kernels(server_args.dtype, self.device, self.model_config.dtype_name)
        self.startup_s["config"] = time.perf_counter() - started
        from sglang.srt.model_loader.model_path import gguf_source_path

        # the linear layers' weight format (layers/quantization/): the default CPU start serves GGUF blocks
        self.gguf_path = gguf_source_path(server_args)
        # the checkpoint's quantization_config as the loaded config holds it (a hub id's too, not only a local path)
        hf_quant = getattr(self.model_config.hf_config, "quantization_config", None)
        self.quantization = served_quantization(server_args, self.gguf_path, self.device, self.model_config.dtype_name,
                                                hf_quant_config=hf_quant if isinstance(hf_quant, dict) else None)
        # --quantization gguf: the vocabulary table held packed, from the file's header, read before the RSS
        # baseline below (the parse leaves ~20 MB in this process that loading the weights does not cost)
        self.packed_vocab = ""
        if self.quantization != "gguf":  # a dense or w8a8_int8 start of a GGUF reads its linear layers dequantized
            from sglang.srt.model_loader.model_path import ensure_dense_linears

            ensure_dense_linears(self.model_path)
        else:
            from sglang.srt.mem_plan.quantization_sizes import gguf_packed_vocab

            self.packed_vocab = gguf_packed_vocab(self.gguf_path)[0]

        # on CPU the kernels run where this CPU's ISA level has them (jit_kernel/cpu_isa.py): bf16 GEMV/GEMM, attention
        # and norms from avx512_bf16, the quantized GEMM from avx2; load (or build) them now, so their code is part of
        # the baseline below and the log says which path decode takes
        self.cpu_kernels = None
        self.cpu_isa = None
        if self.device == "cpu":
            from sglang.jit_kernel.cpu_isa import cpu_isa, native_cpu_isa

            self.cpu_isa = {"level": cpu_isa(), "native": native_cpu_isa(), "dtype": self.model_config.dtype_name,
                            "quantization": self.quantization}
            logger.info("CPU ISA level %s (native %s): dtype %s, weights %s", cpu_isa(), native_cpu_isa(),
                        self.model_config.dtype_name, self.quantization)
        if self.device == "cpu" and (self.dtype == torch.bfloat16 or self.quantization != "none"):
            from sglang.jit_kernel.cpu_ops import cpu_kernels_summary

            self.cpu_kernels = cpu_kernels_summary()
            logger.info("CPU kernels: %s", self.cpu_kernels)
        self.startup_s["kernels"] = time.perf_counter() - started - self.startup_s["config"]
        # 1. measure before load
        self.pre_load_free_bytes = pre_load_free_bytes(self.device)
        # what this process held before loading: the baseline that measured usage is compared against
        self.pre_load_rss_bytes = cpu_current_rss_bytes() if self.device == "cpu" else 0
        self.device_total_bytes = _device_total_bytes(self.device)
        # 2. load
        t0 = time.perf_counter()
        with torch.no_grad():
            self.model = load_model(self.model_config, self.device, self.quantization, self.gguf_path,
                                    self.packed_vocab)
        tensor_bytes = _unique_tensor_bytes(self.model)
        self.weight_bytes = tensor_bytes
        if self.device == "cpu":
            # what loading cost this process: the tensors, plus what the loader's freed temporaries still hold in
            # the heap after returning the free parts to the OS (SmolLM2: 287 MiB of tensors; +310-318 MiB of RSS
            # without the trim, run to run; about the tensors with it)
            trim_cpu_heap()
            self.weight_bytes = max(tensor_bytes, cpu_current_rss_bytes() - self.pre_load_rss_bytes)
        self.startup_s["load"] = time.perf_counter() - t0
        logger.info("Loaded %s in %.2f s (%.1f MiB of weights, %.1f MiB charged to the plan, dtype %s)", self.model_path,
                    self.startup_s["load"], tensor_bytes / 2**20, self.weight_bytes / 2**20, self.dtype)
        # 3. multimodal: encoder reservation and embedding cache, set before the plan charges them
        from sglang.srt.multimodal.runner_setup import setup_multimodal

        self.multimodal = setup_multimodal(self.model, self.model_config, self.model_path, server_args, self.device)
        # 3-4. profile, plan, allocate
        t0 = time.perf_counter()
        self.init_memory_pool()
        self.startup_s["memory_plan"] = time.perf_counter() - t0
        self.init_draft_runner()

    def init_draft_runner(self) -> None:
        """Speculative decoding with a draft model (STANDALONE) or head (EAGLE, EAGLE3, NEXTN), over the target's request
        table and slot range; a head's features are captured by every forward from then on (draft_head.py)."""
        spec = self.server_args.speculative()
        self.draft_runner = None
        if spec is None or spec.algorithm not in ("STANDALONE", "EAGLE", "EAGLE3", "NEXTN"):
            return
        from sglang.srt.model_executor.draft_runner import build_draft_runner

        # NEXTN's MTP layer ships in the target's own checkpoint unless a path names another copy
        path = spec.draft_model_path or self.server_args.model_path
        # rank 0 only (with tp > 1 the followers propose nothing: draft_runner.build_draft_runner)
        self.draft_runner = build_draft_runner(self, path, spec.algorithm)
        if self.draft_runner is not None and spec.algorithm != "STANDALONE":
            from sglang.srt.model_executor.draft_head import enable_capture

            enable_capture(self, spec.algorithm, self.draft_runner.model_config.hf_config)

    @property
    def context_len(self) -> int:
        return self.model_config.context_len

    # read by the scheduler and the offline Engine
    @property
    def encoder_admission(self):
        return self.multimodal.encoder_admission

    @property
    def mm_processor(self):
        return self.multimodal.mm_processor

    @torch.inference_mode()
    def forward(self, forward_batch: ForwardBatch) -> torch.Tensor:
        """Logits (float32 [B, V]) of the last token of each request in the batch, or their greedy token ids (int64
        [B]) where the LogitsProcessor set forward_batch.greedy_fused. With tp ranks, rank 0 first
        broadcasts the batch so every rank runs the same forward (distributed/batch_sync.py); a failure then leaves
        the ranks out of step, so it is fatal (TpRankFailure) instead of confined to the batch's requests."""
        if self.tp_size == 1:
            return self.forward_local(forward_batch)
        from sglang.srt.distributed.batch_sync import FORWARD, TpRankFailure, pack_forward_batch
        from sglang.srt.distributed.communication_op import tp_broadcast_object

        slot_map = getattr(getattr(self, "token_to_kv_pool", None), "slot_map", None)  # windowed layers' (swa_pool)
        try:
            tp_broadcast_object((FORWARD, pack_forward_batch(forward_batch, self.req_to_token_pool.req_to_token_host,
                                                             self.req_to_token_pool.window, slot_map)))
            return self.forward_local(forward_batch)
        except Exception as e:  # noqa: BLE001
            raise TpRankFailure(f"TP rank 0: the forward failed, the ranks are out of step: "
                                f"{type(e).__name__}: {e}") from e

    def ping_tp(self) -> None:
        """Rank 0, idle: one no-op broadcast, which fails (TpRankFailure) when a rank is gone."""
        if self.tp_size == 1:
            return
        from sglang.srt.distributed.batch_sync import PING, TpRankFailure
        from sglang.srt.distributed.communication_op import tp_broadcast_object

        try:
            tp_broadcast_object((PING, None))
        except Exception as e:  # noqa: BLE001
            raise TpRankFailure(f"TP rank 0 lost another rank while idle: {type(e).__name__}: {e}") from e

    def shutdown_tp(self) -> None:
        """Rank 0: release the followers (they leave their loop and exit) and leave the group."""
        if self.tp_size == 1:
            return
        from sglang.srt.distributed.batch_sync import stop_message
        from sglang.srt.distributed.communication_op import tp_broadcast_object
        from sglang.srt.distributed.parallel_state import destroy_tp_group

        tp_broadcast_object(stop_message())
        destroy_tp_group()
        self.tp_size = 1

    @torch.inference_mode()
    def forward_local(self, forward_batch: ForwardBatch) -> torch.Tensor:
        """This rank's forward (every rank calls it with the same batch)."""
        move_to_device(forward_batch, self.device)
        self.req_to_token_pool.sync_to_device()  # the rows the scheduler wrote on the host since the last forward
        forward_batch.req_to_token_pool = self.req_to_token_pool
        forward_batch.token_to_kv_pool = self.token_to_kv_pool
        forward_batch.attn_backend = self.attn_backend
        if self.capture_hidden is not None:  # eager: the decode graphs hand no features over
            forward_batch.capture_hidden = self.capture_hidden
            self.captured_batch = forward_batch
        elif self.cuda_graph_runner is not None and self.cuda_graph_runner.can_run(forward_batch):
            return self.cuda_graph_runner.replay(forward_batch)  # decode of <= cuda_graph_max_bs requests
        self.attn_backend.init_forward_metadata(forward_batch)
        with quant_forward_rule(forward_batch.forward_mode.is_decode()):
            return self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)
