"""A sweep's edges: a backend raising a BaseException that is not an Exception, or changing the
working directory; an unreadable env file beside --out; a --shard that selects no case; an
interrupted merge."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest

from treebench.harness.cli.main import main
from treebench.harness.model.cases import Case
from treebench.harness.run.config import RunConfig
from treebench.harness.run.runner import run_cases
from treebench.harness.store.env import env_fingerprint
from treebench.harness.store.names import report_results
from treebench.harness.store.rows import read_rows
from tests.broken_backends import Correct
from tests.tiny_suites import tiny_suite

CASE = Case(batch_size=2, context_len=5, tree="chain:2", num_q_heads=2, num_kv_heads=1, head_dim=8,
            dtype="float32", page_size=4)
CFG = RunConfig(mode="check", device="cpu", quiet=True, check_memory=False)


class OwnBaseException(BaseException):
    """A backend's own exception class derived from BaseException, not Exception."""


class RaisesBase(Correct):
    """Raises `kind` (a BaseException class) in prepare, or in a timed call with where="timed call"."""

    name = "raises_base"

    def __init__(self, kind: type[BaseException] = OwnBaseException, where: str = "prepare"):
        self.kind, self.where = kind, where

    def prepare(self, inputs):
        if self.where == "prepare":
            raise self.kind("raised in prepare")
        fn, calls = super().prepare(inputs), []

        def run():   # the first call (the comparison's) answers; a timed one raises
            calls.append(1)
            if len(calls) > 1:
                raise self.kind("raised in a timed call")
            return fn()
        return run


@pytest.mark.parametrize("isolate", [False, True])
@pytest.mark.parametrize("kind", [OwnBaseException, asyncio.CancelledError, GeneratorExit])
def test_a_base_exception_a_backend_raises_is_its_error_row_and_the_sweep_goes_on(kind, isolate):
    """Every BaseException a backend raises is its error row, naming that exception, in the process as in
    an isolated worker (which reports it, not a death by SIGKILL); the next backend runs."""
    rows = run_cases([CASE], [RaisesBase(kind), Correct()], replace(CFG, isolate=isolate))
    assert [(r["status"], r["reason"]) for r in rows] == [("error", f"{kind.__name__}: raised in prepare"),
                                                           ("pass", None)]


def test_a_base_exception_in_a_timed_call_is_an_error_row():
    rows = run_cases([CASE], [RaisesBase(asyncio.CancelledError, "timed call"), Correct()], replace(CFG, mode="run"))
    assert [(r["status"], r["reason"]) for r in rows] == [
        ("error", "while timing: CancelledError: raised in a timed call"), ("pass", None)]


BASE_RAISING = """
class Boom(BaseException):
    pass


class RaisesBoom:
    name = "raises_boom"

    def availability(self):
        return None

    def supports(self, case):
        return None

    def prepare(self, inputs):
        raise Boom("not an Exception")
"""


@pytest.mark.parametrize("command", ["run", "check"])
def test_a_cli_sweep_records_a_base_exception_and_runs_every_pair(tmp_path, capsys, command):
    """run and check go on past a backend's BaseException: every pair has its row, exit 1, no traceback."""
    (tmp_path / "boom.py").write_text(BASE_RAISING)
    (tmp_path / "s.toml").write_text(tiny_suite(context_lens=(8, 9)))
    out = tmp_path / "r.jsonl"
    argv = [command, "--suite", str(tmp_path / "s.toml"), "--out", str(out), "--quiet"]
    if command == "run":
        argv += ["--backends", f"{tmp_path / 'boom.py'}:RaisesBoom,reference", "--report", str(tmp_path / "r.html")]
    else:
        argv += ["--backend", f"{tmp_path / 'boom.py'}:RaisesBoom"]
    assert main(argv) == 1
    rows = read_rows([out])
    assert [(r["backend"], r["status"]) for r in rows] == \
        [("raises_boom", "error"), ("reference", "pass")] * 2 if command == "run" else [("raises_boom", "error")] * 2
    assert {r["reason"] for r in rows if r["status"] == "error"} == {"Boom: not an Exception"}
    assert "Traceback" not in capsys.readouterr().err
    assert command == "check" or (tmp_path / "r.html").is_file()


