"""A speculative tree's side branches have request-table rows of their own, planned (issue 44).

A tree keeps branch 0 in its request's row and gives each other branch a row holding a copy of the prefix
(managers/spec_tree.py). Those rows are ReqToTokenPool's branch rows (alloc_branch), beside the R request slots,
and mem_plan/spec_sizes.branch_rows says how many one verify forward can hold. Checked here:

- Exact count: branch_rows == the most side branches any verify forward can hold, found by a knapsack over every
  allotment the policy can make (batch sizes 1..R, per-request caps 0..rows - 1 with sum(cap + 1) <= the budget,
  each cap turned into a tree by the runtime's tree_shape), for top-k 2..4, steps 1..3, every num_draft_tokens,
  R 1..6 and the CPU budget as well as an unbounded one.
- The plan prices the rows in three terms, against a chain's plan of the same slots: req_to_token (a row of
  req_to_token_row_len int64 each), the attention backend's per-sequence buffers (Triton's qo_start entry, FlashInfer's
  indptrs and a context's page ids, AITER's indptrs and token slots, but not their decode buffers), and a quantized
  KV's window map (8 B a row).
- The planned FlashInfer buffers hold the page table of the largest verify forward (R + branch rows sequences of the
  whole context, built by paged_kv_indices.build_page_table as the backend does); without the branch rows it does not
  fit.
- The draft's own attention backend (model_executor/draft_runner.py) is priced as draft_attention_workspace, sized
  for every table row (slots + branch rows: a head's beam decodes them in one batch): FlashInfer's two workspaces plus
  its CSR arrays and page ids, Triton's qo_start and split-KV decode buffers over the draft's heads, computed here
  from the buffers' shapes; torch_native's is 0.
- TreeStep takes branch rows, never a request slot: with both slots held and branch rows for one whole tree, the
  first request verifies its 3 branches, the second a chain, every branch row comes back.
- ReqToTokenPool keeps the two kinds apart: requests never take a branch row, branches never a request slot, a
  repair frees both, check_integrity names a branch row held between steps.
"""

import unittest

import torch

from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_plan.backends import AttentionShape, BackendInputs, declare, persistent
from sglang.srt.mem_plan.sizes import req_to_token_row_len
from sglang.srt.mem_plan.spec_sizes import (CPU_VERIFY_TOKEN_BUDGET, branch_rows, largest_tree, tree_shape,
                                            verify_rows_per_request)
from sglang.test.ci.ci_register import register_cpu_ci

from test_spec_tree import TreeStepHarness
from test_spec_tree_plan import LLAMA, tree_flags

register_cpu_ci(est_time=30, suite="cpu")


def most_side_branches(num_reqs: int, topk: int, steps: int, draft_tokens: int, budget: int) -> int:
    """Knapsack: the most side branches (tree branches - 1, summed) of any batch of n <= num_reqs requests whose
    per-request caps k (each <= rows - 1, the policy's max_proposals) sum to <= budget - n (the policy's extra)."""
    rows = verify_rows_per_request(topk, steps, draft_tokens)
    gain = [0] + [max(0, tree_shape(k, topk, steps, draft_tokens - 1)[0] - 1) for k in range(1, rows)]
    best = 0
    for n in range(1, min(num_reqs, budget) + 1):
        extra = budget - n
        value = [0] * (extra + 1)  # value[c]: most side branches with caps summing to <= c over requests so far
        for _ in range(n):
            value = [max(value[c - k] + gain[k] for k in range(min(c, rows - 1) + 1)) for c in range(extra + 1)]
        best = max(best, value[extra])
    return best


class TestBranchRowCount(unittest.TestCase):
    def test_branch_rows_are_the_most_a_verify_forward_holds(self):
        checked = 0
        for topk in (2, 3, 4):
            for steps in (1, 2, 3):
                for n in range(2, topk * steps + 2):
                    b, d = largest_tree(topk, steps, n)
                    rows = verify_rows_per_request(topk, steps, n)
                    for num_reqs in range(1, 7):
                        for budget in (CPU_VERIFY_TOKEN_BUDGET, num_reqs * rows):
                            want = most_side_branches(num_reqs, topk, steps, n, budget)
                            self.assertEqual(branch_rows(num_reqs, b, d, budget), want,
                                             (topk, steps, n, num_reqs, budget))
                            checked += want > 0
        self.assertGreater(checked, 300)

    def test_nondecreasing_in_slots(self):
        for b, d in ((2, 1), (3, 3), (4, 2)):
            for budget_per_slot in (2, 5, 12):
                seq = [branch_rows(r, b, d, min(r * budget_per_slot, 64)) for r in range(1, 200)]
                self.assertEqual(seq, sorted(seq), (b, d, budget_per_slot))


