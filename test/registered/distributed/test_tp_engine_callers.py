"""`sglang.Engine(tp_size=3)` starts its ranks the same way whatever runs the caller's code: a script file, `python -c`
and `python -` (stdin). The same program, without an `if __name__ == "__main__"` guard, is fed each way to a fresh
interpreter; each prints the greedy tokens of the default model (9 heads) at tp=3, which must equal tp=1's here.

The ranks must not depend on re-importing the caller's __main__: for stdin it is "<stdin>", which multiprocessing's
spawn took for a file path to run in every child (FileNotFoundError: .../<stdin>), and an unguarded script would
start the engine again inside each child.
"""

import json
import subprocess
import sys

import pytest

from sglang import Engine
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.engine_fixtures import PROMPTS, shutdown

register_cpu_ci(est_time=55, suite="cpu")

FLAGS = dict(dtype="float32", max_total_tokens=256, log_level="warning", random_seed=0)
SAMPLING = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}
CALLER_TIMEOUT_S = 300
MARK = "TOKENS "

PROGRAM = f"""
import json
from sglang import Engine

engine = Engine(tp_size=3, **{FLAGS!r})
outs = engine.generate({PROMPTS[:2]!r}, {SAMPLING!r})
engine.shutdown()
print({MARK!r} + json.dumps([o["output_ids"] for o in outs]), flush=True)
"""


@pytest.fixture(scope="module")
def tp1_tokens():
    engine = Engine(**FLAGS)
    try:
        return [o["output_ids"] for o in engine.generate(PROMPTS[:2], SAMPLING)]
    finally:
        shutdown(engine)


def run_caller(how: str, tmp_path) -> subprocess.CompletedProcess:
    if how == "script":
        script = tmp_path / "caller.py"
        script.write_text(PROGRAM)
        argv, stdin = [sys.executable, str(script)], None
    elif how == "-c":
        argv, stdin = [sys.executable, "-c", PROGRAM], None
    else:
        argv, stdin = [sys.executable, "-"], PROGRAM
    return subprocess.run(argv, input=stdin, cwd=tmp_path, capture_output=True, text=True, timeout=CALLER_TIMEOUT_S)


@pytest.mark.parametrize("how", ["script", "-c", "stdin"])
def test_tp3_engine_from_any_caller(how, tmp_path, tp1_tokens):
    done = run_caller(how, tmp_path)
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    assert done.returncode == 0 and lines, f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert json.loads(lines[0][len(MARK):]) == tp1_tokens
