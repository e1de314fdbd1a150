"""Token-to-expert alignment: the batch's T = M * topk assignments (assignment i = m * topk + j is token m's j-th
expert, topk_ids.flatten()[i]) grouped by expert into BLOCK_M-row blocks, so each GEMM block multiplies rows of one
expert only.

Layout written (P, B: workspace.py's bounds; Pad_e = ceil(count_e / BLOCK_M) * BLOCK_M, start_e = sum of Pad_e' for
e' < e):
    sorted_ids[start_e + r] = the r-th assignment of expert e (ascending), r in [0, count_e)
    sorted_ids[start_e + r] = T (the sentinel: no row), r in [count_e, Pad_e)
    expert_ids[start_e / BLOCK_M + b] = e, b in [0, Pad_e / BLOCK_M)
    expert_offsets[e] = start_e, e in [0, E]: expert_offsets[E] = sum_e Pad_e, the padded total (<= P, a multiple
    of BLOCK_M; the GEMM's num_tokens_post_padded)
Experts without assignments get no block. Entries past the padded total (slots) / total / BLOCK_M (blocks) are left
as they were: the GEMM kernel reads the total on the device and skips the rest, so the host never waits for it and
the buffers are sized once (no data-dependent shape).

Three launches: grid (E,) program e counts its assignments (a loop over the ids, CHUNK at a time) into
expert_offsets[e + 1]; grid (E,) program e reads every count, computes start_e and writes its own ids (rank within
the expert = a running count plus a cumsum of the hits within the chunk), padding and block experts; grid (1,) turns
the counts into the padded starts (only after every program of the second launch has read them). Each program of
the first two reads all T ids; E * T int loads stay far below the cost of the expert GEMMs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang.srt.layers.attention.triton_ops.jit_mode import lazy_jit
from sglang.srt.layers.moe.triton_ops.tiles import MoeTiles, default_tiles
from sglang.srt.layers.moe.triton_ops.workspace import max_blocks, max_sorted_slots


@lazy_jit
def _count_kernel(Topk_ids, Offsets, num_assignments, CHUNK: tl.constexpr):
    e = tl.program_id(0)
    hits = tl.zeros([CHUNK], tl.int32)
    for i0 in range(0, num_assignments, CHUNK):
        offs = i0 + tl.arange(0, CHUNK)
        ids = tl.load(Topk_ids + offs, mask=offs < num_assignments, other=-1)
        hits += (ids == e).to(tl.int32)
    tl.store(Offsets + 1 + e, tl.sum(hits, 0))


@lazy_jit
def _scatter_kernel(Topk_ids, Offsets, Sorted_ids, Expert_ids, num_assignments,
                    NUM_EXPERTS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr):
    e = tl.program_id(0)
    experts = tl.arange(0, BLOCK_E)
    counts = tl.load(Offsets + 1 + experts, mask=experts < NUM_EXPERTS, other=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    start = tl.sum(tl.where(experts < e, padded, 0), 0)
    count = tl.sum(tl.where(experts == e, counts, 0), 0)
    end = start + tl.sum(tl.where(experts == e, padded, 0), 0)

    next_slot = start  # where expert e's next assignment goes
    for i0 in range(0, num_assignments, CHUNK):
        offs = i0 + tl.arange(0, CHUNK)
        ids = tl.load(Topk_ids + offs, mask=offs < num_assignments, other=-1)
        hit = (ids == e).to(tl.int32)
        rank = tl.cumsum(hit, 0) - 1  # among this chunk's hits, in assignment order
        tl.store(Sorted_ids + next_slot + rank, offs, mask=hit == 1)
        next_slot += tl.sum(hit, 0)

    pad = start + count + tl.arange(0, BLOCK_M)  # the < BLOCK_M slots [start + count, end)
    tl.store(Sorted_ids + pad, tl.zeros([BLOCK_M], tl.int32) + num_assignments, mask=pad < end)
    num_blocks = (end - start) // BLOCK_M
    for b0 in range(0, num_blocks, CHUNK):
        blocks = b0 + tl.arange(0, CHUNK)
        tl.store(Expert_ids + start // BLOCK_M + blocks, tl.zeros([CHUNK], tl.int32) + e, mask=blocks < num_blocks)


@lazy_jit
def _offsets_kernel(Offsets, NUM_EXPERTS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr):
    experts = tl.arange(0, BLOCK_E)
    counts = tl.load(Offsets + 1 + experts, mask=experts < NUM_EXPERTS, other=0)
    ends = tl.cumsum((counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M, 0)  # ends[e] = start_{e + 1}
    tl.store(Offsets + 1 + experts, ends, mask=experts < NUM_EXPERTS)
    tl.store(Offsets, 0)


def align_block_size(topk_ids: torch.Tensor, num_experts: int, block_m: int, sorted_ids: torch.Tensor,
                     expert_ids: torch.Tensor, expert_offsets: torch.Tensor, tiles: MoeTiles | None = None) -> None:
    """Fills the alignment buffers (module docstring) from topk_ids [M, topk] (int32 or int64, values in [0, E)).

    sorted_ids int32 [>= P], expert_ids int32 [>= B], expert_offsets int32 [E + 1], with
    P, B = workspace.max_sorted_slots / max_blocks(M * topk, E, block_m); block_m a power of two."""
    ids = topk_ids.reshape(-1)
    t = ids.numel()
    assert sorted_ids.numel() >= max_sorted_slots(t, num_experts, block_m), "sorted_ids too small"
    assert expert_ids.numel() >= max_blocks(t, num_experts, block_m), "expert_ids too small"
    assert expert_offsets.numel() == num_experts + 1, (expert_offsets.shape, num_experts)
    if t == 0:
        expert_offsets.zero_()
        return
    chunk = (tiles or default_tiles()).align_chunk
    block_e = triton.next_power_of_2(num_experts)
    _count_kernel[(num_experts,)](ids, expert_offsets, t, CHUNK=chunk)
    _scatter_kernel[(num_experts,)](ids, expert_offsets, sorted_ids, expert_ids, t, NUM_EXPERTS=num_experts,
                                    BLOCK_E=block_e, BLOCK_M=block_m, CHUNK=chunk)
    _offsets_kernel[(1,)](expert_offsets, NUM_EXPERTS=num_experts, BLOCK_E=block_e, BLOCK_M=block_m)
