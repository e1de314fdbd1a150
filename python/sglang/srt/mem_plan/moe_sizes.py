"""The MoE workspace: the buffers a fused-experts call works in, allocated once and shared by every MoE layer.

For M tokens each routed to k of E experts (this rank's experts: all of them, or E / ep with --ep-size), hidden size
K and N expert intermediate columns on this rank (moe_intermediate_size / (tp / ep): expert_shard_of_rank), every
implementation of fused_experts (layers/moe/: the torch path now, the
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
With --ep-size a row's expert may live on another rank: its row still has its slots (M*k is the most rows one rank
can be given, when every token picks this rank's experts) and is skipped by every implementation.
The plan charges the total as its `moe_workspace` term; the runner allocates exactly these buffers before the profile
forward (so the measured activation peak does not count them again) and asserts allocated == planned. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Dict, Optional, Tuple

from sglang.srt.mem_plan.dtypes import canonical_dtype, dtype_bytes

# The implementation that runs the experts (the plan's spec carries it; the runtime's layers adopt it, so the plan
# and the runtime always agree): GPUs run the Triton kernel (layers/moe/triton_ops/); CPUs the sgl-kernel kernel
# (layers/moe/fused_moe_cpu.py) for bf16 experts whose dimensions it takes where its kernels load, else torch.
MOE_IMPL_BY_DEVICE = {"cpu": "torch", "cuda": "triton"}
CPU_KERNEL_DIM_MULTIPLE = 32  # K and N (sgl-kernel moe.h packs 16 x 32 pieces)
CPU_KERNEL_ALIGN_BYTES = 64  # every region of the CPU kernel's workspace starts on a cache line
# Row block of each implementation's sorted_ids padding (B above). The torch path groups rows without padding; the
# Triton kernel's largest row block (layers/moe/triton_ops/tiles.MOE_BLOCK_M, equal by test).
TORCH_SORT_BLOCK_M = 1
TRITON_SORT_BLOCK_M = 64
SORT_BLOCK_M = {"torch": TORCH_SORT_BLOCK_M, "triton": TRITON_SORT_BLOCK_M}
# Whether a CUDA graph can capture the implementation. The torch path reads the experts' row counts on the host, so a
# MoE model on it decodes without graphs (build.graph_batch_size); the Triton kernel reads them on the device.
CAPTURABLE = {"torch": False, "triton": True, "cpu": False}
SORT_INDEX_DTYPE = "int32"

Buffers = Dict[str, Tuple[Tuple[int, ...], str]]


def moe_impl_for(device_kind: str, act_dtype: str = "float32", hidden_size: int = 0, intermediate_size: int = 0,
                 cpu_kernels: bool = False) -> str:
    """The fused-experts implementation a start runs: 'triton' on a GPU; on a CPU 'cpu' (the sgl-kernel kernel) for
    bf16 experts with K and N multiples of CPU_KERNEL_DIM_MULTIPLE when cpu_kernels (its kernels load here), else
    'torch'."""
    impl = MOE_IMPL_BY_DEVICE.get(device_kind, "torch")
    if (impl == "torch" and cpu_kernels and canonical_dtype(act_dtype) == "bfloat16" and hidden_size
            and not hidden_size % CPU_KERNEL_DIM_MULTIPLE and not intermediate_size % CPU_KERNEL_DIM_MULTIPLE):
        return "cpu"
    return impl


def _aligned(nbytes: int) -> int:
    return -(-nbytes // CPU_KERNEL_ALIGN_BYTES) * CPU_KERNEL_ALIGN_BYTES


def cpu_kernel_workspace_bytes(num_tokens: int, top_k: int, num_experts: int, hidden_size: int,
                               intermediate_size: int) -> int:
    """Bytes of the CPU kernel's workspace for num_tokens tokens (sgl-kernel moe.h moe_workspace_bytes, the same
    formula, equal by test): expert_start and block_start int32 [E + 1] each, slot_token int32 and slot_weight fp32
    [M * k] each, silu(gate) * up bf16 [M * k, N], the fp32 sum of the experts' outputs [M, K]; 64-byte aligned."""
    slots = num_tokens * top_k
    return (2 * _aligned(4 * (num_experts + 1)) + 2 * _aligned(4 * slots) + _aligned(2 * slots * intermediate_size)
            + _aligned(4 * num_tokens * hidden_size))


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
    impl: str = "torch"  # the implementation these buffers are for (moe_impl_for)

    def __post_init__(self):
        for name in ("max_tokens", "top_k", "num_experts", "hidden_size", "intermediate_size", "block_m"):
            if getattr(self, name) <= 0:
                raise ValueError(f"MoEWorkspaceSpec.{name} must be > 0, got {getattr(self, name)}")
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
        """name -> (shape, canonical dtype), in allocation order. The CPU kernel lays out its own regions in one
        byte buffer (cpu_kernel_workspace_bytes); the torch path and the Triton kernel use the named buffers."""
        if self.impl == "cpu":
            return {"cpu_kernel": ((cpu_kernel_workspace_bytes(self.max_tokens, self.top_k, self.num_experts,
                                                               self.hidden_size, self.intermediate_size),), "uint8")}
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
        if self.impl == "cpu":
            return (f"{self.max_tokens:,} tokens x top-{self.top_k} of {self.num_experts} experts: the CPU kernel's "
                    f"routing, [{self.num_rows:,}, {self.intermediate_size}] bfloat16 and [{self.max_tokens:,}, "
                    f"{self.hidden_size}] fp32")
        return (f"{self.max_tokens:,} tokens x top-{self.top_k} of {self.num_experts} experts: [{self.num_rows:,}, "
                f"2x{self.intermediate_size} + {self.intermediate_size} + {self.hidden_size}] {self.act_dtype} + "
                f"{SORT_INDEX_DTYPE} sort buffers (block {self.block_m})")


