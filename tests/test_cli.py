"""The treebench CLI: exit codes 0/1/2, one-line errors, append-only result
files, lazily wired subcommands, and the curated public API."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

import treebench.harness as harness
from treebench.harness.cli.main import main
from treebench.harness.run.loading import registered_backends
from treebench.harness.store.rows import read_rows
from tests.cli_errors import one_line_error as _one_line_error

ROOT = Path(__file__).resolve().parent.parent
BROKEN = ROOT / "tests" / "broken_backends.py"

TINY = """
[suite]
name = "tiny"
[axes]
batch_size = [2]
context_len = ["ragged:5-40"]
tree = ["full:2:2"]
num_q_heads = [4]
num_kv_heads = [2]
head_dim = [32]
dtype = ["bfloat16"]
page_size = [16]
layout = ["shuffled", "interleaved"]
"""


@pytest.fixture
def tiny(tmp_path) -> Path:
    p = tmp_path / "tiny.toml"
    p.write_text(TINY)
    return p



def test_public_api():
    names = harness.__all__
    assert len(names) == len(set(names)) and names == sorted(names)
    for name in names:
        obj = getattr(harness, name)
        if callable(obj):
            assert obj.__doc__, f"harness.{name} has no docstring"
            assert obj.__module__.startswith("treebench.harness."), name
    for required in ("Backend", "Capabilities", "register", "load_backend", "Case", "BatchInputs", "build_inputs",
                     "reference_attention", "compare", "ConfigError", "TreeError", "load_suite", "run_cases",
                     "read_rows", "append_row", "env_fingerprint", "parse_tree", "main", "ResultsWriteError"):
        assert required in names
    with pytest.raises(AttributeError):
        harness.no_such_name  # noqa: B018


def test_results_write_error_is_public_and_an_oserror(tmp_path, monkeypatch):
    """The error a failed append raises is importable where the other errors are, and caught as
    OSError (errno, strerror and filename of the results file) or as a HarnessError."""
    import errno
    import os

    import treebench
    from treebench import HarnessError, ResultsWriteError
    from treebench.harness.store import rows, torn

    assert "ResultsWriteError" in harness.__all__ and treebench.ResultsWriteError is harness.ResultsWriteError
    assert issubclass(ResultsWriteError, OSError) and issubclass(ResultsWriteError, HarnessError)

    def broken(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    monkeypatch.setattr(torn, "fsync", broken)
    out = tmp_path / "r.jsonl"
    with pytest.raises(ResultsWriteError) as caught:
        harness.append_row(out, {"schema": rows.SCHEMA, "run_id": "r"})
    assert caught.value.errno == errno.EIO and caught.value.filename == str(out)


def test_run_writes_rows_env_and_report(tiny, tmp_path, capsys):
    out, report = tmp_path / "r" / "rows.jsonl", tmp_path / "rep" / "r.html"
    rc = main(["run", "--suite", str(tiny), "--backends", "torch_sdpa", "--out", str(out),
               "--report", str(report), "--quiet"])
    assert rc == 0
    rows = read_rows([out])
    assert [r["status"] for r in rows] == ["pass", "pass"]
    assert all(r["median_us"] > 0 for r in rows)
    assert (out.parent / f"env-{rows[0]['env']}.json").is_file()
    assert report.is_file() and report.stat().st_size > 0
    stdout = capsys.readouterr().out
    assert "torch_sdpa" in stdout and str(out) in stdout


def test_failing_run_exits_1_and_keeps_the_existing_result_file(tiny, tmp_path):
    out = tmp_path / "rows.jsonl"
    rc = main(["run", "--suite", str(tiny), "--backends", "torch_sdpa", "--out", str(out),
               "--report", str(tmp_path / "a.html"), "--quiet"])
    assert rc == 0
    before = out.read_bytes()
    rc = main(["run", "--suite", str(tiny), "--backends", f"torch_sdpa,{BROKEN}:BrokenCausalMask",
               "--out", str(out), "--report", str(tmp_path / "b.html"), "--quiet"])
    assert rc == 1
    assert out.read_bytes().startswith(before)
    rows = read_rows([out])
    assert len(rows) == 2 + 4
    assert [r["status"] for r in rows[2:] if r["backend"] == "broken_causal_mask"] == ["mismatch", "mismatch"]


def test_check_exit_codes(tiny, capsys):
    assert main(["check", "--suite", str(tiny), "--backend", "torch_sdpa", "--quiet"]) == 0
    assert main(["check", "--suite", str(tiny), "--backend", f"{BROKEN}:BrokenRootHidden", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "mismatch: broken_root_hidden on" in out


def test_check_of_an_unavailable_backend_runs_nothing_and_says_so(tiny, tmp_path, capsys):
    mod = tmp_path / "gpu_only.py"
    mod.write_text("class GpuOnly:\n    name = 'gpu_only'\n    def availability(self): return 'needs a CUDA GPU'\n"
                   "    def supports(self, case): return None\n    def prepare(self, inputs): raise AssertionError\n")
    out = tmp_path / "rows.jsonl"
    assert main(["check", "--suite", str(tiny), "--backend", f"{mod}:GpuOnly", "--out", str(out), "--quiet"]) == 3
    assert {r["status"] for r in read_rows([out])} == {"skipped"}
    assert "no case ran: gpu_only: needs a CUDA GPU" in capsys.readouterr().err
    assert main(["check", "--suite", str(tiny), "--backend", f"{mod}:GpuOnly", "--quiet", "--allow-skip"]) == 0


def test_check_of_a_backend_whose_availability_raises_fails(tiny, tmp_path):
    """availability() raising is the backend's crash: error rows and exit 1, not a skip."""
    mod = tmp_path / "broken_avail.py"
    mod.write_text("class BrokenAvail:\n    name = 'broken_avail'\n"
                   "    def availability(self): raise RuntimeError('boom in availability')\n"
                   "    def supports(self, case): return None\n    def prepare(self, inputs): raise AssertionError\n")
    out = tmp_path / "rows.jsonl"
    assert main(["check", "--suite", str(tiny), "--backend", f"{mod}:BrokenAvail", "--out", str(out), "--quiet"]) == 1
    rows = read_rows([out])
    assert {r["status"] for r in rows} == {"error"}
    assert all("availability() raised RuntimeError: boom in availability" in r["reason"] for r in rows)


