"""The gated delta rule's torch kernels (layers/attention/linear/gated_delta_rule.py) against an fp64 per-token loop
of the recurrence (linear_reference.py): the chunked extend (several chunk sizes, varlen batches with lengths on
both sides of a chunk, GQA q/k heads, with and without the l2norm) == the recurrent decode step == fp64; a prompt
cut at several points (the state handed over from extend to extend) == the whole prompt; has_initial_state mixed in
one batch (a stale row holding nan is ignored); and once HF transformers' own torch functions as a second,
independent reference."""

import unittest

import torch
from linear_reference import gdr_inputs, gdr_reference

from sglang.srt.layers.attention.linear.gated_delta_rule import (
    gated_delta_rule_decode,
    gated_delta_rule_decode_pool_,
    gated_delta_rule_extend,
)
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="cpu")

TOL = 2e-4  # fp32 math over a few hundred tokens, |o| ~ 1


def run_extend(inputs, has, lens, scale, l2, chunk):
    q, k, v, g, beta, state = inputs
    return gated_delta_rule_extend(q, k, v, g, beta, state, has, lens, scale, l2, chunk_size=chunk)


def max_err(a, b):
    return float((a.double() - b.double()).abs().max())


class TestGatedDeltaRuleExtend(unittest.TestCase):
    def test_chunked_equals_fp64_reference(self):
        lens = [1, 63, 64, 65, 150, 0, 7]  # chunk counts 1, 1, 1, 2, 3, 0, 1 at chunk 64: the hand-over batch shrinks
        has = torch.tensor([True, False, True, True, False, True, True])
        for n_qk, l2, chunk in [(2, True, 64), (4, True, 16), (2, False, 32)]:
            inputs = gdr_inputs(lens, n_heads=4, n_qk_heads=n_qk, dk=16, dv=8, seed=n_qk + chunk)
            scale = 16 ** -0.5
            if not l2:  # unnormalized keys grow the state: keep the delta rule contractive (beta |k|^2 < 2)
                inputs = (inputs[0], inputs[1] * 0.25) + inputs[2:]
            ref_o, ref_s = gdr_reference(*inputs[:5], inputs[5], has, lens, scale, l2)
            o, s = run_extend(inputs, has, lens, scale, l2, chunk)
            with self.subTest(n_qk=n_qk, l2=l2, chunk=chunk):
                self.assertEqual(o.shape, ref_o.shape)
                self.assertEqual(s.dtype, torch.float32)
                self.assertLess(max_err(o, ref_o), TOL)
                self.assertLess(max_err(s, ref_s), TOL)

    def test_strong_decay_is_finite_and_exact(self):
        """g down to -30 per token: in-chunk cumulative decays reach -2000; every exponent taken must stay <= 0."""
        lens = [130]
        q, k, v, g, beta, state = gdr_inputs(lens, 2, 2, 8, 8, seed=3)
        g = g * 20
        has = torch.tensor([True])
        ref_o, ref_s = gdr_reference(q, k, v, g, beta, state, has, lens, 8 ** -0.5, True)
        o, s = gated_delta_rule_extend(q, k, v, g, beta, state, has, lens, 8 ** -0.5, True)
        self.assertTrue(bool(torch.isfinite(o).all()))
        self.assertLess(max_err(o, ref_o), TOL)
        self.assertLess(max_err(s, ref_s), TOL)

    def test_prompt_cut_anywhere_equals_whole(self):
        n = 140
        inputs = gdr_inputs([n], 4, 2, 16, 8, seed=5)
        q, k, v, g, beta, state = inputs
        has0 = torch.tensor([True])
        whole_o, whole_s = gated_delta_rule_extend(q, k, v, g, beta, state, has0, [n], 0.25, True)
        for cuts in ([1, 2, 64], [63, 64, 65], [5, 100], [139]):
            bounds = [0, *cuts, n]
            s, outs = state, []
            for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
                o, s = gated_delta_rule_extend(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], s, has0, [b - a], 0.25,
                                               True)
                outs.append(o)
            with self.subTest(cuts=cuts):
                self.assertLess(max_err(torch.cat(outs), whole_o), 1e-5)
                self.assertLess(max_err(s, whole_s), 1e-5)

    def test_has_initial_state_false_ignores_a_stale_row(self):
        lens = [20, 70]
        q, k, v, g, beta, state = gdr_inputs(lens, 2, 2, 8, 8, seed=7)
        stale = state.clone()
        stale[0] = float("nan")
        stale[1, 0, 0, 0] = float("inf")
        has = torch.tensor([False, False])
        o, s = gated_delta_rule_extend(q, k, v, g, beta, stale, has, lens, 0.3, True)
        ref_o, ref_s = gdr_reference(q, k, v, g, beta, state, has, lens, 0.3, True)
        self.assertLess(max_err(o, ref_o), TOL)
        self.assertLess(max_err(s, ref_s), TOL)

    def test_bf16_inputs_give_bf16_output_fp32_state(self):
        lens = [33, 90]
        inputs = gdr_inputs(lens, 4, 4, 16, 16, seed=9, dtype=torch.bfloat16)
        has = torch.tensor([True, False])
        o, s = run_extend(inputs, has, lens, 0.25, True, 64)
        self.assertEqual((o.dtype, s.dtype), (torch.bfloat16, torch.float32))
        ref_o, ref_s = gdr_reference(*inputs[:5], inputs[5], has, lens, 0.25, True)
        self.assertLess(max_err(o, ref_o), 3e-2)
        self.assertLess(max_err(s, ref_s), 1e-3)

    def test_matches_hf_transformers_chunked_function(self):
        from transformers.models.qwen3_next import modeling_qwen3_next as hf

        n = 100
        q, k, v, g, beta, state = gdr_inputs([n], 4, 2, 16, 8, seed=11)
        o, s = gated_delta_rule_extend(q, k, v, g, beta, state, torch.tensor([True]), [n], 16 ** -0.5, True)
        hf_o, hf_s = hf.torch_chunk_gated_delta_rule(q[None], k[None], v[None], g[None], beta[None],
                                                     initial_state=state, output_final_state=True,
                                                     use_qk_l2norm_in_kernel=True)
        self.assertLess(max_err(o, hf_o[0]), 1e-4)
        self.assertLess(max_err(s, hf_s), 1e-4)