def plan_of(*flags):
    from sglang.cli.plan import run

    status, result, _ = run([*flags, "--json"])
    assert status == 0, result
    plan = result["plan"]
    return plan, {t["name"]: t["num_bytes"] for t in plan["terms"]}


class TestPlanTerms(unittest.TestCase):
    GPU = {"triton": "h100-80gb", "flashinfer": "h100-80gb", "aiter": "mi300x"}

    def side_by_side(self, backend: str):
        gpu = ["--gpu", self.GPU[backend], "--max-running-requests", "64", "--context-length", "32768",
               "--attention-backend", backend]
        tree, tree_terms = plan_of(*tree_flags(LLAMA, LLAMA), *gpu)
        chain, chain_terms = plan_of(*tree_flags(LLAMA, LLAMA, topk=1), *gpu)
        self.assertEqual((tree["max_running_requests"], chain["max_running_requests"]), (64, 64))
        return tree, tree_terms, chain_terms

    def test_gpu_plan_prices_table_rows_and_per_sequence_buffers(self):
        ctx, pages = 32768, 32768  # page size 1: one page id per token
        per_row = {"triton": 4,  # qo_start
                   "flashinfer": 4 * 3 + 4 * pages,  # kv_indptr, qo_indptr, kv_last_page_len; kv_indices
                   "aiter": 4 * 3 + 4 * ctx}  # the same CSR arrays, token slots (block 1)
        for backend, ws_row in per_row.items():
            tree, t, c = self.side_by_side(backend)
            spec = tree["speculative"]
            self.assertEqual((spec["tree_branches"], spec["branch_rows"]), (3, 128), backend)  # 64 x (3 - 1)
            self.assertEqual(t["req_to_token"] - c["req_to_token"], 128 * req_to_token_row_len(ctx) * 8, backend)
            self.assertEqual(t["attention_workspace"] - c["attention_workspace"], 128 * ws_row, backend)

    def test_cpu_plan_prices_the_budgets_rows_and_the_window_map(self):
        cpu = ["--device", "cpu", "--total-memory-gb", "64", "--dtype", "bfloat16", "--max-running-requests", "8",
               "--kv-cache-dtype", "int4"]
        tree, t = plan_of(*tree_flags(LLAMA, LLAMA), *cpu)
        chain, c = plan_of(*tree_flags(LLAMA, LLAMA, topk=1), *cpu)
        spec = tree["speculative"]
        # 16 rows a verify forward, 4 per branch: 4 whole branches, one tree's 3 or two trees' 2 + 2: 2 side branches
        self.assertEqual((spec["verify_tokens"], spec["branch_rows"]), (16, 2))
        ctx = tree["context_len"]
        self.assertEqual(t["req_to_token"] - c["req_to_token"], 2 * req_to_token_row_len(ctx) * 8)
        self.assertEqual(t["kv_window"] - c["kv_window"], 2 * 8)
        self.assertEqual(chain["speculative"]["branch_rows"], 0)


class TestDraftWorkspace(unittest.TestCase):
    def test_draft_backend_priced_per_table_row(self):
        ctx = 32768
        gpu = ["--gpu", "h100-80gb", "--max-running-requests", "64", "--context-length", str(ctx)]
        for topk, rows in ((3, 64 + 128), (1, 64)):
            _, t = plan_of(*tree_flags(LLAMA, LLAMA, topk=topk), *gpu, "--attention-backend", "flashinfer")
            # float + int workspaces, kv_indptr / qo_indptr / kv_last_page_len [rows + 1], kv_indices [rows x ctx]
            want = 384 * 2**20 + 8 * 2**20 + 3 * 4 * (rows + 1) + 4 * rows * ctx
            self.assertEqual(t["draft_attention_workspace"], want, topk)
            _, t = plan_of(*tree_flags(LLAMA, LLAMA, topk=topk), *gpu, "--attention-backend", "triton",
                           "--triton-attention-num-kv-splits", "8")
            heads, splits, dv = 32, 8, 128  # the draft (Llama-3.1-8B's config) unsharded
            want = 4 * (rows + 1) + 4 * rows * heads * splits * (dv + 1)  # qo_start; decode logits and lse
            self.assertEqual(t["draft_attention_workspace"], want, topk)
        _, t = plan_of(*tree_flags(LLAMA, LLAMA), "--device", "cpu", "--total-memory-gb", "128", "--dtype", "bfloat16")
        self.assertEqual(t["draft_attention_workspace"], 0)  # torch_native allocates nothing


