"""extend_attention (sgl-kernel/csrc/cpu/extend_attention_op.h): causal attention of a prefill's new tokens over the
paged KV pool, cached prefix included, for a bf16 pool (level avx512_bf16) and an fp32 pool (every level from the
native one down to avx2).

References: (1) fp32 SDPA over each request's gathered K/V with the causal mask (query i at position prefix + i sees
keys j <= prefix + i); (2) the decode kernel: row i of a request must equal, bit for bit, decode_attention of that
token over the request's first prefix + i + 1 tokens (the kernel promises the prompt the decode path's arithmetic).
Then the torch_native backend through a whole model: the kernel path's prefill logits against the SDPA path's.
"""

import unittest

import torch
import torch.nn.functional as F

from sglang.jit_kernel.cpu_isa import LEVELS
from sglang.jit_kernel.cpu_ops import (cpu_kernels_expected, get_cpu_ops, get_fp32_ops, quant_kernels_expected,
                                       set_fp32_kernels)
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="cpu")

BF16 = torch.bfloat16
# (prefix lens, extend lens, heads, kv heads, head dim): no prefix, a prefix (a chunk after the first, a cache hit),
# single-token extends, groups of 3 (SmolLM2), 1, 4, 5, 8
CASES = [
    ([0], [130], 9, 3, 64),
    ([0, 40, 0, 7], [1, 33, 64, 2], 9, 3, 64),
    ([100, 0, 3], [17, 5, 1], 4, 4, 96),
    ([0, 12], [20, 9], 10, 2, 160),
    ([5, 0], [31, 16], 8, 1, 128),
    ([0], [16], 4, 1, 256),
]


def make_batch(prefix, extend, heads, kv, d, dtype, slots=1200):
    g = torch.Generator().manual_seed(len(prefix) * 100 + d)
    k_cache = torch.randn(slots, kv, d, generator=g).to(dtype)
    v_cache = torch.randn(slots, kv, d, generator=g).to(dtype)
    bs, width = len(prefix), max(p + e for p, e in zip(prefix, extend)) + 3
    req_to_token = torch.zeros(bs + 2, width, dtype=torch.int64)
    perm = torch.randperm(slots - 1, generator=g) + 1  # the pool's slots of a request are scattered
    rows = torch.randperm(bs + 2, generator=g)[:bs]
    start = 0
    for r, p, e in zip(rows.tolist(), prefix, extend):
        req_to_token[r, : p + e] = perm[start : start + p + e]
        start += p + e
    q = torch.randn(sum(extend), heads, d, generator=g).to(dtype)
    return q, k_cache, v_cache, req_to_token, rows, torch.tensor(prefix), torch.tensor(extend)


