"""EAGLE-3 and EAGLE-1 draft heads served (issue 44), through sglang.Engine on CPU with a random 6-layer Llama target
(fp32, the default model's tokenizer) and random heads in the published layout (sglang.test.eagle_heads): one
Engine per algorithm, every step proposing (the adaptive policy's pauses patched out, so every decode verifies).

- EAGLE3 (a 4-token prefill chunk, a 256-token pool): greedy tokens == the same engine's without speculation on 8
  prompts, a prefix hit, the retraction scenario (retraction_checks), a JSON-schema request, a stop string; proposals
  were made; the head's proposals == a plain-torch reference forward of the same head weights over HF transformers'
  features of the target (sglang.test.eagle_reference: full causal attention, no paged KV) -- which fails if the
  head reads the wrong layers' features, skips a catch-up, or ignores its vocabulary map d2t; the draft pool and the
  head's tensors == the plan's draft_kv_cache / draft_weights terms, == `sglang plan --json` with the same flags.
- EAGLE (a 2-layer head, the first without input_layernorm; a 1 GB memory cap): greedy == without, proposals ==
  the reference, and the plan of the real start == `sglang plan`'s within 3% of the KV tokens.
"""

import json
import os
import tempfile
import unittest

from sglang import Engine
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import PROMPTS, assert_idle_and_intact, shutdown
from sglang.test.spec_fixtures import spec_off

register_cpu_ci(est_time=200, suite="cpu")

GREEDY = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
AUX_LAYERS = [0, 2, 4]  # of the 6-layer target
SCHEMA = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "n": {"type": "boolean"}},
          "required": ["color", "n"], "additionalProperties": False}


def always_propose(engine) -> None:
    """Every request proposes its full chain every step (no pause after a rejection: a random head is rejected)."""
    policy = engine.scheduler.runner.spec.policy
    policy.max_k = lambda reqs: [max(0, min(policy.max_proposals, r.remaining_new_tokens() - 1)) for r in reqs]


def record_proposals(engine, log):
    """Wrap the proposer: each non-empty proposal with the request's tokens up to its last one (position kv_len)."""
    prop = engine.scheduler.runner.spec.proposer
    inner = prop.propose

    def propose(reqs, max_k):
        out = inner(reqs, max_k)
        for r, p in zip(reqs, out):
            if p:
                log.append((list(r.fill_ids[: r.kv_len + 1]), r.kv_len, list(p)))
        return out

    prop.propose = propose
    return inner


def unique_prompts(vocab: int, n: int, seed: int):
    """Token prompts sharing no first token with each other or the other prompts (no radix-cache prefix: the
    head's draft KV of every position is then its own)."""
    import random

    rng = random.Random(seed)
    return [[30000 + 97 * i + seed] + [rng.randrange(100, vocab) for _ in range(9 + i)] for i in range(n)]


class Base(unittest.TestCase):
    algorithm, head_kw, engine_kw = None, {}, {}

    @classmethod
    def setUpClass(cls):
        from transformers import AutoTokenizer

        from sglang.test.eagle_heads import make_eagle3_head, make_eagle_head, make_llama_target
        from sglang.test.engine_fixtures import default_model_dir

        cls.tmp = tempfile.TemporaryDirectory()
        tok = AutoTokenizer.from_pretrained(default_model_dir())
        cls.target = make_llama_target(os.path.join(cls.tmp.name, "target"), tok)
        make = make_eagle3_head if cls.algorithm == "EAGLE3" else make_eagle_head
        cls.head = make(os.path.join(cls.tmp.name, "head"), cls.target, seed=1, **cls.head_kw)
        cls.vocab = (len(tok) + 63) // 64 * 64
        cls.engine = Engine(model_path=cls.target, dtype="float32", speculative_algorithm=cls.algorithm,
                            speculative_draft_model_path=cls.head, log_level="warning", **cls.engine_kw)
        always_propose(cls.engine)

    @classmethod
    def tearDownClass(cls):
        shutdown(cls.engine)
        cls.tmp.cleanup()

    def counters(self):
        return self.engine.scheduler.runner.spec.counters

    def same_as_without(self, prompts, params, by="output_ids", **kw):
        e = self.engine
        before = self.counters().proposed_tokens
        got = e.generate(prompts, params, **kw)
        assert_idle_and_intact(e)
        proposed = self.counters().proposed_tokens - before
        with spec_off(e):
            ref = e.generate(prompts, params, **kw)
        self.assertEqual([o[by] for o in got], [o[by] for o in ref])
        self.assertGreater(proposed, 0)
        return got, ref

    def check_reference(self, n_prompts: int, min_checked: int):
        """The head's proposals, recorded in a run of fresh prompts, == the plain-torch reference."""
        from sglang.test.eagle_reference import HeadReference

        log = []
        spec = self.engine.scheduler.runner.spec
        prop, policy = spec.proposer, spec.policy
        inner, every_step = record_proposals(self.engine, log), policy.max_k
        steps = [0]

        def some_steps(reqs):  # every third step decodes without proposals: the decode catch-up runs too
            steps[0] += 1
            return [0] * len(reqs) if steps[0] % 3 == 0 else every_step(reqs)

        policy.max_k = some_steps
        try:
            prompts = unique_prompts(self.vocab, n_prompts, seed=len(self.algorithm))
            outs = self.engine.generate(input_ids=prompts, sampling_params=dict(GREEDY, max_new_tokens=16))
        finally:
            prop.propose, policy.max_k = inner, every_step
        ref = HeadReference(self.head, self.target)
        full = {tuple(p): p + o["output_ids"] for p, o in zip(prompts, outs)}
        feats = {k: ref.features(v) for k, v in full.items()}
        checked = 0
        for seq, p, got in log:
            key = next(k for k in full if tuple(seq[: len(k)]) == k)
            self.assertEqual(got, ref.proposals(full[key], feats[key], p, len(got)), (key[:3], p))
            checked += len(got)
        self.assertGreaterEqual(checked, min_checked)

    def test_greedy_equals_without_on_8_prompts_and_a_prefix_hit(self):
        got, ref = self.same_as_without(PROMPTS, [dict(GREEDY) for _ in PROMPTS])
        hit = self.engine.generate(PROMPTS[:2], [dict(GREEDY) for _ in PROMPTS[:2]])  # cached prefixes
        self.assertEqual([o["output_ids"] for o in hit], [o["output_ids"] for o in ref[:2]])
        self.assertTrue(all(o["meta_info"]["spec_verify_ct"] > 0 for o in got))

    def test_proposals_equal_the_plain_torch_reference(self):
        self.check_reference(3, 40)


