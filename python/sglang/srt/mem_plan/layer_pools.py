"""The pools of layers that do not keep every token: windowed (sliding / chunked) KV and linear-attention state.

Each decoder layer has a kind (arch_spec.LAYER_KINDS). Per rank, with c the K/V bytes one layer keeps per token (the
same shape on every attention layer; specs.KVCellSpec at num_layers = 1):

    kv_cache      "full" layers: c x n_full per token, T tokens (the KV pool as before; every layer full -> unchanged)
    kv_windowed   "sliding" + "chunked" layers: c x (n_sliding + n_chunked) per token, T_w tokens (below)
    linear_state  "linear" layers: sum of their StateTensor.bytes_per_rank(tp) per request slot, R + 1 rows (row 0 the
                  dummy that padded / CUDA-graph batches read and write, as req_to_token's row 0)

The windowed bound, with no ratio knob. W is the window: a sliding layer's query at p reads keys p-W+1..p
(sliding_window, W tokens with itself, HF's mask), a chunked layer's reads floor(p/C)*C..p (attention_chunk_size C:
at most C tokens). A model with both kinds gets one pool at the larger of the two bounds (one page table per
request; no zoo model has both). So after a forward a request needs at most its newest W positions. A forward that
adds n tokens to a request makes it hold W + n consecutive positions, which touch at most ceil((W + n - 1) / P) + 1
pages of P tokens: <= W + n + 2 (P - 1) tokens. Every request slot may hold its window (requests outside the batch
keep theirs), and one forward adds at most max(chunk, R) tokens over the batch: a prefill batch shares one
chunked_prefill_size budget (managers/prefill_scheduler.py), a decode batch adds one token per running request, and
the two never share a forward here. Every windowed token belongs to a live request whose tokens all have full-layer
KV too, page for page, so a model with full layers never needs more windowed tokens than the full pool has:

    T_w(T, R) = min(T, align_up(R x (W + 2 (P - 1)) + max(chunk, R), P))

T_w is nondecreasing in T and R, so with a nondecreasing slot rule R(T) the total stays nondecreasing in T and the
token bisection (solver.py) stays exact. The slots' own pools (PoolCost.balance_bytes: T_w windowed tokens and R
states) also bound how many slots the rule buys: never more than the full pool outweighs (slots.py, B(T)).

A windowed layer whose bound reaches the planned context -- W + 2 (P - 1) >= context_len (a sliding window or an
attention chunk as long as any request) -- never drops a token of a request, and one slot's share of the windowed
pool would be a whole context: it is a full layer for the plan (split_kv_cell with context_len; Ministral-8B's
sliding layers, window 32,768 at context 32,768). Its KV goes to the full pool and the plan's layer line says so.

A model without full layers (Mistral-7B, Phi-3-mini: every layer sliding) has no full pool, and its windowed pool
is THE token pool: T is the windowed tokens, sized by the budget as a dense model's KV pool is, and the scheduler
admits a request when its tokens fit there, as it does on the full pool. Reserving a window per slot is not what
keeps the plan from running out -- admission is -- so the slots follow upstream's rule with a request's most tokens
in the pool, L = min(context_len, W + 2 (P - 1)) (request_pool_tokens), in place of context_len. The pool is never
larger than the slots can hold: the solve's bound is T <= U(slot cap) (windowed_bound), and below it T <= U(R(T))
holds anyway when W + 2 (P - 1) >= 2, by the piece of the rule R(T) is in:
  * T // 2: U >= 2 R + R = 3 (T // 2) >= T for T >= 2 (and U >= chunk >= 1 = T at T = 1);
  * the 2048 floor: then T 512 // L < 2048, so T < 4 L, and U >= 2048 L > T;
  * T 512 // L (>= 2048, so T >= 4 L): U >= R L >= 512 T - L >= T;
  * the slot cap: T <= U(cap) is the solve's bound.
So T_w(T, R(T)) = T and the plan's max_total_num_tokens is the windowed pool. (A 1-token window at page 1 may leave
T_w one token below T; the planner snaps T down to a T with T_w(T, R(T)) = T.) A model with no full and no windowed layer (every
layer linear) has no token pool at all: T is then the logical tokens req_to_token can map, R x context_len
(slots.SlotRule kind "context-per-slot").

A model with both pools maps each token-pool slot to its windowed slot (mem_cache/swa_pool.py: req_to_token holds
token-pool slots for every layer): kv_windowed_map, int32 x kv_pool_rows(T), a per-token cost of the full pool. A
model without full layers has no map (its windowed pool is the token pool).

Prefix caching: on a windowed model the radix cache (mem_cache/swa_radix_cache.py) keeps what a finished request
still held of its window beside its full-layer KV; like cached full-layer pages, those windowed pages are evictable
(on their own, leaving the full-layer pages cached) whenever a running request needs one, so T_w bounds the running
requests only and the plan charges the cache nothing. Linear state is freed with its request (no snapshots: the cap
of that term is 0).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from sglang.srt.mem_plan.arch_spec import LAYER_KINDS
from sglang.srt.mem_plan.rounding import align_up
from sglang.srt.mem_plan.sizes import kv_pool_rows

WINDOWED_MAP_ENTRY_BYTES = 4  # int32 token-pool slot -> windowed slot, one entry per token-pool row
STATE_DUMMY_SLOTS = 1  # state row 0: the dummy padded batches point at (as req_to_token's row 0)


def window_tokens_per_slot(window_tokens: int, page_size: int) -> int:
    """Windowed tokens one request slot may hold beside the forward's new tokens: W + 2 (P - 1) (module docstring)."""
    return window_tokens + 2 * (page_size - 1)


