"""How one backend's output is verified: prepare on the backend's view of the batch,
call, compare with the reference, guard the shared inputs, repeat, and, in a check,
re-prepare on a second batch.

A check (``RunConfig.mode == "check"``) asks more of a pass (`check_pair`): each
prepared callable is called CHECK_CALLS (3) times and the later outputs compared bitwise with
the first (repeat), and the backend is prepared a second time on the case's alternate -- the
same axes and shapes with another seed, so other Q/K/V, block tables and ragged contexts, and
another tree of each request's size (treebench.harness.run.pair.CaseData.alternate) -- whose
output must match that batch's reference and repeat bitwise too (re-prepare). A timed run
compares one more call after the timed ones with the reference (an answer that drifts after
warm-up is a mismatch).
A backend that keeps state from one prepare to the next, or whose callable's answer
changes between calls, fails with a reason naming the step and the step in the row's
``failed_step`` (treebench.harness.checking.default_check.FAILED_STEPS). A backend declaring
``deterministic = False`` (treebench.harness.adapter.contract.Backend) has its repeats
compared with the reference within tolerance instead, and its row says so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from treebench.harness.model.compare import compare, compare_lse
from treebench.harness.model.paged import BatchInputs
from treebench.harness.checking.default_check import (CHECK_CALLS, FIRST_PREPARE, RE_PREPARE, REPEAT,
                                                       REPREPARE_STEP)
from treebench.harness.run.inflight import enter_step, signal_stop

if TYPE_CHECKING:
    from treebench.harness.run.pair import CaseData


REASON_MAX_CHARS = 600
NONDETERMINISM_HINT = ("declare `deterministic = False` on the backend if its calls may differ in the last bits "
                       "(atomics, split-K order)")
_RULE = re.compile(r"([=\-_*#~])\1{3,}")            # a line of ==== or ---- (banner decoration)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_CAUSE = re.compile(r"\b\w*(Error|Exception)\b|\berror\b", re.IGNORECASE)


def printable(text: str) -> str:
    """`text` safe for a terminal, a JSON row and HTML: lone surrogates and control characters
    other than newline and tab written as escapes (\\ud800, \\x1b). Raises nothing."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _fit(head: str, tail: str = "") -> str:
    """head + tail in at most REASON_MAX_CHARS: the tail (the cause) kept up to half of it, the head cut."""
    tail = tail[:REASON_MAX_CHARS // 2]
    room = REASON_MAX_CHARS - len(tail)
    return (head if len(head) <= room else head[:room - 3] + "...") + tail


def error_reason(e: BaseException, _depth: int = 0) -> str:
    """'TypeName: first line of the message' for an error row. Where that line only opens what
    follows (it ends in ':' once banner runs such as ==== are dropped: a compiler wrapped in
    another's exception, inductor around a CuteDSL build, prints its cause below a banner),
    ' ... ' and the message's last line that names an error (else its last line with words)
    follow. An exception raised `from` another ends in ' (from <that one's reason>)', three
    levels at most. Control characters and lone surrogates are escaped (`printable`); at most
    REASON_MAX_CHARS characters. Just the type name when the exception's __str__ itself
    raises (a backend's exception is untrusted). A KeyboardInterrupt's type name says that no
    Ctrl-C raised it (one that a signal may have raised stops the sweep: `inflight.signal_stop`)."""
    name = type(e).__name__
    if isinstance(e, SystemExit):
        return f"backend called sys.exit({e.code!r})"
    if isinstance(e, KeyboardInterrupt) and not _depth:
        name += " (raised by the backend, not by a Ctrl-C)"
    try:
        text = printable(str(e))
    except BaseException:  # noqa: BLE001 -- a broken __str__ must not lose the row
        return f"{name} (its message could not be formatted)"
    lines = [t for t in (" ".join(_RULE.sub(" ", ln).split()) for ln in text.splitlines()) if t]
    chained = e.__cause__                                   # raise X from Y: Y is the cause
    if chained is not None and chained is not e and _depth < 3:
        return _fit(f"{name}: {lines[0]}" if lines else name, f" (from {error_reason(chained, _depth + 1)})")
    if not lines:
        return name
    reason = f"{name}: {lines[0]}"
    rest = [t for t in lines[1:] if any(c.isalpha() for c in t)]
    causes = [t for t in rest if _CAUSE.search(t)]
    return _fit(reason, f" ... {(causes or rest)[-1]}" if reason.endswith(":") and (causes or rest) else "")


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


def check_output(result, inputs: BatchInputs, returns_lse: bool = False,
                 lse_base: float = math.e) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(out, lse) of a prepared callable's `result`: `out` alone, or `(out, lse)` when the backend
    declares `returns_lse` (lse None otherwise), lse converted to natural log from the backend's
    `lse_base` (lse * ln(base): a new tensor, the callable's own buffer untouched).

    Raises:
        TypeError/ValueError: `out` not a (sum T_b, Hq, D) tensor in inputs.dtype; with `returns_lse`,
            `result` not a pair or lse not a (sum T_b, Hq) float32 tensor.
    """
    lse = None
    if returns_lse:
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise TypeError(f"prepared callable returned {type(result).__name__}, expected (out, lse): the backend "
                            "declares returns_lse = True")
        result, lse = result
    out = result
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"prepared callable returned {type(out).__name__}, expected a torch.Tensor")
    if tuple(out.shape) != tuple(inputs.q.shape):
        raise ValueError(f"output shape {tuple(out.shape)} != expected (sum T_b, Hq, D) = {tuple(inputs.q.shape)}")
    if out.dtype != inputs.dtype:
        raise TypeError(f"output dtype {out.dtype} != expected {inputs.dtype}")
    if returns_lse:
        if not isinstance(lse, torch.Tensor):
            raise TypeError(f"lse is {type(lse).__name__}, expected a (sum T_b, Hq) float32 torch.Tensor")
        if tuple(lse.shape) != tuple(inputs.q.shape[:2]) or lse.dtype != torch.float32:
            raise ValueError(f"lse is {tuple(lse.shape)} {lse.dtype}, expected (sum T_b, Hq) = "
                             f"{tuple(inputs.q.shape[:2])} torch.float32")
        if lse_base != math.e:
            lse = lse * math.log(lse_base)
    return out, lse


def returns_lse(backend) -> bool:
    """The backend's `returns_lse` (False when it has none)."""
    return getattr(backend, "returns_lse", False) is True


def lse_base(backend) -> float:
    """The base of the backend's returned LSE (`Backend.lse_base`; e when it has none)."""
    return float(getattr(backend, "lse_base", math.e))


def kernel_name(fn, backend, inputs: BatchInputs) -> str | None:
    """The path a prepared callable runs, for the row's `kernel`: its `kernel` attribute (read after
    a call, so a callable may name it as it runs), else the backend's `kernel_path(case)`, else None."""
    name = getattr(fn, "kernel", None)
    if name is None and callable(getattr(backend, "kernel_path", None)):
        name = backend.kernel_path(inputs.case)
    return None if name is None or name == "" else str(name)


def bitwise_diff_count(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements of `a` and `b` (same shape and dtype) whose bit patterns differ (NaN == NaN when the bits match)."""
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return int((a.contiguous().view(as_int) != b.contiguous().view(as_int)).sum())


def determinism(fn: Callable, out: tuple, inputs: BatchInputs, row: dict, with_lse: bool = False,
                base: float = math.e, calls: int = 1, declared: bool = True) -> tuple[tuple, str | None]:
    """Calls `fn` `calls` more times and compares each bitwise with the first call's (out, lse), lse
    in the backend's `lse_base` converted as `check_output` does; sets row["deterministic"].
    `declared`: the backend's `deterministic` (default True), whose reason ends with
    NONDETERMINISM_HINT (the opt-out it has not taken).

    Returns:
        (a copy of the first (out, lse), None or the nondeterminism reason, naming the first call
        that differs).
    """
    # the callable may hand back persistent buffers: keep the first call's bits
    first = tuple(None if t is None else t.clone() for t in out)
    for k in range(2, calls + 2):
        again = check_output(fn(), inputs, with_lse, base)
        n = sum(bitwise_diff_count(a, b) for a, b in zip(first, again) if a is not None and b is not None)
        if n:
            break
    row["deterministic"] = n == 0
    if n == 0:
        return first, None
    total = sum(t.numel() for t in first if t is not None)
    what = "output and LSE" if with_lse else "output"
    between = "two calls" if k == 2 else f"calls 1 and {k}"
    hint = f"; {NONDETERMINISM_HINT}" if declared else ""
    return first, f"nondeterministic: {n} of {total} {what} elements differ bitwise between {between}{hint}"


def join(*reasons: str | None) -> str | None:
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


def prepared(backend, inputs: BatchInputs, data: CaseData, device: torch.device):
    """Prepares `backend` on the backend view of `inputs` and calls it once.

    Returns:
        (the prepared callable, its first (out, lse) -- lse None unless the backend
        `returns_lse` --, a function raising InputsMutated when the backend has since
        written into `inputs`).

    Raises:
        whatever the backend raises; InputsMutated; TypeError for a prepare that returned no callable,
        TypeError/ValueError for a bad output.
    """
    fps = input_fingerprints(inputs)

    def check_inputs() -> None:
        changed = mutated_inputs(inputs, fps)
        if changed:
            data.invalidate(device)  # the next backend gets freshly built inputs and reference
            raise InputsMutated(changed)

    try:
        fn = backend.prepare(inputs.for_backend())
        if not callable(fn):
            raise TypeError(f"the backend's prepare returned {_what(fn)}, not a callable: prepare(inputs) returns "
                            "the zero-argument callable that is timed")
        out = fn()
    except BaseException:
        if mutated_inputs(inputs, fps):
            data.invalidate(device)
        raise
    check_inputs()
    return fn, check_output(out, inputs, returns_lse(backend), lse_base(backend)), check_inputs


def _what(value) -> str:
    """'None', or 'a value of type NAME' (a backend's value is untrusted: its repr is not called)."""
    return "None" if value is None else f"a value of type {type(value).__name__}"


def compared(out: tuple, ref: torch.Tensor, inputs: BatchInputs,
             ref_lse: torch.Tensor | None = None) -> tuple[dict, str | None]:
    """(correctness record without `passed`, None or the mismatch reason) of a call's (out, lse);
    the LSE, when there is one, is compared with `ref_lse` and its max error is `lse_max_abs_err`."""
    o, lse = out
    rec = compare(o, ref, inputs.qo_indptr, inputs.case.dtype, kv_dtype=inputs.case.kv_dtype).as_row()
    bad = None if rec.pop("passed") else _mismatch_reason(rec)
    rec["lse_max_abs_err"] = None
    if lse is not None and ref_lse is not None:
        lrec = compare_lse(lse, ref_lse, inputs.qo_indptr, inputs.case.dtype)
        rec["lse_max_abs_err"] = lrec.max_abs_err
        bad = bad if lrec.passed else join(bad, lrec.reason())
    return rec, bad


def check_step(backend, data: CaseData, device: torch.device, mask_kind: str, row: dict,
                step: str) -> tuple[dict, str | None, str | None]:
    """Prepare, three calls and the comparison with the reference, on one batch of a check
    (CHECK_CALLS: the first call's result must come back bitwise from the second and the third).

    A declared-deterministic backend (`deterministic`, default True) must repeat bitwise;
    one declaring False has each call compared with the reference instead. Sets
    row["deterministic"] (False when any check step's later calls differed bitwise from its first).

    Returns:
        (the correctness record of the first call, None or why the first call failed, None or why
        the later calls failed); `step` names the batch in the reason a declared-nondeterministic
        backend's row gets.
    """
    inputs, ref = data.get(device, mask_kind)
    ref_lse = data.lse(device, mask_kind)
    with_lse, base = returns_lse(backend), lse_base(backend)
    fn, out, check_inputs = prepared(backend, inputs, data, device)
    if row.get("kernel") is None:
        row["kernel"] = kernel_name(fn, backend, inputs)
    declared = getattr(backend, "deterministic", True)
    out, nondet = determinism(fn, out, inputs, row, with_lse, base, calls=CHECK_CALLS - 1, declared=declared)
    again = check_output(fn(), inputs, with_lse, base) if nondet else None
    check_inputs()
    del fn
    rec, bad = compared(out, ref, inputs, ref_lse)
    later = None
    if nondet and declared:
        later = "repeat: " + nondet.removeprefix("nondeterministic: ")
    elif nondet:
        assert again is not None  # called above whenever nondet
        later = compared(again, ref, inputs, ref_lse)[1]
        row["reason"] = join(row.get("reason"), f"{step}: declared nondeterministic (deterministic = False); "
                              + nondet.removeprefix("nondeterministic: "))
    return rec, bad, later


def check_pair(backend, data: CaseData, device: torch.device, mask_kind: str, row: dict) -> None:
    """The check of one pair: the case (prepare, call, repeat, compare) and then its alternate
    (re-prepare on other draws of the same axes, call, repeat, compare). Fills `row`, its
    `failed_step` the step where a failure was found (FAILED_STEPS; None for a pass): the step in
    progress is set before it runs, so an exception the caller turns into an error row keeps it."""
    enter_step(row, FIRST_PREPARE)
    rec, bad, later = check_step(backend, data, device, mask_kind, row, FIRST_PREPARE)
    row.update(rec)
    if bad or later:
        row.update(status="mismatch", reason=join(f"{FIRST_PREPARE}: {join(bad, later)}", row.get("reason")),
                   failed_step=FIRST_PREPARE if bad else REPEAT)
        return
    step = f"{REPREPARE_STEP} of the same axes (seed {data.alternate().case.seed})"
    enter_step(row, RE_PREPARE)
    try:
        rec2, bad2, later2 = check_step(backend, data.alternate(), device, mask_kind, row, step)
    except BaseException as e:  # noqa: BLE001 -- the backend's error on the second batch (signal_stop: a Ctrl-C goes on up)
        if signal_stop(e):
            raise
        row.update(status="error", reason=join(f"{step}: {error_reason(e)}", row.get("reason")))
        return
    if bad2 or later2:
        row.update(rec2, status="mismatch", reason=join(f"{step}: {join(bad2, later2)}", row.get("reason")))
    else:
        row.update(status="pass", failed_step=None)
