"""STANDALONE speculative decoding (issue 44): the draft model runner and its proposer, on CPU with random models.

- DraftRunner over a started engine's pools: the draft's KV pool has the target's slot range and shares its request
  table; a draft whose vocabulary differs from the target's, or whose context is shorter, is refused naming both.
- DraftProposer, driven through the scheduler's sequence of calls by hand (prefill in two chunks, then propose /
  verify rounds with every outcome: a rejection after one accepted proposal, all proposals accepted (the catch-up
  holds two tokens), steps decoded without proposals (a longer catch-up), a draft forward that fails (no proposals
  that step, then proposals resume), per-request proposal caps of 0..3, draft extends split into 4-token forwards),
  on scattered slots: every proposal chain equals HF's fp32 greedy choices of the draft model after the text.
"""

import os
import random
import tempfile
import unittest
from dataclasses import dataclass, field
from typing import List, Optional

import torch

from sglang import Engine
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import PROMPTS as ENGINE_PROMPTS
from sglang.test.engine_fixtures import shutdown
from sglang.test.hf_greedy_reference import teacher_forced_choices

register_cpu_ci(est_time=80, suite="cpu")

PROMPTS = ["The three primary colors are", "def fibonacci(n):", "Once upon a time, in a small village,"]


def make_llama(path: str, vocab: int, layers: int, seed: int, tok, context: int = 512) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=context,
                      tie_word_embeddings=False, eos_token_id=None, bos_token_id=tok.bos_token_id,
                      initializer_range=0.3)
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


@dataclass
class FakeReq:
    """The fields of managers/schedule_batch.Req a proposer reads."""

    rid: str
    origin_input_ids: List[int]
    req_pool_idx: Optional[int]
    output_ids: List[int] = field(default_factory=list)
    kv_len: int = 0

    @property
    def fill_ids(self) -> List[int]:
        return self.origin_input_ids + self.output_ids

    def finished(self) -> bool:
        return False


class FailingRunner:
    """A DraftRunner whose fail_at-th forward (extend or decode) raises before it runs."""

    def __init__(self, runner, fail_at: int):
        self.runner, self.fail_at, self.calls = runner, fail_at, 0

    def _call(self, name, *args):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("injected draft fault")
        return getattr(self.runner, name)(*args)

    def extend_argmax(self, *args):
        return self._call("extend_argmax", *args)

    def decode_argmax(self, *args):
        return self._call("decode_argmax", *args)


