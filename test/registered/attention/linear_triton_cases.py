"""The Triton linear-attention kernels (triton_ops/causal_conv1d.py, triton_ops/gated_delta_rule.py) on small shapes,
run by test_triton_linear_interpreted.py in a child process with TRITON_INTERPRET=1 (interpreted_run.py says why).
Prints one line RESULT_JSON:{case: max abs error}, each case against the fp64 loops of linear_reference.py and, for
decode, the torch form. Not a test file."""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from linear_reference import conv_inputs, conv_reference, gdr_inputs, gdr_reference  # noqa: E402

from sglang.srt.layers.attention.linear.causal_conv1d import causal_conv1d_decode_torch  # noqa: E402
from sglang.srt.layers.attention.linear.gated_delta_rule import gated_delta_rule_decode_torch  # noqa: E402
from sglang.srt.layers.attention.triton_ops.interpreter_blas import use_single_threaded_blas  # noqa: E402

RESULT_PREFIX = "RESULT_JSON:"


def err(a, b) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def conv_cases(out: dict) -> None:
    from sglang.srt.layers.attention.triton_ops.causal_conv1d import (
        causal_conv1d_decode_triton,
        causal_conv1d_extend_triton,
    )

    lens = [1, 2, 3, 9, 0, 20]  # shorter than, equal to and longer than the K - 1 = 3 carried columns
    has = torch.tensor([True, False, True, True, True, False])
    for kernel, bias, act in [(4, True, "silu"), (4, False, None)]:
        x, w, b, state = conv_inputs(lens, 70, kernel, seed=kernel + bias)  # 70 channels: two channel blocks
        b = b if bias else None
        stale = state.clone()
        stale[~has] = float("nan")  # has_initial_state False: the row is never read
        y, s = causal_conv1d_extend_triton(x, w, b, stale, has, lens, act)
        ref_y, ref_s = conv_reference(x, w, b, state, has, lens, act)
        out[f"conv_extend|K{kernel}|bias{bias}|{act}|y"] = err(y, ref_y)
        out[f"conv_extend|K{kernel}|bias{bias}|{act}|state"] = err(s, ref_s)
        dy, ds = causal_conv1d_decode_triton(x[:6], w, b, state, act)
        ty, ts = causal_conv1d_decode_torch(x[:6], w, b, state, act)
        out[f"conv_decode|K{kernel}|bias{bias}|{act}|y"] = err(dy, ty)
        out[f"conv_decode|K{kernel}|bias{bias}|{act}|state"] = err(ds, ts)
    # one prompt cut at 1, 2 (inside the window) and 7 == the fp64 whole
    x, w, b, state = conv_inputs([12], 70, 4, seed=9)
    one = torch.tensor([True])
    ys, s = [], state
    for a, c in [(0, 1), (1, 2), (2, 7), (7, 12)]:
        y, s = causal_conv1d_extend_triton(x[a:c], w, b, s, one, [c - a], "silu")
        ys.append(y)
    ref_y, ref_s = conv_reference(x, w, b, state, one, [12], "silu")
    out["conv_cut|y"] = err(torch.cat(ys), ref_y)
    out["conv_cut|state"] = err(s, ref_s)
    bx, bw, bb, bstate = conv_inputs([3, 5], 70, 4, seed=10, dtype=torch.bfloat16)
    y, s = causal_conv1d_extend_triton(bx, bw, bb, bstate, torch.tensor([True, True]), [3, 5], "silu")
    ref_y, ref_s = conv_reference(bx, bw, bb, bstate, torch.tensor([True, True]), [3, 5], "silu")
    out["conv_bf16|y"] = err(y, ref_y)
    out["conv_bf16|state"] = err(s, ref_s)
    out["conv_bf16|dtypes"] = float(y.dtype != torch.bfloat16 or s.dtype != torch.bfloat16)


