"""A tree's verify rows priced by the plan (issue 44): --speculative-eagle-topk > 1 verifies B branches of depth D as
B x (D + 1) expanded rows (managers/spec_tree.py), not upstream's num_draft_tokens = nodes + 1. The plan
prices mem_plan/spec_sizes.verify_rows_per_request rows a request; the runtime's budget and policy read the same.

- Exact: for every (topk, steps, num_draft_tokens) with topk 2..4, steps 1..3, the plan's rows == an independent
  enumeration (every shape B <= topk, D <= steps, B x D <= num_draft_tokens - 1; the deepest first, then the widest,
  as the tree step's docstring states), and == the largest tree the real TreeStep builds (over a fake model: rows
  counted in the forward it runs) for every per-request cap the policy can give and for short free slots; with no cap
  at all it builds exactly that tree (the plan does not under-price), and never a shape outside the flags.
- A full batch (4 slots, top-k 3, 3 steps) through the real SpecDecoder with `sglang plan --json`'s slots, chunk and
  request table (4 slots, every one held, + the plan's branch rows) on an H100: every request verifies the whole
  3-branch tree, the forward holds the plan's verify_tokens rows. On a CPU the runtime's CPU_VERIFY_TOKEN_BUDGET
  (16 tokens a forward, the plan prices the same) leaves one request its whole tree (the plan's 2 branch rows), the
  next a chain of what is left and the rest x0 alone.
- A sampling fault after every request of that batch committed a token ends the step there (each keeps its token,
  every other slot and branch row comes back) and is logged and counted (SpecDecoder._recover_as_decode; it was
  dropped without a word when no request was left to recover).
- plan == a real start within 3% of the KV tokens for a STANDALONE top-k 3 server (fp32, 1 GB, CPU), the start's
  plan showing the same verify rows (sglang.test.spec_fixtures.assert_plan_matches_start).
"""

import os
import tempfile
import unittest
from types import SimpleNamespace

from sglang.srt.mem_plan.spec_sizes import verify_rows_per_request
from sglang.test.ci.ci_register import register_cpu_ci

from test_spec_tree import TreeStepHarness

register_cpu_ci(est_time=120, suite="cpu")

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mem_plan", "fixtures")
LLAMA = os.path.join(FIXTURES, "llama-3.1-8b")
AMPLE = 1 << 20


def reference_rows(topk: int, steps: int, draft_tokens: int) -> int:
    """Enumerate every tree the flags allow (B <= topk branches of depth D <= steps, B x D <= draft_tokens - 1
    nodes), keep the deepest, then the widest: its expanded rows."""
    shapes = [(b, d) for b in range(1, topk + 1) for d in range(1, steps + 1) if b * d <= draft_tokens - 1]
    deepest = max(d for _, d in shapes)
    return max(b for b, d in shapes if d == deepest) * (deepest + 1)


def built_shape(topk, steps, draft_tokens, max_k, free_slots):
    """The (branches, depth) the real TreeStep puts into its verify forward for one request allowed max_k + 1 rows,
    with free_slots token slots free after its decode slot; None when it verifies nothing."""
    h = TreeStepHarness(topk, steps, draft_tokens, slots=4 + free_slots, rows=topk + 1)
    r = h.decoding_req("a", [5, 6, 7], 9)
    h.branches = {"a": [[(b + j + 1) % 32 for j in range(steps)] for b in range(topk)]}
    lens = []
    forward = h.model.forward
    h.model.forward = lambda fb: lens.extend(fb.extend_seq_lens_cpu) or forward(fb)
    if not h.step.try_verify([r], [max_k]):
        return None
    assert len(set(lens)) == 1, lens
    return len(lens), lens[0] - 1