def test_run_names_each_backend_that_ran_nothing(tiny, tmp_path, caplog):
    """`run` with an unavailable backend next to one that runs: the run goes on, and a
    warning gives the unavailable backend's reason (not only a count of skipped rows)."""
    mod = tmp_path / "gpu_only.py"
    mod.write_text("class GpuOnly:\n    name = 'gpu_only'\n    def availability(self): return 'needs a CUDA GPU'\n"
                   "    def supports(self, case): return None\n    def prepare(self, inputs): raise AssertionError\n")
    out = tmp_path / "rows.jsonl"
    assert main(["run", "--suite", str(tiny), "--backends", f"torch_sdpa,{mod}:GpuOnly", "--out", str(out),
                 "--report", str(tmp_path / "r.html"), "--quiet"]) == 0
    assert any("gpu_only: no case ran: needs a CUDA GPU" in m for m in caplog.messages)
    assert not any(m.startswith("torch_sdpa: no case ran") for m in caplog.messages)


@pytest.mark.parametrize("argv, needle", [
    ([], "required: COMMAND"),
    (["bogus"], "invalid choice: 'bogus'"),
    (["run", "--bogus"], "unrecognized arguments: --bogus"),
    (["tree", "full:x"], "full:x"),
    (["tree", "parents:-1,0,5"], "parents:-1,0,5"),
    (["tree", "random:8:-1", "--json"], "tree 'random:8:-1': random SEED must be >= 0, got -1"),
    (["run", "--suite", "no_such_suite"], "unknown suite"),
    (["run", "--suite", "missing/dir/s.toml"], "file not found"),
    (["run", "--backends", "nope"], "--backends 'nope': unknown backend; known: "),
    (["run", "--backends", ","], "--backends is empty"),
    (["run", "--backends", "all,torch_sdpa"], "--backends: 'all' names every built-in backend and cannot be combined "
                                              "with other names; give --backends all alone, or list the names"),
    (["run", "--backends", "reference, all"], "'all' names every built-in backend and cannot be combined"),
    (["check"], "required: --backend"),
    (["check", "--backend", "nope"], "--backend 'nope': unknown backend; known: "),
    (["check", "--backend", "no/such/file.py:X"], "not found"),
    (["check", "--backend", f"{BROKEN}:NoSuchClass"], "has no class NoSuchClass"),
    (["check", "--backend", "no_such_package_xyz:Cls"], "cannot import"),
    (["run", "--timer", "bogus"], "run: argument --timer: invalid choice: 'bogus' (choose from 'auto', 'cuda_graph'"),
    (["run", "--timer", "wall"], "argument --timer: invalid choice: 'wall'"),
    (["run", "--l2", "hot"], "run: argument --l2: invalid choice: 'hot' (choose from 'cold', 'warm')"),
    (["run", "--l2"], "argument --l2: expected one argument"),
    (["check", "--backend", "torch_sdpa", "--l2", "warm"], "unrecognized arguments: --l2 warm"),
])
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys):
    assert main(argv) == 2
    assert needle in _one_line_error(capsys)


