"""One (case, backend) pair: availability -> supports -> memory fit -> prepare ->
compare [-> determinism] -> time -> compare once more, as one result row; treebench.harness.run.runner sweeps the pairs.

Per case the inputs are built once per device (treebench.harness.model.paged.build_inputs) and
the float64 reference once per (device, mask kind): a backend whose
``mask_kind == "causal"`` gets ``inputs.causal()`` (chains of the same T_b) and
is compared with that batch's reference. Any exception raised by a backend, a
BaseException too (SystemExit, asyncio.CancelledError, GeneratorExit, a class of its own, a
KeyboardInterrupt that no Ctrl-C raised: treebench.harness.run.inflight.signal_stop),
becomes an ``error`` row whose reason is the exception type and the first line
of its message (with the line that names the cause where the first line only
opens it: treebench.harness.run.verify.error_reason); the sweep goes on.

Before a backend runs, treebench.harness.run.memory predicts the pair's device memory and
skips it with the reason when it cannot fit. A backend gets ``inputs.for_backend()``:
the contract fields only, so reading the reference's logical K/V is an error row.
With ``RunConfig.determinism`` the prepared callable runs twice and the outputs are
compared bitwise (row field ``deterministic``). A failed row's ``failed_step`` says where its
failure was found: "first prepare" (prepare, the first call, its comparison) or "timing" (the
timed calls, the call after them, the inputs checked after them);
treebench.harness.checking.default_check.FAILED_STEPS.

A check (``RunConfig.mode == "check"``) also repeats and re-prepares: see
treebench.harness.run.verify.check_pair.

Threads: a pair's correctness work (inputs, reference, prepare, the calls compared, the
comparisons) runs under ``RunConfig.threads`` torch intra-op threads where it is set
(`treebench.harness.timing.wall.torch_threads`; the count before is restored after); the timed
calls keep their timer's (the wall timer's CPU_TIMING_THREADS on the CPU).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import torch

from treebench.harness.adapter.contract import reason_type_error
from treebench.harness.checking.default_check import FIRST_PREPARE, IMPORT, TIMING
from treebench.harness.model.cases import Case
from treebench.harness.run.inflight import enter_step, signal_stop
from treebench.harness.run.memory import fit_reason
from treebench.harness.run.verify import (InputsMutated, check_output, check_pair, compared, determinism,
                                         error_reason, join, kernel_name, lse_base, prepared, returns_lse)
from treebench.harness.model.workload import case_metrics
from treebench.harness.model.paged import BatchInputs, build_inputs
from treebench.harness.model.reference import reference_attention
from treebench.harness.model.trees import TokenTree, from_parents
from treebench.harness.store.rows import ROW_FIELDS, SCHEMA
from treebench.harness.timing.timers import time_callable
from treebench.harness.timing.wall import torch_threads

if TYPE_CHECKING:
    from treebench.harness.run.config import RunConfig

log = logging.getLogger("treebench.harness.run.runner")  # the runner's logger: its records keep their name

MASK_KINDS = ("tree", "causal")
REPREPARE_SEED_OFFSET = 7919   # the alternate case's seed: case.seed + this (same axes, other draws)


def reshaped(tree: TokenTree, rng: random.Random, tries: int = 16) -> TokenTree:
    """Another tree of `tree`'s size T: each node i > 0 under a parent drawn uniformly from 0..i-1
    (a random recursive tree), drawn until its canonical parent array differs from `tree`'s;
    `tree` itself when T <= 2 (one shape only) or no draw of `tries` differs."""
    for _ in range(tries if tree.size > 2 else 0):
        other = from_parents([-1] + [rng.randrange(i) for i in range(1, tree.size)], f"{tree.spec} reshaped")
        if other.parents != tree.parents:
            return other
    return tree


class CaseData:
    """One case's inputs (per device) and references (per device and mask kind), built lazily once."""

    def __init__(self, case: Case, trees=None):
        self.case = case
        self.trees = trees        # B TokenTrees instead of case.trees() (the re-prepare twin's), or None
        self._inputs: dict[str, BatchInputs] = {}
        self._refs: dict[tuple[str, str], tuple[BatchInputs, torch.Tensor]] = {}
        self._lses: dict[tuple[str, str], torch.Tensor] = {}   # the reference's (sum T_b, Hq) float64 LSE
        self._alternate: CaseData | None = None

    def alternate(self) -> "CaseData":
        """The CaseData of the case's re-prepare twin: the same axes, seed + REPREPARE_SEED_OFFSET
        (other values and block tables, other ragged contexts), and every tree replaced by another
        tree of the same size T_b (a shared tree by one shared tree): B, L_b, T_b and every tensor
        shape stay the same, so state a backend keeps by batch shape from one prepare to the next
        (a cached mask, a stale plan) shows up as a mismatch. A tree of 1 or 2 nodes has no other
        shape and is kept."""
        if self._alternate is None:
            twin = replace(self.case, seed=self.case.seed + REPREPARE_SEED_OFFSET)
            rng = random.Random(twin.seed)
            trees = self.case.trees()
            if self.case.tree_per_request == "same":
                trees = [reshaped(trees[0], rng)] * len(trees)
            else:
                trees = [reshaped(t, rng) for t in trees]
            self._alternate = CaseData(twin, trees)
        return self._alternate

    def built(self, device: torch.device, mask_kind: str) -> tuple[bool, bool]:
        """(inputs built, reference built) on `device` for `mask_kind`: what a memory check need not count."""
        return str(device) in self._inputs, (str(device), mask_kind) in self._refs

    def get(self, device: torch.device, mask_kind: str) -> tuple[BatchInputs, torch.Tensor]:
        """(inputs, reference (sum T_b, Hq, D) float64) for a backend on `device` with `mask_kind`.

        Raises:
            ValueError: unknown mask kind.
        """
        if mask_kind not in MASK_KINDS:
            raise ValueError(f"mask_kind {mask_kind!r} is not one of {', '.join(MASK_KINDS)}")
        key = (str(device), mask_kind)
        if key not in self._refs:
            if str(device) not in self._inputs:
                self._inputs[str(device)] = build_inputs(self.case, device, self.trees)
            base = self._inputs[str(device)]
            inputs = base.causal() if mask_kind == "causal" else base
            out, lse = reference_attention(inputs, return_lse=True)
            self._refs[key], self._lses[key] = (inputs, out), lse
        return self._refs[key]

    def lse(self, device: torch.device, mask_kind: str) -> torch.Tensor:
        """The reference's LSE (sum T_b, Hq) float64, natural log, of `get(device, mask_kind)`'s batch."""
        self.get(device, mask_kind)
        return self._lses[(str(device), mask_kind)]

    def invalidate(self, device: torch.device) -> None:
        """Drops the inputs and references on `device` (a backend wrote into them): rebuilt on next get."""
        self._inputs.pop(str(device), None)
        for key in [k for k in self._refs if k[0] == str(device)]:
            del self._refs[key]
            self._lses.pop(key, None)
        self._alternate = None


