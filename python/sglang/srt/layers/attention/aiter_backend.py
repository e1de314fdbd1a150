"""AiterAttnBackend: paged attention through AITER's kernels (ROCm; fp16/bf16 with a KV cache of the same dtype;
MHA/GQA, not MLA).

Memory (declared in mem_plan/backends.py, allocated once by the base class):
    workspace         uint8 [R * H_q * P * (4 * head_dim + 8)], P = ceil(context_len / 256)
                      the decode kernel's scratch, PR #18263's per-slot formula; handed to every decode call
    kv_scales         fp32 [2]  the K and V dequant scales the decode kernel reads (1.0: no fp8 scaling)
    kv_indptr, qo_indptr, kv_last_page_len  int32 [S + 1]  this batch's CSR arrays (views [:B + 1]); S = R + the
                      request table's branch rows (a speculative tree's side branches: sequences of their own)
    kv_indices        int32 [S * context_len]  this batch's token slots, gathered into it (paged_kv_indices.py)
paged_attention_ragged splits the workspace at offsets that depend on the batch B <= R: exp sums and max logits
fp32 [B, H_q, P] at 0 and B * H_q * P * 4, then the partial outputs [B, H_q, P, head_dim] (in the query dtype, so
the 4 B per element charged is an upper bound). That is why the plan solves the KV pool and the slot count together.

Both kernels read the pool at token granularity (block size 1; kv indices are the token slots of req_to_token),
which serves any --page-size:
    decode   aiter.paged_attention_ragged(out, workspace, q, k [slots, 1, KV, D], v, ...)
    extend   aiter.mha_batch_prefill_func(q, k [slots, KV, D], v, qo_indptr, kv_indptr, kv_indices, ...,
             causal=True): new token i of a request with prefix P sees keys <= P + i (bottom-right causal).
"""

from __future__ import annotations

from typing import Optional

import torch

from sglang.srt.layers.attention.flashinfer_backend import check_kernel_dtype
from sglang.srt.layers.attention.paged_kv_indices import PageTable, build_page_table, extend_lens, seq_lens
from sglang.srt.layers.attention.planned_gpu_backend import PlannedGpuAttnBackend
from sglang.srt.layers.attention.window_metadata import windowed_features
from sglang.srt.mem_plan.backends import AITER_PARTITION_TOKENS, aiter_num_partitions

DECODE_SCRATCH_FP32_ARRAYS = 2  # exp sums and max logits, fp32 [B, H_q, P] each


