"""Shared pytest setup: the repo root on sys.path, and tests marked `gpu`
skipped when torch sees no CUDA device (the marker is registered in pyproject)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
import torch

# A test run started in the background by a non-interactive shell (`pytest &`, `nohup`) inherits SIGINT
# ignored, and so would every command the tests start, which then cannot be interrupted: the interrupt
# tests' commands get Python's own handler back (a handler, unlike SIG_IGN, is not inherited across exec).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (auto-skipped without one)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; torch sees none")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
