"""Runs Triton work in a fresh process with TRITON_INTERPRET=1, for the CPU tests of the Triton backend.

triton fixes the interpreter mode of its own library (tl.max, tl.sum, ...) when it is first imported, and in a test
process something else (transformers, another test) may already have imported it without the variable. So the
interpreted work runs in a child process whose environment has TRITON_INTERPRET=1 from the start; it prints one
JSON line that the test reads. Not a test file (run_suite collects test_*.py only).

    python interpreted_run.py kernels            -> {case: max abs error}
    python interpreted_run.py page_ids           -> {case: [page ids from the kernel]} (page_id_cases.py)
    python interpreted_run.py kv_quant_kernels   -> {case: max abs error} over quantized pools (kv_quant_triton_cases.py)
    python interpreted_run.py kv_quant_backend   -> the Triton backend over quantized pools (kv_quant_backend_cases.py)
    python interpreted_run.py engine '<json>'    -> run_engine(**json)
"""

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULT_PREFIX = "RESULT_JSON:"


def run_in_interpreter(*args: str, timeout_s: float = 600) -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, os.path.join(HERE, "interpreted_run.py"), *args], env=env,
                         capture_output=True, text=True, timeout=timeout_s)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if out.returncode != 0 or not lines:
        raise AssertionError(f"interpreted run failed (rc {out.returncode}):\n{out.stdout[-3000:]}\n"
                             f"{out.stderr[-5000:]}")
    return json.loads(lines[-1][len(RESULT_PREFIX):])


