"""How run_suite.py runs its groups: a pool of `jobs` groups side by side, then the serial ones alone.

A group is run by `run_one(files, env, echo)`, which returns one GroupResult per attempt (a hang is run again) and
the text it would have printed. In the pool each group's output is held (echo=False) and printed whole, under a
lock, when the group ends, so two groups' lines never interleave; a serial group streams its output as it comes.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Callable, List, Sequence, Tuple

# (files of a group, its declared seconds)
Group = Tuple[List[str], float]
RunOne = Callable[[List[str], dict, bool], Tuple[list, bytes]]


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def thread_env(jobs: int, environ=os.environ) -> dict:
    """What each of `jobs` side-by-side groups adds to its environment: its share of the cores for its own torch
    (OMP_NUM_THREADS, read when torch loads), and OpenMP threads that sleep when they wait, not spin, so a group
    waiting at a barrier does not burn the core its neighbour needs. A variable the caller set is left as set."""
    if jobs <= 1:
        return {}
    want = {"OMP_NUM_THREADS": str(max(1, usable_cores() // jobs)), "OMP_WAIT_POLICY": "PASSIVE"}
    return {k: v for k, v in want.items() if k not in environ}


def longest_first(groups: Sequence[Group]) -> List[Group]:
    """The order a pool starts groups in: longest declared first, so the last to start are the short ones."""
    return sorted(groups, key=lambda g: -g[1])


def with_hang_retries(run: Callable[[], object], files: List[str], retries: int, echo: bool) -> Tuple[list, bytes]:
    """Every attempt's result of `run()` (a group killed as hung runs again, up to `retries` more times; a failure
    never does) and what they printed; echo: printed as it comes, else held for the caller to print whole."""
    out, text = [], f"\n[run_suite] {' '.join(files)}\n".encode()
    if echo:
        print(text.decode(), end="", flush=True)
    for attempt in range(1 + retries):
        res = run()
        out.append(res)
        line = (f"[run_suite] hung (attempt {attempt + 1}); " +
                ("running it again" if attempt < retries else "giving up") + "\n") if res.hung else ""
        text += res.output + line.encode()
        if echo and line:
            print(line, end="", flush=True)
        if not res.hung:
            break
    return out, text


def run_pool(groups: Sequence[Group], run_one: RunOne, jobs: int, env: dict,
             stop: Callable[[list], bool] = lambda results: False) -> list:
    """Run `groups` on `jobs` worker threads (each a pytest process at a time), longest first; the results of every
    attempt, in the order the groups ended. `stop(results_of_one_group)` True: start no further group."""
    pending = list(longest_first(groups))
    results: list = []
    lock = threading.Lock()
    halted = threading.Event()

    def worker():
        while not halted.is_set():
            with lock:
                if not pending:
                    return
                files, _ = pending.pop(0)
                print(f"[run_suite] started: {' '.join(files)}", flush=True)
            got, text = run_one(files, env, False)
            with lock:
                sys.stdout.buffer.write(text)
                sys.stdout.flush()
                results.extend(got)
                if stop(got):
                    halted.set()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def run_serial(groups: Sequence[Group], run_one: RunOne, env: dict,
               stop: Callable[[list], bool] = lambda results: False) -> list:
    """Run `groups` one after another, in the given order, each streaming its output."""
    results: list = []
    for files, _ in groups:
        got, _ = run_one(files, env, True)
        results.extend(got)
        if stop(got):
            break
    return results
