"""Batches for the page-id gather (layers/attention/paged_kv_indices.fill_page_ids): random page-aligned
req_to_token rows, each batch's page ids computed independently from plain lists. Not a test file."""

import random

import torch

# (page_size, sequence lengths, rows): rows may repeat (a padded graph batch reads the dummy row 0 several times)
CASES = [
    (1, [1, 7, 33], [3, 1, 2]),
    (1, [600, 5, 1100], [2, 4, 1]),  # more than one kernel block of pages in a row
    (16, [1, 16, 17, 300], [1, 2, 3, 4]),
    (16, [9000, 40], [4, 2]),  # 563 pages: several blocks
    (4, [5, 1, 1], [2, 0, 0]),  # dummy rows of a padded batch
]
NUM_ROWS, ROW_LEN = 5, 9100


def make_case(page_size: int, seq_lens, rows, seed: int = 0):
    """(req_to_token int64 [NUM_ROWS, ROW_LEN], expected page ids as a list). Every row holds whole pages in a random
    order, as the allocator hands them out; row 0 is the dummy row of zeros."""
    g = random.Random(seed)
    r2t = torch.zeros(NUM_ROWS, ROW_LEN, dtype=torch.int64)
    table = {0: [0] * ROW_LEN}
    for row in range(1, NUM_ROWS):
        pages = g.sample(range(1, 100_000), -(-ROW_LEN // page_size))
        slots = [p * page_size + i for p in pages for i in range(page_size)][:ROW_LEN]
        table[row] = slots
        r2t[row] = torch.tensor(slots)
    expected = []
    for row, n in zip(rows, seq_lens):
        expected += [table[row][j * page_size] // page_size for j in range(-(-n // page_size))]
    return r2t, expected


def run_case(page_size: int, seq_lens, rows, rows_cpu=True):
    """fill_page_ids over the case, into a buffer larger than needed (poisoned, so a short write shows)."""
    from sglang.srt.layers.attention.paged_kv_indices import _cumsum0, fill_page_ids

    r2t, expected = make_case(page_size, seq_lens, rows)
    pages = [-(-n // page_size) for n in seq_lens]
    indptr = torch.tensor(_cumsum0(pages), dtype=torch.int32)
    out = torch.full((sum(pages) + 64,), -7, dtype=torch.int32)
    view = fill_page_ids(r2t, torch.tensor(rows), rows if rows_cpu else None, pages, indptr, page_size, out)
    return view.tolist(), expected, out[sum(pages):].tolist()


def kernel_page_ids() -> dict:
    """Under TRITON_INTERPRET=1: the kernel's ids, the expected ids and the untouched tail, per case."""
    from sglang.srt.layers.attention.paged_kv_indices import _kernel_fills

    assert _kernel_fills(torch.device("cpu")), "the interpreter must route fill_page_ids to the Triton kernel"
    return {str(i): run_case(*c) for i, c in enumerate(CASES)}
