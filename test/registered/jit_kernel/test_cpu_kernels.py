"""The AVX-512 BF16 CPU kernels against torch references computed from the same bf16 inputs.

On a CPU with AVX-512 BF16 (the project machines, CI) the kernels must build and load: that is asserted, not
skipped (unless SGLANG_CPU_KERNELS=0, which the rest of the suite can be run with to test the torch path alone). Elementwise kernels reproduce the torch path's rounding exactly; the GEMV and attention accumulate in
fp32 in another order, so they are compared with an fp32 reference within a bf16 tolerance, and the GEMV must give
identical rows whatever the batch size (a request's output does not depend on its batch mates).
"""

import unittest

import torch
import torch.nn.functional as F

from sglang.jit_kernel.cpu_ops import cpu_kernels_disabled, cpu_kernels_expected, cpu_ops_status, get_cpu_ops
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="cpu")

BF16 = torch.bfloat16


@unittest.skipUnless(cpu_kernels_expected(), "no AVX-512 BF16 on this CPU, or SGLANG_CPU_KERNELS=0: the kernels are not used")
class TestCpuKernels(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ops = get_cpu_ops()

    def setUp(self):
        self.assertIsNotNone(self.ops, f"CPU kernels did not load: {cpu_ops_status()}")
        torch.manual_seed(0)

    def test_gemv_matches_fp32_reference_and_is_batch_invariant(self):
        for n, k in ((960, 576), (577, 64), (3, 1536), (49152 // 16, 576)):
            w = torch.randn(n, k, dtype=BF16)
            x = torch.randn(9, k, dtype=BF16)
            out = self.ops.gemv(x, w)
            ref = x.float() @ w.float().t()
            self.assertEqual(out.shape, (9, n))
            self.assertEqual(out.dtype, BF16)
            # bf16 output of an fp32 sum: within one bf16 rounding of the exact value (plus fp32 summation noise)
            torch.testing.assert_close(out.float(), ref, atol=1e-2 * k**0.5, rtol=2 ** -7)
            for rows in (1, 2, 3, 4, 5):
                self.assertTrue(torch.equal(self.ops.gemv(x[:rows], w), out[:rows]), (n, k, rows))
            self.assertTrue(torch.equal(self.ops.gemv(x[4:5], w), out[4:5]))

    def test_packed_linear_matches_fp32_reference_and_is_batch_invariant(self):
        """The non-AMX GEMM on weights packed in the VNNI layout: within a bf16 rounding of the fp32 product for 1-70
        rows, each row bit-identical whatever its batch mates; the packed tensor unpacks to the original, and the torch
        path of a packed weight (kernels switched off) is exactly F.linear on the original."""
        from sglang.srt.layers.packed_linear import packed_linear, unpack_weight

        # 80 and 16 rows: 5 and 1 blocks of 16, a last group shorter than the 3 blocks gemm_bf16.h interleaves
        for n, k in ((960, 576), (576, 1536), (16, 32), (3072, 64), (80, 96)):
            w = torch.randn(n, k, dtype=BF16)
            packed = self.ops.pack_linear_weight(w)
            self.assertEqual((packed.shape, packed.dtype), (w.shape, BF16))
            self.assertTrue(torch.equal(unpack_weight(packed), w))
            x = torch.randn(70, k, dtype=BF16)
            out = self.ops.packed_linear(x, packed)
            ref = x.float() @ w.float().t()
            torch.testing.assert_close(out.float(), ref, atol=1e-2 * k**0.5, rtol=2 ** -7)
            for rows in (1, 2, 7, 8, 9, 17, 33, 64):
                self.assertTrue(torch.equal(self.ops.packed_linear(x[:rows], packed), out[:rows]), (n, k, rows))
                self.assertTrue(torch.equal(self.ops.packed_linear(x[rows - 1 : rows], packed), out[rows - 1 : rows]))
            bias = torch.randn(n, dtype=BF16)
            with cpu_kernels_disabled():
                self.assertTrue(torch.equal(packed_linear(x[:5], packed, bias), F.linear(x[:5], w, bias)))
        with self.assertRaisesRegex(RuntimeError, "multiple of 16"):
            self.ops.pack_linear_weight(torch.zeros(24, 64, dtype=BF16))

    def test_prepack_packs_an_untied_lm_head_not_a_tied_one(self):
        """At load the dense layers' weights and an untied lm_head's are packed (its logits then come from
        packed_linear: the same values for one row or many); a tied lm_head is the embedding table and stays as it is."""
        from sglang.jit_kernel.cpu_ops import amx_available
        from sglang.srt.layers.linear import prepack_dense_linear_weights
        from sglang.srt.layers.packed_linear import unpack_weight
        from sglang.srt.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding

        if amx_available():
            self.skipTest("with AMX the dense weights stay unpacked")
        model = torch.nn.Module()
        model.embed, model.lm_head = VocabParallelEmbedding(320, 64), ParallelLMHead(320, 64)
        model.tied_embed, model.tied_head = VocabParallelEmbedding(320, 64), ParallelLMHead(320, 64)
        for m in (model.embed, model.lm_head, model.tied_embed):
            m.weight.data = torch.randn(320, 64, dtype=BF16)
        model.tied_head.tie_weights(model.tied_embed)
        w, table = model.lm_head.weight.detach().clone(), model.tied_embed.weight.detach().clone()
        self.assertEqual(prepack_dense_linear_weights(model), 1)
        self.assertTrue(model.lm_head.weight.vnni_packed and torch.equal(unpack_weight(model.lm_head.weight), w))
        self.assertFalse(getattr(model.tied_embed.weight, "vnni_packed", False))  # the shared table
        self.assertFalse(getattr(model.embed.weight, "vnni_packed", False))  # an embedding is never packed
        self.assertTrue(torch.equal(model.tied_head.weight, table))
        x = torch.randn(5, 64, dtype=BF16)
        logits = model.lm_head.logits(x)
        self.assertTrue(torch.equal(logits, self.ops.packed_linear(x, model.lm_head.weight)))
        self.assertTrue(torch.equal(model.lm_head.logits(x[2:3]), logits[2:3]))
        torch.testing.assert_close(logits.float(), x.float() @ w.float().t(), atol=1e-2 * 8, rtol=2 ** -7)

    def test_amx_linear_matches_fp32_reference_and_is_batch_invariant(self):
        from sglang.jit_kernel.cpu_ops import amx_available

        if "amx_bf16" not in open("/proc/cpuinfo").read():
            self.skipTest("this CPU has no AMX")
        self.assertTrue(amx_available(), "AMX is on this CPU but the kernels could not get the tile state")
        for n, k in ((960, 576), (1000, 64), (7, 1536), (3072, 576)):  # 1000 and 7: a tail of N % 16 rows
            w = torch.randn(n, k, dtype=BF16)
            x = torch.randn(64, k, dtype=BF16)
            out = self.ops.amx_linear(x, w)
            ref = x.float() @ w.float().t()
            self.assertEqual(out.shape, (64, n))
            torch.testing.assert_close(out.float(), ref, atol=1e-2 * k**0.5, rtol=2 ** -7)
            for rows in (1, 3, 9, 16, 17, 31, 33, 48, 63):
                self.assertTrue(torch.equal(self.ops.amx_linear(x[:rows], w), out[:rows]), (n, k, rows))
        with self.assertRaisesRegex(RuntimeError, "at most 64 rows"):
            self.ops.amx_linear(torch.randn(65, 64, dtype=BF16), torch.randn(16, 64, dtype=BF16))

    def test_gemv_rejects_bad_input(self):
        with self.assertRaisesRegex(RuntimeError, "multiple of 32"):
            self.ops.gemv(torch.randn(1, 40, dtype=BF16), torch.randn(8, 40, dtype=BF16))
        with self.assertRaisesRegex(RuntimeError, "bfloat16"):
            self.ops.gemv(torch.randn(1, 64), torch.randn(8, 64))

    def test_rmsnorm_equals_torch_rounding(self):
        for hidden in (576, 100):
            x = torch.randn(7, hidden, dtype=BF16)
            res = torch.randn(7, hidden, dtype=BF16)
            w = (torch.rand(hidden) + 0.5).to(BF16)
            out, res_out = self.ops.rmsnorm(x, res, w, 1e-5)
            s = x + res
            ref = w * F.rms_norm(s.float(), (hidden,), None, 1e-5).to(BF16)
            self.assertTrue(torch.equal(res_out, s))
            torch.testing.assert_close(out, ref, atol=0, rtol=2 ** -7)  # rsqrt may differ in the last fp32 bit
            self.assertGreater((out == ref).float().mean().item(), 0.99)
            out2, none = self.ops.rmsnorm(x, None, w, 1e-5)
            self.assertIsNone(none)
            torch.testing.assert_close(out2, w * F.rms_norm(x.float(), (hidden,), None, 1e-5).to(BF16), atol=0, rtol=2 ** -7)

    def test_silu_and_mul_equals_torch(self):
        x = torch.randn(5, 2 * 1000, dtype=BF16) * 4
        out = self.ops.silu_and_mul(x)
        ref = F.silu(x[:, :1000]) * x[:, 1000:]
        torch.testing.assert_close(out, ref, atol=0, rtol=2 ** -7)
        self.assertGreater((out == ref).float().mean().item(), 0.99)

    def test_rotary_in_place_equals_torch(self):
        from sglang.srt.layers.rotary_embedding import get_rope

        heads, kv, d = 9, 3, 64
        for rd in (64, 32):
            rope = get_rope(d, rd, 4096, 10000.0, dtype=BF16)
            qkv = torch.randn(6, (heads + 2 * kv) * d, dtype=BF16)
            pos = torch.tensor([0, 1, 7, 100, 4000, 3])
            n_qk = (heads + kv) * d
            ref, _ = rope._forward_torch(pos, qkv[:, :n_qk].view(6, -1, d))
            x = qkv.clone()
            self.ops.rotary_embedding_(pos, x, heads + kv, d, rope.cos_sin_cache)
            self.assertTrue(torch.equal(x[:, :n_qk], ref.reshape(6, n_qk)))
            self.assertTrue(torch.equal(x[:, n_qk:], qkv[:, n_qk:]))  # v untouched

    def test_qk_norm_rope_equals_the_norm_then_rotary_kernels(self):
        """Qwen3's attention prologue in one call: bit-identical to the rmsnorm kernel on every q and k head followed
        by the rotary kernel (Qwen3Attention's module path), v untouched, rows of a wider tensor (row stride) too; and
        as close to the torch formulas as the rmsnorm kernel is."""
        from sglang.srt.layers.rotary_embedding import get_rope

        heads, kv, d, n = 8, 2, 64, 5
        qk, width = (heads + kv) * d, (heads + 2 * kv) * d
        pos = torch.tensor([0, 3, 100, 4095, 7])
        qw, kw = (torch.rand(d) + 0.5).to(BF16), (torch.rand(d) + 0.5).to(BF16)
        for rd in (64, 32):
            rope = get_rope(d, rd, 4096, 1e6, dtype=BF16)
            wide = torch.randn(n, width + 32, dtype=BF16) * 3
            qkv = wide[:, :width]
            before = wide.clone()
            self.ops.qk_norm_rope_(qkv, pos, qw, kw, 1e-6, heads, kv, d, rope.cos_sin_cache)
            q = self.ops.rmsnorm(before[:, : heads * d].reshape(-1, d), None, qw, 1e-6)[0].view(n, heads * d)
            k = self.ops.rmsnorm(before[:, heads * d : qk].reshape(-1, d), None, kw, 1e-6)[0].view(n, kv * d)
            ref = torch.cat([q, k], dim=1)
            self.ops.rotary_embedding_(pos, ref, heads + kv, d, rope.cos_sin_cache)
            self.assertTrue(torch.equal(qkv[:, :qk], ref))
            self.assertTrue(torch.equal(wide[:, qk:], before[:, qk:]))  # v and the columns past the rows untouched
            heads_in = before[:, :qk].reshape(n, heads + kv, d).float()
            w = torch.cat([qw.expand(heads, d), kw.expand(kv, d)])
            normed = (w * F.rms_norm(heads_in, (d,), None, 1e-6).to(BF16)).reshape(n, qk)
            torch_ref, _ = rope._forward_torch(pos, normed.view(n, -1, d))
            torch.testing.assert_close(qkv[:, :qk], torch_ref.reshape(n, qk), atol=2 ** -6, rtol=2 ** -6)

    def test_logits_to_float_and_argmax_rows_equal_torch(self):
        """The widening of padded bf16 logits is exact, and each row's argmax follows torch.max(dim=-1).indices:
        the first of equal maxima, a NaN as the maximum (its first one), a row of -inf -> 0; one row or forty (the
        kernels' threads share those)."""
        x = torch.randn(3, 1000 + 24, dtype=BF16)
        self.assertTrue(torch.equal(self.ops.logits_to_float(x, 1000), x[:, :1000].float()))
        y = torch.randn(7, 777)
        y[1, 10] = y[1, 500] = y[1].max() + 1  # a tie: the first wins
        y[2, 9] = y[2, 5] = float("nan")
        y[3] = float("-inf")
        y[4, 776] = float("inf")  # in the tail after the last full 16 values
        y[5, 700:] = y[5].max() + 1
        y[6] = 0.0
        y[6, 300] = -0.0
        self.assertEqual(self.ops.argmax_rows(y).tolist(), y.max(dim=-1).indices.tolist())
        self.assertEqual(self.ops.argmax_rows(y).tolist()[:5], [y[0].argmax().item(), 10, 5, 0, 776])
        big = torch.randn(40, 49152).bfloat16()
        wide = self.ops.logits_to_float(big, 49152)
        self.assertTrue(torch.equal(wide, big.float()))
        self.assertTrue(torch.equal(self.ops.argmax_rows(wide), wide.max(dim=-1).indices))

    def test_decode_attention_matches_sdpa_and_writes_the_pool(self):
        # a task per (request, KV head) serves its group of query heads, 4 per pass over the keys: groups of 3
        # (SmolLM2), 1, 4, 5 (a pass of 4 and one of 1) and 8, with mixed lengths split over the threads by cost
        for lens in ([1, 37, 128], [1, 37, 128, 16, 17, 90, 5, 64]):
            self._check_decode_attention(lens)
        for heads, kv, d in ((4, 4, 96), (8, 2, 32), (10, 2, 160), (8, 1, 128), (4, 1, 256)):
            self._check_decode_attention([3, 128, 1, 77], heads, kv, d)

    def test_decode_attention_is_batch_invariant(self):
        """A request's attention output is the same alone and among other requests of any lengths."""
        lens = [5, 128, 1, 64, 33, 100]
        full, args = self._check_decode_attention(lens)
        q, k_new, v_new, k_cache, v_cache, req_to_token, rows, seq_lens, loc = args
        for b in range(len(lens)):
            one = self.ops.decode_attention(q[b : b + 1], k_new[b : b + 1], v_new[b : b + 1], k_cache, v_cache,
                                            req_to_token, rows[b : b + 1], seq_lens[b : b + 1], loc[b : b + 1], 0.125)
            self.assertTrue(torch.equal(one, full[b : b + 1]), b)

    def _check_decode_attention(self, lens, heads=9, kv=3, d=64):
        slots, bs = 800, len(lens)
        k_cache = torch.randn(slots, kv, d, dtype=BF16)
        v_cache = torch.randn(slots, kv, d, dtype=BF16)
        req_to_token = torch.zeros(bs + 1, 128, dtype=torch.int64)
        perm = torch.randperm(slots - 1) + 1
        seq_lens = torch.tensor(lens)
        rows = torch.randperm(bs + 1)[:bs]
        start = 0
        for r, n in zip(rows.tolist(), lens):
            req_to_token[r, :n] = perm[start : start + n]
            start += n
        loc = torch.stack([req_to_token[r, n - 1] for r, n in zip(rows.tolist(), lens)])
        q = torch.randn(bs, heads, d, dtype=BF16)
        qkv = torch.randn(bs, 2 * kv * d + 5, dtype=BF16)  # k and v as strided views, like slices of a qkv row
        k_new, v_new = qkv[:, : kv * d].view(bs, kv, d), qkv[:, kv * d : 2 * kv * d].view(bs, kv, d)
        out = self.ops.decode_attention(q, k_new, v_new, k_cache, v_cache, req_to_token, rows, seq_lens, loc, d**-0.5)
        self.assertTrue(torch.equal(k_cache[loc], k_new) and torch.equal(v_cache[loc], v_new))
        for b, (r, n) in enumerate(zip(rows.tolist(), lens)):
            idx = req_to_token[r, :n]
            kk = k_cache[idx].float().transpose(0, 1)  # [KV, n, D]
            vv = v_cache[idx].float().transpose(0, 1)
            ref = F.scaled_dot_product_attention(q[b].float().view(kv, heads // kv, d), kk, vv, scale=d**-0.5)
            torch.testing.assert_close(out[b].float(), ref.reshape(-1), atol=2e-2, rtol=2e-2)
        return out, (q, k_new, v_new, k_cache, v_cache, req_to_token, rows, seq_lens, loc)

    def test_decode_attention_rejects_slots_outside_the_pool(self):
        k_cache = torch.zeros(16, 1, 32, dtype=BF16)
        table = torch.full((1, 8), 99, dtype=torch.int64)
        q, k = torch.zeros(1, 2, 32, dtype=BF16), torch.zeros(1, 1, 32, dtype=BF16)
        with self.assertRaisesRegex(RuntimeError, "outside the KV pool"):
            self.ops.decode_attention(q, k, k, k_cache, k_cache.clone(), table, torch.tensor([0]), torch.tensor([4]),
                                      torch.tensor([3]), 1.0)


def teacher_forced_logits(model, model_config, prompts, forced):
    """Prefill each prompt, then decode the same forced tokens for all requests as one batch: [steps, B, V]."""
    from sglang.test.paged_forward import PagedForwardDriver

    driver = PagedForwardDriver(model, model_config, max_reqs=len(prompts), max_tokens=4096)
    rows = [driver.new_request() for _ in prompts]
    out = [torch.stack([driver.extend([r], [p])[0] for r, p in zip(rows, prompts)])]
    for tok in forced:
        out.append(driver.extend(rows, [[t] for t in tok]))
    return torch.stack(out)


@unittest.skipUnless(cpu_kernels_expected(), "no AVX-512 BF16 on this CPU, or SGLANG_CPU_KERNELS=0: the kernels are not used")
class TestCpuKernelsInModel(unittest.TestCase):
    def test_smollm2_bf16_decode_with_and_without_kernels(self):
        """The whole bf16 model with the kernels is as close to the fp32 reference as the torch bf16 path (argmax
        agreement and mean logit error); a request's decode logits are the same in batches of 2, 3 and 4 (the AMX
        kernel's range)."""
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.model_loader import load_model
        from sglang.srt.server_args import ServerArgs
        from sglang.test.engine_fixtures import default_model_dir

        self.assertIsNotNone(get_cpu_ops(), cpu_ops_status())
        model_dir = default_model_dir()
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(100, 20000, (n,), generator=g).tolist() for n in (40, 7, 90, 12)]
        forced = torch.randint(100, 20000, (40, 4), generator=g).tolist()
        logits = {}
        for dtype in ("float32", "bfloat16"):
            mc = ModelConfig.from_server_args(ServerArgs(dtype=dtype), model_dir)
            model = load_model(mc)
            logits[dtype] = teacher_forced_logits(model, mc, prompts, forced)
        with cpu_kernels_disabled():
            logits["torch"] = teacher_forced_logits(model, mc, prompts, forced)
        ref = logits["float32"]

        def agreement(x):
            return (x.argmax(-1) == ref.argmax(-1)).float().mean().item()

        def mean_error(x):
            return (x - ref).abs().mean().item()

        # teacher-forced random tokens make near-ties common: allow a few of the 164 positions to flip either way
        self.assertGreaterEqual(agreement(logits["bfloat16"]), agreement(logits["torch"]) - 0.03)
        self.assertLess(mean_error(logits["bfloat16"]), 1.25 * mean_error(logits["torch"]))
        self.assertFalse(torch.equal(logits["bfloat16"], logits["torch"]))  # the kernels did run
        three = teacher_forced_logits(model, mc, prompts[:3], [t[:3] for t in forced])
        self.assertTrue(torch.equal(three[1:], logits["bfloat16"][1:, :3]))  # decode steps only
        pair = teacher_forced_logits(model, mc, prompts[1:3], [t[1:3] for t in forced])
        self.assertTrue(torch.equal(pair[1:], logits["bfloat16"][1:, 1:3]))

if __name__ == "__main__":
    unittest.main()
