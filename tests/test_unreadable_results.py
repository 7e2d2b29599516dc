"""A results file the file system will not let treebench read, or a folder of them it will not let
treebench list: every reader of the store (gate, report and its --against, merge, rm, plan, and run
or check appending to --out) says so in one line naming the path and the OS's reason, exit 2, never
a traceback; a folder that cannot be listed is not taken for an empty one ("no result rows").

Simulated in the process (open and os.listdir refused for one path, as a missing read permission
refuses them), and for real through file permissions where this user can be kept from reading a
file: any user but root, or root without CAP_DAC_OVERRIDE under setpriv."""

from __future__ import annotations

import builtins
import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny_suites import tiny_suite
from treebench.harness.cli.main import main
from treebench.harness.model.cases import Case
from treebench.harness.speculation.acceptance import shipped_models

ROOT = Path(__file__).resolve().parent.parent
DENIED = os.strerror(errno.EACCES)   # "Permission denied"
OUT_FIX = "make it readable: treebench reads the rows a results file holds before it writes to it"


def _row(case_id: str = "c1", median: float = 100.0) -> dict:
    samples = [median * (1 + 0.001 * i) for i in range(20)]
    return {"schema": 2, "run_id": "r1", "case_id": case_id, "backend": "k", "mask_kind": "tree",
            "case": Case(batch_size=1, context_len=16, tree="chain:3").axes, "tree_sizes": [4], "status": "pass",
            "reason": None, "timer": "cuda_graph", "l2_flushed": True, "median_us": median, "p25_us": median,
            "p75_us": median, "samples_us": samples}


