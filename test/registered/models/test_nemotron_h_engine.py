"""Nemotron-H (the Mamba-2 hybrid) served through sglang.Engine: fp32 greedy tokens equal HF transformers' on a random
checkpoint saved by transformers' own NemotronHConfig (blocks "M-M*-M": three Mamba-2 mixers, one attention block
without rope, two relu2 MLPs; 8 Mamba heads of 8 in 2 B/C groups, state 16, conv kernel 4, SSD chunks of 8).
HF's greedy choice is read teacher-forced (its argmax after every prefix of prompt + our tokens, one full forward per
request: HF's chunked scan from the zero state), which equals our tokens exactly when they are HF's greedy
continuation.

Each engine (tp=1 and tp=2) runs: 8 prompts prefilled in 7-token chunks (the scheduler packs requests into a chunk,
each request's state carried from chunk to chunk); two prompts alone whose last piece is 1 or 2 tokens, inside the
K - 1 = 3 conv window (the new conv state keeps older columns); more requests than the 256-token pool holds
(decode retracts; a retracted request re-prefills from the zero state). After each, the allocator is idle and
intact. The state pool's bytes per slot equal the count from config.json (conv channels x (K - 1) in fp32 plus the
fp32 SSM state, per Mamba block) and the plan's linear_state term; the KV pool holds only the attention block."""

import json
import os

import pytest
import torch

from sglang import Engine
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import shutdown
from sglang.test.hf_greedy_reference import teacher_forced_choices
from sglang.test.retraction_checks import greedy, retraction_prompts, run_retraction

register_cpu_ci(est_time=75, suite="cpu")

VOCAB = 512
CHUNK = 7
PATTERN = "M-M*-M"
FLAGS = dict(dtype="float32", skip_tokenizer_init=True, max_total_tokens=256, chunked_prefill_size=CHUNK,
             log_level="warning", random_seed=0)
PROMPTS = [[(29 * j + 7 * i + 1) % VOCAB for j in range(20 + 5 * i)] for i in range(8)]
# alone, each is prefilled as 7 + 7 + 1 / 7 + 7 + 2 tokens: its last piece, inside the conv window, reads the state
CUT = [[(11 * j + 5 * i + 2) % VOCAB for j in range(2 * CHUNK + 1 + i)] for i in range(2)]
# 8 x (11-14 prompt + 32 new) tokens exceed the 256-token pool: decode must retract
RETRACT = retraction_prompts(VOCAB)


