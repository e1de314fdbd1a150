"""Offline throughput of the engine: N random prompts, fixed output length, all submitted at once.

    python -m sglang.bench_offline_throughput --num-prompts 32 --input-len 128 --output-len 64 [--compare-hf]
        [any `sglang serve` flag, e.g. --dtype bfloat16 --max-running-requests 64]

Prints a table and, with --output-file, appends one JSON line per backend.
"""

from __future__ import annotations

import argparse
import json
import time

from sglang.bench_utils import hf_static_batch_throughput, parse_bench_args, random_prompt_ids


def run_engine(engine, prompts, output_len: int) -> dict:
    params = {"temperature": 0, "max_new_tokens": output_len, "ignore_eos": True}
    engine.generate(input_ids=prompts[:2], sampling_params=dict(params, max_new_tokens=4))  # warm-up
    engine.flush_cache()
    t0 = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    dt = time.perf_counter() - t0
    n_out = sum(len(o["output_ids"]) for o in outs)
    n_in = sum(len(p) for p in prompts)
    return {"backend": "sglang", "duration_s": dt, "output_tokens": n_out, "input_tokens": n_in,
            "output_throughput": n_out / dt, "total_throughput": (n_in + n_out) / dt,
            "request_throughput": len(prompts) / dt,
            "num_retractions": engine.scheduler.num_retractions}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--range-ratio", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--compare-hf", action="store_true", help="also run HF transformers generate as one static batch")
    p.add_argument("--output-file", default=None)
    args, server_args = parse_bench_args(p, argv)

    from sglang import Engine

    t0 = time.perf_counter()
    engine = Engine(server_args=server_args)
    startup = time.perf_counter() - t0
    prompts = random_prompt_ids(args.num_prompts, args.input_len, engine.scheduler.model_config.vocab_size,
                                args.seed, args.range_ratio)
    results = [dict(run_engine(engine, prompts, args.output_len), startup_s=startup)]
    model_dir = engine.scheduler.model_runner.model_path
    dtype = engine.scheduler.model_runner.dtype
    engine.shutdown()
    if args.compare_hf:
        results.append(hf_static_batch_throughput(model_dir, prompts, args.output_len, dtype))

    print(f"\n#prompts {args.num_prompts}  input {args.input_len}  output {args.output_len}  dtype {dtype}")
    print(f"{'backend':<18}{'duration (s)':>14}{'output tok/s':>14}")
    for r in results:
        print(f"{r['backend']:<18}{r['duration_s']:>14.2f}{r['output_throughput']:>14.1f}")
    if args.compare_hf:
        print(f"ratio sglang / hf: {results[0]['output_throughput'] / results[1]['output_throughput']:.2f}x")
    if args.output_file:
        with open(args.output_file, "a") as f:
            for r in results:
                f.write(json.dumps(dict(r, num_prompts=args.num_prompts, input_len=args.input_len,
                                        output_len=args.output_len)) + "\n")


if __name__ == "__main__":
    main()
