"""Quantized checkpoint formats read from config.json's quantization_config: which weights a checkpoint holds in its
format, and the bytes of every tensor it stores for one of them (torch-free). The weights term
(quantization_sizes.quantized_weight_bytes) charges a linear WeightGroup (arch_spec.py) these bytes per tensor, per
rank; every other group stays in the model dtype.

Tensors stored for one quantized [rows, cols] linear weight (rows = output features, cols = input features):
    fp8 (transformers' FineGrainedFP8 / DeepSeek-V3, Qwen3-FP8; AutoFP8)
        weight fp8 [rows, cols]; weight_block_size [bn, bk]: weight_scale_inv fp32 [ceil(rows/bn), ceil(cols/bk)],
        none: weight_scale fp32, one per tensor. activation_scheme "static" adds input_scale, one fp32 per tensor
        ("dynamic" stores none).
    mxfp4 (gpt-oss): only the routed experts' weights; *_blocks uint8 [rows, cols/32, 16] (two E2M1 values a
        byte) and *_scales uint8 [rows, cols/32] (one E8M0 exponent per 32 input weights): 17 bytes per 32 weights.
    awq (AutoAWQ, version gemm; gemv refused): qweight int32 [cols, rows*bits/32], scales fp16 [groups, rows],
        qzeros int32 [groups, rows*bits/32] (zero_point: false stores none); groups = ceil(cols / group_size).
    gptq (AutoGPTQ / GPTQModel, checkpoint_format gptq / gptq_v2; marlin refused): qweight int32
        [cols*bits/32, rows], scales fp16 [groups, rows], qzeros int32 [groups, rows*bits/32] (stored even when
        sym), g_idx int32 [cols] (stored with or without desc_act).
    compressed-tensors (llm-compressor), per config group, by format (a sparsity_config other than dense refused):
        pack-quantized   weight_packed int32 [rows, ceil(cols*bits/32)], weight_shape int64 [2], and when not
                         symmetric weight_zero_point int32 [ceil(rows*bits/32), scale columns]
        int-quantized,   weight int8 / fp8 [rows, cols] (one byte a value at <= 8 bits), and when not symmetric
        float-quantized, weight_zero_point int8 of the scale's shape
        naive-quantized
        every format: weight_scale in scale_dtype (default: the model dtype) of strategy tensor [1], channel
        [rows, 1], group [rows, ceil(cols/group_size)] or block [ceil(rows/bn), ceil(cols/bk)]; actorder "group"
        adds weight_g_idx int32 [cols]; static input activations add input_scale (tensor [1] or group
        [ceil(cols/group_size)], model dtype) and, when not symmetric, input_zero_point int8 of its shape.
A module a format leaves unquantized (modules_to_not_convert, compressed-tensors' ignore, or not a target) stays
in the model dtype; checkpoint_modules.py matches the names by each format's own rule.

Under TP a rank's shard of a weight ([rows/tp, cols] or [rows, cols/tp], as its WeightGroup says) is priced by the
same rule: the scales, zero points and g_idx of its own rows / columns. Not priced: a GPTQ act-order layer split by
input columns, whose scales a GPU loader may keep whole on every rank (groups x rows, not groups/tp x rows), and the
per-layer k_scale / v_scale scalars a compressed-tensors kv_cache_scheme adds (bytes per layer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sglang.srt.mem_plan.dtypes import dtype_bytes
from sglang.srt.mem_plan.checkpoint_modules import ct_instances, hf_not_converted, module_of
from sglang.srt.mem_plan.rounding import cdiv

# the quant_method values the planner prices (quantization_sizes.weight_format adds none / gguf / w8a8_int8)
CHECKPOINT_METHODS = ("fp8", "mxfp4", "awq", "gptq", "compressed-tensors")
CT_FORMATS = ("pack-quantized", "int-quantized", "float-quantized", "naive-quantized")
CT_STRATEGIES = ("tensor", "channel", "group", "block")
FP32_BYTES, FP16_BYTES, INT32_BYTES, INT64_BYTES = 4, 2, 4, 8
MXFP4_GROUP = 32  # weights per E8M0 scale
MXFP4_BLOCK_BYTES = 16  # bytes of one group's E2M1 values
DEFAULT_GROUP_SIZE = 128
GPTQ_LAYOUTS = ("gptq", "gptq_v2")  # qweight / qzeros / scales / g_idx (v2: zero points stored without the -1)


@dataclass(frozen=True)
class LinearCodec:
    """How a checkpoint stores one quantized linear weight. kind: fp8 | mxfp4 | awq | gptq | a CT_FORMATS entry."""

    kind: str
    bits: int = 8
    strategy: str = "tensor"  # scales: tensor | channel | group | block
    group_size: int = 0  # group: input columns per scale (-1: all of them)
    block: Optional[tuple[int, int]] = None  # block: [rows, cols] a scale covers
    symmetric: bool = True
    zero_points: bool = False  # awq / gptq: qzeros stored
    g_idx: bool = False
    scale_bytes: int = 0  # 0: the model dtype's
    input_scales: str = ""  # static activations: "tensor" | "group"; "" for dynamic / none
    input_symmetric: bool = True

    def scale_shape(self, rows: int, cols: int) -> tuple[int, int]:
        if self.strategy == "tensor":
            return (1, 1)
        if self.strategy == "channel":
            return (rows, 1)
        if self.strategy == "group":
            return (rows, cdiv(cols, self.group_size) if self.group_size > 0 else 1)
        return (cdiv(rows, self.block[0]), cdiv(cols, self.block[1]))

    def matrix_bytes(self, rows: int, cols: int, dense_bytes: int) -> int:
        """Bytes of every tensor the checkpoint stores for one [rows, cols] weight."""
        k, sr, sc = self.kind, *self.scale_shape(rows, cols)
        if k == "mxfp4":
            return rows * cdiv(cols, MXFP4_GROUP) * (MXFP4_BLOCK_BYTES + 1)
        if k == "fp8":
            return rows * cols + sr * sc * FP32_BYTES + (FP32_BYTES if self.input_scales else 0)
        if k in ("awq", "gptq"):
            groups = sc
            words = cdiv(rows * self.bits, 32) * cols if k == "awq" else cdiv(cols * self.bits, 32) * rows
            zeros = groups * cdiv(rows * self.bits, 32) * INT32_BYTES if self.zero_points else 0
            return words * INT32_BYTES + groups * rows * FP16_BYTES + zeros + (cols * INT32_BYTES if self.g_idx else 0)
        scale = self.scale_bytes or dense_bytes
        total = sr * sc * scale + (cols * INT32_BYTES if self.g_idx else 0)
        if k == "pack-quantized":
            total += rows * cdiv(cols * self.bits, 32) * INT32_BYTES + 2 * INT64_BYTES
            if not self.symmetric:
                total += (cdiv(sr * self.bits, 32) * sc * INT32_BYTES if self.strategy in ("group", "channel")
                          else sr * sc)
        else:
            total += rows * cols + (0 if self.symmetric else sr * sc)
        if self.input_scales:
            n = 1 if self.input_scales == "tensor" else cdiv(cols, self.group_size)
            total += n * dense_bytes + (0 if self.input_symmetric else n)
        return total


@dataclass(frozen=True)
class CheckpointFormat:
    """A checkpoint's quantization_config: codec per quantized linear group, None for one kept in the dtype.

    codecs: (targets, codec) per compressed-tensors config group; one ((), codec) for the other formats."""

    method: str
    codecs: tuple[tuple[tuple[str, ...], LinearCodec], ...]
    not_converted: tuple[str, ...] = ()  # modules_to_not_convert / ignore
    experts_only: bool = False  # mxfp4: only the routed experts are quantized
    lm_head: bool = False  # gptq "lm_head": true quantizes the lm_head too

    def codec_for(self, group) -> tuple[Optional[LinearCodec], int]:
        """(the codec a WeightGroup is stored in, how many of its instances are), or (None, 0): it stays in the
        model dtype."""
        quantizable = group.linear or (self.lm_head and group.component == "lm_head")
        if not quantizable or (self.experts_only and not group.expert):
            return None, 0
        module = module_of(group.module)
        if self.method == "compressed-tensors":
            dense = ct_instances(module, group.count, True, self.not_converted, "ignore")
            if dense == group.count:
                return None, 0
            for targets, codec in self.codecs:
                hit = ct_instances(module, group.count, True, targets, "config_groups.targets")
                if hit == group.count:
                    return codec, group.count - dense
                if hit:
                    raise ValueError(f"quantization_config.config_groups targets name {hit} of the {group.count} "
                                     f"instances of {module}; the planner prices a config group that targets all "
                                     "instances of a module alike.")
            return None, 0
        if hf_not_converted(module, self.not_converted):
            return None, 0
        return self.codecs[0][1], group.count

    def group_bytes(self, group, dense_bytes: int) -> int:
        """Bytes of a WeightGroup as the checkpoint stores it."""
        codec, quantized = self.codec_for(group)
        if codec is None or not quantized:
            return group.numel * dense_bytes
        rows, cols = group.shape
        return quantized * codec.matrix_bytes(rows, cols, dense_bytes) + (group.count - quantized) * rows * cols * \
            dense_bytes


def _refuse(what: str, value, known) -> ValueError:
    return ValueError(f"quantization_config {what} {value!r}: the planner knows {', '.join(map(str, known))}; "
                      "a checkpoint in another format cannot be sized.")


def _fp8(cfg: dict) -> CheckpointFormat:
    block = cfg.get("weight_block_size")
    scheme = cfg.get("activation_scheme", "dynamic")
    if scheme not in ("dynamic", "static"):
        raise _refuse("activation_scheme", scheme, ("dynamic", "static"))
    codec = LinearCodec("fp8", 8, "block" if block else "tensor", block=tuple(block) if block else None,
                        input_scales="tensor" if scheme == "static" else "")
    return CheckpointFormat("fp8", (((), codec),), _not_converted(cfg))


def _not_converted(cfg: dict) -> tuple[str, ...]:
    return tuple(cfg.get("modules_to_not_convert") or ()) + tuple(cfg.get("ignored_layers") or ())


def _int4(method: str, cfg: dict) -> CheckpointFormat:
    bits = int(cfg.get("bits", cfg.get("w_bit", 4)))
    group = int(cfg.get("group_size", cfg.get("q_group_size", DEFAULT_GROUP_SIZE)))
    not_converted = _not_converted(cfg)
    if method == "awq":
        version = str(cfg.get("version", "gemm")).lower()
        if version != "gemm":
            raise _refuse("version (awq)", version, ("gemm",))
        codec = LinearCodec("awq", bits, "group", group, zero_points=bool(cfg.get("zero_point", True)))
    else:
        layout = str(cfg.get("checkpoint_format") or "gptq").lower()
        if layout not in GPTQ_LAYOUTS:
            raise _refuse("checkpoint_format (gptq)", layout, GPTQ_LAYOUTS)
        for key in (cfg.get("dynamic") or {}):
            if not key.startswith("-:"):
                raise ValueError(f"quantization_config.dynamic entry {key!r} overrides bits / group size per "
                                 "module; the planner prices one GPTQ scheme for every quantized module (a '-:' "
                                 "entry, a module left unquantized, is priced).")
            not_converted += (key[2:],)
        codec = LinearCodec("gptq", bits, "group", group, zero_points=True, g_idx=True)
    return CheckpointFormat(method, (((), codec),), not_converted, lm_head=bool(cfg.get("lm_head", False)))


def _ct_codec(fmt: str, weights: dict, inputs: Optional[dict]) -> LinearCodec:
    if fmt not in CT_FORMATS:
        raise _refuse("format (compressed-tensors)", fmt, CT_FORMATS)
    strategy = str(weights.get("strategy") or "tensor").lower()
    if strategy not in CT_STRATEGIES:
        raise _refuse("weights.strategy (compressed-tensors)", strategy, CT_STRATEGIES)
    bits = int(weights.get("num_bits", 8))
    if fmt != "pack-quantized" and bits > 8:
        raise _refuse("weights.num_bits (compressed-tensors)", bits, range(1, 9))
    block = weights.get("block_structure")
    scale_dtype = weights.get("scale_dtype")
    input_scales, input_symmetric = "", True
    if inputs and not inputs.get("dynamic", False):
        input_scales = str(inputs.get("strategy") or "tensor").lower()
        if input_scales not in ("tensor", "group"):
            raise _refuse("input_activations.strategy (static, compressed-tensors)", input_scales, ("tensor", "group"))
        input_symmetric = bool(inputs.get("symmetric", True))
    return LinearCodec(fmt, bits, strategy, int(weights.get("group_size") or 0),
                       tuple(block) if block else None, bool(weights.get("symmetric", True)),
                       g_idx=str(weights.get("actorder") or "").lower() == "group",
                       scale_bytes=dtype_bytes(str(scale_dtype).replace("torch.", "")) if scale_dtype else 0,
                       input_scales=input_scales, input_symmetric=input_symmetric)


def _compressed_tensors(cfg: dict) -> CheckpointFormat:
    sparsity = (cfg.get("sparsity_config") or {}).get("format")
    if sparsity and sparsity != "dense":
        raise _refuse("sparsity_config.format (compressed-tensors)", sparsity, ("dense",))
    default_fmt = cfg.get("format")
    codecs = []
    for name, group in (cfg.get("config_groups") or {}).items():
        weights = group.get("weights")
        if not weights:
            raise ValueError(f"quantization_config.config_groups.{name} quantizes no weights (activations or the KV "
                             "cache only); the planner sizes weight formats. Plan it with --quantization none.")
        fmt = group.get("format") or default_fmt
        codecs.append((tuple(group.get("targets") or ()), _ct_codec(str(fmt), weights, group.get("input_activations"))))
    if not codecs:
        raise ValueError("quantization_config (compressed-tensors) has no config_groups: nothing says which weights "
                         "are quantized or how.")
    return CheckpointFormat("compressed-tensors", tuple(codecs), tuple(cfg.get("ignore") or ()))


def checkpoint_format(method: str, cfg: dict) -> CheckpointFormat:
    """The format of a checkpoint whose quantization_config is cfg (method: its quant_method, lower case)."""
    if method == "fp8":
        return _fp8(cfg)
    if method == "mxfp4":
        return CheckpointFormat("mxfp4", (((), LinearCodec("mxfp4", 4)),), _not_converted(cfg), experts_only=True)
    if method in ("awq", "gptq"):
        return _int4(method, cfg)
    if method == "compressed-tensors":
        return _compressed_tensors(cfg)
    raise _refuse("quant_method", method, CHECKPOINT_METHODS)
