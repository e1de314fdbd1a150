"""The TP ranks of a server, as the HTTP process sees them.

    node 0      TpServerRanks: rank 0 is the scheduler process (it talks to the TokenizerManager over ZMQ), the
                node's other ranks are followers; started together, watched and stopped as one (the same
                wait_ready / death / stop surface as a single scheduler process, see server_lifecycle.py)
    node n > 0  run_follower_node(): the node's ranks and no HTTP API; exits 0 when rank 0 released them (a
                normal stop of node 0) or on SIGTERM/SIGINT, 1 when one of them failed (named in the log)
A dead rank stops the whole server: death() names it and its cause, the server exits 1 (server_lifecycle.py).
"""

from __future__ import annotations

import logging
import signal
import time
from typing import Optional

from sglang.srt.distributed.launch import (
    COLLECTIVE_LOSS_MARKERS,
    check_tp_config,
    start_node_workers,
    with_dist_init_addr,
)
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.2
# rank 0 stops at its next step boundary after SIGTERM and releases the followers; past this it is killed
RANK0_STOP_TIMEOUT_S = 5.0


class TpServerRanks:
    def __init__(self, server_args: ServerArgs, port_args):
        from sglang.srt.entrypoints.server_lifecycle import launch_scheduler_process

        check_tp_config(server_args)
        sa = with_dist_init_addr(server_args)
        self.scheduler, self.reader = launch_scheduler_process(sa, port_args)
        self.workers = start_node_workers(sa)
        logger.info("TP ranks of this node: scheduler (rank 0) pid %d, followers %s at %s", self.scheduler.pid,
                    dict(zip(self.workers.ranks, self.workers.pids)), sa.dist_init_addr)

    @property
    def pids(self):
        return [self.scheduler.pid] + self.workers.pids

    def death(self) -> Optional[str]:
        """'TP rank k (pid p) died: cause' for the first rank of this node that exited, else None."""
        dead = self.workers.death()
        if self.scheduler.is_alive():
            return dead
        code = self.scheduler.exitcode
        how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exited with code {code}"
        rank0 = f"TP rank 0 (the scheduler, pid {self.scheduler.pid}) died: {how}"
        if dead is None:
            return rank0
        # a follower that only lost its connection to rank 0 is a consequence of rank 0's death
        lost_peer = " died: killed by " not in dead and any(m in dead for m in COLLECTIVE_LOSS_MARKERS)
        return f"{rank0} (then {dead})" if lost_peer else dead

    def wait_ready(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        info = None
        while time.monotonic() < deadline:
            if info is None and self.reader.poll(POLL_INTERVAL_S):
                try:
                    info = self.reader.recv()
                except EOFError:
                    info = {"status": "error", "message": "the scheduler process closed its pipe"}
                if info.get("status") != "ready":
                    raise RuntimeError(f"TP rank 0 (the scheduler) failed to start: {info.get('message')}")
            dead = self.death()
            if dead is not None:
                raise RuntimeError(f"{dead} during startup; see its log above.")
            if info is not None and self.workers.all_ready():
                return info
            if info is not None:
                time.sleep(POLL_INTERVAL_S)
        raise RuntimeError(f"The TP ranks did not start within {timeout_s:.0f} s.")

    def stop(self) -> None:
        """Rank 0 first (it releases the followers at a step boundary), then the followers. When a rank is already
        dead the others may be stuck in a collective with it: everything is killed at once."""
        dead = self.death()
        if dead is not None:
            logger.error("Stopping every TP rank: %s", dead)
            for p in [self.scheduler] + self.workers.procs:
                if p.is_alive():
                    p.kill()
        elif self.scheduler.is_alive():
            self.scheduler.terminate()
            self.scheduler.join(RANK0_STOP_TIMEOUT_S)
            if self.scheduler.is_alive():
                self.scheduler.kill()
        self.scheduler.join(RANK0_STOP_TIMEOUT_S)
        self.workers.stop()


def run_follower_node(server_args: ServerArgs) -> int:
    """Node node_rank > 0: run its ranks until rank 0 releases them, a signal, or a failure. Returns the exit code."""
    check_tp_config(server_args)
    workers = start_node_workers(server_args)
    logger.info("Node %d of %d: TP ranks %s (pids %s) joining %s; no HTTP API on this node", server_args.node_rank,
                server_args.nnodes, workers.ranks, workers.pids, server_args.dist_init_addr)

    def on_signal(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        while True:
            time.sleep(POLL_INTERVAL_S)
            codes = [p.exitcode for p in workers.procs]
            if all(c == 0 for c in codes):
                logger.info("Rank 0 released this node's ranks; stopping.")
                return 0
            if any(c not in (None, 0) for c in codes):
                logger.error("%s; stopping this node.", workers.death())
                return 1
    except SystemExit:
        return 0
    finally:
        workers.stop()
