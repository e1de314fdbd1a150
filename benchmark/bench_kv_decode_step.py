"""In-process decode step time per --kv-cache-dtype (issue 23's speed gate without the server's noise).

    python benchmark/bench_kv_decode_step.py [--formats bfloat16,int8,int4,fp8_e4m3,fp8_e5m2,int2_hadamard]
        [--dtype bfloat16] [--rounds 4] [--batch 32] [--context 200] [--steps 10] [--gather]

The default model through PagedForwardDriver (the runtime's pools and the torch_native backend with the kernels a
start takes at this process's CPU level; no scheduler, no HTTP): for each format, `--batch` requests prefilled with
`--context` random tokens, then rounds of `--steps` batched decode steps, the formats alternating within each round
(the order turned by one every round), the median step of each round kept. Prints each format's step time per round
and its speed relative to the first format in the same round (bf16 / fp32 KV first: the cache a start gives by
default). On a shared 2-core machine one server benchmark round moves by up to 20% (bench_kv_decode_speed.sh); these
rounds by a few percent.

--dtype float32 with the fp32 kernels on (as a start does where --dtype auto resolves to float32, a level without
BF16: run with SGLANG_CPU_ISA=avx512_vnni to measure that level here); --gather reads the quantized pools through
the torch gather path instead of the kernel over the codes (the path below level avx512_vnni).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from sglang.jit_kernel.cpu_isa import cpu_isa_summary
from sglang.jit_kernel.cpu_ops import set_fp32_kernels
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_loader import load_model, resolve_model_path
from sglang.srt.server_args import ServerArgs
from sglang.test.paged_forward import PagedForwardDriver

PLAIN = ("bfloat16", "float32")


def cpu_flags() -> str:
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    return " ".join(sorted(x for x in flags if x in ("avx2", "f16c") or x.startswith(("avx512", "amx"))))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--formats", default="bfloat16,int8,int4,fp8_e4m3,fp8_e5m2,int2_hadamard")
    ap.add_argument("--dtype", default="bfloat16", help="model weights and activations")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--gather", action="store_true", help="quantized pools through the torch gather path")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"CPU level {cpu_isa_summary()}; flags {cpu_flags()}; {a.threads} threads")
    config = ModelConfig.from_pretrained(resolve_model_path(ServerArgs()), dtype=a.dtype)
    model = load_model(config, "cpu")
    set_fp32_kernels(a.dtype == "float32")
    formats = a.formats.split(",")
    tokens = a.batch * (a.context + a.rounds * (a.steps + 1) + 4) + 600
    runs = {}
    for fmt in formats:
        d = PagedForwardDriver(model, config, max_reqs=a.batch + 2, max_tokens=tokens,
                               kv_format=None if fmt in PLAIN else fmt)
        be = d.attn_backend
        if a.gather and fmt not in PLAIN:
            be.cpu_quant_ops = be.cpu_quant_write = None
        if getattr(d.kv_pool, "needs_calibration", False):
            d.kv_pool.calibrate_scales("unit scales (benchmark)")
        rows = [d.new_request() for _ in range(a.batch)]
        gen = torch.Generator().manual_seed(1)
        with torch.inference_mode():
            for r in rows:
                d.extend([r], [torch.randint(0, config.vocab_size, (a.context,), generator=gen).tolist()])
        path = ("kernel over the codes" if getattr(be, "cpu_quant_ops", None) is not None else
                "fused decode kernel" if getattr(be, "cpu_decode_ops", None) is not None else "torch path")
        print(f"{fmt}: {path}", flush=True)
        runs[fmt] = (d, rows, [])
    for r in range(a.rounds):
        for fmt in formats[r % len(formats):] + formats[: r % len(formats)]:
            d, rows, times = runs[fmt]
            step = [[1] for _ in rows]
            with torch.inference_mode():
                d.extend(rows, step)  # warm
                ts = []
                for _ in range(a.steps):
                    t = time.perf_counter()
                    d.extend(rows, step)
                    ts.append(time.perf_counter() - t)
            times.append(statistics.median(ts) * 1e3)
    base = runs[formats[0]][2]
    for fmt in formats:
        times = runs[fmt][2]
        ratios = [b / t for b, t in zip(base, times)]
        print(f"{fmt:<14} step ms {' '.join(f'{t:.1f}' for t in times)}   speed vs {formats[0]} "
              f"{' '.join(f'{x:.3f}' for x in ratios)}   median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
