"""Hidden-state draft heads (EAGLE-1, EAGLE-3; NEXTN plugs in beside them): which target features a head reads, the
target's capture of them, and the head module loaded beside the target (model_executor/draft_runner.py holds it).

Features (ForwardBatch.capture_hidden): EAGLE-1 and NEXTN read the target's final-normed hidden state ("last");
EAGLE-3 reads three decoder layers' outputs concatenated ("aux"), the layers named by the head's config.json
eagle_config.eagle_aux_hidden_state_layer_ids, else upstream's low / middle / high triple. Once enabled, EVERY
target forward keeps its features for all its input rows (ModelRunner.forward_local), which is what the eager
catch-up of speculative/eagle_proposer.py reads right after the forward.

With --tp-size > 1 the head runs on rank 0 only, unsharded (parallel_state.single_rank_view), while the target's
embedding and lm_head hold a vocabulary shard per rank: full_tables gathers the tables a head reads (EAGLE-1 and
NEXTN: embedding and lm_head, one table when tied; EAGLE-3: the embedding, its lm_head is its own) onto rank 0 at
start, which build_head gives the head instead of the target's shards. The target's captured features are full rows
on every rank (all-reduced before they are captured), so the head reads them as at tp=1.
"""

from __future__ import annotations

import importlib
from typing import Optional, Tuple

import torch
from torch import nn

HEAD_ALGORITHMS = ("EAGLE", "EAGLE3")
CAPTURE_MODE = {"EAGLE": "last", "EAGLE3": "aux", "NEXTN": "last"}
HEAD_CLASSES = {"EAGLE": ("sglang.srt.models.llama_eagle", "LlamaForCausalLMEagle"),
                "EAGLE3": ("sglang.srt.models.llama_eagle3", "LlamaForCausalLMEagle3"),
                "NEXTN": ("sglang.srt.models.deepseek_nextn", "DeepseekNextN")}
NUM_AUX_LAYERS = 3
# the target tables each head reads (model.model.embed_tokens, model.lm_head): gathered whole at tp > 1
SHARED_TABLES = {"EAGLE": ("embed_tokens", "lm_head"), "EAGLE3": ("embed_tokens",),
                 "NEXTN": ("embed_tokens", "lm_head")}


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


def full_tables(target_model: nn.Module, algorithm: str, is_rank0: bool) -> Optional[tuple]:
    """EVERY TP rank calls this (all-gathers): on rank 0 the unsharded copies of the tables SHARED_TABLES names, in
    that order, as tp=1 modules (a tied lm_head shares the embedding's copy); None on the other ranks."""
    from sglang.srt.distributed.communication_op import tp_all_gather
    from sglang.srt.distributed.parallel_state import single_rank_view
    from sglang.srt.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding

    embed = target_model.model.embed_tokens
    vocab, hidden = embed.num_embeddings, embed.embedding_dim
    weights = [tp_all_gather(embed.weight.data, dim=0)[:vocab]]
    lm_head = target_model.lm_head if "lm_head" in SHARED_TABLES[algorithm] else None
    tied = lm_head is not None and lm_head.weight is embed.weight
    if lm_head is not None and not tied:
        if getattr(lm_head.weight, "vnni_packed", False) or lm_head.quant_method is not None:
            raise ValueError(f"--speculative-algorithm {algorithm} with --tp-size > 1: the target's lm_head is held "
                             "packed for the CPU kernel, which cannot be gathered into the head's unsharded copy; "
                             "use --tp-size 1 (or --dtype float32).")
        weights.append(tp_all_gather(lm_head.weight.data, dim=0)[:vocab])
    if not is_rank0:
        return None
    with single_rank_view(), torch.device("meta"):  # shells, given the gathered tensors below
        tables = [VocabParallelEmbedding(vocab, hidden)] + ([ParallelLMHead(vocab, hidden)] if lm_head else [])
    for table, weight in zip(tables, weights):
        table.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
    if tied:
        tables[1].tie_weights(tables[0])
    return tuple(tables)


def check_unsharded(modules) -> None:
    """Every layer a rank-0-only draft runs was built for one rank: a sharded one would need its peers' collective,
    which single_rank_view turns into the identity (a wrong result, not an error)."""
    for m in modules:
        for sub in m.modules():
            if getattr(sub, "tp_size", 1) != 1:
                raise RuntimeError(f"draft layer {type(sub).__name__} is sharded over {sub.tp_size} TP ranks; the "
                                   "draft runs on rank 0 alone (single_rank_view)")


def build_head(algorithm: str, head_config, target_model: nn.Module, path: str, dtype: torch.dtype,
               device: str, tables: Optional[tuple] = None) -> nn.Module:
    """The head module in `dtype` on `device`, its own tensors read from `path`'s safetensors; tables: full_tables'
    copies, which replace the target's (sharded) ones the head holds in _shared."""
    from sglang.srt.layers.linear import prepack_dense_linear_weights
    from sglang.srt.layers.quantization import quantization_config
    from sglang.srt.model_loader.loader import set_default_torch_dtype
    from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator

    module, name = HEAD_CLASSES[algorithm]
    cls = getattr(importlib.import_module(module), name)
    with set_default_torch_dtype(dtype), torch.device(device), quantization_config("none", "", (128, 128)):
        head = cls(head_config, target_model)
    head.load_weights(safetensors_weights_iterator(path))
    if tables is not None:
        head._shared = tuple(t.to(dtype) for t in tables)
    prepack_dense_linear_weights(head)
    return head.eval()
