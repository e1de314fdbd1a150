"""The Triton MLA kernels and the Triton backend's MLA path under the Triton interpreter on CPU, against the EXPANDED
multi-head form in float64 (random W_UK / W_UV; triton_mla_cases.py): the absorbed decode (split-KV over the latent
rows, triton_ops/mla_decode.py) and the absorbed extend with a cached prefix (triton_ops/mla_extend.py), page sizes
1 and 16, mixed lengths, both tile sets and the GPU's heads / rows per program (these shapes then span several key
blocks, splits, query blocks and head blocks), fp32 and fp16; then TritonAttnBackend over the latent pool
(mem_cache/mla_pool.py) through prefill, extends over cached prefixes and decode steps (mla_backend_steps.py); and
end to end, a random DeepSeek-V3 (models/deepseek_v2.py: q_lora, grouped routing, a dense first layer) through
sglang.Engine(attention_backend="triton") gives HF transformers' fp32 greedy tokens, a cached prefix included. The
interpreted work runs in child processes with TRITON_INTERPRET=1 (interpreted_run.py says why)."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

import torch
from interpreted_run import run_in_interpreter
from triton_mla_cases import DECODE_CASES, EXTEND_CASES, RESULT_PREFIX, TOL

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=150, suite="cpu")

HERE = os.path.dirname(os.path.abspath(__file__))
DTYPES = {str(d): d for d in TOL}


def run_interpreted(timeout_s: float = 600) -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, os.path.join(HERE, "triton_mla_cases.py")], env=env, capture_output=True,
                         text=True, timeout=timeout_s)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if out.returncode != 0 or not lines:
        raise AssertionError(f"interpreted run failed (rc {out.returncode}):\n{out.stdout[-3000:]}\n"
                             f"{out.stderr[-5000:]}")
    return json.loads(lines[-1][len(RESULT_PREFIX):])


class TestTritonMLAInterpreted(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.result = run_interpreted()

    def test_absorbed_kernels_equal_the_expanded_form(self):
        errors = {k: v for k, v in self.result["kernels"].items() if not k.startswith("broken")}
        # 2 tile sets x 2 dtypes x 2 page sizes x (decode + extend cases)
        self.assertEqual(len(errors), 2 * 2 * 2 * (len(DECODE_CASES) + len(EXTEND_CASES)))
        for key, err in errors.items():
            kind, tiles, dtype, page_size, case = key.split("|")
            with self.subTest(kind=kind, tiles=tiles, dtype=dtype, page_size=page_size, case=case):
                self.assertLessEqual(err, TOL[DTYPES[dtype]], f"{key}: max abs error {err:.3g}")

    def test_comparison_can_fail(self):
        """The kernels run with a wrong softmax scale are far outside the tolerance."""
        for key in ("broken|decode_scale", "broken|extend_scale"):
            self.assertGreater(self.result["kernels"][key], 1e-2, key)

    def test_backend_over_the_latent_pool(self):
        """Prefill, extends over cached prefixes, decode steps and a late request, through TritonAttnBackend; once
        more with the decode steps set up by its CUDA-graph hook (the graph workspace, every split launched)."""
        runs = dict(self.result["backend"])
        self.assertTrue(runs.pop("graph_workspace_written"))  # the graph decode used the planned graph workspace
        self.assertFalse(runs.pop("eager_workspace_written"))  # ... not the eager one
        self.assertEqual(set(runs), {f"{torch.float32}|1", f"{torch.float32}|16", f"{torch.float16}|16", "graph"})
        for key, step_errors in runs.items():
            dtype = torch.float32 if key == "graph" else DTYPES[key.split("|")[0]]
            for i, err in enumerate(step_errors):
                with self.subTest(run=key, step=i):
                    self.assertLessEqual(err, TOL[dtype])


# a small random DeepSeek-V3: q_lora, 2 groups of 4 experts (noaux_tc), one dense layer first, one shared expert
V3_CONFIG = dict(vocab_size=384, hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1,
                 num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1, routed_scaling_factor=2.5,
                 kv_lora_rank=64, q_lora_rank=96, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
                 max_position_embeddings=1024, rope_theta=10000.0, tie_word_embeddings=False)
MAX_NEW = 5
SHARED = [(i * 11) % 300 + 3 for i in range(40)]
# mixed lengths (280 tokens: two prefill chunks of 256, a decode over more than one interpreter block), then a
# request that extends SHARED's cached pages (a radix hit: 32 tokens at page size 16)
BATCHES = [[[5, 17, 30, 42, 9], list(range(20, 300)), [7] * 12], [SHARED], [SHARED + [9, 8, 7, 6, 5]]]
ENGINE_KW = dict(skip_tokenizer_init=True, max_total_memory_gb=1, chunked_prefill_size=256, page_size=16)


class TestTritonMLAEngine(unittest.TestCase):
    def test_greedy_tokens_equal_transformers(self):
        from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

        with tempfile.TemporaryDirectory() as tmp:
            torch.manual_seed(0)
            hf = DeepseekV3ForCausalLM(DeepseekV3Config(**V3_CONFIG)).float().eval()
            hf.save_pretrained(tmp)
            got = run_in_interpreter("engine", json.dumps(dict(model_path=tmp, backend="triton", engine_kwargs=ENGINE_KW,
                                                               batches=BATCHES, max_new_tokens=MAX_NEW)))
        for batch, outs in zip(BATCHES, got["outputs"]):
            for prompt, out in zip(batch, outs):
                with torch.no_grad():
                    ids = hf.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False,
                                      min_new_tokens=MAX_NEW)[0, len(prompt):].tolist()
                self.assertEqual(out["output_ids"], ids, f"prompt of {len(prompt)} tokens")
        self.assertEqual(got["outputs"][2][0]["cached_tokens"], 32)  # the shared prefix's two full pages
        self.assertEqual(got["num_retractions"], 0)


if __name__ == "__main__":
    unittest.main()
