"""Microbenchmark of the fused MoE experts on CPU (sgl-kernel/csrc/cpu/moe.h): printed numbers, not a test.

    python benchmark/bench_moe_cpu.py [--tokens 1 32 2048] [--hidden 1024] [--inter 256] [--experts 64] [--topk 8]

Three paths on the same weights and routing (uniform random top-k, softmax weights), median time per call:
- kernel: fused_experts_cpu on weights packed at load (prepack_moe_weights_);
- grouped torch: tokens grouped by expert, one gate/up and one down torch.mm per routed expert (grouped_experts_torch);
- dense torch: every expert over every token (batched matmuls), then the routing weights (zero for unrouted experts).
Weights are cold as in a model's decode step: the calls cycle over --layers copies of the layer (several times the L3).

Bytes read at M = 1 (--no-bytes to skip): the layer's weights are written to a file, evicted from the page cache and
mapped with read-ahead off (MADV_RANDOM); after one call, mincore() counts the 4 KiB pages the call brought in. That is
what the call read, to the page, against the routed experts' bytes (k x 3NK x 2).

--quant q4 q8 (default both): the kernel on block-quantized experts (moe_quant.h; 4-bit records as Q4_0 / Q4_1, 8-bit
as Q8_0 / int8; random blocks: the speed does not depend on the values), same shapes, layers and routings.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import re
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from sglang.jit_kernel.cpu_ops import cpu_kernels_summary, get_cpu_ops
from sglang.srt.layers.moe.fused_moe_cpu import (
    QuantExpertWeights,
    fused_experts_cpu,
    fused_moe_cpu_workspace_bytes,
    grouped_experts_torch,
    pack_quant_experts,
    prepack_moe_weights_,
)
from sglang.srt.layers.quantization import packing
from sglang.srt.mem_plan.quantization_sizes import cpu_packed_bytes

BF16 = torch.bfloat16
MIB = 2**20
ROUTINGS = 7  # routings cycled per token count (prime to the usual layer counts)


def cpu_flags() -> str:
    text = Path("/proc/cpuinfo").read_text()
    model = re.search(r"model name\s*:\s*(.*)", text)
    flags = sorted(set(re.findall(r"\b(avx512[a-z_0-9]*|amx[a-z_0-9]*)\b", text)))
    return f"{model.group(1) if model else '?'}; {' '.join(flags)}; {'AMX' if any(f.startswith('amx') for f in flags) else 'no AMX'}"


def dense_all_experts(hidden, w13, w2, topk_weights, topk_ids):
    """Every expert over every token, then the routing weights: [E, M, 2N] and [E, M, K] intermediates."""
    num_experts, n = w13.shape[0], w2.shape[2]
    gate_up = torch.matmul(hidden.unsqueeze(0), w13.transpose(1, 2))
    act = F.silu(gate_up[..., :n]) * gate_up[..., n:]
    y = torch.bmm(act, w2.transpose(1, 2))
    dense_w = torch.zeros(hidden.shape[0], num_experts).scatter_(1, topk_ids.long(), topk_weights)
    out = torch.zeros(hidden.shape, dtype=torch.float32)
    for e in range(num_experts):
        out += dense_w[:, e : e + 1] * y[e].float()
    return out.to(hidden.dtype)


def routing(m: int, top_k: int, num_experts: int, g: torch.Generator):
    ids = torch.rand(m, num_experts, generator=g).argsort(-1)[:, :top_k].to(torch.int32)
    return torch.softmax(torch.randn(m, top_k, generator=g), -1), ids


def time_calls(fn, layers, routings, min_calls: int, min_seconds: float):
    """(median, min) seconds per call; call i runs layer i % L with routing i % R (R prime to L: every pairing comes
    up, so the routed experts' weights are rarely still cached). One warm-up pass first."""
    for layer in layers:
        fn(*layer, *routings[0])
    times, start = [], time.perf_counter()
    i = 0
    while i < min_calls or time.perf_counter() - start < min_seconds:
        layer, route = layers[i % len(layers)], routings[i % len(routings)]
        t0 = time.perf_counter()
        fn(*layer, *route)
        times.append(time.perf_counter() - t0)
        i += 1
    return statistics.median(times), min(times)


class MappedWeights:
    """A tensor's bytes in a file, out of the page cache, mapped read-only with read-ahead off."""

    def __init__(self, t: torch.Tensor, directory: str):
        self.path = os.path.join(directory, f"w{id(t)}.bin")
        with open(self.path, "wb") as f:
            f.write(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
            f.flush()
            os.fsync(f.fileno())
        self.fd = os.open(self.path, os.O_RDONLY)
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        self.size = os.fstat(self.fd).st_size
        self.map = mmap.mmap(self.fd, self.size, prot=mmap.PROT_READ)
        self.map.madvise(mmap.MADV_RANDOM)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read-only buffer: never written here
            self.tensor = torch.frombuffer(self.map, dtype=t.dtype).view(t.shape)
        for attr in ("vnni_packed",):
            if getattr(t, attr, False):
                setattr(self.tensor, attr, True)

    def resident_bytes(self) -> int:
        pages = (self.size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mincore(ctypes.c_void_p(self.tensor.data_ptr()), ctypes.c_size_t(self.size), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        return sum(v & 1 for v in vec) * mmap.PAGESIZE


def _mapped(w, directory):
    """(MappedWeights, the weights as the call takes them) for a tensor or QuantExpertWeights."""
    if isinstance(w, QuantExpertWeights):
        m = MappedWeights(w.packed, directory)
        return m, QuantExpertWeights(m.tensor, w.bits, w.rows, w.cols)
    m = MappedWeights(w, directory)
    return m, m.tensor


def bytes_read_one_token(fn, w13, w2, hidden, topk_weights, topk_ids, directory) -> int:
    (m13, w13m), (m2, w2m) = _mapped(w13, directory), _mapped(w2, directory)
    maps = [m13, m2]
    try:
        if sum(m.resident_bytes() for m in maps) != 0:
            raise RuntimeError("the page cache kept the weight files: cannot count the bytes read")
        fn(hidden, w13m, w2m, topk_weights, topk_ids)
        return sum(m.resident_bytes() for m in maps)
    finally:
        del w13m, w2m
        for m in maps:
            del m.tensor
            m.map.close()
            os.close(m.fd)
            os.unlink(m.path)


def random_quant_experts(num_experts: int, rows: int, cols: int, bits: int, g: torch.Generator) -> QuantExpertWeights:
    """Random blocks in packing.py's staging form (u below 2^bits, small fp16 d and c), packed."""
    blocks = cols // packing.BLOCK
    u = torch.randint(0, 2**bits, (num_experts, rows, blocks, packing.BLOCK), generator=g, dtype=torch.int32).to(torch.uint8)
    d = (torch.rand(num_experts, rows, blocks, generator=g) * 1e-3).half().float()
    c = (-d * 2 ** (bits - 1)).half().float()
    staging = torch.stack([packing.staging_from_parts(u[e], d[e], c[e]) for e in range(num_experts)])
    return pack_quant_experts(staging, cols, bits)


def print_bytes_read(paths, top_k, e, active_bytes, layer_bytes, hidden, routing_one, directory):
    print(f"M=1, expert weight bytes read per token (pages brought in, mincore) vs the {top_k} routed experts' "
          f"{active_bytes / MIB:.2f} MiB (all {e}: {layer_bytes / MIB:.1f} MiB):")
    for name, (fn, w13, w2) in paths.items():
        nbytes = bytes_read_one_token(fn, w13, w2, hidden, *routing_one, directory)
        print(f"  {name:>13}: {nbytes / MIB:8.2f} MiB = {nbytes / active_bytes:.3f} x routed, "
              f"{nbytes / layer_bytes:.3f} x all experts")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 32, 2048])
    p.add_argument("--hidden", type=int, default=1024, help="K")
    p.add_argument("--inter", type=int, default=256, help="N, the expert intermediate size")
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--layers", type=int, default=4, help="copies of the layer cycled over (cold weights)")
    p.add_argument("--min-seconds", type=float, default=2.0)
    p.add_argument("--skip-dense-above", type=int, default=4096, help="no dense path for more tokens than this")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--quant", nargs="*", default=["q4", "q8"], choices=["q4", "q8"])
    p.add_argument("--no-bytes", action="store_true")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if get_cpu_ops() is None:
        raise SystemExit(f"the CPU kernels are not in use: {cpu_kernels_summary()}")
    k, n, e, top_k = args.hidden, args.inter, args.experts, args.topk
    layer_bytes = e * 3 * n * k * 2
    active_bytes = top_k * 3 * n * k * 2
    print(f"CPU: {cpu_flags()}; {torch.get_num_threads()} threads; torch {torch.__version__}; kernels {cpu_kernels_summary()}")
    print(f"K={k} N={n} E={e} k={top_k}: {layer_bytes / MIB:.1f} MiB of expert weights per layer, "
          f"{active_bytes / MIB:.2f} MiB routed per token; {args.layers} layers cycled")

    g = torch.Generator().manual_seed(0)
    plain, packed = [], []
    for _ in range(args.layers):
        w13 = (torch.randn(e, 2 * n, k, generator=g) / k**0.5).to(BF16)
        w2 = (torch.randn(e, k, n, generator=g) / n**0.5).to(BF16)
        plain.append((w13, w2))
        w13p, w2p = w13.clone(), w2.clone()
        if not prepack_moe_weights_(w13p, w2p):
            raise SystemExit("the kernel does not serve this shape (K and N must be multiples of 32)")
        packed.append((w13p, w2p))

    print("median (min) ms per call; kernel GB/s = the routed experts' bytes / median time")
    bf16_kernel = {}
    print(f"{'M':>6} {'kernel':>16} {'grouped torch':>16} {'dense torch':>18} {'vs grouped':>10} {'vs dense':>9} "
          f"{'GB/s':>6} {'GFLOP/s':>8} {'workspace MiB':>13}")
    for m in args.tokens:
        hidden = torch.randn(m, k, generator=g).to(BF16)
        routings = [routing(m, top_k, e, g) for _ in range(ROUTINGS)]
        workspace = torch.empty(fused_moe_cpu_workspace_bytes(m, top_k, e, k, n), dtype=torch.uint8)
        calls = max(3, 200 // m)
        kernel = time_calls(lambda a, b, tw, ti: fused_experts_cpu(hidden, a, b, tw, ti, workspace), packed, routings,
                            calls, args.min_seconds)
        grouped = time_calls(lambda a, b, tw, ti: grouped_experts_torch(hidden, a, b, tw, ti), plain, routings, calls,
                             args.min_seconds)
        dense = (float("nan"), float("nan"))
        if m <= args.skip_dense_above:
            dense = time_calls(lambda a, b, tw, ti: dense_all_experts(hidden, a, b, tw, ti), plain, routings, 2,
                               args.min_seconds)
        routed = statistics.mean(len(torch.unique(ids)) for _, ids in routings)  # experts with a token: read once
        bf16_kernel[m] = kernel[0]
        flops = 2 * m * top_k * 3 * n * k
        fmt = lambda t: f"{t[0] * 1e3:.3f} ({t[1] * 1e3:.3f})"
        print(f"{m:>6} {fmt(kernel):>16} {fmt(grouped):>16} {fmt(dense):>18} {grouped[0] / kernel[0]:>9.2f}x "
              f"{dense[0] / kernel[0]:>8.2f}x {routed * 3 * n * k * 2 / kernel[0] / 1e9:>6.1f} "
              f"{flops / kernel[0] / 1e9:>8.1f} {workspace.numel() / MIB:>13.2f}")

    hidden1 = torch.randn(1, k, generator=g).to(BF16)
    routing1 = routing(1, top_k, e, g)
    bench_tmp = os.environ.get("BENCH_TMP", "/tmp")
    if not args.no_bytes:
        with tempfile.TemporaryDirectory(dir=bench_tmp) as d:
            print_bytes_read({"kernel": (fused_experts_cpu, *packed[0]), "grouped torch": (grouped_experts_torch, *plain[0]),
                              "dense torch": (dense_all_experts, *plain[0])}, top_k, e, active_bytes, layer_bytes,
                             hidden1, routing1, d)

    for quant in args.quant:
        bits = 4 if quant == "q4" else 8
        del plain[:]  # memory: only the kernel runs on quantized experts
        layers = [(random_quant_experts(e, 2 * n, k, bits, g), random_quant_experts(e, k, n, bits, g))
                  for _ in range(args.layers)]
        expert_bytes = cpu_packed_bytes(2 * n, k, bits) + cpu_packed_bytes(k, n, bits)
        print(f"\n{bits}-bit experts ({expert_bytes * 8 / (3 * n * k):.2f} bits per weight with scales): "
              f"{e * expert_bytes / MIB:.1f} MiB per layer, {top_k * expert_bytes / MIB:.2f} MiB routed per token")
        print(f"{'M':>6} {'kernel':>16} {'vs bf16 kernel':>14} {'GB/s':>6} {'GFLOP/s':>8} {'workspace MiB':>13}")
        for m in args.tokens:
            hidden = torch.randn(m, k, generator=g).to(BF16)
            routings = [routing(m, top_k, e, g) for _ in range(ROUTINGS)]
            workspace = torch.empty(fused_moe_cpu_workspace_bytes(m, top_k, e, k, n, bits, bits), dtype=torch.uint8)
            t = time_calls(lambda a, b, tw, ti: fused_experts_cpu(hidden, a, b, tw, ti, workspace), layers, routings,
                           max(3, 200 // m), args.min_seconds)
            routed = statistics.mean(len(torch.unique(ids)) for _, ids in routings)
            print(f"{m:>6} {t[0] * 1e3:>7.3f} ({t[1] * 1e3:.3f}) {bf16_kernel[m] / t[0]:>13.2f}x "
                  f"{routed * expert_bytes / t[0] / 1e9:>6.1f} {2 * m * top_k * 3 * n * k / t[0] / 1e9:>8.1f} "
                  f"{workspace.numel() / MIB:>13.2f}")
        if not args.no_bytes:
            with tempfile.TemporaryDirectory(dir=bench_tmp) as d:
                print_bytes_read({"kernel": (fused_experts_cpu, *layers[0])}, top_k, e, top_k * expert_bytes,
                                 e * expert_bytes, hidden1, routing1, d)


if __name__ == "__main__":
    main()
