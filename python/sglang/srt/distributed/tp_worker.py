"""A follower TP rank (rank != 0): its own ModelRunner (its weight shard, its KV pool), no scheduler, no HTTP.

It runs the forward rank 0 broadcasts (batch_sync.py), in lockstep with every other rank, until rank 0 sends
"stop". It runs as a child of a process group (srt/launch/tp_ranks.py): it reports ready once its plan is allocated,
and the group learns of its failures and makes it die with its parent. SIGTERM ends it at once (default action: it
holds no sockets or files to release, and it may be blocked inside a collective).
"""

from __future__ import annotations

import logging
import os
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
        pool = getattr(runner, "token_to_kv_pool", None)
        fb = unpack_forward_batch(payload, runner.req_to_token_pool.req_to_token, getattr(pool, "window", None),
                                  getattr(pool, "slot_map", None))
        runner.forward_local(fb)


def run_tp_worker(server_args: ServerArgs, tp_rank: int, report) -> None:
    """Entry of a follower rank's process (srt/launch/child.py runs it)."""
    from sglang.srt.model_executor.model_runner import ModelRunner

    runner = ModelRunner(server_args, tp_rank=tp_rank)
    report.ready()
    follower_loop(runner)
    logger.info("TP rank %d stopped", tp_rank)
    os._exit(0)  # released: skip the interpreter's teardown of torch
