"""GroupedTopK (layers/moe/grouped_topk.py) against transformers' own DeepSeek routers on random logits: the chosen
expert set and its weights per token, for V3's sigmoid noaux_tc (groups scored by their two best corrected scores,
e_score_correction_bias steering the choice only, norm_topk_prob, routed_scaling_factor; Kimi-K2's single group)
and V2's softmax greedy / group_limited_greedy. The HF router computes logits = hidden @ W^T: with W = I and
hidden = the logits, it routes exactly the logits we route."""

import unittest

import torch

from sglang.srt.layers.moe.grouped_topk import GroupedTopK
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="cpu")

M = 64  # tokens


def hf_route(router, logits: torch.Tensor):
    with torch.no_grad():
        router.weight.copy_(torch.eye(logits.shape[1]))
        _, weights, ids = router(logits)
    return weights, ids


def by_id(weights: torch.Tensor, ids: torch.Tensor):
    """(ids sorted per row, their weights): the order within a token's k experts does not change its output."""
    ids, order = ids.long().sort(dim=-1)
    return ids, weights.gather(1, order)


class TestV3NoauxTc(unittest.TestCase):
    def route_both(self, **fields):
        from transformers import DeepseekV3Config
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

        fields = dict(dict(n_routed_experts=16, hidden_size=16, num_experts_per_tok=4, n_group=4, topk_group=2,
                           norm_topk_prob=True, routed_scaling_factor=2.5), **fields)
        cfg = DeepseekV3Config(**fields)
        router = DeepseekV3TopkRouter(cfg)
        gen = torch.Generator().manual_seed(0)
        bias = torch.randn(cfg.n_routed_experts, generator=gen)  # large enough to reorder the choice
        with torch.no_grad():
            router.e_score_correction_bias.copy_(bias)
        logits = torch.randn(M, cfg.n_routed_experts, generator=gen) * 2
        ours = GroupedTopK.deepseek_v3(cfg).select(logits, bias)
        return by_id(*ours), by_id(*hf_route(router, logits)), logits, bias

    def test_grouped_choice_and_weights_equal_hf(self):
        for fields in (dict(), dict(norm_topk_prob=False), dict(n_group=8, topk_group=3, num_experts_per_tok=6),
                       dict(n_group=1, topk_group=1, routed_scaling_factor=2.827)):  # Kimi-K2: one group
            with self.subTest(**fields):
                (ids, w), (hf_ids, hf_w), _, _ = self.route_both(**fields)
                self.assertTrue(torch.equal(ids, hf_ids))
                torch.testing.assert_close(w, hf_w, rtol=1e-6, atol=0)

    def test_bias_steers_the_choice_not_the_weights(self):
        (ids, w), _, logits, bias = self.route_both()
        unbiased = GroupedTopK.deepseek_v3(_cfg_v3()).select(logits)[1].long().sort(dim=-1)[0]
        self.assertFalse(torch.equal(ids, unbiased))  # the bias changed some tokens' experts
        raw = torch.sigmoid(logits).gather(1, ids)
        torch.testing.assert_close(w, 2.5 * raw / raw.sum(-1, keepdim=True), rtol=1e-6, atol=0)

    def test_only_kept_groups_are_chosen(self):
        (ids, _), _, _, _ = self.route_both()
        groups = [set((row // 4).tolist()) for row in ids]  # 16 experts in 4 groups of 4, 2 kept
        self.assertTrue(all(len(g) <= 2 for g in groups))
        self.assertTrue(any(len(g) == 2 for g in groups))


def _cfg_v3():
    from transformers import DeepseekV3Config

    return DeepseekV3Config(n_routed_experts=16, hidden_size=16, num_experts_per_tok=4, n_group=4, topk_group=2,
                            norm_topk_prob=True, routed_scaling_factor=2.5)


class TestV2(unittest.TestCase):
    def route_both(self, **fields):
        from transformers import DeepseekV2Config
        from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

        fields = dict(dict(n_routed_experts=16, hidden_size=16, num_attention_heads=4, num_experts_per_tok=3,
                           n_group=4, topk_group=2, routed_scaling_factor=16.0), **fields)
        cfg = DeepseekV2Config(**fields)
        logits = torch.randn(M, cfg.n_routed_experts, generator=torch.Generator().manual_seed(1)) * 2
        return by_id(*GroupedTopK.deepseek_v2(cfg).select(logits)), by_id(*hf_route(DeepseekV2TopkRouter(cfg), logits))

    def test_greedy_and_group_limited_equal_hf(self):
        for method in ("greedy", "group_limited_greedy"):
            with self.subTest(method):
                (ids, w), (hf_ids, hf_w) = self.route_both(topk_method=method)
                self.assertTrue(torch.equal(ids, hf_ids))
                torch.testing.assert_close(w, hf_w, rtol=1e-6, atol=0)
        # the group limit changes the choice on these logits (else the two cases would test one thing)
        self.assertFalse(torch.equal(self.route_both(topk_method="greedy")[0][0],
                                     self.route_both(topk_method="group_limited_greedy")[0][0]))

    def test_norm_topk_prob_renormalises_without_scaling(self):
        """DeepSeek-V2's released code: norm_topk_prob (top_k > 1) renormalises the chosen weights and then does not
        apply routed_scaling_factor (transformers 5 ignores the flag and scales; every published V2 config sets it
        false). Same experts; weights = HF's scaled weights over their sum."""
        (ids, w), (hf_ids, hf_w) = self.route_both(topk_method="group_limited_greedy", norm_topk_prob=True)
        self.assertTrue(torch.equal(ids, hf_ids))
        torch.testing.assert_close(w, hf_w / hf_w.sum(-1, keepdim=True), rtol=1e-6, atol=1e-7)


class TestRefusals(unittest.TestCase):
    def test_configs_the_routing_cannot_serve(self):
        from transformers import DeepseekV2Config, DeepseekV3Config

        with self.assertRaisesRegex(ValueError, "n_group 3 does not divide the 16"):
            GroupedTopK.deepseek_v3(DeepseekV3Config(n_routed_experts=16, n_group=3, topk_group=1))
        with self.assertRaisesRegex(ValueError, "cannot hold num_experts_per_tok 8"):
            GroupedTopK.deepseek_v3(DeepseekV3Config(n_routed_experts=16, n_group=8, topk_group=2,
                                                     num_experts_per_tok=8))
        with self.assertRaisesRegex(ValueError, "topk_method 'noaux_tc' is not served"):
            GroupedTopK.deepseek_v2(DeepseekV2Config(n_routed_experts=16, num_experts_per_tok=2,
                                                     topk_method="noaux_tc"))
        cfg = DeepseekV3Config(n_routed_experts=16, n_group=4, topk_group=2)
        cfg.scoring_func = "softmax"
        with self.assertRaisesRegex(ValueError, "scoring_func 'softmax'.*sigmoid"):
            GroupedTopK.deepseek_v3(cfg)


class TestServedConfigs(unittest.TestCase):
    def test_published_configs_are_served_and_routed(self):
        """DeepSeek-V3, V2-Lite and Kimi-K2's config.json (mem_plan fixtures; Kimi's model_type kimi_k2 needs its
        own code in transformers, read here by DeepseekV3Config) start past check_served and build their routing."""
        import os
        import shutil
        import tempfile

        from sglang.srt.configs.hf_config_snapshot import load_hf_config
        from sglang.srt.mem_plan.arch_registry import not_served_note

        fixtures = os.path.join(os.path.dirname(__file__), "..", "mem_plan", "fixtures")
        expect = {"deepseek-v3": ("deepseek_v3", 8, 4), "deepseek-v2-lite": ("deepseek_v2", 1, 1),
                  "kimi-k2-instruct": ("deepseek_v3", 1, 1)}
        for name, (canonical, groups, kept) in expect.items():
            with self.subTest(name), tempfile.TemporaryDirectory() as tmp:
                shutil.copy(os.path.join(fixtures, name, "config.json"), tmp)
                cfg = load_hf_config(tmp, None)
                self.assertEqual(not_served_note(cfg.model_type), "")
                routing = getattr(GroupedTopK, canonical)(cfg)
                self.assertEqual((routing.num_groups, routing.topk_groups), (groups, kept))

    def test_dp_attention_refused_naming_why(self):
        from sglang.srt.server_args import ServerArgs

        with self.assertRaisesRegex(ValueError, "--enable-dp-attention is not supported: .*lockstep.*replicated"):
            ServerArgs(enable_dp_attention=True)
        self.assertFalse(ServerArgs().enable_dp_attention)


if __name__ == "__main__":
    unittest.main()
