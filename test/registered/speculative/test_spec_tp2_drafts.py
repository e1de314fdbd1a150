"""Draft models and heads with --tp-size 2 (issue 44): the draft runs on TP rank 0 alone, unsharded
(model_executor/draft_runner.py, parallel_state.single_rank_view), beside a target sharded over two CPU ranks.

For STANDALONE (a random 2-layer Llama draft of a random 6-layer Llama target) and EAGLE3 / EAGLE (random heads in
the published layout, sglang.test.eagle_heads; EAGLE reads the target's lm_head, gathered whole onto rank 0) and
NEXTN (a random DeepSeek-V3 with one MTP layer, sglang.test.deepseek_mtp: MLA, MoE), each on one tp=2 Engine (fp32,
every step proposing):
  * greedy output_ids == the same engine's without speculation (spec_off) on 4 prompts, output logprobs within
    1e-4, proposals made and verify steps run (spec_verify_steps > 0), the engine idle and intact after;
  * rank 0's draft is a tp=1 draft: every proposal equals a tp=1 start's of the same flags on the same prompts;
  * plan == start: rank 0's draft pool == the start plan's draft_kv_cache term, its cell == `sglang plan --tp-size
    2`'s and unsharded (every KV head), the KV tokens within 3%; the draft's tensors on rank 0 (a head's with the
    whole target tables it reads) == the draft_weights term == the dry run's; both terms say they are rank 0's.
single_rank_view is the calling thread's alone (another thread keeps the real group). `sglang plan` alone for
Llama-3.1-8B + the published EAGLE3 head's config on an H100: the tp=2 draft cell == tp=1's, draft_weights == tp=1's
+ the whole embedding. A draft forward that reached a collective would wait forever for ranks that never join it: a
watchdog ends the process (exit 1, tracebacks with -s) after WATCHDOG_S.
"""

import faulthandler
import os
import tempfile
import unittest

import torch

from sglang import Engine
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import assert_idle_and_intact, shutdown
from sglang.test.spec_fixtures import spec_off

register_cpu_ci(est_time=110, suite="cpu")

VOCAB = 512
PROMPTS = [[5, 17, 300, 42, 9, 5, 17, 300, 42, 9, 5, 17], [7] * 12, list(range(20, 40)) * 2, [101, 3, 77, 250, 9]]
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
# a collective reached from rank 0's draft forward waits for ranks that never join it: the process is ended (with
# every thread's traceback) instead of hanging; one test takes ~15 s
WATCHDOG_S = 180


class _Tok:
    """What eagle_heads.make_llama_target reads of a tokenizer (the engines run with skip_tokenizer_init)."""
    eos_token_id, bos_token_id = 1, 0

    def __len__(self):
        return VOCAB

    def save_pretrained(self, path):
        pass


def always_propose(engine) -> None:
    policy = engine.scheduler.runner.spec.policy
    policy.max_k = lambda reqs: [max(0, min(policy.max_proposals, r.remaining_new_tokens() - 1)) for r in reqs]


def flags(target, algorithm, draft, tp):
    return ["--model-path", target, "--dtype", "float32", "--skip-tokenizer-init", "--tp-size", str(tp),
            "--max-total-memory-gb", "0.5", "--speculative-algorithm", algorithm,
            "--speculative-draft-model-path", draft, "--speculative-num-steps", "3",
            "--speculative-num-draft-tokens", "4"]


