"""treebench.harness.speculation: acceptance models, E(tree), the Sequoia DP, verify curves, the plan, the CLI."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from treebench.harness.cli.main import main
from treebench.harness.errors import ConfigError
from treebench.harness.speculation.acceptance import AcceptanceModel, load_model, model_from_dict, shipped_models
from treebench.harness.speculation.cost import StepCost, parse_step_us, verify_curves
from treebench.harness.speculation.expected import chain_expected, expected_tokens, simulate
from treebench.harness.speculation.plan import format_table, plan, speculation_section
from treebench.harness.speculation.search import choices_text, search_trees
from treebench.harness.model.suites import load_suite
from treebench.harness.store.rows import read_rows
from treebench.harness.model.trees import from_choices

from treebench.harness.model.tree_specs import parse_tree

ROOT = Path(__file__).resolve().parents[1]
GOOD = {"name": "t", "kind": "illustrative", "citation": "synthetic, for tests", "draft": "d", "target": "t"}
DEPTHY = AcceptanceModel("depthy", "illustrative", "test", "d", "t", ((0.7, 0.2), (0.5, 0.3, 0.1), (0.6,)))
WIDE = AcceptanceModel("wide", "illustrative", "test", "d", "t", ((0.4, 0.3, 0.2),))


def _write(tmp_path: Path, text: str | bytes, name: str = "m.toml") -> Path:
    p = tmp_path / name
    p.write_bytes(text.encode() if isinstance(text, str) else text)
    return p


def _toml(p: str, drop: str = "") -> str:
    return "".join(f'{k} = "{v}"\n' for k, v in GOOD.items() if k != drop) + (f"p = {p}\n" if drop != "p" else "")


# ---- acceptance models ----------------------------------------------------------------------------------


def test_shipped_models_load_and_say_what_they_are():
    models = [load_model(p) for p in shipped_models()]
    assert len(models) >= 3
    for m in models:
        assert m.kind == "illustrative" and "not a measurement" in m.citation.lower()


@pytest.mark.parametrize("p, words", [
    ("[[1.2]]", "outside [0, 1]"), ("[[-0.1]]", "outside [0, 1]"), ("[]", "non-empty list of rows"),
    ("[[]]", "p[0] must be a non-empty"), ("[[0.2, 0.5]]", "non-increasing"), ('[["x"]]', "not a number"),
    ("[[0.6, 0.5]]", "sums to"), ("[[true]]", "not a number"), ("0.5", "non-empty list of rows"),
])
def test_bad_p_is_one_config_error_line(tmp_path, p, words):
    with pytest.raises(ConfigError) as e:
        load_model(_write(tmp_path, _toml(p)))
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("field", ["name", "citation", "draft", "target", "kind", "p"])
def test_missing_field(tmp_path, field):
    with pytest.raises(ConfigError, match=f"missing field '{field}'"):
        load_model(_write(tmp_path, _toml("[[0.5]]", drop=field)))


@pytest.mark.parametrize("content, words", [
    (b"\xff\xfe name", "not UTF-8"), ("name = [unclosed", "bad TOML"), ("p = [[0.5]]\nextra = 1\n", "unknown key"),
])
def test_unreadable_files(tmp_path, content, words):
    with pytest.raises(ConfigError, match=words):
        load_model(_write(tmp_path, content))
    with pytest.raises(ConfigError, match="missing.toml': no such file and no shipped model of that name"):
        load_model(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match=f"acceptance file {tmp_path}: cannot read"):   # a folder
        load_model(tmp_path)


def test_json_model_and_depth_rows():
    m = model_from_dict({**GOOD, "p": [[0.5, 0.25], [0.4]]})
    assert m.prob(0, 1) == 0.25 and m.prob(1, 0) == 0.4 and m.prob(7, 0) == 0.4  # last row reused
    assert m.prob(1, 1) == 0.0                                                    # past the row: 0


# ---- E(tree) --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["chain:5", "full:3:2", "eagle:mc_sim_7b_63", "random:37:3", "levels:3,2,1"])
@pytest.mark.parametrize("model", [DEPTHY, WIDE], ids=["depthy", "wide"])
def test_expected_matches_simulation(spec, model):
    tree = parse_tree(spec)
    draws = simulate(tree, model, trials=40_000, seed=11)
    se = draws.std() / math.sqrt(len(draws))
    assert abs(draws.mean() - expected_tokens(tree, model)) < 5 * se + 1e-9


def test_expected_by_hand():
    tree = parse_tree("[(0,), (1,), (0, 0)]")
    assert expected_tokens(tree, DEPTHY) == pytest.approx(1 + 0.7 + 0.2 + 0.7 * 0.5)
    assert expected_tokens(parse_tree("chain:0"), DEPTHY) == 1.0
    assert chain_expected(3, DEPTHY) == pytest.approx(expected_tokens(parse_tree("chain:3"), DEPTHY))


# ---- the DP against brute force -------------------------------------------------------------------------


def _forests(m: int):
    """Every ordered forest of m nodes, as tuples of trees (a tree = tuple of child trees)."""
    if m == 0:
        yield ()
        return
    for k in range(1, m + 1):
        for first in _forests(k - 1):
            for rest in _forests(m - k):
                yield (first, *rest)


def _paths(children, prefix=()):
    for r, sub in enumerate(children):
        yield prefix + (r,)
        yield from _paths(sub, prefix + (r,))


def _brute(model: AcceptanceModel, t: int, max_depth: int | None) -> float:
    best = -math.inf
    for forest in _forests(t - 1):
        paths = list(_paths(forest))
        if max_depth is not None and any(len(p) > max_depth for p in paths):
            continue
        if any(p[-1] >= len(model.row(len(p) - 1)) for p in paths):
            continue
        best = max(best, expected_tokens(from_choices(paths) if paths else parse_tree("chain:0"), model))
    return best


@pytest.mark.parametrize("max_depth", [None, 2])
@pytest.mark.parametrize("model", [DEPTHY, WIDE], ids=["depthy", "wide"])
def test_dp_matches_brute_force(model, max_depth):
    found = search_trees(model, 8, max_depth)
    for t in range(1, 9):
        want = _brute(model, t, max_depth)
        if want == -math.inf:
            assert t not in found
            continue
        assert found[t].expected == pytest.approx(want)
        tree = parse_tree(choices_text(found[t].choices))
        assert tree.size == t and expected_tokens(tree, model) == pytest.approx(want)


def test_dp_256_is_fast_and_consistent():
    for path in shipped_models():
        m = load_model(path)
        found = search_trees(m, 256)
        assert sorted(found) == list(range(1, 257))
        es = [found[t].expected for t in range(1, 257)]
        assert all(b >= a - 1e-12 for a, b in itertools.pairwise(es))   # more nodes never hurt
        assert expected_tokens(parse_tree(choices_text(found[256].choices)), m) == pytest.approx(es[-1])


def test_dp_bad_sizes():
    with pytest.raises(ConfigError, match="max-nodes"):
        search_trees(WIDE, 257)
    with pytest.raises(ConfigError, match="max-depth"):
        search_trees(WIDE, 8, 0)


# ---- cost -----------------------------------------------------------------------------------------------


def _row(backend: str, t: int, us: float, b: int = 4, ctx: int | str = 1024, status: str = "pass") -> dict:
    case = {"batch_size": b, "context_len": ctx, "tree": f"chain:{t - 1}", "num_q_heads": 32, "num_kv_heads": 8,
            "head_dim": 128, "dtype": "bfloat16", "page_size": 16, "layout": "shuffled", "tree_per_request": "same",
            "seed": 0}
    return {"schema": 1, "backend": backend, "case": case, "case_id": f"{backend}-{t}", "tree_sizes": [t] * b,
            "status": status, "median_us": us, "timer": "cuda_graph", "l2_flushed": True}


def test_interpolation_never_extrapolates():
    rows = [_row("k", 4, 100.0), _row("k", 16, 220.0), _row("k", 8, 999.0, status="mismatch"),
            _row("k", 8, 999.0, ctx="ragged:16-2048")]
    (curve,) = verify_curves(rows).values()
    assert curve.sizes == [4, 16]
    assert curve.lookup(10) == (pytest.approx(160.0), "")
    us, why = curve.lookup(32)
    assert us is None and why == "no measurement at T=32 for backend k at B 4, L 1024; measured T: 4, 16"
    assert curve.lookup(1)[0] is None


@pytest.mark.parametrize("text, want", [
    ("2000", StepCost(2000.0, 0.0)), ("2000+0.5*tokens", StepCost(2000.0, 0.5)),
    (" 2000 + 0.5 * tokens ", StepCost(2000.0, 0.5)), ("0.25*tokens", StepCost(0.0, 0.25)), ("1e3", StepCost(1000.0)),
])
def test_step_us_parses(text, want):
    assert parse_step_us(text) == want
    assert want.us(4, 10) == want.fixed_us + want.per_token_us * 40


@pytest.mark.parametrize("text", ["", "abc", "2000+", "-5", "1+2+3*tokens", "2*tokenz", "nan", "inf", "1e400",
                                  "1e308+1e308", "1e308*tokens+tokens*1e308", "2_000", "0.5*tokens+1_0",
                                  "\uff15", "2000+\u0665*tokens"])
def test_step_us_bad(text):
    with pytest.raises(ConfigError, match="--step-us") as e:
        parse_step_us(text)
    assert "\n" not in str(e.value)


# ---- the plan -------------------------------------------------------------------------------------------

CHAIN9 = AcceptanceModel("chain9", "illustrative", "test", "d", "t", ((0.9,),))  # width 1: every tree is a chain


def _plan_rows() -> list[dict]:
    flat = [_row("flat", t, us) for t, us in ((1, 100.0), (4, 100.0), (8, 100.0), (16, 1000.0))]
    return flat + [_row("steep", t, 100.0 * t) for t in (1, 4, 8, 16)]


def test_plan_finds_the_known_best():
    verdicts = {v.key.backend: v for v in plan(verify_curves(_plan_rows()), CHAIN9)}
    flat, steep = verdicts["flat"], verdicts["steep"]
    assert flat.best is not None and flat.best.size == 8           # E rises, cost flat to T = 8, then steep
    assert flat.best.tokens_per_ms(4) == pytest.approx(4 * (1 - 0.9 ** 8) / 0.1 / 100.0 * 1000)
    assert flat.none is not None and flat.none.tokens_per_ms(4) == pytest.approx(40.0)
    assert steep.best is not None and steep.best.size == 1          # cost grows faster than E: no speculation
    with_step = {v.key.backend: v for v in plan(verify_curves(_plan_rows()), CHAIN9, StepCost(10_000.0))}
    assert with_step["steep"].best.size == 16                       # a big fixed step makes length pay
    text = format_table(list(verdicts.values()))
    assert "flat" in text and "best T" in text


@pytest.mark.parametrize("text, where", [
    ("1e308+1e308*tokens", "at B 4, T 1 (4 tokens)"),
    ("1.7e308*tokens", "at B 4, T 1 (4 tokens)"),
    ("4.5e307*tokens", "at B 4, T 1 (4 tokens)"),   # finite up to 3 tokens
    (" 1e308 + 1.7E308 * tokens ", "at B 4, T 1 (4 tokens)"),   # quoted as given, not as 1e+308+1.7e+308*tokens
])
def test_a_step_cost_not_finite_where_it_is_applied_is_refused(text, where):
    """A step cost finite as written but not at a curve's B and T would make every rate 0 tok/ms: refused in a
    line that quotes the user's own text."""
    step = parse_step_us(text)
    for build in (lambda: plan(verify_curves(_plan_rows()), CHAIN9, step),
                  lambda: speculation_section(_plan_rows(), WIDE, step)):
        with pytest.raises(ConfigError, match=re.escape(f"--step-us {text!r}: {where} the step takes more")) as e:
            build()
        assert "\n" not in str(e.value)
    assert plan(verify_curves(_plan_rows()), CHAIN9, parse_step_us("1e300*tokens"))[0].best.tokens_per_ms(4) > 0


