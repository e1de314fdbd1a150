"""GPU presets for the dry run (`sglang plan --gpu ...`).

memory_total_mib is memory.total as nvidia-smi (NVIDIA) or torch/rocm (AMD) report it. pre_load_free_gib is a
typical free memory after the CUDA/HIP context and communication init, before weights load -- the `pre` of the
budget equation. Values marked "PR #18263" come from that PR's MI355X log; the others assume the ~1.05 GiB of
context + NCCL overhead seen on an H100 (79.65 GiB total -> 78.6 GiB free) unless stated.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.mem_plan.units import GiB, MiB


@dataclass(frozen=True)
class GpuPreset:
    key: str
    name: str
    vendor: str  # "nvidia" / "amd"
    memory_total_mib: int
    pre_load_free_gib: float

    @property
    def memory_total_bytes(self) -> int:
        return self.memory_total_mib * MiB

    @property
    def pre_load_free_bytes(self) -> int:
        return int(self.pre_load_free_gib * GiB)

    @property
    def platform(self) -> str:
        """The software platform a server on this GPU runs (layers/attention/backend_resolution.PLATFORMS)."""
        return "rocm" if self.vendor == "amd" else "cuda"


_CONTEXT_OVERHEAD_GIB = 1.05  # H100: 81559 MiB = 79.65 GiB total, 78.6 GiB free before load


def _preset(key: str, name: str, vendor: str, total_mib: int, pre_gib: float | None = None) -> GpuPreset:
    if pre_gib is None:
        pre_gib = round(total_mib / 1024 - _CONTEXT_OVERHEAD_GIB, 2)
    return GpuPreset(key, name, vendor, total_mib, pre_gib)


GPU_PRESETS: dict[str, GpuPreset] = {p.key: p for p in (
    _preset("h100-80gb", "NVIDIA H100 80GB HBM3", "nvidia", 81559, 78.6),
    _preset("h200", "NVIDIA H200 141GB", "nvidia", 143771),
    _preset("h20", "NVIDIA H20 96GB", "nvidia", 97871),
    _preset("a100-40gb", "NVIDIA A100 40GB", "nvidia", 40960),
    _preset("a100-80gb", "NVIDIA A100 80GB", "nvidia", 81920),
    _preset("l40s", "NVIDIA L40S 48GB", "nvidia", 46068),
    _preset("rtx-4090", "NVIDIA GeForce RTX 4090 24GB", "nvidia", 24564),
    _preset("b200", "NVIDIA B200 192GB", "nvidia", 183359),
    _preset("mi300x", "AMD Instinct MI300X 192GB", "amd", 196592, 191.0),
    _preset("mi325x", "AMD Instinct MI325X 256GB", "amd", 262128),  # nominal 256 GiB minus ~16 MiB
    _preset("mi355x", "AMD Instinct MI355X 288GB", "amd", 294896, 287.18),  # pre from PR #18263's log
)}

ALIASES = {"h100": "h100-80gb", "a100": "a100-80gb", "4090": "rtx-4090", "rtx4090": "rtx-4090",
           "h200-141gb": "h200", "h20-96gb": "h20"}


def get_gpu_preset(key: str) -> GpuPreset:
    k = key.lower()
    k = ALIASES.get(k, k)
    if k not in GPU_PRESETS:
        raise KeyError(f"unknown GPU preset {key!r}; known: {', '.join(GPU_PRESETS)}")
    return GPU_PRESETS[k]
