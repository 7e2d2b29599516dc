"""Token tree parsing, canonical form, validation, named trees and display."""

from __future__ import annotations

import json
import logging
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from treebench.harness.model import named_trees
from treebench.harness.errors import ConfigError, TreeError
from treebench.harness.model.trees import MAX_NODES, TokenTree, from_choices, from_parents, render_tree, tree_summary

from treebench.harness.model.tree_specs import parse_tree

FAST = settings(max_examples=60, deadline=None)


@st.composite
def parent_arrays(draw, max_nodes: int = 40) -> list[int]:
    """Any valid parent array: each node under some earlier node (any order)."""
    t = draw(st.integers(1, max_nodes))
    return [-1] + [draw(st.integers(0, i - 1)) for i in range(1, t)]


def ancestors(parents, i: int) -> set[int]:
    """i and its ancestors, by walking parent links (independent of TokenTree)."""
    out = set()
    while i >= 0:
        out.add(i)
        i = parents[i]
    return out


def sibling_order_relabel(tree: TokenTree, rng: random.Random) -> list[int]:
    """A random parent array of `tree` with nodes in another topological order
    that keeps each node's children in rank order."""
    order, ready = [0], list(tree.children[0][:1])
    while ready:
        node = ready.pop(rng.randrange(len(ready)))
        order.append(node)
        sibs = tree.children[tree.parents[node]]
        nxt = sibs.index(node) + 1
        ready += list(tree.children[node][:1]) + ([sibs[nxt]] if nxt < len(sibs) else [])
    new = {old: k for k, old in enumerate(order)}
    return [-1] + [new[tree.parents[old]] for old in order[1:]]


# --------------------------------------------------------------------------- properties


@FAST
@given(parent_arrays())
def test_canonical_order_invariants(parents):
    tree = from_parents(parents)
    assert tree.size == len(parents) and tree.parents[0] == -1
    assert all(tree.parents[i] < i for i in range(1, tree.size))
    assert list(tree.depths) == sorted(tree.depths)
    keys = [(0, ())] + [(tree.depths[i], tree.choices[i - 1]) for i in range(1, tree.size)]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)


@FAST
@given(parent_arrays())
def test_choices_are_contiguous_sibling_ranks(parents):
    tree = from_parents(parents)
    for i, c in enumerate(tree.choices, start=1):
        assert len(c) == tree.depths[i]
        assert c[:-1] == (tree.choices[tree.parents[i] - 1] if tree.parents[i] else ())
    for kids in tree.children:
        assert [tree.choices[k - 1][-1] for k in kids] == list(range(len(kids)))


@FAST
@given(parent_arrays())
def test_round_trip_through_choices_and_parents_text(parents):
    tree = from_parents(parents)
    as_tuples = repr(list(tree.choices))                          # "[(0,), (1,), (0, 0)]"
    as_lists = json.dumps([list(c) for c in tree.choices])        # "[[0], [1], [0, 0]]"
    as_parents = "parents:" + ",".join(map(str, tree.parents))
    for text in (as_tuples, as_lists, as_parents):
        assert parse_tree(text).parents == tree.parents
    assert parse_tree(list(tree.choices)).parents == tree.parents


@FAST
@given(parent_arrays(), st.randoms(use_true_random=False))
def test_any_input_order_gives_the_same_canonical_tree(parents, rng):
    tree = from_parents(parents)
    assert from_parents(sibling_order_relabel(tree, rng)).parents == tree.parents
    shuffled = list(tree.choices)
    rng.shuffle(shuffled)
    assert from_choices(shuffled).parents == tree.parents


@FAST
@given(parent_arrays())
def test_ancestor_mask_is_the_transitive_closure(parents):
    tree = from_parents(parents)
    m = tree.ancestor_mask
    assert m.dtype == torch.bool and m.shape == (tree.size, tree.size)
    for i in range(tree.size):
        assert set(torch.nonzero(m[i]).flatten().tolist()) == ancestors(tree.parents, i)
    assert not torch.triu(m, diagonal=1).any()
    assert m.diagonal().all()
    assert m.sum(1).tolist() == [d + 1 for d in tree.depths]
    mi = m.to(torch.int64)
    assert torch.equal((mi @ mi) > 0, m)  # closed under composition


