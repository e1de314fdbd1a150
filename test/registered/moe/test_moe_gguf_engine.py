"""GGUF MoE checkpoints in llama.cpp's layout through sglang.Engine: fp32 greedy tokens equal HF transformers' on the
same weights.

moe_gguf_fixtures.py writes a random-weight HF checkpoint (moe_fixtures.py) as a GGUF file with the `gguf` package:
experts stacked into blk.N.ffn_{gate,up,down}_exps [E, ...], the router blk.N.ffn_gate_inp, Qwen2-MoE's shared expert
blk.N.ffn_*_shexp and its gate ffn_gate_inp_shexp [K]; Mixtral as a 'llama' file with experts (q/k rows permuted for
llama.cpp's rope). The engine is given the .gguf path, converts it (model_loader/gguf_moe.py) and serves it; HF
transformers runs the safetensors twin the file was written from.
    F32 files       Qwen3-MoE ('qwen3moe'), Mixtral, Qwen2-MoE ('qwen2moe', one dense layer): 8 prompts and a
                    prompt longer than the chunk (chunked prefill)
    a Q4_0 file     read dense (--quantization none, fp32): each expert's slab of blocks is split out and
                    dequantized; HF runs the checkpoint whose block tensors are the `gguf` package's own
                    dequantization of those blocks
The converted config.json names the architecture, experts, top-k, renormalisation and dense layers as the HF one.
"""

import json

import numpy as np
import pytest
import torch

from sglang import Engine
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import hf_greedy, shutdown
from sglang.test.moe_fixtures import VOCAB_SIZE, make_random_mixtral, make_random_qwen2_moe, make_random_qwen3_moe
from sglang.test.moe_gguf_fixtures import write_moe_gguf

register_cpu_ci(est_time=20, suite="cpu")

CHUNK = 32
PROMPTS = [[(37 * i + 11 * j + 5) % VOCAB_SIZE for j in range(5 + i)] for i in range(8)]
LONG = [(29 * j + 1) % VOCAB_SIZE for j in range(2 * CHUNK + 7)]
NEW_TOKENS = 12
MAKERS = {"qwen3_moe": make_random_qwen3_moe, "mixtral": make_random_mixtral, "qwen2_moe": make_random_qwen2_moe}
CONFIG_FIELDS = ("architectures", "model_type", "num_experts_per_tok", "hidden_size", "num_hidden_layers")


def engine_tokens(gguf_path: str, cache_dir: str):
    engine = Engine(model_path=gguf_path, dtype="float32", skip_tokenizer_init=True, max_total_tokens=512,
                    chunked_prefill_size=CHUNK, model_cache_dir=cache_dir, log_level="warning", random_seed=0)
    try:
        greedy = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
        assert engine.get_server_info()["quantization"] == "none"  # fp32: the dequantized reference path
        outs = engine.generate(input_ids=PROMPTS + [LONG], sampling_params=greedy)
        return [o["output_ids"] for o in outs], engine.scheduler.model_runner.model_config.hf_config
    finally:
        shutdown(engine)


def experts_of(config: dict) -> int:
    return config.get("num_experts") or config["num_local_experts"]  # transformers 5 writes num_local_experts


@pytest.mark.parametrize("arch", list(MAKERS))
def test_f32_file_gives_hf_tokens(arch, tmp_path):
    hf_dir = MAKERS[arch](str(tmp_path / "hf"))
    gguf_path = write_moe_gguf(hf_dir, str(tmp_path / f"{arch}.gguf"), "F32")
    got, converted = engine_tokens(gguf_path, str(tmp_path / "cache"))
    assert got == hf_greedy(hf_dir, PROMPTS + [LONG], NEW_TOKENS)
    with open(f"{hf_dir}/config.json") as f:
        want = json.load(f)
    conv = converted.to_dict()
    assert {k: conv[k] for k in CONFIG_FIELDS} == {k: want[k] for k in CONFIG_FIELDS}
    assert experts_of(conv) == experts_of(want)
    if arch != "mixtral":
        assert conv["norm_topk_prob"] == want["norm_topk_prob"]
        assert conv["moe_intermediate_size"] == want["moe_intermediate_size"]
        assert list(conv["mlp_only_layers"]) == list(want["mlp_only_layers"])
    if arch == "qwen2_moe":
        assert conv["shared_expert_intermediate_size"] == want["shared_expert_intermediate_size"]
        assert conv["intermediate_size"] == want["intermediate_size"]  # the dense layer's width


def dequantized_twin(hf_dir: str, out_dir: str, kind: str) -> str:
    """hf_dir with every tensor the GGUF file holds as blocks (the blocks' 2-D and per-expert matrices; not the
    embedding, lm_head, norms or routers) replaced by gguf.quants' dequantization of its `kind` blocks."""
    import gguf.quants as gq
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig

    qtype = gq.GGMLQuantizationType[kind]
    state = load_file(f"{hf_dir}/model.safetensors")
    for name, w in state.items():
        if name.startswith("model.layers.") and w.dim() == 2 and not name.endswith("mlp.gate.weight"):
            blocks = gq.quantize(w.numpy(), qtype)
            state[name] = torch.from_numpy(np.ascontiguousarray(gq.dequantize(blocks, qtype).reshape(w.shape)))
    save_file(state, f"{out_dir}/model.safetensors", metadata={"format": "pt"})
    AutoConfig.from_pretrained(hf_dir).save_pretrained(out_dir)
    return out_dir


def test_q4_0_file_read_dense_gives_hf_tokens_on_its_blocks(tmp_path):
    hf_dir = make_random_qwen3_moe(str(tmp_path / "hf"))
    gguf_path = write_moe_gguf(hf_dir, str(tmp_path / "q4_0.gguf"), "Q4_0")
    (tmp_path / "twin").mkdir()
    twin = dequantized_twin(hf_dir, str(tmp_path / "twin"), "Q4_0")
    got, _ = engine_tokens(gguf_path, str(tmp_path / "cache"))
    want = hf_greedy(twin, PROMPTS + [LONG], NEW_TOKENS)
    assert got == want
    assert want != hf_greedy(hf_dir, PROMPTS + [LONG], NEW_TOKENS)  # the blocks' rounding changes the tokens
