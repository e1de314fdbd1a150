"""The Triton Mamba-2 SSD kernels (triton_ops/mamba2_ssd.py) on the cases of mamba2_ssd_cases.py, run in a child
process with TRITON_INTERPRET=1 (interpreted_run.py says why) by test_triton_mamba2_interpreted.py. Prints one
RESULT_JSON line: {case: max error relative to the fp64 reference's scale}; 'broken|...' cases must be far off.
Not a test file (run_suite collects test_*.py only).

    TRITON_INTERPRET=1 python triton_mamba2_cases.py
"""

import json
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
RESULT_PREFIX = "RESULT_JSON:"
LENS = [7, 1, 13, 0, 30, 16]


def on(case: dict, device: str) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in case.items()}


def extend_errors(run, case, chunk_size, block, dt_limit=(0.0, math.inf), device="cpu"):
    """Relative error of run(...) (the Triton wrapper, or the dispatching ssd_extend on a GPU) on `case`."""
    from mamba2_ssd_cases import max_rel_error, op_args, reference_scan

    ref_y, ref_state = reference_scan(case, dt_limit)
    kwargs = dict(dt_limit=dt_limit) if block is None else dict(dt_limit=dt_limit, block=block)
    y, state = run(*op_args(on(case, device)), chunk_size, dt_bias=case["dt_bias"].to(device), **kwargs)
    return max(max_rel_error(y.cpu(), ref_y), max_rel_error(state.cpu(), ref_state))


def results() -> dict:
    from mamba2_ssd_cases import make_case, max_rel_error, op_args, reference_scan

    from sglang.srt.layers.attention.triton_ops.interpreter_blas import use_single_threaded_blas
    from sglang.srt.layers.attention.triton_ops.jit_mode import interpreted
    from sglang.srt.layers.attention.triton_ops.mamba2_ssd import ssd_decode_triton, ssd_extend_triton

    assert interpreted()
    use_single_threaded_blas()
    out = {}
    base = make_case(LENS, nh=4, hd=8, ng=2, ns=16)  # rows without an initial state hold NaN
    # a chunk smaller than a tile, a chunk that is not a power of two, two row tiles and several source tiles
    for chunk_size, block in ((8, 16), (12, 16), (32, 16)):
        out[f"extend|fp32|chunk{chunk_size}"] = extend_errors(ssd_extend_triton, base, chunk_size, block)
    odd = make_case([20, 3], nh=6, hd=5, ng=3, ns=12, has_initial=[True, False], seed=1)  # padded dot tiles
    out["extend|fp32|odd_dims|dt_limit"] = extend_errors(ssd_extend_triton, odd, 16, 16, dt_limit=(0.5, 0.9))
    half = make_case([19, 6], seed=2, dtype=torch.float16)
    out["extend|fp16"] = extend_errors(ssd_extend_triton, half, 16, 16)

    # one request extended in two calls (cut inside a chunk), the second from the state the first returned
    whole = make_case([40], has_initial=[True], seed=3)
    ref_y, ref_state = reference_scan(whole)
    ys, state = [], whole["initial_state"]
    for lo, hi in ((0, 13), (13, 40)):
        piece = {k: (v[lo:hi] if k in ("x", "dt", "B", "C") else v) for k, v in whole.items()}
        y, state = ssd_extend_triton(piece["x"], piece["dt"], piece["A"], piece["B"], piece["C"], piece["D"], state,
                                     torch.tensor([True]), [hi - lo], 8, dt_bias=whole["dt_bias"], block=16)
        ys.append(y)
    out["extend|fp32|cut_at_13"] = max(max_rel_error(torch.cat(ys), ref_y), max_rel_error(state, ref_state))

    # decode: three requests stepped token by token from their initial state (or zero)
    steps = make_case([5, 5, 5], nh=4, hd=24, ng=2, ns=16, has_initial=[True, False, True], seed=4)
    ref_y, ref_state = reference_scan(steps)
    state = torch.where(steps["has_initial_state"][:, None, None, None], steps["initial_state"], torch.zeros(()))
    ys = []
    for t in range(5):
        rows = torch.tensor([t, 5 + t, 10 + t])
        y, state = ssd_decode_triton(steps["x"][rows], steps["dt"][rows], steps["A"], steps["B"][rows],
                                     steps["C"][rows], steps["D"], state, dt_bias=steps["dt_bias"])
        ys.append(y)
    got = torch.stack(ys, dim=1).reshape(15, 4, 24)
    out["decode|fp32|steps"] = max(max_rel_error(got, ref_y), max_rel_error(state, ref_state))

    broken = dict(base, A=base["A"] * 1.5)  # the kernel run with a wrong A, compared with the right reference
    ref_y, _ = reference_scan(base)
    y, _ = ssd_extend_triton(*op_args(broken), 8, dt_bias=base["dt_bias"], block=16)
    out["broken|extend_A"] = max_rel_error(y, ref_y)
    return out


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    print(RESULT_PREFIX + json.dumps(results()), flush=True)
