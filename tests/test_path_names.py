"""Names of files, given and picked (harness/store/names.py): a name the file system refuses (too long,
a symbolic link loop) is one line and exit 2 wherever a file is written or read by name, before
anything is written; a suite's long name gives a short default file name; `report` without -o keeps a
report made from other results, as `run` does."""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

import pytest
from treebench.harness.cli.main import main
from treebench.harness.cli.run import SAFE_NAME_MAX, safe_name
from treebench.harness.model.cases import Case
from treebench.harness.store.names import NAME_ROOM, os_error_problem, path_problem
from treebench.harness.store.rows import SCHEMA, append_row
from tests.tiny_suites import TINY, tiny_suite
from tests.cli_errors import one_line_error as _one_line_error

ACCEPTANCE = Path(__file__).resolve().parents[1] / "harness/speculation/data/illustrative-geometric.toml"
LONG = "n" * 260   # past NAME_MAX (255) on every Linux file system
CASE = Case(batch_size=1, context_len=4, tree="chain:1").axes   # a row's case, every axis as treebench writes it


@pytest.fixture
def tiny(tmp_path) -> Path:
    p = tmp_path / "tiny.toml"
    p.write_text(tiny_suite())
    return p


@pytest.fixture
def rows(tmp_path) -> Path:
    """A results file of one row, with its env file, to read."""
    out = tmp_path / "ok.jsonl"
    append_row(out, {"schema": SCHEMA, "run_id": "r", "env": "e", "case_id": "c", "backend": "b", "status": "pass",
                     "case": CASE})
    (tmp_path / "env-e.json").write_text('{"env_id": "e"}')
    return out


@pytest.fixture
def loop(tmp_path):
    """`loop(name)`: two links, NAME -> NAME2 -> NAME, in tmp_path; returns NAME's path."""
    def make(name: str) -> Path:
        first, second = tmp_path / name, tmp_path / f"2{name}"
        first.symlink_to(second.name)
        second.symlink_to(first.name)
        return first
    return make



def _argv(command: str, tiny: Path, rows: Path, path: str) -> list[str]:
    """The command line that gives `path` where `command` names it."""
    return {
        "run --out": ["run", "--suite", str(tiny), "--backends", "reference", "--quiet", "--out", path],
        "check --out": ["check", "--suite", str(tiny), "--backend", "reference", "--quiet", "--out", path],
        "run --report": ["run", "--suite", str(tiny), "--backends", "reference", "--quiet", "--out", str(rows),
                         "--report", path],
        "run --suite": ["run", "--suite", path, "--backends", "reference", "--quiet"],
        "report -o": ["report", str(rows), "-o", path],
        "report RESULTS": ["report", path],
        "gate --junit": ["gate", "--baseline", str(rows), "--candidate", str(rows), "--junit", path],
        "gate --baseline": ["gate", "--baseline", path, "--candidate", str(rows), "--junit", "j.xml"],
        "tree-search --suite-out": ["tree-search", "--acceptance", str(ACCEPTANCE), "--max-nodes", "3",
                                    "--suite-out", path],
        "merge OUT": ["merge", path, str(rows)],
        "merge INPUT": ["merge", "m.jsonl", path],
        "rm": ["rm", path, "--run-id", "r"],
    }[command]


SUFFIX = {"run --out": ".jsonl", "check --out": ".jsonl", "run --report": ".html", "run --suite": ".toml",
          "report -o": ".html", "report RESULTS": ".jsonl", "gate --junit": ".xml", "gate --baseline": ".jsonl",
          "tree-search --suite-out": ".toml", "merge OUT": ".jsonl", "merge INPUT": ".jsonl", "rm": ".jsonl"}


