"""The MoE workspace: the buffers a fused-experts call works in, allocated once and shared by every MoE layer.

For M tokens each routed to k of E experts (this rank's experts), hidden size K and N expert intermediate columns on
this rank (moe_intermediate_size / tp), every implementation of fused_experts (layers/moe/: the torch path now, the
Triton GPU kernel and the CPU kernel with the same signature) works in:

    intermediate1   [M*k, 2N]                   activation dtype  gate | up projection of each (token, expert) row
    intermediate2   [M*k, N]                    activation dtype  silu(gate) * up
    intermediate3   [M*k, K]                    activation dtype  each row's gathered input, then its down projection
    sorted_ids      [M*k + E*(B-1)]             int32   row ids m*k + j grouped by expert; each expert's group padded
                                                        to a multiple of the row block B (padding holds M*k)
    expert_ids      [ceil((M*k + E*(B-1)) / B)] int32   the expert of each block of B sorted rows
    expert_offsets  [E + 1]                     int32   start of each expert's (padded) group in sorted_ids; entry E
                                                        is the padded total

B is the implementation's row block (SORT_BLOCK_M): 1 for the torch path, which pads nothing, so its expert_ids is
the expert of every sorted row. The layers run one after another, so one workspace serves them all; a forward of more
than M tokens (a decode batch of more requests than the chunk) runs the experts M tokens at a time
(layers/moe/moe_layer.py). M is the chunked-prefill size, the most tokens a prefill batch holds (prefill_scheduler.py).
The plan charges the total as its `moe_workspace` term; the runner allocates exactly these buffers before the profile
forward (so the measured activation peak does not count them again) and asserts allocated == planned. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Dict, Optional, Tuple

from sglang.srt.mem_plan.dtypes import canonical_dtype, dtype_bytes

# The implementation that runs the experts on each device kind (the runtime's dispatch, layers/moe/dispatch.py, and
# `sglang plan` both read this rule): GPUs run the Triton kernel (layers/moe/triton_ops/), CPUs the torch path.
MOE_IMPL_BY_DEVICE = {"cpu": "torch", "cuda": "triton"}
# Row block of each implementation's sorted_ids padding (B above). The torch path groups rows without padding; the
# Triton kernel's largest row block (layers/moe/triton_ops/tiles.MOE_BLOCK_M, equal by test).
TORCH_SORT_BLOCK_M = 1
TRITON_SORT_BLOCK_M = 64
SORT_BLOCK_M = {"torch": TORCH_SORT_BLOCK_M, "triton": TRITON_SORT_BLOCK_M}
# Whether a CUDA graph can capture the implementation. The torch path reads the experts' row counts on the host, so a
# MoE model on it decodes without graphs (build.graph_batch_size); the Triton kernel reads them on the device.
CAPTURABLE = {"torch": False, "triton": True}
SORT_INDEX_DTYPE = "int32"

Buffers = Dict[str, Tuple[Tuple[int, ...], str]]


def moe_impl_for(device_kind: str) -> str:
    """The fused-experts implementation a start on this device kind ('cpu' / 'cuda') runs."""
    return MOE_IMPL_BY_DEVICE.get(device_kind, "torch")


@dataclass(frozen=True)
class MoEWorkspaceSpec:
    """The workspace of one rank (module docstring), for at most max_tokens tokens per fused-experts call."""

    max_tokens: int  # M
    top_k: int  # k
    num_experts: int  # E on this rank
    hidden_size: int  # K
    intermediate_size: int  # N on this rank
    act_dtype: str  # canonical name of the activation dtype
    block_m: int = TORCH_SORT_BLOCK_M  # B

    def __post_init__(self):
        for name in ("max_tokens", "top_k", "num_experts", "hidden_size", "intermediate_size", "block_m"):
            if getattr(self, name) <= 0:
                raise ValueError(f"MoEWorkspaceSpec.{name} must be > 0, got {getattr(self, name)}")
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k {self.top_k} > {self.num_experts} experts")
        object.__setattr__(self, "act_dtype", canonical_dtype(self.act_dtype))

    @property
    def num_rows(self) -> int:
        """M*k: one row per (token, chosen expert)."""
        return self.max_tokens * self.top_k

    @property
    def num_sorted_ids(self) -> int:
        return self.num_rows + self.num_experts * (self.block_m - 1)

    @property
    def num_blocks(self) -> int:
        return -(-self.num_sorted_ids // self.block_m)

    def buffers(self) -> Buffers:
        """name -> (shape, canonical dtype), in allocation order."""
        rows, n, act, idx = self.num_rows, self.intermediate_size, self.act_dtype, SORT_INDEX_DTYPE
        return {
            "intermediate1": ((rows, 2 * n), act),
            "intermediate2": ((rows, n), act),
            "intermediate3": ((rows, self.hidden_size), act),
            "sorted_ids": ((self.num_sorted_ids,), idx),
            "expert_ids": ((self.num_blocks,), idx),
            "expert_offsets": ((self.num_experts + 1,), idx),
        }

    @property
    def total_bytes(self) -> int:
        return sum(prod(shape) * dtype_bytes(dt) for shape, dt in self.buffers().values())

    def describe(self) -> str:
        return (f"{self.max_tokens:,} tokens x top-{self.top_k} of {self.num_experts} experts: [{self.num_rows:,}, "
                f"2x{self.intermediate_size} + {self.intermediate_size} + {self.hidden_size}] {self.act_dtype} + "
                f"{SORT_INDEX_DTYPE} sort buffers (block {self.block_m})")


def moe_workspace_spec(text, max_tokens: int, tp: int, act_dtype: str, device_kind: str) -> Optional[MoEWorkspaceSpec]:
    """The workspace of one rank of a model (model_shapes.TextShape) whose fused-experts calls take at most
    max_tokens tokens; None for a dense model. The expert intermediate size is split over the tp ranks."""
    if not text.sparse_layers or not text.num_experts:
        return None
    if text.moe_intermediate_size % tp:
        raise ValueError(f"--tp-size {tp} does not divide the model's MoE intermediate size "
                         f"{text.moe_intermediate_size}.")
    return MoEWorkspaceSpec(max_tokens, text.num_experts_per_tok, text.num_experts, text.hidden_size,
                            text.moe_intermediate_size // tp, act_dtype, SORT_BLOCK_M[moe_impl_for(device_kind)])


def moe_workspace_bytes(spec: Optional[MoEWorkspaceSpec]) -> int:
    return 0 if spec is None else spec.total_bytes
