"""mypy over the harness package (config: pyproject.toml [tool.mypy]): no type errors."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_harness_clean():
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy not installed (pip install -e '.[dev]')")
    proc = subprocess.run([sys.executable, "-m", "mypy", "harness"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
