"""setup_multimodal(...) -> MultimodalSetup: the multimodal half of the runner's Measure step, before the plan.

For a model with a processor and a `profile_encoder` hook the returned value holds:
    mm_processor              image_data -> MultimodalInputs (the offline Engine calls it; the server builds its own)
    encoder_reserve_bytes     the plan's encoder term: --encoder-mem-reserve, else MEASURED -- the peak of one
                              encoder call on encoder_batch_size largest-size images on the real device
    encoder_reserve_source    "declared" (explicit) / "measured"
    mm_embedding_cache_bytes  the plan's mm_embedding_cache term (--mm-embedding-cache-mb)
    mm_embedding_cache        MultiModalEmbeddingCache, shared with the model
    encoder_admission         EncoderAdmission for the scheduler (cost of one image, capacity = the reservation)
Text-only models get TEXT_ONLY (zeros and Nones). The profile runs before the language model's activation profile
(see model_runner.py) so the encoder's peak is not hidden by memory the LM profile freed but the process still holds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

from sglang.srt.mem_plan.build import mm_embedding_cache_bytes
from sglang.srt.mem_plan.encoder import EncoderBudget, encoder_reservation_bytes
from sglang.srt.mem_plan.units import MiB

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MultimodalSetup:
    mm_processor: Optional[Any] = None
    mm_embedding_cache: Optional[Any] = None
    encoder_admission: Optional[Any] = None
    encoder_reserve_bytes: int = 0
    encoder_reserve_source: str = "declared"
    encoder_reserve_detail: str = ""
    mm_embedding_cache_bytes: int = 0


TEXT_ONLY = MultimodalSetup()


def setup_multimodal(model, model_config, model_path: str, server_args, device: str) -> MultimodalSetup:
    """Profile the encoder and build the processor, embedding cache and admission for a multimodal model."""
    from sglang.srt.multimodal.processors import get_mm_processor

    sa = server_args
    if not hasattr(model, "profile_encoder"):
        return TEXT_ONLY
    processor = get_mm_processor(model_config.architecture, model_config.hf_config, model_path, sa)
    if processor is None:
        return TEXT_ONLY
    from sglang.srt.multimodal.embedding_cache import MultiModalEmbeddingCache
    from sglang.srt.multimodal.encoder_admission import EncoderAdmission

    bs = sa.encoder_batch_size
    shape = processor.max_pixel_values_shape
    if sa.encoder_mem_reserve is None:
        reserve = model.profile_encoder(bs, shape, device)
        cost = max(reserve // bs, 1)
        reserve = max(reserve, cost * bs)
        source = "measured"
        detail = f"peak of {bs} image(s) of {processor.max_tokens_per_image} tokens"
    else:
        reserve = encoder_reservation_bytes(None, bs, sa.encoder_mem_reserve)
        cost = max(model.profile_encoder(1, shape, device), 1)  # the admission unit: one image
        source = "declared"
        detail = f"--encoder-mem-reserve; one image of {processor.max_tokens_per_image} tokens peaks at {cost:,} B"

    cache_bytes = mm_embedding_cache_bytes(sa)
    cache = MultiModalEmbeddingCache(cache_bytes)
    model.embedding_cache = cache
    model.encoder_batch_size = bs
    admission = EncoderAdmission(EncoderBudget(reserve), cost, cache)
    logger.info("Encoder reservation %.1f MiB (%s; %d image(s) per prefill batch, %.1f MiB each); "
                "embedding cache %d MiB", reserve / MiB, source, admission.max_images, cost / MiB,
                sa.mm_embedding_cache_mb)
    return MultimodalSetup(processor, cache, admission, reserve, source, detail, cache_bytes)
