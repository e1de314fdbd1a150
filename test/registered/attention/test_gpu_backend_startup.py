"""Choosing flashinfer or aiter where they cannot run fails at startup (before weights load or any forward) with a
message naming the device it needs, the package to install and the backend to pick instead: through
check_attention_backend, sglang.Engine and `sglang serve` (exit status and message)."""

import importlib.util
import re
import shutil
import subprocess
import sys
import time
from unittest import mock

import pytest

import sglang
from sglang.srt.layers.attention.attention_registry import check_attention_backend, get_attention_backend_class
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import find_free_port

register_cpu_ci(est_time=25, suite="cpu")

SGLANG = [shutil.which("sglang")] if shutil.which("sglang") else [sys.executable, "-m", "sglang.cli.main"]
NEEDS = {
    "flashinfer": ("NVIDIA GPU (CUDA)", "pip install flashinfer-python"),
    "aiter": ("AMD GPU (ROCm)", "pip install amd-aiter"),
}


def no_gpu_libraries():
    return all(importlib.util.find_spec(m) is None for m in NEEDS)


@pytest.mark.parametrize("backend", sorted(NEEDS))
def test_registry_names_device_package_and_alternative(backend):
    device, install = NEEDS[backend]
    with pytest.raises(ValueError) as err:
        check_attention_backend(backend, "cpu")
    msg = str(err.value)
    assert f"--attention-backend {backend}" in msg and device in msg and "--attention-backend torch_native" in msg
    if importlib.util.find_spec(backend) is None:
        assert install in msg
    check_attention_backend("torch_native", "cpu")  # runs everywhere
    check_attention_backend(None, "cpu")


def test_wrong_gpu_vendor_is_named():
    """On a GPU, each library's own vendor check speaks (find_spec mocked so only the device check is left)."""
    found = mock.patch("importlib.util.find_spec", return_value=object())
    with found, mock.patch("torch.version.hip", None):  # a CUDA build of torch
        assert get_attention_backend_class("flashinfer").startup_problem("cuda") is None
        assert "ROCm" in get_attention_backend_class("aiter").startup_problem("cuda")
    with found, mock.patch("torch.version.hip", "6.3"):  # a ROCm build
        assert get_attention_backend_class("aiter").startup_problem("cuda") is None
        assert "no ROCm build" in get_attention_backend_class("flashinfer").startup_problem("cuda")


@pytest.mark.skipif(not no_gpu_libraries(), reason="a GPU attention library is installed here")
@pytest.mark.parametrize("backend", sorted(NEEDS))
def test_engine_fails_at_startup_naming_the_fix(backend):
    device, install = NEEDS[backend]
    expected = rf"{backend} cannot run here: it needs an {re.escape(device)}.*{install}.*torch_native"
    start = time.monotonic()
    with pytest.raises(ValueError, match=expected):
        sglang.Engine(attention_backend=backend, log_level="error")
    assert time.monotonic() - start < 60  # refused before loading, not at the first forward


@pytest.mark.skipif(not no_gpu_libraries(), reason="a GPU attention library is installed here")
def test_serve_exits_nonzero_with_the_message():
    r = subprocess.run(SGLANG + ["serve", "--attention-backend", "flashinfer", "--port", str(find_free_port())],
                       capture_output=True, text=True, timeout=180)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "--attention-backend flashinfer cannot run here" in out and "pip install flashinfer-python" in out, out
