"""Startup calibration of fp8 KV scales (--kv-cache-dtype fp8_e4m3 / fp8_e5m2; every backend that reads fp8 reads
the scales: torch_native and Triton per (layer, KV head), FlashInfer per layer, so for it each layer takes the
largest of its heads' scales) and of int4's key channel multipliers (--kv-cache-dtype int4: from the key and query
channel energies of every (layer, KV head) over the same forward; the queries through recording_queries, around the
attention backend).

One prefill forward of KV_CALIBRATION_TOKENS seeded pseudo-random token ids into the real pool's first slots (free at
startup; every later reader finds them rewritten first) with the pool recording the amax of every (layer, KV head)'s
K and V; then scale = amax x FP8_SCALE_HEADROOM / fp8 max (quantized_kv_pool.calibrate_scales). Deterministic: the
same model and flags give the same scales.

A checkpoint that carries its own fp8 KV scales (`model.layers.<i>.self_attn.k_scale` / `v_scale`, one per layer or
per KV head: mem_plan/kv_quant.kv_scale_name) gives them to the pool instead (QuantizedKVPool.load_scales), and no
calibration forward runs; /server_info's kv_cache.scales names the source. Every layer must have both, else startup
fails naming the first one missing.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Optional, Tuple

import torch

from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_plan.kv_quant import FP8_SCALE_HEADROOM, kv_scale_name
from sglang.srt.mem_plan.sizes import req_to_token_row_len
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

logger = logging.getLogger(__name__)

KV_CALIBRATION_TOKENS = 512
KV_CALIBRATION_SEED = 0


def checkpoint_kv_scales(model_dir: str, layer_num: int) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """The checkpoint's fp8 KV scales as (k [layer_num, n], v [layer_num, n]) fp32 (n = 1 per layer, or KV heads), or
    None when it has none. ValueError when some layer lacks one (a partial set is no calibration)."""
    from safetensors import safe_open

    from sglang.srt.model_loader.weight_utils import list_safetensors_files

    found = {}
    for file in list_safetensors_files(model_dir):
        with safe_open(file, framework="pt", device="cpu") as f:
            for name in f.keys():
                hit = kv_scale_name(name)
                if hit is not None and hit[0] < layer_num:
                    found[hit] = f.get_tensor(name).to(torch.float32).reshape(-1)
    if not found:
        return None
    for layer in range(layer_num):
        for part in ("k", "v"):
            if (layer, part) not in found:
                raise ValueError(f"{model_dir}: the checkpoint has fp8 KV scales but no "
                                 f"model.layers.{layer}.self_attn.{part}_scale; give every layer both or none")
    return tuple(torch.stack([found[(layer, part)] for layer in range(layer_num)]) for part in ("k", "v"))


def _rank_heads(scale: torch.Tensor, head_num: int, tp_rank: int) -> torch.Tensor:
    """[layers, n] -> this rank's [layers, 1 or head_num] (per-head scales of all KV heads are sliced per TP rank)."""
    n = scale.shape[1]
    if n in (1, head_num):
        return scale
    if n % head_num == 0:
        return scale[:, tp_rank * head_num : (tp_rank + 1) * head_num]
    raise ValueError(f"checkpoint fp8 KV scales have {n} entries per layer; expected 1 or the KV heads")


def calibration_source(pool, n: int) -> str:
    if pool.is_fp8:
        return f"calibrated at startup: amax of {n} seeded random tokens x {FP8_SCALE_HEADROOM:g} / fp8 max, per (layer, KV head)"
    return f"per token; key multipliers calibrated at startup over {n} seeded random tokens, per (layer, KV head)"


@contextlib.contextmanager
def recording_queries(backend, pool):
    """While inside: every extend hands its queries to pool.record_query (int4's key multipliers need E[q^2])."""
    forward_extend = backend.forward_extend

    def recording(q, k, v, layer, forward_batch, save_kv_cache=True):
        pool.record_query(layer.layer_id, q.reshape(q.shape[0], -1, pool.head_dim))
        return forward_extend(q, k, v, layer, forward_batch, save_kv_cache)

    backend.forward_extend = recording
    try:
        yield
    finally:
        del backend.forward_extend  # the class's method again


@torch.inference_mode()
def calibrate_kv_scales(runner) -> None:
    pool = runner.token_to_kv_pool
    if not getattr(pool, "needs_calibration", False):
        return
    scales = checkpoint_kv_scales(runner.model_config.model_path, pool.layer_num) if pool.is_fp8 else None
    if scales is not None:
        rank = getattr(runner, "tp_rank", 0)
        pool.load_scales(*(_rank_heads(s, pool.head_num, rank).to(pool.device) for s in scales),
                         source="checkpoint k_scale / v_scale, plain keys", keys_turned=False)
        logger.info("KV cache %s scales: %s", pool.kv_format, pool.scale_info())
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
        with recording_queries(backend, pool):
            runner.model.forward(ids, fb.positions, fb)
    finally:
        source = calibration_source(pool, n)
        pool.calibrate_scales(source)
    if pool.is_fp8 and getattr(backend, "per_layer_kv_scales", False):  # the kernel takes one scale per layer
        pool.load_scales(pool.fixed["k_scale"].amax(1), pool.fixed["v_scale"].amax(1),
                         source + f", per layer (the largest of its KV heads': {backend.backend_name} takes one)")
    logger.info("KV cache %s scales: %s", pool.kv_format, pool.scale_info())