class TestTreeRows(unittest.TestCase):
    def test_a_chain_prices_its_draft_tokens(self):
        self.assertEqual([verify_rows_per_request(1, s, s + 1) for s in (1, 3, 7)], [2, 4, 8])

    def test_plan_rows_are_the_largest_tree_the_step_builds(self):
        for topk in (2, 3, 4):
            for steps in (1, 2, 3):
                for n in range(2, topk * steps + 2):
                    cfg = (topk, steps, n)
                    rows = verify_rows_per_request(*cfg)
                    self.assertEqual(rows, reference_rows(*cfg), cfg)
                    # nothing but the flags limits it: exactly the priced tree
                    b, d = built_shape(*cfg, AMPLE, AMPLE)
                    self.assertEqual(b * (d + 1), rows, cfg)
                    built = {built_shape(*cfg, k, AMPLE) for k in range(1, rows)}  # the policy's caps
                    built |= {built_shape(*cfg, rows - 1, free) for free in range(rows + 1)}  # short of slots
                    built.discard(None)
                    for b, d in built:
                        self.assertTrue(b <= topk and d <= steps and b * d <= n - 1, (cfg, b, d))
                    self.assertEqual(max(b * (d + 1) for b, d in built), rows, (cfg, built))


def tree_flags(model, draft, topk=3):
    return ["--model-path", model, "--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", draft,
            "--speculative-eagle-topk", str(topk), "--speculative-num-steps", "3"]


class TestFullBatch(unittest.TestCase):
    """The real SpecDecoder over a fake model: R slots, all running, all proposing."""

    def plan(self, device):
        from sglang.cli.plan import run

        status, result, _ = run([*device, *tree_flags(LLAMA, LLAMA), "--max-running-requests", "4", "--json"])
        self.assertEqual(status, 0, result)
        return result["plan"]

    def step(self, plan, device_kind):
        sd, h, reqs = self.decoder(plan, device_kind)
        lens, forward = [], h.model.forward
        h.model.forward = lambda fb: lens.append(list(fb.extend_seq_lens_cpu)) or forward(fb)
        self.assertTrue(sd.try_verify(reqs))
        return sd, lens[0]

    def decoder(self, plan, device_kind):
        from sglang.srt.managers.spec_decode import SpecDecoder
        from sglang.srt.server_args import ServerArgs

        cfg = ServerArgs(model_path=LLAMA, speculative_algorithm="STANDALONE", speculative_draft_model_path=LLAMA,
                         speculative_eagle_topk=3, speculative_num_steps=3).speculative()
        num_reqs = plan["max_running_requests"]
        h = TreeStepHarness(3, 3, cfg.num_draft_tokens, slots=1024, rows=num_reqs,
                            branch_rows=plan["speculative"]["branch_rows"])  # the plan's request table
        reqs = [h.decoding_req(f"r{i}", [5 + i, 6, 7], 9) for i in range(num_reqs)]
        h.branches = {r.rid: [[(b + j + i) % 32 for j in range(3)] for b in range(3)] for i, r in enumerate(reqs)}
        h.model.draft_runner, h.model.chunked_prefill_size = None, plan["chunked_prefill_size"]
        runner = h.decoder.runner
        runner.memory, runner.sink = h.memory, h.decoder.sink
        runner.queues = SimpleNamespace(reqs={r.rid: r for r in reqs})
        sd = SpecDecoder(cfg, runner, num_reqs, plan["chunked_prefill_size"], device_kind)
        sd.proposer = SimpleNamespace(propose_tree=h.propose, on_verified=lambda reqs, committed: None)
        return sd, h, reqs

    def test_a_full_batch_verifies_whole_trees_within_the_plan(self):
        plan = self.plan(["--gpu", "h100-80gb"])
        spec = plan["speculative"]
        self.assertEqual((plan["max_running_requests"], spec["num_draft_tokens"], spec["verify_rows_per_req"]),
                         (4, 10, 12))  # upstream's count: 3 x 3 nodes + 1; expanded: 3 x (3 + 1)
        self.assertEqual(spec["verify_tokens"], 4 * 12)  # the chunk does not bind
        self.assertEqual(spec["branch_rows"], 4 * 2)
        sd, lens = self.step(plan, "cuda")
        self.assertEqual(sd.policy.verify_token_budget, spec["verify_tokens"])
        self.assertEqual(lens, [4] * 12)  # 4 requests x 3 branches x (x0 + 3 nodes): every tree whole
        self.assertEqual(sum(lens), spec["verify_tokens"])

    def test_cpu_budget_caps_the_batch_as_planned(self):
        plan = self.plan(["--device", "cpu", "--total-memory-gb", "128", "--dtype", "bfloat16"])
        spec = plan["speculative"]
        self.assertEqual((spec["verify_rows_per_req"], spec["verify_tokens"]), (12, 16))  # max(4, min(48, 16))
        self.assertEqual(spec["branch_rows"], 2)  # 16 rows hold 4 branches of 4: one tree's 3, or 2 + 2
        _, lens = self.step(plan, "cpu")
        self.assertEqual(sum(lens), 16)
        self.assertEqual(lens, [4, 4, 4, 2, 1, 1])  # one whole tree; 16 - 12 - 1 - 1 rows: a chain of 1, x0 alone


    def test_a_fault_after_every_request_committed_is_counted(self):
        """The walk fails after each request committed its first token: the step ends there, each keeping that
        token, every other slot and branch row given back -- and the fault is logged and counted (it was dropped)."""
        from sglang.srt.managers import spec_tree
        from sglang.srt.managers.fault_confinement import StepFault

        sd, h, reqs = self.decoder(self.plan(["--gpu", "h100-80gb"]), "cuda")
        faults = []
        sd.runner.fault_policy = SimpleNamespace(inject=lambda *a: None, on_fault=lambda what, cause: faults.append(
            (what, cause)))
        sd.runner._recover = lambda units, decode, f: self.fail(f"nothing left to recover, got {units}")
        free_rows = len(h.pool.free_branch_rows)

        def walk_then_fail(logits, rs, chains, offsets, commit, bitmask):
            out = SimpleNamespace(next_token_ids=logits.argmax(-1))
            for i in range(len(rs)):
                commit(i, out, offsets[i], 0)
            raise StepFault("sample", RuntimeError("boom"))

        real = spec_tree.walk_trees
        spec_tree.walk_trees = walk_then_fail
        try:
            self.assertTrue(sd.try_verify(reqs))
        finally:
            spec_tree.walk_trees = real
        self.assertEqual(len(faults), 1, faults)
        self.assertIn("sample", faults[0][0])
        self.assertEqual(str(faults[0][1]), "boom")
        self.assertEqual([len(r.output_ids) for r in reqs], [2] * len(reqs))  # x0 + the committed token
        self.assertEqual([r.alloc_len - r.kv_len for r in reqs], [0] * len(reqs))
        self.assertEqual(len(h.pool.free_branch_rows), free_rows)


