"""Token trees: the draft trees a target model verifies in one forward pass.

A tree has node 0 = the root (the last accepted token) and draft nodes in
breadth-first order, sorted by (depth, path), where a node's path is the tuple
of its ancestors' and its own sibling ranks (EAGLE/Medusa "choices"). Node i
sits at position L_b + depth(i); query i attends to tree node j iff j is an
ancestor of i or i itself (see docs/design.md).

This module holds the tree itself and its two constructors (``from_parents``,
``from_choices``); the text forms a tree is read from (choices, ``parents:``,
generators, named trees) are parsed by ``treebench.harness.model.tree_specs.parse_tree``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from treebench.harness.errors import TreeError

__all__ = ["MAX_NODES", "TokenTree", "check_size", "from_parents", "from_choices", "render_tree", "tree_summary"]

if TYPE_CHECKING:
    import torch  # imported where a mask is built: parsing a tree (a suite, a --help) needs no torch

log = logging.getLogger(__name__)

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
        import torch

        t = self.size
        m = torch.zeros(t, t, dtype=torch.bool)
        m[0, 0] = True
        for i in range(1, t):  # parents come first, so row parents[i] is complete
            m[i] = m[self.parents[i]]
            m[i, i] = True
        return m

    def additive_bias(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """(T, T) additive attention bias on the CPU in `dtype` (None: float32): 0 where node j
        is node i or an ancestor of i, -inf elsewhere (the form of vLLM's `qq_bias` and xformers'
        `spec_attn_bias`)."""
        import torch

        bias = torch.zeros(self.size, self.size, dtype=dtype or torch.float32)
        return bias.masked_fill(~self.ancestor_mask, float("-inf"))

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


# --------------------------------------------------------------------------- canonical form


def from_parents(parents: Sequence[int], spec: str = "") -> TokenTree:
    """Builds a canonical TokenTree from a parent array.

    Args:
        parents: (T,) ints, parents[i] = parent node of node i; parents[0] = -1
            (the root); each parent before its children; siblings ranked in
            order of appearance. Any such order is accepted and re-ordered to
            the canonical breadth-first (depth, path) order.
        spec: the text the array came from, kept as ``TokenTree.spec``.

    Raises:
        TreeError: empty array, more than MAX_NODES nodes, a non-integer entry,
            node 0 not the root, more than one root, a parent out of range, a
            self-parent, a cycle, or a parent after its child.
    """
    parents = [_entry(p, i, spec) for i, p in enumerate(parents)]
    _check_parents(parents, spec)
    order = _bfs_order(parents)
    new_index = {old: k for k, old in enumerate(order)}
    canon = (-1,) + tuple(new_index[parents[old]] for old in order[1:])
    if canon != tuple(parents):
        log.debug("tree %r: parent array re-ordered to canonical (depth, path) order", spec)
    return TokenTree(canon, spec)


def from_choices(choices: Sequence[Sequence[int]], spec: str = "") -> TokenTree:
    """Builds a canonical TokenTree from EAGLE/Medusa/vLLM choice paths.

    Args:
        choices: T - 1 paths, one per draft node: path[k] is the top-k rank of
            the node's depth-(k+1) ancestor. The root is implicit; any order.
        spec: the text the list came from, kept as ``TokenTree.spec``.

    Ranks are kept as sibling order: paths [(0,), (2,)] give the tree [(0,), (1,)]
    (a warning says so, since the acceptance model reads a node's rank).

    Raises:
        TreeError: not a list of paths, an empty, duplicate or non-integer path,
            a negative index, a path whose prefix is missing, or more than
            MAX_NODES nodes.
    """
    paths = _check_choices(choices, spec)
    ordered = sorted(paths, key=lambda p: (len(p), p))  # (depth, path): canonical
    index = {(): 0} | {p: k + 1 for k, p in enumerate(ordered)}
    tree = from_parents([-1] + [index[p[:-1]] for p in ordered], spec)
    gapped = [p for p in ordered if p[-1] > 0 and p[:-1] + (p[-1] - 1,) not in index]
    if gapped:   # the tree keeps sibling order, not the numbers: say so where a rank was given that it drops
        p = gapped[0]
        more = f" ({len(gapped) - 1} more paths alike)" if len(gapped) > 1 else ""
        log.warning("tree %r: choices path %s has no sibling %s before it, so it is rank %d (0-based) of its siblings "
                    "here%s: the mask is the same, but the expected acceptance (speculate, plan) reads each "
                    "node's rank among its siblings", spec, p, p[:-1] + (p[-1] - 1,),
                    tree.choices[index[p] - 1][-1], more)
    return tree


def _entry(p: object, i: int, spec: str) -> int:
    if not isinstance(p, int) or isinstance(p, bool):
        raise TreeError(f"tree {spec!r}: parent of node {i} is {p!r}; parents must be integers")
    return p


def _check_parents(parents: list[int], spec: str) -> None:
    t = len(parents)
    if t == 0:
        raise TreeError(f"tree {spec!r}: empty parent array; give at least the root, e.g. parents:-1")
    check_size(t, spec)
    if parents[0] != -1:
        raise TreeError(f"tree {spec!r}: node 0 has parent {parents[0]}; node 0 must be the root with parent -1")
    roots = [i for i, p in enumerate(parents) if p == -1]
    if len(roots) > 1:
        raise TreeError(f"tree {spec!r}: more than one root (nodes {roots} have parent -1); only node 0 may")
    for i, p in enumerate(parents):
        if p == i:
            raise TreeError(f"tree {spec!r}: node {i} is its own parent")
        if not -1 <= p < t:
            raise TreeError(f"tree {spec!r}: node {i} has parent {p}, out of range [0, {t})")
    for i, p in enumerate(parents):
        if p > i:
            _raise_order_error(parents, i, spec)


def _raise_order_error(parents: list[int], i: int, spec: str) -> None:
    """Raises the TreeError for a node whose parent comes after it."""
    walk, j = [], i
    while j != -1 and j not in walk:
        walk.append(j)
        j = parents[j]
    if j != -1:
        cycle = walk[walk.index(j):]
        raise TreeError(f"tree {spec!r}: cycle through nodes {cycle}; a tree's parent links must end at the root")
    raise TreeError(f"tree {spec!r}: node {i} has parent {parents[i]}, which comes after it; "
                    "list each parent before its children")


def _bfs_order(parents: list[int]) -> list[int]:
    """Old node indices in breadth-first order, children by rank = (depth, path) order."""
    children: list[list[int]] = [[] for _ in parents]
    for i in range(1, len(parents)):
        children[parents[i]].append(i)
    order = [0]
    for node in order:  # the list grows while it is walked: a FIFO queue
        order.extend(children[node])
    return order


def check_size(t: int, spec: str) -> None:
    """Raises TreeError for a tree of `t` nodes past MAX_NODES, the one wording for every format: its
    node count (from 10^18, 'at least 10^k': `t` may then be a lower bound), more than MAX_NODES."""
    if t > MAX_NODES:
        digits = len(str(t)) if t.bit_length() < 10_000 else int(t.bit_length() * 0.30102)   # str's limit: 4300
        count = str(t) if t < 10**18 else f"at least 10^{digits - 1}"
        raise TreeError(f"tree {spec!r}: {count} nodes, more than MAX_NODES = {MAX_NODES}; use a smaller tree")


def _check_choices(choices: object, spec: str) -> list[tuple[int, ...]]:
    if isinstance(choices, (str, bytes)) or not isinstance(choices, Sequence):
        raise TreeError(f"tree {spec!r}: choices must be a list of paths such as [(0,), (1,), (0, 0)]")
    check_size(len(choices) + 1, spec)
    paths, seen = [], set()
    for k, path in enumerate(choices):
        p = _check_path(path, k, spec)
        if p in seen:
            raise TreeError(f"tree {spec!r}: duplicate choices path {p}; list each draft node once")
        seen.add(p)
        paths.append(p)
    for p in paths:
        if len(p) > 1 and p[:-1] not in seen:
            raise TreeError(f"tree {spec!r}: choices path {p} has no parent path {p[:-1]}; add it")
    return paths


def _check_path(path: object, k: int, spec: str) -> tuple[int, ...]:
    if isinstance(path, (str, bytes)) or not isinstance(path, Sequence):
        raise TreeError(f"tree {spec!r}: choices entry {k} is {path!r}, not a tuple of ranks such as (0, 1)")
    if not path:
        raise TreeError(f"tree {spec!r}: choices entry {k} is empty; the root is implicit, leave it out")
    for x in path:
        if not isinstance(x, int) or isinstance(x, bool) or x < 0:
            raise TreeError(f"tree {spec!r}: choices path {tuple(path)} has index {x!r}; "
                            "indices must be non-negative integers")
    return tuple(path)


# --------------------------------------------------------------------------- drawing and summary

_BOX = ("├── ", "└── ", "│   ", "    ")    # tee, elbow, pipe, blank
_ASCII = ("|-- ", "`-- ", "|   ", "    ")


def render_tree(tree: TokenTree, ascii: bool = False) -> str:
    """Draws the tree, one node per line: index, depth and choices path.

    Style after the tree drawings in vLLM's tree-attention PRs
    (vllm-project/vllm#22752): the root first, then each child under its
    parent with box-drawing branches. Iterative, so chains of MAX_NODES work.

    Args:
        tree: any TokenTree.
        ascii: draw branches with ``|-- `-- |`` instead of box characters.

    Returns:
        Lines joined by newlines, headed by a summary line (T, depth, leaves).
    """
    tee, elbow, pipe, blank = _ASCII if ascii else _BOX
    lines = [f"tree {tree.spec or '(unnamed)'}: {shape_text(tree)}", "0  root  depth 0"]
    stack = _frames(tree, 0, "")
    while stack:
        node, prefix, last = stack.pop()
        lines.append(f"{prefix}{elbow if last else tee}{_label(tree, node)}")
        stack.extend(_frames(tree, node, prefix + (blank if last else pipe)))
    return "\n".join(lines)


def shape_text(tree: TokenTree) -> str:
    """'T=13 nodes, depth 2, 9 leaves'; 'T=1 node, depth 0, 1 leaf' for the root alone (chain:0,
    full:3:0: a query length of 1, no draft token). The one summary of a tree's shape that
    `render_tree` and the report's tree figure print."""
    t, leaves = tree.size, len(tree.leaves)
    return (f"T={t} {'node' if t == 1 else 'nodes'}, depth {tree.depth}, "
            f"{leaves} {'leaf' if leaves == 1 else 'leaves'}")


def _frames(tree: TokenTree, node: int, prefix: str) -> list[tuple[int, str, bool]]:
    """Stack frames (child, prefix, is_last) for node's children, first child on top."""
    kids = tree.children[node]
    return [(c, prefix, c == kids[-1]) for c in reversed(kids)]


def _label(tree: TokenTree, node: int) -> str:
    path = ".".join(map(str, tree.choices[node - 1]))
    return f"{node}  depth {tree.depths[node]}  path {path}"


def tree_summary(tree: TokenTree) -> dict:
    """JSON-ready description of a tree, all lists in canonical node order.

    Returns:
        dict with spec, size (T), depth, parents (T,), depths (T,),
        level_sizes (nodes per depth, depth + 1 entries), leaves, paths
        (root-to-leaf node lists), choices (T - 1 rank paths), mask_nnz (True
        entries of the mask = sum of depth + 1) and ancestor_mask (T strings of
        T '0'/'1' characters; row i, column j = 1 iff j is i or its ancestor).
    """
    mask = tree.ancestor_mask.tolist()
    return {
        "spec": tree.spec,
        "size": tree.size,
        "depth": tree.depth,
        "parents": list(tree.parents),
        "depths": list(tree.depths),
        "level_sizes": [tree.depths.count(d) for d in range(tree.depth + 1)],
        "leaves": list(tree.leaves),
        "paths": [list(p) for p in tree.paths],
        "choices": [list(c) for c in tree.choices],
        "mask_nnz": sum(map(sum, mask)),
        "ancestor_mask": ["".join("1" if v else "0" for v in row) for row in mask],
    }
