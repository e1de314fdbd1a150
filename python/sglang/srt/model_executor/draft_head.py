"""Hidden-state draft heads (EAGLE-1, EAGLE-3; NEXTN plugs in beside them): which target features a head reads, the
target's capture of them, and the head module loaded beside the target (model_executor/draft_runner.py holds it).

Features (ForwardBatch.capture_hidden): EAGLE-1 and NEXTN read the target's final-normed hidden state ("last");
EAGLE-3 reads three decoder layers' outputs concatenated ("aux"), the layers named by the head's config.json
eagle_config.eagle_aux_hidden_state_layer_ids, else upstream's low / middle / high triple. Once enabled, EVERY
target forward keeps its features for all its input rows (ModelRunner.forward_local), which is what the eager
catch-up of speculative/eagle_proposer.py reads right after the forward.
"""

from __future__ import annotations

import importlib
from typing import Tuple

import torch
from torch import nn

HEAD_ALGORITHMS = ("EAGLE", "EAGLE3")
CAPTURE_MODE = {"EAGLE": "last", "EAGLE3": "aux", "NEXTN": "last"}
HEAD_CLASSES = {"EAGLE": ("sglang.srt.models.llama_eagle", "LlamaForCausalLMEagle"),
                "EAGLE3": ("sglang.srt.models.llama_eagle3", "LlamaForCausalLMEagle3"),
                "NEXTN": ("sglang.srt.models.deepseek_nextn", "DeepseekNextN")}
NUM_AUX_LAYERS = 3


def default_aux_layer_ids(num_layers: int) -> Tuple[int, ...]:
    """Upstream keeps the residual stream entering layers 2, L // 2 and L - 3: the outputs of these layers."""
    return (1, num_layers // 2 - 1, num_layers - 4)


def aux_layer_ids(head_config, num_layers: int) -> Tuple[int, ...]:
    eagle = getattr(head_config, "eagle_config", None) or {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    ids = tuple(int(i) for i in ids) if ids else default_aux_layer_ids(num_layers)
    if len(ids) != NUM_AUX_LAYERS or any(not 0 <= i < num_layers for i in ids):
        src = "eagle_config.eagle_aux_hidden_state_layer_ids" if eagle else "the default layer triple"
        raise ValueError(f"--speculative-algorithm EAGLE3: {src} {list(ids)} must name {NUM_AUX_LAYERS} layers of the "
                         f"target's {num_layers}; use a head trained for this target (or a target with >= 5 layers).")
    return ids


def enable_capture(target, algorithm: str, head_config=None) -> str:
    """Make every forward of `target` (a ModelRunner) keep the features `algorithm`'s head reads; ValueError naming
    the model type when its forward cannot hand them over."""
    mode = CAPTURE_MODE[algorithm]
    model = target.model
    modes = model.hidden_capture_modes() if hasattr(model, "hidden_capture_modes") else ()
    if mode not in modes:
        mt = target.model_config.shape.text.model_type
        raise ValueError(f"--speculative-algorithm {algorithm}: model_type {mt} ({type(model).__name__}) cannot hand "
                         f"its hidden states to a draft head in this runtime (Llama-family models and DeepSeek can); "
                         "drop the flag, or use NGRAM or STANDALONE.")
    if mode == "aux":
        model.model.aux_layer_ids = aux_layer_ids(head_config, len(model.model.layers))
    target.capture_hidden = mode
    return mode


def check_head_fits(algorithm: str, head_config, target_config, path: str) -> None:
    """The head reads the target's hidden size and proposes in its vocabulary."""
    th, tv = target_config.hidden_size, target_config.vocab_size
    fh = getattr(head_config, "target_hidden_size", None) or head_config.hidden_size
    if algorithm == "EAGLE3":
        if fh != th:
            raise ValueError(f"--speculative-draft-model-path {path}: the EAGLE3 head reads hidden states of size {fh}"
                             f", the target's are {th}; use a head trained for this target.")
    elif head_config.hidden_size != th:
        raise ValueError(f"--speculative-draft-model-path {path}: the EAGLE head's hidden_size is "
                         f"{head_config.hidden_size}, the target's {th}; use a head trained for this target.")
    if head_config.vocab_size != tv:
        raise ValueError(f"--speculative-draft-model-path {path}: the head's vocabulary has {head_config.vocab_size} "
                         f"tokens, the target's {tv}; use a head trained for this target.")


def build_head(algorithm: str, head_config, target_model: nn.Module, path: str, dtype: torch.dtype,
               device: str) -> nn.Module:
    """The head module in `dtype` on `device`, its own tensors read from `path`'s safetensors."""
    from sglang.srt.layers.linear import prepack_dense_linear_weights
    from sglang.srt.layers.quantization import quantization_config
    from sglang.srt.model_loader.loader import set_default_torch_dtype
    from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator

    module, name = HEAD_CLASSES[algorithm]
    cls = getattr(importlib.import_module(module), name)
    with set_default_torch_dtype(dtype), torch.device(device), quantization_config("none", "", (128, 128)):
        head = cls(head_config, target_model)
    head.load_weights(safetensors_weights_iterator(path))
    prepack_dense_linear_weights(head)
    return head.eval()
