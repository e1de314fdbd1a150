"""Run one CI suite of test/registered/.

A file belongs to a suite when it calls register_{cpu,cuda,amd}_ci(..., suite=NAME) at module level; the markers
are read from the AST, so listing never imports a test file. Files run longest declared est_time first, in groups
of about GROUP_EST_S declared seconds, each group in its own pytest process (its own process group), so:
- what a group leaves behind (a thread, a child process, even one in a session of its own) ends with it instead of
  slowing the rest of the suite, and a process it left running is named in the output (a leak is a bug);
- a group still running after its time limit (--timeout-per-file per file in it, at least) gets every thread's
  stack printed (faulthandler, SIGABRT) and is killed; a hang is run once more (--hang-retries) and reported
  as a hang either way. A test failure is never retried.
A test running longer than FAULTHANDLER_TIMEOUT_S gets its stacks printed too (and keeps running). The summary at
the end repeats, for each group that failed or hung, the end of its output.

Nothing passes unrun: a group in which pytest collected no test (exit 5) fails, saying so (with -k, only when no
group had a test matching it). A GPU suite (GPU_SUITES) starts with a preflight, in a process of the interpreter
that runs the tests: torch must be a build for the suite's platform and see a device, and the vendor libraries must
import; otherwise it exits 1 with one line naming what is missing, before any test. Its tests then run with
SUITE_GPU_ENV set, under which sglang.test.gpu_backends fails a test that would skip for want of the GPU.

A group's pytest loads only the installed pytest plugins that one of its files names (suite_plugins.py).

With --jobs N (N > 1) N groups run side by side, each group's output printed whole when it ends, and a file
registered with serial=True (it measures time, CPU or latency) runs after them, alone (suite_pool.py).

    python test/run_suite.py --suite cpu [--list] [-k EXPR] [-x] [--jobs N] [--timeout-per-file S] [--hang-retries N]
"""

from __future__ import annotations

import argparse
import ast
import collections
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List

sys.path.insert(0, str(Path(__file__).resolve().parent))
import suite_pool  # noqa: E402
from suite_plugins import installed_plugins, plugin_blocks  # noqa: E402,F401 (tests reach them here)

REGISTERED = Path(__file__).resolve().parent / "registered"
ROOT = REGISTERED.parent.parent
MARKERS = {"register_cpu_ci": "cpu", "register_cuda_ci": "cuda", "register_amd_ci": "amd"}
PYTEST_NO_TESTS_COLLECTED = 5
FAULTHANDLER_TIMEOUT_S = 300
# files declared shorter than this share a process with their neighbours in the order: each process pays ~4 s
# (interpreter, pytest, torch and sglang imports) before its first test. Declared times run ~3x the measured ones
# (cpu suite: 7,852 s declared, 2,704 s run), so at 600 a group runs ~3-4 min and the cpu suite ~15 processes
# (~32 at 300, ~60 at 120)
GROUP_EST_S = 600
TAIL_LINES = 60
ABORT_GRACE_S = 10  # a hung group's time to print its stacks before SIGKILL
LEAK_GRACE_S = 3  # a finished group's children's time to exit by themselves before they count as left running
GROUP_ENV = "RUN_SUITE_GROUP_TOKEN"  # inherited by everything a group starts (no SGLANG_ prefix: the startup caches key on those)
SUITE_GPU_ENV = "RUN_SUITE_GPU"  # = sglang.test.gpu_backends.SUITE_GPU_ENV (not imported: listing needs no torch)
# suite -> (platform, the modules its tests need besides torch)
GPU_SUITES = {
    "stage-a-test-1-gpu": ("cuda", ("triton", "flashinfer")),
    "stage-a-test-1-gpu-amd": ("rocm", ("triton", "aiter")),
}
PLATFORM_NAMES = {"cuda": "CUDA", "rocm": "ROCm"}
PREFLIGHT_TIMEOUT_S = 300  # importing the vendor libraries can be slow on a cold disk
DEFAULT_JOBS = min(2, os.cpu_count() or 1)  # two groups side by side, each torch on half the cores


@dataclass
class Entry:
    path: Path
    marker: str
    suite: str
    est_time: float
    disabled: str | None
    serial: bool = False


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
            entries.append(Entry(path, name, suite, float(est or 60), kw.get("disabled"), bool(kw.get("serial"))))
    return entries


