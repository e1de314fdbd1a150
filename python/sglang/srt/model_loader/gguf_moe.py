"""GGUF MoE checkpoints in llama.cpp's layout -> this runtime's Hugging Face names and config.json fields:
Qwen3-MoE (arch 'qwen3moe'), Qwen2-MoE ('qwen2moe', with its shared expert) and Mixtral ('llama' with experts).

llama.cpp stacks a layer's routed experts into one tensor per projection (shapes in numpy order, ggml's reversed):
    blk.N.ffn_gate_inp.weight        [E, K]     router                  mlp.gate.weight
    blk.N.ffn_gate_exps.weight       [E, N, K]  every expert's gate     mlp.experts.{e}.gate_proj.weight
    blk.N.ffn_up_exps.weight         [E, N, K]  every expert's up       mlp.experts.{e}.up_proj.weight
    blk.N.ffn_down_exps.weight       [E, K, N]  every expert's down     mlp.experts.{e}.down_proj.weight
    blk.N.ffn_{gate,up,down}_shexp   the shared expert (qwen2moe)       mlp.shared_expert.{gate,up,down}_proj.weight
    blk.N.ffn_gate_inp_shexp.weight  [K]        its sigmoid gate        mlp.shared_expert_gate.weight ([1, K] in HF)
Mixtral's HF names are block_sparse_moe.gate and block_sparse_moe.experts.{e}.w1 / w3 / w2 (gate / up / down).
Expert e of a stacked tensor is its e-th [N, K] (or [K, N]) slab: quantized blocks run along K inside one row, so the
slab of a block-quantized tensor is whole blocks too and is split before dequantizing.

Metadata read ({arch}.*): expert_count (E, checked against the tensors), expert_used_count (top-k),
expert_weights_norm (renormalise the top-k weights; absent in most files: llama.cpp's per-arch default, yes for
qwen3moe and llama, no for qwen2moe). The widths come from the tensors themselves (N from ffn_gate_exps, the shared
expert's from ffn_gate_shexp, a dense layer's from ffn_gate), so expert_feed_forward_length and
feed_forward_length need not agree with them. A Qwen layer without a router is dense (config mlp_only_layers).
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional

# arch -> (HF architecture, model_type, renormalise the top-k by default: llama.cpp's build_moe_ffn norm_w)
MOE_ARCHS = {
    "qwen3moe": ("Qwen3MoeForCausalLM", "qwen3_moe", True),
    "qwen2moe": ("Qwen2MoeForCausalLM", "qwen2_moe", False),
    "llama": ("MixtralForCausalLM", "mixtral", True),  # a llama file with expert tensors
}
# stacked expert tensor -> (Qwen projection, Mixtral projection)
EXPERT_TENSORS = {"ffn_gate_exps": ("gate_proj", "w1"), "ffn_up_exps": ("up_proj", "w3"),
                  "ffn_down_exps": ("down_proj", "w2")}
# other MoE-layer tensors -> (Qwen name, Mixtral name) after "model.layers.{i}."
MOE_LAYER_TENSORS = {
    "ffn_gate_inp": ("mlp.gate", "block_sparse_moe.gate"),
    "ffn_gate_shexp": ("mlp.shared_expert.gate_proj", None),
    "ffn_up_shexp": ("mlp.shared_expert.up_proj", None),
    "ffn_down_shexp": ("mlp.shared_expert.down_proj", None),
    "ffn_gate_inp_shexp": ("mlp.shared_expert_gate", None),
}
SHARED_GATE_HF_SUFFIX = "mlp.shared_expert_gate.weight"  # 1-D in the file, [1, K] in HF
# HF names of the weights served quantized in MoE layers (routed experts; the shared expert's end in *_proj.weight)
_EXPERT_HF_NAME = re.compile(r"\.experts\.\d+\.(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")


def is_expert_weight_name(hf_name: str) -> bool:
    """Whether an HF tensor name is one routed expert's projection (Qwen or Mixtral naming)."""
    return _EXPERT_HF_NAME.search(hf_name) is not None


def is_moe_file(arch: str, tensor_names: List[str]) -> bool:
    """A MoE checkpoint: an architecture this module maps whose file has stacked expert tensors."""
    return arch in MOE_ARCHS and any(n.endswith(".ffn_gate_exps.weight") for n in tensor_names)