@pytest.mark.parametrize("command, option", [("run", "--backends"), ("run", "--backend"), ("check", "--backend"),
                                             ("check", "--backends")])
@pytest.mark.parametrize("value, line", [
    ("missing.py:X", "{option} 'missing.py:X': file missing.py not found"),
    ("nope", "{option} 'nope': unknown backend; known: {known} (or give path/file.py, path/file.py:Class or "
             "package.module:Class)"),
    ("torch_sdpa,nope", "{option} 'nope': unknown backend; known: {known} (or give path/file.py, "
                        "path/file.py:Class or package.module:Class)"),
    ("{broken}:NoSuchClass", "{option} '{broken}:NoSuchClass': {broken} has no class NoSuchClass"),
    ("torch_sdpa,missing.py:X", "{option} 'missing.py:X': file missing.py not found"),
    ("all,torch_sdpa", "{option}: 'all' names every built-in backend and cannot be combined with other names; "
                       "give {option} all alone, or list the names"),
    ("torch_sdpa,,reference", "{option}: empty name between commas in 'torch_sdpa,,reference'; separate names "
                              "with single commas, e.g. a,b"),
])
def test_a_backend_error_names_the_option_as_typed(tiny, tmp_path, capsys, command, option, value, line):
    """`run --backends a,b` and `check --backend x` (each takes both spellings): the line names the
    option the user typed, not the other spelling; check refuses a list first (it takes one backend)."""
    value = value.format(broken=BROKEN)
    assert main([command, "--suite", str(tiny), option, value, "--out", str(tmp_path / "r.jsonl"), "--quiet"]) == 2
    if command == "check" and "," in value:
        line = f"check {option} {value}: check takes one backend; run one check per backend, or " \
               "`treebench run --backends a,b` for several"
    known = ", ".join(sorted(registered_backends()))
    assert _one_line_error(capsys) == "treebench: error: " + line.format(option=option, broken=BROKEN, known=known)
    assert not (tmp_path / "r.jsonl").exists()


SINGLE_COMMAS = "separate names with single commas, e.g. a,b"


@pytest.mark.parametrize("value, why", [
    ("reference,,torch_sdpa", f"empty name between commas in 'reference,,torch_sdpa'; {SINGLE_COMMAS}"),
    ("reference,", f"empty name after the last comma in 'reference,'; {SINGLE_COMMAS}"),
    (",reference", f"empty name before the first comma in ',reference'; {SINGLE_COMMAS}"),
    ("reference,reference", "'reference' named twice in 'reference,reference'; name each once"),
    ("reference, torch_sdpa ,reference", "'reference' named twice in 'reference, torch_sdpa ,reference'; name each once"),
])
@pytest.mark.parametrize("command", ["run", "gate"])
def test_a_backend_list_with_an_empty_or_repeated_name_is_one_line(tiny, tmp_path, capsys, command, value, why):
    """--backends a,,b and a,a were read as a,b and a without a word: bad input now, one line
    naming the entry, exit 2, nothing written."""
    written = tmp_path / "written"
    data = ROOT / "tests" / "data" / "results"
    argv = (["run", "--suite", str(tiny), "--backends", value, "--out", str(written / "r.jsonl"),
             "--report", str(written / "r.html")] if command == "run" else
            ["gate", "--baseline", str(data / "h200-baseline"), "--candidate", str(data / "h200-rerun"),
             "--backends", value, "--summary", str(written / "s.md")])
    assert main(argv) == 2
    assert _one_line_error(capsys) == f"treebench: error: {'gate ' if command == 'gate' else ''}--backends: {why}"
    assert not written.exists()