class TestPageTableFits(unittest.TestCase):
    def test_flashinfer_buffers_hold_the_largest_verify_forward(self):
        from sglang.srt.layers.attention.paged_kv_indices import build_page_table

        ctx, num_reqs, extra = 64, 4, 8
        shape = AttentionShape(4, 16, ctx, num_kv_heads=2)
        table = ReqToTokenPool(num_reqs, ctx, branch_rows=extra)
        for row in range(1, num_reqs + extra + 1):
            table.write(row, 0, list(range(row * ctx, (row + 1) * ctx)))
        seqs = list(range(1, num_reqs + extra + 1))  # every row a whole-context sequence of 4 new tokens

        def build(branch: int):
            bufs = {b.name: torch.zeros(b.shape, dtype=torch.int32)
                    for b in persistent(declare("flashinfer", BackendInputs(shape, num_reqs, 0,
                                                                           num_branch_rows=branch)))
                    if b.dtype == "int32"}
            return build_page_table(table.req_to_token, torch.tensor(seqs), [ctx] * len(seqs), 1,
                                    bufs["kv_indptr_0"], bufs["kv_last_page_len"], bufs["kv_indices_0"], seqs,
                                    extend_lens_cpu=[4] * len(seqs), qo_indptr_buf=bufs["qo_indptr"])

        t = build(extra)
        self.assertEqual(t.kv_indices.tolist(), [s for row in seqs for s in range(row * ctx, (row + 1) * ctx)])
        self.assertEqual(t.qo_indptr.tolist(), list(range(0, 4 * len(seqs) + 1, 4)))
        with self.assertRaisesRegex(ValueError, "exceeds the planned"):
            build(0)


class TestTreeStepRows(unittest.TestCase):
    def test_side_branches_take_branch_rows_never_request_slots(self):
        h = TreeStepHarness(rows=2, branch_rows=2)  # both request slots held; branch rows for one whole tree
        a, b = h.decoding_req("a", [5, 6, 7], 9), h.decoding_req("b", [1, 2], 4)
        h.branches = {r.rid: [[1, 2, 3], [2, 3, 4], [3, 4, 5]] for r in (a, b)}
        seen = []

        def propose(reqs, rows, depth):
            seen.append(([list(x) for x in rows], depth))
            self.assertEqual((h.pool.available_size(), h.pool.free_branch_rows), (0, []))
            return h.propose(reqs, rows, depth)

        h.decoder.proposer.propose_tree = propose
        self.assertTrue(h.step.try_verify([a, b], [11, 11]))
        # a: its own row and both branch rows (a whole tree); b: what is left, its own row (a chain)
        self.assertEqual(seen, [([[a.req_pool_idx, 4, 3], [b.req_pool_idx]], [3, 3])])
        self.assertEqual(sorted(h.pool.free_branch_rows), [3, 4])
        h.pool.check_integrity(2)


class TestTableRows(unittest.TestCase):
    def test_requests_and_branches_never_share_rows(self):
        pool = ReqToTokenPool(3, 16, branch_rows=2)
        self.assertEqual(tuple(pool.req_to_token.shape), (6, 16))
        reqs = [pool.alloc() for _ in range(3)]
        self.assertEqual((sorted(reqs), pool.alloc(), pool.available_size()), ([1, 2, 3], None, 0))
        branches = [pool.alloc_branch() for _ in range(2)]
        self.assertEqual((sorted(branches), pool.alloc_branch()), ([4, 5], None))
        pool.free(reqs[0])
        self.assertEqual((pool.available_size(), pool.alloc_branch()), (1, None))  # a freed slot is no branch row
        with self.assertRaisesRegex(AssertionError, "branch rows held between steps"):
            pool.check_integrity(2)
        pool.free(branches[0])
        self.assertEqual(pool.alloc(), reqs[0])  # a freed branch row is no request slot
        pool.free_all_but(reqs[1:])  # a repair: the survivors' slots kept, every branch row back
        self.assertEqual(sorted(pool.free_branch_rows), [4, 5])
        pool.check_integrity(2)


if __name__ == "__main__":
    unittest.main()
