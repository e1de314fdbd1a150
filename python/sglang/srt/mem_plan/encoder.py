"""Encoder reservation: a typed budget per modality for multimodal encoders instead of a cut to mem_fraction_static.

Each modality a model encodes (image / video / audio) is one plan term, `encoder_<modality>` (EncoderTerm): the peak
of its encoder on the largest planned unit of work (encoder_inputs.py) -- measured by the server at startup, a
formula (encoder_towers.py, EncoderSpec) in `sglang plan`. An explicit --encoder-mem-reserve (GiB) replaces them with
one shared term, `encoder`. EncoderBudget is the admission helper the scheduler uses so it never runs more encoder
work at once than a reservation covers.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional

from sglang.srt.mem_plan.units import GiB

# Live tensors of one transformer encoder layer per token, in units of hidden_size: residual, normed input,
# q, k, v, attention output (6) -- plus the MLP's fc1 output and its activation (2 x intermediate).
ENCODER_LIVE_HIDDEN_PER_TOKEN = 6
ENCODER_LIVE_INTERMEDIATE_PER_TOKEN = 2
# Without a fused (flash) kernel the score matrix and its softmax are materialised: 2 x heads x tokens^2.
ENCODER_SCORE_COPIES = 2


@dataclass(frozen=True)
class EncoderSpec:
    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    max_tokens_per_input: int  # patches (or audio frames) of the largest accepted input
    output_dim: int = 0  # projector output width (embeddings kept for the language model)
    act_dtype_bytes: int = 2
    fused_attention: bool = False

    def bytes_for_tokens(self, num_tokens: int) -> int:
        """Peak activation bytes to encode one input of num_tokens tokens (weights are counted elsewhere)."""
        per_token = (ENCODER_LIVE_HIDDEN_PER_TOKEN * self.hidden_size
                     + ENCODER_LIVE_INTERMEDIATE_PER_TOKEN * self.intermediate_size + self.output_dim)
        scores = 0 if self.fused_attention else ENCODER_SCORE_COPIES * self.num_heads * num_tokens * num_tokens
        return (num_tokens * per_token + scores) * self.act_dtype_bytes

    @property
    def peak_bytes_per_input(self) -> int:
        return self.bytes_for_tokens(self.max_tokens_per_input)


ENCODER_TERM_PREFIX = "encoder_"
SHARED_ENCODER_TERM = "encoder"  # --encoder-mem-reserve: one reservation every modality shares


def encoder_term_name(modality: str) -> str:
    return ENCODER_TERM_PREFIX + modality


@dataclass(frozen=True)
class EncoderTerm:
    """One modality's encoder reservation as the plan charges it."""

    modality: str
    num_bytes: int
    source: str  # measured / formula / declared
    detail: str = ""

    @property
    def name(self) -> str:
        return encoder_term_name(self.modality)

    def __post_init__(self):
        if self.num_bytes < 0:
            raise ValueError(f"encoder term {self.name}: negative size {self.num_bytes}")
        if self.source not in ("measured", "formula", "declared"):
            raise ValueError(f"encoder term {self.name}: source {self.source!r}")


def encoder_reservation_bytes(spec: Optional[EncoderSpec], encoder_batch_size: int = 1,
                              encoder_mem_reserve_gib: Optional[float] = None) -> int:
    """Explicit --encoder-mem-reserve wins; else the spec at its largest input x batch size; 0 without encoder."""
    if encoder_mem_reserve_gib is not None:
        if encoder_mem_reserve_gib < 0:
            raise ValueError("--encoder-mem-reserve must be >= 0")
        return int(encoder_mem_reserve_gib * GiB)
    if spec is None:
        return 0
    return spec.peak_bytes_per_input * encoder_batch_size


class EncoderBudget:
    """Admission control for encoder work against a fixed reservation (thread-safe).

    Invariant: 0 <= in_use_bytes <= capacity_bytes. A job larger than the whole reservation can never run;
    fits_ever() lets the scheduler reject it up front instead of waiting forever.
    """

    def __init__(self, capacity_bytes: int, spec: Optional[EncoderSpec] = None):
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        self.capacity_bytes = capacity_bytes
        self.spec = spec
        self._in_use_bytes = 0
        self._num_running = 0
        self._lock = threading.Lock()

    def cost_bytes(self, num_tokens: int) -> int:
        if self.spec is None:
            raise ValueError("EncoderBudget without a spec: pass byte costs directly")
        return self.spec.bytes_for_tokens(num_tokens)

    def fits_ever(self, cost_bytes: int) -> bool:
        return cost_bytes <= self.capacity_bytes

    def try_acquire(self, cost_bytes: int) -> bool:
        if cost_bytes < 0:
            raise ValueError("cost_bytes must be >= 0")
        with self._lock:
            if self._in_use_bytes + cost_bytes > self.capacity_bytes:
                return False
            self._in_use_bytes += cost_bytes
            self._num_running += 1
            return True

    def release(self, cost_bytes: int) -> None:
        with self._lock:
            if cost_bytes > self._in_use_bytes or self._num_running == 0:
                raise ValueError(f"release of {cost_bytes} bytes exceeds the {self._in_use_bytes} in use")
            self._in_use_bytes -= cost_bytes
            self._num_running -= 1

    @property
    def in_use_bytes(self) -> int:
        return self._in_use_bytes

    def check_integrity(self) -> None:
        assert 0 <= self._in_use_bytes <= self.capacity_bytes, (self._in_use_bytes, self.capacity_bytes)
        assert self._num_running >= 0 and (self._num_running > 0 or self._in_use_bytes == 0)
