"""Output paths of run / check / merge: --report and --out must never damage a file that is not
theirs, default paths stay inside results/local and reports/local, empty values are errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from treebench.harness.cli.main import main
from treebench.harness.cli.run import safe_name
from treebench.harness.model.cases import Case
from treebench.harness.store.rows import SCHEMA, append_row, read_rows
from tests.tiny_suites import TINY, tiny_suite
from tests.cli_errors import one_line_error as _one_line_error

@pytest.fixture
def tiny(tmp_path) -> Path:
    p = tmp_path / "tiny.toml"
    p.write_text(tiny_suite())
    return p



def _row(i: int) -> dict:
    return {"schema": SCHEMA, "run_id": "r", "env": "e", "case_id": f"c{i}", "backend": "b", "status": "pass",
            "case": Case(batch_size=1, context_len=4, tree="chain:1").axes}


def _run(suite, *extra) -> list[str]:
    return ["run", "--suite", str(suite), "--backends", "reference", "--quiet", *extra]


def _env_removed(out: Path) -> str:
    from treebench.harness.store.env import env_fingerprint
    env_id = env_fingerprint("cpu")["env_id"]
    return f"; the env file {out.parent}/env-{env_id}.json it had written beside it is removed"


def _report_line(out: str) -> str:
    """The `report: PATH` line a run printed, without what follows the path (the rows it shows)."""
    (line,) = [ln for ln in out.splitlines() if ln.startswith("report: ")]
    return line.split(" (")[0]


@pytest.mark.parametrize("report_name", ["same", "old.jsonl", "suite.toml", "notes.html"])
def test_report_path_that_is_not_html_is_refused_and_left_alone(tiny, tmp_path, capsys, report_name):
    out = tmp_path / "x.jsonl"
    append_row(out, _row(0))
    report = out if report_name == "same" else tmp_path / report_name
    if report_name != "same":
        report.write_text("[suite]\nname = 'keep me'\n")
    before = report.read_bytes()
    assert main(_run(tiny, "--out", str(out), "--report", str(report))) == 2
    assert "--report" in _one_line_error(capsys)
    assert report.read_bytes() == before
    assert len(out.read_text().splitlines()) == 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permissions")
def test_unwritable_report_folder_is_refused_before_the_sweep(tiny, tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    out = tmp_path / "r.jsonl"
    try:
        assert main(_run(tiny, "--out", str(out), "--report", str(ro / "r.html"))) == 2
    finally:
        ro.chmod(0o700)
    assert "--report" in _one_line_error(capsys)
    assert not out.exists() or out.read_bytes() == b""


@pytest.mark.parametrize("content", ['{"a": 1}\n', '{\n  "a": 1\n}\n', '{"schema": 99, "x": 1}\n',
                                     json.dumps(_row(0)) + '\n{"other": true}\n'])
def test_out_that_holds_something_else_is_refused(tiny, tmp_path, capsys, content):
    out = tmp_path / "some_config.json"
    out.write_text(content)
    assert main(_run(tiny, "--out", str(out))) == 2
    assert "--out" in _one_line_error(capsys)
    assert out.read_text() == content


@pytest.mark.parametrize("field,value,needle", [("status", "weird", "field 'status' is 'weird'"),
                                                ("median_us", "3.1", "field 'median_us' is a string"),
                                                ("case_id", None, "field 'case_id' is missing")])
def test_out_with_a_row_the_readers_refuse_is_refused_and_left_alone(tiny, tmp_path, capsys, field, value, needle):
    """An existing --out whose row report, gate and merge would refuse: the run adds nothing to it."""
    out = tmp_path / "rows.jsonl"
    bad = {**_row(1), field: value}
    out.write_text(json.dumps(_row(0)) + "\n" + json.dumps({k: v for k, v in bad.items() if v is not None}) + "\n")
    before = out.read_bytes()
    assert main(_run(tiny, "--out", str(out))) == 2
    line = _one_line_error(capsys)
    assert "--out" in line and "line 2" in line and needle in line, line
    assert out.read_bytes() == before


@pytest.mark.parametrize("flag,name", [("--out", "rows.jsonl"), ("--report", "r.html")])
def test_an_output_below_a_file_names_the_file(tiny, tmp_path, capsys, flag, name):
    """An output path whose folder is an existing file: the line says which file, not mkdir's
    "File exists"; the file is left alone."""
    blocker = tmp_path / "old.jsonl"
    blocker.write_text("keep\n")
    assert main(_run(tiny, flag, str(blocker / name))) == 2
    assert f"{blocker} is a file, not a folder" in _one_line_error(capsys)
    assert blocker.read_text() == "keep\n"


def test_env_file_as_out_is_refused(tiny, tmp_path, capsys):
    env = tmp_path / "env-0123456789ab.json"
    env.write_text('{"env_id": "0123456789ab"}\n')
    assert main(_run(tiny, "--out", str(env))) == 2
    assert "env fingerprint" in _one_line_error(capsys)


def test_merge_refuses_env_file_as_out_and_html_inputs(tmp_path, capsys):
    a = tmp_path / "a.jsonl"
    append_row(a, _row(0))
    env = tmp_path / "env-0123456789ab.json"
    env.write_text('{"env_id": "0123456789ab"}\n')
    before = env.read_bytes()
    assert main(["merge", str(env), str(a)]) == 2          # `merge results/local/*` with env-* sorted first
    assert "env fingerprint" in _one_line_error(capsys)
    assert env.read_bytes() == before
    html = tmp_path / "r.html"
    html.write_text("<html>\n" + "<p>x</p>\n" * 300 + "</html>\n")
    out = tmp_path / "m.jsonl"
    assert main(["merge", str(out), str(a), str(html)]) == 2
    assert "not a treebench results file" in _one_line_error(capsys)
    assert not out.exists()


def test_merge_takes_env_inputs_quietly(tmp_path, capsys):
    a = tmp_path / "a.jsonl"
    append_row(a, _row(0) | {"env": "0123456789ab"})
    env = tmp_path / "env-0123456789ab.json"
    env.write_text('{"env_id": "0123456789ab"}\n')
    out = tmp_path / "m" / "m.jsonl"
    assert main(["merge", str(out), str(env), str(a)]) == 0
    assert "WARNING" not in capsys.readouterr().err
    assert len(out.read_text().splitlines()) == 1
    assert (out.parent / env.name).exists()


def test_merge_warns_of_an_input_without_its_env_file_as_the_gate_would_refuse_it(tmp_path, capsys):
    """Rows whose env file is beside no input reach OUT without one: one warning line names the input
    (the gate refuses OUT's rows later, as it refuses the input's); none once OUT has it beside it."""
    a, b = tmp_path / "a" / "a.jsonl", tmp_path / "b" / "b.jsonl"
    for path, env in ((a, "0123456789ab"), (b, "ba9876543210")):
        path.parent.mkdir()
        append_row(path, _row(0) | {"env": env})
    (tmp_path / "a" / "env-0123456789ab.json").write_text('{"env_id": "0123456789ab"}\n')
    out = tmp_path / "m" / "m.jsonl"
    assert main(["merge", str(out), str(a), str(b)]) == 0
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err == (
        f"WARNING  merge: the env file for env id ba9876543210 is missing next to {b} (env-ba9876543210.json, "
        f"which the run wrote beside its rows); none is beside {out} either, so gate and report --against "
        f"refuse its rows there: copy it beside {out}"), err
    assert len(read_rows([out])) == 2 and (out.parent / "env-0123456789ab.json").exists()
    (out.parent / "env-ba9876543210.json").write_text('{"env_id": "ba9876543210"}\n')
    assert main(["merge", str(out), str(b)]) == 0
    assert "WARNING" not in capsys.readouterr().err


def test_merge_with_a_missing_input_creates_nothing(tmp_path, capsys):
    out = tmp_path / "m.jsonl"
    assert main(["merge", str(out), str(tmp_path / "missing.jsonl")]) == 2
    _one_line_error(capsys)
    assert not out.exists()


def test_out_dev_null_is_refused_up_front(tiny, capsys):
    assert main(_run(tiny, "--out", "/dev/null")) == 2
    assert "not a regular file" in _one_line_error(capsys)


def test_fsync_einval_is_tolerated(monkeypatch, tmp_path):
    import errno

    from treebench.harness.store import rows as store

    def bad_fsync(fd):
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(store.os, "fsync", bad_fsync)
    append_row(tmp_path / "r.jsonl", _row(0))
    store.append_rows(tmp_path / "r.jsonl", [_row(1)])
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("name, stem, want", [("../../../tmp/t/evil", "s", "tmp_t_evil"), ("", "my-suite", "my-suite"),
                                              ("..", "..", "suite"), ("ok.v1_x", "s", "ok.v1_x"),
                                              ("a/../x", "s", "a_.._x"), ("..", "my suite", "my_suite"),
                                              ("a/", "s", "a"), ("x\x00y", "s", "x_y"), ("x\\u0000y", "s", "x_u0000y"),
                                              ("my suite (v2)", "s", "my_suite_v2"), ("-_.", "._s_", "s"),
                                              ("_private_", "s", "private"), ("naïve", "s", "na_ve")])
def test_safe_name(name, stem, want):
    """One mapping (README, "default file names"): each run of characters outside [A-Za-z0-9._-] one '_', '.', '_'
    and '-' at either end dropped, a name that leaves nothing replaced by the stem mapped alike, else "suite"."""
    assert safe_name(name, Path(f"/x/{stem}.toml")) == want


def test_every_shipped_suite_names_its_default_files_as_it_is_named():
    """The mapping leaves every shipped suite's name as it is: the default results file of a run of one keeps the
    name it had (the committed results under results/ were written with --out, or under such names)."""
    from treebench.harness.model.suites import available_suites, load_suite

    for name in available_suites(findings=True):
        suite = load_suite(name)
        assert safe_name(suite.name, suite.path) == suite.name


def test_evil_suite_name_stays_in_results_local(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    suite = tmp_path / "evil.toml"
    suite.write_text(TINY.format(name="../../escape"))
    assert main(_run(suite)) == 0
    assert not (tmp_path.parent.parent / "escape").exists()
    assert [p.name.split("-")[0] for p in (tmp_path / "results" / "local").glob("*.jsonl")] == ["escape"]
    assert list((tmp_path / "reports" / "local").glob("escape-*.html"))


@pytest.mark.parametrize("option", ["--out", "--shard", "--report"])
def test_empty_values_are_errors(tiny, capsys, option):
    assert main(_run(tiny, option, "")) == 2
    assert option in _one_line_error(capsys)


def test_negative_shard_gets_a_clear_message(tiny, capsys):
    assert main(_run(tiny, "--shard", "-1/2", "--dry-run")) == 2
    line = _one_line_error(capsys)
    assert "0 <= INDEX < COUNT" in line and "expected one argument" not in line


def test_shard_help_says_zero_based(capsys):
    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert "0-based" in out and "Correctness then timing" in out


def test_suite_directory_is_named_as_such(tmp_path, capsys):
    assert main(["run", "--suite", str(tmp_path), "--backends", "reference"]) == 2
    assert "is a directory" in _one_line_error(capsys)


def test_unwritable_report_folder_via_access(tiny, tmp_path, capsys, monkeypatch):
    import treebench.harness.store.paths as cs

    real = os.access
    monkeypatch.setattr(cs.os, "access", lambda p, m: False if Path(p) == tmp_path / "ro" else real(p, m))
    (tmp_path / "ro").mkdir()
    out = tmp_path / "r.jsonl"
    assert main(_run(tiny, "--out", str(out), "--report", str(tmp_path / "ro" / "r.html"))) == 2
    assert "cannot write there" in _one_line_error(capsys)
    assert not out.exists()


def test_unwritable_report_is_found_before_the_run(tiny, tmp_path, capsys, monkeypatch):
    """The report folder is probed with a real write before any case runs (os.access
    says yes to root on read-only file systems such as /sys): exit 2, no rows written."""
    import treebench.harness.store.paths as cs

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(cs.tempfile, "NamedTemporaryFile", refuse)
    out = tmp_path / "r.jsonl"
    rc = main(["run", "--suite", str(tiny), "--backends", "reference", "--out", str(out),
               "--report", str(tmp_path / "rep" / "r.html"), "--quiet"])
    assert rc == 2 and "cannot write there" in _one_line_error(capsys)
    assert not out.exists() and not (tmp_path / "rep").exists()


@pytest.mark.parametrize("stop", ["interrupt", "first pair"])
def test_a_run_stopped_before_its_report_leaves_no_report_folder(tiny, tmp_path, monkeypatch, stop):
    """The report path is probed before the sweep, and its folder made only when the report is
    written: Ctrl-C before then leaves no empty reports/local (nor a probe file) behind; a
    folder that was there is kept; a finished run's report is in it."""
    import treebench.harness.run.runner as runner
    import treebench.harness.sweep.execute

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.chdir(tmp_path)
    argv = ["run", "--suite", str(tiny), "--backends", "reference", "--quiet"]
    with monkeypatch.context() as m:
        m.setattr(*((treebench.harness.sweep.execute, "execute", interrupted) if stop == "interrupt"
                    else (runner, "run_case_backend", interrupted)))
        assert main(argv) == 130
        assert not Path("reports").exists()
        Path("reports/local").mkdir(parents=True)
        assert main(argv) == 130
        assert list(Path("reports/local").iterdir()) == []
    assert main(argv) == 0
    assert [p.suffix for p in Path("reports/local").iterdir()] == [".html"]


