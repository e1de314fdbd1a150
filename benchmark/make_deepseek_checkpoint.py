"""Build the DeepSeek benchmark checkpoint locally: a random-weight DeepSeek-V3-shaped model (transformers'
DeepseekV3Config / DeepseekV3ForCausalLM) in HF layout, bf16 safetensors, with the default model's (SmolLM2) tokenizer,
which llama.cpp's convert_hf_to_gguf.py recognises by its pre-tokenizer hash ("smollm"), so both servers read the
same weights and the same vocabulary.

V3's shape scaled down (issue 42): MLA with q_lora, kv_lora 512 + rope 64 (the 576-wide latent row of DeepSeek-V3),
qk_nope 128 / v 128 per head, a dense first layer, then routed + 1 shared expert per layer, sigmoid scores with
noaux_tc group-limited top-k (8 groups, 4 kept) and a correction bias, routed_scaling_factor 2.5.

    full (default): hidden 1536, 11 layers (1 dense, intermediate 4096), 16 heads, q_lora 768, 64 experts of 256,
                    top 8, vocabulary 49,152 untied: 1.04 B parameters, 0.38 B active per token
    tiny:           hidden 256, 2 layers (1 dense, intermediate 512), 4 heads, q_lora 128, 8 experts of 64, top 2
                    (4 groups, 2 kept); kv_lora 512 + rope 64 kept, so the latent kernels run at V3's width

    python benchmark/make_deepseek_checkpoint.py OUT_DIR [--size full|tiny] [--count-only]
"""

import argparse
import json
import os

SIZES = {
    "full": dict(hidden_size=1536, num_hidden_layers=11, intermediate_size=4096, num_attention_heads=16,
                 q_lora_rank=768, n_routed_experts=64, moe_intermediate_size=256, num_experts_per_tok=8,
                 n_group=8, topk_group=4),
    "tiny": dict(hidden_size=256, num_hidden_layers=2, intermediate_size=512, num_attention_heads=4,
                 q_lora_rank=128, n_routed_experts=8, moe_intermediate_size=64, num_experts_per_tok=2,
                 n_group=4, topk_group=2),
}
# what every size shares with DeepSeek-V3's published config
V3_FIXED = dict(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, first_k_dense_replace=1,
                n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True, max_position_embeddings=4096,
                tie_word_embeddings=False, num_nextn_predict_layers=0)


def make_config(size: str, vocab_size: int, bos: int, eos: int):
    from transformers import DeepseekV3Config

    cfg = DeepseekV3Config(vocab_size=vocab_size, bos_token_id=bos, eos_token_id=eos, **V3_FIXED, **SIZES[size])
    cfg.num_key_value_heads = cfg.num_attention_heads
    cfg.architectures = ["DeepseekV3ForCausalLM"]
    return cfg


def count(cfg) -> tuple:
    """(total, active per token) from the model built on the meta device: exact, and nothing allocated."""
    import torch
    from transformers import DeepseekV3ForCausalLM

    with torch.device("meta"):
        model = DeepseekV3ForCausalLM(cfg)
    total = sum(p.numel() for p in model.parameters())
    moe_layers = cfg.num_hidden_layers - cfg.first_k_dense_replace
    unused = cfg.n_routed_experts - cfg.num_experts_per_tok
    active = total - moe_layers * unused * 3 * cfg.hidden_size * cfg.moe_intermediate_size
    return total, active


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--size", choices=sorted(SIZES), default="full")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--count-only", action="store_true", help="print the parameter counts, write nothing")
    a = ap.parse_args()
    import torch
    from transformers import AutoTokenizer, DeepseekV3ForCausalLM

    from sglang.test.engine_fixtures import default_model_dir

    tok = AutoTokenizer.from_pretrained(default_model_dir())
    cfg = make_config(a.size, (len(tok) + 63) // 64 * 64, tok.bos_token_id, tok.eos_token_id)
    total, active = count(cfg)
    print(f"{a.out}: {a.size}: {total / 1e9:.3f} B parameters, {active / 1e9:.3f} B active "
          f"({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, {cfg.n_routed_experts} experts, "
          f"top {cfg.num_experts_per_tok}, vocabulary {cfg.vocab_size})")
    if a.count_only:
        return
    torch.manual_seed(a.seed)
    torch.set_default_dtype(torch.bfloat16)  # 1 B parameters built in bf16 directly: half the memory of fp32
    model = DeepseekV3ForCausalLM(cfg).eval()
    with torch.no_grad():  # HF leaves the bias at zero; a random one makes noaux_tc's correction do something
        for module in model.modules():
            if hasattr(module, "e_score_correction_bias"):
                module.e_score_correction_bias.normal_(0, 0.1)
    model.save_pretrained(a.out, safe_serialization=True)
    tok.save_pretrained(a.out)
    with open(os.path.join(a.out, "config.json")) as f:
        saved = json.load(f)
    # DeepSeek-V3's published config names its routing; transformers' config class does not serialise these, and
    # llama.cpp's deepseek2 loader reads a missing gating function as softmax (V2's), so they are written here
    saved.update(scoring_func="sigmoid", topk_method="noaux_tc", torch_dtype="bfloat16")
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(saved, f, indent=2)


if __name__ == "__main__":
    main()
