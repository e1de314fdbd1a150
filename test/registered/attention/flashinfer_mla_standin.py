"""A stand-in for flashinfer's BatchMLAPagedAttentionWrapper, added to the `flashinfer` stand-in module of
sglang.test.attention_standins (make_flashinfer). Not a test file (run_suite collects test_*.py only).

It checks wiring, not numerics: __init__ / plan / run have the parameters of flashinfer-python 0.7.4's wrapper
(flashinfer/mla/_batch_mla/_wrapper.py, compared with the wheel's source when written: the flat CSR plan() and the
separate-tensor run() keep the names of flashinfer 0.2's), so a misspelt keyword fails as on a GPU. It records every
call, checks what the kernel assumes (int32 CSR arrays whose page counts match kv_len_arr, ckv / kpe caches
[pages, page_size, width] of one dtype, the query split the same way, fp16/bf16) and computes the attention with
torch from the arguments it receives, reading the latent through the page table it was planned with: a wrong page
table, split, scale or causal alignment gives a wrong output.
"""

from __future__ import annotations

import torch

from sglang.test.attention_standins import HALF_DTYPES, _check_csr, _reads_on_host, _standin


def add_mla_wrapper(fi):
    """fi: a make_flashinfer() module; adds BatchMLAPagedAttentionWrapper logging into fi.calls. Returns fi."""
    log = fi.calls

    class BatchMLAPagedAttentionWrapper:
        @_standin
        def __init__(self, float_workspace_buffer, use_cuda_graph=False, qo_indptr=None, kv_indptr=None,
                     kv_indices=None, kv_len_arr=None, backend="auto"):
            assert float_workspace_buffer.dtype == torch.uint8
            assert not use_cuda_graph, "the backend refuses MLA under CUDA graphs"
            self._float_workspace_buffer = float_workspace_buffer
            log.append(("mla_init", dict(wrapper=self, float_workspace_buffer=float_workspace_buffer)))

        @_reads_on_host("qo_indptr", "kv_indptr", "kv_len_arr")
        @_standin
        def plan(self, qo_indptr=None, kv_indptr=None, kv_indices=None, kv_len_arr=None, num_heads=None,
                 head_dim_ckv=None, head_dim_kpe=None, page_size=None, causal=None, sm_scale=None, q_data_type=None,
                 kv_data_type=None, use_profiler=False, *, metadata=None, cum_seq_lens_q=None, block_tables=None,
                 seq_lens=None, max_q_len=None, query_layout=None, kv_cache_layout=None, lse_mode="none",
                 output_dtype=None, output_scale="none", scale_mode="default", skip_softmax=False, enable_pdl=None,
                 use_sinks=False):
            assert metadata is None and block_tables is None, "the backend uses the flat CSR form"
            batch = len(kv_len_arr)
            assert qo_indptr.dtype == torch.int32 and qo_indptr.shape == (batch + 1,) and int(qo_indptr[0]) == 0
            assert kv_len_arr.dtype == torch.int32
            _check_csr(kv_indptr, kv_indices, None, batch, 1 << 62, page_size)
            pages = (kv_indptr[1:] - kv_indptr[:-1]).long()
            assert torch.equal(pages, (kv_len_arr.long() + page_size - 1) // page_size), "kv_len_arr vs page counts"
            assert q_data_type in HALF_DTYPES and kv_data_type in HALF_DTYPES
            assert isinstance(sm_scale, float) and isinstance(causal, bool)
            self._plan = dict(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len_arr=kv_len_arr,
                              num_heads=num_heads, head_dim_ckv=head_dim_ckv, head_dim_kpe=head_dim_kpe,
                              page_size=page_size, causal=causal, sm_scale=sm_scale, q_data_type=q_data_type,
                              kv_data_type=kv_data_type)
            log.append(("mla_plan", dict(wrapper=self, **self._plan)))

        @_standin
        def run(self, q_nope=None, q_pe=None, ckv_cache=None, kpe_cache=None, out=None, lse=None, return_lse=False,
                profiler_buffer=None, kv_len=None, page_table=None, return_lse_base_on_e=False, o_scale=None, *,
                query=None, kv_cache=None, ckv_scale=None, ckv_scale_arr=None, kpe_scale=None, sinks=None,
                skip_softmax_threshold_scale_factor=None, bmm1_scale=None, bmm2_scale=None):
            p = self._plan
            c, r, ps = p["head_dim_ckv"], p["head_dim_kpe"], p["page_size"]
            n = int(p["qo_indptr"][-1])
            assert q_nope.shape == (n, p["num_heads"], c) and q_pe.shape == (n, p["num_heads"], r)
            assert q_nope.dtype == q_pe.dtype == p["q_data_type"]
            assert ckv_cache.dim() == kpe_cache.dim() == 3 and ckv_cache.shape[1] == kpe_cache.shape[1] == ps
            assert ckv_cache.shape[2] == c and kpe_cache.shape[2] == r and ckv_cache.shape[0] == kpe_cache.shape[0]
            assert ckv_cache.dtype == kpe_cache.dtype == p["kv_data_type"]
            assert out is not None and out.shape == q_nope.shape and out.dtype == q_nope.dtype
            log.append(("mla_run", dict(wrapper=self, q_nope=q_nope, q_pe=q_pe, ckv_cache=ckv_cache,
                                        kpe_cache=kpe_cache, out=out)))
            used = p["kv_indices"][: int(p["kv_indptr"][-1])]
            assert len(used) == 0 or int(used.max()) < ckv_cache.shape[0], "page index outside the cache"
            for b in range(len(p["kv_len_arr"])):
                q0, q1 = int(p["qo_indptr"][b]), int(p["qo_indptr"][b + 1])
                pages = p["kv_indices"][int(p["kv_indptr"][b]) : int(p["kv_indptr"][b + 1])].long()
                kv_len = int(p["kv_len_arr"][b])
                ckv = ckv_cache[pages].reshape(-1, c)[:kv_len].float()  # [L, c]: keys' first part and the values
                kpe = kpe_cache[pages].reshape(-1, r)[:kv_len].float()
                scores = (torch.einsum("nhc,lc->hnl", q_nope[q0:q1].float(), ckv)
                          + torch.einsum("nhr,lr->hnl", q_pe[q0:q1].float(), kpe)) * p["sm_scale"]
                if p["causal"]:  # bottom-right: new token i sits at position kv_len - (q1 - q0) + i
                    q_pos = torch.arange(kv_len - (q1 - q0), kv_len)
                    scores = scores.masked_fill(torch.arange(kv_len)[None, None, :] > q_pos[None, :, None],
                                                float("-inf"))
                out[q0:q1] = torch.einsum("hnl,lc->nhc", scores.softmax(-1), ckv).to(out.dtype)
            return out

    fi.BatchMLAPagedAttentionWrapper = BatchMLAPagedAttentionWrapper
    return fi
