"""The tree verify step (--speculative-eagle-topk > 1): branch slots -> tree proposals -> ONE expanded verify
forward -> the acceptance walk (speculative/tree.py) -> every slot of the step accounted for.

Branch expansion: request r (x0 at p = kv_len) with B branches of depth D contributes B sequences [x0, path_b] at
positions p .. p + D to one EXTEND forward over its prefix. Branch 0 uses the request's own request-table row
(its decode slot at p plus D slots from ReqMemory.alloc_if_free); branch b > 0 a branch row of the request table
(ReqToTokenPool.alloc_branch: rows beside the request slots, as many as mem_plan/spec_sizes.branch_rows plans, so a
full batch of whole trees has them) whose [0, p) copies the request's prefix slots and whose [p, p + D] are fresh
slots. The shape is mem_plan/spec_sizes.tree_shape's (the
deepest tree, then the widest): rows per request B * (D + 1) <= max_k + 1 <= verify_rows_per_request, the expanded
rows the plan prices a request, so a full batch of whole trees fits the plan's verify budget; its B * D <=
num_draft_tokens - 1 nodes (upstream's count). Invariants:
    - branches take slots and branch rows from what is free only (no eviction): speculation never evicts,
      retracts or OOMs; what is not free costs branches (B shrinks) or depth (D shrinks);
    - before committing the token sampled at node n (depth j), the request's row [p, p + j] maps the slots of n's
      home branch (those hold the KV of x0 and the path to n), so whenever the sink may finish or release the
      request, its row [0, kv_len) holds exactly its tokens' KV;
    - after the walk every slot of the step is either in the request's row (kept up to kv_len, the rest given back
      by ReqMemory.truncate, or all of it by the release) or freed here; every branch row is released here,
      faults included.
A proposer with on_tree_forward(fb, rows) is told, per request-table row of a request that committed, (first position,
tokens, first row) of its committed path's home branch in the forward fb (an EAGLE head's catch-up reads those rows'
features): it gets the dict before the walk, which fills each request's entry before committing a token, so a
request the commit finishes has its home rows recorded when OutputSink.finish asks the proposer (on_finish).
Page size 1 only (spec_args refuses top-k > 1 with --page-size > 1): a branch cannot share a partly filled page.
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch

from sglang.srt.managers.fault_confinement import StepFault, step_phase
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.mem_plan.spec_sizes import tree_shape, verify_rows_per_request
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.speculative.tree import DraftTree, walk_trees


def _int64(values: List[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def _alive(req: Req) -> bool:
    return req.req_pool_idx is not None and not req.finished()


def may_commit(req: Req, num_committed: int, sink: Any) -> bool:
    """Before a verify step commits a request's next token (the chain's and the tree's step alike): False when the
    request finished meanwhile -- by the overlapped text of the previous step (its tokens are dropped), or by a stop
    string in its previous token's text, which the overlap window queued and is decoded now (one text half per
    request)."""
    overlap = sink.overlap
    if not _alive(req):
        if overlap is not None:
            overlap.num_dropped_tokens += 1
        return False
    if num_committed and overlap is not None:
        sink.flush_text(req)
        if req.finished():
            sink.settle([req], [])
            return False
    return True


class Branch:
    __slots__ = ("row", "temp", "slots")

    def __init__(self, row: int, temp: bool, slots: List[int]):
        self.row, self.temp, self.slots = row, temp, slots  # slots of positions p .. p + depth


class TreeStep:
    def __init__(self, decoder: Any):
        self.d = decoder
        cfg = decoder.cfg
        self.topk, self.num_steps, self.max_nodes = cfg.topk, cfg.num_steps, cfg.max_proposals
        self.memory = decoder.memory
        # the most expanded rows a request's tree takes: the rows the plan prices (the policy's per-request cap)
        self.max_rows = verify_rows_per_request(self.topk, self.num_steps, self.max_nodes + 1)
        self.side_branch_commits = 0  # request-steps whose committed path left branch 0 (slots moved in)

    # ------------------------------------------------------------------ slots
    def _temp_branch(self, r: Req, p: int, depth: int) -> Optional[Branch]:
        pool, alloc = self.memory.req_to_token_pool, self.memory.allocator
        row = pool.alloc_branch()  # a branch row: never a request slot (ReqToTokenPool)
        if row is None:
            return None
        slots = alloc.alloc(0, 0, depth + 1)
        if slots is None:
            pool.free(row)
            return None
        pool.write(row, 0, pool.read(r.req_pool_idx, 0, p))
        pool.write(row, p, slots)
        return Branch(row, True, slots)

    def _alloc(self, reqs: List[Req], max_k: List[int]) -> List[List[Branch]]:
        pool, out = self.memory.req_to_token_pool, []
        for r, k in zip(reqs, max_k):
            depth = tree_shape(k, self.topk, self.num_steps, self.max_nodes)[1]
            depth = self.memory.alloc_if_free(r, depth) if depth else 0
            if not depth:
                out.append([])
                continue
            p, n = r.kv_len, tree_shape(k, self.topk, depth, self.max_nodes)[0]  # depth: what was free
            branches = [Branch(r.req_pool_idx, False, pool.read(r.req_pool_idx, p, p + depth + 1))]
            while len(branches) < n:
                b = self._temp_branch(r, p, depth)
                if b is None:
                    break
                branches.append(b)
            out.append(branches)
        return out

    def _settle(self, reqs: List[Req], branches: List[List[Branch]], placed: List[List[int]]) -> None:
        """Free every slot of the step that the request's row does not hold, release the branch rows."""
        alloc, pool = self.memory.allocator, self.memory.req_to_token_pool
        for r, bs, pl in zip(reqs, branches, placed):
            if not bs:
                continue
            own = bs[0].slots
            held = set(pl + own[len(pl):])
            alloc.free([s for b in bs for s in b.slots if s not in held])
            for b in bs[1:]:
                pool.free(b.row)

    # ------------------------------------------------------------------ the step
    def try_verify(self, reqs: List[Req], max_k: List[int]) -> bool:
        branches = self._alloc(reqs, max_k)
        paths = self.d.proposer.propose_tree(reqs, [[b.row for b in bs] for bs in branches],
                                             [len(bs[0].slots) - 1 if bs else 0 for bs in branches])
        trees: List[Optional[DraftTree]] = []
        for i, r in enumerate(reqs):
            got = [p for p in paths[i][: len(branches[i])] if p]
            trees.append(DraftTree(got) if got else None)
            for b in branches[i][len(got):]:  # branches the proposer left empty
                if b.temp:
                    self.memory.allocator.free(b.slots)
                    self.memory.req_to_token_pool.free(b.row)
            del branches[i][max(len(got), 1):]
            if not got and branches[i]:
                branches[i] = []
                self.memory.truncate(r, r.kv_len + 1)
        if not any(trees):
            return False
        placed: List[List[int]] = [[] for _ in reqs]
        try:
            self._run(reqs, branches, trees, placed)
        finally:
            self._settle(reqs, branches, placed)
        return True

    def _build(self, reqs: List[Req], branches, trees) -> ForwardBatch:
        ids, positions, out_loc, rows, prefix, lens = [], [], [], [], [], []
        for r, bs, tree in zip(reqs, branches, trees):
            p, x0 = r.kv_len, r.output_ids[-1]
            seqs = tree.branches if tree is not None else [[]]
            for b, path in enumerate(seqs):
                n = len(path) + 1
                ids.append(x0)
                ids.extend(path)
                positions.extend(range(p + r.mrope_delta, p + n + r.mrope_delta))  # past the prompt: one axis
                row = bs[b].row if bs else r.req_pool_idx
                out_loc.extend(bs[b].slots[:n] if bs else self.memory.req_to_token_pool.read(row, p, p + 1))
                rows.append(row)
                prefix.append(p)
                lens.append(n)
        seq_lens = [a + n for a, n in zip(prefix, lens)]
        pos = _int64(positions)
        return ForwardBatch(
            ForwardMode.EXTEND, len(rows), input_ids=_int64(ids), positions=pos,
            mrope_positions=pos.expand(3, -1) if any(r.uses_mrope for r in reqs) else None,
            req_pool_indices=_int64(rows), seq_lens=_int64(seq_lens), out_cache_loc=_int64(out_loc),
            seq_lens_cpu=seq_lens, req_pool_indices_cpu=rows, extend_prefix_lens_cpu=prefix,
            extend_seq_lens_cpu=lens, extend_prefix_lens=_int64(prefix), extend_seq_lens=_int64(lens),
            logits_indices=torch.arange(len(ids)), mm_inputs=None,
        )

    def _run(self, reqs: List[Req], branches, trees, placed) -> None:
        d = self.d
        runner, fp, overlap, sink = d.runner, d.runner.fault_policy, d.sink.overlap, d.sink
        pool = self.memory.req_to_token_pool

        def job() -> torch.Tensor:
            with step_phase("decode"):
                fp.inject("decode", reqs, runner.forward_ct)
                return runner.model_runner.forward(fb)

        try:
            with step_phase("decode"):
                fb = self._build(reqs, branches, trees)
            logits = job() if overlap is None else overlap.run(job)
        except StepFault as f:
            d._recover_as_decode([r for r in reqs if _alive(r)], f)
            return
        offsets, acc = [], 0
        for r, t in zip(reqs, trees):
            offsets.append(acc)
            acc += t.num_rows if t is not None else 1
        chains = [t if t is not None else DraftTree([[]]) for t in trees]  # x0 alone: one row
        base = [r.kv_len for r in reqs]
        committed, accepted = [0] * len(reqs), [0] * len(reqs)
        home_rows = {}  # request-table row -> its committed path's home branch rows in fb, filled before each commit
        note = getattr(d.proposer, "on_tree_forward", None)
        if note is not None:  # a hidden-state head reads the committed path's features from its home branch's rows
            note(fb, home_rows)

        def commit(i: int, out, row: int, node: int) -> bool:
            r, j, tree = reqs[i], committed[i], chains[i]
            if not may_commit(r, j, sink):
                return False
            home = tree.home[node]
            home_rows[r.req_pool_idx] = (base[i], len(tree.branches[home]) + 1, offsets[i] + tree.row_start[home])
            if home:  # the row's [p, p + j] := the home branch's slots of x0 and the path to node
                placed[i] = branches[i][home].slots[: j + 1]
                pool.write(r.req_pool_idx, base[i], placed[i])
            committed[i] = j + 1
            accepted[i] += int(out.next_token_ids[row]) in tree.children[node]
            r.kv_len = base[i] + j + 1  # x0 and the accepted nodes before this token have their KV
            runner._commit_token(r, out, row)
            return _alive(r)

        try:
            with step_phase("sample"):
                fp.inject("sample", reqs, runner.forward_ct)
                walk_trees(logits, reqs, chains, offsets, commit, runner.grammar.bitmask)
        except StepFault as f:
            d._recover_as_decode([r for i, r in enumerate(reqs) if not committed[i] and _alive(r)], f)
        self.side_branch_commits += sum(1 for pl in placed if pl)
        for i, r in enumerate(reqs):
            if committed[i] and _alive(r):
                self.memory.truncate(r)
        # a tree counts as a chain of its depth: the most tokens it could have accepted (policy and counters)
        depth = [[0] * max(map(len, t.branches)) if t is not None else [] for t in trees]
        d._count(reqs, depth, committed, accepted)
