"""Qwen3-Next served through sglang.Engine: fp32 greedy tokens equal HF transformers' on a random checkpoint saved by
transformers' own Qwen3NextConfig (4 layers: linear, full, linear, full; 8 experts top 2 with a shared expert, layer 2
dense through mlp_only_layers; 2 key heads / 4 value heads of 16 in the Gated DeltaNet, conv kernel 4; 4 query / 2 KV
heads of 32 in the gated attention, rope on a quarter of each head; every (1 + w) norm weight random, so a plain w
would be caught). The checkpoint also carries an mtp.* layer, skipped on load. HF's greedy choice is read
teacher-forced (its argmax after every prefix of prompt + our tokens, one full forward per request: its chunked delta
rule from the zero state), which equals our tokens exactly when they are HF's greedy continuation.

Each engine (tp=1 with 7-token prefill chunks, tp=2 with 5-token chunks) runs: 8 prompts batched (the scheduler packs
requests into each chunk); prompts alone whose last chunk is 1, 2, 3 or 5 tokens (inside or at the K - 1 = 3 conv
window: the conv and recurrent state carry from chunk to chunk); a prompt repeated (prefix caching is off for this
model: no cached tokens, the same tokens); more requests than the 256-token pool holds (decode retracts; a retracted
request re-prefills from the zero state). After each, the allocator is idle and intact. The state pool's bytes per
slot equal the count from config.json and the plan's linear_state term; the KV pool holds the 2 full layers only."""

import json
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

register_cpu_ci(est_time=90, suite="cpu")

VOCAB = 512
LAYER_TYPES = ["linear_attention", "full_attention", "linear_attention", "full_attention"]
CHUNKS = {1: 7, 2: 5}  # prefill chunk per tp size
FLAGS = dict(dtype="float32", skip_tokenizer_init=True, max_total_tokens=256, log_level="warning", random_seed=0)
PROMPTS = [[(29 * j + 7 * i + 1) % VOCAB for j in range(20 + 5 * i)] for i in range(8)]
CUT_TAILS = (1, 2, 3, 5)  # tokens of a lone prompt past its last chunk edge
# 8 x (11-14 prompt + 32 new) tokens exceed the 256-token pool: decode must retract
RETRACT = retraction_prompts(VOCAB)


def make_qwen3_next(**overrides):
    """A random fp32 Qwen3NextForCausalLM of transformers; overrides: config fields."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    fields = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4, layer_types=LAYER_TYPES,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
                  linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                  linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                  shared_expert_intermediate_size=48, norm_topk_prob=True, mlp_only_layers=[2],
                  max_position_embeddings=512, eos_token_id=None, bos_token_id=None, pad_token_id=None,
                  tie_word_embeddings=False)
    model = Qwen3NextForCausalLM(Qwen3NextConfig(**{**fields, **overrides}))
    with torch.no_grad():  # more spread than HF's init, so greedy paths and routing are not degenerate
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
            elif name.endswith("linear_attn.norm.weight"):  # the gated norm scales by w
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif name.endswith("norm.weight"):  # the (1 + w) norms: zero-centred weights
                p.normal_(0, 0.3)
            elif name.endswith("dt_bias"):
                p.normal_(0, 0.5)
    return model.float().eval()


def add_mtp_layer(path: str) -> None:
    """The checkpoint plus multi-token-prediction tensors named as Qwen3-Next's release names them (mtp.*)."""
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    mtp = {name.replace("model.layers.3.", "mtp.layers.0."): t.clone() for name, t in tensors.items()
           if name.startswith("model.layers.3.")}
    hidden = tensors["model.norm.weight"].shape[0]
    mtp.update({"mtp.fc.weight": torch.randn(hidden, 2 * hidden), "mtp.norm.weight": torch.zeros(hidden),
                "mtp.pre_fc_norm_embedding.weight": torch.zeros(hidden),
                "mtp.pre_fc_norm_hidden.weight": torch.zeros(hidden)})
    save_file({**tensors, **mtp}, file, metadata={"format": "pt"})


def save(root: str, seed: int = 0, **overrides) -> str:
    torch.manual_seed(seed)
    path = os.path.join(root, f"qwen3_next_{seed}")
    make_qwen3_next(**overrides).save_pretrained(path)
    add_mtp_layer(path)
    return path


