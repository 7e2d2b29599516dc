"""Deliberately faulty paged tree-attention backends, to prove that the `check`
suite (suites/check.toml) catches each fault a real kernel is prone to.

They live in the package (treebench.harness.selftest.mutants, run by `treebench
selftest`); this module re-exports them under the names the tests and the README
use. `Correct` is the correct dense backend they break (selftest.dense.Dense), renamed.
None of them registers itself: load them with
``treebench check --backend tests/broken_backends.py:BrokenCausalMask``.
"""

from __future__ import annotations

from treebench.harness.selftest.dense import Dense
from treebench.harness.selftest.mutants import (
    CLASSIC as BROKEN,
    BrokenCausalMask,
    BrokenDropsLastContext,
    BrokenExtraPageAtMultiple,
    BrokenGqaMapping,
    BrokenIgnoresBlockTable,
    BrokenReadsPastEnd,
    BrokenRequest0Context,
    BrokenRequest0Tree,
    BrokenRootHidden,
    BrokenSiblingsSeeEachOther,
    BrokenSoftmaxScale,
)


class Correct(Dense):
    """The correct dense backend, under the name the tests know it by."""

    name = "correct"


__all__ = [
    "BROKEN",
    "BrokenCausalMask",
    "BrokenDropsLastContext",
    "BrokenExtraPageAtMultiple",
    "BrokenGqaMapping",
    "BrokenIgnoresBlockTable",
    "BrokenReadsPastEnd",
    "BrokenRequest0Context",
    "BrokenRequest0Tree",
    "BrokenRootHidden",
    "BrokenSiblingsSeeEachOther",
    "BrokenSoftmaxScale",
    "Correct",
]
