"""Regressions from the new-user robustness test: mutating backends, resume of check rows,
sys.exit in a backend, duplicate names, huge axes, overflowing trees, non-UTF-8 suites,
unnamed backends, unprintable exceptions, availability order, a JSONL file of something else."""

from __future__ import annotations

from dataclasses import replace

import json
import logging
import os
import signal
import sys
import time

import pytest

from treebench.harness.adapter.contract import Backend, check_unique_names
from treebench.harness.run.loading import load_backend
from treebench.harness.model.cases import Case
from treebench.harness.errors import ConfigError, TreeError
from treebench.harness.run.pair import error_reason
from treebench.harness.run.config import RunConfig
from treebench.harness.run.runner import row_satisfies, run_cases
from treebench.harness.store.rows import read_rows
from treebench.harness.model.tree_specs import parse_tree
from tests.broken_backends import BrokenCausalMask, Correct
from tests.tiny_suites import tiny_suite

CASE = Case(batch_size=2, context_len=5, tree="chain:2", num_q_heads=2, num_kv_heads=1, head_dim=8,
            dtype="float32", page_size=4)
CFG = RunConfig(mode="check", device="cpu", quiet=True, check_memory=False)


class Mutates(Correct):
    name = "mutates"

    def prepare(self, inputs):
        fn = super().prepare(inputs)

        def run():
            out = fn()
            inputs.q.zero_()
            inputs.k_cache.zero_()
            return out
        return run


class Exits(Correct):
    name = "exits"

    def prepare(self, inputs):
        sys.exit(3)


class Interrupts(Correct):
    """A Ctrl-C while it prepares: SIGINT sent to this process, raised by the handler in place."""

    name = "interrupts"

    def prepare(self, inputs):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)


class RaisesKeyboardInterrupt(Correct):
    """Raises KeyboardInterrupt itself, with no SIGINT (a library's own misuse of it)."""

    name = "raises_keyboard_interrupt"

    def __init__(self, where: str = "prepare"):
        self.where = where

    def availability(self):
        if self.where == "availability":
            raise KeyboardInterrupt
        return None

    def prepare(self, inputs):
        if self.where == "prepare":
            raise KeyboardInterrupt("not a Ctrl-C")
        fn = super().prepare(inputs)
        calls = []

        def run():   # the first call (the check's) answers; a timed one raises
            calls.append(1)
            if len(calls) > 1:
                raise KeyboardInterrupt
            return fn()
        return run


class _BadStr(Exception):
    def __str__(self):
        raise RuntimeError("no str")


class BadStr(Correct):
    name = "badstr"

    def prepare(self, inputs):
        raise _BadStr()


def test_mutating_backend_is_error_and_next_backend_gets_fresh_inputs():
    rows = run_cases([CASE], [Mutates(), Correct()], CFG)
    assert rows[0]["status"] == "error" and "mutated its inputs" in rows[0]["reason"]
    assert "q" in rows[0]["reason"] and "k_cache" in rows[0]["reason"]
    assert rows[1]["status"] == "pass"


def test_mutating_backend_is_flagged_under_isolate():
    rows = run_cases([CASE], [Mutates(), Correct()], RunConfig(mode="check", device="cpu", quiet=True,
                                                               check_memory=False, isolate=True))
    assert rows[0]["status"] == "error" and "mutated its inputs" in rows[0]["reason"]
    assert rows[1]["status"] == "pass"


def test_row_satisfies_only_timed_rows_in_run_mode():
    assert not row_satisfies({"status": "pass", "median_us": None}, "run")
    assert row_satisfies({"status": "pass", "median_us": 3.0}, "run")
    assert row_satisfies({"status": "error", "median_us": None}, "run")
    assert row_satisfies({"status": "skipped"}, "run")
    assert row_satisfies({"status": "pass", "median_us": None}, "check")


def test_sys_exit_in_backend_is_error_row_and_keyboard_interrupt_stops():
    rows = run_cases([CASE], [Exits(), Correct()], CFG)
    assert rows[0]["status"] == "error" and rows[0]["reason"] == "backend called sys.exit(3)"
    assert rows[1]["status"] == "pass"
    with pytest.raises(KeyboardInterrupt):
        run_cases([CASE], [Interrupts()], CFG)


