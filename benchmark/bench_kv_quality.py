"""Quality gate of the quantized KV formats (issue 23): each --kv-cache-dtype against a bf16 KV cache, same weights.

    python benchmark/bench_kv_quality.py [--formats fp8_e4m3,int8,...] [--quick] [--json out.json]

The default model (bf16 weights) runs through PagedForwardDriver (the runtime's pools and torch_native backend,
no scheduler), once per KV format:
  (a) decode agreement: NUM_PROMPTS prompts decoded greedily for DECODE_TOKENS steps with a bf16 KV; each format then
      reads the same tokens step by step (teacher forcing: every step a batched decode that reads the quantized
      pool); top-1 agreement with bf16's argmax and mean KL(bf16 || format) of the next-token distributions;
  (b) perplexity on Python's own pydoc_data/topics.py (English, on every machine), PPL_TOKENS tokens read in
      PPL_CHUNK-token chunks, each chunk attending to the pool's quantized K/V of everything before it;
  (c) needle in a haystack: a pass code sentence at depths NEEDLE_DEPTHS of a topics.py haystack of 4k and 8k tokens
      (the default model's context is 8k), prefilled in 2048-token chunks as the server does, then a question;
      recall = share of runs whose greedy answer contains the code;
  (d) decode step time at batch 32 (ms), the torch path's gather for quantized formats vs bf16's.
The reference is the bf16 KV cache read through the same torch path (gather + SDPA) as the quantized formats, so a
row measures the storage format alone; the control row "bfloat16+fused" is the bf16 cache read by the fused CPU decode
kernel (what a bf16 server decodes with): its agreement with the reference is the noise floor of two bf16 kernels.
fp8 scales are calibrated as a server start calibrates them (model_executor/kv_calibration.py). Gates (issue 23):
fp8 / int8 top-1 >= 99% and perplexity within 1% of bf16's; int4 >= 95% and within 5%; int2_hadamard: reported.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the server's scheduler: no OpenMP spinning on shared cores
import torch  # noqa: E402

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_executor.kv_calibration import KV_CALIBRATION_SEED, KV_CALIBRATION_TOKENS
from sglang.srt.model_loader import load_model, resolve_model_path
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.hf_transformers_utils import get_tokenizer
from sglang.test.paged_forward import PagedForwardDriver

FUSED = "bfloat16+fused"  # bf16 KV read by the fused CPU decode kernel (the server's bf16 path), a control row
FORMATS = [FUSED, "fp8_e4m3", "fp8_e5m2", "int8", "int4", "int2_hadamard"]
GATES = {"fp8_e4m3": (0.99, 0.01), "fp8_e5m2": (0.99, 0.01), "int8": (0.99, 0.01), "int4": (0.95, 0.05)}
PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a hash table works, with an example in Python.",
    "Describe the water cycle to a ten year old.",
    "List the steps to bake bread at home and explain why each matters.",
    "What were the main causes of the industrial revolution?",
    "Write a Python function that merges two sorted lists, and explain it.",
    "Give advice to someone starting to learn the piano as an adult.",
    "Summarize the plot of a mystery novel you invent.",
]
NEEDLE = "The secret pass code of the archive is {code}."
QUESTION = "\n\nQuestion: What is the secret pass code of the archive?\nAnswer: The secret pass code of the archive is"
CODES = ["48217", "90536", "31764"]


def topics_text() -> str:
    import pydoc_data.topics as t

    return "\n\n".join(t.topics[k] for k in sorted(t.topics))


def make_driver(model, config, fmt, max_reqs, max_tokens):
    d = PagedForwardDriver(model, config, max_reqs=max_reqs + 1, max_tokens=max_tokens + KV_CALIBRATION_TOKENS,
                           kv_format="bfloat16" if fmt == FUSED else fmt)
    if fmt != FUSED:  # every other row reads K/V through the same torch gather + SDPA path, so only storage differs
        d.attn_backend.cpu_decode_ops = None
    pool = d.kv_pool
    if getattr(pool, "is_fp8", False):  # as a server start: kv_calibration.calibrate_kv_scales
        gen = torch.Generator().manual_seed(KV_CALIBRATION_SEED)
        ids = torch.randint(0, config.vocab_size, (KV_CALIBRATION_TOKENS,), generator=gen).tolist()
        pool.calibrating = True
        d.extend([d.new_request()], [ids])
        pool.calibrate_scales("calibrated (benchmark, as at startup)")
    return d


def decode_runs(model, config, fmt, prompts, steps, ref_tokens=None):
    """Greedy (ref_tokens None) or teacher-forced decode: returns (tokens per prompt, fp32 log-probs per step)."""
    d = make_driver(model, config, fmt, len(prompts) + 2, sum(len(p) for p in prompts) + len(prompts) * (steps + 2) + 600)
    rows = [d.new_request() for _ in prompts]
    logits = torch.stack([d.extend([r], [p])[0] for r, p in zip(rows, prompts)])
    toks, logps = [[] for _ in prompts], []
    for step in range(steps):
        logps.append(torch.log_softmax(logits.float(), -1))
        nxt = logits.argmax(-1).tolist() if ref_tokens is None else [t[step] for t in ref_tokens]
        for t, x in zip(toks, nxt):
            t.append(int(x))
        if step + 1 < steps:
            logits = d.extend(rows, [[x] for x in nxt])
    return toks, torch.stack(logps, 1)  # [prompts, steps, vocab]


def perplexity(model, config, fmt, ids, chunk):
    d = make_driver(model, config, fmt, 2, len(ids) + 8)
    row = d.new_request()
    nll, n = 0.0, 0
    for s in range(0, len(ids) - 1, chunk):
        piece = ids[s : s + chunk]
        logits = d.extend([row], [piece], logits_indices=torch.arange(len(piece)))
        targets = torch.tensor(ids[s + 1 : s + 1 + len(piece)])
        logits = logits[: len(targets)]
        nll += float(torch.nn.functional.cross_entropy(logits.float(), targets, reduction="sum"))
        n += len(targets)
    return math.exp(nll / n)


def needle_recall(model, config, fmt, tok, hay_ids, lengths, depths, chunk=2048, answer_tokens=8):
    hits, total, answers = 0, 0, []
    q_ids = tok.encode(QUESTION, add_special_tokens=False)
    for length in lengths:
        for i, depth in enumerate(depths):
            code = CODES[i % len(CODES)]
            needle = tok.encode(" " + NEEDLE.format(code=code) + " ", add_special_tokens=False)
            body = hay_ids[: length - len(needle) - len(q_ids) - answer_tokens - 1]
            at = int(len(body) * depth)
            ids = body[:at] + needle + body[at:] + q_ids
            d = make_driver(model, config, fmt, 2, len(ids) + answer_tokens + 8)
            row = d.new_request()
            for s in range(0, len(ids), chunk):
                logits = d.extend([row], [ids[s : s + chunk]])
            out = [int(logits[0].argmax())]
            for _ in range(answer_tokens - 1):
                out.append(int(d.extend([row], [[out[-1]]])[0].argmax()))
            text = tok.decode(out)
            answers.append(text.strip()[:24])
            hits += code in text
            total += 1
    return hits / total, answers


def decode_step_ms(model, config, fmt, batch=32, context=512, steps=8):
    d = make_driver(model, config, fmt, batch + 2, batch * (context + steps + 2) + 600)
    rows = [d.new_request() for _ in range(batch)]
    gen = torch.Generator().manual_seed(1)
    for r in rows:
        d.extend([r], [torch.randint(0, config.vocab_size, (context,), generator=gen).tolist()])
    nxt = [[1] for _ in rows]
    d.extend(rows, nxt)  # warm
    t = time.perf_counter()
    for _ in range(steps):
        d.extend(rows, nxt)
    return (time.perf_counter() - t) / steps * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--ppl-tokens", type=int, default=4096)
    ap.add_argument("--ppl-chunk", type=int, default=256)
    ap.add_argument("--needle-lengths", default="4096,8192")
    ap.add_argument("--needle-depths", default="0.2,0.5,0.8")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.manual_seed(0)
    model_dir = resolve_model_path(ServerArgs())
    config = ModelConfig.from_pretrained(model_dir, dtype="bfloat16")
    model = load_model(config, "cpu")
    tok = get_tokenizer(model_dir)
    from sglang.srt.utils.hf_transformers_utils import apply_chat_template

    prompts = [apply_chat_template(tok, [{"role": "user", "content": p}], tokenize=True) for p in PROMPTS]
    text_ids = tok.encode(topics_text(), add_special_tokens=False)
    ppl_ids = text_ids[: a.ppl_tokens]
    hay_ids = text_ids[a.ppl_tokens :]  # the haystack is other text than the perplexity's
    lengths = [int(x) for x in a.needle_lengths.split(",") if x]
    depths = [float(x) for x in a.needle_depths.split(",") if x]

    results = {}
    t0 = time.time()
    ref_toks, ref_logp = decode_runs(model, config, "bfloat16", prompts, a.decode_tokens)
    base = {"ppl": perplexity(model, config, "bfloat16", ppl_ids, a.ppl_chunk)}
    base["needle"], base["answers"] = needle_recall(model, config, "bfloat16", tok, hay_ids, lengths, depths)
    if not a.skip_speed:
        base["decode_ms_b32"] = decode_step_ms(model, config, "bfloat16")  # the gather path
    results["bfloat16"] = base
    print(f"bfloat16 (reference, torch gather path): ppl {base['ppl']:.4f} needle {base['needle']:.2f} {base['answers']} "
          f"decode b32 {base.get('decode_ms_b32', 0):.1f} ms ({time.time() - t0:.0f} s)", flush=True)
    for fmt in [f for f in a.formats.split(",") if f]:
        t0 = time.time()
        toks, logp = decode_runs(model, config, fmt, prompts, a.decode_tokens, ref_tokens=ref_toks)
        top1 = float((logp.argmax(-1) == ref_logp.argmax(-1)).float().mean())
        kl = float((ref_logp.exp() * (ref_logp - logp)).sum(-1).mean())
        r = {"top1": top1, "kl": kl, "ppl": perplexity(model, config, fmt, ppl_ids, a.ppl_chunk)}
        r["ppl_rel"] = r["ppl"] / base["ppl"] - 1
        r["needle"], r["answers"] = needle_recall(model, config, fmt, tok, hay_ids, lengths, depths)
        if not a.skip_speed:
            r["decode_ms_b32"] = decode_step_ms(model, config, fmt)
        gate = GATES.get(fmt)
        r["gate"] = "report" if gate is None else ("pass" if top1 >= gate[0] and r["ppl_rel"] <= gate[1] else "FAIL")
        results[fmt] = r
        print(f"{fmt}: top1 {top1:.4f} KL {kl:.5f} ppl {r['ppl']:.4f} ({r['ppl_rel']:+.2%}) needle {r['needle']:.2f} "
              f"{r['answers']} decode b32 {r.get('decode_ms_b32', 0):.1f} ms gate {r['gate']} "
              f"({time.time() - t0:.0f} s)", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all(r.get("gate") != "FAIL" for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
