"""RequestGrammar: one request's grammar matcher (xgrammar's, or llguidance_engine.LLGuidanceMatcher), advanced with
each committed token.

The matcher's state is a function of the request's output_ids only, so prefix caching, chunked prefill and
retraction (which keeps output_ids and re-prefills them) leave it exact; nothing is rolled back or replayed. A
request's grammar lives from the end of its compile to its finish or abort (GrammarBackend counts the live ones).
Its mask may be filled on the backend's BitmaskFiller thread during the forward (bitmask_fill.py): advancing or
dropping the matcher first waits for that fill.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch


class GrammarRejectedToken(RuntimeError):
    """A committed token the grammar does not allow (the mask should have made this impossible)."""


class RequestGrammar:
    def __init__(self, kind: str, matcher, on_release: Callable[[], None], filler: Optional[Any] = None):
        self.kind = kind
        self.matcher = matcher
        self._on_release: Optional[Callable[[], None]] = on_release
        self.filler = filler  # bitmask_fill.BitmaskFiller whose jobs may read this matcher, or None
        self.num_accepted = 0  # the matcher's position: a mask filled ahead is valid only at the same one

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into bitmask[row] (bit t of word t // 32 set = token t allowed)."""
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token_id: int) -> bool:
        """Advance by one committed token; True when the grammar is complete (its stop token accepted)."""
        if self.filler is not None:
            self.filler.wait(quiet=True)
        self.num_accepted += 1
        if not self.matcher.accept_token(token_id):
            raise GrammarRejectedToken(f"the {self.kind} grammar rejected token {token_id}")
        return self.matcher.is_terminated()

    @property
    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def release(self) -> None:
        """Drop the matcher (idempotent)."""
        if self._on_release is not None:
            if self.filler is not None:
                self.filler.wait(quiet=True)
            self._on_release()
            self._on_release = None
            self.matcher = None
