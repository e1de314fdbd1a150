"""Quantized KV formats (mem_plan/kv_quant.py, mem_cache/kv_quant_codec.py, quantized_kv_pool.py) against independent
references:

- the codec: every format's dequantized rows equal a numpy re-implementation of its stated rule (written from the
  formulas in the docstrings, not from the codec), and stay within the format's error bound;
- the pool: bytes allocated == the plan's per-token and fixed bytes (fp8 scales, int4 key multipliers); int4's
  calibration sets w = (E[q^2] / E[k^2])^(1/8) per channel (mean 1) from exactly the rows and queries it saw; rows written at scattered slots and read back
  through gather_kv, at page sizes 1 and 16, equal the codec's round trip of exactly those rows;
- torch_native attention (decode, and extend with a cached prefix) over a quantized pool equals an fp64 softmax
  attention over the dequantized K/V of the cached tokens and the forward's own new K/V as computed (not their
  codes), GQA 3:1, ragged lengths, page sizes 1 and 16, every format;
- the plan: at the same --max-total-memory-gb the pool holds fp8 >= 1.95x, int8 >= 1.9x, int4 >= 3.5x and
  int2_hadamard >= 8x the bf16 tokens, every scale byte charged (the default model's geometry, `sglang plan` inputs).
"""

import math
import unittest

import numpy as np
import torch

from sglang.srt.mem_cache import kv_quant_codec as codec
from sglang.srt.mem_cache.quantized_kv_pool import QuantizedKVPool, create_kv_pool
from sglang.srt.mem_plan import kv_quant
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=25, suite="cpu")

FORMATS = kv_quant.QUANTIZED_KV_FORMATS


def _rows(n=40, h=3, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h, d, generator=g) * 1.5 + 0.3
    x[:, :, 5] *= 8  # an outlier channel
    x[3] = 0  # an all-zero row
    return x


def ref_dequant(fmt, x, part, scale=None, smooth=None):
    """numpy: the documented rule of each format, applied row by row (smooth: int4's key multiplier w [H, D])."""
    x = x.double().numpy()
    w = np.ones(x.shape[1:]) if smooth is None else smooth.double().numpy()
    int4_key = fmt == "int4" and part == "k"
    n, h, d = x.shape
    out = np.zeros_like(x)
    rot = codec.rotation(d).double().numpy() if codec.is_rotated(fmt, part) or int4_key else np.eye(d)
    assert np.allclose(rot @ rot.T, np.eye(d), atol=1e-6)
    if fmt in kv_quant.FP8_FORMATS:  # fp8 keys are stored turned (x @ R) too
        dt = codec.FP8_TORCH[fmt]
        s = scale.double().numpy()
        fmax = torch.finfo(dt).max
        y = np.clip((x @ rot) / s[None, :, None], -fmax, fmax)
        return (torch.from_numpy(y).to(dt).double().numpy() * s[None, :, None]) @ rot.T
    for i in range(n):
        for j in range(h):
            r = (x[i, j] * w[j]) @ rot if int4_key else x[i, j] @ rot
            if fmt == "int8":
                s = float(np.float16(np.abs(r).max() / 127)) or 1.0
                deq = np.clip(np.rint(r / s), -127, 127) * s
            elif fmt == "int4":
                s, m = float(np.float16((r.max() - r.min()) / 15)), float(np.float16(r.min()))
                deq = np.clip(np.rint((r - m) / (s or 1.0)), 0, 15) * s + m
            else:  # int2_hadamard
                rms = math.sqrt((r ** 2).mean())
                z = r / rms if rms else r
                if part == "k":
                    lv = np.array(codec.LEVELS_2BIT)[np.searchsorted(codec.THRESHOLDS_2BIT, z, side="left")]
                else:
                    lv = (z > codec.THRESHOLD_TERNARY).astype(float) - (z < -codec.THRESHOLD_TERNARY)
                s = max((r * lv).sum() / (lv ** 2).sum(), 0.0) if (lv ** 2).sum() else 0.0
                code = 0 if s <= 0 else min(max(round(math.log2(s) * codec.LOG_SCALE_STEPS) + codec.LOG_SCALE_OFFSET, 1), 255)
                deq = lv * (2.0 ** ((code - codec.LOG_SCALE_OFFSET) / codec.LOG_SCALE_STEPS) if code else 0.0)
            out[i, j] = (deq @ rot.T) / (w[j] if int4_key else 1.0)
    return out