def run_engine(model_path, backend, engine_kwargs, batches, max_new_tokens):
    """Greedy outputs of each batch (one generate call each, in order) plus the engine's state afterwards. The engine
    starts without the warmup requests (skip_server_warmup, unless engine_kwargs says otherwise): interpreted, they
    cost seconds per layer and step, and they leave the pools, the prefix cache and the counters as they were."""
    from sglang import Engine

    sampling = {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    t0 = time.perf_counter()
    engine = Engine(model_path=model_path, dtype="float32", attention_backend=backend, log_level="warning",
                    **{"skip_server_warmup": True, **engine_kwargs})
    t1 = time.perf_counter()
    try:
        outputs = []
        for batch in batches:
            key = "input_ids" if isinstance(batch[0], list) else "prompt"
            outs = engine.generate(**{key: batch}, sampling_params=sampling)
            outputs.append([{"output_ids": o["output_ids"], "cached_tokens": o["meta_info"]["cached_tokens"]}
                            for o in outs])
        engine.scheduler.check_integrity()
        return {"outputs": outputs, "num_retractions": engine.scheduler.num_retractions,
                "startup_s": t1 - t0, "generate_s": time.perf_counter() - t1}
    finally:
        engine.shutdown()


def kernel_errors() -> dict:
    """Max abs error of every kernel case, keyed 'kind|tiles|dtype|page_size|case index', plus two runs with a wrong
    softmax scale ('sensitivity|...') that must be far off."""
    import torch
    from triton_attention_cases import DECODE_CASES, EXTEND_CASES, run_decode, run_extend

    from sglang.srt.layers.attention.triton_ops.interpreter_blas import use_single_threaded_blas
    from sglang.srt.layers.attention.triton_ops.jit_mode import interpreted
    from sglang.srt.layers.attention.triton_ops.tiles import GPU_TILES, INTERPRETER_TILES

    assert interpreted()
    use_single_threaded_blas()
    errors = {}
    for tiles_name, tiles in (("gpu", GPU_TILES), ("interpreter", INTERPRETER_TILES)):
        for dtype in (torch.float32, torch.float16):
            for page_size in (1, 16):
                for i, c in enumerate(DECODE_CASES):
                    errors[f"decode|{tiles_name}|{dtype}|{page_size}|{i}"] = run_decode(
                        page_size=page_size, dtype=dtype, tiles=tiles, **c)
                for i, c in enumerate(EXTEND_CASES):
                    errors[f"extend|{tiles_name}|{dtype}|{page_size}|{i}"] = run_extend(
                        page_size=page_size, dtype=dtype, tiles=tiles, **c)
        c = dict(seq_lens=[9, 40], num_q_heads=4, num_kv_heads=1, head_dim=32, num_splits=2, v_dim=16)
        errors[f"decode|{tiles_name}|{torch.float32}|16|v_dim"] = run_decode(page_size=16, dtype=torch.float32,
                                                                              tiles=tiles, **c)
    errors["sensitivity|decode"] = run_decode(page_size=1, dtype=torch.float32, scale_error=1.5, **DECODE_CASES[0])
    errors["sensitivity|extend"] = run_extend(page_size=1, dtype=torch.float32, scale_error=1.5, **EXTEND_CASES[0])
    return errors


def kv_quant_kernel_errors() -> dict:
    """Max abs error of the Triton kernels over each quantized pool format, keyed 'kind|tiles|dtype|page_size|fmt',
    plus runs with a wrong V scale in the pool ('sensitivity|kind|fmt') and against a reference that reads the new
    tokens through their codes ('codes_reference|kind|fmt'), both of which must be far off; with a recent window
    ('ring|kind|tiles|dtype|page_size|fmt') and against a reference that reads the ring's tokens through their codes
    ('ring_codes_reference|kind|fmt': far off); with a ring that also holds attention sinks
    ('sinks|kind|tiles|dtype|page_size|fmt') and against a reference that reads the sinks through their codes
    ('sink_codes_reference|kind|fmt': far off)."""
    import torch
    from kv_quant_triton_cases import (DECODE_CASE, EXTEND_CASE, FORMATS, WINDOW_FORMATS, ring_decode_case,
                                       ring_extend_case, run_quant_decode, run_quant_extend, sink_decode_case,
                                       sink_extend_case)

    from sglang.srt.layers.attention.triton_ops.interpreter_blas import use_single_threaded_blas
    from sglang.srt.layers.attention.triton_ops.tiles import GPU_TILES

    use_single_threaded_blas()

    def case_family(tag, fmt, decode_kw, extend_kw, reference_flag):
        """One family of cases of a format: the interpreter's tiles at fp32 / fp16 and page sizes 1 / 16, the GPU
        tiles (several key blocks, splits and query blocks per request), and the same case against the reference
        that reads the family's tokens through their codes (reference_flag: must be far off)."""
        for dtype in (torch.float32, torch.float16):
            for page_size in (1, 16):
                errors[f"{tag}decode|interpreter|{dtype}|{page_size}|{fmt}"] = run_quant_decode(
                    fmt, page_size, dtype, **decode_kw)
                errors[f"{tag}extend|interpreter|{dtype}|{page_size}|{fmt}"] = run_quant_extend(
                    fmt, page_size, dtype, **extend_kw)
        errors[f"{tag}decode|gpu|{torch.float32}|16|{fmt}"] = run_quant_decode(
            fmt, 16, torch.float32, tiles=GPU_TILES, **decode_kw)
        errors[f"{tag}extend|gpu|{torch.float32}|1|{fmt}"] = run_quant_extend(
            fmt, 1, torch.float32, tiles=GPU_TILES, **extend_kw)
        errors[f"{reference_flag}|decode|{fmt}"] = run_quant_decode(
            fmt, 1, torch.float32, **{reference_flag: True}, **decode_kw)
        errors[f"{reference_flag}|extend|{fmt}"] = run_quant_extend(
            fmt, 1, torch.float32, **{reference_flag: True}, **extend_kw)

    errors = {}
    for fmt in FORMATS:
        case_family("", fmt, DECODE_CASE, EXTEND_CASE, "codes_reference")
        errors[f"sensitivity|decode|{fmt}"] = run_quant_decode(fmt, 1, torch.float32, scale_error=1.5, **DECODE_CASE)
        errors[f"sensitivity|extend|{fmt}"] = run_quant_extend(fmt, 1, torch.float32, scale_error=1.5, **EXTEND_CASE)
    for fmt in WINDOW_FORMATS:
        case_family("ring|", fmt, ring_decode_case(fmt), ring_extend_case(fmt), "ring_codes_reference")
        case_family("sinks|", fmt, sink_decode_case(fmt), sink_extend_case(fmt), "sink_codes_reference")
    return errors


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    if sys.argv[1] == "kernels":
        result = kernel_errors()
    elif sys.argv[1] == "kv_quant_kernels":
        result = kv_quant_kernel_errors()
    elif sys.argv[1] == "kv_quant_backend":
        from kv_quant_backend_cases import backend_results

        result = backend_results()
    elif sys.argv[1] == "page_ids":
        from page_id_cases import kernel_page_ids

        result = kernel_page_ids()
    else:
        result = run_engine(**json.loads(sys.argv[2]))
    print(RESULT_PREFIX + json.dumps(result), flush=True)
