"""quant_linear per ISA level: ms per call on SmolLM2-135M's linear shapes, each level the machine has forced in turn
(set_cpu_isa), Q4_1 (bits 4) and Q8_0 (bits 8), fp32 activations, M = 1 and 32.

Two weight regimes: `hot` calls one weight over and over (it stays in L2: the kernel's compute), `stream` walks a ring
of copies larger than the last-level cache (each call reads its weight from memory, as a decode step does: the
layers' weights together are far larger than the cache). Levels are interleaved repeat by repeat, so a busy neighbour
slows all of them alike; the figure is the median over repeats.

    PYTHONPATH=python python benchmark/bench_quant_linear_isa.py [--repeats 7] [--regime hot stream]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from sglang.jit_kernel.cpu_isa import LEVELS
from sglang.jit_kernel.cpu_ops import get_cpu_ops
from sglang.srt.layers.quantization import packing

SHAPES = (("q/o", 576, 576), ("k/v", 576, 192), ("gate/up", 576, 1536), ("down", 1536, 576))  # (name, K, N)
TYPES = (("Q4_1", packing.GGUF_Q4_1), ("Q8_0", packing.GGUF_Q8_0))
STREAM_BYTES = 96 << 20  # the ring of weight copies in the stream regime (> a 32 MiB L3)


def packed_weight(ggml_type: int, n: int, k: int, rng) -> tuple:
    import gguf.quants as gq

    raw = gq.quantize((rng.standard_normal((n, k)) * 0.05).astype(np.float32), ggml_type)
    staging = packing.staging_from_gguf(torch.from_numpy(raw), ggml_type)
    bits = packing.staging_bits(staging)
    return packing.pack(staging, bits), bits


def time_calls(ops, x, ring, n, bits, calls) -> float:
    """ms per call, the weights taken round-robin from ring."""
    start = time.perf_counter()
    for i in range(calls):
        ops.quant_linear(x, ring[i % len(ring)], n, bits)
    return (time.perf_counter() - start) * 1e3 / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=100, help="calls per timing (M = 1; M = 32 runs a quarter)")
    parser.add_argument("--regime", nargs="+", default=["hot", "stream"], choices=["hot", "stream"])
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 32])
    args = parser.parse_args()
    ops = get_cpu_ops()
    if ops is None or not hasattr(ops, "set_cpu_isa"):
        raise SystemExit("the CPU kernels (with set_cpu_isa) are not available here")
    native = ops.cpu_isa_native()
    levels = [lv for lv in LEVELS[1 : LEVELS.index(native) + 1] if lv != "amx"] or ["avx2"]
    print(f"native {native}; threads {ops.get_num_threads()}; levels {levels}")
    rng = np.random.default_rng(0)
    rows = []
    try:
        for type_name, ggml_type in TYPES:
            for shape_name, k, n in SHAPES:
                packed, bits = packed_weight(ggml_type, n, k, rng)
                for regime in args.regime:
                    copies = max(1, STREAM_BYTES // packed.numel()) if regime == "stream" else 1
                    ring = [packed] + [packed.clone() for _ in range(copies - 1)]
                    for m in args.rows:
                        x = torch.randn(m, k)
                        calls = max(8, args.calls if m == 1 else args.calls // 4)
                        times = {lv: [] for lv in levels}
                        for lv in levels:  # warm-up
                            ops.set_cpu_isa(lv)
                            time_calls(ops, x, ring, n, bits, min(calls, 8))
                        for _ in range(args.repeats):
                            for lv in levels:
                                ops.set_cpu_isa(lv)
                                times[lv].append(time_calls(ops, x, ring, n, bits, calls))
                        med = {lv: statistics.median(t) for lv, t in times.items()}
                        rows.append((type_name, shape_name, k, n, regime, m, med))
                        cells = "  ".join(f"{lv} {med[lv]:.4f}" for lv in levels)
                        ratio = med[levels[-1]] / med["avx2"]
                        print(f"{type_name} {shape_name:8s} K={k:5d} N={n:5d} {regime:6s} M={m:3d}  ms/call: {cells}"
                              f"  avx2 speed vs {levels[-1]}: {ratio:.0%}", flush=True)
                    del ring
    finally:
        ops.set_cpu_isa(native)


if __name__ == "__main__":
    main()
