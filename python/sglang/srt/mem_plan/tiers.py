"""Upstream GPU-size tiers, reproduced for the defaults they pick and for comparison with our plan.

The tiers choose --chunked-prefill-size and --cuda-graph-max-bs from the card's memory.total (MiB, as
nvidia-smi reports it). The classic auto mem_fraction_static turns a formula reserve into a fraction; our
planner replaces it with a solved plan, but `sglang plan` shows it side by side ("upstream would pick ...").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

MIB_PER_GIB = 1024


@dataclass(frozen=True)
class Tier:
    below_mib: Optional[int]  # tier applies when gpu_mem_mib < below_mib; None = no upper bound
    chunked_prefill_size: int
    cuda_graph_max_bs_small_tp: int  # tp < 4
    cuda_graph_max_bs_large_tp: int  # tp >= 4


# (classic upstream tier table; the "current" layout differs only in the < 35 GiB row, see TIERS_CURRENT)
TIERS_CLASSIC = (
    Tier(20 * MIB_PER_GIB, 2048, 8, 8),
    Tier(35 * MIB_PER_GIB, 2048, 24, 80),
    Tier(60 * MIB_PER_GIB, 4096, 32, 160),
    Tier(90 * MIB_PER_GIB, 8192, 256, 512),
    Tier(160 * MIB_PER_GIB, 8192, 256, 512),
    Tier(None, 16384, 512, 512),
)
TIERS_CURRENT = TIERS_CLASSIC[:1] + (Tier(35 * MIB_PER_GIB, 4096, 48, 160),) + TIERS_CLASSIC[2:]
UNKNOWN_GPU_TIER = Tier(None, 4096, 160, 160)
LARGE_TP = 4


def tier_for(gpu_mem_mib: Optional[int], variant: str = "classic") -> Tier:
    if gpu_mem_mib is None:
        return UNKNOWN_GPU_TIER
    table = TIERS_CLASSIC if variant == "classic" else TIERS_CURRENT
    for tier in table:
        if tier.below_mib is None or gpu_mem_mib < tier.below_mib:
            return tier
    raise AssertionError("unreachable: the last tier has no bound")


def tier_defaults(gpu_mem_mib: Optional[int], tp_size: int = 1, variant: str = "classic") -> tuple[int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs) upstream picks for this card."""
    tier = tier_for(gpu_mem_mib, variant)
    graph_bs = tier.cuda_graph_max_bs_large_tp if tp_size >= LARGE_TP else tier.cuda_graph_max_bs_small_tp
    return tier.chunked_prefill_size, graph_bs


# Classic auto-y reserve (MiB): 512 + 1.5 * max(chunk, 2048) + 2 * cuda_graph_max_bs + 1024 * tp * pp / 8,
# floored at 10 GiB on cards above 60 GiB; EAGLE-style speculative decoding adds 2 GiB, STANDALONE 6 GiB.
RESERVE_BASE_MIB = 512
RESERVE_PER_CHUNK_TOKEN_MIB = 1.5
RESERVE_MIN_CHUNK_TOKENS = 2048
RESERVE_PER_GRAPH_BS_MIB = 2
RESERVE_PER_8_RANKS_MIB = 1024
RESERVE_FLOOR_MIB = 10 * MIB_PER_GIB
RESERVE_FLOOR_ABOVE_MIB = 60 * MIB_PER_GIB
RESERVE_SPEC_MIB = {None: 0, "eagle": 2 * MIB_PER_GIB, "standalone": 6 * MIB_PER_GIB}
UNKNOWN_GPU_MEM_FRACTION = 0.88
MEM_FRACTION_DECIMALS = 3
# Upstream multiplies y by 0.85 for AITER at context > 8192 (a stand-in for the workspace our plan charges).
AITER_DERATE = 0.85
AITER_DERATE_ABOVE_CONTEXT = 8192


def classic_reserved_mib(gpu_mem_mib: int, chunked_prefill_size: int, cuda_graph_max_bs: int,
                         tp_size: int = 1, pp_size: int = 1, speculative: Optional[str] = None) -> float:
    reserved = (RESERVE_BASE_MIB
                + max(chunked_prefill_size, RESERVE_MIN_CHUNK_TOKENS) * RESERVE_PER_CHUNK_TOKEN_MIB
                + cuda_graph_max_bs * RESERVE_PER_GRAPH_BS_MIB
                + tp_size * pp_size / 8 * RESERVE_PER_8_RANKS_MIB)
    if gpu_mem_mib > RESERVE_FLOOR_ABOVE_MIB:
        reserved = max(reserved, RESERVE_FLOOR_MIB)
    return reserved + RESERVE_SPEC_MIB[speculative]


def classic_auto_mem_fraction(gpu_mem_mib: Optional[int], tp_size: int = 1, pp_size: int = 1,
                              chunked_prefill_size: Optional[int] = None, cuda_graph_max_bs: Optional[int] = None,
                              speculative: Optional[str] = None) -> float:
    """Upstream's classic auto mem_fraction_static (tp/pp as given; no DP-attention, VLM or AITER factor)."""
    if gpu_mem_mib is None:
        return UNKNOWN_GPU_MEM_FRACTION
    tier_chunk, tier_graph_bs = tier_defaults(gpu_mem_mib, tp_size)
    chunk = tier_chunk if chunked_prefill_size is None else chunked_prefill_size
    graph_bs = tier_graph_bs if cuda_graph_max_bs is None else cuda_graph_max_bs
    reserved = classic_reserved_mib(gpu_mem_mib, chunk, graph_bs, tp_size, pp_size, speculative)
    return round((gpu_mem_mib - reserved) / gpu_mem_mib, MEM_FRACTION_DECIMALS)


def upstream_mem_fraction(gpu_mem_mib: Optional[int], attention_backend: Optional[str], context_len: int,
                          **kwargs) -> float:
    """Classic auto y with upstream's AITER derate applied (unrounded, as upstream multiplies after rounding)."""
    y = classic_auto_mem_fraction(gpu_mem_mib, **kwargs)
    if attention_backend == "aiter" and context_len > AITER_DERATE_ABOVE_CONTEXT:
        y *= AITER_DERATE
    return y
