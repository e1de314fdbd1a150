"""The x86 instruction-set level the CPU kernels run at: resolved once per process from /proc/cpuinfo.

Levels, lowest first (each implies the ones below it):
    scalar       no AVX2: no kernel; the plain torch path (fp32)
    avx2         AVX2 + FMA + F16C (Haswell and later, AMD Zen 1-3): quantized GEMM with int8 activations
                 (vpmaddubsw / vpmaddwd); activations fp32
    avx512_vnni  AVX-512 F/BW/VL/DQ + VNNI (Cascade Lake, Ice Lake): the quantized GEMM on vpdpbusd, the quantized
                 KV cache's attention and write kernels; activations fp32
    avx512_bf16  + AVX-512 BF16 (Cooper Lake, AMD Zen 4/5): every kernel (bf16 GEMV/GEMM, decode attention, norms,
                 rope, fused MoE); activations bf16
    amx          + AMX tiles (Sapphire Rapids and later): the AMX bf16 GEMM too
The flags Linux prints in /proc/cpuinfo are those the CPU has and the kernel enabled (AVX-512 is hidden when the OS
does not save its registers); AMX additionally needs the per-process tile permission, which the kernels request
(cpu_ops.amx_available).

`SGLANG_CPU_ISA=<level>` forces a lower level on any machine (to run and measure the paths of other CPUs); a level
above the native one is refused. `--dtype auto` follows the level (mem_plan/dtypes.py): bf16 only where the CPU has
bf16 dot products, fp32 elsewhere (torch emulates bf16 GEMMs there, several times slower).
Torch-free.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import FrozenSet, Optional

ISA_ENV = "SGLANG_CPU_ISA"
LEVELS = ("scalar", "avx2", "avx512_vnni", "avx512_bf16", "amx")
# the /proc/cpuinfo flags each level needs on top of the level below it
LEVEL_FLAGS = {
    "scalar": (),
    "avx2": ("avx2", "fma", "f16c"),
    "avx512_vnni": ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"),
    "avx512_bf16": ("avx512_bf16",),
    "amx": ("amx_bf16", "amx_tile", "amx_int8"),
}
BF16_LEVEL = "avx512_bf16"  # the lowest level with bf16 dot products (and the bf16 kernels)
QUANT_LEVEL = "avx2"  # the lowest level with a quantized GEMM kernel
KV_QUANT_LEVEL = "avx512_vnni"  # the lowest level with the quantized-KV kernels (AVX-512 F/BW/VL/DQ, no BF16)


def read_cpu_flags(cpuinfo_path: str = "/proc/cpuinfo") -> FrozenSet[str]:
    """The first CPU's flags ('flags' line); empty where the file cannot be read (not Linux, not x86)."""
    try:
        text = Path(cpuinfo_path).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def native_level(flags: FrozenSet[str]) -> str:
    """The highest level whose flags (and those of every level below it) are all present."""
    best = LEVELS[0]
    for level in LEVELS[1:]:
        if not all(f in flags for f in LEVEL_FLAGS[level]):
            break
        best = level
    return best


def level_rank(level: str) -> int:
    if level not in LEVELS:
        raise ValueError(f"unknown CPU ISA level {level!r}; levels: {', '.join(LEVELS)}")
    return LEVELS.index(level)


def at_least(level: str, floor: str) -> bool:
    return level_rank(level) >= level_rank(floor)


def resolve_level(requested: Optional[str], flags: FrozenSet[str]) -> str:
    """`requested` (SGLANG_CPU_ISA's value; None / '' / 'auto': native) checked against the CPU: ValueError naming the
    native level and the missing flags when it asks for more than the CPU has."""
    native = native_level(flags)
    if requested in (None, "", "auto"):
        return native
    name = requested.strip().lower()
    if name not in LEVELS:
        raise ValueError(f"{ISA_ENV}={requested!r} is not a level; choose one of {', '.join(LEVELS)} (or auto). "
                         f"This CPU's level is {native}.")
    if level_rank(name) > level_rank(native):
        missing = [f for lv in LEVELS[1:level_rank(name) + 1] for f in LEVEL_FLAGS[lv] if f not in flags]
        raise ValueError(f"{ISA_ENV}={name}: this CPU's level is {native} (it lacks {', '.join(missing)}); "
                         f"{ISA_ENV} can only force a lower level.")
    return name


@functools.lru_cache(maxsize=1)
def cpu_isa() -> str:
    """This process's level: SGLANG_CPU_ISA or the native one (read once)."""
    return resolve_level(os.environ.get(ISA_ENV), read_cpu_flags())


@functools.lru_cache(maxsize=1)
def native_cpu_isa() -> str:
    return native_level(read_cpu_flags())


def cpu_isa_summary() -> str:
    """One line for logs and /server_info: 'avx512_bf16 (native)' or 'avx2 (forced by SGLANG_CPU_ISA; native amx)'."""
    level, native = cpu_isa(), native_cpu_isa()
    return f"{level} (native)" if level == native else f"{level} (forced by {ISA_ENV}; native {native})"


def bf16_native() -> bool:
    """Whether bf16 activations run on hardware dot products at this process's level."""
    return at_least(cpu_isa(), BF16_LEVEL)
