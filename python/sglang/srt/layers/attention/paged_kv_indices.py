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

The small indptr arrays are written into the backend's planned buffers (views [:B + 1]); only kv_indices, whose
length is the batch's page count, is a new tensor per step (4 B per page).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch


@dataclass
class PageTable:
    kv_indptr: torch.Tensor  # int32 [B + 1], a view of a planned buffer
    kv_indices: torch.Tensor  # int32 [num_pages]
    kv_last_page_len: torch.Tensor  # int32 [B], a view of a planned buffer
    qo_indptr: Optional[torch.Tensor] = None  # int32 [B + 1] (extend), a view of a planned buffer
    max_q_len: int = 1
    max_kv_len: int = 0


def _cumsum0(lengths: Sequence[int]) -> List[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def page_ids(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens_cpu: Sequence[int],
             page_size: int) -> torch.Tensor:
    """int32 [sum ceil(seq_lens / page_size)]: each request's page ids, concatenated in batch order."""
    max_len = max(seq_lens_cpu)
    firsts = req_to_token[req_pool_indices, :max_len:page_size]  # [B, max_pages] slot of each page's first token
    num_pages = torch.tensor([-(-n // page_size) for n in seq_lens_cpu], device=firsts.device)
    valid = torch.arange(firsts.shape[1], device=firsts.device)[None, :] < num_pages[:, None]
    pages = firsts[valid]  # row-major: request order, then page order
    if page_size > 1:
        pages = pages // page_size
    return pages.to(torch.int32)


def _fill(buf: torch.Tensor, values: List[int]) -> torch.Tensor:
    view = buf[: len(values)]
    view.copy_(torch.tensor(values, dtype=buf.dtype), non_blocking=True)
    return view


def build_page_table(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens_cpu: Sequence[int],
                     page_size: int, kv_indptr_buf: torch.Tensor, last_page_len_buf: torch.Tensor,
                     extend_lens_cpu: Optional[Sequence[int]] = None,
                     qo_indptr_buf: Optional[torch.Tensor] = None) -> PageTable:
    """The page table of one batch; kv_indptr / kv_last_page_len (/ qo_indptr) are written into the given buffers."""
    if len(seq_lens_cpu) + 1 > kv_indptr_buf.numel():
        raise ValueError(f"batch of {len(seq_lens_cpu)} requests exceeds the planned {kv_indptr_buf.numel() - 1} slots")
    pages_per_req = [-(-n // page_size) for n in seq_lens_cpu]
    table = PageTable(
        kv_indptr=_fill(kv_indptr_buf, _cumsum0(pages_per_req)),
        kv_indices=page_ids(req_to_token, req_pool_indices, seq_lens_cpu, page_size),
        kv_last_page_len=_fill(last_page_len_buf,
                               [n - (p - 1) * page_size for n, p in zip(seq_lens_cpu, pages_per_req)]),
        max_kv_len=max(seq_lens_cpu),
    )
    if extend_lens_cpu is not None:
        table.qo_indptr = _fill(qo_indptr_buf, _cumsum0(extend_lens_cpu))
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
