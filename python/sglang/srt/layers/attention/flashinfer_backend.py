"""FlashInferAttnBackend: paged attention through flashinfer's wrappers (CUDA; fp16/bf16, KV fp16/bf16 or fp8).

fp8 KV (--kv-cache-dtype fp8_e4m3 / fp8_e5m2): plan() gets kv_data_type = the pool's fp8 dtype, the paged cache is
the pool's raw fp8 view, and run() gets the layer's k_scale / v_scale floats (flashinfer takes one per layer: the
startup calibration makes the pool's scales per layer for it). The int formats are refused (naming triton). fp8 keys
stored turned (k @ R, unless the scales are a checkpoint's: QuantizedKVPool.turned_parts) take the query turned too.

Memory (declared in mem_plan/backends.py, allocated once by the base class, never again per step):
    workspace            uint8 [384 MiB; 512 MiB for Qwen2/Qwen3/MiMo]  the float workspace of every wrapper
    int_workspace        uint8 [8 MiB]  the plan-info workspace; each wrapper allocates a private one in its
                         constructor, which is swapped for this shared one right away (reset_workspace_buffer)
    kv_indptr_0          int32 [S + 1]  kv_indptr of the batch (eager) / of the captured batch (graphs); S = R + the
                         request table's branch rows (a speculative tree's side branches: sequences of their own)
    qo_indptr            int32 [S + 1]  extend: rows of each sequence's new tokens
    kv_last_page_len     int32 [S + 1]
    kv_indices_0         int32 [S * ceil(context_len / page_size)]  every batch's page ids, gathered into it by one
                         kernel (paged_kv_indices.py); also the fixed page-index buffer graph decode wrappers read
All wrappers share the two workspaces: each forward plans before it runs, so one plan's scratch is never live while
another wrapper runs.

Per batch (init_forward_metadata): the page table (paged_kv_indices.py) from req_to_token, then `plan()` of the
prefill wrapper (EXTEND, causal, bottom-right aligned: new token i of a request with prefix P sees keys <= P + i) or
of the decode wrapper (DECODE); each layer then writes its new K/V to the pool and calls `run(q, (k_cache, v_cache))`
with the pool viewed as [pages, page_size, kv_heads, head_dim] (NHD).

CUDA graphs: `init_forward_metadata_capture_cuda_graph(bs, ...)` builds a decode wrapper with use_cuda_graph=True
whose indptr / indices / last-page buffers are views of the planned ones (fixed addresses a graph can replay);
`init_forward_metadata_replay_cuda_graph(bs, ...)` re-plans it for the live batch before the replay.

Windowed layers (layers/radix_attention.py; the plan's num_wrappers = 2 declares kv_indptr_1 / kv_indices_1): a layer in
the pool's windowed part runs through a second prefill / decode wrapper, planned at the forward's first such layer
with window_left = W - 1 over that layer's own table: each request's pages from the one holding its window's first
key (window_metadata.window_start) to its end, named through the pool's slot_map (paged_kv_indices.py), so no freed
page is read. Sinks go to run(sinks=...) (flashinfer-python 0.7.4's wrappers take them; a flashinfer whose run() has
no sinks argument is refused at the first sink layer). Not wired, refused naming the way out: a logit cap, a window shorter than the context on a layer of
the full pool, two window lengths in one model, and CUDA graphs over windowed layers (--disable-cuda-graph).

MLA models (the latent pool, pool.is_mla): every layer runs through BatchMLAPagedAttentionWrapper instead
(flashinfer_mla.py: the row split into its ckv / kpe views, planned at a forward's first layer with that layer's
scale); the paged wrappers are not built.

The softmax scale is a plan argument in flashinfer; it is head_dim ** -0.5 (every model here) and each layer's
`scaling` is checked against it.
"""

from __future__ import annotations

import inspect
from typing import Optional, Sequence

import torch

