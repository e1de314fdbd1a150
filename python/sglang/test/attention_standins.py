"""Stand-ins for the `flashinfer` and `aiter` modules, for CPU wiring tests of the backends that call them.

They check wiring, not the libraries' numerics: each stand-in function has the parameter names and defaults of the
real one (flashinfer-python 0.7.2: decode.py / prefill.py; amd-aiter 0.1.7: ops/attention.py paged_attention_ragged,
ops/mha.py mha_batch_prefill_func; compared with the wheels' sources when written: identical parameter lists), so a
misspelt keyword fails as it would on a GPU. A stand-in records every call, checks the shapes, dtypes and layouts the
real kernel assumes, and computes the attention with torch *from the arguments it receives* (indptr / indices /
last-page lengths / paged cache), so a wrong page table gives a wrong output.

`install(module)` puts a stand-in into sys.modules (a context manager). `AllocationRecorder` records the size of
every tensor allocated by torch ops while active, except inside the stand-ins' own reference computation.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import types
from typing import List, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

FI_INT_WORKSPACE_BYTES = 8 * 1024 * 1024  # what the real wrappers allocate in __init__
HALF_DTYPES = (torch.float16, torch.bfloat16)


class CallLog(list):
    def named(self, name: str) -> list:
        return [args for n, args in self if n == name]


# ---------------------------------------------------------------------------------------------- reference math
_PAUSED = [0]


def _standin(fn):
    """Stand-in entry points run unrecorded and outside every dispatch mode (the allocation recorder, the device
    discipline): those measure the backend, not the library. What the real library reads on the host is declared
    with _reads_on_host, so the device discipline still sees it."""

    def wrapped(*args, **kwargs):
        with _not_recorded(), _disable_current_modes():
            return fn(*args, **kwargs)

    wrapped.__wrapped__ = fn
    wrapped.__signature__ = inspect.signature(fn)
    return wrapped


@contextlib.contextmanager
def _not_recorded():
    _PAUSED[0] += 1
    try:
        yield
    finally:
        _PAUSED[0] -= 1


def _reads_on_host(*names):
    """The real plan() reads these arrays on the host (`x.to("cpu")`, flashinfer 0.7.2 decode.py / prefill.py): the
    stand-in does the same read before its body, inside the caller's dispatch modes, so handing it device arrays
    counts as the host syncs it would cost on a GPU."""

    def decorate(fn):
        signature = inspect.signature(fn)

        def wrapped(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            for name in names:
                bound.arguments[name].to("cpu")
            return fn(*args, **kwargs)

        wrapped.__wrapped__ = fn
        wrapped.__signature__ = signature
        return wrapped

    return decorate


def csr_attention(q, k_pages, v_pages, qo_indptr, kv_indptr, kv_indices, last_page_len, scale, causal):
    """Attention of q [N, H, D] over a paged cache k/v_pages [pages, page_size, KV, D], read only through the CSR
    arrays; new token i of a request with kv_len L and q_len n sits at position L - n + i (bottom-right causal).
    On the meta device (the GPU stand-in of device-discipline tests) only the output's shape is produced."""
    if q.device.type == "meta":
        return q.new_empty(q.shape[0], q.shape[1], v_pages.shape[-1])
    with _not_recorded():
        ps = k_pages.shape[1]
        out = torch.empty(q.shape[0], q.shape[1], v_pages.shape[-1], dtype=q.dtype)
        for b in range(len(kv_indptr) - 1):
            q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
            pages = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
            kv_len = (len(pages) - 1) * ps + int(last_page_len[b])
            k = k_pages[pages].reshape(-1, *k_pages.shape[2:])[:kv_len].float()  # [L, KV, D]
            v = v_pages[pages].reshape(-1, *v_pages.shape[2:])[:kv_len].float()
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # [L, H, D]
            scores = torch.einsum("nhd,lhd->hnl", q[q0:q1].float(), k) * scale
            if causal:
                q_pos = torch.arange(kv_len - (q1 - q0), kv_len)
                scores = scores.masked_fill(torch.arange(kv_len)[None, None, :] > q_pos[None, :, None], float("-inf"))
            out[q0:q1] = torch.einsum("hnl,lhd->nhd", scores.softmax(-1), v).to(q.dtype)
        return out


