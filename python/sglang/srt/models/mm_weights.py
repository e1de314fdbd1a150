"""Weight loading shared by the multimodal models: encoder towers and projectors copied into their parameters, the
rest handed to the language model under `language_model.`."""

from __future__ import annotations

from typing import Callable, Iterable, Optional, Tuple

import torch
from torch import nn


def load_multimodal_weights(model: nn.Module, weights: Iterable[Tuple[str, torch.Tensor]],
                            rename: Callable[[str], Optional[str]]) -> None:
    """rename maps a checkpoint name to this model's parameter name, or None for a tensor the model does not use.
    Every non-LM parameter must be loaded once with its exact shape; the LM checks its own."""
    params = dict(model.named_parameters())
    text_weights, loaded = [], set()
    for raw_name, w in weights:
        name = rename(raw_name)
        if name is None:
            continue
        if name.startswith("language_model."):
            text_weights.append((name[len("language_model."):], w))
            continue
        if name not in params:
            raise KeyError(f"Checkpoint tensor {raw_name!r} has no parameter in {type(model).__name__}.")
        if params[name].shape != w.shape:
            raise ValueError(f"{raw_name}: checkpoint shape {tuple(w.shape)} != parameter {tuple(params[name].shape)}")
        params[name].data.copy_(w)
        loaded.add(name)
    model.language_model.load_weights(text_weights)
    missing = [n for n in params if not n.startswith("language_model.") and n not in loaded]
    if missing:
        raise ValueError(f"Checkpoint is missing weights: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
