"""Bytes of quantized linear weights: the one place the weights term learns the weight format (torch-free).

Which tensors are quantized: the linear layers of the transformer blocks (attention q/k/v/o or MLA's projections,
dense MLP gate/up/down, MoE experts and shared experts). Norms, biases, MoE routers and encoders stay in the model
dtype, as in upstream SGLang and in this runtime (layers/quantization/); so do the embedding and the lm_head, except
that a GGUF file's lm_head table served with --quantization gguf is held as its own packed blocks when its type has a
packed form (gguf_packed_vocab: the file's output.weight, or its token_embd.weight where the embedding is tied to the
lm_head, one packed table then serving both), as llama.cpp reads it.

Which tensors those are is the architecture's declaration: ModelShape.weight_groups (arch_spec.WeightGroup,
linear=True). A quantized checkpoint (quantization_config: fp8, mxfp4, awq, gptq, compressed-tensors; or
--quantization fp8 / awq / gptq) is charged what it stores for each of them, per tensor and per rank, minus the
modules it leaves unquantized: checkpoint_formats.py, the one place those bytes are defined. The formats this
runtime serves on a CPU are charged their packed form, for the merged tensors the runtime holds (q/k/v as one qkv,
gate/up as one gate_up: runtime_linear_matrices):
    none          rows * cols * dtype bytes
    w8a8_int8     this runtime's CPU packed form (below) at 8 bits: int8 values + fp16 scale and offset per 32
    gguf          the runtime's CPU packed form of each tensor's type (GGUF_PACKED_FORMATS: Q4_0 / Q4_1 at 4 bits,
                  Q5_0 / Q5_1 / Q8_0 at 8 bits with the fp16 header, Q4_K at 4 bits and Q5_K at 8 with the fp32
                  header, Q6_K at 8 with its own: 1.125 bytes per weight); other GGUF types (F16, F32, Q2_K, Q3_K) are requantized
                  to 8-bit blocks at load, as w8a8_int8. A file mixes types per tensor (Q4_K_M: Q4_K, Q6_K, Q5_0,
                  Q8_0), so a file's matrices are sized per layer from its header (gguf_matrix_formats), a merged
                  matrix (qkv, gate_up) in the join of its tensors' formats, as the loader packs them. The file itself
                  holds GGUF_BLOCK_BYTES per GGUF_BLOCK_WEIGHTS (Q4_0 4.5 bits/weight, Q4_K 4.5, Q6_K 6.5625, Q8_0
                  8.5), what llama.cpp keeps. A MoE file's routed experts (3-D ffn_*_exps tensors) may have other
                  types than its 2-D linear tensors: their bits are read per layer (gguf_expert_bits), a layer's
                  gate/up at the larger bits of its two tensors, as the runtime packs them (layers/moe/quant_experts.py;
                  the MoE kernel reads the fp16 header only: K-quant experts are requantized).
CPU packed form (sgl-kernel quant_layout.h, layers/quantization/packing.py): records of 16 rows x 32 weights, rows
padded to 16 and columns to 32: 16 * 32 * bits / 8 bytes of levels plus a header per record, 64 bytes (fp16 d, c per
row; or Q6_K's fp16 d and int8 sc per half block), 128 (fp32 d, c per row) or 256 (fp32 d, c per row and half block). A format code names both: bits + 16 *
header (cpu_format); 4 and 8 are the fp16 header's.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from sglang.srt.mem_plan.checkpoint_formats import (CHECKPOINT_METHODS, CheckpointFormat,
                                                     checkpoint_format)

# GGUF block formats: weights per block and bytes per block (ggml's type table)
GGUF_BLOCK_WEIGHTS = {"Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32, "Q2_K": 256, "Q3_K": 256,
                      "Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "Q8_K": 256}
GGUF_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34, "Q2_K": 84, "Q3_K": 110,
                    "Q4_K": 144, "Q5_K": 176, "Q6_K": 210, "Q8_K": 292}
CPU_PACK_ROWS = 16  # rows per packed record
CPU_PACK_COLS = 32  # weights per row of a record
HEAD_F16, HEAD_F32, HEAD_HALVES, HEAD_Q6 = 0, 1, 2, 3  # record headers (quant_layout.h's kQHead*)
CPU_PACK_HEADER_BYTES = {HEAD_F16: CPU_PACK_ROWS * 2 * 2, HEAD_F32: CPU_PACK_ROWS * 4 * 2,
                         HEAD_HALVES: CPU_PACK_ROWS * 4 * 4, HEAD_Q6: CPU_PACK_ROWS * (2 + 1 + 1)}


def cpu_format(bits: int, head: int) -> int:
    """A packed form's format code (quant_layout.h): bits (4 or 8) + 16 * header."""
    return bits + 16 * head