@pytest.mark.parametrize("isolate", [False, True])
def test_a_keyboard_interrupt_no_signal_raised_is_an_error_row_and_the_sweep_goes_on(isolate):
    """A KeyboardInterrupt that a backend raises with no SIGINT is its error row, saying no Ctrl-C raised it,
    in the process as in an isolated worker; the next backend runs."""
    rows = run_cases([CASE], [RaisesKeyboardInterrupt(), Correct()], replace(CFG, isolate=isolate))
    assert [r["status"] for r in rows] == ["error", "pass"]
    assert rows[0]["reason"] == "KeyboardInterrupt (raised by the backend, not by a Ctrl-C): not a Ctrl-C"


@pytest.mark.parametrize("where, reason", [
    ("availability", "availability() raised KeyboardInterrupt (raised by the backend, not by a Ctrl-C)"),
    ("timed call", "while timing: KeyboardInterrupt (raised by the backend, not by a Ctrl-C)")])
def test_a_keyboard_interrupt_no_signal_raised_in_availability_or_a_timed_call_is_an_error_row(where, reason):
    rows = run_cases([CASE], [RaisesKeyboardInterrupt(where), Correct()], replace(CFG, mode="run"))
    assert [(r["status"], r["reason"]) for r in rows] == [("error", reason), ("pass", None)]


def test_a_ctrl_c_a_backend_swallowed_stops_the_sweep_after_its_pair(tmp_path):
    """A SIGINT whose KeyboardInterrupt a backend catches and drops: the runner raises it after that pair,
    whose row is kept, and puts the SIGINT handler back."""
    class Swallows(Correct):
        name = "swallows"

        def prepare(self, inputs):
            try:
                Interrupts().prepare(inputs)
            except KeyboardInterrupt:
                pass
            return super().prepare(inputs)

    before = signal.getsignal(signal.SIGINT)
    out = tmp_path / "rows.jsonl"
    with pytest.raises(KeyboardInterrupt):
        run_cases([CASE], [Swallows(), Correct()], replace(CFG, store_path=out))
    assert [r["backend"] for r in read_rows([out])] == ["swallows"]
    assert signal.getsignal(signal.SIGINT) is before


def test_duplicate_backend_names_are_refused():
    assert BrokenCausalMask.name != Correct.name
    with pytest.raises(ConfigError, match="'correct'"):
        check_unique_names([Correct(), Correct()])
    with pytest.raises(ConfigError):
        run_cases([CASE], [Correct(), Correct()], CFG)


@pytest.mark.parametrize("field,value", [("batch_size", 10**9), ("head_dim", 2048), ("page_size", 8192),
                                         ("num_q_heads", 4096), ("context_len", 2**25),
                                         ("context_len", "ragged:1-100000000")])
def test_huge_axes_are_config_errors(field, value):
    axes = dict(CASE.axes, **{field: value})
    with pytest.raises(ConfigError, match="limit"):
        Case(**axes)


@pytest.mark.parametrize("spec", ["chain:99999999999999999999", "full:1:99999999999999999999"])
def test_overflowing_tree_is_tree_error(spec):
    with pytest.raises(TreeError):
        parse_tree(spec)


def test_non_utf8_suite_is_config_error(tmp_path):
    from treebench.harness.model.suites import load_suite

    p = tmp_path / "bad.toml"
    p.write_bytes(b"[suite]\nname = \"\xff\xfe\"\n")
    with pytest.raises(ConfigError, match="UTF-8"):
        load_suite(str(p))


def test_backend_without_string_name_is_config_error(tmp_path):
    f = tmp_path / "b.py"
    f.write_text("from tests.broken_backends import Correct\n"
                 "class NoName(Correct):\n    name = None\n"
                 "class EmptyName(Correct):\n    name = ''\n")
    for cls in ("NoName", "EmptyName"):
        with pytest.raises(ConfigError, match="name"):
            load_backend(f"{f}:{cls}")


