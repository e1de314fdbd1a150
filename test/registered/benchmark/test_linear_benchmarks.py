"""Issue 43's CPU benchmarks build and run what they claim (their speed is checked by running them).

make_qwen3_next_checkpoint.py: each size's config is Qwen3-Next-shaped as its docstring says (3 of every 4 layers
Gated DeltaNet, every layer's MLP the routed MoE), and the parameter total it prints, counted on transformers' own
model, equals the planner's count from the same config.json (mem_plan/arch_qwen3_next.py: an independent formula over
the checkpoint's tensor names). bench_linear_decode_step.py: on a random tiny Qwen3-Next it times as many linear and
full-attention mixers as the config has, and decoding through its driver gives HF transformers' fp32 logits, so the
timed steps are the model's real decode, over the linear-state pool and a KV pool of the full layers only.
"""

import importlib.util
import json
import os

import pytest
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=40, suite="cpu")

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "..", "benchmark")
VOCAB = 512


def bench_module(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def maker():
    return bench_module("make_qwen3_next_checkpoint")


@pytest.fixture(scope="module")
def tiny_checkpoint(maker, tmp_path_factory):
    """The tiny size at a 512-token vocabulary (no tokenizer needed): random fp32 weights saved by transformers."""
    from transformers import Qwen3NextForCausalLM

    path = str(tmp_path_factory.mktemp("qwen3_next_tiny"))
    torch.manual_seed(0)
    model = Qwen3NextForCausalLM(maker.make_config("tiny", VOCAB, None, None)).eval()
    with torch.no_grad():  # more spread than HF's init, so the mixers' outputs matter to the logits
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.1)
            elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
                p.normal_(0, 0.2)  # (1 + w) norms: zero-centred
    model.save_pretrained(path, safe_serialization=True)
    return path, model


@pytest.mark.parametrize("size", ["tiny", "full"])
def test_checkpoint_shape_and_count_match_the_planner(maker, size):
    from sglang.srt.mem_plan.model_shapes import model_shape_from_config

    cfg = maker.make_config(size, 49152, 1, 2)
    kinds = cfg.layer_types
    assert kinds == ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(cfg.num_hidden_layers)]
    total, active = maker.count(cfg)
    saved = cfg.to_dict()
    saved.update(full_attention_interval=4, rope_theta=maker.ROPE["rope_theta"],
                 partial_rotary_factor=maker.ROPE["partial_rotary_factor"])
    shape = model_shape_from_config(json.loads(json.dumps(saved)))
    assert shape.num_params == total
    text = shape.text
    assert text.layer_kinds.count("linear") == 3 * text.layer_kinds.count("full")
    assert len(text.sparse_layers) == cfg.num_hidden_layers  # a shared expert beside routed ones on every layer
    assert cfg.shared_expert_intermediate_size > 0 and active < total
    if size == "full":  # the ~1B the benchmark promises
        assert 0.9e9 < total < 1.2e9 and 0.3e9 < active < 0.45e9


def test_decode_step_timer_counts_mixers_and_decodes_like_hf(tiny_checkpoint):
    import argparse

    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader import load_model

    bench = bench_module("bench_linear_decode_step")
    path, hf = tiny_checkpoint
    config = ModelConfig.from_pretrained(path, dtype="float32", context_length=128)
    model = load_model(config, "cpu")
    timer = bench.MixerTimer(model)
    assert dict(timer.layers) == {"linear": 3, "full": 1}

    a = argparse.Namespace(batch=2, rounds=1, steps=1, prefill=True, prefill_chunk=5)
    d, rows = bench.build(a, config, model, 0, VOCAB)
    assert d.kv_pool.layer_num == 1  # the full layer only
    prompts = [[(7 * j + 3 * i + 1) % VOCAB for j in range(9 + 4 * i)] for i in range(2)]
    for r, p in zip(rows, prompts):  # two chunks each: the state carried across the chunk edge
        d.extend([r], [p[:5]])
        d.extend([r], [p[5:]])
    timer.reset()
    nxt = [[11], [13]]
    ours = d.extend(rows, nxt)  # one batched decode step
    assert timer.spent_s["linear"] > 0 and timer.spent_s["full"] > 0
    with torch.no_grad():
        ref = torch.stack([hf(torch.tensor([p + n])).logits[0, -1] for p, n in zip(prompts, nxt)])
    torch.testing.assert_close(ours.float(), ref.float(), atol=2e-4, rtol=2e-4)


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
