"""The Mamba-2 SSD ops in torch (layers/attention/linear/mamba2_ssd.py) against a float64 token-by-token recurrence
(mamba2_ssd_cases.py): the chunked extend over varlen batches at chunk sizes that cut each request in different
places, the recurrent decode step, a request's state carried across extend calls cut anywhere and across a
retraction (re-prefill from prefix 0 into a reused row == the decoded state), requests with and
without an initial state in one batch (rows without one hold NaN, as a reused pool row may), dt_limit, bf16 inputs,
long chunks with the large decays of a real checkpoint's A; and once against transformers' own NemotronHMamba2Mixer
(its torch chunk scan and its one-token state update, an independent implementation)."""

import math
import os
import sys
import unittest

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mamba2_ssd_cases import make_case, max_rel_error, op_args, reference_scan  # noqa: E402

from sglang.srt.layers.attention.linear import mamba2_ssd  # noqa: E402
from sglang.srt.layers.attention.linear.mamba2_ssd import NO_DT_LIMIT, ssd_decode, ssd_extend  # noqa: E402
from sglang.test.ci.ci_register import register_cpu_ci  # noqa: E402

register_cpu_ci(est_time=30, suite="cpu")

TOL = 2e-5  # fp32 math against fp64, relative to the output's scale; a wrong decay or a dropped term is >= 1e-2
LENS = [7, 1, 13, 0, 30, 16]


def extend(case, chunk_size, dt_limit=NO_DT_LIMIT):
    return ssd_extend(*op_args(case), chunk_size, dt_bias=case["dt_bias"], dt_limit=dt_limit)


def decode_all(case, dt_limit=NO_DT_LIMIT):
    """Every request run one token at a time through ssd_decode, from its initial state (or zero)."""
    has = case["has_initial_state"][:, None, None, None]
    state = torch.where(has, case["initial_state"], torch.zeros(()))
    ys = []
    starts = [sum(case["extend_lens"][:i]) for i in range(len(case["extend_lens"]))]
    for r, (start, length) in enumerate(zip(starts, case["extend_lens"])):
        row = state[r:r + 1]
        for t in range(start, start + length):
            y, row = ssd_decode(case["x"][t:t + 1], case["dt"][t:t + 1], case["A"], case["B"][t:t + 1],
                                case["C"][t:t + 1], case["D"], row, dt_bias=case["dt_bias"], dt_limit=dt_limit)
            ys.append(y)
        state[r] = row[0]
    return torch.cat(ys), state


