"""A decode step's time in the linear-attention layers vs the full-attention layers, per context length (issue 43).

    python benchmark/bench_linear_decode_step.py [--model-path DIR] [--contexts 1024,16384] [--batch 8]
        [--rounds 3] [--steps 8] [--dtype bfloat16] [--prefill]

A Gated DeltaNet (or Mamba-2) layer keeps a fixed-size state per request, so its decode step reads the same bytes at
any context; a full-attention layer reads every earlier token's K and V, so its step grows with the context. This
script times both kinds of token mixer with forward hooks (the mixer module's forward only: the MoE / MLP beside it
costs the same at every context and is left out) while the model decodes the same batch at each context length.

The model runs through PagedForwardDriver (the runtime's request-slot pool, its KV pool holding only the full-attention
layers as a start builds it, the torch_native attention backend and the kernels a start takes at this CPU level; no
scheduler, no HTTP) with the linear-state pool attached to the request-slot pool as the runner attaches it. Every
request of the batch is given `context` positions first. By default they are mapped, not computed: their KV rows are
the pool's zeros and their state rows zero, which costs a decode step exactly what computed ones would (a step's work
depends on how many positions it reads, not on their values) and skips a batch x 16k-token prefill; --prefill computes
them instead (chunks of --prefill-chunk tokens through the model).

For each round, the contexts take turns (the order turned by one every round), and each runs --steps batched decode
steps after one warm step; a round keeps, per context, the median step's milliseconds in each mixer kind. The report
gives each kind's time per layer (the kinds' layer counts differ: 3 linear to 1 full in Qwen3-Next) and its growth from
the first context to each other. --model-path defaults to the random tiny Qwen3-Next of make_qwen3_next_checkpoint.py
(built under ~/.cache/sglang-bench on first use); the ~1B one (make_qwen3_next_checkpoint.py OUT_DIR) or a Nemotron-H
checkpoint is timed the same way. On a machine shared with other work, --threads 1: with more threads every small op
of a decode step waits for a descheduled OpenMP worker, which swamps the layers' own time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict

import torch

from sglang.jit_kernel.cpu_isa import cpu_isa_summary
from sglang.jit_kernel.cpu_ops import set_fp32_kernels
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.linear_state_pool import linear_layer_count, linear_state_pool
from sglang.srt.model_loader import load_model
from sglang.test.paged_forward import PagedForwardDriver

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DIR = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "sglang-bench",
                           "qwen3-next-tiny")
# token mixers with a per-request state; a module with a RadixAttention child is a full-attention mixer
LINEAR_MIXER_MARKS = ("GatedDeltaNet", "Mamba")


def cpu_flags() -> str:
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    return " ".join(sorted(x for x in flags if x in ("avx2", "f16c") or x.startswith(("avx512", "amx"))))


def mixers(model) -> list:
    """(kind, module) of each token mixer: "linear" (a state per request) or "full" (reads the KV pool)."""
    out = []
    for module in model.modules():
        name = type(module).__name__
        if any(mark in name for mark in LINEAR_MIXER_MARKS):
            out.append(("linear", module))
        elif any(isinstance(child, RadixAttention) for child in module.children()):
            out.append(("full", module))
    return out


class MixerTimer:
    """Wall time spent in each kind's mixers since reset(): pre- and post-forward hooks around every mixer."""

    def __init__(self, model):
        self.spent_s = defaultdict(float)
        self.layers = defaultdict(int)
        for kind, module in mixers(model):
            self.layers[kind] += 1
            module.register_forward_pre_hook(self._start)
            module.register_forward_hook(lambda m, args, out, kind=kind: self._stop(m, kind))

    def _start(self, module, args):
        module._bench_t0 = time.perf_counter()

    def _stop(self, module, kind):
        self.spent_s[kind] += time.perf_counter() - module._bench_t0

    def reset(self):
        self.spent_s.clear()


class FullLayersOnly:
    """The model config as the KV pool sees it: the full-attention layers only (their RadixAttention layer ids are
    0..n_full-1), as model_executor/linear_state.kv_pool_layers gives the runner's pool."""

    def __init__(self, config, full_layers: int):
        self._config, self.num_hidden_layers = config, full_layers

    def __getattr__(self, name):
        return getattr(self._config, name)


