"""A sweep killed with SIGKILL loses at most the row in flight, and
`treebench run --resume` finishes it without running a stored pair twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cli import main
from harness.store import ROW_FIELDS, read_rows

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ROOT / "tests" / "fault_backends.py"
SLOW = f"{FAULTS}:Slow"
SUITE = """
[axes]
batch_size = [1, 2]
context_len = [5, 33]
tree = ["full:2:1", "chain:2", "random:4:7"]
num_q_heads = [2]
num_kv_heads = [1]
head_dim = [16]
"""
N_CASES = 12


@pytest.fixture
def suite(tmp_path) -> Path:
    p = tmp_path / "s.toml"
    p.write_text(SUITE)
    return p


def _run(suite, out, *extra, backends=SLOW) -> list[str]:
    return ["run", "--suite", str(suite), "--backends", backends, "--out", str(out),
            "--report", str(out.with_suffix(".html")), "--quiet", *extra]


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _kill_after_rows(cmd: list[str], out: Path, n_rows: int, timeout_s: float = 120) -> None:
    """Starts `cmd`, SIGKILLs it once `out` holds at least `n_rows` lines."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TREEBENCH_TEST_SLOW_S": "0.4"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout_s
    try:
        while len(_lines(out)) < n_rows:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the sweep wrote too few rows in time"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


def test_sigkill_mid_sweep_then_resume(suite, tmp_path, monkeypatch):
    out = tmp_path / "r.jsonl"
    _kill_after_rows([sys.executable, "-m", "harness.cli", *_run(suite, out)], out, 3)
    left = _lines(out)
    assert 3 <= len(left) < N_CASES
    for line in left:                                       # nothing torn: each line a whole row
        assert set(json.loads(line)) == set(ROW_FIELDS)
    before = out.read_bytes()

    monkeypatch.setenv("TREEBENCH_TEST_SLOW_S", "0")
    assert main(_run(suite, out, "--resume")) == 0
    assert out.read_bytes().startswith(before)
    rows = read_rows([out])
    keys = [(r["case_id"], r["backend"]) for r in rows]
    assert len(rows) == N_CASES and len(set(keys)) == N_CASES
    assert all(r["status"] == "pass" for r in rows)
    assert len({r["run_id"] for r in rows}) == 2 and len({r["env"] for r in rows}) == 1


def _check(suite, out, *extra) -> list[str]:
    return ["check", "--suite", str(suite), "--backend", f"{FAULTS}:Exact", "--out", str(out), "--quiet", *extra]


def test_resume_of_a_finished_sweep_runs_nothing_and_reports_all(suite, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    assert main(_check(suite, out)) == 0
    before = out.read_bytes()
    assert main(_check(suite, out, "--resume", "--dry-run")) == 0
    text = " ".join(capsys.readouterr().out.split())          # rich may wrap the line
    assert "0 pairs to run here (0 of them skipped rows" in text and "12 already stored" in text
    assert main(_check(suite, out, "--resume")) == 0
    assert out.read_bytes() == before
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("│ exact ")]
    assert [c.strip() for c in line.split("│")][1:6] == ["exact", "12", "0", "0", "0"]   # stored rows summarised


def test_resume_reruns_rows_of_another_env_and_new_backends(suite, tmp_path):
    out = tmp_path / "r.jsonl"
    assert main(_run(suite, out, backends=f"{FAULTS}:Exact")) == 0
    rows = read_rows([out])
    foreign = {**rows[0], "env": "another-machine", "backend": "twin", "run_id": "old"}
    with open(out, "a") as f:
        f.write(json.dumps(foreign) + "\n")
    assert main(_run(suite, out, "--resume", backends=f"{FAULTS}:Exact,{FAULTS}:Twin")) == 0
    rows = read_rows([out])
    assert len(rows) == 12 + 1 + 12                      # the other env's twin row does not count as stored
    assert sum(r["backend"] == "exact" for r in rows) == 12
    assert sum(r["backend"] == "twin" and r["env"] != "another-machine" for r in rows) == 12


def test_resume_merges_rank_files_a_killed_launch_left(suite, tmp_path):
    out = tmp_path / "r.jsonl"
    part = tmp_path / "r.rank1-of-2.jsonl"
    assert main(_check(suite, part, "--shard", "1/2")) == 0
    assert main(_check(suite, out, "--resume")) == 0
    rows = read_rows([out])
    assert len(rows) == 12 and len({(r["case_id"], r["backend"]) for r in rows}) == 12
    assert not part.exists()


def test_resume_needs_out(suite, capsys):
    assert main(["run", "--suite", str(suite), "--resume", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--resume needs --out" in err[0]


def test_dry_run_counts_the_pairs_that_will_be_skipped(suite, tmp_path, capsys):
    """--dry-run says how many planned pairs will only be skipped rows (an
    unavailable backend, an unsupported case), apart from those that will run."""
    out = tmp_path / "r.jsonl"
    args = ["run", "--suite", str(suite), "--backends", f"reference,{FAULTS}:Exact,xformers_tree",
            "--out", str(out), "--quiet", "--dry-run"]
    assert main(args) == 0
    text = " ".join(capsys.readouterr().out.split())
    # xformers is not installed on the CPU (and needs CUDA): its 12 pairs are skips
    assert "36 pairs to run here (12 of them skipped rows" in text
    assert not out.exists()
