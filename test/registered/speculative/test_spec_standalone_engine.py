"""STANDALONE speculative decoding (issue 44): the draft model runner and its proposer, on CPU with random models.

- DraftRunner over a started engine's pools: the draft's KV pool has the target's slot range and shares its request
  table; a draft whose vocabulary differs from the target's is refused, naming both sizes.
- DraftProposer, driven through the scheduler's sequence of calls by hand (prefill in two chunks, then propose /
  verify rounds with every outcome: a rejection after one accepted proposal, all proposals accepted (the catch-up
  holds two tokens), steps decoded without proposals (a longer catch-up), per-request proposal caps of 0..3), on
  scattered slots: every proposal chain equals HF's fp32 greedy choices of the draft model after the request's text.
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
from sglang.test.engine_fixtures import shutdown
from sglang.test.hf_greedy_reference import teacher_forced_choices

register_cpu_ci(est_time=40, suite="cpu")

PROMPTS = ["The three primary colors are", "def fibonacci(n):", "Once upon a time, in a small village,"]


def make_llama(path: str, vocab: int, layers: int, seed: int, tok) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
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

    def test_proposals_are_the_drafts_greedy_choices(self):
        from sglang.srt.speculative.draft_proposer import DraftProposer

        target = self.engine.scheduler.model_runner
        r2t = target.req_to_token_pool
        proposer = DraftProposer(self.draft_runner(self.draft), num_steps=3, max_extend_tokens=16)
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
                  ([3, 3, 3], "reject_after_1"), ([3, 3, 3], "accept_all")]
        checked = 0
        for caps, outcome in rounds:
            # a step without proposals (the adaptive policy, no free pages) does not call the proposer
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


if __name__ == "__main__":
    unittest.main()
