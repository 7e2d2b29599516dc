"""Token trees: the draft trees a target model verifies in one forward pass.

A tree has node 0 = the root (the last accepted token) and draft nodes in
breadth-first order, sorted by (depth, path). Node i sits at position
L_b + depth(i); query i attends to tree node j iff j is an ancestor of i or i
itself (see ../shared/DESIGN.md).

SKELETON: `TokenTree` is final; `parse_tree` handles `chain:N`, `full:B:D` and
`parents:...` for now and is extended by the trees work item.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from harness.errors import TreeError

MAX_NODES = 1024  # T limit: more nodes than any published tree by an order of magnitude


@dataclass(frozen=True)
class TokenTree:
    """A token tree in canonical order.

    Attributes:
        parents: parents[i] is the parent node of node i; parents[0] == -1.
            Canonical: root = 0, breadth-first, sorted by (depth, path).
        spec: the text it was parsed from (for reports and row ids).
    """

    parents: tuple[int, ...]
    spec: str = field(default="", compare=False)

    @property
    def size(self) -> int:
        """T: nodes including the root."""
        return len(self.parents)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        """depths[i]: edges from the root to node i (root = 0)."""
        d = [0] * self.size
        for i in range(1, self.size):
            d[i] = d[self.parents[i]] + 1
        return tuple(d)

    @property
    def depth(self) -> int:
        """Largest node depth (0 for a root-only tree)."""
        return max(self.depths)

    @cached_property
    def ancestor_mask(self) -> torch.Tensor:
        """(T, T) bool on CPU: [i, j] True iff j is i or an ancestor of i."""
        t = self.size
        m = torch.zeros(t, t, dtype=torch.bool)
        for i in range(t):
            j = i
            while j >= 0:
                m[i, j] = True
                j = self.parents[j]
        return m

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """children[i]: child node indices of node i, in canonical order."""
        ch: list[list[int]] = [[] for _ in range(self.size)]
        for i in range(1, self.size):
            ch[self.parents[i]].append(i)
        return tuple(tuple(c) for c in ch)

    @property
    def leaves(self) -> tuple[int, ...]:
        """Nodes with no children, ascending."""
        return tuple(i for i, c in enumerate(self.children) if not c)

    @cached_property
    def paths(self) -> tuple[tuple[int, ...], ...]:
        """Root-to-leaf node paths, one per leaf, each starting at 0."""
        out = []
        for leaf in self.leaves:
            p = [leaf]
            while self.parents[p[-1]] >= 0:
                p.append(self.parents[p[-1]])
            out.append(tuple(reversed(p)))
        return tuple(out)

    @cached_property
    def choices(self) -> tuple[tuple[int, ...], ...]:
        """EAGLE/Medusa-style choice paths (sibling ranks), one per draft node."""
        rank = [0] * self.size
        for c in self.children:
            for r, node in enumerate(c):
                rank[node] = r
        out: list[tuple[int, ...]] = [()]
        for i in range(1, self.size):
            out.append(out[self.parents[i]] + (rank[i],))
        return tuple(out[1:])


def from_parents(parents: list[int] | tuple[int, ...], spec: str = "") -> TokenTree:
    """Builds a canonical TokenTree from a parent array.

    Raises:
        TreeError: parents[0] != -1, a parent index out of range, or a parent
            after its child.
    """
    if not parents or parents[0] != -1:
        raise TreeError(f"tree {spec!r}: node 0 must be the root with parent -1")
    for i, p in enumerate(parents[1:], start=1):
        if not 0 <= p < i:
            raise TreeError(f"tree {spec!r}: node {i} has parent {p}; each parent must come before its child")
    if len(parents) > MAX_NODES:
        raise TreeError(f"tree {spec!r}: {len(parents)} nodes, more than {MAX_NODES}")
    return TokenTree(tuple(parents), spec)


def parse_tree(spec: str) -> TokenTree:
    """Parses any tree format of DESIGN.md into a canonical TokenTree.

    Raises:
        TreeError: malformed spec, naming the problem.
    """
    s = spec.strip()
    if s.startswith("chain:"):
        n = int(s.split(":")[1])
        return from_parents([-1] + list(range(n)), spec)
    if s.startswith("full:"):
        _, b, d = s.split(":")
        parents, frontier = [-1], [0]
        for _ in range(int(d)):
            nxt = []
            for node in frontier:
                for _ in range(int(b)):
                    parents.append(node)
                    nxt.append(len(parents) - 1)
            frontier = nxt
        return from_parents(parents, spec)
    if s.startswith("parents:"):
        return from_parents([int(x) for x in s[len("parents:"):].split(",")], spec)
    if s.startswith("random:"):
        import random as _r
        _, n, seed = s.split(":")
        rng = _r.Random(int(seed))
        parents = [-1]
        for i in range(1, int(n) + 1):
            parents.append(rng.randrange(i))
        return from_parents(parents, spec)  # TODO(trees): canonical (depth, path) order
    raise TreeError(f"tree {spec!r}: unknown format")
