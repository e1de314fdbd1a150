"""Expert parallelism in one process: FusedMoE built as each rank of (tp, ep) = (2, 2) and (4, 2) with the TP
accessors stubbed, and the fused_experts contract EP relies on (an id outside [0, E) contributes nothing).

- Each rank reads exactly its own experts' tensors (its columns of them), nothing of another group's: the loader is
  fed recording stand-ins of CheckpointSlice.
- The ranks' partial outputs sum to the one-rank layer's output (what the MoE block's all-reduce computes).
- The torch path and, where it loads, the CPU kernel skip ids -1 and >= E; the Triton kernel does too under
  TRITON_INTERPRET=1 (a child process: moe_interpreted_run.py says why), with NaN left in its workspace, which a
  skipped row must never read.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import sglang.srt.layers.moe.moe_layer as moe_layer
from sglang.srt.layers.moe.fused_moe_torch import fused_experts_torch
from sglang.srt.layers.moe.moe_layer import QWEN_EXPERT_SHARDS, FusedMoE, expert_checkpoint_target
from sglang.srt.layers.moe.workspace import MoEWorkspace
from sglang.srt.mem_plan.moe_sizes import MoEWorkspaceSpec
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=12, suite="cpu")

E, K, N, TOP_K = 8, 64, 32, 3


class RecordingSlice:
    """A checkpoint tensor not read yet (as weight_utils.CheckpointSlice): records each read as (name, dim, start,
    length)."""

    def __init__(self, name, tensor, reads):
        self.name, self.tensor, self.reads, self.shape = name, tensor, reads, tensor.shape

    def narrow(self, dim, start, length):
        self.reads.append((self.name, dim, start, length))
        return self.tensor.narrow(dim, start, length)


def checkpoint(seed=5):
    g = torch.Generator().manual_seed(seed)
    return {e: {p: torch.randn(*((K, N) if p == "down_proj" else (N, K)), generator=g) / 8
                for p in ("gate_proj", "up_proj", "down_proj")} for e in range(E)}


def build_rank(monkeypatch, ckpt, tp, ep, rank):
    """One rank's FusedMoE, loaded from every checkpoint tensor; returns (layer, reads)."""
    monkeypatch.setattr(moe_layer, "get_tp_size", lambda: tp)
    monkeypatch.setattr(moe_layer, "get_tp_rank", lambda: rank)
    monkeypatch.setattr(moe_layer, "get_ep_size", lambda: ep)
    layer = FusedMoE(E, TOP_K, K, N, renormalize=True, reduce_results=False)
    params, reads = dict(layer.named_parameters()), []
    for e, projs in ckpt.items():
        for p, w in projs.items():
            name = f"layers.0.mlp.experts.{e}.{p}.weight"
            target, expert, shard = expert_checkpoint_target(name, QWEN_EXPERT_SHARDS)
            param = params[target.rsplit(".", 1)[1]]
            param.weight_loader(param, RecordingSlice((e, p), w, reads), shard, expert)
    return layer, reads


@pytest.mark.parametrize("tp,ep", [(2, 2), (4, 2)])
def test_each_rank_reads_only_its_experts_and_the_ranks_sum_to_one(monkeypatch, tp, ep):
    ckpt = checkpoint()
    whole, _ = build_rank(monkeypatch, ckpt, 1, 1, 0)
    x, logits = torch.randn(13, K), torch.randn(13, E)
    total = torch.zeros(13, K)
    moe_tp, per_group = tp // ep, E // ep
    cols = N // moe_tp
    for rank in range(tp):
        layer, reads = build_rank(monkeypatch, ckpt, tp, ep, rank)
        group, shard = rank // moe_tp, rank % moe_tp
        mine = range(group * per_group, (group + 1) * per_group)
        assert layer.w13_weight.shape == (per_group, 2 * cols, K) and layer.w2_weight.shape == (per_group, K, cols)
        # exactly its experts' three projections, each once and only its columns
        want = sorted([((e, p), 1 if p == "down_proj" else 0, shard * cols, cols)
                       for e in mine for p in ("gate_proj", "up_proj", "down_proj")])
        assert sorted(reads) == want, (rank, reads)
        assert not layer.missing_shards()
        last = mine[-1]  # local expert per_group - 1 is global expert `last`
        assert torch.equal(layer.w13_weight[-1, :cols], ckpt[last]["gate_proj"][shard * cols:(shard + 1) * cols])
        assert torch.equal(layer.w13_weight[-1, cols:], ckpt[last]["up_proj"][shard * cols:(shard + 1) * cols])
        assert torch.equal(layer.w2_weight[-1], ckpt[last]["down_proj"][:, shard * cols:(shard + 1) * cols])
        total += layer(x, logits)
    torch.testing.assert_close(total, whole(x, logits), atol=1e-5, rtol=1e-5)


