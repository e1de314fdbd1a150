"""Convert a GGUF file into a Hugging Face directory (config, tokenizer, float32 safetensors).

Weights are dequantized with the `gguf` package and stored as float32, so the fp32 reference path sees exactly
the values llama.cpp would compute with. llama.cpp stores the q/k projections of `llama` models with their rows
permuted for its interleaved rope; we undo that so the checkpoint uses the Hugging Face (neox, half-split) layout.

MoE files (gguf_moe.py: Qwen3-MoE, Qwen2-MoE, Mixtral) have their stacked expert tensors split into the per-expert
tensors of a Hugging Face checkpoint. The tokenizer is rebuilt from `tokenizer.ggml.*` metadata with the `tokenizers`
library (byte-level BPE; SentencePiece BPE in gguf_spm_tokenizer.py), and the chat template is copied from
`tokenizer.chat_template`. Gemma 3 files: gguf_gemma3.py.
--quantization gguf reads the linear layers' blocks from the file instead (gguf_weights.py).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Dict, Iterator, List, Tuple

import numpy as np
import torch
from tqdm import tqdm

from sglang.srt.model_loader import gguf_gemma3
from sglang.srt.model_loader.gguf_moe import (
    SHARED_GATE_HF_SUFFIX,
    MoENames,
    is_expert_weight_name,
    is_moe_file,
    moe_config_fields,
)

logger = logging.getLogger(__name__)

# GGUF architecture -> (HF architecture, HF model_type, rows of q/k are rope-permuted); MoE files (a llama file with
# experts is Mixtral) take their architecture and expert fields from gguf_moe.moe_config_fields
_ARCHS = {
    "llama": ("LlamaForCausalLM", "llama", True),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", False),
    "qwen3": ("Qwen3ForCausalLM", "qwen3", False),
    "qwen2moe": ("Qwen2MoeForCausalLM", "qwen2_moe", False),
    "qwen3moe": ("Qwen3MoeForCausalLM", "qwen3_moe", False),
    gguf_gemma3.ARCH: ("Gemma3ForCausalLM", "gemma3_text", False),
}

# GGUF tensor name (after "blk.{i}.") -> HF name (after "model.layers.{i}.")
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# per-architecture names over _LAYER_TENSORS
_ARCH_LAYER_TENSORS = {gguf_gemma3.ARCH: {**_LAYER_TENSORS, **gguf_gemma3.LAYER_TENSORS}}
_GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

# GGUF token types (llama.cpp's llama_token_type)
_TOKEN_TYPE_CONTROL = 3
_TOKEN_TYPE_USER_DEFINED = 4

# Pre-tokenizer split patterns, by `tokenizer.ggml.pre`. Byte-level BPE then runs on each piece.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


class GGUFMetadata:
    """Access to a GGUF file's key/value fields (gguf_file.GGUFFile), and its tensor names in HF terms (hf_names)."""

    def __init__(self, gguf_file):
        self.file = gguf_file
        self.arch = self.get("general.architecture")
        self.is_moe = is_moe_file(self.arch, [t.name for t in gguf_file.tensors])
        self.moe_names = MoENames(self.arch, self._num_experts()) if self.is_moe else None

    def _num_experts(self) -> int:
        for t in self.file.tensors:
            if t.name.endswith(".ffn_gate_exps.weight"):
                return int(t.shape[-1])  # ggml order: [K, N, E]
        return 0

    def hf_names(self, gguf_name: str) -> List[str]:
        """The HF tensor names of a GGUF tensor: one, or E (expert order) for a MoE file's stacked expert tensor."""
        base, _, suffix = gguf_name.rpartition(".")  # suffix: weight | bias
        if base.startswith("blk.") and self.moe_names is not None:
            _, layer, rest = base.split(".", 2)
            names = self.moe_names.hf_names(layer, rest, suffix)
            if names is not None:
                return names
        return [_hf_tensor_name(gguf_name, self.arch)]

    def get(self, key: str, default: Any = None) -> Any:
        return self.file.fields.get(key, default)

    def arch_get(self, key: str, default: Any = None) -> Any:
        return self.get(f"{self.arch}.{key}", default)


def rope_rows_permuted(arch: str) -> bool:
    """Whether llama.cpp stores this architecture's q/k rows permuted for its interleaved rope (unpermute_rope_rows)."""
    return _ARCHS[arch][2]


