"""Helpers for engine-level tests: HF transformers references and small random-weight checkpoints."""

from __future__ import annotations

import gc
from typing import List

import torch

PROMPTS = [
    "The three primary colors are",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "Water boils at a temperature of",
    "The quick brown fox",
    "List three fruits:\n1.",
    "In mathematics, a prime number is",
    "import numpy as np\n",
]


def default_model_dir() -> str:
    from sglang.srt.model_loader import resolve_model_path
    from sglang.srt.server_args import ServerArgs

    return resolve_model_path(ServerArgs())


def hf_greedy(model_dir: str, prompts_ids: List[List[int]], max_new_tokens: int) -> List[List[int]]:
    """Greedy continuation by HF transformers in float32, ignoring EOS (the reference)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.eval()
    outs = []
    with torch.no_grad():
        for ids in prompts_ids:
            x = torch.tensor([ids])
            y = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new_tokens,
                               min_new_tokens=max_new_tokens, pad_token_id=0)
            outs.append(y[0, len(ids):].tolist())
    del model
    gc.collect()
    return outs


def spread_random_weights(model, std: float = 0.08):
    """Redraw every matrix with a little more spread than the default init, so greedy paths are not degenerate."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, std)
    return model


def make_random_qwen3(path: str, seed: int = 0) -> str:
    """A small random-weight Qwen3 checkpoint (q/k norms, GQA) saved in HF layout."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                      rope_theta=10000.0, tie_word_embeddings=False, eos_token_id=1, bos_token_id=0)
    model = spread_random_weights(Qwen3ForCausalLM(cfg).to(torch.float32))
    model.save_pretrained(path, safe_serialization=True)
    return path


def assert_idle_and_intact(engine) -> None:
    """Nothing queued, running or holding KV; free + held + cached == total for pages and request slots."""
    s = engine.scheduler
    s.check_integrity()
    assert not s.reqs and not s.running and not s.waiting_queue
    assert s.get_stats()["num_used_tokens"] == 0


def shutdown(engine) -> None:
    engine.shutdown()
    gc.collect()
