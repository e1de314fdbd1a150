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
    from sglang.srt.mem_plan.model_shapes import model_shape_from_path
    from sglang.srt.model_loader import resolve_model_path

    shape = model_shape_from_path(resolve_model_path(sa))  # also converts a GGUF once, before the ranks read it
    t, tp = shape.text, sa.tp_size
    if shape.encoders:
        raise ValueError(f"--tp-size {tp}: multimodal models run on one rank only; use --tp-size 1.")
    if t.num_q_heads % tp:
        raise ValueError(f"--tp-size {tp} does not divide the model's {t.num_q_heads} attention heads; "
                         f"pick a divisor of {t.num_q_heads}.")
    if t.num_kv_heads % tp and tp % t.num_kv_heads:
        raise ValueError(f"--tp-size {tp} and the model's {t.num_kv_heads} KV heads: one must divide the other "
                         f"(KV heads are split, or replicated when tp > KV heads).")
    if t.intermediate_size % tp:
        raise ValueError(f"--tp-size {tp} does not divide the model's intermediate size {t.intermediate_size}.")
    per_node = tp // sa.nnodes
    device = sa.device
    if device in ("auto", "cuda", "hip"):
        import torch

        present = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if device != "auto" or present:
            if per_node > present:
                raise ValueError(f"--tp-size {tp} over --nnodes {sa.nnodes} needs {per_node} GPUs per node; "
                                 f"{present} present.")
