"""Radix prefix cache for models with windowed (sliding-window) layers.

A node's `value` holds token-pool slots, as in radix_cache.py. Beside that, a node either still holds the
windowed K/V of its tokens (`windowed`) or is a tombstone: its windowed pages were freed on their own while the
token-pool pages stay (hybrid model: full layers + windowed layers, one token pool + one windowed pool, a page
map between them owned by the allocator). On a windowed-only model (Mistral: the windowed pool IS the token pool)
a tombstone holds no KV at all: its value entries are 0 (the dummy page) and it is only a key placeholder.

A hit needs the window: match_prefix returns the longest prefix whose last min(W, len) tokens all hold windowed
K/V. A run of live tokens that starts at position 0 always qualifies; after a tombstone, a run qualifies from its
W-th token on, so the best match always ends where a live run ends.

Locks. `lock_ref` (full) pins a path as in radix_cache.py. `window_lock_ref` pins windowed K/V: a request that
borrows a prefix of length L needs positions [L - W, L) (page-aligned down: [s, L)), so the node holding position
s is split at s and exactly the nodes at or after s get a window lock. s depends on L alone, and splits never
undo a boundary, so dec_lock_ref finds the same nodes without a handle. Invariants: window_lock_ref <= lock_ref;
a window-locked node is live; an unlocked tombstone is never a leaf (it could never end a hit and would hold
token pages for nothing, so it is deleted the moment it becomes one).

LRU: a node's last_access is (tick, start): one tick per match/insert, and along one path the ancestor is older,
so windowed eviction tombstones the part nearest the root first (a later hit needs only its last W tokens).

Sizes. The token pool (evictable/protected/total_size, what ReqMemory reads): every node on a hybrid model; only
live nodes on a windowed-only one, where evict() frees pages by windowed eviction. The windowed pool
(windowed_*_size): live nodes. evictable + protected == total for both.
"""

from __future__ import annotations

import heapq
import itertools
from typing import List, Optional, Tuple

from sglang.srt.mem_cache.radix_cache import RadixCache, TreeNode


class SWATreeNode(TreeNode):
    __slots__ = ("window_lock_ref", "windowed", "start")

    def __init__(self, parent: Optional["SWATreeNode"] = None, start: int = 0):
        super().__init__(parent)
        self.window_lock_ref = 0
        self.windowed = True  # False: a tombstone (windowed K/V freed)
        self.start = start  # position of key[0] within its namespace's sequences
        self.last_access = (0, start)

    @property
    def end(self) -> int:
        return self.start + len(self.key)


