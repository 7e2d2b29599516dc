"""The check's power: run the default check on every mutant and every correct variant.

A mutant is *killed* when the check would exit 1 on it (a row mismatched or errored,
or with `determinism` a row was nondeterministic), and *survives* otherwise; a
correct variant must pass every case. Each pair runs in process through
`treebench.harness.run.pair.run_case_backend`, the step `treebench check` runs per
(case, backend); a case's inputs and float64 reference are built once and shared
by every backend.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from treebench.harness.errors import ConfigError
from treebench.harness.model.cases import Case
from treebench.harness.run.config import RunConfig
from treebench.harness.run.pair import CaseData, run_case_backend
from treebench.harness.run.runner import default_device
from treebench.harness.selftest.dense import Dense
from treebench.harness.selftest.mutants_field import ALL_MUTANTS
from treebench.harness.selftest.variants import CORRECT

FAILED = ("mismatch", "error")  # row statuses that make `check` exit 1
DEVICE_TYPES = ("cpu", "cuda")  # the devices the selftest runs on (the harness's timers and memory checks know these)


def selftest_device(device: str | None) -> torch.device:
    """The device the selftest runs on: `device` ("cpu", "cuda", "cuda:N"), None: cuda when available, else cpu.

    Raises:
        ConfigError: `device` is not a torch device string, is not a device type the selftest runs on
            (meta, mps, ...), or names CUDA where torch sees no GPU or fewer than N + 1 of them.
    """
    if device is None:
        return default_device()
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ConfigError(f"--device {device}: not a torch device; give cpu, cuda or cuda:N") from None
    if dev.type not in DEVICE_TYPES:
        raise ConfigError(f"--device {device}: not a device selftest can run on; give cpu, cuda or cuda:N")
    gpus = torch.cuda.device_count() if dev.type == "cuda" and torch.cuda.is_available() else 0
    if dev.type == "cuda" and not gpus:
        raise ConfigError(f"--device {device}: CUDA is not available here (torch {torch.__version__} sees no GPU); "
                          "give --device cpu")
    if dev.type == "cuda" and (dev.index or 0) >= gpus:
        raise ConfigError(f"--device {device}: not available here: torch sees {gpus} GPU(s), cuda:0 to cuda:{gpus - 1}")
    return dev


def _default_cases(backend) -> list[Case]:
    """The default check's cases for `backend`: `treebench check` without --suite, built from the
    backend's Capabilities (treebench.harness.checking.default_check)."""
    from treebench.harness.checking.default_check import default_check_cases

    return default_check_cases(backend)[0]


@dataclass(frozen=True)
class Outcome:
    """What the check did to one backend of the selftest."""

    name: str                   # the backend's name
    mutant: bool                # True: a mutant (should fail the check); False: a correct variant (should pass)
    description: str            # one line: what the backend does (wrong)
    axis: str | None            # the coverage axis a check needs to kill this mutant (None: a correct variant)
    upstream: str | None        # the upstream fix this bug reproduces, or None
    failed_check: bool          # the check would exit 1 on this backend
    evidence: str               # the first failing row, "case_id: status: reason", or "" when none failed
    cases: int                  # cases the check ran on it
    errored: bool = False       # that first failing row is an error (the pair raised), not a wrong answer

    @property
    def ok(self) -> bool:
        """A mutant killed, or a correct variant passed."""
        return self.failed_check == self.mutant


def _failure(row: dict, determinism: bool) -> str:
    """'case_id: status: reason' when `row` makes the check fail, else ''."""
    if row["status"] in FAILED:
        return f"{row['case_id']}: {row['status']}: {row.get('reason') or ''}"
    if determinism and row.get("deterministic") is False:
        return f"{row['case_id']}: nondeterministic: {row.get('reason') or ''}"
    return ""


def check_backend(cls: type[Dense], cases_for: Callable[[object], Sequence[Case]], data: dict[str, CaseData],
                  config: RunConfig, device: torch.device) -> Outcome:
    """Runs the check's cases on one fresh instance of `cls` (all cases, in order, as `check` does)."""
    backend = cls()
    cases = list(cases_for(backend))
    evidence, errored = "", False
    for case in cases:
        row = run_case_backend(backend, case, data.setdefault(case.case_id, CaseData(case)), None, device, config)
        if not evidence:
            evidence, errored = _failure(row, config.determinism), row["status"] == "error"
    return Outcome(name=cls.name, mutant=cls.axis is not None, description=cls.description, axis=cls.axis,
                   upstream=cls.upstream, failed_check=bool(evidence), evidence=evidence, cases=len(cases),
                   errored=errored)


def selftest(backends: Sequence[type[Dense]] = (*CORRECT, *ALL_MUTANTS),
             cases_for: Callable[[object], Sequence[Case]] = _default_cases,
             determinism: bool = False, device: str | None = None,
             on_outcome: Callable[[Outcome], None] | None = None, threads: int | None = None) -> list[Outcome]:
    """The check's verdict on every backend class of `backends` (correct variants and mutants).

    Args:
        backends: Dense subclasses; one whose `axis` is None is a correct variant.
        cases_for: backend instance -> the check's cases for it (default: the default check).
        determinism: run each prepared callable twice and count a bitwise difference as a failure
            (`check --determinism`).
        device: torch device (`selftest_device`); None: cuda when available, else cpu.
        on_outcome: called with each outcome as soon as it is known (progress).
        threads: torch intra-op threads of each pair's correctness work (RunConfig.threads; `selftest
            --threads`); None: torch's count as it stands.

    Raises:
        ConfigError: a device the selftest cannot run on here (checked before anything runs), or
            the check's suite cannot be read.
        ValueError: threads < 1.
    """
    dev = selftest_device(device)
    config = RunConfig(mode="check", device=str(dev), quiet=True, determinism=determinism, check_memory=False,
                       threads=threads)
    data: dict[str, CaseData] = {}
    out = []
    for cls in backends:
        outcome = check_backend(cls, cases_for, data, config, dev)
        out.append(outcome)
        if on_outcome:
            on_outcome(outcome)
    return out
