"""What a sweep shows while it runs, and how long a planned one should take.

On a terminal: rich's progress bar (the pair in flight, done / total, time left),
erased when the sweep ends. Anywhere else (``> log 2>&1``, a CI log, a pipe) rich
shows nothing, so `LineProgress` prints plain lines instead::

    [37/378] torch_sdpa on B16-L1024-full:3:2-...: pass (12.0 s elapsed, about 1 min 40 s left)

one per finished pair while pairs take 1 s or more on average, else one every
10 s, and always the last. ``--quiet`` shows neither.

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
no warm-up; without their `costs` they count alike. The bar and the lines show the same figure
(`TimeLeft.left_text`), updated as each pair ends.

`estimate` is the cheap model behind ``--dry-run``'s time line: each pair that will run
costs `PAIR_COSTS`' seconds for its case's size (a fixed part plus a part per K/V value
the query heads read, `workload.kv_values_read`), summed over the pairs. When the results
file holds earlier runs (this env's first, else any env's), the sum is scaled by their
measured time over what the model gives their pairs (each run's span of row timestamps),
so rows of small cases on a fast machine do not predict large cases there at the small
cases' pace. The line says which, and that no earlier run was found in the results file
(nothing without one).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, TextIO

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from treebench.harness.model.workload import kv_values_read

if TYPE_CHECKING:   # the case model loads torch, which `treebench --help` does not
    from treebench.harness.model.cases import Case

EVERY_S = 10.0          # a line at least this often (seconds) when pairs are fast
SLOW_PAIR_S = 1.0       # a line per pair once pairs take this long on average (seconds)
# The cost model of --dry-run's time line, by (mode, device type): correctness only (check) or correctness
# and timing (run); skipped pairs cost nothing. A pair that runs costs fixed_s + s_per_gvalue * V / 1e9
# seconds, V = `kv_values_read` of its case (2 x sum_b S_b x Hq x D).
# CPU: fitted on a 2-core AMD EPYC container (`nproc` 2, torch 2.13.0) by least squares on (modelled /
# measured - 1) per run, a run's measured time being the span of its row timestamps over its rows that ran
# (not skipped) but the first (as `stored_scale` reads it), every CPU backend (flex, reference, torch_sdpa,
# two_pass). run: `treebench run` twice (suite smoke, 31 pairs each, 0.092 s per pair), `treebench run
# --suite seed --shard 0/21` (22 pairs, 5.3 s per pair), `--shard 13/21` (21 pairs, 13.7 s) and a suite in
# between (B 2, 8 x L 256, 2048 x full:3:1, full:3:2; B 64 L 2048 and B 128 L 16 with full:3:0; Hq 32, Hkv 8,
# D 128, P 16; 39 pairs, 7.4 s): 0.09 s + 52.6 s per 1e9 values, modelled / measured 1.00, 1.00, 1.06, 0.81, 1.09.
# check: `treebench check --backend B` (the default check, 167 pairs over the four backends, 0.070 s per pair) and
# `treebench check --suite seed --shard 0/21 --backend B` (19 pairs, 8.2 s), pooled: 0.052 s + 66.6 s per 1e9 values,
# exact on both pools; one backend's pairs alone take 0.2x (torch_sdpa) to 3x (flex, which compiles per shape) what
# the pooled model gives. FLOPs in place of V missed by 10x (a B 64 L 2048 T 1 run pair took 54 s for 2.1 GFLOP, a B
# 64 L 1024 T 40 one 26 s for 43 GFLOP) and FLOPs beside V fitted no better. The seed shards, the suite in between and
# the seed check shared the 2 cores with other work for part of their time (load average up to 2.5).
# CUDA: no size term. Run: 0.81 s per pair over the 1696 pairs that ran in the 5 runs of
# results/h200/seed/seed.jsonl (the seed suite, 14 backends, an H200; 0.41 to 1.15 s per pair by run, each
# backend's first-pair compile included), where a case's mean time per pair did not follow its size (0.14 to
# 2.0 s with no trend from B 1 L 16 to B 64 L 2048). Check: 0.5 s per pair, the median over the 17 backends'
# default checks in results/h200/default-check/ (0.02 to 6.7 s: FlashInfer's backends compile per shape).


@dataclass(frozen=True)
class PairCost:
    """Seconds one (case, backend) pair that runs should take: fixed_s + s_per_gvalue * V / 1e9,
    V being the case's K/V values read (`treebench.harness.model.workload.kv_values_read`)."""

    fixed_s: float        # seconds per pair whatever its size (build, prepare, compare, timing budget, compiles)
    s_per_gvalue: float   # seconds per 1e9 K/V values the query heads read; 0.0: no size term
    fitted_on: str        # where the figures come from, as the time line says it

    def seconds(self, values: int) -> float:
        """Seconds of one pair whose case reads `values` K/V values."""
        return self.fixed_s + self.s_per_gvalue * values / 1e9

    def describe(self, mode: str, kind: str) -> str:
        """The model in words: '0.09 s + 52.6 s per 10^9 K/V values read (...) per run pair on cpu'."""
        if not self.s_per_gvalue:
            return f"{self.fixed_s:g} s per {mode} pair on {kind} whatever its size"
        return (f"{self.fixed_s:g} s + {self.s_per_gvalue:g} s per 10^9 K/V values read (2 x S_b x Hq x D per "
                f"request) per {mode} pair on {kind}")


