"""A GGUF's first start, with an empty cache: the main process loads the tokenizer beside the scheduler (it waits
for the conversion instead of loading it after the scheduler is ready), the default --quantization gguf start
writes no float32 linear layers, and a later dense start (--dtype float32) on the same cache writes them and serves
the Hugging Face reference's greedy tokens."""

import os
import tempfile
import threading
import time
import unittest

import requests
import torch

from sglang.srt.managers.tokenizer_loading import preload_tokenizer
from sglang.srt.model_loader.gguf_converter import DENSE_SHARD, LINEAR_SHARD, SHARD_INDEX
from sglang.srt.model_loader.model_path import default_model_path, ensure_converted_gguf, gguf_cache_dir
from sglang.srt.server_args import ServerArgs
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import DEFAULT_SMALL_SERVER_ARGS, popen_launch_server

register_cpu_ci(est_time=45, suite="cpu", serial=True)  # asserts a time or CPU measure: run alone

PROMPT = "The three primary colors are"
NEW_TOKENS = 12


class TestPreloadWaitsForConversion(unittest.TestCase):
    def test_waits_for_the_converted_directory(self):
        with tempfile.TemporaryDirectory() as root:
            convert = threading.Timer(0.5, ensure_converted_gguf, (default_model_path(), root, False))
            convert.start()
            got = preload_tokenizer(ServerArgs(model_cache_dir=root))
            convert.join()
            self.assertIsNotNone(got, "the preload gave up instead of waiting for the conversion")
            path, tok = got
            self.assertEqual(path, gguf_cache_dir(default_model_path(), root))
            self.assertEqual(tok.encode("Hello world", add_special_tokens=False), [19556, 905])

    def test_stops_waiting(self):
        with tempfile.TemporaryDirectory() as root:
            sa = ServerArgs(model_cache_dir=root)
            start = time.perf_counter()
            self.assertIsNone(preload_tokenizer(sa, scheduler_alive=lambda: False))  # the scheduler died
            self.assertIsNone(preload_tokenizer(sa, wait_s=0.3))  # a conversion that outlasts the wait
            self.assertLess(time.perf_counter() - start, 10)


def completion(base_url: str) -> dict:
    r = requests.post(f"{base_url}/v1/completions", json={"prompt": PROMPT, "max_tokens": NEW_TOKENS,
                                                          "temperature": 0, "ignore_eos": True}, timeout=120)
    r.raise_for_status()
    return r.json()["choices"][0]


class TestFirstStartServer(unittest.TestCase):
    def test_first_start_then_dense_start(self):
        with tempfile.TemporaryDirectory() as root:
            args = DEFAULT_SMALL_SERVER_ARGS + ["--model-cache-dir", root]
            model_dir = gguf_cache_dir(default_model_path(), root)
            server = popen_launch_server(other_args=args)
            try:
                self.assertGreater(len(completion(server.base_url)["text"]), 0)
                log = server.log()
            finally:
                server.kill()
            self.assertIn("Converting", log)
            self.assertIn("gguf", log.split("CPU ISA level", 1)[1].split("\n", 1)[0])  # the weights it served
            files = os.listdir(model_dir)
            self.assertIn(DENSE_SHARD, files)
            self.assertNotIn(LINEAR_SHARD, files)
            self.assertNotIn(SHARD_INDEX, files)

            server = popen_launch_server(other_args=args + ["--dtype", "float32"])
            try:
                text = completion(server.base_url)["text"]
                log = server.log()
            finally:
                server.kill()
            self.assertIn("Writing the float32 linear layers", log)
            self.assertIn(SHARD_INDEX, os.listdir(model_dir))
            from transformers import AutoModelForCausalLM, AutoTokenizer

            tok = AutoTokenizer.from_pretrained(model_dir)
            hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            ids = tok(PROMPT, return_tensors="pt").input_ids
            out = hf.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
            self.assertEqual(text, tok.decode(out[0, ids.shape[1]:]))


if __name__ == "__main__":
    unittest.main()
