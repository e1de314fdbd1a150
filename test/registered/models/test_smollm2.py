"""SmolLM2 (bundled GGUF) through the paged KV pool vs HF transformers fp32; bf16 vs fp32 agreement.

The forward batches are built by hand (sglang.test.paged_forward) so this tests the model side alone.
"""

import unittest

import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_loader import load_model, resolve_model_path
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.hf_transformers_utils import apply_chat_template, get_tokenizer
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.paged_forward import PagedForwardDriver

register_cpu_ci(est_time=25, suite="cpu")

# No near-tie first tokens (see cpu-machine-facts.md: avoid "What is the capital of France?").
PROMPTS = [
    "Tell me a joke about cats.",
    "Write a haiku about the ocean.",
    "List three uses of a paperclip.",
    "Explain photosynthesis in one sentence.",
    "What is 17 plus 25?",
    "Translate 'good morning' into Spanish.",
    "Give me a name for a pet turtle.",
    "Why is the sky blue?",
]
NUM_NEW_TOKENS = 16


def all_logits(driver: PagedForwardDriver, tokens):
    """float32 logits [L, V] of every position of `tokens`, prefilled as one request."""
    row = driver.new_request()
    n = len(tokens)
    return driver.extend([row], [tokens], logits_indices=torch.arange(n))


class TestSmolLM2(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from transformers import LlamaForCausalLM

        torch.manual_seed(0)
        server_args = ServerArgs(dtype="float32")
        cls.model_dir = resolve_model_path(server_args)
        cls.config = ModelConfig.from_server_args(server_args, cls.model_dir)
        cls.model = load_model(cls.config)
        cls.tokenizer = get_tokenizer(cls.model_dir)
        cls.hf = LlamaForCausalLM.from_pretrained(cls.model_dir, dtype=torch.float32).eval()
        cls.prompts = [
            apply_chat_template(cls.tokenizer, [{"role": "user", "content": p}], tokenize=True) for p in PROMPTS
        ]
        cls.ours = {}  # prompt index -> greedy tokens (prefill + incremental decode through the pool)
        driver = PagedForwardDriver(cls.model, cls.config, max_reqs=len(PROMPTS) + 1, max_tokens=2048)
        for i, ids in enumerate(cls.prompts):
            cls.ours[i] = driver.greedy(ids, NUM_NEW_TOKENS)

    def test_greedy_matches_hf_and_logits_close(self):
        driver = PagedForwardDriver(self.model, self.config, max_reqs=len(PROMPTS) + 1, max_tokens=2048)
        max_diff = 0.0
        for i, ids in enumerate(self.prompts):
            seq = ids + self.ours[i]
            with torch.no_grad():
                ref = self.hf(torch.tensor([seq])).logits[0]  # [L, V]
            # HF's greedy choice at every generated position is our token
            self.assertEqual(ref[len(ids) - 1 : -1].argmax(-1).tolist(), self.ours[i], PROMPTS[i])
            ours = all_logits(driver, seq)
            max_diff = max(max_diff, (ours - ref).abs().max().item())
        print(f"SmolLM2 fp32: max |logit diff| vs HF over {len(PROMPTS)} prompts = {max_diff:.2e}")
        self.assertLess(max_diff, 1e-4)

    def test_batched_decode_equals_alone(self):
        driver = PagedForwardDriver(self.model, self.config, max_reqs=4, max_tokens=1024)
        a, b = 0, 3
        rows = [driver.new_request(), driver.new_request()]
        logits = driver.extend(rows, [self.prompts[a], self.prompts[b]])  # one batched extend, B = 2
        out = [[int(logits[0].argmax())], [int(logits[1].argmax())]]
        for _ in range(NUM_NEW_TOKENS - 1):
            logits = driver.extend(rows, [[out[0][-1]], [out[1][-1]]])  # batched decode, different lengths
            out[0].append(int(logits[0].argmax()))
            out[1].append(int(logits[1].argmax()))
        self.assertEqual(out[0], self.ours[a])
        self.assertEqual(out[1], self.ours[b])

    def test_cached_prefix_and_chunked_prefill_equal_full_prefill(self):
        driver = PagedForwardDriver(self.model, self.config, max_reqs=4, max_tokens=1024)
        seq = self.prompts[1] + self.ours[1]
        full = all_logits(driver, seq)[-1]
        row = driver.new_request()
        cut1, cut2 = 7, len(seq) - 9
        driver.extend([row], [seq[:cut1]])
        driver.extend([row], [seq[cut1:cut2]])  # extend after a cached prefix
        last = driver.extend([row], [seq[cut2:]])[0]
        torch.testing.assert_close(last, full, atol=1e-4, rtol=0)
        # a mixed batch: one request with a prefix, one fresh
        r1, r2 = driver.new_request(), driver.new_request()
        driver.extend([r1], [seq[:cut1]])
        mixed = driver.extend([r1, r2], [seq[cut1:], self.prompts[2]])
        torch.testing.assert_close(mixed[0], full, atol=1e-4, rtol=0)
        self.assertEqual(int(mixed[1].argmax()), self.ours[2][0])

    def test_bf16_top1_agreement_with_fp32(self):
        # fp32 greedy runs (our fp32 path equals HF, checked above): one long run plus the 8 short ones
        fp32_driver = PagedForwardDriver(self.model, self.config, max_reqs=2, max_tokens=1024)
        prompt = apply_chat_template(
            self.tokenizer, [{"role": "user", "content": "Write a short story about a robot who learns to paint."}], tokenize=True
        )
        runs = [(prompt, fp32_driver.greedy(prompt, 96))] + [(self.prompts[i], self.ours[i]) for i in range(len(PROMPTS))]
        bf16_config = ModelConfig.from_pretrained(self.model_dir, dtype="bfloat16")
        bf16_model = load_model(bf16_config)
        driver = PagedForwardDriver(bf16_model, bf16_config, max_reqs=len(runs) + 1, max_tokens=4096)
        agree = total = 0
        for run_index, (ids, gen) in enumerate(runs):
            # teacher-forced on the fp32 tokens: bf16 prefill of most of the run, then bf16 decode steps
            num_decode = 16 if run_index == 0 else 4
            cut = len(gen) - num_decode
            row = driver.new_request()
            top1 = driver.extend([row], [ids + gen[: cut - 1]], logits_indices=torch.arange(len(ids) - 1, len(ids) + cut - 1))
            top1 = top1.argmax(-1).tolist()
            for tok in gen[cut - 1 : -1]:
                top1.append(int(driver.extend([row], [[tok]])[0].argmax()))
            agree += sum(a == b for a, b in zip(top1, gen))
            total += len(gen)
        print(f"bf16 vs fp32 top-1 agreement over {total} teacher-forced positions: {agree / total:.3f}")
        self.assertGreaterEqual(agree / total, 0.95)


if __name__ == "__main__":
    unittest.main()
