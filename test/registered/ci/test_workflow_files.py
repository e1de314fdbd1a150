"""The CI workflow files are valid GitHub Actions workflows (checked by a real linter, check-jsonschema with the
vendored GitHub workflow schema) and run what the project says they run: each stack installs its own extra, the
AMD install never names torch or triton (the image's stay), and the GPU suites are ones run_suite preflights."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=8, suite="cpu")

ROOT = Path(__file__).resolve().parents[3]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
sys.path.insert(0, str(ROOT / "test"))
sys.path.insert(0, str(ROOT / "scripts"))
import check_rocm_install  # noqa: E402
import run_suite  # noqa: E402

AMD = ROOT / ".github/workflows/pr-test-amd.yml"
NVIDIA = ROOT / ".github/workflows/pr-test-nvidia.yml"
PYPROJECT = tomllib.loads((ROOT / "python/pyproject.toml").read_text())["project"]
INSTALL_SH = (ROOT / "scripts/install.sh").read_text()


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


def test_gpu_suites_get_a_preflight():
    for path, suite in ((NVIDIA, "stage-a-test-1-gpu"), (AMD, "stage-a-test-1-gpu-amd")):
        assert suite in run_suite.GPU_SUITES
        assert f"--suite {suite}" in run_steps(path)
    assert run_suite.GPU_SUITES["stage-a-test-1-gpu"] == ("cuda", ("triton", "flashinfer"))
    assert run_suite.GPU_SUITES["stage-a-test-1-gpu-amd"] == ("rocm", ("triton", "aiter"))


def names(req: str) -> str:
    m = re.match(r"[A-Za-z0-9._-]+", req)
    return m.group(0).lower() if m else req


def pip_installed_words(text: str) -> list:
    """The words after `pip install` on each line of a shell text (options included)."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        for part in re.split(r"&&|;|\|", line):
            words = shlex.split(part.split("#", 1)[0]) if "pip" in part else []
            if "pip" in words and "install" in words:
                out += words[words.index("install") + 1:]
    return out


def test_base_dependencies_name_no_triton_and_each_stack_has_its_extra():
    base = {names(r) for r in PYPROJECT["dependencies"]}
    assert "torch" in base and not base & {"triton", "xgrammar", "flashinfer-python", "amd-aiter"}
    extras = {k: {names(r) for r in v} for k, v in PYPROJECT["optional-dependencies"].items()}
    assert {"triton", "xgrammar"} <= extras["cpu"]
    assert {"flashinfer-python", "xgrammar"} <= extras["cuda"]
    assert "amd-aiter" in extras["rocm"] and not extras["rocm"] & {"torch", "triton", "xgrammar"}
    assert not extras["test"] & {"torch", "triton", "xgrammar"}
    pins = {r for k in ("cpu", "cuda") for r in PYPROJECT["optional-dependencies"][k] if names(r) == "xgrammar"}
    assert pins == {re.search(r'XGRAMMAR="([^"]+)"', INSTALL_SH).group(1)}  # the ROCm install's --no-deps pin


def test_the_extras_that_name_triton_require_the_kernels_minimum():
    from sglang.srt.layers.attention.triton_ops.jit_mode import MIN_TRITON_INTERPRETER_TEXT, MIN_TRITON_TEXT

    # cpu runs the kernels in the interpreter; rocm cannot name triton (pytorch-triton-rocm): jit_mode's check guards it
    for extra, minimum in (("cpu", MIN_TRITON_INTERPRETER_TEXT), ("cuda", MIN_TRITON_TEXT)):
        specs = [r.split(";")[0].strip() for r in PYPROJECT["optional-dependencies"][extra] if names(r) == "triton"]
        assert specs == [f"triton>={minimum}"], (extra, specs)


def test_the_cpu_install_takes_the_cpu_extra():
    assert '-e "python[cpu${extras}${extras:+,test-cpu}]"' in INSTALL_SH and 'extras=",test"' in INSTALL_SH
    # the CPU-only test tools (their torch floor is above what a ROCm image may bring) ride with --test on CPU only
    assert "test-cpu" in PYPROJECT["optional-dependencies"] and "test-cpu" not in INSTALL_SH.split("else")[0]
    assert "bash scripts/install.sh --test" in (ROOT / ".ci/run").read_text()


def test_the_amd_install_keeps_the_images_torch_and_triton():
    step = check_rocm_install.install_step(AMD)
    assert check_rocm_install.commands(step) == ["bash scripts/install.sh --rocm --test"]
    docker_runs = check_rocm_install.dockerfile_runs(ROOT / "docker/Dockerfile.rocm")
    assert "bash scripts/install.sh --rocm --test" in docker_runs
    for text in (run_steps(AMD), (ROOT / "docker/Dockerfile.rocm").read_text()):
        named = {names(w) for w in pip_installed_words(text) if not w.startswith("-")}
        assert not named & {"torch", "triton", "pytorch-triton-rocm"}, named
        assert 'python[test]' not in text
    rocm = INSTALL_SH.split('if [[ "$stack" == rocm ]]; then', 1)[1].split("\nelse\n", 1)[0]
    assert '--no-deps "$XGRAMMAR"' in rocm and '-c "$keep" -e "python[rocm${extras}]"' in rocm
    installed = [w for line in rocm.splitlines() if line.strip().startswith("$PIP_INSTALL")
                 for w in shlex.split(line)[1:] if not w.startswith("-")]
    # xgrammar alone (--no-deps), then the rest under the constraints file; its requirements are filtered in Python
    assert installed == ["$XGRAMMAR", "$keep", "python[rocm${extras}]", "${xgrammar_reqs[@]}"], installed
    assert 'name not in ("torch", "triton")' in rocm


def test_the_nvidia_install_takes_cuda_torch_first_then_the_cuda_extra():
    for text in (run_steps(NVIDIA), (ROOT / "docker/Dockerfile").read_text()):
        torch_at = text.index("install torch --index-url")
        assert "download.pytorch.org/whl/cu128" in text
        assert torch_at < text.index('pip install -e "python[cuda,test]"')
        assert 'python[test]' not in text


def test_dockerfiles():
    cuda = (ROOT / "docker/Dockerfile").read_text()
    rocm = (ROOT / "docker/Dockerfile.rocm").read_text()
    assert "FROM nvidia/cuda" in cuda and "rocm/pytorch" in rocm
    for text in (cuda, rocm):
        assert "sglang" in text.split("CMD", 1)[1]
    assert "COPY scripts/ scripts/" in rocm


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