class MoENames:
    """GGUF -> HF names for the MoE tensors of one file (mixtral: Mixtral's naming, else Qwen's)."""

    def __init__(self, arch: str, num_experts: int):
        self.mixtral = arch == "llama"
        self.num_experts = num_experts

    def hf_names(self, layer: str, rest: str, suffix: str) -> Optional[List[str]]:
        """HF names of blk.{layer}.{rest}.{suffix}: E names for a stacked expert tensor (expert order), one for the
        other MoE tensors, None when rest is no MoE tensor."""
        prefix = f"model.layers.{layer}"
        if rest in EXPERT_TENSORS:
            proj = EXPERT_TENSORS[rest][1 if self.mixtral else 0]
            block = "block_sparse_moe" if self.mixtral else "mlp"
            return [f"{prefix}.{block}.experts.{e}.{proj}.{suffix}" for e in range(self.num_experts)]
        if rest in MOE_LAYER_TENSORS:
            name = MOE_LAYER_TENSORS[rest][1 if self.mixtral else 0]
            if name is None:
                raise ValueError(f"GGUF tensor blk.{layer}.{rest} has no equivalent in a Mixtral checkpoint")
            return [f"{prefix}.{name}.{suffix}"]
        return None


def _layer_shapes(gguf_file, rest: str) -> Dict[int, List[int]]:
    """layer -> numpy shape of every blk.{layer}.{rest}.weight tensor."""
    out = {}
    for t in gguf_file.tensors:
        parts = t.name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] == rest and parts[3] == "weight":
            out[int(parts[1])] = [int(d) for d in reversed(t.shape)]
    return out


def moe_config_fields(meta, num_layers: int) -> dict:
    """The config.json fields of a MoE file (meta: gguf_converter.GGUFMetadata) that replace or add to the dense
    config: architecture, model_type, expert counts and widths, dense layers."""
    architecture, model_type, default_norm = MOE_ARCHS[meta.arch]
    gate_exps = _layer_shapes(meta.file, "ffn_gate_exps")
    shapes = {tuple(s) for s in gate_exps.values()}
    if len(shapes) != 1:
        raise ValueError(f"GGUF MoE file: the layers' ffn_gate_exps tensors differ in shape ({sorted(shapes)})")
    num_experts, expert_n, _ = shapes.pop()
    declared = meta.arch_get("expert_count")
    if declared is not None and int(declared) != num_experts:
        raise ValueError(f"GGUF MoE file: {meta.arch}.expert_count = {declared} but the expert tensors hold "
                         f"{num_experts} experts")
    top_k = meta.arch_get("expert_used_count")
    if not top_k:
        raise ValueError(f"GGUF MoE file without {meta.arch}.expert_used_count (the experts each token takes)")
    dense_layers = sorted(set(range(num_layers)) - set(gate_exps))
    dense_ffn = {s[0] for s in _layer_shapes(meta.file, "ffn_gate").values()}
    fields = {"architectures": [architecture], "model_type": model_type, "num_experts_per_tok": int(top_k)}
    if meta.arch == "llama":
        if dense_layers:
            raise ValueError(f"a Mixtral GGUF must have experts in every layer; layers {dense_layers} have none")
        # Mixtral's experts are its only MLPs: intermediate_size is their width
        fields.update(num_local_experts=num_experts, intermediate_size=expert_n, sliding_window=None)
        return fields
    fields.update(num_experts=num_experts, moe_intermediate_size=expert_n, decoder_sparse_step=1,
                  mlp_only_layers=dense_layers,
                  norm_topk_prob=bool(meta.arch_get("expert_weights_norm", default_norm)))
    # the dense layers' width (config's intermediate_size): their tensors, else the metadata
    fields["intermediate_size"] = (dense_ffn.pop() if len(dense_ffn) == 1
                                   else int(meta.arch_get("feed_forward_length", expert_n)))
    shexp = {s[0] for s in _layer_shapes(meta.file, "ffn_gate_shexp").values()}
    if meta.arch == "qwen2moe":
        fields["shared_expert_intermediate_size"] = shexp.pop() if shexp else 0
    elif shexp:
        raise ValueError(f"GGUF arch {meta.arch!r} with shared-expert tensors (ffn_*_shexp) is not supported")
    return fields
