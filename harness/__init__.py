"""treebench: benchmark and correctness-validation harness for tree attention
over a paged KV cache (see docs/design.md).

The curated public API is `__all__` below (checked by tests/test_cli.py::
test_public_api). Everything else in the package is internal. `write_report`
(matplotlib, pandas, jinja2) and `main` (the CLI) are imported on first use.
"""

from __future__ import annotations

import importlib
import importlib.metadata

from treebench.harness.adapter.contract import REGISTRY, Backend, Capabilities, load_backend, register
from treebench.harness.model.cases import Case, expand_axes
from treebench.harness.model.compare import TOLERANCES, CorrectnessRecord, compare
from treebench.harness.errors import BackendUnavailable, ConfigError, CorrectnessError, HarnessError, TreeError
from treebench.harness.model.metrics import case_metrics
from treebench.harness.model.paged import BatchInputs, build_inputs
from treebench.harness.model.reference import reference_attention
from treebench.harness.run.runner import RunConfig, run_cases
from treebench.harness.store.env import env_fingerprint, read_envs, write_env
from treebench.harness.store.rows import append_row, read_rows
from treebench.harness.model.suites import Suite, load_suite
from treebench.harness.timing.bandwidth import measure_peak_bandwidth
from treebench.harness.timing.budget import Timing
from treebench.harness.timing.timers import time_callable
from treebench.harness.model.trees import TokenTree, from_parents, parse_tree, render_tree, tree_summary

try:
    __version__ = importlib.metadata.version("treebench")
except importlib.metadata.PackageNotFoundError:  # running from a checkout that is not installed
    __version__ = "0.1.0"

_LAZY = {"write_report": "treebench.harness.analyze.report", "main": "treebench.harness.cli.main"}  # name -> module, imported on first use


def __getattr__(name: str):
    """PEP 562: the heavy or entry-point names of `_LAZY`, imported on first access."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'harness' has no attribute {name!r}")


__all__ = [
    "Backend",
    "BackendUnavailable",
    "BatchInputs",
    "Capabilities",
    "Case",
    "ConfigError",
    "CorrectnessError",
    "CorrectnessRecord",
    "HarnessError",
    "REGISTRY",
    "RunConfig",
    "Suite",
    "TOLERANCES",
    "Timing",
    "TokenTree",
    "TreeError",
    "__version__",
    "append_row",
    "build_inputs",
    "case_metrics",
    "compare",
    "env_fingerprint",
    "expand_axes",
    "from_parents",
    "load_backend",
    "load_suite",
    "main",
    "measure_peak_bandwidth",
    "parse_tree",
    "read_envs",
    "read_rows",
    "reference_attention",
    "register",
    "render_tree",
    "run_cases",
    "time_callable",
    "tree_summary",
    "write_env",
    "write_report",
]
