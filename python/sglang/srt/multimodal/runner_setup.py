"""setup_multimodal(...) -> MultimodalSetup: the multimodal half of the runner's Measure step, before the plan.

A multimodal model exposes its encoders to this step in one of two ways:

    mm_encoder_probes(self) -> {modality: probe}       (per-modality; "image", "video", "audio")
        probe(work: mem_plan.encoder_inputs.EncoderWorkload, device: str) -> None runs that modality's encoder,
        exactly as serving does (same code path, embeddings and retained outputs included), on a synthetic input of
        the planned largest unit of work: work.vision.grid_thw patches x work.vision.num_inputs inputs (images,
        video chunks of work.chunk_frames frames) or work.mel_frames mel frames (audio chunks). Zeros are fine.
    profile_encoder(self, batch_size, pixel_shape, device) -> peak bytes   (LLaVA: images only)

For each modality the runner measures the probe's peak on the device (measure_peak, inference mode, weights already
loaded and excluded) -> the unit cost and the plan's encoder_<modality> term (source "measured"; the formula value
is in the detail). With --encoder-mem-reserve the reservation is that one declared figure, shared by every modality,
and each modality's unit is still measured. The returned value holds:
    mm_processor              image_data -> MultimodalInputs (the offline Engine calls it; the server builds its own)
    encoder_terms             mem_plan EncoderTerm per modality (empty with --encoder-mem-reserve)
    encoder_reserve_bytes     the total encoder reservation; encoder_reserve_source "measured" / "declared"
    encoder_workloads         {modality: EncoderWorkload} -- also set on the model as `model.encoder_workloads`,
                              whose chunk_frames are the video / audio chunk sizes the model must encode long items in
    mm_embedding_cache(_bytes), encoder_admission (one gate per modality)
Text-only models get TEXT_ONLY. The profile runs before the language model's activation profile (model_runner.py)
so an encoder's peak is not hidden by memory the LM profile freed but the process still holds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Optional

from sglang.srt.mem_plan.build import mm_embedding_cache_bytes
from sglang.srt.mem_plan.dtypes import dtype_bytes
from sglang.srt.mem_plan.encoder import EncoderBudget, encoder_reservation_bytes
from sglang.srt.mem_plan.encoder_plan import encoder_workloads, measured_encoder_term
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
    encoder_terms: tuple = ()
    encoder_workloads: dict = field(default_factory=dict)


TEXT_ONLY = MultimodalSetup()


def measure_probe_unit_bytes(probe, work, device: str) -> int:
    """Peak bytes of one unit of `work` (a probe run on the whole workload, divided by its units)."""
    import torch

    from sglang.srt.mem_plan.measure import measure_peak

    with torch.inference_mode(), measure_peak(device) as meter:
        probe(work, device)
    return max(-(-meter.increase_bytes // work.units), 1)


def _unit_costs(model, processor, workloads: dict, sa, device: str) -> dict:
    """{modality: measured bytes of one unit}: each probe of mm_encoder_probes, or LLaVA's profile_encoder."""
    if hasattr(model, "mm_encoder_probes"):
        probes = model.mm_encoder_probes()
        missing = sorted(set(probes) - set(workloads))
        if missing:
            raise ValueError(f"The model encodes {missing}, but its config declares no encoder the plan can size for "
                             f"them (mem_plan/encoder_shapes.py).")
        return {m: measure_probe_unit_bytes(probe, workloads[m], device) for m, probe in probes.items()}
    bs = sa.encoder_batch_size
    peak = model.profile_encoder(bs, processor.max_pixel_values_shape, device)
    return {"image": max(peak // bs, 1)}


def setup_multimodal(model, model_config, model_path: str, server_args, device: str) -> MultimodalSetup:
    """Profile each encoder and build the processor, embedding cache and admission for a multimodal model."""
    from sglang.srt.multimodal.processors import get_mm_processor

    sa = server_args
    if not hasattr(model, "profile_encoder") and not hasattr(model, "mm_encoder_probes"):
        return TEXT_ONLY
    processor = get_mm_processor(model_config.architecture, model_config.hf_config, model_path, sa)
    if processor is None:
        return TEXT_ONLY
    from sglang.srt.multimodal.embedding_cache import MultiModalEmbeddingCache
    from sglang.srt.multimodal.encoder_admission import EncoderAdmission, ModalityGate

    workloads = encoder_workloads(model_config.shape, sa)
    model.encoder_workloads = workloads
    units = _unit_costs(model, processor, workloads, sa, device)
    act = dtype_bytes(model_config.facts.dtype)
    fused = not str(device).startswith("cpu")
    if sa.encoder_mem_reserve is None:
        terms = tuple(measured_encoder_term(workloads[m], cost, workloads[m].peak_bytes(act, fused))
                      for m, cost in units.items())
        gates = {t.modality: ModalityGate(EncoderBudget(t.num_bytes), units[t.modality]) for t in terms}
        reserve, source = sum(t.num_bytes for t in terms), "measured"
        detail = "; ".join(t.detail for t in terms)
    else:
        terms = ()
        reserve, source = encoder_reservation_bytes(None, 1, sa.encoder_mem_reserve), "declared"
        shared = EncoderBudget(reserve)
        gates = {m: ModalityGate(shared, cost) for m, cost in units.items()}
        detail = "--encoder-mem-reserve; one chunk peaks at " + ", ".join(f"{m} {c:,} B" for m, c in units.items())

    cache_bytes = mm_embedding_cache_bytes(sa)
    cache = MultiModalEmbeddingCache(cache_bytes)
    model.embedding_cache = cache
    model.encoder_batch_size = sa.encoder_batch_size
    admission = EncoderAdmission(gates, embedding_cache=cache)
    logger.info("Encoder reservation %.1f MiB (%s; %s); embedding cache %d MiB", reserve / MiB, source,
                admission.describe(), sa.mm_embedding_cache_mb)
    return MultimodalSetup(processor, cache, admission, reserve, source, detail, cache_bytes, terms, workloads)
