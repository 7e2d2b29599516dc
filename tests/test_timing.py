"""Timing and sample statistics: raw samples kept, budgets by time, timers and fallbacks.

CPU tests drive the wall timer with a fake clock, so they check exact samples
without depending on how fast this machine is. GPU tests (marker `gpu`) check
the CUDA timers' plumbing and fallback; the fidelity numbers are measured by
lab/timing_fidelity.py, not asserted here.
"""

from __future__ import annotations

import itertools
import math
import statistics

import numpy as np
import pytest
import torch
from treebench.harness.errors import ConfigError
from treebench.harness.timing import budget as timing_budget
from treebench.harness.timing import timers as timing
from treebench.harness.timing import wall as timing_wall
from treebench.harness.timing.bandwidth import measure_matrix_rate, measure_peak_bandwidth
from treebench.harness.timing.budget import Timing, make_budget
from treebench.harness.timing.stats import cv_of_medians, geometric_mean, summarize
from treebench.harness.timing.timers import time_callable


class FakeClock:
    """perf_counter stand-in: each call of the fake workload advances it by the next duration (ms)."""

    def __init__(self, durations_ms):
        self.now, self._next = 0.0, itertools.cycle(durations_ms)

    def __call__(self) -> float:
        return self.now

    def work(self):
        self.now += next(self._next) / 1e3


@pytest.fixture
def clock(monkeypatch):
    def make(durations_ms):
        c = FakeClock(durations_ms)
        monkeypatch.setattr(timing_budget, "perf_counter", c)   # the warmup
        monkeypatch.setattr(timing_wall, "perf_counter", c)     # the samples
        return c
    return make


# ---- the wall timer (CPU) ---------------------------------------------------------------------

def test_wall_samples_are_each_calls_duration(clock):
    c = clock([1.0, 2.0, 3.0])
    t = time_callable(c.work, device="cpu", warmup_ms=5, rep_ms=20, min_reps=3)
    # warmup: 1 + 2 + 3 = 6 ms >= 5 ms after 3 calls, 2 ms per call -> 20 / 2 = 10 samples
    assert t.warmup_calls == 3
    assert t.samples_us == pytest.approx([1000.0, 2000.0, 3000.0] * 3 + [1000.0])
    assert (t.timer, t.fallback_reason, t.l2_flushed) == ("wall", None, False)


@pytest.mark.parametrize("default_threads", [2, 3])
def test_wall_timer_calls_run_under_one_torch_thread_and_the_count_is_restored(default_threads):
    torch.set_num_threads(default_threads)
    try:
        seen: list[int] = []
        t = time_callable(lambda: seen.append(torch.get_num_threads()), device="cpu", warmup_ms=0, rep_ms=1,
                          min_reps=37, max_reps=37)
        assert seen and set(seen) == {timing_wall.CPU_TIMING_THREADS} == {1}   # warmup and every sample
        assert torch.get_num_threads() == default_threads
        assert t.cpu_threads == 1 and t.as_row()["cpu_threads"] == 1
    finally:
        torch.set_num_threads(default_threads)


def test_torch_threads_restores_the_count_when_the_block_raises():
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="boom"), timing_wall.torch_threads(1):
        assert torch.get_num_threads() == 1
        raise RuntimeError("boom")
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="must be an integer >= 1"), timing_wall.torch_threads(0):
        pass


def test_gpu_timings_record_no_cpu_thread_count():
    assert Timing([1.0], "cuda_graph").as_row()["cpu_threads"] is None


@pytest.mark.parametrize("rep_ms, min_reps, max_reps, expected", [
    (100, 10, 1000, 100),     # 100 ms budget at 1 ms per call
    (100, 10, 37, 37),        # capped by max_reps
    (1, 232, 1000, 232),      # raised to min_reps
])
def test_sample_count_follows_the_time_budget_within_bounds(clock, rep_ms, min_reps, max_reps, expected):
    c = clock([1.0])
    t = time_callable(c.work, warmup_ms=0, rep_ms=rep_ms, min_reps=min_reps, max_reps=max_reps)
    assert len(t.samples_us) == expected and t.warmup_calls == 1


