"""The fp32 CPU kernels (sgl-kernel/csrc/cpu/kernels_f32.h: decode attention over an fp32 KV pool, RMSNorm with the
residual add, SiluAndMul, rotary) at every level from the native one down to avx2, against the torch path.

Each level is forced in-process with the module's set_cpu_isa (restored after each test): 512-bit code from
avx512_vnni up, the AVX2 code at avx2. The torch path computes these in fp32 too, so the kernels must agree with it
within fp32 rounding (sums in another order, FMAs, a polynomial exp): tolerances of a few 1e-6, where any wrong key,
head, tail lane or softmax term moves results by 1e-2 or more. The attention reference is the torch_native backend's
own decode (SDPA over the gathered K/V); the whole fp32 model decodes with the kernels as it does without them.
"""

import unittest

import torch
import torch.nn.functional as F

from sglang.jit_kernel.cpu_isa import LEVELS
from sglang.jit_kernel.cpu_ops import (cpu_kernels_disabled, cpu_ops_status, get_fp32_ops, quant_kernels_expected,
                                       set_fp32_kernels)
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="cpu")


@unittest.skipUnless(quant_kernels_expected(), "no AVX2 on this CPU, or SGLANG_CPU_KERNELS=0: no fp32 kernels")
class TestCpuKernelsF32Levels(unittest.TestCase):
    def setUp(self):
        self.assertIsNone(get_fp32_ops())  # off unless a start serving fp32 by --dtype auto asks for them
        set_fp32_kernels(True)
        self.addCleanup(set_fp32_kernels, False)
        self.ops = get_fp32_ops()
        self.assertIsNotNone(self.ops, f"fp32 CPU kernels did not load: {cpu_ops_status()}")
        self.level0 = self.ops.get_cpu_isa()
        self.levels = list(LEVELS[LEVELS.index("avx2") : LEVELS.index(self.level0) + 1])
        torch.manual_seed(0)

    def tearDown(self):
        self.ops.set_cpu_isa(self.level0)

    def at_levels(self):
        """Each level from the module's one down to avx2, set in turn (a failure's traceback shows self.level)."""
        for level in reversed(self.levels):
            self.ops.set_cpu_isa(level)
            self.assertEqual(self.ops.get_cpu_isa(), level)
            self.level = level
            yield level

    def test_decode_attention_matches_the_torch_path(self):
        # groups of 3 (SmolLM2), 1, 4 (one pass), 5 (a pass of 4 and one of 1) and 8; ragged lengths 1..128 (softmax
        # tails of every width); head dims 32..256 (kVChunk tails of the value pass)
        cases = [([1, 37, 128], 9, 3, 64), ([1, 37, 128, 16, 17, 90, 5, 64], 9, 3, 64), ([3, 128, 1, 77], 4, 4, 96),
                 ([3, 128, 1, 77], 8, 2, 32), ([3, 128, 1, 77], 10, 2, 160), ([3, 9, 1, 77], 8, 1, 128),
                 ([3, 128, 2, 15], 4, 1, 256), ([33, 7], 10, 2, 192)]
        for _ in self.at_levels():
            for lens, heads, kv, d in cases:
                self._check_decode_attention(lens, heads, kv, d)

    def test_decode_attention_is_batch_invariant(self):
        lens = [5, 128, 1, 64, 33, 100]
        for _ in self.at_levels():
            full, args = self._check_decode_attention(lens, 9, 3, 64)
            q, k_new, v_new, k_cache, v_cache, req_to_token, rows, seq_lens, loc = args
            for b in range(len(lens)):
                one = self.ops.decode_attention(q[b : b + 1], k_new[b : b + 1], v_new[b : b + 1], k_cache, v_cache,
                                                req_to_token, rows[b : b + 1], seq_lens[b : b + 1], loc[b : b + 1], 0.125)
                self.assertTrue(torch.equal(one, full[b : b + 1]), b)

    def _check_decode_attention(self, lens, heads, kv, d):
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

        slots, bs = 900, len(lens)
        k_cache, v_cache = torch.randn(slots, kv, d), torch.randn(slots, kv, d)
        req_to_token = torch.zeros(bs + 1, 128, dtype=torch.int64)
        perm = torch.randperm(slots - 1) + 1
        rows = torch.randperm(bs + 1)[:bs]
        start = 0
        for r, n in zip(rows.tolist(), lens):
            req_to_token[r, :n] = perm[start : start + n]
            start += n
        seq_lens = torch.tensor(lens)
        loc = torch.stack([req_to_token[r, n - 1] for r, n in zip(rows.tolist(), lens)])
        q = torch.randn(bs, heads, d)
        qkv = torch.randn(bs, 2 * kv * d + 5)  # k and v as strided views, like slices of a qkv row
        k_new, v_new = qkv[:, : kv * d].view(bs, kv, d), qkv[:, kv * d : 2 * kv * d].view(bs, kv, d)
        out = self.ops.decode_attention(q, k_new, v_new, k_cache, v_cache, req_to_token, rows, seq_lens, loc, d**-0.5)
        self.assertEqual((out.shape, out.dtype), ((bs, heads * d), torch.float32))
        self.assertTrue(torch.equal(k_cache[loc], k_new) and torch.equal(v_cache[loc], v_new))
        # the torch path: the backend's own decode over the gathered K/V (padded to the longest, masked)
        backend = TorchNativeAttnBackend.__new__(TorchNativeAttnBackend)
        backend.token_to_kv_pool = _Pool(k_cache, v_cache)
        backend.req_to_token_pool = _Table(req_to_token)
        layer = _Layer(d**-0.5, d)
        ref = backend._decode_rows(q, layer, rows, seq_lens, max(lens), min(lens) != max(lens))
        torch.testing.assert_close(out, ref, atol=3e-6, rtol=1e-5)
        return out, (q, k_new, v_new, k_cache, v_cache, req_to_token, rows, seq_lens, loc)

    def test_bf16_is_refused_below_avx512_bf16(self):
        z = torch.zeros(1, 2, 32, dtype=torch.bfloat16)
        for level in self.at_levels():
            if LEVELS.index(level) >= LEVELS.index("avx512_bf16"):
                continue
            with self.assertRaisesRegex(RuntimeError, f"bfloat16 needs CPU level avx512_bf16, this module runs at {level}"):
                self.ops.decode_attention(z, z[:, :1], z[:, :1], z[0].view(2, 1, 32), z[0].view(2, 1, 32).clone(),
                                          torch.zeros(1, 4, dtype=torch.int64), torch.tensor([0]), torch.tensor([1]),
                                          torch.tensor([0]), 1.0)
            with self.assertRaisesRegex(RuntimeError, "rmsnorm: .*BFloat16 needs CPU level avx512_bf16"):
                self.ops.rmsnorm(z[0], None, z[0, 0], 1e-6)
        with self.assertRaisesRegex(RuntimeError, "one dtype"):
            self.ops.rmsnorm(torch.zeros(2, 32), None, torch.zeros(32, dtype=torch.bfloat16), 1e-6)

    def test_rmsnorm_matches_the_torch_path(self):
        from sglang.srt.layers.layernorm import RMSNorm

        for _ in self.at_levels():
            for hidden in (576, 100, 7):  # 100, 7: tails of 4 and 7 lanes (AVX2) / 4 and 7 (AVX-512)
                norm = RMSNorm(hidden, 1e-5)
                norm.weight.data = torch.rand(hidden) + 0.5
                x, res = torch.randn(9, hidden), torch.randn(9, hidden)
                out, res_out = self.ops.rmsnorm(x, res, norm.weight, 1e-5)
                with cpu_kernels_disabled():
                    ref, ref_res = norm(x, res)
                    ref_alone = norm(x)
                self.assertTrue(torch.equal(res_out, ref_res))  # one fp32 add: exact
                torch.testing.assert_close(out, ref, atol=1e-6, rtol=2e-6)
                alone, none = self.ops.rmsnorm(x, None, norm.weight, 1e-5)
                self.assertIsNone(none)
                torch.testing.assert_close(alone, ref_alone, atol=1e-6, rtol=2e-6)
                torch.testing.assert_close(norm(x, res)[0], ref, atol=1e-6, rtol=2e-6)  # the layer takes the kernel

    def test_silu_and_mul_matches_the_torch_path(self):
        from sglang.srt.layers.activation import SiluAndMul

        for _ in self.at_levels():
            for inter in (1536, 1003, 5):
                x = torch.randn(5, 2 * inter) * 4
                with cpu_kernels_disabled():
                    ref = SiluAndMul()(x)
                torch.testing.assert_close(self.ops.silu_and_mul(x), ref, atol=2e-6, rtol=2e-6)
                torch.testing.assert_close(SiluAndMul()(x), ref, atol=2e-6, rtol=2e-6)

    def test_rotary_in_place_matches_the_torch_path(self):
        from sglang.srt.layers.rotary_embedding import get_rope

        heads, kv, d = 9, 3, 64
        for _ in self.at_levels():
            for rd in (64, 32, 24):  # 24: a half of 12, a tail at both widths
                rope = get_rope(d, rd, 4096, 10000.0, dtype=torch.float32)
                qkv = torch.randn(6, (heads + 2 * kv) * d)
                pos = torch.tensor([0, 1, 7, 100, 4000, 3])
                n_qk = (heads + kv) * d
                ref, _ = rope._forward_torch(pos, qkv[:, :n_qk].view(6, -1, d))
                x = qkv.clone()
                self.ops.rotary_embedding_(pos, x, heads + kv, d, rope.cos_sin_cache)
                torch.testing.assert_close(x[:, :n_qk], ref.reshape(6, n_qk), atol=2e-6, rtol=2e-6)
                self.assertTrue(torch.equal(x[:, n_qk:], qkv[:, n_qk:]))  # v untouched

    def test_fp32_model_decodes_as_without_the_kernels(self):
        """The default model dense in fp32 at each level: the kernels (attention through the backend, the norms,
        the activation, rotary) give the torch path's logits within fp32 rounding, and did run (not bit-equal)."""
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.layers.attention.cpu_kernel_ops import fused_cpu_decode_available
        from sglang.srt.model_loader import load_model
        from sglang.srt.server_args import ServerArgs
        from sglang.test.engine_fixtures import default_model_dir
        from sglang.test.paged_forward import PagedForwardDriver

        def teacher_forced_logits(prompts, forced):  # prefill each prompt, then decode the forced tokens as one batch
            driver = PagedForwardDriver(model, mc, max_reqs=len(prompts), max_tokens=1024)
            rows = [driver.new_request() for _ in prompts]
            out = [torch.stack([driver.extend([r], [p])[0] for r, p in zip(rows, prompts)])]
            out += [driver.extend(rows, [[t] for t in tok]) for tok in forced]
            return torch.stack(out)

        mc = ModelConfig.from_server_args(ServerArgs(dtype="float32"), default_model_dir())
        model = load_model(mc)
        head_dim = mc.hf_config.hidden_size // mc.hf_config.num_attention_heads
        self.assertTrue(fused_cpu_decode_available("cpu", torch.float32, torch.float32, torch.float32, head_dim, head_dim))
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(100, 20000, (n,), generator=g).tolist() for n in (30, 7)]
        forced = torch.randint(100, 20000, (6, 2), generator=g).tolist()
        with cpu_kernels_disabled():
            ref = teacher_forced_logits(prompts, forced)
        for _ in self.at_levels():
            got = teacher_forced_logits(prompts, forced)
            self.assertFalse(torch.equal(got[1:], ref[1:]))
            torch.testing.assert_close(got, ref, atol=2e-3, rtol=0)  # logits ~10: a few 1e-4 of fp32 noise over 30 layers
            self.assertTrue(torch.equal(got.argmax(-1), ref.argmax(-1)))


class _Pool:
    """The backend's view of a bf16/fp32 pool: one layer's K and V, read through the real pool's gather."""

    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    gather_kv, rotation = MHATokenToKVPool.gather_kv, MHATokenToKVPool.rotation
    del MHATokenToKVPool

    def __init__(self, k, v):
        self.k, self.v = k, v
        self.head_num = k.shape[1]

    def get_key_buffer(self, layer_id):
        return self.k

    def get_value_buffer(self, layer_id):
        return self.v


class _Table:
    def __init__(self, req_to_token):
        self.req_to_token = req_to_token


class _Layer:
    def __init__(self, scaling, v_head_dim):
        self.layer_id, self.scaling, self.v_head_dim = 0, scaling, v_head_dim


if __name__ == "__main__":
    unittest.main()