def test_default_paths_of_runs_started_together_differ(tiny, tmp_path, monkeypatch):
    """Two runs started in the same second (job-array shards without --out) must not
    share their default results file or report; a run's two defaults share one token."""
    monkeypatch.chdir(tmp_path)
    tiny.write_text(tiny_suite(context_lens=(8, 9)))   # a case per shard: a shard without one writes nothing
    for shard in ("0/2", "1/2"):
        assert main(["run", "--suite", str(tiny), "--backends", "reference", "--shard", shard, "--quiet"]) == 0
    results = sorted(p.stem for p in (tmp_path / "results/local").glob("tiny-*.jsonl"))
    reports = sorted(p.stem for p in (tmp_path / "reports/local").glob("tiny-*.html"))
    assert len(results) == 2 and results == reports


def test_a_run_id_used_again_keeps_the_earlier_runs_default_report(tiny, tmp_path, monkeypatch, capsys):
    """A run whose default report is there already (its $TREEBENCH_RUN_ID used again) writes its
    report beside it as <suite>-<run_id>-2.html, -3, ..., warns naming both and prints the new path;
    the earlier report is left as it was. A --resume finishes the run its --out names and writes
    that run's report (named after --out) over it, with no warning. A --report given is written there."""
    from treebench.harness.sweep import shard

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(shard.RUN_ID_ENV, "job7")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    reports, argv = tmp_path / "reports/local", ["run", "--suite", str(tiny), "--backends", "reference", "--quiet"]
    assert main(argv) == 0
    first = (reports / "tiny-job7.html").read_bytes()
    capsys.readouterr()
    for n in (2, 3):
        assert main(argv) == 0
        out, err = capsys.readouterr()
        assert (f"report: reports/local/tiny-job7-{n}.html (this run's rows; results/local/tiny-job7.jsonl holds "
                f"{n - 1} row{'s' if n > 2 else ''} of earlier runs: treebench report results/local/tiny-job7.jsonl -o "
                "FILE.html covers them all)") in out.splitlines(), out
        assert ("WARNING  reports/local/tiny-job7.html is the report of an earlier run under run id job7, and is "
                f"kept: this run's report is reports/local/tiny-job7-{n}.html") in err.splitlines(), err
    assert (reports / "tiny-job7.html").read_bytes() == first
    assert sorted(p.name for p in reports.iterdir()) == ["tiny-job7-2.html", "tiny-job7-3.html", "tiny-job7.html"]
    (reports / "tiny-job7.html").write_bytes(first + b"<!-- the report of the run --resume finishes -->")
    assert main([*argv, "--resume", "--out", "results/local/tiny-job7.jsonl"]) == 0
    out, err = capsys.readouterr()
    assert ("report: reports/local/tiny-job7.html (every row of results/local/tiny-job7.jsonl, among them 3 rows "
            "written before this run)") in out.splitlines() and "is kept" not in err, (out, err)
    assert not (reports / "tiny-job7.html").read_bytes().endswith(b"-->") and len(list(reports.iterdir())) == 3
    (reports / "tiny-job7-2.html").write_bytes(first + b"<!-- a report to replace -->")
    assert main([*argv, "--report", "reports/local/tiny-job7-2.html"]) == 0
    assert "report: reports/local/tiny-job7-2.html" in capsys.readouterr().out
    assert not (reports / "tiny-job7-2.html").read_bytes().endswith(b"-->") and len(list(reports.iterdir())) == 3


