"""EncoderAdmission: the scheduler's gate on how much encoder work one prefill batch may carry, per modality.

The unit of encoder work is one ENCODER CHUNK of an item: a whole image, or one chunk of a video (frames) or of an
audio (mel frames) -- the sizes planned in mem_plan/encoder_inputs.py, which the models encode one chunk at a time.
An item says where its chunks' embedding rows are (`item.encoder_chunks`: [(lo, hi), ...] relative to item.offset;
absent = one chunk, the whole item). Each modality has a gate: an EncoderBudget whose capacity is the modality's
planned reservation (the plan's encoder_<modality> term; with --encoder-mem-reserve every modality shares one budget)
and a unit cost, the measured peak of that modality's largest chunk. Every chunk a batch must encode (it overlaps the
batch's token range of its request and is not in the embedding cache; duplicates within the batch count once)
acquires one unit from its modality's budget; everything is released after the forward. A request whose range would
exceed a budget is cut, page-aligned, before the first chunk that does not fit, or waits for the next batch -- so a
long video or audio is encoded chunk by chunk across batches, a burst queues instead of failing, and no encoder's
peak in any forward exceeds its reservation. Scheduler process only (single-threaded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from sglang.srt.mem_plan.encoder import EncoderBudget


def encoder_chunks(item) -> List[Tuple[int, int]]:
    """[(lo, hi)] embedding rows of each encoder chunk of an item, relative to item.offset."""
    chunks = getattr(item, "encoder_chunks", None)
    return list(chunks) if chunks else [(0, item.num_tokens)]


def unit_key(item_hash: str, index: int, num_chunks: int) -> str:
    """The embedding-cache / admission key of one encoder chunk: the item's hash for a one-chunk item (images), else
    `<hash>:<index>` -- models cache chunk embeddings under this key."""
    return item_hash if num_chunks == 1 else f"{item_hash}:{index}"


@dataclass
class ModalityGate:
    budget: EncoderBudget  # capacity = the modality's reservation (shared by all with --encoder-mem-reserve)
    unit_bytes: int  # measured peak of one largest chunk of this modality

    @property
    def max_units(self) -> int:
        return self.budget.capacity_bytes // self.unit_bytes


class EncoderAdmission:
    def __init__(self, budget, cost_per_image_bytes: Optional[int] = None, embedding_cache=None):
        """EncoderAdmission({modality: ModalityGate}, embedding_cache=...), or (EncoderBudget, cost per image) for a
        model that encodes images only."""
        if isinstance(budget, EncoderBudget):
            gates = {"image": ModalityGate(budget, cost_per_image_bytes)}
        else:
            gates = dict(budget)
        for modality, gate in gates.items():
            if gate.unit_bytes <= 0 or not gate.budget.fits_ever(gate.unit_bytes):
                raise ValueError(
                    f"The encoder reservation for {modality} ({gate.budget.capacity_bytes:,} B) is smaller than "
                    f"encoding one {modality} chunk ({gate.unit_bytes:,} B); raise --encoder-mem-reserve or leave it "
                    f"unset.")
        self.gates: Dict[str, ModalityGate] = gates
        self.embedding_cache = embedding_cache
        self._held: Dict[str, ModalityGate] = {}  # chunk key -> the gate it holds a unit of
        # counters (tests and /get_server_info)
        self.max_units_per_batch: Dict[str, int] = {m: 0 for m in gates}
        self.num_deferred = 0

    # ---- compatibility with the image-only admission ----
    @property
    def budget(self) -> EncoderBudget:
        return next(iter(self.gates.values())).budget

    @property
    def cost_per_image_bytes(self) -> int:
        return self.gates["image"].unit_bytes

    @property
    def max_images(self) -> int:
        return self.gates["image"].max_units

    @property
    def max_images_per_batch(self) -> int:
        return self.max_units_per_batch.get("image", 0)

    def _cached(self, key: str) -> bool:
        return self.embedding_cache is not None and key in self.embedding_cache

    def admit(self, mm_inputs, start: int, num_tokens: int, page_size: int = 1, must_progress: bool = False) -> int:
        """How many of the tokens [start, start + num_tokens) this batch may prefill; acquires their chunks.

        The result is num_tokens, or a page-aligned cut before the first chunk that does not fit, or 0.
        must_progress (the batch would otherwise be empty): at least one page, even if it overruns the budget --
        only reachable when a page holds the starts of more chunks than the reservation covers.
        """
        if mm_inputs is None:
            return num_tokens
        stop = start + num_tokens
        for item, _, _ in mm_inputs.items_in_range(start, stop):
            gate = self.gates.get(getattr(item, "modality", "image"))
            if gate is None:  # a modality this model has no encoder for never reaches the scheduler
                continue
            chunks = encoder_chunks(item)
            for index, (lo, hi) in enumerate(chunks):
                first, end = item.offset + lo, item.offset + hi
                if end <= start or first >= stop:
                    continue
                key = unit_key(item.hash, index, len(chunks))
                if key in self._held or self._cached(key):
                    continue
                if not gate.budget.try_acquire(gate.unit_bytes):
                    cut = (max(first, start) - start) // page_size * page_size
                    if cut <= 0 and must_progress:
                        cut = min(page_size, num_tokens)
                    self.num_deferred += 1
                    return max(cut, 0)
                self._held[key] = gate
        return num_tokens

    def end_batch(self) -> None:
        """Release everything acquired for the batch that just ran."""
        counts: Dict[str, int] = {}
        for gate in self._held.values():
            gate.budget.release(gate.unit_bytes)
        for modality, gate in self.gates.items():
            counts[modality] = sum(1 for g in self._held.values() if g is gate)
            self.max_units_per_batch[modality] = max(self.max_units_per_batch[modality], counts[modality])
        self._held.clear()
        for gate in self.gates.values():
            gate.budget.check_integrity()

    def describe(self) -> str:
        return "; ".join(f"{m}: {g.max_units} chunk(s) of {g.unit_bytes / 2**20:.1f} MiB"
                         for m, g in self.gates.items())
