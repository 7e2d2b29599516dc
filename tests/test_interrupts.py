"""The line after Ctrl-C or SIGTERM in the commands that write no rows: it says no more than
that they were interrupted, and of each file they write (a report, a suite, a gate's summary
and JUnit XML, the results file rm rewrites) whether it was written; such a file is written
whole or not at all. Ctrl-C while treebench starts (held until torch is imported) and while a
run or check loads its suite: the line says what is true there, nothing written. A Ctrl-C that the
libraries of a report or the gate drop or turn into another error still stops the command."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pytest
import treebench.harness.cli.main as cli_main
from treebench.harness.cli.common import Command
from treebench.harness.cli.main import main
from treebench.harness.analyze.report import write_report as WRITE_REPORT
from treebench.harness.speculation.acceptance import shipped_models
from treebench.harness.store.outputs import write_whole
from treebench.harness.store.rows import read_rows

from tests.tiny_suites import tiny_suite

BASE = Path(__file__).parent / "data" / "results" / "h200-baseline"
ROOT = Path(__file__).resolve().parent.parent
START_UP = "treebench: interrupted while starting; nothing was written"
# The console script (`from treebench import main; sys.exit(main())`), after a line on stdout that says it
# is about to start, and with an import hook that sends this process SIGNUM (SIGINT, SIGTERM) as MODULE is
# first looked for.
ENTRY = """import os, signal, sys
class CtrlC:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == {module!r}:
            sys.meta_path.remove(CtrlC)
            os.kill(os.getpid(), signal.{signum})
        return None
sys.meta_path.insert(0, CtrlC)
import treebench
print("starting", flush=True)
sys.exit(treebench.main())
"""
STOPS = {"interrupted": (KeyboardInterrupt, 130), "terminated (SIGTERM)": (cli_main.Terminated, 143)}
# The console script with a Ctrl-C (or SIGNUM) once the command has ended: sent as Python tears down its
# modules (the seconds after the last line, with torch loaded), after it has put back the signals' default actions.
LATE_CTRL_C = """import os, signal, sys
class LateCtrlC:
    def __del__(self):
        os.kill(os.getpid(), signal.{signum})
