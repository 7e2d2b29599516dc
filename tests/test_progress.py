"""Plain progress lines off a terminal (one per slow pair, one per ~10 s of fast ones, the
last always) and the --dry-run estimate's model."""

from __future__ import annotations

import io

import pytest

from treebench.harness.run.progress import EVERY_S, LineProgress, estimate, format_duration, plural


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def row(i: int) -> dict:
    return {"backend": "torch_sdpa", "case_id": f"case{i}", "status": "pass"}


@pytest.mark.parametrize("seconds, text", [(0.37, "0.4 s"), (12.0, "12.0 s"), (100, "1 min 40 s"),
                                           (7537, "2 h 5 min")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize("n, noun, many, text", [
    (1, "pair", None, "1 pair"), (2, "pair", None, "2 pairs"), (0, "row", None, "0 rows"),
    (1, "mismatch", "mismatches", "1 mismatch"), (37, "mismatch", "mismatches", "37 mismatches"),
])
def test_plural_says_one_pair_and_two_pairs(n, noun, many, text):
    assert plural(n, noun, many) == text


def test_the_estimate_of_one_pair_says_pair():
    assert estimate(1, "run", "cpu").startswith("about 4.0 s (1 pair x 4.00 s: ")
    rows = [{"env": "e1", "run_id": "r", "status": "pass", "timestamp": f"2026-01-01T00:00:{s:02d}+00:00"}
            for s in (0, 2, 4)]
    assert "measured over 2 earlier pairs" in estimate(1, "run", "cpu", rows, "e1", "x.jsonl")


def test_slow_pairs_get_a_line_each_with_the_time_left():
    clock, out = Clock(), io.StringIO()
    shown = LineProgress(4, out, clock)
    for i in range(4):
        clock.now += 2.5
        shown.finish(row(i))
    lines = out.getvalue().splitlines()
    assert lines[0] == "[1/4] torch_sdpa on case0: pass (2.5 s elapsed, about 7.5 s left)"
    assert lines[-1] == "[4/4] torch_sdpa on case3: pass (10.0 s elapsed, done)" and len(lines) == 4


@pytest.mark.parametrize("total", [37, 999])
def test_fast_pairs_get_a_line_every_ten_seconds_and_the_last(total):
    clock, out = Clock(), io.StringIO()
    shown = LineProgress(total, out, clock)
    for i in range(total):
        clock.now += 0.05
        shown.finish(row(i))
    lines = out.getvalue().splitlines()
    assert len(lines) == int(total * 0.05 // EVERY_S) + 1 and lines[-1].startswith(f"[{total}/{total}] ")


def test_a_closed_stream_stops_the_lines_not_the_sweep():
    out = io.StringIO()
    out.close()
    LineProgress(1, out).finish(row(0))


def test_the_estimate_says_what_it_is_based_on():
    assert estimate(10, "run", "cpu") == ("about 40.0 s (10 pairs x 4.00 s: a rough constant of 4 s per run pair "
                                          "on cpu; no earlier run in the file with 3 or more timed rows over more "
                                          "than 0 s to measure from)")
    fast = [{"env": "e1", "run_id": "r", "status": "pass", "timestamp": f"2026-01-01T00:00:00.{ms:03d}+00:00"}
            for ms in (100, 300, 500, 700)]            # the rows' millisecond stamps: a run inside one second
    assert estimate(10, "run", "cpu", fast, "e1", "x.jsonl").startswith("about 2.0 s (10 pairs x 0.20 s: measured")
    rows = [{"env": "e1", "run_id": "r", "status": "pass", "timestamp": f"2026-01-01T00:00:{s:02d}+00:00"}
            for s in (0, 2, 4, 6)]
    assert estimate(10, "run", "cuda:0", rows, "e1", "x.jsonl").startswith(
        "about 20.0 s (10 pairs x 2.00 s: measured over 3 earlier pairs of this env in x.jsonl)")
    assert "of other envs" in estimate(10, "run", "cuda:0", rows, "e2", "x.jsonl")
