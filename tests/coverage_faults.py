"""Backends that break what the check's repeat, re-prepare and backend view prove:
each fails `treebench check` with a reason naming the step (tests/test_check_coverage.py).

Built on tests/broken_backends.py's `Correct` (an independent paged implementation).
None registers itself: ``treebench check --backend tests/coverage_faults.py:CachesFirstBlockTable``.
"""

from __future__ import annotations

import torch

from tests.broken_backends import Correct


class CachesFirstBlockTable(Correct):
    """Keeps the block table of its first prepare and reads every later batch through it
    (a plan cached on the adapter, never invalidated)."""
    name = "caches_first_block_table"

    def __init__(self):
        self._table: torch.Tensor | None = None

    def page_ids(self, inputs, b, n_pages):
        if self._table is None:
            self._table = inputs.block_table.clone()
        row = self._table[min(b, self._table.shape[0] - 1)].tolist()
        return [row[min(j, len(row) - 1)] for j in range(n_pages)]


class DriftsBetweenCalls(Correct):
    """Its callable's answer changes between calls: a scratch accumulator never reset,
    so each call adds 1e-3 times the number of earlier calls."""
    name = "drifts_between_calls"

    def prepare(self, inputs):
        run, calls = super().prepare(inputs), [0]

        def drifting() -> torch.Tensor:
            out = run() + 1e-3 * calls[0]
            calls[0] += 1
            return out.to(inputs.dtype)
        return drifting


class RaisesOnSecondPrepare(Correct):
    """Correct on a case's first batch, but every second prepare raises: a plan cache keyed by
    the batch's shapes that breaks when the same shapes come back with other data."""
    name = "raises_on_second_prepare"

    def __init__(self):
        self._prepares = 0

    def prepare(self, inputs):
        self._prepares += 1
        if self._prepares % 2 == 0:
            raise RuntimeError("stale plan for these shapes")
        return super().prepare(inputs)


class ReadsLogicalKV(Correct):
    """Reads the reference's unpaged K/V (`inputs.k_logical`) instead of the pool."""
    name = "reads_logical_kv"

    def prepare(self, inputs):
        _ = inputs.k_logical
        return super().prepare(inputs)


class DeclaredNondeterministic(Correct):
    """Correct within tolerance, but its calls differ in the last bits; it says so."""
    name = "declared_nondeterministic"
    deterministic = False

    def prepare(self, inputs):
        run, calls = super().prepare(inputs), [0]

        def noisy() -> torch.Tensor:
            calls[0] += 1
            out = run()
            return torch.nextafter(out, torch.full_like(out, float("inf"))) if calls[0] % 2 else out  # 1 ulp up
        return noisy


FAULTS = (CachesFirstBlockTable, DriftsBetweenCalls, RaisesOnSecondPrepare, ReadsLogicalKV)