late = LateCtrlC()
import treebench
sys.exit(treebench.main())
"""
# The console script with SIGTERM once the command has returned, before Python exits: its exit code on stdout.
ENDED_SIGTERM = """import os, signal, sys, time
import treebench
code = treebench.main()
print("returned", code, flush=True)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(5)
sys.exit(code)
"""
TERM_START_UP = "treebench: terminated (SIGTERM) while starting; nothing was written"


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
    from treebench.harness.analyze import report

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

    write_report = report.write_report

    def written_then_stopped(*args, **kwargs):
        write_report(*args, **kwargs)
        raise stop()
    monkeypatch.setattr(report, "write_report", written_then_stopped)
    assert main(["report", str(BASE), "-o", str(out)]) == code
    assert _line(capsys) == f"treebench: {what}; the report {out} was written"
    assert "an earlier report" not in out.read_text()


def test_an_interrupt_while_a_report_reads_its_rows_says_the_report_was_not_written(tmp_path, monkeypatch, capsys):
    """Reading large results takes a while: Ctrl-C then says what became of -o, not only "interrupted"."""
    from treebench.harness.cli import report

    out = tmp_path / "r.html"
    monkeypatch.setattr(report, "read_checked_rows", _stop(KeyboardInterrupt))
    assert main(["report", str(BASE), "-o", str(out)]) == 130
    assert _line(capsys) == f"treebench: interrupted; the report {out} was not written"
    assert not out.exists()


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
    monkeypatch.setattr("treebench.harness.analyze.gate.compare_runs", _stop(KeyboardInterrupt))
    monkeypatch.setattr(gate, "refuse_shared_files", lambda *a: None)     # the one results folder on both sides
    monkeypatch.setattr(gate, "refuse_shared_runs", lambda *a: None)
    assert main(argv) == 130
    assert _line(capsys) == (f"treebench: interrupted; nothing was appended to --summary {summary}; "
                             f"--junit {junit} was not written")
    assert summary.read_text() == "earlier steps\n" and not junit.exists()
    monkeypatch.undo()
    monkeypatch.setattr(gate, "refuse_shared_files", lambda *a: None)
    monkeypatch.setattr(gate, "refuse_shared_runs", lambda *a: None)
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


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("command", ["rm", "report"])
def test_a_ctrl_c_after_the_command_ended_changes_nothing(tmp_path, command, signum):
    """rm or report done (its file written, its line printed), then Ctrl-C or SIGTERM while Python exits:
    the process ended by the signal's default action, exit 130 or 143 with no line; now the command's own
    exit code."""
    results = tmp_path / "r.jsonl"
    results.write_bytes((BASE / "seed.jsonl").read_bytes())
    argv = (["rm", str(results), "--run-id", read_rows([results])[0]["run_id"]] if command == "rm" else
            ["report", str(BASE), "-o", str(tmp_path / "r.html")])
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.run([sys.executable, "-c", LATE_CTRL_C.format(signum=signum), *argv], cwd=tmp_path,
                          capture_output=True, text=True, env={**env, "PYTHONPATH": str(ROOT)}, timeout=300,
                          check=False)
    assert proc.returncode == 0 and "interrupted" not in proc.stderr and "terminated" not in proc.stderr, (
        proc.returncode, proc.stderr[-2000:])
    n = len(read_rows([BASE / "seed.jsonl"]))
    assert proc.stdout.startswith(f"removed {n} rows from {results}" if command == "rm" else str(tmp_path / "r.html"))


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


def _start(tmp_path: Path, *argv: str, module: str = "", signum: str = "SIGINT") -> subprocess.Popen:
    """`treebench ARGV` as the console script runs it, in `tmp_path`, once it has said it starts;
    SIGNUM sent to it as MODULE is first looked for (none when "")."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen([sys.executable, "-c", ENTRY.format(module=module, signum=signum), *argv], cwd=tmp_path,
                            env={**env, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline() == "starting\n"
    return proc


def _smoke(out: Path) -> tuple[str, ...]:
    return ("run", "--suite", "smoke", "--backends", "reference", "--out", str(out), "--report", "r.html", "--quiet")


@pytest.mark.slow
@pytest.mark.parametrize("module", ["numpy._core.multiarray", "numpy.exceptions", "numpy.linalg"])
def test_ctrl_c_while_torch_imports_numpy_stops_the_run_at_the_end_of_start_up(tmp_path, module):
    """torch's start-up imports numpy from C++ and drops an exception raised there: a Ctrl-C in it was
    lost (the run went on), or became an ImportError traceback, or left numpy half-imported (no report).
    Held until the imports end, it is the start-up line and 130 whichever module it lands in."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        pytest.skip(f"this numpy has no {module}")
    proc = _start(tmp_path, *_smoke(tmp_path / "r.jsonl"), module=module)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and err.strip().splitlines() == [START_UP], err
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.slow
def test_ctrl_c_at_any_moment_of_start_up_stops_the_run_before_anything_is_written(tmp_path):
    """SIGINT at several moments of `treebench run`'s first second (importing torch takes about that
    long): each run exits 130 with one line saying nothing was written, and writes nothing."""
    allowed = {START_UP, "treebench: interrupted before this run's first row; nothing was written"}
    runs = {}
    for delay in (0.02, 0.1, 0.2, 0.35, 0.6):   # each run sent SIGINT before the next starts; they end together
        where = tmp_path / str(delay)
        where.mkdir()
        proc = _start(where, *_smoke(where / "r.jsonl"))
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        runs[delay] = (where, proc)
    for delay, (where, proc) in runs.items():
        _, err = proc.communicate(timeout=300)
        lines = err.strip().splitlines()
        assert proc.returncode == 130 and len(lines) == 1 and lines[0] in allowed, (delay, err)
        assert os.listdir(where) == [], delay


@pytest.mark.parametrize("module", ["treebench.harness", "torch"])
def test_sigterm_while_treebench_starts_says_so_and_writes_nothing(tmp_path, module):
    """SIGTERM before the CLI's own handler is set, as the harness or torch is first imported: one line
    saying nothing was written, exit 143."""
    proc = _start(tmp_path, *_smoke(tmp_path / "r.jsonl"), module=module, signum="SIGTERM")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143 and err.strip().splitlines() == [TERM_START_UP], err
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize("backend", ["torch_sdpa", f"{ROOT / 'tests' / 'fault_backends.py'}:WrongShape"])
def test_sigterm_after_the_run_returned_says_it_had_ended_and_keeps_the_runs_code(tmp_path, backend):
    """A run done (rows, report and summary written), then SIGTERM before Python exits: one line saying
    the command had ended, naming its exit code, and that code (0 all passed, 1 an error row) rather than
    143: CI keeps the run's verdict."""
    (tmp_path / "tiny.toml").write_text(tiny_suite())
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.run([sys.executable, "-c", ENDED_SIGTERM, "run", "--suite", "tiny.toml", "--backends",
                           backend, "--out", "r.jsonl", "--report", "r.html", "--quiet"], cwd=tmp_path,
                          capture_output=True, text=True, env={**env, "PYTHONPATH": str(ROOT)}, timeout=300,
                          check=False)
    code = 0 if backend == "torch_sdpa" else 1
    assert proc.returncode == code and proc.stdout.splitlines()[-2:] == ["report: r.html", f"returned {code}"], (
        proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr.splitlines()[-1:] == [
        f"treebench: SIGTERM after the command had ended; exit code {code}, the command's own"], proc.stderr
    assert len(read_rows([tmp_path / "r.jsonl"])) == 1 and (tmp_path / "r.html").is_file()


def test_a_held_interrupt_is_raised_when_the_hold_ends():
    """Inside `interrupts_held` a SIGINT is only recorded; the block's end puts the handler back and
    raises it, and a later SIGINT goes to that handler as before."""
    from treebench.harness.run.inflight import interrupts_held

    before = signal.getsignal(signal.SIGINT)
    came = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts_held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
            came.append("after the signal")
    assert came and signal.getsignal(signal.SIGINT) is before
    with interrupts_held():
        pass                                   # no SIGINT: nothing raised
    assert signal.getsignal(signal.SIGINT) is before
    if before is signal.default_int_handler:
        with pytest.raises(KeyboardInterrupt):   # Python's handler back: a SIGINT now raises at once
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)