class TestChunkedAndRecurrentForms(unittest.TestCase):
    def test_chunked_extend_equals_fp64_recurrence(self):
        case = make_case(LENS, nh=4, hd=8, ng=2, ns=16)
        ref_y, ref_state = reference_scan(case)
        for chunk_size in (1, 3, 8, 16, 64):
            with self.subTest(chunk_size=chunk_size):
                y, state = extend(case, chunk_size)
                self.assertEqual((y.dtype, state.dtype), (torch.float32, torch.float32))
                self.assertLess(max_rel_error(y, ref_y), TOL)
                self.assertLess(max_rel_error(state, ref_state), TOL)

    def test_recurrent_decode_equals_fp64_recurrence(self):
        case = make_case(LENS, nh=4, hd=8, ng=1, ns=16, seed=1)
        ref_y, ref_state = reference_scan(case)
        y, state = decode_all(case)
        self.assertLess(max_rel_error(y, ref_y), TOL)
        self.assertLess(max_rel_error(state, ref_state), TOL)

    def test_decode_equals_a_one_token_extend(self):
        case = make_case([1, 1, 1], nh=8, hd=4, ng=4, ns=8, has_initial=[True, True, True], seed=2)
        y_ext, s_ext = extend(case, 16)
        y_dec, s_dec = ssd_decode(case["x"], case["dt"], case["A"], case["B"], case["C"], case["D"],
                                  case["initial_state"], dt_bias=case["dt_bias"])
        torch.testing.assert_close(y_dec, y_ext, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(s_dec, s_ext, rtol=1e-6, atol=1e-6)

    def test_state_carried_across_cuts_equals_the_whole(self):
        """One 40-token request extended in pieces (cuts inside a chunk, on a chunk edge, one token long), each piece
        starting from the state the previous one returned, equals one whole extend and the reference."""
        case = make_case([40], nh=4, hd=8, ng=2, ns=16, has_initial=[True], seed=3)
        ref_y, ref_state = reference_scan(case)
        whole_y, whole_state = extend(case, 8)
        for cuts in ([5], [8, 16], [1, 2, 3, 19, 33], [39]):
            with self.subTest(cuts=cuts):
                bounds = [0] + cuts + [40]
                state, has, ys = case["initial_state"], case["has_initial_state"], []
                for lo, hi in zip(bounds, bounds[1:]):
                    piece = dict(case, extend_lens=[hi - lo], initial_state=state, has_initial_state=has)
                    for key in ("x", "dt", "B", "C"):
                        piece[key] = case[key][lo:hi]
                    y, state = extend(piece, 8)
                    ys.append(y)
                    has = torch.tensor([True])
                self.assertLess(max_rel_error(torch.cat(ys), ref_y), TOL)
                self.assertLess(max_rel_error(state, ref_state), TOL)
                torch.testing.assert_close(torch.cat(ys), whole_y, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(state, whole_state, rtol=1e-5, atol=1e-5)

    def test_retraction_recompute_equals_the_decoded_state(self):
        """A request prefilled in two chunks then decoded 6 tokens, retracted, and re-prefilled from prefix 0 into a
        reused row (NaN, has_initial_state False) over prompt + generated tokens: same state, same last outputs."""
        case = make_case([30], has_initial=[False], seed=10)
        prompt, total = 24, 30

        def piece(lo, hi, state, has):
            p = dict(case, extend_lens=[hi - lo], initial_state=state, has_initial_state=torch.tensor([has]))
            return {**p, **{k: case[k][lo:hi] for k in ("x", "dt", "B", "C")}}

        y1, state = extend(piece(0, 10, case["initial_state"], False), 4)
        y2, state = extend(piece(10, prompt, state, True), 4)
        ys = [y1, y2]
        for t in range(prompt, total):
            y, state = ssd_decode(case["x"][t:t + 1], case["dt"][t:t + 1], case["A"], case["B"][t:t + 1],
                                  case["C"][t:t + 1], case["D"], state, dt_bias=case["dt_bias"])
            ys.append(y)
        reused_row = torch.full_like(state, math.nan)
        y_re, state_re = extend(piece(0, total, reused_row, False), 4)
        torch.testing.assert_close(state_re, state, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(y_re, torch.cat(ys), rtol=1e-5, atol=1e-5)

    def test_mixed_initial_states(self):
        """Rows without an initial state start from zero whatever the row holds (NaN here); rows with one use it."""
        case = make_case([5, 9, 3, 12], has_initial=[False, True, False, True], seed=4)
        ref_y, ref_state = reference_scan(case)
        for y, state in (extend(case, 4), decode_all(case)):
            self.assertLess(max_rel_error(y, ref_y), TOL)
            self.assertLess(max_rel_error(state, ref_state), TOL)
        # the initial states matter: zeroing them moves the rows that had one
        zeroed = dict(case, has_initial_state=torch.zeros(4, dtype=torch.bool))
        y0, _ = extend(zeroed, 4)
        self.assertGreater(float((y0[5:14] - ref_y[5:14]).abs().max()), 1e-2)
        torch.testing.assert_close(y0[:5].double(), ref_y[:5], rtol=1e-4, atol=1e-4)

    def test_dt_limit_clamps_the_step(self):
        case = make_case([11, 6], seed=5)
        limit = (0.5, 0.9)
        ref_y, ref_state = reference_scan(case, dt_limit=limit)
        for y, state in (extend(case, 4, limit), decode_all(case, limit)):
            self.assertLess(max_rel_error(y, ref_y), TOL)
            self.assertLess(max_rel_error(state, ref_state), TOL)
        free_y, _ = reference_scan(case)
        self.assertGreater(float((free_y - ref_y).abs().max()), 1e-2)  # the limit is active in this case

    def test_long_chunks_with_a_checkpoints_decays(self):
        """chunk_size 128 (Nemotron-H's), 300 tokens, A = -1..-nh as transformers initialises A_log: the decay
        weights span many orders of magnitude inside a chunk."""
        nh = 16
        case = make_case([300, 77], nh=nh, hd=4, ng=2, ns=8, has_initial=[True, False], seed=6)
        case["A"] = -torch.arange(1, nh + 1, dtype=torch.float32)
        ref_y, ref_state = reference_scan(case)
        y, state = extend(case, 128)
        self.assertLess(max_rel_error(y, ref_y), TOL)
        self.assertLess(max_rel_error(state, ref_state), TOL)

    def test_blocks_of_chunks(self):
        """The intra-chunk part split into blocks of two chunks gives the same result."""
        case = make_case([9, 14], seed=7)
        y_one, s_one = extend(case, 4)
        saved = mamba2_ssd.INTRA_BLOCK_ELEMS
        mamba2_ssd.INTRA_BLOCK_ELEMS = 2 * 4 * 4 * 4  # two chunks of 4 slots, 4 heads
        try:
            y_blk, s_blk = extend(case, 4)
        finally:
            mamba2_ssd.INTRA_BLOCK_ELEMS = saved
        torch.testing.assert_close(y_blk, y_one, rtol=0, atol=0)
        torch.testing.assert_close(s_blk, s_one, rtol=0, atol=0)

    def test_bf16_inputs(self):
        """bf16 activations: y comes back in bf16, the state in the initial state's dtype (fp32), both near fp64."""
        case = make_case([20, 9], seed=8, dtype=torch.bfloat16)
        ref_y, ref_state = reference_scan(case)
        y, state = extend(case, 8)
        self.assertEqual((y.dtype, state.dtype), (torch.bfloat16, torch.float32))
        self.assertLess(max_rel_error(y, ref_y), 1e-2)
        self.assertLess(max_rel_error(state, ref_state), TOL)

    def test_shape_errors_name_the_tensor(self):
        case = make_case([3, 2])
        with self.assertRaisesRegex(ValueError, r"^C has shape"):
            ssd_extend(*op_args(dict(case, C=case["C"][:, :1])), 4)
        with self.assertRaisesRegex(ValueError, "extend_lens"):
            ssd_extend(*op_args(dict(case, extend_lens=[3, 3])), 4)


class TestAgainstTransformers(unittest.TestCase):
    """transformers' NemotronHMamba2Mixer helpers are an implementation independent of this project's."""

    @classmethod
    def setUpClass(cls):
        from transformers.models.nemotron_h import modeling_nemotron_h as hf

        cls.hf = hf
        torch.manual_seed(0)
        config = hf.NemotronHConfig(hidden_size=32, mamba_num_heads=8, mamba_head_dim=4, n_groups=2,
                                    ssm_state_size=8, conv_kernel=4, chunk_size=8, time_step_min=0.05,
                                    layers_block_type=["mamba"], num_hidden_layers=1)
        mixer = hf.NemotronHMamba2Mixer(config, layer_idx=0).eval()
        with torch.no_grad():
            for p in mixer.parameters():
                p.copy_(torch.randn_like(p) * 0.3)
            mixer.A_log.copy_(torch.rand(8) * 1.5)
        cls.mixer = mixer

    def test_mixer_forward(self):
        """The mixer's whole forward (no cache: the torch chunk scan) equals in_proj -> conv -> ssd_extend -> gated
        norm -> out_proj with this op as the scan, two requests of 19 tokens as one varlen batch."""
        m = self.mixer
        hidden = torch.randn(2, 19, 32)
        with torch.no_grad():
            want = m(hidden)
            proj = m.in_proj(hidden)
            gate, xbc, dt = proj.split([m.intermediate_size, m.conv_dim, m.num_heads], dim=-1)
            xbc = torch.nn.functional.conv1d(xbc.transpose(1, 2), m.conv1d.weight, m.conv1d.bias,
                                             padding=m.conv_kernel_size - 1, groups=m.conv_dim)[..., :19]
            xbc = torch.nn.functional.silu(xbc).transpose(1, 2).reshape(38, m.conv_dim)
            group_width = m.n_groups * m.ssm_state_size
            x, B, C = xbc.split([m.intermediate_size, group_width, group_width], dim=-1)
            y, _ = ssd_extend(x.reshape(38, m.num_heads, m.head_dim), dt.reshape(38, m.num_heads),
                              -torch.exp(m.A_log), B.reshape(38, m.n_groups, -1), C.reshape(38, m.n_groups, -1),
                              m.D, torch.zeros(2, m.num_heads, m.head_dim, m.ssm_state_size),
                              torch.tensor([False, False]), [19, 19], m.chunk_size, dt_bias=m.dt_bias,
                              dt_limit=m.time_step_limit)
            got = m.out_proj(m.norm(y.reshape(2, 19, -1), gate))
        self.assertGreater(m.time_step_limit[0], 0.0)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)

    def test_chunk_scan_with_initial_state_and_selective_update(self):
        """transformers' chunk scan from an initial state (final state returned) and its one-token state update
        (which does not clamp dt: dt_limit off here) against ssd_extend / ssd_decode."""
        hf = self.hf
        case = make_case([21, 21], nh=8, hd=4, ng=2, ns=8, has_initial=[True, True], seed=9)
        lim = (0.05, math.inf)
        with torch.no_grad():
            want_y, want_state = hf.mamba2_chunk_scan(
                case["x"].view(2, 21, 8, 4), case["dt"].view(2, 21, 8), case["A"], case["B"].view(2, 21, 2, 8),
                case["C"].view(2, 21, 2, 8), chunk_size=8, D=case["D"], dt_bias=case["dt_bias"],
                initial_states=case["initial_state"], dt_softplus=True, dt_limit=lim, return_final_states=True)
        y, state = extend(case, 8, lim)
        torch.testing.assert_close(y, want_y.reshape(42, 8, 4), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(state, want_state, rtol=1e-4, atol=1e-4)

        hf_state = state.clone()
        t = torch.tensor([0, 21])
        with torch.no_grad():
            want_y1 = hf.mamba2_selective_state_update(
                hf_state, case["x"][t], case["dt"][t][:, :, None].expand(-1, -1, 4),
                case["A"][:, None, None].expand(-1, 4, 8), case["B"][t], case["C"][t],
                case["D"][:, None].expand(-1, 4), dt_bias=case["dt_bias"][:, None].expand(-1, 4), dt_softplus=True)
        y1, state1 = ssd_decode(case["x"][t], case["dt"][t], case["A"], case["B"][t], case["C"][t], case["D"], state,
                                dt_bias=case["dt_bias"])
        torch.testing.assert_close(y1, want_y1, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(state1, hf_state, rtol=1e-5, atol=1e-5)


if __name__ == "__main__":
    unittest.main()
