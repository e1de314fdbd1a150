"""The ROCm install (the AMD workflow's Install step, which docker/Dockerfile.rocm runs too) leaves the image's torch
and pytorch-triton-rocm alone: scripts/check_rocm_install.py runs the step verbatim in a venv standing in for
rocm/pytorch, its main install resolving only (--resolve-only: pip's --dry-run --report, the same resolution without
unpacking ~140 packages). That run needs PyPI and ~1 min, so CI runs it as its own job beside the CPU suite
(pr-test-cpu.yml's rocm-install-check, checked here); this module tests the checker's own logic, and runs the resolve
too with SGLANG_TEST_ROCM_RESOLVE=1."""

import subprocess
import sys
import os
import urllib.request
from pathlib import Path

import pytest
import yaml

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="cpu")

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "check_rocm_install.py"
sys.path.insert(0, str(SCRIPT.parent))
import check_rocm_install  # noqa: E402

STANDIN = check_rocm_install.STANDIN_MARK
BEFORE = {"versions": {"torch": "2.9.1+rocm6.4", "pytorch-triton-rocm": "3.5.1", "triton": None, "sglang": None,
                       "amd-aiter": None, "xgrammar": None, "accelerate": None},
          "torch_init": STANDIN, "triton_init": STANDIN}
GOOD = {**BEFORE, "versions": {**BEFORE["versions"], "sglang": "0.1.0", "amd-aiter": "0.1.7", "xgrammar": "0.2.8"}}


def pypi_reachable() -> bool:
    try:
        urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=10).close()
        return True
    except OSError:
        return False


def test_the_checker_flags_a_replaced_torch_or_a_cuda_triton():
    assert check_rocm_install.problems(BEFORE, GOOD) == []
    cuda_triton = {**GOOD, "versions": {**GOOD["versions"], "triton": "3.9.0"}, "triton_init": "# CUDA triton"}
    got = check_rocm_install.problems(BEFORE, cuda_triton)
    assert len(got) == 2 and "a `triton` distribution was installed (3.9.0)" in got[0]
    new_torch = {**GOOD, "versions": {**GOOD["versions"], "torch": "2.13.0"}, "torch_init": "# real"}
    assert check_rocm_install.problems(BEFORE, new_torch) == [
        "torch changed: 2.9.1+rocm6.4 -> 2.13.0", "torch's files were replaced"]
    nothing = check_rocm_install.problems(BEFORE, BEFORE)
    assert nothing == [f"{n} was not installed" for n in ("sglang", "amd-aiter", "xgrammar")]


def report(*dists):
    return {"install": [{"metadata": {"name": n, "version": v}} for n, v in dists]}


def test_a_resolver_report_counts_as_installed():
    """--resolve-only judges pip's --report as if installed: a torch or triton in it counts as replaced."""
    xgrammar = {**BEFORE, "versions": {**BEFORE["versions"], "xgrammar": "0.2.8"}}  # installed for real first
    fine = check_rocm_install.as_if_installed(xgrammar, report(("sglang", "0.1.0"), ("amd-aiter", "0.1.7"),
                                                                ("accelerate", "1.15.0"), ("numpy", "2.4.0")))
    assert check_rocm_install.problems(BEFORE, fine) == []
    assert fine["versions"]["accelerate"] == "1.15.0"
    bad = check_rocm_install.as_if_installed(xgrammar, report(("sglang", "0.1.0"), ("amd-aiter", "0.1.7"),
                                                               ("torch", "2.13.0"), ("triton", "3.9.0")))
    assert check_rocm_install.problems(BEFORE, bad) == [
        "torch changed: 2.9.1+rocm6.4 -> 2.13.0", "torch's files were replaced",
        "a `triton` distribution was installed (3.9.0) over the module that pytorch-triton-rocm provides",
        "the `triton` module is no longer pytorch-triton-rocm's"]
    missing = check_rocm_install.as_if_installed(BEFORE, report(("sglang", "0.1.0")))
    assert check_rocm_install.problems(BEFORE, missing) == [f"{n} was not installed" for n in ("amd-aiter", "xgrammar")]


def test_the_stand_in_wheels_install_and_provide_the_triton_module(tmp_path):
    whl = check_rocm_install.wheel(tmp_path, "pytorch-triton-rocm", "3.5.1", {"triton/__init__.py": STANDIN})
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target",
                        str(target), str(whl)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (target / "triton" / "__init__.py").read_text() == STANDIN
    assert (target / "pytorch_triton_rocm-3.5.1.dist-info" / "METADATA").exists()


def test_the_cpu_workflow_runs_the_resolve_in_a_job_of_its_own():
    """The resolve below runs on every PR: a job of the CPU workflow that checks out the tree and runs it, other than
    the job that runs the CPU suite (whose time it would add to)."""
    jobs = yaml.safe_load((ROOT / ".github/workflows/pr-test-cpu.yml").read_text())["jobs"]
    runs = {name: "\n".join(s.get("run", "") for s in job["steps"]) for name, job in jobs.items()}
    resolving = [n for n, r in runs.items() if "python3 scripts/check_rocm_install.py --resolve-only" in r]
    suite = [n for n, r in runs.items() if "bash .ci/run" in r]
    assert len(resolving) == 1 and suite and resolving[0] not in suite, runs
    steps = jobs[resolving[0]]["steps"]
    assert any(s.get("uses", "").startswith("actions/checkout@") for s in steps), steps
    assert "pip install pyyaml" in runs[resolving[0]]  # the checker's one import beyond the standard library


@pytest.mark.skipif(os.environ.get("SGLANG_TEST_ROCM_RESOLVE") != "1" or not pypi_reachable(),
                    reason="CI runs it in pr-test-cpu.yml's rocm-install-check job; here: SGLANG_TEST_ROCM_RESOLVE=1 "
                           "and PyPI reachable")
def test_the_amd_install_step_leaves_torch_and_triton_alone():
    pytest.importorskip("ensurepip", reason="this Python cannot make a venv with pip (python3-venv missing)")
    r = subprocess.run([sys.executable, str(SCRIPT), "--resolve-only"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert "OK: torch 2.9.1+rocm6.4 and pytorch-triton-rocm 3.5.1 untouched, no triton distribution installed" \
        in r.stdout


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
