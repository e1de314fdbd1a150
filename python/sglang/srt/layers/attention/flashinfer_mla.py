"""MLA layers (DeepSeek V2/V3, Kimi-K2) on FlashInfer: flashinfer's BatchMLAPagedAttentionWrapper over the latent pool.

The pool (mem_cache/mla_pool.py) holds one row per token and layer, [c_kv (kv_lora) | k_pe (rope)]; the wrapper takes
the two parts as separate paged caches, and both are views of the same storage: the layer's rows viewed as
[pages, page_size, kv_lora + rope], ckv_cache = [..., :kv_lora] and kpe_cache = [..., kv_lora:] (strided, nothing
copied). The absorbed query [q_nope @ W_UK | q_pe] is split the same way (q_nope = q[..., :kv_lora], the absorbed
part; q_pe = q[..., kv_lora:]); the output is latent, [N, H, kv_lora].

Calls (flashinfer's flat CSR form, keyword arguments: the same names from flashinfer 0.2 to 0.7.4, where they still
work beside the newer MLAPlanMetadata form):
    BatchMLAPagedAttentionWrapper(float_workspace_buffer)  the planned workspace, once
    plan(qo_indptr=, kv_indptr=, kv_indices=, kv_len_arr=, num_heads=, head_dim_ckv=, head_dim_kpe=, page_size=,
         causal=, sm_scale=, q_data_type=, kv_data_type=)  once per forward, at its first layer (the softmax scale
         is the layer's: (nope + rope) ** -0.5 times YaRN's mscale^2, not head_dim ** -0.5); qo_indptr, kv_indptr and
         kv_len_arr as host arrays (plan() reads them on the host), the page ids in the planned kv_indices_0
    run(q_nope=, q_pe=, ckv_cache=, kpe_cache=, out=)  per layer
Extend is planned causal=True (bottom-right aligned: new token i of a request with a cached prefix of P tokens sees
keys <= P + i), decode causal=False. The page table is FlashInfer's own (paged_kv_indices.py, planned buffers);
kv_len_arr holds each request's sequence length (the MLA wrapper takes lengths, not last-page lengths).

Not wired, refused at construction naming the way out: CUDA graphs (--disable-cuda-graph, or --attention-backend
triton, whose graphs take MLA). A quantized latent cache never reaches here (the pool refuses it).

Memory: flashinfer's MLA wrapper keeps a private int workspace and a pinned host copy (8 MiB each; flashinfer 0.7.4
makes them at each plan()) that its public API cannot swap for the planned int_workspace, unlike the paged wrappers.
"""

from __future__ import annotations

from typing import List, Optional

import torch

from sglang.srt.layers.attention.paged_kv_indices import PageTable, build_page_table, extend_lens, seq_lens


class FlashInferMLA:
    def __init__(self, backend):
        """backend: the FlashInferAttnBackend (its kernels module, planned buffers, pools, dtype)."""
        self.backend = backend
        pool = backend.token_to_kv_pool
        self.kv_lora, self.rope = pool.kv_lora_rank, pool.qk_rope_head_dim
        self.num_heads, self.page_size = backend.inputs.shape.num_q_heads, pool.page_size
        if backend.inputs.graph_bs > 0:
            raise ValueError("--attention-backend flashinfer: CUDA graphs over MLA layers are not wired; start with "
                             "--disable-cuda-graph, or use --attention-backend triton (its graphs take MLA)")
        self.wrapper = backend.kernels.BatchMLAPagedAttentionWrapper(backend.buffers["workspace"])
        self.table: Optional[PageTable] = None
        self.kv_lens_host: Optional[torch.Tensor] = None
        self.causal = False
        self.planned_scale: Optional[float] = None  # the scale this forward's plan() got (None: not planned yet)

    def init_forward_metadata(self, fb) -> None:
        """The batch's page table in the planned buffers; plan() waits for the first layer (its softmax scale)."""
        b, lens = self.backend, seq_lens(fb)
        decode = fb.forward_mode.is_decode()
        self.table = build_page_table(
            b.req_to_token_pool.req_to_token, fb.req_pool_indices, lens, self.page_size, b.buffers["kv_indptr_0"],
            b.buffers["kv_last_page_len"], b.buffers["kv_indices_0"], fb.req_pool_indices_cpu or None,
            extend_lens_cpu=None if decode else extend_lens(fb),
            qo_indptr_buf=None if decode else b.buffers["qo_indptr"])
        self.kv_lens_host = torch.tensor(lens, dtype=torch.int32)
        self.causal, self.planned_scale = not decode, None

    def _qo_indptr_host(self) -> torch.Tensor:
        t = self.table
        if t.qo_indptr_host is not None:
            return t.qo_indptr_host
        return torch.arange(len(self.kv_lens_host) + 1, dtype=torch.int32)  # decode: one query row per request

    def _plan(self, scale: float) -> None:
        t, b = self.table, self.backend
        self.wrapper.plan(
            qo_indptr=self._qo_indptr_host(), kv_indptr=t.kv_indptr_host, kv_indices=t.kv_indices,
            kv_len_arr=self.kv_lens_host, num_heads=self.num_heads, head_dim_ckv=self.kv_lora,
            head_dim_kpe=self.rope, page_size=self.page_size, causal=self.causal, sm_scale=scale,
            q_data_type=b.q_dtype, kv_data_type=b.token_to_kv_pool.dtype)
        self.planned_scale = scale

    def _caches(self, layer_id: int) -> List[torch.Tensor]:
        """(ckv_cache [pages, page_size, kv_lora], kpe_cache [pages, page_size, rope]): views of the layer's rows."""
        rows = self.backend.token_to_kv_pool.get_key_buffer(layer_id)  # [slots, 1, kv_lora + rope]
        n = rows.shape[0] - rows.shape[0] % self.page_size
        paged = rows[:n].view(-1, self.page_size, rows.shape[2])
        return [paged[..., : self.kv_lora], paged[..., self.kv_lora :]]

    def forward(self, q, k, layer, fb, save_kv_cache: bool) -> torch.Tensor:
        # q [N, H, kv_lora + rope] (absorbed), k [N, 1, kv_lora + rope] the new rows -> [N, H * kv_lora]
        pool = self.backend.token_to_kv_pool
        if layer.v_head_dim != self.kv_lora:
            raise ValueError(f"flashinfer: layer {layer.layer_id} has v_head_dim {layer.v_head_dim} over an MLA pool "
                             f"whose values are its rows' first {self.kv_lora} columns")
        if self.planned_scale is None:
            self._plan(layer.scaling)
        elif abs(layer.scaling - self.planned_scale) > 1e-6 * self.planned_scale:
            raise NotImplementedError(f"flashinfer: MLA layer {layer.layer_id} scales by {layer.scaling}, this forward "
                                      f"was planned at {self.planned_scale} (one plan per forward)")
        if save_kv_cache:
            pool.set_kv_buffer(layer.layer_id, fb.out_cache_loc, k, None)
        ckv, kpe = self._caches(layer.layer_id)
        out = q.new_empty(q.shape[0], q.shape[1], self.kv_lora)
        self.wrapper.run(q_nope=q[..., : self.kv_lora], q_pe=q[..., self.kv_lora :], ckv_cache=ckv, kpe_cache=kpe,
                         out=out)
        return out.view(q.shape[0], -1)