def request_pool_tokens(window_tokens: int, page_size: int, context_len: int) -> int:
    """L: the most windowed tokens one request holds between forwards, min(context_len, W + 2 (P - 1)): what a model
    without full layers puts in place of context_len in upstream's slot rule (module docstring)."""
    return min(context_len, window_tokens_per_slot(window_tokens, page_size))


def forward_tokens(chunk_tokens: int, num_slots: int) -> int:
    """New tokens one forward adds over the whole batch: a prefill chunk, or one per running request in decode."""
    return max(chunk_tokens, num_slots)


@dataclass(frozen=True)
class LayerPools:
    """One rank's layers by kind, and what the windowed and linear ones keep. Empty: every layer full."""

    full_layers: int = 0
    sliding_layers: int = 0
    chunked_layers: int = 0
    linear_layers: int = 0
    window_tokens: int = 0  # W: the largest bound among the windowed kinds present
    windowed_cell_bytes: int = 0  # K/V bytes per token summed over sliding + chunked layers
    windowed_fixed_bytes: int = 0  # a quantized KV format's per-(layer, head) scales of those layers
    state_bytes_per_slot: int = 0  # summed over linear layers
    sliding_as_full: int = 0  # of full_layers, sliding layers whose window reaches the context (priced full) ...
    chunked_as_full: int = 0  # ... and chunked layers whose chunk does

    def __post_init__(self):
        if min(dataclasses.astuple(self)) < 0:
            raise ValueError(f"LayerPools fields must be >= 0: {self}")
        if self.sliding_as_full + self.chunked_as_full > self.full_layers:
            raise ValueError(f"windowed layers priced full are counted in full_layers: {self}")
        if self.windowed_layers and (self.window_tokens <= 0 or self.windowed_cell_bytes <= 0):
            raise ValueError(f"windowed layers need a window and a cell: {self}")
        if self.linear_layers and self.state_bytes_per_slot <= 0:
            raise ValueError(f"linear layers need their state bytes: {self}")

    @property
    def windowed_layers(self) -> int:
        return self.sliding_layers + self.chunked_layers

    @property
    def per_slot_layers(self) -> bool:
        """Whether some layer keeps memory per request slot rather than per token (windowed or linear)."""
        return bool(self.windowed_layers or self.linear_layers)

    @property
    def has_full_pool(self) -> bool:
        return self.full_layers > 0 or not self.per_slot_layers

    @property
    def windowed_token_pool(self) -> bool:
        """No full layer but windowed ones: the windowed pool is the model's token pool (its T)."""
        return bool(self.windowed_layers) and not self.has_full_pool

    @property
    def mixed_kinds(self) -> bool:
        """Whether some layer is not a plain full layer (the plan then has a layer line)."""
        return self.per_slot_layers or bool(self.sliding_as_full or self.chunked_as_full)

    def describe_kinds(self) -> str:
        plain_full = self.full_layers - self.sliding_as_full - self.chunked_as_full
        kinds = (("full", plain_full), ("sliding (window >= context: full)", self.sliding_as_full),
                 ("chunked (chunk >= context: full)", self.chunked_as_full), ("sliding", self.sliding_layers),
                 ("chunked", self.chunked_layers), ("linear", self.linear_layers))
        return ", ".join(f"{n} {k}" for k, n in kinds if n)


NO_LAYER_POOLS = LayerPools()