def _smooth(h=3, d=64, seed=7):
    """int4 key multipliers: positive, mean 1 per head, a few channels weighted up (as queries weigh them)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(h, d, generator=g) + 0.3
    w[:, 5] *= 4.0
    return w / w.mean(-1, keepdim=True)


def _fp8_scale(h=3):
    return torch.tensor([0.02, 0.05, 0.11])[:h]


class TestCodec(unittest.TestCase):
    def test_every_format_matches_its_rule(self):
        x = _rows()
        for fmt in FORMATS:
            for part, smooth in (("k", None), ("v", None), ("k", _smooth())):
                if smooth is not None and fmt != "int4":
                    continue
                scale = _fp8_scale() if fmt in kv_quant.FP8_FORMATS else None
                fields = codec.quantize(fmt, x, part, scale, smooth)
                got = codec.dequantize(fmt, fields, part, torch.float32, scale, dim=64, smooth=smooth).double().numpy()
                ref = ref_dequant(fmt, x, part, scale, smooth)
                # fp32 vs fp64 rounding may move a value sitting on a rounding boundary by one step: allow it rarely
                close = np.isclose(got, ref, atol=1e-4, rtol=1e-3)
                self.assertGreaterEqual(close.mean(), 0.995, f"{fmt} {part}: {close.mean():.4f}")
                # stored bytes per (token, head) are the planned ones
                per_head = sum(v[0, 0].numel() * v.element_size() for v in fields.values())
                planned = sum(f.bytes for f in kv_quant.token_fields(fmt, 64, 64) if f.name.startswith(part))
                self.assertEqual(per_head, planned, fmt)

    def test_error_bounds(self):
        x = _rows(n=200, seed=1)
        x[3] = 1.0
        rel = {}
        for fmt in FORMATS:
            scale = (x.abs().amax(dim=(0, 2)) * 2 / torch.finfo(codec.FP8_TORCH[fmt]).max
                     if fmt in kv_quant.FP8_FORMATS else None)
            y = codec.dequantize(fmt, codec.quantize(fmt, x, "k", scale), "k", torch.float32, scale, dim=64)
            rel[fmt] = float((y - x).norm() / x.norm())
        # measured (an x8 outlier channel): e4m3 0.026, e5m2 0.054, int8 0.013, int4 0.082, int2 0.32 (a Gaussian
        # 4-level Lloyd-Max quantizer: 0.343)
        bounds = {"fp8_e4m3": 0.04, "fp8_e5m2": 0.08, "int8": 0.02, "int4": 0.12, "int2_hadamard": 0.4}
        for fmt, b in bounds.items():
            self.assertLess(rel[fmt], b, rel)
        self.assertLess(rel["int8"], rel["fp8_e4m3"])
        self.assertLess(rel["int4"], rel["int2_hadamard"])

    def test_rotation_is_orthonormal(self):
        for d in (64, 128, 96):
            r = codec.rotation(d).double()
            self.assertTrue(torch.allclose(r @ r.T, torch.eye(d, dtype=torch.float64), atol=1e-5), d)

    def test_write_path_constants_are_made_once(self):
        """The write path's R and int2's level / trit tables are one tensor per device, not a fresh copy per call (on a
        GPU that copy would be a host-to-device transfer inside a captured CUDA graph)."""
        self.assertIs(codec.rotation(64, "cpu"), codec.rotation(64, torch.device("cpu")))
        x = torch.randn(4, 2, 64)
        before = {f: f.cache_info().misses for f in (codec._constant, codec._trit_table, codec._rotation_on)}
        for _ in range(3):
            for part in ("k", "v"):
                fields = codec.quantize("int2_hadamard", x, part)
                codec.dequantize("int2_hadamard", fields, part, torch.float32, dim=64)
        for f, misses in before.items():
            self.assertLessEqual(f.cache_info().misses - misses, 3, f)  # the first call's, never per call


class TestPool(unittest.TestCase):
    def test_bytes_are_the_planned_ones(self):
        for fmt in FORMATS:
            for page in (1, 16):
                pool = create_kv_pool(fmt, 96, page, torch.bfloat16, 3, 64, 4)
                self.assertIsInstance(pool, QuantizedKVPool)
                rows = 96 + page
                planned = (rows * 3 * 4 * kv_quant.token_bytes_per_head(fmt, 64, 64)
                           + kv_quant.fixed_bytes(fmt, 4, 3, 64, 64))
                self.assertEqual(pool.mem_usage_bytes(), planned, fmt)
                fixed = {"fp8_e4m3": 8, "fp8_e5m2": 8, "int4": 64 * 4}.get(fmt, 0)  # by hand, per (layer, head)
                self.assertEqual(kv_quant.fixed_bytes(fmt, 4, 3, 64, 64), 4 * 3 * fixed, fmt)

    def test_int4_calibration_sets_the_query_aware_key_multipliers(self):
        pool = create_kv_pool("int4", 256, 1, torch.float32, 3, 64, 2)
        self.assertTrue(pool.needs_calibration)
        k1, k2 = _rows(50, seed=11), _rows(30, seed=13) + 1
        q1, q2 = _rows(50, h=6, seed=12) * 2, _rows(30, h=6, seed=14)  # 6 query heads: 2 per KV head
        pool.calibrating = True
        for rows, k, q in ((torch.arange(1, 51), k1, q1), (torch.arange(51, 81), k2, q2)):  # two forwards
            pool.set_kv_buffer(1, rows, k, k)
            pool.record_query(1, q)
        pool.calibrate_scales("test")
        self.assertFalse(pool.calibrating)
        ek = torch.cat([k1, k2]).double().pow(2).mean(0)  # [3, 64]
        eq = torch.cat([q1, q2]).double().pow(2).view(80, 3, 2, 64).mean((0, 2))
        w = (eq / ek) ** 0.125
        w = w / w.mean(-1, keepdim=True)
        self.assertTrue(torch.allclose(pool.fixed["k_smooth"][1].double(), w, rtol=1e-5), (pool.fixed["k_smooth"][1], w))
        self.assertTrue(torch.equal(pool.fixed["k_smooth"][0], torch.ones(3, 64)))  # layer 0 saw nothing: stays 1
        # rows written after calibration: their keys come back within int4's bound (the multiplier undone)
        pool.set_kv_buffer(1, torch.tensor([100]), k1[:1], k1[:1])
        gk, gv = pool.gather_kv(1, torch.tensor([100]), torch.float32)
        self.assertLess(float((gk - k1[:1]).norm() / k1[:1].norm()), 0.12)

    def test_gather_reads_exactly_the_written_rows(self):
        for fmt in FORMATS:
            for page in (1, 16):
                pool = create_kv_pool(fmt, 128, page, torch.float32, 3, 64, 2)
                if pool.is_fp8:
                    pool.fixed["k_scale"][1] = _fp8_scale()
                if "k_smooth" in pool.fixed:
                    pool.fixed["k_smooth"][1] = _smooth()
                k, v = _rows(30, seed=2), _rows(30, seed=3)
                loc = torch.randperm(128)[:30] + page
                pool.set_kv_buffer(1, loc, k, v)
                pick = torch.tensor([5, 0, 29, 7])
                gk, gv = pool.gather_kv(1, loc[pick], torch.float32)
                ks = pool.fixed["k_scale"][1] if pool.is_fp8 else None
                vs = pool.fixed["v_scale"][1] if pool.is_fp8 else None
                kw = pool.fixed["k_smooth"][1] if "k_smooth" in pool.fixed else None
                rk = codec.dequantize(fmt, codec.quantize(fmt, k[pick], "k", ks, kw), "k", torch.float32, ks, dim=64, smooth=kw)
                rv = codec.dequantize(fmt, codec.quantize(fmt, v[pick], "v", vs), "v", torch.float32, vs, dim=64)
                self.assertTrue(torch.allclose(gk, rk, atol=1e-5), fmt)
                self.assertTrue(torch.allclose(gv, rv, atol=1e-5), fmt)
                # the dummy page reads as zeros (finite padding)
                zk, _ = pool.gather_kv(1, torch.tensor([0]), torch.float32)
                self.assertEqual(float(zk.abs().sum()), 0.0)


def _reference_attention(q, k, v, scale, visible):
    """fp64 softmax attention: q [n, H, D], k/v [L, KV, D], visible [n, L] bool -> [n, H * Dv]."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    kx, vx = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)  # [L, H, D]
    scores = torch.einsum("nhd,lhd->nhl", q, kx) * scale
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    return torch.einsum("nhl,lhd->nhd", scores.softmax(-1), vx).reshape(q.shape[0], -1)