def test_an_error_inside_the_hold_puts_the_handler_back():
    """An exception leaving the block goes on unchanged (a SIGINT that came is dropped with it)."""
    from treebench.harness.run.inflight import interrupts_held

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(BaseException) as e:
        with interrupts_held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
            raise RuntimeError("an import failed")
    assert e.type is RuntimeError and signal.getsignal(signal.SIGINT) is before


def test_install_handler_sets_a_handler_on_the_main_thread_and_leaves_signals_alone_off_it():
    """`install_handler` is signal.signal with the previous handler, where one can be set; off the main
    thread it sets nothing and says so (False), where signal.signal raises ValueError."""
    import threading

    from treebench.harness.run.inflight import install_handler

    before = signal.getsignal(signal.SIGINT)

    def mine(signum, frame):
        pass
    try:
        assert install_handler(signal.SIGINT, mine) == (True, before) and signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, before)
    got = []
    thread = threading.Thread(target=lambda: got.append(install_handler(signal.SIGINT, mine)))
    thread.start()
    thread.join()
    assert got == [(False, None)] and signal.getsignal(signal.SIGINT) is before


def test_off_the_main_thread_the_cli_and_its_interrupt_blocks_set_no_handler(monkeypatch, capsys):
    """An application that runs `main` (SIGTERM), `interrupts_held` and `interrupts_noted` (SIGINT) on
    another thread: each goes through `install_handler`, sets nothing there and runs as it would."""
    import threading

    from treebench.harness.run import inflight

    calls, done = [], []
    real = inflight.install_handler

    def counted(signum, handler):
        calls.append(signal.Signals(signum).name)
        return real(signum, handler)
    monkeypatch.setattr(inflight, "install_handler", counted)
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))

    def work():
        with inflight.interrupts_held(), inflight.interrupts_noted():
            done.append(main(["tree", "chain:1"]))
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert done == [0] and "chain:1" in capsys.readouterr().out
    assert sorted(calls) == ["SIGINT"] * 3 + ["SIGTERM"]   # the two blocks, main's hold (none held), its SIGTERM
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


@pytest.mark.parametrize("failing", [False, True])
def test_the_console_entry_puts_the_sigint_handler_back(monkeypatch, capsys, failing):
    """`treebench.main` holds SIGINT from its first line; the CLI's start-up ends the hold, and an
    import that fails before it ends it too. SIGTERM's handler is the console entry's from its first
    line on, put back by the CLI once its command ended, and kept: the process is exiting."""
    import treebench

    before, term = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(treebench, "_AT_EXIT", [True])   # SIGTERM's SIG_IGN at exit is not this process's
    monkeypatch.setattr(sys, "argv", ["treebench", "tree", "chain:1"])
    try:
        if failing:
            monkeypatch.setitem(sys.modules, "treebench.harness.cli.main", None)   # importing it raises ImportError
            with pytest.raises(ImportError):
                treebench.main()
        else:
            assert treebench.main() == 0
        assert signal.getsignal(signal.SIGINT) is before
        assert signal.getsignal(signal.SIGTERM) is treebench._terminated
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if term is None else term)


@pytest.mark.parametrize("code", [0, 1, 3])
def test_a_sigterm_while_the_cli_returns_its_code_keeps_that_code(monkeypatch, capfd, code):
    """SIGTERM after the command ended, its handler the console entry's again, before the CLI's code
    reached `treebench.main`: the line says so with that code, and main returns it (not 143)."""
    import treebench
    from treebench.harness.run import inflight

    def cli(argv=None) -> int:
        inflight.COMMAND_BEGUN[0] = True   # as the CLI's command does; its handler already put back
        os.kill(os.getpid(), signal.SIGTERM)
        return code

    term = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(treebench, "_AT_EXIT", [True])   # SIGTERM's SIG_IGN at exit is not this process's
    monkeypatch.setattr(cli_main, "main", cli)
    try:
        assert treebench.main() == code
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if term is None else term)
    assert capfd.readouterr().err == (f"treebench: SIGTERM after the command had ended; exit code {code}, "
                                      "the command's own\n")


@pytest.mark.parametrize("what", list(STOPS))
@pytest.mark.parametrize("command, out", [("run", None), ("run", "new"), ("run", "there"), ("check", "new"),
                                          ("check", "there")])
def test_an_interrupt_while_the_suite_loads_says_nothing_was_written(tmp_path, monkeypatch, capsys, what,
                                                                     command, out):
    """Ctrl-C or SIGTERM in run or check before its results file is claimed: nothing was written, and
    a --out that was there is left as it was; no word of rows kept."""
    import treebench.harness.model.suites as suites

    stop, code = STOPS[what]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.toml").write_text(tiny_suite())
    path = tmp_path / "r.jsonl"
    if out == "there":
        path.write_bytes((BASE / "seed.jsonl").read_bytes())
    monkeypatch.setattr(suites, "load_suite", _stop(stop))
    backend = "--backends" if command == "run" else "--backend"
    argv = [command, "--suite", "tiny.toml", backend, "reference", "--quiet", *(["--out", str(path)] if out else [])]
    assert main(argv) == code
    tail = f"{path} is left as it was" if out == "there" else "nothing was written"
    assert _line(capsys) == f"treebench: {what} before this run's first row; {tail}"
    assert sorted(os.listdir(tmp_path)) == [*(["r.jsonl"] if out == "there" else []), "tiny.toml"]
    assert out != "there" or path.read_bytes() == (BASE / "seed.jsonl").read_bytes()


