"""Windowed KV and linear-state pools (mem_plan/layer_pools.py), solved with the request slots (issue 40).

References independent of the planner: K/V bytes per layer and state bytes per request written out by hand from the
published configs; the windowed bound checked against a page-by-page simulation of requests prefilled in chunks and
decoded; the solve checked against a brute-force search over every pool size with the slot rules re-written here.
"""

import dataclasses
import os
import random
import unittest

from sglang.srt.mem_plan import MemoryPlanError, PlanInputs, plan_memory
from sglang.srt.mem_plan import build as B
from sglang.srt.mem_plan.arch_spec import StateTensor
from sglang.srt.mem_plan.gpu_presets import get_gpu_preset
from sglang.srt.mem_plan.layer_pools import NO_LAYER_POOLS, LayerPools, PoolCost, split_kv_cell
from sglang.srt.mem_plan.model_shapes import ModelShape, model_shape_from_config, model_shape_from_path
from sglang.srt.mem_plan.slots import SlotRule
from sglang.srt.mem_plan.solver import SlotCost, solve_max_tokens
from sglang.srt.mem_plan.specs import KVCellSpec
from sglang.srt.mem_plan.text_shape import TextShape
from sglang.srt.server_args import ServerArgs
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="cpu")  # 15-25 s measured on the shared 2 cores

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
BF16 = 2


def text(model_type, layers, kv_heads, head_dim, kinds, **kw) -> TextShape:
    base = dict(architectures=(), num_layers=layers, hidden_size=kw.pop("hidden", 4096), num_q_heads=32,
                num_kv_heads=kv_heads, head_dim=head_dim, vocab_size=kw.pop("vocab", 32000),
                intermediate_size=kw.pop("intermediate", 14336), max_position_embeddings=kw.pop("ctx", 131072),
                tie_word_embeddings=False, dtype="bfloat16")
    return TextShape(model_type=model_type, layer_kinds=kinds, **base, **kw)


# published geometry (config.json of each model)
GEMMA3_27B = text("gemma3_text", 62, 16, 128, tuple("full" if i % 6 == 5 else "sliding" for i in range(62)),
                  sliding_window=1024, hidden=5376, vocab=262208, intermediate=21504)  # sliding_window_pattern 6
GPT_OSS_120B = text("gpt_oss", 36, 8, 64, tuple("sliding" if i % 2 == 0 else "full" for i in range(36)),
                    sliding_window=128)  # layer_types alternate sliding_attention / full_attention
LLAMA4_SCOUT = text("llama4_text", 48, 8, 128, tuple("full" if i % 4 == 3 else "chunked" for i in range(48)),
                    attention_chunk_size=8192)  # no_rope_layers: every 4th layer global
# Qwen3-Next-80B-A3B: linear_num_key_heads 16, linear_num_value_heads 32, head dims 128, conv kernel 4
QN_NK, QN_NV, QN_DK, QN_DV, QN_K = 16, 32, 128, 128, 4
QWEN3_NEXT = text("qwen3_next", 48, 2, 256, tuple("full" if i % 4 == 3 else "linear" for i in range(48)),
                  state_tensors=(StateTensor("conv_qk", QN_NK, 2 * QN_DK * (QN_K - 1), "bfloat16"),
                                 StateTensor("conv_v", QN_NV, QN_DV * (QN_K - 1), "bfloat16"),
                                 StateTensor("recurrent", QN_NV, QN_DK * QN_DV, "float32")))