def test_timer_and_l2_options_and_their_defaults():
    from treebench.harness.cli.common import L2_STATES, TIMERS
    from treebench.harness.cli.main import build_parser
    from treebench.harness.timing.modes import MODES

    assert TIMERS == MODES and L2_STATES == ("cold", "warm")
    args = build_parser().parse_args(["run"])
    assert (args.timer, args.l2) == ("auto", "cold")                 # the default: L2 flushed before every call
    args = build_parser().parse_args(["run", "--timer", "host_inclusive", "--l2", "warm"])
    assert (args.timer, args.l2) == ("host_inclusive", "warm")
    args = build_parser().parse_args(["run", "--timer=cuda_graph", "--l2=cold"])
    assert (args.timer, args.l2) == ("cuda_graph", "cold")


@pytest.mark.parametrize("extra, mode, flush", [
    ([], "auto", True),
    (["--l2", "warm"], "auto", False),
    (["--timer", "cuda_event", "--l2", "cold"], "cuda_event", True),
    (["--timer", "host_inclusive", "--l2", "warm"], "host_inclusive", False),
    (["--timer", "cuda_graph_loop", "--l2", "warm"], "cuda_graph_loop", False),
])
def test_run_passes_timer_and_l2_to_the_timer(tiny, tmp_path, monkeypatch, capsys, extra, mode, flush):
    from treebench.harness.run import pair

    seen, real = [], pair.time_callable

    def spy(fn, **kw):
        seen.append(kw)
        return real(fn, **kw)

    monkeypatch.setattr(pair, "time_callable", spy)
    out = tmp_path / "rows.jsonl"
    assert main(["run", "--suite", str(tiny), "--backends", "torch_sdpa", "--out", str(out),
                 "--report", str(tmp_path / "r.html"), "--quiet", *extra]) == 0
    assert [(kw["mode"], kw["flush_l2"]) for kw in seen] == [(mode, flush)] * 2
    rows = read_rows([out])
    assert [(r["timer"], r["l2_flushed"]) for r in rows] == [("wall", False)] * 2   # the CPU never flushes
    assert all((r["timer_fallback"] is None) == (mode == "auto") for r in rows)
    printed = capsys.readouterr().out
    assert "\ntimer: wall\n" in printed                                # the CPU's one timer, no L2 state
    assert ("timer fallback: " in printed) == (mode != "auto")          # a CUDA timer asked for on the CPU


@pytest.mark.parametrize("timer", ["cuda_graph", "cuda_event", "host_inclusive"])
@pytest.mark.parametrize("quiet", [False, True])
def test_a_cuda_timer_on_the_cpu_is_one_warning_naming_both_timers(tiny, tmp_path, capsys, timer, quiet):
    out = tmp_path / "rows.jsonl"
    assert main(["run", "--suite", str(tiny), "--backends", "torch_sdpa", "--out", str(out), "--timer", timer,
                 "--report", str(tmp_path / "r.html"), *(["--quiet"] if quiet else [])]) == 0
    assert len(read_rows([out])) == 2
    warned = [line for line in capsys.readouterr().err.splitlines() if "needs a CUDA device" in line]
    assert len(warned) == (0 if quiet else 1), warned                   # once per run, not once per pair
    assert quiet or f"--timer {timer} " in warned[0] and "wall timer" in warned[0], warned