@pytest.mark.parametrize("what", list(STOPS))
@pytest.mark.parametrize("out_given", [False, True])
def test_a_run_stopped_before_its_report_says_so_and_the_hint_writes_it(tmp_path, monkeypatch, capsys, what,
                                                                         out_given):
    """Stopped after the last row, while the report is made: the line said only to --resume; now it
    says the report was not written and how to write it, and the --resume it names writes that
    report, named after the run it finishes, without running a pair again."""
    import treebench.harness.analyze.report as report

    stop, code = STOPS[what]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.toml").write_text(tiny_suite())
    argv = ["run", "--suite", "tiny.toml", "--backends", "torch_sdpa", "--quiet"]
    with monkeypatch.context() as m:
        m.setattr(report, "write_report", _stop(stop))
        assert main([*argv, *(["--out", "mine.jsonl"] if out_given else [])]) == code
    (out,) = [Path("mine.jsonl")] if out_given else Path("results/local").glob("*.jsonl")
    rows = out.read_bytes()
    page = Path(f"reports/local/tiny-{read_rows([out])[0]['run_id']}.html")
    flags = f" --report {page}" if out_given else ""
    assert _line(capsys) == (f"treebench: {what} after this run's last row; its rows are kept in {out}; the report "
                             f"{page} was not written; to write it, run treebench report {out} -o {page}, or the "
                             f"same command with --out {out}{flags} --resume")
    assert not page.exists()
    assert main([*argv, "--out", str(out), *flags.split(), "--resume"]) == 0
    said = capsys.readouterr().out
    assert f"report: {page} (every row of {out}, among them 1 row written before this run)\n" in said, said
    assert page.exists() and out.read_bytes() == rows
    assert sorted(p.name for p in Path("reports/local").iterdir()) == [page.name]


def test_a_resume_stopped_before_its_report_names_the_report_it_chose(tmp_path, monkeypatch, capsys):
    """A --resume whose default report (named after --out) holds another results file's report
    takes <name>-2.html; stopped while it is made, the line's hint names that path, which the
    report it suggests writes, leaving the other report as it was."""
    import treebench.harness.analyze.report as report

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.toml").write_text(tiny_suite())
    argv = ["run", "--suite", "tiny.toml", "--backends", "reference", "--quiet", "--resume"]
    assert main([*argv, "--out", "w/r.jsonl"]) == 0
    other = Path("reports/local/r.html").read_bytes()
    capsys.readouterr()
    with monkeypatch.context() as m:
        m.setattr(report, "write_report", _stop(KeyboardInterrupt))
        assert main([*argv, "--out", "w/sep/r.jsonl"]) == 130
    out, page = Path("w/sep/r.jsonl"), Path("reports/local/r-2.html")
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"treebench: interrupted after this run's last row; its rows are kept in {out}; the report {page} was not "
        f"written; to write it, run treebench report {out} -o {page}, or the same command with --out {out} "
        f"--report {page} --resume")
    assert main(["report", str(out), "-o", str(page)]) == 0
    assert page.exists() and Path("reports/local/r.html").read_bytes() == other


