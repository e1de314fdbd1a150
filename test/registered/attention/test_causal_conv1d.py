"""The causal conv1d's torch kernels (layers/attention/linear/causal_conv1d.py) against an fp64 per-token loop
(linear_reference.py): varlen extend with lengths shorter than, equal to and longer than the K - 1 carried columns,
has_initial_state mixed (a stale nan row ignored), a prompt cut anywhere (cuts inside the window included) == the
whole prompt, decode == one-token extend, chained decodes == one extend; and HF transformers' causal_conv1d_update
as a second, independent reference."""

import unittest

import torch
from linear_reference import conv_inputs, conv_reference

from sglang.srt.layers.attention.linear.causal_conv1d import causal_conv1d_decode, causal_conv1d_extend
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="cpu")

TOL = 1e-5


def max_err(a, b):
    return float((a.double() - b.double()).abs().max())


class TestCausalConv1dExtend(unittest.TestCase):
    def test_extend_equals_fp64_reference(self):
        lens = [1, 2, 3, 4, 9, 0, 17]
        has = torch.tensor([True, False, True, True, False, True, True])
        for kernel, bias, act in [(4, True, "silu"), (4, False, None), (2, True, "silu")]:
            x, w, b, state = conv_inputs(lens, channels=6, kernel=kernel, seed=kernel)
            b = b if bias else None
            ref_y, ref_s = conv_reference(x, w, b, state, has, lens, act)
            y, s = causal_conv1d_extend(x, w, b, state, has, lens, act)
            with self.subTest(kernel=kernel, bias=bias, act=act):
                self.assertEqual((y.shape, s.shape), (ref_y.shape, ref_s.shape))
                self.assertLess(max_err(y, ref_y), TOL)
                self.assertEqual(max_err(s, ref_s), 0.0)  # the state holds inputs: copied, not computed

    def test_prompt_cut_anywhere_equals_whole(self):
        n = 12
        x, w, b, state = conv_inputs([n], 5, 4, seed=1)
        has = torch.tensor([True])
        whole_y, whole_s = causal_conv1d_extend(x, w, b, state, has, [n], "silu")
        for cuts in ([1], [1, 2], [1, 2, 3, 4, 5], [2, 9], [10, 11], [6]):
            bounds = [0, *cuts, n]
            s, ys = state, []
            for a, c in zip(bounds, bounds[1:]):
                y, s = causal_conv1d_extend(x[a:c], w, b, s, has, [c - a], "silu")
                ys.append(y)
            with self.subTest(cuts=cuts):
                self.assertLess(max_err(torch.cat(ys), whole_y), 1e-6)
                self.assertEqual(max_err(s, whole_s), 0.0)

    def test_has_initial_state_false_ignores_a_stale_row(self):
        lens = [2, 5]
        x, w, b, state = conv_inputs(lens, 4, 4, seed=2)
        stale = state.clone()
        stale[0] = float("nan")
        stale[1, 0, 0] = float("inf")
        has = torch.tensor([False, False])
        y, s = causal_conv1d_extend(x, w, b, stale, has, lens, "silu")
        ref_y, ref_s = conv_reference(x, w, b, torch.zeros_like(state), has, lens, "silu")
        self.assertLess(max_err(y, ref_y), TOL)
        self.assertEqual(max_err(s, ref_s), 0.0)

    def test_bf16_keeps_dtypes(self):
        lens = [3, 8]
        x, w, b, state = conv_inputs(lens, 8, 4, seed=3, dtype=torch.bfloat16)
        has = torch.tensor([True, True])
        y, s = causal_conv1d_extend(x, w, b, state, has, lens, "silu")
        self.assertEqual((y.dtype, s.dtype), (torch.bfloat16, torch.bfloat16))
        ref_y, ref_s = conv_reference(x, w, b, state, has, lens, "silu")
        self.assertLess(max_err(y, ref_y), 5e-2)
        self.assertEqual(max_err(s, ref_s), 0.0)

    def test_unknown_activation_is_refused(self):
        x, w, b, state = conv_inputs([2], 4, 4, seed=4)
        with self.assertRaisesRegex(ValueError, "activation"):
            causal_conv1d_extend(x, w, b, state, torch.tensor([True]), [2], "gelu")


class TestCausalConv1dDecode(unittest.TestCase):
    def test_decode_equals_one_token_extend(self):
        x, w, b, state = conv_inputs([1, 1, 1], 6, 4, seed=5)
        has = torch.ones(3, dtype=torch.bool)
        ext_y, ext_s = causal_conv1d_extend(x, w, b, state, has, [1, 1, 1], "silu")
        dec_y, dec_s = causal_conv1d_decode(x, w, b, state, "silu")
        self.assertLess(max_err(dec_y, ext_y), 1e-6)
        self.assertEqual(max_err(dec_s, ext_s), 0.0)

    def test_chained_decodes_equal_one_extend(self):
        n, batch = 7, 2
        x, w, b, state = conv_inputs([n] * batch, 5, 4, seed=6)
        has = torch.tensor([True, False])
        ref_y, ref_s = conv_reference(x, w, b, state, has, [n] * batch, None)
        s = torch.where(has.view(-1, 1, 1), state, 0.0)
        ys = []
        for t in range(n):
            y, s = causal_conv1d_decode(x[torch.arange(batch) * n + t], w, b, s, None)
            ys.append(y)
        self.assertLess(max_err(torch.stack(ys, 1).reshape(n * batch, 5), ref_y), TOL)
        self.assertEqual(max_err(s, ref_s), 0.0)

    def test_matches_hf_transformers_update(self):
        from transformers.models.qwen3_next import modeling_qwen3_next as hf

        lens = [5, 5]
        x, w, b, state = conv_inputs(lens, 6, 4, seed=7)
        y, s = causal_conv1d_extend(x, w, b, state, torch.tensor([True, True]), lens, "silu")
        hf_state = state.clone()  # updated in place by HF
        hf_y = hf.causal_conv1d_update(x.view(2, 5, 6).transpose(1, 2), hf_state, w, b, "silu")
        self.assertLess(max_err(y, hf_y.transpose(1, 2).reshape(10, 6)), 1e-5)
        self.assertEqual(max_err(s, hf_state), 0.0)


if __name__ == "__main__":
    unittest.main()