def gdr_cases(out: dict) -> None:
    from sglang.srt.layers.attention.triton_ops.gated_delta_rule import (
        gated_delta_rule_decode_triton,
        gated_delta_rule_extend_triton,
    )

    lens = [1, 17, 0, 33]  # 1, 2, 0, 3 chunks of 16
    has = torch.tensor([True, False, True, True])
    scale = 16 ** -0.5
    for n_qk, l2 in [(2, True), (4, False)]:
        q, k, v, g, beta, state = gdr_inputs(lens, 4, n_qk, 16, 32, seed=n_qk)
        if not l2:  # unnormalized keys: keep the delta rule contractive
            k = k * 0.25
        stale = state.clone()
        stale[~has] = float("nan")
        o, s = gated_delta_rule_extend_triton(q, k, v, g, beta, stale, has, lens, scale, l2, 16)
        ref_o, ref_s = gdr_reference(q, k, v, g, beta, state, has, lens, scale, l2)
        out[f"gdr_extend|qk{n_qk}|l2{l2}|o"] = err(o, ref_o)
        out[f"gdr_extend|qk{n_qk}|l2{l2}|state"] = err(s, ref_s)
        if l2:  # the comparison can fail: the same kernel without the l2norm the reference applies
            o_bad, _ = gated_delta_rule_extend_triton(q, k, v, g, beta, stale, has, lens, scale, False, 16)
            out["broken|gdr_extend_without_l2norm"] = err(o_bad, ref_o)
        do, ds = gated_delta_rule_decode_triton(q[:4], k[:4], v[:4], g[:4], beta[:4], state, scale, l2)
        to, ts = gated_delta_rule_decode_torch(q[:4], k[:4], v[:4], g[:4], beta[:4], state, scale, l2)
        out[f"gdr_decode|qk{n_qk}|l2{l2}|o"] = err(do, to)
        out[f"gdr_decode|qk{n_qk}|l2{l2}|state"] = err(ds, ts)
    # one prompt of 40 cut at 5 and 21 (inside and across chunks of 16) == the fp64 whole
    q, k, v, g, beta, state = gdr_inputs([40], 4, 2, 16, 32, seed=7)
    one = torch.tensor([True])
    outs, s = [], state
    for a, c in [(0, 5), (5, 21), (21, 40)]:
        o, s = gated_delta_rule_extend_triton(q[a:c], k[a:c], v[a:c], g[a:c], beta[a:c], s, one, [c - a], scale,
                                              True, 16)
        outs.append(o)
    ref_o, ref_s = gdr_reference(q, k, v, g, beta, state, one, [40], scale, True)
    out["gdr_cut|o"] = err(torch.cat(outs), ref_o)
    out["gdr_cut|state"] = err(s, ref_s)


def dispatch_cases(out: dict) -> None:
    """The public ops with their device test forced to 'GPU': the arguments reach the Triton wrappers in order."""
    from sglang.srt.layers.attention.linear import causal_conv1d as conv_op
    from sglang.srt.layers.attention.linear import gated_delta_rule as gdr_op

    lens, has = [2, 5], torch.tensor([True, False])
    x, w, b, state = conv_inputs(lens, 20, 4, seed=11)
    q, k, v, g, beta, s0 = gdr_inputs(lens, 2, 1, 16, 16, seed=12)
    args = {
        "conv_extend": (conv_op.causal_conv1d_extend, (x, w, b, state, has, lens, "silu")),
        "conv_decode": (conv_op.causal_conv1d_decode, (x[:2], w, b, state, "silu")),
        "gdr_extend": (gdr_op.gated_delta_rule_extend, (q, k, v, g, beta, s0, has, lens, 0.25, True, 16)),
        "gdr_decode": (gdr_op.gated_delta_rule_decode, (q[:2], k[:2], v[:2], g[:2], beta[:2], s0, 0.25, True)),
    }
    torch_runs = {name: fn(*a) for name, (fn, a) in args.items()}
    for module in (conv_op, gdr_op):
        module._uses_triton = lambda _x: True
    for name, (fn, a) in args.items():
        ran = fn(*a)
        out[f"dispatch|{name}"] = max(err(r, t) for r, t in zip(ran, torch_runs[name]))


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    use_single_threaded_blas()
    result: dict = {}
    conv_cases(result)
    gdr_cases(result)
    dispatch_cases(result)
    print(RESULT_PREFIX + json.dumps(result))
