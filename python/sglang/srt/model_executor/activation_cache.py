"""The CPU activation peak of one profile forward, reused across starts (mem_plan/measurement_cache.py).

activation_cache_key() names everything the measured peak of that forward depends on:
    the model        config.json's digest; name, size and mtime of every file of the model directory and of the
                     .gguf it was converted from (the packed-weights cache included)
    the forward      dtype, kv-cache dtype, resolved quantization, chunk size, page size, context length, attention
                     backend
    the code         digest of the sglang Python sources; the CPU kernels in use, their source digest and binary;
                     torch and Python versions
    the machine      CPU model and flags, torch's thread count, the environment variables that steer the kernels,
                     OpenMP or malloc (SGLANG_*, OMP_*, KMP_*, MKL_*, ONEDNN_*, DNNL_*, MALLOC_*, LD_PRELOAD)
Only a CPU start of one rank reuses it: with tp ranks the profile forward runs collectives, so every rank must run
it (a rank reading the cache would leave the others waiting), and a GPU's peak is cheap to measure.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from functools import lru_cache
from pathlib import Path

import torch

from sglang.srt.mem_plan.measurement_cache import CACHE_DIR_ENV, REMEASURE_ENV, Measurement, cached_measurement

CACHE_NAME = "cpu-activation-peak"
_ENV_PREFIXES = ("SGLANG_", "OMP_", "KMP_", "MKL_", "ONEDNN_", "DNNL_", "MALLOC_")
_ENV_IGNORED = (REMEASURE_ENV, CACHE_DIR_ENV, "SGLANG_CACHE_DIR")


def _file_identity(path: str) -> list:
    st = os.stat(path)
    return [os.path.realpath(path), st.st_size, st.st_mtime_ns]


def _sha256_file(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@lru_cache(maxsize=1)
def sglang_code_digest() -> str:
    """sha256 over the names and contents of the sglang package's Python files (~200 files, ~20 ms)."""
    root = Path(__file__).resolve().parents[2]  # .../sglang (model_executor -> srt -> sglang)
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _cpu_identity() -> dict:
    model, flags = "", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return {"model": model or platform.processor(), "flags": hashlib.sha256(flags.encode()).hexdigest()[:16],
            "machine": platform.machine()}


def _kernel_identity(runner) -> dict:
    """The compiled CPU kernels this start uses (bf16 kernels, or the quantized GEMMs): summary, sources, binary."""
    out = {"summary": runner.cpu_kernels or "", "quantization": runner.quantization}
    uses_kernels = (runner.cpu_kernels or "").startswith("in use") or runner.quantization not in (None, "none")
    if str(runner.device) != "cpu" or not uses_kernels:
        return out
    from sglang.jit_kernel.cpu_ops import get_cpu_ops, source_digest

    ops = get_cpu_ops()  # already loaded by this start (model_runner.py / the quantized layers)
    if ops is not None:
        out["binary"] = _file_identity(ops.__file__) if getattr(ops, "__file__", None) else ops.__name__
        try:
            out["source_digest"] = source_digest()
        except OSError:  # an installed package without the checkout's sources: the binary identifies them
            out["source_digest"] = ""
    return out


def _model_identity(runner) -> dict:
    files = sorted(f for f in os.listdir(runner.model_path) if os.path.isfile(os.path.join(runner.model_path, f)))
    return {
        "config_sha256": _sha256_file(os.path.join(runner.model_path, "config.json")),
        "files": {f: _file_identity(os.path.join(runner.model_path, f))[1:] for f in files},
        "gguf": _file_identity(runner.gguf_path) if runner.gguf_path else None,
    }


def activation_cache_key(runner, chunk: int) -> dict:
    """Everything the profile forward's peak at `chunk` tokens depends on, as plain JSON values."""
    sa, mc = runner.server_args, runner.model_config
    return {
        "model": _model_identity(runner),
        "forward": {"dtype": mc.dtype_name, "kv_cache_dtype": mc.kv_cache_dtype_name,
                    "quantization": runner.quantization, "chunk_tokens": chunk, "page_size": sa.page_size,
                    "context_len": runner.context_len, "attention_backend": sa.attention_backend,
                    "kv_splits": sa.triton_attention_num_kv_splits, "device": str(runner.device),
                    "tp_size": runner.tp_size},
        "code": {"sglang": sglang_code_digest(), "kernels": _kernel_identity(runner), "torch": torch.__version__,
                 "python": sys.version.split()[0]},
        "machine": {"cpu": _cpu_identity(), "threads": torch.get_num_threads(),
                    "env": {k: v for k, v in sorted(os.environ.items())
                            if (k.startswith(_ENV_PREFIXES) or k == "LD_PRELOAD") and k not in _ENV_IGNORED}},
    }


def activation_cache_applies(runner) -> bool:
    return str(runner.device) == "cpu" and runner.tp_size == 1


def cpu_activation_peak(runner, chunk: int) -> Measurement:
    """The profile forward's peak at `chunk` tokens: stored by an earlier start with the same key, else measured
    (runner.profile_activation_bytes) and stored. Only where activation_cache_applies()."""
    from sglang.srt.configs.cache_dirs import startup_cache_dir

    key = activation_cache_key(runner, chunk)
    return cached_measurement(startup_cache_dir(runner.server_args), CACHE_NAME, key,
                              lambda: runner.profile_activation_bytes(chunk))
