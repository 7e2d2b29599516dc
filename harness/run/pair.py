"""One (case, backend) pair: availability -> supports -> memory fit -> prepare ->
compare [-> determinism] -> time, as one result row; treebench.harness.run.runner sweeps the pairs.

Per case the inputs are built once per device (treebench.harness.model.paged.build_inputs) and
the float64 reference once per (device, mask kind): a backend whose
``mask_kind == "causal"`` gets ``inputs.causal()`` (chains of the same T_b) and
is compared with that batch's reference. Any exception raised by a backend
becomes an ``error`` row whose reason is the exception type and the first line
of its message; the sweep goes on.

Before a backend runs, treebench.harness.run.memory predicts the pair's device memory and
skips it with the reason when it cannot fit. With ``RunConfig.determinism`` the
prepared callable runs twice and the outputs are compared bitwise (row field
``deterministic``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import torch

from treebench.harness.model.cases import Case
from treebench.harness.model.compare import compare
from treebench.harness.run.memory import fit_reason
from treebench.harness.model.workload import case_metrics
from treebench.harness.model.paged import BatchInputs, build_inputs
from treebench.harness.model.reference import reference_attention
from treebench.harness.store.rows import ROW_FIELDS, SCHEMA
from treebench.harness.timing.timers import time_callable

if TYPE_CHECKING:
    from treebench.harness.run.config import RunConfig

log = logging.getLogger("treebench.harness.run.runner")  # the runner's logger: its records keep their name

MASK_KINDS = ("tree", "causal")


def error_reason(e: BaseException) -> str:
    """'TypeName: first line of the message' for an error row; just the type name when
    the exception's __str__ itself raises (a backend's exception is untrusted)."""
    name = type(e).__name__
    if isinstance(e, SystemExit):
        return f"backend called sys.exit({e.code!r})"
    try:
        msg = str(e).strip().splitlines()
    except BaseException:  # noqa: BLE001 -- a broken __str__ must not lose the row
        return f"{name} (its message could not be formatted)"
    return f"{name}: {msg[0]}" if msg else name


# Input tensors a backend may read but must not write. Small ones are kept as a clone and
# compared bitwise (NaN-aware: the K/V page tails are NaN); ones above SNAPSHOT_MAX_ELEMS
# are fingerprinted by float64 nansum + NaN count + a bitwise strided sample of
# FINGERPRINT_SAMPLES elements, which catches zeroing, scaling or overwriting at a
# fraction of a copy's memory.
INPUT_FIELDS = ("q", "k_cache", "v_cache", "block_table", "context_lens", "seq_lens", "qo_indptr")
SNAPSHOT_MAX_ELEMS = 1 << 22
FINGERPRINT_SAMPLES = 1 << 16


def _bits(t: torch.Tensor) -> torch.Tensor:
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(as_int)


def _fingerprint(t: torch.Tensor) -> tuple:
    if t.numel() <= SNAPSHOT_MAX_ELEMS:
        return ("copy", t.detach().clone())
    flat = t.detach().reshape(-1)
    step = max(1, flat.numel() // FINGERPRINT_SAMPLES)
    d = flat.double()
    return ("sig", float(torch.nansum(d)), int(torch.isnan(d).sum()), _bits(flat[::step]).clone())


def _same(t: torch.Tensor, fp: tuple) -> bool:
    if t.numel() <= SNAPSHOT_MAX_ELEMS:
        ref = fp[1]
        return t.shape == ref.shape and t.dtype == ref.dtype and bool(torch.equal(_bits(t), _bits(ref)))
    again = _fingerprint(t)
    return again[1:3] == fp[1:3] and bool(torch.equal(again[3], fp[3]))


def input_fingerprints(inputs: BatchInputs) -> dict:
    """field -> fingerprint of the input tensors a backend must leave unchanged."""
    return {f: _fingerprint(getattr(inputs, f)) for f in INPUT_FIELDS
            if isinstance(getattr(inputs, f, None), torch.Tensor)}


def mutated_inputs(inputs: BatchInputs, fps: dict) -> list[str]:
    """The fields whose tensors changed since `fps` was taken."""
    return [f for f, fp in fps.items() if not _same(getattr(inputs, f), fp)]


class InputsMutated(RuntimeError):
    """A backend wrote into the shared inputs."""

    def __init__(self, fields: list[str]):
        super().__init__(f"backend mutated its inputs ({'/'.join(fields)})")


class CaseData:
    """One case's inputs (per device) and references (per device and mask kind), built lazily once."""

    def __init__(self, case: Case):
        self.case = case
        self._inputs: dict[str, BatchInputs] = {}
        self._refs: dict[tuple[str, str], tuple[BatchInputs, torch.Tensor]] = {}

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
                self._inputs[str(device)] = build_inputs(self.case, device)
            base = self._inputs[str(device)]
            inputs = base.causal() if mask_kind == "causal" else base
            self._refs[key] = (inputs, reference_attention(inputs))
        return self._refs[key]

    def invalidate(self, device: torch.device) -> None:
        """Drops the inputs and references on `device` (a backend wrote into them): rebuilt on next get."""
        self._inputs.pop(str(device), None)
        for key in [k for k in self._refs if k[0] == str(device)]:
            del self._refs[key]