PAIR_COSTS = {("run", "cpu"): PairCost(0.09, 52.6, "fitted on a 2-core CPU"),
              ("check", "cpu"): PairCost(0.052, 66.6, "fitted on a 2-core CPU"),
              ("run", "cuda"): PairCost(0.8, 0.0, "measured over the seed suite on an H200"),
              ("check", "cuda"): PairCost(0.5, 0.0, "measured over default checks on an H200")}


def _pace(pairs: list[tuple[float, float]]) -> float | None:
    """Measured over predicted seconds of (measured, predicted seconds) `pairs`; None without any."""
    return sum(m for m, _ in pairs) / sum(c for _, c in pairs) if pairs else None


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

    Raises:
        ValueError: `backends` does not name `total` pairs, or `costs` is given without
            `backends`, for another number of pairs or with a cost that is not positive.
    """

    def __init__(self, total: int, clock: Callable[[], float] = time.monotonic,
                 backends: Iterable[str] | None = None, costs: Iterable[float] | None = None):
        self.total, self.clock = total, clock
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
        """Seconds the pairs not yet done should take (the module docstring's model); None
        while a steady pace is needed and no steady pair has been timed."""
        overall = _pace([p for pairs in self.steady.values() for p in pairs])
        if self.to_do is None:
            return None if overall is None else overall * (self.total - self.done_pairs)
        left = 0.0
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
        """'done', 'warming up, time left not known yet' (`left_s` None) or 'about 1 min 40 s left'."""
        if self.done_pairs >= self.total:
            return "done"
        left = self.left_s()
        return "warming up, time left not known yet" if left is None else f"about {format_duration(left)} left"


class LineProgress(TimeLeft):
    """Plain progress lines (see the module docstring) written to `stream`.

    Args:
        total: pairs the sweep runs.
        stream: where the lines go (stderr); a write that fails (a closed pipe) stops them,
            never the sweep.
        clock, backends, costs: as `TimeLeft`'s.

    Raises:
        ValueError: as `TimeLeft`'s.
    """

    def __init__(self, total: int, stream: TextIO, clock: Callable[[], float] = time.monotonic,
                 backends: Iterable[str] | None = None, costs: Iterable[float] | None = None):
        super().__init__(total, clock, backends, costs)
        self.stream: TextIO | None = stream
        self.last = self.t0

    def start(self, label: str) -> None:
        """A pair begins (nothing is printed: lines come when pairs end)."""

    def finish(self, row: dict) -> None:
        """A pair ended with `row` (its 'backend', 'case_id', 'status'): prints its line when one is due."""
        now = self.record(row)
        elapsed = now - self.t0
        slow = elapsed / self.done_pairs >= SLOW_PAIR_S
        if self.done_pairs < self.total and not slow and now - self.last < EVERY_S:
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


class BarProgress(TimeLeft):
    """rich's transient progress bar on a terminal console; its time left is `TimeLeft.left_text`,
    as the plain lines say it (rich's own column would count each backend's warm-up as a pair's
    pace). Args and errors as `TimeLeft`'s, with the console to draw on."""

    def __init__(self, total: int, console: Console, clock: Callable[[], float] = time.monotonic,
                 backends: Iterable[str] | None = None, costs: Iterable[float] | None = None):
        super().__init__(total, clock, backends, costs)
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[left]}", markup=False), console=console, transient=True)
        self.task = self.bar.add_task("starting", total=total, left=self.left_text())

    def start(self, label: str) -> None:
        """Shows the pair in flight, `label` as written (a '[bold]' in a case id or backend name is no markup)."""
        self.bar.update(self.task, description=escape(label))

    def finish(self, row: dict) -> None:
        """One more pair done, and the time left after it."""
        self.record(row)
        self.bar.update(self.task, advance=1, left=self.left_text())


