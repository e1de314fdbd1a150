"""Bytes of quantized linear weights: the one place the weights term learns the weight format (torch-free).

Which tensors are quantized: the linear layers of the transformer blocks (attention q/k/v/o or MLA's projections,
dense MLP gate/up/down, MoE experts and shared experts). Norms, biases, MoE routers and encoders stay in the model
dtype, as in upstream SGLang and in this runtime (layers/quantization/); so do the embedding and the lm_head, except
that a GGUF file's lm_head table served with --quantization gguf is held as its own packed blocks when its type has a
packed form (gguf_packed_vocab: the file's output.weight, or its token_embd.weight where the embedding is tied to the
lm_head, one packed table then serving both), as llama.cpp reads it.

Bytes of one [rows, cols] weight (rows = output features, cols = input features):
    none          rows * cols * dtype bytes
    fp8           rows * cols * 1 + fp32 scales: one per tensor, or one per weight_block_size [bn, bk] block
                  (DeepSeek-style block fp8: ceil(rows/bn) * ceil(cols/bk) * 4)
    w8a8_int8     this runtime's CPU packed form (below) at 8 bits: int8 values + fp16 scale and offset per 32
    awq           4-bit values (int32-packed qweight) + per group of group_size input columns and each output row:
                  an fp16 scale and a 4-bit zero point (qzeros int32-packed)  -> rows*cols/2 + groups*rows*(2 + 1/2)
    gptq          the same + g_idx, one int32 per input column (zero points are stored even when symmetric)
    gguf          the runtime's CPU packed form for Q4_0 / Q4_1 (4 bits) and Q8_0 (8 bits); other GGUF types (F16,
                  F32, K-quants) are requantized to 8-bit blocks at load, as w8a8_int8. The file itself holds
                  GGUF_BLOCK_BYTES per 32 weights (Q4_0 4.5 bits/weight, Q4_1 5.0, Q8_0 8.5), what llama.cpp keeps.
                  A MoE file's routed experts (3-D ffn_*_exps tensors) may have other types than its 2-D linear
                  tensors: their bits are read per layer (gguf_expert_bits), a layer's gate/up at the larger bits of
                  its two tensors, as the runtime packs them (layers/moe/quant_experts.py).
CPU packed form (sgl-kernel quant_gemm.h, layers/quantization/packing.py): records of 16 rows x 32 weights with an
fp16 d and c per row, rows padded to 16 and columns to 32: 16 * 32 * bits / 8 + 64 bytes per record.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from sglang.srt.mem_plan.moe_sizes import expert_shard_of_rank

# GGUF block formats: weights per block and bytes per block (ggml's type table)
GGUF_BLOCK_WEIGHTS = {"Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32, "Q2_K": 256, "Q3_K": 256,
                      "Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "Q8_K": 256}
GGUF_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34, "Q2_K": 84, "Q3_K": 110,
                    "Q4_K": 144, "Q5_K": 176, "Q6_K": 210, "Q8_K": 292}
# GGUF types the runtime serves from their blocks (bits of the packed form); the rest are requantized to int8 blocks
GGUF_PACKED_BITS = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}
GGUF_REQUANTIZED_BITS = 8
DENSE_BITS = 16  # what a spec's bit width says for dense (unquantized) weights
# llama.cpp's stacked expert tensors (blk.N.<name>.weight, [E, rows, cols]) by the fused weight they become
GGUF_EXPERT_TENSORS = {"ffn_gate_exps": "w13", "ffn_up_exps": "w13", "ffn_down_exps": "w2"}

CPU_PACK_ROWS = 16  # rows per packed record
CPU_PACK_COLS = 32  # weights per row of a record
CPU_PACK_HEADER_BYTES = CPU_PACK_ROWS * 2 * 2  # fp16 d and c per row
FP8_SCALE_BYTES = 4
AWQ_SCALE_BYTES = 2
GPTQ_G_IDX_BYTES = 4
DEFAULT_GROUP_SIZE = 128

# formats `sglang plan` sizes that the CPU runtime does not serve (GPU checkpoints)
PLAN_ONLY_QUANTIZATIONS = ("fp8", "awq", "gptq")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def gguf_file_bytes(rows: int, cols: int, gguf_type: str) -> int:
    """Bytes of a [rows, cols] tensor in a GGUF file (rows of whole blocks)."""
    return rows * _cdiv(cols, GGUF_BLOCK_WEIGHTS[gguf_type]) * GGUF_BLOCK_BYTES[gguf_type]


def cpu_record_bytes(bits: int) -> int:
    """Bytes of one packed record: CPU_PACK_ROWS rows x CPU_PACK_COLS weights at `bits`, plus their fp16 d and c."""
    return CPU_PACK_HEADER_BYTES + CPU_PACK_ROWS * CPU_PACK_COLS * bits // 8


def cpu_packed_bytes(rows: int, cols: int, bits: int) -> int:
    """Bytes of this runtime's packed CPU form of a [rows, cols] weight at 4 or 8 bits (layers/quantization/packing.py
    builds exactly this many)."""
    return _cdiv(rows, CPU_PACK_ROWS) * _cdiv(cols, CPU_PACK_COLS) * cpu_record_bytes(bits)


@dataclass(frozen=True)
class WeightFormat:
    """How the quantized linear weights are held. method: none | fp8 | w8a8_int8 | awq | gptq | gguf."""

    method: str = "none"
    bits: int = 16
    group_size: int = DEFAULT_GROUP_SIZE  # awq / gptq; -1: one group over all input columns
    block_size: Optional[tuple[int, int]] = None  # fp8 weight_block_size
    gguf_type: str = ""  # gguf: the linear tensors' type
    # gguf MoE: (gate/up, down) bits of the routed experts of each MoE layer, in layer order
    expert_bits: Optional[Tuple[Tuple[int, int], ...]] = None
    # gguf: the vocabulary table held packed (PACKED_VOCAB_LM_HEAD / PACKED_VOCAB_EMBEDDING, "" for none) and its bits
    packed_vocab: str = ""
    packed_vocab_bits: int = 0

    def matrix_bytes(self, rows: int, cols: int, dense_bytes: int) -> int:
        """Bytes held for one [rows, cols] linear weight; dense_bytes is the model dtype's element size."""
        m = self.method
        if m == "none":
            return rows * cols * dense_bytes
        if m == "gguf":
            return cpu_packed_bytes(rows, cols, GGUF_PACKED_BITS.get(self.gguf_type, GGUF_REQUANTIZED_BITS))
        if m == "w8a8_int8":
            return cpu_packed_bytes(rows, cols, 8)
        if m == "fp8":
            scales = _cdiv(rows, self.block_size[0]) * _cdiv(cols, self.block_size[1]) if self.block_size else 1
            return rows * cols + scales * FP8_SCALE_BYTES
        if m in ("awq", "gptq"):
            groups = _cdiv(cols, self.group_size) if self.group_size > 0 else 1
            values = _cdiv(rows * cols * self.bits, 8)
            per_group = groups * (rows * AWQ_SCALE_BYTES + _cdiv(rows * self.bits, 8))  # scales + zero points
            return values + per_group + (cols * GPTQ_G_IDX_BYTES if m == "gptq" else 0)
        raise ValueError(f"unknown weight format {m!r}")

    def routed_expert_layer_bits(self, num_sparse_layers: int) -> Tuple[Tuple[int, int], ...]:
        """(gate/up, down) bits of each MoE layer's routed experts in this runtime's CPU packed form; DENSE_BITS when
        they are not held there (dense, or a GPU-only format, which the MoE workspace does not see)."""
        if self.method == "gguf" and self.expert_bits is not None:
            if len(self.expert_bits) != num_sparse_layers:
                raise ValueError(f"the GGUF file has routed experts in {len(self.expert_bits)} layers, the model "
                                 f"{num_sparse_layers} MoE layers")
            return self.expert_bits
        if self.method == "gguf":
            bits = GGUF_PACKED_BITS.get(self.gguf_type, GGUF_REQUANTIZED_BITS)
        else:
            bits = 8 if self.method == "w8a8_int8" else DENSE_BITS
        return ((bits, bits),) * num_sparse_layers

    def routed_expert_bits(self) -> Tuple[int, int]:
        """(gate/up, down) bits the MoE workspace is sized for: the widest of any layer (one workspace serves them
        all; mem_plan/moe_sizes.py)."""
        layers = self.routed_expert_layer_bits(len(self.expert_bits) if self.expert_bits else 1)
        return max(b for b, _ in layers), max(b for _, b in layers)


