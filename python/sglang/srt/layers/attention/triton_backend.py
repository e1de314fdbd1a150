"""TritonAttnBackend: the Triton attention backend (CUDA/ROCm).

Memory contract and lifecycle: see planned_gpu_backend.py. Split-KV decode keeps fp32 logits
[B, H_q, num_kv_splits, v_head_dim] and log-sum-exp [B, H_q, num_kv_splits] for eager decode (B = request slots) and
for CUDA graphs (B = cuda_graph_max_bs), plus graph kv-index buffers of cuda_graph_max_bs * context_len.
"""

from __future__ import annotations

from sglang.srt.layers.attention.planned_gpu_backend import PlannedGpuAttnBackend, make_declarations

BACKEND_NAME = "triton"
declare_workspace, declared_buffers = make_declarations(BACKEND_NAME)


class TritonAttnBackend(PlannedGpuAttnBackend):
    backend_name = BACKEND_NAME
    kernel_module = "triton"
