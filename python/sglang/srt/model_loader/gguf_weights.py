"""The weights of a model built with --quantization gguf: the linear layers' and routed experts' tensors as blocks.

    iter_gguf_quantized_weights(gguf_path, model_dir, kinds, packed_names) -> (hf_name, tensor) for load_weights

A quantized tensor comes in a staging form of layers/quantization/packing.py under its HF name, rope rows unpermuted
as the dense converter does: the blocks of the types with a kernel as stored (Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0
narrow, Q4_K / Q5_K / Q6_K wide: packing.staging_from_gguf), other types requantized to 8-bit blocks
(packing.staging_q8_blocks). A MoE file's stacked expert tensor comes as one narrow staging tensor per expert (the
MoE kernel reads the fp16 header only, so K-quant experts are requantized), under the per-expert names the dense
converter writes (gguf_moe.py), so FusedMoE's loaders see the same names and shards as for an HF checkpoint. The packed vocabulary table (packed_names: packed_vocab_weight_names of the table the loader built
packed, its type one with a packed form) comes in the staging form as well. Every other tensor (the embedding and
lm_head otherwise, norms, routers) is read dense from the converted directory.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, Iterable, Iterator, Tuple

import numpy as np
import torch

from sglang.srt.model_loader.gguf_converter import (
    GGUFMetadata,
    is_quantized_weight_name,
    rope_rows_permuted,
    unpermute_rope_rows,
)
from sglang.srt.mem_plan.quantization_sizes import PACKED_VOCAB_EMBEDDING, PACKED_VOCAB_LM_HEAD


# the HF name of each vocabulary table quantization_sizes.gguf_packed_vocab may name (gguf_converter's names)
_PACKED_VOCAB_NAMES = {PACKED_VOCAB_LM_HEAD: "lm_head.weight", PACKED_VOCAB_EMBEDDING: "model.embed_tokens.weight"}


def packed_vocab_weight_names(packed_vocab: str) -> FrozenSet[str]:
    """The checkpoint names served as blocks for a packed vocabulary table ("" -> none)."""
    return frozenset([_PACKED_VOCAB_NAMES[packed_vocab]]) if packed_vocab else frozenset()


def _staging(data: np.ndarray, tensor_type, rows: int, cols: int, wide_ok: bool = True) -> Tuple[torch.Tensor, str]:
    """One [rows, cols] weight's GGUF data -> (staging uint8 [rows, blocks * 36 or 48], what it was, for the load
    log). wide_ok False: narrow staging only (MoE experts)."""
    from sglang.srt.layers.quantization import packing
    from sglang.srt.mem_plan.quantization_sizes import GGUF_PACKED_BITS

    ggml_type = int(tensor_type)
    name = packing.GGUF_TYPE_NAMES.get(ggml_type, "")
    if name and (wide_ok or name in GGUF_PACKED_BITS):
        raw = torch.from_numpy(np.array(data, dtype=np.uint8, copy=True).reshape(rows, -1))
        return packing.staging_from_gguf(raw, ggml_type), name
    from gguf.quants import dequantize

    dense = dequantize(data, tensor_type).astype(np.float32, copy=False).reshape(rows, cols)
    return packing.staging_q8_blocks(torch.from_numpy(np.ascontiguousarray(dense))), f"{tensor_type.name}->int8"


def iter_gguf_quantized_weights(gguf_path: str, model_dir: str, kinds: Dict[str, int],
                                packed_names: Iterable[str] = ()) -> Iterator[Tuple[str, torch.Tensor]]:
    """(hf_name, tensor) for every checkpoint tensor (module docstring). kinds counts the quantized GGUF tensors per
    type name (a stacked expert tensor once), for the load log."""
    packed_names = frozenset(packed_names)
    from sglang.srt.model_loader.gguf_file import open_gguf
    from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator

    meta = GGUFMetadata(open_gguf(gguf_path))
    permuted = rope_rows_permuted(meta.arch)
    heads = {"q_proj": meta.arch_get("attention.head_count")}
    heads["k_proj"] = meta.arch_get("attention.head_count_kv", heads["q_proj"])
    served = set()
    for t in meta.file.tensors:
        names = meta.hf_names(t.name)
        shape = [int(d) for d in reversed(t.shape)]
        quantized = is_quantized_weight_name(names[0]) or names[0] in packed_names
        if not quantized or len(shape) != (3 if len(names) > 1 else 2):
            continue
        if len(names) > 1:  # stacked experts [E, rows, cols]: one expert's slab at a time
            for name, slab in zip(names, t.data):
                staging, kind = _staging(slab, t.tensor_type, shape[1], shape[2], wide_ok=False)
                yield name, staging
        else:
            staging, kind = _staging(t.data, t.tensor_type, shape[0], shape[1])
            proj = names[0].split(".")[-2]
            if permuted and proj in heads:  # staging rows are the weight's rows: unpermute them alike
                staging = torch.from_numpy(unpermute_rope_rows(staging.numpy(), heads[proj])).contiguous()
            yield names[0], staging
        kinds[kind] = kinds.get(kind, 0) + 1
        served.update(names)
    del meta
    for name, tensor in safetensors_weights_iterator(model_dir):
        if name not in served:
            yield name, tensor
