"""bench_cpu_burner: N busy processes while inside the `with`, none left behind afterwards -- after an exception,
after Ctrl-C (SIGINT to the whole process group, as a terminal sends it), and when the parent is SIGKILLed."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from sglang.bench_cpu_burner import CpuBurner
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=4, suite="cpu", serial=True)  # asserts a time or CPU measure: run alone

GONE_TIMEOUT_S = 10.0


def gone(pid: int) -> bool:
    """No such process, or only a zombie waiting for a reaper that is not ours (PID 1 in some containers)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pids, timeout_s: float = GONE_TIMEOUT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(gone(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def our_children():
    """Our child processes, less multiprocessing's resource tracker: the spawn context starts that one idle helper
    per parent process, once, and it stays until the parent exits (it is no burner)."""
    pids = set()
    for c in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(c.cmdline()):
                pids.add(c.pid)
        except psutil.NoSuchProcess:
            pass
    return pids


def test_starts_n_busy_processes_and_reaps_them():
    before = our_children()
    with CpuBurner(2) as burner:
        assert len(burner.started_pids) == 2
        assert set(burner.started_pids) <= our_children() - before
        time.sleep(0.3)
        cpu_s = [sum(psutil.Process(p).cpu_times()[:2]) for p in burner.started_pids]
        assert all(c > 0 for c in cpu_s), cpu_s  # spinning, not sleeping
    assert our_children() <= before  # joined, so not even zombies of ours remain
    assert all(not psutil.pid_exists(p) or gone(p) for p in burner.started_pids)
    assert burner.wall_s >= 0.3 and 0 < burner.cores_busy <= psutil.cpu_count() + 0.1


def test_zero_is_nothing_and_negative_is_refused():
    before = our_children()
    with CpuBurner(0) as burner:
        assert burner.started_pids == [] and our_children() == before
    assert burner.cores_busy == 0.0
    with pytest.raises(ValueError, match="--cpu-burner"):
        CpuBurner(-1)


def test_cleaned_up_when_the_block_raises():
    before = our_children()
    with pytest.raises(RuntimeError, match="measurement failed"):
        with CpuBurner(1) as burner:
            pid = burner.started_pids[0]
            raise RuntimeError("measurement failed")
    assert our_children() <= before and gone(pid)


def spawn_parent_with_burner() -> tuple:
    """A separate Python process (its own session) running one burner; returns (process, burner pid). It restores
    Python's Ctrl-C handler: a runner started in the background by a shell (CI) passes SIGINT on as ignored, and
    Python then installs no KeyboardInterrupt handler of its own."""
    code = ("import signal, time; from sglang.bench_cpu_burner import CpuBurner\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "with CpuBurner(1) as b:\n    print(b.started_pids[0], flush=True)\n    time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True, env=os.environ.copy())
    line = parent.stdout.readline()
    assert line.strip().isdigit(), parent.stderr.read() if parent.poll() is not None else line
    burner_pid = int(line)
    assert psutil.Process(burner_pid).ppid() == parent.pid
    return parent, burner_pid


def test_ctrl_c_to_the_process_group_stops_everything():
    parent, burner_pid = spawn_parent_with_burner()
    try:
        os.kill(burner_pid, signal.SIGINT)  # a burner ignores Ctrl-C: its parent stops it
        time.sleep(0.3)
        assert not gone(burner_pid)
        os.killpg(parent.pid, signal.SIGINT)
        parent.wait(GONE_TIMEOUT_S)
        assert wait_gone([burner_pid])
        err = parent.stderr.read()  # the parent's own KeyboardInterrupt traceback; none from the burner
        assert "KeyboardInterrupt" in err and err.count("Traceback") == 1 and "sglang-cpu-burner" not in err, err
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)


def test_burner_exits_when_its_parent_is_killed():
    parent, burner_pid = spawn_parent_with_burner()
    parent.kill()  # SIGKILL to the parent only: none of its cleanup runs
    parent.wait(GONE_TIMEOUT_S)
    try:
        assert wait_gone([burner_pid]), "the orphaned burner kept spinning"
    finally:
        if not gone(burner_pid):
            os.kill(burner_pid, signal.SIGKILL)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
