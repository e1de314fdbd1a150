"""Run one CI suite of test/registered/.

A file belongs to a suite when it calls register_{cpu,cuda,amd}_ci(..., suite=NAME) at module level; the markers
are read from the AST, so listing never imports a test file. Files are run by pytest in one process, longest
declared est_time first.

    python test/run_suite.py --suite cpu [--list] [-k EXPR] [--timeout-per-file S]
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REGISTERED = Path(__file__).resolve().parent / "registered"
MARKERS = {"register_cpu_ci": "cpu", "register_cuda_ci": "cuda", "register_amd_ci": "amd"}
PYTEST_NO_TESTS_COLLECTED = 5


@dataclass
class Entry:
    path: Path
    marker: str
    suite: str
    est_time: float
    disabled: str | None


def _const(node):
    return node.value if isinstance(node, ast.Constant) else None


def collect(root: Path = REGISTERED) -> list[Entry]:
    entries = []
    for path in sorted(root.rglob("test_*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for stmt in tree.body:
            if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
                continue
            call = stmt.value
            name = getattr(call.func, "id", None) or getattr(call.func, "attr", None)
            if name not in MARKERS:
                continue
            kw = {k.arg: _const(k.value) for k in call.keywords}
            est = kw.get("est_time", _const(call.args[0]) if call.args else None)
            suite = kw.get("suite") or MARKERS[name]
            entries.append(Entry(path, name, suite, float(est or 60), kw.get("disabled")))
    return entries


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--suite", default="cpu")
    p.add_argument("--list", action="store_true")
    p.add_argument("-k", default=None, help="pytest -k expression")
    p.add_argument("-x", action="store_true", help="stop at first failure")
    args = p.parse_args(argv)

    entries = [e for e in collect() if e.suite == args.suite and not e.disabled]
    entries.sort(key=lambda e: -e.est_time)
    if not entries:
        print(f"no test files registered for suite {args.suite!r}", file=sys.stderr)
        return 1
    total = sum(e.est_time for e in entries)
    print(f"suite {args.suite}: {len(entries)} files, estimated {total:.0f} s")
    for e in entries:
        print(f"  {e.est_time:6.0f} s  {e.path.relative_to(REGISTERED.parent.parent)}")
    if args.list:
        return 0
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=15"]
    if args.k:
        cmd += ["-k", args.k]
    if args.x:
        cmd.append("-x")
    cmd += [str(e.path) for e in entries]
    env = dict(os.environ)
    rc = subprocess.call(cmd, env=env)
    # pytest's 5 = "no tests collected": every file skipped itself at import (a GPU suite on a machine without one)
    return 0 if rc == PYTEST_NO_TESTS_COLLECTED else rc


if __name__ == "__main__":
    sys.exit(main())
