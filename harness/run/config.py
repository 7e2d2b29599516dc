"""The run request, `RunConfig`: how run_cases runs and where its rows go.

It sits below the runner and the worker (treebench.harness.run.isolate), which
both read it, and is validated once, when it is built. Beside it, `wait_s`: a time
limit (--case-timeout, --merge-timeout) as the timeout multiprocessing takes, no limit
past MAX_WAIT_S, for the worker pool, the prober and rank 0's wait for the others;
and `check_threads`: the torch threads a pair's correctness work runs under by default
(run, check and selftest's --threads, at most MAX_THREADS).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from treebench.harness.errors import ConfigError
from treebench.harness.timing.modes import MODES as TIMING_MODES

MODES = ("run", "check")   # run: correctness then timing; check: correctness only
MAX_WAIT_S = 2_147_483.0   # the longest timeout multiprocessing's wait() takes: poll()'s int32 ms (24.8 days)
# The least case time limit (--case-timeout) taken, in seconds. The harness's own work on a pair counts in it
# (isolate.py: the worker rebuilds the case's inputs and float64 reference, compares every output, and in a run
# spends the timing budget, 25 ms of warm-up and 100 ms of samples on a GPU: timing.budget.GPU_BUDGET_MS), and a
# fresh worker (the first pair, and each pair after a worker is killed) loads the backend within it first. The
# smallest case takes 0.1 s (check) to 0.2 s (run) so in a worker on a CPU; a limit under 1 s leaves a backend
# next to nothing, and one far under it times every pair out, each in a fresh worker.
MIN_CASE_TIMEOUT_S = 1.0

# torch intra-op threads of a CPU pair's correctness work by default: with one per core (torch's default) the
# threads of each op wait on cores that other work holds: on a 2-core CPU `check --backend torch_sdpa` took 9-12 s
# at load average 1-2 and 3 min at 7-9, against 4-5 s and 51 s with one thread (README, CPU timings)
CPU_CHECK_THREADS = 1
# The most torch intra-op threads taken (--threads, RunConfig.threads): 1024 and 8192 threads ran `check --backend
# torch_sdpa` on a 2-core CPU, 100000 crashed the process (SIGSEGV in the float64 reference's einsum, OpenMP's
# thread pool), and a count past a C long long failed every pair in torch.set_num_threads (OverflowError). 1024
# is past any CPU's cores today and well under the count that crashed.
MAX_THREADS = 1024


def check_threads(threads: int | None, device_type: str) -> int | None:
    """The torch intra-op threads a pair's correctness work runs under (RunConfig.threads) on a device of
    `device_type` ("cpu", "cuda"): `threads` (--threads) when given; else None, torch's count as it stands,
    where $OMP_NUM_THREADS is set (the user's choice, which torch read at start-up) or the device is not
    the CPU; else CPU_CHECK_THREADS. Raises nothing (RunConfig checks the count)."""
    if threads is not None:
        return threads
    if os.environ.get("OMP_NUM_THREADS") or device_type != "cpu":
        return None
    return CPU_CHECK_THREADS


def wait_s(limit_s: float | None) -> float | None:
    """`limit_s` (seconds) as a timeout for multiprocessing.connection.wait, in seconds: None (no limit)
    where it is None or past MAX_WAIT_S, which poll() cannot take (OverflowError; ValueError for an
    infinity). Raises nothing."""
    return None if limit_s is None or limit_s > MAX_WAIT_S else limit_s


@dataclass(frozen=True)
class RunConfig:
    """How run_cases runs and where its rows go.

    Raises:
        ValueError: unknown mode or timing mode, a case time limit under MIN_CASE_TIMEOUT_S, threads
            outside 1..MAX_THREADS, or a report asked of a check.
        ConfigError: the back-to-back timer (cuda_graph_loop) asked for with a flushed L2.
    """

    mode: str = "run"                   # "run": correctness then timing; "check": correctness only
    store_path: Path | None = None      # results JSONL to append rows to; None: keep rows in memory only
    store_named: Path | None = None     # store_path as the user gave it, for the lines that name it (None: store_path)
    run_id: str = ""                    # id shared by this run's rows ("" : a fresh one)
    suite: str | None = None            # name of the suite swept, written into each row (None: not given)
    env_id: str | None = None           # env fingerprint id written into each row
    device: str | None = None           # torch device for inputs; None: cuda when available, else cpu
    peak_bytes_per_s: float | None = None  # measured peak bandwidth, for pct_peak_bw
    timing_mode: str = "auto"           # treebench.harness.timing.timers.time_callable's mode
    flush_l2: bool = True               # flush the L2 before every timed call (GPU only): cold L2; False: warm L2
    quiet: bool = False                 # no progress bar
    report: bool = False                # an HTML report follows the last pair (treebench run's; under torchrun
                                        # rank 0's alone): the progress names it as what comes next, and the
                                        # summary counts earlier rows for it
    wait_note: str = ""                 # what this process waits for after its last pair, said by the progress in
                                        # place of what follows ("waiting for ranks 1-3": torchrun rank 0 waits
                                        # for the others before it merges and reports); "": no wait
    determinism: bool = False           # run the prepared callable twice and compare the outputs bitwise
    check_memory: bool = True           # skip a pair whose predicted device memory exceeds the free memory
    isolate: bool = False               # run every pair in a worker subprocess (treebench.harness.run.isolate)
    case_timeout_s: float | None = None  # per-pair time limit in seconds (isolated runs only), at least
                                         # MIN_CASE_TIMEOUT_S; None or past MAX_WAIT_S (`wait_s`): no limit
    skip: frozenset = frozenset()       # (case_id, backend) pairs not to run (already stored: --resume)
    check_axes: dict = field(default_factory=dict, hash=False)  # case_id -> {axis: value} of the default
    # check (treebench.harness.checking.default_check): each row's `check_axes`, its coverage table's source
    threads: int | None = None          # torch intra-op threads of each pair's correctness work: building the
                                        # inputs and the reference, prepare, the calls compared and the
                                        # comparisons (never the timed calls: the wall timer takes
                                        # CPU_TIMING_THREADS); None: torch's count as it stands (`check_threads`)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.report and self.mode != "run":
            raise ValueError(f"report=True with mode {self.mode!r}: only a run ends with a report")
        if self.timing_mode not in TIMING_MODES:
            raise ValueError(f"timing_mode {self.timing_mode!r} is not one of {', '.join(TIMING_MODES)}")
        if self.timing_mode == "cuda_graph_loop" and self.flush_l2:
            raise ConfigError("--timer cuda_graph_loop times back-to-back calls, so it needs a warm L2: "
                              "add --l2 warm (flush_l2=False)")
        if self.threads is not None and not (isinstance(self.threads, int) and 1 <= self.threads <= MAX_THREADS):
            raise ValueError(f"threads={self.threads!r}: must be an integer from 1 to MAX_THREADS = {MAX_THREADS}, "
                             "or None for torch's count")
        if self.case_timeout_s is not None and not self.case_timeout_s >= MIN_CASE_TIMEOUT_S:
            raise ValueError(f"case_timeout_s={self.case_timeout_s!r}: must be at least MIN_CASE_TIMEOUT_S = "
                             f"{MIN_CASE_TIMEOUT_S:g} seconds (the harness's own work on a pair counts in it)")