def _run_tiny(tmp_path: Path, monkeypatch) -> int:
    """`treebench run` of a one-case suite on torch_sdpa in `tmp_path`, rows to r.jsonl and the report to
    r.html, quiet; its exit code."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.toml").write_text(tiny_suite())
    return main(["run", "--suite", "tiny.toml", "--backends", "torch_sdpa", "--out", "r.jsonl", "--report", "r.html",
                 "--quiet"])


SENT = {"signal": signal.SIGINT}   # what `_ctrl_c` sends: a test of SIGTERM sets it (monkeypatch.setitem)
SIGNALS = {signal.SIGINT: ("interrupted", 130), signal.SIGTERM: ("terminated (SIGTERM)", 143)}   # its line, exit


def _ctrl_c() -> None:
    """SIGINT (or the signal in SENT) to this process, raised by the handler in place before this returns."""
    os.kill(os.getpid(), SENT["signal"])
    time.sleep(5)


def _import_failed(*args, **kwargs):
    """A library's start-up turning a Ctrl-C into its own error, as numpy's does."""
    try:
        _ctrl_c()
    except KeyboardInterrupt:
        raise ImportError("initialization failed") from None


def _dropped(*args, **kwargs):
    """Library code that catches a Ctrl-C and goes on (no page written)."""
    try:
        _ctrl_c()
    except KeyboardInterrupt:
        pass


class _Figure:
    """An object whose last reference goes while the page is made."""


def _lost_in_a_callback(*args, **kwargs):
    """A Ctrl-C raised in a weakref callback, which Python prints and drops."""
    figure = _Figure()
    ref = weakref.ref(figure, lambda _: _ctrl_c())
    del figure
    assert ref() is None


def _stopped_in_a_callback(*args, **kwargs):
    """A Ctrl-C raised in a weakref callback while the page is made (`_lost_in_a_callback`); the
    page is written after it."""
    _lost_in_a_callback()
    return WRITE_REPORT(*args, **kwargs)


@pytest.mark.parametrize("signum", list(SIGNALS))
@pytest.mark.parametrize("how, written", [(_import_failed, False), (_dropped, False), (_stopped_in_a_callback, True)])
def test_a_ctrl_c_lost_while_the_report_is_made_still_stops_the_run(tmp_path, monkeypatch, capsys, how, written,
                                                                    signum):
    """Ctrl-C or SIGTERM while a run's report loads its libraries or makes the page, where that code
    turns it into an ImportError, drops it, or raises it where Python only prints it: the run still
    exits 130 (143) with the line that says whether the report was written (and how to write it), no
    other line, stdout names no report, and the rows are as the sweep left them."""
    import treebench.harness.analyze.report as report

    rows: list[bytes] = []

    def made(*args, **kwargs):
        rows.append(Path("r.jsonl").read_bytes())
        return how(*args, **kwargs)
    monkeypatch.setitem(SENT, "signal", signum)
    monkeypatch.setattr(report, "write_report", made)
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)   # Python's own, which prints to stderr
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    what, code = SIGNALS[signum]
    assert _run_tiny(tmp_path, monkeypatch) == code
    out, err = capsys.readouterr()
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("INFO ")]
    said = ("the report r.html was written" if written else "the report r.html was not written; to write it, run "
            "treebench report r.jsonl -o r.html, or the same command with --out r.jsonl --resume")
    assert lines == [f"treebench: {what} after this run's last row; its rows are kept in r.jsonl; {said}"], err
    assert "report:" not in out and Path("r.html").exists() == written
    assert len(rows) == 1 and Path("r.jsonl").read_bytes() == rows[0] and len(read_rows([Path("r.jsonl")])) == 1
    assert sorted(os.listdir(tmp_path)) == sorted(["r.jsonl", "tiny.toml", *(["r.html"] if written else []),
                                                   *(p.name for p in tmp_path.glob("env-*.json"))])
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


@pytest.mark.parametrize("signum", list(SIGNALS))
@pytest.mark.parametrize("existed", [False, True])
@pytest.mark.parametrize("how, written", [(_import_failed, False), (_dropped, False), (_stopped_in_a_callback, True)])
def test_a_ctrl_c_lost_while_a_report_is_made_still_stops_the_command(tmp_path, monkeypatch, capsys, how, written,
                                                                      existed, signum):
    """`treebench report`: a Ctrl-C or SIGTERM that the report's libraries turn into an ImportError,
    drop, or raise where Python only prints it, exits 130 (143) with the one line that says whether the
    report was written, an earlier report whole where it was not, and no path on stdout."""
    import treebench.harness.analyze.report as report

    out = tmp_path / "r.html"
    if existed:
        out.write_text('<meta name="generator" content="treebench"> an earlier report')
    monkeypatch.setitem(SENT, "signal", signum)
    monkeypatch.setattr(report, "write_report", how)
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)   # Python's own, which prints to stderr
    before = signal.getsignal(signal.SIGINT)
    stopped, code = SIGNALS[signum]
    assert main(["report", str(BASE), "-o", str(out)]) == code
    said, err = capsys.readouterr()
    kept = ": the file already there is left as it was" if existed and not written else ""
    what = "was written" if written else f"was not written{kept}"
    assert [ln for ln in err.strip().splitlines() if not ln.startswith("INFO ")] == [
        f"treebench: {stopped}; the report {out} {what}"], err
    assert said == "" and os.listdir(tmp_path) == (["r.html"] if written or existed else [])
    assert written or not existed or out.read_text().endswith("an earlier report")
    assert signal.getsignal(signal.SIGINT) is before


def test_a_ctrl_c_while_a_report_loads_its_libraries_says_the_report_was_not_written(tmp_path, monkeypatch, capsys):
    """Ctrl-C while `treebench report` loads pandas and matplotlib (a second), turned into an
    ImportError there as numpy's start-up does: exit 130, and the line says what became of -o."""
    name = "treebench.harness.analyze.headline"   # the first of the report's modules that load them

    class CtrlC:
        @staticmethod
        def find_spec(fullname, path=None, target=None):
            if fullname == name:
                _import_failed()

    out = tmp_path / "r.html"
    out.write_text('<meta name="generator" content="treebench"> an earlier report')
    monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [CtrlC, *sys.meta_path])
    assert main(["report", str(BASE), "-o", str(out)]) == 130
    assert _line(capsys) == (f"treebench: interrupted; the report {out} was not written: the file already there "
                             "is left as it was")
    assert out.read_text().endswith("an earlier report") and os.listdir(tmp_path) == ["r.html"]