@functools.lru_cache(maxsize=4)
def _gguf_weight_tensor_types(path: str, size: int, mtime_ns: int) -> Tuple[Tuple[str, str, int], ...]:
    """(name, type name, dims) of every *.weight tensor, e.g. ('blk.3.ffn_down_exps.weight', 'Q8_0', 3) (header
    only, gguf_header.py; cached per file version)."""
    import gguf

    from sglang.srt.mem_plan.gguf_header import read_tensor_table

    try:
        table = [(name, gguf.GGMLQuantizationType(kind).name, dims) for name, kind, dims in read_tensor_table(path)]
    except ValueError:  # a file the short reader does not take (big-endian): the gguf package's full reader
        table = [(t.name, t.tensor_type.name, len(t.shape)) for t in gguf.GGUFReader(path).tensors]
    return tuple(row for row in table if row[0].endswith(".weight"))


def _weight_tensor_types(gguf_path: str) -> Tuple[Tuple[str, str, int], ...]:
    st = os.stat(gguf_path)
    return _gguf_weight_tensor_types(os.path.realpath(gguf_path), st.st_size, st.st_mtime_ns)


def _block_tensor_types(gguf_path: str) -> Tuple[Tuple[str, str, int], ...]:
    """(name after 'blk.', e.g. '3.ffn_down_exps.weight', type name, dims) of every blk.*.weight tensor."""
    return tuple((name.split(".", 1)[1], kind, dims) for name, kind, dims in _weight_tensor_types(gguf_path)
                 if name.startswith("blk."))


