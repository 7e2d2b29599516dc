"""Output where standard output cannot encode every character treebench prints (`PYTHONIOENCODING=ascii`,
`cp1252`: a CI log, an old console): each character it lacks is written as a backslash escape, never a
UnicodeEncodeError traceback and exit 1 (which a gate's caller would read as a failed gate); a failed write of
a file names the file; a report prints no multi-line Python warning of its libraries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from treebench.harness.cli.main import COMMANDS
from treebench.harness.store.rows import read_rows

from tests.tiny_suites import tiny_suite

ROOT = Path(__file__).resolve().parent.parent
ENCODINGS = ("ascii", "cp1252")


def treebench(*argv, cwd: Path, encoding: str = "utf-8") -> subprocess.CompletedProcess:
    """`python -m treebench ARGV` in `cwd` with standard output and error in `encoding`; output kept as bytes
    read back as UTF-8 with escapes (what the console would show is no concern here)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "PYTHONIOENCODING", "PYTHONUTF8")}
    env |= {"PYTHONPATH": str(ROOT), "PYTHONIOENCODING": encoding}
    done = subprocess.run([sys.executable, "-m", "treebench", *map(str, argv)], cwd=cwd, env=env,
                          capture_output=True, timeout=300, check=False)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode("utf-8", "backslashreplace"),
                                       done.stderr.decode("utf-8", "backslashreplace"))


def no_traceback(done: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in done.stderr and "Error:" not in done.stderr, done.stderr
    assert "Warning:" not in done.stderr, done.stderr   # a library's warning, printed with its source line


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """A folder with tiny.toml and base.jsonl, a run of torch_sdpa on its one case, with its env file."""
    d = tmp_path_factory.mktemp("runs")
    (d / "tiny.toml").write_text(tiny_suite())
    done = treebench("run", "--suite", "tiny.toml", "--backends", "torch_sdpa", "--out", "base.jsonl",
                     "--report", "base.html", "--quiet", cwd=d)
    assert done.returncode == 0, done.stderr
    return d


def candidate(runs: Path, name: str, slower: float) -> Path:
    """base.jsonl's rows as another run (`name`.jsonl), each sample `slower` times the baseline's."""
    rows = read_rows(runs / "base.jsonl")
    for r in rows:
        r["run_id"] = r["run_id"] + "-" + name
        r["samples_us"] = [s * slower for s in r["samples_us"]]
        r["median_us"] *= slower
    path = runs / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("slower, code, verdict", [(1.0, 0, "PASS"), (10.0, 1, "FAIL")])
def test_gate_prints_its_verdict_in_any_stdout_encoding(runs, encoding, slower, code, verdict):
    cand = candidate(runs, f"c{slower:g}", slower)
    done = treebench("gate", "--baseline", "base.jsonl", "--candidate", cand.name, cwd=runs, encoding=encoding)
    no_traceback(done)
    assert done.returncode == code, done.stderr
    assert verdict in done.stdout


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_run_into_a_path_stdout_cannot_encode_prints_its_summary_escaped(runs, encoding):
    out = f"op-{encoding}/é\u0436.jsonl"   # é: not ASCII; ж: not cp1252 either
    done = treebench("run", "--suite", "tiny.toml", "--backends", "torch_sdpa", "--out", out,
                     "--report", f"{encoding}.html", cwd=runs, encoding=encoding)
    no_traceback(done)
    assert done.returncode == 0, done.stderr
    assert len(read_rows(runs / out)) == 1
    assert "\\u0436.jsonl" in done.stdout


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_every_help_prints_in_any_stdout_encoding(tmp_path, encoding, command):
    done = treebench(*([command] if command else []), "--help", cwd=tmp_path, encoding=encoding)
    no_traceback(done)
    assert done.returncode == 0 and "usage:" in done.stdout


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_report_prints_in_any_stdout_encoding(runs, encoding):
    done = treebench("report", "base.jsonl", "-o", f"rép-\u0436-{encoding}.html", cwd=runs, encoding=encoding)
    no_traceback(done)
    assert done.returncode == 0 and (runs / f"rép-\u0436-{encoding}.html").stat().st_size > 0


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_gate_summary_that_cannot_be_written_is_named(runs):
    cand = candidate(runs, "full", 1.0)
    done = treebench("gate", "--baseline", "base.jsonl", "--candidate", cand.name, "--summary", "/dev/full",
                     cwd=runs)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "treebench: error: gate: cannot write /dev/full: No space left on device; choose another path"]


@pytest.mark.parametrize("change", [{"median_us": 1e308}, {"backend": "torch\u4e00sdpa"},
                                    {"median_us": 1e308, "samples_us": [1e308] * 5}])
def test_a_report_of_extreme_rows_prints_no_library_warning(runs, change):
    rows = read_rows(runs / "base.jsonl")
    path = runs / "extreme.jsonl"
    path.write_text("".join(json.dumps(r | change) + "\n" for r in rows)
                    + "".join(json.dumps(r | {"backend": "other"}) + "\n" for r in rows))
    done = treebench("report", path.name, "-o", "extreme.html", cwd=runs)
    no_traceback(done)
    assert done.returncode == 0, done.stderr
    assert all(line.startswith(("INFO", "WARNING", " ")) for line in done.stderr.splitlines()), done.stderr