@FAST
@given(parent_arrays())
def test_leaves_and_paths_are_consistent(parents):
    tree = from_parents(parents)
    has_child = set(tree.parents[1:])
    assert tree.leaves == tuple(i for i in range(tree.size) if i not in has_child)
    assert [p[-1] for p in tree.paths] == list(tree.leaves)
    for p in tree.paths:
        assert p[0] == 0 and len(p) == tree.depths[p[-1]] + 1
        assert all(tree.parents[b] == a for a, b in zip(p, p[1:]))
    assert set().union(*map(set, tree.paths)) == set(range(tree.size))


@FAST
@given(st.integers(0, 60), st.integers(0, 2**64))
def test_random_is_deterministic_canonical_and_sized(n, seed):
    tree = parse_tree(f"random:{n}:{seed}")
    assert tree == parse_tree(f"random:{n}:{seed}")
    assert tree.size == n + 1
    assert from_parents(list(tree.parents)).parents == tree.parents


def test_random_shapes_vary_with_the_seed():
    shapes = {parse_tree(f"random:12:{seed}").parents for seed in range(20)}
    depths = {parse_tree(f"random:12:{seed}").depth for seed in range(20)}
    assert len(shapes) > 10 and len(depths) > 1


# --------------------------------------------------------------------------- formats


def level_sizes(counts: list[int]) -> list[int]:
    out = [1]
    for c in counts:
        out.append(out[-1] * c)
    return out


@pytest.mark.parametrize("n", [0, 1, 3, 37, 232, MAX_NODES - 1])
def test_chain(n):
    tree = parse_tree(f"chain:{n}")
    assert tree.size == n + 1 and tree.depth == n
    assert tree.parents == (-1,) + tuple(range(n))


@pytest.mark.parametrize("branching", [1, 2, 3, 5])
@pytest.mark.parametrize("depth", [0, 1, 2, 3])
def test_full(branching, depth):
    tree = parse_tree(f"full:{branching}:{depth}")
    assert tree_summary(tree)["level_sizes"] == level_sizes([branching] * depth)
    assert all(len(c) in (0, branching) for c in tree.children)


@pytest.mark.parametrize("depth, t", [(0, 1), (1, 4), (2, 13), (3, 40)])
def test_full_3_gives_the_seed_benchmark_query_lengths(depth, t):
    assert parse_tree(f"full:3:{depth}").size == t  # DESIGN.md: 1, 4, 13, 40


@pytest.mark.parametrize("counts", [[4, 2, 1], [1], [3, 1, 1, 2], [7, 3]])
def test_levels(counts):
    tree = parse_tree("levels:" + ",".join(map(str, counts)))
    assert tree_summary(tree)["level_sizes"] == level_sizes(counts)
    for node, kids in enumerate(tree.children):
        d = tree.depths[node]
        assert len(kids) == (counts[d] if d < len(counts) else 0)


def test_levels_4_2_1_has_21_nodes():
    assert parse_tree("levels:4,2,1").size == 1 + 4 + 8 + 8  # DESIGN.md


@pytest.mark.parametrize(
    "spec",
    ["[(0,), (1,), (0, 0)]", "[[0], [1], [0, 0]]", "((0,), (1,), (0, 0))", "[(0, 0), (1,), (0,)]",
     "parents:-1,0,0,1", "parents:-1,0,1,0", " parents:-1,0,0,1 "],
)
def test_equivalent_spellings_of_one_tree(spec):
    assert parse_tree(spec).parents == (-1, 0, 0, 1)


def test_vllm_choices_string_matches_vllms_expected_mask():
    # tests/v1/spec_decode/test_tree_attention.py in vllm-project/vllm: the mask
    # vLLM expects for this speculative_token_tree (rows = queries, root first).
    expected = [[1, 0, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0], [1, 0, 1, 0, 0, 0, 0], [1, 1, 0, 1, 0, 0, 0],
                [1, 1, 0, 0, 1, 0, 0], [1, 0, 1, 0, 0, 1, 0], [1, 0, 1, 0, 0, 0, 1]]
    tree = parse_tree("[(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]")
    assert tree.ancestor_mask.to(torch.int64).tolist() == expected


