"""Tile sizes of the fused-MoE kernels: one set for GPUs, one for the CPU interpreter.

Either set computes the same sums; only the cut into programs and loop steps changes. Under TRITON_INTERPRET=1 every
Triton op costs tens of microseconds of Python whatever its size, so the interpreter set uses few, large tiles (a
64-row block per expert, whole K/N dimensions of test-sized weights in one step).

MOE_BLOCK_M is the largest rows-per-block any set uses: the workspace (workspace.py) sizes the alignment buffers
for it, and every smaller BLOCK_M fits the same buffers (their bound grows with BLOCK_M).
"""

from __future__ import annotations

from dataclasses import dataclass

import triton

from sglang.srt.layers.attention.triton_ops.jit_mode import interpreted
from sglang.srt.layers.attention.triton_ops.tiles import MIN_DOT_TILE

MOE_BLOCK_M = 64


@dataclass(frozen=True)
class MoeTiles:
    min_block_m: int  # rows (expert assignments) per GEMM block: at least this, at most MOE_BLOCK_M
    block_n: int  # output columns per GEMM program
    block_k: int  # reduction step of the GEMM loop
    align_chunk: int  # assignments the alignment kernels read per loop step
    act_rows: int  # silu-and-mul tile: rows x columns per program
    act_cols: int

    def block_m(self, num_assignments: int, num_experts: int) -> int:
        """Rows per block for a batch of num_assignments = M * topk over num_experts: about the mean rows an expert
        gets, as a power of two in [min_block_m, MOE_BLOCK_M]. Decode (few rows per expert) gets small blocks, so
        little of a block is padding; prefill gets large ones, so each expert's weight tile is reused over more rows.
        A function of host integers only: the same batch size always gets the same grid (CUDA graphs)."""
        mean_rows = -(-num_assignments // max(1, num_experts))
        return min(MOE_BLOCK_M, max(self.min_block_m, triton.next_power_of_2(mean_rows)))


GPU_TILES = MoeTiles(min_block_m=MIN_DOT_TILE, block_n=64, block_k=64, align_chunk=1024, act_rows=4, act_cols=512)
INTERPRETER_TILES = MoeTiles(min_block_m=MOE_BLOCK_M, block_n=256, block_k=256, align_chunk=4096, act_rows=256,
                             act_cols=1024)


def default_tiles() -> MoeTiles:
    return INTERPRETER_TILES if interpreted() else GPU_TILES
