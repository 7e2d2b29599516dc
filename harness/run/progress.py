"""What a sweep shows while it runs, and how long a planned one should take.

On a terminal: rich's progress bar (the pair in flight, done / total, time left),
erased when the sweep ends; on a narrow terminal the case id is cut short ("…") so that
the backend, done / total and the time left stay whole. Anywhere else (``> log 2>&1``, a CI log, a pipe) rich
shows nothing, so `LineProgress` prints plain lines instead::

    [50/378] torch_sdpa on B16-L1024-full:3:2-...: pass (12.0 s elapsed, about 1 min 20 s left)

at a steady interval in pairs and always the last. The interval, `line_step`, is the smallest of
1, 2, 5, 10, 20, 50, ... pairs that gives at most `LINES` lines (every pair of 8, every 5th of 32,
every 50th of 378), so a sweep of any length shows five to ten (all of one under five pairs), evenly spaced. A sweep's first
pairs carry its warm-ups (a JIT compile), so the pace of pairs says nothing of when the next line
is due: the lines count pairs. Where `EVERY_S` seconds pass without a line (a slow sweep, a long
warm-up), the next pair to end prints one too: a long sweep is never silent for more than that
and a pair, and still quiet (a few lines a minute at most). Where work follows the last pair
(`then`: a run's report), the last
line and the bar say what it is in place of "done", with the seconds it should take::

    [378/378] torch_sdpa on B16-L1024-full:3:2-...: pass (10 min 2 s elapsed, writing the report, about 2.2 s left)

and on a terminal, where the bar is erased when the sweep ends, `after_pairs` shows it until it is
done. Torchrun's rank 0 waits for the other ranks first, for as long as they take: its last line and
bar say that in place of the report, with no seconds (``..., waiting for ranks 1-3)``), and the report
gets a line of its own (`after_pairs`) once the wait is over. ``--quiet`` shows none of these.

The time left allows for warm-up and for pairs of different sizes. A backend's first pair that
runs (not skipped) carries its one-off costs, a JIT compile or autotuning (FlashInfer's took about
40 s in a GPU sweep whose pairs took about 1 s), so its time is kept apart; a pair's time is the
span since the previous pair ended. Each backend's pairs left cost their `PAIR_COSTS` seconds
(`pair_seconds`, as ``--dry-run`` counts them) x its measured / predicted seconds over its other
pairs (skipped ones included: the pairs left skip alike), else that ratio over every backend's such
steady pairs, so a sweep whose large cases come last is not timed at its small cases' pace; plus one
warm-up (the mean of the first pairs seen) in place of the first pair left of a backend yet to run
a pair (one too many for a backend that skips them all). Before any steady pair (the first case of
a case-major sweep) the line says the time left is not known yet instead of scaling the warm-ups
up. Without the backend of each pair (`TimeLeft`'s `backends`) the pairs left cost the steady mean,
no warm-up; without their `costs` they count alike. To the pairs left it adds the seconds after the
last pair (`after_s`: the summary, and the report when one follows, `after_last_pair_s`, as
``--dry-run`` counts them). The bar and the lines show the same figure (`TimeLeft.left_text`),
updated as each pair ends.

Also here, as every console of treebench is one: `TerminalConsole`, a rich console that ignores a
COLUMNS or LINES that is no terminal size (`terminal_size`), as a terminal does.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, Task, TextColumn
from rich.spinner import Spinner
from rich.table import Column
from rich.text import Text

LINES = 10              # lines at the steady interval over a sweep, at most (`line_step`), the last apart
EVERY_S = 30.0          # a line when a pair ends this long (seconds) or more after the previous line
REPORT_NEXT = "writing the report"   # what follows a run's last pair (`then`, `after_pairs`)
SIZE_VARIABLES = ("COLUMNS", "LINES")   # the terminal's size, as the environment may give it


def terminal_size(text: str | None) -> int | None:
    """A COLUMNS or LINES value as a terminal reads it: a positive integer in ASCII digits 0-9, below 10**6
    ('80', '080'); None for any other ('', '0', '-5', 'abc', '²', '１２', '8_0'), which is then ignored."""
    return int(text) if text and re.fullmatch(r"0*[1-9][0-9]{0,5}", text) else None


class _TerminalEnviron(Mapping[str, str]):
    """os.environ, read afresh at each look-up, less a COLUMNS or LINES that `terminal_size` ignores."""

    def __getitem__(self, key: str) -> str:
        value = os.environ[key]
        if key in SIZE_VARIABLES and terminal_size(value) is None:
            raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[str]:
        return (k for k in list(os.environ) if k in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class TerminalConsole(Console):
    """The rich console every console of treebench is: rich reads COLUMNS and LINES from its environment
    with str.isdigit() and then int(), which '²' passes and then fails (a traceback from any command that
    prints), and takes COLUMNS=0 as a width of no columns; this one's environment (`_TerminalEnviron`)
    leaves out such a value, as a terminal ignores it, so rich asks the terminal, or takes 80 columns off one."""

    _environ = _TerminalEnviron()


def _pace(pairs: list[tuple[float, float]]) -> float | None:
    """Measured over predicted seconds of (measured, predicted seconds) `pairs`; None without any."""
    return sum(m for m, _ in pairs) / sum(c for _, c in pairs) if pairs else None


def plural(n: int, noun: str, many: str | None = None) -> str:
    """'1 pair', '2 pairs', '0 pairs': the count and its noun, in the plural (`many`, else noun + 's')
    unless n is 1. Every count-and-noun of treebench's output lines goes through it."""
    return f"{n} {noun if n == 1 else many or noun + 's'}"


