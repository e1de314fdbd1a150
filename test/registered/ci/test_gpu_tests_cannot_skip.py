"""The GPU suites' tests cannot pass by skipping: inside a GPU suite (run_suite sets SUITE_GPU_ENV) a test that finds
no GPU fails, saying so; a backend whose library does not import fails its test (on any machine), naming the
package; and no GPU test file skips or `continue`s past a backend on its own terms."""

import ast
import sys
import textwrap
import unittest
from pathlib import Path

import pytest
import torch

from sglang.test import gpu_backends
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.gpu_backends import SUITE_GPU_ENV, require_library, requires_gpu, skip_or_fail

register_cpu_ci(est_time=10, suite="cpu")

TEST_DIR = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(TEST_DIR))
import run_suite  # noqa: E402

GPU_FILES = sorted({e.path for e in run_suite.collect() if e.marker in ("register_cuda_ci", "register_amd_ci")})
# modules the GPU test files share (not test files themselves)
SHARED = [TEST_DIR / "registered" / "attention" / "backend_fixtures.py"]
SKIPPING_CALLS = {"skipTest", "skipIf", "skipUnless", "skip", "importorskip", "missing_library"}


def test_the_gpu_suites_have_files():
    assert len(GPU_FILES) >= 8, GPU_FILES
    assert run_suite.SUITE_GPU_ENV == SUITE_GPU_ENV


@pytest.mark.parametrize("path", GPU_FILES + SHARED, ids=lambda p: p.name)
def test_no_gpu_test_skips_on_its_own_terms(path):
    """Skips go through gpu_backends (requires_gpu, skip_or_fail), which fail instead inside a GPU suite."""
    tree = ast.parse(path.read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    names = [getattr(c.func, "id", None) or getattr(c.func, "attr", None) for c in calls]
    bad = sorted({n for n in names if n in SKIPPING_CALLS})
    assert not bad, f"{path.name} calls {bad}"
    if path in GPU_FILES:
        assert "requires_gpu" in names, f"{path.name}: its test classes need @requires_gpu(...)"


def run_case(cls) -> unittest.TestResult:
    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(cls).run(result)
    return result


def no_gpu_case():
    class Case(unittest.TestCase):
        def test_something(self):
            pass

    return requires_gpu()(Case)


def test_requires_gpu_skips_outside_a_gpu_suite_and_fails_inside_one(monkeypatch):
    monkeypatch.setattr(gpu_backends, "gpu_kind", lambda: None)
    monkeypatch.delenv(SUITE_GPU_ENV, raising=False)
    outside = run_case(no_gpu_case())
    assert outside.wasSuccessful() and len(outside.skipped) == 1
    assert "needs a CUDA or ROCm GPU" in outside.skipped[0][1]

    monkeypatch.setenv(SUITE_GPU_ENV, "rocm")
    inside = run_case(no_gpu_case())
    assert not inside.wasSuccessful() and not inside.skipped
    message = inside.errors[0][1]
    assert "needs a ROCm GPU" in message and f"{SUITE_GPU_ENV}=rocm" in message and "not a skip" in message


def test_requires_gpu_inside_a_suite_wants_the_suites_platform(monkeypatch):
    monkeypatch.setattr(gpu_backends, "gpu_kind", lambda: "cuda")
    monkeypatch.setenv(SUITE_GPU_ENV, "rocm")
    result = run_case(no_gpu_case())
    assert not result.wasSuccessful() and "needs a ROCm GPU (this one is cuda)" in result.errors[0][1]
    monkeypatch.setenv(SUITE_GPU_ENV, "cuda")
    assert run_case(no_gpu_case()).wasSuccessful()


def test_skip_or_fail(monkeypatch):
    class Case(unittest.TestCase):
        def test_interpreted(self):
            skip_or_fail(self, "TRITON_INTERPRET is set")

    monkeypatch.delenv(SUITE_GPU_ENV, raising=False)
    assert len(run_case(Case).skipped) == 1
    monkeypatch.setenv(SUITE_GPU_ENV, "cuda")
    result = run_case(Case)
    assert not result.skipped and "TRITON_INTERPRET is set" in result.failures[0][1]


def test_a_missing_backend_library_fails_naming_it(monkeypatch):
    monkeypatch.setitem(gpu_backends.LIBRARIES, "flashinfer", ("no_such_module_5b2d", "python[cuda]"))
    with pytest.raises(AssertionError, match=r"flashinfer: the 'no_such_module_5b2d' package does not import "
                                             r"\(ModuleNotFoundError.*\); it comes from python\[cuda\]"):
        require_library("flashinfer")
    require_library("triton")  # installed here (the CPU suite runs its kernels interpreted)


def test_the_shared_backend_loop_fails_a_backend_whose_library_is_missing(monkeypatch):
    sys.path.insert(0, str(TEST_DIR / "registered" / "attention"))
    import backend_fixtures

    monkeypatch.setattr(backend_fixtures, "platform_backends", lambda: ["triton", "aiter"])
    monkeypatch.setitem(gpu_backends.LIBRARIES, "aiter", ("no_such_module_77e0", "scripts/install.sh --rocm"))
    checked = []

    class Case(unittest.TestCase):
        def test_each(self):
            backend_fixtures.for_each_platform_backend(self, checked.append)

    result = run_case(Case)
    assert checked == ["triton"] and not result.skipped
    assert len(result.failures) == 1 and "no_such_module_77e0" in result.failures[0][1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_gpu_test_run_by_run_suite_inside_a_gpu_suite_fails_where_it_skipped(tmp_path):
    path = tmp_path / "test_needs_gpu.py"
    path.write_text(textwrap.dedent("""
        import unittest
        from sglang.test.gpu_backends import requires_gpu

        @requires_gpu()
        class TestOnGpu(unittest.TestCase):
            def test_kernel(self):
                pass
        """))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"]
    outside = run_suite.run_group(cmd, [str(path)], limit_s=120, env={SUITE_GPU_ENV: ""})
    assert outside.rc == 0 and any("needs a CUDA or ROCm GPU" in x for x in outside.tail)
    inside = run_suite.run_group(cmd, [str(path)], limit_s=120, env={SUITE_GPU_ENV: "cuda"})
    assert inside.rc == 1 and any("needs a CUDA GPU" in x for x in inside.tail), inside.tail


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
