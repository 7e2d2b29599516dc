"""What a sweep shows while it runs, and how long a planned one should take.

On a terminal: rich's progress bar (the pair in flight, done / total, time left),
erased when the sweep ends. Anywhere else (``> log 2>&1``, a CI log, a pipe) rich
shows nothing, so `LineProgress` prints plain lines instead::

    [37/378] torch_sdpa on B16-L1024-full:3:2-...: pass (12.0 s elapsed, about 1 min 40 s left)

one per finished pair while pairs take 1 s or more on average, else one every
10 s, and always the last. ``--quiet`` shows neither.

`estimate` is the cheap model behind ``--dry-run``'s time line: the pairs to run
times the seconds per pair of earlier runs stored in the results file (the span
of each run's row timestamps over its pairs; this env's runs first, else any
env's), or, without such rows, a per-device constant (`SECONDS_PER_PAIR`), and
says which.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

EVERY_S = 10.0          # a line at least this often (seconds) when pairs are fast
SLOW_PAIR_S = 1.0       # a line per pair once pairs take this long on average (seconds)
# Rough seconds per (case, backend) pair that runs, by (mode, device type): seed-suite sizes,
# correctness only (check) or correctness and timing (run); skipped pairs cost nothing.
SECONDS_PER_PAIR = {("check", "cpu"): 1.0, ("run", "cpu"): 4.0, ("check", "cuda"): 0.3, ("run", "cuda"): 1.5}


def plural(n: int, noun: str, many: str | None = None) -> str:
    """'1 pair', '2 pairs', '0 pairs': the count and its noun, in the plural (`many`, else noun + 's')
    unless n is 1. Every count-and-noun of treebench's output lines goes through it."""
    return f"{n} {noun if n == 1 else many or noun + 's'}"


def format_duration(seconds: float) -> str:
    """'0.4 s', '12.0 s', '1 min 40 s', '2 h 5 min' (rounded down to the unit shown)."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


class LineProgress:
    """Plain progress lines (see the module docstring) written to `stream`.

    Args:
        total: pairs the sweep runs.
        stream: where the lines go (stderr); a write that fails (a closed pipe) stops them,
            never the sweep.
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(self, total: int, stream: TextIO, clock: Callable[[], float] = time.monotonic):
        self.total, self.clock = total, clock
        self.stream: TextIO | None = stream
        self.done_pairs = 0
        self.t0 = self.last = clock()

    def start(self, label: str) -> None:
        """A pair begins (nothing is printed: lines come when pairs end)."""

    def finish(self, row: dict) -> None:
        """A pair ended with `row`: prints its line when one is due."""
        self.done_pairs += 1
        now = self.clock()
        elapsed = now - self.t0
        slow = elapsed / self.done_pairs >= SLOW_PAIR_S
        if self.done_pairs < self.total and not slow and now - self.last < EVERY_S:
            return
        self.last = now
        left = elapsed / self.done_pairs * (self.total - self.done_pairs)
        when = "done" if self.done_pairs >= self.total else f"about {format_duration(left)} left"
        self._write(f"[{self.done_pairs}/{self.total}] {row['backend']} on {row['case_id']}: {row['status']} "
                    f"({format_duration(elapsed)} elapsed, {when})")

    def _write(self, line: str) -> None:
        if self.stream is None:
            return
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):   # a closed pipe or file: the sweep goes on without lines
            self.stream = None


class BarProgress:
    """rich's transient progress bar on a terminal console."""

    def __init__(self, total: int, console: Console):
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeRemainingColumn(), console=console, transient=True)
        self.task = self.bar.add_task("starting", total=total)

    def start(self, label: str) -> None:
        """Shows the pair in flight."""
        self.bar.update(self.task, description=label)

    def finish(self, row: dict) -> None:
        """One more pair done."""
        self.bar.advance(self.task)


class NoProgress:
    """--quiet: nothing."""

    def start(self, label: str) -> None:
        """Nothing."""

    def finish(self, row: dict) -> None:
        """Nothing."""


class progress:
    """Context manager giving the progress display of a sweep of `total` pairs: none when
    `quiet`, the bar on a terminal, plain lines elsewhere (`LineProgress`)."""

    def __init__(self, total: int, quiet: bool, console: Console | None):
        self.total, self.quiet = total, quiet
        self.console = console or Console(stderr=True)

    def __enter__(self):
        if self.quiet:
            self.shown = NoProgress()
        elif self.console.is_terminal:
            self.shown = BarProgress(self.total, self.console)
            self.shown.bar.start()
        else:
            self.shown = LineProgress(self.total, self.console.file)
        return self.shown

    def __exit__(self, *exc) -> None:
        if isinstance(self.shown, BarProgress):
            self.shown.bar.stop()


def stored_seconds_per_pair(rows: Iterable[dict], env_id: str | None) -> tuple[float, int] | None:
    """(seconds per pair, pairs it is based on) from the row timestamps of earlier runs of
    `env_id` (of any env when None): per run, the span from its first to its last row over its
    rows that ran (not skipped) but one; None without a run of at least 3 such rows spanning over 0 s."""
    runs: dict[str, list[float]] = {}
    for r in rows:
        if (env_id is not None and r.get("env") != env_id) or r.get("status") == "skipped" or not r.get("timestamp"):
            continue
        try:
            runs.setdefault(r.get("run_id") or "", []).append(datetime.fromisoformat(r["timestamp"]).timestamp())
        except (TypeError, ValueError):
            continue
    span = pairs = 0.0
    for stamps in runs.values():
        if len(stamps) >= 3:
            span, pairs = span + max(stamps) - min(stamps), pairs + len(stamps) - 1
    return (span / pairs, int(pairs)) if span > 0 else None


def estimate(pairs: int, mode: str, device: str, rows: Iterable[dict] = (), env_id: str | None = None,
             source: str = "") -> str:
    """'about 4 min 0 s (60 pairs x 4.0 s, ...)': the time `pairs` pairs that run should take,
    and what the figure is based on: the row timestamps of earlier runs in `source` (this env's,
    else any env's), else `SECONDS_PER_PAIR`."""
    rows = list(rows)
    mine, anyone = stored_seconds_per_pair(rows, env_id), stored_seconds_per_pair(rows, None)
    found = mine if mine is not None else anyone
    if found is not None:
        per, n = found
        whose = "this env" if mine is not None else "other envs (another commit, machine or versions)"
        basis = f"measured over {plural(n, 'earlier pair')} of {whose} in {source}"
    else:
        per = SECONDS_PER_PAIR.get((mode, device.split(":")[0]), SECONDS_PER_PAIR[(mode, "cpu")])
        basis = (f"a rough constant of {per:g} s per {mode} pair on {device.split(':')[0]}; "
                 "no earlier run in the file with 3 or more timed rows over more than 0 s to measure from")
    return f"about {format_duration(pairs * per)} ({plural(pairs, 'pair')} x {per:.2f} s: {basis})"
