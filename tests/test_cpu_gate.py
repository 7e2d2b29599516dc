"""Two back-to-back CPU runs of the same code pass `treebench gate`: CPU timings are taken
under one torch thread (harness/timing/wall.py), so they are not scheduler-bucket noise.

This runs the smoke suite twice through the CLI, as a user's CI job would, on whatever CPU
runs the tests (two cores in CI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = "torch_sdpa,reference"   # the dense CPU backends; flex compiles, two_pass is pure Python loops


def _treebench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("OMP_NUM_THREADS", None)   # torch's default threading: what a user gets
    return subprocess.run([sys.executable, "-m", "treebench", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600, check=False)


def _two_runs_and_gate(where: Path) -> subprocess.CompletedProcess:
    where.mkdir()
    for name in ("a", "b"):
        run = _treebench("run", "--suite", "smoke", "--backends", BACKENDS, "--out", str(where / f"{name}.jsonl"),
                         "--report", str(where / f"{name}.html"), cwd=where)
        assert run.returncode == 0, run.stderr[-2000:]
    rows = [json.loads(line) for line in (where / "a.jsonl").read_text().splitlines()]
    assert rows and all(r["timer"] == "wall" and r["cpu_threads"] == 1 for r in rows)
    return _treebench("gate", "--baseline", str(where / "a.jsonl"), "--candidate", str(where / "b.jsonl"), cwd=where)


ATTEMPTS = 3
PAUSE_S = 20   # between attempts: an attempt takes seconds, so a burst of other work could span all three


@pytest.mark.slow
def test_two_back_to_back_cpu_runs_pass_the_gate(tmp_path):
    """Up to three attempts, PAUSE_S apart: another job's burst can slow one whole run. When every attempt
    fails while other processes kept the cores busy (load average above the core count), the
    timings say nothing about treebench and the test skips, saying so; on a machine that is
    not busy, three failures fail it (timings in scheduler buckets, as under multi-threaded
    torch, do)."""
    busy = []
    for attempt in range(ATTEMPTS):
        if attempt:
            time.sleep(PAUSE_S)
        gate = _two_runs_and_gate(tmp_path / f"attempt{attempt}")
        if gate.returncode == 0:
            break
        busy.append(os.getloadavg()[0] > (os.cpu_count() or 1))
    else:
        if all(busy):
            pytest.skip(f"the machine was busy during all {ATTEMPTS} attempts (load average "
                        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores): CPU timings not comparable")
    assert gate.returncode == 0, gate.stdout[-3000:] + gate.stderr[-1000:]
    assert "PASS" in gate.stdout
