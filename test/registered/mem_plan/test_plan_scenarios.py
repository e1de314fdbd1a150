"""plan_memory() on the seed scenarios: the Qwen3-Omni thinker on H100/H20, PR #18263 on MI355X, and §12.2/12.3."""

import dataclasses
import json
import unittest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang.srt.mem_plan import MemoryPlan, MemoryPlanError, PlanInputs, WorkspaceSpec, plan_memory
from sglang.srt.mem_plan.backends import AttentionShape, workspace_spec
from sglang.srt.mem_plan.budget import upstream_kv_bytes
from sglang.srt.mem_plan.plan import MemoryTerm
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=8, suite="cpu")

GB = 10**9
GiB = 2**30
MiB = 2**20


def omni_inputs(pre_bytes, y, device_total_bytes=None) -> PlanInputs:
    """Qwen3-Omni thinker (30B MoE, ~60 GB of weights) at the thinker's context of 8192, FlashInfer on CUDA."""
    return PlanInputs(
        pre_load_free_bytes=pre_bytes,
        weight_bytes=60 * GB,
        kv_cell_bytes=98_304,
        context_len=8192,
        mem_fraction_static=y,
        chunked_prefill_size=8192,
        activation_bytes=2 * GiB,
        workspace=workspace_spec("flashinfer", AttentionShape(32, 128, 8192, architectures=("Qwen3OmniMoe",))),
        cuda_graph_max_bs=256,
        cuda_graph_bytes=512 * MiB,
        encoder_bytes=1 * GiB,
        device_total_bytes=device_total_bytes,
    )


def assert_plan_fits(test, plan: MemoryPlan):
    test.assertLessEqual(plan.total_bytes, plan.budget_bytes)
    test.assertTrue(all(t.num_bytes >= 0 for t in plan.terms))
    # the pool's T tokens plus the dummy page the allocator reserves (padded reads point at it)
    test.assertEqual(plan.kv_bytes, (plan.max_total_num_tokens + plan.page_size) * plan.kv_cell_bytes)
    test.assertEqual(plan.max_total_num_tokens % plan.page_size, 0)


class TestOmniThinker(unittest.TestCase):
    """The blog's H100 story: a fixed 0.7 cannot start; the auto plan fits; an H20 at 0.7 leaves ~7.2 GB of KV."""

    def test_h100_fixed_0_7_fails_and_says_raise(self):
        with self.assertRaises(MemoryPlanError) as cm:
            plan_memory(omni_inputs(78 * GB, 0.7))
        e = cm.exception
        self.assertEqual(e.direction, "raise")
        self.assertEqual(e.knob, "--mem-fraction-static")
        self.assertIn("Raise --mem-fraction-static", str(e))
        self.assertIn("Startup would fail", str(e))
        self.assertGreater(e.suggested_value, 0.7)
        # 0.7 x 78 GB - 60 GB = -5.4 GB of KV, as the blog computes
        self.assertAlmostEqual((0.7 * 78 * GB - 60 * GB) / GB, -5.4, places=6)
        # the suggested value works, and is the smallest on the 0.001 grid that does
        plan = plan_memory(omni_inputs(78 * GB, e.suggested_value))
        assert_plan_fits(self, plan)
        self.assertEqual(plan.mem_fraction_static, e.suggested_value)
        self.assertEqual(plan.mem_fraction_static_source, "user")
        self.assertGreaterEqual(plan.max_total_num_tokens, 8192)
        with self.assertRaises(MemoryPlanError):
            plan_memory(omni_inputs(78 * GB, round(e.suggested_value - 0.001, 3)))

    def test_h100_blog_values_at_0_8_and_0_85(self):
        for y, kv_gb in ((0.8, 2.4), (0.85, 6.3)):
            plan = plan_memory(omni_inputs(78 * GB, y))
            self.assertAlmostEqual(plan.kv_bytes / GB, kv_gb, delta=0.0001)

    def test_h100_auto_plan_fits(self):
        plan = plan_memory(omni_inputs(78 * GB, None, device_total_bytes=81559 * MiB))
        assert_plan_fits(self, plan)
        self.assertEqual(plan.mem_fraction_static_source, "auto")
        self.assertEqual(plan.headroom_bytes < 98_304 + 50_000, True)  # KV took everything left
        self.assertGreater(plan.kv_bytes, 10 * GB)
        self.assertGreater(plan.mem_fraction_static, 0.85)
        self.assertEqual(plan.bytes_of("encoder"), 1 * GiB)
        self.assertEqual(plan.cuda_graph_max_bs, 256)
        # the reported effective y is (weights + KV) / budget
        self.assertAlmostEqual(plan.mem_fraction_static, (60 * GB + plan.kv_bytes) / (78 * GB), places=12)

    def test_h20_at_0_7_leaves_7_2_gb(self):
        plan = plan_memory(omni_inputs(96 * GB, 0.7))
        self.assertAlmostEqual(plan.kv_bytes / GB, 7.2, delta=0.0001)  # 96 x 0.7 - 60
        assert_plan_fits(self, plan)


