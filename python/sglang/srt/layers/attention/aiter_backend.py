"""AiterAttnBackend: the AITER attention backend (ROCm).

Memory contract and lifecycle: see planned_gpu_backend.py. AITER's paged-attention decode keeps fp32 partial outputs
per request slot and 256-token partition: H_q * ceil(context_len / 256) * (4 * head_dim + 8) bytes per slot (none for
MLA), which is why the planner solves the KV pool and the slot count together instead of derating
mem_fraction_static.
"""

from __future__ import annotations

from sglang.srt.layers.attention.planned_gpu_backend import PlannedGpuAttnBackend, make_declarations

BACKEND_NAME = "aiter"
declare_workspace, declared_buffers = make_declarations(BACKEND_NAME)


class AiterAttnBackend(PlannedGpuAttnBackend):
    backend_name = BACKEND_NAME
    kernel_module = "aiter"
