"""test/run_suite.py itself: files grouped by declared time, a hung group's stacks printed and the group killed
(with what it left running), a failure reported with the end of its output, a hang retried and a failure not; a
group that ran no test fails; a group loads only the pytest plugins its files name; a GPU suite's preflight refuses a machine without the device or the libraries."""

import json
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

PLUGINS = run_suite.installed_plugins()
# the groups run here name no plugin: each pytest they start skips loading them, as the suite's groups do
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "faulthandler_timeout=60",
          *[x for name, _ in PLUGINS for x in ("-p", f"no:{name}")]]


def entry(name, est):
    return run_suite.Entry(Path(name), "register_cpu_ci", "cpu", est, None)


def test_groups_pack_neighbours_up_to_the_declared_time():
    es = [entry("a", 200), entry("b", 40), entry("c", 15), entry("d", 5), entry("e", 30), entry("f", 2)]
    got = [[e.path.name for e in g] for g in run_suite.groups(es, group_est_s=60)]
    assert got == [["a"], ["b", "c", "d"], ["e", "f"]]
    assert sum(len(g) for g in got) == len(es)


def test_a_group_loads_only_the_plugins_its_files_name(tmp_path):
    names = {name for name, _ in PLUGINS}
    assert {"hypothesispytest", "schemathesis"} <= names  # the test extra's plugins, ~5 s of imports
    # a real pytest run on the blocks: the loaded plugin set is what pytest's plugin manager reports (the probe
    # reads the names from a file: in its own text they would count as naming every plugin)
    (tmp_path / "names.json").write_text(json.dumps(sorted(names)))
    probe = """
        import json, pathlib
        def test_plugins(request):
            names = json.loads((pathlib.Path(__file__).parent / "names.json").read_text())
            loaded = {{n for n in names if request.config.pluginmanager.has_plugin(n)}}
            assert loaded == {want!r}, loaded
        """
    plain = write(tmp_path, "test_plain.py", probe.format(want=set()))
    assert run_suite.plugin_blocks([plain], PLUGINS) == [x for n, _ in PLUGINS for x in ("-p", f"no:{n}")]
    named = write(tmp_path, "test_named.py", "from hypothesis import given  # noqa\n" + textwrap.dedent(
        probe.format(want={"hypothesispytest"})))
    for files in ([plain], [named]):
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"] + run_suite.plugin_blocks(files, PLUGINS)
        res = run_suite.run_group(cmd, files, limit_s=120)
        assert res.rc == 0, "\n".join(res.tail)
    # a plugin named in any file of a group is loaded for the whole group
    assert "no:hypothesispytest" not in run_suite.plugin_blocks([plain, named], PLUGINS)


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


def test_a_group_that_collected_no_test_fails_and_says_so(tmp_path, capsys):
    # every test of the file skips itself at import: pytest's exit 5, "no tests collected"
    skipped = write(tmp_path, "test_skipped.py", """
        import pytest
        pytest.skip("no GPU here", allow_module_level=True)
        def test_never():
            pass
        """)
    res = run_suite.run_group(PYTEST, [skipped], limit_s=120)
    assert res.rc == run_suite.PYTEST_NO_TESTS_COLLECTED
    ok = run_suite.GroupResult(["a"], 0, 1.0, False, [])
    assert run_suite.summarize([ok, res], 2) == 1
    assert "no tests collected" in capsys.readouterr().out
    # with -k a group with no matching test is fine, as long as some group had one
    assert run_suite.summarize([ok, res], 2, k_filter=True) == 0
    assert run_suite.summarize([res], 2, k_filter=True) == 1
    assert "-k matched nothing" in capsys.readouterr().out


CPU_TORCH = {"torch": "2.13.0+cpu", "cuda": None, "hip": None, "devices": 0, "triton_interpret": "",
             "modules": {"triton": None, "flashinfer": "ModuleNotFoundError: No module named 'flashinfer'",
                         "aiter": "ModuleNotFoundError: No module named 'aiter'"}}
CUDA_OK = {**CPU_TORCH, "torch": "2.9.1+cu128", "cuda": "12.8", "devices": 1,
           "modules": {"triton": None, "flashinfer": None}}
ROCM_OK = {**CPU_TORCH, "torch": "2.9.1+rocm6.4", "hip": "6.4.4", "devices": 8,
           "modules": {"triton": None, "aiter": None}}
CUDA, AMD = "stage-a-test-1-gpu", "stage-a-test-1-gpu-amd"