def groups(entries: List[Entry], group_est_s: float = GROUP_EST_S) -> List[List[Entry]]:
    """Consecutive files (in run order) whose declared times add up to about group_est_s share one process."""
    out: List[List[Entry]] = []
    for e in entries:
        if out and sum(x.est_time for x in out[-1]) + e.est_time <= group_est_s:
            out[-1].append(e)
        else:
            out.append([e])
    return out


@dataclass
class GroupResult:
    files: List[str]
    rc: int  # pytest's exit status; -1 when it was killed for running past its limit
    seconds: float
    hung: bool
    tail: List[str]
    leaked: List[str] = field(default_factory=list)
    output: bytes = b""  # everything it printed, when run with echo=False (held for printing whole)


# What the preflight needs to know, gathered in a child process: a broken library may crash its importer, and the
# tests' interpreter (sys.executable) is the one that must see the GPU.
PROBE = r"""
import importlib, json, os, sys
facts = {"torch": None, "torch_error": None, "device_error": None, "cuda": None, "hip": None, "devices": 0,
         "modules": {}, "triton_interpret": os.environ.get("TRITON_INTERPRET", "")}
try:
    import torch
    facts.update(torch=torch.__version__, cuda=torch.version.cuda, hip=getattr(torch.version, "hip", None))
    facts["devices"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
except Exception as e:
    facts["torch_error" if facts["torch"] is None else "device_error"] = f"{type(e).__name__}: {e}"
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        facts["modules"][name] = None
    except BaseException as e:
        facts["modules"][name] = f"{type(e).__name__}: {e}".splitlines()[0]
print("FACTS=" + json.dumps(facts))
"""


def gpu_facts(modules) -> dict:
    """PROBE's facts for this interpreter; {"probe_error": ...} when the probe itself died (a crash in a library)."""
    what = f"the preflight probe (import torch, {', '.join(modules)})"
    try:
        r = subprocess.run([sys.executable, "-c", PROBE, *modules], capture_output=True, text=True, cwd=ROOT,
                           timeout=PREFLIGHT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"probe_error": f"{what} ran past {PREFLIGHT_TIMEOUT_S} s"}
    lines = [x for x in r.stdout.splitlines() if x.startswith("FACTS=")]
    if not lines:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return {"probe_error": f"{what} exited {r.returncode}: {last}"}
    return json.loads(lines[-1][len("FACTS="):])


def preflight_problems(suite: str, facts: dict) -> List[str]:
    """What keeps `suite` (a GPU suite) from running on the machine these facts describe; empty when nothing."""
    platform, modules = GPU_SUITES[suite]
    if facts.get("probe_error"):
        return [facts["probe_error"]]
    if facts.get("torch_error") or not facts.get("torch"):
        return [f"torch does not import ({facts.get('torch_error')})"]
    torch_v, problems = facts["torch"], []
    if platform == "cuda" and facts.get("hip"):
        problems.append(f"torch {torch_v} is a ROCm build (torch.version.hip={facts['hip']}), not a CUDA build")
    elif platform == "cuda" and not facts.get("cuda"):
        problems.append(f"torch {torch_v} is not a CUDA build (torch.version.cuda is None)")
    elif platform == "rocm" and not facts.get("hip"):
        problems.append(f"torch {torch_v} is not a ROCm build (torch.version.hip is None)")
    elif facts.get("device_error"):
        problems.append(f"torch {torch_v} cannot list its devices ({facts['device_error']})")
    elif not facts.get("devices"):
        where = "CUDA_VISIBLE_DEVICES, the container's --gpus" if platform == "cuda" else \
            "HIP_VISIBLE_DEVICES, the container's /dev/kfd and /dev/dri"
        problems.append(f"torch {torch_v} sees no {PLATFORM_NAMES[platform]} device (torch.cuda.is_available() is "
                        f"False; check the driver, {where})")
    for name in modules:
        err = facts.get("modules", {}).get(name, "not probed")
        if err is not None:
            problems.append(f"{name} does not import ({err})")
    if facts.get("triton_interpret") not in ("", "0"):
        problems.append(f"TRITON_INTERPRET={facts['triton_interpret']} is set: the GPU suite runs the compiled "
                        "Triton kernels")
    return problems


