"""Allocate: turn declared buffers into tensors. The only torch use in mem_plan, imported lazily."""

from __future__ import annotations

from sglang.srt.mem_plan.backends import BufferDecl


def allocate_declared_buffers(buffers: list[BufferDecl], device="cpu") -> dict:
    """One torch.empty per declaration, with exactly the declared shape and dtype."""
    import torch

    return {b.name: torch.empty(b.shape, dtype=getattr(torch, b.dtype), device=device) for b in buffers}


def allocated_bytes(tensors: dict) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())
