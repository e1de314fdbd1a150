"""Speculative decoding's terms of the memory plan (issue 44), each against a formula written here from the config.json
values (or transformers' meta-device model), through `sglang plan` as users run it:

  - Llama-3.1-8B + the published EAGLE3-LLaMA3.1-Instruct-8B head on an H100-80GB: draft_weights (fc 3h -> h, one
    layer whose q/k/v read 2h, norms, a draft_vocab_size lm_head, d2t / t2d), draft_kv_cache ((T + 1) x one layer's
    K/V), the logits term at verify_token_cap rows, spec_hidden_states (3 x hidden per verify row), draft_cuda_graphs
    0 (the served head decodes eagerly, as STANDALONE's draft: 0 on a GPU too);
    the draft cell is charged per token (fewer tokens than without, and not one more token fits).
  - SmolLM2-135M + a smaller Llama draft (transformers' LlamaConfig) on CPU: draft weights == HF meta-device
    parameters x dtype + this runtime's rope table; the draft pool over the target's token slots.
  - EAGLE-1 head and DeepSeek-V3's MTP layer (NEXTN, against transformers' DeepSeek-V3 layer on the meta device).
  - NGRAM: verify rows only (a CPU: within the runtime's verify budget), and a real NGRAM start's plan == the dry run.
  - A STANDALONE tree (top-k > 1): its verify rows are the tree's branches expanded, B x (depth + 1), not upstream's
    num_draft_tokens (nodes + 1); the logits term holds that many rows a slot.
    Refusals name the flag and what the planner lacks.
"""

import contextlib
import io
import json
import math
import os
import tempfile
import unittest

from sglang.cli.plan import main
from sglang.srt.mem_plan.sizes import sampler_bytes_per_slot, sampler_fixed_bytes
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=70, suite="cpu")

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
LLAMA = os.path.join(FIXTURES, "llama-3.1-8b")
EAGLE3 = os.path.join(FIXTURES, "eagle3-llama3.1-instruct-8b")
DEEPSEEK = os.path.join(FIXTURES, "deepseek-v3")
MiB = 2**20
BF16 = 2


def plan_json(*argv):
    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        try:
            status = main([*argv, "--json"])
        except SystemExit as e:
            return e.code, err.getvalue()
    return status, json.loads(buf.getvalue())


def plan_text(*argv):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        status = main(list(argv))
    return status, buf.getvalue()


def terms(d):
    return {t["name"]: t["num_bytes"] for t in d["plan"]["terms"]}


def config(path):
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


CPU_BUDGET = 16  # mem_plan/spec_sizes.py CPU_VERIFY_TOKEN_BUDGET: a CPU verify forward's most tokens


def verify_rows(slots, draft_tokens, chunk, budget=None):
    """Written from the design: every slot's draft tokens, at most the chunk (and a CPU's budget), never fewer than a
    decode step."""
    return max(slots, min(slots * draft_tokens, chunk, budget or chunk))