@pytest.mark.parametrize("mode", ["cuda_graph", "cuda_event", "host_inclusive", "cuda_graph_loop"])
def test_gpu_timers_on_the_cpu_fall_back_to_wall_with_the_reason(clock, mode):
    c = clock([0.5])
    t = time_callable(c.work, device="cpu", mode=mode, warmup_ms=0, rep_ms=5, flush_l2=mode != "cuda_graph_loop")
    assert t.timer == "wall" and mode in t.fallback_reason and "CUDA" in t.fallback_reason


def test_the_back_to_back_graph_timer_needs_a_warm_l2(clock):
    """cuda_graph_loop times k calls in a row: a flush between them would be measured."""
    with pytest.raises(ConfigError, match="cuda_graph_loop.*warm L2"):
        time_callable(clock([0.5]).work, device="cpu", mode="cuda_graph_loop")


def test_no_sample_is_dropped(clock):
    c = clock([1.0] * 9 + [50.0])           # one slow outlier in every ten calls
    t = time_callable(c.work, warmup_ms=0, rep_ms=10_000, min_reps=10, max_reps=100)
    assert len(t.samples_us) == 100 and max(t.samples_us) == pytest.approx(50_000.0)


@pytest.mark.parametrize("kwargs, field", [
    ({"mode": "fastest"}, "mode"),
    ({"warmup_ms": -1}, "warmup_ms"),
    ({"rep_ms": 0}, "rep_ms"),
    ({"min_reps": 0}, "min_reps"),
    ({"min_reps": 5, "max_reps": 4}, "max_reps"),
])
def test_bad_timing_arguments_are_config_errors(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        time_callable(lambda: None, **kwargs)


def test_real_cpu_callable_is_timed():
    a = torch.randn(37, 37)
    t = time_callable(lambda: a @ a, warmup_ms=0.5, rep_ms=2, min_reps=3, max_reps=50)
    assert 3 <= len(t.samples_us) <= 50 and all(s > 0 for s in t.samples_us) and t.timer == "wall"


def test_the_timers_a_timing_records_are_the_timers_rows_may_name():
    """Every timer name the timers put in a Timing (`Timing(samples, NAME, ...)`, `timer=NAME` in timers.py and
    wall.py) is one of modes.TIMERS, the names a row's `timer` is checked against (store.validate), and each
    of those is put there by one of them."""
    import ast
    import inspect

    from treebench.harness.timing.modes import TIMERS, WALL

    written = set()
    for module in (timing, timing_wall):
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(node, ast.Call):
                names = node.args[1:2] if isinstance(node.func, ast.Name) and node.func.id == "Timing" else []
                for arg in [*names, *(k.value for k in node.keywords if k.arg == "timer")]:
                    if isinstance(arg, ast.Constant):
                        written.add(arg.value)
                    elif isinstance(arg, ast.Name) and arg.id == "WALL":
                        written.add(WALL)
    assert written == set(TIMERS) and "auto" not in TIMERS


def test_timing_row_fields_come_from_the_samples():
    t = Timing([4.0, 1.0, 3.0, 2.0], "cuda_graph", None)
    row = t.as_row()
    assert row["median_us"] == 2.5 and row["p25_us"] == 1.75 and row["p75_us"] == 3.25
    assert row["n_samples"] == 4 and row["samples_us"] == [4.0, 1.0, 3.0, 2.0]
    assert row["timer"] == "cuda_graph" and row["timer_fallback"] is None and row["l2_flushed"] is False
    assert row["cv"] == pytest.approx(np.std([1, 2, 3, 4], ddof=1) / 2.5)
    assert Timing([1.0], "cuda_graph", None, l2_flushed=True).as_row()["l2_flushed"] is True


@pytest.mark.parametrize("flush_l2", [True, False])
def test_the_cpu_never_flushes_and_its_rows_say_so(clock, flush_l2):
    c = clock([1.0])
    t = time_callable(c.work, device="cpu", warmup_ms=0, rep_ms=1, min_reps=3, max_reps=3, flush_l2=flush_l2)
    assert (t.timer, t.l2_flushed, t.as_row()["l2_flushed"]) == ("wall", False, False)


def test_peak_bandwidth_and_matrix_rate_are_none_on_the_cpu():
    assert measure_peak_bandwidth("cpu") is None
    assert measure_matrix_rate("cpu") is None


@pytest.mark.gpu
def test_measured_peaks_are_plausible_for_the_gpu():
    """The copy bandwidth and the bf16 matmul rate lie between a fifth of the datasheet figure and just above it
    (a known GPU), or in a broad band (any other)."""
    from treebench.harness.model.workload import device_peak

    peak = device_peak(torch.cuda.get_device_name())
    bw, tflops = measure_peak_bandwidth("cuda"), measure_matrix_rate("cuda", n=4096, reps=3)
    assert bw is not None and tflops is not None
    if peak:
        assert 0.2 * peak.hbm_tb_per_s < bw / 1e12 < 1.05 * peak.hbm_tb_per_s
        assert 0.2 * peak.tflops_16bit < tflops < 1.05 * peak.tflops_16bit
    else:
        assert 0.05 < bw / 1e12 < 20 and 1 < tflops < 5000


# ---- statistics -------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 37, 232])
def test_summarize_matches_numpy(n):
    x = np.random.default_rng(n).lognormal(3, 0.2, n)
    s = summarize(x.tolist())
    assert s.n == n and s.median_us == pytest.approx(np.median(x))
    assert (s.p25_us, s.p75_us) == pytest.approx(tuple(np.percentile(x, [25, 75])))
    assert s.min_us <= s.p25_us <= s.median_us <= s.p75_us <= s.max_us
    assert s.cv == (pytest.approx(x.std(ddof=1) / x.mean()) if n > 1 else 0.0)


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [1.0, -2.0], [float("inf")]])
def test_summarize_rejects_bad_samples(bad):
    with pytest.raises(ValueError):
        summarize(bad)