class TestStandaloneDraft(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from transformers import AutoTokenizer

        from sglang.test.engine_fixtures import default_model_dir

        cls.tmp = tempfile.TemporaryDirectory()
        tok = AutoTokenizer.from_pretrained(default_model_dir())
        cls.tok = tok
        vocab = (len(tok) + 63) // 64 * 64
        cls.target = make_llama(os.path.join(cls.tmp.name, "target"), vocab, 2, 0, tok)
        cls.draft = make_llama(os.path.join(cls.tmp.name, "draft"), vocab, 1, 1, tok)
        cls.bad_draft = make_llama(os.path.join(cls.tmp.name, "bad"), vocab + 64, 1, 2, tok)
        cls.short_draft = make_llama(os.path.join(cls.tmp.name, "short"), vocab, 1, 2, tok, context=256)
        cls.engine = Engine(model_path=cls.target, max_total_tokens=2048, dtype="float32", log_level="warning")

    @classmethod
    def tearDownClass(cls):
        shutdown(cls.engine)
        cls.tmp.cleanup()

    def draft_runner(self, path):
        from sglang.srt.model_executor.draft_runner import DraftRunner

        return DraftRunner(self.engine.scheduler.model_runner, path)

    def test_pool_shares_the_targets_slots_and_table(self):
        target = self.engine.scheduler.model_runner
        d = self.draft_runner(self.draft)
        self.assertIs(d.req_to_token_pool, target.req_to_token_pool)
        self.assertEqual(d.token_to_kv_pool.k_buffer.shape[1], target.token_to_kv_pool.k_buffer.shape[1])
        # 1 layer x 2 KV heads x 16 dims, K and V, fp32: 256 B a slot, over the target's rows (the dummy page too)
        self.assertEqual(d.kv_bytes(), 256 * target.token_to_kv_pool.k_buffer.shape[1])

    def test_refuses_a_draft_with_another_vocabulary(self):
        n = (len(self.tok) + 63) // 64 * 64
        with self.assertRaises(ValueError) as cm:
            self.draft_runner(self.bad_draft)
        msg = str(cm.exception)
        self.assertIn(f"{n + 64} tokens", msg)
        self.assertIn(f"the target's {n}", msg)

    def test_refuses_a_draft_with_a_shorter_context(self):
        with self.assertRaises(ValueError) as cm:
            self.draft_runner(self.short_draft)
        self.assertIn("context length is 256 tokens, the target's 512; pass --context-length 256", str(cm.exception))

    def test_proposals_are_the_drafts_greedy_choices(self):
        from sglang.srt.speculative.draft_proposer import DraftProposer

        target = self.engine.scheduler.model_runner
        r2t = target.req_to_token_pool
        proposer = DraftProposer(self.draft_runner(self.draft), num_steps=3, max_extend_tokens=4)
        rng = random.Random(0)
        # scattered slots: a position's slot is whatever the table says, never its index
        free = list(range(target.server_args.page_size, target.max_total_num_tokens))
        rng.shuffle(free)
        reqs = []
        for i, text in enumerate(PROMPTS):
            row = r2t.alloc()
            r2t.write(row, 0, free[i * 128:(i + 1) * 128])
            reqs.append(FakeReq(f"r{i}", self.tok.encode(text), row))
        try:
            self.drive(proposer, reqs, rng)
        finally:
            for r in reqs:
                r2t.free(r.req_pool_idx)

    def drive(self, proposer, reqs, rng):
        # prefill in two chunks (the second batched across the requests), the target's first token appended
        proposer.on_extend([(self.advance(r, 4), 4) for r in reqs])
        proposer.on_extend([(self.advance(r, len(r.origin_input_ids) - 4), len(r.origin_input_ids) - 4)
                            for r in reqs])
        for r in reqs:
            r.output_ids.append(rng.randrange(1000))
        rounds = [([3, 3, 3], "reject_after_1"), ([3, 2, 1], "accept_all"), ([0, 0, 0], "decode"),
                  ([0, 0, 0], "decode"), ([3, 3, 3], "reject_first"), ([2, 0, 3], "accept_all"),
                  ([3, 3, 3], "draft_fault"), ([3, 3, 3], "reject_after_1"), ([3, 3, 3], "accept_all")]
        checked = 0
        for caps, outcome in rounds:
            # a step without proposals (the adaptive policy, no free pages) does not call the proposer
            if outcome == "draft_fault":  # the draft's second forward fails: no proposals this step
                real = proposer.runner
                proposer.runner = FailingRunner(real, fail_at=2)
                props = proposer.propose(reqs, caps)
                proposer.runner = real
                self.assertEqual(props, [[], [], []])
            else:
                props = proposer.propose(reqs, caps) if any(caps) else [[] for _ in reqs]
                self.assertEqual([len(p) for p in props], caps)
            want = teacher_forced_choices(self.draft, [r.fill_ids for r in reqs], props)
            for r, p, w in zip(reqs, props, want):
                self.assertEqual(p, w[:len(p)], (r.rid, outcome))
                checked += len(p)
            committed = [self.commit(r, p, outcome, rng) for r, p in zip(reqs, props)]
            proposer.on_verified(reqs, committed)
        self.assertGreaterEqual(checked, 30)

    @staticmethod
    def advance(r, n):
        r.kv_len += n
        return r

    @staticmethod
    def commit(r, props, outcome, rng) -> int:
        """What a verify step leaves: the accepted proposals, then a correction (or the bonus token)."""
        accepted = {"reject_first": 0, "reject_after_1": 1}.get(outcome, len(props))
        toks = props[:accepted]
        toks.append(rng.randrange(1000) if accepted == len(props) else (props[accepted] + 1) % 1000)
        r.kv_len += len(toks)  # x0 and the accepted proposals now hold KV; the new last token has none
        r.output_ids.extend(toks)
        return len(toks)


GREEDY = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}