def base_row(backend_name: str, case: Case, config: RunConfig) -> dict:
    """A row with every schema field, identity filled, results None."""
    row = dict.fromkeys(ROW_FIELDS)
    row.update(schema=SCHEMA, run_id=config.run_id, env=config.env_id, backend=backend_name,
               case=case.axes, case_id=case.case_id, context_lens=case.context_lens(),
               tree_sizes=[t.size for t in case.trees()])
    return row


def _check_output(out, inputs: BatchInputs) -> None:
    """Raises TypeError/ValueError when `out` is not a (sum T_b, Hq, D) tensor in inputs.dtype."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"prepared callable returned {type(out).__name__}, expected a torch.Tensor")
    if tuple(out.shape) != tuple(inputs.q.shape):
        raise ValueError(f"output shape {tuple(out.shape)} != expected (sum T_b, Hq, D) = {tuple(inputs.q.shape)}")
    if out.dtype != inputs.dtype:
        raise TypeError(f"output dtype {out.dtype} != expected {inputs.dtype}")


def bitwise_diff_count(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements of `a` and `b` (same shape and dtype) whose bit patterns differ (NaN == NaN when the bits match)."""
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return int((a.contiguous().view(as_int) != b.contiguous().view(as_int)).sum())


def _determinism(fn: Callable, out: torch.Tensor, inputs: BatchInputs, row: dict) -> tuple[torch.Tensor, str | None]:
    """Calls `fn` a second time and compares bitwise with `out`; sets row["deterministic"].

    Returns:
        (a copy of the first output, None or the nondeterminism reason).
    """
    first = out.clone()  # the callable may hand back one persistent buffer: keep the first call's bits
    again = fn()
    _check_output(again, inputs)
    n = bitwise_diff_count(first, again)
    row["deterministic"] = n == 0
    if n == 0:
        return first, None
    return first, f"nondeterministic: {n} of {first.numel()} output elements differ bitwise between two calls"


def _join(*reasons: str | None) -> str | None:
    """'a; b' of the reasons that are not None, or None."""
    kept = [r for r in reasons if r]
    return "; ".join(kept) if kept else None


def _mismatch_reason(rec: dict) -> str:
    """One line describing a failed comparison."""
    worst = rec["worst"]
    where = f" at (request {worst[0]}, node {worst[1]}, head {worst[2]})" if worst else ""
    nonfinite = f", {rec['nonfinite']} non-finite" if rec["nonfinite"] else ""
    return (f"max_abs_err {rec['max_abs_err']:.3g}{where}; "
            f"{rec['mismatch_frac']:.1%} of elements out of tolerance{nonfinite}")


def _time_row(row: dict, fn: Callable, inputs: BatchInputs, config: RunConfig) -> None:
    """Times `fn` and fills the timing and metric fields of `row`."""
    timing = time_callable(fn, device=inputs.device, mode=config.timing_mode, flush_l2=config.flush_l2)
    row.update(timing.as_row())
    row.update(case_metrics(inputs, row["median_us"], config.peak_bytes_per_s))


