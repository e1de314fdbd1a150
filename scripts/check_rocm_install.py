"""Does the ROCm install leave the image's torch and triton alone? Runs the AMD workflow's Install step, verbatim,
in a fresh venv made to look like rocm/pytorch, and checks what it changed.

The stand-in image: a clean venv holding two locally built wheels, `torch` (a ROCm-style version that requires
pytorch-triton-rocm, as the ROCm torch wheels do) and `pytorch-triton-rocm` (which provides the `triton` module,
under that distribution name). Both are empty shells: pip only reads their metadata, nothing here imports them.
Then the step runs with the venv first on PATH, over a copy of python/pyproject.toml and scripts/ (so the
checkout is not written to), and afterwards:
  - torch and pytorch-triton-rocm are the stand-ins still (same version, same files);
  - no `triton` distribution was installed (that would be the CUDA wheel, over the ROCm module);
  - sglang, its rocm extra (amd-aiter) and xgrammar are installed.
docker/Dockerfile.rocm must run the same install command as the workflow (checked here too).

--resolve-only (pr-test-cpu.yml's rocm-install-check job): the step's main install (the editable `-e python[...]`,
which brings the ~90 dependencies) runs as `pip install --dry-run --report`, through install.sh's PIP: the same resolution, so the
same decision on torch and triton, without downloading and unpacking what it chose. What it would install is
checked as if installed (a torch or triton in the report counts as replaced); the steps around it run for real.

    python3 scripts/check_rocm_install.py [--keep DIR] [--torch-version V] [--root CHECKOUT] [--resolve-only]

Needs PyPI (40-80 s on two cores; --resolve-only about a quarter of the CPU time). Exit 0 and "OK ..." when all holds, 1 and each broken point if not.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ".github/workflows/pr-test-amd.yml"
DOCKERFILE = "docker/Dockerfile.rocm"
NOISE = ("WARNING: Location 'file://",)  # this machine's pip config (local indexes that lack most names)
STANDIN_MARK = "# stand-in for the rocm/pytorch image's build (scripts/check_rocm_install.py)\n"
TRITON_VERSION = "3.5.1"


def install_step(path: Path) -> str:
    """The `run` of the AMD job's step named Install."""
    doc = yaml.safe_load(path.read_text())
    runs = [s["run"] for job in doc["jobs"].values() for s in job["steps"] if s.get("name") == "Install"]
    if len(runs) != 1:
        raise SystemExit(f"{path}: expected one step named Install, found {len(runs)}")
    return runs[0]


def commands(script: str) -> list:
    """The non-empty, non-comment lines of a shell snippet."""
    return [x.strip() for x in script.splitlines() if x.strip() and not x.strip().startswith("#")]


def dockerfile_runs(path: Path) -> list:
    """Each RUN of a Dockerfile as its `&&`-separated commands (line continuations joined)."""
    text = path.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        if line.strip().startswith("RUN "):
            out += [" ".join(c.split()) for c in line.strip()[4:].split("&&")]
    return out


def wheel(dest: Path, name: str, version: str, files: dict, requires=()) -> Path:
    """A minimal py3-none-any wheel: `files` (path -> text) plus its dist-info."""
    dist = f"{name.replace('-', '_')}-{version}"
    meta = {
        f"{dist}.dist-info/METADATA": "Metadata-Version: 2.1\nName: %s\nVersion: %s\n%s" % (
            name, version, "".join(f"Requires-Dist: {r}\n" for r in requires)),
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: check_rocm_install\nRoot-Is-Purelib: true\n"
                                   "Tag: py3-none-any\n",
    }
    entries = {**files, **meta}
    record = []
    for path, text in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    out = dest / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as z:
        for path, text in entries.items():
            z.writestr(path, text)
        z.writestr(f"{dist}.dist-info/RECORD", "\n".join(record) + "\n")
    return out


def run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def venv_facts(python: Path) -> dict:
    probe = r"""
import importlib.metadata as md, importlib.util, json
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
def text(module):
    spec = importlib.util.find_spec(module)
    return open(spec.origin).read() if spec and spec.origin else None
names = ["torch", "pytorch-triton-rocm", "triton", "sglang", "amd-aiter", "xgrammar", "accelerate"]
print(json.dumps({"versions": {n: version(n) for n in names}, "torch_init": text("torch"),
                  "triton_init": text("triton")}))
"""
    out = run([str(python), "-c", probe], check=True)
    return json.loads(out.stdout)


# install.sh's $PIP under --resolve-only: the editable install only resolves, into the report at $RESOLVE_REPORT
PIP_RESOLVE_ONLY = """#!/usr/bin/env bash
for a in "$@"; do
  if [[ "$a" == -e ]]; then exec python3 -m pip "$@" --dry-run --report "$RESOLVE_REPORT"; fi
done
exec python3 -m pip "$@"
"""


