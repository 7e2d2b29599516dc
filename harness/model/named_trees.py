"""Published draft trees, re-typed from their public sources as data.

Each tree is a choices list: one path of top-k ranks per draft node, the root
(the last accepted token) implicit. ``treebench.harness.model.tree_specs.parse_tree`` reads them by
name (``eagle:mc_sim_7b_63``) and puts them in canonical order; this module
holds data only and imports nothing from the harness.

Sources (re-typed by hand, then checked against a second copy where one exists):

- ``eagle:mc_sim_7b_63``: SafeAILab/EAGLE, ``eagle/model/choices.py`` at commit
  08dc06ccb428f2d3cf8380933ea50ed3e4178168 (older layout: ``model/choices.py``
  at e98fc7c, the copy cited by facebookresearch/xformers
  ``tests/test_tree_attention.py``). 25 draft nodes (T = 26), depth 5,
  nodes per level 4, 8, 8, 3, 2 -- despite the Medusa-derived name.
- ``medusa:mc_sim_7b_63``: FasterDecoding/Medusa,
  ``medusa/model/medusa_choices.py`` at commit
  11af0aa503437b40d45f5a47c001c43699b7ae52 (same list at 5e98053, the copy in
  xformers ``tests/test_tree_attention.py``). 63 draft nodes (T = 64), depth 4,
  nodes per level 10, 28, 23, 2; listed in Medusa's own (not breadth-first)
  order, which parse_tree re-orders canonically.

- ``vllm:pr_27`` (alias ``vllm_pr_27_node_tree``): the 27-node tree of the
  vLLM tree-attention PR (vllm-project/vllm#20401), *reconstructed*: its exact
  list of tuples was not found in the public sources we could search (the PR
  description's first part and benchmark table, tests/v1/spec_decode/, the
  tree-sampler PR #22752). What is known -- 27 draft nodes (T = 28), depth 5,
  3 top-level branches, and the PR's tree drafting supporting only a fixed
  number of children per level -- admits few shapes; we use 3 top-level
  branches with 2 children each, then single-child chains (levels:3,2,1,1,1:
  nodes per level 3, 6, 6, 6, 6). T and depth equal the PR's, so timings are
  comparable; the mask may differ from the PR's in which leaves branch.
"""

from __future__ import annotations

from dataclasses import dataclass

Choices = tuple[tuple[int, ...], ...]  # one path of sibling ranks per draft node


@dataclass(frozen=True)
class NamedTree:
    """A published draft tree.

    Attributes:
        name: registry key, ``<project>:<name in the source>``.
        choices: paths as the source lists them (root implicit, source order).
        source: repository, file path and commit it was re-typed from.
    """

    name: str            # e.g. "eagle:mc_sim_7b_63"
    choices: Choices     # D_i-long paths of top-k ranks, one per draft node
    source: str          # "owner/repo path@commit"


# fmt: off
_EAGLE_MC_SIM_7B_63: Choices = (
    (0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0),
    (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 0, 0), (0, 0, 0, 0, 1),
)

_MEDUSA_MC_SIM_7B_63: Choices = (
    (0,), (0, 0), (1,), (0, 1), (2,), (0, 0, 0), (1, 0), (0, 2), (3,), (0, 3), (4,), (0, 4),
    (2, 0), (0, 5), (0, 0, 1), (5,), (0, 6), (6,), (0, 7), (0, 1, 0), (1, 1), (7,), (0, 8),
    (0, 0, 2), (3, 0), (0, 9), (8,), (9,), (1, 0, 0), (0, 2, 0), (1, 2), (0, 0, 3), (4, 0),
    (2, 1), (0, 0, 4), (0, 0, 5), (0, 0, 0, 0), (0, 1, 1), (0, 0, 6), (0, 3, 0), (5, 0),
    (1, 3), (0, 0, 7), (0, 0, 8), (0, 0, 9), (6, 0), (0, 4, 0), (1, 4), (7, 0), (0, 1, 2),
    (2, 0, 0), (3, 1), (2, 2), (8, 0), (0, 5, 0), (1, 5), (1, 0, 1), (0, 2, 1), (9, 0),
    (0, 6, 0), (0, 0, 0, 1), (1, 6), (0, 7, 0),
)

# levels:3,2,1,1,1 -- see the module docstring: a reconstruction, not a re-typing.
_VLLM_PR_27: Choices = tuple(
    [(a,) for a in range(3)]
    + [(a, b) for a in range(3) for b in range(2)]
    + [(a, b) + (0,) * k for k in (1, 2, 3) for a in range(3) for b in range(2)]
)
# fmt: on

NAMED_TREES: dict[str, NamedTree] = {
    t.name: t
    for t in (
        NamedTree(
            "eagle:mc_sim_7b_63",
            _EAGLE_MC_SIM_7B_63,
            "SafeAILab/EAGLE eagle/model/choices.py@08dc06ccb428f2d3cf8380933ea50ed3e4178168",
        ),
        NamedTree(
            "medusa:mc_sim_7b_63",
            _MEDUSA_MC_SIM_7B_63,
            "FasterDecoding/Medusa medusa/model/medusa_choices.py@11af0aa503437b40d45f5a47c001c43699b7ae52",
        ),
        NamedTree(
            "vllm:pr_27",
            _VLLM_PR_27,
            "reconstructed from vllm-project/vllm#20401's description (27 draft nodes, depth 5, "
            "3 top-level branches); exact tuple list not recovered",
        ),
    )
}

# Other spellings of a name -> its registry key.
ALIASES: dict[str, str] = {"vllm_pr_27_node_tree": "vllm:pr_27"}

# Names that are reserved for a published tree whose data could not be re-typed
# from a public source -> why (parse_tree raises a TreeError with this reason).
UNAVAILABLE: dict[str, str] = {}
UNAVAILABLE_ALIASES: dict[str, str] = {}


def registry_key(name: str) -> str | None:
    """The registry key of the named tree `name`, written in any case or as an alias
    ("VLLM:PR_27", "vllm_pr_27_node_tree" -> "vllm:pr_27"), as generator keywords are read in
    any case; None when `name` names no tree (nor a reserved one: see `unavailable_reason`)."""
    low = name.lower()
    key = ALIASES.get(low, low)
    return key if key in NAMED_TREES else None


def unavailable_reason(name: str) -> str | None:
    """Why the reserved name `name` (in any case, or its alias) has no tree; None when it is not one."""
    low = name.lower()
    return UNAVAILABLE.get(UNAVAILABLE_ALIASES.get(low, low))


def known_names() -> list[str]:
    """Sorted registry keys and aliases that parse_tree accepts as named trees."""
    return sorted([*NAMED_TREES, *ALIASES])
