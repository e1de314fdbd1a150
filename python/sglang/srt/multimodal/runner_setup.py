"""init_multimodal(runner): the multimodal half of the runner's Measure step, before the plan.

For a model with a processor and a `profile_encoder` hook it sets on the runner:
    mm_processor              image_data -> MultimodalInputs (the offline Engine calls it; the server builds its own)
    encoder_reserve_bytes     the plan's encoder term: --encoder-mem-reserve, else MEASURED -- the peak of one
                              encoder call on encoder_batch_size largest-size images on the real device
    encoder_reserve_source    "declared" (explicit) / "measured"
    mm_embedding_cache_bytes  the plan's mm_embedding_cache term (--mm-embedding-cache-mb)
    mm_embedding_cache        MultiModalEmbeddingCache, shared with the model
    encoder_admission         EncoderAdmission for the scheduler (cost of one image, capacity = the reservation)
Text-only models get zeros and Nones. The profile runs before the language model's activation profile (see
model_runner.py) so the encoder's peak is not hidden by memory the LM profile freed but the process still holds.
"""

from __future__ import annotations

import logging

from sglang.srt.mem_plan.encoder import EncoderBudget, encoder_reservation_bytes
from sglang.srt.mem_plan.units import MiB

logger = logging.getLogger(__name__)


def init_multimodal(runner) -> None:
    from sglang.srt.multimodal.processors import get_mm_processor

    sa = runner.server_args
    runner.mm_processor = None
    runner.mm_embedding_cache = None
    runner.encoder_admission = None
    runner.encoder_reserve_bytes = 0
    runner.encoder_reserve_source = "declared"
    runner.encoder_reserve_detail = ""
    runner.mm_embedding_cache_bytes = 0
    model = runner.model
    if not hasattr(model, "profile_encoder"):
        return
    processor = get_mm_processor(runner.model_config.architecture, runner.model_config.hf_config,
                                 runner.model_path, sa)
    if processor is None:
        return
    from sglang.srt.multimodal.embedding_cache import MultiModalEmbeddingCache
    from sglang.srt.multimodal.encoder_admission import EncoderAdmission

    runner.mm_processor = processor
    bs = sa.encoder_batch_size
    shape = processor.max_pixel_values_shape
    if sa.encoder_mem_reserve is None:
        reserve = model.profile_encoder(bs, shape, runner.device)
        cost = max(reserve // bs, 1)
        reserve = max(reserve, cost * bs)
        runner.encoder_reserve_source = "measured"
        runner.encoder_reserve_detail = f"peak of {bs} image(s) of {processor.max_tokens_per_image} tokens"
    else:
        reserve = encoder_reservation_bytes(None, bs, sa.encoder_mem_reserve)
        cost = max(model.profile_encoder(1, shape, runner.device), 1)  # the admission unit: one image
        runner.encoder_reserve_detail = (f"--encoder-mem-reserve; one image of {processor.max_tokens_per_image} "
                                         f"tokens peaks at {cost:,} B")
    runner.encoder_reserve_bytes = reserve

    runner.mm_embedding_cache_bytes = sa.mm_embedding_cache_mb * MiB
    runner.mm_embedding_cache = MultiModalEmbeddingCache(runner.mm_embedding_cache_bytes)
    model.embedding_cache = runner.mm_embedding_cache
    model.encoder_batch_size = bs
    runner.encoder_admission = EncoderAdmission(EncoderBudget(reserve), cost, runner.mm_embedding_cache)
    logger.info("Encoder reservation %.1f MiB (%s; %d image(s) per prefill batch, %.1f MiB each); "
                "embedding cache %d MiB", reserve / MiB, runner.encoder_reserve_source,
                runner.encoder_admission.max_images, cost / MiB, sa.mm_embedding_cache_mb)