def test_cv_of_medians_and_geometric_mean():
    runs = [[10.0, 10.0, 11.0], [12.0, 12.0], [14.0]]        # medians 10, 12, 14
    assert cv_of_medians(runs) == pytest.approx(2.0 / 12.0)
    with pytest.raises(ValueError):
        cv_of_medians([[1.0]])
    assert geometric_mean([2.0, 0.5]) == pytest.approx(1.0)
    assert math.isnan(geometric_mean([]))
    with pytest.raises(ValueError):
        geometric_mean([1.0, 0.0])


# ---- CUDA timers ------------------------------------------------------------------------------

def _matmul():
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    return lambda: a @ a


@pytest.mark.gpu
@pytest.mark.parametrize("flush_l2", [True, False])
def test_cuda_graph_timer(flush_l2):
    t = time_callable(_matmul(), device="cuda", warmup_ms=5, rep_ms=10, min_reps=5, max_reps=200,
                      flush_l2=flush_l2)
    assert t.timer == "cuda_graph" and t.fallback_reason is None and t.l2_flushed == flush_l2
    assert t.as_row()["l2_flushed"] is flush_l2
    assert 5 <= len(t.samples_us) <= 200 and min(t.samples_us) > 0
    assert t.calls_per_sample == 1, "timing events inside the graph should work on this torch"


