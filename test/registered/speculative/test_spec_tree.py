"""Tree verification (--speculative-eagle-topk > 1, issue 44).

- The walk (speculative/tree.py) and the tree step (managers/spec_tree.py) without a model: a synthetic target whose
  row after a history is a fixed random function of that history, read by a fake forward through the request table
  and a fake KV store (slot -> the (position, token) written there), so a temporary row with a wrong prefix, a branch
  computed at the wrong positions or a request row left pointing at another branch's slots all change what is read.
  Branches include the greedy continuation split over two side branches and wrong ones: the step commits exactly the
  reference greedy tokens, the request's row then maps each position to the slot holding its token, and every other
  slot and temporary row goes back (the allocator's free count and the table's free rows return to their start).
- The walk's law at temperature 1: a chi-square over many draws against the chain rule over the tree's outcomes.
- STANDALONE with top-k 3 and 2 through sglang.Engine (one engine; top-k 2 by the tree step's own setting): greedy
  tokens == the same engine's without speculation, with a 4-token chunked prefill, a prefix hit, a stop string and
  retraction (python/sglang/test/retraction_checks.py), idle and intact after every run (no slot leaked); and a
  JSON schema (xgrammar) with top-k 3: greedy tokens == without speculation, the text parses under the schema.
"""

import json
import os
import tempfile
import unittest
from types import SimpleNamespace

import torch

from sglang.srt.managers.req_memory import ReqMemory
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.spec_tree import TreeStep
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.speculative.tree import DraftTree, walk_trees
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=240, suite="cpu")

V = 32


def target_row(history) -> torch.Tensor:
    """The synthetic target's logits after `history` (a fixed random function of it)."""
    g = torch.Generator().manual_seed(hash(tuple(history)) % (1 << 62))
    return torch.randn(V, generator=g)


def greedy(history, n):
    out = []
    for _ in range(n):
        out.append(int(target_row(history + out).argmax()))
    return out


def greedy_reference(history, tree_prefixes, limit):
    """Non-speculative greedy decoding from the target, for as long as the tokens so far are a node of the tree."""
    out = []
    while len(out) < limit:
        out.append(int(target_row(history + out).argmax()))
        if tuple(out) not in tree_prefixes:
            break
    return out


class FakeModel:
    """ForwardBatch -> logits of every row, each computed from the history read through the request table."""

    def __init__(self, pool):
        self.pool, self.kv = pool, {}

    def forward(self, fb):
        rows, starts = [], fb.extend_prefix_lens_cpu
        ids, loc, at = fb.input_ids.tolist(), fb.out_cache_loc.tolist(), 0
        for row, p, n in zip(fb.req_pool_indices_cpu, starts, fb.extend_seq_lens_cpu):
            for q in range(n):
                self.kv[loc[at + q]] = (p + q, ids[at + q])
            hist = []
            for pos, slot in enumerate(self.pool.read(row, 0, p)):
                assert self.kv[slot][0] == pos, (row, pos)
                hist.append(self.kv[slot][1])
            for q in range(n):
                rows.append(target_row(hist + ids[at: at + q + 1]))
            at += n
        return torch.stack(rows)