class TestGatedDeltaRuleDecode(unittest.TestCase):
    def test_decode_steps_equal_reference_and_chunked(self):
        lens = [40, 40, 40]
        q, k, v, g, beta, state = gdr_inputs(lens, 4, 2, 16, 8, seed=13)
        has = torch.tensor([True, False, True])
        ref_o, ref_s = gdr_reference(q, k, v, g, beta, state, has, lens, 0.25, True)
        chunk_o, _ = gated_delta_rule_extend(q, k, v, g, beta, state, has, lens, 0.25, True, chunk_size=16)
        s = torch.where(has.view(-1, 1, 1, 1), state, 0.0)
        rows = torch.arange(3) * 40
        outs = []
        for t in range(40):
            o, s = gated_delta_rule_decode(q[rows + t], k[rows + t], v[rows + t], g[rows + t], beta[rows + t], s,
                                           0.25, True)
            outs.append(o)
        dec_o = torch.stack(outs, 1).reshape(120, 4, 8)  # [B, T, H, dv] -> request-major tokens
        self.assertLess(max_err(dec_o, ref_o), TOL)
        self.assertLess(max_err(s, ref_s), TOL)
        self.assertLess(max_err(dec_o, chunk_o), TOL)

    def test_decode_equals_one_token_extend(self):
        lens = [1, 1, 1, 1]
        q, k, v, g, beta, state = gdr_inputs(lens, 4, 4, 16, 8, seed=17)
        has = torch.ones(4, dtype=torch.bool)
        ext_o, ext_s = gated_delta_rule_extend(q, k, v, g, beta, state, has, lens, 0.25, True)
        dec_o, dec_s = gated_delta_rule_decode(q, k, v, g, beta, state, 0.25, True)
        self.assertLess(max_err(dec_o, ext_o), 1e-5)
        self.assertLess(max_err(dec_s, ext_s), 1e-5)

    def test_decode_in_pool_rows_equals_gathered_decode(self):
        """The CPU decode that updates each request's pool row in place (rows in any order, others untouched) gives
        the gathered decode's output and new states bit for bit, over steps against the fp64 reference."""
        lens = [30, 30, 30]
        q, k, v, g, beta, state = gdr_inputs(lens, 4, 2, 16, 8, seed=23)
        has = torch.ones(3, dtype=torch.bool)
        ref_o, ref_s = gdr_reference(q, k, v, g, beta, state, has, lens, 0.25, True)
        pool = torch.randn(7, 4, 16, 8, generator=torch.Generator().manual_seed(5))
        rows = [5, 1, 3]
        pool[rows] = state
        untouched = pool[[0, 2, 4, 6]].clone()
        s = state.clone()
        tokens = torch.arange(3) * 30
        outs = []
        for t in range(30):
            at = tokens + t
            o = gated_delta_rule_decode_pool_(q[at], k[at], v[at], g[at], beta[at], pool, rows, 0.25, True)
            gathered_o, s = gated_delta_rule_decode(q[at], k[at], v[at], g[at], beta[at], s, 0.25, True)
            self.assertTrue(torch.equal(o, gathered_o))
            self.assertTrue(torch.equal(pool[rows], s))
            outs.append(o)
        self.assertTrue(torch.equal(pool[[0, 2, 4, 6]], untouched))
        self.assertLess(max_err(torch.stack(outs, 1).reshape(90, 4, 8), ref_o), TOL)
        self.assertLess(max_err(pool[rows], ref_s), TOL)

    def test_decode_matches_hf_transformers_recurrent_function(self):
        from transformers.models.qwen3_next import modeling_qwen3_next as hf

        q, k, v, g, beta, state = gdr_inputs([1, 1, 1], 4, 2, 16, 8, seed=19)
        o, s = gated_delta_rule_decode(q, k, v, g, beta, state, 16 ** -0.5, True)
        hf_o, hf_s = hf.torch_recurrent_gated_delta_rule(q[:, None], k[:, None], v[:, None], g[:, None],
                                                         beta[:, None], initial_state=state,
                                                         output_final_state=True, use_qk_l2norm_in_kernel=True)
        self.assertLess(max_err(o, hf_o[:, 0]), 1e-5)
        self.assertLess(max_err(s, hf_s), 1e-5)

    def test_bad_head_counts_are_refused(self):
        q, k, v, g, beta, state = gdr_inputs([1, 1], 4, 3, 8, 8, seed=23)
        with self.assertRaisesRegex(ValueError, "divide"):
            gated_delta_rule_decode(q, k, v, g, beta, state, 0.3, True)


if __name__ == "__main__":
    unittest.main()