def _write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _refuse(monkeypatch, refused: Path) -> None:
    """open(), os.listdir() and os.scandir() of `refused` raise PermissionError, as they do without read
    permission (the tests run as root too, which chmod would not stop)."""
    real_open, real_listdir, real_scandir = builtins.open, os.listdir, os.scandir

    def denied(path) -> bool:
        return isinstance(path, (str, os.PathLike)) and os.path.abspath(path) == str(refused)

    def open_(file, *args, **kwargs):
        if denied(file):
            raise PermissionError(errno.EACCES, DENIED, os.fspath(file))
        return real_open(file, *args, **kwargs)

    def listdir(path="."):
        if denied(path):
            raise PermissionError(errno.EACCES, DENIED, os.fspath(path))
        return real_listdir(path)

    def scandir(path="."):
        if denied(path):
            raise PermissionError(errno.EACCES, DENIED, os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(builtins, "open", open_)
    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(os, "scandir", scandir)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.mark.parametrize("command", ["gate --candidate", "gate --baseline", "report", "report --against", "merge",
                                     "plan"])
def test_an_unreadable_results_file_is_one_line_exit_2(tmp_path, monkeypatch, capsys, command):
    good, bad = _write(tmp_path / "a" / "good.jsonl", [_row()]), _write(tmp_path / "b" / "bad.jsonl", [_row()])
    html = tmp_path / "r.html"
    argv = {"gate --candidate": ["gate", "--baseline", good, "--candidate", bad],
            "gate --baseline": ["gate", "--baseline", bad, "--candidate", good],
            "report": ["report", bad, "-o", html],
            "report --against": ["report", good, "--against", bad, "-o", html],
            "merge": ["merge", tmp_path / "m.jsonl", bad],
            "plan": ["plan", "--results", bad, "--acceptance", shipped_models()[0]]}[command]
    _refuse(monkeypatch, bad)
    assert main(list(map(str, argv))) == 2
    assert _one_line(capsys) == (f"treebench: error: {command}: results file {bad}: cannot be read ({DENIED}); make it "
                                 "readable")   # led by the command reading it, as its other lines are
    assert not html.exists() and not (tmp_path / "m.jsonl").exists()


@pytest.mark.parametrize("command", ["report", "gate --candidate", "merge", "plan"])
def test_a_folder_of_results_that_cannot_be_listed_is_said_so_not_empty(tmp_path, monkeypatch, capsys, command):
    good, folder = _write(tmp_path / "good.jsonl", [_row()]), tmp_path / "runs"
    _write(folder / "c.jsonl", [_row()])
    argv = {"report": ["report", folder, "-o", tmp_path / "r.html"],
            "gate --candidate": ["gate", "--baseline", good, "--candidate", folder],
            "merge": ["merge", tmp_path / "m.jsonl", folder],
            "plan": ["plan", "--results", folder, "--acceptance", shipped_models()[0]]}[command]
    _refuse(monkeypatch, folder)
    assert main(list(map(str, argv))) == 2
    assert _one_line(capsys) == (f"treebench: error: {command}: results folder {folder}: cannot be listed ({DENIED}); "
                                 "make it readable")


@pytest.mark.parametrize("command", ["run --resume", "check", "merge OUT", "rm"])
def test_a_results_file_to_write_that_cannot_be_read_is_refused_before_anything_is_written(
        tmp_path, monkeypatch, capsys, command):
    """A write-only --out (or merge's OUT, or rm's file): its rows are read before rows are appended
    (--resume, a run id used again) or removed, so it is refused up front, the file left as it was."""
    suite = tmp_path / "tiny.toml"
    suite.write_text(tiny_suite())
    out, good = _write(tmp_path / "out.jsonl", [_row()]), _write(tmp_path / "in" / "good.jsonl", [_row("c2")])
    before = out.read_bytes()
    what, argv = {"run --resume": ("--out", ["run", "--suite", suite, "--backends", "reference", "--out", out,
                                             "--resume", "--quiet"]),
                  "check": ("--out", ["check", "--suite", suite, "--backend", "reference", "--out", out, "--quiet"]),
                  "merge OUT": ("merge OUT", ["merge", out, good]),
                  "rm": ("rm", ["rm", out, "--backend", "k"])}[command]
    _refuse(monkeypatch, out)
    assert main(list(map(str, argv))) == 2
    assert _one_line(capsys) == f"treebench: error: {what} {out}: cannot be read ({DENIED}); {OUT_FIX}"
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["in", "out.jsonl",
                                                                                        "tiny.toml"]


def _without_read_override() -> list[str]:
    """The prefix that runs a command as a user file permissions apply to: none for a user other than
    root; for root, setpriv dropping CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH. Skips where neither works."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search"] if setpriv else []
    if not prefix or subprocess.run([*prefix, "true"], capture_output=True, timeout=30).returncode != 0:
        pytest.skip("running as root, and setpriv cannot drop CAP_DAC_OVERRIDE here")
    return prefix


@pytest.mark.parametrize("what", ["file", "folder"])
def test_real_permissions_give_the_same_line(tmp_path, what):
    """`chmod 000` on a results file, or on a folder of them, read by the gate as a user meets it."""
    prefix = _without_read_override()
    good, folder = _write(tmp_path / "good.jsonl", [_row()]), tmp_path / "runs"
    bad = _write(folder / "c.jsonl", [_row()])
    shut = bad if what == "file" else folder
    shut.chmod(0)
    try:
        proc = subprocess.run([*prefix, sys.executable, "-m", "treebench", "gate", "--baseline", str(good),
                               "--candidate", str(bad if what == "file" else folder)], cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                              timeout=300, check=False)
    finally:
        shut.chmod(0o700)
    said = (f"gate --candidate: results file {bad}: cannot be read ({DENIED})" if what == "file" else
            f"gate --candidate: results folder {folder}: cannot be listed ({DENIED})")
    assert proc.returncode == 2 and proc.stderr.strip() == f"treebench: error: {said}; make it readable", proc.stderr


@pytest.mark.parametrize("command", ["run", "check", "report"])
def test_an_output_path_under_a_folder_that_cannot_be_searched_is_one_line(tmp_path, command):
    """--out or -o inside a folder at mode 000: pathlib's lookups raise there, so the path is refused
    in one line naming it, exit 2, and nothing is written."""
    prefix = _without_read_override()
    suite, shut = tmp_path / "tiny.toml", tmp_path / "shut"
    suite.write_text(tiny_suite())
    good = _write(tmp_path / "good.jsonl", [_row()])
    out = shut / ("r.html" if command == "report" else "x.jsonl")
    argv = {"run": ["run", "--suite", str(suite), "--backends", "reference", "--out", str(out), "--quiet"],
            "check": ["check", "--suite", str(suite), "--backend", "reference", "--out", str(out), "--quiet"],
            "report": ["report", str(good), "-o", str(out)]}[command]
    shut.mkdir()
    shut.chmod(0)
    try:
        proc = subprocess.run([*prefix, sys.executable, "-m", "treebench", *argv], cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                              timeout=300, check=False)
    finally:
        shut.chmod(0o700)
    flag = "report -o" if command == "report" else "--out"
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == (f"treebench: error: {flag} {out}: cannot be reached ({DENIED}: a folder above "
                                   "it cannot be searched); choose another path or fix its permissions"), proc.stderr
    assert list(shut.iterdir()) == []