class TestMI355XAiter(unittest.TestCase):
    """PR #18263's case as a full plan: every term charged, nothing exceeds the budget."""

    # per slot: PR #18263's H * P * (4d + 8) + 3 int32 indptr entries, + a context of int32 kv_indices (block 1)
    PER_SLOT = 17_039_372 + 262_144 * 4
    PRE = int(287.18 * GiB)
    WEIGHTS = int(56.98 * GiB)

    def inputs(self, y=None, **kw):
        return PlanInputs(
            pre_load_free_bytes=self.PRE, weight_bytes=self.WEIGHTS, kv_cell_bytes=98_304, context_len=262_144,
            mem_fraction_static=y, chunked_prefill_size=16384, activation_bytes=4 * GiB,
            workspace=workspace_spec("aiter", AttentionShape(32, 128, 262_144)), req_to_token_elem_bytes=8,
            cuda_graph_max_bs=512, cuda_graph_bytes=1 * GiB, device_total_bytes=294_896 * MiB, **kw)

    def test_auto_plan_charges_workspace(self):
        plan = plan_memory(self.inputs())
        assert_plan_fits(self, plan)
        ws = plan.bytes_of("attention_workspace")
        self.assertEqual(ws, 12 + 8 + self.PER_SLOT * plan.max_running_requests)  # + the two fp32 K/V scales
        self.assertEqual(plan.slot_regime, "linear")
        self.assertTrue(2048 < plan.max_running_requests < 4096)
        # KV + workspace + every other term within the budget, with the KV pool taking the rest
        self.assertLess(plan.headroom_bytes, 98_304 + self.PER_SLOT + 262_148 * 8)
        self.assertGreater(plan.max_total_num_tokens, 1_500_000)

    def test_upstream_auto_y_at_0_911_would_oom_and_we_say_lower(self):
        with self.assertRaises(MemoryPlanError) as cm:
            plan_memory(self.inputs(0.911))
        e = cm.exception
        self.assertEqual(e.direction, "lower")
        self.assertIn("Lower --mem-fraction-static", str(e))
        self.assertLess(e.suggested_value, 0.911)
        plan = plan_memory(self.inputs(e.suggested_value))
        assert_plan_fits(self, plan)
        with self.assertRaises(MemoryPlanError):
            plan_memory(self.inputs(round(e.suggested_value + 0.001, 3)))

    def test_user_max_running_requests(self):
        plan = plan_memory(self.inputs(max_running_requests=256))
        assert_plan_fits(self, plan)
        self.assertEqual(plan.max_running_requests, 256)
        self.assertEqual(plan.slot_regime, "user")
        self.assertEqual(plan.bytes_of("attention_workspace"), 12 + 8 + self.PER_SLOT * 256)


