"""fused_experts_torch against a per-token brute force in float64 (a loop over tokens and their k experts), with
routings where some experts get no tokens and one expert gets every token; the router against transformers' Qwen3-MoE
and Mixtral routers; FusedMoE's loader slicing each expert over TP ranks; and the workspace it runs in."""

import pytest
import torch
import torch.nn.functional as F

from sglang.srt.layers.moe.fused_moe_torch import fused_experts_torch, row_pieces
from sglang.srt.layers.moe.router import select_experts
from sglang.srt.layers.moe.workspace import MoEWorkspace
from sglang.srt.mem_plan.moe_sizes import MoEWorkspaceSpec
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=8, suite="cpu")

E, K, N, TOP_K = 6, 48, 40, 2


def brute_force(hidden, w13, w2, topk_weights, topk_ids):
    """out[m] = sum_j w[m, j] * (silu(gate) * up)(hidden[m]) @ w2[e].T, one token and one expert at a time, fp64."""
    h, w13, w2, tw = hidden.double(), w13.double(), w2.double(), topk_weights.double()
    out = torch.zeros_like(h)
    n = w13.shape[1] // 2
    for m in range(h.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[m, j])
            gate, up = w13[e, :n] @ h[m], w13[e, n:] @ h[m]
            out[m] += tw[m, j] * (w2[e] @ (F.silu(gate) * up))
    return out


def weights(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(E, 2 * N, K, generator=g) / K**0.5
    w2 = torch.randn(E, K, N, generator=g) / N**0.5
    return w13.to(dtype), w2.to(dtype)


def routing(m, ids, seed=1):
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(m, TOP_K, generator=g)
    return w / w.sum(-1, keepdim=True), ids.to(torch.int32)


def distinct_pairs(m, experts, seed=2):
    """Each token's TOP_K distinct experts drawn from `experts` only."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.tensor(experts)[torch.randperm(len(experts), generator=g)[:TOP_K]] for _ in range(m)])


CASES = {
    "random": lambda m: distinct_pairs(m, list(range(E))),
    "experts 1 and 4 get none": lambda m: distinct_pairs(m, [0, 2, 3, 5]),
    "expert 3 gets every token": lambda m: torch.stack([torch.full((m,), 3), torch.randint(4, 6, (m,))], 1),
    "one token": lambda m: distinct_pairs(1, list(range(E))),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_per_token_brute_force_fp32(case):
    m = 37
    ids = CASES[case](m)
    hidden = torch.randn(ids.shape[0], K, generator=torch.Generator().manual_seed(3))
    w13, w2 = weights()
    topk_weights, topk_ids = routing(ids.shape[0], ids)
    got = fused_experts_torch(hidden, w13, w2, topk_weights, topk_ids)
    torch.testing.assert_close(got.double(), brute_force(hidden, w13, w2, topk_weights, topk_ids),
                               atol=1e-5, rtol=1e-5)


def test_bf16_within_bf16_tolerance_and_workspace_reused():
    m = 29
    ids = CASES["random"](m)
    hidden = torch.randn(m, K, generator=torch.Generator().manual_seed(4))
    w13, w2 = weights(dtype=torch.bfloat16)
    topk_weights, topk_ids = routing(m, ids)
    spec = MoEWorkspaceSpec(64, TOP_K, E, K, N, "bfloat16")
    ws = MoEWorkspace(spec, "cpu")
    ptrs = {name: t.data_ptr() for name, t in ws.buffers.items()}
    got = fused_experts_torch(hidden.bfloat16(), w13, w2, topk_weights, topk_ids, ws)
    assert got.dtype == torch.bfloat16
    ref = brute_force(hidden.bfloat16().float(), w13.float(), w2.float(), topk_weights, topk_ids)
    torch.testing.assert_close(got.double(), ref, atol=3e-2, rtol=3e-2)
    # the call ran in the workspace: its sort buffers hold this call's grouping (block 1: no padding)
    rows = m * TOP_K
    flat = topk_ids.reshape(-1)
    assert torch.equal(ws.expert_ids[:rows], flat.sort(stable=True).values)
    assert torch.equal(flat[ws.sorted_ids[:rows].long()], ws.expert_ids[:rows])
    assert ws.expert_offsets.tolist() == [0] + torch.bincount(flat, minlength=E).cumsum(0).tolist()
    assert {name: t.data_ptr() for name, t in ws.buffers.items()} == ptrs
    assert ws.allocated_bytes() == spec.total_bytes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nothing_row_sized_is_allocated_outside_the_workspace(dtype):
    """Besides its output, a call allocates only O(rows) integers and weights (what the activations formula charges
    per routed row) and O(E) counts: every [rows, ...] intermediate is the workspace's."""
    from sglang.srt.mem_plan.moe_activations import ROUTED_ROW_TEMPORARY_BYTES

    m = 256
    ws = MoEWorkspace(MoEWorkspaceSpec(m, TOP_K, E, K, N, str(dtype).replace("torch.", "")), "cpu")
    w13, w2 = weights(dtype=dtype)
    hidden = torch.randn(m, K).to(dtype)
    topk_weights, topk_ids = routing(m, CASES["random"](m))
    fused_experts_torch(hidden, w13, w2, topk_weights, topk_ids, ws)  # warm: one-time library allocations
    with torch.autograd.profiler.profile(profile_memory=True) as prof:
        out = fused_experts_torch(hidden, w13, w2, topk_weights, topk_ids, ws)
    allocated = sum(e.cpu_memory_usage for e in prof.function_events if e.cpu_memory_usage > 0 and not e.cpu_children)
    budget = out.numel() * out.element_size() + m * TOP_K * ROUTED_ROW_TEMPORARY_BYTES + 64 * (E + 1)
    assert allocated <= budget, (allocated, budget)


def test_row_pieces_tile_each_group_in_powers_of_two():
    for lo, count in [(0, 1), (5, 2), (7, 300), (0, 256), (1000, 2047), (3, 16384)]:
        pieces = row_pieces(lo, lo + count, True)
        assert pieces[0][0] == lo and pieces[-1][1] == lo + count
        assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))
        sizes = [hi - start for start, hi in pieces]
        assert all(size & (size - 1) == 0 for size in sizes) and sizes == sorted(sizes, reverse=True)
        assert len(pieces) == bin(count).count("1")
    assert row_pieces(7, 307, False) == [(7, 307)]