@pytest.mark.parametrize("command", list(SUFFIX))
def test_a_file_name_too_long_is_one_line_naming_it(tiny, rows, tmp_path, monkeypatch, capsys, command):
    """A 260-character name, written or read: exit 2, one line saying the name is too long, and
    nothing is written (no results file, no report folder)."""
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(_argv(command, tiny, rows, LONG + SUFFIX[command])) == 2
    assert "file name too long (" in _one_line_error(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("command", list(SUFFIX))
def test_a_symbolic_link_loop_is_one_line_naming_it(tiny, rows, tmp_path, monkeypatch, capsys, loop, command):
    """A path that is a link loop (l.x -> 2l.x -> l.x): exit 2, one line saying so; the links are left as
    they are (a report or suite written through them would replace one with a file)."""
    monkeypatch.chdir(tmp_path)
    link = loop("l" + SUFFIX[command])
    assert main(_argv(command, tiny, rows, link.name)) == 2
    line = _one_line_error(capsys)
    assert f" {link.name}: a symbolic link loop" in line, line
    assert link.is_symlink() and os.readlink(link) == f"2{link.name}"


def test_a_written_name_leaves_room_for_the_files_named_after_it(tiny, tmp_path, capsys):
    """A results name that fits the file system but leaves no room for its lock sidecar and temporary
    files is refused up front; one that leaves room is taken."""
    too_long = tmp_path / ("r" * (256 - NAME_ROOM - len(".jsonl")) + ".jsonl")
    assert main(["run", "--suite", str(tiny), "--backends", "reference", "--quiet", "--out", str(too_long),
                 "--report", str(tmp_path / "r.html")]) == 2
    assert f"at most {255 - NAME_ROOM} here" in _one_line_error(capsys) and not too_long.exists()
    fits = tmp_path / ("r" * (255 - NAME_ROOM - len(".jsonl")) + ".jsonl")
    assert main(["run", "--suite", str(tiny), "--backends", "reference", "--quiet", "--out", str(fits),
                 "--report", str(tmp_path / "r.html")]) == 0
    assert fits.read_text().count("\n") == 1


def test_a_folder_name_too_long_and_a_path_too_long_are_named(tmp_path):
    assert path_problem(tmp_path / LONG / "r.jsonl").startswith("folder name too long (260 bytes;")
    assert path_problem("/".join(["d" * 200] * 25) + "/r.jsonl").startswith("path too long (")
    assert path_problem(tmp_path / "r.jsonl", NAME_ROOM) == ""


@pytest.mark.parametrize("code, says", [(errno.ELOOP, "a symbolic link loop"), (errno.ENAMETOOLONG, "name too long"),
                                        (errno.EACCES, None)])
def test_os_error_problem_words_only_name_errors(code, says):
    problem = os_error_problem(OSError(code, os.strerror(code), "x"))
    assert problem is None if says is None else problem.startswith(says)


def test_a_name_error_no_check_found_is_one_line(tiny, rows, tmp_path, monkeypatch, capsys):
    """The last resort: an ENAMETOOLONG that escaped the checks (here raised where the report's
    rows are read) is one line naming the path, exit 2, no traceback."""
    import treebench.harness.cli.report as report

    def too_long(paths, command):
        raise OSError(errno.ENAMETOOLONG, "File name too long", "some/path.jsonl")
    monkeypatch.setattr(report, "read_checked_rows", too_long)
    assert main(["report", str(rows), "-o", str(tmp_path / "r.html")]) == 2
    assert "some/path.jsonl: name too long for the file system" in _one_line_error(capsys)


@pytest.mark.parametrize("name", ["s" * 300, "suite name " * 30, "s" * (SAFE_NAME_MAX + 1)])
def test_a_long_suite_name_gives_a_short_recognisable_unique_file_name(name):
    short = safe_name(name)
    assert len(short) <= SAFE_NAME_MAX and short[:8] == safe_name(name[:8])
    assert safe_name(name + "x") != short and safe_name(name) == short
    assert safe_name("s" * SAFE_NAME_MAX) == "s" * SAFE_NAME_MAX


def test_a_suite_with_a_300_character_name_runs_into_its_default_files(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    suite = tmp_path / "long.toml"
    suite.write_text(TINY.format(name="s" * 300))
    assert main(["run", "--suite", str(suite), "--backends", "reference", "--quiet"]) == 0
    [results] = (tmp_path / "results/local").glob("*.jsonl")
    [report] = (tmp_path / "reports/local").glob("*.html")
    assert results.stem == report.stem and results.name.startswith("s" * 40) and len(results.name) < 100


def test_report_without_o_keeps_the_report_of_other_results_as_run_does(rows, tmp_path, monkeypatch, capsys):
    """`report X.jsonl` writes reports/local/X.html; again from the same file, over its own report; from
    another X.jsonl (another folder), beside it as X-2.html with a warning naming both, the first kept;
    a page that records no results file is kept too."""
    monkeypatch.chdir(tmp_path)
    reports = tmp_path / "reports/local"
    other = tmp_path / "elsewhere" / rows.name
    other.parent.mkdir()
    other.write_bytes(rows.read_bytes())
    (other.parent / "env-e.json").write_text('{"env_id": "e"}')
    for _ in range(2):
        assert main(["report", str(rows)]) == 0
        out, err = capsys.readouterr()
        assert out == "reports/local/ok.html\n" and "is kept" not in err, err
    first = (reports / "ok.html").read_bytes()
    assert main(["report", "elsewhere/ok.jsonl"]) == 0
    out, err = capsys.readouterr()
    assert out == "reports/local/ok-2.html\n"
    assert ("WARNING  report: reports/local/ok.html is the report of other results than elsewhere/ok.jsonl, and is "
            "kept: this report is reports/local/ok-2.html") in err.splitlines(), err
    assert (reports / "ok.html").read_bytes() == first
    (reports / "ok-2.html").write_text("<html>a page of no results file</html>")
    (reports / "ok.html").unlink()
    (reports / "ok.html").write_text("<html>another page</html>")
    assert main(["report", "elsewhere/ok.jsonl"]) == 0
    out, err = capsys.readouterr()
    assert out == "reports/local/ok-3.html\n" and "does not record which results file" in err, err


def test_the_readme_states_how_a_suite_name_becomes_a_default_file_name():
    """README's default file names give the mapping `safe_name` applies, with examples that it gives."""
    import re

    text = " ".join((Path(__file__).parents[1] / "README.md").read_text().split())
    assert ("in default file names `<suite>` is the suite's name with each run of characters other than ASCII "
            "letters, digits, `.`, `_` and `-` made one `_`, and `.`, `_` and `-` at either end dropped") in text
    assert "a name that leaves nothing, such as `..`, gives way to the suite file's stem, mapped the same way" in text
    examples = re.findall(r"`([^`]+)` gives `([^`]+)`", text)
    assert len(examples) >= 3 and all(safe_name(name) == want for name, want in examples), examples
    assert safe_name("..") == "suite" and safe_name("..", Path("my suite.toml")) == "my_suite"


def test_the_readme_states_how_a_long_suite_name_is_shortened_and_what_an_empty_shard_does():
    """README's default file names: a suite name over SAFE_NAME_MAX characters is cut to its first
    SAFE_NAME_MAX - 9 and 8 hex digits of the whole name's SHA-1, as `safe_name` does; its exit-code
    table says that a --shard holding no case of the suite runs and writes nothing and exits 0."""
    import hashlib

    text = " ".join((Path(__file__).parents[1] / "README.md").read_text().split())
    keep = SAFE_NAME_MAX - 9
    assert (f"a suite name over {SAFE_NAME_MAX} characters is shortened to its first {keep} characters, trailing "
            "`.`, `_` and `-` dropped, then `-` and the first 8 hex digits of the SHA-1 of the whole name") in text
    name = "s" * (SAFE_NAME_MAX + 1)
    assert safe_name(name) == f"{name[:keep]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
    assert ("| 0 | every pair that ran passed; also a `--shard` holding no case of the suite (`--shard 5/7` of 2 "
            "cases), which runs nothing, writes nothing (no results file, env file or report) and warns") in text


@pytest.mark.parametrize("command", ["run", "report", "gate"])
def test_a_dot_dot_after_a_missing_folder_is_refused_and_makes_nothing(command, tmp_path, monkeypatch, capsys):
    """An output path whose '..' leaves a folder that is not there (op/r/cg.jsonl/../x) would need that
    folder made to be resolved: refused in one line naming the path without it, nothing made."""
    monkeypatch.chdir(tmp_path)
    suite = tmp_path / "tiny.toml"
    suite.write_text(tiny_suite())
    (tmp_path / "op/r").mkdir(parents=True)
    append_row(tmp_path / "in.jsonl", {"schema": SCHEMA, "run_id": "r", "env": "e", "case_id": "c", "backend": "b",
                                       "status": "pass", "case": CASE})
    out = {"run": "op/r/cg.jsonl/../x.jsonl", "report": "op/r/cg.jsonl/../x.html", "gate": "op/r/cg.jsonl/../s.md"}
    argv = {"run": ["run", "--suite", str(suite), "--backends", "reference", "--quiet", "--out", out["run"]],
            "report": ["report", "in.jsonl", "-o", out["report"]],
            "gate": ["gate", "--baseline", "in.jsonl", "--candidate", "in.jsonl", "--summary", out["gate"]]}[command]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "op/r/cg.jsonl, which does not exist" in err, err
    assert err.endswith(os.path.normpath(out[command])), err
    assert sorted(os.listdir(tmp_path / "op/r")) == []


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_named_jsonl_in_a_results_folder_is_skipped_with_one_warning(tmp_path, monkeypatch, capsys):
    """A FIFO named *.jsonl inside a results folder is skipped with one warning naming it (reading it would
    wait for a writer forever); the folder's results files are read. An alarm fails the test instead of a hang."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a").mkdir()
    os.mkfifo(tmp_path / "a" / "pipe.jsonl")
    append_row(tmp_path / "a" / "r.jsonl", {"schema": SCHEMA, "run_id": "a", "env": "e", "case_id": "c",
                                            "backend": "b", "status": "pass",
                                            "case": CASE})
    def hung(*_):
        raise TimeoutError("report waited on the FIFO")
    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        assert main(["report", "a", "-o", "x.html"]) == 0
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "a/pipe.jsonl is not a regular file" in line], err
    assert (tmp_path / "x.html").is_file()


@pytest.mark.parametrize("command", ["report", "gate"])
def test_a_folder_named_jsonl_in_a_results_folder_is_skipped_with_one_warning(command, tmp_path, monkeypatch, capsys):
    """A folder named *.jsonl inside a results folder is skipped as every other folder there is (folders are
    not searched recursively), with one warning naming it; the folder's results files are read."""
    monkeypatch.chdir(tmp_path)
    for side in ("a", "b"):
        (tmp_path / side / "stray.jsonl").mkdir(parents=True)
        append_row(tmp_path / side / "r.jsonl", {"schema": SCHEMA, "run_id": side, "env": "e", "case_id": "c",
                                                 "backend": "b", "status": "pass",
                                                 "case": CASE})
    argv = {"report": ["report", "a", "-o", "x.html"],
            "gate": ["gate", "--baseline", "a", "--candidate", "b", "--allow-env-mismatch"]}[command]
    assert main(argv) in (0, 1)
    err = capsys.readouterr().err
    for side in ("a", "b") if command == "gate" else ("a",):
        warned = [line for line in err.splitlines() if f"{side}/stray.jsonl is a folder" in line]
        assert len(warned) == 1, err
