"""Which attention backend a start uses: resolved once, by one function, for `sglang serve` and `sglang plan`.

    explicit --attention-backend NAME   wins; refused with the reason when the platform cannot run NAME
    CUDA                                flashinfer when installed, else triton
    ROCm                                aiter when installed, else triton
    CPU                                 torch_native
(upstream's rule.) The server asks whether the vendor library is importable here; `sglang plan --gpu X` plans a
server installed with that GPU's extra (`pip install "sglang[cuda]"` brings flashinfer, `"sglang[rocm]"` AITER), and
says so in the reason. Both pass through `resolve_attention_backend`, so the dry run and the start agree whenever
the libraries installed agree. Torch-free: `device_platform()` is the only function that reads torch, lazily.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Callable, Optional

from sglang.srt.mem_plan.backends import ATTENTION_BACKENDS

PLATFORMS = ("cpu", "cuda", "rocm")
# platform -> the backends tried in order when none is named (the last one always runs there)
PLATFORM_DEFAULTS = {"cuda": ("flashinfer", "triton"), "rocm": ("aiter", "triton"), "cpu": ("torch_native",)}
# An MLA model (DeepSeek V2/V3, Kimi-K2) on a GPU defaults to triton: its MLA kernels run with CUDA graphs on CUDA and
# ROCm, while flashinfer's MLA wrapper runs only without CUDA graphs and aiter's MLA kernels are not wired here
MLA_DEFAULT_REASON = ("an MLA model: triton's MLA kernels (flashinfer's MLA wrapper runs only without CUDA graphs, "
                      "aiter's MLA is not wired)")
# backend -> the platforms it runs on (triton on a CPU only under the Triton interpreter: tests)
BACKEND_PLATFORMS = {"torch_native": ("cpu", "cuda", "rocm"), "triton": ("cuda", "rocm", "cpu"),
                     "flashinfer": ("cuda",), "aiter": ("rocm",)}
# backend -> the module it imports (None: nothing beyond torch)
BACKEND_MODULES = {"torch_native": None, "triton": "triton", "flashinfer": "flashinfer", "aiter": "aiter"}
GPU_EXTRAS = {"cuda": "sglang[cuda]", "rocm": "sglang[rocm]"}
assert set(BACKEND_PLATFORMS) == set(BACKEND_MODULES) == set(ATTENTION_BACKENDS)


@dataclass(frozen=True)
class BackendChoice:
    name: str
    reason: str

    def to_dict(self) -> dict:
        return {"name": self.name, "reason": self.reason}


def module_installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def device_platform(device: str) -> str:
    """'cpu', 'cuda' or 'rocm' for a resolved device string ('cpu', 'cuda', 'cuda:1', 'meta' counts as cpu)."""
    if not str(device).startswith("cuda"):
        return "cpu"
    import torch

    return "rocm" if torch.version.hip else "cuda"


def platform_problem(name: str, platform: str) -> Optional[str]:
    """Why `name` cannot run on `platform`, or None."""
    if platform not in BACKEND_PLATFORMS[name]:
        runs_on = ", ".join(BACKEND_PLATFORMS[name])
        defaults = " (or ".join(PLATFORM_DEFAULTS[platform]) + ")" * (len(PLATFORM_DEFAULTS[platform]) - 1)
        return (f"--attention-backend {name} cannot run on {platform}: it runs on {runs_on}. Leave "
                f"--attention-backend unset for the {platform} default, {defaults}, or name one that runs there.")
    return None


def resolve_attention_backend(requested: Optional[str], platform: str,
                              installed: Callable[[str], bool] = module_installed,
                              installed_note: str = "", mla: bool = False) -> BackendChoice:
    """The backend a start on `platform` uses, and why. `installed(module)` says whether a vendor library is there
    (the server: importable here; `sglang plan`: assumed from the GPU extra, `installed_note` says so). mla: the
    model attends through MLA (a GPU default is then triton, MLA_DEFAULT_REASON)."""
    if platform not in PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}; one of {', '.join(PLATFORMS)}")
    if requested is not None:
        if requested not in BACKEND_MODULES:
            raise ValueError(f"Unknown attention backend {requested!r}; choose one of {', '.join(ATTENTION_BACKENDS)}.")
        problem = platform_problem(requested, platform)
        if problem:
            raise ValueError(problem)
        return BackendChoice(requested, f"--attention-backend {requested}")
    if mla and platform in GPU_EXTRAS:
        return BackendChoice("triton", f"the {platform} default for {MLA_DEFAULT_REASON}")
    candidates = PLATFORM_DEFAULTS[platform]
    skipped = []
    for name in candidates:
        module = BACKEND_MODULES[name]
        if module is None or installed(module) or name == candidates[-1]:
            why = f"the {platform} default" if not skipped else f"the {platform} fallback ({'; '.join(skipped)})"
            note = f", {installed_note}" if installed_note and module is not None else ""
            return BackendChoice(name, f"{why}{note}")
        skipped.append(f"{name}: the {module!r} package is not installed, `pip install "
                       f"\"{GPU_EXTRAS.get(platform, 'sglang')}\"` brings it")
    raise AssertionError("unreachable: the last candidate is always chosen")