from sglang.srt.layers.attention.flashinfer_mla import FlashInferMLA
from sglang.srt.layers.attention.paged_kv_indices import PageTable, build_page_table, extend_lens, seq_lens
from sglang.srt.layers.attention.planned_gpu_backend import PlannedGpuAttnBackend
from sglang.srt.layers.attention.window_metadata import window_start

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
MAX_CUDA_CORE_DECODE_GROUP = 4  # query heads per KV head above which decode runs on tensor cores


def check_kernel_dtype(backend: str, q_dtype: torch.dtype) -> None:
    if q_dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"--attention-backend {backend} runs float16/bfloat16 models, not {q_dtype}: use "
                         "--dtype bfloat16, or --attention-backend triton / torch_native for float32.")


def fp8_layer_scales(backend: str, pool) -> Optional[list]:
    """The (k_scale, v_scale) host floats of every layer of an fp8 pool (read once: the scales are fixed after the
    startup calibration), None for a plain pool. The kernels take one scale per layer; an int format is refused."""
    fmt = getattr(pool, "kv_format", None)
    if fmt is None:  # a plain pool (MHATokenToKVPool)
        return None
    if not getattr(pool, "is_fp8", False):
        raise ValueError(f"--attention-backend {backend} cannot read --kv-cache-dtype {fmt} (its kernels take fp16/"
                         "bf16/fp8 K/V only): use --attention-backend triton, which dequantizes it in-kernel.")
    k, v = pool.fixed["k_scale"], pool.fixed["v_scale"]
    for name, s in (("k", k), ("v", v)):
        if not bool((s == s[:, :1]).all()):
            raise ValueError(f"--attention-backend {backend} takes one fp8 {name} scale per layer, and the pool's "
                             "differ between KV heads (kv_calibration.py makes them per layer for it): use "
                             "--attention-backend triton for per-head scales.")
    return list(zip(k[:, 0].tolist(), v[:, 0].tolist()))