def test_choices_with_rank_gaps_keep_their_order(caplog):
    with caplog.at_level(logging.WARNING):
        tree = parse_tree("[(0,), (2,), (2, 5), (2, 1)]")
    assert tree.parents == (-1, 0, 0, 2, 2)
    assert tree.choices == ((0,), (1,), (1, 0), (1, 1))
    # the ranks given are not kept: one warning says so, naming the first gap and counting the others ((2, 5)
    # lacks (2, 4), (2, 1) lacks (2, 0))
    [record] = caplog.records
    assert "choices path (2,) has no sibling (1,) before it, so it is rank 1" in record.getMessage()
    assert "(2 more paths alike)" in record.getMessage() and "expected acceptance" in record.getMessage()


def test_choices_without_rank_gaps_warn_of_nothing(caplog):
    with caplog.at_level(logging.WARNING):
        parse_tree("[(0,), (1,), (0, 0), (1, 0), (1, 1)]")
        parse_tree("medusa:mc_sim_7b_63")
    assert caplog.records == []


def test_spec_keeps_the_text_given_and_is_not_part_of_equality():
    tree = parse_tree(" chain:3 ")
    assert tree.spec == " chain:3 "
    assert tree == parse_tree("[(0,), (0, 0), (0, 0, 0)]")
    assert parse_tree([(0,), (1,)]).spec == "[(0,), (1,)]"
    assert parse_tree(tree) is tree


def test_root_only_trees():
    for spec in ("chain:0", "full:4:0", "random:0:7", "parents:-1", "[]"):
        assert parse_tree(spec).parents == (-1,)


