"""Runs the Triton fused-MoE kernels in a fresh process with TRITON_INTERPRET=1 (the CPU tests' child process).

triton fixes the interpreter mode of its own library (tl.sum, tl.cumsum, ...) when it is first imported, and in a
test process something else may already have imported it without the variable; so the work runs in a child whose
environment has TRITON_INTERPRET=1 from the start, and prints one JSON line the test reads. Named apart from
attention/interpreted_run.py because pytest imports both by their bare module names. Not a test file.

    python moe_interpreted_run.py    -> {"fused|tiles|dtype|case": rel. error, "align|tiles|block_m|case": [problems],
                                         "workspace|kind|case": rel. error, "sensitivity|swap_gate_up": rel. error,
                                         "seconds|fused" / "seconds|align": wall time of each part}
"""

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULT_PREFIX = "RESULT_JSON:"
ALIGN_BLOCK_MS = (16, 64)
WORKSPACE_KINDS = ("planned", "dict", "separate", "runtime")  # fused_moe_cases.run_case


def run_in_interpreter(timeout_s: float = 300) -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, os.path.join(HERE, "moe_interpreted_run.py")], env=env,
                         capture_output=True, text=True, timeout=timeout_s)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if out.returncode != 0 or not lines:
        raise AssertionError(f"interpreted run failed (rc {out.returncode}):\n{out.stdout[-3000:]}\n"
                             f"{out.stderr[-5000:]}")
    return json.loads(lines[-1][len(RESULT_PREFIX):])


def interpreted_results() -> dict:
    import torch
    from fused_moe_cases import ALIGN_CASES, CASES, alignment_mismatches, run_case

    from sglang.srt.layers.attention.triton_ops.interpreter_blas import use_single_threaded_blas
    from sglang.srt.layers.attention.triton_ops.jit_mode import interpreted
    from sglang.srt.layers.moe.triton_ops.tiles import GPU_TILES, INTERPRETER_TILES

    assert interpreted()
    use_single_threaded_blas()
    tile_sets = (("gpu", GPU_TILES), ("interpreter", INTERPRETER_TILES))
    results = {}
    t0 = time.perf_counter()
    for tiles_name, tiles in tile_sets:
        for dtype in (torch.float32, torch.float16):
            for c in CASES:
                results[f"fused|{tiles_name}|{dtype}|{c['name']}"] = run_case(c, dtype, tiles=tiles)
    for kind in WORKSPACE_KINDS:  # decode, k=1 and the mixed batch in a workspace planned for more tokens
        for c in CASES[:2] + CASES[5:6]:
            results[f"workspace|{kind}|{c['name']}"] = run_case(c, torch.float32, workspace=kind,
                                                                workspace_tokens=c["M"] + 13)
    results["sensitivity|swap_gate_up"] = run_case(CASES[5], torch.float32, swap_gate_up=True)
    t1 = time.perf_counter()
    for tiles_name, tiles in tile_sets:
        for block_m in ALIGN_BLOCK_MS:
            for c in ALIGN_CASES:
                results[f"align|{tiles_name}|{block_m}|{c['name']}"] = alignment_mismatches(c, block_m, tiles)
    results["seconds|fused"], results["seconds|align"] = t1 - t0, time.perf_counter() - t1
    return results


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    print(RESULT_PREFIX + json.dumps(interpreted_results()), flush=True)
