"""Killing a process and what it started, with upstream's names (`sglang.srt.utils.kill_process_tree`).

A server is a tree: the HTTP process, its scheduler(s), TP ranks, detokenizer. Tests and launch scripts stop it by
pid; these walk the tree with psutil and kill the descendants before the root, so no orphan keeps a port or memory.
"""

from __future__ import annotations

import os
import signal
from typing import Optional


def kill_process_tree(parent_pid: Optional[int] = None, include_parent: bool = True, skip_pid: Optional[int] = None,
                      wait_s: float = 10.0) -> None:
    """SIGKILL every descendant of parent_pid (except skip_pid), then parent_pid itself when include_parent.

    parent_pid None means this process: its children are killed and it is kept (upstream's meaning). Waits up to
    wait_s for the killed processes to be gone, so the caller can reuse their port at once.
    """
    import psutil

    if parent_pid is None:
        parent_pid, include_parent = os.getpid(), False
    try:
        parent = psutil.Process(parent_pid)
    except psutil.NoSuchProcess:
        return
    try:
        victims = [p for p in parent.children(recursive=True) if p.pid != skip_pid]
    except psutil.NoSuchProcess:
        victims = []
    if include_parent and parent_pid != os.getpid():
        victims.append(parent)
    for p in victims:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(victims, timeout=wait_s)
    if include_parent and parent_pid == os.getpid():
        os.kill(parent_pid, signal.SIGKILL)  # last: the caller asked to end itself


def kill_child_process(pid: Optional[int] = None, include_self: bool = False, skip_pid: Optional[int] = None) -> None:
    """Upstream's older name: kill pid's descendants (this process's when None), and pid itself if include_self."""
    kill_process_tree(pid, include_parent=include_self, skip_pid=skip_pid)
