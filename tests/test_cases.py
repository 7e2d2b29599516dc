"""Case validation and axis expansion."""

from __future__ import annotations

import dataclasses

import pytest

from treebench.harness.model.cases import MAX_CASES, Case, expand_axes
from treebench.harness.errors import ConfigError, TreeError

BASE = dict(batch_size=2, context_len=8, tree="full:2:1")


@pytest.mark.parametrize("field, value, fragment", [
    ("batch_size", 0, "positive integer"),
    ("head_dim", 37.5, "positive integer"),
    ("num_q_heads", 6, "multiple of num_kv_heads"),
    ("dtype", "float8", "use one of"),
    ("layout", "random", "use one of"),
    ("tree_per_request", "some", "'same' or 'mixed'"),
    ("context_len", -1, ">= 0"),
    ("context_len", "ragged:9-3", "LO <= HI"),
    ("context_len", "ragged:x", "ragged:LO-HI"),
    ("context_len", 2.5, "integer >= 0"),
    ("sm_scale", 0, "sm_scale=0: must be a positive finite number"),
    ("sm_scale", float("inf"), "positive finite"),
    ("sm_scale", True, "positive finite"),
    ("sm_scale", "0.3", "positive finite"),
    ("sm_scale", True, r"sm_scale=True: must be a positive finite number, e.g. 0.125 \(leave sm_scale out for "),
    ("seed", True, "seed=True: must be an integer"),     # True is an int to Python: it was a case of its own
    ("seed", "7", "seed='7': must be an integer"),
    ("seed", 1.5, "seed=1.5: must be an integer"),
    ("tree", 5, "tree=5: must be a tree spec string"),
    ("batch_size", True, "batch_size=True: must be a positive integer"),
])
def test_bad_fields_raise_config_error(field, value, fragment):
    with pytest.raises(ConfigError, match=fragment):
        Case(**{**BASE, field: value, "num_kv_heads": 4 if field == "num_q_heads" else 8})


def test_bad_tree_is_a_tree_error():
    with pytest.raises(TreeError):
        Case(**{**BASE, "tree": "full:3"})


def test_ragged_context_lengths_are_drawn_in_range_and_fixed_per_case():
    c = Case(**{**BASE, "batch_size": 37, "context_len": "ragged:5-232"})
    lens = c.context_lens()
    assert len(lens) == 37 and all(5 <= x <= 232 for x in lens) and len(set(lens)) > 1
    assert lens == c.context_lens()
    assert lens == dataclasses.replace(c, layout="interleaved", page_size=32).context_lens()


def test_mixed_trees_vary_and_keep_request_zero():
    c = Case(**{**BASE, "batch_size": 9, "tree": "full:3:2", "tree_per_request": "mixed"})
    trees = c.trees()
    assert trees[0].size == 13 and all(1 <= t.size <= 13 for t in trees)
    assert len({t.parents for t in trees}) > 2


def test_expand_axes_is_the_product():
    cases = expand_axes({"batch_size": [1, 3], "context_len": [0, 16, 232], "tree": ["chain:2"]})
    assert len(cases) == 6 and len({c.case_id for c in cases}) == 6