def test_max_nodes_is_accepted():
    assert parse_tree(f"random:{MAX_NODES - 1}:3").size == MAX_NODES
    assert parse_tree("full:2:9").size == 1023


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "spec, fragment",
    [
        # text and format
        ("", "empty spec"),
        ("   ", "empty spec"),
        ("foo:1", "unknown format"),
        ("mc_sim_7b_63", "eagle:mc_sim_7b_63"),  # the error lists the known names
        ("eagle:nope", "unknown format"),
        ("[(0,), (1,)", "not a Python list"),
        ("[(0,), __import__('os')]", "not a Python list"),
        # choices
        ("[(0,), (0, 0), (1, 1)]", "no parent path (1,)"),
        ("[(0,), (1,), (0,)]", "duplicate choices path (0,)"),
        ("[(0,), (-1,)]", "index -1"),
        ("[(0,), (0.5,)]", "index 0.5"),
        ("[(0,), ('a',)]", "index 'a'"),
        ("[(True,)]", "index True"),
        ("[()]", "root is implicit"),
        ("[0, 1]", "not a tuple of ranks"),
        ("({0: 1},)", "not a tuple of ranks"),
        # parents
        ("parents:", "empty parent array"),
        ("parents:-1,2,0", "comes after it"),
        ("parents:-1,1", "its own parent"),
        ("parents:-1,2,1", "cycle through nodes [1, 2]"),
        ("parents:-1,0,3,2", "cycle through nodes [2, 3]"),
        ("parents:-1,7", "out of range"),
        ("parents:-1,-2", "out of range"),
        ("parents:-1,0,-1", "more than one root"),
        ("parents:0,-1", "node 0 must be the root"),
        ("parents:-1,x", "must be an integer"),
        ("parents:-1,0.5", "must be an integer"),
        # generators
        ("chain:-1", "chain N must be >= 0"),
        ("chain:", "must be an integer"),
        ("chain:2:3", "write chain:N"),
        ("full:3", "write full:BRANCHING:DEPTH"),
        ("full:0:2", "full BRANCHING must be >= 1"),
        ("full:3:-1", "full DEPTH must be >= 0"),
        ("full:a:2", "must be an integer"),
        ("levels:0", "levels count must be >= 1"),
        ("levels:", "levels needs"),
        ("levels:2,,1", "must be an integer"),
        ("random:5", "write random:N:SEED"),
        ("random:-1:0", "random N must be >= 0"),
        ("random:3:x", "random SEED must be an integer"),
        ("random:8:-1", "random SEED must be >= 0, got -1"),   # random.Random(-1) would draw random:8:1's tree
        ("random:37:-232", "random SEED must be >= 0, got -232"),
        ("random:5:-0", "random SEED must be >= 0, got -0"),   # a second spelling of random:5:0
        ("chain:-00", "chain N must be >= 0, got -00"),
        # no spaces inside a generator spec, digits in ASCII only
        ("chain: 3", "a generator spec has no spaces; write chain:3"),
        ("chain :3", "a generator spec has no spaces; write chain:3"),
        ("CHAIN: 3", "a generator spec has no spaces; write chain:3"),
        ("full:3:\t2", "a generator spec has no spaces; write full:3:2"),
        ("parents:-1, 0, 0", "a generator spec has no spaces; write parents:-1,0,0"),
        ("chain:\uff13", "chain N must be an integer in ASCII digits with no spaces, got '\uff13'"),
        ("full:\u0663:2", "full BRANCHING must be an integer in ASCII digits with no spaces"),
        ("random:3:\uff10", "random SEED must be an integer in ASCII digits"),
        ("chain:1_0", "chain N must be an integer in ASCII digits"),
        ("chain:+3", "chain N must be an integer in ASCII digits"),
        ("chain:" + "9" * 5000, "chain N has 5000 digits, more than an integer may have here"),
        ("full:1" + "0" * 5000 + ":2", "full BRANCHING has 5001 digits"),
        # size: one wording, the tree's own node count
        (f"chain:{MAX_NODES}", f"{MAX_NODES + 1} nodes, more than MAX_NODES = {MAX_NODES}; use a smaller tree"),
        ("chain:99999999999999999999", "at least 10^20 nodes, more than MAX_NODES"),
        ("full:10:10", "11111111111 nodes, more than MAX_NODES"),
        ("full:3:6", "1093 nodes, more than MAX_NODES"),
        ("full:1:99999999999", "100000000000 nodes, more than MAX_NODES"),
        ("full:2:1025", "at least 10^19 nodes, more than MAX_NODES"),
        ("levels:32,32", "1057 nodes, more than MAX_NODES"),
        (f"random:{MAX_NODES}:0", f"{MAX_NODES + 1} nodes, more than MAX_NODES = {MAX_NODES}; use a smaller tree"),
        ("parents:" + ",".join(["-1"] + ["0"] * MAX_NODES), f"{MAX_NODES + 1} nodes, more than MAX_NODES"),
        (repr([(k,) for k in range(MAX_NODES)]), f"{MAX_NODES + 1} nodes, more than MAX_NODES"),
    ],
)
def test_bad_specs_raise_one_clear_tree_error(spec, fragment):
    with pytest.raises(TreeError) as info:
        parse_tree(spec)
    message = str(info.value)
    assert fragment in message and "\n" not in message
    assert isinstance(info.value, ConfigError)


