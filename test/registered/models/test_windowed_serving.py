"""Gemma 3 (one full layer of four, the others a 16-token window: a full pool, a windowed pool and the slot map between
them) served over HTTP, through the real openai client: a random fp32 checkpoint with the SmolLM2 tokenizer.

Against HF transformers' fp32 greedy tokens on the same checkpoint:
- completions of prompts 3x the window, prefilled in 24-token chunks (every chunk edge cuts a window);
- the same prompt twice: the second is a prefix-cache hit (usage.prompt_tokens_details.cached_tokens covers at least
  the window, --enable-cache-report) and decodes the same tokens;
- ten concurrent requests (48 prompt + 440 new tokens each, native /generate) overfill the 4,224-token full pool:
  decode retracts (the server's sglang:num_retracted_requests_total moves) and every token is still HF's greedy
  choice (teacher-forced: HF's logits over prompt + output in one forward);
- /server_info reports the windowed pool (its window, its own pool, what it holds), and a bad field is a 400;
- a 1,024-token generation (64 windows of 16) holds its window, not its history: /server_info's windowed tokens in
  use, sampled by a thread throughout it, stay within slots x (window + chunk + page) (the full pool holds all 1,032
  tokens), and its tokens are HF's greedy choices (teacher-forced).
The Engine runs of the same scenarios (tp=1) are test_swa_engine.py's (Gemma 3, Mistral) and test_gpt_oss_engine.py's
(gpt-oss at tp=1 and 2, Mistral); gpt-oss over HTTP is test_gpt_oss_server.py's, Mistral's test_mistral_server.py's.
Gemma 3 at tp=2 through the Engine: test_gemma3_tp2_equals_hf."""

import os
import tempfile
import threading
import time
import unittest

import requests
import torch

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import default_model_dir
from sglang.test.test_utils import openai_client, popen_launch_server
from sglang.test.windowed_server_checks import WindowedServerChecks

from test_gemma3 import WINDOW, make_gemma3  # noqa: E402 (the same directory)

register_cpu_ci(est_time=170, suite="cpu")

CHUNK, POOL = 24, 4224  # the full pool: sized by test_3's retraction (test_5's generation fits in it)
LONG_NEW = 1024  # 64 windows of 16: a pool that kept the history would hold ~25x the bound by the end
RETRACT_NEW = 440  # 10 x (48 + 440) > POOL, while the admission estimate (new_token_ratio ~0.7) admits all ten
assert CHUNK % WINDOW != 0  # chunk edges fall inside windows


def _prompts(n, length, seed, vocab):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (length - 3 * i,), generator=g).tolist() for i in range(n)]


