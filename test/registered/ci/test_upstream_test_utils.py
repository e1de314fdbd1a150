"""Upstream's test utilities keep upstream's meaning here (issue 28): an upstream-style test file -- CustomTestCase,
DEFAULT_URL_FOR_TEST, a DEFAULT_*_MODEL_* constant, popen_launch_server(model, base_url, timeout, api_key,
other_args, return_stdout_stderr, device), kill_process_tree from sglang.srt.utils, encode_image_base64 from
sglang.utils -- runs against a real server after changing only its model name.

The upstream-style class at the bottom is written as such a file is; the other tests check each name's behaviour
against an independent observation (psutil's process table, PIL's decode, unittest's own result object).
"""

import base64
import io
import os
import subprocess
import sys
import textwrap
import time
import unittest

import psutil
import pytest
import requests
from PIL import Image

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=35, suite="cpu")

from sglang.srt.model_loader.model_path import default_model_path  # noqa: E402
from sglang.srt.utils import get_device, is_cuda, is_hip, is_npu, kill_child_process, kill_process_tree  # noqa: E402
from sglang.test import test_utils  # noqa: E402
from sglang.test.test_utils import (  # noqa: E402
    DEFAULT_SMALL_MODEL_NAME_FOR_TEST,
    DEFAULT_SMALL_SERVER_ARGS,
    DEFAULT_TIMEOUT_FOR_SERVER_LAUNCH,
    DEFAULT_URL_FOR_TEST,
    STDERR_FILENAME,
    STDOUT_FILENAME,
    CustomTestCase,
    is_in_ci,
    popen_launch_server,
)
from sglang.utils import encode_image_base64, launch_server_cmd, terminate_process, wait_for_server  # noqa: E402

# a parent that starts a sleeping child and prints the child's pid
TREE = textwrap.dedent("""
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print(child.pid, flush=True)
    time.sleep(60)
""")


def _spawn_tree():
    parent = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    child_pid = int(parent.stdout.readline())
    return parent, child_pid


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_platform_predicates_on_this_cpu_machine():
    import torch

    assert is_cuda() is (bool(torch.version.cuda) and torch.cuda.is_available())
    assert is_hip() is False and is_npu() is False
    assert get_device() == ("cuda" if torch.cuda.is_available() else "cpu")


def test_kill_process_tree_and_kill_child_process():
    parent, child = _spawn_tree()
    kill_process_tree(parent.pid)  # upstream: the parent too, by default
    parent.wait(10)
    assert _gone(parent.pid) and _gone(child)

    parent, child = _spawn_tree()
    try:
        kill_child_process(parent.pid)  # upstream: the children only
        deadline = time.time() + 10
        while not _gone(child) and time.time() < deadline:
            time.sleep(0.05)
        assert _gone(child)
        assert parent.poll() is None, "kill_child_process must keep the parent"
    finally:
        parent.kill()
        parent.wait(10)


def test_encode_image_base64_from_path_bytes_and_pil(tmp_path):
    img = Image.new("RGB", (7, 5), (10, 200, 30))
    img.putpixel((3, 2), (255, 0, 128))
    path = tmp_path / "x.png"
    img.save(path)
    raw = path.read_bytes()
    assert encode_image_base64(str(path)) == encode_image_base64(raw) == base64.b64encode(raw).decode()
    decoded = Image.open(io.BytesIO(base64.b64decode(encode_image_base64(img)))).convert("RGB")
    assert decoded.tobytes() == img.tobytes()
    with pytest.raises(TypeError, match="path, bytes or a PIL image"):
        encode_image_base64(3)


def test_model_constants(monkeypatch):
    assert DEFAULT_SMALL_MODEL_NAME_FOR_TEST == default_model_path()
    from sglang.test.test_utils import DEFAULT_SMALL_EMBEDDING_MODEL_NAME_FOR_TEST

    assert DEFAULT_SMALL_EMBEDDING_MODEL_NAME_FOR_TEST == default_model_path()
    with pytest.raises(ImportError, match="mixture-of-experts.*make_random_mixtral.*DEFAULT_MOE_MODEL_NAME_FOR_TEST"):
        from sglang.test.test_utils import DEFAULT_MOE_MODEL_NAME_FOR_TEST  # noqa: F401
    monkeypatch.setenv("DEFAULT_MOE_MODEL_NAME_FOR_TEST", "/models/my-moe")
    assert test_utils.DEFAULT_MOE_MODEL_NAME_FOR_TEST == "/models/my-moe"
    assert not hasattr(test_utils, "NOT_AN_UPSTREAM_NAME")
    port = int(DEFAULT_URL_FOR_TEST.rsplit(":", 1)[1])
    assert DEFAULT_URL_FOR_TEST.startswith("http://127.0.0.1:") and 0 < port < 65536