class TestTorchNativeOverQuantizedPool(unittest.TestCase):
    def _harness(self, fmt, page):
        from types import SimpleNamespace

        from sglang.srt.layers.attention.attention_registry import create_attention_backend
        from sglang.test.attention_harness import BackendHarness

        h = BackendHarness("torch_native", page_size=page, num_q_heads=6, num_kv_heads=2, head_dim=64,
                           dtype=torch.float32, pool_tokens=512)
        h.pool = create_kv_pool(fmt, 512, page, torch.float32, 2, 64, h.num_layers)
        if h.pool.is_fp8:
            h.pool.fixed["k_scale"].fill_(0.03)
            h.pool.fixed["v_scale"].fill_(0.02)
        if "k_smooth" in h.pool.fixed:  # calibrated-like key multipliers
            h.pool.fixed["k_smooth"].copy_(_smooth(2)[None])
        h.backend = create_attention_backend("torch_native", model_config=SimpleNamespace(dtype=torch.float32),
                                             req_to_token_pool=h.r2t, token_to_kv_pool=h.pool, device="cpu")
        return h

    def _stored(self, h, layer, row, n):
        """The request's first n K/V rows as the pool holds them, dequantized (gathered by slot)."""
        slots = h.r2t.req_to_token[row, :n]
        return h.pool.gather_kv(layer, slots, torch.float32)

    def test_decode_and_extend_match_fp64_over_dequantized_kv(self):
        g = torch.Generator().manual_seed(4)
        for fmt in FORMATS:
            for page in (1, 16):
                h = self._harness(fmt, page)
                layer = h.layers[1]
                rows = [h.new_request() for _ in range(3)]
                # prefill: 19, 33 and 5 tokens (no cached prefix)
                lens = [19, 33, 5]
                fb = h.batch(rows, lens)
                h.backend.init_forward_metadata(fb)
                n = sum(lens)
                q, k, v = (torch.randn(n, hh, 64, generator=g) for hh in (6, 2, 2))
                h.backend.forward(q, k, v, layer, fb)
                # extend with a cached prefix: request 0 gets 7 more tokens, read partly from the pool
                fb = h.batch([rows[0]], [7])
                h.backend.init_forward_metadata(fb)
                q, k, v = (torch.randn(7, hh, 64, generator=g) for hh in (6, 2, 2))
                out = h.backend.forward(q, k, v, layer, fb)
                ks, vs = self._stored(h, layer.layer_id, rows[0], 26)
                # the cached 19 tokens as the pool holds them, this forward's 7 as computed (not their codes)
                ks, vs = torch.cat([ks[:19], k]), torch.cat([vs[:19], v])
                visible = torch.arange(26)[None, :] <= torch.arange(19, 26)[:, None]
                ref = _reference_attention(q, ks, vs, layer.scaling, visible)
                self.assertLess(float((out.double() - ref).abs().max()), 1e-4, f"extend {fmt} page {page}")
                # a decode step of all three (ragged lengths 26, 33, 5)
                fb = h.batch(rows, [1, 1, 1])
                h.backend.init_forward_metadata(fb)
                q, k, v = (torch.randn(3, hh, 64, generator=g) for hh in (6, 2, 2))
                out = h.backend.forward(q, k, v, layer, fb)
                for b, (row, length) in enumerate(zip(rows, (27, 34, 6))):
                    ks, vs = self._stored(h, layer.layer_id, row, length)
                    ks, vs = torch.cat([ks[:-1], k[b : b + 1]]), torch.cat([vs[:-1], v[b : b + 1]])  # its own K/V exact
                    ref = _reference_attention(q[b : b + 1], ks, vs, layer.scaling, torch.ones(1, length, dtype=torch.bool))
                    self.assertLess(float((out[b : b + 1].double() - ref).abs().max()), 1e-4,
                                    f"decode {fmt} page {page} row {b}")
                # the pool holds the new token's K/V quantized (for later forwards), not exactly
                self.assertFalse(torch.equal(self._stored(h, layer.layer_id, rows[2], 6)[0][-1], k[2]))


