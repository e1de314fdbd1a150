"""`sglang plan` predicts what a real start allocates: the default model on CPU with --max-total-memory-gb 1, 2 and 4.

For each cap, the dry run (`sglang plan --device cpu` with the same flags and this machine's available RAM) and a
real sglang.Engine start are compared term by term: every formula/declared term byte for byte, the terms the
server measures (weights; activations where the startup peak exceeded the formula) within 10% of the dry run's
formulas, the KV pool within 3%, and exactly the dry run's pool less what the measured terms took beyond their
formulas (the same solver on both sides). The real start
also proves allocation == plan (ModelRunner.check_allocation runs at startup) and, without a cap flag, the CPU
default budget (half of the available RAM) with the cap flags overriding it."""

import contextlib
import io
import json
import subprocess
import sys
import unittest

from sglang.cli.plan import main as plan_main
from sglang.srt.mem_plan.budget import CPU_DEFAULT_AVAILABLE_SHARE
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=100, suite="cpu")

GiB = 2**30
MEASURED_TOLERANCE = 0.10
KV_TOKENS_TOLERANCE = 0.03


def dry_run(*flags) -> dict:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        status = plan_main(["--device", "cpu", *flags, "--json"])
    out = json.loads(buf.getvalue())
    assert status == 0, out
    return out["plan"]


SERVE = """
import json, sys
import sglang
engine = sglang.Engine(log_level="warning", **json.loads(sys.argv[1]))
try:
    out = engine.generate("The capital of France is", {"max_new_tokens": 4, "temperature": 0})
    assert out["meta_info"]["completion_tokens"] >= 1
    info = engine.get_server_info()
    plan = dict(info["memory_plan"], measured_activation_bytes=info["memory_plan_per_rank"][0]["activation_bytes"])
    print("PLAN=" + json.dumps(plan))
finally:
    engine.shutdown()
"""


def served_plan(**kwargs) -> dict:
    """A real start in a fresh process (as `sglang serve` starts: nothing else warmed the heap first)."""
    out = subprocess.run([sys.executable, "-c", SERVE, json.dumps(kwargs)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("PLAN=")][-1]
    return json.loads(line[len("PLAN="):])


def terms(plan: dict) -> dict:
    return {t["name"]: t for t in plan["terms"]}


class TestPlanMatchesServer(unittest.TestCase):
    def check(self, cap_gb: float, kv_tolerance: float = KV_TOKENS_TOLERANCE):
        served = served_plan(max_total_memory_gb=cap_gb)
        planned = dry_run("--max-total-memory-gb", str(cap_gb))
        for key in ("budget_bytes", "kv_cell_bytes", "max_running_requests", "chunked_prefill_size",
                    "cuda_graph_max_bs", "page_size", "context_len", "cap_source"):
            self.assertEqual(served[key], planned[key], key)
        got, want = terms(served), terms(planned)
        self.assertEqual(list(got), list(want))
        for name, term in got.items():
            with self.subTest(cap_gb=cap_gb, term=name):
                if name == "kv_cache":
                    continue
                if term["source"] == "measured":
                    self.assertEqual(want[name]["source"], "formula")
                    self.assertLessEqual(abs(term["num_bytes"] - want[name]["num_bytes"]),
                                         MEASURED_TOLERANCE * max(term["num_bytes"], 1), (term, want[name]))
                else:  # formula / declared: the same function computed it on both sides
                    self.assertEqual(term["source"], want[name]["source"])
                    self.assertEqual(term["num_bytes"], want[name]["num_bytes"], (term, want[name]))
                    self.assertEqual(term["detail"], want[name]["detail"])
        # CPU activations: the formula, guarded by the startup measurement (never below the peak that was seen)
        self.assertGreaterEqual(got["activations"]["num_bytes"], served["measured_activation_bytes"])
        t_served, t_planned = served["max_total_num_tokens"], planned["max_total_num_tokens"]
        # exact accounting: the KV pool is the dry run's, less what the measured terms took beyond their formulas
        excess_bytes = sum(t["num_bytes"] - want[n]["num_bytes"] for n, t in got.items() if n != "kv_cache")
        expected = t_planned - excess_bytes / served["kv_cell_bytes"]
        self.assertLessEqual(abs(t_served - expected), served["page_size"] + 1, (t_served, t_planned, excess_bytes))
        # the prediction: measured terms stay close enough to their formulas that the dry run's pool is near
        self.assertLessEqual(abs(t_served - t_planned), kv_tolerance * t_served, (t_served, t_planned))
        return served

    def test_cap_2_gib(self):
        self.check(2)

    def test_cap_1_gib(self):
        self.check(1)

    def test_cap_4_gib(self):
        self.check(4)

    def test_cpu_default_budget_is_half_the_available_ram(self):
        served = served_plan(max_total_tokens=4096)
        self.assertEqual(served["budget_bytes"], int(served["pre_load_free_bytes"] * CPU_DEFAULT_AVAILABLE_SHARE))
        self.assertIn("CPU default", served["cap_source"])
        self.assertIn("CPU default", served["limited_by"] + served["cap_source"])


class TestCpuActivationTerm(unittest.TestCase):
    def test_formula_unless_the_measured_peak_is_higher(self):
        from sglang.srt.mem_plan.build import cpu_activation_term

        self.assertEqual(cpu_activation_term(100, 90), (100, "formula"))
        self.assertEqual(cpu_activation_term(100, 100), (100, "formula"))
        self.assertEqual(cpu_activation_term(100, 101), (101, "measured"))


class TestCpuDefaultBudgetInTheDryRun(unittest.TestCase):
    def test_rule_and_overrides(self):
        default = dry_run("--total-memory-gb", "24")
        self.assertEqual(default["budget_bytes"], 12 * GiB)
        self.assertEqual(default["limited_by"], default["cap_source"])
        self.assertIn("50% of available RAM", default["cap_source"])
        capped = dry_run("--total-memory-gb", "24", "--max-total-memory-gb", "20")
        self.assertEqual(capped["budget_bytes"], 20 * GiB)
        self.assertEqual(capped["limited_by"], "--max-total-memory-gb")
        pinned = dry_run("--total-memory-gb", "24", "--mem-fraction-static", "0.5")
        self.assertEqual(pinned["budget_bytes"], 24 * GiB)  # an explicit fraction of everything available
        self.assertEqual(pinned["mem_fraction_static_source"], "user")
        self.assertGreater(default["max_total_num_tokens"], 0)


if __name__ == "__main__":
    unittest.main()