def test_bf16_calls_with_new_routings_leave_memory_where_it_was():
    """torch's bf16 GEMMs on a CPU (oneDNN) keep state per row count; every routing gives the experts new row counts,
    so one GEMM per expert group grew RSS by ~15 MB over these 20 calls (K 1024, N 256). The power-of-two pieces
    reuse the shapes the warm-up calls built: no growth."""
    from sglang.srt.mem_plan.measure import cpu_current_rss_bytes, trim_cpu_heap

    k_dim, n, experts, m = 1024, 256, 8, 256
    g = torch.Generator().manual_seed(0)
    w13 = (torch.randn(experts, 2 * n, k_dim, generator=g) / k_dim**0.5).bfloat16()
    w2 = (torch.randn(experts, k_dim, n, generator=g) / n**0.5).bfloat16()
    ws = MoEWorkspace(MoEWorkspaceSpec(m, TOP_K, experts, k_dim, n, "bfloat16"), "cpu")
    hidden = torch.randn(m, k_dim, generator=g).bfloat16()

    def call(seed):
        logits = torch.randn(m, experts, generator=torch.Generator().manual_seed(seed))
        fused_experts_torch(hidden, w13, w2, *select_experts(logits, TOP_K, True), ws)

    with torch.inference_mode():
        for seed in range(4):  # warm: builds the piece shapes
            call(seed)
        trim_cpu_heap()
        before = cpu_current_rss_bytes()
        for seed in range(4, 24):
            call(seed)
        trim_cpu_heap()
    assert cpu_current_rss_bytes() - before < 4 * 2**20, (cpu_current_rss_bytes() - before) / 2**20


def test_workspace_too_small_is_refused():
    w13, w2 = weights()
    ids = CASES["random"](9)
    topk_weights, topk_ids = routing(9, ids)
    ws = MoEWorkspace(MoEWorkspaceSpec(8, TOP_K, E, K, N, "float32"), "cpu")
    with pytest.raises(ValueError, match="cannot take 9 tokens"):
        fused_experts_torch(torch.randn(9, K), w13, w2, topk_weights, topk_ids, ws)