@pytest.mark.parametrize("suite, facts, wanted", [
    (CUDA, CUDA_OK, []),
    (AMD, ROCM_OK, []),
    (CUDA, CPU_TORCH, ["torch 2.13.0+cpu is not a CUDA build", "flashinfer does not import (ModuleNotFoundError"]),
    (AMD, CPU_TORCH, ["torch 2.13.0+cpu is not a ROCm build", "aiter does not import"]),
    (CUDA, {**CUDA_OK, "devices": 0}, ["sees no CUDA device"]),
    (AMD, {**ROCM_OK, "devices": 0},
     ["sees no ROCm device (torch.cuda.is_available() is False; check the driver, HIP_VISIBLE_DEVICES"]),
    (CUDA, ROCM_OK, ["is a ROCm build", "flashinfer does not import (not probed)"]),
    (AMD, CUDA_OK, ["not a ROCm build", "aiter does not import"]),
    (AMD, {**ROCM_OK, "modules": {"triton": "ImportError: libamdhip64.so", "aiter": None}}, ["triton does not import"]),
    (CUDA, {**CUDA_OK, "triton_interpret": "1"}, ["TRITON_INTERPRET=1 is set"]),
    (CUDA, {"torch_error": "ModuleNotFoundError: No module named 'torch'"}, ["torch does not import"]),
    (CUDA, {**CUDA_OK, "device_error": "RuntimeError: CUDA driver too old"}, ["cannot list its devices (Runtime"]),
    (AMD, {"probe_error": "the preflight probe (import torch, triton, aiter) exited -11: "}, ["probe (import torch"]),
])
def test_preflight_names_what_is_missing(suite, facts, wanted):
    got = run_suite.preflight_problems(suite, facts)
    assert len(got) == len(wanted), got
    for line, part in zip(got, wanted):
        assert part in line, got


