"""The line after Ctrl-C or SIGTERM in the commands that write no rows: it says no more than
that they were interrupted, and of each file they write (a report, a suite, a gate's summary
and JUnit XML, the results file rm rewrites) whether it was written; such a file is written
whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import treebench.harness.cli.main as cli_main
from treebench.harness.cli.common import Command
from treebench.harness.cli.main import main
from treebench.harness.speculation.acceptance import shipped_models
from treebench.harness.store.outputs import write_whole
from treebench.harness.store.rows import read_rows

BASE = Path(__file__).parent / "data" / "results" / "h200-baseline"
STOPS = {"interrupted": (KeyboardInterrupt, 130), "terminated (SIGTERM)": (cli_main.Terminated, 143)}


def _stop(stop: type[BaseException]):
    def stopped(*args, **kwargs):
        raise stop()
    return stopped


def _line(capsys) -> str:
    """The one treebench line on stderr (an INFO record of the report written may come before it)."""
    lines = [ln for ln in capsys.readouterr().err.strip().splitlines() if not ln.startswith("INFO ")]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("what", list(STOPS))
@pytest.mark.parametrize("argv", [["list"], ["tree", "full:3:2"], ["selftest"],
                                  ["plan", "--results", "r.jsonl", "--acceptance", "m.toml"]])
def test_a_command_that_writes_nothing_says_only_that_it_was_interrupted(monkeypatch, capsys, argv, what):
    """No rows and no files: no word of rows kept."""
    stop, code = STOPS[what]
    real = cli_main.command
    monkeypatch.setattr(cli_main, "command", lambda name: Command(real(name).add_arguments, _stop(stop)))
    assert main(argv) == code
    assert _line(capsys) == f"treebench: {what}"


def test_an_interrupt_before_the_command_is_known_says_nothing_was_written(monkeypatch, capsys):
    """Ctrl-C while the subcommand's module is imported (torch among its imports): as at start-up."""
    monkeypatch.setattr(cli_main, "command_parser", _stop(KeyboardInterrupt))
    assert main(["gate", "--baseline", "a", "--candidate", "b"]) == 130
    assert _line(capsys) == "treebench: interrupted while starting; nothing was written"


def test_an_interrupt_while_the_cli_imports_torch_is_the_start_up_line(monkeypatch, capsys):
    """Ctrl-C in main's own start-up (its imports load torch; then the crash report is set up):
    the start-up line and 130, not a traceback."""
    import treebench.harness.run.inflight as inflight

    monkeypatch.setattr(inflight, "enable_crash_report", _stop(KeyboardInterrupt))
    assert main(["list"]) == 130
    assert _line(capsys) == "treebench: interrupted while starting; nothing was written"


@pytest.mark.parametrize("what", list(STOPS))
@pytest.mark.parametrize("existed", [False, True])
def test_an_interrupted_report_says_whether_it_was_written(tmp_path, monkeypatch, capsys, what, existed):
    from treebench.harness.cli import report

    stop, code = STOPS[what]
    out = tmp_path / "new" / "r.html"
    if existed:
        out.parent.mkdir()
        out.write_text('<meta name="generator" content="treebench"> an earlier report')
    monkeypatch.setattr(report, "write_report", _stop(stop))       # while the page is made
    assert main(["report", str(BASE), "-o", str(out)]) == code
    kept = ": the file already there is left as it was" if existed else ""
    assert _line(capsys) == f"treebench: {what}; the report {out} was not written{kept}"
    assert out.exists() == existed and (not existed or "an earlier report" in out.read_text())
    monkeypatch.undo()

    def written_then_stopped(*args, **kwargs):
        from treebench.harness.analyze.report import write_report
        write_report(*args, **kwargs)
        raise stop()
    monkeypatch.setattr(report, "write_report", written_then_stopped)
    assert main(["report", str(BASE), "-o", str(out)]) == code
    assert _line(capsys) == f"treebench: {what}; the report {out} was written"
    assert "an earlier report" not in out.read_text()