def format_bits(fmt: int) -> int:
    return fmt & 15


def format_head(fmt: int) -> int:
    return fmt >> 4


def join_formats(a: int, b: int) -> int:
    """The format of one packed matrix holding tensors of formats a and b (a merged qkv / gate_up): the wider bits and
    the wider header (every narrower record's values fit the wider one exactly); Q6_K's header holds Q6_K alone, so
    with another format it joins as the halves header."""
    if a == b:
        return a
    head = max(min(format_head(f), HEAD_HALVES) for f in (a, b))
    return cpu_format(max(format_bits(a), format_bits(b)), head)


# GGUF types the runtime serves from their blocks, exactly: the format code of their packed form (linear tensors);
# the rest are requantized to int8 blocks
GGUF_PACKED_FORMATS = {"Q4_0": 4, "Q4_1": 4, "Q5_0": 8, "Q5_1": 8, "Q8_0": 8, "Q4_K": cpu_format(4, HEAD_F32),
                       "Q5_K": cpu_format(8, HEAD_F32), "Q6_K": cpu_format(8, HEAD_Q6)}
# those with the fp16 header, which the MoE kernel and the packed vocabulary table also read (bits)
GGUF_PACKED_BITS = {k: v for k, v in GGUF_PACKED_FORMATS.items() if format_head(v) == HEAD_F16}
GGUF_REQUANTIZED_BITS = 8
DENSE_BITS = 16  # what a spec's bit width says for dense (unquantized) weights
# llama.cpp's stacked expert tensors (blk.N.<name>.weight, [E, rows, cols]) by the fused weight they become
GGUF_EXPERT_TENSORS = {"ffn_gate_exps": "w13", "ffn_up_exps": "w13", "ffn_down_exps": "w2"}


# formats `sglang plan` sizes that the CPU runtime does not serve (GPU checkpoints)
PLAN_ONLY_QUANTIZATIONS = ("fp8", "awq", "gptq")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def gguf_file_bytes(rows: int, cols: int, gguf_type: str) -> int:
    """Bytes of a [rows, cols] tensor in a GGUF file (rows of whole blocks)."""
    return rows * _cdiv(cols, GGUF_BLOCK_WEIGHTS[gguf_type]) * GGUF_BLOCK_BYTES[gguf_type]


def cpu_header_bytes(head: int) -> int:
    return CPU_PACK_HEADER_BYTES[head]


def cpu_record_bytes(fmt: int) -> int:
    """Bytes of one packed record: CPU_PACK_ROWS rows x CPU_PACK_COLS weights at the format's bits, plus its header
    (fmt 4 / 8: bits with the fp16 header)."""
    return cpu_header_bytes(format_head(fmt)) + CPU_PACK_ROWS * CPU_PACK_COLS * format_bits(fmt) // 8


def cpu_packed_bytes(rows: int, cols: int, fmt: int) -> int:
    """Bytes of this runtime's packed CPU form of a [rows, cols] weight in a format code (4 / 8 bits: the fp16 header;
    layers/quantization/packing.py builds exactly this many)."""
    return _cdiv(rows, CPU_PACK_ROWS) * _cdiv(cols, CPU_PACK_COLS) * cpu_record_bytes(fmt)


