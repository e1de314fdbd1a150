"""The per-request state of linear-attention / state-space layers (Gated DeltaNet, Mamba-2): the linear_state term.

One tensor per StateTensor of the model (mem_plan/arch_spec.py; the family module's docstring names each one's
layout), for every linear layer at once:

    buffers[name]: [n_lin, num_rows, ceil(shard_units / tp), unit_elems] in the StateTensor's dtype, zero-filled

Row r is request slot r, the same index as req_to_token's row (fb.req_pool_indices address both); row 0 is the dummy
that padded and CUDA-graph rows read and write. num_rows = plan.state_slots (= request slots + 1), so the pool's bytes
are the plan's linear_state term exactly (mem_plan/layer_pools.py: state_bytes_per_slot x state_slots).

A row is not cleared when its request ends. Its next owner starts from the zero state: a forward whose prefix length
is 0 (a new request, a re-prefill after retraction) ignores the row and overwrites it, every later forward of the
request (the next prefill chunk, decode) reads what the previous one left. So only the model's forwards touch a row.

The linear_layer index is a layer's ordinal among the model's "linear" layers (0..n_lin-1), not its decoder index.
"""

from __future__ import annotations

from typing import Dict, Sequence

import torch

from sglang.srt.mem_plan.dtypes import torch_dtype


class LinearStatePool:
    def __init__(self, state_tensors: Sequence, num_linear_layers: int, tp: int, num_rows: int,
                 device: str = "cpu"):
        if num_linear_layers <= 0 or not state_tensors:
            raise ValueError(f"LinearStatePool needs linear layers and their state tensors, got {num_linear_layers} "
                             f"layers and {len(state_tensors)} tensors")
        if num_rows < 2:
            raise ValueError(f"LinearStatePool needs the dummy row and at least one request slot, got {num_rows} rows")
        self.num_linear_layers, self.num_rows, self.tp, self.device = num_linear_layers, num_rows, tp, device
        self.buffers: Dict[str, torch.Tensor] = {}
        for t in state_tensors:
            if t.name in self.buffers:
                raise ValueError(f"two state tensors named {t.name!r}")
            units = -(-t.shard_units // tp)
            self.buffers[t.name] = torch.zeros((num_linear_layers, num_rows, units, t.unit_elems),
                                               dtype=torch_dtype(t.dtype), device=device)

    @property
    def names(self) -> tuple:
        return tuple(self.buffers)

    def get(self, name: str, linear_layer: int) -> torch.Tensor:
        """Layer linear_layer's state `name`: [num_rows, units on this rank, unit_elems], a contiguous view that the
        model reads with an index over rows (req_pool_indices) and writes back with index_copy_."""
        buf = self.buffers.get(name)
        if buf is None:
            raise KeyError(f"no state tensor {name!r}; this model's: {self.names}")
        if not 0 <= linear_layer < self.num_linear_layers:
            raise IndexError(f"linear layer {linear_layer} out of 0..{self.num_linear_layers - 1}")
        return buf[linear_layer]

    def bytes_per_slot(self) -> int:
        """One row over every linear layer and tensor: the plan's state_bytes_per_slot."""
        return sum(b.numel() // self.num_rows * b.element_size() for b in self.buffers.values())

    def mem_usage_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers.values())

    def info(self) -> dict:
        """/server_info's description: per-slot bytes, rows (the dummy included), linear layers, and each tensor's
        per-layer shape and dtype."""
        return {"state_bytes_per_slot": self.bytes_per_slot(), "state_slots": self.num_rows,
                "state_layers": self.num_linear_layers,
                "state_tensors": {n: {"shape": list(b.shape[2:]), "dtype": str(b.dtype).replace("torch.", "")}
                                  for n, b in self.buffers.items()}}


def linear_layer_count(text_shape) -> int:
    """The model's "linear" layers (model_shapes.TextShape.layer_kinds; () means every layer full)."""
    return sum(1 for k in text_shape.layer_kinds if k == "linear")


def linear_state_pool(text_shape, tp: int, num_rows: int, device: str = "cpu") -> LinearStatePool:
    """The pool of a model's TextShape: its state_tensors over its linear layers, num_rows rows (plan.state_slots)."""
    return LinearStatePool(text_shape.state_tensors, linear_layer_count(text_shape), tp, num_rows, device)


def prefix_cache_off_reason(text_shape) -> str:
    """Why the prefix cache is off for this model, or "" when it may be on: a cached prefix would need the linear
    layers' state at its end, and no snapshots of it are kept."""
    if not linear_layer_count(text_shape):
        return ""
    return (f"prefix caching is off: {text_shape.model_type} keeps per-request recurrent state (linear attention / "
            "SSM layers); a prefix hit would need a state snapshot")
