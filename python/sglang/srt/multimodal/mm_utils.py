"""general_mm_embed_routine: prompt embeddings of an EXTEND batch with image / video rows spliced in.

Request b of the batch prefills tokens [extend_prefix_lens[b], extend_prefix_lens[b] + extend_seq_lens[b]) of its
sequence, at rows [row_b, row_b + extend_seq_lens[b]) of the batch (rows are concatenated in request order). An
image at [offset, offset + num_tokens) of the sequence may overlap that chunk in part -- it spans a chunk boundary,
or a cached prefix covers its first tokens -- so only its overlapping embedding rows are copied:
    sequence tokens [lo, hi)  ->  batch rows [row_b + lo - start_b, row_b + hi - start_b),  embedding rows
    [lo - offset, hi - offset).
Embeddings come from the cache first (held for the whole batch), then the misses are encoded in one call of the
model's encode_items (which groups them by modality as its encoders need).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardBatch


def general_mm_embed_routine(
    input_ids: torch.Tensor,
    forward_batch: ForwardBatch,
    embed_tokens: Callable[[torch.Tensor], torch.Tensor],
    encode_items: Callable[[List[Any]], List[torch.Tensor]],
    embedding_cache=None,
) -> torch.Tensor:
    """input_ids [N] -> embeddings [N, hidden]. encode_items: MultimodalDataItems -> one [T_i, hidden] each."""
    embeds = embed_tokens(input_ids)
    needs = []  # (first batch row, item, first embedding row, end embedding row)
    row = 0
    for b, mm in enumerate(forward_batch.mm_inputs or []):
        start = forward_batch.extend_prefix_lens_cpu[b]
        n = forward_batch.extend_seq_lens_cpu[b]
        if mm is not None:
            for item, lo, hi in mm.items_in_range(start, start + n):
                needs.append((row + item.offset + lo - start, item, lo, hi))
        row += n
    if not needs:
        return embeds

    feats: Dict[str, torch.Tensor] = {}
    missing = {}
    for _, item, _, _ in needs:
        if item.hash in feats or item.hash in missing:
            continue
        hit: Optional[torch.Tensor] = embedding_cache.get(item.hash) if embedding_cache is not None else None
        if hit is not None:
            feats[item.hash] = hit
        else:
            missing[item.hash] = item
    if missing:
        outs = encode_items(list(missing.values()))
        for (h, item), e in zip(missing.items(), outs):
            if e.shape[0] != item.num_tokens:
                raise ValueError(f"The encoder produced {e.shape[0]} embeddings for an {item.modality} of "
                                 f"{item.num_tokens} tokens; the processor and the model disagree.")
            feats[h] = e
            if embedding_cache is not None:
                embedding_cache.put(h, e.clone())  # own storage: e may be a view of the whole encoder batch

    for dst, item, lo, hi in needs:
        embeds[dst : dst + hi - lo] = feats[item.hash][lo:hi].to(embeds.dtype)
    return embeds