@pytest.mark.parametrize(
    "build, fragment",
    [
        (lambda: from_parents([]), "empty parent array"),
        (lambda: from_parents([-1, 0.0]), "must be integers"),
        (lambda: from_parents([-1, True]), "must be integers"),
        (lambda: from_choices("abc"), "list of paths"),
        (lambda: from_choices({(0,)}), "list of paths"),
        (lambda: parse_tree([[0], [0, 0], [1, 0]]), "no parent path (1,)"),
    ],
)
def test_bad_programmatic_trees_raise(build, fragment):
    with pytest.raises(TreeError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        build()


# --------------------------------------------------------------------------- named trees


@pytest.mark.parametrize(
    "name, t, depth, per_level",
    [
        # Counted from the source lists cited in harness/model/named_trees.py.
        ("eagle:mc_sim_7b_63", 26, 5, [1, 4, 8, 8, 3, 2]),
        ("medusa:mc_sim_7b_63", 64, 4, [1, 10, 28, 23, 2]),
        ("vllm:pr_27", 28, 5, [1, 3, 6, 6, 6, 6]),  # reconstructed shape, see named_trees
    ],
)
def test_named_trees(name, t, depth, per_level):
    source = named_trees.NAMED_TREES[name].choices
    tree = parse_tree(name)
    assert (tree.size, tree.depth) == (t, depth) == (len(source) + 1, max(map(len, source)))
    assert tree_summary(tree)["level_sizes"] == per_level
    assert set(tree.choices) == set(source)  # published ranks are contiguous: same paths
    assert tree.spec == name


def test_named_tree_sources_are_cited():
    for entry in named_trees.NAMED_TREES.values():
        if entry.source.startswith("reconstructed"):
            assert "#" in entry.source  # names the PR it stands in for
            continue
        repo, path_at_commit = entry.source.split(" ")
        assert "/" in repo and "@" in path_at_commit and len(path_at_commit.split("@")[1]) == 40


def test_vllm_pr_27_alias_gives_the_same_tree():
    assert parse_tree("vllm_pr_27_node_tree").parents == parse_tree("vllm:pr_27").parents


# --------------------------------------------------------------------------- display


def test_render_tree_says_leaf_for_one():
    assert render_tree(parse_tree("chain:4")).splitlines()[0].endswith("T=5 nodes, depth 4, 1 leaf")   # root + 4


@pytest.mark.parametrize("spec", ["chain:0", "full:3:0", "parents:-1", "[]"])
def test_root_alone_is_one_node(spec):
    """chain:0 is the root alone (T = 0 + 1: plain decoding, query length 1): 1 node, not 1 nodes."""
    assert render_tree(parse_tree(spec)).splitlines()[0] == f"tree {spec}: T=1 node, depth 0, 1 leaf"


@pytest.mark.parametrize("spec, line", [("chain:0", "T=1 node, depth 0, 1 leaf"),
                                        ("chain:1", "T=2 nodes, depth 1, 1 leaf"),
                                        ("full:3:2", "T=13 nodes, depth 2, 9 leaves")])
def test_shape_text_counts_in_the_right_number(spec, line):
    from treebench.harness.model.trees import shape_text     # the line the report's tree figure prints too
    assert shape_text(parse_tree(spec)) == line


def test_render_tree_small():
    expected = "\n".join([
        "tree parents:-1,0,0,1: T=4 nodes, depth 2, 2 leaves",
        "0  root  depth 0",
        "├── 1  depth 1  path 0",
        "│   └── 3  depth 2  path 0.0",
        "└── 2  depth 1  path 1",
    ])
    assert render_tree(parse_tree("parents:-1,0,0,1")) == expected


@pytest.mark.parametrize("spec", ["levels:3,2", "eagle:mc_sim_7b_63", "random:37:5"])
def test_render_tree_one_line_per_node(spec):
    tree = parse_tree(spec)
    text = render_tree(tree, ascii=True)
    lines = text.splitlines()[1:]
    assert len(lines) == tree.size
    assert sorted(int(line.lstrip("|`- ").split()[0]) for line in lines) == list(range(tree.size))
    assert text.isascii()


def test_render_deep_chain_without_recursion():
    assert len(render_tree(parse_tree(f"chain:{MAX_NODES - 1}")).splitlines()) == MAX_NODES + 1


@pytest.mark.parametrize("spec", ["chain:4", "full:3:2", "medusa:mc_sim_7b_63", "[(0,), (2,), (2, 1)]"])
def test_tree_summary_is_json_and_consistent(spec):
    tree = parse_tree(spec)
    summary = json.loads(json.dumps(tree_summary(tree)))
    assert summary["parents"] == list(tree.parents) and summary["depths"] == list(tree.depths)
    assert summary["size"] == tree.size == sum(summary["level_sizes"]) == len(summary["ancestor_mask"])
    assert summary["ancestor_mask"] == ["".join(str(int(v)) for v in row) for row in tree.ancestor_mask.tolist()]
    assert summary["mask_nnz"] == sum(d + 1 for d in tree.depths)
    assert len(summary["choices"]) == tree.size - 1 and summary["spec"] == spec
