"""ProcessGroup without a model: ready messages, the startup failure named, the first cause of death chosen among
several dead children, stop waves, and no child left behind a parent that exits or is SIGKILLed.

The entries live in a module written to tmp_path and put on sys.path here: the children find it because the group
hands them this process's sys.path."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="cpu")

from sglang.srt.launch.process_group import ProcessGroup  # noqa: E402

ENTRIES = textwrap.dedent("""
    import os, signal, time

    def serve(value, report):
        report.ready({"value": value, "pid": os.getpid()})
        time.sleep(600)

    def fail_at_start(report):
        raise ValueError("no such model")

    def lose_peer(report):
        report.ready()
        time.sleep(0.5)
        raise RuntimeError("[gloo/transport/tcp/pair.cc] Connection closed by peer")

    def raise_own(report):
        report.ready()
        time.sleep(0.3)
        raise RuntimeError("injected fault")

    def log_sigterm(path, report):
        signal.signal(signal.SIGTERM, lambda *_: (open(path, "a").write(f"{time.monotonic()}\\n"), os._exit(0)))
        report.ready()
        time.sleep(600)
""")


@pytest.fixture
def entries(tmp_path, monkeypatch):
    (tmp_path / "pg_entries.py").write_text(ENTRIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    groups = []

    def make(what="test children"):
        groups.append(ProcessGroup(what))
        return groups[-1]

    yield make
    for g in groups:
        g.stop()


def spawn(group, label, entry, *args, wave=0):
    return group.spawn(label, f"pg_entries:{entry}", args, log_name=label, log_level="warning", stop_wave=wave)


def wait_until(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_ready_messages_in_spawn_order(entries):
    g = entries()
    spawn(g, "a", "serve", 1)
    spawn(g, "b", "serve", 2)
    infos = g.wait_ready(30)
    assert [(i["status"], i["value"], i["pid"]) for i in infos] == [("ready", 1, g.pids[0]), ("ready", 2, g.pids[1])]
    assert g.death() is None


def test_startup_failure_names_the_child_and_its_error(entries):
    g = entries()
    spawn(g, "a", "serve", 1)
    bad = spawn(g, "rank 7", "fail_at_start")
    with pytest.raises(RuntimeError, match=rf"rank 7 \(pid {bad.pid}\) failed to start: ValueError: no such model"):
        g.wait_ready(30)


def test_a_killed_child_is_named_before_one_that_lost_its_peer(entries):
    g = entries()
    spawn(g, "rank 0", "lose_peer")
    victim = spawn(g, "rank 1", "serve", 1)
    g.wait_ready(30)
    os.kill(victim.pid, signal.SIGKILL)
    wait_until(lambda: all(c is not None for c in g.exit_codes()))
    assert g.death() == f"rank 1 (pid {victim.pid}) died: killed by SIGKILL (then rank 0 stopped too)"


def test_an_own_error_is_named_before_a_lost_peer(entries):
    g = entries()
    spawn(g, "rank 0", "lose_peer")
    culprit = spawn(g, "rank 1", "raise_own")
    g.wait_ready(30)
    wait_until(lambda: all(c is not None for c in g.exit_codes()))
    assert g.death().startswith(f"rank 1 (pid {culprit.pid}) died: RuntimeError: injected fault")
    g.stop()
    assert g.death() is None  # a stopped group reports nothing more


def test_stop_goes_wave_by_wave(entries, tmp_path):
    g = entries()
    first, second = tmp_path / "first", tmp_path / "second"
    spawn(g, "rank 0", "log_sigterm", str(first))
    spawn(g, "follower", "log_sigterm", str(second), wave=1)
    g.wait_ready(30)
    g.stop()
    assert g.exit_codes() == [0, 0]
    assert float(first.read_text()) < float(second.read_text())


PARENT = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[1])
    from sglang.srt.launch.process_group import ProcessGroup
    g = ProcessGroup("children")
    g.spawn("a", "pg_entries:serve", (1,), log_name="a", log_level="warning")
    g.wait_ready(30)
    print(g.pids[0], flush=True)
    if sys.argv[2] == "sleep":
        time.sleep(600)
""")


@pytest.mark.parametrize("how", ["exits", "sigkilled"])
def test_no_child_outlives_its_parent(tmp_path, how):
    (tmp_path / "pg_entries.py").write_text(ENTRIES)
    parent = subprocess.Popen([sys.executable, "-", str(tmp_path), "sleep" if how == "sigkilled" else "exit"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    parent.stdin.write(PARENT)  # from stdin: children must not depend on the caller's __main__
    parent.stdin.close()
    try:
        pid = int(parent.stdout.readline())
        try:
            child = psutil.Process(pid)
        except psutil.NoSuchProcess:  # "exits": the parent may have cleaned its child up before we looked
            child = None
        if how == "sigkilled":
            assert child is not None, "the parent sleeps: its child must be alive until the parent is killed"
            parent.kill()  # no atexit, no cleanup: the child's death signal and watchdog
        assert parent.wait(30) in (0, -signal.SIGKILL)
        gone, alive = psutil.wait_procs([child] if child is not None else [], timeout=10)
        assert not alive, "the child outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
