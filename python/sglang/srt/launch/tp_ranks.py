"""The follower TP ranks of this node (tp_config.py says which), in a ProcessGroup, for each kind of rank 0:

    Engine             rank 0 is the caller's own process: start_engine_ranks(); a thread ends the process (exit 1,
                       the dead rank named in the log) when a follower dies, since rank 0 would wait for it forever
    server, node 0     rank 0 is the scheduler process, in the same group (scheduler_processes.py)
    server, node n > 0 run_follower_node(): the node's ranks and no HTTP API; exits 0 when rank 0 released them (a
                       normal stop of node 0) or on SIGTERM/SIGINT, 1 when one of them failed (named in the log)
A follower runs distributed/tp_worker.py:run_tp_worker; rank 0 releases it at a stop, so the followers are the last
stop wave (stop_wave=1) behind a rank 0 in the group.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Optional, Tuple

from sglang.srt.launch.process_group import ProcessGroup
from sglang.srt.launch.tp_config import check_tp_config, ranks_of_node, with_dist_init_addr
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.cpu_threads import scheduler_child_env

logger = logging.getLogger(__name__)

FOLLOWER_ENTRY = "sglang.srt.distributed.tp_worker:run_tp_worker"
RANK_WATCH_INTERVAL_S = 0.2
FOLLOWER_STOP_WAVE = 1


def spawn_followers(group: ProcessGroup, sa: ServerArgs) -> None:
    """This node's ranks but 0 (the caller runs rank 0, or has spawned it into `group`)."""
    for rank in ranks_of_node(sa):
        if rank != 0:
            group.spawn(f"TP rank {rank}", FOLLOWER_ENTRY, (sa, rank), log_name=f"tp{rank}", log_level=sa.log_level,
                        stop_wave=FOLLOWER_STOP_WAVE, env=scheduler_child_env())


def start_engine_ranks(sa: ServerArgs) -> Tuple[ServerArgs, Optional[ProcessGroup]]:
    """(server args with --dist-init-addr resolved, the followers or None at tp == 1) for an in-process rank 0."""
    if sa.tp_size == 1:
        return sa, None
    if sa.nnodes != 1:
        raise ValueError("sglang.Engine runs every TP rank on this machine; use --nnodes 1 (or the server).")
    check_tp_config(sa)
    sa = with_dist_init_addr(sa)
    group = ProcessGroup("TP ranks")
    spawn_followers(group, sa)
    threading.Thread(target=_exit_when_a_rank_dies, args=(group,), name="tp-rank-watch", daemon=True).start()
    return sa, group


def _exit_when_a_rank_dies(group: ProcessGroup) -> None:
    while not group.exits_expected.wait(RANK_WATCH_INTERVAL_S):
        if group.death() is not None:
            group.stop()  # logs the dead rank and its cause
            logger.error("Stopping this process: TP rank 0 cannot go on without every other rank.")
            logging.shutdown()
            os._exit(1)


def run_follower_node(sa: ServerArgs) -> int:
    """Node node_rank > 0: run its ranks until rank 0 releases them, a signal, or a failure. Returns the exit code."""
    check_tp_config(sa)
    group = ProcessGroup("TP ranks")
    spawn_followers(group, sa)
    logger.info("Node %d of %d: TP ranks %s (pids %s) joining %s; no HTTP API on this node", sa.node_rank,
                sa.nnodes, ranks_of_node(sa), group.pids, sa.dist_init_addr)

    def on_signal(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        while True:
            time.sleep(RANK_WATCH_INTERVAL_S)
            codes = group.exit_codes()
            if all(c == 0 for c in codes):
                logger.info("Rank 0 released this node's ranks; stopping.")
                group.expect_exits()
                return 0
            if any(c not in (None, 0) for c in codes):
                return 1  # stop() below names the rank that failed first
    except SystemExit:
        return 0
    finally:
        group.stop()
