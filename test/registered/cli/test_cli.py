"""The `sglang` console script and `python -m sglang.launch_server`: subcommands, generated flags, fast failures."""

import dataclasses
import shutil
import socket
import subprocess
import sys

import pytest

from sglang.srt.server_args import ServerArgs
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.version import __version__

register_cpu_ci(est_time=8, suite="cpu")

SGLANG = [shutil.which("sglang")] if shutil.which("sglang") else [sys.executable, "-m", "sglang.cli.main"]


def run(args, timeout=120):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


def test_version():
    r = run(SGLANG + ["version"])
    assert r.returncode == 0 and r.stdout.strip() == __version__


def test_help_lists_commands():
    r = run(SGLANG + ["--help"])
    assert r.returncode == 0
    for cmd in ("serve", "version", "plan"):
        assert cmd in r.stdout


def test_unknown_command():
    r = run(SGLANG + ["frobnicate"])
    assert r.returncode == 2 and "unknown command" in r.stderr


def test_serve_flags_are_generated_from_server_args():
    r = run(SGLANG + ["serve", "--help"])
    assert r.returncode == 0
    for f in dataclasses.fields(ServerArgs):
        assert "--" + f.name.replace("_", "-") in r.stdout, f.name
    assert "(default: 30000)" in r.stdout


@pytest.mark.parametrize("args,fragment", [
    (["--dtype", "fp64"], "--dtype"),
    (["--port", "0"], "--port"),
    (["--max-queued-requests", "-1"], "--max-queued-requests"),
    (["--no-such-flag"], "unrecognized arguments"),
])
def test_serve_rejects_bad_flags_before_loading(args, fragment):
    r = run(SGLANG + ["serve", *args])
    assert r.returncode == 2 and fragment in r.stderr, r.stderr


def test_launch_server_module_shares_the_flags():
    r = run([sys.executable, "-m", "sglang.launch_server", "--help"])
    assert r.returncode == 0 and "--model-path" in r.stdout and "--enable-metrics" in r.stdout


def test_busy_port_fails_fast():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = run(SGLANG + ["serve", "--port", str(port)], timeout=60)
    assert r.returncode != 0 and f"127.0.0.1:{port}" in r.stderr and "--port" in r.stderr


def test_plan_subcommand_dispatches():
    r = run(SGLANG + ["plan", "--help"])
    assert r.returncode == 0 and "usage" in r.stdout.lower()


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