def test_default_file_names_carry_the_run_id_printed_and_stored(tiny, tmp_path, monkeypatch, capsys):
    """The token in the default results and report names is the run's `run_id`: the one printed
    in the summary and stored in every row, so a file can be found from a row and back."""
    from treebench.harness.store.rows import read_rows
    from treebench.harness.sweep import shard

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(shard.RUN_ID_ENV, raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert main(["run", "--suite", str(tiny), "--backends", "reference"]) == 0
    (results,) = (tmp_path / "results/local").glob("tiny-*.jsonl")
    run_id = results.stem.removeprefix("tiny-")
    assert {r["run_id"] for r in read_rows([results])} == {run_id}
    assert (tmp_path / "reports/local" / f"tiny-{run_id}.html").is_file()
    assert f"run_id: {run_id}" in capsys.readouterr().out
    monkeypatch.setenv(shard.RUN_ID_ENV, "shared.id_1")    # the id every rank of a launch agrees on
    assert main(["run", "--suite", str(tiny), "--backends", "reference", "--quiet"]) == 0
    rows = read_rows([tmp_path / "results/local/tiny-shared.id_1.jsonl"])
    assert {r["run_id"] for r in rows} == {"shared.id_1"}


RUN_ID_RULE = ("a run id may hold only ASCII letters, digits, '-', '_' and '.' (at most 100, the first a letter "
               "or digit), as it goes into file names and commands; ")


@pytest.mark.parametrize("value", ["shared id/1", "a/b", "-x", ".hidden", "r:1", "x" * 101])
@pytest.mark.parametrize("command, variable", [("run", "TREEBENCH_RUN_ID"), ("check", "TREEBENCH_RUN_ID"),
                                               ("run", "TORCHELASTIC_RUN_ID"), ("check", "TORCHELASTIC_RUN_ID")])
def test_a_run_id_given_from_outside_is_checked_where_it_is_taken_in(tiny, tmp_path, monkeypatch, capsys, value,
                                                                     command, variable):
    """A run id from $TREEBENCH_RUN_ID or torchrun's $TORCHELASTIC_RUN_ID that would break a file
    name or the rm command a line prints ('/', a space, a leading '-'): one line naming the
    variable, its value and the characters allowed, exit 2, nothing written."""
    import re

    from treebench.harness.sweep import shard

    monkeypatch.chdir(tmp_path)
    for name in (shard.RUN_ID_ENV, "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, value)
    backend = "--backends" if command == "run" else "--backend"
    out = ["--out", str(tmp_path / "out" / "r.jsonl")] if command == "check" else []
    assert main([command, "--suite", str(tiny), backend, "reference", "--quiet", *out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    source = "$TREEBENCH_RUN_ID" if variable == shard.RUN_ID_ENV else "$TORCHELASTIC_RUN_ID (torchrun --rdzv-id)"
    fix = ("set it to one such as ID, or unset it for a fresh one" if variable == shard.RUN_ID_ENV else
           "give torchrun --rdzv-id one such as ID, or set $TREEBENCH_RUN_ID to one")
    assert len(err) == 1 and re.sub(r"\d{8}T\d{6}Z-[0-9a-f]{6}", "ID", err[0]) == (
        f"treebench: error: {source} {value!r}: {RUN_ID_RULE}{fix}"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.toml"]


def test_interrupt_names_the_results_file_and_how_to_resume(tiny, tmp_path, capsys, monkeypatch):
    import treebench.harness.sweep.execute

    def interrupted(cases, backends, opts, console):
        append_row(opts.out, {**_row(1), "run_id": opts.run.run_id})   # a row of this run
        raise KeyboardInterrupt
    monkeypatch.setattr(treebench.harness.sweep.execute, "execute", interrupted)
    out = tmp_path / "r.jsonl"
    append_row(out, _row(0))              # an earlier run's row
    assert main(["run", "--suite", str(tiny), "--backends", "reference", "--out", str(out), "--quiet"]) == 130
    err = capsys.readouterr().err
    assert f"rows already written are kept in {out}" in err and f"--out {out} --resume" in err
    assert len(read_rows([out])) == 2


@pytest.mark.parametrize("command, backend", [("run", "--backends"), ("check", "--backend")])
@pytest.mark.parametrize("where", ["treebench.harness.run.runner:run_case_backend",   # in the first pair
                                   "treebench.harness.sweep.execute:execute"])       # before it (env fingerprint)
def test_an_interrupt_during_the_first_pair_says_the_results_file_is_left_as_it_was(tiny, tmp_path, capsys,
                                                                                   monkeypatch, command, backend,
                                                                                   where):
    """Ctrl-C while the first pair runs or before it, --out holding an earlier run's rows: this run wrote
    none, so no rm of its run_id (which would find nothing) and no word of rows kept."""
    import importlib

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    module, name = where.split(":")
    monkeypatch.setattr(importlib.import_module(module), name, interrupted)
    out = tmp_path / "r.jsonl"
    append_row(out, _row(0))              # an earlier run's row
    before = out.read_bytes()
    assert main([command, "--suite", str(tiny), backend, "reference", "--out", str(out), "--quiet"]) == 130
    lines = capsys.readouterr().err.strip().splitlines()
    env = _env_removed(out) if "runner" in where else ""   # the env file is written before the first pair
    assert lines[-1] == f"treebench: interrupted before this run's first row; {out} is left as it was{env}", lines
    assert out.read_bytes() == before


@pytest.mark.parametrize("command, backend", [("run", "--backends"), ("check", "--backend")])
@pytest.mark.parametrize("out_there, env_there", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("stop", ["interrupt", "I/O error"])
def test_a_stop_before_the_first_row_takes_back_the_env_file_it_wrote(tiny, tmp_path, capsys, monkeypatch,
                                                                      command, backend, out_there, env_there, stop):
    """Ctrl-C in the first pair, or its row failing to append: no row of this run was written, so the
    env fingerprint it wrote beside --out is removed again and the line's "left as it was" / "removed"
    stays true; an env file that was there before is left as it was. Once a row is written, the env
    file stays."""
    import errno

    import treebench.harness.run.runner as runner
    from treebench.harness.store import torn
    from treebench.harness.store.env import env_fingerprint

    monkeypatch.chdir(tmp_path)           # the run's default report goes to reports/local here
    suite, folder = tmp_path / "two.toml", tmp_path / "d"
    suite.write_text(tiny_suite("two", (8, 12)))
    out, env_id = folder / "r.jsonl", env_fingerprint("cpu", None)["env_id"]
    env_file = folder / f"env-{env_id}.json"
    folder.mkdir()
    if out_there:
        append_row(out, {**_row(0), "suite": "two"})   # an earlier run's row of this suite (--resume continues it)
    if env_there:
        env_file.write_text(json.dumps({**env_fingerprint("cpu", None), "peak_bw_bytes_per_s": 1.0}))   # kept as it was
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    def broken(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    real = runner.run_case_backend
    with monkeypatch.context() as m:
        m.setattr(*((runner, "run_case_backend", interrupted) if stop == "interrupt" else (torn, "fsync", broken)))
        argv = [command, "--suite", "two.toml", backend, "reference", "--out", "d/r.jsonl", "--quiet"]
        assert main(argv) == (130 if stop == "interrupt" else 2)
    line = capsys.readouterr().err.strip().splitlines()[-1]
    env = "" if env_there else f"; the env file d/{env_file.name} it had written beside it is removed"
    assert (f"d/r.jsonl is left as it was{env}" if out_there else
            f"before any row was written: the empty results file d/r.jsonl it had created is removed{env}") in line
    assert line.startswith("treebench: interrupted" if stop == "interrupt" else
                           "treebench: error: could not write d/r.jsonl: ") and str(tmp_path) not in line, line
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    calls = []

    def second_pair_interrupted(*a, **k):
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(*a, **k)
    monkeypatch.setattr(runner, "run_case_backend", second_pair_interrupted)
    assert main([*argv, "--resume"]) == 130
    assert env_file.is_file() and len(read_rows([out])) == out_there + 1


@pytest.mark.parametrize("command, backend", [("run", "--backends"), ("check", "--backend")])
@pytest.mark.parametrize("other", ["rows written", "writing"])
def test_a_stop_before_the_first_row_keeps_the_env_file_another_run_shares(tiny, tmp_path, monkeypatch, capsys,
                                                                            command, backend, other):
    """Two runs with --out files in one folder share its env file. The run that wrote it, stopped
    before its first row, leaves it where the other run has since written rows naming it, or is
    writing its results file (holding its lock): those rows keep their fingerprint."""
    import contextlib

    import treebench.harness.run.runner as runner
    from treebench.harness.store.env import env_fingerprint
    from treebench.harness.store.lock import hold

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "d"
    folder.mkdir()
    mine, theirs = folder / "a.jsonl", folder / "b.jsonl"
    env_file = folder / f"env-{env_fingerprint('cpu', None)['env_id']}.json"
    other_run = contextlib.ExitStack()

    def other_run_then_interrupted(*a, **k):
        assert env_file.is_file()                          # this run wrote it
        if other == "rows written":
            append_row(theirs, {**_row(0), "env": env_file.stem[len("env-"):]})
        else:
            other_run.enter_context(hold(theirs))
        raise KeyboardInterrupt
    monkeypatch.setattr(runner, "run_case_backend", other_run_then_interrupted)
    with other_run:
        assert main([command, "--suite", str(tiny), backend, "reference", "--out", "d/a.jsonl", "--quiet"]) == 130
        assert env_file.is_file() and not mine.exists()
    why = "rows in that folder name its env" if other == "rows written" else "another run is writing a results file"
    assert f"file d/a.jsonl it had created is removed; the env file d/{env_file.name} it had written beside it is " \
        f"kept: {why}" in capsys.readouterr().err


@pytest.mark.parametrize("sidecar, writing", [("a.jsonl.lock", False), ("b.jsonl.lock", True),
                                              ("b.jsonl.lock:dead", False), ("b.jsonl.lock:", True),
                                              ("pip.lock", False)])
def test_another_writer_beside_a_results_file_is_told_by_the_pid_in_its_sidecar(tmp_path, sidecar, writing):
    """A sidecar of another results file naming a live process (or no pid yet: a lock being taken) is
    a run writing beside this one; its own sidecar, a killed holder's and other .lock files are not."""
    import subprocess
    import sys

    from treebench.harness.store.lock import other_writer_beside

    name, _, pid = sidecar.partition(":")
    if pid == "dead":
        proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True)
        pid = proc.stdout.strip()
    (tmp_path / name).write_text(pid if ":" in sidecar else f"{os.getpid()}\n")
    assert other_writer_beside(tmp_path / "a.jsonl") is writing


@pytest.mark.parametrize("command, backend", [("run", "--backends"), ("check", "--backend")])
@pytest.mark.parametrize("stop", ["interrupt", "full disk", "bad input"])
@pytest.mark.parametrize("existed", [False, True])
def test_a_results_file_created_by_a_sweep_that_wrote_no_row_is_removed(tiny, tmp_path, capsys, monkeypatch,
                                                                        command, backend, stop, existed):
    """Stopped before its first row (Ctrl-C, a full disk, an error), run and check remove the
    --out file they created, and say so; a file that was there before is kept, empty or not."""
    import errno

    import treebench.harness.sweep.execute
    from treebench.harness.errors import ConfigError

    def stopped(cases, backends, opts, console):
        if stop == "interrupt":
            raise KeyboardInterrupt
        if stop == "full disk":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        raise ConfigError("refused")
    monkeypatch.setattr(treebench.harness.sweep.execute, "execute", stopped)
    out = tmp_path / "r.jsonl"
    if existed:
        out.touch()
    code = main([command, "--suite", str(tiny), backend, "reference", "--out", str(out), "--quiet"])
    assert code == (130 if stop == "interrupt" else 2)
    assert {p.name for p in tmp_path.iterdir()} == {"tiny.toml", *["r.jsonl"] * existed}
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    line = lines[0]
    if stop == "bad input":
        assert line == "treebench: error: refused"
    elif existed and stop == "interrupt":
        assert line == f"treebench: interrupted before this run's first row; {out} is left as it was", line
    elif existed:
        assert f"rows already written are kept in {out}" in line and f"--out {out} --resume" in line, line
    else:
        assert f"before any row was written: the empty results file {out} it had created is removed" in line, line


@pytest.mark.parametrize("command, backend, out", [("run", "--backends", None),
                                                   ("run", "--backends", "kept/made/deeper/r.jsonl"),
                                                   ("check", "--backend", "kept/made/deeper/r.jsonl")])
@pytest.mark.parametrize("stop", ["interrupt", "full disk"])
def test_a_sweep_that_wrote_no_row_leaves_no_folder_it_made(tiny, tmp_path, monkeypatch, command, backend, out,
                                                            stop):
    """Stopped before its first row, run and check remove the folders they made for the --out file
    (results/local for run's default) with the file; a folder that was there before is kept, empty
    or not."""
    import errno

    import treebench.harness.sweep.execute

    def stopped(cases, backends, opts, console):
        raise KeyboardInterrupt if stop == "interrupt" else OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(treebench.harness.sweep.execute, "execute", stopped)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "kept").mkdir()
    argv = [command, "--suite", str(tiny), backend, "reference", "--quiet", *(["--out", out] if out else [])]
    assert main(argv) == (130 if stop == "interrupt" else 2)
    assert {p.name for p in tmp_path.iterdir()} == {"tiny.toml", "kept"}
    assert not any((tmp_path / "kept").iterdir())


def test_a_results_path_refused_after_its_folder_was_made_leaves_no_folder(tmp_path, monkeypatch):
    """check_writable makes the folders of --out before proving them writable: a path it then refuses
    leaves none of the folders it made, and keeps the one that was there."""
    import errno
    import tempfile

    from treebench.harness.errors import ConfigError
    from treebench.harness.store.paths import check_writable

    def unwritable(*a, **k):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    monkeypatch.setattr(tempfile, "NamedTemporaryFile", unwritable)
    (tmp_path / "kept").mkdir()
    with pytest.raises(ConfigError, match="is not writable"):
        check_writable(tmp_path / "kept" / "made" / "deeper" / "r.jsonl")
    assert [p.name for p in tmp_path.iterdir()] == ["kept"] and not any((tmp_path / "kept").iterdir())


def test_check_writable_made_names_the_folders_it_made(tmp_path):
    """check_writable_made returns the folders it made for the results file, deepest first (the list
    run and check remove again when stopped before a row): none where the folder was there, none
    and nothing made for a dry run."""
    from treebench.harness.store.paths import check_writable_made

    out = tmp_path / "a" / "b" / "r.jsonl"
    assert check_writable_made(out, create=False) == (out, []) and not (tmp_path / "a").exists()
    assert check_writable_made(out) == (out, [tmp_path / "a" / "b", tmp_path / "a"]) and out.is_file()
    assert check_writable_made(tmp_path / "a" / "s.jsonl") == (tmp_path / "a" / "s.jsonl", [])


@pytest.mark.parametrize("command, backend", [("run", "--backends"), ("check", "--backend")])
@pytest.mark.parametrize("full_at, existed", [(0, False), (0, True), (1, True)])
def test_a_row_the_disk_cannot_hold_is_cut_off_again(tmp_path, capsys, caplog, monkeypatch, command, backend,
                                                     full_at, existed):
    """A full disk half-way through a row (this run's first or second): exit 2 with one line naming
    the file and the error; the file holds exactly the rows before that one and reads cleanly, and
    the line says what became of it (removed, left as it was, or this run's rows to resume or rm)."""
    import errno
    import logging

    from treebench.harness.store.paths import check_writable

    suite = tmp_path / "two.toml"
    suite.write_text(tiny_suite("two", (8, 12)))
    out, real_write, rows_seen = tmp_path / "r.jsonl", os.write, []
    if existed:
        append_row(out, _row(0))                                         # an earlier run's row

    def row_then_full(fd, data):
        if bytes(data[:11]) == b'{"schema": ':
            rows_seen.append(data)
            if len(rows_seen) == full_at + 1:
                real_write(fd, bytes(data[: len(data) // 2]))
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)
    before = out.read_bytes() if existed else b""
    with monkeypatch.context() as m:
        m.setattr(os, "write", row_then_full)
        code = main([command, "--suite", str(suite), backend, "reference", "--out", str(out), "--quiet"])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert line.startswith(f"treebench: error: could not write {out}: {os.strerror(errno.ENOSPC)}; "), line
    if not existed:
        assert not out.exists() and line.endswith(f"the empty results file {out} it had created is removed"
                                                  f"{_env_removed(out)}; free space, then run the same command again")
        return
    assert out.read_bytes() == before + (rows_seen[0] if full_at else b"")
    check_writable(out)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="treebench"):
        rows = read_rows([out])                                         # no torn line to warn of
    assert not caplog.records and len(rows) == 1 + full_at
    if full_at == 0:
        assert line.endswith(f"stopped before this run's first row: {out} is left as it was{_env_removed(out)}; free "
                             "space, then run the same command again"), line
    else:
        run_id = rows[-1]["run_id"]
        assert line.endswith(f"rows already written are kept in {out}, run_id {run_id}; free space, then run the "
                             f"same command with --out {out} --resume, or remove them with treebench rm {out} "
                             f"--run-id {run_id}"), line


@pytest.mark.parametrize("command, backend", [("run", "--backends"), ("check", "--backend")])
@pytest.mark.parametrize("stop", [KeyboardInterrupt, "Terminated"])
def test_interrupt_names_the_run_id_that_rm_takes(tiny, tmp_path, capsys, monkeypatch, stop, command, backend):
    """Ctrl-C (130) or SIGTERM (143) in a run or a check --out: the one line names the run_id its
    rows carry, and the rm that removes them, as the end of a finished run prints `run_id: ID`."""
    import treebench.harness.cli.main as cli_main
    import treebench.harness.sweep.execute

    stop = cli_main.Terminated if stop == "Terminated" else stop
    seen = []

    def interrupted(cases, backends, opts, console):
        seen.append(opts.run.run_id)          # the id every row of this run would carry
        append_row(opts.out, {**_row(0), "run_id": opts.run.run_id})
        raise stop
    monkeypatch.setattr(treebench.harness.sweep.execute, "execute", interrupted)
    out = tmp_path / "r.jsonl"
    code = main([command, "--suite", str(tiny), backend, "reference", "--out", str(out), "--quiet"])
    assert code == (143 if stop is cli_main.Terminated else 130) and seen and seen[0]
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"kept in {out}, run_id {seen[0]};" in lines[0], lines
    assert lines[0].endswith(f"--out {out} --resume, or remove them with treebench rm {out} --run-id {seen[0]}")


@pytest.mark.parametrize("command, backend, extra, tail", [
    ("check", "--backend", [], "check without --out keeps no rows: nothing was written; give --out FILE to keep them"),
    ("check", "--backend", ["--dry-run"], "a dry run writes no rows: nothing was written"),
    ("run", "--backends", ["--dry-run"], "a dry run writes no rows: nothing was written"),
])
def test_an_interrupted_sweep_that_writes_no_rows_says_nothing_was_written(tiny, capsys, monkeypatch, command,
                                                                          backend, extra, tail):
    """Ctrl-C in a check without --out or in a dry run: no rows were written, so the line says that,
    not that rows are kept, and names no rm."""
    import treebench.harness.sweep.execute

    def interrupted(cases, backends, opts, console):
        raise KeyboardInterrupt
    monkeypatch.setattr(treebench.harness.sweep.execute, "execute", interrupted)
    assert main([command, "--suite", str(tiny), backend, "reference", "--quiet", *extra]) == 130
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"treebench: interrupted; {tail}"], lines


def test_an_interrupted_check_without_out_says_how_far_it_got(tmp_path, capsys):
    """Stopped in its third pair, a check without --out says so: 2 of the 3 pairs had finished."""
    suite = tmp_path / "three.toml"
    suite.write_text(TINY.format(name="three").replace("batch_size = [1]", "batch_size = [1, 2, 3]"))
    third = tmp_path / "third.py"
    third.write_text(f"import os, signal, sys, time\nsys.path.insert(0, {str(Path(FAULTS).parent)!r})\n"
                     "from fault_backends import Exact\n\n\nclass StopsThird(Exact):\n    name = 'stops_third'\n\n"
                     "    def prepare(self, inputs):\n        if len(inputs.context_lens) == 3:   # B 3: the third case\n"
                     "            os.kill(os.getpid(), signal.SIGINT)   # Ctrl-C\n            time.sleep(5)\n"
                     "        return super().prepare(inputs)\n")
    assert main(["check", "--suite", str(suite), "--backend", f"{third}:StopsThird", "--quiet"]) == 130
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1] == ("treebench: interrupted after 2 of 3 pairs; check without --out keeps no rows: nothing "
                         "was written; give --out FILE to keep them"), lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["third.py", "three.toml"]


def test_backend_option_spellings(tiny, capsys):
    """run takes --backend as well as --backends; check says it takes one backend."""
    assert main(["run", "--suite", str(tiny), "--backend", "reference", "--dry-run"]) == 0
    assert main(["check", "--suite", str(tiny), "--backends", "reference,flex"]) == 2
    assert "check takes one backend" in _one_line_error(capsys)


FAULTS = str(Path(__file__).resolve().parent / "fault_backends.py")


@pytest.mark.parametrize("dry", [[], ["--dry-run"]])
def test_two_backends_of_one_name_are_refused_before_anything_is_written(tiny, tmp_path, capsys, dry):
    """`--backends` naming two classes with one `name` is bad input: exit 2 before the results
    file, its env fingerprint or the report exist (a dry run refuses it too)."""
    same = tmp_path / "same.py"
    same.write_text(f"import sys\nsys.path.insert(0, {str(Path(FAULTS).parent)!r})\n"
                    "from fault_backends import Exact\n\n\nclass Same(Exact):\n    name = 'twin'\n")
    out = tmp_path / "d" / "out.jsonl"
    argv = ["run", "--suite", str(tiny), "--backends", f"{FAULTS}:Twin,{same}:Same", "--out", str(out),
            "--report", str(tmp_path / "r.html"), "--quiet", *dry]
    assert main(argv) == 2
    assert f"backend name 'twin' is used by both {FAULTS}:Twin and {same}:Same" in _one_line_error(capsys)
    assert not (tmp_path / "d").exists() and not (tmp_path / "r.html").exists()


def test_dry_run_refuses_a_report_path_the_run_would_refuse(tiny, tmp_path, capsys):
    notes = tmp_path / "p.html"
    notes.write_text("precious\n")
    assert main(_run(tiny, "--out", str(tmp_path / "x.jsonl"), "--report", str(notes), "--dry-run")) == 2
    assert "exists and is not an HTML file" in _one_line_error(capsys)
    assert notes.read_text() == "precious\n"


def test_a_results_folder_that_refuses_the_env_file_is_refused_up_front(tiny, tmp_path, capsys, monkeypatch):
    """The env fingerprint is written beside the results: a folder that refuses new files
    (root ignores chmod, so the probe is made to fail) is bad input before anything is written."""
    import tempfile

    def refuse(*a, **kw):
        raise PermissionError(13, "Operation not permitted")
    monkeypatch.setattr(tempfile, "NamedTemporaryFile", refuse)
    out = tmp_path / "x.jsonl"
    assert main(["check", "--suite", str(tiny), "--backend", "reference", "--out", str(out)]) == 2
    assert "env fingerprint (env-*.json) is written beside the results" in _one_line_error(capsys)
    assert not out.exists()


def test_write_env_failure_is_one_config_error_and_merge_keeps_out_as_it_was(tmp_path, monkeypatch):
    from treebench.harness.errors import ConfigError
    from treebench.harness.store import env as store
    from treebench.harness.store import merge

    def refuse(self, *a, **kw):
        raise PermissionError(13, "Operation not permitted")
    with monkeypatch.context() as m:
        m.setattr(Path, "write_text", refuse)
        with pytest.raises(ConfigError, match="env fingerprint .*cannot write it"):
            store.write_env(tmp_path, {"env_id": "abc"})
    assert not list(tmp_path.glob("env-*"))
    src, out = tmp_path / "in" / "a.jsonl", tmp_path / "out" / "m.jsonl"
    append_row(src, _row(1))
    (src.parent / "env-e.json").write_text(json.dumps({"env_id": "e"}))
    append_row(out, _row(0))
    before = out.read_bytes()

    def env_refused(directory, env):
        raise ConfigError("env fingerprint: cannot write it")
    monkeypatch.setattr(store, "write_env", env_refused)   # merge writes env files through env_beside
    with pytest.raises(ConfigError):
        merge.merge_results(out, [src])
    assert out.read_bytes() == before                 # no row appended before the env file failed


@pytest.mark.parametrize("name", ["results.txt", "results.json", "results"])
def test_out_must_be_a_jsonl_path(tiny, tmp_path, capsys, name):
    """Rows written to results.txt would be missed by every folder read (*.jsonl only):
    run and check refuse it, as merge always did, and write nothing."""
    out = tmp_path / name
    assert main(_run(tiny, "--out", str(out))) == 2
    assert ".jsonl" in _one_line_error(capsys) and not out.exists()
    assert main(["check", "--suite", str(tiny), "--backend", "torch_sdpa", "--out", str(out), "--quiet"]) == 2
    assert ".jsonl" in _one_line_error(capsys) and not out.exists()


def test_a_dry_run_in_which_every_pair_would_skip_exits_as_the_run_would(tiny, capsys, tmp_path):
    """The real run exits 3 when nothing ran; its dry run says so and exits 3 too (0 with --allow-skip)."""
    cuda_only = f"{FAULTS}:Unavailable"               # every pair a skipped row
    assert main(["check", "--suite", str(tiny), "--backend", cuda_only, "--dry-run"]) == 3
    err = capsys.readouterr().err
    assert "every one of the" in err and "--allow-skip" in err and len(err.strip().splitlines()) == 1
    assert main(["run", "--suite", str(tiny), "--backend", cuda_only, "--dry-run", "--allow-skip"]) == 0
    assert "accepted by --allow-skip" in capsys.readouterr().err
    assert main(["check", "--suite", str(tiny), "--backend", cuda_only, "--out", str(tmp_path / "r.jsonl"),
                 "--quiet"]) == 3
    assert main(["run", "--suite", str(tiny), "--backends", f"reference,{cuda_only}", "--dry-run"]) == 0
    # with --resume the run counts the stored rows: stored passes and only skips left exits 0, and so does its dry run
    out = tmp_path / "s.jsonl"
    assert main(["run", "--suite", str(tiny), "--backends", "reference", "--out", str(out), "--quiet",
                 "--report", str(tmp_path / "s0.html")]) == 0
    again = ["run", "--suite", str(tiny), "--backends", f"reference,{cuda_only}", "--out", str(out), "--resume",
             "--quiet", "--report", str(tmp_path / "s.html")]
    assert main([*again, "--dry-run"]) == 0
    assert main(again) == 0


def test_check_help_does_not_offer_run_timing_in_resume(capsys):
    """check times nothing: its --resume help says nothing of --timer or --l2, run's does."""
    for cmd, timed in (("check", False), ("run", True)):
        assert main([cmd, "--help"]) == 0
        text = " ".join(capsys.readouterr().out.split())
        start = text.index("--resume skip")
        resume = text[start:text.index("--shard I/N", start)]
        assert ("--timer" in resume) is timed, resume


def test_report_outputs_overwrite_only_treebench_reports(tmp_path, capsys):
    """`report -o` and `run --report` replace a report treebench wrote (with the generator tag,
    or one written before it had one) and an empty file, never another HTML page."""
    rows = tmp_path / "a.jsonl"
    append_row(rows, _row(0))
    page = tmp_path / "page.html"
    page.write_text("<html><body>my handwritten page</body></html>\n")
    assert main(["report", str(rows), "-o", str(page)]) == 2
    assert "was not written by treebench (it is left as it is)" in _one_line_error(capsys)
    assert page.read_text() == "<html><body>my handwritten page</body></html>\n"
    assert main(["run", "--suite", "smoke", "--backends", "reference", "--out", str(tmp_path / "b.jsonl"),
                 "--report", str(page), "--quiet", "--dry-run"]) == 2
    assert "was not written by treebench" in _one_line_error(capsys)
    mine = tmp_path / "mine.html"
    assert main(["report", str(rows), "-o", str(mine)]) == 0
    assert '<meta name="generator" content="treebench">' in mine.read_text()
    assert main(["report", str(rows), "-o", str(mine)]) == 0                 # its own report again
    old = tmp_path / "old.html"                                              # the template before the tag
    old.write_text(mine.read_text().replace('<meta name="generator" content="treebench">\n', ""))
    empty = tmp_path / "empty.html"
    empty.write_text("")
    for path in (old, empty):
        assert main(["report", str(rows), "-o", str(path)]) == 0 and "generator" in path.read_text()


def test_a_merge_the_disk_cannot_hold_adds_none_of_its_rows(tmp_path, capsys, monkeypatch):
    """A full disk half-way through merge's one write: exit 2, one line naming OUT and the error,
    and OUT holds exactly what it held before."""
    import errno

    src, out = tmp_path / "in" / "a.jsonl", tmp_path / "out" / "m.jsonl"
    for i in (1, 2):
        append_row(src, _row(i))
    append_row(out, _row(0))
    before, real_write = out.read_bytes(), os.write

    def half_then_full(fd, data):
        real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with monkeypatch.context() as m:
        m.setattr(os, "write", half_then_full)
        assert main(["merge", str(out), str(src)]) == 2
    assert _one_line_error(capsys) == (f"treebench: error: could not write {out}: {os.strerror(errno.ENOSPC)}; what "
                                       "was written before is kept")
    assert out.read_bytes() == before


def test_a_resume_keeps_the_report_of_another_results_file_of_the_same_name(tiny, tmp_path, monkeypatch, capsys):
    """--resume without --report names its report after --out's file name; where that report was
    made from another results file of the same name (another folder), it is kept: this run's report
    is <name>-2.html, with a warning, and a resume of that same --out again writes over its own."""
    monkeypatch.chdir(tmp_path)
    reports = tmp_path / "reports/local"
    assert main(_run(tiny, "--out", "w/r.jsonl", "--resume")) == 0
    first = (reports / "r.html").read_bytes()
    assert f'<meta name="treebench-results" content="{tmp_path / "w/r.jsonl"}">'.encode() in first
    capsys.readouterr()
    for _ in range(2):
        assert main(_run(tiny, "--out", "w/sep/r.jsonl", "--resume")) == 0
        out, err = capsys.readouterr()
        assert _report_line(out) == "report: reports/local/r-2.html", out
        assert ("WARNING  reports/local/r.html is the report of other results than w/sep/r.jsonl, and is kept: "
                "this run's report is reports/local/r-2.html") in err.splitlines(), err
        assert (reports / "r.html").read_bytes() == first
    assert sorted(p.name for p in reports.iterdir()) == ["r-2.html", "r.html"]
    assert main(_run(tiny, "--out", "w/r.jsonl", "--resume")) == 0
    out, err = capsys.readouterr()
    assert _report_line(out) == "report: reports/local/r.html" and "is kept" not in err, (out, err)


def test_a_resume_keeps_a_report_that_does_not_record_its_results(tiny, tmp_path, monkeypatch, capsys):
    """Where --resume's default report is one made before reports recorded their results files (no
    treebench-results tag), the warning says that it does not record them, not that it is another
    file's report: it is kept, and this run's report is <name>-2.html."""
    import re

    monkeypatch.chdir(tmp_path)
    old = tmp_path / "reports/local/r.html"
    assert main(_run(tiny, "--out", "w/r.jsonl", "--resume")) == 0
    old.write_text(re.sub(r'<meta name="treebench-results" content="[^"]*">', "", old.read_text()))
    before = old.read_bytes()
    capsys.readouterr()
    assert main(_run(tiny, "--out", "w/r.jsonl", "--resume")) == 0
    out, err = capsys.readouterr()
    assert _report_line(out) == "report: reports/local/r-2.html", out
    assert [line for line in err.splitlines() if "is kept" in line] == [
        "WARNING  reports/local/r.html does not record which results file it was made from, so it is kept: this "
        "run's report is reports/local/r-2.html"], err
    assert old.read_bytes() == before


@pytest.mark.parametrize("dry", [[], ["--dry-run"]])
@pytest.mark.parametrize("which", ["report under a file", "default out under a file"])
def test_a_dry_run_refuses_a_folder_that_is_a_file_as_the_run_does(tiny, tmp_path, capsys, monkeypatch, dry, which):
    """A --report or a default --out whose folder would be made under a regular file: the run and its
    dry run both refuse it (exit 2, one line naming the file), and neither makes anything."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("keep\n")
    (tmp_path / "results").write_text("keep\n")
    extra = (["--out", str(tmp_path / "x.jsonl"), "--report", str(tmp_path / "afile" / "r.html")]
             if which == "report under a file" else [])
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(_run(tiny, *extra, *dry)) == 2
    line = _one_line_error(capsys)
    assert "is a file, not a folder" in line and ("afile" in line if extra else "results is" in line)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("dry", [[], ["--dry-run"]])
def test_a_default_results_file_that_cannot_be_written_is_not_named_as_out(tiny, tmp_path, capsys, monkeypatch, dry):
    """No --out given: the line calls the path run's default --out and says to give --out or run from a
    writable folder (the default is relative to the working folder)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").write_text("keep\n")
    assert main(_run(tiny, *dry)) == 2
    line = _one_line_error(capsys)
    assert line.startswith("treebench: error: run's default --out results/local/"), line
    assert line.endswith("; give --out or run from a writable folder"), line


@pytest.mark.parametrize("dry", [[], ["--dry-run"]])
@pytest.mark.parametrize("cause", ["a file", "no permission"])
def test_a_default_report_that_cannot_be_written_is_named_as_the_default(tiny, tmp_path, capsys, monkeypatch, dry,
                                                                         cause):
    """No --report given: the line calls the path run's default --report, not a --report the user gave, and says
    to give --report or run from a writable folder; nothing is written."""
    import treebench.harness.store.paths as paths

    monkeypatch.chdir(tmp_path)
    if cause == "a file":
        (tmp_path / "reports").write_text("keep\n")
    else:
        real_mkdir, real_access = Path.mkdir, os.access

        def refused(path, *a, **k):
            if Path(path).absolute().is_relative_to(tmp_path / "reports") or Path(path) == Path("reports"):
                raise PermissionError(13, "Permission denied")
            return real_mkdir(path, *a, **k)
        monkeypatch.setattr(Path, "mkdir", refused)
        monkeypatch.setattr(paths.os, "access", lambda p, m: Path(p).absolute() != tmp_path and real_access(p, m))
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(_run(tiny, "--out", str(tmp_path / "r.jsonl"), *dry)) == 2
    line = _one_line_error(capsys)
    assert line.startswith("treebench: error: run's default --report reports/local/tiny-"), line
    assert ("cannot write there" if dry else "cannot create its folder") in line
    assert line.endswith("; give --report or run from a writable folder"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("code, says", [("EACCES", "its folder {} is not writable (Permission denied)"),
                                        ("ENOENT", "cannot create a file in its folder {} (No such file or directory)")])
def test_a_results_folder_that_takes_no_file_is_refused_with_the_real_reason(tmp_path, monkeypatch, code, says):
    """The probe of the results folder failing: the line calls the folder unwritable only where the
    error says so; another error (/proc takes no new file: ENOENT) is named as what failed."""
    import errno
    import re
    import tempfile

    from treebench.harness.errors import ConfigError
    from treebench.harness.store.paths import check_writable

    def refused(*a, **k):
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)))
    monkeypatch.setattr(tempfile, "NamedTemporaryFile", refused)
    with pytest.raises(ConfigError, match=re.escape(says.format(tmp_path))):
        check_writable(tmp_path / "r.jsonl")


@pytest.mark.parametrize("dry", [[], ["--dry-run"]])
@pytest.mark.parametrize("option, name, lower", [("--out", "x.JSONL", "x.jsonl"), ("--report", "x.HTML", "x.html"),
                                                 ("--report", "x.Htm", "x.htm")])
def test_an_output_suffix_in_upper_case_is_refused_for_results_and_report_alike(tiny, tmp_path, capsys, dry, option,
                                                                                name, lower):
    """--out and --report match their suffix as written, in lower case (a folder is read for *.jsonl
    alone): either in another case is refused, the line naming the lower-case name, nothing made."""
    paths = {"--out": str(tmp_path / "r.jsonl"), "--report": str(tmp_path / "r.html"), option: str(tmp_path / name)}
    assert main(_run(tiny, "--out", paths["--out"], "--report", paths["--report"], *dry)) == 2
    assert f"(in lower case: {lower})" in _one_line_error(capsys)
    assert not any(tmp_path.glob("r.*")) and not (tmp_path / name).exists()


def test_report_o_refuses_an_upper_case_suffix_as_run_does(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    append_row(out, _row(0))
    assert main(["report", str(out), "-o", str(tmp_path / "r.HTML")]) == 2
    assert "(in lower case: r.html)" in _one_line_error(capsys)


@pytest.mark.parametrize("again", ["r/cg.jsonl", "./r/cg.jsonl", "r/../r/cg.jsonl", "link.jsonl"])
def test_a_results_file_named_twice_is_one_input_of_report(again, tmp_path, monkeypatch, capsys):
    """`report A A` (A twice in any spelling, or through a link) reads A once, as gate and merge do:
    its default report is A's own, written over without a -2.html, and no warning names A twice."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r").mkdir()
    for i in (1, 2):
        append_row(tmp_path / "r/cg.jsonl", _row(i))
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "r/cg.jsonl")
    assert main(["report", "r/cg.jsonl"]) == 0
    capsys.readouterr()
    assert main(["report", "r/cg.jsonl", again]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "reports/local/cg.html", err
    assert not (tmp_path / "reports/local/cg-2.html").exists()
    assert "other results" not in err and err.count("cg.jsonl") <= 1, err
    page = (tmp_path / "reports/local/cg.html").read_text()
    assert page.count('<meta name="treebench-results"') == 1


def test_a_report_that_records_its_results_file_twice_is_that_files_own(tmp_path, monkeypatch, capsys):
    """A report made by `report A A` before A was taken once records A twice: `report A` writes over it."""
    monkeypatch.chdir(tmp_path)
    append_row(tmp_path / "cg.jsonl", _row(1))
    assert main(["report", "cg.jsonl"]) == 0
    page = tmp_path / "reports/local/cg.html"
    tag = f'<meta name="treebench-results" content="{tmp_path / "cg.jsonl"}">'
    page.write_text(page.read_text().replace(tag, tag + tag))
    capsys.readouterr()
    assert main(["report", "cg.jsonl"]) == 0
    assert capsys.readouterr().out.strip() == "reports/local/cg.html"
