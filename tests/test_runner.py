"""The runner with fake backends (plumbing on the CPU), and suite loading."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from treebench.harness.timing.budget import Timing
import torch

import treebench.backends  # noqa: F401  (registers torch_sdpa)
from treebench.harness.run import pair
from treebench.harness.adapter.contract import REGISTRY, Capabilities
from treebench.harness.model.cases import Case
from treebench.harness.errors import ConfigError
from treebench.harness.model.reference import paged_reference_attention
from treebench.harness.run.config import RunConfig
from treebench.harness.run.runner import run_cases
from treebench.harness.store.rows import ROW_FIELDS, SCHEMA, read_rows
from treebench.harness.model.suites import available_suites, load_suite

CASES = [Case(2, "ragged:3-37", "full:2:2", 4, 2, 32, "bfloat16", 16, "shuffled"),
         Case(1, 16, "chain:3", 4, 1, 32, "float32", 8, "interleaved")]


class Fake:
    """A backend whose output is made by `make(inputs)`."""

    mask_kind = "tree"
    capabilities = Capabilities()

    def __init__(self, name, make=None, available=None, unsupported=None):
        self.name, self.make, self.available, self.unsupported = name, make, available, unsupported

    def availability(self):
        if isinstance(self.available, Exception):
            raise self.available
        return self.available

    def supports(self, case):
        return self.unsupported

    def prepare(self, inputs):
        return lambda: self.make(inputs)


def _exact(inputs):
    return paged_reference_attention(inputs).to(inputs.dtype)


def _boom(inputs):
    raise RuntimeError("boom\nsecond line")


def _by_backend(rows):
    return {r["backend"]: r for r in rows}


def _check(cases, bks, **kw):
    return run_cases(cases, bks, RunConfig(mode="check", quiet=True, **kw))


def test_faults_become_rows_with_reasons_and_the_sweep_goes_on():
    bks = [Fake("raises", _boom),
           Fake("shape", lambda i: _exact(i)[:-1]),
           Fake("dtype", lambda i: _exact(i).double()),
           Fake("not_tensor", lambda i: [1, 2]),
           Fake("unavailable", _exact, available="needs a CUDA GPU"),
           Fake("availability_raises", _exact, available=KeyError("x")),
           Fake("unsupported", _exact, unsupported="page size 16 not supported"),
           Fake("supports_true", _exact, unsupported=True),
           Fake("availability_7", _exact, available=7),
           Fake("availability_false", _exact, available=False),
           Fake("zeros", lambda i: torch.zeros_like(i.q)),
           Fake("good", _exact)]
    rows = _check(CASES, bks)
    assert len(rows) == len(CASES) * len(bks)
    for case_rows in (rows[:len(bks)], rows[len(bks):]):
        by = _by_backend(case_rows)
        assert by["raises"]["status"] == "error" and by["raises"]["reason"] == "RuntimeError: boom"
        assert by["shape"]["status"] == "error" and "output shape" in by["shape"]["reason"]
        assert by["dtype"]["status"] == "error" and "dtype torch.float64" in by["dtype"]["reason"]
        assert by["not_tensor"]["status"] == "error" and "returned list" in by["not_tensor"]["reason"]
        assert by["unavailable"]["status"] == "skipped" and by["unavailable"]["reason"] == "needs a CUDA GPU"
        assert by["availability_raises"]["status"] == "error"       # its code crashed: not a skip
        assert "availability() raised KeyError" in by["availability_raises"]["reason"]
        assert by["unsupported"]["status"] == "skipped" and "page size 16" in by["unsupported"]["reason"]
        assert by["supports_true"]["status"] == "error"              # the contract: None or a reason string
        assert by["supports_true"]["reason"] == ("TypeError: supports() of backend 'supports_true' returned bool True, "
                                                 "expected None or a reason string")
        for name, got in (("availability_7", "int 7"), ("availability_false", "bool False")):
            assert by[name]["status"] == "error"                     # not "skipped" with the reason 7
            assert by[name]["reason"] == (f"TypeError: availability() of backend {name!r} returned {got}, "
                                          "expected None or a reason string")
        assert by["zeros"]["status"] == "mismatch" and "max_abs_err" in by["zeros"]["reason"]
        assert by["zeros"]["mismatch_frac"] > 0.5 and by["zeros"]["worst"] is not None
        assert by["good"]["status"] == "pass" and by["good"]["reason"] is None


def test_rows_carry_every_schema_field_and_identity():
    rows = _check(CASES, [Fake("good", _exact), Fake("raises", _boom)], run_id="run-1", env_id="env-1")
    for row, case in zip(rows[::2], CASES):
        assert set(row) == set(ROW_FIELDS)
        assert row["schema"] == SCHEMA and row["run_id"] == "run-1" and row["env"] == "env-1"
        assert row["case"] == case.axes and row["case_id"] == case.case_id
        assert row["context_lens"] == case.context_lens()
        assert row["tree_sizes"] == [t.size for t in case.trees()]
        assert row["timestamp"] and row["median_us"] is None      # check mode: no timing


def test_run_mode_times_passing_and_mismatching_rows_only():
    bks = [Fake("good", _exact), Fake("zeros", lambda i: torch.zeros_like(i.q)), Fake("raises", _boom)]
    rows = run_cases(CASES[:1], bks, RunConfig(mode="run", quiet=True, device="cpu"))
    by = _by_backend(rows)
    for name in ("good", "zeros"):
        r = by[name]
        assert r["timer"] == "wall" and r["n_samples"] == len(r["samples_us"]) >= 1
        assert r["p25_us"] <= r["median_us"] <= r["p75_us"]
        assert "tflops" in r and "tb_per_s" in r
    assert by["raises"]["median_us"] is None and by["raises"]["timer"] is None
    assert by["good"]["l2_flushed"] is False          # the CPU's wall timer never flushes, whatever flush_l2 says
    assert by["raises"]["l2_flushed"] is None         # untimed rows: no L2 state, like their timer


def test_check_rows_have_no_l2_state():
    (row,) = _check(CASES[:1], [Fake("good", _exact)])
    assert row["timer"] is None and row["l2_flushed"] is None


@pytest.mark.parametrize("mode", ["auto", "cuda_graph", "cuda_event", "host_inclusive"])
@pytest.mark.parametrize("flush_l2", [True, False])
def test_run_config_timer_and_l2_reach_time_callable(monkeypatch, mode, flush_l2):
    seen = []

    def fake_time_callable(fn, **kw):
        seen.append(kw)
        return Timing([3.0, 1.0, 2.0], "cuda_graph", None, l2_flushed=kw["flush_l2"])

    monkeypatch.setattr(pair, "time_callable", fake_time_callable)
    config = RunConfig(mode="run", quiet=True, device="cpu", timing_mode=mode, flush_l2=flush_l2)
    (row,) = run_cases(CASES[:1], [Fake("good", _exact)], config)
    assert seen == [{"device": torch.device("cpu"), "mode": mode, "flush_l2": flush_l2}]
    assert (row["timer"], row["l2_flushed"], row["median_us"]) == ("cuda_graph", flush_l2, 2.0)


def test_run_config_refuses_the_back_to_back_timer_with_a_flushed_l2():
    with pytest.raises(ConfigError, match="cuda_graph_loop.*flush_l2=False"):
        run_cases(CASES[:1], [Fake("good", _exact)], RunConfig(mode="run", quiet=True, device="cpu",
                                                               timing_mode="cuda_graph_loop"))


def test_run_config_defaults_flush_the_l2():
    assert (RunConfig().timing_mode, RunConfig().flush_l2) == ("auto", True)
    with pytest.raises(ValueError, match="timing_mode 'wall' is not one of auto, cuda_graph"):
        run_cases(CASES[:1], [Fake("good", _exact)], RunConfig(quiet=True, timing_mode="wall"))


def test_each_row_is_in_the_store_before_the_next_backend_runs(tmp_path):
    path = tmp_path / "rows.jsonl"
    seen = []

    def count_then_exact(inputs):
        seen.append(len(read_rows([path])) if path.exists() else 0)
        return _exact(inputs)

    rows = _check(CASES, [Fake("a", _boom), Fake("b", count_then_exact)], store_path=path)
    assert seen == [1] * 6 + [3] * 6   # a check calls three times on the case, then three on its alternate
    assert [r["backend"] for r in read_rows([path])] == [r["backend"] for r in rows]


def test_inputs_and_reference_are_built_once_per_case(monkeypatch):
    calls = {"inputs": 0, "ref": 0}
    real_build, real_ref = pair.build_inputs, pair.reference_attention

    def build(*a, **k):
        calls["inputs"] += 1
        return real_build(*a, **k)

    def ref(*a, **k):
        calls["ref"] += 1
        return real_ref(*a, **k)

    monkeypatch.setattr(pair, "build_inputs", build)
    monkeypatch.setattr(pair, "reference_attention", ref)
    _check(CASES, [Fake("a", _exact), Fake("b", _exact), Fake("c", _boom)])
    assert calls == {"inputs": 4, "ref": 4}   # each case and its re-prepare alternate, once for all backends


def test_causal_backends_get_the_causal_batch_and_reference():
    seen = []

    def chains_only(inputs):
        seen.append([t.parents for t in inputs.trees])
        return _exact(inputs)

    causal = Fake("causal", chains_only)
    causal.mask_kind = "causal"
    rows = _check(CASES[:1], [causal, Fake("tree", _exact)])
    assert [r["status"] for r in rows] == ["pass", "pass"]
    assert all(p == tuple(range(-1, len(p) - 1)) for p in seen[0])


def test_unknown_mask_kind_is_an_error_row():
    odd = Fake("odd", _exact)
    odd.mask_kind = "sliding"
    (row,) = _check(CASES[:1], [odd])
    assert row["status"] == "error" and "mask_kind 'sliding'" in row["reason"]


def test_torch_sdpa_passes_on_cpu():
    rows = _check(CASES, [REGISTRY["torch_sdpa"]()])
    assert [r["status"] for r in rows] == ["pass", "pass"]


@pytest.mark.gpu
def test_torch_sdpa_runs_and_is_timed_on_cuda():
    rows = run_cases(CASES, [REGISTRY["torch_sdpa"]()], RunConfig(mode="run", quiet=True, device="cuda"))
    assert [r["status"] for r in rows] == ["pass", "pass"]
    assert all(r["timer"] in ("cuda_graph", "cuda_event") and r["median_us"] > 0 for r in rows)
    assert all(r["l2_flushed"] is True for r in rows)


@pytest.mark.gpu
def test_warm_l2_rows_on_cuda_say_so():
    config = RunConfig(mode="run", quiet=True, device="cuda", flush_l2=False)
    rows = run_cases(CASES[:1], [REGISTRY["torch_sdpa"]()], config)
    assert [(r["status"], r["l2_flushed"]) for r in rows] == [("pass", False)]


def test_timing_fields_keep_every_sample():
    f = Timing([5.0, 1.0, 3.0, 2.0, 4.0], "wall").as_row()
    assert f["median_us"] == 3.0 and f["p25_us"] == 2.0 and f["p75_us"] == 4.0
    assert f["n_samples"] == 5 and f["samples_us"] == [5.0, 1.0, 3.0, 2.0, 4.0]


# ---- suites -------------------------------------------------------------------------------

GOOD_AXES = """
batch_size = [1]
context_len = [16]
tree = ["full:2:1"]
num_q_heads = [4]
num_kv_heads = [2]
head_dim = [32]
"""


def _suite(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "s.toml"
    p.write_text(textwrap.dedent(text))
    return p


def test_findings_suites_load_by_name_from_any_directory(tmp_path, monkeypatch):
    """suites/findings/NAME.toml is `findings/NAME` (with or without .toml) wherever the command
    runs; a file of that relative path, where one exists, wins; an unknown one lists every name."""
    from treebench.harness.errors import ConfigError
    monkeypatch.chdir(tmp_path)
    names = available_suites(findings=True)
    assert "findings/xqa_fp8_gqa48_4" in names and "smoke" in names and "findings/xqa_fp8_gqa48_4" not in \
        available_suites()
    for name in ("findings/xqa_fp8_gqa48_4", "findings/xqa_fp8_gqa48_4.toml"):
        assert load_suite(name).path.parent.name == "findings" and load_suite(name).cases
    (tmp_path / "findings").mkdir()
    (tmp_path / "findings" / "xqa_fp8_gqa48_4.toml").write_text('[axes]\nbatch_size = [2]\ncontext_len = [4]\ntree = ["chain:2"]\n')
    assert load_suite("findings/xqa_fp8_gqa48_4.toml").path == Path("findings/xqa_fp8_gqa48_4.toml")
    with pytest.raises(ConfigError, match="file not found.*findings/fa4_tma_nan_tail"):
        load_suite("findings/nope")


def test_shipped_suites_load():
    assert {"smoke", "check", "seed"} <= set(available_suites())
    assert all(load_suite(name).cases for name in available_suites(findings=True))
    smoke = load_suite("smoke")
    assert smoke.name == "smoke" and 1 <= len(smoke.cases) <= 16
    seed = load_suite("seed")
    assert {c.head_dim for c in seed.cases} == {128} and {c.page_size for c in seed.cases} == {16, 128}
    assert {c.tree for c in seed.cases} >= {"full:3:0", "full:3:1", "full:3:2", "full:3:3"}
    targets = {(c.batch_size, c.context_len, c.tree, c.page_size) for c in load_suite("targets").cases}
    assert {(64, 2048, t, 128) for t in ("vllm:pr_27", "full:3:3", "full:3:1")} | {(1, 2048, "vllm:pr_27", 128)} \
        <= targets and len(targets) == 6        # the four speed-target cells of suites/targets.toml, seed-grid heads


def test_suite_with_one_axes_table(tmp_path):
    s = load_suite(_suite(tmp_path, "[suite]\nname = 'mine'\ndescription = 'd'\n[axes]\n" + GOOD_AXES
                          + "page_size = [8, 16]\n"))
    assert (s.name, s.description, len(s.cases)) == ("mine", "d", 2)
    assert [c.page_size for c in s.cases] == [8, 16]


def test_a_suite_file_may_start_with_a_utf8_byte_order_mark(tmp_path):
    """As Windows editors save TOML: the BOM is no "Invalid statement at line 1, column 1"."""
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + ("[suite]\nname = 'mine'\n[axes]\n" + GOOD_AXES).encode())
    assert load_suite(path).name == "mine" and load_suite(path).cases


def test_a_tree_axis_takes_trees_that_differ_only_in_sibling_rank(tmp_path):
    """parents:-1,0,0,1 and parents:-1,0,0,2 hang the third node under the first and under the second
    draft token: two trees, not one spelled twice (a draft's rank among its siblings is its place)."""
    s = load_suite(_suite(tmp_path, "[axes]\n" + GOOD_AXES.replace(
        '"full:2:1"', '"parents:-1,0,0,1", "parents:-1,0,0,2", "levels:3", "full:2:1"')))
    assert [c.tree for c in s.cases] == ["parents:-1,0,0,1", "parents:-1,0,0,2", "levels:3", "full:2:1"]


def test_a_negative_case_seed_is_a_case_of_its_own(tmp_path):
    """A case's seed is hashed with its other axes (Case.rng), so -1 and 1 draw apart, unlike random:N:SEED,
    whose random.Random(SEED) would draw one tree for both: the suite axis takes negative seeds."""
    s = load_suite(_suite(tmp_path, "[axes]\n" + GOOD_AXES + "seed = [-1, 1]\n"))
    assert [c.seed for c in s.cases] == [-1, 1] and s.cases[0].case_id != s.cases[1].case_id
    assert s.cases[0].rng("q").random() != s.cases[1].rng("q").random()


def test_suite_with_axes_groups_concatenates_and_drops_duplicates(tmp_path):
    text = "[[axes]]\n" + GOOD_AXES + "[[axes]]\n" + GOOD_AXES + "layout = ['contiguous', 'shuffled', 'interleaved']\n"
    s = load_suite(_suite(tmp_path, text))     # the groups share the shuffled case: taken once
    assert s.name == "s" and len(s.axes) == 2
    assert [c.layout for c in s.cases] == ["shuffled", "contiguous", "interleaved"]


@pytest.mark.parametrize("text, needle", [
    ("[axes\nbatch_size = [1]", "bad TOML"),
    ("[suite]\nname = 's'\n", "no [axes] table"),
    ("[axes]\n" + GOOD_AXES + "[extra]\nx = 1\n", "unknown top-level key 'extra'"),
    ("suite = 3\n[axes]\n" + GOOD_AXES, "[suite] must be a table"),
    ("[suite]\ncolour = 'red'\n[axes]\n" + GOOD_AXES, "unknown key 'colour'"),
    ("[suite]\nname = 7\n[axes]\n" + GOOD_AXES, "[suite] name must be a string"),
    ("[suite]\nname = ''\n[axes]\n" + GOOD_AXES, "[suite] name is ''; give it a name or leave it out"),
    ('[suite]\nname = " \\t"\n[axes]\n' + GOOD_AXES, "[suite] name is ' \\t'; give it a name or leave it out"),
    ("axes = []\n", "[[axes]] is empty"),
    ("axes = [3]\n", ": axes must be a non-empty table"),
    ("[axes]\n", ": axes must be a non-empty table"),
    ("[[axes]]\n" + GOOD_AXES + "[[axes]]\n", "axes group 1 must be a non-empty table"),
    ("[axes]\n" + GOOD_AXES + "heads = [4]\n", "unknown axis 'heads'"),
    ("[axes]\n" + GOOD_AXES + "page_size = []\n", "axis 'page_size' is empty"),
    ("[axes]\n" + GOOD_AXES + "page_size = ['16']\n", "axis page_size value '16': must be a positive integer (P)"),
    ("[axes]\n" + GOOD_AXES + "page_size = [true]\n", "axis page_size value true: must be a positive integer (P)"),
    ("[axes]\n" + GOOD_AXES + "page_size = [16.5]\n", "axis page_size value 16.5: must be a positive integer"),
    ("[axes]\n" + GOOD_AXES + "page_size = [16, 16]\n",
     ": axes: axis page_size value 16 given twice; give each once"),
    ("[axes]\n" + GOOD_AXES + "page_size = [8, 16, 8]\n", "axis page_size value 8 given twice"),
    ("[axes]\n" + GOOD_AXES + "logit_scale = [1, 1.0]\n", "axis logit_scale value 1.0 given twice"),
    ("[axes]\n" + GOOD_AXES + "layout = ['shuffled', 'shuffled']\n", "axis layout value 'shuffled' given twice"),
    ("[axes]\n" + GOOD_AXES.replace('"full:2:1"', '"full:2:1", "levels:2"'),
     ": axes: axis tree values 'full:2:1' and 'levels:2' are one tree (3 nodes, parents -1,0,0); give it once"),
    ("[axes]\n" + GOOD_AXES.replace('"full:2:1"', '"chain:3", "full:3:1", "parents:-1,0,1,2"'),
     "axis tree values 'chain:3' and 'parents:-1,0,1,2' are one tree (4 nodes, parents -1,0,1,2)"),
    ("[axes]\n" + GOOD_AXES.replace('"full:2:1"', '"FULL:2:1", "[(1,), (0,)]"'),
     "axis tree values 'FULL:2:1' and '[(1,), (0,)]' are one tree"),
    ("[axes]\n" + GOOD_AXES.replace('"full:2:1"', '"full:2:1", " full:2:1"'),
     "axis tree values 'full:2:1' and ' full:2:1' are one tree"),
    ("[axes]\n" + GOOD_AXES.replace('"full:2:1"', '"vllm:pr_27", "full:2:1", "VLLM:PR_27"'),
     "axis tree values 'vllm:pr_27' and 'VLLM:PR_27' are one tree (28 nodes"),
    ("[axes]\n" + GOOD_AXES + "page_size = [0]\n", "page_size=0"),
    ("[axes]\n" + GOOD_AXES + "dtype = ['float8']\n", "dtype='float8'"),
    ("[axes]\n" + GOOD_AXES + "tree_per_request = ['some']\n", "tree_per_request"),
    ("[axes]\n" + GOOD_AXES.replace("[2]", "[3]") + "\n", "not a multiple of num_kv_heads"),
    ("[axes]\n" + GOOD_AXES.replace('"full:2:1"', '"full:x"'), "full:x"),
    ("[axes]\n" + GOOD_AXES.replace('"full:2:1"', "5"), "axis tree value 5: must be a tree spec string, e.g."),
    ("[axes]\n" + GOOD_AXES.replace("[16]", '["ragged:9-2"]'), "ragged:9-2"),
    ("[axes]\n" + GOOD_AXES.replace("[16]", "[1.5]"),
     "axis context_len value 1.5: must be an integer >= 0, 'ragged:LO-HI' or 'list:L0,L1,...'"),
    ("[[axes]]\n" + GOOD_AXES + "[[axes]]\n" + GOOD_AXES + "seed = ['x']\n", "axes group 1: axis seed"),
    ("[[axes]]\n" + GOOD_AXES + "[[axes]]\n" + GOOD_AXES,
     ": axes group 1 is the same as axes group 0; give each group once"),
    ("[[axes]]\n" + GOOD_AXES + "layout = ['contiguous']\n[[axes]]\n" + GOOD_AXES + "[[axes]]\n" + GOOD_AXES
     + "layout = ['contiguous']\n", ": axes group 2 is the same as axes group 0"),
    ("[[axes]]\n" + GOOD_AXES + "[[axes]]\n" + GOOD_AXES + "layout = ['shuffled']\n",   # the default layout
     ": axes group 1 yields only cases that axes group 0 already yields; remove it or change its axes"),
    ("[[axes]]\n" + GOOD_AXES + "[[axes]]\n" + GOOD_AXES + "layout = ['contiguous']\n[[axes]]\n" + GOOD_AXES
     + "layout = ['contiguous', 'shuffled']\n", ": axes group 2 yields only cases that axes groups 0 and 1 already yield"),
    ("[[axes]]\n" + GOOD_AXES + "[[axes]]\n" + GOOD_AXES.replace('"full:2:1"', '"levels:2"').replace("[16]", "[16, 32]"),
     ": axes group 1's tree 'levels:2' and axes group 0's 'full:2:1' are one tree (3 nodes, parents -1,0,0) in "
     "otherwise equal cases; spell it one way"),
])
def test_bad_suites_raise_config_error_naming_file_and_field(tmp_path, text, needle):
    path = _suite(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_suite(path)
    assert str(path) in str(e.value) and needle in str(e.value)
    assert "\n" not in str(e.value)


SM_SCALE = "must be a positive finite number, e.g. 0.125 (leave sm_scale out for 1/sqrt(D))"


@pytest.mark.parametrize("axis, value, line", [
    ("sm_scale", "true", f"axis sm_scale value true: {SM_SCALE}"),
    ("sm_scale", "'big'", f"case field sm_scale='big': {SM_SCALE}"),
    ("sm_scale", "-0.5", f"case field sm_scale=-0.5: {SM_SCALE}"),
    ("seed", "true", "axis seed value true: must be an integer, e.g. 0"),
    ("logit_scale", "true", "axis logit_scale value true: must be a number in (0, 1e+06], e.g. 1.0"),
    ("k_scale", "false", "axis k_scale value false: must be a positive finite number (other than 1.0 on an fp8 "
                         "kv_dtype only)"),
    ("kv_dtype", "true", "axis kv_dtype value true: must be one of bfloat16, float16, float8_e4m3fn, float8_e5m2 "
                         "(leave kv_dtype out for the query dtype)"),
    ("dtype", "true", "axis dtype value true: must be one of bfloat16, float16, float32"),
    ("layout", "1", "axis layout value 1: must be one of contiguous, shuffled, interleaved"),
])
def test_a_bad_axis_value_gets_the_line_of_its_field(tmp_path, axis, value, line):
    """A TOML true (Python's True is an int) or a string where a number goes: the line says what that
    axis takes, as the case's own check does, never a list of Python type names."""
    path = _suite(tmp_path, "[axes]\n" + GOOD_AXES + f"{axis} = [{value}]\n")
    with pytest.raises(ConfigError) as e:
        load_suite(path)
    assert str(e.value) == f"suite {path}: axes: {line}"


def test_every_case_field_says_what_it_takes():
    from treebench.harness.model.cases import AXIS_VALUES, CASE_FIELDS

    assert set(AXIS_VALUES) == set(CASE_FIELDS)


@pytest.mark.parametrize("name, needle", [("no_such_suite", "unknown suite"), ("missing/s.toml", "file not found"),
                                          ("gone.toml", "file not found")])
def test_unknown_suite_names_and_missing_files(name, needle):
    with pytest.raises(ConfigError, match=needle) as e:
        load_suite(name)
    assert "smoke" in str(e.value)             # lists the known suites


def test_a_stop_request_a_backend_swallowed_ends_the_run_after_the_pair(tmp_path):
    """SIGTERM's handler raises and also records the stop; a backend whose own code catches
    the raised exception (a compiler's worker pool) still stops the run after that pair,
    and the pair's row is kept."""
    from treebench.harness.run import runner

    class Stop(KeyboardInterrupt):
        pass

    def swallows(inputs):
        runner.STOP_REQUESTED[0] = Stop()   # what the signal handler does, the raise swallowed
        return _exact(inputs)

    out = tmp_path / "rows.jsonl"
    with pytest.raises(Stop):
        run_cases(CASES, [Fake("swallows", swallows)], RunConfig(mode="check", quiet=True, store_path=out))
    assert len(read_rows(out)) == 1
    assert len(_check(CASES, [Fake("exact", _exact)])) == 2    # the next run starts with no stop request


def test_list_names_an_availability_of_the_wrong_type_as_the_rows_do():
    from treebench.harness.run.loading import availability_of

    assert availability_of(Fake("avail_7", available=7)) == ("TypeError: availability() of backend 'avail_7' "
                                                             "returned int 7, expected None or a reason string")
    assert availability_of(Fake("ok")) is None and availability_of(Fake("no", available="no GPU")) == "no GPU"
