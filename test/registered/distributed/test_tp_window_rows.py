"""--tp-size > 1 with a windowed KV format (int4): every rank's recent window reads the same entries.

Only rank 0 allocates request slots (and their ring rows); followers receive each forward from batch_sync. Two ranks
are stood up in one process (each a ReqToTokenPool and an int4 pool with its window, as model_runner_kv_cache_mixin
builds them), rank 0's batches go through pack -> pickle -> unpack, and after each forward both ranks' ring
bookkeeping (RecentWindow.tail: which cached positions each request reads from its ring) and ring state must be equal.
The case that broke: a request slot and its ring row handed to a new request whose cached prefix is the old one's
slots -- the old entries still match req_to_token, so a follower that never empties the row reads them.
"""

import pickle
import unittest

import torch

from sglang.srt.distributed.batch_sync import pack_forward_batch, unpack_forward_batch
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.quantized_kv_pool import create_kv_pool
from sglang.srt.mem_plan.kv_quant import recent_window, sink_tokens
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="cpu")

W, S = recent_window("int4"), sink_tokens("int4")


class Rank:
    def __init__(self):
        self.r2t = ReqToTokenPool(3, 64)
        self.pool = create_kv_pool("int4", 128, 1, torch.float32, 1, 64, 1, window_rows=2,  # 1 row + scratch
                                   window_req_rows=self.r2t.req_to_token.shape[0])
        self.r2t.attach_window(self.pool.window)

    def tail(self, fb):
        pre = fb.seq_lens - (fb.extend_seq_lens if fb.forward_mode.is_extend() else 1)
        ext = fb.extend_seq_lens if fb.forward_mode.is_extend() else torch.ones_like(fb.seq_lens)
        return self.pool.window.tail(fb.req_pool_indices, pre, ext, fb.out_cache_loc, self.r2t.req_to_token,
                                     int(ext.max()))


def extend(rows, prefix, new_slots):
    lens = [len(s) for s in new_slots]
    seq = [p + n for p, n in zip(prefix, lens)]
    t = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    return ForwardBatch(ForwardMode.EXTEND, len(rows), t([0] * sum(lens)), t([i for p, s in zip(prefix, seq)
                                                                                 for i in range(p, s)]),
                        t(rows), t(seq), t([x for s in new_slots for x in s]), seq_lens_cpu=seq,
                        extend_prefix_lens_cpu=prefix, extend_seq_lens_cpu=lens, extend_prefix_lens=t(prefix),
                        extend_seq_lens=t(lens))


class TestTpWindowRows(unittest.TestCase):
    def forward(self, ranks, fb):
        """Rank 0 runs fb; the follower runs what it receives. Both ranks' ring reads and state must agree."""
        msg = pickle.loads(pickle.dumps(pack_forward_batch(fb, ranks[0].r2t.req_to_token_host, ranks[0].pool.window)))
        follower_fb = unpack_forward_batch(msg, ranks[1].r2t.req_to_token, ranks[1].pool.window)
        tails = [ranks[0].tail(fb), ranks[1].tail(follower_fb)]
        for name in ("ring_rows", "counts", "sink_counts"):
            self.assertEqual(getattr(tails[0], name).tolist(), getattr(tails[1], name).tolist(), name)
        self.assertTrue(torch.equal(ranks[0].pool.window.loc, ranks[1].pool.window.loc))
        return tails[0]

    def test_reused_row_is_emptied_on_every_rank(self):
        ranks = [Rank(), Rank()]
        r2t = ranks[0].r2t
        n = W + S + 4
        a = r2t.alloc()
        slots = list(range(1, n + 1))
        r2t.write(a, 0, slots)
        self.forward(ranks, extend([a], [0], [slots]))
        r2t.write_cells([a], [n], [n + 1])  # a decode step: one more token
        decode = ForwardBatch(ForwardMode.DECODE, 1, torch.tensor([0]), torch.tensor([n]), torch.tensor([a]),
                              torch.tensor([n + 1]), torch.tensor([n + 1]), seq_lens_cpu=[n + 1])
        t = self.forward(ranks, decode)
        self.assertEqual((t.counts.item(), t.sink_counts.item()), (W, S))  # a reads its newest and first from the ring
        # a finishes; b gets its slot and its ring row back, with a's tokens as its cached prefix
        r2t.free(a)
        b = r2t.alloc()
        self.assertEqual(b, a)
        self.assertEqual(ranks[0].pool.window.rows.row_of[b], 1)
        r2t.write(b, 0, slots + [n + 2])
        t = self.forward(ranks, extend([b], [n], [[n + 2]]))
        # none of the ring's entries are b's (they were written by a's forwards): read through the codes
        self.assertEqual((t.counts.item(), t.sink_counts.item()), (0, 0))
        # a second request while b holds the only row: no ring row on either rank, nothing read from a ring
        c = r2t.alloc()
        r2t.write(c, 0, [n + 3, n + 4])
        t = self.forward(ranks, extend([b, c], [n + 1, 0], [[n + 5], [n + 3, n + 4]]))
        self.assertEqual(t.ring_rows.tolist(), [1, 0])
        self.assertEqual(ranks[0].pool.window.rows.num_without_row, 1)
        r2t.check_integrity(2)


if __name__ == "__main__":
    unittest.main()