def state_bytes_per_slot(path: str) -> int:
    """Every linear layer's state from config.json, all ranks together: the conv window (K - 1 inputs of the q, k and
    v channels, fp32 here) and the recurrent state (value heads x dk x dv, fp32)."""
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    conv = (2 * nk * dk + nv * dv) * (cfg["linear_conv_kernel_dim"] - 1) * 4
    return cfg["layer_types"].count("linear_attention") * (conv + nv * dk * dv * 4)


def cut_prompts(chunk: int):
    return [[(11 * j + 5 * t) % VOCAB for j in range(chunk + t)] for t in CUT_TAILS]


def scenarios(engine, chunk: int) -> dict:
    runner = engine.scheduler.model_runner
    out = {"kv_layers": runner.token_to_kv_pool.layer_num,
           "state_per_slot": runner.req_to_token_pool.linear_state.bytes_per_slot(),
           "info": engine.get_server_info()}
    out["prompts"] = [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=greedy(12))]
    assert_idle_and_intact(engine)
    out["cut"] = [engine.generate(input_ids=p, sampling_params=greedy(6))["output_ids"] for p in cut_prompts(chunk)]
    twice = [engine.generate(input_ids=PROMPTS[3], sampling_params=greedy(6)) for _ in range(2)]
    out["repeat"] = [o["output_ids"] for o in twice]
    out["repeat_cached"] = [o["meta_info"]["cached_tokens"] for o in twice]
    out["retraction"], out["num_retractions"] = run_retraction(engine, RETRACT)
    return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save(str(tmp_path_factory.mktemp("qwen3_next")))


@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def served(request, checkpoint):
    tp = request.param
    engine = Engine(model_path=checkpoint, tp_size=tp, chunked_prefill_size=CHUNKS[tp], **FLAGS)
    try:
        return scenarios(engine, CHUNKS[tp]), CHUNKS[tp]
    finally:
        shutdown(engine)


def test_prompts_in_chunks_equal_hf(served, checkpoint):
    got, chunk = served
    assert max(len(p) for p in PROMPTS) > 6 * chunk
    assert got["prompts"] == hf_greedy_choices(checkpoint, PROMPTS, got["prompts"])


def test_chunk_edges_inside_the_conv_window_equal_hf(served, checkpoint):
    got, chunk = served
    assert got["cut"] == hf_greedy_choices(checkpoint, cut_prompts(chunk), got["cut"])


def test_prefix_cache_off_recomputes_the_same_tokens(served, checkpoint):
    got, _ = served
    assert got["repeat_cached"] == [0, 0]
    assert got["repeat"][0] == got["repeat"][1] == got["prompts"][3][:6]
    assert got["info"]["prefix_cache"]["enabled"] is False
    assert "recurrent state" in got["info"]["prefix_cache"]["reason"]


def test_retraction(served, checkpoint):
    got, _ = served
    assert got["num_retractions"] > 0
    assert got["retraction"] == hf_greedy_choices(checkpoint, RETRACT, got["retraction"])


def test_state_pool_is_the_plan_term(served, checkpoint):
    """State bytes per slot (all ranks) == config.json's count; == the plan's linear_state term per slot; the KV pool
    holds the 2 full-attention layers only."""
    got, _ = served
    info = got["info"]
    ranks = len(info["memory_plan_per_rank"])
    assert got["kv_layers"] == LAYER_TYPES.count("full_attention")
    assert got["state_per_slot"] * ranks == state_bytes_per_slot(checkpoint), (got["state_per_slot"], ranks)
    plan = info["memory_plan"]
    terms = {t["name"]: t["num_bytes"] for t in plan["terms"]}
    assert terms["linear_state"] == got["state_per_slot"] * plan["state_slots"], (terms, plan["state_slots"])
    for rank in info["memory_plan_per_rank"]:  # each rank holds its heads' share, as planned
        assert rank["allocated_bytes"]["linear_state"] == terms["linear_state"], rank["allocated_bytes"]


def test_mtp_layer_skipped_on_load(checkpoint, caplog):
    """The checkpoint's mtp.* tensors are skipped, named once in the log; every other tensor loads (a missing or
    unknown one is an error: load_weights checks both)."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader import load_model

    with caplog.at_level(logging.INFO, logger="sglang.srt.models.qwen3_next"):
        model = load_model(ModelConfig.from_pretrained(checkpoint, dtype="float32"))
    notes = [r.getMessage() for r in caplog.records if "multi-token-prediction" in r.getMessage()]
    assert len(notes) == 1 and "mtp.*" in notes[0], notes
    assert [layer.is_linear for layer in model.model.layers] == [True, False, True, False]
