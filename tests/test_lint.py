"""ruff's pyflakes and syntax rules over the whole tree (undefined names,
unused imports and variables): cheap bugs caught before any test runs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_pyflakes_clean():
    exe = shutil.which("ruff")
    if exe is None:
        pytest.skip("ruff not installed (pip install -e '.[dev]')")
    proc = subprocess.run([exe, "check", "--select", "F,E9", "--output-format", "concise", str(ROOT)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
