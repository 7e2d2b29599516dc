"""Speculation planning: expected accepted tokens per µs of verify, and the tree that maximises it.

Modules, each owning one noun:

- ``acceptance``: positional acceptance models (Sequoia, arXiv 2402.12374) read from data files;
- ``expected``: E(tree), expected accepted tokens, and its Monte Carlo check;
- ``search``: the Sequoia dynamic program, best tree of every size T <= 256;
- ``cost``: verify time against T from stored result rows, and the rest of the step;
- ``plan``: the verdict per backend, B and L (tokens per ms), and an HTML section for reports;
- ``commands``: the ``tree-search`` and ``plan`` subcommands.
"""

from __future__ import annotations

from treebench.harness.speculation.acceptance import AcceptanceModel, load_model, shipped_models
from treebench.harness.speculation.cost import StepCost, VerifyCurve, load_curves, parse_step_us, verify_curves
from treebench.harness.speculation.expected import chain_expected, expected_tokens, simulate
from treebench.harness.speculation.plan import Verdict, format_table, plan, speculation_section
from treebench.harness.speculation.search import SearchedTree, choices_text, search_trees

__all__ = ["AcceptanceModel", "load_model", "shipped_models", "expected_tokens", "chain_expected", "simulate",
           "SearchedTree", "search_trees", "choices_text", "StepCost", "VerifyCurve", "parse_step_us",
           "verify_curves", "load_curves", "Verdict", "plan", "format_table", "speculation_section"]
