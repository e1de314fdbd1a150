"""The CSR page tables that paged-attention libraries (FlashInfer, AITER) read, built from req_to_token.

For a batch of B requests with KV lengths seq_lens[b] and a pool of pages of `page_size` slots (page p covers slots
[p * page_size, (p + 1) * page_size), see mem_cache/allocator.py):
    kv_indptr       int32 [B + 1]  kv_indptr[b + 1] - kv_indptr[b] = ceil(seq_lens[b] / page_size) pages
    kv_indices      int32 [kv_indptr[B]]  the page ids of request b, in order, at kv_indptr[b]:kv_indptr[b + 1]
    kv_last_page_len int32 [B]     tokens used in each request's last page, in 1..page_size
    qo_indptr       int32 [B + 1]  (extend) rows of request b's new tokens in q: qo_indptr[b]:qo_indptr[b + 1]
A request's token i sits in page req_pages[i // page_size] at offset i % page_size, so the page of token
j * page_size (the first token of its j-th page) is req_to_token[row, j * page_size] // page_size. With page_size 1
the page ids are the token slots themselves.

A windowed layer's table (first_pos given: FlashInfer's second wrapper) covers request b's positions
[first_pos[b] // page_size * page_size, seq_lens[b]) only -- whole pages from the one holding its window's first key
(the scheduler frees only windowed pages wholly below the window, so that page is held) -- and names each page through
the pool's slot_map (token slot -> windowed slot, page-parallel) when the layer's pool has one.

Everything is written into the backend's planned buffers: the small indptr arrays (views [:B + 1]) from host lists,
kv_indices (a view [:total pages] of a buffer of S x ceil(context / page_size) entries, S the request table's rows,
mem_plan/backends.py) by one gather kernel. No per-step device tensor grows with the batch or its context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch


@dataclass
class PageTable:
    kv_indptr: torch.Tensor  # int32 [B + 1], a view of a planned buffer
    kv_indices: torch.Tensor  # int32 [num_pages], a view of a planned buffer
    kv_last_page_len: torch.Tensor  # int32 [B], a view of a planned buffer
    # the same arrays on the host (what they were copied from): FlashInfer's plan() reads its arrays on the host, and
    # handing it the device copies would make it read them back (a sync per plan)
    kv_indptr_host: Optional[torch.Tensor] = None
    kv_last_page_len_host: Optional[torch.Tensor] = None
    qo_indptr: Optional[torch.Tensor] = None  # int32 [B + 1] (extend), a view of a planned buffer
    qo_indptr_host: Optional[torch.Tensor] = None
    max_q_len: int = 1
    max_kv_len: int = 0


def _cumsum0(lengths: Sequence[int]) -> List[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def _kernel_fills(device: torch.device) -> bool:
    """Whether the Triton page-id kernel runs on `device`: a GPU, or the CPU under the Triton interpreter."""
    if device.type == "cuda":
        return True
    if device.type != "cpu":
        return False
    from sglang.srt.layers.attention.triton_backend import triton_interpreter_enabled

    return triton_interpreter_enabled()


def fill_page_ids(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, rows_cpu: Optional[Sequence[int]],
                  pages_per_req: Sequence[int], kv_indptr: torch.Tensor, page_size: int,
                  out: torch.Tensor, first_pages: Optional[Sequence[int]] = None,
                  slot_map: Optional[torch.Tensor] = None) -> torch.Tensor:
    """out[:total] = each request's page ids, concatenated in batch order (int32); returns that view. One Triton
    launch on a GPU (triton_ops/page_ids.py); elsewhere (tests on a CPU or the stand-in device) one slice copy per
    request, read through the host's row ids. Nothing of size B x context is allocated on the device."""
    total = sum(pages_per_req)
    if total > out.numel():
        raise ValueError(f"batch of {total} pages exceeds the planned kv_indices buffer of {out.numel()}")
    view = out[:total]
    if _kernel_fills(out.device):
        from sglang.srt.layers.attention.triton_ops.page_ids import page_ids_fwd

        firsts = None if first_pages is None else torch.tensor(first_pages, dtype=torch.int64).to(out.device)
        page_ids_fwd(req_to_token, req_pool_indices, kv_indptr, page_size, view, firsts, slot_map)
        return view
    rows = list(rows_cpu) if rows_cpu is not None else req_pool_indices.tolist()
    start = 0
    for b, (row, n) in enumerate(zip(rows, pages_per_req)):
        p0 = first_pages[b] * page_size if first_pages is not None else 0
        firsts = req_to_token[row, p0 : p0 + n * page_size : page_size]  # the slot of each page's first token
        if slot_map is not None:
            firsts = slot_map[firsts.long()]
        view[start : start + n].copy_(firsts // page_size if page_size > 1 else firsts)
        start += n
    return view


def _fill(buf: torch.Tensor, values: List[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(the view of `buf` now holding `values`, the host tensor it was copied from)."""
    host = torch.tensor(values, dtype=buf.dtype)
    view = buf[: len(values)]
    view.copy_(host, non_blocking=True)
    return view, host


def build_page_table(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens_cpu: Sequence[int],
                     page_size: int, kv_indptr_buf: torch.Tensor, last_page_len_buf: torch.Tensor,
                     kv_indices_buf: torch.Tensor, rows_cpu: Optional[Sequence[int]] = None,
                     extend_lens_cpu: Optional[Sequence[int]] = None,
                     qo_indptr_buf: Optional[torch.Tensor] = None, first_pos: Optional[Sequence[int]] = None,
                     slot_map: Optional[torch.Tensor] = None) -> PageTable:
    """The page table of one batch, written into the given planned buffers (kv_indices too). rows_cpu: the host's
    copy of req_pool_indices (the batch was built on the host), for devices without the Triton kernel. first_pos /
    slot_map: a windowed layer's table (the module docstring)."""
    if len(seq_lens_cpu) + 1 > kv_indptr_buf.numel():
        raise ValueError(f"batch of {len(seq_lens_cpu)} requests exceeds the planned {kv_indptr_buf.numel() - 1} slots")
    first_pages = [p // page_size for p in first_pos] if first_pos is not None else None
    if first_pages is not None:  # the table's lengths count from each request's first page
        seq_lens_cpu = [n - f * page_size for n, f in zip(seq_lens_cpu, first_pages)]
    pages_per_req = [-(-n // page_size) for n in seq_lens_cpu]
    kv_indptr, kv_indptr_host = _fill(kv_indptr_buf, _cumsum0(pages_per_req))
    last_page_len, last_page_len_host = _fill(
        last_page_len_buf, [n - (p - 1) * page_size for n, p in zip(seq_lens_cpu, pages_per_req)])
    table = PageTable(
        kv_indptr=kv_indptr,
        kv_indices=fill_page_ids(req_to_token, req_pool_indices, rows_cpu, pages_per_req, kv_indptr, page_size,
                                 kv_indices_buf, first_pages, slot_map),
        kv_last_page_len=last_page_len,
        kv_indptr_host=kv_indptr_host,
        kv_last_page_len_host=last_page_len_host,
        max_kv_len=max(seq_lens_cpu),
    )
    if extend_lens_cpu is not None:
        table.qo_indptr, table.qo_indptr_host = _fill(qo_indptr_buf, _cumsum0(extend_lens_cpu))
        table.max_q_len = max(extend_lens_cpu)
    return table


def extend_lens(forward_batch) -> List[int]:
    """Host list of new tokens per request of an EXTEND batch."""
    fb = forward_batch
    if fb.extend_seq_lens_cpu:
        return list(fb.extend_seq_lens_cpu)
    if fb.extend_seq_lens is not None:
        return fb.extend_seq_lens.tolist()
    return [s - p for s, p in zip(seq_lens(fb), fb.extend_prefix_lens_cpu)]


def seq_lens(forward_batch) -> List[int]:
    fb = forward_batch
    return list(fb.seq_lens_cpu) if fb.seq_lens_cpu else fb.seq_lens.tolist()
