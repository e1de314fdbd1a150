"""STANDALONE proposals: a smaller draft model (model_executor/draft_runner.py) decodes greedily ahead of the target.

Contract with the scheduler's step (managers/spec_decode.py) -- read before changing either side:
  * on_extend(units) is called after a target EXTEND forward whose units were committed (req.kv_len already
    includes the unit's n tokens). The draft then runs the same tokens [kv_len - n, kv_len) into the same slots, so
    its KV is valid wherever the target's is. A request already released by then (finished at its first token) is
    skipped here: on_finish computed its draft KV.
  * on_finish(req) is called by OutputSink.finish before a finished request's tokens [0, kv_len) enter the prefix
    cache: the draft runs the positions it never saw as inputs, so a later prefix hit (the next turn of a chat, a
    repeated prompt) reads the draft's KV at every cached position, never a stale slot's (measured: a second turn
    over the first turn's output fell from 100% to ~50% acceptance with the target as its own draft without it).
  * propose(reqs, max_k) is called AFTER the step recorded slots for positions p .. p + max_k[i] of each request in
    req_to_token (p = kv_len: the decode slot plus one per proposal; ReqMemory.alloc_if_free). The draft writes its
    KV of x0, d1 .. d_{k-1} into the slots of positions p .. p + k - 1, the same slots the verify forward then
    writes the target's KV into; truncate() gives back the rejected ones for both models at once (writes_kv: the
    step allocates the slots before it calls propose).
  * on_verified / release only forget bookkeeping; nothing here allocates or frees memory.

Per request the draft's KV is valid for positions [0, seen): after proposing, seen = p + k (x0 and d1 .. d_{k-1} were
inputs); after the verify step committed c tokens, kv_len = p + c and positions < min(seen, kv_len) hold tokens the
draft saw as inputs (x0 and the accepted proposals). So a propose() first runs one catch-up EXTEND of the tokens in
[min(seen, kv_len), kv_len + 1) -- 1 token, 2 when every proposal was accepted (d_k was never an input), more after
steps decoded without proposals -- whose last logits give d1, then max_k - 1 DECODE forwards give d2 .. dk.
Proposals are the draft's argmax (a point-mass draft: speculative/verify.py accepts them exactly).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Sequence, Tuple

import torch

from sglang.srt.speculative.draft_beam import beam_paths, extend_logits

logger = logging.getLogger(__name__)

Piece = Tuple[int, int, int]  # (index into the batch's requests, first position, end position)


def _alive(req: Any) -> bool:
    return req.req_pool_idx is not None and not req.finished()


class DraftProposer:
    """A speculative/proposer.Proposer (by its methods: the protocol module may import this one)."""

    writes_kv = True  # propose() writes the draft's KV into the proposals' slots: they must be allocated first

    def __init__(self, runner: Any, num_steps: int, max_extend_tokens: int):
        """runner: a DraftRunner; num_steps: most proposals per request; max_extend_tokens: most tokens of one draft
        EXTEND forward (the chunked-prefill size: the draft, smaller than the target, stays within its profile)."""
        self.runner, self.num_steps = runner, num_steps
        self.max_extend_tokens = max_extend_tokens if max_extend_tokens > 0 else 1 << 62  # <= 0: no chunking
        self.seen: Dict[str, int] = {}  # rid -> end of the positions whose draft KV was computed
        self.indexes = self.seen  # the scheduler step prunes the rids that left through this name (as for NGRAM)
        self.num_forwards = 0

    # ------------------------------------------------------------------ protocol
    def on_extend(self, units: Sequence[Tuple[Any, int]]) -> None:
        live = [(r, n) for r, n in units if n > 0 and _alive(r)]
        pieces = [(i, r.kv_len - n, r.kv_len) for i, (r, n) in enumerate(live)]
        try:
            self._extend([r for r, _ in live], pieces)
        except Exception as e:  # noqa: BLE001 - see _forget
            self._forget([r for r, _ in live], "extend", e)

    def propose(self, reqs: Sequence[Any], max_k: Sequence[int]) -> List[List[int]]:
        out: List[List[int]] = [[] for _ in reqs]
        idx = [i for i, r in enumerate(reqs) if max_k[i] > 0 and _alive(r)]
        if not idx:
            return out
        try:
            return self._propose(reqs, max_k, idx, out)
        except Exception as e:  # noqa: BLE001 - see _forget
            self._forget([reqs[i] for i in idx], "propose", e)
            return [[] for _ in reqs]

    @staticmethod
    def _forget(reqs: List[Any], what: str, e: Exception) -> None:
        """A failed draft forward costs proposals, never a request: the target decodes them without proposals this
        step. `seen` advances only after a draft forward returned, so the next propose() recomputes exactly the
        positions whose draft KV the failure may have left half written."""
        logger.warning("Draft model %s failed for %d request(s) (%s: %s); they decode without proposals this step",
                       what, len(reqs), type(e).__name__, e)

    def _propose(self, reqs, max_k, idx: List[int], out: List[List[int]]) -> List[List[int]]:
        live = [reqs[i] for i in idx]
        ks = [min(max_k[i], self.num_steps) for i in idx]
        pieces = [(j, min(self.seen.get(r.rid, 0), r.kv_len), r.kv_len + 1) for j, r in enumerate(live)]
        last = self._extend(live, pieces)
        tokens = [[int(last[j])] for j in range(len(live))]
        for step in range(1, max(ks)):
            js = [j for j, k in enumerate(ks) if k > step]
            # input d_step of request j sits at position p + step (p = kv_len) and writes its draft KV into that slot
            nxt = self._decode([live[j] for j in js], [tokens[j][-1] for j in js], [live[j].kv_len + step for j in js])
            for j, t in zip(js, nxt):
                tokens[j].append(int(t))
        for j, r in enumerate(live):
            self.seen[r.rid] = r.kv_len + ks[j]
            out[idx[j]] = tokens[j]
        return out

    def propose_tree(self, reqs: Sequence[Any], rows: Sequence[List[int]],
                     depth: Sequence[int]) -> List[List[List[int]]]:
        """Tree proposals (top-k > 1): per request up to len(rows[i]) branches of depth[i] tokens, beam b's draft KV
        in row rows[i][b] (row 0: the request's own) -- speculative/draft_beam.py. The slots were allocated first."""
        out: List[List[List[int]]] = [[] for _ in reqs]
        idx = [i for i, r in enumerate(reqs) if depth[i] > 0 and rows[i] and _alive(r)]
        if not idx:
            return out
        live = [reqs[i] for i in idx]
        try:
            pieces = [(j, min(self.seen.get(r.rid, 0), r.kv_len), r.kv_len + 1) for j, r in enumerate(live)]
            last = self._extend(live, pieces, logits=True)
            paths = beam_paths(self.runner, [r.kv_len for r in live], [rows[i] for i in idx],
                               [depth[i] for i in idx], torch.stack([last[j] for j in range(len(live))]))
        except Exception as e:  # noqa: BLE001 - see _forget
            self._forget(live, "propose", e)
            return out
        for j, r in enumerate(live):
            self.seen[r.rid] = r.kv_len + depth[idx[j]]
            out[idx[j]] = paths[j]
        return out

    def on_verified(self, reqs: Sequence[Any], committed: Sequence[int]) -> None:
        for r in reqs:  # the positions past kv_len held rejected proposals: their slots were given back
            if r.rid in self.seen:
                self.seen[r.rid] = min(self.seen[r.rid], r.kv_len)

    def release(self, req: Any) -> None:
        self.seen.pop(req.rid, None)

    def on_finish(self, req: Any) -> None:
        """A finished request whose KV enters the prefix cache next: one draft EXTEND (batch 1) of [seen, kv_len) --
        the positions past the draft's last input (the last accepted proposal, never an input itself; the tokens of
        steps decoded without proposals), or, for a request the draft never saw (it finished at its first token, or
        the scheduler decoded it without its SpecDecoder), everything after its prefix hit. Then its bookkeeping
        goes."""
        start = min(self.seen.get(req.rid, req.prefix_len), req.kv_len)
        try:
            if start < req.kv_len:
                self._extend([req], [(0, start, req.kv_len)])
        except Exception as e:  # noqa: BLE001 - see _forget
            self._forget([req], "catch-up before caching", e)
        self.seen.pop(req.rid, None)

    # ------------------------------------------------------------------ draft forwards
    def _extend(self, reqs: List[Any], pieces: List[Piece], logits: bool = False) -> Dict[int, Any]:
        """Run the draft over each piece's tokens (split into forwards of at most max_extend_tokens); returns the
        draft's argmax (logits=True: its logits row) after each request's last piece, and records the positions it
        saw."""
        cap, batch, used, last = self.max_extend_tokens, [], 0, {}
        queue = [p for p in pieces if p[2] > p[1]]
        while queue:
            j, a, b = queue.pop(0)
            take = min(b - a, cap - used)
            batch.append((j, a, a + take))
            used += take
            if a + take < b:
                queue.insert(0, (j, a + take, b))
            if used == cap or not queue:
                for (jj, _, end), t in zip(batch, self._extend_forward(reqs, batch, logits)):
                    last[jj] = t
                    self.seen[reqs[jj].rid] = end
                batch, used = [], 0
        return last

    def _extend_forward(self, reqs: List[Any], batch: List[Piece], logits: bool = False) -> List[Any]:
        self.num_forwards += 1
        if logits:
            return list(extend_logits(self.runner, [(reqs[j].req_pool_idx, reqs[j].fill_ids[a:b], a)
                                                    for j, a, b in batch]))
        return self.runner.extend_argmax([(reqs[j].req_pool_idx, reqs[j].fill_ids[a:b], a) for j, a, b in batch])

    def _decode(self, reqs: List[Any], tokens: List[int], positions: List[int]) -> List[int]:
        self.num_forwards += 1
        return self.runner.decode_argmax([r.req_pool_idx for r in reqs], tokens, positions)