class TestLlama8BH100(unittest.TestCase):
    """§12.2: explicit y reproduces upstream's T = (y * pre - weights) // cell exactly."""

    PRE = int(78.6 * GiB)
    WEIGHTS = int(14.99 * GiB)

    def plan(self, y, **kw):
        return plan_memory(PlanInputs(pre_load_free_bytes=self.PRE, weight_bytes=self.WEIGHTS,
                                      kv_cell_bytes=kw.pop("cell", 131_072), context_len=kw.pop("ctx", 131_072),
                                      mem_fraction_static=y, safety_margin_bytes=0, req_to_token_elem_bytes=4, **kw))

    def test_tokens_at_each_fraction(self):
        for y, tokens in ((0.70, 327_925), (0.835, 414_851), (0.85, 424_509), (0.90, 456_703)):
            # upstream computes rest in float GiB: post - pre * (1 - y)
            rest_gib = (78.6 - 14.99) - 78.6 * (1 - y)
            self.assertEqual(int(rest_gib * 2**30) // 131_072, tokens)
            # we compute in integer bytes and charge the pool's dummy page (upstream allocates it unplanned): one
            # token fewer than upstream, except at y = 0.9, where rest is exactly 55.75 GiB and upstream's float
            # arithmetic lands just below (55.7499...), losing the token we gain
            plan = self.plan(y)
            exact = (int(self.PRE * y) - self.WEIGHTS) // 131_072 - 1
            self.assertEqual(plan.max_total_num_tokens, exact)
            self.assertIn(exact - tokens, (-1, 0))
            self.assertEqual(plan.max_running_requests, 2048)

    def test_req_to_token_and_pages(self):
        plan = self.plan(0.835)
        self.assertAlmostEqual(plan.bytes_of("req_to_token") / GiB, 1.0005, places=4)  # 2049 x 131076 x 4 B
        # upstream's pool at these page sizes; it allocates one dummy page more than it plans, which we charge, so
        # our static region (same y) holds exactly one page fewer
        for page, upstream_tokens in ((16, 414_848), (64, 414_848), (128, 414_848), (256, 414_720)):
            self.assertEqual(self.plan(0.835, page_size=page).max_total_num_tokens, upstream_tokens - page)
        fp8 = self.plan(0.835, cell=65_536)
        self.assertEqual(fp8.max_total_num_tokens, 829_702 - 1)
        self.assertEqual(fp8.max_running_requests, 3241)
        self.assertEqual(self.plan(0.835, ctx=8192).max_running_requests, 4096)

    def test_qwen3_moe_on_h100(self):
        for y, tokens in ((0.835, 95_365), (0.85, 108_243), (0.90, 151_169)):
            kv = upstream_kv_bytes(self.PRE, self.PRE - int(56.9 * GiB), y)
            self.assertEqual(kv // 98_304, tokens)

    def test_mi300x_undervalued_workspace(self):
        kv = upstream_kv_bytes(int(191.0 * GiB), int((191.0 - 56.9) * GiB), 0.867)
        tokens = kv // 98_304
        self.assertEqual(tokens, 1_187_261)
        slots = min(max(tokens * 512 // 262_144, 2048), 4096)
        self.assertEqual(slots, 2318)
        self.assertAlmostEqual(slots * 17_039_360 / GiB, 36.78, places=2)


class TestPlanObject(unittest.TestCase):
    def test_invariants_are_checked(self):
        good = plan_memory(PlanInputs(pre_load_free_bytes=4 * GiB, weight_bytes=GiB, kv_cell_bytes=4096,
                                      context_len=2048))
        with self.assertRaises(ValueError):
            dataclasses.replace(good, budget_bytes=good.total_bytes - 1)
        with self.assertRaises(ValueError):
            MemoryTerm("x", -1, "formula")
        with self.assertRaises(ValueError):
            MemoryTerm("x", 1, "guessed")
        with self.assertRaises(ValueError):
            dataclasses.replace(good, max_total_num_tokens=good.max_total_num_tokens + 1)

    def test_json_and_table(self):
        plan = plan_memory(PlanInputs(pre_load_free_bytes=4 * GiB, weight_bytes=GiB, kv_cell_bytes=4096,
                                      context_len=2048, cap_bytes=3 * GiB, activation_bytes=100 * MiB,
                                      sources={"activations": "measured"}))
        d = json.loads(plan.to_json())
        self.assertEqual(d["budget_bytes"], 3 * GiB)
        self.assertEqual(sum(t["num_bytes"] for t in d["terms"]), d["total_bytes"])
        self.assertEqual(plan.limited_by, "--max-total-memory-gb")
        table = plan.render_table()
        for name in ("weights", "kv_cache", "req_to_token", "attention_workspace", "activations", "safety_margin",
                     "headroom", "budget", "measured", "formula", "declared"):
            self.assertIn(name, table)
        self.assertIn("capped by --max-total-memory-gb", table)
        self.assertIn("KV pool", plan.explain())

    def test_nothing_fits_reports_shortfall(self):
        with self.assertRaises(MemoryPlanError) as cm:
            plan_memory(PlanInputs(pre_load_free_bytes=10 * GiB, weight_bytes=12 * GiB, kv_cell_bytes=4096,
                                   context_len=2048))
        self.assertIsNone(cm.exception.direction)
        self.assertGreater(cm.exception.shortfall_bytes, 2 * GiB)
        self.assertIn("Does not fit", str(cm.exception))

    def test_max_total_tokens_caps_pool(self):
        plan = plan_memory(PlanInputs(pre_load_free_bytes=8 * GiB, weight_bytes=GiB, kv_cell_bytes=4096,
                                      context_len=2048, max_total_tokens=10_000, page_size=64))
        self.assertEqual(plan.max_total_num_tokens, 9_984)
        self.assertEqual(plan.limited_by, "--max-total-tokens")
        self.assertGreater(plan.headroom_bytes, GiB)


class TestFullPlanNeverExceedsBudget(unittest.TestCase):
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        pre=st.integers(GiB, 300 * GiB),
        weight_frac=st.floats(0.0, 0.9),
        cell=st.integers(1024, 300_000),
        ctx=st.sampled_from([2048, 8192, 32768, 131072, 262144]),
        page=st.sampled_from([1, 16, 64]),
        per_req=st.integers(0, 20_000_000),
        act=st.integers(0, 4 * GiB),
        y=st.one_of(st.none(), st.floats(0.05, 0.98)),
        user_r=st.one_of(st.none(), st.integers(1, 8192)),
    )
    def test_all_terms_within_budget(self, pre, weight_frac, cell, ctx, page, per_req, act, y, user_r):
        inputs = PlanInputs(pre_load_free_bytes=pre, weight_bytes=int(pre * weight_frac), kv_cell_bytes=cell,
                            context_len=ctx, page_size=page, mem_fraction_static=y, max_running_requests=user_r,
                            activation_bytes=act, workspace=WorkspaceSpec(12, per_req, 4 * ctx),
                            cuda_graph_max_bs=256, req_to_token_elem_bytes=8)
        try:
            plan = plan_memory(inputs)
        except MemoryPlanError as e:
            if e.suggested_value is not None:  # the suggested value must work
                assert_plan_fits(self, plan_memory(dataclasses.replace(inputs, mem_fraction_static=e.suggested_value)))
            return
        assert_plan_fits(self, plan)
        tokens = plan.max_total_num_tokens
        # every request slot the rule allows at this pool size is given (written out here, independent of slots.py)
        half = tokens // 2
        rule = min(user_r, half) if user_r is not None else min(min(max(tokens * 512 // ctx, 2048), 4096), half)
        self.assertEqual(plan.max_running_requests, rule)
        if y is None:  # auto: the pool took every page that fits -- one more page would not
            self.assertGreater(total_bytes_at(inputs, plan, tokens + page), plan.budget_bytes)


def total_bytes_at(inputs: PlanInputs, plan: MemoryPlan, num_tokens: int) -> int:
    """Every term's bytes with a pool of num_tokens: the same inputs planned on a budget so large that the pool is
    exactly num_tokens (max_total_tokens) and the safety margin pinned to the original plan's."""
    roomy = dataclasses.replace(inputs, pre_load_free_bytes=inputs.pre_load_free_bytes * 4 + 2**40,
                                max_total_tokens=num_tokens, safety_margin_bytes=plan.bytes_of("safety_margin"))
    bigger = plan_memory(roomy)
    assert bigger.max_total_num_tokens == num_tokens
    return bigger.total_bytes


if __name__ == "__main__":
    unittest.main()