def unpermute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation: interleaved rope pairs -> HF's [first half | second half]."""
    rows, cols = w.shape
    return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def iter_dequantized_tensors(meta: GGUFMetadata, select=None) -> Iterator[Tuple[str, np.ndarray]]:
    """Yield (hf_name, float32 array in HF layout) for every tensor of the file whose HF name select(name) takes (all
    without select; a stacked expert tensor: one per expert, each dequantized from its own slab of blocks)."""
    from gguf.quants import dequantize

    permuted = rope_rows_permuted(meta.arch)
    n_head = meta.arch_get("attention.head_count")
    n_kv_head = meta.arch_get("attention.head_count_kv", n_head)
    for t in tqdm(meta.file.tensors, desc="Dequantizing GGUF", unit="tensor", leave=False):
        names = meta.hf_names(t.name)
        if select is not None and not select(names[0]):
            continue
        shape = tuple(int(d) for d in reversed(t.shape))
        if len(names) > 1:  # stacked experts [E, rows, cols]: t.data's leading dimension is the expert
            for name, slab in zip(names, t.data):
                w = dequantize(slab, t.tensor_type).astype(np.float32, copy=False).reshape(shape[1:])
                yield name, np.array(w, copy=True)
            continue
        name = names[0]
        w = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        w = w.reshape(shape)
        if permuted and name.endswith("self_attn.q_proj.weight"):
            w = unpermute_rope_rows(w, n_head)
        elif permuted and name.endswith("self_attn.k_proj.weight"):
            w = unpermute_rope_rows(w, n_kv_head)
        elif name.endswith(SHARED_GATE_HF_SUFFIX):
            w = w.reshape(1, -1)  # [K] in the file, the [1, K] weight of a Linear(K, 1) in HF
        elif meta.arch == gguf_gemma3.ARCH:
            w = gguf_gemma3.unshift_norm(name, w)
        w = np.ascontiguousarray(w)
        yield name, (w if w.flags.writeable else w.copy())


def _hf_tensor_name(gguf_name: str, arch: str = "") -> str:
    base, _, suffix = gguf_name.rpartition(".")  # suffix: weight | bias
    if base.startswith("blk."):
        _, layer, rest = base.split(".", 2)
        names = _ARCH_LAYER_TENSORS.get(arch, _LAYER_TENSORS)
        if rest not in names:
            raise ValueError(f"GGUF tensor {gguf_name!r} has no Hugging Face equivalent in this converter.")
        return f"model.layers.{layer}.{names[rest]}.{suffix}"
    if base not in _GLOBAL_TENSORS:
        raise ValueError(f"GGUF tensor {gguf_name!r} has no Hugging Face equivalent in this converter.")
    return f"{_GLOBAL_TENSORS[base]}.{suffix}"


