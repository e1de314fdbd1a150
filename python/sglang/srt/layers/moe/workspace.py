"""MoEWorkspace: the fused-experts buffers of one rank (mem_plan/moe_sizes.py), allocated once on the device.

The model runner allocates one from the plan's spec before its profile forward and hands it to every FusedMoE layer
(moe_layer.attach_moe_workspace); its bytes are the plan's moe_workspace term exactly (check_allocation). An
implementation called without one (a model driven outside the runner) builds one of its call's size.
"""

from __future__ import annotations

import torch

from sglang.srt.mem_plan.dtypes import torch_dtype
from sglang.srt.mem_plan.moe_sizes import MoEWorkspaceSpec


class MoEWorkspace:
    """The buffers of `spec` by name (intermediate1..3, sorted_ids, expert_ids, expert_offsets: moe_sizes.py).

    Zero-filled, not just reserved: on a CPU the pages are then resident before the profile forward measures its
    peak RSS, so the activation peak does not count the workspace a second time."""

    def __init__(self, spec: MoEWorkspaceSpec, device):
        self.spec = spec
        self.buffers = {name: torch.zeros(shape, dtype=torch_dtype(dtype), device=device)
                        for name, (shape, dtype) in spec.buffers().items()}
        for name, tensor in self.buffers.items():  # intermediate1..3 and the sort buffers, or the CPU kernel's bytes
            setattr(self, name, tensor)

    @property
    def max_tokens(self) -> int:
        return self.spec.max_tokens

    def allocated_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.buffers.values())

    def check_fits(self, num_tokens: int, top_k: int, num_experts: int, hidden_size: int, intermediate_size: int,
                   dtype: torch.dtype) -> None:
        """ValueError unless a call of this geometry fits (the caller splits longer inputs into max_tokens rows)."""
        s = self.spec
        got = (top_k, num_experts, hidden_size, intermediate_size, dtype)
        want = (s.top_k, s.num_experts, s.hidden_size, s.intermediate_size, torch_dtype(s.act_dtype))
        if num_tokens > s.max_tokens or got != want:
            raise ValueError(f"MoE workspace for {s.max_tokens} tokens of (k, E, K, N, dtype) = {want} cannot take "
                             f"{num_tokens} tokens of {got}")