@dataclass(frozen=True)
class WeightFormat:
    """How the quantized linear weights are held. method: none | w8a8_int8 | gguf (this runtime's CPU forms) | one of
    checkpoint_formats.CHECKPOINT_METHODS (then `checkpoint` says what the checkpoint stores)."""

    method: str = "none"
    bits: int = 16
    checkpoint: Optional[CheckpointFormat] = None
    gguf_type: str = ""  # gguf: the linear tensors' type
    # gguf MoE: (gate/up, down) bits of the routed experts of each MoE layer, in layer order
    expert_bits: Optional[Tuple[Tuple[int, int], ...]] = None
    # gguf: the vocabulary table held packed (PACKED_VOCAB_LM_HEAD / PACKED_VOCAB_EMBEDDING, "" for none) and its bits
    packed_vocab: str = ""
    packed_vocab_bits: int = 0
    # gguf: (runtime projection, e.g. 'qkv_proj', its format code in each layer) from the file (gguf_matrix_formats)
    matrix_formats: Tuple[Tuple[str, Tuple[int, ...]], ...] = ()

    @property
    def group_size(self) -> int:
        """Input columns per scale of a checkpoint format's (first) codec (-1: all of them); 0 without one."""
        return self.checkpoint.codecs[0][1].group_size if self.checkpoint is not None else 0

    def matrix_bytes(self, rows: int, cols: int, dense_bytes: int) -> int:
        """Bytes held for one [rows, cols] linear weight; dense_bytes is the model dtype's element size."""
        m = self.method
        if m == "none":
            return rows * cols * dense_bytes
        if m == "gguf":
            return cpu_packed_bytes(rows, cols, gguf_type_format(self.gguf_type))
        if m == "w8a8_int8":
            return cpu_packed_bytes(rows, cols, 8)
        raise ValueError(f"unknown weight format {m!r}")

    def matrices_bytes(self, name: str, rows: int, cols: int, count: int, dense_bytes: int) -> int:
        """Bytes of `count` [rows, cols] linear weights of the runtime projection `name` (one per layer): per layer in
        the file's format for it where matrix_formats has one per layer, else matrix_bytes each."""
        per_layer = dict(self.matrix_formats).get(name, ())
        if self.method == "gguf" and len(per_layer) == count:
            return sum(cpu_packed_bytes(rows, cols, f) for f in per_layer)
        return count * self.matrix_bytes(rows, cols, dense_bytes)

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
    them) its token_embd.weight; it is packed only when its type has a packed form with the fp16 header
    (GGUF_PACKED_BITS: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; the embedding lookup reads those records), so the logits read the
    file's own blocks. Other types (F16, F32, K-quants) stay dense: a requantized lm_head would round the logits of a
    file whose author kept that table wide."""
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
    """Bits of the fp16-header packed form a GGUF expert tensor of this type is held in (F16, F32, K-quants:
    requantized; the MoE kernel reads that header only)."""
    return GGUF_PACKED_BITS.get(gguf_type, GGUF_REQUANTIZED_BITS)


def gguf_type_format(gguf_type: str) -> int:
    """The format code a 2-D (linear) GGUF tensor of this type is packed in (requantized types: 8 bits, fp16)."""
    return GGUF_PACKED_FORMATS.get(gguf_type, GGUF_REQUANTIZED_BITS)


# llama.cpp's per-layer linear tensor names (blk.N.<name>.weight) by the HF projection they hold
GGUF_LINEAR_TENSORS = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj",
                       "ffn_gate": "gate_proj", "ffn_up": "up_proj", "ffn_down": "down_proj"}


def gguf_matrix_formats(gguf_path: Optional[str]) -> Tuple[Tuple[str, Tuple[int, ...]], ...]:
    """(runtime projection, its format code in each layer, in layer order) of a GGUF file's 2-D linear tensors (header
    only): q/k/v as one qkv_proj and gate/up as one gate_up_proj in the join of their tensors' formats, as the
    loader packs them (layers/quantization/linear_method.py). () without a file."""
    if not gguf_path:
        return ()
    layers: Dict[str, Dict[int, int]] = {}
    for name, kind, dims in _block_tensor_types(gguf_path):
        layer, _, rest = name.partition(".")
        proj = GGUF_LINEAR_TENSORS.get(rest[: -len(".weight")])
        if proj is None or dims != 2:
            continue
        per = layers.setdefault(MERGED_PROJECTIONS.get(proj, proj), {})
        fmt = gguf_type_format(kind)
        per[int(layer)] = join_formats(per[int(layer)], fmt) if int(layer) in per else fmt
    return tuple((proj, tuple(per[i] for i in sorted(per))) for proj, per in layers.items())


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


KNOWN_QUANTIZATIONS = ("none", "gguf", "w8a8_int8", *CHECKPOINT_METHODS)


def weight_format(quantization: Optional[str], hf_quant_config: Optional[dict] = None,
                  gguf_type: str = "", expert_bits: Optional[Tuple[Tuple[int, int], ...]] = None,
                  packed_vocab: Tuple[str, int] = ("", 0),
                  matrix_formats: Tuple[Tuple[str, Tuple[int, ...]], ...] = ()) -> WeightFormat:
    """The format from --quantization, else from config.json's quantization_config (a quantized checkpoint); the
    checkpoint's settings apply when its quant_method is the one chosen. packed_vocab: gguf_packed_vocab's
    (table, bits) of a GGUF file, matrix_formats its gguf_matrix_formats (gguf only). ValueError naming an unknown
    method and the known ones."""
    cfg = hf_quant_config or {}
    method = quantization or str(cfg.get("quant_method", "none")).lower()
    if method in ("none", ""):
        return WeightFormat()
    if method in CHECKPOINT_METHODS:
        own = cfg if str(cfg.get("quant_method", "")).lower() == method else {}
        ckpt = checkpoint_format(method, own)
        codec = ckpt.codecs[0][1]
        return WeightFormat(method, codec.bits, checkpoint=ckpt)  # groups, blocks, scales: ckpt's codecs
    if method == "w8a8_int8":
        return WeightFormat("w8a8_int8", 8)
    if method == "gguf":
        return WeightFormat("gguf", gguf_type_bits(gguf_type), gguf_type=gguf_type, expert_bits=expert_bits,
                            packed_vocab=packed_vocab[0], packed_vocab_bits=packed_vocab[1],
                            matrix_formats=matrix_formats)
    source = "--quantization" if quantization else "quantization_config.quant_method"
    raise ValueError(f"{source} {method!r}: the planner knows {', '.join(KNOWN_QUANTIZATIONS)}; a checkpoint in "
                     "another format cannot be sized.")


# projections this runtime holds as one merged tensor (models/: qkv_proj, gate_up_proj; Mixtral's w1 / w3)
MERGED_PROJECTIONS = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
                      "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj", "w1": "gate_up_proj",
                      "w3": "gate_up_proj"}
GATE_UP = "gate_up_proj"


def runtime_linear_matrices_named(groups) -> list[tuple[str, int, int, int, bool, bool]]:
    """(projection, rows, cols, count, expert, is gate_up) of the linear weights as this runtime holds them: the linear
    WeightGroups with q/k/v and gate/up of one module merged (their rows added), in declaration order; projection is
    the runtime module's name (qkv_proj, gate_up_proj, o_proj, down_proj, ...)."""
    merged: dict[tuple, list] = {}
    for g in groups:
        if not g.linear:
            continue
        parts = g.module.split(".")
        proj = parts[-2] if len(parts) >= 2 else g.module
        name = MERGED_PROJECTIONS.get(proj, "")
        key = (".".join(parts[:-2]), name, g.shape[1], g.count, g.expert) if name else (g.module,)
        rows = merged.setdefault(key, [name or proj, 0, g.shape[1], g.count, g.expert, name == GATE_UP])
        rows[1] += g.shape[0]
    return [tuple(v) for v in merged.values()]


