"""Shared by the Triton fused-MoE tests (CPU interpreter and GPU): routing cases, a per-token float64 reference
written from the definition (not from the kernels' code), a brute-force alignment built from plain lists, and
runners that return the relative error of the kernels. Not a test file (run_suite collects test_*.py only)."""

import torch
import torch.nn.functional as F

# max |out - ref| / max |ref| against the float64 reference (bf16: GPU only, the interpreter's bf16 dot is wrong)
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
SENSITIVITY_MIN_ERROR = 1e-1  # a kernel fed gate and up swapped must be at least this far off

# routing: "random" (k distinct experts per token), "subset:<ids>" (k distinct experts among those ids only, so the
# other experts get no assignment), "shared:<e>" (every token has expert e as its first choice)
CASES = [
    dict(name="decode_k8", M=1, K=72, N=40, E=13, topk=8, routing="random"),  # T = 8 < E: most experts empty
    dict(name="k1", M=9, K=40, N=24, E=5, topk=1, routing="random"),
    dict(name="one_expert_all_tokens", M=20, K=40, N=24, E=7, topk=1, routing="subset:4"),
    dict(name="shared_expert", M=12, K=40, N=24, E=6, topk=2, routing="shared:5"),
    dict(name="empty_experts", M=17, K=72, N=40, E=9, topk=3, routing="subset:1,4,5,8"),  # 0, 2, 3, 6, 7 empty
    dict(name="mixed_k8", M=37, K=72, N=40, E=11, topk=8, routing="random"),
    dict(name="many_blocks", M=130, K=40, N=24, E=6, topk=4, routing="random"),  # T = 520: several blocks/expert
    dict(name="wide", M=5, K=300, N=136, E=3, topk=2, routing="random"),  # K, 2N > the interpreter's 256 tiles
]
# T = M * topk > the GPU tiles' alignment chunk (1024): the alignment loops over several chunks
ALIGN_CASES = CASES + [dict(name="long", M=300, K=8, N=8, E=19, topk=4, routing="random")]


def make_routing(M, E, topk, routing, g):
    """topk_ids int64 [M, topk] (distinct experts per token) and topk_weights fp32 [M, topk] (rows sum to 1)."""
    kind, _, arg = routing.partition(":")
    allowed = list(range(E)) if kind != "subset" else [int(x) for x in arg.split(",")]
    rows = []
    for _ in range(M):
        perm = [allowed[i] for i in torch.randperm(len(allowed), generator=g).tolist()]
        if kind == "shared":
            first = int(arg)
            perm = [first] + [e for e in perm if e != first]
        rows.append(perm[:topk])
    weights = torch.rand(M, topk, generator=g) + 0.1
    return torch.tensor(rows, dtype=torch.int64), weights / weights.sum(1, keepdim=True)


def make_inputs(case, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    M, K, N, E = case["M"], case["K"], case["N"], case["E"]
    hidden = torch.randn(M, K, generator=g).to(dtype)
    w13 = (torch.randn(E, 2 * N, K, generator=g) * K**-0.5).to(dtype)
    w2 = (torch.randn(E, K, N, generator=g) * N**-0.5).to(dtype)
    ids, weights = make_routing(M, E, case["topk"], case["routing"], g)
    return hidden, w13, w2, weights, ids


def reference(hidden, w13, w2, topk_weights, topk_ids):
    """float64, one token and one of its experts at a time, straight from the definition."""
    N = w2.shape[2]
    out = torch.zeros(hidden.shape, dtype=torch.float64)
    for m in range(hidden.shape[0]):
        x = hidden[m].double()
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[m, j])
            gate = w13[e, :N].double() @ x
            up = w13[e, N:].double() @ x
            out[m] += float(topk_weights[m, j]) * (w2[e].double() @ (F.silu(gate) * up))
    return out


def relative_error(out, ref):
    return ((out.cpu().double() - ref).abs().max() / ref.abs().max()).item()