@pytest.mark.parametrize("signum", list(SIGNALS))
@pytest.mark.parametrize("how, written", [(_import_failed, False), (_dropped, True), (_lost_in_a_callback, True)])
def test_a_ctrl_c_lost_while_the_gate_compares_still_stops_it(tmp_path, monkeypatch, capsys, how, written, signum):
    """`treebench gate`: a Ctrl-C or SIGTERM that its libraries turn into an ImportError, drop, or raise
    where Python only prints it, exits 130 (143) with the one line that says what became of --summary
    and --junit, and no summary on stdout."""
    from treebench.harness.analyze import gate as analyze_gate
    from treebench.harness.cli import gate

    compare_runs = analyze_gate.compare_runs

    def lost_then_compared(*args, **kwargs):
        how()
        return compare_runs(*args, **kwargs)
    summary, junit = tmp_path / "summary.md", tmp_path / "gate.xml"
    summary.write_text("earlier steps\n")
    monkeypatch.setattr(analyze_gate, "compare_runs", lost_then_compared)
    monkeypatch.setattr(gate, "refuse_shared_files", lambda *a: None)     # the one results folder on both sides
    monkeypatch.setattr(gate, "refuse_shared_runs", lambda *a: None)
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)   # Python's own, which prints to stderr
    monkeypatch.setitem(SENT, "signal", signum)
    before = signal.getsignal(signal.SIGINT)
    stopped, code = SIGNALS[signum]
    assert main(["gate", "--baseline", str(BASE), "--candidate", str(BASE), "--allow-env-mismatch",
                 "--summary", str(summary), "--junit", str(junit)]) == code
    said, err = capsys.readouterr()
    what = (f"the summary was appended to --summary {summary}; --junit {junit} was written" if written else
            f"nothing was appended to --summary {summary}; --junit {junit} was not written")
    assert [ln for ln in err.strip().splitlines() if not ln.startswith("INFO ")] == [
        f"treebench: {stopped}; {what}"], err
    assert said == "" and junit.exists() == written and summary.read_text().startswith("earlier steps\n")
    assert (summary.read_text() == "earlier steps\n") != written
    assert signal.getsignal(signal.SIGINT) is before


def test_a_run_whose_report_failed_names_no_report(tmp_path, monkeypatch, capsys):
    """A report that could not be written: exit 1, the error line, and stdout names the rows only."""
    import treebench.harness.analyze.report as report

    monkeypatch.setattr(report, "write_report", _stop(RuntimeError))
    assert _run_tiny(tmp_path, monkeypatch) == 1
    out, err = capsys.readouterr()
    assert "ERROR    report not written (RuntimeError: ); the rows are in r.jsonl" in err.splitlines(), err
    assert "rows: r.jsonl" in out.splitlines() and "report:" not in out and not Path("r.html").exists()


@pytest.mark.parametrize("given", [True, False])
def test_a_report_run_cannot_write_is_named_by_run_s_option(tmp_path, monkeypatch, capsys, given):
    """A report that cannot be written (a full disk) is one line, exit 2 as any failed write, the rows kept; it
    names the option of the command that asked for it:
    `--report` (or run's default) under `treebench run`, whose command line has no `report -o`; `-o` under
    `treebench report`."""
    import treebench.harness.analyze.report as report

    def full_disk(path, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(report, "write_whole", full_disk)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.toml").write_text(tiny_suite())
    asked = ["--report", "r.html"] if given else []
    assert main(["run", "--suite", "tiny.toml", "--backends", "torch_sdpa", "--out", "r.jsonl", "--quiet", *asked]) == 2
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("ERROR ")]
    run_id = read_rows(["r.jsonl"])[0]["run_id"]
    named = "--report r.html" if given else f"run's default --report reports/local/tiny-{run_id}.html"
    assert line == (f"ERROR    report not written: {named}: cannot write (No space left on device); "
                    "choose another path; the rows are in r.jsonl"), line
    assert main(["report", "r.jsonl", "-o", "x.html"]) == 2
    assert capsys.readouterr().err == ("treebench: error: report -o x.html: cannot write (No space left on device); "
                                       "choose another path\n")