def line_step(total: int) -> int:
    """Pairs between two plain lines of a sweep of `total` pairs: the smallest of 1, 2, 5, 10, 20,
    50, ... that gives at most LINES lines (8 pairs: 1, 32: 5, 378: 50, 10^4: 1000)."""
    for magnitude in itertools.count():
        for m in (1, 2, 5):
            if m * 10 ** magnitude * LINES >= total:
                return m * 10 ** magnitude
    raise AssertionError("unreachable")   # itertools.count() does not end


def format_duration(seconds: float) -> str:
    """'4.2 ms', '37 ms' (under 0.1 s: a check's pairs on a GPU take milliseconds), '0.4 s', '12.0 s',
    '1 min 40 s', '2 h 5 min' (minutes and hours rounded down to the unit shown)."""
    if seconds < 0.1:
        ms = seconds * 1e3
        return f"{ms:.1f} ms" if ms < 10 else f"{ms:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


class TimeLeft:
    """How long the pairs not yet done should take (the module docstring's model), fed each
    pair's row as it ends; what the plain lines and the bar both show.

    Args:
        total: pairs the sweep runs.
        clock: monotonic seconds (tests pass a fake one).
        backends: the backend name of each of the `total` pairs, each backend's pairs in the order
            they run; None when not known (the time left then adds no warm-up for backends yet
            to run a pair).
        costs: the predicted seconds of each pair of `backends`, in its order (`pair_seconds`);
            None: every pair alike.
        after_s: seconds the sweep should take after its last pair (`after_last_pair_s`), added to
            the time left until that pair is done.
        then: what follows the last pair, said in place of "done" once it ends (`REPORT_NEXT`
            for a run); "" says "done".

    Raises:
        ValueError: `backends` does not name `total` pairs, or `costs` is given without
            `backends`, for another number of pairs or with a cost that is not positive.
    """

    def __init__(self, total: int, clock: Callable[[], float] = time.monotonic,
                 backends: Iterable[str] | None = None, costs: Iterable[float] | None = None, after_s: float = 0.0,
                 then: str = ""):
        self.total, self.clock, self.after_s, self.then = total, clock, after_s, then
        self.done_pairs = 0
        self.t0 = self.ended = clock()
        names = None if backends is None else list(backends)
        if names is not None and len(names) != total:
            raise ValueError(f"backends names {len(names)} pairs, total is {total}")
        weights = [1.0] * total if costs is None else list(costs)
        if costs is not None and (names is None or len(weights) != total or min(weights, default=1.0) <= 0):
            raise ValueError(f"costs must give a positive cost for each of the {total} pairs of backends")
        self.to_do: dict[str, deque[float]] | None = None   # backend -> predicted seconds of its pairs left, in order
        if names is not None:
            self.to_do = {}
            for name, cost in zip(names, weights):
                self.to_do.setdefault(name, deque()).append(cost)
        self.warm: set[str] = set()             # backends whose first pair that ran (not skipped) is done
        self.warmup_s: list[float] = []         # those first pairs' times (seconds)
        self.steady: dict[str, list[tuple[float, float]]] = {}   # backend -> (measured, predicted seconds) of its other pairs

    def record(self, row: dict) -> float:
        """A pair ended with `row` (its 'backend', 'status'): files its time (seconds since the
        previous pair ended) as its backend's warm-up or as a steady pair, beside its predicted
        seconds; returns the clock now."""
        self.done_pairs += 1
        now = self.clock()
        pair_s, self.ended = now - self.ended, now
        name = row.get("backend", "")
        mine = self.to_do.get(name) if self.to_do is not None else None
        cost = mine.popleft() if mine else 1.0
        if name not in self.warm and row.get("status") != "skipped":
            self.warm.add(name)
            self.warmup_s.append(pair_s)
        else:
            self.steady.setdefault(name, []).append((pair_s, cost))
        return now

    def left_s(self) -> float | None:
        """Seconds the pairs not yet done and what follows the last should take (the module
        docstring's model); None while a steady pace is needed and no steady pair has been timed."""
        overall = _pace([p for pairs in self.steady.values() for p in pairs])
        if self.to_do is None:
            return None if overall is None else overall * (self.total - self.done_pairs) + self.after_s
        left = self.after_s
        for name, pending in self.to_do.items():
            costs = list(pending)
            if costs and name not in self.warm:     # its first pair that runs: a warm-up like those seen
                if not self.warmup_s:
                    return None
                left, costs = left + sum(self.warmup_s) / len(self.warmup_s), costs[1:]
            pace = _pace(self.steady[name]) if name in self.steady else overall
            if costs and pace is None:
                return None
            left += sum(costs) * (pace or 0.0)
        return left

    def left_text(self) -> str:
        """'warming up, time left not known yet' (`left_s` None) or 'about 1 min 40 s left'; after the
        last pair 'done', or what follows it (`then`) with its seconds: 'writing the report, about 2.2 s
        left'."""
        if self.done_pairs >= self.total:
            if not self.then:
                return "done"
            return f"{self.then}, about {format_duration(self.after_s)} left" if self.after_s > 0 else self.then
        left = self.left_s()
        return "warming up, time left not known yet" if left is None else f"about {format_duration(left)} left"


