"""The page ids of a batch, gathered from req_to_token straight into a planned buffer (one launch, no temporary).

Grid (B,): program b reads request b's row r = req_pool_indices[b] and writes its pages
    out[kv_indptr[b] + j] = req_to_token[r, j * page_size] // page_size,   j in [0, kv_indptr[b + 1] - kv_indptr[b])
(the slot of a page's first token names the page: mem_cache/allocator.py hands out whole pages), BLOCK pages at a
time. A windowed table (paged_kv_indices.build_page_table with first_pages) starts request b at its page
first_pages[b] and names each page by its windowed slot, slot_map[req_to_token[r, (first_pages[b] + j) * page_size]]
// page_size (swa_pool.py: the map is page-parallel). paged_kv_indices.py builds kv_indptr on the host; `out` is the
backend's planned kv_indices buffer.
"""

from __future__ import annotations

import torch
import triton.language as tl

from sglang.srt.layers.attention.triton_ops.jit_mode import lazy_jit

PAGE_IDS_BLOCK = 512


@lazy_jit
def _page_ids_kernel(Req_to_token, Req_pool_indices, Kv_indptr, Out, First_pages, Slot_map, stride_r2t,
                     PAGE_SIZE: tl.constexpr, BLOCK: tl.constexpr, WINDOWED: tl.constexpr, MAPPED: tl.constexpr):
    b = tl.program_id(0)
    row = tl.load(Req_pool_indices + b).to(tl.int64)
    start = tl.load(Kv_indptr + b)
    num_pages = tl.load(Kv_indptr + b + 1) - start
    offs = tl.arange(0, BLOCK)
    first = 0
    if WINDOWED:
        first = tl.load(First_pages + b).to(tl.int64)
    for j in range(0, num_pages, BLOCK):
        page = j + offs
        mask = page < num_pages
        slot = tl.load(Req_to_token + row * stride_r2t + (first + page.to(tl.int64)) * PAGE_SIZE, mask=mask, other=0)
        if MAPPED:
            slot = tl.load(Slot_map + slot.to(tl.int64), mask=mask, other=0)
        tl.store(Out + start + page, (slot // PAGE_SIZE).to(Out.dtype.element_ty), mask=mask)


def page_ids_fwd(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, kv_indptr: torch.Tensor,
                 page_size: int, out: torch.Tensor, first_pages: torch.Tensor | None = None,
                 slot_map: torch.Tensor | None = None) -> None:
    """req_to_token int64 [R + 1, L]; req_pool_indices int [B]; kv_indptr int32 [B + 1]; out int32 [>= total];
    first_pages int [B] (a windowed table: request b's first page), slot_map int32 (token slot -> windowed slot)."""
    batch = req_pool_indices.shape[0]
    if batch == 0:
        return
    assert req_to_token.stride(1) == 1, "req_to_token rows must be contiguous"
    _page_ids_kernel[(batch,)](req_to_token, req_pool_indices, kv_indptr, out,
                               first_pages if first_pages is not None else kv_indptr,
                               slot_map if slot_map is not None else kv_indptr, req_to_token.stride(0),
                               PAGE_SIZE=page_size, BLOCK=PAGE_IDS_BLOCK, WINDOWED=int(first_pages is not None),
                               MAPPED=int(slot_map is not None))
