"""fused_experts_torch: the torch implementation of the shared fused_experts signature (layers/moe/__init__.py).

Rows are the M*k (token, chosen expert) pairs, row r = m*k + j. One stable sort of the rows by expert groups them;
then every expert with rows runs its two GEMMs once over its contiguous group (experts without rows are skipped, no
expert runs on tokens not routed to it, and nothing loops over tokens):

    sort         expert_ids[:R] = experts of the rows in sorted order, sorted_ids[:R] = the rows (R = M*k; block 1:
                 no padding), expert_offsets = where each expert's group starts (one device -> host read); a row
                 whose id is outside [0, E) (another rank's expert under --ep-size: -1) sorts as expert E, after
                 every group, and is neither computed nor combined (rows [expert_offsets[E], R) of the buffers)
    gather       intermediate3[i] = hidden[sorted_ids[i] // k]
    GEMM 1       intermediate1[group e] = intermediate3[group e] @ w13[e].T          [R, 2N]
    activation   intermediate2 = silu(intermediate1[:, :N]) * intermediate1[:, N:]   [R, N]
    GEMM 2       intermediate3[group e] = intermediate2[group e] @ w2[e].T           [R, K] (the inputs are consumed)
    combine      intermediate3[i] *= topk_weight of row i (in the activation dtype); out[token of row i] +=
                 intermediate3[i]

Every R-sized intermediate lives in the workspace (mem_plan/moe_sizes.py; its block is 1 here). Outside it: the
output [M, K], and temporaries of O(R) integers and fp32 weights (the sort's int64 order, the rows' tokens and weights)
and O(E) counts, which the activations term covers (mem_plan/moe_activations.py).
Reduced precision on a CPU (bf16 / fp16): torch runs these GEMMs through oneDNN, which keeps state for every distinct
(rows, N, K) it has run (its primitive cache, and with that cache off still ~0.27 MB per shape). The rows of an
expert differ on nearly every call, so one GEMM per group left ~0.65 MB behind per new row count (K 1024, 2N 512): a
16-layer, 64-expert model's first 2,048-token forward grew RSS by 517 MB, and a server would keep growing with every
new count. Each group is therefore run as pieces of power-of-two rows (row_pieces): at most
log2(M*k) + 1 shapes per GEMM, and no growth after them; the extra calls cost time at prefill (2,048 tokens, K 1024,
64 experts, top 8: ~0.5 vs ~0.4 s on a busy 2-core EPYC), not at decode (8 tokens: 25 ms either way). fp32 runs MKL's
sgemm, which keeps nothing per shape: one GEMM per group.
Accumulation: the GEMMs and the combine run in the input dtype, so fp32 inputs accumulate in fp32 and bf16 inputs in
bf16 (each row's GEMM reduction in whatever precision torch's kernel uses for that dtype; the routing weight is
rounded to bf16, as the Qwen references do, and the k weighted outputs of a token are summed into the bf16 output).
A token's k contributions are added in increasing expert order, the order of the HF reference loop, so fp32 results
match it.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from sglang.srt.layers.moe.workspace import MoEWorkspace
from sglang.srt.mem_plan.moe_sizes import TORCH_SORT_BLOCK_M, MoEWorkspaceSpec


def fused_experts_torch(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                        topk_ids: torch.Tensor, workspace: Optional[MoEWorkspace] = None) -> torch.Tensor:
    """hidden [M, K], w13 [E, 2N, K], w2 [E, K, N], topk_weights fp32 [M, k], topk_ids int [M, k] -> [M, K]."""
    num_tokens, hidden_size = hidden.shape
    num_experts, two_n, _ = w13.shape
    n, top_k = two_n // 2, topk_ids.shape[1]
    out = torch.zeros_like(hidden)
    if num_tokens == 0:
        return out
    if hidden.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("the torch MoE path reads expert counts on the host and cannot be captured in a CUDA "
                           "graph; start with --disable-cuda-graph")
    if workspace is None:
        dtype = str(hidden.dtype).replace("torch.", "")
        spec = MoEWorkspaceSpec(num_tokens, top_k, num_experts, hidden_size, n, dtype, TORCH_SORT_BLOCK_M)
        workspace = MoEWorkspace(spec, hidden.device)
    workspace.check_fits(num_tokens, top_k, num_experts, hidden_size, n, hidden.dtype)
    if workspace.spec.block_m != TORCH_SORT_BLOCK_M:
        raise ValueError(f"the torch MoE path groups rows without padding; got a workspace of block "
                         f"{workspace.spec.block_m}")
    rows = num_tokens * top_k

    # sort the rows by expert (stable: within an expert, rows keep token order); ids outside [0, E) sort as E, last
    flat_ids = topk_ids.reshape(-1).to(torch.int32)
    flat_ids = flat_ids.masked_fill((flat_ids < 0) | (flat_ids >= num_experts), num_experts)
    expert_of_sorted = workspace.expert_ids[:rows]
    order = torch.empty(rows, dtype=torch.int64, device=hidden.device)
    torch.sort(flat_ids, stable=True, out=(expert_of_sorted, order))
    sorted_rows = workspace.sorted_ids[:rows]
    sorted_rows.copy_(order)
    offsets = workspace.expert_offsets
    offsets[0] = 0
    offsets[1:].copy_(torch.cumsum(torch.bincount(flat_ids, minlength=num_experts + 1)[:num_experts], dim=0))
    starts = offsets.tolist()  # the one device -> host read: which experts have rows, and where
    live = starts[num_experts]  # rows [0, live) have an expert here; [live, rows) are skipped
    if live == 0:
        return out
    sorted_rows = sorted_rows[:live]
    token_of_sorted = torch.div(sorted_rows, top_k, rounding_mode="floor")

    x = workspace.intermediate3[:live]  # the gathered inputs, later the down projections
    gate_up = workspace.intermediate1[:live]
    act = workspace.intermediate2[:live]
    torch.index_select(hidden, 0, token_of_sorted, out=x)
    pow2 = hidden.device.type == "cpu" and hidden.dtype != torch.float32  # oneDNN: bounded shapes (docstring)
    active = [(e, piece) for e in range(num_experts) if starts[e + 1] > starts[e]
              for piece in row_pieces(starts[e], starts[e + 1], pow2)]
    for e, (lo, hi) in active:
        torch.mm(x[lo:hi], w13[e].t(), out=gate_up[lo:hi])
    F.silu(gate_up[:, :n], inplace=True)
    torch.mul(gate_up[:, :n], gate_up[:, n:], out=act)
    for e, (lo, hi) in active:
        torch.mm(act[lo:hi], w2[e].t(), out=x[lo:hi])
    # the weights in x's dtype: a bf16 x scaled by fp32 weights in place would be promoted through an fp32 copy of x
    x.mul_(topk_weights.reshape(-1)[sorted_rows].to(x.dtype).unsqueeze(1))
    out.index_add_(0, token_of_sorted, x)
    return out


def row_pieces(lo: int, hi: int, pow2: bool) -> list:
    """Rows [lo, hi) as one piece, or with pow2 as pieces of decreasing power-of-two lengths (the binary digits of
    hi - lo: 300 rows -> 256, 32, 8, 4)."""
    if not pow2:
        return [(lo, hi)]
    pieces, count = [], hi - lo
    while count:
        size = 1 << (count.bit_length() - 1)
        pieces.append((lo, lo + size))
        lo, count = lo + size, count - size
    return pieces