def qwen3_next_state_by_hand(tp: int) -> int:
    """36 linear layers x (causal-conv state over the q, k, v channels for kernel - 1 steps in bf16 + the fp32
    recurrent state [value heads, dk, dv]), heads split over the ranks."""
    nk, nv = -(-QN_NK // tp), -(-QN_NV // tp)
    conv_channels = 2 * nk * QN_DK + nv * QN_DV
    return 36 * (conv_channels * (QN_K - 1) * 2 + nv * QN_DK * QN_DV * 4)


def split(shape: TextShape, tp: int = 1, kv: int = BF16):
    return split_kv_cell(shape, KVCellSpec(shape.num_layers, kv, shape.num_kv_heads, shape.head_dim, tp_size=tp), tp)


class TestBytesByHand(unittest.TestCase):
    def test_gemma3_27b(self):
        for tp, heads in ((1, 16), (2, 8), (32, 1)):  # tp 32 > 16 KV heads: replicated, one a rank
            full, pools = split(GEMMA3_27B, tp)
            layer = heads * (128 + 128) * BF16
            self.assertEqual(full.cell_bytes, 10 * layer)
            self.assertEqual((pools.full_layers, pools.sliding_layers, pools.window_tokens), (10, 52, 1024))
            self.assertEqual(pools.windowed_cell_bytes, 52 * layer)
        full, pools = split(GEMMA3_27B)
        self.assertEqual(full.cell_bytes + pools.windowed_cell_bytes, 507_904)  # issue 40: every layer at full
        self.assertEqual(full.cell_bytes, 81_920)  # ... and "past the window a token costs 81,920 B"

    def test_gpt_oss_120b(self):
        full, pools = split(GPT_OSS_120B)
        self.assertEqual(full.cell_bytes, 18 * 8 * 128 * BF16)
        self.assertEqual(pools.windowed_cell_bytes, 18 * 8 * 128 * BF16)
        self.assertEqual((pools.sliding_layers, pools.window_tokens, pools.linear_layers), (18, 128, 0))

    def test_llama4_scout_chunked(self):
        full, pools = split(LLAMA4_SCOUT, tp=4)
        self.assertEqual(full.cell_bytes, 12 * 2 * 256 * BF16)
        self.assertEqual((pools.chunked_layers, pools.sliding_layers, pools.window_tokens), (36, 0, 8192))
        self.assertEqual(pools.windowed_cell_bytes, 36 * 2 * 256 * BF16)

    def test_qwen3_next_state(self):
        for tp in (1, 2, 4, 8):
            full, pools = split(QWEN3_NEXT, tp)
            self.assertEqual(full.cell_bytes, 12 * max(1, 2 // tp) * 512 * BF16)
            self.assertEqual(pools.windowed_cell_bytes, 0)
            self.assertEqual(pools.state_bytes_per_slot, qwen3_next_state_by_hand(tp))
        self.assertEqual(qwen3_next_state_by_hand(1), 77_266_944)

    def test_qwen3_next_fixture_declares_the_same_state(self):
        """D's declaration from the published config.json, against the hand formula (fp32 recurrent state:
        the config has no mamba_ssm_dtype)."""
        shape = model_shape_from_path(os.path.join(FIXTURES, "qwen3-next-80b-a3b-instruct")).text
        for tp in (1, 4):
            full, pools = split(shape, tp)
            self.assertEqual(pools.state_bytes_per_slot, qwen3_next_state_by_hand(tp))
            self.assertEqual((pools.full_layers, pools.linear_layers), (12, 36))

    def test_quantized_cell_splits_scales_too(self):
        whole = KVCellSpec(62, 1, 16, 128, kv_format="fp8_e4m3")
        full, pools = split_kv_cell(GEMMA3_27B, whole)
        self.assertEqual(full.cell_bytes + pools.windowed_cell_bytes, whole.cell_bytes)
        self.assertEqual(full.fixed_bytes + pools.windowed_fixed_bytes, whole.fixed_bytes)

    def test_all_full_is_unchanged(self):
        shape = model_shape_from_path(os.path.join(FIXTURES, "llama-3.1-8b")).text
        cell = KVCellSpec(32, BF16, 8, 128)
        self.assertEqual(split_kv_cell(shape, cell), (cell, NO_LAYER_POOLS))


def simulate_peak(window, page, chunk, num_slots, steps, rng):
    """Largest windowed and full pool (tokens, whole pages) over a random run: each forward either prefills up to
    `chunk` new tokens over some requests or decodes one token for every request. A request of L tokens that gains n
    holds the pages of positions [max(0, L - W), L + n) in the windowed pool and [0, L + n) in the full pool."""
    lens = [0] * num_slots
    peak_w = peak_f = 0
    for _ in range(steps):
        new = [0] * num_slots
        if rng.random() < 0.5:
            budget = chunk
            for i in rng.sample(range(num_slots), num_slots):
                new[i] = rng.randint(0, budget)
                budget -= new[i]
        else:
            new = [1] * num_slots
        held_w = held_f = 0
        for L, n in zip(lens, new):
            lo, hi = max(0, L - window), L + n
            if hi > lo:
                held_w += (-(-hi // page) - lo // page) * page
            held_f += -(-hi // page) * page
        peak_w, peak_f = max(peak_w, held_w), max(peak_f, held_f)
        lens = [L + n for L, n in zip(lens, new)]
    return peak_w, peak_f


class TestWindowedBound(unittest.TestCase):
    def test_simulated_runs_stay_within_the_bound(self):
        rng = random.Random(40)
        for _ in range(300):
            window, page = rng.randint(1, 24), rng.choice([1, 2, 4, 16])
            chunk, slots = rng.randint(1, 40), rng.randint(1, 8)  # decode batches above the chunk too
            peak_w, peak_f = simulate_peak(window, page, chunk, slots, rng.randint(1, 40), rng)
            pools = LayerPools(full_layers=1, sliding_layers=1, window_tokens=window, windowed_cell_bytes=1)
            cost = PoolCost(pools, chunk, page)
            self.assertLessEqual(peak_w, cost.windowed_tokens(10**9, slots), (window, page, chunk, slots))
            self.assertLessEqual(peak_w, peak_f)  # never more windowed tokens than full ones: the min(T, .)

    def test_bound_is_reached(self):
        """Page 1: every slot at its window, then a decode forward: R (W + 1) tokens; or a full chunk: R W + chunk."""
        cost = PoolCost(LayerPools(full_layers=1, sliding_layers=1, window_tokens=1024, windowed_cell_bytes=1), 8192)
        self.assertEqual(cost.windowed_tokens(10**9, 3), 3 * 1024 + 8192)
        self.assertEqual(cost.windowed_tokens(10**9, 10_000), 10_000 * 1025)
        self.assertEqual(cost.windowed_tokens(5000, 3), 5000)

    def test_mistral_per_layer_window_bound(self):
        """Mistral-7B: every layer sliding (4,096): no full pool, and the windowed pool is the token pool -- sized by
        the budget, with upstream's slot rule at a request's most tokens in it (4,096, page 1) for the context."""
        plan = plan_card(MISTRAL_7B, "h100-80gb")
        self.assertFalse(plan.has_full_pool)
        self.assertEqual(plan.kv_cell_bytes, 0)
        self.assertEqual(plan.window_slot_tokens, 4096)
        self.assertEqual(plan.windowed_cell_bytes, 32 * 8 * 256 * BF16)
        T = plan.max_total_num_tokens
        self.assertEqual(plan.windowed_tokens, T)
        R = min(max(T * 512 // 4096, 2048), 4096, T // 2)  # upstream's rule, context 4,096
        self.assertEqual((plan.max_running_requests, R), (4096, 4096))
        self.assertLessEqual(T, 4096 * 4096 + max(8192, 4096))  # never more than 4,096 slots can hold
        self.assertEqual(plan.bytes_of("kv_windowed"), (T + 1) * 32 * 8 * 256 * BF16)
        self.assertLess(plan.headroom_bytes, plan.windowed_cell_bytes)  # one more token would not fit: the most
        self.assertEqual(plan.full_context_requests, T // 4096)
        self.assertGreater(T, 400_000)
        self.assertIn("none -- no layer keeps every token; the windowed pool is the token pool", plan.explain())

def balance_cap(T, cell, window, wcell, state, chunk, page):
    """The balance cap as slots.py states it: the largest R in [1, T // 2] with T_w(T, R) x windowed cell + R x state
    <= T x full cell, or 1; every R tried."""
    ok = [R for R in range(1, T // 2 + 1) if windowed(T, R, window, chunk, page) * wcell + R * state <= T * cell]
    return max(ok, default=1)


def windowed(T, R, window, chunk, page):
    return min(T, -(-(R * (window + 2 * (page - 1)) + max(chunk, R)) // page) * page) if window else 0


def rule_slots(kind, ctx, user, T, cell=0, window=0, state=0, chunk=1, page=1):
    """The slot rules as slots.py's docstring states them, written again (cell, window, state: the balance cap).
    "windowed-pool" (no full layer): upstream's rule with ctx = min(context, window + 2 (page - 1))."""
    if kind == "windowed-pool":
        kind, ctx = "upstream", min(ctx, window + 2 * (page - 1))
    if kind == "context-per-slot":
        return min(user, T // ctx) if user else min(T // ctx, 4096)
    if user:
        return min(user, T // 2)
    if kind == "first-context":
        cap = balance_cap(T, cell, window, 3, state, chunk, page) if cell and (window or state) else 4096
        return min(1 + max(T - ctx, 0) * 512 // ctx, 4096, T // 2, cap)
    return min(max(T * 512 // ctx, 2048), 4096, T // 2)


def brute_force(budget, cell, kind, ctx, user, per_slot, window, chunk, state, page, t_max):
    best = 0
    for T in range(0, t_max + 1, page):
        R = rule_slots(kind, ctx, user, T, cell, window, state, chunk, page)
        win = windowed(T, R, window, chunk, page) + page if window else 0
        slot_map = (T + page) * 4 if window and cell else 0  # int32 token slot -> windowed slot, both pools present
        if T * cell + R * per_slot + win * 3 + slot_map + (R + 1) * state * bool(state) <= budget:
            best = T
    return best


def windowed_pool_cap(user, window, chunk, page):
    """The windowed pool's bound at the slot cap: align_down(align_up(R (W + 2 (P - 1)) + max(chunk, R), P), P)."""
    R = user or 4096
    return -(-(R * (window + 2 * (page - 1)) + max(chunk, R)) // page) * page


class TestSolveVsBruteForce(unittest.TestCase):
    def test_small_integers(self):
        rng = random.Random(7)
        balanced = windowed_pools = 0
        for _ in range(400):
            kind = rng.choice(["first-context", "context-per-slot", "windowed-pool"])
            ctx, page = rng.randint(4, 40), rng.choice([1, 2, 4])
            window, state = rng.choice([0, rng.randint(1, 12)]), rng.choice([0, rng.randint(1, 50)])
            if kind == "context-per-slot":  # every layer linear: no token pool
                window, state = 0, state or 7
            if kind == "windowed-pool":
                window = window or rng.randint(1, 12)
            if not window and not state:
                window = 3
            cell = 0 if kind != "first-context" else rng.randint(1, 9)
            user = rng.choice([None, rng.randint(1, 9)])
            per_slot, chunk = rng.randint(0, 30), rng.randint(1, 16)
            budget = rng.randint(0, 3000)
            cap = (user or 4096) * ctx if kind == "context-per-slot" else None
            if kind == "windowed-pool":
                cap = windowed_pool_cap(user, window, chunk, page)
            t_max = cap if cap is not None else budget // cell
            if kind == "windowed-pool":  # every windowed token costs 3 B and T_w >= T - 1 (checked below)
                t_max = min(cap, budget + page + 1)
            pools = PoolCost(LayerPools(full_layers=int(cell > 0), sliding_layers=int(window > 0),
                                        linear_layers=int(state > 0), window_tokens=window,
                                        windowed_cell_bytes=3 if window else 0, state_bytes_per_slot=state),
                             chunk, page)
            rule = (SlotRule(min(ctx, window + 2 * (page - 1)), user, kind="upstream", pools=pools)
                    if kind == "windowed-pool" else SlotRule(ctx, user, kind=kind, full_cell_bytes=cell, pools=pools))
            got = solve_max_tokens(budget, cell, rule, SlotCost(per_slot_bytes=per_slot), page,
                                   cap // page * page if cap else None, pools)
            want = brute_force(budget, cell, kind, ctx, user, per_slot, window, chunk, state, page,
                               t_max // page * page)
            self.assertEqual(got, want, (kind, ctx, page, window, state, cell, user, per_slot, chunk, budget))
            self.assertEqual(rule.slots(got), rule_slots(kind, ctx, user, got, cell, window, state, chunk, page))
            if kind == "windowed-pool":  # the pool is never more than the slots can hold: T_w = T (window 1, page
                T_w = pools.windowed_tokens(got, rule.slots(got))  # 1: at most a token less)
                self.assertEqual(T_w, got) if window + 2 * (page - 1) >= 2 else self.assertGreaterEqual(T_w, got - 1)
                windowed_pools += 1
            balanced += rule.regime(got) == "balance"
        self.assertGreater(balanced, 20)  # the cap binds in a good share of the solves
        self.assertGreater(windowed_pools, 100)

    def test_one_full_context_before_a_second_slot(self):
        """first-context: whenever one request of the full context fits beside its window, the solve reaches it."""
        ctx, cell, chunk = 64, 5, 16
        pools = PoolCost(LayerPools(full_layers=1, sliding_layers=1, window_tokens=16, windowed_cell_bytes=40), chunk)
        for rule in (SlotRule(ctx, kind="first-context"),  # and with the balance cap (windows 8x the full cell)
                     SlotRule(ctx, kind="first-context", full_cell_bytes=cell, pools=pools)):
            for budget in range(0, 20_000, 37):
                T = solve_max_tokens(budget, cell, rule, SlotCost(per_slot_bytes=100), 1, None, pools)
                one_fits = ctx * cell + 100 + (16 + chunk + 1) * 40 + (ctx + 1) * 4 <= budget  # + the slot map
                self.assertEqual(T >= ctx, one_fits, budget)
                if T < ctx:
                    self.assertLessEqual(rule.slots(T), 1)


MISTRAL_7B = {  # mistralai/Mistral-7B-v0.1 config.json
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
    "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0", "use_cache": True, "vocab_size": 32000}

# Gemma-3-27B's text parameters by hand: embeddings (tied) + 62 x (q, k, v, o, q/k norms, 4 norms, gate/up/down)
GEMMA3_27B_PARAMS = 262208 * 5376 + 62 * (5376 * (4096 + 2 * 2048) + 4096 * 5376 + 2 * 128 + 4 * 5376
                                          + 3 * 5376 * 21504) + 5376


def card_inputs(model, gpu_key: str, weight_bytes=None, **flags) -> PlanInputs:
    gpu = get_gpu_preset(gpu_key)
    shape = model if isinstance(model, ModelShape) else model_shape_from_config(model)
    facts = B.ModelFacts(shape, shape.text.max_position_embeddings, "bfloat16", "bfloat16")
    sa = ServerArgs(attention_backend="flashinfer", **flags)
    device = B.DeviceFacts("cuda", gpu.pre_load_free_bytes, gpu.memory_total_bytes)
    if weight_bytes is None:
        measured = B.formula_terms(sa, facts, device)
    else:
        measured = B.MeasuredTerms(weight_bytes, B.activation_formula_bytes(sa, facts, device),
                                   B.formula_cuda_graph_bytes(B.graph_batch_size(sa, facts, device),
                                                              shape.text.vocab_size))
    return B.build_plan_inputs(sa, facts, device, measured)


def plan_card(model, gpu_key, **kw):
    return plan_memory(card_inputs(model, gpu_key, **kw))


class TestPlans(unittest.TestCase):
    def gemma(self, gpu="h100-80gb", **flags):
        return plan_card(ModelShape(GEMMA3_27B), gpu, weight_bytes=GEMMA3_27B_PARAMS * BF16, **flags)

    def test_gemma3_27b_h100_holds_a_full_context_request(self):
        plan = self.gemma()
        self.assertGreaterEqual(plan.max_total_num_tokens, 131072)
        self.assertGreaterEqual(plan.full_context_requests, 1)
        self.assertEqual(plan.kv_cell_bytes, 81_920)
        R = plan.max_running_requests
        self.assertEqual(plan.windowed_tokens, min(plan.max_total_num_tokens, R * 1024 + 8192))
        self.assertEqual(plan.bytes_of("kv_windowed"), (plan.windowed_tokens + 1) * 425_984)
        # 512 slots a context past the first, capped where the windows would outweigh the full pool (slots.py):
        # (1,024 R + 8,192) x 425,984 <= T x 81,920 while the windows stay below T
        T = plan.max_total_num_tokens
        self.assertEqual(R, min(1 + (T - 131072) * 512 // 131072, (T * 81_920 // 425_984 - 8192) // 1024))
        self.assertGreater(R, 1)
        text = plan.explain()
        for words in ("KV pool (full layers)", "Windowed pool", "10 full, 52 sliding", "Full-context requests"):
            self.assertIn(words, text)
        d = plan.to_dict()
        self.assertEqual(d["full_context_requests"], plan.full_context_requests)
        self.assertEqual(d["windowed_tokens"], plan.windowed_tokens)
        self.assertIn("kv_windowed", [t["name"] for t in d["terms"]])
        # and one more token would not fit (the solve is exact over the pools)
        r = plan_memory(dataclasses.replace(card_inputs(ModelShape(GEMMA3_27B), "h100-80gb",
                                                        weight_bytes=GEMMA3_27B_PARAMS * BF16),
                                            max_total_tokens=plan.max_total_num_tokens + 1))
        self.assertEqual(r.max_total_num_tokens, plan.max_total_num_tokens)

    def test_max_running_requests_wins(self):
        plan = self.gemma(max_running_requests=4)
        self.assertEqual(plan.max_running_requests, 4)
        self.assertEqual(plan.windowed_tokens, 4 * 1024 + 8192)
        self.assertGreater(plan.max_total_num_tokens, self.gemma().max_total_num_tokens)

    def test_explicit_fraction_holds_every_pool_in_the_static_region(self):
        plan = self.gemma(mem_fraction_static=0.93)
        static = plan.bytes_of("weights") + plan.kv_bytes + plan.bytes_of("kv_windowed")
        self.assertLessEqual(static, int(0.93 * plan.budget_bytes))
        more = plan.max_total_num_tokens + 1
        R = SlotRule(131072, kind="first-context").slots(more)
        grown = more * 81_920 + (min(more, R * 1024 + 8192) + 1) * 425_984 + plan.bytes_of("weights") + 81_920
        self.assertGreater(grown, int(0.93 * plan.budget_bytes) - 1)

    def test_explicit_fraction_too_small_for_the_window_says_so(self):
        """At 0.66 the static region holds weights and a chunk of full-layer KV, not the window beside it: the error
        counts the windowed pool, and the value it suggests plans."""
        with self.assertRaises(MemoryPlanError) as cm:
            self.gemma(mem_fraction_static=0.66)
        e = cm.exception
        self.assertEqual(e.direction, "raise")
        self.assertIn("windowed / linear-state pools", str(e))
        plan = self.gemma(mem_fraction_static=e.suggested_value)
        self.assertGreaterEqual(plan.max_total_num_tokens, 8192)  # one chunk
        self.assertEqual(plan.windowed_tokens, min(plan.max_total_num_tokens, plan.max_running_requests * 1024 + 8192))

    def test_invariants_refuse_a_wrong_pool(self):
        plan = self.gemma()
        with self.assertRaises(ValueError):
            dataclasses.replace(plan, windowed_tokens=plan.windowed_tokens + 1)
        with self.assertRaises(ValueError):
            dataclasses.replace(plan, windowed_tokens=plan.max_total_num_tokens + 1)

    def test_qwen3_next_state_pool(self):
        shape = model_shape_from_path(os.path.join(FIXTURES, "qwen3-next-80b-a3b-instruct"))
        plan = plan_card(shape, "mi300x")
        self.assertEqual(plan.state_slots, plan.max_running_requests + 1)
        self.assertEqual(plan.bytes_of("linear_state"), plan.state_slots * qwen3_next_state_by_hand(1))
        self.assertEqual(plan.kv_cell_bytes, 12 * 2 * 512 * BF16)
        self.assertGreaterEqual(plan.full_context_requests, 1)
        self.assertIn("Linear-state pool", plan.explain())

    def test_gemma3_27b_h200_slots_balance_the_windows(self):
        """On an H200 the pool holds ~4 contexts: 512 slots a context would buy ~1,500 windows of 436 MB; the cap keeps
        the windows' bytes to the full pool's."""
        plan = self.gemma("h200")
        T, R = plan.max_total_num_tokens, plan.max_running_requests
        self.assertEqual(R, (T * 81_920 // 425_984 - 8192) // 1024)  # (1,024 R + 8,192) x 425,984 <= T x 81,920
        self.assertEqual(plan.slot_regime, "balance")
        self.assertLess(R, 1 + (T - 131072) * 512 // 131072)
        self.assertGreaterEqual(plan.full_context_requests, 3)
        self.assertEqual(plan.windowed_tokens, min(T, R * 1024 + 8192))

    def test_served_model_plan_has_no_pools(self):
        shape = model_shape_from_path(os.path.join(FIXTURES, "llama-3.1-8b"))
        plan = plan_card(shape, "h100-80gb")
        names = [t.name for t in plan.terms]
        self.assertNotIn("kv_windowed", names)
        self.assertNotIn("linear_state", names)
        self.assertEqual(plan.max_running_requests, SlotRule(131072).slots(plan.max_total_num_tokens))
        self.assertNotIn("Windowed pool", plan.explain())


if __name__ == "__main__":
    unittest.main()