class SWARadixCache(RadixCache):
    """allocator (swa_allocator.py): free(slots) frees token-pool pages and whatever windowed pages they still map;
    free_windowed(slots) frees only their windowed pages; windowed_only: the windowed pool is the token pool
    (free_windowed is free)."""

    def __init__(self, page_size: int, allocator, window_tokens: int):
        if window_tokens <= 0:
            raise ValueError(f"SWARadixCache needs a positive window, got {window_tokens} tokens")
        self.allocator = allocator
        self.window_tokens = window_tokens
        self.windowed_only = bool(allocator.windowed_only)
        self._ticks = itertools.count(1)
        super().__init__(page_size, allocator.free)

    def reset(self) -> None:
        super().reset()
        self.root = self._new_root()
        self._full_total = self._full_protected = 0  # tokens of all nodes / of nodes with lock_ref > 0
        self._win_total = self._win_protected = 0  # tokens of live nodes / of nodes with window_lock_ref > 0

    def _new_root(self) -> SWATreeNode:
        root = SWATreeNode()
        root.lock_ref = 1  # roots are never evicted
        return root

    def _root(self, salt: Optional[str], create: bool) -> Optional[SWATreeNode]:
        if salt is None:
            return self.root
        root = self.salt_roots.get(salt)
        if root is None and create:
            root = self.salt_roots[salt] = self._new_root()
        return root

    # ------------------------------------------------------------------ sizes
    def windowed_total_size(self) -> int:
        return self._win_total

    def windowed_protected_size(self) -> int:
        return self._win_protected

    def windowed_evictable_size(self) -> int:
        return self._win_total - self._win_protected

    def total_size(self) -> int:
        return self._win_total if self.windowed_only else self._full_total

    def protected_size(self) -> int:
        return self._win_protected if self.windowed_only else self._full_protected

    def evictable_size(self) -> int:
        return self.total_size() - self.protected_size()

    # ------------------------------------------------------------------ structure
    def _split(self, child: SWATreeNode, n: int) -> SWATreeNode:
        """Split `child` after its first n tokens; the new upper node shares its locks, liveness and tick."""
        upper = SWATreeNode(child.parent, child.start)
        upper.key, upper.value = child.key[:n], child.value[:n]
        upper.lock_ref, upper.window_lock_ref, upper.windowed = child.lock_ref, child.window_lock_ref, child.windowed
        upper.last_access = (child.last_access[0], upper.start)
        child.parent.children[self._edge(upper.key)] = upper
        child.key, child.value = child.key[n:], child.value[n:]
        child.start += n
        child.last_access = (child.last_access[0], child.start)
        child.parent = upper
        upper.children[self._edge(child.key)] = child
        return upper

    def _add(self, parent: SWATreeNode, key: List[int], value: List[int], windowed: bool, tick: int) -> SWATreeNode:
        new = SWATreeNode(parent, parent.end)
        new.key, new.windowed = key, windowed
        new.value = value if windowed or not self.windowed_only else [0] * len(key)
        new.last_access = (tick, new.start)
        parent.children[self._edge(key)] = new
        self._full_total += len(key)
        self._win_total += len(key) if windowed else 0
        return new

    def _delete_leaf(self, leaf: SWATreeNode) -> Tuple[int, int, SWATreeNode]:
        """Remove an unlocked leaf, freeing what it holds; then every unlocked tombstone that became a leaf.
        Returns (token-pool tokens, windowed tokens) freed and the deepest node left on its path."""
        freed_full = freed_win = 0
        node = leaf
        while True:
            assert not node.children and node.lock_ref == 0 and node.window_lock_ref == 0
            n = len(node.key)
            if node.windowed or not self.windowed_only:
                self.allocator.free(node.value)
                freed_full += n
            if node.windowed:
                freed_win += n
                self._win_total -= n
            self._full_total -= n
            del node.parent.children[self._edge(node.key)]
            node = node.parent
            if node.parent is None or node.children or node.lock_ref or node.windowed:
                return freed_full, freed_win, node

    def _tombstone(self, node: SWATreeNode) -> None:
        assert node.windowed and node.window_lock_ref == 0
        self.allocator.free_windowed(node.value)
        node.windowed = False
        self._win_total -= len(node.key)
        if self.windowed_only:
            node.value = [0] * len(node.key)

    def _drop_empty_salt_roots(self) -> None:
        for salt in [s for s, root in self.salt_roots.items() if not root.children]:
            del self.salt_roots[salt]

    # ------------------------------------------------------------------ lookup
    def match_prefix(self, key: List[int], salt: Optional[str] = None) -> Tuple[List[int], SWATreeNode]:
        """Longest cached page-aligned prefix of `key` whose last min(W, len) tokens hold windowed K/V: (its
        slots, the node it ends at; a root when none). On a windowed-only model a tombstone's slots are 0."""
        ps = self.page_size
        key = key[: len(key) // ps * ps]
        node = self._root(salt, create=False)
        if node is None:
            return [], self.root
        path: List[SWATreeNode] = []
        i = 0
        while i < len(key):
            child = node.children.get(self._edge(key, i))
            if child is None:
                break
            n = self._common_len(child.key, key, i)
            if n < len(child.key):
                child = self._split(child, n)
            path.append(child)
            i += n
            node = child
        best, run_start = 0, 0  # run_start: where the live run ending at the current node began (None: tombstone)
        for k, x in enumerate(path):
            if not x.windowed:
                run_start = None
                continue
            if run_start is None:
                run_start = x.start
            if run_start == 0 or x.end - run_start >= self.window_tokens:
                best = k + 1
        tick = next(self._ticks)
        slots: List[int] = []
        for x in path[:best]:
            x.last_access = (tick, x.start)
            slots.extend(x.value)
        return slots, (path[best - 1] if best else self._root(salt, create=False))

    # ------------------------------------------------------------------ insert
    def insert(self, key: List[int], value: List[int], salt: Optional[str] = None, *, windowed_from: int,
               borrowed_len: int) -> int:
        """Cache a finished request's key -> value (page-aligned). value[:borrowed_len] is the prefix it borrowed
        from this cache (untouched); the cache takes ownership of every slot in value[borrowed_len:] -- keeping it,
        or freeing it when the tokens are already cached -- so the caller frees none of them. Positions below
        windowed_from carry no windowed K/V (the request freed those pages; on a windowed-only model those
        entries are not slots at all). Returns how many leading tokens were already cached. Both bounds are
        required: RadixCache.insert's caller frees value[prefix_len:cached] itself, which here would free twice."""
        ps = self.page_size
        assert len(key) == len(value) and len(key) % ps == 0
        assert windowed_from % ps == 0 and borrowed_len % ps == 0, "windowed_from / borrowed_len not page aligned"
        node = self._root(salt, create=bool(key))
        if node is None:
            return 0
        tick = next(self._ticks)
        i = 0
        while i < len(key):
            child = node.children.get(self._edge(key, i))
            if child is None:
                break
            n = self._common_len(child.key, key, i)
            for cut in (borrowed_len, windowed_from):  # one node lies wholly on one side of each boundary
                if i < cut < i + n:
                    n = cut - i
            if n < len(child.key):
                child = self._split(child, n)
            if i >= borrowed_len:
                self._absorb(child, value[i : i + n], incoming_windowed=i >= windowed_from)
            child.last_access = (tick, child.start)
            i += n
            node = child
        cached = i
        if i < len(key):
            if windowed_from >= len(key):  # a tail with no windowed K/V could never end a hit: not kept
                self._free_incoming(value[i:], incoming_windowed=False)
                return cached
            if windowed_from > i:
                node = self._add(node, key[i:windowed_from], value[i:windowed_from], False, tick)
                i = windowed_from
            self._add(node, key[i:], value[i:], True, tick)
        return cached

    def _free_incoming(self, slots: List[int], incoming_windowed: bool) -> None:
        """Free a request's slots the cache does not keep. Without windowed K/V on a windowed-only model they
        were freed already (they are not slots)."""
        if incoming_windowed or not self.windowed_only:
            self.allocator.free(slots)

    def _absorb(self, node: SWATreeNode, slots: List[int], incoming_windowed: bool) -> None:
        """The request's own copy of tokens `node` already caches: revive a tombstone with the request's windowed
        K/V when its pages can be swapped (windowed-only: a tombstone holds nothing; hybrid: nobody borrows the
        node's slots), else free the copy."""
        if incoming_windowed and not node.windowed and (self.windowed_only or node.lock_ref == 0):
            if not self.windowed_only:
                self.allocator.free(node.value)  # token-pool pages only: their windowed pages are gone
            node.value = slots
            node.windowed = True
            self._win_total += len(node.key)
            return
        self._free_incoming(slots, incoming_windowed)

    # ------------------------------------------------------------------ locking
    def _window_start(self, node: SWATreeNode) -> int:
        return max(0, node.end - self.window_tokens) // self.page_size * self.page_size

    def inc_lock_ref(self, node: SWATreeNode) -> None:
        """Pin the path to `node` (token pool) and the windowed K/V of its last W tokens (page-aligned)."""
        if node.parent is None:
            return
        s = self._window_start(node)
        x = node
        while x.parent is not None and x.start > s:
            x = x.parent
        if x.parent is not None and x.start < s:
            self._split(x, s - x.start)
        x = node
        while x.parent is not None:
            if x.lock_ref == 0:
                self._full_protected += len(x.key)
            x.lock_ref += 1
            if x.start >= s:
                assert x.windowed, "window-locking a tombstone: the match did not hold the window"
                if x.window_lock_ref == 0:
                    self._win_protected += len(x.key)
                x.window_lock_ref += 1
            x = x.parent

    def release_window(self, node: SWATreeNode) -> None:
        """Drop only the window lock a holder of `node` took (it no longer reads those positions: its own tokens
        moved past them). Pass window_released=True to the holder's dec_lock_ref later."""
        s = self._window_start(node)
        x = node
        while x.parent is not None and x.start >= s:
            assert x.window_lock_ref > 0, "radix node window-unlocked more often than locked"
            x.window_lock_ref -= 1
            if x.window_lock_ref == 0:
                self._win_protected -= len(x.key)
            x = x.parent

    def dec_lock_ref(self, node: SWATreeNode, window_released: bool = False) -> None:
        if node.parent is None:
            return
        if not window_released:
            self.release_window(node)
        x = node
        while x.parent is not None:
            assert x.lock_ref > x.window_lock_ref, "radix node unlocked more often than locked"
            x.lock_ref -= 1
            if x.lock_ref == 0:
                self._full_protected -= len(x.key)
            x = x.parent
        if not node.windowed and not node.children and node.lock_ref == 0:
            self._delete_leaf(node)
            self._drop_empty_salt_roots()

    # ------------------------------------------------------------------ eviction
    def evict(self, num_tokens: int) -> int:
        """Free at least num_tokens token-pool tokens if possible: least recently used unlocked leaves first
        (a windowed-only model's token pool is its windowed pool: windowed eviction). Returns tokens freed."""
        if self.windowed_only:
            return self.evict_windowed(num_tokens)
        leaves = [n for n in self._iter_nodes() if not n.children and n.lock_ref == 0]
        heapq.heapify(leaves)
        freed = 0
        while freed < num_tokens and leaves:
            n, _, left = self._delete_leaf(heapq.heappop(leaves))
            freed += n
            if left.parent is not None and not left.children and left.lock_ref == 0:
                heapq.heappush(leaves, left)
        self._drop_empty_salt_roots()
        return freed

    def evict_windowed(self, num_tokens: int) -> int:
        """Free at least num_tokens windowed tokens if possible, least recently used first among live nodes no
        request window-locks: an unlocked leaf is deleted (both pools), any other node becomes a tombstone
        (windowed pages only). Returns windowed tokens freed."""
        nodes = [n for n in self._iter_nodes() if n.windowed and n.window_lock_ref == 0]
        heapq.heapify(nodes)
        freed = 0
        while freed < num_tokens and nodes:
            x = heapq.heappop(nodes)
            if not x.children and x.lock_ref == 0:
                freed += self._delete_leaf(x)[1]
            else:
                self._tombstone(x)
                freed += len(x.key)
        self._drop_empty_salt_roots()
        return freed

    # ------------------------------------------------------------------ checks
    def check_integrity(self) -> None:
        full = full_prot = win = win_prot = 0
        roots = (self.root, *self.salt_roots.values())
        for root in roots:
            assert root.start == 0 and not root.key and root.windowed
        for n in self._iter_nodes():
            assert len(n.key) == len(n.value) and len(n.key) and len(n.key) % self.page_size == 0
            assert n.start == n.parent.end, "node start drift"
            assert n.parent.children.get(self._edge(n.key)) is n
            assert 0 <= n.window_lock_ref <= n.lock_ref, "window lock without a full lock"
            assert n.windowed or n.window_lock_ref == 0, "a window-locked tombstone"
            assert n.windowed or n.children or n.lock_ref, "an unlocked tombstone leaf"
            assert n.parent.parent is None or n.parent.lock_ref >= n.lock_ref, "a locked node's ancestor is not"
            if self.windowed_only and not n.windowed:
                assert not any(n.value), "a windowed-only tombstone claims slots"
            full += len(n.key)
            full_prot += len(n.key) if n.lock_ref else 0
            win += len(n.key) if n.windowed else 0
            win_prot += len(n.key) if n.window_lock_ref else 0
        got = (self._full_total, self._full_protected, self._win_total, self._win_protected)
        want = (full, full_prot, win, win_prot)
        assert want == got, f"swa radix size drift: {want} != {got}"

    def all_slots(self) -> List[int]:
        """Token-pool slots the cache holds (a windowed-only model's tombstones hold none)."""
        return [s for n in self._iter_nodes() if n.windowed or not self.windowed_only for s in n.value]

    def windowed_slots(self) -> List[int]:
        """Token-pool slots whose windowed pages the cache holds."""
        return [s for n in self._iter_nodes() if n.windowed for s in n.value]