def runtime_linear_matrices(groups) -> list[tuple[int, int, int, bool, bool]]:
    """runtime_linear_matrices_named without the projection: (rows, cols, count, expert, is gate_up)."""
    return [m[1:] for m in runtime_linear_matrices_named(groups)]


def quantized_weight_bytes(shape, fmt: WeightFormat, tp: int = 1, dense_dtype_bytes: int = 2, ep: int = 1) -> int:
    """The weights term of a ModelShape (model_shapes.py) whose linear layers are held in `fmt`: the dense bytes at
    the model dtype (a tensor stored in its own dtype, WeightGroup.dtype, at that one's), with each linear
    WeightGroup's dense bytes replaced by what the format holds for it (ep: --ep-size). A checkpoint format: its stored tensors (checkpoint_formats.py). This runtime's CPU forms: the merged
    matrices' packed bytes, the routed experts' at their own bits (fmt.routed_expert_layer_bits), and the packed
    vocabulary table of a GGUF file (fmt.packed_vocab) in its packed bytes: exactly one [vocab, hidden] table, the
    lm_head's or the tied embedding's."""
    total = shape.dense_weight_bytes(tp, dense_dtype_bytes, ep)  # tensors with their own stored dtype at theirs
    if fmt.method == "none":
        return total
    groups = shape.weight_groups(tp, ep)
    if fmt.checkpoint is not None:
        return total + sum(fmt.checkpoint.group_bytes(g, dense_dtype_bytes) - g.numel * dense_dtype_bytes
                           for g in groups)
    num_sparse = len(shape.text.sparse_layers)
    layer_bits = fmt.routed_expert_layer_bits(num_sparse) if num_sparse else ()
    for proj, rows, cols, count, expert, gate_up in runtime_linear_matrices_named(groups):
        dense = count * rows * cols * dense_dtype_bytes
        if expert and fmt.method in ("gguf", "w8a8_int8") and num_sparse:
            # each MoE layer's experts at that layer's bits (count: layers x experts held)
            total += sum(count // num_sparse * cpu_packed_bytes(rows, cols, bits[0 if gate_up else 1])
                         for bits in layer_bits) - dense
        else:
            total += fmt.matrices_bytes(proj, rows, cols, count, dense_dtype_bytes) - dense
    if fmt.method == "gguf" and fmt.packed_vocab_bits:
        rows, cols = _cdiv(shape.text.vocab_size, tp), shape.text.hidden_size
        total += cpu_packed_bytes(rows, cols, fmt.packed_vocab_bits) - rows * cols * dense_dtype_bytes
    return total
