"""DeepSeek V2 / V3 served through sglang.Engine: fp32 greedy tokens equal HF transformers' on random checkpoints saved
by transformers' own DeepseekV2Config / DeepseekV3Config (4 layers, the first dense, then routed + shared experts;
kv_lora_rank 64, so the latent row is 64 + 16 = 80 wide). HF's greedy choice is read teacher-forced (its argmax after
every prefix of prompt + our tokens, one forward per request), which equals our tokens exactly when they are HF's
greedy continuation.

    v2        q_proj (q_lora_rank None), softmax group_limited_greedy (n_group 4, topk_group 2), routed_scaling_factor
    v2_qlora  q_a_proj / q_a_layernorm / q_b_proj (q_lora_rank 96), softmax greedy
    v3        q_lora 96, sigmoid noaux_tc (n_group 4, topk_group 2) with a random e_score_correction_bias,
              norm_topk_prob, routed_scaling_factor 2.5, YaRN (factor 8 past 32 positions, mscale != mscale_all_dim),
              and an MTP layer's tensors (model.layers.4.*) in the checkpoint that the load skips; tp=1 and tp=2
Each engine runs: 8 prompts prefilled in 16-token chunks; prompts extending a cached prefix (hits); more requests than
the 256-token pool holds (decode retracts). After each, the allocator is idle and intact, and the KV pool is the latent
pool (one 80-wide row per token and layer, the same on every rank)."""

import logging
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang import Engine
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import assert_idle_and_intact, shutdown
from sglang.test.hf_greedy_reference import teacher_forced_choices as hf_greedy_choices
from sglang.test.retraction_checks import greedy, retraction_prompts, run_retraction

register_cpu_ci(est_time=45, suite="cpu")

VOCAB = 512
CHUNK = 16
KV_LORA, ROPE = 64, 16
FLAGS = dict(dtype="float32", skip_tokenizer_init=True, max_total_tokens=256, chunked_prefill_size=CHUNK,
             log_level="warning", random_seed=0)
PROMPTS = [[(29 * j + 7 * i + 1) % VOCAB for j in range(20 + 5 * i)] for i in range(8)]
PREFIX = [(17 * j + 2) % VOCAB for j in range(41)]
SUFFIXES = [[400, 401], [7, 8, 9], [250]]
# 8 x (11-14 prompt + 32 new) tokens exceed the 256-token pool: decode must retract
RETRACT = retraction_prompts(VOCAB)
YARN = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32, "mscale": 1.0,
        "mscale_all_dim": 0.8, "beta_fast": 32.0, "beta_slow": 1.0, "rope_theta": 10000.0}


def make_deepseek(kind: str, **overrides):
    """A random fp32 DeepSeek model of transformers (kind: v2 / v2_qlora / v3); overrides: config fields."""
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM

    fields = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                  num_hidden_layers=4, num_attention_heads=4, kv_lora_rank=KV_LORA, qk_nope_head_dim=32,
                  qk_rope_head_dim=ROPE, v_head_dim=32, first_k_dense_replace=1, n_shared_experts=1,
                  max_position_embeddings=256, eos_token_id=None, bos_token_id=None, tie_word_embeddings=False)
    if kind == "v3":
        fields.update(q_lora_rank=96, n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
                      norm_topk_prob=True, routed_scaling_factor=2.5, rope_parameters=YARN)
        model = DeepseekV3ForCausalLM(DeepseekV3Config(**{**fields, **overrides}))
    else:
        grouped = dict(topk_method="group_limited_greedy", n_group=4, topk_group=2, routed_scaling_factor=2.0)
        fields.update(n_routed_experts=8, num_experts_per_tok=2, **(grouped if kind == "v2" else {}),
                      q_lora_rank=96 if kind == "v2_qlora" else None)
        model = DeepseekV2ForCausalLM(DeepseekV2Config(**{**fields, **overrides}))
    with torch.no_grad():  # more spread than HF's init, so greedy paths and routing are not degenerate
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
        for module in model.modules():
            if hasattr(module, "e_score_correction_bias"):
                module.e_score_correction_bias.normal_(0, 0.5)
    return model.float().eval()