def test_is_in_ci(monkeypatch):
    for var in ("SGLANG_IS_IN_CI", "CI"):
        monkeypatch.delenv(var, raising=False)
    assert is_in_ci() is False
    monkeypatch.setenv("SGLANG_IS_IN_CI", "true")
    assert is_in_ci() is True


def _run(case_cls) -> unittest.TestResult:
    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(case_cls).run(result)
    return result


def test_custom_test_case_retries_and_tears_down(monkeypatch):
    calls = []

    class Flaky(CustomTestCase):
        def test_once_wrong(self):
            calls.append(1)
            self.assertGreater(len(calls), 1)

    monkeypatch.setenv("SGLANG_TEST_MAX_RETRY", "0")
    assert len(_run(Flaky).failures) == 1
    calls.clear()
    monkeypatch.setenv("SGLANG_TEST_MAX_RETRY", "1")
    result = _run(Flaky)
    assert result.wasSuccessful() and len(calls) == 2

    torn = []

    class BrokenSetup(CustomTestCase):
        @classmethod
        def setUpClass(cls):
            cls.resource = "started"
            raise RuntimeError("launch failed")

        @classmethod
        def tearDownClass(cls):
            torn.append(cls.resource)

        def test_nothing(self):
            pass

    result = _run(BrokenSetup)
    assert torn == ["started"], "a failing setUpClass must still run tearDownClass"
    assert "launch failed" in result.errors[0][1]


def test_launch_server_cmd_wait_and_terminate():
    process, port = launch_server_cmd(f"python -m sglang.launch_server {' '.join(DEFAULT_SMALL_SERVER_ARGS)}")
    try:
        wait_for_server(f"http://127.0.0.1:{port}", timeout=DEFAULT_TIMEOUT_FOR_SERVER_LAUNCH)
        children = [c.pid for c in psutil.Process(process.pid).children(recursive=True)]
        assert children, "the server runs its scheduler in a child process"
        assert requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).status_code == 200
    finally:
        terminate_process(process)
    assert process.wait(10) is not None
    assert all(_gone(pid) for pid in children)


class TestUpstreamStyleFile(CustomTestCase):
    """Written as an upstream test file is; only the model name is this project's."""

    @classmethod
    def setUpClass(cls):
        cls.model = DEFAULT_SMALL_MODEL_NAME_FOR_TEST
        cls.base_url = DEFAULT_URL_FOR_TEST
        cls.api_key = "sk-123456"
        cls.stdout = open(STDOUT_FILENAME, "w")
        cls.stderr = open(STDERR_FILENAME, "w")
        cls.process = popen_launch_server(
            cls.model,
            cls.base_url,
            timeout=DEFAULT_TIMEOUT_FOR_SERVER_LAUNCH,
            api_key=cls.api_key,
            other_args=DEFAULT_SMALL_SERVER_ARGS,
            return_stdout_stderr=(cls.stdout, cls.stderr),
            device="cpu",
        )

    @classmethod
    def tearDownClass(cls):
        pids = [c.pid for c in psutil.Process(cls.process.pid).children(recursive=True)] + [cls.process.pid]
        kill_process_tree(cls.process.pid)
        cls.stdout.close()
        cls.stderr.close()
        for name in (STDOUT_FILENAME, STDERR_FILENAME):
            os.remove(name)
        assert all(_gone(p) for p in pids)

    def test_chat_and_captured_output(self):
        import openai

        client = openai.Client(api_key=self.api_key, base_url=f"{self.base_url}/v1")
        r = client.chat.completions.create(model=self.model, messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=4, temperature=0)
        self.assertEqual(r.usage.completion_tokens, 4)
        self.assertIsNone(self.process.poll())
        with open(STDOUT_FILENAME) as f:
            self.assertIn(f"SGLang server ready at {self.base_url}", f.read())
        with open(STDERR_FILENAME) as f:
            stderr = f.read()
        self.assertTrue(stderr.strip(), "the server's stderr (its log) reaches the file given for it")
        self.assertNotIn("SGLang server ready at", stderr)


def test_get_tokenizer_takes_the_gguf_path():
    # upstream tests call get_tokenizer(DEFAULT_SMALL_MODEL_NAME_FOR_TEST): here that is the bundled .gguf file
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer
    from sglang.test.engine_fixtures import default_model_dir

    from_gguf, served = get_tokenizer(DEFAULT_SMALL_MODEL_NAME_FOR_TEST), get_tokenizer(default_model_dir())
    text = "Hello, world! <|im_start|>user\nCount: 1 2 3<|im_end|>"
    assert from_gguf(text).input_ids == served(text).input_ids
    assert from_gguf.eos_token == served.eos_token and from_gguf.chat_template == served.chat_template
