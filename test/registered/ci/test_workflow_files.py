"""The CI workflow files are valid GitHub Actions workflows (checked by a real linter, check-jsonschema with the
vendored GitHub workflow schema) and run what the project says they run."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=8, suite="cpu")

ROOT = Path(__file__).resolve().parents[3]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def lint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(path)],
        capture_output=True, text=True, timeout=120,
    )


def run_steps(path: Path) -> str:
    doc = yaml.safe_load(path.read_text())
    return "\n".join(step.get("run", "") for job in doc["jobs"].values() for step in job["steps"])


def test_workflows_exist():
    names = {p.name for p in WORKFLOWS}
    assert {"pr-test-cpu.yml", "pr-test-nvidia.yml", "pr-test-amd.yml"} <= names


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_passes_schema(path):
    result = lint(path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_linter_catches_a_broken_workflow(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text((ROOT / ".github/workflows/pr-test-cpu.yml").read_text().replace("    steps:", "    step:"))
    assert lint(broken).returncode != 0


def test_workflows_run_the_suites():
    assert "bash .ci/run" in run_steps(ROOT / ".github/workflows/pr-test-cpu.yml")
    nvidia = run_steps(ROOT / ".github/workflows/pr-test-nvidia.yml")
    amd = run_steps(ROOT / ".github/workflows/pr-test-amd.yml")
    assert "test/run_suite.py --suite stage-a-test-1-gpu" in nvidia
    assert "test/run_suite.py --suite stage-a-test-1-gpu-amd" in amd
    for path in (ROOT / ".github/workflows/pr-test-nvidia.yml", ROOT / ".github/workflows/pr-test-amd.yml"):
        for job in yaml.safe_load(path.read_text())["jobs"].values():
            assert "self-hosted" in job["runs-on"]


def test_dockerfiles():
    cuda = (ROOT / "docker/Dockerfile").read_text()
    rocm = (ROOT / "docker/Dockerfile.rocm").read_text()
    assert "FROM nvidia/cuda" in cuda and "rocm/pytorch" in rocm
    for text in (cuda, rocm):
        assert 'pip install -e "python[test]"' in text and "sglang" in text.split("CMD", 1)[1]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