def as_if_installed(facts: dict, report: dict) -> dict:
    """`facts` after pip installed what its --report says it would (a distribution it installs replaces the
    installed one's files, so torch's and triton's module text no longer count as the stand-in's)."""
    out = {**facts, "versions": dict(facts["versions"])}
    for item in report.get("install", []):
        name, version = item["metadata"]["name"].lower(), item["metadata"]["version"]
        if name in out["versions"]:
            out["versions"][name] = version
        if name == "torch":
            out["torch_init"] = f"# torch {version} as resolved"
        if name in ("triton", "pytorch-triton-rocm"):
            out["triton_init"] = f"# {name} {version} as resolved"
    return out


def problems(before: dict, after: dict) -> list:
    """What the install broke, one line each (empty: nothing)."""
    found = []
    for name in ("torch", "pytorch-triton-rocm"):
        if after["versions"][name] != before["versions"][name]:
            found.append(f"{name} changed: {before['versions'][name]} -> {after['versions'][name]}")
    if after["torch_init"] != before["torch_init"]:
        found.append("torch's files were replaced")
    if after["versions"]["triton"] is not None:
        found.append(f"a `triton` distribution was installed ({after['versions']['triton']}) over the module "
                     "that pytorch-triton-rocm provides")
    if after["triton_init"] != before["triton_init"]:
        found.append("the `triton` module is no longer pytorch-triton-rocm's")
    for name in ("sglang", "amd-aiter", "xgrammar"):
        if after["versions"][name] is None:
            found.append(f"{name} was not installed")
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--keep", help="build the venv here and keep it (default: a temporary directory)")
    p.add_argument("--torch-version", default="2.9.1+rocm6.4", help="the stand-in torch's version")
    p.add_argument("--root", type=Path, default=ROOT, help="the checkout whose workflow and files to use")
    p.add_argument("--resolve-only", action="store_true",
                   help="the editable install resolves (pip --dry-run --report) instead of installing")
    args = p.parse_args(argv)
    root = args.root.resolve()

    step = install_step(root / WORKFLOW)
    docker = dockerfile_runs(root / DOCKERFILE)
    missing = [c for c in commands(step) if c not in docker]
    found = [f"docker/Dockerfile.rocm does not run the workflow's install command(s): {missing}"] if missing else []

    base = Path(args.keep or tempfile.mkdtemp(prefix="rocmsim-"))
    try:
        base.mkdir(parents=True, exist_ok=True)
        venv, tree, wheels = base / "venv", base / "tree", base / "wheels"
        run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        python = venv / "bin" / "python"
        wheels.mkdir(exist_ok=True)
        standins = [
            wheel(wheels, "pytorch-triton-rocm", TRITON_VERSION, {"triton/__init__.py": STANDIN_MARK}),
            wheel(wheels, "torch", args.torch_version, {"torch/__init__.py": STANDIN_MARK},
                  [f"pytorch-triton-rocm=={TRITON_VERSION}"]),
        ]
        r = run([str(python), "-m", "pip", "install", "-q", "--no-index", *map(str, standins)])
        if r.returncode:
            print(r.stdout + r.stderr)
            return 1
        shutil.rmtree(tree, ignore_errors=True)
        (tree / "python" / "sglang").mkdir(parents=True)
        shutil.copy(root / "python" / "pyproject.toml", tree / "python")
        (tree / "python" / "sglang" / "__init__.py").write_text("")
        shutil.copytree(root / "scripts", tree / "scripts")
        before = venv_facts(python)

        # PIP_NO_COMPILE: no .pyc files written for the ~90 packages; what gets installed is the same
        env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": str(venv),
               "PIP_NO_COMPILE": "1"}
        env.pop("PYTHONPATH", None)
        report = base / "resolved.json"
        if args.resolve_only:
            wrapper = base / "pip-resolve-only"
            wrapper.write_text(PIP_RESOLVE_ONLY)
            wrapper.chmod(0o755)
            env.update(PIP=str(wrapper), RESOLVE_REPORT=str(report))
        print(f"$ {step.strip()}    (in {tree}, {venv / 'bin'} first on PATH)", flush=True)
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", step], cwd=tree, env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        print("\n".join(x for x in r.stdout.strip().splitlines() if not x.startswith(NOISE)))
        if r.returncode:
            print(f"FAIL: the install step exited {r.returncode}")
            return 1
        after = venv_facts(python)
        if args.resolve_only:
            if not report.exists():
                print("FAIL: --resolve-only, but the step ran no editable install (no resolver report)")
                return 1
            after = as_if_installed(after, json.loads(report.read_text()))
        found += problems(before, after)
        for line in found:
            print("FAIL: " + line)
        if found:
            return 1
        v = after["versions"]
        print(f"OK: torch {v['torch']} and pytorch-triton-rocm {v['pytorch-triton-rocm']} untouched, no triton "
              f"distribution installed; sglang {v['sglang']}, amd-aiter {v['amd-aiter']}, xgrammar {v['xgrammar']}, "
              f"accelerate {v['accelerate']} installed")
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