MOVES = """
import os

from treebench.backends.reference import ReferenceBackend


class Moves(ReferenceBackend):
    name = "moves"

    def prepare(self, inputs):
        os.chdir({elsewhere!r})
        return super().prepare(inputs)


class Stays(ReferenceBackend):
    name = "stays"
"""


@pytest.mark.parametrize("command, isolate", [("run", False), ("run", True), ("check", False)])
def test_a_backend_that_changes_directory_moves_no_output(tmp_path, monkeypatch, capsys, command, isolate):
    """Rows, env file, lock and report go where the command line said, relative to where it started,
    whatever directory a backend moves to; the lines name them as given. An isolated worker moves
    back after each pair, so a backend given by a relative path loads in it all the same."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "moves.py").write_text(MOVES.format(elsewhere=str(elsewhere)))
    (tmp_path / "s.toml").write_text(tiny_suite())
    monkeypatch.chdir(tmp_path)
    argv = [command, "--suite", "s.toml", "--out", "r.jsonl", "--quiet"] + (["--isolate"] if isolate else [])
    if command == "run":
        argv += ["--backends", "moves.py:Moves,moves.py:Stays", "--report", "r.html"]
    else:
        argv += ["--backend", "moves.py:Moves"]
    assert main(argv) == 0
    assert sorted(p.name for p in elsewhere.iterdir()) == []
    names = {p.name for p in tmp_path.iterdir()}
    assert {"r.jsonl", "moves.py", "s.toml"} <= names and "r.jsonl.lock" not in names
    assert any(n.startswith("env-") for n in names) and ("r.html" in names) == (command == "run")
    assert [r["status"] for r in read_rows([tmp_path / "r.jsonl"])] == ["pass"] * (2 if command == "run" else 1)
    if command == "run":
        assert "rows: r.jsonl\nreport: r.html" in capsys.readouterr().out
        page = (tmp_path / "r.html").read_text()     # the header names the file as given, the meta tag in full
        assert "from <code>r.jsonl</code>" in page and str(tmp_path / "r.jsonl") not in page.split("<body")[1]
        assert report_results(tmp_path / "r.html") == [str((tmp_path / "r.jsonl").resolve())]


@pytest.mark.parametrize("command", ["run", "check"])
@pytest.mark.parametrize("given_out", [True, False])
def test_a_shard_without_cases_writes_nothing(tmp_path, monkeypatch, capsys, caplog, command, given_out):
    """--shard 5/7 of a 2-case suite runs nothing and writes nothing (no results file, env file, lock or
    report, default paths included), names no file, and exits 0 with one warning."""
    (tmp_path / "s.toml").write_text(tiny_suite(context_lens=(8, 9)))
    monkeypatch.chdir(tmp_path)
    argv = [command, "--suite", "s.toml", "--shard", "5/7", "--quiet"] + (["--out", "r.jsonl"] if given_out else [])
    argv += ["--backends", "reference"] + (["--report", "r.html"] if given_out else []) if command == "run" else \
        ["--backend", "reference"]
    assert main(argv) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]
    assert "rows:" not in capsys.readouterr().out
    assert "no case of suite tiny falls to --shard 5/7 (2 cases)" in caplog.text


def _env_id() -> str:
    from treebench.harness.store.env import env_fingerprint

    return env_fingerprint("cpu")["env_id"]


@pytest.mark.parametrize("text", ["{broken\n", '{"env_id": "ffffffffffff", "x": 1}', '{"env_id": "ID"}',
                                  '{"env_id": "ID", "x": 1}'])
def test_a_run_writes_its_own_env_file_again_where_it_holds_no_fingerprint(tmp_path, monkeypatch, caplog, text):
    """env-<this run's env id>.json beside --out that is not JSON, or JSON with another env_id or without
    the fields its id hashes, is written again from the run's fingerprint (its name is the hash of what
    it held), with a warning; the run and its report go on."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(tiny_suite())
    env_file = tmp_path / f"env-{_env_id()}.json"
    env_file.write_text(text.replace("ID", _env_id()))
    assert main(["run", "--suite", "s.toml", "--backends", "reference", "--out", "r.jsonl", "--report", "r.html",
                 "--quiet"]) == 0
    assert json.loads(env_file.read_text())["env_id"] == read_rows(["r.jsonl"])[0]["env"] == _env_id()
    (warning,) = [m for m in caplog.messages if "written again" in m]
    assert (tmp_path / "r.html").is_file() and warning.startswith(f"env file {env_file.name}: "), warning
    assert json.loads(env_file.read_text()) == {**env_fingerprint("cpu"), "peak_bw_bytes_per_s": None}