class TreeStepHarness:
    """A TreeStep over real request memory (allocator, request table) with a fake runner and proposer."""

    def __init__(self, topk=3, steps=3, draft_tokens=10, slots=256, rows=8, branch_rows=None):
        # request slots, and the branch rows the side branches take (default: every slot's tree whole)
        self.pool = ReqToTokenPool(rows, 128, branch_rows=rows * (topk - 1) if branch_rows is None else branch_rows)
        self.alloc = TokenToKVPoolAllocator(slots)
        self.memory = ReqMemory(self.pool, self.alloc, None, 1)
        self.model = FakeModel(self.pool)
        self.branches = {}
        self.counted = []
        runner = SimpleNamespace(
            fault_policy=SimpleNamespace(inject=lambda *a: None), forward_ct=0, model_runner=self.model,
            grammar=SimpleNamespace(bitmask=None), _commit_token=lambda r, out, row: r.append_token_id(
                int(out.next_token_ids[row])))
        self.decoder = SimpleNamespace(
            cfg=SimpleNamespace(topk=topk, num_steps=steps, max_proposals=draft_tokens - 1), memory=self.memory,
            runner=runner, sink=SimpleNamespace(overlap=None), proposer=SimpleNamespace(propose_tree=self.propose),
            _recover_as_decode=lambda reqs, f: None, _count=lambda *a: self.counted.append(a))
        self.step = TreeStep(self.decoder)

    def propose(self, reqs, rows, depth):
        return [[b[: depth[i]] for b in self.branches.get(r.rid, [])][: len(rows[i])] for i, r in enumerate(reqs)]

    def decoding_req(self, rid, prompt, x0, **sp):
        """A request after its prefill: the prompt's KV written, x0 sampled, its decode slot allocated."""
        sp.setdefault("max_new_tokens", 64)
        r = Req(rid, list(prompt), SamplingParams(temperature=0.0, **sp))
        self.memory.admit(r, [], None)
        slots = self.memory.alloc(r, len(prompt))
        for pos, (s, t) in enumerate(zip(slots, prompt)):
            self.model.kv[s] = (pos, t)
        r.kv_len = len(prompt)
        r.append_token_id(x0)
        assert self.memory.alloc_decode([r])
        return r


class TestTreeStep(unittest.TestCase):
    def test_walk_follows_the_right_branch_and_gives_back_every_other_slot(self):
        h = TreeStepHarness()
        free_slots, free_rows, free_branches = self.alloc_state(h)
        a = h.decoding_req("a", [5, 6, 7], 9)
        b = h.decoding_req("b", [1, 2], 4)
        c = h.decoding_req("c", [3, 3, 3, 3], 8)
        d = h.decoding_req("d", [2, 4], 1, max_new_tokens=3)  # finishes in the middle of its walk
        g = {r.rid: greedy(r.fill_ids, 4) for r in (a, b, c, d)}  # non-speculative greedy tokens
        wrong = lambda t: (t + 1) % V  # noqa: E731
        ga, gb, gd = g["a"], g["b"], g["d"]
        h.branches = {
            # branch 0 wrong at once; the greedy path runs through branch 1 (g1) then branch 2 (g1 g2)
            "a": [[wrong(ga[0]), 1, 2], [ga[0], wrong(ga[1]), 3], [ga[0], ga[1], wrong(ga[2])]],
            "b": [[gb[0], gb[1], gb[2]], [wrong(gb[0]), 0, 0]],  # branch 0 right to its end: the bonus token
            "d": [[wrong(gd[0]), 5, 5], [gd[0], gd[1], gd[2]]],  # 2 branches of the 3 it had slots for
        }
        before = {r.rid: list(r.fill_ids) for r in (a, b, c, d)}
        reqs = [a, b, c, d]
        held0 = [r.alloc_len for r in reqs]
        self.assertTrue(h.step.try_verify(reqs, [11, 7, 0, 11]))
        for r in (a, b, c):  # the tree's greedy walk, computed from the prefixes alone
            prefixes = {tuple(p[:j]) for p in h.branches.get(r.rid, []) for j in range(1, len(p) + 1)}
            self.assertEqual(r.output_ids[1:], greedy_reference(before[r.rid], prefixes, 4), r.rid)
        self.assertEqual([r.output_ids[1:] for r in reqs], [ga[:3], gb[:4], g["c"][:1], gd[:2]])
        self.assertTrue(d.finished())  # max_new_tokens 3: x0 and two more
        # the request's row maps every position below kv_len to the slot whose KV holds its token
        for r in (a, b, c, d):
            self.assertEqual(r.kv_len, len(r.fill_ids) - 1, r.rid)
            for pos, slot in enumerate(h.pool.read(r.req_pool_idx, 0, r.kv_len)):
                self.assertEqual(h.model.kv[slot], (pos, r.fill_ids[pos]), (r.rid, pos))
        self.assertEqual([r.alloc_len for r in (a, b, c)], [r.kv_len for r in (a, b, c)])
        # every slot of the step not in a request's row is free again, every temporary row released
        grown = sum(r.alloc_len - n for r, n in zip(reqs, held0))
        self.assertEqual(h.alloc.available_size(), free_slots - sum(held0) - grown)
        self.assertEqual(h.pool.available_size(), free_rows - len(reqs))
        self.assertEqual(h.step.side_branch_commits, 2)  # a and d left branch 0
        for r in reqs:
            h.memory.release(r, cache=False)
        self.assertEqual(self.alloc_state(h), (free_slots, free_rows, free_branches))

    def test_nothing_proposed_gives_back_the_branches(self):
        h = TreeStepHarness()
        free_slots, free_rows, free_branches = self.alloc_state(h)
        r = h.decoding_req("a", [5, 6, 7], 9)
        self.assertFalse(h.step.try_verify([r], [11]))  # the proposer made no tree
        self.assertEqual(r.alloc_len, r.kv_len + 1)
        h.memory.release(r, cache=False)
        self.assertEqual(self.alloc_state(h), (free_slots, free_rows, free_branches))

    def test_branches_take_only_free_slots(self):
        h = TreeStepHarness(slots=12)  # 3 prompt + 1 decode slot leave 8: branch 0 (+3) and one more branch (4)
        r = h.decoding_req("a", [5, 6, 7], 9)
        h.branches = {"a": [[1, 2, 3], [2, 3, 4], [3, 4, 5]]}
        seen = []

        def propose(reqs, rows, depth):
            seen.append(([len(x) for x in rows], depth))
            return h.propose(reqs, rows, depth)

        h.decoder.proposer.propose_tree = propose
        h.step.try_verify([r], [11])
        self.assertEqual(seen, [([2], [3])])
        self.assertEqual(h.alloc.available_size(), 12 - r.alloc_len)

    @staticmethod
    def alloc_state(h):
        return h.alloc.available_size(), h.pool.available_size(), len(h.pool.free_branch_rows)


