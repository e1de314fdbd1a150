"""Write an HF MoE checkpoint (moe_fixtures.py) as a GGUF file in llama.cpp's layout, with the `gguf` package's
GGUFWriter, so the converter and the quantized loader are tested on files built here.

    write_moe_gguf(hf_dir, out_path, weight_type="Q8_0", tensor_types=None, chat_template=None) -> out_path

Architectures: qwen3_moe -> 'qwen3moe', qwen2_moe -> 'qwen2moe', mixtral -> 'llama' (q/k rows permuted for
llama.cpp's interleaved rope, as its converter does). Each layer's experts are stacked into ffn_{gate,up,down}_exps
[E, N, K] / [E, K, N]; the qwen2moe shared expert is ffn_*_shexp with its gate ffn_gate_inp_shexp [K].
weight_type: the type of every 2-D / 3-D linear weight (attention, dense MLP, experts, shared expert): F32, F16,
Q8_0, Q4_0 or Q4_1 (blocks by gguf.quants.quantize); tensor_types overrides it per kind of block tensor, e.g.
{"ffn_down_exps": "Q8_0"}, or for one layer's, {"blk.0.ffn_down_exps": "Q8_0"} (llama.cpp's mixed files keep some
tensors wider). The embedding and the output stay F32 (F16 in an F16 file) unless tensor_types names them
({"output": "Q8_0"}, {"token_embd": ...}, as llama.cpp's quantized files store them);
norms, biases and routers F32, as llama.cpp keeps them. A synthetic byte-level BPE vocabulary (256 byte symbols,
then merges of letter pairs) fills the tokenizer metadata the converter needs; chat_template, when given, is stored as
tokenizer.chat_template (a server can then chat).
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Optional

import numpy as np

GGUF_ARCHS = {"qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe", "mixtral": "llama"}
WEIGHT_TYPES = ("F32", "F16", "Q8_0", "Q4_0", "Q4_1")
# HF per-layer name -> GGUF name (after blk.N.), besides the experts
_ATTENTION = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
              "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "mlp.gate": "ffn_gate_inp",
              "block_sparse_moe.gate": "ffn_gate_inp", "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
              "mlp.shared_expert.up_proj": "ffn_up_shexp", "mlp.shared_expert.down_proj": "ffn_down_shexp",
              "mlp.shared_expert_gate": "ffn_gate_inp_shexp"}
_EXPERT_PROJ = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps",
                "w1": "ffn_gate_exps", "w3": "ffn_up_exps", "w2": "ffn_down_exps"}
_DENSE_KEEP = ("ffn_gate_inp", "ffn_gate_inp_shexp")  # routers: F32 whatever the file's type


def byte_symbols() -> List[str]:
    """GPT-2's byte-level alphabet: byte b -> a printable character (printable Latin-1 bytes map to themselves, the
    others to chr(256 + n) in byte order)."""
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(ord("¡"), ord("¬") + 1)) | set(range(ord("®"), 256))
    out, extra = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def synthetic_vocab(vocab_size: int) -> tuple[List[str], List[str]]:
    """(tokens, merges): the 256 byte symbols, then vocab_size - 256 merges of two letters (or Ġ + letter)."""
    tokens = byte_symbols()
    firsts = "etaoinsrhldcumfpgwybvkxjqz" + "Ġ"
    merges = []
    for a in firsts:
        for b in "etaoinsrhldcumfpgwybvkxjqz":
            if len(tokens) == vocab_size:
                return tokens, merges
            merges.append(f"{a} {b}")
            tokens.append(a + b)
    raise ValueError(f"synthetic_vocab makes at most {len(tokens)} tokens, asked for {vocab_size}")


def permute_for_interleaved_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF q/k rows (each head's rotary pairs are (i, i + d/2)) -> llama.cpp's (pairs (2i, 2i + 1)): row i of the
    first half and row i of the second half of a head become rows 2i and 2i + 1."""
    rows, cols = w.shape
    return w.reshape(n_head, 2, rows // n_head // 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def _encode(w: np.ndarray, kind: str):
    """(data, raw type or None) for GGUFWriter.add_tensor."""
    import gguf
    from gguf.quants import quantize

    if kind == "F32":
        return w.astype(np.float32), None
    if kind == "F16":
        return w.astype(np.float16), None
    qtype = gguf.GGMLQuantizationType[kind]
    return quantize(np.ascontiguousarray(w, dtype=np.float32), qtype), qtype


def _gguf_tensors(state: Dict[str, np.ndarray], cfg: dict) -> Dict[str, np.ndarray]:
    """GGUF name -> float32 array (numpy order) of every tensor: experts stacked, q/k permuted for llama."""
    arch = GGUF_ARCHS[cfg["model_type"]]
    out = {"token_embd.weight": state["model.embed_tokens.weight"], "output_norm.weight": state["model.norm.weight"]}
    if "lm_head.weight" in state:
        out["output.weight"] = state["lm_head.weight"]
    experts: Dict[str, Dict[int, np.ndarray]] = {}
    for name, w in state.items():
        if not name.startswith("model.layers."):
            continue
        _, _, layer, rest = name.split(".", 3)
        base, _, suffix = rest.rpartition(".")
        if ".experts." in base:  # mlp.experts.{e}.{proj} / block_sparse_moe.experts.{e}.{proj}
            _, e, proj = base.rsplit(".", 2)
            experts.setdefault(f"blk.{layer}.{_EXPERT_PROJ[proj]}.{suffix}", {})[int(e)] = w
            continue
        gguf_name = _ATTENTION[base]
        if arch == "llama" and gguf_name in ("attn_q", "attn_k") and suffix == "weight":
            heads = cfg["num_attention_heads"] if gguf_name == "attn_q" else cfg["num_key_value_heads"]
            w = permute_for_interleaved_rope(w, heads)
        if gguf_name == "ffn_gate_inp_shexp":
            w = w.reshape(-1)  # [1, K] in HF, [K] in llama.cpp
        out[f"blk.{layer}.{gguf_name}.{suffix}"] = w
    for name, by_expert in experts.items():
        out[name] = np.stack([by_expert[e] for e in range(len(by_expert))])
    return out


def write_moe_gguf(hf_dir: str, out_path: str, weight_type: str = "Q8_0",
                   tensor_types: Optional[Dict[str, str]] = None, chat_template: Optional[str] = None) -> str:
    """Write hf_dir's MoE checkpoint (config.json + model.safetensors) as a GGUF file (module docstring)."""
    import gguf
    from safetensors.numpy import load_file

    tensor_types = tensor_types or {}
    for kind in (weight_type, *tensor_types.values()):
        if kind not in WEIGHT_TYPES:
            raise ValueError(f"tensor type {kind!r}: one of {WEIGHT_TYPES}")
    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    arch = GGUF_ARCHS[cfg["model_type"]]
    state = {k: v.astype(np.float32) for k, v in load_file(os.path.join(hf_dir, "model.safetensors")).items()}
    writer = gguf.GGUFWriter(out_path, arch)
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    experts = cfg.get("num_experts") or cfg["num_local_experts"]
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]))  # transformers 5
    writer.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    writer.add_vocab_size(cfg["vocab_size"])
    writer.add_expert_count(experts)
    writer.add_expert_used_count(cfg["num_experts_per_tok"])
    if arch != "llama":
        writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if cfg.get("shared_expert_intermediate_size"):
        writer.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    tokens, merges = synthetic_vocab(cfg["vocab_size"])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * len(tokens))
    writer.add_token_merges(merges)
    if chat_template:
        writer.add_chat_template(chat_template)
    dense_kind = "F16" if weight_type == "F16" else "F32"
    for name, w in _gguf_tensors(state, cfg).items():
        base = name.rpartition(".")[0]  # blk.N.ffn_down_exps: this layer's, else every layer's ffn_down_exps
        kind = tensor_types.get(base, tensor_types.get(base.rpartition(".")[2], weight_type))
        if w.ndim == 1 or name.split(".")[-2] in _DENSE_KEEP:
            kind = "F32"
        elif not name.startswith("blk."):
            kind = tensor_types.get(base, dense_kind)
        data, raw_type = _encode(w, kind)
        writer.add_tensor(name, data, raw_dtype=raw_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
