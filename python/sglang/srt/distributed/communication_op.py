"""Collectives of the TP group. Every one is the identity when tp == 1, so single-rank code paths pay nothing.

Which group: on CUDA the device group is NCCL, which only takes CUDA tensors, and cpu_group is gloo, which only
takes CPU tensors (on CPU both are the same gloo group). So a tensor goes to the group of its device, and pickled
objects, which the object collectives turn into CPU tensors on gloo (CUDA tensors on NCCL), always go to cpu_group.
Every torch.distributed collective of the package is here (test_collective_groups.py checks both).
"""

from __future__ import annotations

from typing import Any, List

import torch
import torch.distributed as dist

from sglang.srt.distributed.parallel_state import TpGroup, get_tp_group


def _group_for(g: TpGroup, x: torch.Tensor):
    return g.cpu_group if x.device.type == "cpu" else g.device_group


def tp_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum of x over the TP ranks (in place; returns x)."""
    g = get_tp_group()
    if g is None or g.size == 1:
        return x
    dist.all_reduce(x, group=_group_for(g, x))
    return x


def tp_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenation of every rank's x along dim, in rank order. x: [..., n, ...] -> [..., size * n, ...]."""
    g = get_tp_group()
    if g is None or g.size == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(g.size)]
    dist.all_gather(parts, x, group=_group_for(g, x))
    return torch.cat(parts, dim=dim)


def tp_broadcast_object(obj: Any = None, src: int = 0) -> Any:
    """Rank src's obj on every rank (pickled over the gloo group)."""
    g = get_tp_group()
    if g is None or g.size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=g.cpu_group)
    return box[0]


def tp_all_gather_object(obj: Any) -> List[Any]:
    """Every rank's obj, in rank order, on every rank (pickled over the gloo group)."""
    g = get_tp_group()
    if g is None or g.size == 1:
        return [obj]
    out: List[Any] = [None] * g.size
    dist.all_gather_object(out, obj, group=g.cpu_group)
    return out


def _reduce_int(value: int, op) -> int:
    g = get_tp_group()
    if g is None or g.size == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64)  # a host integer: gloo, never NCCL
    dist.all_reduce(t, op=op, group=g.cpu_group)
    return int(t.item())


def tp_max_int(value: int) -> int:
    """MAX of an integer over the TP ranks (the plan charges every rank the largest measured term)."""
    return _reduce_int(value, dist.ReduceOp.MAX)


def tp_min_int(value: int) -> int:
    """MIN of an integer over the TP ranks (every rank plans from the tightest device)."""
    return _reduce_int(value, dist.ReduceOp.MIN)
