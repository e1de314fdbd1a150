"""TorchNativeAttnBackend against a plain per-request attention reference (random q/k/v, paged slots)."""

import unittest
from types import SimpleNamespace

import torch

from sglang.srt.layers.attention.attention_registry import create_attention_backend
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="cpu")

H, KV, D = 6, 2, 16
SCALE = D**-0.5


def reference_attention(q, k, v, q_start):
    """q: [Lq, H, D] at sequence positions q_start.., k/v: [L, KV, D] (the whole sequence) -> [Lq, H * D]."""
    k = k.repeat_interleave(H // KV, dim=1)
    v = v.repeat_interleave(H // KV, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k.double()) * SCALE
    q_pos = torch.arange(q.shape[0])[:, None] + q_start
    scores = scores.masked_fill(torch.arange(k.shape[0])[None, :] > q_pos, float("-inf"))
    out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.double())
    return out.reshape(q.shape[0], H * D).float()


class Env:
    def __init__(self):
        torch.manual_seed(0)
        self.r2t = ReqToTokenPool(8, 256)
        self.pool = MHATokenToKVPool(1024, 1, torch.float32, KV, D, layer_num=1)
        self.backend = create_attention_backend(
            "torch_native", model_config=SimpleNamespace(), req_to_token_pool=self.r2t, token_to_kv_pool=self.pool, device="cpu"
        )
        self.layer = RadixAttention(H, D, SCALE, KV, layer_id=0)
        self.next_slot = 1
        # full per-request K/V history, for the reference
        self.k_hist, self.v_hist = {}, {}
        # shuffled slots so that requests are not contiguous in the pool
        self.slot_order = torch.randperm(1023) + 1

    def step(self, mode, rows, new_lens):
        prefix = [self.k_hist.get(r, torch.empty(0, KV, D)).shape[0] for r in rows]
        seq = [p + n for p, n in zip(prefix, new_lens)]
        locs = []
        for r, p, n in zip(rows, prefix, new_lens):
            loc = self.slot_order[self.next_slot : self.next_slot + n]
            self.next_slot += n
            self.r2t.req_to_token[r, p : p + n] = loc
            locs.append(loc)
        total = sum(new_lens)
        q, k, v = torch.randn(total, H, D), torch.randn(total, KV, D), torch.randn(total, KV, D)
        is_extend = mode == ForwardMode.EXTEND
        fb = ForwardBatch(
            forward_mode=mode, batch_size=len(rows), input_ids=torch.zeros(total, dtype=torch.int64),
            positions=torch.zeros(total, dtype=torch.int64), req_pool_indices=torch.tensor(rows),
            seq_lens=torch.tensor(seq), out_cache_loc=torch.cat(locs), seq_lens_cpu=seq,
            extend_prefix_lens_cpu=prefix if is_extend else [], extend_seq_lens_cpu=new_lens if is_extend else [],
            req_to_token_pool=self.r2t, token_to_kv_pool=self.pool, attn_backend=self.backend,
        )
        self.backend.init_forward_metadata(fb)
        out = self.layer(q, k, v, fb)
        expected, start = [], 0
        for r, p, n in zip(rows, prefix, new_lens):
            kh = torch.cat([self.k_hist.get(r, torch.empty(0, KV, D)), k[start : start + n]])
            vh = torch.cat([self.v_hist.get(r, torch.empty(0, KV, D)), v[start : start + n]])
            self.k_hist[r], self.v_hist[r] = kh, vh
            expected.append(reference_attention(q[start : start + n], kh, vh, p))
            start += n
        torch.testing.assert_close(out, torch.cat(expected), atol=1e-5, rtol=1e-5)


class TestTorchNativeBackend(unittest.TestCase):
    def test_extend_single_request_causal(self):
        Env().step(ForwardMode.EXTEND, [1], [37])

    def test_extend_with_prefix_and_chunks(self):
        env = Env()
        env.step(ForwardMode.EXTEND, [1], [20])
        env.step(ForwardMode.EXTEND, [1], [13])  # cached prefix of 20
        env.step(ForwardMode.EXTEND, [1], [1])  # one-token extend

    def test_mixed_batch_extend(self):
        env = Env()
        env.step(ForwardMode.EXTEND, [1], [9])
        env.step(ForwardMode.EXTEND, [2], [4])
        env.step(ForwardMode.EXTEND, [1, 2, 3], [5, 17, 3])  # prefixes 9, 4, 0

    def test_decode_varied_lengths(self):
        env = Env()
        env.step(ForwardMode.EXTEND, [1, 2, 3], [3, 30, 11])
        for _ in range(4):
            env.step(ForwardMode.DECODE, [1, 2, 3], [1, 1, 1])
        env.step(ForwardMode.DECODE, [2], [1])
        env.step(ForwardMode.DECODE, [1, 3], [1, 1])

    def test_unknown_backend_lists_choices(self):
        with self.assertRaisesRegex(ValueError, "torch_native"):
            create_attention_backend("nope", model_config=None, req_to_token_pool=None, token_to_kv_pool=None, device="cpu")


if __name__ == "__main__":
    unittest.main()
