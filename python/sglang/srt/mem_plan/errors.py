"""MemoryPlanError: a plan that cannot work, with the knob to turn and the value that would work."""

from __future__ import annotations

from typing import Optional


class MemoryPlanError(ValueError):
    """Raised when no memory plan satisfies the inputs.

    Attributes make the error actionable for callers (the CLI prints them, the server logs them):
      knob            the flag to change, e.g. "--mem-fraction-static"; None when no single knob fixes it
      direction       "raise" / "lower" / None
      suggested_value the value that would work (already checked by the planner), or None
      shortfall_bytes how many bytes are missing when nothing fits, else 0
    """

    def __init__(
        self,
        message: str,
        *,
        knob: Optional[str] = None,
        direction: Optional[str] = None,
        suggested_value: Optional[float] = None,
        shortfall_bytes: int = 0,
    ):
        super().__init__(message)
        self.knob = knob
        self.direction = direction
        self.suggested_value = suggested_value
        self.shortfall_bytes = shortfall_bytes

    def to_dict(self) -> dict:
        return {
            "error": str(self),
            "knob": self.knob,
            "direction": self.direction,
            "suggested_value": self.suggested_value,
            "shortfall_bytes": self.shortfall_bytes,
        }
