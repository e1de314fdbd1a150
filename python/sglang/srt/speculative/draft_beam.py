"""STANDALONE tree proposals (--speculative-eagle-topk > 1): a beam of width W over D draft steps.

Each request brings W request-table rows (managers/spec_tree.py: row 0 its own, the others temporary rows with its
prefix slots) and W * (D + 1) slots at positions p .. p + D; beam b lives in row b. The draft:
  * catch-up: one EXTEND on row 0 of the positions whose draft KV is missing, up to x0 at p (DraftProposer's rule);
    x0's draft KV is then copied from row 0's slot at p into every other row's slot at p;
  * beams: the W best first tokens by log-prob; each further step decodes every beam's last token at its own row
    (its draft KV into that row's slot), scores each (beam, next token) by the cumulative log-prob and keeps the W
    best; a kept beam whose parent lived in another row gets the parent's draft KV of positions p+1 .. p+s copied
    into its row's slots (gathered first, so a row that is both source and target reads the old values).
So when the beam ends, row b's slots at p .. p + D - 1 hold the draft KV of x0 and beam b's first D - 1 tokens, the
same slots the verify forward then fills with the target's KV: the accepted branch's slots, moved into the request's
row, leave the draft's KV valid up to kv_len (the chain's rule, DraftProposer.seen). Beams are distinct token paths,
ordered best first (row 0, the request's own row, holds the best).
"""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode


def _int64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def extend_logits(runner: Any, pieces: Sequence[Tuple[int, List[int], int]]) -> torch.Tensor:
    """The draft's float32 logits after each piece (request-table row, token ids, first position) of one EXTEND."""
    rows = [row for row, _, _ in pieces]
    prefix = [start for _, _, start in pieces]
    lens = [len(ids) for _, ids, _ in pieces]
    seq_lens = [a + n for a, n in zip(prefix, lens)]
    pool = runner.req_to_token_pool
    fb = ForwardBatch(
        ForwardMode.EXTEND, len(pieces), input_ids=_int64([t for _, ids, _ in pieces for t in ids]),
        positions=_int64([q for a, n in zip(prefix, lens) for q in range(a, a + n)]),
        req_pool_indices=_int64(rows), seq_lens=_int64(seq_lens),
        out_cache_loc=torch.cat([pool.slots(row, a, b) for row, a, b in zip(rows, prefix, seq_lens)]),
        seq_lens_cpu=seq_lens, req_pool_indices_cpu=rows, extend_prefix_lens_cpu=prefix, extend_seq_lens_cpu=lens,
        extend_prefix_lens=_int64(prefix), extend_seq_lens=_int64(lens), logits_indices=_int64(lens).cumsum(0) - 1,
    )
    return runner.forward(fb).float()


def decode_logits(runner: Any, rows: List[int], tokens: List[int], positions: List[int]) -> torch.Tensor:
    """The draft's float32 logits of one DECODE forward: token i at positions[i] of row rows[i]."""
    r2t = runner.req_to_token_pool.req_to_token_host
    index = _int64(rows)
    seq_lens = [q + 1 for q in positions]
    fb = ForwardBatch(
        ForwardMode.DECODE, len(rows), input_ids=_int64(tokens), positions=_int64(positions),
        req_pool_indices=index, seq_lens=_int64(seq_lens), out_cache_loc=r2t[index, _int64(positions)],
        seq_lens_cpu=seq_lens, req_pool_indices_cpu=list(rows),
    )
    return runner.forward(fb).float()


def copy_draft_kv(runner: Any, src: List[int], dst: List[int]) -> None:
    """Draft KV of slots src -> slots dst, every layer (all sources read before any target is written): K and V of a
    standard pool, or the latent rows of an MLA pool (NEXTN's head: mem_cache/mla_pool.py kv_buffer)."""
    if not src:
        return
    kv = runner.token_to_kv_pool
    buffers = [kv.kv_buffer] if getattr(kv, "is_mla", False) else [kv.k_buffer, kv.v_buffer]
    s, t = _int64(src).to(buffers[0].device), _int64(dst).to(buffers[0].device)
    rows = [b[:, s] for b in buffers]
    for b, r in zip(buffers, rows):
        b[:, t] = r


def _slots(runner: Any, row: int, a: int, b: int) -> List[int]:
    return runner.req_to_token_pool.read(row, a, b)


@torch.inference_mode()
def beam_paths(runner: Any, p: List[int], rows: List[List[int]], depth: List[int],
               first_logits: torch.Tensor) -> List[List[List[int]]]:
    """Per request j (x0 at p[j], beams in rows[j], depth[j] tokens each; first_logits[j]: the draft's logits after
    x0) its beams' token paths, best cumulative log-prob first."""
    n = len(p)
    scores, paths = [], []
    for j in range(n):
        w = min(len(rows[j]), first_logits.shape[-1])
        lp = torch.log_softmax(first_logits[j], -1)
        top = lp.topk(w)
        scores.append(top.values)
        paths.append([[int(t)] for t in top.indices])
        src = _slots(runner, rows[j][0], p[j], p[j] + 1)
        copy_draft_kv(runner, src * (w - 1), [_slots(runner, r, p[j], p[j] + 1)[0] for r in rows[j][1:w]])
    for step in range(1, max(depth, default=0)):
        js = [j for j in range(n) if depth[j] > step]
        batch = [(j, b) for j in js for b in range(len(paths[j]))]
        logits = decode_logits(runner, [rows[j][b] for j, b in batch], [paths[j][b][-1] for j, b in batch],
                               [p[j] + step for j, _ in batch])
        lp = torch.log_softmax(logits, -1)
        at = 0
        for j in js:
            w = len(paths[j])
            cand = (scores[j][:, None] + lp[at: at + w]).flatten()
            at += w
            top = cand.topk(w)
            vocab = lp.shape[-1]
            parents = [int(i) // vocab for i in top.indices]
            tokens = [int(i) % vocab for i in top.indices]
            src, dst = [], []
            for b, parent in enumerate(parents):
                if parent != b:  # positions p+1 .. p+step: the parent's inputs d1 .. d_step
                    src += _slots(runner, rows[j][parent], p[j] + 1, p[j] + step + 1)
                    dst += _slots(runner, rows[j][b], p[j] + 1, p[j] + step + 1)
            copy_draft_kv(runner, src, dst)
            paths[j] = [paths[j][parent] + [t] for parent, t in zip(parents, tokens)]
            scores[j] = top.values
    return paths
