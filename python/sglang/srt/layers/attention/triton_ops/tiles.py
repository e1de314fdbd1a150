"""Tile sizes of the attention kernels: one set for GPUs, one for the CPU interpreter.

The kernels compute the same online softmax with either set; only how the work is cut into programs and loop steps
changes. Under TRITON_INTERPRET=1 every Triton op costs tens of microseconds of Python whatever its size, so the
interpreter set uses few, large tiles: one SmolLM2 layer of a 2048-token prefill took 1.3 s with it and 36 s with
the GPU set (measured on this 2-core CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import triton

from sglang.srt.layers.attention.triton_ops.jit_mode import interpreted

MIN_DOT_TILE = 16  # the smallest dimension tl.dot accepts on NVIDIA and AMD GPUs


@dataclass(frozen=True)
class AttentionTiles:
    decode_block_n: int  # KV tokens per decode inner step
    decode_min_split_tokens: int  # a decode request gets at most one KV split per this many tokens
    extend_rows: int  # query rows (new tokens x the query heads of one KV head) per extend program
    extend_block_n: int  # keys per extend inner step


GPU_TILES = AttentionTiles(decode_block_n=32, decode_min_split_tokens=32, extend_rows=64, extend_block_n=32)
INTERPRETER_TILES = AttentionTiles(decode_block_n=256, decode_min_split_tokens=256, extend_rows=512,
                                   extend_block_n=256)


def default_tiles() -> AttentionTiles:
    return INTERPRETER_TILES if interpreted() else GPU_TILES


def dot_tile(dim: int) -> int:
    """A head dimension padded to the power-of-two tile that holds it (masked loads cover the padding)."""
    return max(MIN_DOT_TILE, triton.next_power_of_2(dim))

