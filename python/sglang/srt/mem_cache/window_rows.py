"""The recent window's rows as a small allocator of their own (host side; recent_window.RecentWindow holds the rings).

Rows 1..num_rows are handed to requests when they start running (ReqToTokenPool.alloc) and come back when they
finish or are retracted (ReqToTokenPool.free); row 0 is the scratch row of the requests that found none free, which
read their whole history through the codes (counted: num_without_row). Invariant (check_integrity): every row is
either free or held by exactly one request slot that is itself held, never both.
`fresh` records the rows handed out since the last take_fresh(): with --tp-size > 1 rank 0 sends them with the next
forward (distributed/batch_sync.py) so every rank empties the same rows before reading them.
"""

from __future__ import annotations

from typing import Dict, Iterable, List


class WindowRows:
    def __init__(self, num_rows: int):
        self.num_rows = num_rows
        self.free: List[int] = list(range(num_rows, 0, -1))  # pop() hands out row 1 first
        self.row_of: Dict[int, int] = {}  # request slot -> its row (slots without one are absent)
        self.fresh: set = set()
        self.num_without_row = 0  # requests that started running with every row taken

    def take(self, req_row: int) -> int:
        """A row for the request in req_row, 0 when none is free."""
        assert req_row not in self.row_of, f"request slot {req_row} already holds window row {self.row_of[req_row]}"
        if not self.free:
            self.num_without_row += 1
            return 0
        row = self.free.pop()
        self.row_of[req_row] = row
        self.fresh.add(row)
        return row

    def give_back(self, req_row: int) -> None:
        row = self.row_of.pop(req_row, 0)
        if row:
            self.free.append(row)

    def lookup(self, req_rows: Iterable[int]) -> List[int]:
        return [self.row_of.get(r, 0) for r in req_rows]

    def take_fresh(self) -> List[int]:
        fresh, self.fresh = sorted(self.fresh), set()
        return fresh

    def check_integrity(self, held_req_rows: set) -> None:
        held = list(self.row_of.values())
        assert len(set(self.free)) == len(self.free), "duplicate free window rows"
        assert not set(self.free) & set(held), "a window row is both free and held"
        assert len(set(held)) == len(held), "a window row held by two request slots"
        assert len(self.free) + len(held) == self.num_rows, (
            f"window rows leak: free {len(self.free)} + held {len(held)} != {self.num_rows}")
        stray = set(self.row_of) - held_req_rows
        assert not stray, f"window rows held by free request slots {sorted(stray)}"