class NoProgress:
    """--quiet: nothing."""

    def start(self, label: str) -> None:
        """Nothing."""

    def finish(self, row: dict) -> None:
        """Nothing."""


class progress:
    """Context manager giving the progress display of a sweep of `total` pairs: none when
    `quiet`, the bar on a terminal, plain lines elsewhere (`LineProgress`); both given
    `backends` and `costs` (as `TimeLeft`'s) or None."""

    def __init__(self, total: int, quiet: bool, console: Console | None, backends: Iterable[str] | None = None,
                 costs: Iterable[float] | None = None):
        self.total, self.quiet, self.backends, self.costs = total, quiet, backends, costs
        self.console = console or Console(stderr=True)

    def __enter__(self):
        if self.quiet:
            self.shown = NoProgress()
        elif self.console.is_terminal:
            self.shown = BarProgress(self.total, self.console, backends=self.backends, costs=self.costs)
            self.shown.bar.start()
        else:
            self.shown = LineProgress(self.total, self.console.file, backends=self.backends, costs=self.costs)
        return self.shown

    def __exit__(self, *exc) -> None:
        if isinstance(self.shown, BarProgress):
            self.shown.bar.stop()


def case_values(case: Case) -> int:
    """`kv_values_read` of `case`: its L_b and T_b as the run draws them (a count of values)."""
    return kv_values_read(case.context_lens(), [t.size for t in case.trees()], case.num_q_heads, case.head_dim)


def cost_model(mode: str, device: str) -> tuple[PairCost, str]:
    """(`PAIR_COSTS`' model of a `mode` pair on `device`, e.g. 'cpu', 'cuda:0'; its device type): the
    CPU's for a device type without its own."""
    kind = device.split(":")[0]
    return (PAIR_COSTS[(mode, kind)], kind) if (mode, kind) in PAIR_COSTS else (PAIR_COSTS[(mode, "cpu")], "cpu")


def pair_seconds(pairs: Sequence[tuple[Case, str]], mode: str) -> list[float]:
    """`cost_model`'s seconds of each (case, device) pair in `mode` ('run' or 'check'): `TimeLeft`'s costs."""
    values = {c: case_values(c) for c in {case for case, _ in pairs}}      # one size per distinct case
    return [cost_model(mode, device)[0].seconds(values[case]) for case, device in pairs]


def row_values(row: dict) -> int | None:
    """`kv_values_read` of a stored row, from its context_lens, tree_sizes and case axes; None when
    it lacks them."""
    try:
        axes = row["case"]
        return kv_values_read(row["context_lens"], row["tree_sizes"], int(axes["num_q_heads"]),
                              int(axes["head_dim"]))
    except (KeyError, TypeError, ValueError):
        return None


