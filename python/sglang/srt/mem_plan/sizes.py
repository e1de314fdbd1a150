"""Byte sizes of the runtime's own tables, written once: the planner charges them, the pools allocate them.

req_to_token   int64 [(num_reqs + 1), context_len + REQ_TO_TOKEN_EXTRA_COLUMNS]; row 0 is a dummy row for padded
               batches (memory_pool.ReqToTokenPool). Upstream keeps the same 4 spare columns (room for a few
               tokens past the context, e.g. speculative drafts) in int32.
kv pool        [layers, num_tokens + page_size, kv_heads, head_dim] for K and for V: the first page is a dummy page
               that padded reads point at (memory_pool.MHATokenToKVPool, allocator.py).
sampler        per running request, at the sampler's peak, the draw (sampling/sampler.py): fp32 rows of
               vocabulary size -- the logits (temperature and softmax turn them into the probabilities in place),
               their log-softmax (logprobs), the Exp(1) noise of the exponential race argmax(probs / noise) (what
               torch.multinomial allocates for one sample; seeded rows' noise is drawn on the host), and, in a
               prefill step, the forward's logits rows the step still holds while the sampler works on a copy of its
               finished rows (managers/batch_runner.py: logits[done]) -- 4 B each = 16 B per vocabulary entry
               (measured on CPU: test/registered/sampling/test_sampler_memory.py; the sampler before this peaked at
               24 B in decode and 28 B in prefill). Top-k/top-p sort no vocabulary (sampling/topk_topp.py): a 1 B
               keep mask per entry, freed before the draw, and per row SAMPLER_TOPK_CANDIDATES candidates (value, id,
               cumulative mass, three masks); plus one fixed term, the rows sorted in full (on a GPU every row that may
               need it, without a host read) SAMPLER_SORT_FALLBACK_ROWS at a time (row copy, sorted values, int64
               order, cumulative mass, masks) and the int64 rank row. (The full-sort sampler before that peaked at
               ~39 B per entry: sorted values and int64 order for every row, their cumulative sums, masks, a scattered
               copy.)
prompt logprobs (layers/prompt_logprobs.py) fit inside the sampler's per-slot rows: a prefill chunk's prompt rows are
               projected PROMPT_LOGPROB_BLOCK_ROWS(R) = R rows at a time (R request slots), each row holding the
               lm-head output (<= 4 B per entry), its fp32 copy, its fp32 log-softmax and the 1 B compare mask
               that ranks the target -- at most PROMPT_LOGPROB_BYTES_PER_VOCAB_ENTRY = 13 B (13.0 measured in fp32)
               <= SAMPLER_BYTES_PER_VOCAB_ENTRY (16 B). The block is scored
               inside the forward, before the sampler's rows exist, so a chunk of any length needs at most the
               `logits` term's V x 16 B x R (measured: test/registered/logprobs/test_prompt_logprob_memory.py).
grammar        structured output (srt/constrained/): the token bitmask's device rows, int32 [request slots,
               ceil(vocab / 32)] (one bit per vocabulary entry, allocated once: constrained/token_bitmask.py), plus, on
               a CPU only, the compiled-grammar cache budget (--grammar-cache-mb; on a GPU it and the bitmask's host
               rows are host memory); both 0 with --grammar-backend none.
graph logits   the captured decode graphs' output (model_executor/cuda_graph_runner.py): one fp32 [G, V] buffer
               shared by every captured size (G = the largest graph batch), not one [P, V] per size P. Part of the
               `cuda_graphs` term: the dry run's formula is this plus CUDA_GRAPH_BYTES_PER_BS x G (mem_plan/build.py)
               for the graphs' own activations; a server measures the capture.
"""

from __future__ import annotations