@pytest.mark.parametrize("axes, fragment", [
    ({"batch_size": [1], "tree": ["chain:1"]}, "'context_len' is required"),
    ({"batch_size": [1], "context_len": [1], "tree": []}, "is empty"),
    ({"batch_size": [1], "context_len": [1], "tree": ["chain:1"], "heads": [2]}, "unknown axis 'heads'"),
    ({"batch_size": list(range(1, 1001)), "context_len": list(range(MAX_CASES // 1000 + 1)),
      "tree": ["chain:1"]}, "more than"),
])
def test_expand_axes_rejects(axes, fragment):
    with pytest.raises(ConfigError, match=fragment):
        expand_axes(axes)


def test_check_p64_is_the_check_suite_at_page_size_64():
    """suites/check_p64.toml: the same cases as `check` but P 64 (xformers' paged path)."""
    from dataclasses import replace

    from treebench.harness.model.suites import load_suite
    check, p64 = load_suite("check").cases, load_suite("check_p64").cases
    assert p64 and all(c.page_size == 64 for c in p64)
    assert [replace(c, page_size=16) for c in p64] == list(check)


def test_pages_suite_is_every_page_size_over_the_seed_suites_trees():
    """suites/pages.toml: P 1..128 x B 16, 64 x L 2048 x the seed suite's 27-node and Medusa trees and full:3:3."""
    from treebench.harness.model.suites import load_suite
    pages, seed = load_suite("pages"), load_suite("seed")
    assert pages.name == "pages" and len(pages.cases) == 6 * 2 * 1 * 3
    grid = {(c.page_size, c.batch_size, c.context_len, c.tree) for c in pages.cases}
    trees = ("vllm:pr_27", "full:3:3", "medusa:mc_sim_7b_63")
    assert grid == {(p, b, 2048, t) for p in (1, 8, 16, 32, 64, 128) for b in (16, 64) for t in trees}
    assert set(trees) <= {c.tree for c in seed.cases}
    assert {c.trees()[0].size for c in pages.cases} == {28, 40, 64}
    assert {(c.num_q_heads, c.num_kv_heads, c.head_dim, c.dtype, c.layout) for c in pages.cases} == {
        (32, 8, 128, "bfloat16", "shuffled")}


def test_tree_spellings_that_parse_alike_share_one_case_id():
    """' FULL:3:2 ' and 'full:3:2' are one tree: one case id, one seed (new-user finding)."""
    from treebench.harness.model.cases import canonical_spec
    a = Case(batch_size=2, context_len=8, tree=" FULL:3:2 ")
    b = Case(batch_size=2, context_len=8, tree="full:3:2")
    assert a.tree == "full:3:2" and a.case_id == b.case_id and a == b
    assert canonical_spec("Chain: 4") == "chain:4"
    assert canonical_spec(" eagle:mc_sim_7b_63 ") == "eagle:mc_sim_7b_63"
    assert canonical_spec("EAGLE:MC_SIM_7B_63") == "eagle:mc_sim_7b_63"   # names in any case, as keywords
    assert canonical_spec("[(0,), (1,)]") == "[(0,), (1,)]"


@pytest.mark.parametrize("spelling, canonical", [
    ("random:8:01", "random:8:1"), ("random:08:0001", "random:8:1"), ("RANDOM:8:01", "random:8:1"),
    ("chain:03", "chain:3"), (" Chain:003 ", "chain:3"), ("chain:00", "chain:0"),
    ("full:03:02", "full:3:2"), ("levels:04,02,01", "levels:4,2,1"), ("levels:37,02", "levels:37,2"),
    ("parents:-01,00,00,01", "parents:-1,0,0,1"), ("parents:-1,-0,0", "parents:-1,0,0"),
    ("vllm_pr_27_node_tree", "vllm:pr_27"), ("VLLM:PR_27", "vllm:pr_27"), (" Vllm_PR_27_node_tree", "vllm:pr_27"),
    ("EAGLE:MC_SIM_7B_63", "eagle:mc_sim_7b_63"), ("Medusa:mc_sim_7B_63", "medusa:mc_sim_7b_63"),
])
def test_a_tree_spelled_with_leading_zeros_case_or_an_alias_has_one_case_id(spelling, canonical):
    """'random:8:01' and 'random:8:1' are one tree (and 'VLLM:PR_27' and 'vllm:pr_27'): the case holds the normalised spelling, so
    suites that spell it either way give it one case id (and one seed)."""
    a = Case(batch_size=2, context_len=37, tree=spelling)
    b = Case(batch_size=2, context_len=37, tree=canonical)
    assert a.tree == canonical and a.case_id == b.case_id and a == b
    assert [t.parents for t in a.trees()] == [t.parents for t in b.trees()]


def _case_ids_of_suites(tmp_path, axes: dict[str, str]) -> list[list[str]]:
    """The case ids of one suite per (name, axes text) in `axes`, in order."""
    from treebench.harness.model.suites import load_suite
    ids = []
    for name, text in axes.items():
        p = tmp_path / f"{name}.toml"
        p.write_text(f"[axes]\n{text}\n")
        ids.append([c.case_id for c in load_suite(str(p)).cases])
    return ids


def test_two_suites_spelling_one_tree_two_ways_share_its_case_ids(tmp_path):
    """Across suites (and so in the rows gate, report, merge and --resume compare by case_id)."""
    head = "batch_size = [1, 3]\ncontext_len = [16]\ntree = "
    ids = _case_ids_of_suites(tmp_path, {"zeros": head + '["random:8:01", "chain:03"]',
                                         "plain": head + '["random:8:1", "chain:3"]'})
    assert ids[0] == ids[1] and len(set(ids[0])) == 4 and "-random:8:1-" in ids[0][0]


def test_canonical_spec_leaves_what_it_cannot_read():
    """Text that is no integer stays as written (parse_tree names what is wrong), digits of any number."""
    from treebench.harness.model.tree_specs import canonical_spec
    assert canonical_spec("chain:1_0") == "chain:1_0" and canonical_spec("chain:x07") == "chain:x07"
    assert canonical_spec("levels:,") == "levels:," and canonical_spec("full:3:") == "full:3:"
    assert canonical_spec("random:8:" + "0" * 5000 + "7") == "random:8:7"


@pytest.mark.parametrize("spelling, canonical", [
    ("ragged:016-2048", "ragged:16-2048"), ("ragged:00-0048", "ragged:0-48"), ("ragged:5-0232", "ragged:5-232"),
    ("list:01,2,037", "list:1,2,37"), ("list:000,00,17", "list:0,0,17"),
    ("list:" + "0" * 5000 + "7,1,2", "list:7,1,2"),
])
def test_a_context_spec_with_leading_zeros_has_one_case_id(spelling, canonical):
    """'ragged:016-2048' and 'ragged:16-2048' are one set of lengths: the case holds the normalised
    spelling, so suites that spell it either way give it one case id (and one seed)."""
    a = Case(batch_size=3, context_len=spelling, tree="chain:2")
    b = Case(batch_size=3, context_len=canonical, tree="chain:2")
    assert a.context_len == canonical and a.case_id == b.case_id and a == b
    assert f"-L{canonical}-" in a.case_id and a.context_lens() == b.context_lens()


@pytest.mark.parametrize("spec, part", [
    ("ragged:1_6-20", "1_6"), ("ragged:16-2_048", "2_048"), ("list:1_0,2,3", "1_0"), ("list:１,2,3", "１"),
    ("ragged:١٦-20", "١٦"), ("ragged:16-²", "²"), ("ragged:+16-20", "+16"), ("list:1, 2,3", " 2"),
    ("ragged:16-20 ", "20 "), ("list:1,2,", ""),
])
def test_a_context_spec_in_other_than_ascii_digits_is_refused(spec, part):
    """int() reads '1_6', '１' and ' 2' too: each would be a second case id (or a case id spelled other
    than its lengths); one line naming the spec as given and the number's rule."""
    with pytest.raises(ConfigError) as e:
        Case(batch_size=3, context_len=spec, tree="chain:2")
    usage = "ragged:LO-HI, e.g. ragged:16-2048" if spec.startswith("ragged") else "list:L0,L1,... with one"
    assert str(e.value).startswith(f"case field context_len={spec!r}: {part!r} is not an integer (ASCII digits 0-9, "
                                   f"no '_'); write {usage}"), str(e.value)


@pytest.mark.parametrize("spec, fragment", [
    ("ragged:16-99999999", r"must be in \[0, 2\*\*24\]"), ("ragged:0-" + "9" * 5000, r"must be in \[0, 2\*\*24\]"),
    ("ragged:16", "two integers; write ragged:LO-HI"), ("ragged:1-2-3", "two integers; write ragged:LO-HI"),
    ("ragged:-1-5", "'' is not an integer"), ("list:0,-0,2", r"must be in \[0, 2\*\*24\]"),
    ("Ragged:1-5", "must be an integer >= 0, 'ragged:LO-HI' or 'list:L0,L1,...'"),
])
def test_a_context_spec_out_of_range_or_form_is_refused(spec, fragment):
    with pytest.raises(ConfigError, match=fragment):
        Case(batch_size=3, context_len=spec, tree="chain:2")


@pytest.mark.parametrize("values, first, second", [
    ('"ragged:16-2048", "ragged:016-2048"', "ragged:16-2048", "ragged:016-2048"),
    ('"list:01,2", 4, "list:1,2"', "list:01,2", "list:1,2"),
])
def test_one_context_spec_spelled_twice_in_a_suite_axis_is_refused(tmp_path, values, first, second):
    """Both spellings would be one case: refused as a tree spelled twice is, naming both."""
    from treebench.harness.model.suites import load_suite
    p = tmp_path / "twice.toml"
    p.write_text(f'[axes]\nbatch_size = [2]\ncontext_len = [{values}]\ntree = ["chain:1"]\n')
    with pytest.raises(ConfigError) as e:
        load_suite(str(p))
    held = first.replace("01", "1")
    assert str(e.value) == (f"suite {p}: axes: axis context_len values {first!r} and {second!r} are one context "
                            f"spec ({held}); give it once")


def test_two_suites_spelling_one_context_spec_two_ways_share_its_case_ids(tmp_path):
    tail = '\ntree = ["chain:3"]'
    ids = _case_ids_of_suites(tmp_path, {
        "zeros": 'batch_size = [2]\ncontext_len = ["ragged:016-0232", "list:00,037"]' + tail,
        "plain": 'batch_size = [2]\ncontext_len = ["ragged:16-232", "list:0,37"]' + tail})
    assert ids[0] == ids[1] and len(set(ids[0])) == 2 and "-Lragged:16-232-" in ids[0][0]


@pytest.mark.parametrize("spelling", ["[(0,), (1,), (0, 0)]", "[[0],[1],[0,0]]", " [(1,), (0,), (0, 0)] ",
                                      "((0,), (0, 0), (1,))", "[[0], [0, 0], [1]]"])
def test_one_choices_tree_in_any_spelling_has_one_case_id(spelling):
    """A choices list written as lists or tuples, in any order or spacing, is one tree: one case id."""
    a = Case(batch_size=2, context_len=37, tree=spelling)
    b = Case(batch_size=2, context_len=37, tree="[(0,), (1,), (0, 0)]")
    assert a.tree == "[(0,), (1,), (0, 0)]" and a.case_id == b.case_id
    assert [t.parents for t in a.trees()] == [t.parents for t in b.trees()]


def test_sm_scale_is_in_the_id_only_when_set_and_draws_its_twins_values():
    """sm_scale left out (or 1/sqrt(D) spelt out) is the default case, id unchanged; set, it adds
    'sm0.3-' to the id and keeps the default twin's draws (it seeds no stream)."""
    base = Case(**{**BASE, "head_dim": 64})
    assert "sm_scale" not in base.axes and base.softmax_scale == 0.125
    assert Case(**{**BASE, "head_dim": 64, "sm_scale": 0.125}) == base
    scaled = Case(**{**BASE, "head_dim": 64, "sm_scale": 0.3})
    assert "-sm0.3-" in scaled.case_id and scaled.case_id != base.case_id and scaled.softmax_scale == 0.3
    assert Case(**scaled.axes) == scaled and scaled.axes["sm_scale"] == 0.3
    assert Case(**{**BASE, "head_dim": 64, "sm_scale": 1}).sm_scale == 1.0
    assert scaled.torch_seed("qkv") == base.torch_seed("qkv") and scaled.context_lens() == base.context_lens()


def test_a_suite_sweeps_sm_scale(tmp_path):
    from treebench.harness.model.suites import load_suite
    p = tmp_path / "scales.toml"
    p.write_text('[axes]\nbatch_size = [1]\ncontext_len = [4]\ntree = ["chain:1"]\nhead_dim = [64]\n'
                 "sm_scale = [0.3, 1]\n")
    assert [c.sm_scale for c in load_suite(str(p)).cases] == [0.3, 1.0]
    p.write_text(p.read_text().replace("[0.3, 1]", '["big"]'))
    with pytest.raises(ConfigError, match="sm_scale='big'"):
        load_suite(str(p))
