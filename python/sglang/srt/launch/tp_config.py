"""Where the TP ranks run and whether they can: checked in the parent, before any rank starts.

    node n of --nnodes runs ranks [n * k, (n + 1) * k), k = tp_size / nnodes; rank 0 (node 0) is the scheduler
    (the server's scheduler process, or the offline Engine's own process), every other rank a follower
The ranks meet at --dist-init-addr (host:port; on one node a free port on 127.0.0.1 is picked when unset).
"""

from __future__ import annotations

import dataclasses
import socket
from typing import List

from sglang.srt.server_args import ServerArgs


def ranks_of_node(sa: ServerArgs) -> List[int]:
    per_node = sa.tp_size // sa.nnodes
    return list(range(sa.node_rank * per_node, (sa.node_rank + 1) * per_node))


def free_local_addr() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def with_dist_init_addr(sa: ServerArgs) -> ServerArgs:
    """sa with --dist-init-addr set: unchanged when given (or tp == 1), else a free loopback port (one node)."""
    if sa.tp_size == 1 or sa.dist_init_addr:
        return sa
    return dataclasses.replace(sa, dist_init_addr=free_local_addr())


def check_tp_config(sa: ServerArgs) -> None:
    """Fail before any rank starts: heads / KV heads / intermediate / vocab sharding, model kind, devices present."""
    if sa.tp_size == 1:
        return
    from sglang.srt.configs.resolved import check_tp_sharding, gpu_count, resolve_device
    from sglang.srt.mem_plan.model_shapes import model_shape_from_path
    from sglang.srt.model_loader import resolve_model_path

    shape = model_shape_from_path(resolve_model_path(sa, dense_linears=False))  # also converts a GGUF once, before the ranks read it
    check_tp_sharding(shape, sa.tp_size, sa.ep_size)  # the rule `sglang plan` applies too (configs/resolved.py)
    tp = sa.tp_size
    per_node = tp // sa.nnodes
    if resolve_device(sa.device) == "cuda":
        present = gpu_count()
        if per_node > present:
            raise ValueError(f"--tp-size {tp} over --nnodes {sa.nnodes} needs {per_node} GPUs per node; "
                             f"{present} present.")
