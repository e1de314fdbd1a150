"""Device memory pools: the request-to-token table and the per-layer K/V token pool.

ReqToTokenPool.req_to_token: int64[size + branch_rows + 1, max_context_len]; row 0 is a dummy row, rows 1..size are
request slots, rows size + 1 .. size + branch_rows the side branches of speculative trees (alloc_branch).
The scheduler reads and writes its rows through the host copy (ReqToTokenPool.write / read / sync_to_device).
MHATokenToKVPool.k_buffer / v_buffer: [layer_num, size + page_size, head_num, head_dim]; slots [0, page_size) are the
dummy page that is never handed out, so real slots are [page_size, size + page_size).
Shapes and element sizes come from mem_plan/sizes.py, the numbers the memory plan charges.
The pools only hold memory; which slots are free is the allocator's business (allocator.py).
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Sequence

import torch

from sglang.srt.mem_plan.sizes import REQ_TO_TOKEN_DTYPE, kv_pool_rows


class ReqToTokenPool:
    """req_to_token: the device table the attention kernels read. req_to_token_host: the host's copy, where the
    scheduler reads and writes rows (slot lookups, releases, batch building) without ever waiting for the device.
    On a CPU device the two are one tensor. Elsewhere every write goes to the host copy and is queued; the model
    runner calls sync_to_device() once before each forward, which applies the queue with one scatter (three small
    host-to-device copies), so the device table holds every row a forward reads. The host copy costs host RAM of
    the table's size (pinned on CUDA, so those copies are asynchronous); it is not a device-plan term.
    Two kinds of rows, each with its own free list: `size` request slots (alloc / free: a request holds one while it
    is admitted) and `branch_rows` rows a verify step's tree borrows for its side branches (alloc_branch / free,
    all given back within the step; mem_plan/spec_sizes.branch_rows plans how many), so branches never take a
    request's slot and requests never take a branch's row."""

    def __init__(self, size: int, max_context_len: int, device: str = "cpu", host_mirror: Optional[bool] = None,
                 branch_rows: int = 0):
        if size <= 0:
            raise ValueError(f"ReqToTokenPool needs at least one request slot, got {size}.")
        if branch_rows < 0:
            raise ValueError(f"ReqToTokenPool branch_rows must be >= 0, got {branch_rows}.")
        self.size = size
        self.branch_rows = branch_rows
        rows = size + branch_rows + 1
        self.max_context_len = max_context_len
        self.device = device
        dtype = getattr(torch, REQ_TO_TOKEN_DTYPE)
        # torch.empty: on CPU a large table is backed lazily, page by page, as rows are used; a row is zeroed when
        # its slot is handed out, so stale indices never reach a backend.
        self.req_to_token = torch.empty((rows, max_context_len), dtype=dtype, device=device)
        self.req_to_token[0].zero_()
        mirrored = torch.device(device).type != "cpu" if host_mirror is None else host_mirror
        self.req_to_token_host = self.req_to_token
        if mirrored:
            pin = torch.device(device).type == "cuda" and torch.cuda.is_available()
            self.req_to_token_host = torch.zeros((rows, max_context_len), dtype=dtype, pin_memory=pin)
        self._pending_rows: List[int] = []  # queued device writes: req_to_token[row, col] = slot
        self._pending_cols: List[int] = []
        self._pending_slots: List[int] = []
        self.free_slots: List[int] = list(range(1, size + 1))
        self.free_branch_rows: List[int] = list(range(size + 1, size + branch_rows + 1))
        self.on_alloc: List = []  # callbacks(row) when a row is handed out
        # a KV pool's recent window whose ring rows follow the running requests (attach_window), or None
        self.window = None
        # linear-attention / SSM models: the per-slot state (mem_cache/linear_state_pool.py), row r = request slot r
        self.linear_state = None

    def attach_window(self, window) -> None:
        """A request slot handed out gets a ring row of window (recent_window.RecentWindow.assign), one freed gives
        it back: the rings cost what running requests hold (mem_plan/kv_window.py)."""
        self.window = window

    def free_all_but(self, held_slots: Iterable[int]) -> None:
        """Rebuild the free list: every slot not in held_slots is free (clear: none held; a repair after a fault:
        the slots of the requests that survive). The ring rows of the slots this frees go back to the window."""
        held = set(held_slots)
        slots = [s for s in range(1, self.size + 1) if s not in held]
        branch = list(range(self.size + 1, self.size + self.branch_rows + 1))  # a step's branches are gone too
        if self.window is not None:
            for row in (set(slots) - set(self.free_slots)) | (set(branch) - set(self.free_branch_rows)):
                self.window.release(row)
        self.free_slots, self.free_branch_rows = slots, branch

    @property
    def mirrored(self) -> bool:
        return self.req_to_token_host is not self.req_to_token

    def mem_usage_bytes(self) -> int:
        return self.req_to_token.numel() * self.req_to_token.element_size()

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self) -> Optional[int]:
        """A request slot, None when every one is held."""
        return self._hand_out(self.free_slots)

    def alloc_branch(self) -> Optional[int]:
        """A row for a tree's side branch (given back with free() within the step), None when every one is held."""
        return self._hand_out(self.free_branch_rows)

    def _hand_out(self, free: List[int]) -> Optional[int]:
        if not free:
            return None
        slot = free.pop()
        self.req_to_token[slot].zero_()  # a device kernel, no wait
        if self.mirrored:
            self.req_to_token_host[slot].zero_()
        for forget in self.on_alloc:
            forget(slot)
        if self.window is not None:
            self.window.assign(slot)
        return slot

    def free(self, slot: int) -> None:
        free = self.free_slots if slot <= self.size else self.free_branch_rows
        assert 1 <= slot <= self.size + self.branch_rows and slot not in free, f"bad request slot free: {slot}"
        free.append(slot)
        if self.window is not None:
            self.window.release(slot)

    def clear(self) -> None:
        self.free_all_but(())

    # ------------------------------------------------------------------ rows (host side)
    def write(self, row: int, start: int, slots: Sequence[int]) -> None:
        """req_to_token[row, start:start + len(slots)] = slots (on the device at the next sync_to_device)."""
        n = len(slots)
        self.req_to_token_host[row, start : start + n] = torch.tensor(slots, dtype=self.req_to_token_host.dtype)
        if self.mirrored:
            self._pending_rows.extend([row] * n)
            self._pending_cols.extend(range(start, start + n))
            self._pending_slots.extend(slots)

    def write_cells(self, rows: List[int], cols: List[int], slots: List[int]) -> None:
        """req_to_token[rows[i], cols[i]] = slots[i] for every i, with one indexed write (a decode step's new
        tokens, one per request)."""
        if len(rows) == 1:  # a plain element write costs a third of an indexed one
            self.req_to_token_host[rows[0], cols[0]] = slots[0]
        else:
            index = (torch.tensor(rows, dtype=torch.int64), torch.tensor(cols, dtype=torch.int64))
            self.req_to_token_host[index] = torch.tensor(slots, dtype=self.req_to_token_host.dtype)
        if self.mirrored:
            self._pending_rows.extend(rows)
            self._pending_cols.extend(cols)
            self._pending_slots.extend(slots)

    def read_cells(self, rows: List[int], cols: List[int]) -> List[int]:
        """[req_to_token[rows[i], cols[i]] for every i], from the host copy."""
        index = (torch.tensor(rows, dtype=torch.int64), torch.tensor(cols, dtype=torch.int64))
        return self.req_to_token_host[index].tolist()

    def read(self, row: int, start: int, end: int) -> List[int]:
        """The slots of row `row`, columns [start, end), from the host copy."""
        return self.req_to_token_host[row, start:end].tolist()

    def slots(self, row: int, start: int, end: int) -> torch.Tensor:
        """The same as a host int64 tensor (a view of the host copy)."""
        return self.req_to_token_host[row, start:end]

    def sync_to_device(self) -> int:
        """Apply the queued writes to the device table (no host wait); returns how many entries were written."""
        n = len(self._pending_slots)
        if n:
            device = self.req_to_token.device
            rows, cols, vals = (torch.tensor(x, dtype=torch.int64).to(device, non_blocking=True)
                                for x in (self._pending_rows, self._pending_cols, self._pending_slots))
            self.req_to_token.index_put_((rows, cols), vals.to(self.req_to_token.dtype))
            self._pending_rows, self._pending_cols, self._pending_slots = [], [], []
        return n

    def check_integrity(self, num_used: int) -> None:
        assert len(set(self.free_slots)) == len(self.free_slots), "duplicate free request slots"
        assert len(self.free_slots) + num_used == self.size, (
            f"request slots leak: free {len(self.free_slots)} + used {num_used} != {self.size}"
        )
        assert sorted(self.free_branch_rows) == list(range(self.size + 1, self.size + self.branch_rows + 1)), (
            f"branch rows held between steps: free {sorted(self.free_branch_rows)} of {self.branch_rows}")
        if self.window is not None:
            self.window.rows.check_integrity(set(range(1, self.size + 1)) - set(self.free_slots))


