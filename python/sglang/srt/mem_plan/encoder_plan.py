"""The encoder terms of a plan: one per modality the model encodes, sized at its largest planned unit of work.

    encoder_workloads(shape, sa)        {modality: EncoderWorkload} -- the inputs the terms are planned at; the runner
                                        measures each encoder on exactly these (multimodal/runner_setup.py)
    formula_encoder_terms(...)          the dry run's terms: each workload's formula peak (encoder_towers.py), source
                                        "formula"; on GPUs attention is fused (no score matrices), on a CPU the
                                        largest attention segment's scores are charged
    measured_encoder_term(...)          the server's term for a modality from its measured unit peak
Torch-free.
"""

from __future__ import annotations

from sglang.srt.mem_plan.dtypes import dtype_bytes
from sglang.srt.mem_plan.encoder import EncoderTerm
from sglang.srt.mem_plan.encoder_inputs import GENERIC_PROCESSOR, EncoderWorkload, planned_workloads

MODALITY_ORDER = ("image", "video", "audio")


def encoder_workloads(shape, sa) -> dict[str, EncoderWorkload]:
    """{modality: largest unit of work} of a ModelShape's encoder towers, in MODALITY_ORDER."""
    work = planned_workloads(shape.encoders, shape.processor or GENERIC_PROCESSOR, sa)
    return {m: work[m] for m in MODALITY_ORDER if m in work}


def formula_encoder_terms(shape, sa, dtype: str, device_kind: str) -> tuple[EncoderTerm, ...]:
    fused = device_kind != "cpu"
    b = dtype_bytes(dtype)
    return tuple(EncoderTerm(m, w.peak_bytes(b, fused), "formula", w.describe())
                 for m, w in encoder_workloads(shape, sa).items())


def measured_encoder_term(work: EncoderWorkload, unit_bytes: int, formula_bytes: int) -> EncoderTerm:
    """The reservation of a modality whose unit of work measured unit_bytes: one unit per admission slot."""
    return EncoderTerm(work.modality, unit_bytes * work.units, "measured",
                       f"{work.describe()}; formula {formula_bytes:,} B")
