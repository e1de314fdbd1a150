"""test/run_suite.py itself: files grouped by declared time, a hung group's stacks printed and the group killed
(with what it left running), a failure reported with the end of its output, a hang retried and a failure not."""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="cpu")

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import run_suite  # noqa: E402

PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "faulthandler_timeout=60"]


def entry(name, est):
    return run_suite.Entry(Path(name), "register_cpu_ci", "cpu", est, None)


def test_groups_pack_neighbours_up_to_the_declared_time():
    es = [entry("a", 200), entry("b", 40), entry("c", 15), entry("d", 5), entry("e", 30), entry("f", 2)]
    got = [[e.path.name for e in g] for g in run_suite.groups(es, group_est_s=60)]
    assert got == [["a"], ["b", "c", "d"], ["e", "f"]]
    assert sum(len(g) for g in got) == len(es)


def write(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie nobody reaped yet counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_hung_group_gets_its_stacks_printed_and_is_killed_with_its_children(tmp_path):
    pid_file = tmp_path / "child.pid"
    hang = write(tmp_path, "test_hang.py", f"""
        import subprocess, time
        def test_waits_forever():
            child = subprocess.Popen(["sleep", "600"])
            open({str(pid_file)!r}, "w").write(str(child.pid))
            deeply_stuck_here()

        def deeply_stuck_here():
            time.sleep(600)
        """)
    start = time.monotonic()
    res = run_suite.run_group(PYTEST, [hang], limit_s=8)
    assert time.monotonic() - start < 60
    assert res.hung and res.rc == -1
    out = "\n".join(res.tail)
    assert "deeply_stuck_here" in out and "test_waits_forever" in out, out  # the stack of the stuck thread
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child), "the hung group's child process outlived it"


def test_failure_keeps_the_end_of_its_output_and_a_pass_is_zero(tmp_path):
    bad = write(tmp_path, "test_bad.py", """
        def test_ok():
            pass

        def test_wrong():
            assert 2 + 2 == 5, "arithmetic marker 7f3a"
        """)
    good = write(tmp_path, "test_good.py", "def test_ok():\n    pass\n")
    res = run_suite.run_group(PYTEST, [bad], limit_s=120)
    assert not res.hung and res.rc == 1
    assert any("arithmetic marker 7f3a" in line for line in res.tail)
    assert run_suite.run_group(PYTEST, [good], limit_s=120).rc == 0


def test_summary_fails_on_a_failure_or_a_final_hang_not_on_a_hang_that_passed_again():
    ok = run_suite.GroupResult(["a"], 0, 1.0, False, [])
    hung = run_suite.GroupResult(["b"], -1, 9.0, True, ["stack of b"])
    hung_then_ok = run_suite.GroupResult(["b"], 0, 2.0, False, [])
    failed = run_suite.GroupResult(["c"], 1, 3.0, False, ["assert marker"])
    assert run_suite.summarize([ok, hung, hung_then_ok], 12) == 0
    assert run_suite.summarize([ok, hung], 10) == 1
    assert run_suite.summarize([ok, failed], 4) == 1
    skipped_gpu = run_suite.GroupResult(["g"], run_suite.PYTEST_NO_TESTS_COLLECTED, 1.0, False, [])
    assert run_suite.summarize([skipped_gpu], 1) == 0


@pytest.mark.parametrize("suite", ["cpu"])
def test_list_names_every_registered_file_once(suite):
    out = subprocess.run([sys.executable, str(Path(run_suite.__file__)), "--suite", suite, "--list"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    listed = [line.split()[-1] for line in out.stdout.splitlines()[1:]]
    assert "test/registered/ci/test_run_suite.py" in listed
    assert len(listed) == len(set(listed))


def test_a_process_left_running_in_a_session_of_its_own_is_named_and_killed(tmp_path):
    pid_file = tmp_path / "detached.pid"
    leaky = write(tmp_path, "test_leaky.py", f"""
        import subprocess
        def test_starts_a_detached_sleeper():
            child = subprocess.Popen(["sleep", "600"], start_new_session=True)
            open({str(pid_file)!r}, "w").write(str(child.pid))
        """)
    res = run_suite.run_group(PYTEST, [leaky], limit_s=120)
    assert res.rc == 0 and not res.hung
    child = int(pid_file.read_text())
    assert any(x.startswith(f"pid {child}: sleep 600") for x in res.leaked), res.leaked
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child), "a detached process outlived its group"
    clean = write(tmp_path, "test_clean.py", "def test_ok():\n    pass\n")
    assert run_suite.run_group(PYTEST, [clean], limit_s=120).leaked == []


def test_a_group_that_survives_the_stack_dump_signal_is_killed_after_the_grace(tmp_path, monkeypatch):
    stubborn = write(tmp_path, "test_stubborn.py", """
        import signal, time
        def test_ignores_sigabrt():
            signal.signal(signal.SIGABRT, signal.SIG_IGN)
            time.sleep(600)
        """)
    monkeypatch.setattr(run_suite, "ABORT_GRACE_S", 2)
    start = time.monotonic()
    res = run_suite.run_group(PYTEST, [stubborn], limit_s=5)
    assert res.hung and res.rc == -1
    assert time.monotonic() - start < 40