def test_speculation_section_renders():
    html = speculation_section(_plan_rows(), WIDE, StepCost(500.0))
    assert html.startswith("<section") and html.endswith("</section>") and "<svg" in html and "<table>" in html
    assert "no status=pass" in speculation_section([], WIDE).lower()


# ---- CLI and suite --------------------------------------------------------------------------------------


def _cli(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "treebench", *argv], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120, check=False)


def test_cli_bad_acceptance_file_exit_2_one_line(tmp_path):
    bad = _write(tmp_path, _toml("[[0.3, 0.6]]"))
    proc = _cli("tree-search", "--acceptance", str(bad), "--max-nodes", "4")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "non-increasing" in proc.stderr


@pytest.mark.parametrize("argv, words", [
    (["tree-search", "--acceptance", "{bad}", "--max-nodes", "4"], "not UTF-8"),
    (["tree-search", "--acceptance", "{good}", "--max-nodes", "x"], "argument --max-nodes: 'x' is not an integer (ASCII digits 0-9, no '+', '_' or spaces)"),
    (["tree-search", "--acceptance", "{good}", "--max-nodes", "8", "--sizes", "4,4"],
     "argument --sizes: 4 given twice in '4,4'; give each once"),
    (["tree-search", "--acceptance", "{good}", "--max-nodes", "8", "--batch-sizes", "1,16,01"],
     "argument --batch-sizes: 1 given twice in '1,16,01'; give each once"),
    (["tree-search", "--acceptance", "{good}", "--max-nodes", "37", "--context-lens", "232,2048,232"],
     "argument --context-lens: 232 given twice in '232,2048,232'; give each once"),
    (["tree-search", "--acceptance", "{good}", "--max-nodes", "4", "--batch-sizes", "2"],
     "tree-search --batch-sizes without --suite-out: it sets an axis of the suite that --suite-out FILE writes"),
    (["tree-search", "--acceptance", "{good}", "--max-nodes", "4", "--context-lens", "0"],
     "tree-search --context-lens without --suite-out: it sets an axis"),
    (["tree-search", "--acceptance", "{good}", "--max-nodes", "4", "--context-lens", "16", "--batch-sizes", "1"],
     "tree-search --batch-sizes and --context-lens without --suite-out: they set axes"),
    (["tree-search", "--acceptance", "{good}", "--max-nodes", "4", "--suite-out", "{tmp}/s.toml", "--batch-sizes",
      "0"], "argument --batch-sizes: '0' is not a comma-separated list of positive integers"),
    (["tree-search", "--acceptance", "{good}", "--max-nodes", "4", "--suite-out", "{tmp}/s.toml", "--context-lens",
      "0,x"], "argument --context-lens: '0,x' is not a comma-separated list of integers >= 0"),
    (["plan", "--results", "{rows}", "--acceptance", "{good}", "--step-us", "fast"], "--step-us"),
    (["plan", "--results", "{rows}", "--acceptance", "{good}", "--step-us", "1e308+1e308*tokens"],
     "--step-us '1e308+1e308*tokens': at B 4, T 1 (4 tokens) the step takes more µs than a float holds"),
    (["plan", "--results", "{rows}", "--acceptance", "{good}", "--step-us", "1e308+1e308"],
     "--step-us '1e308+1e308': its terms add up to more µs than a float holds"),
    (["report", "{rows}", "-o", "{tmp}/r.html", "--acceptance", "{good}", "--step-us", "1e308+1e308*tokens"],
     "--step-us '1e308+1e308*tokens': at B 4, T 1 (4 tokens)"),
    (["plan", "--results", "{rows}", "--acceptance", "{good}", "--backends", "nope"], "--backends nope"),
    (["plan", "--results", "{rows}", "--acceptance", "{good}", "--backends", "flat,,flat"],
     "--backends: empty name between commas in 'flat,,flat'"),
    (["plan", "--results", "{rows}", "--acceptance", "{good}", "--backends", "flat,flat"],
     "--backends: 'flat' named twice in 'flat,flat'"),
    (["plan", "--results", "{rows}", "--acceptance", "{good}", "--backends", " , "], "--backends ' , ' names no backend"),
])
def test_cli_bad_input_in_process(tmp_path, capsys, argv, words):
    paths = {"bad": str(_write(tmp_path, b"\xff", "bad.toml")), "good": str(shipped_models()[0]), "tmp": str(tmp_path),
             "rows": str(_write(tmp_path, "".join(json.dumps(r) + "\n" for r in _plan_rows()), "r.jsonl"))}
    assert main([a.format(**paths) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err
    assert err.startswith(f"treebench: error: {argv[0]}"), err            # each line led by its command
    assert not (tmp_path / "r.html").exists()


def test_cli_tree_search_output_parses_back_and_suite_loads(tmp_path):
    suite = tmp_path / "s.toml"
    proc = _cli("tree-search", "--acceptance", str(shipped_models()[0]), "--max-nodes", "16", "--sizes", "1,4,16",
                "--suite-out", str(suite))
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("T=")]
    assert [ln.split()[0] for ln in lines] == ["T=1", "T=4", "T=16"]
    for ln in lines:
        assert parse_tree(ln.split(" ", 3)[3]).size == int(ln.split()[0][2:])
    loaded = load_suite(suite)
    assert {parse_tree(c.tree).size for c in loaded.cases} == {1, 4, 16}


def test_tree_search_writes_a_suite_of_context_length_0_as_suites_take_it(tmp_path, capsys):
    suite = tmp_path / "s.toml"
    assert main(["tree-search", "--acceptance", str(shipped_models()[0]), "--max-nodes", "3", "--suite-out",
                 str(suite), "--context-lens", "0,37", "--batch-sizes", "1"]) == 0
    assert sorted({c.context_len for c in load_suite(suite).cases}) == [0, 37]
    assert "--batch-sizes 1 --context-lens 0,37" in suite.read_text().splitlines()[1]


@pytest.mark.parametrize("name, text", [("m.toml", _toml("[[0.9]]")), ("m.json", json.dumps({**GOOD, "p": [[0.9]]}))])
def test_an_acceptance_file_may_start_with_a_utf8_byte_order_mark(tmp_path, name, text):
    assert load_model(_write(tmp_path, "\ufeff" + text, name)).prob(0, 0) == 0.9


def test_plan_on_check_rows_says_they_are_untimed(tmp_path, capsys):
    """check's rows pass untimed: plan says so, not that no row passed."""
    from tests.tiny_suites import tiny_suite

    (tmp_path / "tiny.toml").write_text(tiny_suite())
    rows = tmp_path / "c.jsonl"
    assert main(["check", "--backend", "torch_sdpa", "--suite", str(tmp_path / "tiny.toml"), "--out", str(rows),
                 "--quiet"]) == 0
    capsys.readouterr()
    assert main(["plan", "--results", str(rows), "--acceptance", str(shipped_models()[0])]) == 2
    err = capsys.readouterr().err
    n = len(read_rows([rows]))
    counted = f"all {n} rows" if n > 1 else "its one row"
    assert err == (f"treebench: error: plan --results {rows}: {counted} left out: untimed (as check's rows); plan "
                   "reads timed status=pass rows of one context length and one tree size per batch; give result "
                   "files written by treebench run\n"), err


def test_cli_plan_prints_table(tmp_path, capsys):
    rows = _write(tmp_path, "".join(json.dumps(r) + "\n" for r in _plan_rows()), "r.jsonl")
    model = _write(tmp_path, _toml("[[0.9]]"))
    assert main(["plan", "--results", str(rows), "--acceptance", str(model), "--backends", "flat"]) == 0
    out = capsys.readouterr().out
    table = [ln.split() for ln in out.splitlines() if ln.startswith("flat")]
    assert table and table[0][3] == "8"                                  # best T
    assert "T=8: [(0,), (0, 0)," in out


def test_plan_suite_loads_with_the_searched_sizes():
    suite = load_suite(ROOT / "suites" / "plan.toml")
    sizes = {parse_tree(c.tree).size for c in suite.cases}
    assert sizes == {1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 32, 48, 64, 96, 128}
    assert {c.batch_size for c in suite.cases} == {1, 16, 64} and {c.context_len for c in suite.cases} == {2048}
    assert "treebench tree-search" in suite.description


def test_cli_tree_search_suite_out_never_replaces_another_file(tmp_path):
    """--suite-out is checked before the search: an existing file tree-search did not write, a
    non-.toml path or an empty one is refused with one line and exit 2, and left as it is (a file tree-search
    did not write even with --force); a suite tree-search wrote is refused without --force (a user's edits to
    it kept) and replaced by the new one with it."""
    notes = tmp_path / "notes.toml"
    notes.write_text("important\nsecond line\n")
    args = ("tree-search", "--acceptance", str(shipped_models()[0]), "--max-nodes", "8")
    for out, needle in ((notes, "was not written by tree-search"), (tmp_path / "s.txt", "give a .toml path"),
                        ("", "--suite-out is empty"), (tmp_path, "is a folder")):
        proc = _cli(*args, "--suite-out", str(out), "--force")
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr
        assert not proc.stdout                                   # refused before the search printed anything
    assert notes.read_text() == "important\nsecond line\n"
    assert not (tmp_path / "s.txt").exists()
    suite = tmp_path / "s.toml"
    assert _cli(*args, "--sizes", "1,4", "--suite-out", str(suite)).returncode == 0
    edited = suite.read_text() + "# my note\n"
    suite.write_text(edited)
    proc = _cli(*args, "--sizes", "1,8", "--suite-out", str(suite))   # without --force: refused, edits kept
    assert proc.returncode == 2 and not proc.stdout and proc.stderr.strip().splitlines() == [
        f"treebench: error: tree-search --suite-out {suite}: exists (it is left as it is, edits and all); choose a "
        "new path, or add --force to replace it"], proc.stderr
    assert suite.read_text() == edited
    proc = _cli(*args, "--sizes", "1,8", "--suite-out", str(suite), "--force")   # --force replaces it
    assert proc.returncode == 0, proc.stderr
    assert {parse_tree(c.tree).size for c in load_suite(suite).cases} == {1, 8}
    proc = _cli(*args, "--force")
    assert proc.returncode == 2 and "tree-search --force without --suite-out" in proc.stderr and not proc.stdout


@pytest.mark.parametrize("option, value, axis, limit", [("--batch-sizes", "1,99999999", "batch_size", 65536),
                                                        ("--context-lens", "0,99999999999", "context_len", 2**24)])
@pytest.mark.parametrize("existing", [True, False], ids=["replacing", "new"])
def test_tree_search_refuses_an_axis_value_past_a_suites_limit_before_anything(tmp_path, capsys, option, value, axis,
                                                                             limit, existing):
    """--batch-sizes and --context-lens are held to the limits the suite reader holds the axes to (cases.MAX_AXIS,
    MAX_CONTEXT_LEN): a value past one is one line naming the option, exit 2, before the trees are printed; a suite
    tree-search wrote there is left as it was, and no file is made where there was none. The limit itself is taken."""
    suite = tmp_path / "ts.toml"
    args = ["tree-search", "--acceptance", str(shipped_models()[0]), "--max-nodes", "4", "--suite-out", str(suite)]
    if existing:
        assert main(args) == 0
        capsys.readouterr()
    before = suite.read_bytes() if existing else None
    assert main([*args, option, value]) == 2
    out, err = capsys.readouterr()
    assert not out and err.splitlines() == [f"treebench: error: tree-search {option} {value.split(',')[1]}: exceeds the limit "
                                            f"{limit} of a suite's {axis} axis; give values <= {limit}"]
    assert (suite.read_bytes() if suite.exists() else None) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == (["ts.toml"] if existing else [])
    assert main([*args, option, str(limit), "--force"]) == 0
    assert limit in {getattr(c, axis) for c in load_suite(suite).cases}


def test_tree_search_never_writes_a_suite_the_suite_reader_refuses(tmp_path, capsys, monkeypatch):
    """The suite's text is read back as load_suite reads it, from a temporary file beside it, before that file
    replaces --suite-out: a suite the reader would refuse is one line and exit 2, with the file there left as it
    was (or none made, nor its folders), no temporary file left behind, and no tree printed."""
    from treebench.harness.speculation import commands

    written = commands.suite_text
    monkeypatch.setattr(commands, "suite_text", lambda *a: written(*a).replace("page_size = [16]", "page_size = [0]"))
    for suite in (tmp_path / "ts.toml", tmp_path / "new" / "deeper" / "ts.toml"):
        args = ["tree-search", "--acceptance", str(shipped_models()[0]), "--max-nodes", "3", "--suite-out", str(suite),
                "--force"]
        if suite.parent == tmp_path:
            suite.write_text("# a suite\n# Generated by: treebench tree-search --max-nodes 3\n")
        before = sorted(tmp_path.rglob("*")), suite.read_bytes() if suite.exists() else None
        assert main(args) == 2
        out, err = capsys.readouterr()
        assert not out and len(err.splitlines()) == 1 and f"suite {suite}: axes: case field page_size=0" in err, err
        assert (sorted(tmp_path.rglob("*")), suite.read_bytes() if suite.exists() else None) == before


def test_cli_tree_search_suite_out_creates_missing_folders(tmp_path, capsys):
    """--suite-out in folders that do not exist yet: they are made (as run --out and report -o make
    theirs) and the suite loads; a folder that cannot be made is refused before the search."""
    args = ["tree-search", "--acceptance", str(shipped_models()[0]), "--max-nodes", "4"]
    suite = tmp_path / "new" / "deeper" / "s.toml"
    assert main([*args, "--suite-out", str(suite)]) == 0
    cases = load_suite(suite).cases
    assert capsys.readouterr().err == f"tree-search: wrote {suite}: {len(cases)} cases\n"   # led as its other lines
    assert {parse_tree(c.tree).size for c in cases} == {1, 2, 3, 4}
    (tmp_path / "a-file").write_text("x")
    assert main([*args, "--suite-out", str(tmp_path / "a-file" / "s.toml")]) == 2
    out, err = capsys.readouterr()
    assert not out and err.count("\n") == 1 and "is not a folder" in err


# ---- acceptance models by name --------------------------------------------------------------------------

NAMES = "illustrative-depth-decay, illustrative-geometric, illustrative-weak-draft"


def test_acceptance_takes_a_shipped_models_name_from_any_folder(tmp_path, monkeypatch, capsys):
    """tree-search, plan and report take a shipped model's name (its file stem) wherever they run."""
    rows = _write(tmp_path, "".join(json.dumps(r) + "\n" for r in _plan_rows()), "r.jsonl")
    monkeypatch.chdir(tmp_path)
    assert main(["tree-search", "--acceptance", "illustrative-geometric", "--max-nodes", "8"]) == 0
    assert capsys.readouterr().out.startswith("# illustrative-geometric (illustrative;")
    assert main(["plan", "--results", str(rows), "--acceptance", "illustrative-depth-decay"]) == 0
    assert capsys.readouterr().out.startswith("acceptance model illustrative-depth-decay (illustrative)")
    assert main(["report", str(rows), "-o", str(tmp_path / "r.html"), "--acceptance", "illustrative-weak-draft"]) == 0
    assert "Acceptance model illustrative-weak-draft" in (tmp_path / "r.html").read_text()
    proc = subprocess.run([sys.executable, "-m", "treebench", "tree-search", "--acceptance", "illustrative-geometric",
                           "--max-nodes", "4"], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert proc.returncode == 0 and proc.stdout.startswith("# illustrative-geometric"), proc.stderr
    for command in (["tree-search", "--help"], ["plan", "--help"]):
        assert main(command) == 0
        shown = " ".join(capsys.readouterr().out.split())
        assert f"--acceptance MODEL acceptance model: a shipped model's name ({NAMES}) or a TOML/JSON file" in shown


@pytest.mark.parametrize("given", ["harness/speculation/data/illustrative-geometric.toml", "geometric",
                                   "illustrative-geometric.json", ""])
@pytest.mark.parametrize("command", ["tree-search", "plan", "report"])
def test_acceptance_neither_a_file_nor_a_shipped_name_is_refused_listing_the_names(tmp_path, monkeypatch, capsys,
                                                                                 given, command):
    """From outside the repository the example path is no file: one line, exit 2, that lists the shipped
    names (never suggesting the path that just failed), nothing written."""
    rows = _write(tmp_path, "".join(json.dumps(r) + "\n" for r in _plan_rows()), "r.jsonl")
    monkeypatch.chdir(tmp_path)
    argv = {"tree-search": ["tree-search", "--max-nodes", "4", "--acceptance", given],
            "plan": ["plan", "--results", str(rows), "--acceptance", given],
            "report": ["report", str(rows), "-o", str(tmp_path / "r.html"), "--acceptance", given]}[command]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert not out and err.count("\n") == 1, err
    assert err.startswith(f"treebench: error: {command}: acceptance model {given!r}: no such file and no shipped model "
                          "of that name")                                      # led by the command, as its other lines
    assert err.rstrip().endswith(f"one of: {NAMES}") and "data/illustrative-geometric.toml" not in err.split(":", 4)[4]
    assert not (tmp_path / "r.html").exists()


def test_an_acceptance_path_that_exists_wins_over_a_shipped_name(tmp_path, monkeypatch, capsys):
    """A file named as a shipped model, in the working folder, is the file; the name and the shipped
    file's own path, given together to tree-search, are one model given twice."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "illustrative-geometric").write_text(_toml("[[0.9]]"))
    assert load_model("illustrative-geometric").name == "t"
    assert main(["tree-search", "--acceptance", "illustrative-geometric", "--max-nodes", "3"]) == 0
    assert capsys.readouterr().out.startswith("# t (illustrative")
    shipped = str(ROOT / "harness/speculation/data/illustrative-depth-decay.toml")
    assert main(["tree-search", "--acceptance", "illustrative-depth-decay", "--acceptance", shipped,
                 "--max-nodes", "3"]) == 2
    assert (f"--acceptance {shipped} (the file of --acceptance illustrative-depth-decay) given twice"
            in capsys.readouterr().err)


# ---- rows the plan leaves out ---------------------------------------------------------------------------

def _left_out_rows() -> list[dict]:
    """_plan_rows and, for backend flat, 3 ragged-context rows, one list-context row, one skipped, one
    untimed (as check's), and one with a tree per request."""
    ragged = [_row("flat", t, 50.0, ctx="ragged:16-2048") for t in (1, 4, 8)]
    listed = _row("flat", 4, 50.0, b=2, ctx="list:16,2048")
    skipped = {**_row("flat", 4, 50.0, ctx=232), "status": "skipped", "median_us": None, "reason": "no"}
    untimed = {**_row("flat", 8, 50.0, ctx=37), "median_us": None}
    mixed = _row("flat", 4, 50.0, ctx=37)
    mixed = {**mixed, "case": {**mixed["case"], "tree_per_request": "mixed"}, "tree_sizes": [4, 2, 1, 3]}
    return _plan_rows() + ragged + [listed, skipped, untimed, mixed]


def test_plan_counts_the_rows_it_leaves_out_and_why(tmp_path, capsys):
    """Rows no curve can use (half of a smoke run's: its ragged contexts) were dropped without a word: one
    line above the table counts them by reason, for the backends shown; none when every row is used."""
    model = str(shipped_models()[0])
    rows = _write(tmp_path, "".join(json.dumps(r) + "\n" for r in _left_out_rows()), "r.jsonl")
    assert main(["plan", "--results", str(rows), "--acceptance", model]) == 0
    out = capsys.readouterr().out
    note = ("7 rows left out: 4 a context of several lengths (list:16,2048, ragged:16-2048), 1 a tree per request "
            "(tree_per_request mixed), 1 status other than pass (skipped), 1 untimed (as check's rows); plan reads "
            "timed status=pass rows of one context length and one tree size per batch")
    assert out.splitlines()[2] == note and out.count("left out") == 1
    assert main(["plan", "--results", str(rows), "--acceptance", model, "--backends", "steep"]) == 0
    assert "left out" not in capsys.readouterr().out                     # steep's rows are all used
    only_ragged = _write(tmp_path, "".join(json.dumps(r) + "\n" for r in _left_out_rows()[:11]), "s.jsonl")
    assert main(["plan", "--results", str(only_ragged), "--acceptance", model, "--backends", "flat"]) == 0
    assert ("\n3 rows left out: a context of several lengths (ragged:16-2048); plan reads timed status=pass rows"
            in capsys.readouterr().out)
    html = speculation_section(_left_out_rows(), WIDE)
    assert "<p>7 rows left out: 4 a context of several lengths" in html and "this section reads timed" in html


@pytest.mark.parametrize("kept, said", [
    (slice(8, None), "all 7 rows left out: 4 a context of several lengths (list:16,2048, ragged:16-2048), 1 a tree "
                     "per request (tree_per_request mixed), 1 status other than pass (skipped), 1 untimed (as check's "
                     "rows)"),
    (slice(8, 11), "all 3 rows left out: a context of several lengths (ragged:16-2048)"),
    (slice(12, 13), "its one row left out: status other than pass (skipped)"),
])
def test_plan_refusing_every_row_counts_them_by_reason_as_its_note_does(tmp_path, capsys, kept, said):
    """Results of which no row is usable: the one line that refuses them says why, counting the rows by
    reason in the words of the note above a plan's table, so the user learns what to run instead."""
    rows = _write(tmp_path, "".join(json.dumps(r) + "\n" for r in _left_out_rows()[kept]), "r.jsonl")
    assert main(["plan", "--results", str(rows), "--acceptance", str(shipped_models()[0])]) == 2
    out, err = capsys.readouterr()
    assert not out and err == (f"treebench: error: plan --results {rows}: {said}; plan reads timed status=pass rows "
                               "of one context length and one tree size per batch; give result files written by "
                               "treebench run\n"), err
    rows.write_text("")
    assert main(["plan", "--results", str(rows), "--acceptance", str(shipped_models()[0])]) == 2
    assert capsys.readouterr().err == (f"treebench: error: plan --results {rows}: no result rows; give result files "
                                       "written by treebench run\n")


@pytest.mark.parametrize("kept, said", [
    (slice(8, None), "all 7 rows left out: 4 a context of several lengths (list:16,2048, ragged:16-2048), 1 a tree "
                     "per request (tree_per_request mixed), 1 status other than pass (skipped), 1 untimed (as check's "
                     "rows); plan reads timed status=pass rows of one context length and one tree size per batch"),
    (slice(12, 13), "its one row left out: status other than pass (skipped); plan reads timed status=pass rows of "
                    "one context length and one tree size per batch"),
    (slice(0, 0), "no rows of it in the results"),
])
def test_plan_backends_without_a_usable_row_counts_its_rows_by_reason(tmp_path, capsys, kept, said):
    """`plan --backends flat` where none of flat's rows is usable (steep's are): the one line counts flat's
    rows by reason, as the refusal of results without a usable row does, or says the results hold none."""
    steep = [r for r in _plan_rows() if r["backend"] == "steep"]
    rows = _write(tmp_path, "".join(json.dumps(r) + "\n" for r in steep + _left_out_rows()[kept]), "r.jsonl")
    assert main(["plan", "--results", str(rows), "--acceptance", str(shipped_models()[0]), "--backends",
                 "steep,flat"]) == 2
    out, err = capsys.readouterr()
    assert not out and err == f"treebench: error: plan --backends flat: {said}; backends with usable rows: steep\n", err