def _check_csr(indptr, indices, last_page_len, batch, num_pages, page_size):
    assert indptr.dtype == torch.int32 and indptr.shape == (batch + 1,), (indptr.dtype, indptr.shape)
    assert indices.dtype == torch.int32 and indices.dim() == 1
    if "meta" in (indptr.device.type, indices.device.type, getattr(last_page_len, "device", indptr.device).type):
        return  # no values on the GPU stand-in: dtypes and shapes only
    assert len(indices) >= int(indptr[-1])
    assert int(indptr[0]) == 0 and bool((indptr[1:] >= indptr[:-1]).all())
    used = indices[: int(indptr[-1])]
    assert len(used) == 0 or (0 <= int(used.min()) and int(used.max()) < num_pages), "page index outside the cache"
    if last_page_len is not None:
        assert last_page_len.dtype == torch.int32 and last_page_len.shape == (batch,)
        assert bool(((last_page_len >= 1) & (last_page_len <= page_size)).all())


# ---------------------------------------------------------------------------------------------- flashinfer
FI_KV_DTYPES = HALF_DTYPES + (torch.float8_e4m3fn, torch.float8_e5m2)


def _scaled(sm_scale, k_scale):
    """As flashinfer's run(): `sm_scale *= k_scale` (a float; a tensor would reach the kernel as one)."""
    assert k_scale is None or isinstance(k_scale, float), type(k_scale)
    return sm_scale if k_scale is None else sm_scale * k_scale


def _times(out, v_scale):
    """As flashinfer's run(): the output times v_scale (a float)."""
    assert v_scale is None or isinstance(v_scale, float), type(v_scale)
    return out if v_scale is None else (out.float() * v_scale).to(out.dtype)