def preflight(suite: str) -> bool:
    """Print one line: what the GPU suite found, or what it is missing (then the suite must not run)."""
    platform, modules = GPU_SUITES[suite]
    found = preflight_problems(suite, gpu_facts(modules))
    if found:
        print(f"[run_suite] {suite}: preflight failed, no test run: {'; '.join(found)}", file=sys.stderr, flush=True)
        return False
    print(f"[run_suite] {suite}: preflight ok: a {PLATFORM_NAMES[platform]} device and {', '.join(modules)}",
          flush=True)
    return True


def processes_with_token(token: str) -> List[tuple]:
    """(pid, command line) of the live processes whose environment carries GROUP_ENV=token."""
    needle = f"{GROUP_ENV}={token}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if needle not in (d / "environ").read_bytes().split(b"\0"):
                continue
            if (d / "stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z":
                continue
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        found.append((int(d.name), cmd))
    return found


def sweep(token: str) -> List[str]:
    """Kill what a finished group left running (its own process group, or one that started a session of its own)
    after LEAK_GRACE_S (a helper such as multiprocessing's resource tracker exits on its own just after pytest)."""
    deadline = time.monotonic() + LEAK_GRACE_S
    leaked = processes_with_token(token)
    while leaked and time.monotonic() < deadline:
        time.sleep(0.1)
        leaked = processes_with_token(token)
    for pid, _ in leaked:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return [f"pid {pid}: {cmd[:200]}" for pid, cmd in leaked]


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_group(cmd: List[str], files: List[str], limit_s: float, env: dict | None = None,
              echo: bool = True) -> GroupResult:
    """One pytest process over `files` (with `env` added to its environment), its output streamed through (echo) or
    kept in the result's `output`; past limit_s it gets SIGABRT (pytest's faulthandler prints every thread's stack)
    and, ABORT_GRACE_S later, SIGKILL."""
    start = time.monotonic()
    tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
    held = bytearray()

    def emit(data: bytes) -> None:
        if echo:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
        else:
            held.extend(data)
    token = f"{os.getpid()}-{time.time_ns()}"
    proc = subprocess.Popen(cmd + files, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT,
                            start_new_session=True, bufsize=0, env={**os.environ, **(env or {}), GROUP_ENV: token})
    os.set_blocking(proc.stdout.fileno(), False)
    kill_at = None  # set once the group is found hung
    pending = b""
    while True:
        chunk = proc.stdout.read()
        if chunk:
            emit(chunk)
            *lines, pending = (pending + chunk).split(b"\n")
            tail.extend(x.decode(errors="replace") for x in lines)
        elif proc.poll() is not None:
            break
        else:
            time.sleep(0.05)
        now = time.monotonic()
        if kill_at is None and now - start > limit_s:
            emit(f"\n[run_suite] {' '.join(files)}: still running after {limit_s:.0f} s: printing every thread's "
                 f"stack (SIGABRT), then killing it\n".encode())
            _kill_group(proc, signal.SIGABRT)
            kill_at = now + ABORT_GRACE_S
        elif kill_at is not None and now > kill_at:
            _kill_group(proc, signal.SIGKILL)
    rc = proc.wait()
    if pending:
        tail.append(pending.decode(errors="replace"))
    hung = kill_at is not None
    leaked = sweep(token)  # what the group started and left running, wherever it went
    _kill_group(proc, signal.SIGKILL)
    if leaked and not hung:
        emit((f"[run_suite] left running by {' '.join(files)} (killed now):\n  " + "\n  ".join(leaked) + "\n").encode())
    return GroupResult(files, -1 if hung else rc, time.monotonic() - start, hung, list(tail), leaked, bytes(held))


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--suite", default="cpu")
    p.add_argument("--list", action="store_true")
    p.add_argument("-k", default=None, help="pytest -k expression")
    p.add_argument("-x", action="store_true", help="stop at the first failing group")
    p.add_argument("--timeout-per-file", type=float, default=900,
                   help="seconds a file may run (a group of files gets the sum, at least this)")
    p.add_argument("--hang-retries", type=int, default=1, help="runs more of a group that was killed as hung")
    p.add_argument("--jobs", type=int, default=None,
                   help=f"groups run side by side (serial=True files run after them, alone); default {DEFAULT_JOBS} "
                        "for a CPU suite, 1 for a GPU suite (its tests measure the one device's memory)")
    args = p.parse_args(argv)
    if args.jobs is None:
        args.jobs = 1 if args.suite in GPU_SUITES else DEFAULT_JOBS

    entries = [e for e in collect() if e.suite == args.suite and not e.disabled]
    entries.sort(key=lambda e: -e.est_time)
    if not entries:
        print(f"no test files registered for suite {args.suite!r}", file=sys.stderr)
        return 1
    total = sum(e.est_time for e in entries)
    print(f"suite {args.suite}: {len(entries)} files, estimated {total:.0f} s")
    for e in entries:
        print(f"  {e.est_time:6.0f} s  {e.path.relative_to(ROOT)}")
    if args.list:
        return 0
    env = {}
    if args.suite in GPU_SUITES:
        if not preflight(args.suite):
            return 1
        env[SUITE_GPU_ENV] = GPU_SUITES[args.suite][0]
    # a test still running after FAULTHANDLER_TIMEOUT_S gets every thread's stack printed (it keeps running)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=5",
           "-o", f"faulthandler_timeout={FAULTHANDLER_TIMEOUT_S}"]
    if args.k:
        cmd += ["-k", args.k]
    if args.x:
        cmd.append("-x")

    plugins = installed_plugins()

    def run_one(files: List[str], group_env: dict, echo: bool):
        return suite_pool.with_hang_retries(
            lambda: run_group(cmd + plugin_blocks(files, plugins), files, args.timeout_per_file * len(files),
                              {**env, **group_env}, echo=echo), files, args.hang_retries, echo)

    def as_groups(part: List[Entry]):
        return [([str(e.path.relative_to(ROOT)) for e in g], sum(e.est_time for e in g)) for g in groups(part)]

    def stop(got: List[GroupResult]) -> bool:
        return args.x and not group_ok(got[-1], bool(args.k))

    suite_start = time.monotonic()
    pooled = as_groups([e for e in entries if not e.serial])
    alone = as_groups([e for e in entries if e.serial])
    if args.jobs > 1:
        print(f"[run_suite] {len(pooled)} groups, {args.jobs} at a time; then {len(alone)} serial group(s) alone",
              flush=True)
        results = suite_pool.run_pool(pooled, run_one, args.jobs, suite_pool.thread_env(args.jobs), stop)
    else:
        results = suite_pool.run_serial(pooled, run_one, {}, stop)
    if not (results and stop(results[-1:])):
        results += suite_pool.run_serial(alone, run_one, {}, stop)
    return summarize(results, time.monotonic() - suite_start, k_filter=bool(args.k))


