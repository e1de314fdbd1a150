"""Radix-tree prefix cache over KV slots, with LRU eviction of unlocked leaves.

Each edge holds a run of token ids (`key`) and the KV slots of those tokens (`value`), always a multiple of
page_size long, so every cached run covers whole pages that the tree alone owns. A request that reuses a
prefix locks the path to its last matched node (`inc_lock_ref`); locked nodes are never evicted.
Accounting: evictable_size() + protected_size() == total tokens in the tree.

Namespaces (upstream's cache_salt): requests with a salt match and insert under that salt's own root, so requests
with different salts never share a page, the same salt shares, and unsalted requests share only the main root. A
salt root holds no tokens (it is a root: never locked by a request, never evicted itself) and is dropped once its
last leaf is evicted; every node below it is an ordinary node, counted, locked and evicted as any other.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Callable, Dict, List, Optional, Tuple

_clock = itertools.count()


class TreeNode:
    __slots__ = ("children", "parent", "key", "value", "lock_ref", "last_access")

    def __init__(self, parent: Optional["TreeNode"] = None):
        self.children: Dict[Tuple[int, ...], TreeNode] = {}
        self.parent = parent
        self.key: List[int] = []
        self.value: List[int] = []
        self.lock_ref = 0
        self.last_access = next(_clock)

    def __lt__(self, other: "TreeNode") -> bool:
        return self.last_access < other.last_access


class RadixCache:
    def __init__(self, page_size: int, free_slots: Callable[[List[int]], None]):
        self.page_size = page_size
        self._free_slots = free_slots
        self.reset()

    def reset(self) -> None:
        self.root = TreeNode()
        self.root.lock_ref = 1  # the root is never evicted
        self.salt_roots: Dict[str, TreeNode] = {}  # cache_salt -> its namespace's root (parent None, like the root)
        self._evictable = 0
        self._protected = 0

    # ------------------------------------------------------------------ sizes
    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def total_size(self) -> int:
        return self._evictable + self._protected

    def _edge(self, key: List[int], i: int = 0) -> Tuple[int, ...]:
        return tuple(key[i : i + self.page_size])

    def _root(self, salt: Optional[str], create: bool) -> Optional[TreeNode]:
        """The root of `salt`'s namespace (the main root for None); None if it has none and create is False."""
        if salt is None:
            return self.root
        root = self.salt_roots.get(salt)
        if root is None and create:
            root = self.salt_roots[salt] = TreeNode()
            root.lock_ref = 1
        return root

    # ------------------------------------------------------------------ lookup
    def match_prefix(self, key: List[int], salt: Optional[str] = None) -> Tuple[List[int], TreeNode]:
        """Longest cached page-aligned prefix of `key` within `salt`'s namespace: (its slots, the deepest node of
        the match; a root when nothing matched)."""
        ps = self.page_size
        key = key[: len(key) // ps * ps]
        node = self._root(salt, create=False)
        if node is None:
            return [], self.root
        slots: List[int] = []
        i = 0
        now = next(_clock)
        node.last_access = now
        while i < len(key):
            child = node.children.get(self._edge(key, i))
            if child is None:
                break
            n = self._common_len(child.key, key, i)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            slots.extend(child.value)
            i += n
            node = child
        return slots, node

    def _common_len(self, node_key: List[int], key: List[int], start: int) -> int:
        ps = self.page_size
        n = 0
        limit = min(len(node_key), len(key) - start)
        while n + ps <= limit and node_key[n : n + ps] == key[start + n : start + n + ps]:
            n += ps
        return n

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Split `child` after its first n tokens; returns the new upper node."""
        upper = TreeNode(child.parent)
        upper.key, upper.value = child.key[:n], child.value[:n]
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        child.parent.children[self._edge(upper.key)] = upper
        child.key, child.value = child.key[n:], child.value[n:]
        child.parent = upper
        upper.children[self._edge(child.key)] = child
        return upper

    # ------------------------------------------------------------------ insert
    def insert(self, key: List[int], value: List[int], salt: Optional[str] = None) -> int:
        """Cache key -> value (page-aligned) in `salt`'s namespace. Returns how many leading tokens were already
        cached; the caller still owns value[:that] (duplicates of cached slots) and must free them."""
        ps = self.page_size
        assert len(key) == len(value) and len(key) % ps == 0
        node = self._root(salt, create=bool(key))
        if node is None:
            return 0
        i = 0
        now = next(_clock)
        while i < len(key):
            child = node.children.get(self._edge(key, i))
            if child is None:
                new = TreeNode(node)
                new.key, new.value = key[i:], value[i:]
                new.last_access = now
                node.children[self._edge(new.key)] = new
                self._evictable += len(new.key)
                return i
            n = self._common_len(child.key, key, i)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            i += n
            node = child
        return i

    # ------------------------------------------------------------------ locking
    def inc_lock_ref(self, node: TreeNode) -> None:
        while node.parent is not None:  # up to its namespace's root
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        while node.parent is not None:
            assert node.lock_ref > 0, "radix node unlocked more often than locked"
            if node.lock_ref == 1:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
            node.lock_ref -= 1
            node = node.parent

    # ------------------------------------------------------------------ eviction
    def evict(self, num_tokens: int) -> int:
        """Free at least num_tokens cached tokens (least recently used unlocked leaves first), if possible."""
        leaves = [n for n in self._iter_nodes() if not n.children and n.lock_ref == 0]
        heapq.heapify(leaves)
        freed = 0
        while freed < num_tokens and leaves:
            leaf = heapq.heappop(leaves)
            self._free_slots(leaf.value)
            freed += len(leaf.value)
            self._evictable -= len(leaf.key)
            parent = leaf.parent
            del parent.children[self._edge(leaf.key)]
            if parent.parent is not None and not parent.children and parent.lock_ref == 0:
                heapq.heappush(leaves, parent)
        for salt in [s for s, root in self.salt_roots.items() if not root.children]:
            del self.salt_roots[salt]
        return freed

    def _iter_nodes(self):
        """Every node of every namespace, roots excluded."""
        stack = [c for root in (self.root, *self.salt_roots.values()) for c in root.children.values()]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def check_integrity(self) -> None:
        total = evictable = 0
        for n in self._iter_nodes():
            assert len(n.key) == len(n.value) and len(n.key) % self.page_size == 0
            assert n.lock_ref >= 0
            for c in n.children.values():
                assert c.parent is n
                assert n.lock_ref >= c.lock_ref, "a locked node has an unlocked ancestor"
            total += len(n.key)
            if n.lock_ref == 0:
                evictable += len(n.key)
        assert total == self.total_size(), f"radix size drift: {total} != {self.total_size()}"
        assert evictable == self._evictable, f"radix evictable drift: {evictable} != {self._evictable}"

    def all_slots(self) -> List[int]:
        out: List[int] = []
        for n in self._iter_nodes():
            out.extend(n.value)
        return out
