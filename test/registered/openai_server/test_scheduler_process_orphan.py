"""The scheduler process never outlives the server process, even when the server is killed with SIGKILL and has no
chance to clean up (PR_SET_PDEATHSIG plus a parent-pid watchdog in srt/launch/child.py)."""

import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="cpu")

PARENT = textwrap.dedent("""
    import multiprocessing as mp, os, sys, time

    def child(parent_pid):
        from sglang.srt.launch.child import kill_itself_when_parent_died
        kill_itself_when_parent_died(parent_pid)
        time.sleep(600)

    if __name__ == "__main__":
        p = mp.get_context("spawn").Process(target=child, args=(os.getpid(),), daemon=True)
        p.start()
        print(p.pid, flush=True)
        time.sleep(600)
""")


def test_child_dies_with_killed_parent(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        child = psutil.Process(int(parent.stdout.readline()))
        time.sleep(1.0)  # let the child install its death signal
        assert child.is_running()
        parent.kill()  # SIGKILL: no atexit, no multiprocessing cleanup
        parent.wait(10)
        gone, alive = psutil.wait_procs([child], timeout=10)
        assert not alive, "the child outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
