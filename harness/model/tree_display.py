"""Drawing and summarising token trees (for `treebench tree` and reports)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from treebench.harness.model.trees import TokenTree

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
    lines = [f"tree {tree.spec or '(unnamed)'}: T={tree.size} nodes, depth {tree.depth}, "
             f"{len(tree.leaves)} {'leaf' if len(tree.leaves) == 1 else 'leaves'}", "0  root  depth 0"]
    stack = _frames(tree, 0, "")
    while stack:
        node, prefix, last = stack.pop()
        lines.append(f"{prefix}{elbow if last else tee}{_label(tree, node)}")
        stack.extend(_frames(tree, node, prefix + (blank if last else pipe)))
    return "\n".join(lines)


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
