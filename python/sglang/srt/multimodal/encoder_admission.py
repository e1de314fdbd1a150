"""EncoderAdmission: the scheduler's gate on how much encoder work one prefill batch may carry.

Every image a batch must encode (it overlaps the batch's chunk of its request and is not in the embedding cache;
duplicates within the batch count once) costs `cost_per_image_bytes`, the measured encoder peak of one
largest-size image. The costs are acquired from an EncoderBudget whose capacity is the planned reservation, and
released after the forward; a request whose chunk would exceed it is cut before the first image that does not
fit, or waits for the next batch. So a burst of large images queues instead of failing, and the encoder's peak in
any forward stays within the reservation. Scheduler process only (single-threaded).
"""

from __future__ import annotations

from typing import Set

from sglang.srt.mem_plan.encoder import EncoderBudget


class EncoderAdmission:
    def __init__(self, budget: EncoderBudget, cost_per_image_bytes: int, embedding_cache=None):
        if not budget.fits_ever(cost_per_image_bytes):
            raise ValueError(
                f"The encoder reservation ({budget.capacity_bytes:,} B) is smaller than encoding one image "
                f"({cost_per_image_bytes:,} B); raise --encoder-mem-reserve or leave it unset.")
        self.budget = budget
        self.cost_per_image_bytes = cost_per_image_bytes
        self.embedding_cache = embedding_cache
        self._batch_hashes: Set[str] = set()
        # counters (tests and /get_server_info)
        self.max_images_per_batch = 0
        self.num_deferred = 0

    @property
    def max_images(self) -> int:
        return self.budget.capacity_bytes // self.cost_per_image_bytes

    def _cached(self, h: str) -> bool:
        return self.embedding_cache is not None and h in self.embedding_cache

    def admit(self, mm_inputs, start: int, num_tokens: int, page_size: int = 1, must_progress: bool = False) -> int:
        """How many of the tokens [start, start + num_tokens) this batch may prefill; acquires their images.

        The result is num_tokens, or a page-aligned cut before the first image that does not fit, or 0.
        must_progress (the batch would otherwise be empty): at least one page, even if it overruns the budget --
        only reachable when a page holds the starts of more images than the reservation covers.
        """
        if mm_inputs is None:
            return num_tokens
        for item, _, _ in mm_inputs.items_in_range(start, start + num_tokens):
            if item.hash in self._batch_hashes or self._cached(item.hash):
                continue
            if not self.budget.try_acquire(self.cost_per_image_bytes):
                cut = (item.offset - start) // page_size * page_size
                if cut <= 0 and must_progress:
                    cut = min(page_size, num_tokens)
                self.num_deferred += 1
                return max(cut, 0)
            self._batch_hashes.add(item.hash)
        return num_tokens

    def end_batch(self) -> None:
        """Release everything acquired for the batch that just ran."""
        self.max_images_per_batch = max(self.max_images_per_batch, len(self._batch_hashes))
        for _ in range(len(self._batch_hashes)):
            self.budget.release(self.cost_per_image_bytes)
        self._batch_hashes.clear()
        self.budget.check_integrity()
