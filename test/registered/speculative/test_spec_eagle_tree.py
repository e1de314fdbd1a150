"""Tree proposals of the hidden-state heads (--speculative-eagle-topk > 1 with EAGLE3 / EAGLE, issue 44), through
sglang.Engine on CPU (fp32, the default model's tokenizer, every step proposing: always_propose).

- EAGLE3, top-k 3 (a random head over a random 6-layer Llama; 4-token prefill chunks, a 256-token pool): greedy tokens
  == the same engine's without speculation on 8 prompts, a prefix hit, a stop string and the retraction scenario,
  idle and intact after every run (no slot or request row leaked); and every recorded beam (W branches of D tokens)
  == a plain-torch beam (sglang.test.eagle_reference.reference_beam: full causal attention over HF transformers'
  features, every row recomputed) -- which fails if a re-parented beam keeps its own head KV or hidden state.
- EAGLE-1, top-k 3, a head that copies the target: the target's layers add nothing to the residual stream (o_proj and
  down_proj zero: its next token is a function of the last token, its final-normed feature of position q a function
  of the token at q), and the head's fc passes the token's embedding plus a small multiple of the feature, so its
  greedy proposal is almost always the target's and most proposals are accepted; the beam is not always greedy-first,
  so steps commit through a side branch (TreeStep.side_branch_commits). Greedy == without; every recorded beam ==
  the reference beam, its scores within 1e-4 -- which fails if the catch-up after a side-branch commit reads branch 0's
  features (the feature moves the scores by ~1e-2).
"""

import contextlib
import os
import tempfile
import unittest

import torch

from sglang import Engine
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import PROMPTS, assert_idle_and_intact, shutdown
from sglang.test.spec_fixtures import spec_off, uncapped_verify_budget

from test_spec_eagle_engine import AUX_LAYERS, always_propose, unique_prompts

register_cpu_ci(est_time=200, suite="cpu")

GREEDY = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
NEAR_TIE = 1e-4  # candidates closer than this may order differently in two float32 computations
FEATURE_EPS = 0.01  # the copying head's weight on the target's feature


@contextlib.contextmanager
def record_trees(engine, log):
    """Observe propose_tree: per request with branches, (rid, its tokens up to x0, kv_len, width, depth, the branches,
    their cumulative log-probs as eagle_beam.head_beam scored them)."""
    from sglang.srt.speculative import eagle_proposer

    prop, beam = engine.scheduler.runner.spec.proposer, eagle_proposer.head_beam
    inner, scores = prop.propose_tree, []

    def head_beam(*args):
        paths, sc = beam(*args)
        scores.extend(x.tolist() for x in sc)
        return paths, sc

    def propose_tree(reqs, rows, depth):
        scores.clear()
        out = inner(reqs, rows, depth)
        got = iter(scores)
        for r, rs, d, paths in zip(reqs, rows, depth, out):
            if paths:
                log.append((r.rid, list(r.fill_ids[: r.kv_len + 1]), r.kv_len, len(rs), d, [list(p) for p in paths],
                            next(got)))
        return out

    prop.propose_tree, eagle_proposer.head_beam = propose_tree, head_beam
    try:
        yield
    finally:
        del prop.propose_tree
        eagle_proposer.head_beam = beam


def bigram_target(path: str, tok) -> str:
    """make_llama_target with every layer's o_proj and down_proj zero: the residual stream is the token's embedding."""
    from safetensors.torch import load_file, save_file

    from sglang.test.eagle_heads import make_llama_target

    make_llama_target(path, tok)
    f = os.path.join(path, "model.safetensors")
    w = load_file(f)
    for k in w:
        if k.endswith("o_proj.weight") or k.endswith("down_proj.weight"):
            w[k] = torch.zeros_like(w[k])
    save_file(w, f, metadata={"format": "pt"})
    return path


def copying_head(path: str, target: str) -> str:
    """An EAGLE-1 head whose output is embed(token) + FEATURE_EPS * R @ feature: its lm_head (the target's) then
    ranks as the bigram target does, up to the feature's small push."""
    from safetensors.torch import load_file, save_file

    from sglang.test.eagle_heads import make_eagle_head

    make_eagle_head(path, target, seed=3)
    f = os.path.join(path, "model.safetensors")
    w = load_file(f)
    H = w["fc.bias"].shape[0]
    g = torch.Generator().manual_seed(5)
    w["fc.weight"] = torch.cat([torch.eye(H), FEATURE_EPS * torch.randn(H, H, generator=g) / H ** 0.5], 1)
    w["fc.bias"] = torch.zeros(H)
    for k in ("layers.0.self_attn.o_proj.weight", "layers.0.mlp.down_proj.weight"):
        w[k] = torch.zeros_like(w[k])
    save_file(w, f, metadata={"format": "pt"})
    return path


