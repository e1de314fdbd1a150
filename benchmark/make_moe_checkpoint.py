"""Build the MoE benchmark checkpoint locally: a random-weight Qwen3-MoE of realistic proportions (no pretrained MoE
small enough exists on the test machines) in HF layout, bf16, with the default model's (SmolLM2) tokenizer and chat
template so every server can load it and chat clients can talk to it.

Geometry (issue 21; sglang.test.moe_fixtures.BENCHMARK_GEOMETRY): hidden 1024, 64 experts, top 8, expert
intermediate 256, 16 heads / 4 KV heads of 64, vocabulary 49,152 untied; 12 layers by default: 0.74 B parameters,
0.21 B active per token (printed; the input embedding counts whole, though a token reads one row of it).

    python benchmark/make_moe_checkpoint.py OUT_DIR [--layers 12]
"""

import argparse
import json
import os

from sglang.test.engine_fixtures import default_model_dir
from sglang.test.moe_fixtures import BENCHMARK_GEOMETRY, make_benchmark_qwen3_moe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir())
    make_benchmark_qwen3_moe(a.out, num_layers=a.layers, vocab_size=(len(tok) + 63) // 64 * 64, seed=a.seed)
    tok.save_pretrained(a.out)
    with open(os.path.join(a.out, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    g, v, layers = BENCHMARK_GEOMETRY, cfg["vocab_size"], a.layers
    h, d, e, k, n = g["hidden_size"], g["head_dim"], g["num_experts"], g["num_experts_per_tok"], g["moe_intermediate_size"]
    attn = h * d * (g["num_attention_heads"] * 2 + g["num_key_value_heads"] * 2) + 2 * d
    per_layer_dense = attn + 2 * h + e * h  # attention, norms, router
    total = 2 * v * h + h + layers * (per_layer_dense + e * 3 * h * n)
    active = 2 * v * h + h + layers * (per_layer_dense + k * 3 * h * n)
    print(f"{a.out}: {total / 1e9:.2f} B parameters, {active / 1e9:.3f} B active ({layers} layers, {e} experts, "
          f"top {k})")


if __name__ == "__main__":
    main()
