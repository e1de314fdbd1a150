"""CPU kernels: the `sgl_kernel` package, or built on first use; which of them run follows the ISA level (cpu_isa.py).

`get_cpu_ops()` returns the compiled module where its bf16 kernels run (level avx512_bf16 or amx), else None;
`get_quant_ops()` returns it where the quantized GEMM runs (level avx2 and up); `get_kv_quant_ops()` where the
quantized KV cache's attention and write kernels run (level avx512_vnni and up); `get_fp32_ops()` where its fp32
kernels run (decode attention, rmsnorm, silu_and_mul, rotary_embedding_ on fp32 tensors: level avx2 and up). None means the kernels cannot be used
here (a lower level, no C++ compiler, `SGLANG_CPU_KERNELS=0`); callers then take the plain torch path, which computes
the same thing. The module's level is set to this process's (`SGLANG_CPU_ISA` forces a lower one) when it loads.
The sources are in the checkout's `sgl-kernel/csrc/cpu/`. Where they are found, in order:
1. the `sgl_kernel` package (`pip install --no-build-isolation ./sgl-kernel`, which scripts/install.sh runs), when it
   was built from sources with the checkout's digest;
2. otherwise a build on first use into torch's extension cache (`TORCH_EXTENSIONS_DIR`, by default
   `~/.cache/torch_extensions`) under a name that changes with the sources, so an edit rebuilds and an unchanged
   tree loads in well under a second.
`python -m sglang.jit_kernel.cpu_ops` loads them and prints what is in use. `SGLANG_CPU_AMX=0` switches the AMX
GEMM off (to run and measure the non-AMX path on an AMX machine; the same as SGLANG_CPU_ISA=avx512_bf16 there).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Optional, Tuple

from sglang.jit_kernel.cpu_isa import (BF16_LEVEL, KV_QUANT_LEVEL, QUANT_LEVEL, at_least, cpu_isa, cpu_isa_summary,
                                      level_rank, native_cpu_isa)

logger = logging.getLogger(__name__)

# python/sglang/jit_kernel/cpu_ops.py -> the checkout's root
CSRC_DIR = Path(__file__).resolve().parents[3] / "sgl-kernel" / "csrc" / "cpu"
ENV_SWITCH = "SGLANG_CPU_KERNELS"  # "0" turns the kernels off
AMX_ENV_SWITCH = "SGLANG_CPU_AMX"  # "0" keeps the kernels but never uses AMX tiles

_lock = threading.Lock()
_ops: Optional[ModuleType] = None
_tried = False
_reason = "not loaded yet"
_disabled_depth = 0  # > 0 inside cpu_kernels_disabled()
_bf16_ok = False  # the loaded module's bf16 kernels run at this level
_quant_ok = False  # its quantized GEMM runs at this level
_fp32_ok = False  # its fp32 kernels run at this level
_kv_quant_ok = False  # its quantized-KV attention / write kernels run at this level
_fp32_serving = False  # set_fp32_kernels: fp32 layers take them (else the torch reference path)
_amx: Optional[bool] = None
_threads: Optional[Tuple[int, int]] = None  # (threads, spin us) the runtime chose; None: torch's thread count


def cpu_kernels_expected() -> bool:
    """Whether this process should be running the bf16 kernels: its ISA level has AVX-512 BF16 and they are not
    switched off. (Tests assert that the kernels then really load, instead of silently testing the fallback.)"""
    return at_least(cpu_isa(), BF16_LEVEL) and os.environ.get(ENV_SWITCH, "1") != "0"


def kv_quant_kernels_expected() -> bool:
    """Whether this process should be running the quantized-KV kernels (extend_attention_quant, kv_quant_write):
    level avx512_vnni and up, not switched off."""
    return at_least(cpu_isa(), KV_QUANT_LEVEL) and os.environ.get(ENV_SWITCH, "1") != "0"


def quant_kernels_expected() -> bool:
    """Whether this process should be running the quantized GEMM (quant_linear): level avx2 and up, not switched off."""
    return at_least(cpu_isa(), QUANT_LEVEL) and os.environ.get(ENV_SWITCH, "1") != "0"


def source_digest() -> str:
    """sha256 over the sorted file names and contents of the kernel sources (sgl-kernel/setup.py records the same
    digest in the package it builds)."""
    h = hashlib.sha256()
    for path in sorted(CSRC_DIR.iterdir()):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def _ninja_on_path() -> None:
    """torch's extension builder runs `ninja` from PATH; the `ninja` package's binary may not be there (a --user
    install, an unactivated venv)."""
    try:
        import ninja
    except ImportError:
        return
    bin_dir = getattr(ninja, "BIN_DIR", None)
    if bin_dir and bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")


class _NoCudaNotice(logging.Filter):
    """torch.utils.cpp_extension warns at import that no CUDA runtime is found: expected for these CPU kernels."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "No CUDA runtime is found" not in record.getMessage()