def test_a_report_whose_folder_became_a_file_during_the_run_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    """--report sub/r.html where sub/ was a folder when the run began and is a plain file when the report is
    written: one line that says so as the check before the run says it ("... is a file, not a folder"), exit 2
    as any output that cannot be written, and the rows kept (not exit 1, which means a mismatch or an error)."""
    from treebench.harness.run import inflight

    sub = tmp_path / "sub"
    sub.mkdir()
    due = inflight.report_due

    def folder_to_file(*args):   # between the last row and the report
        sub.rmdir()
        sub.write_text("a file now\n")
        return due(*args)
    monkeypatch.setattr(inflight, "report_due", folder_to_file)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.toml").write_text(tiny_suite())
    argv = ["run", "--suite", "tiny.toml", "--backends", "torch_sdpa", "--out", "r.jsonl", "--report", "sub/r.html",
            "--quiet"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert [ln for ln in err.splitlines() if ln.startswith("ERROR ")] == [
        f"ERROR    report not written: --report sub/r.html: cannot write ({sub} is a file, not a folder); choose "
        "another path; the rows are in r.jsonl"], err
    assert len(read_rows(["r.jsonl"])) == 1 and "report:" not in out and sub.read_text() == "a file now\n"
    monkeypatch.setattr(inflight, "report_due", due)
    assert main(argv) == 2   # the check before the run names the same problem in the same words
    assert "(sub is a file, not a folder)" in capsys.readouterr().err


def test_a_run_stopped_after_its_report_says_it_was_written(tmp_path, monkeypatch, capsys):
    import treebench.harness.cli.run as run_cmd

    monkeypatch.setattr(run_cmd, "print_summary", _stop(KeyboardInterrupt))
    assert _run_tiny(tmp_path, monkeypatch) == 130
    assert _line(capsys) == "treebench: interrupted after this run's last row; its rows are kept in r.jsonl; the " \
                            "report r.html was written"
    assert Path("r.html").exists()


def _sigterm_lost(then):
    """`then`, after a SIGTERM raised in a weakref callback, where Python only prints it."""
    def lost(*args, **kwargs):
        SENT["signal"] = signal.SIGTERM
        try:
            _lost_in_a_callback()
        finally:
            SENT["signal"] = signal.SIGINT
        return then(*args, **kwargs)
    return lost


def test_a_sigterm_lost_after_the_report_still_ends_the_run_with_143(tmp_path, monkeypatch, capsys):
    """A SIGTERM whose Terminated Python only prints (a weakref callback) while the summary is printed,
    after the report: the command's end raises it again, exit 143 with the SIGTERM line and no other."""
    import treebench.harness.cli.run as run_cmd

    monkeypatch.setattr(run_cmd, "print_summary", _sigterm_lost(run_cmd.print_summary))
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)   # Python's own, which prints to stderr
    assert _run_tiny(tmp_path, monkeypatch) == 143
    assert _line(capsys) == ("treebench: terminated (SIGTERM) after this run's last row; its rows are kept in "
                             "r.jsonl; the report r.html was written")
    assert Path("r.html").exists() and len(read_rows([Path("r.jsonl")])) == 1


def test_a_sigterm_lost_before_the_sweep_stops_the_run_after_its_first_pair(tmp_path, monkeypatch, capsys):
    """A SIGTERM lost while the suite loads (before the runner starts): the runner still raises it after
    the pair in flight, and the run ends there with 143, its one row kept and no report."""
    import treebench.harness.model.suites as suites

    monkeypatch.setattr(suites, "load_suite", _sigterm_lost(suites.load_suite))
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)   # Python's own, which prints to stderr
    monkeypatch.chdir(tmp_path)
    (tmp_path / "two.toml").write_text(tiny_suite(context_lens=(8, 9)))
    assert main(["run", "--suite", "two.toml", "--backends", "torch_sdpa", "--out", "r.jsonl", "--report", "r.html",
                 "--quiet"]) == 143
    (row,) = read_rows([Path("r.jsonl")])
    assert _line(capsys) == (f"treebench: terminated (SIGTERM); rows already written are kept in r.jsonl, run_id "
                             f"{row['run_id']}; to finish, run the same command with --out r.jsonl --resume, or "
                             f"remove them with treebench rm r.jsonl --run-id {row['run_id']}")
    assert not Path("r.html").exists()


def test_a_results_file_that_changed_before_the_first_pair_is_not_said_to_be_left_as_it_was(tmp_path, monkeypatch,
                                                                                            capsys):
    """--resume merges rows a killed launch left in rank files into --out before the first pair: an
    interrupt then must not say that --out is left as it was."""
    import treebench.harness.sweep.execute

    from treebench.harness.store.rows import append_row

    def merged_then_stopped(cases, backends, opts, console):
        append_row(opts.out, read_rows([BASE / "seed.jsonl"])[0])     # another run's row
        raise KeyboardInterrupt
    monkeypatch.setattr(treebench.harness.sweep.execute, "execute", merged_then_stopped)
    (tmp_path / "tiny.toml").write_text(tiny_suite())
    out = tmp_path / "r.jsonl"
    out.write_bytes((BASE / "seed.jsonl").read_bytes())
    assert main(["check", "--suite", str(tmp_path / "tiny.toml"), "--backend", "reference", "--out", str(out),
                 "--quiet"]) == 130
    line = _line(capsys)
    assert "left as it was" not in line and f"rows already written are kept in {out}" in line, line


@pytest.mark.parametrize("name", ["run", "check", "merge"])
def test_an_interrupt_before_any_results_file_is_claimed_says_nothing_was_written(name, capsys):
    """Stopped after the subcommand is known but before its results file is claimed or marked (the
    backends and env still loading): no word of rows kept, which no file holds."""
    from treebench.harness.cli.common import ACTIVE_OUT, ACTIVE_RUN_IDS, NOTHING_WRITTEN
    from treebench.harness.run.inflight import PROGRESS, UNWRITTEN

    ACTIVE_OUT[0] = NOTHING_WRITTEN[0] = PROGRESS[0] = UNWRITTEN[0] = None
    ACTIVE_RUN_IDS[0] = ()
    assert cli_main._interrupted(False, name) == 130
    assert capsys.readouterr().err == "treebench: interrupted; nothing was written\n"