def ensure_default_checkpoint(path: str) -> None:
    if not os.path.exists(os.path.join(path, "config.json")):
        subprocess.run([sys.executable, os.path.join(HERE, "make_qwen3_next_checkpoint.py"), path, "--size", "tiny"],
                       check=True)


def build(a, config, model, context: int, vocab: int) -> tuple:
    text = config.shape.text
    n_full = sum(1 for k in text.layer_kinds if k == "full") if text.layer_kinds else config.num_hidden_layers
    tokens = a.batch * (context + a.rounds * (a.steps + 1) + 2) + 64
    d = PagedForwardDriver(model, FullLayersOnly(config, n_full), max_reqs=a.batch, max_tokens=tokens)
    if linear_layer_count(text):
        d.req_to_token_pool.linear_state = linear_state_pool(text, 1, a.batch + 1)
    rows = [d.new_request() for _ in range(a.batch)]
    gen = torch.Generator().manual_seed(context)
    with torch.inference_mode():
        for r in rows:
            if a.prefill:
                ids = torch.randint(0, vocab, (context,), generator=gen).tolist()
                for s in range(0, context, a.prefill_chunk):
                    d.extend([r], [ids[s: s + a.prefill_chunk]])
            else:
                d._alloc(r, context)  # positions 0..context-1 mapped to KV slots (module docstring)
    return d, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default=DEFAULT_DIR)
    ap.add_argument("--contexts", default="1024,16384", help="context lengths (tokens per request before decoding)")
    ap.add_argument("--dtype", default="bfloat16", help="model weights and activations")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prefill", action="store_true", help="compute the context through the model (module docstring)")
    ap.add_argument("--prefill-chunk", type=int, default=1024)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    contexts = [int(x) for x in a.contexts.split(",")]
    if a.model_path == DEFAULT_DIR:
        ensure_default_checkpoint(a.model_path)
    config = ModelConfig.from_pretrained(a.model_path, dtype=a.dtype,
                                         context_length=max(contexts) + a.rounds * (a.steps + 1) + 8)
    model = load_model(config, "cpu")
    set_fp32_kernels(a.dtype == "float32")
    timer = MixerTimer(model)
    if not timer.layers.get("linear") or not timer.layers.get("full"):
        raise SystemExit(f"{a.model_path}: needs both linear and full-attention mixers, found {dict(timer.layers)}")
    print(f"CPU level {cpu_isa_summary()}; flags {cpu_flags()}; {a.threads} threads")
    print(f"{a.model_path}: {config.shape.text.model_type}, {timer.layers['linear']} linear + {timer.layers['full']} "
          f"full-attention layers, {a.dtype}, batch {a.batch}, context {'computed' if a.prefill else 'mapped'}",
          flush=True)
    runs = {c: build(a, config, model, c, config.vocab_size) for c in contexts}
    ms = {c: defaultdict(list) for c in contexts}  # context -> kind -> per-round median ms per step (all layers)
    for r in range(a.rounds):
        for c in contexts[r % len(contexts):] + contexts[: r % len(contexts)]:
            d, rows = runs[c]
            step = [[1] for _ in rows]
            per_kind = defaultdict(list)
            d.extend(rows, step)  # warm
            for _ in range(a.steps):
                timer.reset()
                t = time.perf_counter()
                d.extend(rows, step)
                per_kind["step"].append(time.perf_counter() - t)
                for kind in ("linear", "full"):
                    per_kind[kind].append(timer.spent_s[kind])
            for kind, xs in per_kind.items():
                ms[c][kind].append(statistics.median(xs) * 1e3)
    base = contexts[0]
    print(f"{'context':>8} {'kind':<7} {'layers':>6} {'ms/step (rounds)':<26} {'ms/layer':>9} {'vs ' + str(base):>9}")
    for c in contexts:
        for kind in ("linear", "full", "step"):
            rounds, layers = ms[c][kind], timer.layers.get(kind, 1)
            growth = statistics.median(ms[c][kind]) / statistics.median(ms[base][kind])
            print(f"{c:>8} {kind:<7} {layers if kind != 'step' else '':>6} {' '.join(f'{x:.2f}' for x in rounds):<26} "
                  f"{statistics.median(rounds) / layers:>9.3f} {growth:>8.2f}x")


if __name__ == "__main__":
    main()