# ------------------------------------------------------------------------------------ the walk's law (temperature 1)
# the tree: root -> {0, 1}; node (0,) -> {1}. Branches [0, 1] and [1]; expanded rows: [root, (0,), (0, 1)], [root, (1,)]
W = 4
NODE_ROWS = {(): [2.0, 1.5, 0.5, 0.0], (0,): [0.3, 1.8, 1.0, 0.0], (0, 1): [0.0, 0.7, 1.2, 0.4],
             (1,): [1.0, 0.2, 0.0, 0.9]}
BRANCHES = [[0, 1], [1]]


def tree_law():
    p = {k: torch.softmax(torch.tensor(v, dtype=torch.float64), 0).tolist() for k, v in NODE_ROWS.items()}
    law = {}
    for a in range(W):
        if a == 0:
            for b in range(W):
                if b == 1:
                    law.update({(0, 1, c): p[()][0] * p[(0,)][1] * p[(0, 1)][c] for c in range(W)})
                else:
                    law[(0, b)] = p[()][0] * p[(0,)][b]
        elif a == 1:
            law.update({(1, c): p[()][1] * p[(1,)][c] for c in range(W)})
        else:
            law[(a,)] = p[()][a]
    return law


def walked(n):
    torch.manual_seed(99)
    tree = DraftTree(BRANCHES)
    rows = torch.tensor([NODE_ROWS[()], NODE_ROWS[(0,)], NODE_ROWS[(0, 1)], NODE_ROWS[()], NODE_ROWS[(1,)]])
    reqs = [Req(f"u{i}", [1], SamplingParams(temperature=1.0, max_new_tokens=64, ignore_eos=True)) for i in range(n)]
    got = [[] for _ in range(n)]

    def commit(i, out, row, node):
        got[i].append(int(out.next_token_ids[row]))
        return True

    walk_trees(rows.repeat(n, 1), reqs, [tree] * n, [5 * i for i in range(n)], commit, None)
    return [tuple(g) for g in got]


def chi_square_p(outcomes, law):
    from scipy.stats import chisquare

    keys = sorted(law)
    hist = {k: 0 for k in keys}
    for o in outcomes:
        hist[o] += 1
    n = len(outcomes)
    return chisquare([hist[k] for k in keys], [law[k] * n for k in keys]).pvalue


