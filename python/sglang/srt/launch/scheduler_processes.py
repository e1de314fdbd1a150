"""The scheduler side of an HTTP server, as one ProcessGroup:

    one scheduler process          --tp-size 1 --dp-size 1
    TP rank 0 + followers          --tp-size N: rank 0 is the scheduler process (it talks to the TokenizerManager over
                                   ZMQ), this node's other ranks are followers (tp_ranks.py); rank 0 stops first
    N scheduler processes          --dp-size N: one whole single-rank server core per replica, each with its own
                                   input socket (PortArgs.for_replica) and, on GPUs, its own device
Every scheduler process runs managers/scheduler_process.py:run_scheduler_process and reports its ready_info.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
from typing import List, Optional

from sglang.srt.launch.process_group import Child, ProcessGroup
from sglang.srt.launch.tp_config import check_tp_config, with_dist_init_addr
from sglang.srt.launch.tp_ranks import spawn_followers
from sglang.srt.managers.data_parallel_controller import merge_ready_info, replica_port_args
from sglang.srt.managers.port_args import PortArgs
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.cpu_threads import replica_num_threads, scheduler_child_env

logger = logging.getLogger(__name__)

SCHEDULER_ENTRY = "sglang.srt.managers.scheduler_process:run_scheduler_process"
SCHEDULER_STARTUP_TIMEOUT_S = 600.0


def start_scheduler_processes(sa: ServerArgs, port_args: PortArgs) -> ProcessGroup:
    """Spawn the scheduler side (see the module docstring); wait_for_schedulers() then waits until it serves."""
    if sa.dp_size > 1:
        return start_replicas(sa, port_args)
    if sa.tp_size == 1:
        group = ProcessGroup("scheduler process")
        group.spawn("the scheduler process", SCHEDULER_ENTRY, (sa, port_args), log_name="scheduler",
                    log_level=sa.log_level, env=scheduler_child_env())
        return group
    check_tp_config(sa)
    sa = with_dist_init_addr(sa)
    group = ProcessGroup("TP ranks")
    group.spawn("TP rank 0", SCHEDULER_ENTRY, (sa, port_args), log_name="scheduler", log_level=sa.log_level,
                env=scheduler_child_env())
    spawn_followers(group, sa)
    logger.info("TP ranks of this node: scheduler (rank 0) pid %d, followers %s at %s", group.pids[0],
                group.pids[1:], sa.dist_init_addr)
    return group


def wait_for_schedulers(group: ProcessGroup, sa: ServerArgs, timeout_s: float = SCHEDULER_STARTUP_TIMEOUT_S) -> dict:
    """The ready_info the main process serves with (every replica's merged). RuntimeError when startup fails."""
    infos = group.wait_ready(timeout_s)
    if sa.dp_size == 1:
        return infos[0]  # TP: rank 0's (the followers report only that they are ready)
    for k, info in enumerate(infos):
        logger.info("Replica %d: KV pool %s tokens, %s request slots", k, f"{info.get('max_total_num_tokens'):,}",
                    info.get("max_running_requests"))
    return merge_ready_info(infos)


# ====================================================================== data-parallel replicas
def replica_server_args(server_args: ServerArgs, dp_size: int) -> ServerArgs:
    """A replica's ServerArgs: on CPU, with --num-threads unset, its share of the cores."""
    if server_args.device not in ("auto", "cpu"):
        return server_args
    return dataclasses.replace(server_args, num_threads=replica_num_threads(server_args.num_threads, dp_size))


def replica_visible_devices(server_args: ServerArgs, dp_size: int) -> Optional[List[str]]:
    """The GPU each replica sees (CUDA_VISIBLE_DEVICES), or None on CPU. Raises when there are fewer than N."""
    from sglang.srt.configs.resolved import gpu_count, resolve_device

    if resolve_device(server_args.device) == "cpu":
        return None
    present = gpu_count()
    if present == 0:
        raise RuntimeError(f"--device {server_args.device}: no GPU is visible.")
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = [d.strip() for d in env.split(",") if d.strip()] if env else [str(i) for i in range(present)]
    if dp_size > len(visible):
        raise RuntimeError(f"--dp-size {dp_size} needs {dp_size} GPUs (one per replica); {len(visible)} visible.")
    return visible[:dp_size]


def describe_replica_death(child: Child, others: List[Child]) -> str:
    code = child.exit_code
    if code is not None and code < 0:
        how = f"was killed by {signal.Signals(-code).name}"
    elif child.report.get("status") in ("error", "fatal"):
        how = f"failed: {child.report['message']}"
    else:
        how = f"exited with code {code}"
    return f"{child.label} (scheduler pid {child.pid}) {how}"


def start_replicas(sa: ServerArgs, port_args: PortArgs) -> ProcessGroup:
    dp = sa.dp_size
    devices = replica_visible_devices(sa, dp)
    replica_args = replica_server_args(sa, dp)
    group = ProcessGroup("data-parallel replicas", describe=describe_replica_death)
    for k, pa in enumerate(replica_port_args(port_args, dp)):
        group.spawn(f"data-parallel replica {k}", SCHEDULER_ENTRY, (replica_args, pa), log_name=f"scheduler dp{k}",
                    log_level=sa.log_level, env={**scheduler_child_env(), **({"CUDA_VISIBLE_DEVICES": devices[k]} if devices else {})})
    logger.info("Started %d data-parallel replicas (pids %s), load balancing: %s", dp,
                ", ".join(str(p) for p in group.pids), sa.load_balance_method)
    return group