class TestStandaloneEngine(unittest.TestCase):
    """Through sglang.Engine: greedy tokens with STANDALONE == the same engine's without it (8 prompts, a 4-token
    chunked prefill, a prefix hit, a pool small enough to retract), for a random draft (near-zero acceptance) and for
    the target as its own draft (every proposal accepted: the draft's KV catch-up is right; the overlap schedule too);
    and the plan a start allocates == `sglang plan`'s within 3% of the KV tokens, the draft's pool == the plan's
    draft_kv_cache term."""

    @classmethod
    def setUpClass(cls):
        from transformers import AutoTokenizer

        from sglang.test.engine_fixtures import default_model_dir

        cls.tmp = tempfile.TemporaryDirectory()
        tok = AutoTokenizer.from_pretrained(default_model_dir())
        vocab = (len(tok) + 63) // 64 * 64
        cls.target = make_llama(os.path.join(cls.tmp.name, "target"), vocab, 2, 0, tok)
        cls.draft = make_llama(os.path.join(cls.tmp.name, "draft"), vocab, 1, 1, tok)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def start(self, draft, **kw):
        return Engine(model_path=self.target, dtype="float32", speculative_algorithm="STANDALONE",
                      speculative_draft_model_path=draft, log_level="warning", **kw)

    def same_as_without(self, engine):
        from sglang.test.engine_fixtures import assert_idle_and_intact

        s = engine.scheduler
        retractions = s.num_retractions
        spec = engine.generate(ENGINE_PROMPTS, [dict(GREEDY) for _ in ENGINE_PROMPTS])
        assert_idle_and_intact(engine)
        hit = engine.generate(ENGINE_PROMPTS[:2], [dict(GREEDY) for _ in ENGINE_PROMPTS[:2]])  # cached prefixes
        assert_idle_and_intact(engine)
        retractions = s.num_retractions - retractions
        saved, s.runner.spec = s.runner.spec, None
        try:
            ref = engine.generate(ENGINE_PROMPTS, [dict(GREEDY) for _ in ENGINE_PROMPTS])
        finally:
            s.runner.spec = saved
        self.assertEqual([o["output_ids"] for o in spec], [o["output_ids"] for o in ref])
        self.assertEqual([o["output_ids"] for o in hit], [o["output_ids"] for o in ref[:2]])
        self.assertTrue(all(o["meta_info"]["spec_verify_ct"] > 0 for o in spec))
        self.ref = [o["output_ids"] for o in ref]
        return saved.counters, retractions

    def same_with_overlap(self, engine):
        from sglang.srt.managers.overlap_worker import OverlapSchedule
        from sglang.test.engine_fixtures import assert_idle_and_intact

        s = engine.scheduler
        ov = s.overlap = OverlapSchedule(s.sink)
        try:
            got = engine.generate(ENGINE_PROMPTS, [dict(GREEDY) for _ in ENGINE_PROMPTS])
        finally:
            s.overlap = None
            ov.shutdown()
        assert_idle_and_intact(engine)
        self.assertGreater(ov.num_overlapped_steps, 0)
        self.assertEqual([o["output_ids"] for o in got], self.ref)

    def test_random_draft_changes_no_token(self):
        engine = self.start(self.draft, chunked_prefill_size=4, max_total_tokens=192)
        try:
            counters, retractions = self.same_as_without(engine)
        finally:
            shutdown(engine)
        self.assertGreater(retractions, 0)
        self.assertGreater(counters.proposed_tokens, 0)

    def test_target_as_its_own_draft_is_accepted(self):
        engine = self.start(self.target, chunked_prefill_size=4, max_total_tokens=2048)
        try:
            counters, _ = self.same_as_without(engine)
            self.same_with_overlap(engine)  # several tokens a step, their text decoded while the next step runs
        finally:
            shutdown(engine)
        self.assertGreater(counters.proposed_tokens, 100)
        self.assertGreaterEqual(counters.accepted_tokens, 0.95 * counters.proposed_tokens)

    def test_plan_equals_a_real_start(self):
        from sglang.test.spec_fixtures import assert_plan_matches_start

        flags = ["--model-path", self.target, "--dtype", "float32", "--speculative-algorithm", "STANDALONE",
                 "--speculative-draft-model-path", self.draft, "--max-total-memory-gb", "1"]
        plan, _, engine = assert_plan_matches_start(self, flags)
        runner = engine.scheduler.model_runner
        self.assertEqual(runner.draft_runner.kv_bytes(),
                         256 * (plan.max_total_num_tokens + runner.server_args.page_size))


if __name__ == "__main__":
    unittest.main()