def _run_one(backend, case: Case, data: CaseData, device: torch.device, config: RunConfig, row: dict) -> None:
    """Fills `row` for one available backend on one case; exceptions propagate."""
    mask_kind = getattr(backend, "mask_kind", "tree")
    declined = backend.supports(case)
    if declined is not None and not isinstance(declined, str):   # the contract: None or a reason string
        raise TypeError(f"supports() returned {type(declined).__name__} {declined!r}, expected None or a reason string")
    reason = declined or _memory_reason(backend, case, data, device, mask_kind, config)
    if reason:
        row.update(status="skipped", reason=str(reason))
        return
    inputs, ref = data.get(device, mask_kind)
    fps = input_fingerprints(inputs)

    def check_inputs() -> None:
        changed = mutated_inputs(inputs, fps)
        if changed:
            data.invalidate(device)  # the next backend gets freshly built inputs and reference
            raise InputsMutated(changed)

    try:
        fn = backend.prepare(inputs)
        out = fn()
    except BaseException:
        if mutated_inputs(inputs, fps):
            data.invalidate(device)
        raise
    check_inputs()
    _check_output(out, inputs)
    nondet = None
    if config.determinism:
        out, nondet = _determinism(fn, out, inputs, row)
        check_inputs()
    rec = compare(out, ref, inputs.qo_indptr, case.dtype).as_row()
    passed = rec.pop("passed")
    row.update(rec, status="pass" if passed else "mismatch",
               reason=_join(None if passed else _mismatch_reason(rec), nondet))
    del out
    if config.mode == "run":
        try:
            _time_row(row, fn, inputs, config)
        except (Exception, SystemExit) as e:  # noqa: BLE001 -- a failure while timing is the backend's error row
            row.update(status="error", reason="while timing: " + error_reason(e))
        check_inputs()


def _memory_reason(backend, case: Case, data: CaseData, device: torch.device, mask_kind: str,
                   config: RunConfig) -> str | None:
    """treebench.harness.run.memory.fit_reason for this pair (None when the check is off or it fits)."""
    if not config.check_memory or mask_kind not in MASK_KINDS:
        return None
    inputs_built, reference_built = data.built(device, mask_kind)
    return fit_reason(case, backend, device, config.mode, config.determinism, inputs_built, reference_built)


def run_case_backend(backend, case: Case, data: CaseData, availability: str | None,
                     device: torch.device, config: RunConfig) -> dict:
    """One result row: skipped (with reason), error (with reason), pass or mismatch.

    Never raises for a backend's fault: any exception becomes an error row.
    """
    row = base_row(getattr(backend, "name", type(backend).__name__), case, config)
    if availability:   # a raising availability() is the backend's crash: an error row, not a skip
        row.update(status="error" if isinstance(availability, AvailabilityRaised) else "skipped",
                   reason=availability)
    else:
        try:
            _run_one(backend, case, data, device, config, row)
        except (Exception, SystemExit) as e:  # noqa: BLE001 -- the contract: a backend's exception (or
            # sys.exit) is an error row; KeyboardInterrupt still stops the sweep
            log.debug("backend %s on %s raised", row["backend"], case.case_id, exc_info=True)
            row.update(status="error", reason=error_reason(e))
            if isinstance(e, InputsMutated):  # its timings (if any) describe a run on changed inputs
                row.update(dict.fromkeys(("median_us", "p25_us", "p75_us", "cv", "n_samples", "samples_us",
                                          "tflops", "tb_per_s", "pct_peak_bw"), None))
            if isinstance(e, torch.cuda.OutOfMemoryError):
                torch.cuda.empty_cache()
    row["timestamp"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return row


class AvailabilityRaised(str):
    """The reason string of an availability() that raised: its pairs become error rows."""


def availabilities(backends: Sequence) -> dict[int, str | None]:
    """id(backend) -> its availability(); one that raises gives an AvailabilityRaised reason
    (its rows are errors: the backend's code crashed, it did not decline)."""
    out: dict[int, str | None] = {}
    for b in backends:
        try:
            out[id(b)] = b.availability()
        except (Exception, SystemExit) as e:  # noqa: BLE001 -- a broken availability() is an error row
            out[id(b)] = AvailabilityRaised("availability() raised " + error_reason(e))
    return out
