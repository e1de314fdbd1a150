"""PortArgs: the ZMQ endpoints that connect the HTTP process and the scheduler process.

    main process (TokenizerManager)                      scheduler process
      PUSH  --connect-->  scheduler_input_ipc_name  <--bind--  PULL   requests and control messages
      PULL  --bind----->  tokenizer_ipc_name        <--connect-- PUSH  BatchReqOutput per step, RpcReply

Endpoints are ipc:// sockets in a fresh temporary directory, so several servers on one machine never collide;
`cleanup()` removes the directory at shutdown. A server killed without cleanup (SIGKILL, OOM killer) leaves its
directory behind, so each directory records its owner ("pid start_time" in OWNER_FILE) and `init_new()` first
removes the directories whose owner is gone. A directory whose owner lives, or whose owner is unknown (another
user's, or one still being created), is never touched.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import List, Optional

import psutil

logger = logging.getLogger(__name__)

IPC_DIR_PREFIX = "sglang-ipc-"
OWNER_FILE = "owner"
# the start time of a pid is recorded so a recycled pid is not taken for the owner
START_TIME_TOLERANCE_S = 1.0


def process_start_time(pid: int) -> Optional[float]:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:
        return -1.0  # exists, but not ours to inspect: treat as alive


def owner_is_alive(ipc_dir: str) -> Optional[bool]:
    """True/False from the directory's owner record; None when it has no readable record."""
    try:
        with open(os.path.join(ipc_dir, OWNER_FILE)) as f:
            pid_text, start_text = f.read().split()
        pid, start = int(pid_text), float(start_text)
    except (OSError, ValueError):
        return None
    now_start = process_start_time(pid)
    if now_start is None:
        return False
    return now_start < 0 or abs(now_start - start) <= START_TIME_TOLERANCE_S


def remove_stale_ipc_dirs(root: Optional[str] = None) -> List[str]:
    """Remove this user's IPC directories under `root` (the temp dir) whose owner process is gone."""
    root = root or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        path = os.path.join(root, name)
        if not name.startswith(IPC_DIR_PREFIX):
            continue
        try:
            if not os.path.isdir(path) or os.path.islink(path) or os.stat(path).st_uid != os.getuid():
                continue
        except OSError:
            continue
        if owner_is_alive(path) is False:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    if removed:
        logger.info("Removed %d IPC director%s left by servers that died: %s", len(removed),
                    "y" if len(removed) == 1 else "ies", ", ".join(removed))
    return removed


@dataclass(frozen=True)
class PortArgs:
    ipc_dir: str
    scheduler_input_ipc_name: str
    tokenizer_ipc_name: str
    dp_rank: int = 0  # the --dp-size replica a scheduler process serves as (stamped on its RpcReply)

    @classmethod
    def init_new(cls, root: Optional[str] = None) -> "PortArgs":
        remove_stale_ipc_dirs(root)
        ipc_dir = tempfile.mkdtemp(prefix=IPC_DIR_PREFIX, dir=root)
        pid = os.getpid()
        record = os.path.join(ipc_dir, OWNER_FILE + ".tmp")
        with open(record, "w") as f:
            f.write(f"{pid} {process_start_time(pid)!r}\n")
        os.replace(record, os.path.join(ipc_dir, OWNER_FILE))  # readers see a whole record or none
        return cls(
            ipc_dir=ipc_dir,
            scheduler_input_ipc_name=f"ipc://{os.path.join(ipc_dir, 'scheduler_input')}",
            tokenizer_ipc_name=f"ipc://{os.path.join(ipc_dir, 'tokenizer')}",
        )

    def for_replica(self, dp_rank: int) -> "PortArgs":
        """Data-parallel replica dp_rank: its own input socket; every replica's outputs go to the one tokenizer."""
        return dataclasses.replace(self, scheduler_input_ipc_name=f"{self.scheduler_input_ipc_name}_{dp_rank}",
                                   dp_rank=dp_rank)

    def cleanup(self) -> None:
        shutil.rmtree(self.ipc_dir, ignore_errors=True)