def test_a_folder_named_without_a_slash_is_a_directory_not_a_module(tmp_path, monkeypatch):
    """`--backend somedir:X` imports somedir/ (no __init__.py) as a namespace package: the folder in the working
    directory is what the user meant, so it is refused as a directory; a namespace package found elsewhere on the
    path is a module without the class."""
    (tmp_path / "work" / "tb_somedir").mkdir(parents=True)
    (tmp_path / "lib" / "tb_nsonly").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.syspath_prepend(str(tmp_path / "work"))       # as '' is under `python -m treebench`
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    try:
        with pytest.raises(ConfigError, match=r"^--backend 'tb_somedir:X': tb_somedir is a directory; "
                                              r"give a Python file, PATH.py:Class$"):
            load_backend("tb_somedir:X")
        with pytest.raises(ConfigError, match="tb_nsonly has no class X"):
            load_backend("tb_nsonly:X")
    finally:
        for name in ("tb_somedir", "tb_nsonly"):
            sys.modules.pop(name, None)


def test_unprintable_exception_still_gives_a_reason():
    assert error_reason(_BadStr()).startswith("_BadStr")
    rows = run_cases([CASE], [BadStr()], CFG)
    assert rows[0]["status"] == "error" and rows[0]["reason"].startswith("_BadStr")


def test_unprintable_exception_under_isolate():
    rows = run_cases([CASE], [BadStr()], RunConfig(mode="check", device="cpu", quiet=True,
                                                   check_memory=False, isolate=True))
    assert rows[0]["status"] == "error" and rows[0]["reason"].startswith("_BadStr"), rows[0]["reason"]


class PreparesNothing(Correct):
    """prepare returns `PREPARED` instead of the callable that is timed (a forgotten `return fn`)."""

    name = "prepares_nothing"

    def __init__(self, prepared=None):
        self.prepared = prepared

    def prepare(self, inputs):
        return self.prepared


@pytest.mark.parametrize("isolate", [False, True])
@pytest.mark.parametrize("prepared, what", [(None, "None"), ((1, 2), "a value of type tuple"),
                                            (37, "a value of type int")])
def test_a_prepare_returning_no_callable_is_an_error_row_that_says_so(isolate, prepared, what):
    rows = run_cases([CASE], [PreparesNothing(prepared), Correct()], replace(CFG, isolate=isolate))
    assert [r["status"] for r in rows] == ["error", "pass"]
    assert rows[0]["reason"] == (f"TypeError: the backend's prepare returned {what}, not a callable: "
                                 "prepare(inputs) returns the zero-argument callable that is timed"), rows[0]["reason"]


def test_availability_reports_missing_package_before_device():
    class NeedsPkg(Backend):
        name = "needspkg"
        install_hint = "pip install nothere"
        from treebench.harness.adapter.contract import Capabilities
        capabilities = Capabilities(devices=("cuda",))

        def load_optional(self):
            raise ImportError("No module named 'nothere'")

    assert NeedsPkg().availability().startswith("pip install nothere")


def test_run_resume_reruns_untimed_check_rows(tmp_path):
    """A `check` row (no timings) does not satisfy `run --resume`; it does satisfy `check --resume`."""
    from treebench.harness.cli.main import main
    from treebench.harness.store.rows import read_rows

    out = tmp_path / "r.jsonl"
    assert main(["check", "--suite", "smoke", "--backend", "reference", "--out", str(out), "--quiet"]) == 0
    n_check = len(read_rows([out]))
    assert main(["check", "--suite", "smoke", "--backend", "reference", "--out", str(out), "--resume",
                 "--quiet"]) == 0
    assert len(read_rows([out])) == n_check
    assert main(["run", "--suite", "smoke", "--backends", "reference", "--out", str(out), "--resume",
                 "--report", str(tmp_path / "r.html"), "--quiet"]) == 0
    rows = read_rows([out])
    assert len(rows) == 2 * n_check and all(r["median_us"] is not None for r in rows[n_check:])