def _build() -> ModuleType:
    logging.getLogger("torch.utils.cpp_extension").addFilter(_NoCudaNotice())
    from torch.utils.cpp_extension import load

    _ninja_on_path()
    name = f"sgl_cpu_kernels_{source_digest()}"
    try:
        from torch.utils.cpp_extension import _get_build_directory

        if not any(Path(_get_build_directory(name, False)).glob("*.so")):
            logger.info("Compiling the CPU kernels %s (once per machine, about 30 s) ...", name)
    except Exception:  # a private helper of torch: only used for the message
        pass
    start = time.perf_counter()
    module = load(
        name=name,
        sources=[str(CSRC_DIR / "bindings.cpp")],
        extra_include_paths=[str(CSRC_DIR)],
        extra_cflags=["-O3", "-fopenmp"],
        extra_ldflags=["-fopenmp"],
        verbose=False,
    )
    took = time.perf_counter() - start
    if took > 2:
        logger.info("Built the CPU kernels %s in %.0f s (cached for later runs).", name, took)
    return module


def _prebuilt() -> Optional[ModuleType]:
    """The `sgl_kernel` package's module when it was built from these sources; None (and why, logged) otherwise."""
    try:
        import sgl_kernel
    except ImportError:
        return None
    try:
        module, digest = sgl_kernel.load()
    except Exception as e:  # built for another torch, a broken install
        logger.info("sgl_kernel is installed but does not load (%s: %s); building the kernels instead.", type(e).__name__, e)
        return None
    if CSRC_DIR.is_dir() and digest != source_digest():
        logger.info("sgl_kernel was built from other sources (%s, checkout %s); building the checkout's.", digest, source_digest())
        return None
    return module


def _load() -> Optional[ModuleType]:
    """The compiled module at this process's level, loaded once (None below avx2, or when it cannot be built)."""
    global _ops, _tried, _reason, _bf16_ok, _quant_ok, _fp32_ok, _kv_quant_ok
    if _tried:
        return _ops
    with _lock:
        if _tried:
            return _ops
        if os.environ.get(ENV_SWITCH, "1") == "0":
            _reason = f"turned off by {ENV_SWITCH}=0"
        elif not quant_kernels_expected():
            _reason = f"no kernel for CPU level {cpu_isa_summary()}"
        else:
            try:
                module = _prebuilt()
                if module is None:
                    if not CSRC_DIR.is_dir():
                        raise FileNotFoundError(f"no sgl_kernel package and no kernel sources at {CSRC_DIR}")
                    module = _build()
                # the module's own check (what the compiler and OS allow) can be lower than the flags say
                level = min(cpu_isa(), module.cpu_isa_native(), key=level_rank)
                module.set_cpu_isa(level)
                _ops, _reason = module, "in use"
                _bf16_ok = at_least(level, BF16_LEVEL) and bool(module.cpu_supported())
                _quant_ok = bool(module.quant_supported())
                _fp32_ok = bool(module.f32_supported())
                _kv_quant_ok = at_least(level, KV_QUANT_LEVEL) and hasattr(module, "extend_attention_quant")
                _apply_threads()
            except Exception as e:  # no compiler, no ninja, a build error: the torch path still works
                _reason = f"build failed: {type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
                logger.warning("CPU kernels unavailable (%s); using the torch path.", _reason)
        _tried = True
        return _ops


def get_cpu_ops() -> Optional[ModuleType]:
    """The compiled kernels where the bf16 ones run (level avx512_bf16 / amx), else None (why: `cpu_ops_status()`)."""
    if _disabled_depth:
        return None
    ops = _load()
    return ops if _bf16_ok else None


def get_kv_quant_ops() -> Optional[ModuleType]:
    """The compiled kernels where the quantized KV cache's attention and write kernels run (extend_attention_quant,
    kv_quant_write: level avx512_vnni and up), else None."""
    if _disabled_depth:
        return None
    ops = _load()
    return ops if _kv_quant_ok else None


def get_quant_ops() -> Optional[ModuleType]:
    """The compiled kernels where the quantized GEMM runs (level avx2 and up), else None."""
    if _disabled_depth:
        return None
    ops = _load()
    return ops if _quant_ok else None


