"""treebench: benchmark and correctness-validation harness for tree attention
over a paged KV cache (see docs/design.md).

The curated public API is `__all__` below (checked by tests/test_cli.py::
test_public_api). Everything else in the package is internal. Every name is
imported on first use (PEP 562), so that `import treebench.harness` (and the
command line's `--help`) does not import torch.
"""

from __future__ import annotations

import importlib
import importlib.metadata

try:
    __version__ = importlib.metadata.version("treebench")
except importlib.metadata.PackageNotFoundError:  # running from a checkout that is not installed
    __version__ = "0.1.0"

_P = "treebench.harness."
_LAZY = {  # public name -> the module that defines it, imported on first access
    **dict.fromkeys(("REGISTRY", "Backend", "Capabilities", "register"), _P + "adapter.contract"),
    **dict.fromkeys(("Case", "expand_axes"), _P + "model.cases"),
    **dict.fromkeys(("TOLERANCES", "CorrectnessRecord", "compare"), _P + "model.compare"),
    **dict.fromkeys(("BackendUnavailable", "ConfigError", "CorrectnessError", "HarnessError", "ResultsWriteError",
                     "TreeError"), _P + "errors"),
    "case_metrics": _P + "model.workload",
    **dict.fromkeys(("BatchInputs", "build_inputs"), _P + "model.paged"),
    "reference_attention": _P + "model.reference",
    "RunConfig": _P + "run.config",
    "load_backend": _P + "run.loading",
    "run_cases": _P + "run.runner",
    **dict.fromkeys(("append_row", "read_rows"), _P + "store.rows"),
    **dict.fromkeys(("env_fingerprint", "read_envs", "write_env"), _P + "store.env"),
    **dict.fromkeys(("Suite", "load_suite"), _P + "model.suites"),
    "time_callable": _P + "timing.timers",
    "measure_peak_bandwidth": _P + "timing.bandwidth",
    "Timing": _P + "timing.budget",
    **dict.fromkeys(("TokenTree", "from_parents", "render_tree", "tree_summary"), _P + "model.trees"),
    "parse_tree": _P + "model.tree_specs",
    "write_report": _P + "analyze.report",
    "main": _P + "cli.main",
}


def __getattr__(name: str):
    """PEP 562: a public name of `_LAZY`, imported from its module on first access."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'harness' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


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
    "ResultsWriteError",
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
