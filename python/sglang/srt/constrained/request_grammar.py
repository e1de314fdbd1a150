"""RequestGrammar: one request's grammar matcher (xgrammar's, or llguidance_engine.LLGuidanceMatcher), advanced with
each committed token.

The matcher's state is a function of the request's output_ids only, so prefix caching, chunked prefill and
retraction (which keeps output_ids and re-prefills them) leave it exact; nothing is rolled back or replayed. A
request's grammar lives from the end of its compile to its finish or abort (GrammarBackend counts the live ones).
Its mask may be filled on the backend's BitmaskFiller thread during the forward (bitmask_fill.py): advancing or
dropping the matcher first waits for that fill.

A dead end: the mask at the matcher's position allows no token and no stop (the served tokenizer cannot spell what
the grammar needs next; grammars no string matches are refused before they get here: empty_language.py). The
sampler marks it (logits_mask.py) and the request ends as the client's error, a 400 naming its grammar field
(dead_end_error), instead of committing a token the grammar rejects.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from sglang.srt.sampling.validation import ParamError

GRAMMAR_DEAD_END_STATUS = 400  # the client sent a grammar the served tokenizer cannot finish
DEAD_END_ALLOWED = ("a grammar that this model's tokenizer can spell to its end (the tokenizer may lack tokens for "
                    "some control characters or bytes)")


class GrammarRejectedToken(RuntimeError):
    """A committed token the grammar does not allow (the mask should have made this impossible)."""


class RequestGrammar:
    def __init__(self, kind: str, matcher, on_release: Callable[[], None], filler: Optional[Any] = None):
        self.kind = kind
        self.matcher = matcher
        self._on_release: Optional[Callable[[], None]] = on_release
        self.filler = filler  # bitmask_fill.BitmaskFiller whose jobs may read this matcher, or None
        self.num_accepted = 0  # the matcher's position: a mask filled ahead is valid only at the same one
        self.dead_end = False  # its mask at num_accepted allows nothing: the matcher never moves again
        self.stuck = getattr(matcher, "stuck", None)  # llguidance's: a stop-only mask where the output may not end

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

    def dead_end_error(self, text: str) -> ParamError:
        """The client's error for a dead end (text: the request's grammar)."""
        return ParamError(self.kind, f"the grammar admits no continuation after {self.num_accepted} tokens: no token "
                          "of this model's vocabulary, nor the end of the output, is allowed next", text,
                          DEAD_END_ALLOWED)

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
            self.matcher = self.stuck = None