def build_hf_config(meta: GGUFMetadata, tensor_names: List[str]) -> Tuple[dict, dict]:
    """(config.json dict, generation_config.json dict) from GGUF metadata."""
    if meta.arch not in _ARCHS:
        raise ValueError(f"GGUF architecture {meta.arch!r} is not supported; supported: {sorted(_ARCHS)}.")
    if any(n == "rope_freqs.weight" for n in tensor_names):
        raise ValueError("GGUF files with rope_freqs (Llama-3.1 style rope scaling) are not supported yet.")
    architecture, model_type, _ = _ARCHS[meta.arch]
    if meta.arch in ("qwen2moe", "qwen3moe") and not meta.is_moe:
        raise ValueError(f"GGUF architecture {meta.arch!r} without expert tensors (blk.*.ffn_gate_exps)")
    hidden = int(meta.arch_get("embedding_length"))
    n_head = int(meta.arch_get("attention.head_count"))
    head_dim = int(meta.arch_get("attention.key_length", hidden // n_head))
    bos = meta.get("tokenizer.ggml.bos_token_id")
    eos = meta.get("tokenizer.ggml.eos_token_id")
    vocab_size = meta.arch_get("vocab_size") or len(meta.get("tokenizer.ggml.tokens"))
    rope_theta = float(meta.arch_get("rope.freq_base", 10000.0))
    config = {
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": int(meta.arch_get("feed_forward_length")),
        "num_hidden_layers": int(meta.arch_get("block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(meta.arch_get("attention.head_count_kv", n_head)),
        "head_dim": head_dim,
        "max_position_embeddings": int(meta.arch_get("context_length", 2048)),
        # float32 keeps the exact (more than 7-bit) float32 value llama.cpp reads
        "rms_norm_eps": float(np.float32(meta.arch_get("attention.layer_norm_rms_epsilon", 1e-6))),
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "vocab_size": int(vocab_size),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "hidden_act": "silu",
        "attention_bias": any(n.endswith("attn_q.bias") for n in tensor_names),
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
    }
    if meta.is_moe:
        config.update(moe_config_fields(meta, config["num_hidden_layers"]))
    if meta.arch == gguf_gemma3.ARCH:
        config = gguf_gemma3.config_fields(meta, config)
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if config[k] is not None}
    return config, generation


def build_tokenizer_files(meta: GGUFMetadata, out_dir: str) -> None:
    """Write tokenizer.json + tokenizer_config.json for a byte-level BPE ("gpt2") GGUF vocabulary (a SentencePiece
    one, "llama": gguf_spm_tokenizer.py)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = meta.get("tokenizer.ggml.model")
    if kind == "llama":
        from sglang.srt.model_loader.gguf_spm_tokenizer import build_spm_tokenizer_files

        return build_spm_tokenizer_files(meta, out_dir)
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (byte-level BPE 'gpt2' and SentencePiece "
                         f"BPE 'llama' are); pass --tokenizer-path.")
    tokens: List[str] = meta.get("tokenizer.ggml.tokens")
    token_types: List[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges")]
    vocab = {tok: i for i, tok in enumerate(tokens)}

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    pre = meta.get("tokenizer.ggml.pre", "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre == "smollm":  # llama.cpp: digits split one by one, then the GPT-2 pattern
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in ("llama-bpe", "llama3", "llama-v3", "smaug-bpe", "qwen2"):
        split = _QWEN2_SPLIT if pre == "qwen2" else _LLAMA3_SPLIT
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
            ]
        )
    else:
        if pre not in ("default", "gpt2"):
            logger.warning("Unknown GGUF pre-tokenizer %r; using the GPT-2 split pattern.", pre)
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    special = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, token_types) if ty == _TOKEN_TYPE_CONTROL]
    user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, token_types) if ty == _TOKEN_TYPE_USER_DEFINED]
    tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)
    tok.save(os.path.join(out_dir, "tokenizer.json"))

    from sglang.srt.model_loader.gguf_spm_tokenizer import write_tokenizer_config

    write_tokenizer_config(meta, tokens, out_dir, bool(meta.get("tokenizer.ggml.add_bos_token", False)),
                           bool(meta.get("tokenizer.ggml.add_eos_token", False)))


# The converted directory is a sharded HF checkpoint: shard 1 holds what every start reads dense (embedding, norms,
# routers, an untied lm_head), shard 2 the linear layers' and routed experts' weights (is_quantized_weight_name)
# dequantized, which only a dense or w8a8_int8 start reads. Shard 2 and the index that lists both are written on the
# first start that needs them (write_dense_linears; model_path.ensure_dense_linears): a --quantization gguf start
# (the CPU default) reads those layers' blocks from the file and never pays for their float32 copies. GGUF_SOURCE_FILE
# names the file they come from.
DENSE_SHARD, LINEAR_SHARD = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
SHARD_INDEX = "model.safetensors.index.json"
GGUF_SOURCE_FILE = "gguf_source.json"


def _save_tensors(meta: GGUFMetadata, out_dir: str, shard: str, select) -> List[str]:
    """Dequantize the tensors whose HF names `select` takes into out_dir/shard (temporary file, then rename)."""
    from safetensors.torch import save_file

    tensors: Dict[str, torch.Tensor] = {name: torch.from_numpy(w) for name, w in iter_dequantized_tensors(meta, select)}
    tmp = os.path.join(out_dir, f".{shard}.tmp-{os.getpid()}")
    save_file(tensors, tmp, metadata={"format": "pt"})
    os.replace(tmp, os.path.join(out_dir, shard))
    return sorted(tensors)


def convert_gguf_to_hf_dir(gguf_path: str, out_dir: str, dense_linears: bool = True) -> None:
    """Write config.json, generation_config.json, the tokenizer files, GGUF_SOURCE_FILE and the dense shard into
    out_dir; with dense_linears the linear shard and the index too."""
    from sglang.srt.model_loader.gguf_file import open_gguf

    meta = GGUFMetadata(open_gguf(gguf_path))
    config, generation = build_hf_config(meta, [t.name for t in meta.file.tensors])
    os.makedirs(out_dir, exist_ok=True)
    build_tokenizer_files(meta, out_dir)
    _save_tensors(meta, out_dir, DENSE_SHARD, lambda name: not is_quantized_weight_name(name))
    st = os.stat(gguf_path)
    source = {"path": os.path.realpath(gguf_path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    for name, content in (("config.json", config), ("generation_config.json", generation), (GGUF_SOURCE_FILE, source)):
        with open(os.path.join(out_dir, name), "w") as f:
            json.dump(content, f, indent=2)
    if dense_linears:
        write_dense_linears(meta, out_dir)


def write_dense_linears(meta: GGUFMetadata, out_dir: str) -> None:
    """The linear shard, then the index listing both shards (whole or absent: each is renamed into place)."""
    from safetensors import safe_open

    linear = _save_tensors(meta, out_dir, LINEAR_SHARD, is_quantized_weight_name)
    with safe_open(os.path.join(out_dir, DENSE_SHARD), framework="pt") as f:
        dense = list(f.keys())
    weight_map = {**{n: DENSE_SHARD for n in dense}, **{n: LINEAR_SHARD for n in linear}}
    tmp = os.path.join(out_dir, f".{SHARD_INDEX}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump({"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
    os.replace(tmp, os.path.join(out_dir, SHARD_INDEX))


# Linear-layer tensors served in their own blocks with --quantization gguf (layers/quantization/, gguf_weights.py)
# besides the routed experts (gguf_moe.is_expert_weight_name) and the lm_head's table where it has a packed form
# (gguf_weights.packed_vocab_weight_names); the rest (norms, MoE routers, the other tables) are read dense from the
# converted directory.
QUANTIZED_LINEAR_SUFFIXES = tuple(
    f"{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
)


def is_quantized_weight_name(hf_name: str) -> bool:
    """Whether --quantization gguf / w8a8_int8 serves this checkpoint tensor quantized (else it loads dense)."""
    return hf_name.endswith(QUANTIZED_LINEAR_SUFFIXES) or is_expert_weight_name(hf_name)