class Tp2Case:  # the tests, on unittest.TestCase subclasses below
    algorithm = None

    @classmethod
    def setUpClass(cls):
        from sglang.test.eagle_heads import make_eagle3_head, make_eagle_head, make_llama_target

        cls.tmp = tempfile.TemporaryDirectory()
        if cls.algorithm == "NEXTN":  # the MTP layer is the target checkpoint's layer L
            from sglang.test.deepseek_mtp import save_v3_with_mtp

            cls.target = cls.draft = save_v3_with_mtp(os.path.join(cls.tmp.name, "v3"), 2, vocab=VOCAB)
            return
        cls.target = make_llama_target(os.path.join(cls.tmp.name, "target"), _Tok())
        draft = os.path.join(cls.tmp.name, "draft")
        if cls.algorithm == "STANDALONE":
            make_llama_target(draft, _Tok(), layers=2, seed=3)
        else:
            (make_eagle3_head if cls.algorithm == "EAGLE3" else make_eagle_head)(draft, cls.target, seed=1)
        cls.draft = draft

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def start(self, tp):
        from sglang.srt.server_args import prepare_server_args

        e = Engine(server_args=prepare_server_args(flags(self.target, self.algorithm, self.draft, tp)
                                                   + ["--log-level", "warning"]))
        self.engines.append(e)
        always_propose(e)
        return e

    def setUp(self):
        self.engines = []
        faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)

    def tearDown(self):
        for e in self.engines:
            shutdown(e)
        faulthandler.cancel_dump_traceback_later()

    def proposals(self, engine):
        """Every proposal the engine's proposer makes while decoding PROMPTS greedily."""
        log, prop = [], engine.scheduler.runner.spec.proposer
        inner = prop.propose

        def propose(reqs, max_k):
            out = inner(reqs, max_k)
            log.extend((tuple(r.fill_ids[: r.kv_len + 1]), tuple(p)) for r, p in zip(reqs, out) if p)
            return out

        prop.propose = propose
        try:
            outs = engine.generate(input_ids=PROMPTS, sampling_params=[dict(GREEDY) for _ in PROMPTS],
                                   return_logprob=True)
        finally:
            prop.propose = inner
        return outs, sorted(log)

    def test_tp2_greedy_exact_plan_matches_start_and_proposals_match_tp1(self):
        from sglang.cli.plan import run

        e = self.start(2)
        got, proposed = self.proposals(e)
        assert_idle_and_intact(e)
        self.assertGreater(e.scheduler.get_stats()["spec_verify_steps"], 0)
        self.assertTrue(proposed)
        with spec_off(e):
            want = e.generate(input_ids=PROMPTS, sampling_params=[dict(GREEDY) for _ in PROMPTS], return_logprob=True)
        for a, b in zip(got, want):
            self.assertEqual(a["output_ids"], b["output_ids"])
            for x, y in zip(a["meta_info"]["output_token_logprobs"], b["meta_info"]["output_token_logprobs"]):
                self.assertLessEqual(abs(x[0] - y[0]), 1e-4)
        # plan == start: rank 0's draft against the start's plan and the dry run's
        runner = e.scheduler.model_runner
        plan, draft = runner.memory_plan, runner.draft_runner
        status, result, _ = run(["--device", "cpu", *flags(self.target, self.algorithm, self.draft, 2), "--json"])
        self.assertEqual(status, 0, result)
        dry = {t["name"]: t for t in result["plan"]["terms"]}
        self.assertEqual(draft.kv_bytes(), plan.bytes_of("draft_kv_cache"))
        tokens, dry_tokens = plan.max_total_num_tokens, result["plan"]["max_total_num_tokens"]
        self.assertLess(abs(tokens / dry_tokens - 1), 0.03, (tokens, dry_tokens))
        cell = draft.kv_bytes() // (tokens + 1)  # page size 1: one dummy slot
        self.assertEqual(cell * (tokens + 1), draft.kv_bytes())
        self.assertEqual(cell * (dry_tokens + 1), dry["draft_kv_cache"]["num_bytes"])
        self.assertEqual(cell, self.cell_bytes)  # every KV head of every draft layer, fp32 K and V
        self.assertIn("unsharded on TP rank 0 alone", dry["draft_kv_cache"]["detail"])
        self.assertEqual(plan.bytes_of("draft_weights"), dry["draft_weights"]["num_bytes"])
        # the draft's tensors on rank 0 (a head's: with the gathered whole target tables) == the planned term
        self.assertEqual(draft.weight_bytes, plan.bytes_of("draft_weights"))
        self.assertIn("unsharded, on TP rank 0 alone", dry["draft_weights"]["detail"])
        # rank 0's draft is a tp=1 draft: the same proposals as a tp=1 start
        shutdown(self.engines.pop())
        _, proposed1 = self.proposals(self.start(1))
        self.assertEqual(proposed, proposed1)