class TestPlanEqualsStart(unittest.TestCase):
    def test_standalone_tree_plan_equals_a_real_start(self):
        from transformers import AutoTokenizer

        from sglang.test.engine_fixtures import default_model_dir
        from sglang.test.spec_fixtures import assert_plan_matches_start

        from test_spec_standalone_engine import make_llama

        with tempfile.TemporaryDirectory() as tmp:
            tok = AutoTokenizer.from_pretrained(default_model_dir())
            vocab = (len(tok) + 63) // 64 * 64
            target = make_llama(os.path.join(tmp, "target"), vocab, 2, 0, tok)
            draft = make_llama(os.path.join(tmp, "draft"), vocab, 1, 1, tok)
            flags = [*tree_flags(target, draft), "--dtype", "float32", "--max-total-memory-gb", "1"]
            plan, dry, engine = assert_plan_matches_start(self, flags)
            self.assertEqual(plan.speculative.verify_rows_per_req, dry["speculative"]["verify_rows_per_req"])
            self.assertEqual((plan.speculative.num_draft_tokens, plan.speculative.verify_rows_per_req), (10, 12))
            spec = engine.scheduler.runner.spec
            self.assertEqual((spec.policy.max_proposals, spec.tree.max_rows), (11, 12))
            # the request table the start allocated: the plan's slots + its branch rows (the CPU budget's 2) + 1
            pool = engine.scheduler.runner.memory.req_to_token_pool
            self.assertEqual((pool.size, pool.branch_rows), (plan.max_running_requests, plan.speculative.branch_rows))
            self.assertEqual(plan.speculative.branch_rows, 2)
            self.assertEqual(pool.req_to_token.shape[0], plan.max_running_requests + 3)


if __name__ == "__main__":
    unittest.main()
