"""Helpers for speculative-decoding engine tests."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def spec_off(engine):
    """The engine decodes without speculation inside the block (its SpecDecoder swapped out; call while idle), so one
    engine gives both sides of a comparison."""
    s = engine.scheduler
    saved, s.runner.spec = s.runner.spec, None
    try:
        yield
    finally:
        s.runner.spec = saved


@contextlib.contextmanager
def uncapped_verify_budget():
    """Plan and build an Engine without the CPU's cap on a verify forward's rows (spec_sizes.CPU_VERIFY_TOKEN_BUDGET),
    as a GPU plans it: the policy's budget holds every slot's whole tree, and the plan gives the request table the
    branch rows for that (spec_sizes.branch_rows). For tests whose requests all propose every step (always_propose):
    under the CPU cap the table has rows for one or two trees a step. Wraps the construction only (the plan and the
    SpecDecoder's budget are fixed there)."""
    from sglang.srt.mem_plan import spec_sizes

    saved = spec_sizes.CPU_VERIFY_TOKEN_BUDGET
    spec_sizes.CPU_VERIFY_TOKEN_BUDGET = 0
    try:
        yield
    finally:
        spec_sizes.CPU_VERIFY_TOKEN_BUDGET = saved


def assert_plan_matches_start(test, flags, tolerance: float = 0.03):
    """`sglang plan --device cpu --json` with `flags` (serve flags, --model-path included) against a real
    sglang.Engine started with the same flags: the draft's pool == the start plan's draft_kv_cache term, its weights
    <= draft_weights, and the start's KV tokens within `tolerance` of the dry run's. Returns (the start's
    MemoryPlan, the dry run's plan dict, the running engine: the caller shuts it down with engine_fixtures.shutdown,
    which the returned engine is registered for through test.addCleanup)."""
    from sglang import Engine
    from sglang.cli.plan import run
    from sglang.srt.server_args import prepare_server_args
    from sglang.test.engine_fixtures import shutdown

    status, result, _ = run(["--device", "cpu", *flags, "--json"])
    test.assertEqual(status, 0, result)
    dry = result["plan"]
    engine = Engine(server_args=prepare_server_args([*flags, "--log-level", "warning"]))
    test.addCleanup(shutdown, engine)
    runner = engine.scheduler.model_runner
    plan, draft = runner.memory_plan, runner.draft_runner
    test.assertEqual(draft.kv_bytes(), plan.bytes_of("draft_kv_cache"))
    test.assertLessEqual(draft.weight_bytes, plan.bytes_of("draft_weights"))
    ratio = plan.max_total_num_tokens / dry["max_total_num_tokens"]
    test.assertLess(abs(ratio - 1), tolerance, (plan.max_total_num_tokens, dry["max_total_num_tokens"]))
    return plan, dry, engine
