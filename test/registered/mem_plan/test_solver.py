"""Exact token solve vs. brute force, across every region of the request-slot rule, and PR #18263's numbers."""

import random
import unittest

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang.srt.mem_plan import SlotCost, SlotRule, linear_regime_tokens, solve_max_tokens
from sglang.srt.mem_plan.backends import aiter_decode_workspace_per_req_bytes
from sglang.srt.mem_plan.layer_pools import LayerPools, PoolCost
from sglang.srt.mem_plan.solver import total_bytes
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=12, suite="cpu")

PROPERTY_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def brute_force(budget, cell, rule, cost, page, max_tokens=None):
    """Largest feasible T by evaluating every page multiple (no monotonicity assumed)."""
    n_max = budget // (cell * page)
    if max_tokens is not None:
        n_max = min(n_max, max_tokens // page)
    t = np.arange(n_max + 1, dtype=np.int64) * page
    half = t // 2
    if rule.user_max_running_requests is not None:
        r = np.minimum(rule.user_max_running_requests, half)
    else:
        est = np.clip(t * rule.slots_per_context // rule.context_len, rule.min_slots, rule.max_slots)
        r = np.minimum(est, half)
    total = (t * cell + cost.fixed_bytes + cost.per_slot_bytes * r
             + cost.per_graph_bs_bytes * np.minimum(cost.cuda_graph_max_bs, r))
    ok = np.nonzero(total <= budget)[0]
    return int(t[ok[-1]]) if len(ok) else 0


def pools_of(window=0, windowed_cell=0, state=0, chunk=1, page=1) -> PoolCost:
    return PoolCost(LayerPools(full_layers=1, sliding_layers=int(window > 0), linear_layers=int(state > 0),
                               window_tokens=window, windowed_cell_bytes=windowed_cell, state_bytes_per_slot=state),
                    chunk, page)


def cap_by_brute_force(T, cell, window, wcell, state, chunk, page):
    """The balance cap as the issue states it: the largest R in [1, T // 2] whose windowed tokens
    min(T, (R (W + 2 (P - 1)) + max(chunk, R)) rounded up to a page) x windowed cell + R x state <= T x full cell,
    or 1; every R tried."""
    best = 1
    for R in range(1, T // 2 + 1):
        t_w = min(T, -(-(R * (window + 2 * (page - 1)) + max(chunk, R)) // page) * page) if window else 0
        if t_w * wcell + R * state <= T * cell:
            best = R
    return best


class TestSlotRule(unittest.TestCase):
    def test_regions(self):
        rule = SlotRule(131072)
        self.assertEqual(rule.slots(414_851), 2048)  # floor: int(414851 / 131072 * 512) = 1620 -> 2048
        self.assertEqual(rule.regime(414_851), "floor")
        self.assertEqual(rule.slots(829_702), 3241)  # fp8 KV doubles the pool -> linear
        self.assertEqual(rule.regime(829_702), "linear")
        self.assertEqual(SlotRule(8192).slots(414_851), 4096)  # int(T / 8192 * 512) = 25928 -> cap
        self.assertEqual(SlotRule(8192).regime(414_851), "cap")
        self.assertEqual(rule.slots(3000), 1500)  # tiny pool: T // 2
        self.assertEqual(rule.regime(3000), "half")

    def test_user_value(self):
        self.assertEqual(SlotRule(131072, 64).slots(414_851), 64)
        self.assertEqual(SlotRule(131072, 5000).slots(3000), 1500)
        self.assertEqual(SlotRule(131072, 5000).regime(3000), "half")

    def test_integer_floor_matches_upstream_float(self):
        for ctx in (4096, 8192, 32768, 40960, 131072, 262144):
            for t in range(0, 40 * ctx, ctx // 7 + 1):
                self.assertEqual(t * 512 // ctx, int(t / ctx * 512))


class TestSlotRuleKinds(unittest.TestCase):
    """The rules of models with windowed / linear layers (layer_pools.py): values by hand, and monotone in T."""

    def test_first_context(self):
        rule = SlotRule(131072, kind="first-context")
        self.assertEqual(rule.slots(100_000), 1)  # below one context: one slot, no 2048 floor
        self.assertEqual(rule.regime(100_000), "first-context")
        self.assertEqual(rule.slots(131072 + 255), 1)
        self.assertEqual(rule.slots(131072 + 256), 2)  # then 512 per context of pool
        self.assertEqual(rule.regime(131072 + 256), "linear")
        self.assertEqual(rule.slots(137_215), 1 + (137_215 - 131072) // 256)
        self.assertEqual(rule.slots(10**9), 4096)
        self.assertEqual(rule.regime(10**9), "cap")
        self.assertEqual(rule.slots(1), 0)  # T // 2 still bounds it
        self.assertEqual(rule.regime(1), "half")
        self.assertEqual(SlotRule(131072, 8, kind="first-context").slots(10**6), 8)  # the user's value wins

    def test_balance_cap_state(self):
        """Nemotron-H-8B at context 8,192: a full token 16,384 B (4 attention layers x 8 KV heads x 128 x K,V x 2 B),
        a slot's state 102,137,856 B (24 Mamba layers x (10,240 conv channels x 3 x 2 B + 128 x 64 x 128 x 4 B)).
        Past the first context the 512-per-context rule would buy 4,096 slots; with no window the cap is
        R x 102,137,856 <= T x 16,384, i.e. T x 16,384 // 102,137,856."""
        rule = SlotRule(8192, kind="first-context", full_cell_bytes=16_384, pools=pools_of(state=102_137_856))
        self.assertEqual(1 + (1_906_484 - 8192) * 512 // 8192, 118_644)  # the linear piece, capped at 4,096
        self.assertEqual(rule.slots(1_906_484), 305)  # 31,235,833,856 B of KV / 102,137,856 B = 305.8
        self.assertEqual(rule.regime(1_906_484), "balance")
        self.assertLessEqual(305 * 102_137_856, 1_906_484 * 16_384)
        self.assertGreater(306 * 102_137_856, 1_906_484 * 16_384)
        # one state is exactly 6,234 tokens of KV (6,234 x 16,384 = 102,137,856): the cap is T // 6,234
        self.assertEqual(rule.slots(6_233), 1)  # below one slot's worth of KV: still the one slot
        self.assertEqual(rule.slots(8192 + 16), 1)  # the linear piece says 2, the cap 8,208 // 6,234 = 1
        self.assertEqual(rule.regime(8192 + 16), "balance")
        self.assertEqual(rule.slots(3 * 6234 - 1), 2)
        self.assertEqual(rule.slots(3 * 6234), 3)
        self.assertEqual(rule.slots(1), 0)  # T // 2 still bounds it
        # the user's value, and the other kinds, are not capped
        self.assertEqual(SlotRule(8192, 900, kind="first-context", full_cell_bytes=16_384,
                                  pools=pools_of(state=102_137_856)).slots(1_906_484), 900)
        self.assertEqual(SlotRule(8192, full_cell_bytes=16_384, pools=pools_of(state=102_137_856)).slots(1_906_484),
                         4096)
        self.assertEqual(SlotRule(8192, kind="first-context").slots(1_906_484), 4096)  # no pools given: no cap
        with self.assertRaises(ValueError):
            SlotRule(8192, kind="first-context", full_cell_bytes=-1, pools=pools_of(state=5))

    def test_balance_cap_windows(self):
        """Gemma-3-27B at 131,072, page 1, chunk 8,192: a full token 81,920 B (10 layers), a windowed one 425,984 B
        (52 sliding layers of 1,024). While the windows stay below the full pool, R slots are balanced when
        (1,024 R + 8,192) x 425,984 <= T x 81,920: R <= (T x 81,920 // 425,984 - 8,192) // 1,024."""
        gemma = SlotRule(131072, kind="first-context", full_cell_bytes=81_920,
                         pools=pools_of(window=1024, windowed_cell=425_984, chunk=8192))
        for T, linear in ((135_679, 18), (513_786, 1_495)):
            self.assertEqual(1 + (T - 131072) * 512 // 131072, linear)
            self.assertEqual(gemma.slots(T), (T * 81_920 // 425_984 - 8192) // 1024)  # 17, 88
            self.assertEqual(gemma.regime(T), "balance")
        self.assertEqual(gemma.slots(100_000), 1)  # nothing balanced below 8,192 windowed tokens' worth: one slot
        # Gemma-2-9B at 8,192: 21 sliding layers of 4,096 beside 21 full, the same cell (172,032 B): the windows can
        # never outweigh the full pool (T_w <= T), so the cap never binds (the additive form gave 43 slots at 178,021)
        gemma2 = SlotRule(8192, kind="first-context", full_cell_bytes=172_032,
                          pools=pools_of(window=4096, windowed_cell=172_032, chunk=8192))
        plain = SlotRule(8192, kind="first-context")
        for T in (2, 4096, 8192, 8193, 12_000, 16_383, 178_021, 10**7):
            self.assertEqual(gemma2.slots(T), plain.slots(T), T)
            self.assertNotEqual(gemma2.regime(T), "balance")
        self.assertEqual(gemma2.slots(178_021), 4096)
        self.assertLess(178_021 * 172_032 // ((4096 + 0) * 172_032), 4096)  # what the additive cap made of it: 43

    def test_balance_cap_vs_brute_force(self):
        """B(T) over small integers -- windowed cell below / equal / above the full one, with and without state,
        pages 1..4 -- against every R in [1, T // 2] tried (no monotonicity assumed); and B nondecreasing in T."""
        rng = random.Random(40)
        seen = {"below": 0, "equal": 0, "above": 0, "binds": 0}
        for _ in range(200):
            cell, page, chunk = rng.randint(1, 9), rng.choice([1, 2, 4]), rng.randint(1, 16)
            wcell = rng.choice([0, rng.randint(1, cell), cell, rng.randint(cell, 30)])
            window = rng.randint(1, 12) if wcell else 0
            state = rng.choice([0, rng.randint(1, 60)]) if wcell else rng.randint(1, 60)
            rule = SlotRule(rng.randint(2, 40), kind="first-context", full_cell_bytes=cell,
                            pools=pools_of(window, wcell, state, chunk, page))
            prev = 0
            for T in range(0, 260):
                want = cap_by_brute_force(T, cell, window, wcell, state, chunk, page)
                self.assertEqual(rule.balance_cap(T), want, (T, cell, window, wcell, state, chunk, page))
                for upto in (1, 2, 3, 7, 50):
                    self.assertEqual(rule.balance_cap(T, upto=upto), min(upto, want))
                self.assertGreaterEqual(want, prev)  # nondecreasing in T
                prev = want
                seen["binds"] += 1 < want < T // 2
            seen["below" if wcell < cell else "equal" if wcell == cell else "above"] += 1
        self.assertTrue(all(n >= 20 for n in seen.values()), seen)

    @PROPERTY_SETTINGS
    @given(kind=st.sampled_from(["upstream", "first-context", "context-per-slot"]), ctx=st.integers(2, 5000),
           user=st.one_of(st.none(), st.integers(1, 5000)), t=st.integers(0, 10**7), dt=st.integers(1, 10**5),
           cell=st.integers(0, 10**5), window=st.integers(0, 10**5), wcell=st.integers(1, 10**6),
           state=st.integers(0, 10**9), chunk=st.integers(1, 10**5), page=st.sampled_from([1, 16, 64]))
    def test_monotone(self, kind, ctx, user, t, dt, cell, window, wcell, state, chunk, page):
        pools = pools_of(window, wcell if window else 0, state if window else state + 1, chunk, page)
        rule = SlotRule(ctx, user, kind=kind, full_cell_bytes=cell, pools=pools)
        self.assertLessEqual(rule.slots(t), rule.slots(t + dt))
        if kind == "first-context" and user is None and cell and rule.slots(t) > 1:  # the cap holds where it binds
            self.assertLessEqual(pools.balance_bytes(t, rule.slots(t)), t * cell)

    def test_context_per_slot(self):
        """Every layer linear (no token pool): a slot maps one context of logical tokens."""
        rule = SlotRule(32768, kind="context-per-slot")
        self.assertEqual(rule.slots(32767), 0)
        self.assertEqual(rule.slots(3 * 32768 + 5), 3)
        self.assertEqual(rule.regime(3 * 32768), "per-context")
        self.assertEqual(rule.slots(5000 * 32768), 4096)
        self.assertEqual(rule.regime(5000 * 32768), "cap")
        self.assertEqual(SlotRule(32768, 7, kind="context-per-slot").slots(10 * 32768), 7)
        self.assertEqual(SlotRule(32768, 7, kind="context-per-slot").regime(10 * 32768), "user")
        self.assertEqual(SlotRule(32768, 7, kind="context-per-slot").slots(3 * 32768), 3)  # a slot is a context
        with self.assertRaises(ValueError):
            SlotRule(32768, kind="ratio")


class TestPR18263(unittest.TestCase):
    """Qwen3-30B-A3B at context 262144 on MI355X with AITER: KV + workspace budget of 219,721,119,039 bytes."""

    BUDGET = 219_721_119_039
    CELL = 98_304  # 4 KV heads x 256 x 48 layers x 2 B
    CTX = 262_144

    def test_workspace_per_request(self):
        self.assertEqual(aiter_decode_workspace_per_req_bytes(32, 128, self.CTX), 17_039_360)

    def test_continuous_linear_solve_reproduces_pr(self):
        ws = aiter_decode_workspace_per_req_bytes(32, 128, self.CTX)
        self.assertEqual(self.CELL + ws * 512 // self.CTX, 131_584)
        t = linear_regime_tokens(self.BUDGET, self.CELL, ws, self.CTX)
        self.assertEqual(t, 1_669_816)
        self.assertEqual(SlotRule(self.CTX).slots(t), 3261)

    def test_exact_solver_finds_62_more_tokens(self):
        ws = aiter_decode_workspace_per_req_bytes(32, 128, self.CTX)
        rule, cost = SlotRule(self.CTX), SlotCost(per_slot_bytes=ws)
        t = solve_max_tokens(self.BUDGET, self.CELL, rule, cost)
        self.assertEqual(t, 1_669_878)
        self.assertEqual(rule.slots(t), 3261)
        self.assertEqual(rule.regime(t), "linear")
        self.assertLessEqual(total_bytes(t, self.CELL, rule, cost), self.BUDGET)
        self.assertGreater(total_bytes(t + 1, self.CELL, rule, cost), self.BUDGET)
        # workspace of the solved plan: 3261 x 16.25 MiB = 51.75 GiB
        self.assertAlmostEqual(3261 * ws / 2**30, 51.75, places=2)


class TestSolverEdges(unittest.TestCase):
    def test_nothing_fits(self):
        self.assertEqual(solve_max_tokens(100, 10, SlotRule(64), SlotCost(fixed_bytes=101)), 0)
        self.assertEqual(solve_max_tokens(-5, 10, SlotRule(64)), 0)

    def test_max_tokens_and_page(self):
        self.assertEqual(solve_max_tokens(10**9, 10, SlotRule(64), page_size=16, max_tokens=1000), 992)

    def test_zero_cell_needs_bound(self):
        with self.assertRaises(ValueError):
            solve_max_tokens(10**9, 0, SlotRule(64))
        self.assertEqual(solve_max_tokens(10**9, 0, SlotRule(64), max_tokens=640, page_size=64), 640)

    def test_each_region_matches_brute_force(self):
        ctx, cell = 4096, 1000  # half: T < 4096; floor: T <= 16384; linear: < 32768; cap above
        cost = SlotCost(fixed_bytes=12345, per_slot_bytes=777, per_graph_bs_bytes=50, cuda_graph_max_bs=300)
        rule = SlotRule(ctx)
        for target, regime in ((3000, "half"), (10_000, "floor"), (24_000, "linear"), (50_000, "cap")):
            budget = total_bytes(target, cell, rule, cost) + 999
            t = solve_max_tokens(budget, cell, rule, cost)
            self.assertEqual(t, brute_force(budget, cell, rule, cost, 1))
            self.assertEqual(rule.regime(t), regime, (target, t))


class TestSolverProperties(unittest.TestCase):
    @PROPERTY_SETTINGS
    @given(
        ctx=st.integers(64, 4096),
        cell=st.integers(1, 4096),
        per_slot=st.integers(0, 200_000),
        fixed=st.integers(0, 10**7),
        per_graph=st.integers(0, 50_000),
        graph_bs=st.sampled_from([0, 8, 256, 512]),
        page=st.sampled_from([1, 2, 16, 64, 256]),
        user_r=st.one_of(st.none(), st.integers(1, 5000)),
        scale=st.floats(0.0, 12.0),
        slack=st.integers(0, 10**6),
        cap=st.one_of(st.none(), st.integers(1, 60_000)),
    )
    def test_solved_tokens_are_the_largest_feasible(self, ctx, cell, per_slot, fixed, per_graph, graph_bs, page,
                                                    user_r, scale, slack, cap):
        rule = SlotRule(ctx, user_r)
        cost = SlotCost(fixed, per_slot, per_graph, graph_bs)
        target = int(scale * ctx)  # 0..12 contexts: covers half, floor (< 4 ctx), linear (4-8 ctx) and cap
        budget = total_bytes(target, cell, rule, cost) + slack
        t = solve_max_tokens(budget, cell, rule, cost, page, cap)
        self.assertEqual(t % page, 0)
        self.assertEqual(t, brute_force(budget, cell, rule, cost, page, cap))
        if t or total_bytes(0, cell, rule, cost) <= budget:
            self.assertLessEqual(total_bytes(t, cell, rule, cost), budget)
        if cap is None or t + page <= cap:
            self.assertGreater(total_bytes(t + page, cell, rule, cost), budget)

    @PROPERTY_SETTINGS
    @given(ctx=st.integers(8, 64), cell=st.integers(1, 64), per_slot=st.integers(0, 5000),
           page=st.sampled_from([1, 4, 8]), budget=st.integers(0, 400_000), user_r=st.one_of(st.none(), st.integers(1, 40)))
    def test_small_rule_constants(self, ctx, cell, per_slot, page, budget, user_r):
        """Same property with a scaled-down rule (min 16, max 32 slots) so all regions occur at small T."""
        rule = SlotRule(ctx, user_r, slots_per_context=4, min_slots=16, max_slots=32)
        cost = SlotCost(per_slot_bytes=per_slot)
        t = solve_max_tokens(budget, cell, rule, cost, page)
        self.assertEqual(t, brute_force(budget, cell, rule, cost, page))


if __name__ == "__main__":
    unittest.main()
