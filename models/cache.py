"""The expert cache: N experts kept in RAM, evicted by route hotness (docs/planner.md). Pure logic.

Every expert (resident or not) has a selection count: +1 each time a token's router chooses it,
halved every HOTNESS_HALVING_TOKENS tokens. When the cache is full, the resident expert with the
lowest count goes first; among equal counts, the least recently used. Halving is exact in
floating point (a power-of-two scale), so it never reorders experts and never invents ties.

Experts are numbered globally, `layer * experts_per_layer + expert`. The cache stores an opaque
value per expert (the engine keeps dequantized weights; replay keeps nothing).
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from .constants import HOTNESS_HALVING_TOKENS


class ExpertCache:
    def __init__(self, capacity: int, total_experts: int, halving_tokens: int = HOTNESS_HALVING_TOKENS):
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = capacity
        self.halving_tokens = halving_tokens
        self.hot = np.zeros(total_experts, dtype=np.float64)     # selection counts
        self.last = np.zeros(total_experts, dtype=np.int64)      # use clock of the last selection/admission
        self.resident = np.zeros(total_experts, dtype=bool)
        self.values: dict[int, Any] = {}
        self.clock = 0
        self.tokens = 0
        self.hits = 0
        self.misses = 0
        self.miss_counts = np.zeros(total_experts, dtype=np.int64)   # per expert: the usage history (models.usage)
        self.evictions = 0

    def __len__(self) -> int:
        return len(self.values)

    def __contains__(self, key: int) -> bool:
        return bool(self.resident[key])

    def select(self, keys: Iterable[int], counts: Iterable[int] | None = None) -> None:
        """Record router selections (each key chosen `count` times, default once) and use them now."""
        keys = np.asarray(list(keys) if not isinstance(keys, np.ndarray) else keys, dtype=np.int64)
        if keys.size == 0:
            return
        given = counts if counts is None or isinstance(counts, np.ndarray) else list(counts)
        c = np.ones(keys.size) if given is None else np.asarray(given, dtype=np.float64)
        np.add.at(self.hot, keys, c)
        self.clock += 1
        self.last[keys] = self.clock

    def advance(self, tokens: int = 1) -> None:
        """Count processed tokens; halve every count at each multiple of halving_tokens."""
        before = self.tokens // self.halving_tokens
        self.tokens += tokens
        halvings = self.tokens // self.halving_tokens - before
        if halvings:
            self.hot *= 0.5 ** halvings

    def lookup(self, key: int) -> tuple[bool, Any]:
        """(hit, value); counts the hit or miss."""
        if self.resident[key]:
            self.hits += 1
            return True, self.values[key]
        self.misses += 1
        self.miss_counts[key] += 1
        return False, None

    def count_misses(self, keys: Iterable[int]) -> None:
        """Record misses found without `lookup` (replay asks `resident` for a whole layer at once)."""
        keys = np.asarray(list(keys), dtype=np.int64)
        self.misses += int(keys.size)
        np.add.at(self.miss_counts, keys, 1)

    def victim(self, protect: Iterable[int] = ()) -> int | None:
        """The resident expert to evict: lowest count, then least recently used; None if none."""
        cand = np.flatnonzero(self.resident)
        protect = list(protect)
        if protect:
            cand = cand[~np.isin(cand, protect)]
        if cand.size == 0:
            return None
        h = self.hot[cand]
        cand = cand[h == h.min()]
        return int(cand[np.argmin(self.last[cand])])

    def admit(self, key: int, value: Any = None, protect: Iterable[int] = ()) -> list[int]:
        """Insert `key`, evicting as needed (never a key in `protect`); returns the evicted keys.
        With capacity 0, or when everything resident is protected, the key is not kept."""
        if self.resident[key]:
            self.values[key] = value
            return []
        evicted = []
        while len(self.values) >= self.capacity:
            v = self.victim(list(protect) + [key])
            if v is None:
                return evicted
            self.resident[v] = False
            del self.values[v]
            evicted.append(v)
            self.evictions += 1
        self.resident[key] = True
        self.values[key] = value
        self.clock += 1
        self.last[key] = self.clock
        return evicted
