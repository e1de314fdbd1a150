"""What a CPU start reuses from an earlier one (mem_plan/measurement_cache.py, model_executor/activation_cache.py,
configs/hf_config_snapshot.py), checked on real values, never on timings:

* the activation peak: a second sglang.Engine start with the same flags reads the first start's measurement (the same
  bytes, the plan's note and /server_info name the file); a different --chunked-prefill-size measures again under
  another key that differs from the first in exactly that input; a different dtype or thread count is another key;
  the HTTP server of the same inputs reports the cached measurement in /server_info;
* the file is used only for its exact key (a tampered, corrupt or mismatched file is measured again);
  SGLANG_REMEASURE_ACTIVATIONS=1 measures again and overwrites it;
* the config snapshot gives back every value AutoConfig resolves, and the tokenizer AutoTokenizer builds from it is
  the one AutoTokenizer builds on its own.
"""

import dataclasses
import json
import os
import shutil
import tempfile
import unittest
import unittest.mock

import requests
import torch

from sglang.srt.mem_plan.measurement_cache import (
    CACHE_DIR_ENV,
    REMEASURE_ENV,
    cache_file,
    cached_measurement,
    read_cached,
)
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import assert_idle_and_intact, default_model_dir, shutdown
from sglang.test.test_utils import DEFAULT_TEST_ENV, popen_launch_server

register_cpu_ci(est_time=60, suite="cpu")

ENGINE_ARGS = {"max_total_tokens": 4096, "max_running_requests": 8, "log_level": "warning"}


class Counter:
    def __init__(self, value: int):
        self.value, self.calls = value, 0

    def __call__(self) -> int:
        self.calls += 1
        return self.value


class TestMeasurementCacheFile(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.key = {"model": "m", "chunk_tokens": 2048}

    def test_measured_once_then_read_for_the_same_key_only(self):
        first = cached_measurement(self.dir, "peak", self.key, Counter(1234))
        self.assertEqual((first.value_bytes, first.cached, first.source), (1234, False, "measured"))
        again = Counter(999)
        second = cached_measurement(self.dir, "peak", dict(self.key), again)
        self.assertEqual((second.value_bytes, second.cached, again.calls), (1234, True, 0))
        self.assertEqual(second.path, first.path)
        self.assertEqual(second.source, f"measured (cached {first.path})")
        other = cached_measurement(self.dir, "peak", {**self.key, "chunk_tokens": 1024}, Counter(555))
        self.assertEqual((other.value_bytes, other.cached), (555, False))
        self.assertNotEqual(other.path, first.path)

    def test_corrupt_or_foreign_file_is_measured_again(self):
        path = cache_file(self.dir, "peak", self.key)
        cached_measurement(self.dir, "peak", self.key, Counter(1234))
        with open(path) as f:
            data = json.load(f)
        data["key"] = {**self.key, "model": "another"}  # a file whose key is not this start's
        with open(path, "w") as f:
            json.dump(data, f)
        self.assertIsNone(read_cached(path, self.key))
        self.assertEqual(cached_measurement(self.dir, "peak", self.key, Counter(77)).value_bytes, 77)
        with open(path, "w") as f:
            f.write("{not json")
        self.assertEqual(cached_measurement(self.dir, "peak", self.key, Counter(78)).cached, False)
        self.assertEqual(read_cached(path, self.key), 78)

    def test_remeasure_switch_overwrites(self):
        cached_measurement(self.dir, "peak", self.key, Counter(1234))
        os.environ[REMEASURE_ENV] = "1"
        try:
            m = cached_measurement(self.dir, "peak", self.key, Counter(4321))
        finally:
            del os.environ[REMEASURE_ENV]
        self.assertEqual((m.value_bytes, m.cached), (4321, False))
        self.assertEqual(cached_measurement(self.dir, "peak", self.key, Counter(1)).value_bytes, 4321)


class TestHFConfigSnapshot(unittest.TestCase):
    def test_snapshot_equals_autoconfig_and_gives_the_same_tokenizer(self):
        from transformers import AutoConfig, AutoTokenizer

        from sglang.srt.configs.hf_config_snapshot import (
            config_values,
            load_hf_config,
            read_snapshot,
            tokenizer_kwargs,
            write_snapshot,
        )
        from sglang.srt.utils.hf_transformers_utils import get_tokenizer

        model_dir = default_model_dir()
        cache = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, cache, True)
        self.assertIsNone(read_snapshot(model_dir, cache))
        full = load_hf_config(model_dir, cache)  # no snapshot yet: AutoConfig, then written
        self.assertEqual(type(full), type(AutoConfig.from_pretrained(model_dir)))
        snap = load_hf_config(model_dir, cache)
        self.assertEqual(type(snap).__name__, "HFConfigSnapshot")
        values = config_values(full)
        self.assertGreater(len(values), 20)
        for name, value in values.items():
            self.assertEqual((name, type(getattr(snap, name)), getattr(snap, name)), (name, type(value), value))
        self.assertIsNone(getattr(snap, "text_config", None))  # absent attributes stay absent

        self.assertIn("config", tokenizer_kwargs(model_dir, cache))
        ref = AutoTokenizer.from_pretrained(model_dir)
        tok = get_tokenizer(model_dir, cache)
        self.assertEqual(type(tok), type(ref))
        self.assertEqual(tok.get_vocab(), ref.get_vocab())
        self.assertEqual(tok.all_special_tokens, ref.all_special_tokens)
        self.assertEqual(tok.chat_template, ref.chat_template)
        msgs = [{"role": "user", "content": "Hello there, what is 2+2?"}]
        self.assertEqual(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
                         ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
        text = "Grüße, 世界! def f(x): return x**2\n"
        self.assertEqual(tok.encode(text), ref.encode(text))

        # a changed config.json is another key: no snapshot for it
        copy = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, copy, True)
        for f in ("config.json", "tokenizer_config.json", "tokenizer.json"):
            shutil.copy(os.path.join(model_dir, f), copy)
        self.assertIsNotNone(write_snapshot(full, copy, cache))
        with open(os.path.join(copy, "config.json")) as f:
            cfg = json.load(f)
        cfg["rms_norm_eps"] = 1e-6
        with open(os.path.join(copy, "config.json"), "w") as f:
            json.dump(cfg, f)
        self.assertIsNone(read_snapshot(copy, cache))

    def test_non_plain_values_are_never_snapshotted(self):
        from sglang.srt.configs.hf_config_snapshot import write_snapshot

        class WithSubConfig:
            def __init__(self):
                self.hidden_size = 8
                self.vision_config = object()

        cache = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, cache, True)
        self.assertIsNone(write_snapshot(WithSubConfig(), default_model_dir(), cache))
        self.assertEqual(os.listdir(cache), [])