# the vocabulary table --quantization gguf holds as packed blocks (layers/quantization/vocab_method.py)
PACKED_VOCAB_LM_HEAD = "lm_head"  # an untied output.weight: the lm_head's own table (the embedding stays dense)
PACKED_VOCAB_EMBEDDING = "embedding"  # a tied token_embd.weight: one packed table, the embedding and the lm_head
GGUF_LM_HEAD_TENSOR, GGUF_EMBEDDING_TENSOR = "output.weight", "token_embd.weight"


def gguf_packed_vocab(gguf_path: Optional[str]) -> Tuple[str, int]:
    """(which vocabulary table a --quantization gguf start of this file holds packed, its bits), or ("", 0): both
    stay dense in the model dtype. The lm_head's table is the file's output.weight, else (the converter then ties
    them) its token_embd.weight; it is packed only when its type has a packed form of its own (GGUF_PACKED_BITS:
    Q4_0, Q4_1, Q8_0), so the logits read the file's own blocks. Other types (F16, F32, K-quants) stay dense: a
    requantized lm_head would round the logits of a file whose author kept that table wide."""
    if not gguf_path:
        return "", 0
    types = {name: kind for name, kind, _ in _weight_tensor_types(gguf_path)}
    if GGUF_LM_HEAD_TENSOR in types:
        table, kind = PACKED_VOCAB_LM_HEAD, types[GGUF_LM_HEAD_TENSOR]
    else:
        table, kind = PACKED_VOCAB_EMBEDDING, types.get(GGUF_EMBEDDING_TENSOR, "")
    bits = GGUF_PACKED_BITS.get(kind, 0)
    return (table, bits) if bits else ("", 0)


