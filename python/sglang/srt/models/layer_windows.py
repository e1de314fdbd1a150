"""Each decoder layer's attention window, read from the planner's declaration of the architecture.

The planner sizes the windowed KV pool from TextShape.layer_kinds / sliding_window (mem_plan/arch_*.py); a model that
read config.json's window keys itself could disagree with it (a null sliding_window, an absent layer_types, a
default), and a layer masked by a window the pool does not keep would read freed K/V. So models take their windows
from the same shape function, applied to the same config.
"""

from __future__ import annotations

from typing import Tuple

from sglang.srt.mem_plan.model_shapes import text_shape_from_config

NO_WINDOW = -1  # RadixAttention's sliding_window_size for a layer that attends to every earlier token


def config_dict(hf_config, model_type: str) -> dict:
    """config.json's keys as the planner reads them, from a transformers config or a start's HFConfigSnapshot (which
    holds the instance attributes, its dtypes by name, and no class attributes such as model_type)."""
    if hasattr(hf_config, "to_dict"):
        return hf_config.to_dict()
    values = {k: v for k, v in vars(hf_config).items() if not k.startswith("_snapshot")}
    return {"model_type": model_type, **values, **hf_config.__dict__.get("_snapshot_dtypes", {})}


def layer_windows(hf_config, model_type: str) -> Tuple[int, ...]:
    """sliding_window_size per decoder layer of a `model_type` config: the shape's window for a "sliding" layer,
    NO_WINDOW for a "full" one; ValueError for kinds no served model has (chunked, linear)."""
    shape = text_shape_from_config(config_dict(hf_config, model_type))
    other = sorted(set(shape.kinds()) - {"full", "sliding"})
    if other:
        raise ValueError(f"{shape.model_type}: {' / '.join(other)} layers are not served by this model implementation")
    return tuple(shape.sliding_window if kind == "sliding" else NO_WINDOW for kind in shape.kinds())
