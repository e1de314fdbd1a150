"""Quality gate of the quantized KV formats (issue 23): each --kv-cache-dtype against a bf16 KV cache, same weights.

    python benchmark/bench_kv_quality.py [--formats float32,int8,...] [--quick] [--json out.json]

What is compared, and why: the default model runs with fp32 weights and fp32 activations (--dtype float32: the same
checkpoint the bf16 server loads, before its bf16 cast) through PagedForwardDriver (the runtime's pools and the
torch_native backend, no scheduler). The reference is a bf16 KV cache (the gate's "vs bf16 KV"); every row -- the
reference, a float32 KV cache and each quantized format -- is read through exactly the same code (torch gather +
SDPA for decode and for extend with a prefix; SDPA on the fresh K/V for a prefill without one; the fused CPU
kernels are off for every row), so two rows differ only in what the pool stores. fp32 compute matters: with bf16
activations, the rounding of the activations themselves moves near-tied next tokens, and two bf16 runs that
differ in any way (even the same bf16 cache read by two kernels) agreed on only ~98.6% of tokens, above the 99%
gate's resolution. The float32 KV row is the measure's noise floor: how far the bf16 reference itself is from exact
storage (its top-1 flips are near-ties that any perturbation of bf16's size moves).

  (a) decode agreement: NUM_PROMPTS (16) chat prompts decoded greedily for --decode-tokens (128) steps with the bf16
      KV; each row then reads the same tokens step by step (teacher forcing: every step a batched decode reading its
      pool); top-1 agreement with the reference's argmax over 16 x 128 = 2,048 positions (one flip = 0.05%) and mean
      KL(bf16 || row) of the next-token distributions (the primary continuous figure);
  (b) perplexity on Python's own pydoc_data/topics.py (English, on every machine), --ppl-tokens tokens read in
      --ppl-chunk-token chunks, each chunk attending to the pool's stored K/V of everything before it;
  (c) needle in a haystack: a pass code sentence at depths 0.2 / 0.5 / 0.8 of a topics.py haystack of 4k and 8k
      tokens (the default model's context is 8k), prefilled in 2048-token chunks as the server does, then a question;
      recall = share of runs whose greedy answer contains the code;
  (d) --speed: decode step time at batch 32 (ms) in the model dtype (the torch path; the kernels are issue 23's
      other half).
fp8 scales and int4 key multipliers are calibrated as a server start calibrates them (model_executor/kv_calibration.py). Gates (issue 23):
fp8 / int8 top-1 >= 99% and perplexity within 1% of bf16's; int4 >= 95% and within 5%; int2_hadamard: reported.
--quick: 8 prompts x 48 tokens, 1,024 perplexity tokens, no needle (a development check, not the gate).
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

from sglang.jit_kernel.cpu_ops import get_kv_quant_ops
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.attention.cpu_kernel_ops import QUANT_KERNEL_FORMATS
from sglang.srt.model_executor.kv_calibration import KV_CALIBRATION_SEED, KV_CALIBRATION_TOKENS, recording_queries
from sglang.srt.model_loader import load_model, resolve_model_path
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.hf_transformers_utils import get_tokenizer
from sglang.test.paged_forward import PagedForwardDriver

REFERENCE = "bfloat16"
FORMATS = ["float32", "fp8_e4m3", "fp8_e5m2", "int8", "int4", "int2_hadamard"]  # float32: the noise floor row
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
    "Why is the sky blue? Answer in a few paragraphs.",
    "Write a haiku sequence about autumn in the mountains.",
    "Compare TCP and UDP and say when to use each.",
    "Plan a three day trip to Rome for a family with two children.",
    "Explain recursion to a beginner programmer with a simple example.",
    "What are the health benefits of regular exercise?",
    "Write a polite email asking a colleague to review a report.",
    "Describe how a bill becomes a law in a parliamentary democracy.",
]
NEEDLE = "The secret pass code of the archive is {code}."
QUESTION = "\n\nQuestion: What is the secret pass code of the archive?\nAnswer: The secret pass code of the archive is"
CODES = ["48217", "90536", "31764"]


def topics_text() -> str:
    import pydoc_data.topics as t

    return "\n\n".join(t.topics[k] for k in sorted(t.topics))


KERNELS = False  # --kernels: the quantized rows read through the CPU kernel (extend_attention_quant)


def make_driver(model, config, fmt, max_reqs, max_tokens):
    d = PagedForwardDriver(model, config, max_reqs=max_reqs + 1, max_tokens=max_tokens + KV_CALIBRATION_TOKENS,
                           kv_format=fmt)
    # every row reads K/V through the same torch gather + SDPA path (no fused kernel), so only the storage differs
    d.attn_backend.cpu_decode_ops = d.attn_backend.cpu_extend_ops = None
    d.attn_backend.cpu_quant_ops = d.attn_backend.cpu_quant_write = None
    if KERNELS and fmt in QUANT_KERNEL_FORMATS:  # fp32 rows through the kernel module as a bf16 server's (its fp32 path)
        ops = get_kv_quant_ops()
        d.attn_backend.cpu_quant_ops, d.attn_backend.cpu_quant_write = ops, ops.kv_quant_write
    pool = d.kv_pool
    if getattr(pool, "needs_calibration", False):  # fp8 scales, int4 means: as a server start (kv_calibration.py)
        gen = torch.Generator().manual_seed(KV_CALIBRATION_SEED)
        ids = torch.randint(0, config.vocab_size, (KV_CALIBRATION_TOKENS,), generator=gen).tolist()
        pool.calibrating = True
        with recording_queries(d.attn_backend, pool):
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


def decode_step_ms(model, config, fmt, batch=32, context=512, steps=4):
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
    ap.add_argument("--dtype", default="float32", help="model weights and activations (float32: see above)")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--ppl-tokens", type=int, default=4096)
    ap.add_argument("--ppl-chunk", type=int, default=256)
    ap.add_argument("--needle-lengths", default="4096,8192")
    ap.add_argument("--needle-depths", default="0.2,0.5,0.8")
    ap.add_argument("--quick", action="store_true", help="8 prompts x 48 tokens, 1,024 perplexity tokens, no needle")
    ap.add_argument("--speed", action="store_true", help="also time a batch-32 decode step")
    ap.add_argument("--json", default=None, help="merge the rows into this file (runs of separate --formats add up)")
    ap.add_argument("--ref-cache", default=None, help="keep the reference's decode (tokens, log-probs) and figures in "
                    "this torch file, so runs of separate --formats compute it once (~0.4 GB at 16 x 128)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the figures do not depend on it)")
    ap.add_argument("--kernels", action="store_true", help="read the quantized rows through the CPU kernel "
                    "(extend_attention_quant: every quantized format) as a server does, not the shared gather path")
    a = ap.parse_args()
    global KERNELS
    KERNELS = a.kernels
    torch.set_num_threads(a.threads)
    if a.quick:
        a.prompts, a.decode_tokens, a.ppl_tokens, a.needle_lengths = 8, 48, 1024, ""
    torch.manual_seed(0)
    model_dir = resolve_model_path(ServerArgs())
    config = ModelConfig.from_pretrained(model_dir, dtype=a.dtype)
    model = load_model(config, "cpu")
    tok = get_tokenizer(model_dir)
    from sglang.srt.utils.hf_transformers_utils import apply_chat_template

    prompts = [apply_chat_template(tok, [{"role": "user", "content": p}], tokenize=True) for p in PROMPTS[: a.prompts]]
    text_ids = tok.encode(topics_text(), add_special_tokens=False)
    ppl_ids = text_ids[: a.ppl_tokens]
    hay_ids = text_ids[4096:]  # the haystack is other text than the perplexity's
    lengths = [int(x) for x in a.needle_lengths.split(",") if x]
    depths = [float(x) for x in a.needle_depths.split(",") if x]
    results = {}
    if a.json and os.path.exists(a.json):
        with open(a.json) as f:
            results = json.load(f)
    setup = {"dtype": a.dtype, "prompts": len(prompts), "decode_tokens": a.decode_tokens, "ppl_tokens": len(ppl_ids),
             "ppl_chunk": a.ppl_chunk, "needle_lengths": lengths, "needle_depths": depths}
    if results.get("setup", setup) != setup:
        results = {}  # rows of another setup are not comparable
    results["setup"] = setup

    def row(fmt, ref_toks=None, ref_logp=None):
        t0 = time.time()
        toks, logp = decode_runs(model, config, fmt, prompts, a.decode_tokens, ref_tokens=ref_toks)
        r = {"ppl": perplexity(model, config, fmt, ppl_ids, a.ppl_chunk)}
        if ref_logp is not None:
            r["top1"] = float((logp.argmax(-1) == ref_logp.argmax(-1)).float().mean())
            r["kl"] = float((ref_logp.exp() * (ref_logp - logp)).sum(-1).mean())
            r["ppl_rel"] = r["ppl"] / results[REFERENCE]["ppl"] - 1
        if lengths and depths:
            r["needle"], r["answers"] = needle_recall(model, config, fmt, tok, hay_ids, lengths, depths)
        if a.speed:
            r["decode_ms_b32"] = decode_step_ms(model, config, fmt)
        gate = GATES.get(fmt)
        if ref_logp is not None:
            ok = gate is not None and r["top1"] >= gate[0] and r["ppl_rel"] <= gate[1]
            r["gate"] = "report" if gate is None else ("pass" if ok else "FAIL")
        r["seconds"] = round(time.time() - t0, 1)
        return toks, logp, r

    cached = torch.load(a.ref_cache) if a.ref_cache and os.path.exists(a.ref_cache) else None
    if cached is not None and cached["setup"] == setup:
        ref_toks, ref_logp, ref = cached["toks"], cached["logp"], cached["row"]
    else:
        ref_toks, ref_logp, ref = row(REFERENCE)
        if a.ref_cache:
            torch.save({"setup": setup, "toks": ref_toks, "logp": ref_logp, "row": ref}, a.ref_cache)
    results[REFERENCE] = {**results.get(REFERENCE, {}), **ref}
    print(f"{REFERENCE} KV (reference): ppl {ref['ppl']:.4f} needle {ref.get('needle', '-')} {ref.get('answers', '')} "
          f"({ref['seconds']:.0f} s)", flush=True)
    for fmt in [f for f in a.formats.split(",") if f and f != REFERENCE]:
        _, _, r = row(fmt, ref_toks, ref_logp)
        results[fmt] = r
        print(f"{fmt}: top1 {r['top1']:.4f} KL {r['kl']:.6f} ppl {r['ppl']:.4f} ({r['ppl_rel']:+.2%}) "
              f"needle {r.get('needle', '-')} {r.get('answers', '')} gate {r['gate']} ({r['seconds']:.0f} s)", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all(isinstance(r, dict) and r.get("gate") != "FAIL" for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
