"""Shared shell of the GPU attention backends (AITER, FlashInfer, Triton).

Memory: every persistent buffer is declared once in sglang.srt.mem_plan.backends from the real BackendInputs (tp,
request slots, graph batch size, kv splits); AttentionBackend.__init__ allocates exactly that list and asserts it.
`allocate_buffers(declared, "meta")` runs the same allocation without a GPU (tests).

The kernel library is imported only inside `__init__`: importing a backend module, planning with it (`sglang plan`)
and running the CPU test suite never need it. `startup_problem(device)` says, before anything is loaded, why the
backend cannot run here (no such device, library not installed); the model runner raises it at startup.
Subclasses implement the kernel calls; the defaults below fail at the first forward with a message naming the
backend that works (torch_native).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Optional

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.mem_plan.backends import BackendInputs


class PlannedGpuAttnBackend(AttentionBackend):
    kernel_module: str = ""  # imported in __init__ only
    install_hint: str = ""  # how to get kernel_module, e.g. "pip install flashinfer-python"
    device_kind: str = "a CUDA or ROCm GPU"

    @classmethod
    def device_problem(cls, device: str) -> Optional[str]:
        """Why `device` cannot run this backend, or None."""
        if not str(device).startswith("cuda"):
            return f"it needs {cls.device_kind} and this process runs on {device}"
        return None

    @classmethod
    def startup_problem(cls, device: str) -> Optional[str]:
        """Everything that keeps this backend from running on `device` (None if nothing does)."""
        problems = [p for p in (cls.device_problem(device),) if p]
        if importlib.util.find_spec(cls.kernel_module) is None:
            problems.append(f"the {cls.kernel_module!r} package is not installed ({cls.install_hint})")
        if not problems:
            return None
        return (f"--attention-backend {cls.backend_name} cannot run here: {'; '.join(problems)}. "
                f"{cls.alternatives_hint()}")

    @classmethod
    def alternatives_hint(cls) -> str:
        return "Pick another backend: --attention-backend torch_native runs everywhere (CPU and GPU)."

    def __init__(self, *, model_config: Any, req_to_token_pool: Any, token_to_kv_pool: Any, device: str,
                 inputs: BackendInputs):
        try:
            self.kernels = importlib.import_module(self.kernel_module)
        except ImportError as e:  # keeps the type: callers (and tests) catch ImportError
            raise ImportError(f"--attention-backend {self.backend_name} needs the {self.kernel_module!r} package "
                              f"({self.install_hint}): {e}. {self.alternatives_hint()}") from e
        branch = getattr(req_to_token_pool, "branch_rows", 0)  # a table built without branch rows has none
        if inputs.num_seqs != req_to_token_pool.size + branch:  # every row a batch may index, branches included
            raise ValueError(f"{self.backend_name}: planned {inputs.num_reqs} request slots + {inputs.num_branch_rows} "
                             f"branch rows, the request table has {req_to_token_pool.size} + {branch}")
        super().__init__(model_config=model_config, req_to_token_pool=req_to_token_pool,
                         token_to_kv_pool=token_to_kv_pool, device=device, inputs=inputs)

    def _not_wired(self):
        return NotImplementedError(
            f"--attention-backend {self.backend_name}: the kernel path is not wired in this fork yet (its buffers are "
            "planned and allocated). Use --attention-backend torch_native."
        )

    def init_forward_metadata(self, forward_batch) -> None:
        raise self._not_wired()

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True):
        raise self._not_wired()

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True):
        raise self._not_wired()