class TestEagle3OnH100(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        base = ("--model-path", LLAMA, "--gpu", "h100-80gb")
        cls.flags = (*base, "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", EAGLE3)
        cls.status, cls.d = plan_json(*cls.flags)
        _, cls.without = plan_json(*base)

    def test_each_term_is_the_config_formula(self):
        self.assertEqual(self.status, 0)
        head, target = config(EAGLE3), config(LLAMA)
        h, inter, v = head["hidden_size"], head["intermediate_size"], head["vocab_size"]
        dv, nq, nkv = head["draft_vocab_size"], head["num_attention_heads"], head["num_key_value_heads"]
        d = h // nq
        params = (h * 3 * target["hidden_size"]  # fc: the target's 3 auxiliary states -> h
                  + 2 * h * (nq * d + 2 * nkv * d) + nq * d * h  # q/k/v read [embedding | fc output], o_proj
                  + 3 * h * inter  # gate, up, down
                  + 4 * h  # hidden_norm, input_layernorm, post_attention_layernorm, norm
                  + dv * h)  # lm_head over the draft vocabulary
        maps = dv * 8 + v * 1  # d2t int64, t2d bool
        # the head's cos/sin table over the target's positions (the longer of the two configs')
        rope = max(head["max_position_embeddings"], target["max_position_embeddings"]) * d * BF16
        got, plan = terms(self.d), self.d["plan"]
        self.assertEqual(got["draft_weights"], params * BF16 + maps + rope)
        T, R = plan["max_total_num_tokens"], plan["max_running_requests"]
        cell = 1 * nkv * d * 2 * BF16  # one layer's K and V
        self.assertEqual(got["draft_kv_cache"], (T + 1) * cell)
        rows = verify_rows(R, 4, plan["chunked_prefill_size"])  # EAGLE3 default: 3 steps + 1
        self.assertEqual(rows, 8192)
        tv = target["vocab_size"]
        self.assertEqual(got["logits"], sampler_fixed_bytes(tv) + rows * sampler_bytes_per_slot(tv))
        self.assertEqual(got["spec_hidden_states"], rows * 3 * target["hidden_size"] * BF16)
        G = plan["cuda_graph_max_bs"]
        self.assertEqual(G, 256)
        self.assertEqual(got["draft_cuda_graphs"], 0)  # the served head decodes eagerly (draft_runner.py)
        s = plan["speculative"]
        self.assertEqual((s["draft_kv_cell_bytes"], s["draft_kv_rows"], s["draft_kv_bytes"], s["verify_tokens"]),
                         (cell, T + 1, (T + 1) * cell, rows))

    def test_the_draft_cell_is_charged_per_token(self):
        plan, base = self.d["plan"], self.without["plan"]
        self.assertLess(plan["max_total_num_tokens"], base["max_total_num_tokens"])
        self.assertEqual(plan["max_running_requests"], base["max_running_requests"])  # floor regime both
        self.assertLessEqual(plan["total_bytes"], plan["budget_bytes"])
        # the solve is exact with target cell + draft cell: one more token would not fit
        self.assertLess(plan["headroom_bytes"], plan["kv_cell_bytes"] + plan["speculative"]["draft_kv_cell_bytes"])
        # what the KV pool lost is what the new terms took (same slots, so every other term is unchanged)
        extra = sum(v for k, v in terms(self.d).items() if k.startswith(("draft_", "spec_"))) + (
            terms(self.d)["logits"] - terms(self.without)["logits"]) - plan["speculative"]["draft_kv_bytes"]
        # budget = ... + (T0 + 1) c + h0 = ... + extra + (T1 + 1)(c + dc) + h1 with h1 < c + dc
        cell, draft = plan["kv_cell_bytes"], plan["speculative"]["draft_kv_cell_bytes"]
        t0 = base["max_total_num_tokens"]
        self.assertEqual(plan["max_total_num_tokens"],
                         (t0 * cell + base["headroom_bytes"] - extra - draft) // (cell + draft))

    def test_explicit_fraction_holds_the_draft_in_the_static_region(self):
        status, d = plan_json(*self.flags, "--mem-fraction-static", "0.6")
        self.assertEqual(status, 0, d)
        plan, got = d["plan"], terms(d)
        cell, draft = plan["kv_cell_bytes"], plan["speculative"]["draft_kv_cell_bytes"]
        static = math.floor(plan["budget_bytes"] * 0.6) - got["weights"] - got["draft_weights"] - (cell + draft)
        self.assertEqual(plan["max_total_num_tokens"], static // (cell + draft))  # + the dummy page of both pools

    def test_text_shows_each_term(self):
        status, text = plan_text(*self.flags)
        self.assertEqual(status, 0)
        for name in ("draft_weights", "draft_kv_cache", "spec_hidden_states", "draft_cuda_graphs", "verify rows"):
            self.assertIn(name, text)
        self.assertIn("Speculative decoding (EAGLE3", text)
        self.assertIn("Upstream SGLang (classic auto y=0.81)", text)  # 0.835 without: + upstream's 2 GiB EAGLE reserve


class TestStandaloneDraft(unittest.TestCase):
    """SmolLM2-135M's published geometry as the target, a 4-layer Llama as the draft, both from LlamaConfig."""

    @classmethod
    def setUpClass(cls):
        from transformers import LlamaConfig

        cls.tmp = tempfile.TemporaryDirectory()
        common = dict(vocab_size=49152, max_position_embeddings=8192, tie_word_embeddings=True, head_dim=64,
                      rope_theta=100000.0, torch_dtype="bfloat16")
        cls.configs = {
            "target": LlamaConfig(hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                                  num_key_value_heads=3, num_hidden_layers=30, **common),
            "draft": LlamaConfig(hidden_size=256, intermediate_size=640, num_attention_heads=4,
                                 num_key_value_heads=2, num_hidden_layers=4, **common)}
        cls.paths = {}
        for name, c in cls.configs.items():
            cls.paths[name] = os.path.join(cls.tmp.name, name)
            os.makedirs(cls.paths[name])
            with open(os.path.join(cls.paths[name], "config.json"), "w") as f:
                json.dump(c.to_dict(), f)
        cls.base = ("--model-path", cls.paths["target"], "--device", "cpu", "--total-memory-gb", "8",
                    "--dtype", "bfloat16")
        cls.status, cls.d = plan_json(*cls.base, "--speculative-algorithm", "STANDALONE",
                                      "--speculative-draft-model-path", cls.paths["draft"])
        _, cls.without = plan_json(*cls.base)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_draft_weights_are_the_meta_models_parameters(self):
        import torch
        from transformers import LlamaForCausalLM

        self.assertEqual(self.status, 0, self.d)
        c = self.configs["draft"]
        with torch.device("meta"):
            model = LlamaForCausalLM(c)
        model.tie_weights()
        numel = sum(p.numel() for p in model.parameters())  # the tied table once
        rope = c.max_position_embeddings * c.head_dim * BF16  # this runtime's cos/sin table, [positions, rotary]
        self.assertEqual(terms(self.d)["draft_weights"], numel * BF16 + rope)
        self.assertEqual(self.d["plan"]["speculative"]["draft_dtype"], "bfloat16")

    def test_draft_pool_shares_the_target_slots(self):
        c, plan = self.configs["draft"], self.d["plan"]
        cell = c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 2 * BF16
        T = plan["max_total_num_tokens"]
        self.assertEqual(terms(self.d)["draft_kv_cache"], (T + plan["page_size"]) * cell)
        self.assertLess(T, self.without["plan"]["max_total_num_tokens"])
        self.assertLess(plan["headroom_bytes"], plan["kv_cell_bytes"] + cell)
        self.assertEqual(terms(self.d)["draft_cuda_graphs"], 0)  # a CPU: no graphs
        R = plan["max_running_requests"]
        rows = verify_rows(R, 4, plan["chunked_prefill_size"], CPU_BUDGET)
        self.assertEqual(rows, R)  # 256 slots: a verify forward is never longer than a decode step of every slot
        self.assertEqual(terms(self.d)["logits"], sampler_fixed_bytes(49152) + rows * sampler_bytes_per_slot(49152))
        self.assertEqual(terms(self.d)["logits"], terms(self.without)["logits"])

    def test_standalone_prices_no_draft_graphs_on_a_gpu(self):
        """The served DraftRunner decodes the draft eagerly, so a GPU plan holds no draft graphs while the target's
        own graphs are priced (EAGLE3's head too: TestEagle3OnH100)."""
        flags = ("--model-path", self.paths["target"], "--gpu", "h100-80gb", "--speculative-algorithm", "STANDALONE",
                 "--speculative-draft-model-path", self.paths["draft"])
        status, d = plan_json(*flags)
        self.assertEqual(status, 0, d)
        self.assertGreater(d["plan"]["cuda_graph_max_bs"], 0)
        self.assertGreater(terms(d)["cuda_graphs"], 0)
        self.assertEqual(terms(d)["draft_cuda_graphs"], 0)
        _, text = plan_text(*flags)
        self.assertIn("draft_runner.py captures no graphs", text)

    def test_a_tree_prices_its_expanded_rows(self):
        """Top-k 3, 3 steps, num_draft_tokens 8 (upstream's nodes + 1: 7 of the 9 a full beam has): the tree step
        builds the deepest tree within 7 nodes, 2 branches x depth 3, and verifies it as 2 x (3 + 1) = 8 expanded
        rows; top-k 4 with 2 steps and 5 draft tokens: 2 x (2 + 1) = 6 rows, more than its 5 draft tokens. On an H100
        with 16 slots neither the chunk nor a CPU budget binds: the logits term holds 16 x those rows."""
        for topk, steps, draft_tokens, rows in ((3, 3, 8, 8), (4, 2, 5, 6), (3, 3, None, 12)):
            tree = ["--speculative-eagle-topk", str(topk), "--speculative-num-steps", str(steps)]
            if draft_tokens:
                tree += ["--speculative-num-draft-tokens", str(draft_tokens)]
            status, d = plan_json("--model-path", self.paths["target"], "--gpu", "h100-80gb", "--max-running-requests",
                                  "16", "--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path",
                                  self.paths["draft"], *tree)
            self.assertEqual(status, 0, d)
            s = d["plan"]["speculative"]
            self.assertEqual((s["num_draft_tokens"], s["verify_rows_per_req"]), (draft_tokens or 10, rows))
            self.assertEqual(s["verify_tokens"], verify_rows(16, rows, d["plan"]["chunked_prefill_size"]))
            self.assertEqual(s["verify_tokens"], 16 * rows)
            self.assertEqual(terms(d)["logits"], sampler_fixed_bytes(49152) + 16 * rows * sampler_bytes_per_slot(49152))
        _, text = plan_text("--model-path", self.paths["target"], "--gpu", "h100-80gb", "--speculative-algorithm",
                            "STANDALONE", "--speculative-draft-model-path", self.paths["draft"],
                            "--speculative-eagle-topk", "3")
        self.assertIn("num_draft_tokens 10: a tree's nodes + 1, verified as 12 expanded rows a request", text)

    def test_cpu_verify_budget_with_few_slots(self):
        status, d = plan_json(*self.base, "--max-running-requests", "4", "--speculative-algorithm", "NGRAM")
        self.assertEqual(status, 0, d)
        rows = verify_rows(4, 8, d["plan"]["chunked_prefill_size"], CPU_BUDGET)
        self.assertEqual((rows, d["plan"]["speculative"]["verify_tokens"]), (16, 16))  # not 4 x 8: the budget
        self.assertEqual(terms(d)["logits"], sampler_fixed_bytes(49152) + rows * sampler_bytes_per_slot(49152))

    def test_unknown_draft_architecture_is_refused_naming_it(self):
        path = os.path.join(self.tmp.name, "odd")
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(dict(self.configs["draft"].to_dict(), model_type="falcon"), f)
        status, err = plan_json(*self.base, "--speculative-algorithm", "STANDALONE",
                                "--speculative-draft-model-path", path)
        self.assertEqual(status, 2)
        self.assertIn("--speculative-draft-model-path", err)
        self.assertIn("'falcon'", err)


class TestOtherAlgorithms(unittest.TestCase):
    def test_the_runtimes_cpu_budget_is_the_one_planned(self):
        from sglang.srt.mem_plan.spec_sizes import verify_budget  # what SpecDecoder gives the policy

        self.assertEqual(verify_budget(64, 10, 8192, "cpu"), CPU_BUDGET)
        self.assertEqual(verify_budget(64, 10, 8192, "cuda"), 640)  # no device cap elsewhere

    def test_eagle1_head(self):
        status, d = plan_json("--model-path", LLAMA, "--gpu", "h100-80gb", "--speculative-algorithm", "EAGLE",
                              "--speculative-draft-model-path", EAGLE3)  # a one-layer Llama config
        self.assertEqual(status, 0)
        h, inter = 4096, 14336
        q, kv = 32 * 128, 8 * 128
        params = 2 * h * h + h + h * (q + 2 * kv) + q * h + 3 * h * inter + h  # fc + bias, layer, post-attn norm
        rope = 131072 * 128 * BF16  # the head's rotary table over Llama-3.1's positions
        self.assertEqual(terms(d)["draft_weights"], params * BF16 + rope)  # embedding and lm_head: the target's
        self.assertEqual(terms(d)["spec_hidden_states"], d["plan"]["speculative"]["verify_tokens"] * h * BF16)

    def test_nextn_mtp_layer_is_deepseek_v3s_decoder_layer(self):
        import torch
        from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

        cfg = {k: v for k, v in config(DEEPSEEK).items() if k not in ("quantization_config", "auto_map")}
        hf = DeepseekV3Config(**dict(cfg, num_hidden_layers=1, first_k_dense_replace=0))
        with torch.device("meta"):
            layer = DeepseekV3ForCausalLM(hf).model.layers[0]
        H = cfg["hidden_size"]
        want = sum(p.numel() for p in layer.parameters()) + sum(
            b.numel() for n, b in layer.named_buffers() if n.endswith("e_score_correction_bias"))
        want += 2 * H * H + 3 * H  # eh_proj, enorm, hnorm, shared_head.norm
        from sglang.srt.mem_plan.draft_heads import nextn_weights

        self.assertEqual(sum(g.numel for g in nextn_weights(config(DEEPSEEK))), want * cfg["num_nextn_predict_layers"])
        status, d = plan_json("--model-path", DEEPSEEK, "--gpu", "h200", "--tp", "8", "--speculative-algorithm", "NEXTN")
        self.assertEqual(status, 0)
        latent = (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * cfg["num_nextn_predict_layers"] * BF16  # MLA rows
        self.assertEqual(terms(d)["draft_kv_cache"], (d["plan"]["max_total_num_tokens"] + 1) * latent)

    def test_ngram_prices_verify_rows_only(self):
        status, d = plan_json("--model-path", LLAMA, "--gpu", "h100-80gb", "--speculative-algorithm", "NGRAM")
        self.assertEqual(status, 0)
        got, plan = terms(d), d["plan"]
        for name in ("draft_weights", "draft_kv_cache", "spec_hidden_states", "draft_cuda_graphs"):
            self.assertEqual(got[name], 0, name)
        rows = verify_rows(plan["max_running_requests"], 8, plan["chunked_prefill_size"])
        self.assertEqual(got["logits"], sampler_fixed_bytes(128256) + rows * sampler_bytes_per_slot(128256))

    def test_nextn_on_a_model_without_mtp_layers_is_refused(self):
        status, err = plan_json("--model-path", LLAMA, "--gpu", "h100-80gb", "--speculative-algorithm", "NEXTN")
        self.assertEqual(status, 2)
        self.assertIn("NEXTN", err)
        self.assertIn("'llama'", err)


class TestNgramPlanIsTheStart(unittest.TestCase):
    """A real start with NGRAM (the default model, a 2 GiB cap) builds its plan with the dry run's function: every
    declared / formula term and the speculative part byte for byte, the KV pool within 3% (the measured weights move
    it)."""

    def test_ngram_start(self):
        import test_plan_matches_server as server  # its fresh-process start and dry run (module, not its tests)

        served = server.served_plan(max_total_memory_gb=2, speculative_algorithm="NGRAM")
        planned = server.dry_run("--max-total-memory-gb", "2", "--speculative-algorithm", "NGRAM")
        self.assertEqual(served["speculative"], planned["speculative"])
        self.assertEqual(served["speculative"]["verify_tokens"], served["max_running_requests"])  # CPU: 256 >= 16
        got, want = server.terms(served), server.terms(planned)
        self.assertEqual(list(got), list(want))
        for name, term in got.items():
            if term["source"] != "measured" and name != "kv_cache":
                self.assertEqual((term["num_bytes"], term["detail"]), (want[name]["num_bytes"], want[name]["detail"]))
        t_served, t_planned = served["max_total_num_tokens"], planned["max_total_num_tokens"]
        self.assertLessEqual(abs(t_served - t_planned), 0.03 * t_served, (t_served, t_planned))


if __name__ == "__main__":
    unittest.main()
