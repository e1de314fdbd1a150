"""benchmark/plan_zoo.py, the zoo table of issue 40, run as a user runs it (a subprocess, offline) on two published
configs and a config of an architecture the planner does not know. Reference: `sglang plan --json` on each card."""

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys

import pytest

from sglang.cli.plan import main as plan_main
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=12, suite="cpu")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
FIXTURES = os.path.join(ROOT, "test", "registered", "mem_plan", "fixtures")
ZOO = os.path.join(ROOT, "benchmark", "plan_zoo.py")
MODELS = ("llama-3.1-8b", "gpt-oss-20b")  # one dense model, one with sliding-window layers
CARDS = ("h100-80gb", "h200", "mi300x")


def plan_json(model_dir, gpu):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        plan_main(["--model-path", model_dir, "--gpu", gpu, "--json"])
    return json.loads(buf.getvalue())


def n(value):
    return f"{value:,}" if value else "-"


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo")
    for m in MODELS:
        shutil.copytree(os.path.join(FIXTURES, m), root / m)
    cfg = json.loads((root / MODELS[0] / "config.json").read_text())
    (root / "frobnicator").mkdir()
    (root / "frobnicator" / "config.json").write_text(json.dumps({**cfg, "model_type": "frobnicator",
                                                                   "architectures": ["FrobForCausalLM"]}))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    r = subprocess.run([sys.executable, ZOO, "--fixtures", str(root)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stdout.splitlines() if l.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [dict(zip(head, (c.strip() for c in l.strip("|").split("|")))) for l in lines[2:]]
    return root, rows


def test_a_row_per_model_and_card_as_sglang_plan_says(table):
    root, rows = table
    by_key = {(r["model"], r["card"]): r for r in rows}
    for m in MODELS:
        for gpu in CARDS:
            row, ref = by_key[(m, gpu)], plan_json(str(root / m), gpu)
            assert ref["fits"] and row["fits"] == "yes"
            p, up = ref["plan"], ref["upstream"]
            assert row["model_type"] == ref["model_type"]
            assert row["params (B)"] == f"{ref['num_params'] / 1e9:.2f}"
            assert row["full KV tokens"] == f"{p['max_total_num_tokens']:,}"
            assert row["windowed tokens"] == n(p["windowed_tokens"])
            assert row["state slots"] == n(p["state_slots"])
            assert row["slots"] == f"{p['max_running_requests']:,}"
            assert row["full-context requests"] == f"{p['full_context_requests']:,}"
            assert row["upstream KV tokens"] == f"{up['max_total_num_tokens']:,}"
            assert row["upstream SWA tokens"] == n(up["swa_tokens"])
            assert row["upstream state slots"] == n(up["mamba_cache_slots"])
    # the sliding-window model has a windowed pool, the dense one none
    assert by_key[("gpt-oss-20b", "h200")]["windowed tokens"] != "-"
    assert by_key[("llama-3.1-8b", "h200")]["windowed tokens"] == "-"


def test_a_refused_model_gets_one_row_with_the_refusal(table):
    _, rows = table
    refused = [r for r in rows if r["model"] == "frobnicator"]
    assert len(refused) == 1 and refused[0]["card"] == ", ".join(CARDS)
    assert refused[0]["fits"].startswith("refused: model_type 'frobnicator'") and "llama" in refused[0]["fits"]
    assert len(rows) == len(MODELS) * len(CARDS) + 1


def upstream_room(ref):
    """Upstream's static region less the weights: floor(y x pre) - weights (the budget equation's KV share)."""
    weights = next(t["num_bytes"] for t in ref["plan"]["terms"] if t["name"] == "weights")
    return int(ref["upstream"]["mem_fraction_static"] * ref["pre_load_free_bytes"]) - weights


def test_upstream_splits_hybrid_pools_with_its_default_ratios():
    # sliding-window layers: --swa-full-tokens-ratio 0.8, a full token costs F + 0.8 S (page 1)
    ref = plan_json(os.path.join(FIXTURES, "gpt-oss-20b"), "h100-80gb")
    p, up = ref["plan"], ref["upstream"]
    full = int(upstream_room(ref) / (p["kv_cell_bytes"] + 0.8 * p["windowed_cell_bytes"]))
    assert (up["max_total_num_tokens"], up["swa_tokens"], up["mamba_cache_slots"]) == (full, int(0.8 * full), 0)
    # Mamba-2 layers: --mamba-full-memory-ratio 0.9 of the room to K state slots, the rest less K + 1 slots to KV
    ref = plan_json(os.path.join(FIXTURES, "nemotron-h-8b-base-8k"), "h100-80gb")
    p, up = ref["plan"], ref["upstream"]
    room, state = upstream_room(ref), p["state_bytes_per_slot"]
    k = int(room * 0.9 / 1.9) // state
    assert up["mamba_cache_slots"] == k and up["swa_tokens"] == 0
    assert up["max_total_num_tokens"] == (room - (k + 1) * state) // p["kv_cell_bytes"]
    assert up["max_running_requests"] == k // 3


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
