"""Token trees: the draft trees a target model verifies in one forward pass.

A tree has node 0 = the root (the last accepted token) and draft nodes in
breadth-first order, sorted by (depth, path), where a node's path is the tuple
of its ancestors' and its own sibling ranks (EAGLE/Medusa "choices"). Node i
sits at position L_b + depth(i); query i attends to tree node j iff j is an
ancestor of i or i itself (see docs/design.md).

Formats read by ``parse_tree`` (every format ends in the same canonical form):

- choices: a list of paths, e.g. ``[(0,), (1,), (0, 0)]`` or its text (EAGLE,
  Medusa, vLLM's ``speculative_token_tree``); the root is implicit;
- ``parents:-1,0,0,1``: parent of each node, each parent before its children,
  siblings ranked in order of appearance; re-ordered canonically if needed;
- generators: ``chain:N``, ``full:BRANCHING:DEPTH``, ``levels:4,2,1``,
  ``random:N:SEED``;
- named published trees (``treebench.harness.model.named_trees``), e.g. ``eagle:mc_sim_7b_63``.
"""

from __future__ import annotations

import ast
import itertools
import logging
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch

from treebench.harness.model import named_trees
from treebench.harness.errors import TreeError

__all__ = ["MAX_NODES", "TokenTree", "from_parents", "from_choices", "parse_tree", "render_tree", "tree_summary"]

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
        t = self.size
        m = torch.zeros(t, t, dtype=torch.bool)
        m[0, 0] = True
        for i in range(1, t):  # parents come first, so row parents[i] is complete
            m[i] = m[self.parents[i]]
            m[i, i] = True
        return m

    def additive_bias(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(T, T) additive attention bias on the CPU: 0 where node j is node i or an
        ancestor of i, -inf elsewhere (the form of vLLM's `qq_bias` and xformers'
        `spec_attn_bias`)."""
        return torch.zeros(self.size, self.size, dtype=dtype).masked_fill(~self.ancestor_mask, float("-inf"))

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

    Raises:
        TreeError: not a list of paths, an empty, duplicate or non-integer path,
            a negative index, a path whose prefix is missing, or more than
            MAX_NODES nodes.
    """
    paths = _check_choices(choices, spec)
    ordered = sorted(paths, key=lambda p: (len(p), p))  # (depth, path): canonical
    index = {(): 0} | {p: k + 1 for k, p in enumerate(ordered)}
    return from_parents([-1] + [index[p[:-1]] for p in ordered], spec)


def _entry(p: object, i: int, spec: str) -> int:
    if not isinstance(p, int) or isinstance(p, bool):
        raise TreeError(f"tree {spec!r}: parent of node {i} is {p!r}; parents must be integers")
    return p


def _check_parents(parents: list[int], spec: str) -> None:
    t = len(parents)
    if t == 0:
        raise TreeError(f"tree {spec!r}: empty parent array; give at least the root, e.g. parents:-1")
    _check_size(t, spec)
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


def _check_size(t: int, spec: str) -> None:
    if t > MAX_NODES:
        raise TreeError(f"tree {spec!r}: {t} nodes, more than MAX_NODES = {MAX_NODES}; use a smaller tree")


def _check_choices(choices: object, spec: str) -> list[tuple[int, ...]]:
    if isinstance(choices, (str, bytes)) or not isinstance(choices, Sequence):
        raise TreeError(f"tree {spec!r}: choices must be a list of paths such as [(0,), (1,), (0, 0)]")
    _check_size(len(choices) + 1, spec)
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


# --------------------------------------------------------------------------- generators


def _int_arg(text: str, name: str, low: int | None, spec: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise TreeError(f"tree {spec!r}: {name} must be an integer, got {text!r}") from None
    if low is not None and value < low:
        raise TreeError(f"tree {spec!r}: {name} must be >= {low}, got {value}")
    return value


def _args(rest: str, n: int, usage: str, spec: str) -> list[str]:
    args = rest.split(":")
    if len(args) != n:
        raise TreeError(f"tree {spec!r}: {len(args)} argument(s) given; write {usage}")
    return args


def _levels_tree(counts: Iterable[int], spec: str) -> TokenTree:
    """Tree with counts[k] children under every node of depth k (1+c0+c0*c1+... nodes)."""
    counts = list(_capped(counts, spec))
    parents, frontier = [-1], [0]
    for c in counts:
        nxt = []
        for node in frontier:
            for _ in range(c):
                parents.append(node)
                nxt.append(len(parents) - 1)
        frontier = nxt
    return from_parents(parents, spec)


def _capped(counts: Iterable[int], spec: str) -> Iterable[int]:
    """Yields counts while the tree they describe stays within MAX_NODES."""
    total, width = 1, 1
    for k, c in enumerate(counts, start=1):
        width *= c
        total += width
        if c > MAX_NODES or total > MAX_NODES:
            raise TreeError(f"tree {spec!r}: more than MAX_NODES = {MAX_NODES} nodes by depth {k}; "
                            "use fewer levels or fewer children")
        yield c


def _gen_chain(rest: str, spec: str) -> TokenTree:
    (n,) = _args(rest, 1, "chain:N (N draft tokens)", spec)
    return _levels_tree(itertools.repeat(1, min(_int_arg(n, "chain N", 0, spec), MAX_NODES + 1)), spec)


def _gen_full(rest: str, spec: str) -> TokenTree:
    b, d = _args(rest, 2, "full:BRANCHING:DEPTH, e.g. full:3:2", spec)
    branching = _int_arg(b, "full BRANCHING", 1, spec)
    return _levels_tree(itertools.repeat(branching, min(_int_arg(d, "full DEPTH", 0, spec), MAX_NODES + 1)), spec)


def _gen_levels(rest: str, spec: str) -> TokenTree:
    if not rest.strip():
        raise TreeError(f"tree {spec!r}: levels needs children counts per depth, e.g. levels:4,2,1")
    return _levels_tree([_int_arg(c, "levels count", 1, spec) for c in rest.split(",")], spec)


def _gen_random(rest: str, spec: str) -> TokenTree:
    """N draft nodes, each under a uniformly chosen earlier node, from random.Random(SEED)."""
    n, seed = _args(rest, 2, "random:N:SEED, e.g. random:20:0", spec)
    count = _int_arg(n, "random N", 0, spec)
    _check_size(count + 1, spec)
    rng = random.Random(_int_arg(seed, "random SEED", None, spec))
    return from_parents([-1] + [rng.randrange(i) for i in range(1, count + 1)], spec)


def _gen_parents(rest: str, spec: str) -> TokenTree:
    if not rest.strip():
        raise TreeError(f"tree {spec!r}: empty parent array; write e.g. parents:-1,0,0,1")
    return from_parents([_int_arg(p, f"parent of node {i}", None, spec) for i, p in enumerate(rest.split(","))],
                        spec)


# Explicit registry: format prefix -> reader of the text after "prefix:".
_GENERATORS = {
    "chain": _gen_chain,
    "full": _gen_full,
    "levels": _gen_levels,
    "random": _gen_random,
    "parents": _gen_parents,
}


# --------------------------------------------------------------------------- parsing


def canonical_spec(spec: str) -> str:
    """`spec` as parse_tree reads it: without surrounding white space and with a
    generator keyword in lower case (" FULL:3:2" -> "full:3:2"), so that spellings
    parse_tree takes alike give one case id. Choices lists and named trees are
    kept as written (stripped). Does not validate: parse_tree does."""
    s = spec.strip()
    kind, sep, rest = s.partition(":")
    if sep and kind.strip().lower() in _GENERATORS:
        return f"{kind.strip().lower()}:{rest.strip()}"
    return s


def parse_tree(spec: str | Sequence[Sequence[int]] | TokenTree) -> TokenTree:
    """Parses any tree format of DESIGN.md into a canonical TokenTree.

    Args:
        spec: a format string (see the module docstring), a choices list of
            paths, or an already built TokenTree (returned as is). Choices text
            is read with ``ast.literal_eval``, never ``eval``.

    Returns:
        The tree in canonical order; ``spec`` keeps the text given (a list is
        kept as its repr).

    Raises:
        TreeError: empty text, an unknown format or name (the message lists the
            known ones), bad generator arguments, or any malformed tree (see
            ``from_parents`` and ``from_choices``).
    """
    if isinstance(spec, TokenTree):
        return spec
    if not isinstance(spec, str):
        return from_choices(spec, repr(spec))
    s = spec.strip()
    if not s:
        raise TreeError("tree '': empty spec; give e.g. chain:4, full:3:2, parents:-1,0,0 or [(0,), (1,)]")
    if s[0] in "[(":
        return _parse_choices_text(s, spec)
    named = _named(s, spec)
    if named is not None:
        return named
    kind, sep, rest = s.partition(":")
    reader = _GENERATORS.get(kind.strip().lower())
    if reader is None or not sep:
        raise TreeError(f"tree {spec!r}: unknown format or name; use a choices list [(0,), (1,), (0, 0)], "
                        f"{', '.join(f'{k}:...' for k in _GENERATORS)}, or a named tree "
                        f"({', '.join(named_trees.known_names())})")
    return reader(rest, spec)


def _parse_choices_text(text: str, spec: str) -> TokenTree:
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise TreeError(f"tree {spec!r}: not a Python list of tuples; write e.g. [(0,), (1,), (0, 0)]") from None
    return from_choices(value, spec)


def _named(name: str, spec: str) -> TokenTree | None:
    """The named published tree, None if `name` is not a tree name."""
    key = named_trees.ALIASES.get(name, name)
    if key in named_trees.NAMED_TREES:
        return from_choices(named_trees.NAMED_TREES[key].choices, spec)
    key = named_trees.UNAVAILABLE_ALIASES.get(name, name)
    if key in named_trees.UNAVAILABLE:
        raise TreeError(f"tree {spec!r}: {named_trees.UNAVAILABLE[key]}")
    return None


# --------------------------------------------------------------------------- display


from treebench.harness.model.tree_display import render_tree, tree_summary  # noqa: E402  (re-export)
