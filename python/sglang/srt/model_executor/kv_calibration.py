"""Startup calibration of fp8 KV scales (--kv-cache-dtype fp8_e4m3 / fp8_e5m2; every backend that reads fp8 reads
the scales: torch_native and Triton per (layer, KV head), FlashInfer per layer, so for it each layer takes the
largest of its heads' scales).

One prefill forward of KV_CALIBRATION_TOKENS seeded pseudo-random token ids into the real pool's first slots (free at
startup; every later reader finds them rewritten first) with the pool recording the amax of every (layer, KV head)'s
K and V; then scale = amax x FP8_SCALE_HEADROOM / fp8 max (quantized_kv_pool.calibrate_scales). Deterministic: the
same model and flags give the same scales. A checkpoint's own k_scale / v_scale tensors are not read yet.
"""

from __future__ import annotations

import logging

import torch

from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_plan.kv_quant import FP8_SCALE_HEADROOM
from sglang.srt.mem_plan.sizes import req_to_token_row_len
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

logger = logging.getLogger(__name__)

KV_CALIBRATION_TOKENS = 512
KV_CALIBRATION_SEED = 0


@torch.inference_mode()
def calibrate_kv_scales(runner) -> None:
    pool = runner.token_to_kv_pool
    if not getattr(pool, "is_fp8", False):
        return
    page = runner.server_args.page_size
    n = min(KV_CALIBRATION_TOKENS, runner.max_total_num_tokens, runner.chunked_prefill_size, runner.context_len - 1)
    device = runner.device
    r2t = ReqToTokenPool(1, req_to_token_row_len(runner.context_len), device)
    backend = runner._attention_backend(r2t, pool, 1, 0)
    slots = torch.arange(page, page + n, dtype=torch.int64, device=device)
    r2t.req_to_token[1, :n] = slots
    gen = torch.Generator().manual_seed(KV_CALIBRATION_SEED)
    ids = torch.randint(0, runner.model_config.vocab_size, (n,), generator=gen, dtype=torch.int64).to(device)
    fb = ForwardBatch(
        forward_mode=ForwardMode.EXTEND, batch_size=1, input_ids=ids,
        positions=torch.arange(n, dtype=torch.int64, device=device),
        req_pool_indices=torch.tensor([1], device=device), seq_lens=torch.tensor([n], device=device),
        out_cache_loc=slots, seq_lens_cpu=[n], extend_prefix_lens_cpu=[0], extend_seq_lens_cpu=[n],
        extend_prefix_lens=torch.tensor([0], device=device), extend_seq_lens=torch.tensor([n], device=device),
        req_to_token_pool=r2t, token_to_kv_pool=pool, attn_backend=backend,
    )
    pool.calibrating = True
    try:
        backend.init_forward_metadata(fb)
        runner.model.forward(ids, fb.positions, fb)
    finally:
        source = f"calibrated at startup: amax of {n} seeded random tokens x {FP8_SCALE_HEADROOM:g} / fp8 max"
        pool.calibrate_scales(source + ", per (layer, KV head)")
    if pool.is_fp8 and getattr(backend, "per_layer_kv_scales", False):  # the kernel takes one scale per layer
        pool.load_scales(pool.fixed["k_scale"].amax(1), pool.fixed["v_scale"].amax(1),
                         source + f", per layer (the largest of its KV heads': {backend.backend_name} takes one)")
    logger.info("KV cache %s scales: %s", pool.kv_format, pool.scale_info())
