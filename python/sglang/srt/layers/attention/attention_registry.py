"""Attention backend registry: name -> class, imported only when chosen (CPU runs never import GPU kernels).

The backend names are mem_plan.backends.ATTENTION_BACKENDS (also the --attention-backend choices); backend `name`
lives in module `<name>_backend` and exposes its class as BACKEND_CLASS.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Optional

from sglang.srt.layers.attention.backend_resolution import PLATFORM_DEFAULTS
from sglang.srt.mem_plan.backends import ATTENTION_BACKENDS, BackendInputs

if TYPE_CHECKING:
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

_PKG = "sglang.srt.layers.attention"
# what a None name means here: the CPU default (tests, CPU tools). A start resolves its backend first
# (backend_resolution.resolve_attention_backend), so a GPU run never reaches this default.
DEFAULT_ATTENTION_BACKEND = PLATFORM_DEFAULTS["cpu"][-1]


def get_attention_backend_class(name: str) -> type:
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"Unknown attention backend {name!r}; choose one of {', '.join(sorted(ATTENTION_BACKENDS))}.")
    return importlib.import_module(f"{_PKG}.{name}_backend").BACKEND_CLASS


def check_attention_backend(name: str | None, device: str) -> None:
    """Raise ValueError at startup, before any weight is loaded, when backend `name` cannot run on `device` (wrong
    device, kernel library missing); the message names what to install or which backend to pick."""
    cls = get_attention_backend_class(name or DEFAULT_ATTENTION_BACKEND)
    startup_problem = getattr(cls, "startup_problem", None)  # backends that run everywhere have none
    problem = startup_problem(device) if startup_problem is not None else None
    if problem:
        raise ValueError(problem)


def create_attention_backend(
    name: str | None, *, model_config: Any, req_to_token_pool: Any, token_to_kv_pool: Any, device: str,
    inputs: Optional[BackendInputs] = None,
) -> "AttentionBackend":
    """inputs: the BackendInputs the plan charged (mem_plan/build.backend_inputs: tp, slots, graph batch, kv splits).
    Required for backends with persistent buffers; torch_native holds none and may go without."""
    name = name or DEFAULT_ATTENTION_BACKEND
    cls = get_attention_backend_class(name)
    if inputs is None and name != DEFAULT_ATTENTION_BACKEND:
        raise TypeError(f"create_attention_backend({name!r}) needs inputs=BackendInputs (the planned slot count, "
                        "graph batch size, tp and kv splits), so it allocates what the plan charged.")
    return cls(model_config=model_config, req_to_token_pool=req_to_token_pool, token_to_kv_pool=token_to_kv_pool,
               device=device, inputs=inputs)