def set_fp32_kernels(on: bool) -> None:
    """Whether fp32 layers take the fp32 kernels (decode attention, RMSNorm, SiluAndMul, rotary). Off by default:
    fp32 then stays the torch reference path, bit for bit; a start turns it on where --dtype auto resolved to float32
    (a CPU level without bf16: configs/resolved.use_fp32_kernels, which `sglang plan` calls too)."""
    global _fp32_serving
    _fp32_serving = bool(on)


def get_fp32_ops() -> Optional[ModuleType]:
    """The compiled kernels where their fp32 forms run (level avx2 and up: 512-bit from avx512_vnni, 256-bit at avx2)
    and set_fp32_kernels(True) asked for them, else None."""
    if _disabled_depth or not _fp32_serving:
        return None
    ops = _load()
    return ops if _fp32_ok else None


def get_ops_for_dtype(dtype) -> Optional[ModuleType]:
    """The module whose elementwise / attention kernels take tensors of `dtype` here: bf16 -> get_cpu_ops(), fp32 ->
    get_fp32_ops(), any other dtype None (the layers' torch path)."""
    import torch

    if dtype == torch.bfloat16:
        return get_cpu_ops()
    return get_fp32_ops() if dtype == torch.float32 else None


def _apply_threads() -> None:
    if _ops is None:
        return
    if _threads is None:
        import torch

        _ops.set_num_threads(torch.get_num_threads())
    else:
        _ops.set_num_threads(_threads[0])
        _ops.set_spin_us(_threads[1])


def set_kernel_threads(num_threads: int, spin_us: int) -> None:
    """Size the kernels' thread pool (sgl-kernel/csrc/cpu/parallel.h) now if they are loaded, else when they load.
    Until this is called they take torch's thread count at load."""
    global _threads
    _threads = (num_threads, spin_us)
    _apply_threads()


@contextlib.contextmanager
def cpu_kernels_disabled():
    """Within this block every caller takes the torch path (for A/B comparisons in tests and benchmarks; objects
    that decide at construction, like the attention backend, must also be built inside it)."""
    global _disabled_depth
    _disabled_depth += 1
    try:
        yield
    finally:
        _disabled_depth -= 1


def amx_available() -> bool:
    """Whether the AMX GEMM (`amx_linear`) can run here: level amx, the kernels are loaded and Linux granted the tile
    state."""
    global _amx
    ops = get_cpu_ops()
    if ops is None or cpu_isa() != "amx" or os.environ.get(AMX_ENV_SWITCH, "1") == "0":
        return False
    if _amx is None:
        _amx = bool(ops.amx_supported())
    return _amx


def cpu_ops_status() -> str:
    """Why the kernels are (not) in use: 'in use', or the reason none loaded."""
    _load()
    if _ops is not None and not _bf16_ok and cpu_kernels_expected():
        return "the CPU check of the compiled bf16 kernels failed"
    return _reason


def cpu_kernels_summary() -> str:
    """One line for logs and /server_info: 'in use, with AMX', 'in use, without AMX' or 'in use for the quantized GEMM
    and the fp32 kernels, and the quantized KV cache's attention' (below avx512_bf16: without the fp32 kernels where
    fp32 stays the torch path, without the KV attention below avx512_vnni, '... only' with neither), then where the
    module came from and the level it runs at; or 'not used: <why>'."""
    ops = get_cpu_ops()
    quant = get_quant_ops()
    if ops is None and quant is None:
        return f"not used: {cpu_ops_status()}"
    module = ops if ops is not None else quant
    source = "sgl_kernel package" if module.__name__.startswith("sgl_kernel") else "built on first use"
    level = module.get_cpu_isa()  # what the compiled code dispatches on, as set at load
    where = f"({source}), CPU level {level}" + ("" if level == native_cpu_isa() else f" (native {native_cpu_isa()})")
    if ops is None:
        fp32 = " and the fp32 kernels" if _fp32_serving and _fp32_ok else ""
        kv = ", and the quantized KV cache's attention" if _kv_quant_ok else ""
        return f"in use for the quantized GEMM{fp32}{kv}{'' if fp32 or kv else ' only'} {where}"
    if amx_available():
        return f"in use, with AMX {where}"
    off = f", switched off by {AMX_ENV_SWITCH}=0" if os.environ.get(AMX_ENV_SWITCH, "1") == "0" else ""
    return f"in use, without AMX{off} {where}"


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    start = time.perf_counter()
    ops = get_cpu_ops()
    print(f"sglang CPU kernels: {cpu_kernels_summary()} ({time.perf_counter() - start:.1f} s)")
