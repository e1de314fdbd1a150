"""A triton older than the kernels need (no `triton.knobs`, as in 3.1-3.3, which torch 2.5-2.7 wheels bring) is
refused where the kernels are reached -- importing the attention or MoE kernels, picking the Triton backend at
startup -- with one message naming the version found and the one needed (triton_ops/jit_mode.py). No GPU needed:
the old triton is a module object put in sys.modules for the test, with a __version__ and no `knobs`."""

import importlib
import importlib.machinery
import sys
import types

import pytest

from sglang.srt.layers.attention.triton_ops.jit_mode import (MIN_TRITON_INTERPRETER_TEXT, MIN_TRITON_TEXT,
                                                              triton_interpreter_problem, triton_version_problem)
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=3, suite="cpu")

KERNEL_PACKAGES = ("sglang.srt.layers.attention.triton_ops", "sglang.srt.layers.moe.triton_ops")
OLD = "3.3.1"


class _Anything:
    def __call__(self, *args, **kwargs):
        return self


def _put_triton(monkeypatch, version: str, interpret=None):
    """sys.modules holds a triton of `version` (with `knobs` when interpret is not None) and none of the kernel
    modules (all restored after)."""
    fake = types.ModuleType("triton")
    fake.__version__ = version
    if interpret is not None:
        fake.knobs = types.SimpleNamespace(runtime=types.SimpleNamespace(interpret=interpret))
    fake.__spec__ = importlib.machinery.ModuleSpec("triton", None)
    fake.language = types.ModuleType("triton.language")
    fake.language.__getattr__ = lambda name: _Anything()  # tl.constexpr, tl.float32, ...: present in 3.1-3.3 too
    fake.jit = lambda fn: fn
    monkeypatch.setitem(sys.modules, "triton", fake)
    monkeypatch.setitem(sys.modules, "triton.language", fake.language)
    for name in [n for n in sys.modules if n.startswith(KERNEL_PACKAGES)]:
        monkeypatch.delitem(sys.modules, name)
    return fake


@pytest.fixture
def old_triton(monkeypatch):
    return _put_triton(monkeypatch, OLD)


def _names_both_versions(text: str) -> None:
    assert f"triton {OLD} is installed" in text and f"triton >= {MIN_TRITON_TEXT}" in text, text


def test_versions_accepted_and_refused():
    assert MIN_TRITON_TEXT == "3.4"
    for ok in ("3.4.0", "3.4.0+git7f1e8b2", "3.5.0rc1", "3.10.1", "4.0.0"):
        assert triton_version_problem(ok) is None, ok
    for old in ("3.3.1", "3.1.0", "2.3.1", "3.3.0+rocm6.2", "nightly"):
        problem = triton_version_problem(old)
        assert problem and f"triton {old} is installed" in problem and "torch_native" in problem, old


@pytest.mark.parametrize("module", ["sglang.srt.layers.attention.triton_ops",
                                    "sglang.srt.layers.attention.triton_ops.decode_attention",
                                    "sglang.srt.layers.moe.triton_ops.fused_moe"])
def test_importing_the_kernels_names_the_versions(old_triton, module):
    with pytest.raises(ImportError) as e:
        importlib.import_module(module)
    _names_both_versions(str(e.value))


def test_moe_experts_on_a_gpu_name_the_versions(old_triton):
    from sglang.srt.layers.moe.dispatch import get_fused_experts

    with pytest.raises(ImportError) as e:
        get_fused_experts("triton")  # what a MoE layer on a GPU builds with (mem_plan/moe_sizes.moe_impl_for)
    _names_both_versions(str(e.value))


def test_the_backend_reports_it_at_startup_and_nothing_swallows_it(old_triton):
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend, triton_interpreter_enabled

    with pytest.raises(ImportError) as e:  # not "False": an old triton is not "no interpreter"
        triton_interpreter_enabled()
    _names_both_versions(str(e.value))
    for device in ("cuda", "cuda:1", "cpu"):
        problem = TritonAttnBackend.startup_problem(device)
        assert problem and problem.startswith("--attention-backend triton cannot run here"), problem
        _names_both_versions(problem)


@pytest.mark.parametrize("interpret", [True, False])
def test_an_interpreter_too_old_for_numpy_is_refused_where_it_would_run(monkeypatch, interpret):
    """triton 3.4-3.6 compile the kernels for a GPU, but their interpreter fails on NumPy 2.4 (jit_mode.py)."""
    assert MIN_TRITON_INTERPRETER_TEXT == "3.7"
    assert triton_interpreter_problem("3.7.0") is None and "triton 3.6.0 is installed" in triton_interpreter_problem(
        "3.6.0")
    _put_triton(monkeypatch, "3.5.0", interpret=interpret)
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend, triton_interpreter_enabled
    from sglang.srt.layers.attention.triton_ops import jit_mode

    if not interpret:  # the GPU's compiled path: accepted
        assert not jit_mode.interpreted() and not triton_interpreter_enabled()
        assert TritonAttnBackend.startup_problem("cuda") is None
        return
    with pytest.raises(ImportError, match="triton 3.5.0 is installed.*TRITON_INTERPRET=1.*triton >= 3.7"):
        jit_mode.interpreted()
    problem = TritonAttnBackend.startup_problem("cpu")
    assert "triton 3.5.0 is installed" in problem and "triton >= 3.7" in problem, problem


def test_the_installed_triton_passes():
    import triton

    assert triton_version_problem(triton.__version__) is None  # the CPU suite's own triton (the cpu extra's pin)
    assert triton_interpreter_problem(triton.__version__) is None
