"""Which mode the kernels run in: compiled for the GPU, or the CPU interpreter (TRITON_INTERPRET=1); and the one
check of the installed triton's version, which every kernel module passes through at import (it imports this first).

MIN_TRITON_VERSION is the oldest triton these kernels run on: `triton.knobs` (where the interpreter switch is read
at each launch) arrived in 3.4. Under the CPU interpreter they need MIN_TRITON_INTERPRETER_VERSION: before 3.7 the
interpreter makes a loop bound a Python int by int() of a one-element array, which NumPy 2.4 refuses (every kernel
here loops over KV or K blocks; seen with triton 3.4 and 3.5 and the suite's NumPy 2.4). python/pyproject.toml's
cuda extra requires the first, its cpu extra (the interpreter's) the second; the rocm extra cannot name triton
(pytorch-triton-rocm provides the module under another name), so there this check is the guard.
"""

from __future__ import annotations

import functools
import re
import types
from typing import Optional, Tuple

import triton

MIN_TRITON_VERSION: Tuple[int, int] = (3, 4)
MIN_TRITON_TEXT = ".".join(map(str, MIN_TRITON_VERSION))
MIN_TRITON_INTERPRETER_VERSION: Tuple[int, int] = (3, 7)
MIN_TRITON_INTERPRETER_TEXT = ".".join(map(str, MIN_TRITON_INTERPRETER_VERSION))


def _at_least(version: str, minimum: Tuple[int, int]) -> bool:
    """Local and pre-release tails (3.4.0+git1234, 3.5.0rc1) count as their release."""
    m = re.match(r"(\d+)\.(\d+)", str(version))
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= minimum


def triton_interpreter_problem(version: str) -> Optional[str]:
    """Why a triton of this `__version__` cannot run the kernels under TRITON_INTERPRET=1 (module docstring), or
    None."""
    if _at_least(version, MIN_TRITON_INTERPRETER_VERSION):
        return None
    return (f"triton {version} is installed, and the project's Triton kernels under TRITON_INTERPRET=1 (the CPU "
            f"interpreter) need triton >= {MIN_TRITON_INTERPRETER_TEXT} (older interpreters fail on NumPy >= 2.4): "
            f"pip install \"triton>={MIN_TRITON_INTERPRETER_TEXT}\".")


def triton_version_problem(version: str) -> Optional[str]:
    """Why a triton of this `__version__` cannot run the project's kernels (naming the version found and the one
    needed, and what to install), or None."""
    if _at_least(version, MIN_TRITON_VERSION):
        return None
    return (f"triton {version} is installed, and the project's Triton kernels (--attention-backend triton, the "
            f"fused MoE experts on a GPU) need triton >= {MIN_TRITON_TEXT} (triton.knobs). Install one with its "
            f"torch: on CUDA torch >= 2.8 (its wheel brings triton >= {MIN_TRITON_TEXT}), on ROCm an image whose "
            f"pytorch-triton-rocm is >= {MIN_TRITON_TEXT}; or, for a dense model, use --attention-backend "
            "torch_native.")


_VERSION = getattr(triton, "__version__", "(no __version__)")
_PROBLEM = triton_version_problem(_VERSION)
if _PROBLEM is not None:
    raise ImportError(_PROBLEM)
_INTERPRETER_PROBLEM = triton_interpreter_problem(_VERSION)

from triton import knobs  # noqa: E402 (after the version check: an older triton has none)


def interpreted() -> bool:
    """Whether launches run in the CPU interpreter; ImportError naming the versions when they would, on a triton
    whose interpreter cannot run the kernels (asked at every launch and by the backend's startup check)."""
    on = bool(knobs.runtime.interpret)
    if on and _INTERPRETER_PROBLEM is not None:
        raise ImportError(_INTERPRETER_PROBLEM)
    return on


class lazy_jit:  # noqa: N801 (used as a decorator, like triton.jit)
    """`triton.jit`, applied at the first launch in each mode (GPU compile or CPU interpreter) rather than at import.

    triton.jit fixes the mode when it runs; deferring it means importing these kernels never fixes the mode for the
    process (a test suite may import them before or after setting TRITON_INTERPRET). Launch as `kernel[grid](...)`.
    """

    def __init__(self, fn):
        self.fn = fn
        self._by_mode = {}

    def __getitem__(self, grid):
        mode = interpreted()
        kernel = self._by_mode.get(mode)
        if kernel is None:
            kernel = self._by_mode[mode] = triton.jit(_bind_helpers(self.fn, mode))
        return kernel[grid]


class lazy_jit_helper:  # noqa: N801
    """A device function (`@triton.jit` without a grid) called from `lazy_jit` kernels, jitted per mode as well.

    The kernel sees it by its module-level name: at the kernel's first launch in a mode, `lazy_jit` jits a copy of
    the kernel whose globals map every `lazy_jit_helper` to the helper jitted for that mode.
    """

    def __init__(self, fn):
        self.fn = fn
        self._by_mode = {}

    def for_mode(self, mode: bool):
        helper = self._by_mode.get(mode)
        if helper is None:
            helper = self._by_mode[mode] = triton.jit(_bind_helpers(self.fn, mode))  # helpers may call helpers
        return helper

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self.fn.__name__} is a Triton device function: call it from a lazy_jit kernel")


def _bind_helpers(fn, mode: bool):
    """fn itself when it calls no lazy_jit_helper, else a copy whose globals hold the helpers jitted for `mode`."""
    helpers = {name: fn.__globals__[name].for_mode(mode) for name in fn.__code__.co_names
               if isinstance(fn.__globals__.get(name), lazy_jit_helper)}  # the helpers fn names
    if not helpers:
        return fn
    bound = types.FunctionType(fn.__code__, {**fn.__globals__, **helpers}, fn.__name__, fn.__defaults__,
                               fn.__closure__)
    bound.__kwdefaults__ = fn.__kwdefaults__
    return functools.update_wrapper(bound, fn, updated=())