def test_run_prints_its_run_id_which_rm_takes(tmp_path, capsys):
    """`run` ends by naming its run_id, rows and report: the id `treebench rm --run-id` takes to
    remove this run from a results file it was appended to."""
    from treebench.harness.cli.main import main
    from treebench.harness.store.rows import read_rows

    out = tmp_path / "r.jsonl"
    for _ in range(2):
        assert main(["run", "--suite", "smoke", "--backends", "reference", "--out", str(out), "--report",
                     str(tmp_path / "r.html")]) == 0
    lines = capsys.readouterr().out.splitlines()
    ids = [ln.removeprefix("run_id: ") for ln in lines if ln.startswith("run_id: ")]
    reports = [ln for ln in lines if ln.startswith("report: ")]     # the second names the first run's rows
    assert "earlier" not in reports[0] and \
        f"holds {len(read_rows([out])) // 2} rows of earlier runs: treebench report {out}" in reports[1]
    rows = read_rows([out])
    assert len(ids) == 2 and ids[0] != ids[1] and [r["run_id"] for r in rows] == \
        [ids[0]] * (len(rows) // 2) + [ids[1]] * (len(rows) // 2)
    assert main(["rm", str(out), "--run-id", ids[0]]) == 0
    assert {r["run_id"] for r in read_rows([out])} == {ids[1]}


def test_run_summary_counts_the_earlier_rows_held_while_it_wrote(tmp_path, capsys, monkeypatch):
    """Rows another run appends once this run has released --out (before its summary) are not
    counted as rows of earlier runs: the count is taken while this run holds the file."""
    import json

    from treebench.harness.cli import run as run_cli
    from treebench.harness.cli.main import main
    from treebench.harness.store.lock import lock_path
    from treebench.harness.store.rows import append_row, read_rows

    out = tmp_path / "r.jsonl"
    real = run_cli._write_report

    def later_run_appends(rows, out_path, report, title, *shown):
        assert not lock_path(out_path).exists()           # released: another run may write now
        for row in read_rows([out_path]):
            append_row(out_path, json.loads(json.dumps(row)) | {"run_id": "later"})
        return real(rows, out_path, report, title, *shown)
    monkeypatch.setattr(run_cli, "_write_report", later_run_appends)
    assert main(["run", "--suite", "smoke", "--backends", "reference", "--out", str(out), "--report",
                 str(tmp_path / "r.html")]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("report: ")]
    assert line == f"report: {tmp_path / 'r.html'}" and "later" in {r["run_id"] for r in read_rows([out])}


def test_a_wrapped_compiler_error_keeps_its_cause_below_the_banner():
    # the shape of inductor's message around a failed CuteDSL build: the cause sits below a banner
    e = RuntimeError("LoweringException: RuntimeError: CuteDSL template failed: " + "=" * 80 + "\n"
                     "Traceback (most recent call last):\n  File \"x.py\", line 3, in build\n"
                     "DSLRuntimeError: mask_mod aux tensor of rank 2 is not supported\n" + "=" * 80 + "\n"
                     "  target: flex_attention\n")
    r = error_reason(e)
    assert r.startswith("RuntimeError: LoweringException: RuntimeError: CuteDSL template failed")
    assert r.endswith("... DSLRuntimeError: mask_mod aux tensor of rank 2 is not supported"), r
    assert "====" not in r


def test_a_one_line_error_reason_is_unchanged_and_a_long_one_is_capped():
    assert error_reason(ValueError("bad page size")) == "ValueError: bad page size"
    assert error_reason(ValueError("first\n\n  second line here")) == "ValueError: first"
    assert error_reason(ValueError("build failed:\n  ptxas: out of registers")) == \
        "ValueError: build failed: ... ptxas: out of registers"
    r = error_reason(ValueError("x" * 5000))
    assert len(r) == 600 and r.endswith("...")


def test_a_long_opening_line_is_cut_and_the_cause_kept():
    e = RuntimeError("LoweringException: " + "x" * 900 + " failed:\n" + "=" * 40 + "\nDSLRuntimeError: the cause")
    r = error_reason(e)
    assert len(r) <= 600 and r.endswith("... DSLRuntimeError: the cause"), r


def test_a_chained_cause_and_unprintable_characters_reach_the_reason():
    try:
        try:
            raise ValueError("the real cause")
        except ValueError as inner:
            raise RuntimeError("kernel launch failed") from inner
    except RuntimeError as e:
        assert error_reason(e) == "RuntimeError: kernel launch failed (from ValueError: the real cause)"
    r = error_reason(RuntimeError("bad\x00byte \x1b[31mred \ud800 surrogate"))
    assert r == "RuntimeError: bad\\x00byte \\x1b[31mred \\ud800 surrogate"
    r.encode("utf-8")                                    # printable, a JSON row and a terminal take it
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a                      # a cycle ends
    assert error_reason(a).count("(from") == 3


@pytest.mark.parametrize("reader", [
    ["report", "{f}", "-o", "{tmp}/r.html"],
    ["report", "{good}", "--against", "{f}", "-o", "{tmp}/r.html"],
    ["gate", "--baseline", "{f}", "--candidate", "{good}"],
    ["merge", "{tmp}/m.jsonl", "{f}"],
])
def test_a_jsonl_file_of_something_else_is_named_as_such(tmp_path, capsys, reader):
    """Rows without a schema field are not a treebench results file: every reader says so in one
    line (exit 2) instead of speaking of schema None."""
    from treebench.harness.cli.main import main
    from treebench.harness.store.rows import SCHEMA, append_row

    f, good = tmp_path / "x.jsonl", tmp_path / "good.jsonl"
    f.write_text('{"x": 1}\n')
    append_row(good, {"schema": SCHEMA, "run_id": "r", "env": "e", "case_id": "c", "backend": "b", "status": "pass",
                      "case": Case(batch_size=1, context_len=4, tree="chain:1").axes})
    argv = [a.format(f=f, good=good, tmp=tmp_path) for a in reader]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    led = {"report": "report", "merge": "merge", "gate": "gate --baseline"}[reader[0]]   # the command reading it
    led = "report --against" if "--against" in reader else led
    assert err == [(f"treebench: error: {led}: results file {f}: not a treebench results file (line 1 has no schema "
                    "field); give .jsonl files written by treebench run")], err


READERS = {   # each command that reads result files, given one file `{f}`: (its command line, what leads its lines)
    "report": (["report", "{f}", "-o", "{tmp}/r.html"], "report"),
    "report --against": (["report", "{good}", "--against", "{f}", "-o", "{tmp}/r.html", "--allow-env-mismatch"],
                         "report --against"),
    "gate --baseline": (["gate", "--baseline", "{f}", "--candidate", "{good}", "--allow-env-mismatch"],
                        "gate --baseline"),
    "gate --candidate": (["gate", "--baseline", "{good}", "--candidate", "{f}", "--allow-env-mismatch"],
                         "gate --candidate"),
    "merge": (["merge", "{tmp}/m.jsonl", "{f}"], "merge"),
    "plan": (["plan", "--results", "{f}", "--acceptance", "illustrative-geometric"], "plan"),
}


def _reader_row(run_id: str, backend: str = "b") -> dict:
    from treebench.harness.store.rows import SCHEMA

    return {"schema": SCHEMA, "run_id": run_id, "env": "e", "case_id": "c", "backend": backend, "status": "pass",
            "case": Case(batch_size=1, context_len=4, tree="chain:1").axes}


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize("second, said", [
    (b'{"schema": 99, "backend": "b"}', "results file {f}:2: schema 99, newer than this treebench reads (2)"),
    (b'{"schema": 2, "backend": "\xff"}', "results file {f}:2: byte 0xff at column 27 is not UTF-8 text"),
    (b"\xef\xbb\xbf" + json.dumps(_reader_row("r3")).encode(),   # a byte-order mark that only line 1 may hold
     "results file {f}:2: a byte-order mark (U+FEFF) at the start of line 2, where JSON reads none (only one "
     "before a file's first line is dropped); treebench writes UTF-8: edit or delete that line"),
    (json.dumps({k: v for k, v in _reader_row("r3").items() if k != "run_id"}).encode(),   # as a null one
     "results file {f}:2: field 'run_id' is missing; edit or delete that line"),
    (None, "results path {f}: not found"),
])
def test_a_readers_refusal_of_a_results_file_is_led_by_the_command_that_read_it(tmp_path, capsys, reader, second,
                                                                                said):
    """A row of a newer schema, a line that is not UTF-8 or opens with a byte-order mark after line 1, a schema-2
    row without a run_id, a path that is not there: the one line names the
    command (and the side, or the option) that read the file first, as that command's other lines do."""
    import json

    from treebench.harness.cli.main import main
    from treebench.harness.store.rows import append_row

    f, good = tmp_path / "x.jsonl", tmp_path / "good.jsonl"
    append_row(good, _reader_row("r1"))
    if second is not None:
        f.write_bytes(json.dumps(_reader_row("r2")).encode() + b"\n" + second + b"\n")
    argv, led = READERS[reader]
    assert main([a.format(f=f, good=good, tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"treebench: error: {led}: {said.format(f=f)}"), err
    assert not (tmp_path / "m.jsonl").exists() and not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("reader", list(READERS))
def test_a_readers_warnings_of_a_results_folder_are_led_by_the_command_that_read_it(tmp_path, capsys, reader):
    """A torn last line and a folder named *.jsonl inside a results folder: the one warning of each names the
    command (and the side) that read the folder first, as that command's other lines do."""
    import json

    from treebench.harness.cli.main import main
    from treebench.harness.store.rows import append_row

    folder, good = tmp_path / "runs", tmp_path / "good.jsonl"
    append_row(good, _reader_row("r1"))
    (folder / "stray.jsonl").mkdir(parents=True)
    (folder / "x.jsonl").write_text(json.dumps(_reader_row("r2", "b2")) + '\n{"schema": 2, "backend": "b')
    argv, led = READERS[reader]
    main([a.format(f=folder, good=good, tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err.splitlines()
    torn = [line for line in err if "skipping a torn or malformed result line" in line]
    stray = [line for line in err if "stray.jsonl is a folder" in line]
    assert torn == [f"WARNING  {led}: {folder / 'x.jsonl'}:2: skipping a torn or malformed result line"], err
    assert stray == [f"WARNING  {led}: results folder {folder}: {folder / 'stray.jsonl'} is a folder, not a results "
                     "file; skipped (folders are not searched recursively)"], err


def test_merge_into_an_out_ending_in_a_torn_line_says_so_led_by_merge(tmp_path, capsys):
    """OUT ending in part of a row: merge reads past it and sets it aside before appending, and both
    warnings are led by the command, as merge's other lines are."""
    import json

    from treebench.harness.cli.main import main
    from treebench.harness.store.rows import append_row, read_rows

    out, new = tmp_path / "out.jsonl", tmp_path / "new.jsonl"
    out.write_text(json.dumps(_reader_row("r1")) + '\n{"schema": 2, "backe')
    append_row(new, _reader_row("r2", "b2"))
    assert main(["merge", str(out), str(new)]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "torn" in line]
    assert err == [f"WARNING  merge: {out}:2: skipping a torn or malformed result line",
                   f"WARNING  merge: {out} ended in a torn line (20 bytes, a row cut short by a killed writer): moved "
                   f"to {out}.torn before appending"], err
    assert [r["run_id"] for r in read_rows([out])] == ["r1", "r2"]


@pytest.mark.parametrize("source, run_id, fix", [
    ("TREEBENCH_RUN_ID", "job42", "unset $TREEBENCH_RUN_ID (or set a new one) for a run of its own"),
    ("TORCHELASTIC_RUN_ID", "torchrun-job42",
     "give torchrun another --rdzv-id (or set $TREEBENCH_RUN_ID) for a run of its own"),
    (None, None, None)])
@pytest.mark.parametrize("resume", [False, True])
def test_a_run_id_given_again_for_one_out_is_warned_of(tmp_path, capsys, monkeypatch, source, run_id, fix, resume):
    """A run id from outside that already names rows in --out (the same job run twice): the second
    run warns in one line, names what the shared id costs and how to avoid it, and still appends; a
    --resume (which continues that run) and a run with a fresh id say nothing."""
    from treebench.harness.cli.main import main
    from treebench.harness.store.rows import read_rows

    for name in ("TREEBENCH_RUN_ID", "TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    if source:
        monkeypatch.setenv(source, "job42")
    monkeypatch.chdir(tmp_path)
    suite, out = tmp_path / "two.toml", "d/r.jsonl"
    suite.write_text(tiny_suite("two", (8, 12)))
    argv = ["check", "--suite", "two.toml", "--backend", "reference", "--out", out, "--quiet"]
    assert main([*argv, "--shard", "0/2"]) == 0
    assert capsys.readouterr().err == ""
    assert main([*argv, *(["--resume"] if resume else [])]) == 0
    err = capsys.readouterr().err.splitlines()
    rows = read_rows([out])
    assert len(rows) == (2 if resume else 3) and len({r["run_id"] for r in rows}) == (1 if source else 2)
    if resume or not source:
        assert err == [], err
        return
    named = f"${source}{' (torchrun --rdzv-id)' * (source != 'TREEBENCH_RUN_ID')}"
    assert err == [(f"WARNING  run id {run_id} ({named}) already names 1 row in {out}, written before this run "
                    f"started: its rows get the same id, so `treebench rm {out} --run-id {run_id}` removes both runs' "
                    "rows, and gate and report read both runs' rows of a pair (the gate compares the later); "
                    f"{fix}, or add --resume to continue that run")], err


def test_a_check_then_a_run_resumed_under_one_run_id_keeps_the_timed_rows(tmp_path, capsys, monkeypatch):
    """`check --out F` then `run --resume --out F` under one $TREEBENCH_RUN_ID: --resume does not skip the
    check's untimed rows, so the run measures those pairs again under the same id; it warns in one line
    saying so and how to keep them apart, and gate and report read the timed rows (not dropped as
    repeats of the untimed ones). A resume of the run itself says nothing."""
    from treebench.harness.store.validate import latest_rows
    from treebench.harness.cli.main import main
    from treebench.harness.store.validate import read_checked_rows

    for name in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TREEBENCH_RUN_ID", "job42")
    monkeypatch.chdir(tmp_path)
    suite, out = tmp_path / "two.toml", tmp_path / "r.jsonl"
    suite.write_text(tiny_suite("two", (8, 12)))
    assert main(["check", "--suite", str(suite), "--backend", "reference", "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    run = ["run", "--suite", str(suite), "--backends", "reference", "--out", str(out), "--resume", "--quiet"]
    assert main(run) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("WARNING")]
    assert err == [f"WARNING  run id job42 ($TREEBENCH_RUN_ID) already names 2 rows in {out} that --resume does not "
                   "skip (untimed rows of `treebench check`, or rows timed with another --timer or --l2): this run "
                   f"measures those pairs again under the same id, so `treebench rm {out} --run-id job42` removes the "
                   "rows of both, and gate and report read both (the gate compares the later); to keep them apart, "
                   "unset $TREEBENCH_RUN_ID (or set a new one) for a run of its own"], err
    for command in ("report", "gate --candidate"):
        rows = read_checked_rows([str(out)], command)
        assert len(rows) == 4 and sum(r["median_us"] is not None for r in rows) == 2
        assert all(r["median_us"] is not None for r in latest_rows(rows).values())
    assert main(run) == 0                                   # the run resumed: every pair stored, nothing to say
    assert "already names" not in capsys.readouterr().err
    assert len(read_checked_rows([str(out)], "report")) == 4


def test_a_run_id_given_in_code_again_is_warned_of_too(tmp_path, caplog):
    """An id a caller gave execute (not from the environment) that --out already holds: the same
    warning, with the fix that fits."""
    from treebench.harness.store.rows import SCHEMA, append_row
    from treebench.harness.sweep.execute import _warn_reused_run_id

    out = tmp_path / "r.jsonl"
    _warn_reused_run_id(out, "fixed")                                    # no file yet: nothing to say
    for run_id in ("fixed", "other", "fixed"):
        append_row(out, {"schema": SCHEMA, "run_id": run_id, "case_id": "c", "backend": "b", "status": "pass",
                         "case": {}})
    _warn_reused_run_id(out, "new")
    assert not caplog.records
    with caplog.at_level(logging.WARNING, logger="treebench"):
        _warn_reused_run_id(out, "fixed")
    (message,) = caplog.messages
    assert message.startswith(f"run id fixed already names 2 rows in {out}, ") and \
        message.endswith("; give this run another id, or add --resume to continue that run"), message