def test_the_back_to_back_timer_without_a_warm_l2_is_refused_before_anything_is_written(tiny, tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    assert main(["run", "--suite", str(tiny), "--backends", "torch_sdpa", "--out", str(out),
                 "--report", str(tmp_path / "r.html"), "--timer", "cuda_graph_loop"]) == 2
    assert "--l2 warm" in _one_line_error(capsys)
    assert not out.exists() and not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("twice", [["--l2", "warm", "--l2", "cold"], ["--timer=auto", "--timer", "cuda_event"]])
def test_timer_or_l2_given_twice_is_refused(tiny, tmp_path, capsys, twice):
    out = tmp_path / "rows.jsonl"
    assert main(["run", "--suite", str(tiny), "--out", str(out), *twice]) == 2
    assert f"error: run: {twice[0].split('=')[0]} given 2 times; give it once" in _one_line_error(capsys)
    assert not out.exists()


def test_gpus_relaunch_keeps_timer_and_l2(tiny, tmp_path, monkeypatch):
    from treebench.harness.cli import run as cli_sweep
    from treebench.harness.sweep import shard

    launched = []
    monkeypatch.setattr(cli_sweep, "_check_gpus", lambda n: None)
    monkeypatch.setattr(shard, "launch_torchrun", lambda n, argv, run_id=None: launched.append(argv) or 0)
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--suite", str(tiny), "--gpus", "2", "--timer", "cuda_event", "--l2=warm", "--quiet"]) == 0
    ((argv),) = launched
    assert argv[:5] == ["run", "--suite", str(tiny), "--timer", "cuda_event"] and argv[5] == "--l2=warm"


def test_bad_out_and_report_paths_exit_2(tiny, tmp_path, capsys):
    base = ["run", "--suite", str(tiny), "--backends", "torch_sdpa", "--quiet"]
    assert main(base + ["--out", str(tmp_path)]) == 2
    assert "is a directory" in _one_line_error(capsys)
    assert main(base + ["--out", str(tmp_path / "r.jsonl"), "--report", str(tmp_path)]) == 2
    assert "--report" in _one_line_error(capsys)
    assert main(["check", "--suite", str(tiny), "--backend", "torch_sdpa", "--out", str(tmp_path)]) == 2
    _one_line_error(capsys)


def test_bad_suite_file_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[axes]\nbatch_size = [1]\nheads = [3]\n")
    assert main(["check", "--suite", str(bad), "--backend", "torch_sdpa"]) == 2
    assert "unknown axis 'heads'" in _one_line_error(capsys)


@pytest.mark.parametrize("name, shown", [("   ", "'   '"), (" \t ", "' \\t '"), ("", "''")])
def test_a_blank_suite_name_is_quoted_in_the_line_as_written(tmp_path, capsys, name, shown):
    """The line refusing a blank [suite] name quotes it exactly (repr): three spaces are three, not one."""
    bad = tmp_path / "blank.toml"
    bad.write_text(TINY.replace('name = "tiny"', f"name = {json.dumps(name)}"))
    assert main(["check", "--suite", str(bad), "--backend", "reference"]) == 2
    assert f"[suite] name is {shown}; give it a name or leave it out" in _one_line_error(capsys)


@pytest.mark.parametrize("message, line", [
    ("a  b\n  c\t d ", "a  b c d"),                                  # plain spaces kept, a line break or tab one space
    ("name is '   '; fix", "name is '   '; fix"),
    ("x" * 300 + "  y", "x" * 100 + "…[100 characters]…" + "x" * 100 + "  y"),   # a long word cut to its ends
])
def test_the_line_of_a_refusal_keeps_runs_of_spaces_and_joins_lines(message, line):
    from treebench.harness.cli import one_line

    assert one_line(message) == line


def test_a_user_module_that_raises_on_import_is_bad_input(tmp_path, capsys):
    mod = tmp_path / "bad_mod.py"
    mod.write_text("raise RuntimeError('cannot load')\n")
    assert main(["check", "--backend", f"{mod}:X"]) == 2
    assert "RuntimeError: cannot load" in _one_line_error(capsys)


def test_list_shows_backends_with_availability(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "torch_sdpa" in out and "reference" in out


def test_tree_prints_parents_depths_and_mask(capsys):
    assert main(["tree", "full:2:2"]) == 0
    out = capsys.readouterr().out
    assert "parents: -1 0 0 1 1 2 2" in out and "depths:  0 1 1 2 2 2 2" in out and "1101000" in out


def test_tree_json(capsys):
    assert main(["tree", "[(0,), (1,), (0, 0)]", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["parents"] == [-1, 0, 0, 1] and summary["depths"] == [0, 1, 1, 2]


def test_help_exits_0(capsys):
    assert main(["--help"]) == 0
    assert "check" in capsys.readouterr().out


@pytest.mark.parametrize("name, words", [
    ("run", ["Correctness then timing"]), ("gate", ["exit 1 on a significant slowdown"]),
    ("report", ["HTML report"]), ("rm", ["Remove rows"]),
    ("check", ["Correctness only, for one backend", "Exit 0 when every case that ran passed, 1 when",
               "3 when no case"]),
    ("selftest", ["mutants", "correct variants", "2-core CPU", "Exit 0 when every mutant is killed"]),
    ("list", ["registered backend", "Runs nothing; exit 0."]), ("tree", ["token tree", "2 on a malformed spec"]),
    ("tree-search", ["Sequoia", "Exit 0, 2 on bad input."]), ("plan", ["accepted tokens per ms", "Exit 0, 2"]),
    ("merge", ["without duplicates", "Exit 0, 2 on bad input."]),
])
def test_every_subcommand_help_says_what_it_does(name, words, capsys):
    """`treebench COMMAND --help` has a description between the usage and the options."""
    from treebench.harness.cli.main import COMMANDS

    assert set(COMMANDS) == {"run", "check", "selftest", "merge", "rm", "list", "tree", "tree-search", "plan", "gate",
                             "report"}
    assert main([name, "--help"]) == 0
    usage, _, rest = capsys.readouterr().out.partition("\n\n")
    description = " ".join(rest.split("\n\n")[0].split())
    assert usage.startswith(f"usage: treebench {name}") and not description.startswith(("options:", "positional")), rest
    assert all(w in description for w in words), description


def _fake_module(monkeypatch, name: str, **attrs) -> None:
    monkeypatch.setitem(sys.modules, f"treebench.harness.cli.{name}", types.SimpleNamespace(**attrs))


def test_gate_and_report_are_wired_lazily(monkeypatch):
    seen = {}

    def add_arguments(parser):
        parser.add_argument("--baseline", required=True)
        parser.add_argument("paths", nargs="*")

    def run(args):
        seen.update(vars(args))
        return 1

    _fake_module(monkeypatch, "gate", add_arguments=add_arguments, run=run)
    assert main(["gate", "--baseline", "A", "x.jsonl", "y.jsonl"]) == 1
    assert seen == {"baseline": "A", "paths": ["x.jsonl", "y.jsonl"]}


def test_lazy_subcommand_errors_are_one_line(monkeypatch, capsys):
    _fake_module(monkeypatch, "gate", add_arguments=lambda p: p.add_argument("--baseline", required=True),
                 run=lambda a: 0)
    assert main(["gate"]) == 2
    assert "gate: the following arguments are required: --baseline" in _one_line_error(capsys)


def test_list_wraps_long_reasons_in_a_narrow_pipe(capsys, monkeypatch):
    """At 80 columns (a pipe) a long unavailability reason wraps in full instead of being cut
    with an ellipsis (new-user finding: vllm_triton's module paths were lost)."""
    import treebench.backends  # noqa: F401
    from treebench.harness.adapter.contract import REGISTRY
    from treebench.harness.run.loading import availability_of

    monkeypatch.setenv("COLUMNS", "80")
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    shown: dict[str, str] = {}          # backend -> its reason cell, the wrapped lines joined
    name = None
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) != 5:
            continue
        name = cells[0] or name
        shown[name] = shown.get(name, "") + cells[4]
    for name in REGISTRY:
        reason = availability_of(REGISTRY[name]())
        if reason:
            assert shown[name].replace(" ", "") == reason.replace(" ", ""), name


def test_counts_of_one_are_singular(tiny, tmp_path, capsys):
    """A dry run, a merge and an rm of one case / pair / row say "1 case", not "1 cases"."""
    one = tmp_path / "one.toml"
    one.write_text(TINY.replace('["shuffled", "interleaved"]', '["shuffled"]'))
    check = ["check", "--suite", str(one), "--backend", "torch_sdpa", "--quiet"]
    assert main([*check, "--dry-run"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "suite tiny, backend torch_sdpa, 1 case: 1 pair to run here" in text and "(1 pair, " in text
    out = tmp_path / "one.jsonl"
    assert main([*check, "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["merge", str(tmp_path / "merged.jsonl"), str(out)]) == 0
    assert "merged 1 row into " in capsys.readouterr().out
    assert main(["rm", str(out), "--backend", "torch_sdpa"]) == 0
    assert "removed 1 row from " in capsys.readouterr().out


@pytest.mark.parametrize("columns, width", [("120", 120), ("80", 80), (None, 160)])
def test_list_fits_the_width_in_a_pipe(columns, width):
    """`treebench list | cat`: the table fits COLUMNS, or 160 columns without it, its reasons folded."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"PYTHONPATH": str(ROOT)}
    if columns:
        env["COLUMNS"] = columns
    done = subprocess.run([sys.executable, "-m", "treebench", "list"], cwd=ROOT, capture_output=True, text=True,
                          check=True, env=env)
    lines = done.stdout.splitlines()
    assert len(lines) > 5 and any("│" in line for line in lines)
    assert max(len(line) for line in lines) <= width, max(lines, key=len)


BAD_SIZES = ["²", "", "-5", "0", "abc", "１２", "8_0", "1" * 5000]   # '²' and '１２' pass str.isdigit()


def test_list_ignores_a_columns_that_is_no_width(capsys, monkeypatch):
    """A COLUMNS no terminal reads as a width ('²' passes str.isdigit() and fails int()): the table
    at the default width, as without COLUMNS; never a traceback."""
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["list"]) == 0
    default = capsys.readouterr().out
    assert max(len(line) for line in default.splitlines()) <= 160
    for columns in BAD_SIZES:
        monkeypatch.setenv("COLUMNS", columns)
        assert main(["list"]) == 0, columns
        assert capsys.readouterr().out == default, columns
    monkeypatch.setenv("COLUMNS", "080")
    assert main(["list"]) == 0 and max(len(line) for line in capsys.readouterr().out.splitlines()) == 80


@pytest.mark.parametrize("size", BAD_SIZES)
def test_a_terminal_console_ignores_a_columns_or_lines_that_is_no_size(monkeypatch, size):
    """Every console of treebench (on a terminal too, where rich reads COLUMNS as it is made) takes the
    size it takes without COLUMNS and LINES when they hold no size."""
    import io

    from treebench.harness.cli.common import console
    from treebench.harness.run.progress import TerminalConsole, terminal_size

    def sizes():
        tty = TerminalConsole(file=io.StringIO(), force_terminal=True)
        return tuple(tty.size), tuple(console().size), tuple(console(stderr=True).size)

    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)
    default = sizes()
    monkeypatch.setenv("COLUMNS", size)
    monkeypatch.setenv("LINES", size)
    assert terminal_size(size) is None and sizes() == default
    monkeypatch.setenv("COLUMNS", "97")
    assert TerminalConsole(file=io.StringIO(), force_terminal=True).width == 97 and terminal_size("097") == 97


@pytest.mark.parametrize("name", ["COLUMNS", "LINES"])
def test_a_check_prints_under_a_columns_or_lines_that_is_no_size(name):
    """The shared stderr console reads them too: `check --dry-run` with COLUMNS=² ended in a traceback."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")} | {name: "²", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "treebench", "check", "--suite", "smoke", "--backend", "reference",
                           "--dry-run"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "suite smoke, backend reference" in done.stdout


@pytest.mark.parametrize("argv, needle", [
    (["rm", "{f}"], "give at least one of --run-id, --backend, --env"),
    (["rm", "{f}", "--run-id", ""], "--run-id is empty"),
    (["rm", "{f}.missing", "--backend", "x"], "no such results file"),
    (["rm", "{d}", "--backend", "x"], "is a directory; give the results .jsonl file"),
    (["rm", "{d}/tiny.toml", "--backend", "x"], "tiny.toml: is a .toml file, not a .jsonl results file; give a .jsonl"),
    (["rm"], "required: RESULTS"),
])
def test_rm_argument_errors_are_one_line_and_exit_2(tmp_path, argv, needle):
    """`treebench rm` refuses to run without a filter (it never empties a file by default)."""
    import os
    import subprocess

    pytest.importorskip("treebench.harness.store.remove")
    f = tmp_path / "rows.jsonl"
    f.write_text("")
    (tmp_path / "tiny.toml").write_text(TINY)
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "treebench", *(a.format(f=f, d=tmp_path) for a in argv)], cwd=root,
                          capture_output=True, text=True, check=False, env={**os.environ, "PYTHONPATH": str(root)})
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("treebench: error: "), done.stderr
    assert needle in lines[0] and f.read_text() == ""


@pytest.mark.parametrize("filters, twice", [(["--run-id", "A", "A"], "--run-id 'A'"),
                                            (["--backend", "x", "--backend", "x"], "--backend 'x'"),
                                            (["--env", "e1", "e2", "--env", "e1"], "--env 'e1'")])
def test_rm_refuses_a_value_given_twice_as_every_list_does(tmp_path, capsys, filters, twice):
    f = tmp_path / "rows.jsonl"
    f.write_text("")
    assert main(["rm", str(f), *filters]) == 2
    assert f"rm: {twice} given twice; give each value once" in _one_line_error(capsys)


@pytest.mark.parametrize("filters", [["--run-id", "nosuch"], ["--backend", "nosuch"], ["--env", "nosuch"],
                                     ["--backend", "torch_sdpa", "--run-id", "nosuch"]])
def test_rm_of_a_value_naming_no_row_exits_2_and_removes_nothing(tiny, tmp_path, capsys, filters):
    out = tmp_path / "r.jsonl"
    assert main(["check", "--suite", str(tiny), "--backend", "torch_sdpa", "--quiet", "--out", str(out)]) == 0
    before = out.read_bytes()
    capsys.readouterr()
    assert main(["rm", str(out), *filters]) == 2
    line = _one_line_error(capsys)
    assert f"'{filters[-1]}'" in line and "nothing removed" in line
    assert out.read_bytes() == before


def test_rm_removes_the_rows_matching_every_option_and_says_which(tiny, tmp_path, capsys):
    """`rm --run-id R --backend B` removes B's rows of run R, not every row of R and every row of B;
    a run id and a backend that each name rows, but never together, are refused."""
    out = tmp_path / "r.jsonl"
    for backend in ("torch_sdpa", "torch_sdpa", "reference"):     # runs A and B of torch_sdpa, C of reference
        assert main(["check", "--suite", str(tiny), "--backend", backend, "--quiet", "--out", str(out)]) == 0
    rows = read_rows([out])
    a, b, c = dict.fromkeys(r["run_id"] for r in rows)
    capsys.readouterr()
    assert main(["rm", str(out), "--run-id", c, "--backend", "torch_sdpa"]) == 2
    assert _one_line_error(capsys).endswith(f"no row has run_id {c!r} and backend 'torch_sdpa' (each value names "
                                            "rows, but no row matches them all); nothing removed: check the filters")
    assert main(["rm", str(out), "--run-id", a, c, "--backend", "torch_sdpa", "reference"]) == 0
    first, second = sorted([a, c])                                 # the line names each kind's values sorted
    assert capsys.readouterr().out.split() == ["removed", "4", "rows", "from", str(out), "(run_id",
                                               f"{first!r}", "or", f"{second!r}", "and", "backend", "'reference'",
                                               "or", "'torch_sdpa')"]
    assert [r["run_id"] for r in read_rows([out])] == [b, b]


def test_summary_table_shows_names_as_written(capsys):
    """The end-of-run table reads no rich markup from backend or suite names."""
    from treebench.harness.cli.common import print_summary

    rows = [{"backend": "flex[bold]", "status": "pass", "median_us": 2.0, "case_id": "c"},
            {"backend": "two[/x]", "status": "skipped", "median_us": None, "case_id": "c"}]
    print_summary(rows, "suite [red]s[/red]")
    out = capsys.readouterr().out
    assert "flex[bold]" in out and "two[/x]" in out and "suite [red]s[/red]" in out


def test_the_summary_gives_the_rows_of_a_backend_that_could_not_be_loaded_one_line(capsys):
    """Its error rows (failed_step import, one reason) are one line where its first row was, among the other failed
    rows' one line each; past `max_lines` the rest are counted as rows."""
    from treebench.harness.cli.common import print_summary

    def row(backend, case, step=None, reason="boom"):
        return {"backend": backend, "status": "error", "median_us": None, "case_id": case, "reason": reason,
                "failed_step": step}

    gone = "loading it called os._exit(3)"
    rows = [row("x.py", "c1", "import", gone), row("b", "c1"), row("x.py", "c2", "import", gone), row("b", "c2"),
            row("x.py", "c3", "import", gone)]
    print_summary(rows, "s")
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("error: ")]
    assert said == [f"error: x.py on 3 cases: {gone}", "error: b on c1: boom", "error: b on c2: boom"], said
    print_summary(rows, "s", max_lines=1)
    assert "... and 2 more failed rows" in capsys.readouterr().out