def reference(q, k_cache, v_cache, req_to_token, rows, prefix, extend, heads, kv, d):
    outs, q0 = [], 0
    for r, p, e in zip(rows.tolist(), prefix.tolist(), extend.tolist()):
        idx = req_to_token[r, : p + e]
        kk, vv = k_cache[idx].float().transpose(0, 1), v_cache[idx].float().transpose(0, 1)  # [KV, p + e, D]
        qq = q[q0 : q0 + e].float().view(e, kv, heads // kv, d).permute(1, 2, 0, 3).reshape(kv, -1, d)
        mask = (torch.arange(p + e)[None, :] <= (p + torch.arange(e))[:, None]).repeat(heads // kv, 1)
        o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, scale=d**-0.5)  # [KV, G * e, D]
        outs.append(o.view(kv, heads // kv, e, d).permute(2, 0, 1, 3).reshape(e, heads * d))
        q0 += e
    return torch.cat(outs)


class ExtendAttentionChecks:
    dtype = None
    atol = None

    def check(self, ops, case):
        prefix, extend, heads, kv, d = case
        args = make_batch(prefix, extend, heads, kv, d, self.dtype)
        out = ops.extend_attention(*args, d**-0.5)
        self.assertEqual(out.dtype, self.dtype)
        torch.testing.assert_close(out.float(), reference(*args, heads, kv, d), atol=self.atol, rtol=self.atol)
        # row by row, the decode kernel's result for that token (it rewrites the token's own K/V: the same values)
        q, k_cache, v_cache, table, rows, pre, ext = args
        q0 = 0
        for r, p, e in zip(rows.tolist(), pre.tolist(), ext.tolist()):
            for i in range(e):
                slot = table[r, p + i : p + i + 1]
                one = ops.decode_attention(q[q0 + i : q0 + i + 1], k_cache[slot], v_cache[slot], k_cache, v_cache,
                                           table, torch.tensor([r]), torch.tensor([p + i + 1]), slot, d**-0.5)
                self.assertTrue(torch.equal(one[0], out[q0 + i]), (case, r, i))
            q0 += e

    def check_refusals(self, ops):
        q, k_cache, v_cache, table, rows, pre, ext = make_batch([0, 4], [6, 3], 4, 2, 64, self.dtype)
        with self.assertRaisesRegex(RuntimeError, "sum to"):
            ops.extend_attention(q[:-1], k_cache, v_cache, table, rows, pre, ext, 0.125)
        bad = table.clone()
        bad[rows[1], 2] = k_cache.shape[0]
        with self.assertRaisesRegex(RuntimeError, "outside the KV pool"):
            ops.extend_attention(q, k_cache, v_cache, bad, rows, pre, ext, 0.125)


@unittest.skipUnless(cpu_kernels_expected(), "no AVX-512 BF16 on this CPU, or SGLANG_CPU_KERNELS=0")
class TestExtendAttentionBf16(ExtendAttentionChecks, unittest.TestCase):
    dtype, atol = BF16, 2e-2

    def test_matches_sdpa_and_the_decode_kernel(self):
        for case in CASES:
            self.check(get_cpu_ops(), case)

    def test_refusals(self):
        self.check_refusals(get_cpu_ops())


@unittest.skipUnless(quant_kernels_expected(), "no AVX2 on this CPU, or SGLANG_CPU_KERNELS=0: no fp32 kernels")
class TestExtendAttentionF32(ExtendAttentionChecks, unittest.TestCase):
    dtype, atol = torch.float32, 2e-5

    def setUp(self):
        set_fp32_kernels(True)
        self.addCleanup(set_fp32_kernels, False)
        self.ops = get_fp32_ops()
        self.level0 = self.ops.get_cpu_isa()
        self.addCleanup(self.ops.set_cpu_isa, self.level0)

    def test_every_level(self):
        for level in LEVELS[LEVELS.index("avx2") : LEVELS.index(self.level0) + 1]:
            self.ops.set_cpu_isa(level)
            for case in CASES:
                self.check(self.ops, case)
        self.check_refusals(self.ops)


@unittest.skipUnless(cpu_kernels_expected(), "no AVX-512 BF16 on this CPU, or SGLANG_CPU_KERNELS=0")
class TestExtendAttentionInModel(unittest.TestCase):
    def test_prefill_logits_as_close_to_fp32_as_the_sdpa_path(self):
        """The default model in bf16: every position's logits of a prefill without a prefix and of one chunked over
        a prefix, through the kernel and through the backend's SDPA path, against the fp32 model's (SDPA): the kernel
        path is as close (mean error, argmax agreement) as the SDPA path is. A wrong mask or prefix is far off."""
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.model_loader import load_model
        from sglang.srt.server_args import ServerArgs
        from sglang.test.engine_fixtures import default_model_dir
        from sglang.test.paged_forward import PagedForwardDriver

        g = torch.Generator().manual_seed(1)
        prompt = torch.randint(100, 20000, (150,), generator=g).tolist()
        logits = {}
        for dtype, fused in (("float32", False), ("bfloat16", True), ("bfloat16", False)):
            mc = ModelConfig.from_server_args(ServerArgs(dtype=dtype), default_model_dir())
            model = load_model(mc)
            driver = PagedForwardDriver(model, mc, max_reqs=2, max_tokens=1024)
            if not fused:
                driver.attn_backend.cpu_extend_ops = None
            self.assertEqual(driver.attn_backend.cpu_extend_ops is not None, fused)
            whole, chunked = driver.new_request(), driver.new_request()
            a = driver.extend([whole], [prompt], logits_indices=torch.arange(150))
            driver.extend([chunked], [prompt[:100]])
            b = driver.extend([chunked], [prompt[100:]], logits_indices=torch.arange(50))
            logits[fused if dtype == "bfloat16" else "ref"] = torch.cat([a, b]).float()
        ref = logits["ref"]
        err = {k: (logits[k] - ref).abs().mean().item() for k in (True, False)}
        agree = {k: (logits[k].argmax(-1) == ref.argmax(-1)).float().mean().item() for k in (True, False)}
        print(f"mean |logit error| kernel {err[True]:.4f} sdpa {err[False]:.4f}; argmax agreement kernel "
              f"{agree[True]:.3f} sdpa {agree[False]:.3f}")
        self.assertLess(err[True], 1.25 * err[False])
        self.assertGreater(agree[True], agree[False] - 0.05)


if __name__ == "__main__":
    unittest.main()
