"""The block-fp8 GEMM (layers/quantization/fp8_block_gemm.py) and its linear layers (fp8_block_linear.py) run under
TRITON_INTERPRET=1 in this child process (triton fixes the interpreter mode at its first import, so the test starts
a fresh process); prints one RESULT_JSON line. References are computed here in fp64 from the test's own block
quantization (fp8_block_fixtures.py) and activation quantization (below), not from the kernels' code. Not a test
file (run_suite collects test_*.py only)."""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_block_fixtures import BLOCK, E4M3_MAX, dequantize_reference, quantize_block  # noqa: E402

RESULT_PREFIX = "RESULT_JSON:"
SHAPES = ((1, 128, 128), (5, 200, 300), (33, 256, 384))  # (M, N, K): whole and ragged blocks, several tiles


def act_quant_reference(x: torch.Tensor):
    """(fp8 values, fp32 scales) per token and 128 columns: scale = amax / 448."""
    m, k = x.shape
    groups = -(-k // BLOCK)
    padded = torch.zeros(m, groups * BLOCK)
    padded[:, :k] = x.float()
    scale = (padded.reshape(m, groups, BLOCK).abs().amax(-1) / E4M3_MAX).clamp(min=1e-10)
    q = (x.float() / scale.repeat_interleave(BLOCK, 1)[:, :k]).to(torch.float8_e4m3fn)
    return q, scale


def gemm_reference(x, q, s):
    qa, sa = act_quant_reference(x)
    a = qa.double() * sa.double().repeat_interleave(BLOCK, 1)[:, : x.shape[1]]
    return a @ dequantize_reference(q, s).T


def rel_error(y, ref) -> float:
    return float((y.double() - ref).abs().max() / ref.abs().max())


def kernel_cases() -> dict:
    from sglang.srt.layers.quantization.fp8_block_gemm import (GPU_TILES, INTERPRETER_TILES, block_fp8_linear,
                                                                per_token_group_quant_fp8)

    out = {}
    for m, n, k in SHAPES:
        torch.manual_seed(m + n + k)
        x = torch.randn(m, k) * 2
        q, s = quantize_block(torch.randn(n, k) * 0.05)
        qa, sa = per_token_group_quant_fp8(x, BLOCK)
        rq, rs = act_quant_reference(x)
        out[f"act_quant|{m}x{k}"] = [bool(torch.equal(qa.view(torch.uint8), rq.view(torch.uint8))),
                                     float((sa - rs).abs().max() / rs.abs().max())]
        ref = gemm_reference(x, q, s)
        for name, tiles in (("interpreter", INTERPRETER_TILES), ("gpu", GPU_TILES)):
            out[f"gemm|{name}|{m}x{n}x{k}"] = rel_error(block_fp8_linear(x, q, s, (BLOCK, BLOCK), tiles=tiles), ref)
        out[f"sensitivity|{m}x{n}x{k}"] = rel_error(block_fp8_linear(x, q, 1.0 / s, (BLOCK, BLOCK)), ref)
    return out


def layer_cases() -> dict:
    """QKV, gate/up and down layers built as --quantization fp8 builds them, loaded shard by shard (weight and
    weight_scale_inv through their loaders, as a model's load_weights calls them), forward through the kernels; and
    a gate/up whose halves end inside a block (refused)."""
    from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
    from sglang.srt.layers.quantization import quantization_config
    from sglang.srt.layers.quantization.fp8_block_linear import Fp8BlockLinearMethod

    torch.manual_seed(7)
    hidden, heads, kv_heads, head_dim, inter = 256, 4, 2, 64, 384
    with quantization_config("fp8", "", (BLOCK, BLOCK)):
        qkv = QKVParallelLinear(hidden, head_dim, heads, kv_heads)
        gate_up = MergedColumnParallelLinear(hidden, [inter, inter])
        down = RowParallelLinear(inter, hidden)
        ragged = MergedColumnParallelLinear(hidden, [320, 320])
    out = {"layer|methods": [type(m.quant_method).__name__ == Fp8BlockLinearMethod.__name__
                             for m in (qkv, gate_up, down)]}

    def load(layer, parts):
        dense = []
        for shard_id, rows, cols in parts:
            q, s = quantize_block(torch.randn(rows, cols) * 0.05)
            layer.weight.weight_loader(layer.weight, q, shard_id)
            layer.weight_scale_inv.weight_loader(layer.weight_scale_inv, s, shard_id)
            dense.append(dequantize_reference(q, s))
        return torch.cat(dense)

    cases = ((qkv, [("q", heads * head_dim, hidden), ("k", kv_heads * head_dim, hidden),
                    ("v", kv_heads * head_dim, hidden)], hidden),
             (gate_up, [(0, inter, hidden), (1, inter, hidden)], hidden), (down, [(None, hidden, inter)], inter))
    for layer, parts, cols in cases:
        w = load(layer, parts)
        x = torch.randn(9, cols)
        qa, sa = act_quant_reference(x)
        ref = (qa.double() * sa.double().repeat_interleave(BLOCK, 1)[:, :cols]) @ w.T
        out[f"layer|{type(layer).__name__}"] = [rel_error(layer(x), ref), layer.quant_method.unpacked_reason(layer)]
    try:
        load(ragged, [(0, 320, hidden), (1, 320, hidden)])
        out["layer|ragged_refused"] = ""
    except ValueError as e:
        out["layer|ragged_refused"] = str(e)
    return out


if __name__ == "__main__":
    result = kernel_cases()
    result.update(layer_cases())
    print(RESULT_PREFIX + json.dumps(result))