def make_nemotron_h(**overrides):
    """A random fp32 NemotronHForCausalLM of transformers; overrides: config fields."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    fields = dict(vocab_size=VOCAB, hidden_size=64, hybrid_override_pattern=PATTERN, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, intermediate_size=96, mamba_num_heads=8, mamba_head_dim=8,
                  n_groups=2, ssm_state_size=16, conv_kernel=4, chunk_size=8, max_position_embeddings=512,
                  eos_token_id=None, bos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    model = NemotronHForCausalLM(NemotronHConfig(**{**fields, **overrides}))
    with torch.no_grad():  # more spread than HF's init, so greedy paths are not degenerate
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
            elif name.endswith("norm.weight") or name.endswith("norm_f.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith(("dt_bias", "D")):
                p.normal_(0, 0.5)
            elif name.endswith("conv1d.bias"):
                p.normal_(0, 0.2)
    return model.float().eval()


def save(root: str, seed: int = 0, **overrides) -> str:
    torch.manual_seed(seed)
    path = os.path.join(root, f"nemotron_h_{seed}")
    make_nemotron_h(**overrides).save_pretrained(path)
    return path


def state_bytes_per_slot(path: str) -> int:
    """The per-request state of every Mamba block from config.json: the conv window (K - 1 inputs of the x, B and
    C channels, in the checkpoint dtype) and the SSM state (heads x head_dim x state size, fp32)."""
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    mambas = cfg["layers_block_type"].count("linear_attention")
    conv_channels = cfg["mamba_num_heads"] * cfg["mamba_head_dim"] + 2 * cfg["n_groups"] * cfg["ssm_state_size"]
    conv = conv_channels * (cfg["conv_kernel"] - 1) * 4
    ssm = cfg["mamba_num_heads"] * cfg["mamba_head_dim"] * cfg["ssm_state_size"] * 4
    return mambas * (conv + ssm)


def scenarios(engine) -> dict:
    runner = engine.scheduler.model_runner
    out = {"kv_layers": runner.token_to_kv_pool.layer_num,
           "state_per_slot": runner.req_to_token_pool.linear_state.bytes_per_slot(),
           "info": engine.get_server_info()}
    out["prompts"] = [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=greedy(12))]
    out["cut"] = [engine.generate(input_ids=[p], sampling_params=greedy(8))[0]["output_ids"] for p in CUT]
    out["retraction"], out["num_retractions"] = run_retraction(engine, RETRACT)
    return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save(str(tmp_path_factory.mktemp("nemotron_h")))


@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def served(request, checkpoint):
    engine = Engine(model_path=checkpoint, tp_size=request.param, **FLAGS)
    try:
        return scenarios(engine)
    finally:
        shutdown(engine)


def test_prompts_in_chunks_equal_hf(served, checkpoint):
    assert max(len(p) for p in PROMPTS) > 6 * CHUNK
    assert served["prompts"] == teacher_forced_choices(checkpoint, PROMPTS, served["prompts"])


def test_last_piece_inside_the_conv_window(served, checkpoint):
    assert [len(p) % CHUNK for p in CUT] == [1, 2]  # < K - 1 = 3 new tokens after two full chunks
    assert served["cut"] == teacher_forced_choices(checkpoint, CUT, served["cut"])


def test_retraction(served, checkpoint):
    assert served["num_retractions"] > 0
    assert served["retraction"] == teacher_forced_choices(checkpoint, RETRACT, served["retraction"])


def test_state_pool_is_the_plan_term(served, checkpoint):
    """State bytes per slot == config.json's count == the plan's; the KV pool holds the one attention block only."""
    per_slot = state_bytes_per_slot(checkpoint)
    plan = served["info"]["memory_plan"]
    assert served["kv_layers"] == PATTERN.count("*")
    ranks = len(served["info"]["memory_plan_per_rank"])
    assert served["state_per_slot"] * ranks == per_slot, (served["state_per_slot"], ranks, per_slot)
    terms = {t["name"]: t["num_bytes"] for t in plan["terms"]}
    assert terms["linear_state"] == served["state_per_slot"] * plan["state_slots"], (terms, plan["state_slots"])


def test_moe_blocks_are_refused_naming_them(checkpoint, tmp_path):
    """An "E" block (Nemotron-3-Nano's MoE) is planned but not served: building the model says so, naming it."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import build_model

    with open(os.path.join(checkpoint, "config.json")) as f:
        cfg = json.load(f)
    cfg["layers_block_type"] = ["linear_attention", "full_attention", "moe"]
    cfg["num_hidden_layers"] = 3
    cfg.update(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
               moe_shared_expert_intermediate_size=32)
    with open(tmp_path / "config.json", "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ValueError, match="MoE blocks .* are planned .* but not served"):
        build_model(ModelConfig.from_pretrained(str(tmp_path), dtype="float32"), device="meta")


def test_w8a8_int8_loads_the_mamba_projections(checkpoint):
    """--quantization w8a8_int8 packs in_proj (one checkpoint tensor of five segments) and the relu2 MLP's up_proj
    through their class loaders: every quantized layer gets all its rows (load_model raises otherwise)."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader import load_model

    model = load_model(ModelConfig.from_pretrained(checkpoint, dtype="bfloat16"), quantization="w8a8_int8")
    mamba, mlp = model.backbone.layers[0].mixer, model.backbone.layers[1].mixer
    assert mamba.in_proj.qweight is not None and mlp.up_proj.qweight is not None