class TestEagle3Engine(Base):
    algorithm = "EAGLE3"
    head_kw = {"aux_layer_ids": AUX_LAYERS}
    engine_kw = {"chunked_prefill_size": 4, "max_total_tokens": 256}

    def test_retraction_changes_no_token(self):
        from sglang.test.retraction_checks import retraction_prompts, run_retraction

        prompts = retraction_prompts(self.vocab)
        before = self.counters().proposed_tokens
        got, retractions = run_retraction(self.engine, prompts)
        self.assertGreater(retractions, 0)
        self.assertGreater(self.counters().proposed_tokens, before)
        with spec_off(self.engine):
            ref, _ = run_retraction(self.engine, prompts)
        self.assertEqual(got, ref)

    def test_json_schema_and_stop_string(self):
        params = {"temperature": 0, "max_new_tokens": 32, "json_schema": json.dumps(SCHEMA)}
        got, _ = self.same_as_without(['Answer in JSON: {"color": "'], [params])
        json.loads(got[0]["text"])
        plain = self.engine.generate("The quick brown fox", dict(GREEDY))["text"]
        stop = plain[len(plain) // 2: len(plain) // 2 + 3]  # a string the greedy text reaches mid-way
        params = dict(GREEDY, stop=[stop])
        got, _ = self.same_as_without(["The quick brown fox"], [params], by="text")
        self.assertLess(len(got[0]["text"]), len(plain))

    def test_plan_terms_are_the_allocation(self):
        from sglang.cli.plan import run

        runner = self.engine.scheduler.model_runner
        plan, draft = runner.memory_plan, runner.draft_runner
        page = runner.server_args.page_size
        # one layer x 2 KV heads x 16 dims, K and V, fp32: 256 B a slot, over the target's slots and the dummy page
        self.assertEqual(draft.kv_bytes(), plan.bytes_of("draft_kv_cache"))
        self.assertEqual(draft.kv_bytes(), 256 * (plan.max_total_num_tokens + page))
        self.assertEqual(draft.weight_bytes, plan.bytes_of("draft_weights"))  # head tensors, maps, rope table
        self.assertEqual(plan.bytes_of("draft_cuda_graphs"), 0)
        flags = ["--model-path", self.target, "--dtype", "float32", "--speculative-algorithm", "EAGLE3",
                 "--speculative-draft-model-path", self.head, "--max-total-tokens", "256", "--chunked-prefill-size", "4"]
        status, result, _ = run(["--device", "cpu"] + flags + ["--json"])
        self.assertEqual(status, 0)
        dry = {t["name"]: t["num_bytes"] for t in result["plan"]["terms"]}
        for name in ("draft_weights", "draft_kv_cache", "spec_hidden_states", "draft_cuda_graphs"):
            self.assertEqual(dry[name], plan.bytes_of(name), name)


class TestEagle1Engine(Base):
    algorithm = "EAGLE"
    head_kw = {"layers": 2}
    engine_kw = {"max_total_memory_gb": 1}

    def test_plan_equals_a_real_start(self):
        from sglang.cli.plan import run

        flags = ["--model-path", self.target, "--dtype", "float32", "--speculative-algorithm", "EAGLE",
                 "--speculative-draft-model-path", self.head, "--max-total-memory-gb", "1"]
        status, result, _ = run(["--device", "cpu"] + flags + ["--json"])
        self.assertEqual(status, 0)
        runner = self.engine.scheduler.model_runner
        plan, draft = runner.memory_plan, runner.draft_runner
        self.assertEqual(draft.kv_bytes(), plan.bytes_of("draft_kv_cache"))
        self.assertEqual(draft.kv_bytes(), 2 * 256 * (plan.max_total_num_tokens + runner.server_args.page_size))
        self.assertEqual(draft.weight_bytes, plan.bytes_of("draft_weights"))
        ratio = plan.max_total_num_tokens / result["plan"]["max_total_num_tokens"]
        self.assertLess(abs(ratio - 1), 0.03, (plan.max_total_num_tokens, result["plan"]["max_total_num_tokens"]))


del Base  # not collected itself

if __name__ == "__main__":
    unittest.main()
