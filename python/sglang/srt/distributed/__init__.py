"""Tensor parallelism on torch.distributed: process groups (parallel_state), collectives (communication_op), the
batch rank 0 broadcasts (batch_sync) and the follower ranks' loop (tp_worker). Starting and watching the ranks'
processes is srt/launch/."""

from sglang.srt.distributed.communication_op import (
    tp_all_gather,
    tp_all_gather_object,
    tp_all_reduce,
    tp_broadcast_object,
    tp_max_int,
)
from sglang.srt.distributed.parallel_state import divide, get_tp_group, get_tp_rank, get_tp_size

__all__ = ["divide", "get_tp_group", "get_tp_rank", "get_tp_size", "tp_all_gather", "tp_all_gather_object",
           "tp_all_reduce", "tp_broadcast_object", "tp_max_int"]
