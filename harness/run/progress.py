"""What a sweep shows while it runs, and how long a planned one should take.

On a terminal: rich's progress bar (the pair in flight, done / total, time left),
erased when the sweep ends. Anywhere else (``> log 2>&1``, a CI log, a pipe) rich
shows nothing, so `LineProgress` prints plain lines instead::

    [37/378] torch_sdpa on B16-L1024-full:3:2-...: pass (12.0 s elapsed, about 1 min 40 s left)

one per finished pair while pairs take 1 s or more on average, else one every
10 s, and always the last. ``--quiet`` shows neither.

The time left allows for warm-up. A backend's first pair that runs (not skipped)
carries its one-off costs, a JIT compile or autotuning (FlashInfer's took about
40 s in a GPU sweep whose pairs took about 1 s), so its time is kept apart; a
pair's time is the span since the previous pair ended. Each backend's pairs left
cost its mean over its other pairs (skipped ones included: the pairs left skip
alike), else the mean over every backend's such steady pairs, plus one warm-up
(the mean of the first pairs seen) for a backend yet to run a pair (so one too
many for a backend that skips them all). Before any steady pair (the first case
of a case-major sweep) the line says the time left is not known yet instead of
scaling the warm-ups up. Without the backend of each pair (`LineProgress`'s
`backends`), the pairs left cost the steady mean, no warm-up.

`estimate` is the cheap model behind ``--dry-run``'s time line: the pairs to run
times the seconds per pair of earlier runs stored in the results file (the span
of each run's row timestamps over its pairs; this env's runs first, else any
env's), or, without such rows, a per-device constant (`SECONDS_PER_PAIR`), and
says which.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

EVERY_S = 10.0          # a line at least this often (seconds) when pairs are fast
SLOW_PAIR_S = 1.0       # a line per pair once pairs take this long on average (seconds)
# Rough seconds per (case, backend) pair that runs, by (mode, device type): correctness only (check)
# or correctness and timing (run); skipped pairs cost nothing. The time follows the case sizes, so each
# figure names the suite it is for (SIZES_OF). CPU: measured on a 2-core AMD EPYC container
# (`nproc` 2) as `stored_seconds_per_pair` does, from row timestamps: run 0.091, 0.093 and 0.101 s in
# three `treebench run` (suite smoke, 32 pairs, the 4 CPU backends); check 0.070 s pooled over two
# `treebench check --backend B` (its default check, 44 pairs) per CPU backend (torch_sdpa 0.012,
# reference 0.027, two_pass 0.026, flex 0.21). The seed suite's first 6 cases (`run --suite seed
# --shard 0/21`) took 5.6 s per run pair there. CUDA: seed-suite sizes.
SECONDS_PER_PAIR = {("check", "cpu"): 0.07, ("run", "cpu"): 0.1, ("check", "cuda"): 0.3, ("run", "cuda"): 1.5}
SIZES_OF = {("check", "cpu"): "a default check's", ("run", "cpu"): "the smoke suite's",   # whose case sizes
            ("check", "cuda"): "the seed suite's", ("run", "cuda"): "the seed suite's"}


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
        backends: the backend name of each of the `total` pairs, in any order; None when not
            known (the time left then adds no warm-up for backends yet to run a pair).

    Raises:
        ValueError: `backends` does not name `total` pairs.
    """

    def __init__(self, total: int, stream: TextIO, clock: Callable[[], float] = time.monotonic,
                 backends: Iterable[str] | None = None):
        self.total, self.clock = total, clock
        self.stream: TextIO | None = stream
        self.done_pairs = 0
        self.t0 = self.last = self.ended = clock()
        self.to_do: Counter[str] | None = None if backends is None else Counter(backends)  # backend -> pairs left
        if self.to_do is not None and sum(self.to_do.values()) != total:
            raise ValueError(f"backends names {sum(self.to_do.values())} pairs, total is {total}")
        self.warm: set[str] = set()             # backends whose first pair that ran (not skipped) is done
        self.warmup_s: list[float] = []         # those first pairs' times (seconds)
        self.steady_s: dict[str, list[float]] = {}   # backend -> its other pairs' times (seconds)

    def start(self, label: str) -> None:
        """A pair begins (nothing is printed: lines come when pairs end)."""

    def finish(self, row: dict) -> None:
        """A pair ended with `row` (its 'backend', 'case_id', 'status'): prints its line when one is due."""
        self.done_pairs += 1
        now = self.clock()
        self._record(row, now - self.ended)
        self.ended = now
        elapsed = now - self.t0
        slow = elapsed / self.done_pairs >= SLOW_PAIR_S
        if self.done_pairs < self.total and not slow and now - self.last < EVERY_S:
            return
        self.last = now
        left = self.left_s()
        when = ("done" if self.done_pairs >= self.total else "warming up, time left not known yet" if left is None
                else f"about {format_duration(left)} left")
        self._write(f"[{self.done_pairs}/{self.total}] {row['backend']} on {row['case_id']}: {row['status']} "
                    f"({format_duration(elapsed)} elapsed, {when})")

    def _record(self, row: dict, pair_s: float) -> None:
        """Files the pair's time (seconds) as its backend's warm-up or as a steady pair."""
        name = row.get("backend", "")
        if self.to_do is not None and self.to_do[name] > 0:
            self.to_do[name] -= 1
        if name not in self.warm and row.get("status") != "skipped":
            self.warm.add(name)
            self.warmup_s.append(pair_s)
        else:
            self.steady_s.setdefault(name, []).append(pair_s)

    def left_s(self) -> float | None:
        """Seconds the pairs not yet done should take (the module docstring's model); None
        while a steady time per pair is needed and no steady pair has been timed."""
        steady = [s for times in self.steady_s.values() for s in times]
        overall = sum(steady) / len(steady) if steady else None
        if self.to_do is None:
            return None if overall is None else overall * (self.total - self.done_pairs)
        left = 0.0
        for name, n in self.to_do.items():
            if n and name not in self.warm:         # its first pair that runs: a warm-up like those seen
                if not self.warmup_s:
                    return None
                left, n = left + sum(self.warmup_s) / len(self.warmup_s), n - 1
            mine = self.steady_s.get(name)
            per = sum(mine) / len(mine) if mine else overall
            if n and per is None:
                return None
            left += n * (per or 0.0)
        return left

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
    `quiet`, the bar on a terminal, plain lines elsewhere (`LineProgress`, given `backends`:
    each pair's backend name, or None)."""

    def __init__(self, total: int, quiet: bool, console: Console | None, backends: Iterable[str] | None = None):
        self.total, self.quiet, self.backends = total, quiet, backends
        self.console = console or Console(stderr=True)

    def __enter__(self):
        if self.quiet:
            self.shown = NoProgress()
        elif self.console.is_terminal:
            self.shown = BarProgress(self.total, self.console)
            self.shown.bar.start()
        else:
            self.shown = LineProgress(self.total, self.console.file, backends=self.backends)
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
    """'about 6.0 s (60 pairs x 0.10 s: ...)': the time `pairs` pairs that run should take (their
    `mode`, 'run' or 'check', on `device`, e.g. 'cuda:0'), and what the figure is based on: the row
    timestamps of earlier runs in `source` (this env's, else any env's), else `SECONDS_PER_PAIR`
    (the CPU's for a device type it lacks)."""
    rows = list(rows)
    mine, anyone = stored_seconds_per_pair(rows, env_id), stored_seconds_per_pair(rows, None)
    found = mine if mine is not None else anyone
    if found is not None:
        per, n = found
        whose = "this env" if mine is not None else "other envs (another commit, machine or versions)"
        basis = f"measured over {plural(n, 'earlier pair')} of {whose} in {source}"
    else:
        kind = device.split(":")[0] if (mode, device.split(":")[0]) in SECONDS_PER_PAIR else "cpu"
        per = SECONDS_PER_PAIR[(mode, kind)]
        basis = (f"a rough constant of {per:g} s per {mode} pair on {kind}, for {SIZES_OF[(mode, kind)]} case sizes; "
                 "no earlier run in the file with 3 or more timed rows over more than 0 s to measure from")
    return f"about {format_duration(pairs * per)} ({plural(pairs, 'pair')} x {per:.2f} s: {basis})"
