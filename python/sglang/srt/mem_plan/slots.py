"""Request slots (req_to_token rows) as a function of the KV pool size: upstream's rule, and two for models whose
layers keep memory per slot (windowed KV, linear state: layer_pools.py).

kind "upstream" (every layer full; or no full layer and a windowed pool, T its tokens):
    unset --max-running-requests:  R(T) = min(clamp(floor(T * 512 / context_len), 2048, 4096), T // 2)
    set   --max-running-requests:  R(T) = min(user, T // 2)
    Without full layers the rule's context_len is a request's most tokens in the windowed pool, min(context,
    W + 2 (P - 1)) (layer_pools.request_pool_tokens): the windowed pool is then the token pool the scheduler admits
    requests against, and a request never holds more of it (Mistral-7B on an H100: 4,096 slots, as upstream).
kind "first-context" (some windowed or linear layers, and full layers):
    unset:  R(T) = min(1 + floor(max(T - context_len, 0) * 512 / context_len), 4096, T // 2, B(T))
            B(T) = the balance cap (below)
    set:    R(T) = min(user, T // 2)
kind "context-per-slot" (no full and no windowed layer -- every layer linear, no token pool: T is the logical
tokens req_to_token maps, R x context_len):
    unset:  R(T) = min(floor(T / context_len), 4096)
    set:    R(T) = min(user, floor(T / context_len))

Why "first-context": a slot of such a model costs its window on every windowed layer and its state on every linear
layer (Gemma-3-27B: 1,025 tokens x 425,984 B = 437 MB a slot), so upstream's floor of 2048 slots alone would ask for
0.9 TB, and a plan solved with it leaves the full pool a fraction of one request (issue 40: 26,243 tokens at context
131,072 on an H100). The rule gives the first context_len tokens of the full pool to one request -- so wherever
anything fits, one full-context request does before a second slot -- and past them upstream's ratio of 512 slots per
context of pool, without the floor. With a full pool a slot's window is never more than the pool (T_w <= T), so a
short --context-length still gets many cheap slots.

Why the balance cap B(T): a slot is worth the tokens it can use. Its own pools -- the windowed tokens it may hold
(layer_pools.PoolCost) and its linear state -- are bought beside the full pool its requests share, and 512 slots per
context prices them as if they were as cheap as a req_to_token row. On a model with a small full cell they are not:
Nemotron-H-8B (4 full layers, 16,384 B a token; 24 Mamba layers, 102 MB a slot) got 601 slots = 57 GiB of state
beside 17,807 tokens of KV on an H100, about two full-context requests for 601 slots. So the slots' pools may never
outweigh the full pool they share. With a the windowed cell (bytes a windowed token costs over all windowed layers),
s a slot's state, c the full cell and T_w(T, R) = min(T, U(R)), U(R) = align_up(R (W + 2 (P - 1)) + max(chunk, R), P)
the windowed pool's tokens (layer_pools.py), R slots are *balanced* at T when

    L(T, R) = T_w(T, R) x a + R x s  <=  T x c
    B(T)    = the largest R in [1, T // 2] balanced at T, or 1 if none (one full-context request before anything)

The cap is exact where the earlier form T c // (W a + s) was not: that form counted every slot's window as additive
even after T_w had reached T, so Gemma-2-9B (a = c, 21 sliding layers of 4,096 at context 8,192) got 43 slots with
no byte saved. Here, whenever a <= c and s = 0 (the windowed pool can never outweigh the full one, as T_w <= T),
every R is balanced and the cap never binds; Gemma-3-27B (a = 5.2 c) and the state models keep a cap close to the
earlier one. R(T) only ever takes min(other terms, B(T)), so the rule checks the other terms' R and bisects below it
only when it is not balanced (L is nondecreasing in R: U and min(T, .) are, so the balanced R at a given T are
[1, B(T)], a prefix, and the bisection is exact).

B(T) is nondecreasing in T. For T <= 1 it is 1, the least it can be. For T >= 2 every R balanced at T is balanced
at every T' > T (and R <= T // 2 <= T' // 2), so B(T') >= B(T). Take R balanced at T and T' > T:
  * U(R) <= T (T_w(T, R) = U(R), the window bound): T_w(T', R) = U(R) too, so L(T', R) = L(T, R) <= T c < T' c.
  * U(R) > T (T_w(T, R) = T, the full pool's tokens): balance says T a + R s <= T c, so R s <= T (c - a); with T >= 1
    that needs a <= c. Then L(T', R) = min(T', U) a + R s <= min(T', U) a + T (c - a) <= min(T', U) a
    + min(T', U) (c - a) = min(T', U) c <= T' c, since T < min(T', U) and c - a >= 0.
(At T = 0 every R is balanced when s = 0 -- T_w = 0 -- and would not stay so; the [1, T // 2] range keeps it out.)
Where slots are cheap (gpt-oss: a 128-token window) B(T) is far above the other terms and changes nothing. Upstream splits the same memory with fixed knobs instead: --mamba-full-memory-ratio
0.9 gives the states 0.9 / 1.9 = 47% of the pool room (and 1 request slot per 3 state slots for its prefix-cache
snapshots), which B(T) at its bound (states = 50%) nearly matches without the knob; --swa-full-tokens-ratio 0.8 gives
the windowed layers 0.8 x the full pool's tokens whatever the window, several times the full pool's bytes on
Gemma-3 (52 sliding : 10 full layers), where B(T) holds the windows to the full pool's bytes at most. The user's
--max-running-requests is not capped (the user chose the slots).

Upstream writes int(T / context_len * 512); for any T and context_len below 2**40 the float and the exact
integer floor agree (T / ctx rounds to k/512 exactly only when it is k/512), so the integer form is used.
Every kind's R(T) is nondecreasing in T, which makes "KV(T) + cost(R(T))" nondecreasing and the token solve monotone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # the cap only calls PoolCost.balance_bytes; no import at run time
    from sglang.srt.mem_plan.layer_pools import PoolCost

# Upstream constants (scheduler request-slot heuristic): 512 slots per context-length worth of KV tokens,
# at least 2048 and at most 4096 slots.
SLOTS_PER_CONTEXT = 512
MIN_AUTO_SLOTS = 2048
MAX_AUTO_SLOTS = 4096
SLOT_RULE_KINDS = ("upstream", "first-context", "context-per-slot")


@dataclass(frozen=True)
class SlotRule:
    context_len: int
    user_max_running_requests: Optional[int] = None
    slots_per_context: int = SLOTS_PER_CONTEXT
    min_slots: int = MIN_AUTO_SLOTS
    max_slots: int = MAX_AUTO_SLOTS
    kind: str = "upstream"
    full_cell_bytes: int = 0  # first-context's balance cap: the full pool's bytes per token (0: no cap) ...
    pools: Optional["PoolCost"] = None  # ... and the slots' windowed + linear-state pools (None: no cap)

    def __post_init__(self):
        if self.kind not in SLOT_RULE_KINDS:
            raise ValueError(f"slot rule kind {self.kind!r} not in {SLOT_RULE_KINDS}")
        if self.context_len <= 0:
            raise ValueError("context_len must be positive")
        if self.user_max_running_requests is not None and self.user_max_running_requests <= 0:
            raise ValueError("--max-running-requests must be positive")
        if not 0 < self.min_slots <= self.max_slots:
            raise ValueError("need 0 < min_slots <= max_slots")
        if self.full_cell_bytes < 0:
            raise ValueError("full_cell_bytes must be >= 0")

    @property
    def balanced(self) -> bool:
        """Whether the balance cap B(T) applies (module docstring): first-context, a full cell and per-slot pools."""
        return (self.kind == "first-context" and self.full_cell_bytes > 0 and self.pools is not None
                and self.pools.pools.per_slot_layers)

    def is_balanced(self, total_tokens: int, num_slots: int) -> bool:
        """L(T, R) <= T x c: R slots' windowed tokens and states do not outweigh the full pool (module docstring)."""
        return self.pools.balance_bytes(total_tokens, num_slots) <= total_tokens * self.full_cell_bytes

    def balance_cap(self, total_tokens: int, upto: Optional[int] = None) -> int:
        """B(T): the largest R in [1, T // 2] balanced at T, or 1 if none; with `upto`, min(upto, B(T)) for
        upto >= 1 (the same prefix cut at upto: checks upto, bisects below it only when it is not balanced)."""
        hi = total_tokens // 2 if upto is None else min(total_tokens // 2, upto)
        if hi <= 1 or self.is_balanced(total_tokens, hi):
            return max(hi, 1)
        lo, hi = 1, hi - 1  # invariant: every R <= lo is balanced or lo == 1; every R > hi is not
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.is_balanced(total_tokens, mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _linear(self, total_tokens: int) -> int:
        if self.kind == "first-context":
            return 1 + max(total_tokens - self.context_len, 0) * self.slots_per_context // self.context_len
        return total_tokens * self.slots_per_context // self.context_len

    def estimated(self, total_tokens: int) -> int:
        """The clamp part of the rule, before the T // 2 bound (the kind's own bound for context-per-slot)."""
        if self.kind == "context-per-slot":
            return min(total_tokens // self.context_len, self.max_slots)
        if self.kind == "first-context":
            est = min(self._linear(total_tokens), self.max_slots)
            return self.balance_cap(total_tokens, upto=est) if self.balanced else est
        return min(max(self._linear(total_tokens), self.min_slots), self.max_slots)

    def bound(self, total_tokens: int) -> int:
        """The slots T can back at all: T // 2 (a request needs 2 tokens), or T // context_len without a full pool."""
        return total_tokens // (self.context_len if self.kind == "context-per-slot" else 2)

    def slots(self, total_tokens: int) -> int:
        if self.user_max_running_requests is not None:
            return min(self.user_max_running_requests, self.bound(total_tokens))
        return min(self.estimated(total_tokens), self.bound(total_tokens))

    @property
    def slot_cap(self) -> int:
        """The most slots the rule gives at any T."""
        return self.user_max_running_requests if self.user_max_running_requests is not None else self.max_slots

    def regime(self, total_tokens: int) -> str:
        """Which piece of the rule is active at T: 'user', 'half' (T // 2), 'floor', 'linear' or 'cap';
        'first-context' (one slot while T <= context), 'balance' (B(T)) and 'per-context' (T // context) for the
        other kinds."""
        bound_name = "per-context" if self.kind == "context-per-slot" else "half"
        if self.user_max_running_requests is not None:
            return "user" if self.user_max_running_requests <= self.bound(total_tokens) else bound_name
        est = self.estimated(total_tokens)
        if self.kind == "context-per-slot":
            return "cap" if est >= self.max_slots else bound_name
        linear = self._linear(total_tokens)
        unbalanced = min(linear, self.max_slots) if self.kind == "first-context" else est  # R without B(T)
        if self.balanced and est < min(unbalanced, self.bound(total_tokens)):
            return "balance"  # B(T) is below every other term
        if self.bound(total_tokens) < unbalanced:
            return "half"
        if self.kind == "first-context" and linear <= 1:
            return "first-context"
        if self.kind == "upstream" and linear <= self.min_slots:
            return "floor"
        if linear >= self.max_slots:
            return "cap"
        return "linear"


def max_num_reqs(total_tokens: int, context_len: int, user_max_running_requests: Optional[int] = None) -> int:
    return SlotRule(context_len, user_max_running_requests).slots(total_tokens)
