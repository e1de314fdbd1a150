"""Specs: what each memory consumer declares, as small frozen dataclasses of integers.

- KVCellSpec: KV-cache bytes per token on one rank (MHA/GQA or MLA, kv dtype, TP sharding).
- WorkspaceSpec: a buffer whose size is linear in request slots (and in the CUDA-graph batch size),
  e.g. an attention backend's decode workspace. Linearity is what lets the solver be exact.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from sglang.srt.mem_plan import kv_quant
from sglang.srt.mem_plan.dtypes import dtype_bytes, kv_compute_dtype, resolve_kv_cache_dtype


def kv_dtype_bytes(kv_cache_dtype: str, model_dtype: str = "bfloat16") -> int:
    """Element size of the KV cache for a --kv-cache-dtype value ("auto" -> the model dtype); an int format's
    codes are not elements of a dtype: its bytes are KVCellSpec(kv_format=...).cell_bytes (kv_quant.py)."""
    fmt = resolve_kv_cache_dtype(kv_cache_dtype, model_dtype)
    return 1 if fmt in kv_quant.INT_FORMATS else dtype_bytes(kv_compute_dtype(fmt, model_dtype))


def kv_heads_per_rank(num_kv_heads: int, tp_size: int) -> int:
    """KV heads held by one TP rank; heads are replicated when tp_size > num_kv_heads, so never below 1."""
    return max(1, num_kv_heads // tp_size)


@dataclass(frozen=True)
class KVCellSpec:
    """KV bytes per token on one rank, summed over the rank's KV layers.

    MHA/GQA: kv_heads_per_rank * (head_dim + v_head_dim) * num_layers * kv_dtype_bytes
    MLA:     (kv_lora_rank + qk_rope_head_dim) * num_layers * kv_dtype_bytes   (one latent, never TP-sharded)
    With kv_format set (a name of mem_plan/kv_quant.py), an MHA/GQA cell is
             kv_heads_per_rank * num_layers * kv_quant.token_bytes_per_head(kv_format, head_dim, v_head_dim)
    (codes and every per-token scale byte), and fixed_bytes the per-(layer, KV head) scales.
    """

    num_layers: int
    kv_dtype_bytes: int
    num_kv_heads: int = 0
    head_dim: int = 0
    v_head_dim: Optional[int] = None  # None: same as head_dim
    tp_size: int = 1
    kv_lora_rank: int = 0  # > 0 selects MLA
    qk_rope_head_dim: int = 0
    kv_format: str = ""  # "" = plain kv_dtype_bytes elements

    def __post_init__(self):
        if self.num_layers < 0 or self.kv_dtype_bytes <= 0 or self.tp_size <= 0:
            raise ValueError(f"invalid KVCellSpec {self}")
        if not self.is_mla and (self.num_kv_heads <= 0 or self.head_dim <= 0):
            raise ValueError(f"MHA/GQA KVCellSpec needs num_kv_heads and head_dim > 0: {self}")
        if self.is_mla and self.kv_format in kv_quant.INT_FORMATS:
            raise ValueError(f"--kv-cache-dtype {self.kv_format} is for MHA/GQA models; an MLA model's latent "
                             f"cache takes fp8_e4m3, fp8_e5m2 or the model dtype.")

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def num_kv_heads_per_rank(self) -> int:
        return 1 if self.is_mla else kv_heads_per_rank(self.num_kv_heads, self.tp_size)

    @property
    def cell_bytes(self) -> int:
        if self.is_mla:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * self.num_layers * self.kv_dtype_bytes
        v_dim = self.head_dim if self.v_head_dim is None else self.v_head_dim
        if self.kv_format:
            per_head = kv_quant.token_bytes_per_head(self.kv_format, self.head_dim, v_dim)
            return self.num_kv_heads_per_rank * self.num_layers * per_head
        return self.num_kv_heads_per_rank * (self.head_dim + v_dim) * self.num_layers * self.kv_dtype_bytes

    @property
    def fixed_bytes(self) -> int:
        """Per-(layer, KV head) fields that do not grow with the pool (fp8 scales, int4 channel means)."""
        if not self.kv_format:
            return 0
        v_dim = self.head_dim if self.v_head_dim is None else self.v_head_dim
        return kv_quant.fixed_bytes(self.kv_format, self.num_layers, self.num_kv_heads_per_rank, self.head_dim, v_dim)

    @property
    def bf16_cell_bytes(self) -> int:
        """The same cell in bfloat16, for the capacity gain a format reports."""
        return dataclasses.replace(self, kv_dtype_bytes=2, kv_format="").cell_bytes


@dataclass(frozen=True)
class WorkspaceSpec:
    """Bytes = fixed_bytes + per_req_bytes * num_reqs + per_graph_bs_bytes * cuda_graph_bs
    + per_branch_row_bytes * branch_rows.

    num_reqs is the request-slot count; cuda_graph_bs is the largest captured decode batch, which never exceeds
    num_reqs; branch_rows are the request-table rows beyond the slots that a speculative tree's side branches take
    (spec_sizes.branch_rows, nondecreasing in num_reqs). All coefficients are >= 0, so the total is nondecreasing in
    num_reqs -- the property the token solver relies on.
    """

    fixed_bytes: int = 0
    per_req_bytes: int = 0
    per_graph_bs_bytes: int = 0
    name: str = "workspace"
    per_branch_row_bytes: int = 0

    def __post_init__(self):
        if min(self.fixed_bytes, self.per_req_bytes, self.per_graph_bs_bytes, self.per_branch_row_bytes) < 0:
            raise ValueError(f"WorkspaceSpec coefficients must be >= 0: {self}")

    def bytes_for(self, num_reqs: int, cuda_graph_bs: int = 0, branch_rows: int = 0) -> int:
        return (self.fixed_bytes + self.per_req_bytes * num_reqs + self.per_graph_bs_bytes * cuda_graph_bs
                + self.per_branch_row_bytes * branch_rows)
