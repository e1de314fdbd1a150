"""What a MoE block adds to the activation peak of a forward (the `activations` term, model_shapes.activation_bytes).

The routed experts' row-sized buffers are the moe_workspace term (moe_sizes.py), allocated before the profile forward,
so what is left for the activations term is:

  routing, per token      the router logits upcast to fp32 and their softmax, per expert (ROUTER_BYTES_PER_EXPERT);
                          per routed row (token, expert) the fp32 weight, topk's int64 id and its int32 copy, the
                          sort's int64 order, the row's int32 token, its gathered fp32 weight and that weight in the
                          activation dtype (ROUTED_ROW_TEMPORARY_BYTES; layers/moe/router.py, fused_moe_torch.py).
                          Live tensors: model_shapes scales them with the rest by its temporaries factor.
  first call, once (CPU)  the library state the first MoE block of a process builds and keeps: the router GEMM's
                          (oneDNN in bf16, MKL in fp32) setup and JIT code, topk / sort / bincount scratch, and on the
                          torch path in bf16 the oneDNN primitives of the expert GEMMs, one per row-count shape
                          (fused_moe_torch runs each expert's rows in power-of-two pieces so that there are at most
                          log2(M k) + 1 of them per GEMM; one GEMM per row count kept ~0.65 MB per new count and grew
                          a 16-layer model's first 2,048-token forward by 517 MB). Not per token, not per layer.

MOE_FIRST_CALL_BYTES, by implementation (moe_sizes.moe_impl_for), from the peak RSS of starts on a 2-core AVX-512
BF16 EPYC (the server's measurement: VmHWM over one profile forward at the chunk, here the fixtures' 1,024-token
context, the KV pages it writes resident before), as what each MoE checkpoint measured beyond the formula without
this term:
  torch   random Qwen3-MoE / Mixtral / Qwen2-MoE of moe_fixtures (hidden 64): fp32 +1.7 to +5.5 MB, bf16 (Mixtral,
          N 48) +23.2 MB, bf16 with SGLANG_CPU_KERNELS=0 (every layer on torch) +24.7 to +26.7 MB; one torch-path
          fused_experts call alone, first call: 16 MB (hidden 64) / 28 MB (hidden 1024, 64 experts, top 8) in bf16
  cpu     the sgl-kernel kernel (bf16): the same Qwen3-MoE / Qwen2-MoE +10.6 / +9.0 MB
so 32 MiB for the torch path and 16 MiB for the kernel. The benchmark proportions (hidden 1024, 64 experts, top 8,
expert intermediate 256, 2 and 16 layers) measure well under the formula with these terms (docs/moe.md). GPUs
measure the peak in the caching allocator, where library state does not show: 0 there.
"""

from __future__ import annotations

from typing import Optional

from sglang.srt.mem_plan.units import MiB

ROUTER_LOGIT_BYTES = 4  # fp32 router logits per token per expert
ROUTER_BYTES_PER_EXPERT = 2 * ROUTER_LOGIT_BYTES  # the fp32 logits and their softmax
ROUTED_ROW_TEMPORARY_BYTES = 4 + 8 + 4 + 8 + 4 + 4 + 4  # per (token, expert) row: see the module docstring
MOE_FIRST_CALL_BYTES = {"torch": 32 * MiB, "cpu": 16 * MiB, "triton": 0}
MOE_FIRST_CALL_DEVICES = ("cpu",)  # where the activation peak is peak RSS, which sees library state


def moe_routing_bytes(num_tokens: int, num_experts: int, top_k: int) -> int:
    """Live routing temporaries of one MoE block over num_tokens tokens (before the temporaries factor)."""
    return num_tokens * (num_experts * ROUTER_BYTES_PER_EXPERT + top_k * ROUTED_ROW_TEMPORARY_BYTES)


def moe_first_call_bytes(impl: Optional[str], device: str) -> int:
    """The once-per-process library state of the first MoE block call with `impl` on `device` (0 off CPU)."""
    if device not in MOE_FIRST_CALL_DEVICES:
        return 0
    return MOE_FIRST_CALL_BYTES[impl or "torch"]