@pytest.mark.gpu
@pytest.mark.parametrize("flush_l2", [True, False])
def test_whole_replay_fallback(flush_l2):
    budget = make_budget(torch.device("cuda"), 2, 5, 5, 100, flush_l2)
    t = timing._time_replays(_matmul(), budget, calls=0)
    assert t.timer == "cuda_graph" and 5 <= len(t.samples_us) <= 100 and min(t.samples_us) > 0
    assert t.calls_per_sample == 1 if flush_l2 else t.calls_per_sample >= 1


@pytest.mark.gpu
def test_uncapturable_callable_falls_back_to_cuda_events():
    a = torch.randn(256, 256, device="cuda")

    def syncs():                      # .item() synchronizes: illegal while capturing a graph
        return a * a.sum().item()
    stream = torch.cuda.current_stream()
    t = time_callable(syncs, device="cuda", warmup_ms=2, rep_ms=5, min_reps=5)
    assert t.timer == "cuda_event" and t.fallback_reason.startswith("CUDA graph capture failed")
    # the failed capture left nothing behind: same stream, random ops and later captures work
    assert torch.cuda.current_stream() == stream
    torch.randn(8, device="cuda").sum().item()
    after = time_callable(_matmul(), device="cuda", warmup_ms=2, rep_ms=5, min_reps=5)
    assert after.timer == "cuda_graph", "a failed capture must not break later captures"


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["cuda_event", "host_inclusive"])
def test_other_cuda_timers(mode):
    t = time_callable(_matmul(), device="cuda", mode=mode, warmup_ms=2, rep_ms=5, min_reps=5, max_reps=100)
    assert t.timer == mode and 5 <= len(t.samples_us) <= 100 and min(t.samples_us) > 0


@pytest.mark.gpu
def test_back_to_back_graph_timer():
    """cuda_graph_loop: one replay of k calls lasts >= LOOP_REPLAY_US, a sample is replay / k; a
    1024^3 bf16 matmul takes microseconds, so k is large and the samples are per call."""
    fn = _matmul()
    t = time_callable(fn, device="cuda", mode="cuda_graph_loop", warmup_ms=5, rep_ms=20, min_reps=5,
                      max_reps=100, flush_l2=False)
    assert t.timer == "cuda_graph_loop" and t.fallback_reason is None and t.l2_flushed is False
    assert t.calls_per_sample > 1 and 5 <= len(t.samples_us) <= 100
    per_call = time_callable(fn, device="cuda", warmup_ms=5, rep_ms=20, min_reps=5, flush_l2=False)
    ratio = statistics.median(t.samples_us) / statistics.median(per_call.samples_us)
    assert 0.3 < ratio < 1.5, ratio          # the same call: same order of magnitude, no event between calls


@pytest.mark.gpu
def test_back_to_back_graph_timer_falls_back_to_cuda_events():
    a = torch.randn(256, 256, device="cuda")
    t = time_callable(lambda: a * a.sum().item(), device="cuda", mode="cuda_graph_loop", warmup_ms=2, rep_ms=5,
                      min_reps=5, flush_l2=False)
    assert t.timer == "cuda_event" and t.fallback_reason.startswith("CUDA graph capture failed")


@pytest.mark.gpu
def test_peak_bandwidth_is_plausible():
    bw = measure_peak_bandwidth("cuda", nbytes=2**28, reps=5)
    assert 1e11 < bw < 2e13          # 0.1 to 20 TB/s: any current GPU


@pytest.mark.gpu
def test_empty_graph_is_not_timed(recwarn):
    """A callable that queues no device work (host-only, or work on another
    stream) captures an empty graph: it must be refused, not timed as an empty
    replay, and torch's empty-graph warning is not passed on."""
    a = torch.randn(512, 512, device="cuda")
    with pytest.raises(RuntimeError, match="graph is empty"):
        timing.capture_graph(lambda: a)
    assert not [w for w in recwarn if "Graph is empty" in str(w.message)]
    torch.cuda.synchronize()
    after = time_callable(_matmul(), device="cuda", warmup_ms=2, rep_ms=5, min_reps=5)
    assert after.timer == "cuda_graph"