def separate_workspace(max_tokens, topk, E, N, K, dtype, device, block_m):
    """A workspace laid out as the model runner's MoEWorkspace (layers/moe/workspace.py in the model branch): 2-D
    intermediates, its own intermediate3, and the looser bounds T + E * (B - 1) slots and ceil(slots / B) blocks."""
    from types import SimpleNamespace

    t = max_tokens * topk
    slots = t + E * (block_m - 1)
    return SimpleNamespace(
        intermediate1=torch.empty(t, 2 * N, dtype=dtype, device=device),
        intermediate2=torch.empty(t, N, dtype=dtype, device=device),
        intermediate3=torch.empty(t, K, dtype=dtype, device=device),
        sorted_ids=torch.empty(slots, dtype=torch.int32, device=device),
        expert_ids=torch.empty(-(-slots // block_m), dtype=torch.int32, device=device),
        expert_offsets=torch.empty(E + 1, dtype=torch.int32, device=device))


def run_case(case, dtype, tiles=None, device="cpu", swap_gate_up=False, workspace=None, workspace_tokens=None):
    """Relative error of fused_experts_triton against the reference. swap_gate_up feeds the kernel w13 with its gate
    and up halves swapped (the comparison must then fail). workspace: None (the call allocates one), "planned" (a
    FusedMoeWorkspace for workspace_tokens >= M tokens), "dict" (the same as a dict of its fields), "separate"
    (separate_workspace) or "runtime" (the MoEWorkspace the model runner allocates from the plan's spec on a GPU,
    whose row block is moe_sizes.SORT_BLOCK_M["triton"])."""
    from sglang.srt.layers.moe.triton_ops import FusedMoeWorkspace, fused_experts_triton
    from sglang.srt.layers.moe.triton_ops.tiles import MOE_BLOCK_M

    hidden, w13, w2, weights, ids = make_inputs(case, dtype)
    ref = reference(hidden, w13, w2, weights, ids)
    if swap_gate_up:
        w13 = torch.cat([w13[:, case["N"]:], w13[:, : case["N"]]], dim=1)
    ws = None
    if workspace is not None:
        shape = (workspace_tokens, case["topk"], case["E"], case["N"], case["K"], dtype, device, MOE_BLOCK_M)
        if workspace == "runtime":
            from sglang.srt.layers.moe.workspace import MoEWorkspace
            from sglang.srt.mem_plan.moe_sizes import SORT_BLOCK_M, MoEWorkspaceSpec

            spec = MoEWorkspaceSpec(workspace_tokens, case["topk"], case["E"], case["K"], case["N"],
                                    str(dtype).replace("torch.", ""), SORT_BLOCK_M["triton"])
            ws = MoEWorkspace(spec, device)
        else:
            ws = separate_workspace(*shape) if workspace == "separate" else FusedMoeWorkspace.allocate(*shape)
            ws = dict(vars(ws)) if workspace == "dict" else ws
    d = dict(device=device)
    out = fused_experts_triton(hidden.to(**d), w13.to(**d), w2.to(**d), weights.to(**d), ids.to(**d), ws,
                               tiles=tiles)
    assert out.shape == hidden.shape and out.dtype == dtype
    return relative_error(out, ref)


def brute_force_alignment(ids, E, block_m):
    """(sorted ids, block experts, group starts + the padded total) built from plain lists: each expert's assignments
    ascending, padded with T to a multiple of block_m; experts without assignments get nothing."""
    flat = ids.reshape(-1).tolist()
    t = len(flat)
    sorted_ids, experts, starts = [], [], []
    for e in range(E):
        starts.append(len(sorted_ids))
        mine = [i for i, x in enumerate(flat) if x == e]
        padded = -(-len(mine) // block_m) * block_m
        sorted_ids += mine + [t] * (padded - len(mine))
        experts += [e] * (padded // block_m)
    return sorted_ids, experts, starts + [len(sorted_ids)]


def alignment_mismatches(case, block_m, tiles=None, device="cpu"):
    """align_block_size against brute_force_alignment, into buffers larger than needed and poisoned with -7:
    returns a list of what differs (empty when it matches), also checking that nothing past the used entries was
    written and that the used total respects the workspace bound."""
    from sglang.srt.layers.moe.triton_ops.align import align_block_size
    from sglang.srt.layers.moe.triton_ops.workspace import max_blocks, max_sorted_slots

    _, _, _, _, ids = make_inputs(case, torch.float32)
    E, t = case["E"], ids.numel()
    slots, blocks = max_sorted_slots(t, E, block_m), max_blocks(t, E, block_m)
    d = dict(dtype=torch.int32, device=device)
    sorted_buf, expert_buf = torch.full((slots + 5,), -7, **d), torch.full((blocks + 5,), -7, **d)
    offsets = torch.full((E + 1,), -7, **d)
    align_block_size(ids.to(device), E, block_m, sorted_buf[:slots], expert_buf[:blocks], offsets, tiles)
    want_sorted, want_experts, want_offsets = brute_force_alignment(ids, E, block_m)
    want_total = want_offsets[-1]
    problems = []
    if offsets.tolist() != want_offsets:
        problems.append(f"expert_offsets {offsets.tolist()} != {want_offsets}")
    if want_total > slots:
        problems.append(f"padded total {want_total} exceeds the bound {slots}")
    if sorted_buf[:want_total].tolist() != want_sorted:
        problems.append(f"sorted_ids {sorted_buf[:want_total].tolist()} != {want_sorted}")
    if expert_buf[: len(want_experts)].tolist() != want_experts:
        problems.append(f"expert_ids {expert_buf[: len(want_experts)].tolist()} != {want_experts}")
    if set(sorted_buf[want_total:].tolist()) != {-7} or set(expert_buf[len(want_experts):].tolist()) != {-7}:
        problems.append("entries past the used ones were written")
    return problems