def add_mtp_layer(path: str, num_layers: int) -> None:
    """The checkpoint plus the tensors of a V3 multi-token-prediction layer (model.layers.{num_layers}.*: a decoder
    layer with enorm / hnorm / eh_proj / shared_head), as DeepSeek-V3's checkpoint carries them."""
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    last = f"model.layers.{num_layers - 1}."
    mtp = {name.replace(last, f"model.layers.{num_layers}."): t.clone() for name, t in tensors.items()
           if name.startswith(last)}
    hidden = tensors["model.norm.weight"].shape[0]
    mtp.update({f"model.layers.{num_layers}.enorm.weight": torch.ones(hidden),
                f"model.layers.{num_layers}.hnorm.weight": torch.ones(hidden),
                f"model.layers.{num_layers}.eh_proj.weight": torch.randn(hidden, 2 * hidden),
                f"model.layers.{num_layers}.shared_head.head.weight": torch.randn(VOCAB, hidden)})
    save_file({**tensors, **mtp}, file, metadata={"format": "pt"})


def save(kind: str, root: str) -> str:
    torch.manual_seed({"v2": 0, "v2_qlora": 1, "v3": 2}[kind])
    path = os.path.join(root, kind)
    make_deepseek(kind).save_pretrained(path)
    if kind == "v3":
        add_mtp_layer(path, 4)
    return path


def scenarios(engine) -> dict:
    runner = engine.scheduler.model_runner
    pool = runner.token_to_kv_pool
    out = {"latent_pool": (getattr(pool, "is_mla", False), tuple(pool.get_key_buffer(0).shape[1:]))}
    out["prompts"] = [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=greedy(12))]
    assert_idle_and_intact(engine)
    engine.flush_cache()
    engine.generate(input_ids=[PREFIX + [1]], sampling_params=greedy(1))  # caches the shared prefix
    outs = engine.generate(input_ids=[PREFIX + s for s in SUFFIXES], sampling_params=greedy(10))
    out["prefix"] = [o["output_ids"] for o in outs]
    out["prefix_hits"] = [o["meta_info"]["cached_tokens"] for o in outs]
    out["retraction"], out["num_retractions"] = run_retraction(engine, RETRACT)
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("deepseek"))
    return {kind: save(kind, root) for kind in ("v2", "v2_qlora", "v3")}


@pytest.fixture(scope="module", params=[("v2", 1), ("v2_qlora", 1), ("v3", 1), ("v3", 2)],
                ids=["v2-tp1", "v2_qlora-tp1", "v3-tp1", "v3-tp2"])
def served(request, checkpoints):
    kind, tp = request.param
    engine = Engine(model_path=checkpoints[kind], tp_size=tp, **FLAGS)
    try:
        return scenarios(engine), checkpoints[kind]
    finally:
        shutdown(engine)


def test_prompts_in_chunks_equal_hf(served):
    got, path = served
    assert got["latent_pool"] == (True, (1, KV_LORA + ROPE))
    assert max(len(p) for p in PROMPTS) > 3 * CHUNK
    assert got["prompts"] == hf_greedy_choices(path, PROMPTS, got["prompts"])


def test_prefix_cache_hits(served):
    got, path = served
    assert all(h >= len(PREFIX) - 1 for h in got["prefix_hits"]), got["prefix_hits"]
    assert got["prefix"] == hf_greedy_choices(path, [PREFIX + s for s in SUFFIXES], got["prefix"])


def test_retraction(served):
    got, path = served
    assert got["num_retractions"] > 0
    assert got["retraction"] == hf_greedy_choices(path, RETRACT, got["retraction"])


def test_mtp_layer_skipped_on_load(checkpoints, caplog):
    """The V3 checkpoint's model.layers.4.* (the MTP layer) is skipped, named once in the log; the 4 served layers
    load every other tensor (a missing or unknown one is an error: load_weights checks both)."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader import load_model

    with caplog.at_level(logging.INFO, logger="sglang.srt.models.deepseek_v2"):
        model = load_model(ModelConfig.from_pretrained(checkpoints["v3"], dtype="float32"))
    notes = [r.getMessage() for r in caplog.records if "multi-token-prediction" in r.getMessage()]
    assert len(notes) == 1 and "model.layers.4.*" in notes[0], notes
    assert len(model.model.layers) == 4
