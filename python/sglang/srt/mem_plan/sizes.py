"""Byte sizes of the runtime's own tables, written once: the planner charges them, the pools allocate them.

req_to_token   int64 [(num_reqs + 1), context_len + REQ_TO_TOKEN_EXTRA_COLUMNS]; row 0 is a dummy row for padded
               batches (memory_pool.ReqToTokenPool). Upstream keeps the same 4 spare columns (room for a few
               tokens past the context, e.g. speculative drafts) in int32.
kv pool        [layers, num_tokens + page_size, kv_heads, head_dim] for K and for V: the first page is a dummy page
               that padded reads point at (memory_pool.MHATokenToKVPool, allocator.py).
sampler        float32/int64 rows of vocabulary size per running request (sampling/sampler.py):
               logits (4 B), a softmax/log-softmax copy (4 B), sorted probabilities (4 B) + their int64 sort
               indices (8 B) for top-p/top-k, and the scattered result (4 B) = 24 B per vocabulary entry.
"""

from __future__ import annotations

REQ_TO_TOKEN_EXTRA_COLUMNS = 4
REQ_TO_TOKEN_DTYPE = "int64"
REQ_TO_TOKEN_ELEM_BYTES = 8
UPSTREAM_REQ_TO_TOKEN_ELEM_BYTES = 4  # upstream SGLang's int32 table, for comparisons
SAMPLER_BYTES_PER_VOCAB_ENTRY = 4 + 4 + 4 + 8 + 4
# upstream SGLang's GPU sampler (fused top-k/top-p kernels, no full sort): fp32 logits + fp32 probabilities
UPSTREAM_SAMPLER_BYTES_PER_VOCAB_ENTRY = 4 + 4


def req_to_token_row_len(context_len: int) -> int:
    """Columns of the request -> token-slot table."""
    return context_len + REQ_TO_TOKEN_EXTRA_COLUMNS


def req_to_token_bytes(num_reqs: int, context_len: int, elem_bytes: int = REQ_TO_TOKEN_ELEM_BYTES) -> int:
    """(num_reqs + 1) rows (row 0 is the dummy row) x (context_len + 4) columns."""
    return (num_reqs + 1) * req_to_token_row_len(context_len) * elem_bytes


def kv_pool_rows(num_tokens: int, page_size: int) -> int:
    """Rows of each per-layer K and V buffer: the pool's tokens plus the dummy page."""
    return num_tokens + page_size


def sampler_bytes_per_slot(vocab_size: int) -> int:
    """Sampler/logits bytes one running request holds at once (module docstring)."""
    return vocab_size * SAMPLER_BYTES_PER_VOCAB_ENTRY
