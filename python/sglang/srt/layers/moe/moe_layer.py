"""FusedMoE: the routed experts of one MoE block as two stacked weights, loaded from HF per-expert tensors.

    w13_weight  [E_l, 2N_r, K]  rows [0, N_r) local expert l's gate projection, [N_r, 2N_r) its up projection
    w2_weight   [E_l, K, N_r]   local expert l's down projection
Which experts and columns a rank holds (distributed/parallel_state.moe_parallel_layout; moe_tp = tp / ep):
    tensor parallel (--ep-size 1)   E_l = E, N_r = N / tp: every expert, columns [r*N_r, (r+1)*N_r) on rank r
    expert parallel (--ep-size ep)  E_l = E / ep: global experts [g*E_l, (g+1)*E_l) on the ranks of expert group
                                    g = r // moe_tp, each expert's columns split over that group's moe_tp ranks
                                    (ep = tp: whole experts, N_r = N)
Every (expert, column shard) lives on exactly one rank, so a rank's output is a partial sum and one all-reduce per
MoE block completes it (here, or in the block that adds a shared expert's partial sum first: reduce_results=False).
Under EP the router is replicated: every rank routes every token over all E experts, then maps the chosen global ids
to its local ones, an id held by another group becoming -1, which every fused_experts implementation skips (torch,
Triton and CPU kernel alike: layers/moe/__init__.py), so a rank computes only the rows routed to its own experts.

Checkpoint tensors (expert_checkpoint_target maps their names):
    Qwen2-MoE / Qwen3-MoE   mlp.experts.{e}.gate_proj / up_proj / down_proj.weight      shards w1 / w3 / w2
    Mixtral                 block_sparse_moe.experts.{e}.w1 / w3 / w2.weight           (the same shards)
gate and up ([N, K]) give rows [s*N_r, (s+1)*N_r), down ([K, N]) its columns (s: the rank's column shard); a rank
reads only those, and only for its own experts: another group's expert tensors are never read.

--quantization gguf / w8a8_int8 (CPU, tp = 1): the two weights are block-quantized instead (quant_experts.py), loaded
from the same names and shards, and run the 'cpu' implementation.

forward(hidden [M, K], router_logits [M, E]) routes (router.py) and runs the implementation chosen once at build
(dispatch.py) in the workspace the runner attached (attach_moe_workspace), at most workspace.max_tokens tokens per
call: a longer input (a decode batch of more requests than the chunk) runs in slices.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from sglang.srt.distributed.communication_op import tp_all_reduce
from sglang.srt.distributed.parallel_state import get_ep_size, get_tp_rank, get_tp_size, moe_parallel_layout
from sglang.srt.layers.linear import default_weight_loader
from sglang.srt.layers.moe.dispatch import get_fused_experts
from sglang.srt.layers.moe.quant_experts import QUANT_EXPERTS_IMPL, expert_bits, quant_experts_method
from sglang.srt.layers.moe.router import select_experts
from sglang.srt.layers.moe.workspace import MoEWorkspace
from sglang.srt.mem_plan.moe_sizes import SORT_BLOCK_M, TORCH_SORT_BLOCK_M, MoEWorkspaceSpec, moe_impl_for

GATE, UP, DOWN = "w1", "w3", "w2"
# checkpoint projection name -> shard
QWEN_EXPERT_SHARDS = {"gate_proj": GATE, "up_proj": UP, "down_proj": DOWN}
MIXTRAL_EXPERT_SHARDS = {"w1": GATE, "w3": UP, "w2": DOWN}
_EXPERT_NAME = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<expert>\d+)\.(?P<proj>\w+)\.weight$")


def expert_checkpoint_target(name: str, shards: Dict[str, str]) -> Optional[Tuple[str, int, str]]:
    """(parameter name, expert id, shard) of a per-expert checkpoint tensor, e.g. 'model.layers.0.mlp.experts.3.
    up_proj.weight' -> ('model.layers.0.mlp.experts.w13_weight', 3, 'w3'); None for any other tensor."""
    m = _EXPERT_NAME.match(name)
    if m is None or m.group("proj") not in shards:
        return None
    shard = shards[m.group("proj")]
    param = "w2_weight" if shard == DOWN else "w13_weight"
    return f"{m.group('prefix')}.{param}", int(m.group("expert")), shard


