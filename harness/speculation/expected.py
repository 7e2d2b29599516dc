"""Expected accepted tokens of a draft tree under a positional acceptance model.

Under the positional model (``treebench.harness.speculation.acceptance``; Sequoia,
arXiv 2402.12374, sec. 3.1) a draft node is accepted iff its whole path is, so

    E(tree) = 1 + sum over draft nodes i of prod_{j on the path root -> i, j != root} p[depth(parent j)][rank j]

tokens per verify step: the 1 is the bonus token the target samples after the
last accepted node (or in place of the first rejected one). ``simulate`` draws
the same process token by token, for checking E.
"""

from __future__ import annotations

import numpy as np

from treebench.harness.speculation.acceptance import AcceptanceModel
from treebench.harness.model.trees import TokenTree

__all__ = ["node_probs", "expected_tokens", "chain_expected", "simulate"]


def _ranks(tree: TokenTree) -> list[int]:
    """rank[i]: node i's position among its parent's children (order of appearance); 0 for the root."""
    rank = [0] * tree.size
    for kids in tree.children:
        for r, node in enumerate(kids):
            rank[node] = r
    return rank


def node_probs(tree: TokenTree, model: AcceptanceModel) -> list[float]:
    """Per-node acceptance probability given the parent was accepted.

    Returns:
        (T,) floats; entry 0 (the root, already accepted) is 1.0, entry i is
        p[depth(parent(i))][rank(i)] (0 for a rank past the model's row).
    """
    rank, depths = _ranks(tree), tree.depths
    return [1.0] + [model.prob(depths[tree.parents[i]], rank[i]) for i in range(1, tree.size)]


def expected_tokens(tree: TokenTree, model: AcceptanceModel) -> float:
    """E(tree): expected tokens accepted per verify step, the bonus token included.

    Exact under the positional model: 1 + the sum over draft nodes of the
    product of acceptance probabilities along the node's path (Sequoia,
    arXiv 2402.12374, sec. 3.1). A root-only tree (T = 1) gives 1.

    Args:
        tree: a harness token tree (canonical order: parents before children).
        model: the acceptance model.

    Returns:
        E in tokens per request per step, in [1, T].
    """
    probs = node_probs(tree, model)
    reach = [1.0] * tree.size  # reach[i]: P(node i accepted), the product along its path
    for i in range(1, tree.size):
        reach[i] = reach[tree.parents[i]] * probs[i]
    return 1.0 + sum(reach[1:])


def chain_expected(n_draft: int, model: AcceptanceModel) -> float:
    """E of a chain of `n_draft` draft tokens (T = n_draft + 1), each the rank-0 child of the one before:
    1 + sum_{k=1..n} prod_{d<k} p[d][0]."""
    total, reach = 1.0, 1.0
    for d in range(n_draft):
        reach *= model.prob(d, 0)
        total += reach
    return total


def simulate(tree: TokenTree, model: AcceptanceModel, trials: int, seed: int = 0) -> np.ndarray:
    """Monte Carlo draw of tokens accepted per verify step (the model's process, token by token).

    Each trial walks from the root: at an accepted depth-d node one uniform
    u in [0, 1) picks the accepted child: the rank-r child iff
    sum_{s<r} p[d][s] <= u < sum_{s<=r} p[d][s] (mutually exclusive events; the
    target samples one token, at most one child matches it); no child is
    accepted when u falls past the children present. The walk stops there.

    Args:
        trials: number of independent verify steps to draw.
        seed: numpy Generator seed.

    Returns:
        (trials,) int64: accepted draft nodes + 1 (the bonus token) per trial;
        its mean estimates ``expected_tokens``.
    """
    rng = np.random.default_rng(seed)
    probs, kids = node_probs(tree, model), tree.children
    node = np.zeros(trials, dtype=np.int64)     # current accepted node per trial
    count = np.ones(trials, dtype=np.int64)      # tokens accepted so far (the bonus token)
    alive = np.ones(trials, dtype=bool)
    for _ in range(tree.depth):
        u = rng.random(trials)
        nxt = np.full(trials, -1, dtype=np.int64)
        for parent in np.unique(node[alive]):
            at = alive & (node == parent)
            edge = 0.0
            for child in kids[parent]:
                hit = at & (u >= edge) & (u < edge + probs[child])
                nxt[hit] = child
                edge += probs[child]
        alive &= nxt >= 0
        node = np.where(alive, nxt, node)
        count += alive
    return count