class TestPlanCapacity(unittest.TestCase):
    GAINS = {"fp8_e4m3": 1.95, "fp8_e5m2": 1.95, "int8": 1.9, "int4": 3.5, "int2_hadamard": 8.0}

    def _plan(self, fmt, gib=16):
        from sglang.cli.plan import run

        status, result, _ = run(["--device", "cpu", "--max-total-memory-gb", str(gib), "--kv-cache-dtype", fmt,
                                 "--attention-backend", "torch_native", "--json"])
        self.assertEqual(status, 0)
        return result

    def test_tokens_at_the_same_budget(self):
        base = self._plan("bfloat16")
        base_tokens = base["plan"]["max_total_num_tokens"]
        for fmt, gain in self.GAINS.items():
            got = self._plan(fmt)
            tokens = got["plan"]["max_total_num_tokens"]
            kv_term = next(t for t in got["plan"]["terms"] if t["name"] == "kv_cache")["num_bytes"]
            # the term is the pool's bytes: tokens + dummy page at the format's cell, plus fp8's fixed scales
            self.assertEqual(kv_term, (tokens + 1) * got["kv_cell_bytes"] + got["plan"]["kv_fixed_bytes"], fmt)
            fixed = {"fp8_e4m3": 8, "fp8_e5m2": 8, "int4": 64 * 4}.get(fmt, 0)  # per (layer, KV head), by hand
            self.assertEqual(got["plan"]["kv_fixed_bytes"], 30 * 3 * fixed, fmt)
            print(f"{fmt}: {tokens:,} tokens vs bf16 {base_tokens:,} = {tokens / base_tokens:.3f}x")
            self.assertGreaterEqual(tokens / base_tokens, gain, fmt)


    def test_dry_run_refuses_an_int_format_on_a_gpu_backend(self):
        import contextlib
        import io

        from sglang.cli.plan import run

        err = io.StringIO()
        with contextlib.redirect_stderr(err), self.assertRaises(SystemExit):
            run(["--gpu", "h100-80gb", "--kv-cache-dtype", "int4", "--attention-backend", "flashinfer"])
        self.assertIn("read by --attention-backend torch_native / triton, not by flashinfer", err.getvalue())
        self.assertIn("use --attention-backend triton", err.getvalue())


if __name__ == "__main__":
    unittest.main()
