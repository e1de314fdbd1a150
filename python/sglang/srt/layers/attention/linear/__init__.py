"""Kernels of the layers that keep a fixed-size state per request instead of a KV cache (linear attention, SSMs).

causal_conv1d: the short depthwise causal convolution in front of Gated DeltaNet and Mamba-2 mixers.
gated_delta_rule: Qwen3-Next's Gated DeltaNet recurrence (chunked for extend, one recurrent step for decode).
mamba2_ssd: Mamba-2's state-space duality scan.

Every op takes a varlen batch (extend_lens, the tokens of request b contiguous in the flat token axis) and per
request its state from the state pool (mem_cache/linear_state_pool.py) with has_initial_state [B]: a request whose
flag is False starts from the zero state whatever its row holds (rows are not zeroed on free). Math is fp32 inside.
Each op file picks the Triton kernel on a CUDA / ROCm device and the torch form elsewhere.
"""