def make_flashinfer(log: Optional[CallLog] = None) -> types.ModuleType:
    log = CallLog() if log is None else log

    class _Base:
        @_standin
        def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer):
            for buf in (float_workspace_buffer, int_workspace_buffer):
                assert buf.dtype == torch.uint8 and buf.data_ptr() % 16 == 0
            log.append(("reset_workspace_buffer", dict(wrapper=self, float_workspace_buffer=float_workspace_buffer,
                                                        int_workspace_buffer=int_workspace_buffer)))
            self._float_workspace_buffer, self._int_workspace_buffer = float_workspace_buffer, int_workspace_buffer

        def _check_cache(self, q, paged_kv_cache):
            k, v = paged_kv_cache
            assert k.dim() == 4 and k.shape[1] == self._page_size and k.shape[2] == self._num_kv_heads, k.shape
            assert q.dtype == self._q_data_type and k.dtype == v.dtype == self._kv_data_type, (q.dtype, k.dtype)
            assert k.dtype in FI_KV_DTYPES, k.dtype
            assert q.shape[1:] == (self._num_qo_heads, self._head_dim) and q.is_contiguous(), q.shape
            return k, v

    class BatchDecodeWithPagedKVCacheWrapper(_Base):
        @_standin
        def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                     paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                     backend="auto", jit_args=None):
            assert kv_layout == "NHD" and float_workspace_buffer.dtype == torch.uint8
            if use_cuda_graph:
                for buf in (paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer):
                    assert torch.is_tensor(buf) and buf.dtype == torch.int32
                assert len(paged_kv_indptr_buffer) == len(paged_kv_last_page_len_buffer) + 1
            self._float_workspace_buffer = float_workspace_buffer
            self._int_workspace_buffer = torch.empty(FI_INT_WORKSPACE_BYTES, dtype=torch.uint8)  # as the real one
            self.use_cuda_graph, self.use_tensor_cores = use_cuda_graph, use_tensor_cores
            self._paged_kv_indptr_buf, self._paged_kv_indices_buf = paged_kv_indptr_buffer, paged_kv_indices_buffer
            self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buffer
            log.append(("decode_init", dict(wrapper=self, float_workspace_buffer=float_workspace_buffer,
                                            use_cuda_graph=use_cuda_graph, use_tensor_cores=use_tensor_cores,
                                            paged_kv_indptr_buffer=paged_kv_indptr_buffer,
                                            paged_kv_indices_buffer=paged_kv_indices_buffer,
                                            paged_kv_last_page_len_buffer=paged_kv_last_page_len_buffer)))


        @_reads_on_host("indptr", "last_page_len")
        @_standin
        def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
                 pos_encoding_mode="NONE", window_left=-1, window_right=0, logits_soft_cap=None,
                 q_data_type="float16", kv_data_type=None, o_data_type=None, data_type=None, sm_scale=None,
                 rope_scale=None, rope_theta=None, non_blocking=True, block_tables=None, seq_lens=None,
                 fixed_split_size=None, disable_split_kv=False, q_len_per_req=1, is_causal=None):
            assert pos_encoding_mode == "NONE" and num_qo_heads % num_kv_heads == 0
            batch = len(last_page_len)
            _check_csr(indptr, indices, last_page_len, batch, 1 << 62, page_size)
            if self.use_cuda_graph:  # as the real plan(): fixed batch, copies into the fixed buffers
                assert batch == len(self._paged_kv_last_page_len_buf)
                assert len(indices) <= len(self._paged_kv_indices_buf)
                self._paged_kv_indptr_buf.copy_(indptr)
                self._paged_kv_last_page_len_buf.copy_(last_page_len)
                self._paged_kv_indices_buf[: len(indices)].copy_(indices)
            else:
                self._paged_kv_indptr_buf, self._paged_kv_indices_buf = indptr, indices
                self._paged_kv_last_page_len_buf = last_page_len
            self._num_qo_heads, self._num_kv_heads, self._head_dim, self._page_size = (
                num_qo_heads, num_kv_heads, head_dim, page_size)
            self._q_data_type = q_data_type
            self._kv_data_type = kv_data_type or q_data_type
            self._sm_scale = head_dim ** -0.5 if sm_scale is None else sm_scale
            log.append(("decode_plan", dict(wrapper=self, indptr=indptr, indices=indices, last_page_len=last_page_len,
                                            num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                                            page_size=page_size, sm_scale=sm_scale, q_data_type=q_data_type)))


        @_standin
        def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
                return_lse=False, enable_pdl=None, window_left=None, sinks=None, q_len_per_req=None,
                skip_softmax_threshold_scale_factor=None, kv_cache_sf=None):
            k, v = self._check_cache(q, paged_kv_cache)
            batch = len(self._paged_kv_last_page_len_buf)
            assert q.shape[0] == batch, (q.shape, batch)
            _check_csr(self._paged_kv_indptr_buf, self._paged_kv_indices_buf, self._paged_kv_last_page_len_buf,
                       batch, k.shape[0], self._page_size)
            log.append(("decode_run", dict(wrapper=self, q=q, paged_kv_cache=paged_kv_cache, k_scale=k_scale,
                                           v_scale=v_scale)))
            out = csr_attention(q, k, v, torch.arange(batch + 1), self._paged_kv_indptr_buf,
                                self._paged_kv_indices_buf, self._paged_kv_last_page_len_buf,
                                _scaled(self._sm_scale, k_scale), False)
            return _times(out, v_scale)

    class BatchPrefillWithPagedKVCacheWrapper(_Base):
        @_standin
        def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                     paged_kv_indptr_buf=None, paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None,
                     custom_mask_buf=None, mask_indptr_buf=None, backend="auto", jit_args=None, jit_kwargs=None,
                     variant_owns_mask=False):
            assert kv_layout == "NHD" and float_workspace_buffer.dtype == torch.uint8
            self._float_workspace_buffer = float_workspace_buffer
            self._int_workspace_buffer = torch.empty(FI_INT_WORKSPACE_BYTES, dtype=torch.uint8)
            log.append(("prefill_init", dict(wrapper=self, float_workspace_buffer=float_workspace_buffer,
                                             use_cuda_graph=use_cuda_graph)))


        @_reads_on_host("qo_indptr", "paged_kv_indptr", "paged_kv_last_page_len")
        @_standin
        def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
                 num_kv_heads, head_dim_qk, page_size, head_dim_vo=None, custom_mask=None, packed_custom_mask=None,
                 causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None, window_left=-1,
                 logits_soft_cap=None, rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
                 o_data_type=None, non_blocking=True, prefix_len_ptr=None, token_pos_in_items_ptr=None,
                 token_pos_in_items_len=0, max_item_len_ptr=None, seq_lens=None, seq_lens_q=None, block_tables=None,
                 max_token_per_sequence=None, max_sequence_kv=None, fixed_split_size=None, disable_split_kv=False,
                 uniform_q_len=None):
            batch = len(qo_indptr) - 1
            assert qo_indptr.dtype == torch.int32 and int(qo_indptr[0]) == 0
            _check_csr(paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, batch, 1 << 62, page_size)
            self._qo_indptr, self._kv = qo_indptr, (paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len)
            self._num_qo_heads, self._num_kv_heads, self._head_dim, self._page_size = (
                num_qo_heads, num_kv_heads, head_dim_qk, page_size)
            self._q_data_type, self._kv_data_type = q_data_type, kv_data_type or q_data_type
            self._causal, self._sm_scale = causal, head_dim_qk ** -0.5 if sm_scale is None else sm_scale
            log.append(("prefill_plan", dict(wrapper=self, qo_indptr=qo_indptr, paged_kv_indptr=paged_kv_indptr,
                                             paged_kv_indices=paged_kv_indices,
                                             paged_kv_last_page_len=paged_kv_last_page_len, causal=causal,
                                             sm_scale=sm_scale, page_size=page_size)))


        @_standin
        def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
                return_lse=False, lse_base="log2", lse_layout="NH", enable_pdl=None, window_left=None, sinks=None,
                kv_cache_sf=None, skip_softmax_threshold_scale_factor=None, use_fp16_softmax=None,
                uses_spcompress=None):
            k, v = self._check_cache(q, paged_kv_cache)
            assert q.shape[0] == int(self._qo_indptr[-1])
            log.append(("prefill_run", dict(wrapper=self, q=q, paged_kv_cache=paged_kv_cache, k_scale=k_scale,
                                            v_scale=v_scale)))
            out = csr_attention(q, k, v, self._qo_indptr, *self._kv, _scaled(self._sm_scale, k_scale), self._causal)
            return _times(out, v_scale)

    mod = types.ModuleType("flashinfer")
    mod.BatchDecodeWithPagedKVCacheWrapper = BatchDecodeWithPagedKVCacheWrapper
    mod.BatchPrefillWithPagedKVCacheWrapper = BatchPrefillWithPagedKVCacheWrapper
    mod.calls = log
    return mod