@pytest.mark.parametrize("arch", ["qwen3_moe norm_topk_prob", "qwen3_moe", "mixtral"])
def test_router_matches_transformers(arch):
    from transformers import MixtralConfig, Qwen3MoeConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    torch.manual_seed(0)
    if arch == "mixtral":  # always renormalised
        hf, renormalize = MixtralTopKRouter(MixtralConfig(hidden_size=K, num_local_experts=8, num_experts_per_tok=3)), True
    else:
        renormalize = arch.endswith("norm_topk_prob")
        cfg = Qwen3MoeConfig(hidden_size=K, num_experts=8, num_experts_per_tok=3, norm_topk_prob=renormalize)
        hf = Qwen3MoeTopKRouter(cfg)
    with torch.no_grad():
        hf.weight.normal_()
    x = torch.randn(50, K)
    _, ref_weights, ref_ids = hf(x)
    got_weights, got_ids = select_experts(F.linear(x, hf.weight), 3, renormalize)
    assert got_weights.dtype == torch.float32 and got_ids.dtype == torch.int32
    assert torch.equal(got_ids.long(), ref_ids)
    torch.testing.assert_close(got_weights, ref_weights.float(), atol=0, rtol=0)
    sums = got_weights.sum(-1)
    assert torch.allclose(sums, torch.ones(50)) == renormalize


def test_loader_slices_each_expert_over_tp_ranks(monkeypatch):
    """Rank r holds rows [r*N/2, (r+1)*N/2) of gate and up, and those columns of down, for every expert; the two
    ranks' partial outputs sum to the one-rank output."""
    import sglang.srt.layers.moe.moe_layer as moe_layer
    from sglang.srt.layers.moe.moe_layer import FusedMoE, expert_checkpoint_target, QWEN_EXPERT_SHARDS

    g = torch.Generator().manual_seed(5)
    ckpt = {e: {p: torch.randn(*((K, N) if p == "down_proj" else (N, K)), generator=g)
                for p in ("gate_proj", "up_proj", "down_proj")} for e in range(E)}

    def build(tp, rank):
        monkeypatch.setattr(moe_layer, "get_tp_size", lambda: tp)
        monkeypatch.setattr(moe_layer, "get_tp_rank", lambda: rank)
        layer = FusedMoE(E, TOP_K, K, N, renormalize=True, reduce_results=False)
        params = dict(layer.named_parameters())
        for e, projs in ckpt.items():
            for p, w in projs.items():
                target, expert, shard = expert_checkpoint_target(f"layers.0.mlp.experts.{e}.{p}.weight",
                                                                 QWEN_EXPERT_SHARDS)
                param = params[target.rsplit(".", 1)[1]]
                param.weight_loader(param, w, shard, expert)
        assert not layer.missing_shards()
        return layer

    x, logits = torch.randn(11, K), torch.randn(11, E)
    whole = build(1, 0)
    assert torch.equal(whole.w13_weight[2, :N], ckpt[2]["gate_proj"])
    assert torch.equal(whole.w13_weight[2, N:], ckpt[2]["up_proj"])
    assert torch.equal(whole.w2_weight[2], ckpt[2]["down_proj"])
    halves = [build(2, r) for r in (0, 1)]
    assert torch.equal(halves[1].w13_weight[4, : N // 2], ckpt[4]["gate_proj"][N // 2:])
    assert torch.equal(halves[1].w13_weight[4, N // 2:], ckpt[4]["up_proj"][N // 2:])
    assert torch.equal(halves[1].w2_weight[4], ckpt[4]["down_proj"][:, N // 2:])
    torch.testing.assert_close(halves[0](x, logits) + halves[1](x, logits), whole(x, logits), atol=1e-4, rtol=1e-4)


def test_layer_runs_inputs_longer_than_the_workspace_in_slices():
    from sglang.srt.layers.moe.moe_layer import FusedMoE

    layer = FusedMoE(E, TOP_K, K, N, renormalize=False)
    w13, w2 = weights()
    with torch.no_grad():
        layer.w13_weight.copy_(w13)
        layer.w2_weight.copy_(w2)
    x, logits = torch.randn(23, K), torch.randn(23, E)
    whole = layer(x, logits)
    layer.workspace = MoEWorkspace(layer.workspace_spec(8, "float32"), "cpu")
    torch.testing.assert_close(layer(x, logits), whole, atol=1e-6, rtol=1e-6)