def expert_shard_of_rank(num_experts: int, moe_intermediate_size: int, tp: int, ep: int = 1) -> Tuple[int, int]:
    """(experts, intermediate columns per expert) one rank holds: tp ranks in ep expert groups of tp / ep ranks
    (distributed/parallel_state.moe_parallel_layout) hold E / ep experts, each split over the group's ranks.
    ep = 1: every expert, moe_intermediate_size / tp columns; ep = tp: E / tp whole experts."""
    if ep < 1 or tp % ep or num_experts % ep or moe_intermediate_size % (tp // ep):
        raise ValueError(f"--tp-size {tp} / --ep-size {ep} cannot split {num_experts} experts of intermediate size "
                         f"{moe_intermediate_size} (configs/resolved.check_tp_sharding names the fix)")
    return num_experts // ep, moe_intermediate_size // (tp // ep)


def moe_workspace_spec(text, max_tokens: int, tp: int, act_dtype: str, device_kind: str,
                       cpu_kernels: bool = False, ep: int = 1) -> Optional[MoEWorkspaceSpec]:
    """The workspace of one rank of a model (model_shapes.TextShape) whose fused-experts calls take at most
    max_tokens tokens, for the implementation moe_impl_for picks; None for a dense model. The rank's experts and
    intermediate columns are expert_shard_of_rank's (--ep-size: E / ep experts, N / (tp / ep) columns)."""
    if not text.sparse_layers or not text.num_experts:
        return None
    experts, n = expert_shard_of_rank(text.num_experts, text.moe_intermediate_size, tp, ep)
    impl = moe_impl_for(device_kind, act_dtype, text.hidden_size, n, cpu_kernels)
    return MoEWorkspaceSpec(max_tokens, text.num_experts_per_tok, experts, text.hidden_size, n, act_dtype,
                            SORT_BLOCK_M.get(impl, TORCH_SORT_BLOCK_M), impl)


def moe_workspace_bytes(spec: Optional[MoEWorkspaceSpec]) -> int:
    return 0 if spec is None else spec.total_bytes