class TestWindowedServing(WindowedServerChecks, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from transformers import AutoTokenizer

        cls.tmp = tempfile.TemporaryDirectory()
        cls.tok = AutoTokenizer.from_pretrained(default_model_dir())
        torch.manual_seed(0)
        cls.vocab = (len(cls.tok) + 63) // 64 * 64
        cls.hf = make_gemma3(vocab_size=cls.vocab, eos_token_id=None, bos_token_id=None, pad_token_id=0,
                             max_position_embeddings=2 * POOL).float().eval()
        path = os.path.join(cls.tmp.name, "model")
        cls.hf.save_pretrained(path)
        cls.tok.save_pretrained(path)
        cls.server = popen_launch_server(path, other_args=[
            "--dtype", "float32", "--max-total-tokens", str(POOL), "--chunked-prefill-size",
            str(CHUNK), "--enable-cache-report", "--enable-metrics", "--random-seed", "0"])
        cls.client = openai_client(cls.server.base_url, timeout=120)
        cls.model = cls.client.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        cls.server.kill()
        cls.tmp.cleanup()

    def assert_hf(self, ids, n, text):
        self.assertEqual(text, self.tok.decode(self.hf_greedy(ids, n)))

    def generate_ids(self, ids, n):
        """Greedy continuation's token ids from the native /generate endpoint."""
        out = requests.post(f"{self.server.base_url}/generate", timeout=900, json={
            "input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}})
        self.assertEqual(out.status_code, 200, out.text)
        return out.json()["output_ids"]

    def assert_hf_teacher_forced(self, ids, new):
        """Each new token is HF's greedy choice after the same history: HF's logits over prompt + new in one forward
        (one pass instead of hundreds of generate steps), the token HF's argmax or within fp32 noise of its max."""
        with torch.no_grad():
            logits = self.hf(torch.tensor([ids + new])).logits[0, len(ids) - 1: -1]
        gap = logits.max(-1).values - logits[torch.arange(len(new)), torch.tensor(new)]
        self.assertLessEqual(gap.max().item(), 1e-3)
        self.assertGreaterEqual((gap == 0).float().mean().item(), 0.99)

    def test_1_prompts_3x_the_window_in_chunks(self):
        for ids in _prompts(3, 3 * WINDOW, seed=1, vocab=self.vocab):
            text, usage = self.complete(ids, 16)
            self.assertEqual((usage.prompt_tokens, usage.completion_tokens), (len(ids), 16))
            self.assert_hf(ids, 16, text)

    def test_2_prefix_hit(self):
        """A shared prefix 3x the window, cached by a request that ends as its prefill does (so its window's tokens
        are still held), is a hit for every later prompt that extends it, repeated or not."""
        prefix = _prompts(1, 3 * WINDOW, seed=2, vocab=self.vocab)[0]
        self.complete(prefix, 1)
        ids = prefix + _prompts(1, 7, seed=6, vocab=self.vocab)[0]
        for _ in range(2):
            text, usage = self.complete(ids, 10)
            cached = usage.prompt_tokens_details.cached_tokens
            self.assertGreaterEqual(cached, 2 * WINDOW)  # the prefix, borrowed with its window
            self.assertLess(cached, len(ids))
            self.assert_hf(ids, 10, text)

    def test_3_retraction_decodes_hf_tokens(self):
        prompts = _prompts(10, 3 * WINDOW, seed=3, vocab=self.vocab)  # 10 x (48 prompt + 440 new) > the pool
        before = self.metric("sglang:num_retracted_requests_total")
        outs = [None] * len(prompts)

        def run(i):
            outs[i] = self.generate_ids(prompts[i], RETRACT_NEW)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertGreater(self.metric("sglang:num_retracted_requests_total"), before)
        for ids, out in zip(prompts, outs):
            self.assertEqual(len(out), RETRACT_NEW)
            self.assert_hf_teacher_forced(ids, out)

    def test_4_windowed_pool_idle_and_bad_field(self):
        info = requests.get(f"{self.server.base_url}/server_info", timeout=30).json()
        kv = info["kv_cache"]
        self.assertEqual(kv["windowed_window_tokens"], WINDOW)
        self.assertFalse(kv["windowed_pool_is_token_pool"])  # Gemma 3 keeps a full layer: a pool of its own
        self.assertGreater(kv["windowed_pool_tokens"], 0)
        # only the cached prefixes' window pages are held now: at most the pool, and the peak stayed bounded
        self.assertLessEqual(kv["windowed_tokens_in_use"], kv["windowed_pool_tokens"])
        self.check_bad_field()

    def test_5_windowed_pages_bounded_through_a_1k_generation(self):
        """A thread samples /server_info while one request generates 1,024 tokens: the windowed pool never holds more
        than one request's window + chunk + page (its pages below the window are freed after every forward), at
        every sample, and the samples cover the whole generation."""
        base = self.server.base_url
        self.assertEqual(requests.post(f"{base}/flush_cache", timeout=30).status_code, 200)  # the cache's windows
        info = requests.get(f"{base}/server_info", timeout=30).json()
        self.assertEqual(info["kv_cache"]["windowed_tokens_in_use"], 0)
        page = info["memory_plan"]["page_size"]
        bound = 1 * (WINDOW + CHUNK + page)  # slots (one request) x (window + chunk + page)
        prompt = _prompts(1, 8, seed=7, vocab=self.vocab)[0]
        done, samples, result = threading.Event(), [], {}

        def generate():
            try:
                result["ids"] = self.generate_ids(prompt, LONG_NEW)
            finally:
                done.set()

        gen = threading.Thread(target=generate)
        start = time.monotonic()
        gen.start()
        while not done.is_set():
            kv = requests.get(f"{base}/server_info", timeout=30).json()["kv_cache"]
            samples.append((time.monotonic() - start, kv["windowed_tokens_in_use"]))
            time.sleep(0.05)
        gen.join()
        elapsed = time.monotonic() - start
        self.assertEqual(len(result["ids"]), LONG_NEW)
        held = [s for s in samples if s[1] > 0]  # taken while the request held its window
        self.assertGreaterEqual(len(held), 20, samples)
        self.assertLessEqual(held[0][0], 0.2 * elapsed)  # from the start of the generation ...
        self.assertGreaterEqual(held[-1][0], 0.8 * elapsed)  # ... to its end
        self.assertLessEqual(max(t for _, t in samples), bound, samples)
        print(f"1k generation: {len(samples)} samples over {elapsed:.1f} s, windowed tokens in use max "
              f"{max(t for _, t in samples)}, bound {bound}")
        self.assert_hf_teacher_forced(prompt, result["ids"])  # freed pages, handed out again, held the right K/V



def test_gemma3_tp2_equals_hf(tmp_path):
    """The follower rank's windowed layers read the K/V rank 0's allocator mapped (batch_sync sends the slot map's
    entries): without them it read the dummy page and left HF's tokens at the 10th."""
    from sglang import Engine

    torch.manual_seed(0)  # the server's checkpoint and first prompts
    vocab = 49152  # SmolLM2's tokenizer, rounded up to 64
    hf = make_gemma3(vocab_size=vocab, eos_token_id=None, bos_token_id=None, pad_token_id=0).float().eval()
    hf.save_pretrained(str(tmp_path))
    prompts = _prompts(2, 3 * WINDOW, seed=1, vocab=vocab)
    engine = Engine(model_path=str(tmp_path), dtype="float32", tp_size=2, skip_tokenizer_init=True,
                    chunked_prefill_size=CHUNK, max_total_tokens=POOL, log_level="warning")
    try:
        outs = engine.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": 16,
                                                                   "ignore_eos": True})
    finally:
        engine.shutdown()
    for ids, out in zip(prompts, outs):
        with torch.no_grad():
            x = torch.tensor([ids])
            ref = hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=16,
                              min_new_tokens=16, pad_token_id=0)[0, len(ids):].tolist()
        assert out["output_ids"] == ref


if __name__ == "__main__":
    unittest.main()
