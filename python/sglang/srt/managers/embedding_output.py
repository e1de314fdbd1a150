"""An embedding server's commit (--is-embedding): pooled rows become a request's embedding, and the request leaves.

The forward of a prefill batch returns one float32 row per request (layers/pooler.py). "last": the row of a request's
final chunk is its vector. "mean": each chunk's row is the sum of that chunk's hidden states; the sums of a chunked
prompt add up here, and the final chunk divides by the prompt length. The vector is L2-normalized and the request
finishes at once: no token is sampled, nothing decodes, and its KV slots go back to the pool (the embedding server
keeps no prefix cache).
"""

from __future__ import annotations

from typing import List, Tuple

import torch

from sglang.srt.managers.schedule_batch import Req

EMBEDDING_NORM_EPS = 1e-12  # the L2 norm's floor (a zero vector stays zero)


def finish_embedding(req: Req, pooled: torch.Tensor, pooling: str) -> None:
    """Set req.embedding from its last pooled row (module docstring); the caller finishes the request."""
    if pooling == "mean":
        pooled = req.pooled_sum / len(req.origin_input_ids)
    vec = pooled / pooled.norm().clamp_min(EMBEDDING_NORM_EPS)
    req.embedding = vec.cpu().tolist()
    req.pooled_sum = None
    req.finished_reason = {"type": "stop", "matched": None}


def commit_pooled(units: List[Tuple[Req, int]], pooled: torch.Tensor, pooling: str, sink) -> None:
    """After a successful pooled forward (kv_len already advanced): accumulate, and finish each completed prompt."""
    for i, (req, _) in enumerate(units):
        if req.req_pool_idx is None or req.finished():
            continue
        if pooling == "mean":
            req.pooled_sum = pooled[i] if req.pooled_sum is None else req.pooled_sum + pooled[i]
        if req.kv_len == req.fill_len:
            finish_embedding(req, pooled[i], pooling)
            sink.finish(req)