def base_row(backend_name: str, case: Case, config: RunConfig) -> dict:
    """A row with every schema field, identity filled, results None."""
    row = dict.fromkeys(ROW_FIELDS)
    row.update(schema=SCHEMA, run_id=config.run_id, env=config.env_id, suite=config.suite, backend=backend_name,
               case=case.axes, case_id=case.case_id, context_lens=case.context_lens(),
               tree_sizes=[t.size for t in case.trees()], check_axes=config.check_axes.get(case.case_id))
    return row


def correctness_threads(config: RunConfig) -> AbstractContextManager:
    """`torch_threads(config.threads)` around a pair's correctness work; where config.threads is None,
    nothing: torch's count as it stands (OMP_NUM_THREADS, the caller's torch.set_num_threads)."""
    return nullcontext() if config.threads is None else torch_threads(config.threads)


def _time_row(row: dict, fn: Callable, inputs: BatchInputs, config: RunConfig) -> None:
    """Times `fn` and fills the timing and metric fields of `row`."""
    timing = time_callable(fn, device=inputs.device, mode=config.timing_mode, flush_l2=config.flush_l2)
    row.update(timing.as_row())
    row.update(case_metrics(inputs, row["median_us"], config.peak_bytes_per_s))


def _run_one(backend, case: Case, data: CaseData, device: torch.device, config: RunConfig, row: dict) -> None:
    """Fills `row` for one available backend on one case; exceptions propagate."""
    mask_kind = getattr(backend, "mask_kind", "tree")
    declined = backend.supports(case)
    wrong = reason_type_error(declined, "supports()", backend)   # the contract: None or a reason string
    if wrong:
        row.update(status="error", reason=wrong)
        return
    reason = declined or _memory_reason(backend, case, data, device, mask_kind, config)
    if reason:
        row.update(status="skipped", reason=str(reason))
        return
    if config.mode == "check":
        with correctness_threads(config):
            check_pair(backend, data, device, mask_kind, row)
        return
    enter_step(row, FIRST_PREPARE)   # the step in progress: an exception the caller makes an error row keeps it
    with correctness_threads(config):
        inputs, ref = data.get(device, mask_kind)
        fn, out, check_inputs = prepared(backend, inputs, data, device)
        row["kernel"] = kernel_name(fn, backend, inputs)
        nondet = None
        if config.determinism:
            out, nondet = determinism(fn, out, inputs, row, returns_lse(backend),
                                      declared=getattr(backend, "deterministic", True))
            check_inputs()
        rec, bad = compared(out, ref, inputs, data.lse(device, mask_kind))
    row.update(rec, status="mismatch" if bad else "pass", reason=join(bad, nondet))
    del out
    enter_step(row, TIMING)
    try:
        _time_row(row, fn, inputs, config)   # under the timer's threads, not config.threads
        with correctness_threads(config):
            _compare_after_timing(backend, fn, inputs, data, device, mask_kind, row)
    except BaseException as e:  # noqa: BLE001 -- a failure while timing is the backend's error row
        if signal_stop(e):
            raise
        row.update(status="error", reason="while timing: " + error_reason(e))
    check_inputs()
    if row["status"] == "pass":
        row["failed_step"] = None
    elif bad and row["status"] == "mismatch":   # the first comparison's mismatch, timed all the same
        row["failed_step"] = FIRST_PREPARE


