"""Latency of one static batch: prefill time and per-step decode latency, straight through the model runner.

    python -m sglang.bench_one_batch --batch-size 1 --input-len 128 --output-len 64 [--compare-hf] [server flags]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from sglang.bench_utils import hf_batch1_decode, parse_bench_args, random_prompt_ids


def measure(engine, prompts, output_len: int) -> dict:
    """Step the scheduler by hand. Prefill: every step until each request has its first token (a batch larger than
    the chunked-prefill size takes several); after that each step is one decode step of the whole batch."""
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput, new_rid
    from sglang.srt.sampling.sampling_params import SamplingParams

    sched = engine.scheduler
    sched.flush_cache()
    rids = []
    for p in prompts:
        sp = SamplingParams.from_dict({"temperature": 0, "max_new_tokens": output_len, "ignore_eos": True})
        rids.append(new_rid())
        sched.add_request(TokenizedGenerateReqInput(rids[-1], None, p, sp))
    reqs = [sched.reqs[rid] for rid in rids]
    t0 = time.perf_counter()
    while not all(r.output_ids for r in reqs):
        sched.step()
    prefill = time.perf_counter() - t0
    steps = []
    while sched.has_work():
        t0 = time.perf_counter()
        sched.step()
        steps.append(time.perf_counter() - t0)
    med = statistics.median(steps)
    bs = len(prompts)
    return {"backend": "sglang", "batch_size": bs, "prefill_s": prefill, "prefill_tok_s": sum(map(len, prompts)) / prefill,
            "decode_median_step_s": med, "decode_tok_s": bs / med, "decode_steps": len(steps)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, nargs="+", default=[1])
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--compare-hf", action="store_true", help="also measure HF transformers batch-1 decode")
    p.add_argument("--output-file", default=None)
    args, server_args = parse_bench_args(p, argv)

    from sglang import Engine

    engine = Engine(server_args=server_args)
    vocab = engine.scheduler.model_config.vocab_size
    measure(engine, random_prompt_ids(1, 16, vocab, 99), 8)  # warm-up
    results = []
    for bs in args.batch_size:
        results.append(measure(engine, random_prompt_ids(bs, args.input_len, vocab, bs), args.output_len))
    model_dir = engine.scheduler.model_runner.model_path
    dtype = engine.scheduler.model_runner.dtype
    engine.shutdown()
    print(f"\ninput {args.input_len}  output {args.output_len}  dtype {dtype}")
    print(f"{'batch':>6}{'prefill (s)':>13}{'prefill tok/s':>15}{'decode step (ms)':>18}{'decode tok/s':>14}")
    for r in results:
        print(f"{r['batch_size']:>6}{r['prefill_s']:>13.3f}{r['prefill_tok_s']:>15.1f}"
              f"{r['decode_median_step_s'] * 1e3:>18.2f}{r['decode_tok_s']:>14.1f}")
    if args.compare_hf:
        hf = hf_batch1_decode(model_dir, random_prompt_ids(1, args.input_len, vocab, 1)[0], args.output_len, dtype)
        results.append(hf)
        print(f"hf_transformers batch-1 decode: {hf['decode_tok_s']:.1f} tok/s")
        one = next((r for r in results if r.get("batch_size") == 1), None)
        if one:
            print(f"ratio sglang / hf (batch-1 decode): {one['decode_tok_s'] / hf['decode_tok_s']:.2f}x")
    if args.output_file:
        with open(args.output_file, "a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