class LineProgress(TimeLeft):
    """Plain progress lines (see the module docstring) written to `stream`.

    Args:
        total: pairs the sweep runs.
        stream: where the lines go (stderr); a write that fails (a closed pipe) stops them,
            never the sweep.
        clock, backends, costs, after_s, then: as `TimeLeft`'s.

    Raises:
        ValueError: as `TimeLeft`'s.
    """

    def __init__(self, total: int, stream: TextIO, clock: Callable[[], float] = time.monotonic,
                 backends: Iterable[str] | None = None, costs: Iterable[float] | None = None, after_s: float = 0.0,
                 then: str = ""):
        super().__init__(total, clock, backends, costs, after_s, then)
        self.stream: TextIO | None = stream
        self.last = self.t0                 # when the previous line was printed (the start before any)
        self.step = line_step(total)

    def start(self, backend: str, case_id: str) -> None:
        """A pair begins (nothing is printed: lines come when pairs end)."""

    def finish(self, row: dict) -> None:
        """A pair ended with `row` (its 'backend', 'case_id', 'status'): prints its line when one is
        due: every `step`-th pair, the last, and one after EVERY_S seconds without a line."""
        now = self.record(row)
        elapsed = now - self.t0
        due = self.done_pairs % self.step == 0 or self.done_pairs >= self.total or now - self.last >= EVERY_S
        if not due:
            return
        self.last = now
        self._write(f"[{self.done_pairs}/{self.total}] {row['backend']} on {row['case_id']}: {row['status']} "
                    f"({format_duration(elapsed)} elapsed, {self.left_text()})")

    def _write(self, line: str) -> None:
        if self.stream is None:
            return
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):   # a closed pipe or file: the sweep goes on without lines
            self.stream = None