def test_an_interrupt_while_a_report_is_written_leaves_the_earlier_one(tmp_path, monkeypatch, capsys):
    """Stopped between writing the page and putting it in place: the earlier report stays whole,
    no temporary file is left, and the line says so."""
    out = tmp_path / "r.html"
    out.write_text('<meta name="generator" content="treebench"> an earlier report')
    monkeypatch.setattr(os, "replace", _stop(KeyboardInterrupt))
    assert main(["report", str(BASE), "-o", str(out)]) == 130
    assert _line(capsys) == f"treebench: interrupted; the report {out} was not written: the file already there " \
                            "is left as it was"
    assert out.read_text().endswith("an earlier report") and os.listdir(tmp_path) == ["r.html"]


def test_an_interrupted_tree_search_says_its_suite_was_not_written(tmp_path, monkeypatch, capsys):
    from treebench.harness.speculation import commands

    monkeypatch.setattr(commands, "searched", _stop(KeyboardInterrupt))
    suite = tmp_path / "s.toml"
    assert main(["tree-search", "--acceptance", str(shipped_models()[0]), "--max-nodes", "8",
                 "--suite-out", str(suite)]) == 130
    assert _line(capsys) == f"treebench: interrupted; --suite-out {suite} was not written"
    assert not suite.exists()


def test_an_interrupted_gate_says_what_it_wrote(tmp_path, monkeypatch, capsys):
    from treebench.harness.cli import gate

    summary, junit = tmp_path / "summary.md", tmp_path / "gate.xml"
    summary.write_text("earlier steps\n")
    argv = ["gate", "--baseline", str(BASE), "--candidate", str(BASE), "--allow-env-mismatch",
            "--summary", str(summary), "--junit", str(junit)]
    monkeypatch.setattr(gate, "compare_runs", _stop(KeyboardInterrupt))
    monkeypatch.setattr(gate, "_refuse_shared_files", lambda *a: None)     # the one results folder on both sides
    monkeypatch.setattr(gate, "_refuse_shared_runs", lambda *a: None)
    assert main(argv) == 130
    assert _line(capsys) == (f"treebench: interrupted; nothing was appended to --summary {summary}; "
                             f"--junit {junit} was not written")
    assert summary.read_text() == "earlier steps\n" and not junit.exists()
    monkeypatch.undo()
    monkeypatch.setattr(gate, "_refuse_shared_files", lambda *a: None)
    monkeypatch.setattr(gate, "_refuse_shared_runs", lambda *a: None)
    monkeypatch.setattr(gate, "emit", _stop(KeyboardInterrupt))             # both files written, then Ctrl-C
    assert main(argv) == 130
    assert _line(capsys) == (f"treebench: interrupted; the summary was appended to --summary {summary}; "
                             f"--junit {junit} was written")


def test_an_interrupted_rm_says_no_row_was_removed(tmp_path, monkeypatch, capsys):
    from treebench.harness.store import remove

    results = tmp_path / "r.jsonl"
    results.write_bytes((BASE / "seed.jsonl").read_bytes())
    run_id = read_rows([results])[0]["run_id"]
    monkeypatch.setattr(remove, "write_whole", _stop(KeyboardInterrupt))
    assert main(["rm", str(results), "--run-id", run_id]) == 130
    assert _line(capsys) == f"treebench: interrupted; no row was removed: {results} is left as it was"
    assert results.read_bytes() == (BASE / "seed.jsonl").read_bytes()


@pytest.mark.parametrize("existed", [False, True])
def test_write_whole_leaves_the_file_as_it_was_when_stopped(tmp_path, monkeypatch, existed):
    path = tmp_path / "out.html"
    if existed:
        path.write_text("before")
        path.chmod(0o640)
    monkeypatch.setattr(os, "fsync", _stop(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        write_whole(path, "after")
    assert os.listdir(tmp_path) == (["out.html"] if existed else [])
    assert not existed or path.read_text() == "before"
    monkeypatch.undo()
    write_whole(path, "after")
    assert path.read_text() == "after" and (not existed or path.stat().st_mode & 0o777 == 0o640)


def test_write_whole_writes_a_link_through_to_its_target(tmp_path):
    target, link = tmp_path / "target.xml", tmp_path / "link.xml"
    target.write_text("before")
    link.symlink_to(target)
    write_whole(link, "after")
    assert link.is_symlink() and target.read_text() == "after"


def test_write_whole_names_the_path_asked_for_when_it_fails(tmp_path):
    with pytest.raises(OSError) as e:
        write_whole(tmp_path / "missing" / "out.xml", "x")
    assert e.value.filename == str(tmp_path / "missing" / "out.xml")
