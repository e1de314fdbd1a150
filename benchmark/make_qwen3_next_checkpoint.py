"""Build the Qwen3-Next benchmark checkpoint locally: a random-weight Qwen3-Next-shaped model (transformers'
Qwen3NextConfig / Qwen3NextForCausalLM) in HF layout, bf16 safetensors, with the default model's (SmolLM2) tokenizer,
which llama.cpp's convert_hf_to_gguf.py recognises by its pre-tokenizer hash ("smollm"), so both servers read the
same weights and the same vocabulary.

Qwen3-Next-80B-A3B's shape scaled down (issue 43): 3 of every 4 layers Gated DeltaNet (full_attention_interval 4;
value heads twice the key heads, dk = dv = 128, a 4-wide causal conv, per-head decay and beta, gated RMSNorm on the
output), the 4th gated full attention (q_proj also yields the output gate; head_dim 256, 2 KV heads, rotary on the
first quarter of each head); every layer a routed MoE of softmax top-k (normalised) beside a shared expert with its
sigmoid gate.

    full (default): hidden 1024, 16 layers (12 linear, 4 full), 8 query heads, linear 8 key / 16 value heads,
                    64 experts of 256, top 8, shared expert 512, vocabulary 49,152 untied:
                    ~1.05 B parameters, ~0.36 B active per token (printed exactly)
    tiny:           hidden 256, 4 layers (3 linear, 1 full), 4 query heads of 64, linear 2 key / 4 value heads of 64,
                    8 experts of 64, top 2, shared expert 64

    python benchmark/make_qwen3_next_checkpoint.py OUT_DIR [--size full|tiny] [--count-only]
"""

import argparse
import json
import os

SIZES = {
    "full": dict(hidden_size=1024, num_hidden_layers=16, num_attention_heads=8, head_dim=256,
                 linear_num_key_heads=8, linear_num_value_heads=16, linear_key_head_dim=128,
                 linear_value_head_dim=128, num_experts=64, moe_intermediate_size=256, num_experts_per_tok=8,
                 shared_expert_intermediate_size=512, intermediate_size=2048),
    "tiny": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, head_dim=64,
                 linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
                 linear_value_head_dim=64, num_experts=8, moe_intermediate_size=64, num_experts_per_tok=2,
                 shared_expert_intermediate_size=64, intermediate_size=512),
}
# what every size shares with Qwen3-Next-80B-A3B's published config (intermediate_size above is unused: every
# layer is sparse, as published, with decoder_sparse_step 1 and no mlp_only_layers)
NEXT_FIXED = dict(num_key_value_heads=2, linear_conv_kernel_dim=4, full_attention_interval=4, decoder_sparse_step=1,
                  mlp_only_layers=[], norm_topk_prob=True, max_position_embeddings=32768, tie_word_embeddings=False,
                  rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False)
ROPE = dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25)


def make_config(size: str, vocab_size: int, bos: int, eos: int):
    from transformers import Qwen3NextConfig

    fixed = {k: v for k, v in NEXT_FIXED.items() if k != "full_attention_interval"}
    cfg = Qwen3NextConfig(vocab_size=vocab_size, bos_token_id=bos, eos_token_id=eos, rope_parameters=dict(ROPE),
                          **fixed, **SIZES[size])
    interval = NEXT_FIXED["full_attention_interval"]
    # the published config.json lists layer_types; write the 3-linear-then-1-full pattern explicitly
    cfg.layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                       for i in range(cfg.num_hidden_layers)]
    cfg.architectures = ["Qwen3NextForCausalLM"]
    return cfg


def count(cfg) -> tuple:
    """(total, active per token) from the model built on the meta device: exact, and nothing allocated."""
    import torch
    from transformers import Qwen3NextForCausalLM

    with torch.device("meta"):
        model = Qwen3NextForCausalLM(cfg)
    total = sum(p.numel() for p in model.parameters())
    unused = cfg.num_experts - cfg.num_experts_per_tok  # every layer sparse (decoder_sparse_step 1)
    active = total - cfg.num_hidden_layers * unused * 3 * cfg.hidden_size * cfg.moe_intermediate_size
    return total, active


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--size", choices=sorted(SIZES), default="full")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--count-only", action="store_true", help="print the parameter counts, write nothing")
    a = ap.parse_args()
    import torch
    from transformers import AutoTokenizer, Qwen3NextForCausalLM

    from sglang.test.engine_fixtures import default_model_dir

    tok = AutoTokenizer.from_pretrained(default_model_dir())
    cfg = make_config(a.size, (len(tok) + 63) // 64 * 64, tok.bos_token_id, tok.eos_token_id)
    total, active = count(cfg)
    kinds = cfg.layer_types
    print(f"{a.out}: {a.size}: {total / 1e9:.3f} B parameters, {active / 1e9:.3f} B active "
          f"({cfg.num_hidden_layers} layers: {kinds.count('linear_attention')} Gated DeltaNet, "
          f"{kinds.count('full_attention')} full attention; hidden {cfg.hidden_size}, {cfg.num_experts} experts "
          f"of {cfg.moe_intermediate_size}, top {cfg.num_experts_per_tok}, shared expert "
          f"{cfg.shared_expert_intermediate_size}, vocabulary {cfg.vocab_size})")
    if a.count_only:
        return
    torch.manual_seed(a.seed)
    torch.set_default_dtype(torch.bfloat16)  # 1 B parameters built in bf16 directly: half the memory of fp32
    model = Qwen3NextForCausalLM(cfg).eval()
    model.save_pretrained(a.out, safe_serialization=True)
    tok.save_pretrained(a.out)
    with open(os.path.join(a.out, "config.json")) as f:
        saved = json.load(f)
    # the published config.json spells these at the top level (full_attention_interval, which llama.cpp's converter
    # reads, rope_theta, partial_rotary_factor, torch_dtype); transformers' config class nests or drops them
    saved.update(full_attention_interval=NEXT_FIXED["full_attention_interval"], torch_dtype="bfloat16",
                 rope_theta=ROPE["rope_theta"], partial_rotary_factor=ROPE["partial_rotary_factor"])
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(saved, f, indent=2)


if __name__ == "__main__":
    main()
