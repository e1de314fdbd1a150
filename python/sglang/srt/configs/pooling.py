"""How an embedding server (--is-embedding) pools a prompt's final hidden states into one vector.

Default: the last token's hidden state (what decoder embedding models such as e5-mistral / gte-Qwen / Qwen3-Embedding
are trained for). A sentence-transformers checkpoint states its pooling in `modules.json` -> the Pooling module's
`config.json`; `pooling_mode_mean_tokens` selects the mean over the prompt's tokens, `pooling_mode_lasttoken` the last
token. Other modes (CLS, max, weighted mean) are refused at startup with the reason. The vector is always
L2-normalized (docs/embeddings.md).
"""

from __future__ import annotations

import json
import os
from typing import Optional

POOLING_LAST = "last"
POOLING_MEAN = "mean"
POOLING_CHOICES = (POOLING_LAST, POOLING_MEAN)


def _read_json(path: str) -> Optional[object]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def resolve_pooling(model_dir: Optional[str]) -> str:
    """The pooling mode of the checkpoint in `model_dir` (module docstring); ValueError for a mode not served."""
    if not model_dir or not os.path.isdir(model_dir):
        return POOLING_LAST
    modules = _read_json(os.path.join(model_dir, "modules.json"))
    if not isinstance(modules, list):
        return POOLING_LAST
    for module in modules:
        if not isinstance(module, dict) or not str(module.get("type", "")).endswith("Pooling"):
            continue
        cfg = _read_json(os.path.join(model_dir, str(module.get("path", "")), "config.json")) or {}
        if cfg.get("pooling_mode_lasttoken"):
            return POOLING_LAST
        if cfg.get("pooling_mode_mean_tokens"):
            return POOLING_MEAN
        modes = sorted(k for k, v in cfg.items() if k.startswith("pooling_mode_") and v)
        raise ValueError(f"{model_dir}: the sentence-transformers Pooling config asks for {modes or 'no mode'}; "
                         f"--is-embedding serves last-token or mean pooling only (set pooling_mode_lasttoken or "
                         f"pooling_mode_mean_tokens in {module.get('path')}/config.json).")
    return POOLING_LAST