def test_local_expert_ids_and_missing_shards(monkeypatch):
    ckpt = checkpoint()
    layer, _ = build_rank(monkeypatch, {e: ckpt[e] for e in range(E) if e != 5}, 2, 2, 1)
    assert layer.first_expert == 4 and layer.num_local_experts == 4
    ids = torch.tensor([[0, 3, 4], [7, 5, 1]], dtype=torch.int32)
    assert layer.local_expert_ids(ids).tolist() == [[-1, -1, 0], [3, 1, -1]]
    assert {e for e, _ in layer.missing_shards()} == {5}  # global ids, of this rank's experts only
    with pytest.raises(ValueError, match="outside the model's 8 experts"):
        layer.weight_loader(layer.w2_weight, ckpt[0]["down_proj"], "w2", 8)


def brute_force(hidden, w13, w2, topk_weights, topk_ids):
    """float64, one token and one expert at a time; ids outside [0, E) skipped."""
    out = torch.zeros(hidden.shape, dtype=torch.float64)
    n = w13.shape[1] // 2
    for m in range(hidden.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[m, j])
            if 0 <= e < w13.shape[0]:
                h = hidden[m].double()
                act = F.silu(w13[e, :n].double() @ h) * (w13[e, n:].double() @ h)
                out[m] += float(topk_weights[m, j]) * (w2[e].double() @ act)
    return out


def foreign_routing(m, seed=3):
    """Ids of a rank holding global experts [4, 8) of 8 under ep=2, mapped as the layer maps them: each token's 3
    experts, ~half of them -1; token 0 has only foreign experts; a stray id E too."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:TOP_K] for _ in range(m)]).to(torch.int32) - E // 2
    ids[ids < 0] = -1
    ids[0] = -1
    ids[1, 0] = E // 2  # == the local expert count: outside [0, E_l) too
    weights = torch.rand(m, TOP_K, generator=g) + 0.1
    return ids, weights / weights.sum(1, keepdim=True)


def local_weights(seed=4, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return ((torch.randn(E // 2, 2 * N, K, generator=g) / K**0.5).to(dtype),
            (torch.randn(E // 2, K, N, generator=g) / N**0.5).to(dtype))


def test_torch_path_skips_other_ranks_experts():
    w13, w2 = local_weights()
    hidden = torch.randn(21, K)
    ids, weights = foreign_routing(21)
    ref = brute_force(hidden, w13, w2, weights, ids)
    ws = MoEWorkspace(MoEWorkspaceSpec(32, TOP_K, E // 2, K, N, "float32"), "cpu")  # as planned for E_l experts
    for buf in ws.buffers.values():  # skipped rows must never be read: poison the buffers
        if buf.is_floating_point():
            buf.fill_(float("nan"))
    out = fused_experts_torch(hidden, w13, w2, weights, ids, ws)
    assert torch.all(out[0] == 0)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    assert torch.all(fused_experts_torch(hidden, w13, w2, weights, torch.full_like(ids, -1), ws) == 0)


def test_cpu_kernel_skips_other_ranks_experts():
    from sglang.srt.layers.moe.fused_moe_cpu import fused_experts_cpu, prepack_moe_weights_

    w13, w2 = local_weights(dtype=torch.bfloat16)
    w13, w2 = torch.nn.Parameter(w13, requires_grad=False), torch.nn.Parameter(w2, requires_grad=False)
    hidden = torch.randn(21, K).to(torch.bfloat16)
    ids, weights = foreign_routing(21)
    ref = brute_force(hidden, w13, w2, weights, ids)
    if not prepack_moe_weights_(w13, w2):
        pytest.skip("the sgl-kernel CPU MoE kernel does not load here")
    out = fused_experts_cpu(hidden, w13, w2, weights, ids)
    assert torch.all(out[0] == 0)
    assert (out.double() - ref).abs().max() <= 2e-2 * ref.abs().max()


TRITON_CHILD = """
import json, torch
from sglang.srt.layers.moe.triton_ops.fused_moe import FusedMoeWorkspace, fused_experts_triton
from test_moe_ep_layer import E, K, N, TOP_K, brute_force, foreign_routing, local_weights
w13, w2 = local_weights()
hidden = torch.randn(21, K, generator=torch.Generator().manual_seed(9))
ids, weights = foreign_routing(21)
ws = FusedMoeWorkspace.allocate(32, TOP_K, E // 2, N, K, torch.float32, "cpu")
ws.intermediate1.fill_(float("nan"))
ws.intermediate2.fill_(float("nan"))
out = fused_experts_triton(hidden, w13, w2, weights, ids, ws)
ref = brute_force(hidden, w13, w2, weights, ids)
print("RESULT_JSON:" + json.dumps({"err": float((out.double() - ref).abs().max() / ref.abs().max()),
                                   "token0": float(out[0].abs().max())}))
"""


def test_triton_kernel_skips_other_ranks_experts_interpreted():
    pytest.importorskip("triton")
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", TRITON_CHILD], env=env, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("RESULT_JSON:")]
    assert run.returncode == 0 and lines, run.stderr[-4000:]
    got = json.loads(lines[-1][len("RESULT_JSON:"):])
    assert got["token0"] == 0.0
    assert got["err"] <= 1e-5, got
