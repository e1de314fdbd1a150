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

Quantized experts (--quantization gguf / w8a8_int8 on a CPU: layers/moe/quant_experts.py) always run the CPU
kernel's entry (fused_moe_cpu.py, which dequantizes per call where the kernel does not serve them), so their spec is
impl 'cpu' with the experts' bit widths: the kernel's buffer then adds the int8 activations of moe_quant.h.
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
DENSE_EXPERT_BITS = 16  # a spec's w13_bits / w2_bits for bf16 / fp32 experts
QUANT_BLOCK = 32  # weights per quantized block; the kernel's int8 activations have one fp32 scale and sum per block

Buffers = Dict[str, Tuple[Tuple[int, ...], str]]


def moe_impl_for(device_kind: str, act_dtype: str = "float32", hidden_size: int = 0, intermediate_size: int = 0,
                 cpu_kernels: bool = False, quantized_experts: bool = False) -> str:
    """The fused-experts implementation a start runs: 'triton' on a GPU; on a CPU 'cpu' (the sgl-kernel kernel) for
    bf16 experts with K and N multiples of CPU_KERNEL_DIM_MULTIPLE when cpu_kernels (its kernels load here), and for
    quantized experts always (its entry is the only one that reads them), else 'torch'."""
    impl = MOE_IMPL_BY_DEVICE.get(device_kind, "torch")
    if impl == "torch" and quantized_experts:
        return "cpu"
    if (impl == "torch" and cpu_kernels and canonical_dtype(act_dtype) == "bfloat16" and hidden_size
            and not hidden_size % CPU_KERNEL_DIM_MULTIPLE and not intermediate_size % CPU_KERNEL_DIM_MULTIPLE):
        return "cpu"
    return impl