REQ_TO_TOKEN_EXTRA_COLUMNS = 4
REQ_TO_TOKEN_DTYPE = "int64"
REQ_TO_TOKEN_ELEM_BYTES = 8
UPSTREAM_REQ_TO_TOKEN_ELEM_BYTES = 4  # upstream SGLang's int32 table, for comparisons
SAMPLER_LOGITS_BYTES_PER_VOCAB_ENTRY = 4  # fp32 logits, made the probabilities in place
SAMPLER_LOGPROBS_BYTES_PER_VOCAB_ENTRY = 4  # fp32 log-softmax, when a request asks for logprobs
SAMPLER_DRAW_NOISE_BYTES_PER_VOCAB_ENTRY = 4  # the draw's fp32 Exp(1) noise
SAMPLER_PREFILL_ROWS_BYTES_PER_VOCAB_ENTRY = 4  # prefill: the forward's logits, held beside the sampled copy
SAMPLER_BYTES_PER_VOCAB_ENTRY = (SAMPLER_LOGITS_BYTES_PER_VOCAB_ENTRY + SAMPLER_LOGPROBS_BYTES_PER_VOCAB_ENTRY
                                 + SAMPLER_DRAW_NOISE_BYTES_PER_VOCAB_ENTRY
                                 + SAMPLER_PREFILL_ROWS_BYTES_PER_VOCAB_ENTRY)
PROMPT_LOGPROB_BYTES_PER_VOCAB_ENTRY = 4 + 4 + 4 + 1  # lm-head output, fp32 copy, log-softmax, rank mask
assert PROMPT_LOGPROB_BYTES_PER_VOCAB_ENTRY <= SAMPLER_BYTES_PER_VOCAB_ENTRY
SAMPLER_FILTER_BYTES_PER_VOCAB_ENTRY = 1  # the top-k/top-p keep mask (and min-p's compare), never live at the draw
SAMPLER_TOPK_CANDIDATES = 1024
SAMPLER_BYTES_PER_CANDIDATE = 4 + 8 + 4 + 1 + 1 + 1
SAMPLER_SORT_FALLBACK_ROWS = 4
SAMPLER_SORT_BYTES_PER_VOCAB_ENTRY = 4 + 4 + 8 + 4 + 1 + 1 + 1 + 1
SAMPLER_RANK_BYTES_PER_VOCAB_ENTRY = 8  # the int64 rank row the full-sort fallback compares with top_k
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
    return vocab_size * SAMPLER_BYTES_PER_VOCAB_ENTRY + min(vocab_size, SAMPLER_TOPK_CANDIDATES) * SAMPLER_BYTES_PER_CANDIDATE


def prompt_logprob_block_rows(num_request_slots: int) -> int:
    """Prompt-logprob rows projected at once: the request slots, so the block fits the logits term (docstring)."""
    return max(1, num_request_slots)


# an embedding server (--is-embedding) runs no sampler: its forward returns one fp32 pooled row per request
# (layers/pooler.py), which replaces the sampler's rows in the plan's logits term
POOLED_ROW_BYTES_PER_HIDDEN_UNIT = 4


def pooled_bytes_per_slot(hidden_size: int) -> int:
    """An embedding server's logits term per request slot: the fp32 pooled row."""
    return hidden_size * POOLED_ROW_BYTES_PER_HIDDEN_UNIT


def sampler_fixed_bytes(vocab_size: int) -> int:
    """The sampler's scratch that does not grow with the batch: the full-sort fallback rows (module docstring)."""
    return vocab_size * (SAMPLER_SORT_FALLBACK_ROWS * SAMPLER_SORT_BYTES_PER_VOCAB_ENTRY
                         + SAMPLER_RANK_BYTES_PER_VOCAB_ENTRY)


CUDA_GRAPH_LOGITS_BYTES_PER_VOCAB_ENTRY = 4  # fp32


def cuda_graph_logits_bytes(graph_bs: int, vocab_size: int) -> int:
    """The decode graphs' shared logits output, fp32 [G, V] (module docstring); 0 without graphs."""
    return graph_bs * vocab_size * CUDA_GRAPH_LOGITS_BYTES_PER_VOCAB_ENTRY


GRAMMAR_BITMASK_DTYPE = "int32"
GRAMMAR_BITMASK_WORD_BYTES = 4
GRAMMAR_BITMASK_TOKENS_PER_WORD = 32


def grammar_bitmask_words(vocab_size: int) -> int:
    """int32 words of one bitmask row: ceil(vocab_size / 32)."""
    return -(-vocab_size // GRAMMAR_BITMASK_TOKENS_PER_WORD)


def grammar_bitmask_bytes_per_slot(vocab_size: int) -> int:
    """Bytes of one request slot's row of the grammar bitmask."""
    return grammar_bitmask_words(vocab_size) * GRAMMAR_BITMASK_WORD_BYTES


def grammar_cache_budget_bytes(grammar_cache_mb: int) -> int:
    return grammar_cache_mb * 2**20