def test_the_walk_keeps_the_target_distribution():
    law = tree_law()
    assert abs(sum(law.values()) - 1) < 1e-9
    assert chi_square_p(walked(6000), law) > 1e-3


def test_the_chi_square_rejects_a_walk_that_reads_the_wrong_row():
    from unittest import mock

    # the mutant forgets the home branch: node (1,) samples from branch 0's row at its depth, node (0,)'s
    with mock.patch.object(DraftTree, "row", lambda self, n: self.depth[n]):
        outcomes = walked(6000)
    assert chi_square_p(outcomes, tree_law()) < 1e-3


# --------------------------------------------------------------------------------------------------------- the flags
def tree_args(**kw):
    from sglang.srt.server_args import ServerArgs

    return ServerArgs(model_path="/m", speculative_algorithm="STANDALONE", speculative_draft_model_path="/d",
                      speculative_eagle_topk=2, **kw)


def test_tree_flags_resolve_and_refuse_naming_the_flags():
    import pytest

    cfg = tree_args().speculative()
    assert (cfg.topk, cfg.num_steps, cfg.num_draft_tokens) == (2, 3, 7)  # every node of a full beam, + 1
    assert tree_args(speculative_num_draft_tokens=5).speculative().num_draft_tokens == 5
    refusals = [(dict(page_size=16), ["--speculative-eagle-topk 2", "--page-size 16"]),
                (dict(speculative_num_draft_tokens=8), ["--speculative-num-draft-tokens 8", "[2, 7]"])]
    for kw, named in refusals:
        with pytest.raises(ValueError) as e:
            tree_args(**kw)
        assert all(n in str(e.value) for n in named), str(e.value)
    from sglang.srt.server_args import ServerArgs

    for algo in ("EAGLE", "EAGLE3", "NEXTN"):  # the heads' beams (speculative/eagle_beam.py): trees too
        path = None if algo == "NEXTN" else "/d"
        cfg = ServerArgs(model_path="/m", speculative_algorithm=algo, speculative_draft_model_path=path,
                         speculative_eagle_topk=2).speculative()
        assert (cfg.algorithm, cfg.topk, cfg.num_draft_tokens) == (algo, 2, 7)
    with pytest.raises(ValueError, match="--speculative-num-steps / --speculative-eagle-topk apply to draft models"):
        ServerArgs(model_path="/m", speculative_algorithm="NGRAM", speculative_eagle_topk=2)  # no draft: no beam


# ----------------------------------------------------------------------------------------- STANDALONE through Engine
GREEDY = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
# with most proposals accepted a request lives few steps: 128 new tokens keep all 8 running after the 4-token-chunk
# prefills, over the 256-token pool (with 32 the speculative run may never retract)
RETRACT_NEW = 128


