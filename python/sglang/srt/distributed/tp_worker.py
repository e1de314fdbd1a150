"""A follower TP rank (rank != 0): its own ModelRunner (its weight shard, its KV pool), no scheduler, no HTTP.

It runs the forward rank 0 broadcasts (batch_sync.py), in lockstep with every other rank, until rank 0 sends
"stop". Reports through `pipe_writer`: {"status": "ready"} once its plan is allocated, then, if it fails,
{"status": "fatal", "message": ...} before exiting with code 1; a startup failure is {"status": "error", ...}.
SIGTERM ends it at once (default action: it holds no sockets or files to release), and it never outlives its parent.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import traceback
from typing import Optional

from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


# Tests make a follower raise: "RANK:N" raises RuntimeError in rank RANK's N-th broadcast forward (1-based).
FAULT_ENV = "SGLANG_TP_WORKER_FAULT"


def injected_fault_at(tp_rank: int) -> Optional[int]:
    spec = os.environ.get(FAULT_ENV, "")
    rank, _, n = spec.partition(":")
    return int(n) if spec and int(rank) == tp_rank else None


def follower_loop(runner) -> None:
    from sglang.srt.distributed.batch_sync import FORWARD, PING, STOP, unpack_forward_batch
    from sglang.srt.distributed.communication_op import tp_broadcast_object

    fault_at = injected_fault_at(runner.tp_rank)
    num_forwards = 0
    while True:
        kind, payload = tp_broadcast_object(None)
        if kind == STOP:
            return
        if kind == PING:
            continue
        assert kind == FORWARD, kind
        num_forwards += 1
        if num_forwards == fault_at:
            raise RuntimeError(f"injected fault ({FAULT_ENV}) in forward {num_forwards}")
        fb = unpack_forward_batch(payload, runner.req_to_token_pool.req_to_token)
        runner.forward_local(fb)


def run_tp_worker(server_args: ServerArgs, tp_rank: int, pipe_writer, parent_pid: int) -> None:
    from sglang.srt.managers.scheduler_process import kill_itself_when_parent_died

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    kill_itself_when_parent_died(parent_pid)
    logging.basicConfig(level=server_args.log_level.upper(),
                        format=f"[%(asctime)s tp{tp_rank}] %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")
    try:
        from sglang.srt.model_executor.model_runner import ModelRunner

        runner = ModelRunner(server_args, tp_rank=tp_rank)
    except BaseException as e:  # noqa: BLE001 - everything must reach the parent as a message
        logger.error("TP rank %d failed to start:\n%s", tp_rank, traceback.format_exc())
        pipe_writer.send({"status": "error", "message": f"{type(e).__name__}: {e}"})
        sys.exit(1)
    pipe_writer.send({"status": "ready"})
    try:
        follower_loop(runner)
    except BaseException as e:  # noqa: BLE001
        logger.error("TP rank %d crashed:\n%s", tp_rank, traceback.format_exc())
        try:
            pipe_writer.send({"status": "fatal", "message": f"{type(e).__name__}: {e}"})
        finally:
            os._exit(1)
    logger.info("TP rank %d stopped", tp_rank)
    os._exit(0)