def test_a_run_keeps_its_own_env_file_where_it_holds_this_fingerprint(tmp_path, caplog):
    """env-<id>.json holding this run's fingerprint (the peaks measured another time) is kept as it is."""
    (tmp_path / "s.toml").write_text(tiny_suite())
    env_file = tmp_path / f"env-{_env_id()}.json"
    env_file.write_text(json.dumps({**env_fingerprint("cpu"), "peak_bw_bytes_per_s": 7.0}))
    before = env_file.read_bytes()
    assert main(["check", "--suite", str(tmp_path / "s.toml"), "--backend", "reference", "--out",
                 str(tmp_path / "r.jsonl"), "--quiet"]) == 0
    assert env_file.read_bytes() == before and "written again" not in caplog.text


@pytest.mark.parametrize("command", ["run", "check"])
def test_a_folder_named_as_the_own_env_file_is_refused_before_any_pair(tmp_path, monkeypatch, capsys, command):
    """A folder named env-<this run's env id>.json beside --out is refused in one line, exit 2, before
    any pair runs: nothing is written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(tiny_suite())
    (tmp_path / f"env-{_env_id()}.json").mkdir()
    argv = [command, "--suite", "s.toml", "--out", "r.jsonl", "--quiet"]
    argv += ["--backends", "reference", "--report", "r.html"] if command == "run" else ["--backend", "reference"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(tmp_path) not in err, err
    assert f"error: --out r.jsonl: env file env-{_env_id()}.json: a folder, where the env fingerprint" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"env-{_env_id()}.json", "s.toml"]


@pytest.mark.parametrize("text", ["{broken\n", "[1, 2]\n", "\xff\n",
                                  '{"env_id": "0123456789ab", "torch_threads": 0}\n'])
@pytest.mark.parametrize("command", ["run", "check"])
def test_a_run_refuses_an_env_file_beside_out_its_report_could_not_read_before_writing(tmp_path, monkeypatch, capsys,
                                                                                       text, command):
    """Another env file beside --out that holds no fingerprint (or a field no run writes) is refused in one
    line, exit 2, before any pair runs (by check too: report, gate and merge read its rows with that folder's env files): no
    results file, env file, lock or report is left, and that file is kept as it was."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(tiny_suite())
    other = tmp_path / "env-0123456789ab.json"
    other.write_bytes(text.encode("latin-1"))
    argv = [command, "--suite", "s.toml", "--out", "r.jsonl", "--quiet"]
    argv += ["--backends", "reference", "--report", "r.html"] if command == "run" else ["--backend", "reference"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and str(tmp_path) not in err, err
    assert f"error: --out r.jsonl: env file {other.name} beside it: " in err, err
    assert "remove or repair it, or give an --out in another folder" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == [other.name, "s.toml"]
    assert other.read_bytes() == text.encode("latin-1")


@pytest.mark.parametrize("command", ["report", "gate"])
def test_report_and_gate_name_an_env_file_that_holds_no_fingerprint_in_one_line(tmp_path, capsys, command):
    (tmp_path / "s.toml").write_text(tiny_suite())
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        assert main(["check", "--suite", str(tmp_path / "s.toml"), "--backend", "reference", "--out",
                     str(tmp_path / name / "r.jsonl"), "--quiet"]) == 0
    broken = tmp_path / "b" / f"env-{_env_id()}.json"
    broken.write_text("{broken\n")
    capsys.readouterr()
    argv = (["report", str(tmp_path / "b" / "r.jsonl"), "-o", str(tmp_path / "r.html")] if command == "report" else
            ["gate", "--baseline", str(tmp_path / "a" / "r.jsonl"), "--candidate", str(tmp_path / "b" / "r.jsonl")])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [   # led by the command and the side that read it
        f"treebench: error: {'report' if command == 'report' else 'gate --candidate'}: env file {broken}: not JSON "
        "(JSONDecodeError: Expecting property name enclosed in "
        "double quotes: line 1 column 2 (char 1)); remove or repair it (a run on the machine it describes "
        "writes it again beside its results)"]


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("where", ["append_rows", "fsync"])
@pytest.mark.parametrize("existed", [False, True])
def test_an_interrupted_merge_writes_nothing(tmp_path, monkeypatch, capsys, where, existed):
    """Ctrl-C while merge appends its rows (before the write, or after it, before the fsync) leaves OUT as
    it was: removed with the folder made for it when the merge created them, else byte for byte as
    before; no env file is left beside it; the line says nothing was written."""
    import treebench.harness.store.merge as merge
    import treebench.harness.store.torn as torn

    (tmp_path / "s.toml").write_text(tiny_suite())
    big = tmp_path / "in" / "big.jsonl"
    big.parent.mkdir()
    assert main(["check", "--suite", str(tmp_path / "s.toml"), "--backend", "reference", "--out", str(big),
                 "--quiet"]) == 0
    new = tmp_path / "made" / "NEW.jsonl"
    if existed:   # rows of another env: the merge appends every row of big.jsonl
        new.parent.mkdir()
        new.write_text("".join(json.dumps({**r, "env": "e" * 12}) + "\n" for r in read_rows([big])))
    before = new.read_bytes() if existed else None
    monkeypatch.setattr(merge if where == "append_rows" else torn, where, _interrupt)
    capsys.readouterr()
    assert main(["merge", str(new), str(big)]) == 130
    assert capsys.readouterr().err.strip() == "treebench: interrupted; nothing was written"
    if existed:
        assert [p.name for p in new.parent.iterdir()] == ["NEW.jsonl"] and new.read_bytes() == before
    else:
        assert not new.parent.exists()


def test_an_interrupted_merge_takes_back_an_env_file_its_out_lacked(tmp_path, monkeypatch, capsys):
    """OUT already holds rows of the input's env but not its env file: a merge stopped while appending
    leaves no env file it copied beside OUT, as the line says (nothing was written)."""
    import treebench.harness.store.merge as merge

    (tmp_path / "s.toml").write_text(tiny_suite(context_lens=(8, 9)))
    big = tmp_path / "in" / "big.jsonl"
    big.parent.mkdir()
    assert main(["check", "--suite", str(tmp_path / "s.toml"), "--backend", "reference", "--out", str(big),
                 "--quiet"]) == 0
    new = tmp_path / "made" / "NEW.jsonl"
    new.parent.mkdir()
    new.write_text(json.dumps(read_rows([big])[0]) + "\n")   # one row of the env; its env file not copied
    before = new.read_bytes()
    monkeypatch.setattr(merge, "append_rows", _interrupt)
    capsys.readouterr()
    assert main(["merge", str(new), str(big)]) == 130
    assert capsys.readouterr().err.strip() == "treebench: interrupted; nothing was written"
    assert [p.name for p in new.parent.iterdir()] == ["NEW.jsonl"] and new.read_bytes() == before


def test_a_worker_reports_what_escaped_a_task_as_its_error_row(monkeypatch):
    """Whatever escapes the serving of a task in an isolated worker (the harness's own failure, since a
    backend's raise is its row already) is that pair's error row naming it: the worker answers and goes on."""
    import multiprocessing
    import signal

    from treebench.harness.run import isolate

    def fails(self, task):
        raise asyncio.CancelledError("while serving")
    monkeypatch.setattr(isolate._WorkerState, "serve", fails)
    monkeypatch.setattr(signal, "signal", lambda *args: None)   # worker_main's SIGINT setting: not this process's
    parent, child = multiprocessing.Pipe()
    parent.send(isolate.Task(CASE.axes, "reference", "reference", "cpu", CFG))
    parent.send(None)
    isolate.worker_main(child, "cpu", 30)
    assert parent.recv()[0] == "ready"
    kind, row, lost = parent.recv()
    assert (kind, row["backend"], row["status"], lost) == ("row", "reference", "error", False)
    assert row["reason"] == "the isolated worker failed: CancelledError: while serving"