def gguf_linear_type(gguf_path: Optional[str]) -> str:
    """The type most of a GGUF file's 2-D block tensors (blk.*.weight) have, e.g. 'Q4_1' (header only)."""
    if not gguf_path:
        return ""
    counts: dict[str, int] = {}
    for _, kind, dims in _block_tensor_types(gguf_path):
        if dims == 2:
            counts[kind] = counts.get(kind, 0) + 1
    return max(counts, key=counts.get) if counts else ""


def gguf_type_bits(gguf_type: str) -> int:
    """Bits of the CPU packed form a GGUF tensor of this type is held in (F16, F32, K-quants: requantized)."""
    return GGUF_PACKED_BITS.get(gguf_type, GGUF_REQUANTIZED_BITS)


def gguf_expert_bits(gguf_path: Optional[str]) -> Optional[Tuple[Tuple[int, int], ...]]:
    """(gate/up, down) bits of a GGUF MoE file's routed experts, per MoE layer in layer order: a layer's gate/up at
    the larger bits of its gate and up tensors (one packed weight holds both); None for a file without expert
    tensors."""
    if not gguf_path:
        return None
    layers: Dict[int, Dict[str, int]] = {}
    for name, kind, _ in _block_tensor_types(gguf_path):
        layer, _, rest = name.partition(".")
        fused = GGUF_EXPERT_TENSORS.get(rest[: -len(".weight")])
        if fused is not None:
            bits = layers.setdefault(int(layer), {"w13": 0, "w2": 0})
            bits[fused] = max(bits[fused], gguf_type_bits(kind))
    return tuple((layers[i]["w13"], layers[i]["w2"]) for i in sorted(layers)) or None


def weight_format(quantization: Optional[str], hf_quant_config: Optional[dict] = None,
                  gguf_type: str = "", expert_bits: Optional[Tuple[Tuple[int, int], ...]] = None,
                  packed_vocab: Tuple[str, int] = ("", 0)) -> WeightFormat:
    """The format from --quantization, else from config.json's quantization_config (a quantized checkpoint).
    packed_vocab: gguf_packed_vocab's (table, bits) of a GGUF file (gguf only)."""
    cfg = hf_quant_config or {}
    method = quantization or str(cfg.get("quant_method", "none")).lower()
    if method in ("none", ""):
        return WeightFormat()
    if method == "fp8":
        block = cfg.get("weight_block_size")
        return WeightFormat("fp8", 8, block_size=tuple(block) if block else None)
    if method in ("awq", "gptq"):
        bits = int(cfg.get("bits", cfg.get("w_bit", 4)))
        group = int(cfg.get("group_size", cfg.get("q_group_size", DEFAULT_GROUP_SIZE)))
        return WeightFormat(method, bits, group_size=group)
    if method == "w8a8_int8":
        return WeightFormat("w8a8_int8", 8)
    if method == "gguf":
        return WeightFormat("gguf", gguf_type_bits(gguf_type), gguf_type=gguf_type, expert_bits=expert_bits,
                            packed_vocab=packed_vocab[0], packed_vocab_bits=packed_vocab[1])
    raise ValueError(f"--quantization {method!r}: the planner knows none, gguf, w8a8_int8, fp8, awq and gptq")


