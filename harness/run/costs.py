"""The cost model of a (case, backend) pair: the seconds it should take, for `--dry-run`'s time
lines (`estimate`) and the live time left (`pair_seconds`, `after_last_pair_s`,
`treebench.harness.run.progress.TimeLeft`).

`estimate` is the cheap model behind ``--dry-run``'s time lines: each pair that will run
costs `PAIR_COSTS`' seconds for its case's size (a fixed part plus a part per K/V value
the query heads read, `workload.kv_values_read`), summed over the pairs. When the results
file holds earlier runs (this env's first, else any env's), the sum is scaled by their
measured time over what the model gives their pairs (each run's span of row timestamps),
so rows of small cases on a fast machine do not predict large cases there at the small
cases' pace; it is scaled only when those pairs cover enough modelled time (`SCALE_MIN_S`,
or `SCALE_MIN_SHARE` of the pairs to run when that is less). The lines say which, that no
earlier run was found in the results file, or that the one found covers too little
(nothing without a results file). To the pairs' sum it adds, unscaled, `OUTSIDE_PAIRS`' seconds of the
whole invocation outside its pairs (start-up and, after the last pair, the summary and a run's
report) and, under ``--isolate``, `WORKER_START_S` for its worker; what it cannot count
(a worker's start on a device type without a figure, the ranks of ``--gpus N``, the pairs of backends
whose Triton kernels Triton's CPU interpreter runs: `interpreted_triton`) it names as not included.
`pair_seconds` counts the pairs alone and `after_last_pair_s` the part after them (the report's part
only when one follows): the time left of a sweep already under way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from treebench.harness.model.cases import Case
from treebench.harness.model.workload import kv_values_read
from treebench.harness.run.progress import format_duration, plural

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

    def seconds(self, values: int) -> float:
        """Seconds of one pair whose case reads `values` K/V values."""
        return self.fixed_s + self.s_per_gvalue * values / 1e9

    def describe(self, mode: str, kind: str) -> str:
        """The model in words: 'per run pair on cpu: 0.09 s + 52.6 s per 10^9 K/V values read (...)'."""
        if not self.s_per_gvalue:
            return f"per {mode} pair on {kind}: {self.fixed_s:g} s whatever its size"
        return (f"per {mode} pair on {kind}: {self.fixed_s:g} s + {self.s_per_gvalue:g} s per 10^9 K/V values read "
                "(2 x S_b x Hq x D per request)")


# Seconds more per pair for a backend that compiles each new shape, by (backend name, device type).
# flex (torch.compile of flex_attention) on a 2-core CPU: `treebench run --backends B --quiet` of the smoke
# suite (8 pairs) took 8.0 and 8.1 s of wall time for flex against 3.4-3.6 s for torch_sdpa, reference and
# two_pass (start-up included, one machine, load average about 2): about 0.6 s more per pair.
COMPILE_S = {("flex", "cpu"): 0.6}
PAIR_COSTS = {("run", "cpu"): PairCost(0.09, 52.6),
              ("check", "cpu"): PairCost(0.052, 66.6),
              ("run", "cuda"): PairCost(0.8, 0.0),
              ("check", "cuda"): PairCost(0.5, 0.0)}


@dataclass(frozen=True)
class OutsidePairs:
    """Seconds an invocation spends outside its pairs, whatever their number."""

    start_s: float   # before the first pair: imports (torch's among them), suite and backends, the env
                     # fingerprint (on CUDA its bandwidth and matrix-rate probes)
    after_s: float   # after the last pair: the summary, and a run's HTML report

    @property
    def seconds(self) -> float:
        """Start-up and wrap-up together."""
        return self.start_s + self.after_s


# Seconds of a `run` or `check` outside its pairs, by (mode, device type), added once to --dry-run's estimate
# (the part after the last pair also to the live time left).
# CPU: the 2-core container of PAIR_COSTS' fit (torch 2.13.0), 3 times each, with rows and report written to
# fresh files and each phase read off the row timestamps: `treebench run --suite smoke --backends torch_sdpa`
# (8 pairs) took 4.0-4.5 s from start to exit at load average 0.1-1.9 (its `--dry-run` 1.7 s): first row
# 1.25-1.5 s after the start (one pair of ~0.1 s in it), exit 2.2 s after its last row (the report):
# 1.3 + 2.2 = 3.5 s; at load average 2-4 the run took 5.0-6.9 s, 1.9 + 3.3 s outside its pairs (3.0 s after
# the last of 24 rows of 3 backends). `treebench check --backend torch_sdpa` (the default check): first row
# 1.35-1.5 s after the start, exit 0.45-0.55 s after its last row: 1.3 + 0.5 = 1.8 s. Of the start-up,
# `import torch` took 1.85 s under load, the CPU env fingerprint 0.02 s. CUDA: check: 5.4 s, `treebench check
# --backend triton_tree` on an H200 (results/h200/default-check/: 28 s with start-up, its last pair done 22.6 s
# after the sweep began), taken as 4.9 s of start-up and the summary's 0.5 s as on the CPU (the summary is CPU
# work); run: that start-up and the report's 2.2 s as on the CPU (the report is CPU work too).
OUTSIDE_PAIRS = {("run", "cpu"): OutsidePairs(1.3, 2.2),
                 ("check", "cpu"): OutsidePairs(1.3, 0.5),
                 ("run", "cuda"): OutsidePairs(4.9, 2.2),
                 ("check", "cuda"): OutsidePairs(4.9, 0.5)}

# Seconds to start the one `--isolate` worker of an invocation (treebench.harness.run.isolate.WorkerPool starts
# it at the first pair it runs; a crash, a hang or a lost CUDA context starts another), by device type.
# CPU: the container of PAIR_COSTS' fit, load average 1.7-1.8, 3 times: `WorkerPool("cpu")._start()` from a
# script (spawn, the worker's imports, its ready message) took 1.03-1.05 s; end to end, `treebench run --suite
# smoke --backends torch_sdpa --quiet`, 3 times with `--isolate` and 3 without, alternately: first row 2.2-3.3 s
# after the start against 1.2-1.8 s, the pairs after it and the time after the last row alike. CUDA: not
# measured (a worker also initialises CUDA), so a dry run says it is not included.
WORKER_START_S = {"cpu": 1.0}

# Where the figures of PAIR_COSTS, OUTSIDE_PAIRS and WORKER_START_S come from, by (mode, device type), as the
# dry run's lines say it.
MEASURED_ON = {("run", "cpu"): "measured on a 2-core CPU",
               ("check", "cpu"): "measured on a 2-core CPU",
               ("run", "cuda"): "measured over the seed suite on an H200, the report on a 2-core CPU",
               ("check", "cuda"): "measured over default checks on an H200, the summary on a 2-core CPU"}


def case_values(case: Case) -> int:
    """`kv_values_read` of `case`: its L_b and T_b as the run draws them (a count of values)."""
    return kv_values_read(case.context_lens(), [t.size for t in case.trees()], case.num_q_heads, case.head_dim)


def cost_model(mode: str, device: str) -> tuple[PairCost, str]:
    """(`PAIR_COSTS`' model of a `mode` pair on `device`, e.g. 'cpu', 'cuda:0'; its device type): the
    CPU's for a device type without its own."""
    kind = device.split(":")[0]
    return (PAIR_COSTS[(mode, kind)], kind) if (mode, kind) in PAIR_COSTS else (PAIR_COSTS[(mode, "cpu")], "cpu")


def after_last_pair_s(report: bool, device: str) -> float:
    """`OUTSIDE_PAIRS`' seconds after the last pair of a sweep on `device`, for the device type whose model
    applies (`cost_model`): the end of `TimeLeft`'s time left. With `report` (`RunConfig.report`: an HTML
    report follows) a run's figure, its summary and report; without, a check's, its summary alone."""
    return OUTSIDE_PAIRS[("run" if report else "check", cost_model("run", device)[1])].after_s


def pair_seconds(pairs: Sequence[tuple[Case, str]], mode: str, backends: Sequence[str] | None = None) -> list[float]:
    """`cost_model`'s seconds of each (case, device) pair in `mode` ('run' or 'check'), plus `COMPILE_S` of
    the pair's backend on the device type whose model applies (`backends`: the backend name of each
    pair, or None): `TimeLeft`'s costs, in seconds.

    Raises:
        ValueError: `backends` names another number of pairs than `pairs`.
    """
    values = {c: case_values(c) for c in {case for case, _ in pairs}}      # one size per distinct case
    names = backends if backends is not None else [""] * len(pairs)
    out = []
    for (case, device), name in zip(pairs, names, strict=True):
        cost, kind = cost_model(mode, device)     # kind: the device type whose model applies
        out.append(cost.seconds(values[case]) + COMPILE_S.get((name, kind), 0.0))
    return out


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


# The earlier pairs scale the estimate only when they cover at least SCALE_MIN_S seconds of modelled time, or
# SCALE_MIN_SHARE of the modelled seconds of the pairs to run when that is less. A few short pairs say little of
# the machine's pace (fixed costs, a load spike, a cold cache weigh on them alone), and their scale multiplies
# every pair to run: `treebench run --suite random --backends torch_sdpa --out X`, stopped after 4 rows, then
# `--resume --dry-run`: 3 earlier pairs (B 5, L ragged:0-700, random:12:1; 2.1 s as modelled) scaled the 78 pairs
# left by x 0.26: 2 min 11 s said against 8 min 41 s taken, where the unscaled model said 8 min 24 s.
# On the 2-core container of PAIR_COSTS' fit (load average 2) the same 3 pairs gave x 1.75 (14 min 36 s). Both
# under 10 s: unscaled. Below SCALE_MIN_S the share bounds what a wrong scale can cost: pairs to run of at most 4x
# the earlier pairs' modelled time (under 40 s), as when a smoke run is repeated (its runs: modelled / measured 1.00).
SCALE_MIN_S = 10.0
SCALE_MIN_SHARE = 0.25


@dataclass(frozen=True)
class Pace:
    """The pace of earlier runs: what their pairs took against what the model gives them."""

    scale: float        # measured / modelled seconds
    pairs: int          # the pairs it is based on
    modelled_s: float   # PAIR_COSTS' (and COMPILE_S') seconds of those pairs


def stored_scale(rows: Iterable[dict], env_id: str | None, kind: str) -> Pace | None:
    """The `Pace` of the earlier runs in `rows` (`_timed_runs`): per run, the span from its first to its last row
    against `PAIR_COSTS`' (and `COMPILE_S`') seconds on device type `kind` ('cpu' or 'cuda') for its rows but the
    first (the pairs the span covers), at the run's own mode (a run with a timed row is a run, else a check); None
    without a run spanning over 0 s."""
    span = modelled = 0.0
    pairs = 0
    for run in _timed_runs(rows, env_id):
        cost = PAIR_COSTS[("run" if any(r.get("timer") for _, r, _ in run) else "check", kind)]
        span += run[-1][0] - run[0][0]
        modelled += sum(cost.seconds(values) + COMPILE_S.get((str(r.get("backend")), kind), 0.0)
                        for _, r, values in run[1:])
        pairs += len(run) - 1
    return Pace(span / modelled, pairs, modelled) if span > 0 and modelled > 0 else None


def _scaling(rows: list[dict], env_id: str | None, kind: str, source: str | None,
             to_run_s: float) -> tuple[float, str]:
    """(the factor of the pairs' modelled seconds, the line saying where it comes from, '' without a
    results file): `stored_scale` of this env's earlier runs in `rows`, else of any env's; 1.0 without one,
    or when its pairs cover less modelled time than `SCALE_MIN_S` and `SCALE_MIN_SHARE` of `to_run_s`, the
    modelled seconds of the pairs to run."""
    mine = stored_scale(rows, env_id, kind)
    found = mine if mine is not None else stored_scale(rows, None, kind)
    if found is None:
        no_run = f"not scaled: {source} has no earlier run with 3 or more rows that ran (not skipped)"
        return 1.0, no_run if source is not None else ""
    need = min(SCALE_MIN_S, SCALE_MIN_SHARE * to_run_s)     # seconds of modelled time the earlier pairs must cover
    if found.modelled_s < need:
        return 1.0, (f"not scaled: {plural(found.pairs, 'earlier pair')} in {source}, modelled at "
                     f"{format_duration(found.modelled_s)}, too few to set the pace ({format_duration(need)} needed)")
    whose = "this env" if mine is not None else "other envs (another commit, machine or versions)"
    return found.scale, (f"scaled x {found.scale:.2f} to the pace of {plural(found.pairs, 'earlier pair')} "
                         f"of {whose} in {source}")


# Triton's CPU interpreter (TRITON_INTERPRET on) is not modelled: its pairs take many times what PAIR_COSTS gives
# them, by a factor that varies with the case. `TRITON_INTERPRET=1 treebench run --suite smoke --backends triton_tree
# --quiet` on the 2-core container of PAIR_COSTS' fit (torch 2.13.0, triton 3.9.0, load average 1.6) took 38 s
# against the dry run's 4.2 s: 33.9 s over the 7 pairs after the first (PAIR_COSTS: 0.64 s, x 53), 0.41 to 14.5 s
# a pair (x 4.6 to x 154 of its modelled 0.09 s), so no one factor is applied; the dry run says it leaves them out.
def interpreted_triton(backends: Iterable[object]) -> set[str]:
    """The names of `backends` whose kernels run in Triton's CPU interpreter here: those that declare
    `runs_triton` (treebench.harness.adapter.contract.Backend) while TRITON_INTERPRET is on
    (treebench.harness.model.paged.triton_interpret); empty when it is off. Raises nothing."""
    from treebench.harness.model.paged import triton_interpret   # torch: imported only when asked

    if not triton_interpret():
        return set()
    return {getattr(b, "name", type(b).__name__) for b in backends if getattr(b, "runs_triton", False)}


def _not_included(kind: str, worker: bool, ranks: int, interpreted: Sequence[str] = ()) -> list[str]:
    """What the estimate leaves out, a line each: the `--isolate` worker's start on a device type without
    a `WORKER_START_S` (`worker`: one starts), the start-up of `ranks` > 1 torchrun ranks, the pairs of the
    `interpreted` backends (`interpreted_triton`)."""
    missing = []
    if interpreted:
        missing.append(f"not included: Triton's CPU interpreter (TRITON_INTERPRET is on), in which "
                       f"{', '.join(interpreted)} run{'s' if len(interpreted) == 1 else ''}: the estimate does not "
                       "model interpreted Triton, whose pairs take many times longer")
    if worker and kind not in WORKER_START_S:
        missing.append(f"not included: the --isolate worker's start-up on {kind} (not measured)")
    if ranks > 1:
        missing.append(f"not included: the start-up of the {ranks} torchrun ranks of --gpus {ranks} (not measured); "
                       "the time is that of one GPU running every pair")
    return missing


def estimate(cases: Sequence[Case], mode: str, device: str, rows: Iterable[dict] = (), env_id: str | None = None,
             source: str | None = None, backends: Sequence[str] | None = None, *, isolate: bool = False,
             ranks: int = 1, interpreted: Iterable[str] = ()) -> str:
    """The time the invocation should take from start to exit, and what the figure is based on, a line each:
    'about 1 h 29 min in all (480 pairs, 11.13 s each on average, + 3.5 s of start-up, summary and
    report)', the cost model ('per run pair on cpu: 0.09 s + 52.6 s per 10^9 K/V values read ...'),
    where its figures come from ('figures measured on a 2-core CPU'), with a results file how earlier
    runs in it scale them ('scaled x 1.20 to the pace of ...'), and what it leaves out ('not included: ...').

    Each pair costs `PAIR_COSTS[(mode, device type)]` for its case's size (`cost_model`); with earlier
    runs in `rows` (the results file `source`; this env's, else any env's) that cover enough modelled
    time (`SCALE_MIN_S`, `SCALE_MIN_SHARE`), the sum is scaled by their measured / modelled time
    (`stored_scale`). `OUTSIDE_PAIRS[(mode, device type)]` (start-up, the summary, a run's report) is
    added once, unscaled, and so is `WORKER_START_S` under `isolate`.

    Args:
        cases: the case of each pair that will run, once per backend that runs it.
        mode: 'run' or 'check'.
        device: where they run, e.g. 'cpu', 'cuda:0'.
        rows: the rows stored in `source`; env_id: this run's env id.
        source: the results file, or None without one (the model then goes unscaled, unremarked).
        backends: the backend name of each pair (its `COMPILE_S`), or None.
        isolate: the pairs run in an `--isolate` worker (one starts when any pair runs).
        ranks: the torchrun ranks `--gpus` would start (1: none); their start-up is named as not included.
        interpreted: the backends whose Triton kernels run interpreted (`interpreted_triton`); those of
            them with a pair to run (in `backends`) are named as not modelled.

    Raises:
        ValueError: `backends` names another number of pairs than `cases`.
    """
    cost, kind = cost_model(mode, device)
    modelled = sum(pair_seconds([(c, kind) for c in cases], mode, backends))     # seconds
    scale, scaled = _scaling(list(rows), env_id, kind, source, modelled)
    total = scale * modelled
    worker_s = WORKER_START_S.get(kind, 0.0) if isolate and cases else 0.0
    compiling = sorted({n for n in backends or () if (n, kind) in COMPILE_S})
    model = cost.describe(mode, kind) + "".join(f", {n} + {COMPILE_S[(n, kind)]:g} s (it compiles each shape)"
                                                for n in compiling)
    slow = sorted(set(interpreted) & set(backends or ()))      # interpreted backends with a pair to run
    missing = _not_included(kind, isolate and bool(cases), ranks, slow)
    lines = [_time_line(total, len(cases), mode, OUTSIDE_PAIRS[(mode, kind)], worker_s), model,
             f"figures {MEASURED_ON[(mode, kind)]}", scaled, *missing]
    return "\n".join(line for line in lines if line)


def _time_line(pairs_s: float, pairs: int, mode: str, outside: OutsidePairs, worker_s: float) -> str:
    """'about 8.9 s in all (10 pairs, 0.44 s each on average, + 3.5 s of start-up, summary and report,
    + 1 s for the --isolate worker)': `pairs` pairs of `pairs_s` seconds in all, `outside` and the
    worker's `worker_s` (0: none) added."""
    each = f", {pairs_s / pairs:.2f} s each on average" if pairs else ""
    outside_text = "start-up, summary and report" if mode == "run" else "start-up and summary"
    worker = f", + {worker_s:g} s for the --isolate worker" if worker_s else ""
    return (f"about {format_duration(pairs_s + outside.seconds + worker_s)} in all ({plural(pairs, 'pair')}{each}, "
            f"+ {outside.seconds:g} s of {outside_text}{worker})")
