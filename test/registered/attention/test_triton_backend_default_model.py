"""The default model (SmolLM2-135M) with --attention-backend triton under the Triton interpreter gives the same
greedy tokens as torch_native in fp32 through sglang.Engine: three prompts of different lengths in one batch, four
new tokens each. The triton engine runs in a child process with TRITON_INTERPRET=1 (interpreted_run.py); a small
prefill chunk keeps its startup profile forward short under the interpreter (the default 2048-token chunk costs
minutes there)."""

import json

from interpreted_run import run_engine, run_in_interpreter

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=45, suite="cpu")

PROMPTS = ["The three primary colors are", "def fibonacci(n):", "In mathematics, a prime number is a natural"]
MAX_NEW = 4
# three request slots hold the one batch of three; the startup warm-up runs min(4, slots) requests, and under the
# interpreter each of their decode steps costs a split-KV kernel per layer and request
ENGINE_KW = dict(chunked_prefill_size=64, max_total_memory_gb=2, max_running_requests=3)


def test_default_model_triton_matches_torch_native():
    ref = run_engine(None, "torch_native", ENGINE_KW, [PROMPTS], MAX_NEW)
    got = run_in_interpreter("engine", json.dumps(dict(model_path=None, backend="triton", engine_kwargs=ENGINE_KW,
                                                       batches=[PROMPTS], max_new_tokens=MAX_NEW)))
    ids = [o["output_ids"] for o in got["outputs"][0]]
    assert all(len(o) == MAX_NEW for o in ids)
    assert ids == [o["output_ids"] for o in ref["outputs"][0]]
    assert got["num_retractions"] == 0
    print(f"default model, triton (interpreted): startup {got['startup_s']:.1f} s, generate {got['generate_s']:.1f} s; "
          f"torch_native: startup {ref['startup_s']:.1f} s, generate {ref['generate_s']:.1f} s")
