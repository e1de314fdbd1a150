"""EAGLE / EAGLE3 / NEXTN tree proposals (--speculative-eagle-topk > 1): a beam of width W over D head steps.

Each request brings W request-table rows (managers/spec_tree.py: row 0 its own, the others temporary rows whose
[0, p) are its prefix slots) and slots at positions p .. p + D in each; beam b lives in row b. The catch-up
(speculative/eagle_proposer.py) ran the head up to its row at p - 1, which reads x0 and whose head KV sits in the
shared prefix: that row's best log-probs and hidden_out (kept per request) start every beam:
  * first tokens: the W best by the head's log-prob (EAGLE-3 ranks in its draft vocabulary; to_target_ids maps);
  * step s = 1 .. D - 1: one head DECODE of every beam's last token at position p + s - 1 of its own row (its head KV
    into that row's slot) with the beam's own hidden state; each (beam, next token) is scored by the cumulative
    log-prob and the W best are kept; a kept beam whose parent lived in another row gets the parent's head KV of
    positions p .. p + s - 1 copied into its row's slots (draft_beam.copy_draft_kv: every source read before any
    target is written) and the parent's hidden_out of this step as its hidden state.
Beams are distinct token paths, best cumulative log-prob first (row 0, the request's own row, holds the best). The head
KV written at p .. p + D - 2 is approximate (the head's hidden, not the target's feature), as in a chain: the catch-up
after the verify rewrites the committed positions from the target's features of the committed path.
"""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.speculative.draft_beam import copy_draft_kv

First = Tuple[torch.Tensor, torch.Tensor]  # (log-probs, head-vocabulary ids) of the catch-up's best tokens, best first


def _int64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def first_tokens(logits_row: torch.Tensor, k: int) -> First:
    """The k best (log-prob, head id) of a catch-up row's logits."""
    top = torch.log_softmax(logits_row.float(), -1).topk(min(k, logits_row.shape[-1]))
    return top.values, top.indices


def _decode(runner: Any, rows: List[int], tokens: List[int], positions: List[int], hidden: torch.Tensor):
    r2t = runner.req_to_token_pool.req_to_token_host
    index = _int64(rows)
    seq_lens = [q + 1 for q in positions]
    fb = ForwardBatch(
        ForwardMode.DECODE, len(rows), input_ids=_int64(tokens), positions=_int64(positions), req_pool_indices=index,
        seq_lens=_int64(seq_lens), out_cache_loc=r2t[index, _int64(positions)], seq_lens_cpu=seq_lens,
        req_pool_indices_cpu=list(rows),
    )
    return runner.forward_head(fb, hidden)


def _slots(runner: Any, row: int, a: int, b: int) -> List[int]:
    return runner.req_to_token_pool.read(row, a, b)


@torch.inference_mode()
def head_beam(runner: Any, p: Sequence[int], rows: Sequence[List[int]], depth: Sequence[int],
              first: Sequence[First], hidden: Sequence[torch.Tensor]) -> Tuple[List[List[List[int]]], List[Any]]:
    """Per request j (x0 at p[j], beams in rows[j], depth[j] tokens each; first[j] and hidden[j]: the catch-up's last
    row) its beams' target-id token paths and their cumulative log-probs, best first."""
    to_target = runner.model.to_target_ids
    n = len(p)
    scores, paths, hid = [], [], []
    for j in range(n):
        w = min(len(rows[j]), first[j][0].shape[0])
        scores.append(first[j][0][:w])
        paths.append([[t] for t in to_target(first[j][1][:w]).tolist()])
        hid.append(hidden[j].unsqueeze(0).expand(w, -1))
    for step in range(1, max(depth, default=0)):
        js = [j for j in range(n) if depth[j] > step]
        batch = [(j, b) for j in js for b in range(len(paths[j]))]
        logits, h = _decode(runner, [rows[j][b] for j, b in batch], [paths[j][b][-1] for j, b in batch],
                            [p[j] + step - 1 for j, _ in batch], torch.cat([hid[j] for j in js]))
        lp = torch.log_softmax(logits.float(), -1)
        vocab, at = lp.shape[-1], 0
        for j in js:
            w = len(paths[j])
            top = (scores[j].to(lp.device)[:, None] + lp[at: at + w]).flatten().topk(w)
            parents = (top.indices // vocab).tolist()
            tokens = to_target(top.indices % vocab).tolist()
            src, dst = [], []
            for b, parent in enumerate(parents):
                if parent != b:  # positions p .. p + step - 1: the parent's inputs d1 .. d_step
                    src += _slots(runner, rows[j][parent], p[j], p[j] + step)
                    dst += _slots(runner, rows[j][b], p[j], p[j] + step)
            copy_draft_kv(runner, src, dst)
            hid[j] = h[at + _int64(parents).to(h.device)]
            paths[j] = [paths[j][parent] + [t] for parent, t in zip(parents, tokens)]
            scores[j] = top.values
            at += w
    return paths, scores
