"""Tensor-parallel process groups (torch.distributed): who am I, how many are we, which group to talk to.

One process per TP rank; the world is exactly the TP group (no pipeline / data parallel ranks inside it).
    device_group   the backend of the tensors the model reduces: gloo on CPU, nccl on CUDA (the default group)
    cpu_group      always gloo: pickled Python objects (the scheduled batches rank 0 broadcasts) and every host
                   tensor, such as the memory plan's integer reductions (NCCL cannot reduce a CPU tensor)
Collectives go through communication_op.py, which picks the group by what it carries.
Before init_tp_group() (and in every tp=1 process) get_tp_size() == 1 and get_tp_rank() == 0, so layers built
outside a distributed run are the plain single-rank layers.

Expert parallelism (--ep-size, dividing --tp-size) uses no group of its own: the MoE layers split the TP ranks into
ep_size expert groups of moe_tp = tp_size / ep_size consecutive ranks (moe_parallel_layout). Rank r holds expert
group r // moe_tp (E / ep_size whole experts) and, within it, intermediate shard r % moe_tp; every (expert, shard)
pair lives on exactly one rank, so the MoE block's one all-reduce over the TP group completes the sum as it does
for plain TP (ep_size 1: moe_tp = tp_size) and for pure EP (ep_size = tp_size: moe_tp = 1).

single_rank_view(): inside it, in the calling thread only, get_tp_group() is None, get_tp_size() 1, get_tp_rank() 0
and get_ep_size() 1, so layers built there are unsharded and every collective of communication_op.py is the identity.
Rank 0 builds and runs a speculative draft that way (model_executor/draft_runner.py); another thread (the overlap
worker running a target forward) keeps the real group.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import threading
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

# A collective waits this long for its peers. Followers wait in a broadcast while the server is idle, so this is
# not a liveness check: a dead rank closes its sockets (gloo raises at once) or is reaped by the parent process.
COLLECTIVE_TIMEOUT = datetime.timedelta(days=365)


@dataclass(frozen=True)
class TpGroup:
    rank: int
    size: int
    device: str  # "cpu" or "cuda"
    device_group: Any
    cpu_group: Any
    ep_size: int = 1  # expert groups the MoE layers split the ranks into (moe_parallel_layout)


_TP: Optional[TpGroup] = None
_VIEW = threading.local()  # .single: this thread sees a tp=1 world (single_rank_view)


def divide(numerator: int, denominator: int, what: str = "size") -> int:
    if numerator % denominator:
        raise ValueError(f"{what} {numerator} is not divisible by --tp-size {denominator}.")
    return numerator // denominator


@dataclass(frozen=True)
class MoeParallelLayout:
    """Where one rank's experts come from (module docstring): experts [ep_rank * E / ep_size, (ep_rank + 1) * E /
    ep_size), intermediate columns shard moe_tp_rank of moe_tp_size."""

    ep_size: int
    ep_rank: int
    moe_tp_size: int
    moe_tp_rank: int


def moe_parallel_layout(tp_size: int, tp_rank: int, ep_size: int) -> MoeParallelLayout:
    if ep_size < 1 or tp_size % ep_size:
        raise ValueError(f"--ep-size {ep_size} must divide --tp-size {tp_size}.")
    moe_tp = tp_size // ep_size
    return MoeParallelLayout(ep_size, tp_rank // moe_tp, moe_tp, tp_rank % moe_tp)


def init_tp_group(tp_size: int, tp_rank: int, init_addr: str, device: str, ep_size: int = 1) -> TpGroup:
    """Join the TP group at tcp://init_addr (host:port) as rank tp_rank; blocks until all tp_size ranks joined.
    ep_size: the expert groups its MoE layers use (moe_parallel_layout)."""
    global _TP
    if _TP is not None:
        raise RuntimeError("the tensor-parallel group is already initialised in this process")
    moe_parallel_layout(tp_size, tp_rank, ep_size)  # refused before any rendezvous
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(tp_rank % torch.cuda.device_count())
    dist.init_process_group(backend=backend, init_method=f"tcp://{init_addr}", world_size=tp_size, rank=tp_rank,
                            timeout=COLLECTIVE_TIMEOUT)
    world = dist.group.WORLD
    cpu_group = world if backend == "gloo" else dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT)
    _TP = TpGroup(tp_rank, tp_size, device, world, cpu_group, ep_size)
    logger.info("TP rank %d of %d joined the group at %s (%s, ep_size %d)", tp_rank, tp_size, init_addr, backend,
                ep_size)
    return _TP


def destroy_tp_group() -> None:
    global _TP
    if _TP is None:
        return
    _TP = None
    if dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def single_rank_view():
    """This thread sees a tp=1 world inside the block (module docstring); nests."""
    saved = getattr(_VIEW, "single", False)
    _VIEW.single = True
    try:
        yield
    finally:
        _VIEW.single = saved


def _group() -> Optional[TpGroup]:
    return None if getattr(_VIEW, "single", False) else _TP


def get_tp_group() -> Optional[TpGroup]:
    return _group()


def get_tp_rank() -> int:
    g = _group()
    return g.rank if g is not None else 0


def get_tp_size() -> int:
    g = _group()
    return g.size if g is not None else 1


def get_ep_size() -> int:
    """--ep-size: the expert groups of the MoE layers (1 outside a distributed run); moe_parallel_layout(get_tp_size(),
    get_tp_rank(), get_ep_size()) is this rank's place in them."""
    g = _group()
    return g.ep_size if g is not None else 1
