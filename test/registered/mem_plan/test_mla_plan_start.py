"""`sglang plan` predicts a DeepSeek-V3 (MLA) start: a random V3 checkpoint (transformers' own DeepseekV3Config, 4
layers, noaux_tc grouped routing, one dense layer) at tp=1 and tp=2 on CPU.

The start holds the latent pool (mem_cache/mla_pool.py): kv_cache bytes == (tokens + one page) x layers x
(kv_lora_rank + qk_rope_head_dim) x 4 B, computed here from config.json, and at tp=2 EVERY rank holds that same pool
(the latent is replicated, not split by heads; the plan says so). `sglang plan` with the same flags predicts the
start's token count within 3% (the start measures weights and activations, the dry run uses formulas), and
/server_info's kv_cache names the latent layout and its row width. A quantized --kv-cache-dtype is refused at start,
naming the flag.
"""

import contextlib
import io
import json
import os

import pytest
import torch

from sglang import Engine
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import shutdown

register_cpu_ci(est_time=75, suite="cpu")

KV_TOKENS_TOLERANCE = 0.03
CHUNK = 64
CONFIG = dict(vocab_size=384, hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1,
              num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1, routed_scaling_factor=2.5,
              kv_lora_rank=64, q_lora_rank=96, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
              max_position_embeddings=1024, rope_theta=10000.0, tie_word_embeddings=False)


def make_v3(path: str) -> dict:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    DeepseekV3ForCausalLM(DeepseekV3Config(**CONFIG)).float().eval().save_pretrained(path)
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


def dry_run(path: str, tp: int) -> dict:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        from sglang.cli.plan import main as plan_main

        status = plan_main(["--device", "cpu", "--model-path", path, "--dtype", "float32", "--max-total-memory-gb",
                            "1", "--chunked-prefill-size", str(CHUNK), "--tp-size", str(tp), "--json"])
    out = json.loads(buf.getvalue())
    assert status == 0, out
    return out["plan"]


@pytest.mark.parametrize("tp", [1, 2])
def test_plan_predicts_the_v3_start(tmp_path, tp):
    path = str(tmp_path / "v3")
    cfg = make_v3(path)
    row_bytes = (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 4  # fp32
    engine = Engine(model_path=path, skip_tokenizer_init=True, log_level="warning", dtype="float32",
                    chunked_prefill_size=CHUNK, max_total_memory_gb=1, tp_size=tp, random_seed=0)
    try:
        out = engine.generate(input_ids=[[5, 9, 11, 200, 3]], sampling_params={"temperature": 0, "max_new_tokens": 4,
                                                                                 "ignore_eos": True})
        assert len(out[0]["output_ids"]) == 4
        info = engine.get_server_info()
        served, ranks, kv = info["memory_plan"], info["memory_plan_per_rank"], info["kv_cache"]
        runner = engine.scheduler.model_runner
        page = runner.server_args.page_size
    finally:
        shutdown(engine)
    tokens = served["max_total_num_tokens"]
    pool_bytes = (tokens + page) * cfg["num_hidden_layers"] * row_bytes
    assert kv["pool_layout"] == "mla_latent" and kv["row_width"] == 80, kv
    assert kv["bytes_per_token"] == cfg["num_hidden_layers"] * row_bytes, kv
    assert {t["name"]: t["num_bytes"] for t in served["terms"]}["kv_cache"] == pool_bytes
    assert len(ranks) == tp
    for rank in ranks:  # every rank holds the whole latent pool (replicated), as planned
        assert rank["allocated_bytes"]["kv_cache"] == pool_bytes, rank
        assert rank["max_total_num_tokens"] == tokens
    planned = dry_run(path, tp)
    assert [t["name"] for t in planned["terms"]] == [t["name"] for t in served["terms"]]
    assert abs(planned["max_total_num_tokens"] - tokens) <= KV_TOKENS_TOLERANCE * tokens, (planned, served)
    print(f"V3 tp={tp}: plan {planned['max_total_num_tokens']} tokens / start {tokens} tokens "
          f"({(planned['max_total_num_tokens'] - tokens) / tokens:+.2%}), kv_cache {pool_bytes:,} B per rank")


def test_quantized_latent_cache_is_refused_naming_the_flag(tmp_path):
    path = str(tmp_path / "v3")
    make_v3(path)
    with pytest.raises(Exception, match="--kv-cache-dtype fp8_e4m3"):
        engine = Engine(model_path=path, skip_tokenizer_init=True, log_level="error", dtype="float32",
                        chunked_prefill_size=CHUNK, max_total_memory_gb=1, kv_cache_dtype="fp8_e4m3")
        shutdown(engine)