def test_the_commands_a_line_suggests_quote_their_paths(tmp_path, monkeypatch, capsys):
    """A path with a space is quoted in every command a line suggests, so that it can be pasted:
    stopped while its report is made, the run's hint writes the report; the kept rows' and the
    crash line's --resume and `treebench rm` name the file as one word."""
    import shlex

    import treebench.harness.analyze.report as report
    from treebench.harness.run.inflight import kept_rows
    from treebench.harness.sweep.crash import crash_line

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.toml").write_text(tiny_suite())
    argv = ["run", "--suite", "tiny.toml", "--backends", "reference", "--quiet", "--out", "my out.jsonl",
            "--report", "my page.html"]
    with monkeypatch.context() as m:
        m.setattr(report, "write_report", _stop(KeyboardInterrupt))
        assert main(argv) == 130
    line = _line(capsys)
    assert line.endswith("to write it, run treebench report 'my out.jsonl' -o 'my page.html', or the same command "
                         "with --out 'my out.jsonl' --resume"), line
    suggested = shlex.split(line.split("to write it, run ")[1].split(", or")[0])
    assert suggested[:2] == ["treebench", "report"] and main(suggested[1:]) == 0 and Path("my page.html").exists()
    out = Path("my out.jsonl")
    assert kept_rows(out, ("ID",), "then run") == (" in my out.jsonl, run_id ID; then run the same command with "
                                                  "--out 'my out.jsonl' --resume, or remove them with treebench rm "
                                                  "'my out.jsonl' --run-id ID")
    assert crash_line(out, "ID").endswith("--isolate --out 'my out.jsonl' --resume, or remove them with treebench rm "
                                          "'my out.jsonl' --run-id ID")
    assert crash_line(out, "ID", written=False).endswith("--isolate --out 'my out.jsonl'")


@pytest.mark.parametrize("left", [0, 1])
def test_a_check_resume_stopped_after_its_sweep_names_the_runs_its_rows_are_in(tmp_path, monkeypatch, capsys, left):
    """`check --resume` stopped after its sweep (Ctrl-C while its summary prints) whose --out changed (`left` cases
    checked now, or else a row a killed launch left in a rank file merged in): the line names the run ids of the
    check's rows (the earlier run's, and this one's where it wrote a row), as `run` does, not this run's fresh id
    alone, which holds none where nothing was left; several ids as one `rm --run-id A B`, which rm then takes."""
    import shlex

    import treebench.harness.cli.check as check_cmd

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.toml").write_text(tiny_suite(context_lens=(8, 9)))
    argv = ["check", "--suite", "tiny.toml", "--backend", "reference", "--out", "r.jsonl", "--quiet"]
    assert main(argv) == 0
    (earlier,) = {r["run_id"] for r in read_rows([Path("r.jsonl")])}
    first, second = Path("r.jsonl").read_text().splitlines(keepends=True)
    Path("r.jsonl").write_text(first)
    if not left:   # what a killed torchrun launch leaves: merged into --out by --resume
        Path("r.rank1-of-2.jsonl").write_text(second)
    capsys.readouterr()
    with monkeypatch.context() as m:
        m.setattr(check_cmd, "print_summary", _stop(KeyboardInterrupt))
        assert main([*argv, "--resume"]) == 130
    line = _line(capsys)
    rows = read_rows([Path("r.jsonl")])
    ids = sorted({r["run_id"] for r in rows})
    assert len(rows) == 2 and len(ids) == 1 + left and earlier in ids, rows
    assert f"rows already written are kept in r.jsonl, run_id {', '.join(ids)}; " in line, line
    assert line.endswith(f"or remove them with treebench rm r.jsonl --run-id {' '.join(ids)}"), line
    assert main(shlex.split(line.split("remove them with treebench ")[1])) == 0
    assert read_rows([Path("r.jsonl")]) == []


# The console script started with SIGINT ignored (a non-interactive shell's `treebench run ... &`): a SIGINT
# sent as MODULE is first looked for and one sent as the report is written, and the report then written.
IGNORED_ENTRY = ENTRY.split("import treebench")[0].replace("{signum}", "SIGINT") + """import treebench
from treebench.harness.analyze import report
written = report.write_report
def ctrl_c_then_write(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    return written(*args, **kwargs)
report.write_report = ctrl_c_then_write
sys.exit(treebench.main())
"""


@pytest.mark.parametrize("module", ["torch", "treebench.harness.cli.main"])
def test_a_sigint_ignored_when_treebench_starts_stays_ignored_through_the_report(tmp_path, module):
    """SIGINT ignored from the start stays ignored: a SIGINT while it starts or writes the report changes nothing."""
    (tmp_path / "tiny.toml").write_text(tiny_suite())
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    argv = ["run", "--suite", "tiny.toml", "--backends", "torch_sdpa", "--out", "r.jsonl", "--report", "r.html",
            "--quiet"]
    proc = subprocess.run([sys.executable, "-c", IGNORED_ENTRY.format(module=module), *argv], cwd=tmp_path,
                          env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300,
                          check=False, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert proc.returncode == 0 and "interrupted" not in proc.stderr, (proc.returncode, proc.stderr[-2000:])
    assert (tmp_path / "r.html").is_file() and {r["status"] for r in read_rows([tmp_path / "r.jsonl"])} == {"pass"}
