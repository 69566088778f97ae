"""The lookahead branch: a 2-D window of W columns x (N-1) levels of the Jacobi trajectory.

Level ``l`` column ``j`` sits at position ``l + j + 1`` after the root. It sees the root, the level-0
tokens of the columns to its left (positions 1..j) and the lower levels of its own column (positions
j+1..j+l): a complete left context, so the output of the top level at column j is the model's guess
for position ``top + j + 2``. Each column read bottom-to-top plus that output is an n-gram of tokens
each predicted right after its predecessor; those n-grams feed the pool. Then the window slides: the
oldest level is dropped and the outputs become the new top level. During the first N-2 steps the
window is still filling (levels are appended, no n-grams harvested), as in the paper's warm-up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class LookaheadWindow:
    W: int
    N: int
    levels: list[list[int]] = field(default_factory=list)  # levels[l][j], oldest first
    _layouts: dict[int, tuple[list[int], list[list[bool]]]] = field(default_factory=dict)

    @classmethod
    def seeded(cls, W: int, N: int, prompt_ids: list[int], rng: np.random.Generator) -> LookaheadWindow:
        """Level 0 starts as random prompt tokens (deterministic for a fixed rng)."""
        picks = rng.integers(0, len(prompt_ids), size=W)
        return cls(W=W, N=N, levels=[[prompt_ids[int(i)] for i in picks]])

    @property
    def full(self) -> bool:
        return len(self.levels) == self.N - 1

    @property
    def size(self) -> int:
        """Tokens the window feeds this step (W per level filled so far)."""
        return self.W * len(self.levels)

    def tokens(self) -> list[int]:
        """Window tokens, level-major: level 0 columns 0..W-1, then level 1, ..."""
        return [t for level in self.levels for t in level]

    def layout(self) -> tuple[list[int], list[list[bool]]]:
        """(relative positions [n], mask [n][n] among window tokens) for the current level count, cached:
        callers must not modify them."""
        n_lev = len(self.levels)
        cached = self._layouts.get(n_lev)
        if cached is None:
            W = self.W
            n = n_lev * W
            rel = [lev + col + 1 for lev in range(n_lev) for col in range(W)]
            mask = [[False] * n for _ in range(n)]
            for lev in range(n_lev):
                for col in range(W):
                    i = lev * W + col
                    for j in [*range(col), *range(col, (lev + 1) * W, W)]:
                        mask[i][j] = True  # level 0 columns to the left; its own column, levels 0..lev
            cached = (rel, mask)
            self._layouts[n_lev] = cached
        return cached

    def top_rows(self) -> range:
        """Indices (within the window block) whose outputs form the next level."""
        start = (len(self.levels) - 1) * self.W
        return range(start, start + self.W)

    def advance(self, outputs: list[int]) -> list[tuple[int, ...]]:
        """Slide with the top level's outputs; return the harvested n-grams (empty while filling)."""
        ngrams: list[tuple[int, ...]] = []
        if self.full:
            ngrams = [tuple(level[j] for level in self.levels) + (outputs[j],) for j in range(self.W)]
            self.levels.pop(0)
        self.levels.append(list(outputs))
        return ngrams
