"""The quantization_config of an fp8 block checkpoint (torch-free: `sglang plan` and the start's resolution read it).

fp8_block.py reads the tensors; checkpoint_formats.py prices what the checkpoint stores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

SERVED_FORMAT = "e4m3"


def _as_dict(quant_config) -> dict:
    if isinstance(quant_config, dict):
        return quant_config
    to_dict = getattr(quant_config, "to_dict", None)  # a transformers QuantizationConfig object
    return to_dict() if to_dict is not None else {}


def is_fp8_block_checkpoint(quant_config) -> bool:
    """Whether quantization_config says fp8 weights with block scales (whether or not this runtime loads it)."""
    cfg = _as_dict(quant_config)
    return str(cfg.get("quant_method", "")).lower() == "fp8" and bool(cfg.get("weight_block_size"))


@dataclass(frozen=True)
class Fp8BlockFormat:
    block_n: int  # output rows per scale
    block_k: int  # input columns per scale
    not_converted: Tuple[str, ...] = ()


def fp8_block_format(quant_config: Optional[dict]) -> Optional[Fp8BlockFormat]:
    """The block format of a checkpoint's quantization_config, None for a checkpoint that is not fp8; ValueError
    naming the field for fp8 checkpoints this runtime does not load."""
    cfg = _as_dict(quant_config)
    if not cfg or str(cfg.get("quant_method", "")).lower() != "fp8":
        return None
    block = cfg.get("weight_block_size")
    if not block or len(block) != 2:
        raise ValueError("quantization_config (fp8) has no weight_block_size: this runtime loads fp8 checkpoints with "
                         "block scales (weight_scale_inv, e.g. [128, 128]); a per-tensor fp8 checkpoint is sized by "
                         "`sglang plan` only. Serve its bf16 original instead.")
    fmt = str(cfg.get("fmt", SERVED_FORMAT)).lower()
    if fmt != SERVED_FORMAT:
        raise ValueError(f"quantization_config.fmt {fmt!r}: this runtime loads {SERVED_FORMAT} fp8 blocks only.")
    scheme = str(cfg.get("activation_scheme", "dynamic")).lower()
    if scheme != "dynamic":
        raise ValueError(f"quantization_config.activation_scheme {scheme!r}: this runtime loads block fp8 "
                         "checkpoints with dynamic activation scales (input_scale tensors are not read).")
    not_converted = tuple(cfg.get("modules_to_not_convert") or ()) + tuple(cfg.get("ignored_layers") or ())
    return Fp8BlockFormat(int(block[0]), int(block[1]), not_converted)



ROUTED_EXPERT_FIELDS = ("n_routed_experts", "num_experts", "num_local_experts")


FP8_ROUTED_EXPERTS_REFUSAL = (
    "--quantization fp8 (an fp8 block checkpoint on a GPU) with routed experts: this runtime has no block-fp8 MoE "
    "kernel, so the experts would be held dequantized, more than `sglang plan` charges for the checkpoint's blocks. "
    "Use --quantization none (every weight dequantized once to --dtype, as the plan then charges).")


def fp8_path_refusal(config: dict) -> str:
    """check_fp8_path_model's message for a config.json dict ('' when the fp8 GPU path holds the model): what
    `sglang plan` notes beside a plan it prices but a start refuses."""
    text = config.get("text_config") or config
    return FP8_ROUTED_EXPERTS_REFUSAL if any(text.get(f) for f in ROUTED_EXPERT_FIELDS) else ""


def check_fp8_path_model(hf_config) -> None:
    """ValueError for a model the fp8 GPU path cannot hold as `sglang plan` prices it: routed experts have no
    block-fp8 kernel here (they would be dequantized, more bytes than the checkpoint's blocks the plan charges)."""
    text = getattr(hf_config, "text_config", None) or hf_config
    if any(getattr(text, f, None) for f in ROUTED_EXPERT_FIELDS):
        raise ValueError(FP8_ROUTED_EXPERTS_REFUSAL)