class TestActivationPeakReuse(unittest.TestCase):
    """Engine starts with their own cache directory (set for this class only)."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp()
        cls.saved = {k: os.environ.get(k) for k in (CACHE_DIR_ENV, "OMP_WAIT_POLICY")}
        os.environ[CACHE_DIR_ENV] = cls.dir
        os.environ.update(DEFAULT_TEST_ENV)  # the server below runs with it: the same key as these engines

    @classmethod
    def tearDownClass(cls):
        for k, v in cls.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(cls.dir, True)

    def start(self, **kwargs):
        import sglang

        engine = sglang.Engine(**ENGINE_ARGS, **kwargs)
        info = engine.get_server_info()
        return engine, info["memory_plan"], info["memory_plan_per_rank"][0]

    def peak_files(self) -> list:
        from sglang.srt.model_executor.activation_cache import CACHE_NAME

        return sorted(f for f in os.listdir(self.dir) if f.startswith(CACHE_NAME))

    def stored(self, source: str) -> dict:
        path = source[len("measured (cached "):-1]
        with open(path) as f:
            return json.load(f)

    def test_second_start_reads_it_and_a_changed_input_measures_again(self):
        from sglang.srt.model_executor.activation_cache import CACHE_NAME, activation_cache_key

        a, plan_a, rank_a = self.start()
        shutdown(a)
        self.assertEqual(rank_a["activation_source"], "measured")
        self.assertFalse(any("cached" in n for n in plan_a["notes"]))
        self.assertEqual(len(self.peak_files()), 1, os.listdir(self.dir))

        b, plan_b, rank_b = self.start()
        try:
            self.assertTrue(rank_b["activation_source"].startswith("measured (cached "), rank_b)
            stored = self.stored(rank_b["activation_source"])
            self.assertEqual(rank_b["activation_bytes"], rank_a["activation_bytes"])
            self.assertEqual(stored["value_bytes"], rank_a["activation_bytes"])
            terms_a = {t["name"]: t for t in plan_a["terms"]}
            terms_b = {t["name"]: t for t in plan_b["terms"]}
            self.assertEqual(terms_b["activations"], terms_a["activations"])
            self.assertTrue(any(rank_b["activation_source"][len("measured (cached "):-1] in n
                                for n in plan_b["notes"]), plan_b["notes"])
            out = b.generate("The capital of France is", {"max_new_tokens": 4, "temperature": 0})
            self.assertEqual(out["meta_info"]["completion_tokens"], 4)
            assert_idle_and_intact(b)

            # the key names every input: a changed dtype or thread count is another file
            runner = b.scheduler.model_runner
            key = activation_cache_key(runner, 2048)
            self.assertEqual(key, stored["key"])
            mc = runner.model_config
            proxy = dataclasses.replace(mc, facts=dataclasses.replace(mc.facts, dtype="float32"))
            with unittest.mock.patch.object(runner, "model_config", proxy):
                self.assertEqual(activation_cache_key(runner, 2048)["forward"]["dtype"], "float32")
                self.assertNotEqual(cache_file(self.dir, CACHE_NAME, activation_cache_key(runner, 2048)),
                                    cache_file(self.dir, CACHE_NAME, key))
            threads = torch.get_num_threads()
            torch.set_num_threads(1 if threads > 1 else 2)
            try:
                self.assertNotEqual(activation_cache_key(runner, 2048)["machine"], key["machine"])
            finally:
                torch.set_num_threads(threads)
        finally:
            shutdown(b)

        c, _, rank_c = self.start(chunked_prefill_size=1024)
        shutdown(c)
        self.assertEqual(rank_c["activation_source"], "measured")
        self.assertEqual(len(self.peak_files()), 2)
        keys = [json.load(open(os.path.join(self.dir, f)))["key"] for f in self.peak_files()]
        diff = {(s, k) for s in keys[0] for k in keys[0][s] if keys[0][s][k] != keys[1][s][k]}
        self.assertEqual(diff, {("forward", "chunk_tokens")})

        # the HTTP server with the same inputs reads it too, and says so in /server_info
        server = popen_launch_server(other_args=["--max-total-tokens", "4096", "--max-running-requests", "8"],
                                     command=["sglang", "serve"])
        try:
            info = requests.get(f"{server.base_url}/server_info", timeout=30).json()
            rank = info["memory_plan_per_rank"][0]
            self.assertTrue(rank["activation_source"].startswith("measured (cached "), rank)
            self.assertEqual(rank["activation_bytes"], rank_a["activation_bytes"])
            self.assertTrue(any("measured (cached" in n for n in info["memory_plan"]["notes"]))
            self.assertIn("activation peak measured (cached", server.log())
        finally:
            server.kill()


if __name__ == "__main__":
    unittest.main()
