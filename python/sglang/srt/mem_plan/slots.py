"""Request slots (req_to_token rows) as a function of the KV pool size, upstream's rule.

    unset --max-running-requests:  R(T) = min(clamp(floor(T * 512 / context_len), 2048, 4096), T // 2)
    set   --max-running-requests:  R(T) = min(user, T // 2)

Upstream writes int(T / context_len * 512); for any T and context_len below 2**40 the float and the exact
integer floor agree (T / ctx rounds to k/512 exactly only when it is k/512), so the integer form is used.
R(T) is nondecreasing in T, which makes "KV(T) + cost(R(T))" nondecreasing and the token solve monotone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# Upstream constants (scheduler request-slot heuristic): 512 slots per context-length worth of KV tokens,
# at least 2048 and at most 4096 slots.
SLOTS_PER_CONTEXT = 512
MIN_AUTO_SLOTS = 2048
MAX_AUTO_SLOTS = 4096


@dataclass(frozen=True)
class SlotRule:
    context_len: int
    user_max_running_requests: Optional[int] = None
    slots_per_context: int = SLOTS_PER_CONTEXT
    min_slots: int = MIN_AUTO_SLOTS
    max_slots: int = MAX_AUTO_SLOTS

    def __post_init__(self):
        if self.context_len <= 0:
            raise ValueError("context_len must be positive")
        if self.user_max_running_requests is not None and self.user_max_running_requests <= 0:
            raise ValueError("--max-running-requests must be positive")
        if not 0 < self.min_slots <= self.max_slots:
            raise ValueError("need 0 < min_slots <= max_slots")

    def estimated(self, total_tokens: int) -> int:
        """The clamp part of the rule, before the T // 2 bound."""
        linear = total_tokens * self.slots_per_context // self.context_len
        return min(max(linear, self.min_slots), self.max_slots)

    def slots(self, total_tokens: int) -> int:
        if self.user_max_running_requests is not None:
            return min(self.user_max_running_requests, total_tokens // 2)
        return min(self.estimated(total_tokens), total_tokens // 2)

    def regime(self, total_tokens: int) -> str:
        """Which piece of the rule is active at T: 'user', 'half' (T // 2), 'floor', 'linear' or 'cap'."""
        if self.user_max_running_requests is not None:
            return "user" if self.user_max_running_requests <= total_tokens // 2 else "half"
        est = self.estimated(total_tokens)
        if total_tokens // 2 < est:
            return "half"
        linear = total_tokens * self.slots_per_context // self.context_len
        if linear <= self.min_slots:
            return "floor"
        if linear >= self.max_slots:
            return "cap"
        return "linear"


def max_num_reqs(total_tokens: int, context_len: int, user_max_running_requests: Optional[int] = None) -> int:
    return SlotRule(context_len, user_max_running_requests).slots(total_tokens)
