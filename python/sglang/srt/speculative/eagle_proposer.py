"""EAGLE / EAGLE3 proposals (and NEXTN's, whose head plugs into the same runner): a draft head over the target's
hidden states (model_executor/draft_head.py), run in an eager catch-up after every target forward.

Convention (upstream's): the head's row at position q reads the token at q + 1 and a feature of position q, and
predicts the token at q + 2. Its KV at q lives in the slot the request table maps q to (DraftRunner's pool over the
target's slots), so whatever frees a slot frees it for both.

Catch-up (on_extend / on_decoded / on_verified, each right after a target forward and its commits): the forward's
captured features (ModelRunner.captured_batch: one row per input row) are consumed at once, nothing is stored past
the step. A request whose forward covered positions [a, a + n) and whose kv_len is now e <= a + n runs the head over
positions [a, e) with tokens fill_ids[a + 1 : e + 1] (all committed: e = kv_len <= fill_len - 1) and the target's
feature rows of those positions, in one head EXTEND over the request's draft prefix [0, a):
    extend chunk [a, b): e = b (the chunk's last token is followed by the next prompt token or the sampled one);
    decode of x0 at p:   e = p + 1;   verify of [x0, d1..dk] at p that committed c tokens: e = p + c.
The last row's argmax (in target ids: to_target_ids) is d1, the proposal for position e + 1, and its hidden_out the
head's own state h; both are kept per request with `end` = e (one row each), and with top-k > 1 that row's top-k
log-probs (speculative/eagle_beam.py starts the beams from them).
After a TREE verify (managers/spec_tree.py) the forward held every branch as its own sequence: the committed
positions' features are the rows of the committed path's home branch, which may be a temporary row; the tree step
names them per request (on_tree_forward) and the catch-up reads those rows instead of the request's own row's.
A request that finishes in a forward's commits leaves before that catch-up: on_finish (OutputSink.finish, before
its tokens enter the prefix cache) runs the same piece for it alone, so the cached positions carry head KV from the
target's features (a later prefix hit -- the next chat turn, a repeated prompt -- reads them).

propose(): for a request with end == kv_len, d1 is ready; each further proposal is a head DECODE at the next
position (e, e + 1, ...) with the previous proposal's token and the previous row's hidden_out (EAGLE-3: H wide,
the fc runs on target features only), writing draft KV into the slots the step allocated for the proposals
(writes_kv). Those rows are approximate (the head's hidden, not the target's feature) and are rewritten by the next
catch-up, which starts at p = the verify forward's first position. A request the last forward did not cover (a
fault retried in halves) keeps a stale `end` and proposes nothing until a later catch-up covers it (its draft KV
then has a gap: lower acceptance, never a wrong token -- the target verifies every proposal). Likewise a prefix
borrowed from the radix cache carries the draft KV another request wrote there.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.speculative.eagle_beam import First, first_tokens, head_beam

logger = logging.getLogger(__name__)


def _alive(req: Any) -> bool:
    return req.req_pool_idx is not None and not req.finished()


def _int64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def batch_rows(fb: ForwardBatch) -> Dict[int, Tuple[int, int, int]]:
    """Per request-table row of a target forward: (first position, tokens, first input row)."""
    out, offset = {}, 0
    for b, row in enumerate(fb.req_pool_indices_cpu):
        if fb.forward_mode.is_extend():
            first, n = fb.extend_prefix_lens_cpu[b], fb.extend_seq_lens_cpu[b]
        else:
            first, n = fb.seq_lens_cpu[b] - 1, 1
        out[int(row)] = (first, n, offset)
        offset += n
    return out


class EagleProposer:
    """A speculative/proposer.Proposer (by its methods)."""

    writes_kv = True  # propose() writes the head's KV into the proposals' slots: they must be allocated first
    next_token_kv = True  # the head's KV at position i is computed from token i + 1 (ReqMemory.trim_prefix_page)

    def __init__(self, runner: Any, target: Any, num_steps: int, topk: int = 1):
        """runner: a DraftRunner holding a head; target: the ModelRunner whose captured_batch the catch-up reads;
        topk > 1: trees (propose_tree), the catch-up keeps its last row's topk best log-probs."""
        self.runner, self.target, self.num_steps, self.topk = runner, target, num_steps, topk
        # rid -> (d1, hidden_out row, end, the last row's top-k (log-probs, head ids) or None with top-k 1)
        self.state: Dict[str, Tuple[int, torch.Tensor, int, Optional[First]]] = {}
        self._tree_rows: Tuple[Any, Dict[int, Tuple[int, int, int]]] = (None, {})  # (tree forward, its home rows)
        self.indexes = self.state  # the scheduler step prunes the rids that left through this name
        self._consumed = None  # the target batch whose features were run last (never twice)
        self.num_forwards = 0
        self.num_unfed_positions = 0  # positions on_finish found no target features for (their head KV stays)

    # ------------------------------------------------------------------ protocol
    def on_extend(self, units: Sequence[Tuple[Any, int]]) -> None:
        self._catch_up([r for r, _ in units])

    def on_decoded(self, reqs: Sequence[Any]) -> None:
        self._catch_up(reqs)

    def on_verified(self, reqs: Sequence[Any], committed: Sequence[int]) -> None:
        self._catch_up(reqs)

    def release(self, req: Any) -> None:
        self.state.pop(req.rid, None)

    def on_tree_forward(self, fb: ForwardBatch, home_rows: Dict[int, Tuple[int, int, int]]) -> None:
        """The tree step's verify forward fb, told before its walk: per request-table row of a request that committed,
        (first position, tokens, first input row) of its committed path's home branch -- where the catch-up (and
        on_finish, for a request the walk finishes) reads the committed positions' features. The tree step fills
        home_rows as it commits, before each commit may finish the request."""
        self._tree_rows = (fb, home_rows)

    def on_finish(self, req: Any) -> None:
        """A finished request whose KV enters the prefix cache next (OutputSink.finish, before caching): the head runs
        the positions of the forward that committed its last tokens, exactly as the catch-up after that forward would
        have (the catch-up skips finished requests) -- a verify's [p, kv_len) from the request's rows or, after a tree
        verify, its committed path's home branch's; a decode's [p, p + 1); a last prefill chunk's [a, kv_len). So a
        later prefix hit reads head KV from the target's features at every cached position, not the approximate KV
        propose() wrote there (the head's own hidden state) or a slot's stale KV. Positions between the head's last
        catch-up and that forward have no target features left (the forward of a fault retried in halves, or a
        request the head never saw): they stay as they are and are counted in num_unfed_positions."""
        seen = self.state.pop(req.rid, None)
        fed = seen[2] if seen is not None else req.prefix_len
        fb = self.target.captured_batch
        piece = None
        if fb is not None and fb is not self._consumed and fb.captured_hidden is not None:
            entry = self._feature_rows(fb).get(req.req_pool_idx)
            if entry is not None:
                first, n, offset = entry
                end = min(first + n, req.kv_len, req.fill_len - 1)
                if end > first:
                    piece = (req, first, end, offset)
        start = piece[1] if piece is not None else req.kv_len
        self.num_unfed_positions += max(0, min(start, req.kv_len) - fed)
        if piece is None:
            return
        try:
            self._extend(fb.captured_hidden, [piece])
        except Exception as e:  # noqa: BLE001 - the cached positions keep their approximate head KV
            logger.warning("Draft head catch-up before caching request %s failed (%s: %s)", req.rid,
                           type(e).__name__, e)
        self.state.pop(req.rid, None)

    def propose_tree(self, reqs: Sequence[Any], rows: Sequence[List[int]],
                     depth: Sequence[int]) -> List[List[List[int]]]:
        """Tree proposals (top-k > 1): per request up to len(rows[i]) branches of depth[i] tokens, beam b's head KV in
        row rows[i][b] (row 0: the request's own) -- speculative/eagle_beam.py. The slots were allocated first."""
        out: List[List[List[int]]] = [[] for _ in reqs]
        idx = [i for i, r in enumerate(reqs) if depth[i] > 0 and rows[i] and _alive(r) and r.rid in self.state
               and self.state[r.rid][2] == r.kv_len and self.state[r.rid][3] is not None]
        if not idx:
            return out
        st = [self.state[reqs[i].rid] for i in idx]
        ds = [min(depth[i], self.num_steps) for i in idx]
        try:
            paths, _ = head_beam(self.runner, [reqs[i].kv_len for i in idx], [rows[i] for i in idx], ds,
                                 [s[3] for s in st], [s[1] for s in st])
        except Exception as e:  # noqa: BLE001 - a failed head forward costs proposals, never a request
            logger.warning("Draft head tree proposal failed for %d requests (%s: %s); they decode without proposals",
                           len(idx), type(e).__name__, e)
            return out
        self.num_forwards += max(ds) - 1
        for j, i in enumerate(idx):
            out[i] = paths[j]
        return out

    def propose(self, reqs: Sequence[Any], max_k: Sequence[int]) -> List[List[int]]:
        out: List[List[int]] = [[] for _ in reqs]
        idx = [i for i, r in enumerate(reqs) if max_k[i] > 0 and _alive(r) and r.rid in self.state
               and self.state[r.rid][2] == r.kv_len]
        if not idx:
            return out
        try:
            return self._propose(reqs, max_k, idx, out)
        except Exception as e:  # noqa: BLE001 - a failed head forward costs proposals, never a request
            logger.warning("Draft head propose failed for %d requests (%s: %s); they decode without proposals",
                           len(idx), type(e).__name__, e)
            return [[] for _ in reqs]

    # ------------------------------------------------------------------ head forwards
    def _catch_up(self, reqs: Sequence[Any]) -> None:
        fb = self.target.captured_batch
        if fb is None or fb is self._consumed or fb.captured_hidden is None:
            return
        self._consumed = fb
        rows = self._feature_rows(fb)
        self._tree_rows = (None, {})
        pieces = []  # (req, first position, end position, first feature row)
        for r in reqs:
            if not _alive(r) or r.req_pool_idx not in rows:
                continue
            first, n, offset = rows[r.req_pool_idx]
            end = min(first + n, r.kv_len, r.fill_len - 1)
            if end > first:
                pieces.append((r, first, end, offset))
        if not pieces:
            return
        try:
            self._extend(fb.captured_hidden, pieces)
        except Exception as e:  # noqa: BLE001 - the requests propose nothing until a later catch-up covers them
            logger.warning("Draft head catch-up failed for %d requests (%s: %s)", len(pieces), type(e).__name__, e)
            for r, *_ in pieces:
                self.state.pop(r.rid, None)

    def _feature_rows(self, fb: ForwardBatch) -> Dict[int, Tuple[int, int, int]]:
        """batch_rows(fb), with the committed paths' home branches when fb is the tree step's forward."""
        rows = batch_rows(fb)
        tree_fb, home_rows = self._tree_rows
        if tree_fb is fb:
            rows.update(home_rows)
        return rows

    def _extend(self, features: torch.Tensor, pieces: List[Tuple[Any, int, int, int]]) -> None:
        pool = self.runner.req_to_token_pool
        ids, positions, feat_rows, lens, prefix, rows, seq_lens, out_loc = [], [], [], [], [], [], [], []
        for r, a, e, offset in pieces:
            ids.extend(r.fill_ids[a + 1 : e + 1])
            positions.extend(range(a, e))
            feat_rows.extend(range(offset, offset + e - a))
            lens.append(e - a)
            prefix.append(a)
            rows.append(r.req_pool_idx)
            seq_lens.append(e)
            out_loc.append(pool.slots(r.req_pool_idx, a, e))
        fb = ForwardBatch(
            ForwardMode.EXTEND, len(pieces), input_ids=_int64(ids), positions=_int64(positions),
            req_pool_indices=_int64(rows), seq_lens=_int64(seq_lens), out_cache_loc=torch.cat(out_loc),
            seq_lens_cpu=seq_lens, req_pool_indices_cpu=rows, extend_prefix_lens_cpu=prefix, extend_seq_lens_cpu=lens,
            extend_prefix_lens=_int64(prefix), extend_seq_lens=_int64(lens),
            logits_indices=_int64(lens).cumsum(0) - 1,
        )
        hidden_in = features[_int64(feat_rows).to(features.device)]
        logits, hidden_out = self.runner.forward_head(fb, hidden_in)
        self.num_forwards += 1
        d1 = self._to_target(logits)
        last = fb.logits_indices.to(hidden_out.device)
        for j, (r, _, e, _) in enumerate(pieces):
            top = first_tokens(logits[j], self.topk) if self.topk > 1 else None
            self.state[r.rid] = (d1[j], hidden_out[last[j]].clone(), e, top)

    def _propose(self, reqs, max_k, idx, out) -> List[List[int]]:
        r2t = self.runner.req_to_token_pool.req_to_token_host
        ks = {i: min(max_k[i], self.num_steps) for i in idx}
        tokens = {i: [self.state[reqs[i].rid][0]] for i in idx}
        hidden = {i: self.state[reqs[i].rid][1] for i in idx}
        for step in range(1, max(ks.values())):
            js = [i for i in idx if ks[i] > step]
            rows = [reqs[i].req_pool_idx for i in js]
            pos = [reqs[i].kv_len + step - 1 for i in js]
            index = _int64(rows)
            seq_lens = [p + 1 for p in pos]
            fb = ForwardBatch(
                ForwardMode.DECODE, len(js), input_ids=_int64([tokens[i][-1] for i in js]), positions=_int64(pos),
                req_pool_indices=index, seq_lens=_int64(seq_lens), out_cache_loc=r2t[index, _int64(pos)],
                seq_lens_cpu=seq_lens, req_pool_indices_cpu=rows,
            )
            logits, h = self.runner.forward_head(fb, torch.stack([hidden[i] for i in js]))
            self.num_forwards += 1
            for j, (i, t) in enumerate(zip(js, self._to_target(logits))):
                tokens[i].append(t)
                hidden[i] = h[j]
        for i in idx:
            out[i] = tokens[i][: ks[i]]
        return out

    def _to_target(self, logits: torch.Tensor) -> List[int]:
        return self.runner.model.to_target_ids(logits.argmax(-1)).tolist()