class Base(unittest.TestCase):
    algorithm, engine_kw = None, {}

    @classmethod
    def make(cls, tmp, tok):
        raise NotImplementedError

    @classmethod
    def setUpClass(cls):
        from transformers import AutoTokenizer

        from sglang.test.engine_fixtures import default_model_dir

        cls.tmp = tempfile.TemporaryDirectory()
        tok = AutoTokenizer.from_pretrained(default_model_dir())
        cls.vocab = (len(tok) + 63) // 64 * 64
        cls.target, cls.head = cls.make(cls.tmp.name, tok)
        with uncapped_verify_budget():  # every request's whole tree each step (always_propose), rows planned for it
            cls.engine = Engine(model_path=cls.target, dtype="float32", speculative_algorithm=cls.algorithm,
                                speculative_draft_model_path=cls.head, speculative_eagle_topk=3,
                                speculative_num_steps=3, log_level="warning", **cls.engine_kw)
        always_propose(cls.engine)

    @classmethod
    def tearDownClass(cls):
        shutdown(cls.engine)
        cls.tmp.cleanup()

    def spec(self):
        return self.engine.scheduler.runner.spec

    def generate(self, prompts, **sp):
        out = self.engine.generate(prompts, [dict(GREEDY, **sp) for _ in prompts])
        assert_idle_and_intact(self.engine)  # nothing held: no slot or request row leaked
        return out

    def check_beams(self, n_prompts: int, min_checked: int):
        """The beams recorded in a run of fresh prompts == the reference beam over the whole committed text: the
        same paths in the same order, cumulative log-probs within NEAR_TIE."""
        from sglang.test.eagle_reference import HeadReference, reference_beam

        log = []
        with record_trees(self.engine, log):
            prompts = unique_prompts(self.vocab, n_prompts, seed=7)
            outs = self.engine.generate(input_ids=prompts, sampling_params=dict(GREEDY, max_new_tokens=16))
        ref = HeadReference(self.head, self.target)
        full = {tuple(p): p + o["output_ids"] for p, o in zip(prompts, outs)}
        feats = {k: ref.features(v) for k, v in full.items()}
        checked = ties = 0
        for _, seq, p, width, depth, got, got_scores in log:
            key = next(k for k in full if tuple(seq[: len(k)]) == k)
            run = lambda t, h: ref.logits(t, h, torch.arange(len(t)))  # noqa: E731
            want, want_scores, gap = reference_beam(run, list(full[key][1: p + 1]), ref.head_input(feats[key][:p]),
                                                    width, depth, ref.to_target)
            if gap < NEAR_TIE:
                ties += 1
                continue
            self.assertEqual(got, want, (key[:2], p))
            for a, b in zip(got_scores, want_scores):
                self.assertLess(abs(a - b), NEAR_TIE, (key[:2], p, got_scores, want_scores))
            checked += 1
        self.assertGreaterEqual(checked, min_checked)
        self.assertLessEqual(ties, max(2, checked // 10))
        return checked


class TestEagle3Tree(Base):
    algorithm = "EAGLE3"
    engine_kw = {"chunked_prefill_size": 4, "max_total_tokens": 256}

    @classmethod
    def make(cls, tmp, tok):
        from sglang.test.eagle_heads import make_eagle3_head, make_llama_target

        target = make_llama_target(os.path.join(tmp, "target"), tok)
        return target, make_eagle3_head(os.path.join(tmp, "head"), target, seed=1, aux_layer_ids=AUX_LAYERS)

    def test_greedy_equals_without_speculation(self):
        from sglang.test.retraction_checks import retraction_prompts, run_retraction

        retract = retraction_prompts(self.vocab)
        with spec_off(self.engine):
            ref_retract, _ = run_retraction(self.engine, retract)
            ref = self.generate(PROMPTS)
            stop = ref[0]["text"][len(ref[0]["text"]) // 2:][:4]
            ref_stop = self.generate(PROMPTS[:1], stop=[stop])
        before = self.spec().counters.proposed_tokens
        got, retractions = run_retraction(self.engine, retract)
        self.assertEqual(got, ref_retract)
        self.assertGreater(retractions, 0)
        got = self.generate(PROMPTS)
        self.assertEqual([o["output_ids"] for o in got], [o["output_ids"] for o in ref])
        self.assertTrue(all(o["meta_info"]["spec_verify_ct"] > 0 for o in got))
        hit = self.generate(PROMPTS[:2])  # their prompts are cached now
        self.assertEqual([o["output_ids"] for o in hit], [o["output_ids"] for o in ref[:2]])
        stopped = self.generate(PROMPTS[:1], stop=[stop])
        self.assertEqual(stopped[0]["text"], ref_stop[0]["text"])
        self.assertEqual(stopped[0]["meta_info"]["finish_reason"]["type"], "stop")
        self.assertGreater(self.spec().counters.proposed_tokens, before)

    def test_beams_equal_the_plain_torch_beam(self):
        self.check_beams(3, 30)


class TestEagle1CopyingTree(Base):
    algorithm = "EAGLE"

    @classmethod
    def make(cls, tmp, tok):
        target = bigram_target(os.path.join(tmp, "target"), tok)
        return target, copying_head(os.path.join(tmp, "head"), target)

    def test_side_branch_commits_and_beams(self):
        spec = self.spec()
        side, counters = spec.tree.side_branch_commits, dict(spec.counters.to_dict())
        got = self.generate(PROMPTS)
        with spec_off(self.engine):
            ref = self.generate(PROMPTS)
        self.assertEqual([o["output_ids"] for o in got], [o["output_ids"] for o in ref])
        now = spec.counters.to_dict()
        self.assertGreater(now["accepted_tokens"] - counters["accepted_tokens"], 50)
        self.assertGreater(spec.tree.side_branch_commits, side)
        side = spec.tree.side_branch_commits
        self.check_beams(4, 20)
        self.assertGreater(spec.tree.side_branch_commits, side)  # the checked beams followed side-branch commits


del Base  # not collected itself

if __name__ == "__main__":
    unittest.main()
