"""Draft trees: how any proposal is laid into one forward and verified.

PLD and Jacobi propose one chain, lookahead proposes up to G n-grams; all become a token tree hanging
off the root (the last accepted token, not yet in the cache). Shared prefixes are merged, so a tree
costs one input token per distinct node. Verification walks the tree from the root:

- greedy: follow the child equal to the argmax at the current node; the argmax where the walk stops
  is the bonus token. The output is exactly the greedy continuation.
- sampling (paper Appendix B, one-hot drafts): at each node try the children in order, accepting child
  x with probability p(x) under the warped target p; on rejection set p(x) = 0 and renormalise; if all
  are rejected (or there are none) sample the bonus from what is left. Every emitted token is then
  distributed exactly as under autoregressive sampling.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from decoders.sampling import SamplingParams, target_probs


@dataclass
class DraftTree:
    """Nodes in insertion order; ``parents[i] == -1`` means the node hangs off the root."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)  # root children have depth 1
    children: list[dict[int, int]] = field(default_factory=lambda: [{}])  # [0] = root's, [i+1] = node i's

    @classmethod
    def from_chains(cls, chains: list[list[int]] | list[tuple[int, ...]], max_nodes: int | None = None) -> DraftTree:
        """Merge ``chains`` in order; with ``max_nodes``, a chain that would exceed it is cut short
        (so earlier, better-ranked chains keep their full depth)."""
        tree = cls()
        for chain in chains:
            tree.add_chain(chain, max_nodes)
        return tree

    def add_chain(self, chain: list[int] | tuple[int, ...], max_nodes: int | None = None) -> None:
        parent = -1
        for tok in chain:
            kids = self.children[parent + 1]
            node = kids.get(tok)
            if node is None:
                if max_nodes is not None and len(self.tokens) >= max_nodes:
                    return
                node = len(self.tokens)
                kids[tok] = node
                self.tokens.append(tok)
                self.parents.append(parent)
                self.depths.append(1 if parent < 0 else self.depths[parent] + 1)
                self.children.append({})
            parent = node

    def __len__(self) -> int:
        return len(self.tokens)

    def mask(self) -> list[list[bool]]:
        """[T][T]: node i sees node j iff j is i or an ancestor of i. Python rows, as the window's layout:
        a step lays its whole mask out in lists and makes one tensor of it (each numpy or torch call on a
        step's few rows cost more than the arithmetic, after a forward had flushed the caches)."""
        t = len(self.tokens)
        rows: list[list[bool]] = []
        for i, p in enumerate(self.parents):
            row = list(rows[p]) if p >= 0 else [False] * t
            row[i] = True
            rows.append(row)
        return rows


@dataclass(frozen=True)
class Verdict:
    """Outcome of verifying a tree: emitted tokens (accepted drafts + bonus) and the nodes to keep."""

    tokens: list[int]
    nodes: list[int]  # accepted tree nodes, root-to-leaf; their cache entries are kept


def verify_greedy(tree: DraftTree, pred: list[int]) -> Verdict:
    """``pred[0]`` is the argmax at the root, ``pred[i+1]`` the argmax at node i."""
    nodes: list[int] = []
    tokens: list[int] = []
    at = -1
    while True:
        tok = pred[at + 1]
        tokens.append(tok)
        nxt = tree.children[at + 1].get(tok)
        if nxt is None:
            return Verdict(tokens, nodes)
        nodes.append(nxt)
        at = nxt


def verify_sampling(
    tree: DraftTree, logits: torch.Tensor, params: SamplingParams, gen: torch.Generator
) -> Verdict:
    """``logits``: [1 + T (+ more), vocab] rows for the root and each node (float32, any device); rows
    after the tree's (a lookahead step's window) are not read.

    Each visited row is warped on the CPU, where ``gen`` lives: a CPU generator cannot drive
    ``torch.multinomial`` on a CUDA tensor, and CPU draws keep a seed's output device-independent.
    """
    nodes: list[int] = []
    tokens: list[int] = []
    at = -1
    while True:
        p = target_probs(logits[at + 1].cpu(), params)  # [V] float64, CPU
        moved = False
        for tok, child in tree.children[at + 1].items():
            if torch.rand((), generator=gen, dtype=torch.float64) < p[tok]:
                tokens.append(tok)
                nodes.append(child)
                at = child
                moved = True
                break
            p[tok] = 0.0  # rejected: the residual is p without tok, renormalised
            p = p / p.sum()
        if not moved:
            tokens.append(int(torch.multinomial(p.float(), 1, generator=gen)))
            return Verdict(tokens, nodes)
