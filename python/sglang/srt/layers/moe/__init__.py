"""Mixture-of-experts layers: a router picks k of E experts per token, the experts' gated MLPs run grouped by expert.

    router.py           select_experts: router logits -> softmax (fp32) -> top-k -> optional renormalisation
    fused_moe_torch.py  fused_experts_torch: the reference implementation of the shared fused_experts signature
    dispatch.py         the one place an implementation is chosen (torch now; the Triton GPU and CPU kernels plug in)
    workspace.py        MoEWorkspace: the buffers of mem_plan/moe_sizes.py, allocated once, shared by every layer
    moe_layer.py        FusedMoE: stacked expert weights (tensor parallel over the intermediate size, or whole
                        experts per rank under --ep-size) and loaders

The shared signature (every implementation keeps it exactly):
    fused_experts(hidden [M, K], w13 [E, 2N, K], w2 [E, K, N], topk_weights [M, k] fp32, topk_ids [M, k] int,
                  workspace=None) -> [M, K]
    w13 rows [0, N) are the gate projection, [N, 2N) the up projection; out[m] = sum_j topk_weights[m, j] *
    (silu(gate) * up)(hidden[m]; e = topk_ids[m, j]) @ w2[e].T, where an id outside [0, E) (-1: an expert another
    rank holds under --ep-size) contributes nothing and costs no GEMM rows
"""