def test_a_gpu_suite_without_its_gpu_exits_nonzero_before_any_test(monkeypatch, capsys):
    def no_test_may_run(*a, **k):
        raise AssertionError("a test group ran although the preflight failed")

    monkeypatch.setattr(run_suite, "run_group", no_test_may_run)
    for suite in (CUDA, AMD):
        monkeypatch.setattr(run_suite, "gpu_facts", lambda modules: CPU_TORCH)
        assert run_suite.main(["--suite", suite]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{suite}: preflight failed, no test run: torch 2.13.0+cpu is not a" in err[0]


def test_a_gpu_suite_that_passes_preflight_marks_its_tests_as_inside_a_gpu_suite(monkeypatch):
    seen = []
    monkeypatch.setattr(run_suite, "gpu_facts", lambda modules: ROCM_OK)
    monkeypatch.setattr(run_suite, "run_group",
                        lambda cmd, files, limit_s, env=None, echo=True: seen.append(env) or
                        run_suite.GroupResult(files, 0, 0.1, False, []))
    assert run_suite.main(["--suite", AMD]) == 0
    assert seen and all(env == {run_suite.SUITE_GPU_ENV: "rocm"} for env in seen)


def test_preflight_probe_reports_this_machine(monkeypatch):
    import torch

    facts = run_suite.gpu_facts(["triton", "no_such_module_9c1e"])
    assert facts["torch"] == torch.__version__ and facts["cuda"] == torch.version.cuda
    assert facts["modules"]["triton"] is None
    assert "No module named 'no_such_module_9c1e'" in facts["modules"]["no_such_module_9c1e"]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("suite", [CUDA, AMD])
def test_gpu_suite_on_this_gpu_less_machine_exits_nonzero_saying_why(suite):
    out = subprocess.run([sys.executable, str(Path(run_suite.__file__)), "--suite", suite],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode != 0
    assert f"{suite}: preflight failed, no test run: torch" in out.stderr, out.stderr
    assert "[run_suite] ====" not in out.stdout  # no group ran


@pytest.mark.parametrize("suite", ["cpu", CUDA, AMD])
def test_list_names_every_registered_file_once(suite):
    out = subprocess.run([sys.executable, str(Path(run_suite.__file__)), "--suite", suite, "--list"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    listed = [line.split()[-1] for line in out.stdout.splitlines()[1:]]
    assert suite != "cpu" or "test/registered/ci/test_run_suite.py" in listed
    assert suite == "cpu" or "test/registered/attention/test_gpu_memory_plan.py" in listed
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


def test_serial_is_read_from_the_marker(tmp_path):
    (tmp_path / "test_alone.py").write_text('register_cpu_ci(est_time=7, suite="cpu", serial=True)\n')
    (tmp_path / "test_shared.py").write_text('register_cpu_ci(est_time=9, suite="cpu")\n')
    got = {e.path.name: (e.est_time, e.serial) for e in run_suite.collect(tmp_path)}
    assert got == {"test_alone.py": (7.0, True), "test_shared.py": (9.0, False)}


def test_the_pool_runs_jobs_groups_at_once_longest_first_and_prints_each_whole(capsys):
    import threading

    both_running = threading.Barrier(2, timeout=20)  # breaks unless two groups run at the same time
    started = []

    def run_one(files, env, echo):
        assert not echo and env == {"X": "1"}
        started.append(files[0])
        if files[0] in ("long", "mid"):
            both_running.wait()
        lines = b"".join(f"{files[0]} line {i}\n".encode() for i in range(50))
        return [run_suite.GroupResult(files, 0, 0.1, False, [])], lines

    groups = [(["short"], 10.0), (["long"], 500.0), (["mid"], 300.0)]
    results = run_suite.suite_pool.run_pool(groups, run_one, 2, {"X": "1"})
    assert started[:2] in (["long", "mid"], ["mid", "long"]) and started[2] == "short"
    assert sorted(r.files[0] for r in results) == ["long", "mid", "short"]
    out = [x for x in capsys.readouterr().out.splitlines() if " line " in x]
    names = [x.split()[0] for x in out]
    # each group's 50 lines in one block: the name changes only between blocks
    assert sum(a != b for a, b in zip(names, names[1:])) == 2, names


def test_the_pool_starts_no_group_after_a_stop():
    ran = []

    def run_one(files, env, echo):
        ran.append(files[0])
        return [run_suite.GroupResult(files, 1 if files[0] == "a" else 0, 0.1, False, [])], b""

    groups = [([n], 100.0 - i) for i, n in enumerate("abcd")]
    run_suite.suite_pool.run_pool(groups, run_one, 1, {}, stop=lambda got: got[-1].rc != 0)
    assert ran == ["a"]


def test_groups_side_by_side_split_the_cores_and_wait_passively(monkeypatch):
    monkeypatch.setattr(run_suite.suite_pool, "usable_cores", lambda: 8)
    assert run_suite.suite_pool.thread_env(1, {}) == {}
    assert run_suite.suite_pool.thread_env(2, {}) == {"OMP_NUM_THREADS": "4", "OMP_WAIT_POLICY": "PASSIVE"}
    assert run_suite.suite_pool.thread_env(16, {}) == {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    assert run_suite.suite_pool.thread_env(2, {"OMP_NUM_THREADS": "3"}) == {"OMP_WAIT_POLICY": "PASSIVE"}


def test_a_held_group_prints_nothing_until_it_ends_and_keeps_its_output(tmp_path, capfd):
    noisy = write(tmp_path, "test_noisy.py", """
        def test_prints():
            print("held marker 91c2")
            assert False, "failure marker 91c2"
        """)
    res = run_suite.run_group(PYTEST + ["-s"], [noisy], limit_s=120, echo=False)
    assert res.rc == 1
    assert b"held marker 91c2" in res.output and b"failure marker 91c2" in res.output
    assert "91c2" not in capfd.readouterr().out
    assert any("failure marker 91c2" in line for line in res.tail)


def test_main_runs_the_serial_files_after_the_pool_alone_without_the_thread_split(monkeypatch, tmp_path):
    shared = [run_suite.Entry(Path(f"/test_s{i}.py"), "register_cpu_ci", "cpu", 700, None) for i in range(3)]
    alone = run_suite.Entry(Path("/test_alone.py"), "register_cpu_ci", "cpu", 900, None, serial=True)
    monkeypatch.setattr(run_suite, "collect", lambda: shared + [alone])
    monkeypatch.setattr(run_suite, "ROOT", Path("/"))
    monkeypatch.setattr(run_suite, "plugin_blocks", lambda files, plugins: [])
    calls = []

    def fake(cmd, files, limit_s, env=None, echo=True):
        calls.append((files[0], echo, dict(env or {})))
        return run_suite.GroupResult(files, 0, 0.1, False, [])

    monkeypatch.setattr(run_suite, "run_group", fake)
    monkeypatch.setattr(run_suite.suite_pool, "usable_cores", lambda: 2)
    for name in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(name, raising=False)
    assert run_suite.main(["--suite", "cpu", "--jobs", "2"]) == 0
    assert sorted(c[0] for c in calls[:3]) == ["test_s0.py", "test_s1.py", "test_s2.py"]
    split = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    assert all(not echo and env == split for _, echo, env in calls[:3]), calls
    assert calls[3] == ("test_alone.py", True, {})