class TestStandaloneTreeEngine(unittest.TestCase):
    """One engine: a random 2-layer Llama target (fp32) with itself as the draft (most proposals accepted, and the
    beam's best path is not always the greedy one, so some steps commit through a side branch), top-k 3, a 4-token
    chunked prefill and a 256-token pool; top-k 2 by setting the tree step's width on the same engine."""

    @classmethod
    def setUpClass(cls):
        from transformers import AutoTokenizer

        from sglang import Engine
        from sglang.test.engine_fixtures import default_model_dir

        from test_spec_standalone_engine import make_llama

        cls.tmp = tempfile.TemporaryDirectory()
        tok = AutoTokenizer.from_pretrained(default_model_dir())
        cls.vocab = (len(tok) + 63) // 64 * 64
        target = make_llama(os.path.join(cls.tmp.name, "target"), cls.vocab, 2, 0, tok)
        with open(os.path.join(target, "config.json")) as f:
            config = json.load(f)
        config["eos_token_id"] = tok.eos_token_id  # a grammar needs a stop token (the other runs ignore EOS)
        with open(os.path.join(target, "config.json"), "w") as f:
            json.dump(config, f)
        cls.engine = Engine(model_path=target, dtype="float32", speculative_algorithm="STANDALONE",
                            speculative_draft_model_path=target, speculative_eagle_topk=3, speculative_num_steps=3,
                            chunked_prefill_size=4, max_total_tokens=256, log_level="warning")

    @classmethod
    def tearDownClass(cls):
        from sglang.test.engine_fixtures import shutdown

        shutdown(cls.engine)
        cls.tmp.cleanup()

    def generate(self, prompts, **sp):
        from sglang.test.engine_fixtures import assert_idle_and_intact

        out = self.engine.generate(prompts, [dict(GREEDY, **sp) for _ in prompts])
        assert_idle_and_intact(self.engine)  # nothing held: no slot or request row leaked
        return out

    def test_greedy_tokens_equal_decoding_without_speculation(self):
        from sglang.test.engine_fixtures import PROMPTS
        from sglang.test.retraction_checks import retraction_prompts, run_retraction
        from sglang.test.spec_fixtures import spec_off

        spec = self.engine.scheduler.runner.spec
        self.assertEqual((spec.cfg.topk, spec.cfg.num_draft_tokens, spec.tree.max_rows), (3, 10, 12))
        retract = retraction_prompts(self.vocab)
        with spec_off(self.engine):
            ref_retract, _ = run_retraction(self.engine, retract, RETRACT_NEW)  # from the fresh engine's empty pool
            ref = self.generate(PROMPTS)
            stop = ref[0]["text"][len(ref[0]["text"]) // 2:][:6]
            ref_stop = self.generate(PROMPTS[:1], stop=[stop])
        want = [o["output_ids"] for o in ref]
        for topk in (3, 2):
            spec.tree.topk = topk
            side, counters = spec.tree.side_branch_commits, dict(spec.counters.to_dict())
            outs, retractions = run_retraction(self.engine, retract, RETRACT_NEW)
            self.assertEqual(outs, ref_retract, topk)
            self.assertGreater(retractions, 0, topk)
            got = self.generate(PROMPTS)
            self.assertEqual([o["output_ids"] for o in got], want, topk)
            self.assertTrue(all(o["meta_info"]["spec_verify_ct"] > 0 for o in got), topk)
            hit = self.generate(PROMPTS[:2])  # their prompts are cached now
            self.assertEqual([o["output_ids"] for o in hit], want[:2], topk)
            stopped = self.generate(PROMPTS[:1], stop=[stop])
            self.assertEqual(stopped[0]["text"], ref_stop[0]["text"], topk)
            self.assertEqual(stopped[0]["meta_info"]["finish_reason"]["type"], "stop")
            now = spec.counters.to_dict()
            self.assertGreater(now["accepted_tokens"] - counters["accepted_tokens"], 50, topk)
            self.assertGreater(spec.tree.side_branch_commits, side, topk)

    def test_json_schema_equals_decoding_without_speculation_and_parses(self):
        import jsonschema

        from sglang.test.spec_fixtures import spec_off

        spec = self.engine.scheduler.runner.spec
        spec.tree.topk = 3
        prompts = ['Answer in JSON: {"color": "', "The three primary colors are"]
        params = [{"temperature": 0, "max_new_tokens": 48, "json_schema": json.dumps(SCHEMA)} for _ in prompts]
        with spec_off(self.engine):
            ref = self.engine.generate(prompts, params)
        steps, faults = spec.counters.verify_steps, self.engine.scheduler.fault_policy.num_faults
        got = self.engine.generate(prompts, params)
        # no verify step fell back to a decode (a fault there is confined, and the decode's tokens would match)
        self.assertEqual(self.engine.scheduler.fault_policy.num_faults, faults)
        from sglang.test.engine_fixtures import assert_idle_and_intact

        assert_idle_and_intact(self.engine)
        self.assertEqual([o["output_ids"] for o in got], [o["output_ids"] for o in ref])
        self.assertGreater(spec.counters.verify_steps, steps)
        for o in got:
            self.assertGreater(o["meta_info"]["spec_verify_ct"], 0)
            jsonschema.validate(json.loads(o["text"]), SCHEMA)  # the grammar held on every committed token


SCHEMA = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "n": {"type": "boolean"}},
          "required": ["color", "n"], "additionalProperties": False}


if __name__ == "__main__":
    unittest.main()