def linear_matrices(text, tp: int = 1, ep: int = 1) -> list[tuple[int, int, int]]:
    """(rows, cols, count) of the quantized linear weights of a TextShape (model_shapes.py) on one TP rank (ep:
    --ep-size): the same shapes text_params counts (which adds biases, norms, routers, embeddings on top)."""
    from sglang.srt.mem_plan.specs import kv_heads_per_rank

    s, H = text, text.hidden_size
    nq = _cdiv(s.num_q_heads, tp)
    mats: list[tuple[int, int, int]] = []
    L = s.num_layers
    if s.is_mla:
        qk_dim = s.qk_nope_head_dim + s.qk_rope_head_dim
        if s.q_lora_rank:
            mats += [(s.q_lora_rank, H, L), (nq * qk_dim, s.q_lora_rank, L)]
        else:
            mats.append((nq * qk_dim, H, L))
        mats += [(s.kv_lora_rank + s.qk_rope_head_dim, H, L),  # kv_a_proj_with_mqa
                 (nq * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank, L),  # kv_b_proj
                 (H, nq * s.v_head_dim, L)]  # o_proj
    else:
        d, nkv = s.head_dim, kv_heads_per_rank(s.num_kv_heads, tp)
        mats += [((nq + 2 * nkv) * d, H, L), (H, nq * d, L)]  # qkv, o
    num_sparse = len(s.sparse_layers)

    def mlp(inter: int, count: int) -> None:
        if inter and count:
            mats.extend([(2 * inter, H, count), (H, inter, count)])  # gate+up, down

    mlp(_cdiv(s.intermediate_size, tp), L - num_sparse)
    mats += routed_expert_matrices(s, tp, ep)
    if s.shared_expert_intermediate_size:
        mlp(_cdiv(s.shared_expert_intermediate_size, tp), num_sparse)
    elif s.num_shared_experts:
        mlp(_cdiv(s.moe_intermediate_size, tp), num_sparse * s.num_shared_experts)
    return mats


def routed_expert_matrices(text, tp: int = 1, ep: int = 1) -> list[tuple[int, int, int]]:
    """(rows, cols, count) of the routed experts' fused gate+up and down weights on one rank, in that order ([] for a
    dense model); part of linear_matrices. ep = 1: every expert, N / tp columns; else E / ep experts of
    moe_sizes.expert_shard_of_rank's columns."""
    if ep == 1:
        n, experts = _cdiv(text.moe_intermediate_size, tp), text.num_experts
    else:
        experts, n = expert_shard_of_rank(text.num_experts, text.moe_intermediate_size, tp, ep)
    count = len(text.sparse_layers) * experts
    if not (n and count):
        return []
    return [(2 * n, text.hidden_size, count), (text.hidden_size, n, count)]


def quantized_weight_bytes(shape, fmt: WeightFormat, tp: int = 1, dense_dtype_bytes: int = 2, ep: int = 1) -> int:
    """The weights term of a ModelShape (model_shapes.py) whose linear layers are held in `fmt`: the dense bytes at
    the model dtype, with each quantized matrix's dense bytes replaced by its quantized bytes (ep: --ep-size; the
    routed experts' at their own bits, fmt.routed_expert_bits, where the CPU packed form holds them; the packed
    vocabulary table of a GGUF file, fmt.packed_vocab, in its packed bytes: exactly one [vocab, hidden] table, the
    lm_head's or the tied embedding's)."""
    total = sum(shape.params(tp, ep).values()) * dense_dtype_bytes + shape.rope_cache_bytes(dense_dtype_bytes)
    if fmt.method == "none":
        return total
    for rows, cols, count in linear_matrices(shape.text, tp, ep):
        total += count * (fmt.matrix_bytes(rows, cols, dense_dtype_bytes) - rows * cols * dense_dtype_bytes)
    experts = routed_expert_matrices(shape.text, tp, ep)
    if fmt.method in ("gguf", "w8a8_int8") and experts:
        # linear_matrices sized the experts as the linear layers: correct them to each layer's bits
        num_sparse = len(shape.text.sparse_layers)
        for layer_bits in fmt.routed_expert_layer_bits(num_sparse):
            for (rows, cols, count), bits in zip(experts, layer_bits):
                total += count // num_sparse * (cpu_packed_bytes(rows, cols, bits)
                                                - fmt.matrix_bytes(rows, cols, dense_dtype_bytes))
    if fmt.method == "gguf" and fmt.packed_vocab_bits:
        rows, cols = _cdiv(shape.text.vocab_size, tp), shape.text.hidden_size
        total += cpu_packed_bytes(rows, cols, fmt.packed_vocab_bits) - rows * cols * dense_dtype_bytes
    return total