class KVCache:
    """Base of token-indexed KV pools; backends read k_buffer/v_buffer per layer."""

    size: int
    page_size: int
    dtype: torch.dtype
    layer_num: int

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        raise NotImplementedError

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        raise NotImplementedError

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        raise NotImplementedError

    # Windowed layers (layers/radix_attention.py: sliding_window_size). A pool with a windowed pool keeps those
    # layers' K/V apart, indexed by its own slots; req_to_token and out_cache_loc always hold the token pool's slots,
    # and windowed_slots maps them (a freed windowed position maps to the dummy page). get_key_buffer /
    # get_value_buffer of a windowed layer return its windowed buffer (index it with windowed_slots(...));
    # set_kv_buffer and gather_kv take token-pool slots for every layer and map them themselves.
    def is_windowed_layer(self, layer_id: int) -> bool:
        return False

    def windowed_slots(self, slots: torch.Tensor) -> torch.Tensor:
        return slots


class MHATokenToKVPool(KVCache):
    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        device: str = "cpu",
        v_head_dim: Optional[int] = None,
    ):
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        self.head_num = head_num
        self.head_dim = head_dim
        self.v_head_dim = v_head_dim or head_dim
        self.layer_num = layer_num
        self.device = device
        # fp8 KV is stored as uint8 views and cast on read/write
        self.store_dtype = torch.uint8 if dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else dtype
        rows = kv_pool_rows(size, page_size)
        # torch.empty: every slot is written before it is read, except the dummy page that padded reads point at,
        # which is zeroed (finite values, so masked-out padding never turns into NaN). On CPU the rest of the pool
        # is backed lazily as it fills.
        self.k_buffer = torch.empty((layer_num, rows, head_num, head_dim), dtype=self.store_dtype, device=device)
        self.v_buffer = torch.empty((layer_num, rows, head_num, self.v_head_dim), dtype=self.store_dtype, device=device)
        self.k_buffer[:, :page_size].zero_()
        self.v_buffer[:, :page_size].zero_()

    def mem_usage_bytes(self) -> int:
        """Everything allocated, the dummy page included (= the plan's kv_cache term)."""
        return self.k_buffer.numel() * self.k_buffer.element_size() + self.v_buffer.numel() * self.v_buffer.element_size()

    def _view(self, buf: torch.Tensor) -> torch.Tensor:
        return buf.view(self.dtype) if self.store_dtype != self.dtype else buf

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self._view(self.k_buffer[layer_id])

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self._view(self.v_buffer[layer_id])

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        # k: [N, head_num, head_dim], v: [N, head_num, v_head_dim]
        if k.dtype != self.dtype:
            k = k.to(self.dtype)
            v = v.to(self.dtype)
        if self.store_dtype != self.dtype:
            k = k.view(self.store_dtype)
            v = v.view(self.store_dtype)
        self.k_buffer[layer_id].index_copy_(0, loc, k)
        self.v_buffer[layer_id].index_copy_(0, loc, v)

    # the read interface the quantized pool shares (quantized_kv_pool.py): plain rows, no rotation
    def rotation(self, part: str) -> Optional[torch.Tensor]:
        return None

    def gather_kv(self, layer_id: int, index: torch.Tensor, dtype: torch.dtype, rotated: bool = False):
        """K [n, head_num, head_dim] and V [n, head_num, v_head_dim] of the slots `index`, in dtype."""
        k = self.get_key_buffer(layer_id).index_select(0, index)  # ~3x faster than advanced indexing on CPU
        v = self.get_value_buffer(layer_id).index_select(0, index)
        if k.dtype != dtype:
            k, v = k.to(dtype), v.to(dtype)
        return k, v