def _compare_after_timing(backend, fn: Callable, inputs: BatchInputs, data: CaseData, device: torch.device,
                          mask_kind: str, row: dict) -> None:
    """Calls `fn` once more after its timed calls and compares that result with the reference:
    a kernel whose answer drifts after warm-up (state kept from call to call) is a mismatch row."""
    after = check_output(fn(), inputs, returns_lse(backend), lse_base(backend))
    bad = compared(after, data.get(device, mask_kind)[1], inputs, data.lse(device, mask_kind))[1]
    if bad and row["status"] == "pass":
        row.update(status="mismatch", reason=join(f"after the timed calls: {bad}", row.get("reason")))


def _memory_reason(backend, case: Case, data: CaseData, device: torch.device, mask_kind: str,
                   config: RunConfig) -> str | None:
    """treebench.harness.run.memory.fit_reason for this pair (None when the check is off or it fits)."""
    if not config.check_memory or mask_kind not in MASK_KINDS:
        return None
    inputs_built, reference_built = data.built(device, mask_kind)
    twice = config.determinism or config.mode == "check"   # a check keeps a copy of the first output
    return fit_reason(case, backend, device, config.mode, twice, inputs_built, reference_built)


def run_case_backend(backend, case: Case, data: CaseData, availability: str | None,
                     device: torch.device, config: RunConfig) -> dict:
    """One result row: skipped (with reason), error (with reason), pass or mismatch.

    Never raises for a backend's fault: any exception becomes an error row, every BaseException too
    (SystemExit, asyncio.CancelledError, GeneratorExit, ...), a KeyboardInterrupt unless a signal may have raised it (`inflight.signal_stop`: a Ctrl-C or SIGTERM stops the sweep).
    """
    row = base_row(getattr(backend, "name", type(backend).__name__), case, config)
    row["mask_kind"] = getattr(backend, "mask_kind", "tree")
    if availability:   # a raising availability() is the backend's crash: an error row, not a skip
        row.update(status="error" if isinstance(availability, AvailabilityRaised) else "skipped",
                   reason=availability, failed_step=getattr(availability, "step", None))
    else:
        try:
            _run_one(backend, case, data, device, config, row)
        except BaseException as e:  # noqa: BLE001 -- the contract: whatever a backend raises (sys.exit,
            # asyncio.CancelledError, a KeyboardInterrupt no signal raised) is an error row; a Ctrl-C stops the sweep
            if signal_stop(e):
                raise
            log.debug("backend %s on %s raised", row["backend"], case.case_id, exc_info=True)
            row.update(status="error", reason=error_reason(e))
            if isinstance(e, InputsMutated):  # its timings (if any) describe a run on changed inputs
                row.update(dict.fromkeys(("median_us", "p25_us", "p75_us", "cv", "n_samples", "samples_us",
                                          "tflops", "tb_per_s", "pct_peak_bw"), None))
            if isinstance(e, torch.cuda.OutOfMemoryError):
                torch.cuda.empty_cache()
    row["timestamp"] = datetime.now(timezone.utc).isoformat(timespec="milliseconds")   # ms: a fast run spans > 0 s
    return row


class AvailabilityRaised(str):
    """The reason string of an availability() that raised: its pairs become error rows, whose
    `failed_step` is `step` (none here; ImportFailed's names the import)."""

    step: str | None = None


class ImportFailed(AvailabilityRaised):
    """The reason of a backend whose loading ended or hung the worker process it was loaded in first
    (treebench.harness.sweep.imports): its rows are errors whose `failed_step` is IMPORT."""

    step = IMPORT


def availability_reason(backend) -> str | None:
    """backend.availability(): None (usable here) or its reason; one that raises, or returns neither None
    nor a string (`contract.reason_type_error`), gives an AvailabilityRaised reason (its rows are errors:
    the backend's code crashed or broke the contract, it did not decline).

    Raises:
        KeyboardInterrupt / the stop of a signal (`inflight.signal_stop`): a Ctrl-C or SIGTERM while it ran.
    """
    try:
        got = backend.availability()
    except BaseException as e:  # noqa: BLE001 -- a broken availability() is an error row
        if signal_stop(e):
            raise
        return AvailabilityRaised("availability() raised " + error_reason(e))
    wrong = reason_type_error(got, "availability()", backend)   # the contract: None or a reason string
    return AvailabilityRaised(wrong) if wrong else got


def availabilities(backends: Sequence) -> dict[int, str | None]:
    """id(backend) -> its `availability_reason`."""
    return {id(b): availability_reason(b) for b in backends}
