"""`sglang plan` predicts a real start of a MoE checkpoint: the KV pool within 3%, and the activation peak the start
measures over its worst-case chunk (the profile forward at the chunked-prefill size: 2,048 tokens on CPU, the
tiny checkpoint's 1,024-token context) under the
activations the dry run planned (mem_plan/moe_activations.py: routing temporaries and the experts' first-call state).

Checkpoints: the random Qwen3-MoE of moe_fixtures (hidden 64, 8 experts, top 2) in fp32 (the torch experts) and bf16
(the sgl-kernel experts where they load, else torch), and issue 21's benchmark proportions (hidden 1024, 64 experts,
top 8, expert intermediate 256; 2 layers, vocabulary 512) in bf16. Each start runs in a fresh process (as `sglang
serve` does: no earlier work warmed its heap) with its own startup cache, so the peak is measured, not reused. Every
other term equals the dry run's byte for byte, the measured weights within 10% of their formula (2 MiB for the tiny
checkpoint, whose load residual outweighs its tensors).
Measured on a 2-core AVX-512 BF16 EPYC (peak / planned): tiny fp32 13-14 / 43.3 MB, tiny bf16 16 / 21.9 MB,
benchmark-proportion bf16 71-85 / 113.1 MB (16 layers: 74-85 / 113.1 MB; fp32 110-129 / 219.9 MB).
"""

import contextlib
import io
import json
import os
import subprocess
import sys

import pytest

from sglang.cli.plan import main as plan_main
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.moe_fixtures import make_benchmark_qwen3_moe, make_random_qwen3_moe

register_cpu_ci(est_time=30, suite="cpu")

KV_TOKENS_TOLERANCE = 0.03
MEASURED_TOLERANCE = 0.10
# On CPU the measured weights are the RSS the load added: the tensors plus what first-touched library code and allocator
# state cost, which the formula prices as one constant (model_shapes.CPU_LOAD_RESIDUAL_BYTES, 10 MiB). That residual
# moves with the installed libraries (8.9-9.4 MiB over the tiny checkpoint's 0.6 MB of bf16 tensors with transformers
# 5.24, 2026-11), so a model this small is held to the residual's spread, not to 10% of a total it dominates.
RESIDUAL_SPREAD_BYTES = 2 * 2**20
CASES = {  # name: (checkpoint, dtype, --max-total-memory-gb)
    "tiny-fp32": ("tiny", "float32", 0.5),
    "tiny-bf16": ("tiny", "bfloat16", 0.5),
    "benchmark-proportions-bf16": ("benchmark", "bfloat16", 1.0),
}

SERVE = """
import json, sys
import sglang
engine = sglang.Engine(log_level="warning", skip_tokenizer_init=True, random_seed=0, **json.loads(sys.argv[1]))
try:
    out = engine.generate(input_ids=[5, 6, 7, 8], sampling_params={"max_new_tokens": 4, "temperature": 0})
    assert len(out["output_ids"]) == 4
    info = engine.get_server_info()
    rank = info["memory_plan_per_rank"][0]
    print("PLAN=" + json.dumps(dict(info["memory_plan"], measured_activation_bytes=rank["activation_bytes"],
                                    activation_source=rank["activation_source"])))
finally:
    engine.shutdown()
"""


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe_plan")
    return {"tiny": make_random_qwen3_moe(str(root / "tiny")),
            "benchmark": make_benchmark_qwen3_moe(str(root / "benchmark"), num_layers=2, vocab_size=512)}


def served_plan(tmp_path, **kwargs) -> dict:
    env = dict(os.environ, SGLANG_STARTUP_CACHE_DIR=str(tmp_path / "startup-cache"))
    out = subprocess.run([sys.executable, "-c", SERVE, json.dumps(kwargs)], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("PLAN=")][-1]
    return json.loads(line[len("PLAN="):])


def dry_run(*flags) -> dict:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        status = plan_main(["--device", "cpu", *flags, "--json"])
    out = json.loads(buf.getvalue())
    assert status == 0, out
    return out["plan"]


def terms(plan: dict) -> dict:
    return {t["name"]: t for t in plan["terms"]}


@pytest.mark.parametrize("case", list(CASES))
def test_plan_matches_a_real_start(case, checkpoints, tmp_path):
    name, dtype, cap_gb = CASES[case]
    path = checkpoints[name]
    served = served_plan(tmp_path, model_path=path, dtype=dtype, max_total_memory_gb=cap_gb)
    planned = dry_run("--model-path", path, "--dtype", dtype, "--max-total-memory-gb", str(cap_gb))
    got, want = terms(served), terms(planned)
    assert list(got) == list(want)
    assert got["moe_workspace"]["num_bytes"] > 0
    # the worst-case chunk: the start measured its peak now, over a forward of the planned chunk (the CPU default
    # 2,048 tokens, or the context where shorter: the tiny checkpoint's 1,024)
    assert served["chunked_prefill_size"] == planned["chunked_prefill_size"] == min(2048, planned["context_len"])
    assert served["activation_source"] == "measured"
    measured, planned_act = served["measured_activation_bytes"], want["activations"]["num_bytes"]
    print(f"{case}: activation peak {measured / 2**20:.1f} MiB <= planned {planned_act / 2**20:.1f} MiB; KV tokens "
          f"start {served['max_total_num_tokens']:,} plan {planned['max_total_num_tokens']:,}")
    assert 0 < measured <= planned_act, (measured, planned_act)
    for term, t in got.items():
        if term == "kv_cache":
            continue
        if t["source"] == "measured":  # the weights (and CUDA graphs: none on a CPU) against their formulas
            assert want[term]["source"] == "formula"
            allowed = max(MEASURED_TOLERANCE * t["num_bytes"], RESIDUAL_SPREAD_BYTES)
            assert abs(t["num_bytes"] - want[term]["num_bytes"]) <= allowed, (term, t["num_bytes"], want[term])
        else:  # declared terms, and the activations' formula over the smaller peak: the same function on both sides
            assert (t["source"], t["num_bytes"], t["detail"]) == (want[term]["source"], want[term]["num_bytes"],
                                                                  want[term]["detail"]), term
    t_served, t_planned = served["max_total_num_tokens"], planned["max_total_num_tokens"]
    assert abs(t_served - t_planned) <= KV_TOKENS_TOLERANCE * t_served, (t_served, t_planned)