def group_ok(r: GroupResult, k_filter: bool = False) -> bool:
    # pytest's 5, "no tests collected": every file skipped itself at import, or -k deselected them all (which is
    # fine for one group of a -k run; summarize fails a -k run in which no group had a test)
    return r.rc == 0 or (k_filter and r.rc == PYTEST_NO_TESTS_COLLECTED)


def describe(r: GroupResult) -> str:
    if r.hung:
        return "HUNG (killed)"
    if r.rc == PYTEST_NO_TESTS_COLLECTED:
        return f"FAILED (pytest exit {r.rc}: no tests collected, nothing was checked)"
    return f"FAILED (pytest exit {r.rc})"


def summarize(results: List[GroupResult], seconds: float, k_filter: bool = False) -> int:
    final = {tuple(r.files): r for r in results}  # the last run of each group decides
    failed = [r for r in final.values() if not group_ok(r, k_filter)]
    nothing_ran = bool(final) and all(r.rc == PYTEST_NO_TESTS_COLLECTED for r in final.values())
    hangs = [r for r in results if r.hung]
    leaks = [(r, x) for r in results if not r.hung for x in r.leaked]
    print(f"\n[run_suite] ==== {len(final)} groups in {seconds:.0f} s: {len(final) - len(failed)} passed, "
          f"{len(failed)} failed; {len(hangs)} hang(s) killed; {len(leaks)} process(es) left running ====")
    for r, x in leaks:
        print(f"[run_suite] left running by {' '.join(r.files)}: {x}")
    for r in results:
        if r.hung or not group_ok(r, k_filter):
            print(f"\n[run_suite] {describe(r)} after {r.seconds:.0f} s: {' '.join(r.files)}; the end of its output:")
            print("\n".join(r.tail))
    if nothing_ran:
        print("[run_suite] FAILED: no group collected a test (pytest exit 5 everywhere)" +
              (": -k matched nothing" if k_filter else ""))
    return 1 if failed or nothing_ran else 0


if __name__ == "__main__":
    sys.exit(main())
