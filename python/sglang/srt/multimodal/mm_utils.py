"""general_mm_embed_routine: prompt embeddings of an EXTEND batch with image / video rows spliced in.

Request b of the batch prefills tokens [extend_prefix_lens[b], extend_prefix_lens[b] + extend_seq_lens[b]) of its
sequence, at rows [row_b, row_b + extend_seq_lens[b]) of the batch (rows are concatenated in request order). An
image at [offset, offset + num_tokens) of the sequence may overlap that chunk in part -- it spans a chunk boundary,
or a cached prefix covers its first tokens -- so only its overlapping embedding rows are copied:
    sequence tokens [lo, hi)  ->  batch rows [row_b + lo - start_b, row_b + hi - start_b),  embedding rows
    [lo - offset, hi - offset).
A long item is encoded in its planned chunks (item.encoder_chunks, one encoder call each, keyed by unit_key): only
the chunks that overlap the batch are looked up in the embedding cache, and only the misses are encoded, in one call
of the model's encode_items (which groups them by modality as its encoders need) -- so a chunked prefill through a
long video encodes each chunk once, when its rows are first needed, as the scheduler's admission charged it.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.multimodal.mm_inputs import unit_key


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

    # one entry per encoder chunk the batch needs: (first batch row, chunk item, first row, end row in the chunk)
    pieces = []
    for dst, item, lo, hi in needs:
        for index, (clo, chi) in enumerate(item.chunk_rows()):
            a, b = max(lo, clo), min(hi, chi)
            if a < b:
                pieces.append((dst + a - lo, item, index, a - clo, b - clo))

    feats: Dict[str, torch.Tensor] = {}
    missing = {}  # unit key -> the chunk as an item of its own
    for _, item, index, _, _ in pieces:
        key = unit_key(item.hash, index, item.num_chunks)
        if key in feats or key in missing:
            continue
        hit: Optional[torch.Tensor] = embedding_cache.get(key) if embedding_cache is not None else None
        if hit is not None:
            feats[key] = hit
        else:
            missing[key] = item.chunk(index)
    if missing:
        outs = encode_items(list(missing.values()))
        for (key, chunk), e in zip(missing.items(), outs):
            if e.shape[0] != chunk.num_tokens:
                raise ValueError(f"The encoder produced {e.shape[0]} embeddings for an {chunk.modality} (chunk) of "
                                 f"{chunk.num_tokens} tokens; the processor and the model disagree.")
            feats[key] = e
            if embedding_cache is not None:
                embedding_cache.put(key, e.clone())  # own storage: e may be a view of the whole encoder batch

    for dst, item, index, lo, hi in pieces:
        embeds[dst : dst + hi - lo] = feats[unit_key(item.hash, index, item.num_chunks)][lo:hi].to(embeds.dtype)
    return embeds