def _aligned(nbytes: int) -> int:
    return -(-nbytes // CPU_KERNEL_ALIGN_BYTES) * CPU_KERNEL_ALIGN_BYTES


def _quant_act_row_bytes(bits: int, blocks: int) -> int:
    """quant_gemm.h's quant_act_row_bytes: int8 per value, twice for 8-bit weights (the rounding residual's pass)."""
    return (2 if bits == 8 else 1) * blocks * QUANT_BLOCK


def cpu_kernel_workspace_bytes(num_tokens: int, top_k: int, num_experts: int, hidden_size: int,
                               intermediate_size: int, w13_bits: int = DENSE_EXPERT_BITS,
                               w2_bits: int = DENSE_EXPERT_BITS) -> int:
    """Bytes of the CPU kernel's workspace for num_tokens tokens (sgl-kernel moe.h moe_workspace_bytes, the same
    formula, equal by test): expert_start and block_start int32 [E + 1] each, slot_token int32 and slot_weight fp32
    [M * k] each, silu(gate) * up bf16 [M * k, N], the fp32 sum of the experts' outputs [M, K]; 64-byte aligned.
    Quantized experts (w13_bits, w2_bits 4 or 8; moe_quant.h moe_quant_workspace_bytes) add the int8 activations
    with an fp32 scale and sum per 32 values: the hidden rows [M, K] for gate/up, silu(gate) * up [M * k, N] for
    down."""
    slots = num_tokens * top_k
    nbytes = (2 * _aligned(4 * (num_experts + 1)) + 2 * _aligned(4 * slots) + _aligned(2 * slots * intermediate_size)
              + _aligned(4 * num_tokens * hidden_size))
    if (w13_bits, w2_bits) == (DENSE_EXPERT_BITS, DENSE_EXPERT_BITS):
        return nbytes
    if w13_bits not in (4, 8) or w2_bits not in (4, 8):
        raise ValueError(f"quantized experts have 4 or 8 bits, got w13 {w13_bits}, w2 {w2_bits}")
    nb13, nb2 = hidden_size // QUANT_BLOCK, intermediate_size // QUANT_BLOCK
    return (nbytes + _aligned(num_tokens * _quant_act_row_bytes(w13_bits, nb13)) + 2 * _aligned(4 * num_tokens * nb13)
            + _aligned(slots * _quant_act_row_bytes(w2_bits, nb2)) + 2 * _aligned(4 * slots * nb2))


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
    w13_bits: int = DENSE_EXPERT_BITS  # quantized experts (impl 'cpu'): bits of gate/up and of down, 4 or 8
    w2_bits: int = DENSE_EXPERT_BITS

    def __post_init__(self):
        for name in ("max_tokens", "top_k", "num_experts", "hidden_size", "intermediate_size", "block_m"):
            if getattr(self, name) <= 0:
                raise ValueError(f"MoEWorkspaceSpec.{name} must be > 0, got {getattr(self, name)}")
        object.__setattr__(self, "act_dtype", canonical_dtype(self.act_dtype))
        if self.quantized and self.impl != "cpu":
            raise ValueError(f"quantized experts ({self.w13_bits}/{self.w2_bits} bits) run the 'cpu' implementation, "
                             f"not {self.impl!r}")

    @property
    def quantized(self) -> bool:
        return (self.w13_bits, self.w2_bits) != (DENSE_EXPERT_BITS, DENSE_EXPERT_BITS)

    def serves(self, need: "MoEWorkspaceSpec") -> bool:
        """Whether a layer needing `need` can run in these buffers: the same spec, except that quantized experts of
        fewer bits fit a workspace sized for more (the plan sizes one workspace for a file's widest experts; the
        kernel takes any workspace of at least its bytes)."""
        same = dict(vars(self), w13_bits=need.w13_bits, w2_bits=need.w2_bits) == vars(need)
        return same and need.w13_bits <= self.w13_bits and need.w2_bits <= self.w2_bits

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
                                                               self.hidden_size, self.intermediate_size,
                                                               self.w13_bits, self.w2_bits),), "uint8")}
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
            quant = (f"; int8 activations of {self.w13_bits}/{self.w2_bits}-bit gate_up/down experts"
                     if self.quantized else "")
            return (f"{self.max_tokens:,} tokens x top-{self.top_k} of {self.num_experts} experts: the CPU kernel's "
                    f"routing, [{self.num_rows:,}, {self.intermediate_size}] bfloat16 and [{self.max_tokens:,}, "
                    f"{self.hidden_size}] fp32{quant}")
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
                       cpu_kernels: bool = False, ep: int = 1,
                       expert_bits: Tuple[int, int] = (DENSE_EXPERT_BITS, DENSE_EXPERT_BITS)
                       ) -> Optional[MoEWorkspaceSpec]:
    """The workspace of one rank of a model (model_shapes.TextShape) whose fused-experts calls take at most
    max_tokens tokens, for the implementation moe_impl_for picks; None for a dense model. The rank's experts and
    intermediate columns are expert_shard_of_rank's (--ep-size: E / ep experts, N / (tp / ep) columns).
    expert_bits: (gate/up, down) bits of quantized experts on a CPU (quantization_sizes.WeightFormat.
    routed_expert_bits); other devices take them as dense."""
    if not text.sparse_layers or not text.num_experts:
        return None
    experts, n = expert_shard_of_rank(text.num_experts, text.moe_intermediate_size, tp, ep)
    quantized = device_kind == "cpu" and tuple(expert_bits) != (DENSE_EXPERT_BITS, DENSE_EXPERT_BITS)
    impl = moe_impl_for(device_kind, act_dtype, text.hidden_size, n, cpu_kernels, quantized)
    bits = tuple(expert_bits) if quantized else (DENSE_EXPERT_BITS, DENSE_EXPERT_BITS)
    return MoEWorkspaceSpec(max_tokens, text.num_experts_per_tok, experts, text.hidden_size, n, act_dtype,
                            SORT_BLOCK_M.get(impl, TORCH_SORT_BLOCK_M), impl, *bits)


def moe_workspace_bytes(spec: Optional[MoEWorkspaceSpec]) -> int:
    return 0 if spec is None else spec.total_bytes
