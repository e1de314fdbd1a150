"""Attention-backend buffer declarations: the one place their sizes are written down.

The contract, for every backend: `declare(inputs: BackendInputs) -> list[BufferDecl]`. BackendInputs holds the real
inputs of one rank -- the model's attention shape under TP, the request-slot count R, the largest CUDA-graph batch
G, the Triton kv splits, the dtypes and the prefill chunk. The planner charges WorkspaceSpec = the linear fit of the
declared bytes in (R, G) (exact: every size is linear in them); the backend allocates exactly the persistent buffers
of the same declaration at construction and asserts byte-for-byte equality (layers/attention/base_attn_backend.py).
Transient buffers are upper bounds on per-forward scratch: charged, never allocated up front.

  AITER (ROCm, non-MLA): one uint8 workspace that paged_attention_ragged splits into exp sums and max logits
      [B, H_q, P] fp32 and partial outputs [B, H_q, P, d] (B = the batch, <= R), with P = ceil(context_len / 256);
      charged at 4 B per partial-output element -> per slot H_q * P * (4 * d + 8) bytes (PR #18263's formula), plus
      the two fp32 K/V dequant scales the kernel reads. MLA allocates none of it.
  FlashInfer: one uint8 float workspace (384 MiB; 512 MiB for Qwen2/Qwen3/MiMo architectures) and one 8 MiB int
      workspace shared by every wrapper (flashinfer's own constructor allocates a private one; the backend swaps in
      the planned one) + int32 kv-index buffers [R * ceil(context_len / page_size)] per wrapper: every batch's page
      ids (eager and graph decode, extend) are gathered into it, never into a per-step tensor.
  Triton: split-KV decode logits fp32 [B, H_q, splits, d_v] + lse [B, H_q, splits], for eager decode at B = R
      and for graphs at B = G, + int32 extend qo_start [R + 1]; with a rotated KV format (int4, int2_hadamard) its
      fp32 rotation matrices [parts, d, d], which turn the query and the output on the device.
  torch_native: nothing persistent; transients: one extend call with a cached prefix (mask, gathered K/V, query
      and output copies) and, without the fused CPU decode kernel, one decode row group's gathered K/V. With the
      fused CPU kernels (the same module serves decode and extend) extend is one kernel call per layer: its query
      copy and output, and each kernel thread's fp32 scores over the longest sequence.
AITER and FlashInfer also keep small int32 indptr buffers of R + 1 entries; AITER's kv indices (token slots, block 1)
      are int32 [R * context_len].
A speculative tree's side branches are sequences of their own in a verify forward (EXTEND), each in a request-table
row beyond the R slots (mem_plan/spec_sizes.branch_rows): every buffer an extend batch is indexed into (indptrs,
qo_start, kv indices) is sized for S = R + those rows (BackendInputs.num_seqs); the decode-only ones stay at R.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

from sglang.srt.mem_plan.dtypes import dtype_bytes
from sglang.srt.mem_plan.specs import WorkspaceSpec
from sglang.srt.mem_plan.units import MiB

# the attention backends, in the order --attention-backend lists them (the registry and ServerArgs read this)
ATTENTION_BACKENDS = ("torch_native", "triton", "flashinfer", "aiter")
# the backends with a CUDA-graph decode path (capture/replay hooks; model_executor/cuda_graph_runner.py)
GRAPH_BACKENDS = ("triton", "flashinfer")
AITER_PARTITION_TOKENS = 256  # hard-wired in the AITER paged-attention kernel
FLASHINFER_WORKSPACE_BYTES = 384 * MiB
FLASHINFER_WORKSPACE_LARGE_BYTES = 512 * MiB  # upstream forces this for these architecture families
FLASHINFER_LARGE_WORKSPACE_ARCH_PREFIXES = ("Qwen2", "Qwen3", "MiMo")
FLASHINFER_INT_WORKSPACE_BYTES = 8 * MiB  # the size flashinfer's wrappers give their int (plan-info) workspace
# torch_native: upper bound on K/V tokens one decode layer gathers at once (rows x padded length)
DECODE_GATHER_TOKENS = 64 * 1024
EXTEND_MASK_BYTES_PER_ENTRY = 1 + 4  # the bool mask and SDPA's float copy of it
DECODE_SCORE_BYTES = 4  # float32 scores per gathered token and query head
EXTEND_KERNEL_SCORE_BYTES = 4 * 4  # the fused CPU kernel's scratch: 4 heads' float32 scores per key, per thread
DECODE_INDEX_BYTES = 8 + 1 + 1  # per gathered token: its int64 slot, the bool valid mask and its negation


@dataclass(frozen=True)
class BufferDecl:
    name: str
    shape: tuple[int, ...]
    dtype: str
    transient: bool = False  # a per-forward scratch bound: charged by the plan, not allocated at startup

    @property
    def num_bytes(self) -> int:
        return math.prod(self.shape) * dtype_bytes(self.dtype)


@dataclass(frozen=True)
class AttentionShape:
    """What a backend needs to know about the model on one TP rank."""

    num_q_heads: int  # per rank
    head_dim: int
    context_len: int
    v_head_dim: int | None = None
    is_mla: bool = False
    architectures: tuple[str, ...] = ()
    num_kv_splits: Optional[int] = None  # --triton-attention-num-kv-splits (ServerArgs holds the default)
    num_wrappers: int = 1  # FlashInfer: 2 with sliding-window or cross attention
    num_kv_heads: int = 1  # per rank (torch_native's gather bound)
    model_dtype_bytes: int = 2
    kv_dtype_bytes: int = 2
    decode_gather_tokens: int = DECODE_GATHER_TOKENS  # torch_native's decode row group (kv_quant: less if quantized)
    kv_rotated_parts: int = 0  # K/V parts a rotated KV format stores turned (kv_quant.rotated_parts): Triton's R

    @property
    def v_dim(self) -> int:
        return self.head_dim if self.v_head_dim is None else self.v_head_dim


@dataclass(frozen=True)
class BackendInputs:
    """The real inputs one backend instance sizes its buffers from."""

    shape: AttentionShape
    num_reqs: int  # request slots (req_to_token rows minus the dummy row)
    cuda_graph_max_bs: int = 0  # largest captured decode batch; 0 = no graphs
    max_extend_tokens: int = 0  # the prefill chunk (torch_native's extend bound); 0 = not charged
    fused_cpu_decode: bool = True  # torch_native decodes (and extends) through the fused CPU kernels (no gather);
    # a quantized pool: through the kernel over its codes (resolved.fused_cpu_decode)
    cpu_threads: int = 1  # the CPU kernels' threads (each holds the fused extend's scores)
    page_size: int = 1  # tokens per KV page (--page-size): sizes the page-index buffers
    num_branch_rows: int = 0  # request-table rows beyond the slots: a speculative tree's side branches

    def __post_init__(self):
        if min(self.num_reqs, self.cuda_graph_max_bs, self.max_extend_tokens, self.num_branch_rows) < 0:
            raise ValueError(f"BackendInputs counts must be >= 0: {self}")

    @property
    def num_seqs(self) -> int:
        """Sequences one extend forward may hold: one per request-table row (request slots + branch rows)."""
        return self.num_reqs + self.num_branch_rows

    @property
    def graph_bs(self) -> int:
        return min(self.cuda_graph_max_bs, self.num_reqs)

    def max_pages_per_req(self, page_size: int) -> int:
        """Pages one request's KV can span: ceil(context_len / page_size)."""
        return -(-self.shape.context_len // page_size)


def aiter_num_partitions(context_len: int) -> int:
    return -(-context_len // AITER_PARTITION_TOKENS)


def aiter_decode_workspace_per_req_bytes(num_q_heads: int, head_dim: int, context_len: int) -> int:
    """H_q * ceil(ctx / 256) * (4 * head_dim + 8): fp32 partial output plus fp32 (max logit, exp sum)."""
    return num_q_heads * aiter_num_partitions(context_len) * (4 * head_dim + 8)


def aiter_buffers(x: BackendInputs) -> list[BufferDecl]:
    s, r, n = x.shape, x.num_reqs, x.num_seqs
    bufs = [BufferDecl(name, (n + 1,), "int32") for name in ("kv_indptr", "qo_indptr", "kv_last_page_len")]
    bufs.append(BufferDecl("kv_indices", (n * x.max_pages_per_req(1),), "int32"))  # token granularity (block 1)
    if s.is_mla:
        return bufs
    # one buffer: the kernel places exp sums, max logits and partial outputs at offsets that depend on the batch
    per_slot = aiter_decode_workspace_per_req_bytes(s.num_q_heads, s.head_dim, s.context_len)
    return bufs + [BufferDecl("workspace", (r * per_slot,), "uint8"), BufferDecl("kv_scales", (2,), "float32")]


def flashinfer_workspace_bytes(architectures: tuple[str, ...] = ()) -> int:
    if any(a.startswith(FLASHINFER_LARGE_WORKSPACE_ARCH_PREFIXES) for a in architectures):
        return FLASHINFER_WORKSPACE_LARGE_BYTES
    return FLASHINFER_WORKSPACE_BYTES


def flashinfer_buffers(x: BackendInputs) -> list[BufferDecl]:
    s, n = x.shape, x.num_seqs
    bufs = [BufferDecl("workspace", (flashinfer_workspace_bytes(s.architectures),), "uint8"),
            BufferDecl("int_workspace", (FLASHINFER_INT_WORKSPACE_BYTES,), "uint8")]
    for w in range(s.num_wrappers):
        bufs.append(BufferDecl(f"kv_indptr_{w}", (n + 1,), "int32"))
        # the page ids of any batch of <= S sequences (eager) and the fixed buffer the graph wrappers read (G <= R)
        bufs.append(BufferDecl(f"kv_indices_{w}", (n * x.max_pages_per_req(x.page_size),), "int32"))
    bufs.append(BufferDecl("qo_indptr", (n + 1,), "int32"))
    bufs.append(BufferDecl("kv_last_page_len", (n + 1,), "int32"))
    return bufs


def triton_buffers(x: BackendInputs) -> list[BufferDecl]:
    s, r, g = x.shape, x.num_reqs, x.graph_bs
    h, splits, dv = s.num_q_heads, s.num_kv_splits, s.v_dim
    if splits is None:
        raise ValueError("the Triton workspace is sized by its kv splits: pass --triton-attention-num-kv-splits "
                         "(AttentionShape.num_kv_splits)")
    # the kernels read K/V through req_to_token and derive their splits from seq_lens: no kv-index buffers, and
    # extend needs only where each request's rows start in q
    return [BufferDecl("qo_start", (x.num_seqs + 1,), "int32")] + [
        BufferDecl("attn_logits", (r, h, splits, dv), "float32"),
        BufferDecl("attn_lse", (r, h, splits), "float32"),
        BufferDecl("cuda_graph_attn_logits", (g, h, splits, dv), "float32"),
        BufferDecl("cuda_graph_attn_lse", (g, h, splits), "float32"),
    ] + ([BufferDecl("kv_rotation", (s.kv_rotated_parts, s.head_dim, s.head_dim), "float32")]
         if s.kv_rotated_parts else [])  # a rotated KV format's R per part: q (and out) turn on the device


def extend_attention_workspace_bytes(num_q_heads: int, num_kv_heads: int, head_dim: int, elem_bytes: int,
                                     max_extend_tokens: int, context_len: int) -> int:
    """Upper bound on the transient memory of one torch_native extend call with a cached prefix: the bool mask and
    SDPA's converted copy of it (q_len x seq_len x (1 + 4) B), the gathered K/V, their expansion to the query heads,
    and the query/output transposes. Measured on this CPU: 49 MB at q_len 2048 x seq_len 8192 (SmolLM2 heads),
    against 114 MB from this bound."""
    q, lk = max_extend_tokens, context_len
    mask = q * lk * EXTEND_MASK_BYTES_PER_ENTRY
    kv = 2 * lk * head_dim * elem_bytes * (num_kv_heads + num_q_heads)
    q_out = 2 * q * num_q_heads * head_dim * elem_bytes
    return mask + kv + q_out


def fused_extend_workspace_bytes(num_q_heads: int, head_dim: int, elem_bytes: int, max_extend_tokens: int,
                                 context_len: int, cpu_threads: int) -> int:
    """torch_native's extend through the fused CPU kernels (extend_attention_op.h; quant_attention_op.h over an int8 /
    fp8 pool's codes, which turns the query inside its scratch): the contiguous query copy and the output, [chunk,
    H * D] each, and every kernel thread's scores over the longest sequence."""
    return (2 * max_extend_tokens * num_q_heads * head_dim * elem_bytes
            + cpu_threads * EXTEND_KERNEL_SCORE_BYTES * context_len)


def decode_gather_bytes(shape: AttentionShape) -> int:
    """torch_native without the fused kernel: DECODE_GATHER_TOKENS tokens of one layer's gathered K and V (+ one
    contiguous copy inside SDPA), their float32 scores, and the row group's slot table and mask."""
    per_token_layer = shape.num_kv_heads * (shape.head_dim + shape.v_dim) * shape.kv_dtype_bytes
    return shape.decode_gather_tokens * (2 * per_token_layer + DECODE_SCORE_BYTES * shape.num_q_heads
                                         + DECODE_INDEX_BYTES)


def torch_native_buffers(x: BackendInputs) -> list[BufferDecl]:
    s = x.shape
    bufs = []
    if x.max_extend_tokens and x.fused_cpu_decode:
        extend = fused_extend_workspace_bytes(s.num_q_heads, s.head_dim, s.model_dtype_bytes, x.max_extend_tokens,
                                              s.context_len, x.cpu_threads)
        bufs.append(BufferDecl("extend_attention", (extend,), "uint8", transient=True))
    elif x.max_extend_tokens:
        extend = extend_attention_workspace_bytes(s.num_q_heads, s.num_kv_heads, s.head_dim, s.model_dtype_bytes,
                                                  x.max_extend_tokens, s.context_len)
        bufs.append(BufferDecl("extend_attention", (extend,), "uint8", transient=True))
    if not x.fused_cpu_decode:
        bufs.append(BufferDecl("decode_gather", (decode_gather_bytes(s),), "uint8", transient=True))
    return bufs


BUFFER_DECLARATIONS = {
    "aiter": aiter_buffers,
    "flashinfer": flashinfer_buffers,
    "triton": triton_buffers,
    "torch_native": torch_native_buffers,
}
assert set(BUFFER_DECLARATIONS) == set(ATTENTION_BACKENDS)


def declare(backend: str, inputs: BackendInputs) -> list[BufferDecl]:
    """The buffers `backend` holds for these inputs (persistent and transient)."""
    if backend not in BUFFER_DECLARATIONS:
        raise ValueError(f"Unknown attention backend {backend!r}; choose one of {', '.join(ATTENTION_BACKENDS)}.")
    return BUFFER_DECLARATIONS[backend](inputs)


def persistent(buffers: list[BufferDecl]) -> list[BufferDecl]:
    return [b for b in buffers if not b.transient]


def buffers_bytes(buffers: list[BufferDecl]) -> int:
    return sum(b.num_bytes for b in buffers)


def workspace_spec(backend: str, shape_or_inputs: AttentionShape | BackendInputs,
                   persistent_only: bool = False) -> WorkspaceSpec:
    """The backend's declared bytes as fixed + per_req * R + per_graph_bs * G + per_branch_row * rows (exact: linear
    in the three); persistent_only: the buffers it allocates at construction, without the transient scratch bounds.

    With BackendInputs, everything but R, G and the branch rows (the chunk, the decode path) is taken from it."""
    x = shape_or_inputs if isinstance(shape_or_inputs, BackendInputs) else BackendInputs(shape_or_inputs, 0)

    def at(num_reqs: int, graph_bs: int, branch_rows: int = 0) -> int:
        declared = declare(backend, replace(x, num_reqs=num_reqs, cuda_graph_max_bs=graph_bs,
                                            num_branch_rows=branch_rows))
        return buffers_bytes(persistent(declared) if persistent_only else declared)

    base = at(0, 0)
    # G is capped at R, so the graph coefficient is read at R = 1 and the slot coefficient from R = 1, G = 0
    per_req = at(1, 0) - base
    per_graph_bs = at(1, 1) - at(1, 0)
    return WorkspaceSpec(base, per_req, per_graph_bs, name=backend, per_branch_row_bytes=at(0, 0, 1) - base)