# ---------------------------------------------------------------------------------------------- aiter
def make_aiter(log: Optional[CallLog] = None) -> types.ModuleType:
    log = CallLog() if log is None else log


    @_standin
    def paged_attention_ragged(out, workspace_buffer, query, key_cache, value_cache, scale, kv_indptr,
                               kv_page_indices, kv_last_page_lens, block_size, max_num_partitions, alibi_slopes,
                               kv_cache_dtype, kv_cache_layout, logits_soft_cap, k_scale, v_scale, fp8_out_scale=None,
                               partition_size=256, mtp=1):
        assert query.dtype in HALF_DTYPES and out.dtype == query.dtype and out.shape == query.shape
        assert out.is_contiguous() and query.is_contiguous()  # the kernel takes q_stride(0) only, out dense
        assert kv_cache_layout == "NHD" and key_cache.dim() == 4 and key_cache.shape[1] == block_size
        assert kv_cache_dtype == "auto" and key_cache.dtype == query.dtype
        num_seqs, num_heads, head_size = query.shape
        num_kv_heads = key_cache.size(2)  # NHD, as the real wrapper reads it
        assert num_heads % num_kv_heads == 0 and key_cache.shape[3] == head_size
        assert k_scale.dtype == v_scale.dtype == torch.float32 and k_scale.numel() == v_scale.numel() == 1
        # the kernel's layout: exp sums + max logits fp32 [S, H, P], then partial outputs [S, H, P, D] (query dtype)
        needed = num_seqs * num_heads * max_num_partitions * (2 * 4 + head_size * query.element_size())
        assert workspace_buffer.dtype == torch.uint8
        assert workspace_buffer.numel() >= needed, (workspace_buffer.numel(), needed)
        last = kv_last_page_lens if block_size > 1 else torch.ones(num_seqs, dtype=torch.int32)
        _check_csr(kv_indptr, kv_page_indices, last, num_seqs, key_cache.shape[0], block_size)
        longest = int((kv_indptr[1:] - kv_indptr[:-1]).max()) * block_size
        assert -(-longest // partition_size) <= max_num_partitions, "sequence longer than the workspace's partitions"
        log.append(("paged_attention_ragged", dict(out=out, workspace_buffer=workspace_buffer, query=query,
                                                   key_cache=key_cache, scale=scale, kv_indptr=kv_indptr,
                                                   kv_page_indices=kv_page_indices, block_size=block_size,
                                                   max_num_partitions=max_num_partitions,
                                                   partition_size=partition_size, k_scale=k_scale, v_scale=v_scale)))
        out.copy_(csr_attention(query, key_cache, value_cache, torch.arange(num_seqs + 1), kv_indptr,
                                kv_page_indices, last, scale, False))
        return out


    @_standin
    def mha_batch_prefill_func(q, k, v, cu_seqlens_q, kv_indptr, kv_page_indices, max_seqlen_q, max_seqlen_k,
                               dropout_p=0.0, softmax_scale=None, logits_soft_cap=0.0, causal=False,
                               window_size=(-1, -1), alibi_slopes=None, deterministic=False, return_lse=False,
                               return_attn_probs=False, out=None):
        assert q.dtype in HALF_DTYPES and k.dtype == v.dtype == q.dtype
        # the pool at token granularity: k, v [slots, KV, D]
        assert k.dim() == 3 and k.shape[1:] == v.shape[1:] and q.shape[2] == k.shape[2], (q.shape, k.shape)
        batch = len(cu_seqlens_q) - 1
        assert cu_seqlens_q.dtype == torch.int32 and int(cu_seqlens_q[-1]) == q.shape[0]
        _check_csr(kv_indptr, kv_page_indices, None, batch, k.shape[0], 1)
        assert max_seqlen_q == int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
        assert max_seqlen_k == int((kv_indptr[1:] - kv_indptr[:-1]).max())
        log.append(("mha_batch_prefill_func", dict(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, kv_indptr=kv_indptr,
                                                   kv_page_indices=kv_page_indices, causal=causal,
                                                   softmax_scale=softmax_scale)))
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        ones = torch.ones(batch, dtype=torch.int32)
        return csr_attention(q, k.unsqueeze(1), v.unsqueeze(1), cu_seqlens_q, kv_indptr, kv_page_indices, ones, scale,
                             causal)

    mod = types.ModuleType("aiter")
    mod.paged_attention_ragged = paged_attention_ragged
    mod.mha_batch_prefill_func = mha_batch_prefill_func
    mod.calls = log
    return mod


@contextlib.contextmanager
def install(module: types.ModuleType):
    """Put a stand-in into sys.modules under its name for the duration."""
    name = module.__name__
    saved = sys.modules.get(name)
    sys.modules[name] = module
    try:
        yield module
    finally:
        if saved is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = saved


class AllocationRecorder(TorchDispatchMode):
    """Bytes of every new tensor storage produced by a torch op while active (views are not allocations); the
    stand-ins' own reference math is left out."""

    def __init__(self):
        super().__init__()
        self.sizes: List[int] = []

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if _PAUSED[0]:
            return out
        inputs = {t.untyped_storage().data_ptr() for t in _tensors((args, kwargs))}
        for t in _tensors(out):
            if t.untyped_storage().data_ptr() not in inputs:
                self.sizes.append(t.untyped_storage().nbytes())
        return out

    @property
    def largest_bytes(self) -> int:
        return max(self.sizes, default=0)


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x)