class FlashInferAttnBackend(PlannedGpuAttnBackend):
    backend_name = "flashinfer"
    per_layer_kv_scales = True  # fp8: one k_scale / v_scale per layer (run()'s floats)
    kernel_module = "flashinfer"
    install_hint = "pip install flashinfer-python"
    device_kind = "an NVIDIA GPU (CUDA)"

    @classmethod
    def device_problem(cls, device: str) -> Optional[str]:
        problem = super().device_problem(device)
        if problem is None and torch.version.hip:
            return "flashinfer has no ROCm build (on AMD GPUs use --attention-backend aiter or triton)"
        return problem

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        pool, shape = self.token_to_kv_pool, self.inputs.shape
        self.q_dtype = getattr(self.model_config, "dtype", None) or pool.dtype
        check_kernel_dtype(self.backend_name, self.q_dtype)
        # an MLA model (the latent pool, mem_cache/mla_pool.py): every layer through the MLA wrapper (flashinfer_mla.py)
        self.mla = FlashInferMLA(self) if getattr(pool, "is_mla", False) else None
        if self.mla is not None:
            return
        self.kv_scales = fp8_layer_scales(self.backend_name, pool)  # [(k_scale, v_scale)] per layer, or None
        if shape.num_wrappers > 2:
            raise NotImplementedError("flashinfer: cross attention (a third wrapper) is not wired; use "
                                      "--attention-backend torch_native")
        self.windowed_wrappers = shape.num_wrappers == 2  # a second wrapper for the windowed layers
        if self.windowed_wrappers and self.inputs.graph_bs > 0:
            raise ValueError("flashinfer: CUDA graphs over windowed layers are not wired; start with "
                             "--disable-cuda-graph, or use --attention-backend triton (its graphs take the window)")
        self.num_q_heads, self.num_kv_heads = shape.num_q_heads, pool.head_num
        self.head_dim, self.page_size = pool.head_dim, pool.page_size
        self.sm_scale = self.head_dim ** -0.5
        self.decode_use_tensor_cores = self.num_q_heads // self.num_kv_heads > MAX_CUDA_CORE_DECODE_GROUP
        fi = self.kernels
        self.prefill_wrapper = self._shared_workspaces(
            fi.BatchPrefillWithPagedKVCacheWrapper(self.buffers["workspace"], "NHD"))
        self.decode_wrapper = self._shared_workspaces(fi.BatchDecodeWithPagedKVCacheWrapper(
            self.buffers["workspace"], "NHD", use_tensor_cores=self.decode_use_tensor_cores))
        if self.windowed_wrappers:
            self.win_prefill_wrapper = self._shared_workspaces(
                fi.BatchPrefillWithPagedKVCacheWrapper(self.buffers["workspace"], "NHD"))
            self.win_decode_wrapper = self._shared_workspaces(fi.BatchDecodeWithPagedKVCacheWrapper(
                self.buffers["workspace"], "NHD", use_tensor_cores=self.decode_use_tensor_cores))
        self.win_window: Optional[int] = None  # the window the windowed wrapper is planned with in this forward
        self.forward_batch = None
        self.run_takes_sinks = "sinks" in inspect.signature(fi.BatchPrefillWithPagedKVCacheWrapper.run).parameters
        self.graph_decode_wrappers: dict = {}  # captured batch size -> wrapper with fixed buffers
        self.active_decode_wrapper = self.decode_wrapper
        self.table: Optional[PageTable] = None

    def _shared_workspaces(self, wrapper):
        wrapper.reset_workspace_buffer(self.buffers["workspace"], self.buffers["int_workspace"])
        return wrapper

    # ------------------------------------------------------------------ plan (once per forward)
    def _plan_kwargs(self) -> dict:
        return dict(sm_scale=self.sm_scale, q_data_type=self.q_dtype, kv_data_type=self.token_to_kv_pool.dtype)

    def _decode_table(self, req_pool_indices, lens: Sequence[int], rows_cpu: Sequence[int]) -> PageTable:
        return build_page_table(self.req_to_token_pool.req_to_token, req_pool_indices, lens, self.page_size,
                                self.buffers["kv_indptr_0"], self.buffers["kv_last_page_len"],
                                self.buffers["kv_indices_0"], rows_cpu)

    def _plan_decode(self, wrapper, table: PageTable) -> None:
        # plan() reads indptr and last-page lengths on the host: the host arrays, so it never reads the device back
        wrapper.plan(table.kv_indptr_host, table.kv_indices, table.kv_last_page_len_host, self.num_q_heads,
                     self.num_kv_heads, self.head_dim, self.page_size, pos_encoding_mode="NONE", **self._plan_kwargs())

    def init_forward_metadata(self, forward_batch) -> None:
        if self.mla is not None:
            return self.mla.init_forward_metadata(forward_batch)
        fb, lens = forward_batch, seq_lens(forward_batch)
        self.forward_batch, self.win_window = fb, None
        if fb.forward_mode.is_decode():
            self.table = self._decode_table(fb.req_pool_indices, lens, fb.req_pool_indices_cpu or None)
            self.active_decode_wrapper = self.decode_wrapper
            self._plan_decode(self.decode_wrapper, self.table)
            return
        t = build_page_table(self.req_to_token_pool.req_to_token, fb.req_pool_indices, lens, self.page_size,
                             self.buffers["kv_indptr_0"], self.buffers["kv_last_page_len"],
                             self.buffers["kv_indices_0"], fb.req_pool_indices_cpu or None,
                             extend_lens_cpu=extend_lens(fb), qo_indptr_buf=self.buffers["qo_indptr"])
        self.table = t
        self.prefill_wrapper.plan(t.qo_indptr_host, t.kv_indptr_host, t.kv_indices, t.kv_last_page_len_host,
                                  self.num_q_heads, self.num_kv_heads, self.head_dim, self.page_size, causal=True,
                                  **self._plan_kwargs())

    # ------------------------------------------------------------------ CUDA-graph decode
    def init_forward_metadata_capture_cuda_graph(self, bs: int, req_pool_indices: torch.Tensor,
                                                 seq_lens_cpu: Sequence[int],
                                                 rows_cpu: Optional[Sequence[int]] = None) -> None:
        """Build the fixed-buffer decode wrapper of batch size bs (<= the planned graph batch) and plan it."""
        assert self.mla is None, "flashinfer: MLA with CUDA graphs is refused at construction"
        if not 1 <= bs <= self.inputs.graph_bs:
            raise ValueError(f"flashinfer: graph batch {bs} is outside the planned 1..{self.inputs.graph_bs}")
        self.graph_decode_wrappers[bs] = self._shared_workspaces(self.kernels.BatchDecodeWithPagedKVCacheWrapper(
            self.buffers["workspace"], "NHD", use_cuda_graph=True, use_tensor_cores=self.decode_use_tensor_cores,
            paged_kv_indptr_buffer=self.buffers["kv_indptr_0"][: bs + 1],
            paged_kv_indices_buffer=self.buffers["kv_indices_0"],
            paged_kv_last_page_len_buffer=self.buffers["kv_last_page_len"][:bs],
        ))
        self.init_forward_metadata_replay_cuda_graph(bs, req_pool_indices, seq_lens_cpu, rows_cpu)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, req_pool_indices: torch.Tensor,
                                                seq_lens_cpu: Sequence[int],
                                                rows_cpu: Optional[Sequence[int]] = None) -> None:
        """Re-plan the captured wrapper of batch size bs for the live (padded) batch; the graph then replays."""
        wrapper = self.graph_decode_wrappers[bs]
        rows = list(rows_cpu)[:bs] if rows_cpu is not None else None
        self.table = self._decode_table(req_pool_indices[:bs], list(seq_lens_cpu)[:bs], rows)
        self._plan_decode(wrapper, self.table)
        self.active_decode_wrapper = wrapper

    # ------------------------------------------------------------------ per layer
    def _paged_cache(self, layer):
        """The pool of one layer as (k, v) [pages, page_size, kv_heads, head_dim] (NHD)."""
        pool, ps = self.token_to_kv_pool, self.page_size
        k, v = pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id)
        rows = k.shape[0] - k.shape[0] % ps
        return (k[:rows].view(-1, ps, k.shape[1], k.shape[2]), v[:rows].view(-1, ps, v.shape[1], v.shape[2]))

    def _scales(self, layer) -> dict:
        """fp8: the layer's K and V scales (flashinfer folds k_scale into sm_scale and multiplies out by v_scale)."""
        if self.kv_scales is None:
            return {}
        k_scale, v_scale = self.kv_scales[layer.layer_id]
        return dict(k_scale=k_scale, v_scale=v_scale)

    def _query(self, q: torch.Tensor) -> torch.Tensor:
        """q, turned by R where the fp8 pool stores its keys turned (k @ R; q.k unchanged), contiguous."""
        r_k = self.token_to_kv_pool.rotation("k")
        return q.contiguous() if r_k is None else (q.float() @ r_k).to(q.dtype)

    def _check_layer(self, layer) -> None:
        if abs(layer.scaling - self.sm_scale) > 1e-6 * self.sm_scale:
            raise NotImplementedError(f"flashinfer: layer {layer.layer_id} scales by {layer.scaling}, the plan by "
                                      f"head_dim ** -0.5 = {self.sm_scale}; use --attention-backend torch_native")

    def _wrapper(self, layer, decode: bool):
        """The wrapper of this layer: the full one, or (a layer in the windowed pool) the windowed one, planned at the
        forward's first windowed layer."""
        window, lid = getattr(layer, "sliding_window_size", -1), layer.layer_id
        if getattr(layer, "logit_cap", 0.0) > 0:
            raise NotImplementedError(f"flashinfer: layer {lid} caps its logits, which is not wired; use "
                                      "--attention-backend triton or torch_native")
        if getattr(layer, "sinks", None) is not None and not self.run_takes_sinks:
            raise NotImplementedError("flashinfer: this flashinfer's run() takes no attention sinks; upgrade "
                                      "flashinfer-python, or use --attention-backend triton")
        if not self.token_to_kv_pool.is_windowed_layer(lid):
            if 0 < window < self.inputs.shape.context_len:
                raise NotImplementedError(f"flashinfer: layer {lid}'s {window}-token window lives in the full pool and "
                                          "is not wired there; use --attention-backend triton")
            return self.active_decode_wrapper if decode else self.prefill_wrapper
        if not self.windowed_wrappers or window <= 0:
            raise NotImplementedError(f"flashinfer: layer {lid} lives in the windowed pool but the plan declared "
                                      f"{self.inputs.shape.num_wrappers} wrapper(s) and its window is {window}")
        if self.win_window is None:
            self._plan_windowed(window, decode)
        elif self.win_window != window:
            raise NotImplementedError(f"flashinfer: windows of {self.win_window} and {window} tokens in one model "
                                      "(one windowed wrapper); use --attention-backend triton")
        return self.win_decode_wrapper if decode else self.win_prefill_wrapper

    def _plan_windowed(self, window: int, decode: bool) -> None:
        fb, lens, pool = self.forward_batch, seq_lens(self.forward_batch), self.token_to_kv_pool
        new = [1] * len(lens) if decode else extend_lens(fb)
        first_pos = [window_start(n - e, window) for n, e in zip(lens, new)]
        # kv_last_page_len is shared with the full table: plan() takes the host copies, and the device view is read
        # only by CUDA-graph wrappers, which windowed models do not use
        t = build_page_table(self.req_to_token_pool.req_to_token, fb.req_pool_indices, lens, self.page_size,
                             self.buffers["kv_indptr_1"], self.buffers["kv_last_page_len"],
                             self.buffers["kv_indices_1"], fb.req_pool_indices_cpu or None,
                             extend_lens_cpu=None if decode else new,
                             qo_indptr_buf=None if decode else self.buffers["qo_indptr"], first_pos=first_pos,
                             slot_map=getattr(pool, "slot_map", None))
        kw = dict(window_left=window - 1, **self._plan_kwargs())
        if decode:
            self.win_decode_wrapper.plan(t.kv_indptr_host, t.kv_indices, t.kv_last_page_len_host, self.num_q_heads,
                                         self.num_kv_heads, self.head_dim, self.page_size, pos_encoding_mode="NONE",
                                         **kw)
        else:
            self.win_prefill_wrapper.plan(t.qo_indptr_host, t.kv_indptr_host, t.kv_indices, t.kv_last_page_len_host,
                                          self.num_q_heads, self.num_kv_heads, self.head_dim, self.page_size,
                                          causal=True, **kw)
        self.win_window = window

    def _run(self, q, k, v, layer, forward_batch, save_kv_cache: bool, decode: bool) -> torch.Tensor:
        # q: [N, H, D], k/v: [N, KV, D] -> [N, H * Dv]
        if self.mla is not None:
            return self.mla.forward(q, k, layer, forward_batch, save_kv_cache)
        self._check_layer(layer)
        wrapper = self._wrapper(layer, decode)
        if save_kv_cache:
            self.token_to_kv_pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, k, v)
        sinks = getattr(layer, "sinks", None)
        extra = dict(sinks=sinks.float()) if sinks is not None else {}
        out = wrapper.run(self._query(q), self._paged_cache(layer), **self._scales(layer), **extra)
        return out.view(q.shape[0], -1)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        return self._run(q, k, v, layer, forward_batch, save_kv_cache, decode=False)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        return self._run(q, k, v, layer, forward_batch, save_kv_cache, decode=True)


BACKEND_CLASS = FlashInferAttnBackend