class FusedMoE(nn.Module):
    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int, renormalize: bool,
                 reduce_results: bool = True):
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        self.layout = layout = moe_parallel_layout(self.tp_size, self.tp_rank, get_ep_size())
        if num_experts % layout.ep_size or intermediate_size % layout.moe_tp_size:
            raise ValueError(f"--tp-size {self.tp_size} / --ep-size {layout.ep_size}: {num_experts} experts of "
                             f"intermediate size {intermediate_size} do not split over {layout.ep_size} expert groups "
                             f"of {layout.moe_tp_size} ranks")
        self.num_experts, self.top_k, self.hidden_size = num_experts, top_k, hidden_size  # E: what the router picks
        self.num_local_experts = num_experts // layout.ep_size  # E_l
        self.first_expert = layout.ep_rank * self.num_local_experts  # global id of local expert 0
        self.intermediate_size = intermediate_size // layout.moe_tp_size  # N_r
        self.renormalize, self.reduce_results = renormalize, reduce_results
        self.workspace: Optional[MoEWorkspace] = None
        self._loaded: set = set()
        self._built_dtype = torch.get_default_dtype()  # the model dtype, the activations' (act_dtype)
        device = torch.empty(0).device  # where the model is being built (meta: as on a CPU)
        # --quantization: block-quantized experts (layers/moe/quant_experts.py) take the place of the dense weights
        # and run the 'cpu' implementation; None: dense experts
        self.quant_method = quant_experts_method(self, device)
        if self.quant_method is None:
            n, e_l = self.intermediate_size, self.num_local_experts
            self.w13_weight = nn.Parameter(torch.empty(e_l, 2 * n, hidden_size), requires_grad=False)
            self.w2_weight = nn.Parameter(torch.empty(e_l, hidden_size, n), requires_grad=False)
            self.w13_weight.weight_loader = self.weight_loader
            self.w2_weight.weight_loader = self.weight_loader
            # the implementation is chosen once, by the device the weights are built on
            self.impl = moe_impl_for(device.type)
            self.fused_experts = get_fused_experts(self.impl)

    @property
    def act_dtype(self) -> torch.dtype:
        """The activations' dtype: the dense experts' (as they are now), or the model's for quantized ones."""
        return self._built_dtype if self.quant_method is not None else self.w13_weight.dtype

    # ------------------------------------------------------------------ loading
    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str, expert_id: int) -> None:
        """Copy this rank's slice of global expert expert_id's checkpoint tensor (a tensor or a lazy CheckpointSlice);
        an expert of another expert group is skipped unread."""
        if shard_id not in (GATE, UP, DOWN):
            raise ValueError(f"unknown expert shard {shard_id!r}; expected {GATE}, {UP} or {DOWN}")
        if not 0 <= expert_id < self.num_experts:
            raise ValueError(f"checkpoint expert {expert_id} is outside the model's {self.num_experts} experts")
        local = expert_id - self.first_expert
        if not 0 <= local < self.num_local_experts:
            return
        n, start = self.intermediate_size, self.layout.moe_tp_rank * self.intermediate_size
        if shard_id == DOWN:
            default_weight_loader(param.data[local], loaded_weight.narrow(1, start, n))
        else:
            offset = 0 if shard_id == GATE else n
            default_weight_loader(param.data[local, offset: offset + n], loaded_weight.narrow(0, start, n))
        self._loaded.add((expert_id, shard_id))

    def missing_shards(self) -> List[Tuple[int, str]]:
        """(global expert, shard) pairs of this rank's experts no checkpoint tensor has filled."""
        held = range(self.first_expert, self.first_expert + self.num_local_experts)
        return [(e, s) for e in held for s in (GATE, UP, DOWN) if (e, s) not in self._loaded]

    # ------------------------------------------------------------------ forward
    def workspace_spec(self, max_tokens: int, act_dtype: str) -> MoEWorkspaceSpec:
        """The workspace this layer's implementation needs for max_tokens tokens (for tests; the runner sizes it from
        config.json by the same rule, mem_plan/build.moe_workspace)."""
        return MoEWorkspaceSpec(max_tokens, self.top_k, self.num_local_experts, self.hidden_size,
                                self.intermediate_size, act_dtype, SORT_BLOCK_M.get(self.impl, TORCH_SORT_BLOCK_M),
                                self.impl, *expert_bits(self))

    def use_impl(self, impl: str) -> None:
        """Run the experts with `impl` (the plan's choice, moe_sizes.moe_impl_for). The CPU kernel reads its expert
        weights packed: they are packed here, in place, once (layers/moe/fused_moe_cpu.py)."""
        if self.quant_method is not None and impl != QUANT_EXPERTS_IMPL:
            raise ValueError(f"quantized experts run the {QUANT_EXPERTS_IMPL!r} implementation, not {impl!r}")
        if impl == "cpu" and self.quant_method is None:
            from sglang.srt.layers.moe.fused_moe_cpu import prepack_moe_weights_

            if not prepack_moe_weights_(self.w13_weight, self.w2_weight):
                raise ValueError("the CPU MoE kernel cannot take this layer's expert weights (dtype or shape)")
        self.impl, self.fused_experts = impl, get_fused_experts(impl)

    def forward(self, hidden: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """hidden [M, K], router_logits [M, E] -> [M, K] (this rank's partial sum when reduce_results is False)."""
        topk_weights, topk_ids = select_experts(router_logits, self.top_k, self.renormalize)
        if self.layout.ep_size > 1:
            topk_ids = self.local_expert_ids(topk_ids)
        ws, w13, w2 = self.workspace, self.w13_weight, self.w2_weight
        step = ws.max_tokens if ws is not None else max(hidden.shape[0], 1)
        if hidden.shape[0] <= step:
            out = self.fused_experts(hidden, w13, w2, topk_weights, topk_ids, ws)
        else:
            out = torch.cat([self.fused_experts(hidden[i: i + step], w13, w2, topk_weights[i: i + step],
                                                topk_ids[i: i + step], ws)
                             for i in range(0, hidden.shape[0], step)])
        return tp_all_reduce(out) if self.reduce_results else out


    def local_expert_ids(self, topk_ids: torch.Tensor) -> torch.Tensor:
        """Global expert ids [M, k] -> this rank's w13 / w2 indices, -1 for an expert another group holds (skipped by
        every implementation). Device ops only: a CUDA graph captures it."""
        local = topk_ids - self.first_expert
        return local.masked_fill_((local < 0) | (local >= self.num_local_experts), -1)


def attach_moe_workspace(model: nn.Module, spec: Optional[MoEWorkspaceSpec], device) -> Optional[MoEWorkspace]:
    """Allocate the one workspace of `spec` and give it to every FusedMoE layer of model, which runs spec.impl from
    then on; None for a dense model. The spec is the plan's (mem_plan/build.moe_workspace), so the runner's
    allocation is the planned term and the implementation the planned one."""
    layers = [m for m in model.modules() if isinstance(m, FusedMoE)]
    if spec is None or not layers:
        if layers or spec is not None:
            raise ValueError(f"the plan's MoE workspace ({spec}) does not match the model's {len(layers)} MoE layers")
        return None
    for layer in layers:
        if layer.impl != spec.impl:
            layer.use_impl(spec.impl)
        want = layer.workspace_spec(spec.max_tokens, str(layer.act_dtype).replace("torch.", ""))
        if not spec.serves(want):
            raise ValueError(f"the plan's MoE workspace {spec} is not what this layer needs: {want}")
    workspace = MoEWorkspace(spec, device)
    for layer in layers:
        layer.workspace = workspace
    return workspace
