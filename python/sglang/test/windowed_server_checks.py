"""Checks shared by the windowed-attention server tests (issue 41: Gemma 3, gpt-oss, Mistral behind the HTTP server,
through the real openai client), against HF transformers' fp32 greedy tokens on the same random checkpoint.

A unittest.TestCase mixes in WindowedServerChecks and sets, in setUpClass: hf (the HF model), tok (the tokenizer the
server was saved with), client (openai_client of the server), model (its served name), server (popen_launch_server's
result), vocab (the checkpoint's vocabulary size)."""

from __future__ import annotations

from typing import List, Tuple

import requests
import torch


def random_ids(n: int, length: int, seed: int, vocab: int) -> List[List[int]]:
    """n prompts of `length` token ids in [2, vocab), reproducible from seed."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (length,), generator=g).tolist() for _ in range(n)]


class WindowedServerChecks:
    def hf_greedy(self, ids: List[int], n: int) -> List[int]:
        """HF's n greedy tokens after ids (EOS ignored)."""
        with torch.no_grad():
            x = torch.tensor([ids])
            y = self.hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                                 min_new_tokens=n, pad_token_id=0)
        return y[0, len(ids):].tolist()

    def complete(self, prompt, n: int) -> Tuple[str, object]:
        """Greedy completion (text or token ids) through the openai client: (its text, the usage)."""
        out = self.client.completions.create(model=self.model, prompt=prompt, max_tokens=n, temperature=0,
                                             extra_body={"ignore_eos": True, "skip_special_tokens": False})
        return out.choices[0].text, out.usage

    def metric(self, name: str) -> float:
        """A series of the server's /metrics (--enable-metrics), labels or not."""
        for line in requests.get(f"{self.server.base_url}/metrics", timeout=30).text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"{name} not in /metrics")

    def check_prefix_hit(self, window: int, seed: int = 2) -> None:
        """A shared prefix 3x the window, cached by a request that ends as its prefill does (its window's tokens still
        held when it is inserted), is a hit for prompts extending it (cached_tokens, --enable-cache-report) that
        decode HF's tokens."""
        prefix = random_ids(1, 3 * window, seed, self.vocab)[0]
        self.complete(prefix, 1)
        for suffix in ([11, 12, 13, 14, 15, 16, 17], [300, 301]):
            ids = prefix + suffix
            text, usage = self.complete(ids, 10)
            cached = usage.prompt_tokens_details.cached_tokens
            self.assertGreaterEqual(cached, 2 * window)  # the prefix, borrowed with its window
            self.assertLess(cached, len(ids))
            self.assertEqual(text, self.tok.decode(self.hf_greedy(ids, 10)))

    def check_bad_field(self) -> None:
        """A bad field is a 400 naming it, and the server keeps serving."""
        import openai

        with self.assertRaises(openai.BadRequestError) as err:
            self.client.completions.create(model=self.model, prompt="hi", max_tokens=-3)
        self.assertIn("max_tokens", str(err.exception))
        out = self.client.completions.create(model=self.model, prompt="hi", max_tokens=2, temperature=0)
        self.assertEqual(out.usage.completion_tokens, 2)