# draft KV bytes per token: layers x 2 KV heads x 16 x (K, V) x 4 B (tp=2 sharding would halve it)
class TestStandaloneTp2(Tp2Case, unittest.TestCase):
    algorithm, cell_bytes = "STANDALONE", 2 * 2 * 16 * 2 * 4


class TestEagle3Tp2(Tp2Case, unittest.TestCase):
    algorithm, cell_bytes = "EAGLE3", 1 * 2 * 16 * 2 * 4


class TestEagleTp2(Tp2Case, unittest.TestCase):
    algorithm, cell_bytes = "EAGLE", 1 * 2 * 16 * 2 * 4


class TestNextnTp2(Tp2Case, unittest.TestCase):
    algorithm, cell_bytes = "NEXTN", 1 * (64 + 16) * 4  # one MLA layer's latent (kv_lora_rank + rope dims), fp32


def test_single_rank_view_is_this_threads_alone():
    """Inside the view this thread sees tp=1 (no group: collectives are the identity); another thread (an overlap
    worker's target forward) still sees the real group meanwhile, and the view ends with the block, nested too."""
    import threading
    from unittest import mock

    from sglang.srt.distributed import communication_op, parallel_state as ps

    group = ps.TpGroup(1, 2, "cpu", object(), object(), ep_size=2)
    seen = {}
    with mock.patch.object(ps, "_TP", group):
        entered, checked = threading.Event(), threading.Event()

        def other():
            entered.wait()
            seen["other"] = (ps.get_tp_size(), ps.get_tp_rank(), ps.get_ep_size(), ps.get_tp_group())
            checked.set()

        t = threading.Thread(target=other)
        t.start()
        with ps.single_rank_view():
            with ps.single_rank_view():
                pass
            seen["view"] = (ps.get_tp_size(), ps.get_tp_rank(), ps.get_ep_size(), ps.get_tp_group())
            x = torch.ones(3)
            assert communication_op.tp_all_gather(x) is x and communication_op.tp_all_reduce(x) is x
            entered.set()
            checked.wait(10)
        t.join(10)
        seen["after"] = (ps.get_tp_size(), ps.get_tp_rank(), ps.get_ep_size(), ps.get_tp_group())
    assert seen["view"] == (1, 0, 1, None)
    assert seen["other"] == seen["after"] == (2, 1, 2, group)


def test_plan_prices_the_draft_unsharded_at_tp2():
    """`sglang plan` for Llama-3.1-8B + the published EAGLE3 head's config on an H100 (bf16): at --tp-size 2 the draft
    cell is tp=1's (every KV head of the head's layer) and draft_weights are tp=1's + the whole embedding the head
    reads (vocab x hidden x 2 B, gathered onto rank 0); both terms say the other rank leaves them unused."""
    from sglang.cli.plan import run

    fixtures = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mem_plan", "fixtures")
    target, head = os.path.join(fixtures, "llama-3.1-8b"), os.path.join(fixtures, "eagle3-llama3.1-instruct-8b")
    plans = {}
    for tp in (1, 2):
        status, result, _ = run(["--model-path", target, "--gpu", "h100-80gb", "--tp-size", str(tp),
                                 "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", head, "--json"])
        assert status == 0, result
        plans[tp] = result["plan"]
    term = {tp: {t["name"]: t for t in p["terms"]} for tp, p in plans.items()}
    cell = {tp: term[tp]["draft_kv_cache"]["num_bytes"] // (plans[tp]["max_total_num_tokens"] + 1) for tp in plans}
    layers, kv_heads, head_dim = 1, 8, 128  # the head's config.json
    assert cell[1] == cell[2] == layers * kv_heads * head_dim * 2 * 2
    vocab, hidden = 128256, 4096  # the target's embedding
    assert term[2]["draft_weights"]["num_bytes"] == term[1]["draft_weights"]["num_bytes"] + vocab * hidden * 2
    for name in ("draft_kv_cache", "draft_weights"):
        assert "TP rank 0 alone" in term[2][name]["detail"] and "unused" in term[2][name]["detail"]
        assert "rank 0" not in term[1][name]["detail"]


if __name__ == "__main__":
    unittest.main()