@dataclass(frozen=True)
class PoolCost:
    """The windowed and state pools' bytes at (T, R), for the solver: chunk and page resolved by the planner."""

    pools: LayerPools = NO_LAYER_POOLS
    chunk_tokens: int = 0
    page_size: int = 1

    def windowed_bound(self, num_slots: int) -> int:
        """U(R) = align_up(R (W + 2 (P - 1)) + max(chunk, R), P): the most windowed tokens R slots can hold at once."""
        p = self.pools
        bound = (num_slots * window_tokens_per_slot(p.window_tokens, self.page_size)
                 + forward_tokens(self.chunk_tokens, num_slots))
        return align_up(bound, self.page_size)

    def windowed_tokens(self, num_tokens: int, num_slots: int) -> int:
        """T_w(T, R) = min(T, U(R)) (module docstring); 0 without windowed layers."""
        if not self.pools.windowed_layers:
            return 0
        return min(num_tokens, self.windowed_bound(num_slots))

    def windowed_bytes(self, num_tokens: int, num_slots: int) -> int:
        """T_w tokens plus the pool's dummy page, and the fixed scales of a quantized format."""
        p = self.pools
        if not p.windowed_layers:
            return 0
        rows = kv_pool_rows(self.windowed_tokens(num_tokens, num_slots), self.page_size)
        return rows * p.windowed_cell_bytes + p.windowed_fixed_bytes

    def map_bytes(self, num_tokens: int) -> int:
        """kv_windowed_map: one int32 per token-pool row, when both a full and a windowed pool exist (else 0)."""
        p = self.pools
        if not p.windowed_layers or not p.has_full_pool:
            return 0
        return kv_pool_rows(num_tokens, self.page_size) * WINDOWED_MAP_ENTRY_BYTES

    def balance_bytes(self, num_tokens: int, num_slots: int) -> int:
        """L(T, R) = T_w(T, R) x windowed cell + R x state: what slots.SlotRule's balance cap weighs against the
        full pool (T x full cell); nondecreasing in R (and 0 without per-slot layers)."""
        p = self.pools
        return self.windowed_tokens(num_tokens, num_slots) * p.windowed_cell_bytes + num_slots * p.state_bytes_per_slot

    def state_slots(self, num_slots: int) -> int:
        return num_slots + STATE_DUMMY_SLOTS if self.pools.linear_layers else 0

    def state_bytes(self, num_slots: int) -> int:
        return self.state_slots(num_slots) * self.pools.state_bytes_per_slot

    def bytes_for(self, num_tokens: int, num_slots: int) -> int:
        return self.windowed_bytes(num_tokens, num_slots) + self.map_bytes(num_tokens) + self.state_bytes(num_slots)


def layer_kind_counts(layer_kinds: tuple, num_layers: int) -> dict[str, int]:
    """Layers per kind; () means every layer full (model_shapes.TextShape.layer_kinds)."""
    kinds = tuple(layer_kinds) or ("full",) * num_layers
    if len(kinds) != num_layers:
        raise ValueError(f"layer_kinds lists {len(kinds)} layers, the model has {num_layers}")
    counts = {k: 0 for k in LAYER_KINDS}
    for k in kinds:
        if k not in counts:
            raise ValueError(f"unknown layer kind {k!r}; known: {tuple(counts)}")
        counts[k] += 1
    return counts


def split_kv_cell(text, cell, tp: int = 1, context_len: Optional[int] = None, page_size: int = 1):
    """(the full layers' KVCellSpec, LayerPools) of a text shape whose all-layer cell is `cell` (ModelShape.kv_cell).

    With the planned context_len (and page size), a sliding / chunked kind whose bound reaches it is priced full (module
    docstring). A shape whose layers are all full gets `cell` back unchanged and NO_LAYER_POOLS, so its plan is what it
    was; one whose windowed layers all reach the context gets the same cell (every layer) and only the layer line."""
    counts = layer_kind_counts(text.layer_kinds, text.num_layers)
    if counts["full"] == text.num_layers:
        return cell, NO_LAYER_POOLS
    bound_of = {"sliding": text.sliding_window, "chunked": text.attention_chunk_size}
    if any(counts[k] and b <= 0 for k, b in bound_of.items()):
        raise ValueError(f"{text.model_type}: sliding / chunked layers need sliding_window / attention_chunk_size > 0")
    as_full = {k: counts[k] if context_len is not None and window_tokens_per_slot(b, page_size) >= context_len else 0
               for k, b in bound_of.items()}
    kept = {k: counts[k] - as_full[k] for k in bound_of}  # windowed layers that keep a window
    full = counts["full"] + sum(as_full.values())
    windowed = sum(kept.values())
    win_cell = dataclasses.replace(cell, num_layers=windowed)
    state = sum(t.bytes_per_rank(tp) for t in text.state_tensors) * counts["linear"]
    pools = LayerPools(
        full_layers=full, sliding_layers=kept["sliding"], chunked_layers=kept["chunked"],
        linear_layers=counts["linear"], window_tokens=max((bound_of[k] for k in kept if kept[k]), default=0),
        windowed_cell_bytes=win_cell.cell_bytes if windowed else 0,
        windowed_fixed_bytes=win_cell.fixed_bytes if windowed else 0,
        state_bytes_per_slot=state, sliding_as_full=as_full["sliding"], chunked_as_full=as_full["chunked"])
    return dataclasses.replace(cell, num_layers=full), pools


def windowed_layer_flags(text, pools: LayerPools) -> tuple[bool, ...]:
    """Per decoder layer: whether its K/V lives in the windowed pool (a sliding / chunked layer that keeps a window;
    one priced full by split_kv_cell stays in the full pool, masked by its window all the same)."""
    kept = {"sliding": pools.sliding_layers > 0, "chunked": pools.chunked_layers > 0}
    return tuple(kept.get(k, False) for k in (tuple(text.layer_kinds) or ("full",) * text.num_layers))
