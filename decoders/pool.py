"""The n-gram pool: n-grams keyed by their first token, at most ``cap`` continuations per key.

A re-inserted n-gram moves to the front; when a key is full the least recently inserted continuation
is evicted. Insert and lookup are O(1) per n-gram (dict-backed, insertion ordered).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class NgramPool:
    def __init__(self, n: int, cap: int) -> None:
        if n < 2:
            raise ValueError(f"n-gram size must be >= 2, got {n}")
        self.n = n
        self.cap = cap
        self._by_key: dict[int, dict[tuple[int, ...], None]] = {}

    def add(self, ngram: Sequence[int]) -> None:
        if self.cap <= 0:
            return
        key, cont = ngram[0], tuple(ngram[1:])
        conts = self._by_key.setdefault(key, {})
        if cont in conts:
            del conts[cont]  # refresh: re-insert as newest
        elif len(conts) >= self.cap:
            del conts[next(iter(conts))]  # evict the oldest
        conts[cont] = None

    def add_from(self, tokens: Sequence[int]) -> None:
        """Insert every n-gram of ``tokens`` in order (later ones end up newest)."""
        for i in range(len(tokens) - self.n + 1):
            self.add(tokens[i : i + self.n])

    def add_all(self, ngrams: Iterable[Sequence[int]]) -> None:
        for g in ngrams:
            self.add(g)

    def get(self, key: int) -> list[tuple[int, ...]]:
        """Continuations (n-1 tokens each) for ``key``, newest first."""
        conts = self._by_key.get(key)
        return list(reversed(conts)) if conts else []

    def __len__(self) -> int:
        return sum(len(c) for c in self._by_key.values())