class _Shortened(TextColumn):
    """A column of plain text that the bar's table narrows first, cut there with "…" on one line."""

    def __init__(self, text_format: str):
        super().__init__(text_format, markup=False, table_column=Column(overflow="ellipsis"))   # narrowed

    def render(self, task: Task) -> Text:
        text = super().render(task)
        text.no_wrap, text.overflow = True, "ellipsis"
        return text


class BarProgress(TimeLeft):
    """rich's transient progress bar on a terminal console: "BACKEND on CASE_ID ━━━━ N/M TIME LEFT",
    the case id (then the bar) narrowed where the line does not fit; its time left is
    `TimeLeft.left_text`, as the plain lines say it (rich's own column would count each backend's
    warm-up as a pair's pace). Args and errors as `TimeLeft`'s, with the console to draw on."""

    def __init__(self, total: int, console: Console, clock: Callable[[], float] = time.monotonic,
                 backends: Iterable[str] | None = None, costs: Iterable[float] | None = None, after_s: float = 0.0,
                 then: str = ""):
        super().__init__(total, clock, backends, costs, after_s, then)
        whole = Column(no_wrap=True)   # never narrowed: the case id, then the bar, give way
        self.bar = Progress(TextColumn("{task.fields[backend]}", markup=False, table_column=whole),
                            _Shortened("{task.description}"), BarColumn(), MofNCompleteColumn(table_column=whole),
                            TextColumn("{task.fields[left]}", markup=False, table_column=whole),
                            console=console, transient=True)
        self.task = self.bar.add_task("starting", total=total, backend="", left=self.left_text())

    def start(self, backend: str, case_id: str) -> None:
        """Shows the pair in flight, "BACKEND on CASE_ID", as written (a '[bold]' in either is no markup)."""
        self.bar.update(self.task, description=case_id, backend=f"{backend} on")

    def finish(self, row: dict) -> None:
        """One more pair done, and the time left after it."""
        self.record(row)
        self.bar.update(self.task, advance=1, left=self.left_text())


class NoProgress:
    """--quiet: nothing."""

    def start(self, backend: str, case_id: str) -> None:
        """Nothing."""

    def finish(self, row: dict) -> None:
        """Nothing."""


class progress:
    """Context manager giving the progress display of a sweep of `total` pairs: none when
    `quiet`, the bar on a terminal, plain lines elsewhere (`LineProgress`); both given
    `backends`, `costs`, `after_s` and `then` (as `TimeLeft`'s)."""

    def __init__(self, total: int, quiet: bool, console: Console | None, backends: Iterable[str] | None = None,
                 costs: Iterable[float] | None = None, after_s: float = 0.0, then: str = ""):
        self.total, self.quiet, self.console = total, quiet, console or TerminalConsole(stderr=True)
        self.plan = {"backends": backends, "costs": costs, "after_s": after_s, "then": then}

    def __enter__(self):
        if self.quiet:
            self.shown = NoProgress()
        elif self.console.is_terminal:
            self.shown = BarProgress(self.total, self.console, **self.plan)
            self.shown.bar.start()
        else:
            self.shown = LineProgress(self.total, self.console.file, **self.plan)
        return self.shown

    def __exit__(self, *exc) -> None:
        if isinstance(self.shown, BarProgress):
            self.shown.bar.stop()


@contextlib.contextmanager
def after_pairs(console: Console, quiet: bool, said: bool = True) -> Iterator[None]:
    """Shows REPORT_NEXT while the with-block runs, unless `quiet`: the work after a sweep's last pair.
    On a terminal a transient spinner line, where the bar that said it is erased; elsewhere one plain
    line where the last progress line did not say it (`said` False: it said what came first, torchrun
    rank 0's wait for the other ranks: `RunConfig.wait_note`), none where it did (`TimeLeft.left_text`).
    Raises whatever the block raises."""
    if quiet or not console.is_terminal:
        if not (quiet or said):
            with contextlib.suppress(OSError, ValueError):   # a closed pipe or file: the report all the same
                console.file.write(f"{REPORT_NEXT}\n")
                console.file.flush()
        yield
        return
    with Live(Spinner("dots", Text(REPORT_NEXT)), console=console, transient=True) as live:
        live.refresh()   # shown now, not at the spinner's first tick
        yield
