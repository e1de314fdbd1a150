"""FlashInferAttnBackend: the FlashInfer attention backend (CUDA).

Memory contract and lifecycle: see planned_gpu_backend.py. FlashInfer shares one uint8 workspace (384 MiB; 512 MiB for
Qwen2/Qwen3/MiMo) and keeps CUDA-graph kv-index buffers of cuda_graph_max_bs * context_len int32 per wrapper.
"""

from __future__ import annotations

from sglang.srt.layers.attention.planned_gpu_backend import PlannedGpuAttnBackend, make_declarations

BACKEND_NAME = "flashinfer"
declare_workspace, declared_buffers = make_declarations(BACKEND_NAME)


class FlashInferAttnBackend(PlannedGpuAttnBackend):
    backend_name = BACKEND_NAME
    kernel_module = "flashinfer"
