"""--tp-size > 1 with windowed layers beside full ones (Gemma 3, gpt-oss): every rank reads the same windowed K/V.

Only rank 0's allocator sets the pool's slot map (token slot -> windowed slot); a follower learns it from batch_sync.
Two ranks are stood up in one process (each a ReqToTokenPool and an SWAKVPool; only rank 0 an allocator), rank 0's
batches go through pack -> pickle -> unpack, each rank writes the same K/V for the batch's new tokens (as its model
would), and then every windowed layer's K/V over each request's window must be the one written at those positions,
on both ranks. The case that broke: a follower's map stayed all 0, so every windowed layer wrote and read the dummy
page (Gemma 3 at tp=2 left HF greedy at the 10th token).
"""

import pickle
import unittest

import torch

from sglang.srt.distributed.batch_sync import pack_forward_batch, unpack_forward_batch
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.swa_allocator import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.swa_pool import SWAKVPool
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=3, suite="cpu")

LAYERS = (True, False, True)  # windowed, full, windowed
PAGE, WINDOW, TOKENS, WINDOWED_TOKENS = 4, 6, 64, 24


class Rank:
    def __init__(self):
        self.r2t = ReqToTokenPool(3, 48)
        self.pool = SWAKVPool(LAYERS, TOKENS, WINDOWED_TOKENS, PAGE, torch.float32, head_num=1, head_dim=2)

    def write(self, fb: ForwardBatch) -> None:
        """K/V of the batch's new tokens, a function of (position, layer) only: what every rank's model computes."""
        for layer in range(len(LAYERS)):
            k = (fb.positions.float() * 10 + layer)[:, None, None].expand(-1, 1, 2).contiguous()
            self.pool.set_kv_buffer(layer, fb.out_cache_loc, k, -k)

    def window_kv(self, row: int, seq_len: int):
        slots = self.r2t.req_to_token[row, max(0, seq_len - WINDOW) : seq_len].to(torch.int64)
        return {layer: self.pool.gather_kv(layer, slots, torch.float32)[0][:, 0, 0].tolist()
                for layer in range(len(LAYERS)) if LAYERS[layer]}


def extend(rows, prefix, new_slots):
    lens = [len(s) for s in new_slots]
    seq = [p + n for p, n in zip(prefix, lens)]
    t = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    return ForwardBatch(ForwardMode.EXTEND, len(rows), t([0] * sum(lens)),
                        t([i for p, s in zip(prefix, seq) for i in range(p, s)]), t(rows), t(seq),
                        t([x for s in new_slots for x in s]), seq_lens_cpu=seq, extend_prefix_lens_cpu=prefix,
                        extend_seq_lens_cpu=lens, extend_prefix_lens=t(prefix), extend_seq_lens=t(lens))


def decode(rows, seq_lens, new_slots):
    t = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    return ForwardBatch(ForwardMode.DECODE, len(rows), t([0] * len(rows)), t([n - 1 for n in seq_lens]), t(rows),
                        t(seq_lens), t(new_slots), seq_lens_cpu=list(seq_lens))


class TestTpWindowedSlotMap(unittest.TestCase):
    def setUp(self):
        self.ranks = [Rank(), Rank()]
        self.alloc = SWATokenToKVPoolAllocator(TOKENS, WINDOWED_TOKENS, PAGE, WINDOW, self.ranks[0].pool.slot_map)
        self.lens = {}

    def forward(self, fb):
        msg = pickle.loads(pickle.dumps(pack_forward_batch(fb, self.ranks[0].r2t.req_to_token_host, None,
                                                           self.ranks[0].pool.slot_map)))
        follower_fb = unpack_forward_batch(msg, self.ranks[1].r2t.req_to_token, None, self.ranks[1].pool.slot_map)
        self.ranks[0].write(fb)
        self.ranks[1].write(follower_fb)
        for row, n in zip(fb.req_pool_indices.tolist(), fb.seq_lens_cpu):
            want = {layer: [p * 10.0 + layer for p in range(max(0, n - WINDOW), n)]
                    for layer in range(len(LAYERS)) if LAYERS[layer]}
            for rank in self.ranks:
                self.assertEqual(rank.window_kv(row, n), want, (self.ranks.index(rank), row, n))

    def grow(self, row, n_new):
        """Rank 0's scheduler: slots for n_new more tokens, then its windowed pages below the window freed."""
        r2t, cur = self.ranks[0].r2t, self.lens.get(row, 0)
        last = r2t.read(row, cur - 1, cur)[0] if cur else 0
        slots = self.alloc.alloc(cur, last, n_new)
        r2t.write(row, cur, slots)
        self.lens[row] = cur + n_new
        return cur, slots

    def free_below_window(self, row):
        n = self.lens[row]
        whole_pages = max(0, n - WINDOW + 1) // PAGE * PAGE
        if whole_pages:
            self.alloc.free_windowed(self.ranks[0].r2t.read(row, 0, whole_pages))

    def test_follower_reads_the_windowed_kv_rank0_allocated(self):
        r2t = self.ranks[0].r2t
        a, b = r2t.alloc(), r2t.alloc()  # a follower's rows are written by unpack only
        # b's first pages take the first windowed pages, so a's token pages map elsewhere: no identity by chance
        pb, sb = self.grow(b, 5)
        pa, sa = self.grow(a, 11)
        self.forward(extend([b, a], [pb, pa], [sb, sa]))
        self.free_below_window(a)
        for _ in range(9):  # decode across page boundaries, freeing a's windowed pages as its window moves
            (pa, sa), (pb, sb) = self.grow(a, 1), self.grow(b, 1)
            self.forward(decode([a, b], [self.lens[a], self.lens[b]], sa + sb))
            self.free_below_window(a)
            self.free_below_window(b)
        self.assertGreater(self.alloc.num_windowed_pages_in_use(), 0)
        # a chunk of prefill after a has freed its early windowed pages: its new pages reuse freed windowed pages
        pa, sa = self.grow(a, 7)
        self.forward(extend([a], [pa], [sa]))


if __name__ == "__main__":
    unittest.main()