def _timed_runs(rows: Iterable[dict], env_id: str | None) -> list[list[tuple[float, dict, int]]]:
    """Earlier runs of `env_id` (of any env when None), each as its rows that ran (not skipped) with a
    timestamp and a size: (timestamp in seconds, row, `row_values`) in time order, grouped by run_id;
    runs of 3 or more such rows."""
    runs: dict[str, list[tuple[float, dict, int]]] = {}
    for r in rows:
        if (env_id is not None and r.get("env") != env_id) or r.get("status") == "skipped" or not r.get("timestamp"):
            continue
        try:
            stamp = datetime.fromisoformat(r["timestamp"]).timestamp()
        except (TypeError, ValueError):
            continue
        if (values := row_values(r)) is not None:
            runs.setdefault(r.get("run_id") or "", []).append((stamp, r, values))
    return [sorted(run, key=lambda x: x[0]) for run in runs.values() if len(run) >= 3]


def stored_scale(rows: Iterable[dict], env_id: str | None, kind: str) -> tuple[float, int] | None:
    """(measured / modelled seconds, pairs it is based on) of the earlier runs in `rows` (`_timed_runs`):
    per run, the span from its first to its last row against `PAIR_COSTS`' seconds on device type `kind`
    ('cpu' or 'cuda') for its rows but the first (the pairs the span covers), at the run's own mode (a run
    with a timed row is a run, else a check); None without a run spanning over 0 s."""
    span = modelled = 0.0
    pairs = 0
    for run in _timed_runs(rows, env_id):
        cost = PAIR_COSTS[("run" if any(r.get("timer") for _, r, _ in run) else "check", kind)]
        span += run[-1][0] - run[0][0]
        modelled += sum(cost.seconds(values) for _, _, values in run[1:])
        pairs += len(run) - 1
    return (span / modelled, pairs) if span > 0 and modelled > 0 else None


def estimate(cases: Sequence[Case], mode: str, device: str, rows: Iterable[dict] = (), env_id: str | None = None,
             source: str | None = None) -> str:
    """'about 1 h 29 min (480 pairs, 11.13 s each on average: ...)': the time the pairs that will run
    should take, and what the figure is based on.

    Each pair costs `PAIR_COSTS[(mode, device type)]` for its case's size (`cost_model`); with earlier
    runs in `rows` (the results file `source`; this env's, else any env's), the sum is scaled by their
    measured / modelled time (`stored_scale`).

    Args:
        cases: the case of each pair that will run, once per backend that runs it.
        mode: 'run' or 'check'.
        device: where they run, e.g. 'cpu', 'cuda:0'.
        rows: the rows stored in `source`; env_id: this run's env id.
        source: the results file, or None without one (the model then goes unscaled, unremarked).
    """
    cost, kind = cost_model(mode, device)
    total = sum(pair_seconds([(c, kind) for c in cases], mode))     # seconds
    rows = list(rows)
    mine = stored_scale(rows, env_id, kind)
    found = mine if mine is not None else stored_scale(rows, None, kind)
    basis = f"a cost model {cost.fitted_on}, {cost.describe(mode, kind)}"
    if found is not None:
        scale, n = found
        whose = "this env" if mine is not None else "other envs (another commit, machine or versions)"
        total *= scale
        basis = (f"the cost model, {cost.describe(mode, kind)}, x {scale:.2f} as measured over "
                 f"{plural(n, 'earlier pair')} of {whose} in {source}")
    elif source is not None:
        basis += f"; {source} has no earlier run with 3 or more rows that ran (not skipped) to scale it by"
    each = f", {total / len(cases):.2f} s each on average" if cases else ""
    return f"about {format_duration(total)} ({plural(len(cases), 'pair')}{each}: {basis})"