class AiterAttnBackend(PlannedGpuAttnBackend):
    backend_name = "aiter"
    kernel_module = "aiter"
    install_hint = "pip install amd-aiter, beside a ROCm build of torch"
    device_kind = "an AMD GPU (ROCm)"

    @classmethod
    def device_problem(cls, device: str) -> Optional[str]:
        problem = super().device_problem(device)
        if problem is None and not torch.version.hip:
            return "AITER runs on ROCm and this torch is a CUDA build (on NVIDIA GPUs use flashinfer or triton)"
        return problem

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        pool, shape = self.token_to_kv_pool, self.inputs.shape
        if shape.is_mla:
            raise NotImplementedError("--attention-backend aiter: MLA (DeepSeek V2/V3, Kimi-K2: the latent KV pool) is "
                                      "not wired to AITER's MLA kernels; use --attention-backend triton (its MLA "
                                      "decode kernel runs on ROCm) or torch_native")
        windowed = windowed_features(self.model_config, pool)
        if windowed:
            raise ValueError(f"--attention-backend aiter: this model's {windowed} are not wired in AITER's kernels; "
                             "use --attention-backend triton")
        self.q_dtype = getattr(self.model_config, "dtype", None) or pool.dtype
        check_kernel_dtype(self.backend_name, self.q_dtype)
        if hasattr(pool, "kv_format"):  # a quantized pool (fp8 / int): mha_batch_prefill_func takes no fp8 K/V
            raise ValueError(f"--attention-backend aiter cannot read --kv-cache-dtype {pool.kv_format}: AITER's "
                             "prefill kernel (mha_batch_prefill_func) takes K/V in the query dtype only, without "
                             "scales; use --attention-backend triton, which dequantizes it in-kernel.")
        if pool.dtype != self.q_dtype:  # mha_batch_prefill reads K/V in the query dtype
            raise ValueError(f"aiter: a {pool.dtype} KV cache under a {self.q_dtype} model is not wired; use "
                             "--kv-cache-dtype auto, or --attention-backend triton / torch_native")
        self.kv_cache_dtype = "auto"  # paged_attention_ragged: K/V in the query dtype
        self.num_q_heads, self.num_kv_heads, self.head_dim = shape.num_q_heads, pool.head_num, pool.head_dim
        self.num_partitions = aiter_num_partitions(shape.context_len)
        self.workspace = self.buffers["workspace"]
        self.kv_scales = self.buffers["kv_scales"]
        self.kv_scales.fill_(1.0)
        self.table: Optional[PageTable] = None

    def decode_workspace_bytes(self, batch_size: int) -> int:
        """Bytes of the workspace one decode call of batch_size requests uses (the kernel's layout)."""
        cells = batch_size * self.num_q_heads * self.num_partitions
        return cells * (DECODE_SCRATCH_FP32_ARRAYS * 4 + self.head_dim * self.q_dtype.itemsize)

    def init_forward_metadata(self, forward_batch) -> None:
        fb, lens = forward_batch, seq_lens(forward_batch)
        ext = None if fb.forward_mode.is_decode() else extend_lens(fb)
        self.table = build_page_table(self.req_to_token_pool.req_to_token, fb.req_pool_indices, lens, 1,
                                      self.buffers["kv_indptr"], self.buffers["kv_last_page_len"],
                                      self.buffers["kv_indices"], fb.req_pool_indices_cpu or None,
                                      extend_lens_cpu=ext, qo_indptr_buf=self.buffers["qo_indptr"])
        if ext is None and self.decode_workspace_bytes(len(lens)) > self.workspace.numel():
            raise AssertionError(f"aiter: decode of {len(lens)} requests needs {self.decode_workspace_bytes(len(lens))}"
                                 f" B of workspace, the plan gave {self.workspace.numel()}")

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        # q: [N, H, D], k/v: [N, KV, D] -> [N, H * Dv]
        pool, t = self.token_to_kv_pool, self.table
        if save_kv_cache:
            pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, k, v)
        out = self.kernels.mha_batch_prefill_func(
            q.contiguous(), pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id),
            t.qo_indptr, t.kv_indptr, t.kv_indices, t.max_q_len, t.max_kv_len,
            softmax_scale=layer.scaling, causal=True,
        )
        return out.reshape(q.shape[0], -1)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        # q: [B, H, D], k/v: [B, KV, D] -> [B, H * Dv]
        pool, t = self.token_to_kv_pool, self.table
        if save_kv_cache:
            pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, k, v)
        k_cache, v_cache = pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # contiguous, whatever q's strides
        self.kernels.paged_attention_ragged(
            out=out, workspace_buffer=self.workspace, query=q.contiguous(),
            key_cache=k_cache.unsqueeze(1), value_cache=v_cache.unsqueeze(1),  # [slots, block 1, KV, D] (NHD)
            scale=layer.scaling, kv_indptr=t.kv_indptr, kv_page_indices=t.kv_indices,
            kv_last_page_lens=t.kv_last_page_len, block_size=1, max_num_partitions=self.num_partitions,
            alibi_slopes=None, kv_cache_dtype=self.kv_cache_dtype, kv_cache_layout="NHD", logits_soft_cap=0.0,
            k_scale=self.kv_scales[0:1], v_scale=self.kv_scales[1:2], fp8_out_scale=None,
            partition_size=AITER_PARTITION_TOKENS,
        )
        return out.view(q.shape[0], -1)


BACKEND_CLASS = AiterAttnBackend
