"""The tree of each size that maximises E under a positional acceptance model.

The dynamic program of Sequoia (Chen et al. 2024, arXiv 2402.12374, sec. 3.1,
and its ``tree_search.py``), with depth-dependent rows. Sizes count the root,
as the harness's T does (and Sequoia's budget does): a tree of T nodes has
T - 1 draft nodes. For a node at depth d whose subtree holds n nodes:

    f_d(n)     = 1 + g_d(0, n - 1)                         expected accepted tokens of that subtree,
                                                           given the node was accepted (itself counted)
    g_d(r, 0)  = 0
    g_d(r, m)  = max_{1 <= k <= m} p[d][r] * f_{d+1}(k) + g_d(r + 1, m - k)
                                                           best use of m nodes by children of rank r, r+1, ...
    g_d(r, m)  = -inf  for m > 0 and r past row d          (no rank beyond the model's row)

Children take ranks 0, 1, ... with no gaps: rows are non-increasing, so a
lower rank is never worse. Then max E over trees of T nodes is f_0(T).
Depths past the model's table reuse its last row, so without a depth limit
every depth >= len(p) - 1 shares one f (computed for n ascending, since
f(n) needs f(k < n) only); with ``max_depth`` D, depth D nodes have no children.
Cost: O(families * W * N^2) with numpy over k; N = 256 takes well under a second.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from treebench.harness.errors import ConfigError
from treebench.harness.speculation.acceptance import AcceptanceModel

__all__ = ["MAX_SEARCH_NODES", "SearchedTree", "search_trees", "choices_text"]

MAX_SEARCH_NODES = 256  # largest T searched (root included)

Choices = tuple[tuple[int, ...], ...]  # EAGLE/Medusa paths of sibling ranks, root implicit


@dataclass(frozen=True)
class SearchedTree:
    """The best tree of one size.

    Attributes:
        size: T, nodes including the root.
        expected: E, expected accepted tokens per step (bonus token included).
        choices: T - 1 paths in (depth, path) order; ``treebench.harness.model.tree_specs.parse_tree`` reads them.
    """

    size: int
    expected: float
    choices: Choices

    @property
    def depth(self) -> int:
        """Largest draft-node depth (0 for the root alone)."""
        return max((len(c) for c in self.choices), default=0)


@dataclass
class _Family:
    """One DP table: nodes whose children use `row` and whose children's subtrees use family `child`."""

    row: tuple[float, ...]
    child: int | None            # index of the children's family; None: leaves only (the depth limit)
    f: np.ndarray                # (N + 1,) f(n); f[0] = -inf
    pick: np.ndarray             # (W, N) int: k chosen for (rank r, budget m); 0 when m == 0


def _families(model: AcceptanceModel, n_max: int, max_depth: int | None) -> list[_Family]:
    """The DP's tables, index = depth (capped where depths share a table)."""
    if max_depth is None or max_depth >= n_max - 1:     # no limit reachable with n_max nodes
        last = len(model.p) - 1
        links: list[int | None] = [min(d + 1, last) for d in range(last + 1)]
    else:
        links = [d + 1 for d in range(max_depth)] + [None]
    out = []
    for d, child in enumerate(links):
        row = model.row(d) if child is not None else ()
        out.append(_Family(row, child, np.full(n_max + 1, -np.inf), np.zeros((max(len(row), 1), n_max), int)))
    return out


def _fill(fams: list[_Family], i: int, n_max: int) -> None:
    """Fills family i's f and pick for budgets 0..n_max - 1 (children's family already filled, or i itself)."""
    fam = fams[i]
    fc = fams[fam.child].f if fam.child is not None else None
    width = len(fam.row)
    g = np.full((width + 1, n_max), -np.inf)             # g[r, m]; row `width`: no ranks left
    g[:, 0] = 0.0
    for m in range(n_max):
        for r in range(width - 1, -1, -1):
            if m == 0 or fc is None:
                continue
            sub = fc[1:m + 1]                            # (m,) f_child(k), k = 1..m
            vals = np.where(np.isfinite(sub), fam.row[r] * sub, -np.inf) + g[r + 1, m - 1::-1]
            k = int(np.argmax(vals))
            g[r, m] = vals[k]
            fam.pick[r, m] = k + 1
        fam.f[m + 1] = 1.0 + g[0, m]


def _build(fams: list[_Family], i: int, n: int, prefix: tuple[int, ...], out: list[tuple[int, ...]]) -> None:
    """Appends the choices paths of the best n-node subtree of family i rooted at `prefix`."""
    fam, left, r = fams[i], n - 1, 0
    while left > 0:
        k = int(fam.pick[r, left])
        path = prefix + (r,)
        out.append(path)
        assert fam.child is not None
        _build(fams, fam.child, k, path, out)
        left, r = left - k, r + 1


def search_trees(model: AcceptanceModel, max_nodes: int, max_depth: int | None = None) -> dict[int, SearchedTree]:
    """For every size T = 1..max_nodes, the tree of T nodes (root included) maximising E.

    Args:
        model: the acceptance model.
        max_nodes: largest T, 1..MAX_SEARCH_NODES.
        max_depth: deepest draft node allowed (>= 1), None for no limit.

    Returns:
        T -> SearchedTree, for every T some tree of that size fits (a depth limit
        with rows of width W caps T at 1 + W + ... + W^D; larger T are left out).

    Raises:
        ConfigError: max_nodes or max_depth out of range.
    """
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or not 1 <= max_nodes <= MAX_SEARCH_NODES:
        raise ConfigError(f"--max-nodes {max_nodes!r}: give T between 1 and {MAX_SEARCH_NODES} (root included)")
    if max_depth is not None and (isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1):
        raise ConfigError(f"--max-depth {max_depth!r}: give a depth >= 1 (depth of the deepest draft token)")
    fams = _families(model, max_nodes, max_depth)
    for i in range(len(fams) - 1, -1, -1):
        _fill(fams, i, max_nodes)
    out = {}
    for t in range(1, max_nodes + 1):
        if np.isfinite(fams[0].f[t]):
            paths: list[tuple[int, ...]] = []
            _build(fams, 0, t, (), paths)
            out[t] = SearchedTree(t, float(fams[0].f[t]), tuple(sorted(paths, key=lambda p: (len(p), p))))
    return out


def choices_text(choices: Choices) -> str:
    """A choices list as text that ``treebench.harness.model.tree_specs.parse_tree`` reads: "[(0,), (1,), (0, 0)]"."""
    return "[" + ", ".join("(" + ", ".join(map(str, c)) + ("," if len(c) == 1 else "") + ")" for c in choices) + "]"
