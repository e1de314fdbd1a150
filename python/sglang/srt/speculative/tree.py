"""Tree proposals (--speculative-eagle-topk > 1): the tree made of a request's branches, and the exact acceptance walk.

A proposal tree is given as branches: root-to-leaf token paths after the request's last token x0, which may share
prefixes. Node 0 is the root (x0); every other node is one distinct prefix of a branch. The verify forward expands
the tree into its branches (managers/spec_tree.py): branch b is its own sequence [x0, path_b] at positions p, p+1, ..,
so its rows are row_start[b] .. row_start[b] + len(path_b). A node's logits row is the row of its HOME branch (the
first branch holding it) at the node's depth: every branch holding the node computes the same causal row (same
tokens at the same positions over the same prefix), so any of them would do.

The walk (exact for point-mass candidates, as the chain in speculative/verify.py): at node n, sample t from n's row
with the request's state as if the path to n were already output; commit t; move to n's child with token t if there
is one, else stop (t was the correction; at a leaf it is the bonus token). Drawing t ~ p and following the child that
matches is speculative rejection sampling with a point-mass draft at every child at once: a child with token d is
taken with probability p(d), and the token committed when none matches is distributed as p restricted to the
children's complement -- so every committed token has the law of non-speculative decoding. The grammar and every
other per-request state advance only through commit, i.e. only over committed tokens.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence

import torch

from sglang.srt.sampling.sampler import SampleOutput, sample
from sglang.srt.speculative.verify import RowView, needs_sequential

# commit(i, out, row, node): append row `row` of `out` (sampled from node `node` of request i's tree) to request i;
# False when the request is finished or dropped
TreeCommit = Callable[[int, SampleOutput, int, int], bool]


class DraftTree:
    """The trie of a request's branches. Lists are indexed by node (0 = the root, x0)."""

    def __init__(self, branches: Sequence[Sequence[int]]):
        self.branches: List[List[int]] = [list(b) for b in branches]
        self.token: List[int] = [-1]
        self.parent: List[int] = [-1]
        self.depth: List[int] = [0]
        self.home: List[int] = [0]  # the first branch holding the node
        self.children: List[Dict[int, int]] = [{}]
        self.leaf: List[int] = []  # per branch: its last node
        for b, path in enumerate(self.branches):
            n = 0
            for t in path:
                c = self.children[n].get(t)
                if c is None:
                    c = len(self.token)
                    self.children[n][t] = c
                    self.token.append(t)
                    self.parent.append(n)
                    self.depth.append(self.depth[n] + 1)
                    self.home.append(b)
                    self.children.append({})
                n = c
            self.leaf.append(n)
        self.row_start: List[int] = []  # per branch: its first row in the request's expanded rows
        acc = 0
        for path in self.branches:
            self.row_start.append(acc)
            acc += len(path) + 1
        self.num_rows = acc

    @property
    def num_nodes(self) -> int:
        """Proposed tokens: the nodes other than the root."""
        return len(self.token) - 1

    def row(self, n: int) -> int:
        """Node n's row among the request's expanded rows."""
        return self.row_start[self.home[n]] + self.depth[n]

    def path(self, n: int) -> List[int]:
        """The proposed tokens from the root to node n (the root: [])."""
        out = []
        while n:
            out.append(self.token[n])
            n = self.parent[n]
        out.reverse()
        return out


@torch.inference_mode()
def walk_trees(logits: torch.Tensor, reqs: List[Any], trees: List[DraftTree], offsets: List[int],
               commit: TreeCommit, grammar_bitmask) -> List[int]:
    """logits float32 [N, V] (modified in place); request i's expanded rows start at offsets[i]. Walks each
    request's tree in request order, committing through commit; returns the tokens committed per request."""
    batched = [i for i, r in enumerate(reqs) if not needs_sequential(r)]
    rows, views, first = [], [], {}
    for i in batched:
        first[i] = len(rows)
        for n in range(len(trees[i].token)):
            rows.append(offsets[i] + trees[i].row(n))
            views.append(reqs[i] if n == 0 else RowView(reqs[i], trees[i].path(n)))
    out = sample(logits[rows], views) if rows else None
    counts = []
    for i, req in enumerate(reqs):
        tree, n, committed = trees[i], 0, 0
        while True:
            if i in first:
                o, row = out, first[i] + n
            else:  # the real request, its state advanced by the commits so far
                r0 = offsets[i] + tree.row(n)
                o, row = sample(logits[r0: r0 + 1], [req], grammar_bitmask), 0
            token = o.next_token_ids[row]
            committed += 1
            if not commit(i, o, row, n):
                break
            n = tree.children[n].get(int(token), -1)
            if n < 0:
                break
        counts.append(committed)
    return counts
