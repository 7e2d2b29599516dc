"""Plain progress lines off a terminal (one every `line_step` pairs, one after EVERY_S seconds
without a line, the last always), the bar on a terminal with the same time left, and the --dry-run
estimate's model."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console
from treebench.harness.model.cases import Case
from treebench.harness.model.suites import load_suite
from treebench.harness.run.config import RunConfig
from treebench.harness.run.costs import OUTSIDE_PAIRS, estimate, pair_seconds
from treebench.harness.run.progress import (
    EVERY_S,
    LINES,
    REPORT_NEXT,
    BarProgress,
    LineProgress,
    after_pairs,
    format_duration,
    line_step,
    plural,
    progress,
)
from treebench.harness.sweep.shard import Shard

SMOKE = Case(batch_size=1, context_len=16, tree="full:2:2", num_q_heads=4, num_kv_heads=2, head_dim=64)
SEED = Case(batch_size=64, context_len=2048, tree="full:3:3")            # Hq 32, Hkv 8, D 128


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def stored(case: Case, seconds: list[float], env: str = "e1", timer: str | None = "wall") -> list[dict]:
    """Result rows of one earlier run of `case`, one per pair, written `seconds` after midnight."""
    return [{"env": env, "run_id": "r", "status": "pass", "timer": timer, "case": case.axes,
             "context_lens": case.context_lens(), "tree_sizes": [t.size for t in case.trees()],
             "timestamp": (datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=s)).isoformat()}
            for s in seconds]


def row(i: int, backend: str = "torch_sdpa", status: str = "pass") -> dict:
    return {"backend": backend, "case_id": f"case{i}", "status": status}


@pytest.mark.parametrize("seconds, text", [(0.37, "0.4 s"), (12.0, "12.0 s"), (100, "1 min 40 s"),
                                           (7537, "2 h 5 min"), (0.037, "37 ms"), (0.0042, "4.2 ms"),
                                           (0.0999, "100 ms"), (0.1, "0.1 s"), (0.0, "0.0 ms")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_a_sweep_of_millisecond_pairs_says_how_long_it_took():
    """A check's pairs on a GPU take milliseconds: 8 of 4 ms end "(32 ms elapsed, done)", not 0.0 s."""
    clock, out = Clock(), io.StringIO()
    lines = LineProgress(8, out, clock, ["torch_sdpa"] * 8)
    for i in range(8):
        clock.now += 0.004
        lines.finish(row(i))
    assert out.getvalue().splitlines()[-1] == "[8/8] torch_sdpa on case7: pass (32 ms elapsed, done)"


@pytest.mark.parametrize("n, noun, many, text", [
    (1, "pair", None, "1 pair"), (2, "pair", None, "2 pairs"), (0, "row", None, "0 rows"),
    (1, "mismatch", "mismatches", "1 mismatch"), (37, "mismatch", "mismatches", "37 mismatches"),
])
def test_plural_says_one_pair_and_two_pairs(n, noun, many, text):
    assert plural(n, noun, many) == text


def test_the_estimate_of_one_pair_says_pair():
    assert estimate([SMOKE], "run", "cpu").startswith("about 3.6 s in all (1 pair, 0.09 s each on average, ")
    assert "the pace of 2 earlier pairs" in estimate([SMOKE], "run", "cpu", stored(SMOKE, [0, 2, 4]), "e1", "x.jsonl")


def test_slow_pairs_get_a_line_each_with_the_time_left():
    clock, out = Clock(), io.StringIO()
    shown = LineProgress(4, out, clock)
    for i in range(4):
        clock.now += 2.5
        shown.finish(row(i))
    lines = out.getvalue().splitlines()
    assert lines[0] == "[1/4] torch_sdpa on case0: pass (2.5 s elapsed, warming up, time left not known yet)"
    assert lines[1] == "[2/4] torch_sdpa on case1: pass (5.0 s elapsed, about 5.0 s left)"
    assert lines[-1] == "[4/4] torch_sdpa on case3: pass (10.0 s elapsed, done)" and len(lines) == 4


@pytest.mark.parametrize("plan", [True, False])
def test_the_time_left_counts_what_follows_the_last_pair(plan):
    """The summary and a run's report (`after_s`) come after the last pair: the time left counts them
    until that pair is done."""
    clock, out = Clock(), io.StringIO()
    shown = LineProgress(4, out, clock, ["a"] * 4 if plan else None, [1.0] * 4 if plan else None, after_s=2.2)
    for i in range(4):
        clock.now += 2.5
        shown.finish(row(i, "a"))
    lines = out.getvalue().splitlines()
    assert lines[1] == "[2/4] a on case1: pass (5.0 s elapsed, about 7.2 s left)"     # 2 pairs of 2.5 s and 2.2 s
    assert lines[2].endswith("(7.5 s elapsed, about 4.7 s left)") and lines[-1].endswith("(10.0 s elapsed, done)")


@pytest.mark.parametrize("after_s, said", [(2.2, "writing the report, about 2.2 s left"),
                                           (0.0, "writing the report")])
def test_the_last_line_of_a_run_says_its_report_is_being_written(after_s, said):
    """After a run's last pair its report is written: the last line says so (with the seconds it
    should take) in place of 'done', and so does the bar."""
    clock, out = Clock(), io.StringIO()
    shown = LineProgress(3, out, clock, ["a"] * 3, [1.0] * 3, after_s=after_s, then=REPORT_NEXT)
    bar = BarProgress(3, Console(file=io.StringIO(), force_terminal=True), clock, ["a"] * 3, [1.0] * 3,
                      after_s=after_s, then=REPORT_NEXT)
    for i in range(3):
        clock.now += 2.5
        shown.finish(row(i, "a"))
        bar.finish(row(i, "a"))
    lines = out.getvalue().splitlines()
    assert lines[-2].endswith("(5.0 s elapsed, about 2.5 s left)" if not after_s else
                              "(5.0 s elapsed, about 4.7 s left)")
    assert lines[-1] == f"[3/3] a on case2: pass (7.5 s elapsed, {said})" and "done" not in bar_text(bar)
    assert said in bar_text(bar)


@pytest.mark.parametrize("terminal, quiet", [(True, False), (True, True), (False, False)])
def test_what_follows_the_last_pair_is_shown_on_a_terminal_until_it_ends(terminal, quiet):
    """On a terminal the bar is erased when the sweep ends: `after_pairs` shows the report being
    written until it is, and erases that too; --quiet and plain lines show nothing more."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, color_system=None)
    with after_pairs(console, quiet):
        during = out.getvalue()
    assert (REPORT_NEXT in during) == (terminal and not quiet), during
    assert out.getvalue() == "" if quiet or not terminal else out.getvalue().endswith("\x1b[2K")


@pytest.mark.parametrize("quiet", [False, True])
def test_a_report_after_a_wait_gets_a_plain_line_of_its_own(quiet):
    """Off a terminal, where the last progress line said a wait (torchrun rank 0's for the other ranks),
    `after_pairs` says in one line that the report is being written, before the block runs; --quiet does not."""
    out = io.StringIO()
    with after_pairs(Console(file=out, force_terminal=False), quiet, said=False):
        during = out.getvalue()
    assert during == ("" if quiet else f"{REPORT_NEXT}\n") and out.getvalue() == during


def done_of(lines: list[str]) -> list[int]:
    """'[5/32] ...' -> 5: the pairs done that each line reports."""
    return [int(re.match(r"\[(\d+)/\d+\] ", line).group(1)) for line in lines]


@pytest.mark.parametrize("total, step", [(1, 1), (8, 1), (10, 1), (11, 2), (32, 5), (37, 5), (50, 5), (51, 10),
                                         (232, 50), (378, 50), (999, 100), (10**4, 1000), (10**4 + 1, 2000)])
def test_the_line_step_is_a_round_number_giving_at_most_ten_lines(total, step):
    assert line_step(total) == step and -(-total // step) <= LINES


def test_a_fast_sweep_after_a_slow_warm_up_gets_lines_at_a_steady_interval():
    """The CPU smoke run: a first pair of 3.3 s (compiles), then 31 of 0.15 s. The mean pace says
    nothing of when the next line is due: lines every 5 pairs and the last, not 1, 2, 3 and 32."""
    clock, out = Clock(), io.StringIO()
    shown = LineProgress(32, out, clock, ["a"] * 32)
    for i in range(32):
        clock.now += 3.3 if i == 0 else 0.15
        shown.finish(row(i, "a"))
    assert done_of(out.getvalue().splitlines()) == [5, 10, 15, 20, 25, 30, 32]


@pytest.mark.parametrize("total, pair_s", [(37, 0.05), (999, 0.05), (10**4, 0.01), (232, 0.6)])
def test_fast_pairs_get_a_line_every_step_and_the_last(total, pair_s):
    """Pairs fast enough that a step takes under EVERY_S: lines at each step alone, and the last."""
    clock, out = Clock(), io.StringIO()
    shown = LineProgress(total, out, clock)
    for i in range(total):
        clock.now += pair_s
        shown.finish(row(i))
    step = line_step(total)
    assert done_of(out.getvalue().splitlines()) == [*range(step, total, step), total]


@pytest.mark.parametrize("total, pair_s", [(378, 1.0), (37, 45.0), (2000, 2.5)])
def test_a_slow_sweep_gets_a_line_every_step_and_after_each_quiet_spell(total, pair_s):
    """Steps that take longer than EVERY_S: a line also when EVERY_S seconds have passed without
    one; no spell of more than EVERY_S and a pair without a line, and never a line per pair of a
    long sweep of short pairs."""
    clock, out = Clock(), io.StringIO()
    shown = LineProgress(total, out, clock)
    for i in range(total):
        clock.now += pair_s
        shown.finish(row(i))
    done = done_of(out.getvalue().splitlines())
    step = line_step(total)
    assert set(range(step, total, step)) <= set(done) and done[-1] == total
    gaps_s = [(b - a) * pair_s for a, b in zip([0, *done], done)]
    assert max(gaps_s) < EVERY_S + pair_s
    assert len(done) <= LINES + total * pair_s / EVERY_S + 1


def test_a_closed_stream_stops_the_lines_not_the_sweep():
    out = io.StringIO()
    out.close()
    LineProgress(1, out).finish(row(0))


def test_the_estimate_says_what_it_is_based_on():
    assert estimate([SMOKE] * 10, "run", "cpu") == UNSCALED
    assert estimate([SMOKE] * 10, "run", "cuda:1") == (
        "about 15.1 s in all (10 pairs, 0.80 s each on average, + 7.1 s of start-up, summary and report)\n"
        "per run pair on cuda: 0.8 s whatever its size\n"
        "figures measured over the seed suite on an H200, the report on a 2-core CPU")
    assert "\nper check pair on cpu: 0.052 s + 66.6 s per 10^9 K/V values read (2 x S_b x Hq x D per request)\n" in \
        estimate([SMOKE] * 10, "check", "mps")
    fast = stored(SMOKE, [0.1, 0.3, 0.5, 0.7])     # millisecond stamps: a run inside one second, 0.2 s per pair
    assert estimate([SMOKE] * 10, "run", "cpu", fast, "e1", "x.jsonl") == (
        "about 5.5 s in all (10 pairs, 0.20 s each on average, + 3.5 s of start-up, summary and report)\n"
        "per run pair on cpu: 0.09 s + 52.6 s per 10^9 K/V values read (2 x S_b x Hq x D per request)\n"
        "figures measured on a 2-core CPU\n"
        "scaled x 2.21 to the pace of 3 earlier pairs of this env in x.jsonl")
    rows = stored(SMOKE, [0, 2, 4, 6])
    assert estimate([SMOKE] * 10, "run", "cuda:0", rows, "e1", "x.jsonl").startswith(
        "about 27.1 s in all (10 pairs, 2.00 s each on average, + 7.1 s of start-up, summary and report)\n"
        "per run pair on cuda: 0.8 s whatever its size\n")
    assert estimate([SMOKE] * 10, "run", "cuda:0", rows, "e1", "x.jsonl").endswith(
        "\nscaled x 2.50 to the pace of 3 earlier pairs of this env in x.jsonl")
    assert "of other envs" in estimate([SMOKE] * 10, "run", "cuda:0", rows, "e2", "x.jsonl")


@pytest.mark.parametrize("mode", ["run", "check"])
@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
@pytest.mark.parametrize("source", [None, "results/local/smoke-20260101T000000Z.jsonl"])
def test_the_estimate_says_once_where_its_figures_come_from_in_short_lines(mode, device, source):
    """One line of the time, one of the cost model, one of where its figures come from (the pairs' and the
    time outside them alike, said once), one of the scale: each about 140 characters at most as printed."""
    rows = stored(SMOKE, [0, 2, 4, 6])
    for found in ([], rows):
        lines = estimate([SMOKE] * 10, mode, device, found if source else (), "e1", source,
                         ["flex"] * 10, isolate=True).splitlines()
        assert len(lines) == 3 + bool(source) + (device != "cpu"), lines
        assert sum(ln.count("measured on") + ln.count("measured over") for ln in lines) == 1, lines
        assert lines[2].startswith("figures measured ") and "2-core CPU" in lines[2]
        assert len("estimated time: " + lines[0]) <= 150 and max(len("  " + ln) for ln in lines[1:]) <= 140, lines


def per_pair_s(line: str) -> float:
    """The seconds per pair an estimate's line states ('..., 0.09 s each on average: ...')."""
    return float(line.split(" s each on average")[0].rsplit(", ", 1)[1])


@pytest.mark.parametrize("mode", ["run", "check"])
def test_a_seed_sized_case_costs_far_more_per_pair_than_a_smoke_sized_one(mode):
    """The time follows each case's size: B 64 L 2048 T 40 (H 32x8, D 128) reads ~50000x the K/V of B 1 L 16
    T 7 (H 4x2, D 64); on the CPU its pairs took ~50 s against ~0.1 s."""
    seed, smoke = per_pair_s(estimate([SEED] * 4, mode, "cpu")), per_pair_s(estimate([SMOKE] * 4, mode, "cpu"))
    assert seed > 100 * smoke and seed > 20.0
    both = per_pair_s(estimate([SEED, SMOKE, SMOKE, SMOKE], mode, "cpu"))   # a sum over the pairs, not a count
    assert both == pytest.approx((seed + 3 * smoke) / 4, rel=0.01)


def test_the_seed_suite_estimate_on_the_cpu_is_near_the_measured_pace():
    """A model check, timing nothing: the CPU run pairs of the seed suite (its 4 CPU backends) against what
    they took on a 2-core CPU: 5.3 s per pair over its first shard (`--shard 0/21`: B 1, 16, 64 x L 16 and
    1024), 9.4 s over that shard and `--shard 13/21` (L 16 and 2048) together."""
    cases = load_suite("seed").cases
    first = per_pair_s(estimate([c for c in Shard(0, 21).select(cases) for _ in range(4)], "run", "cpu"))
    assert 5.6 / 2 < first < 5.6 * 2
    whole = per_pair_s(estimate([c for c in cases for _ in range(4)], "run", "cpu"))
    assert 9.4 / 2 < whole < 9.4 * 2


def test_the_readme_quotes_the_seed_suite_dry_run_on_a_cpu():
    """The README's figure of `treebench run --suite seed --dry-run` on a CPU (its four CPU backends) is the one
    the dry run gives now."""
    from pathlib import Path

    from treebench.harness.run.loading import resolve_backends
    from treebench.harness.sweep.execute import SweepOptions, execute

    backends = resolve_backends(["torch_sdpa", "flex", "reference", "two_pass"])
    run = RunConfig(mode="run", quiet=True, device="cpu")
    plan = execute(load_suite("seed").cases, backends, SweepOptions(run=run, dry_run=True))
    total = plan.estimate.split(" in all")[0].removeprefix("about ")
    quoted = (f"the seed suite's {plan.planned - plan.will_skip} run pairs on a CPU ({plan.will_skip} more to be "
              f"recorded as skipped) at about {total} in all")
    assert quoted in " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split()), quoted


def test_rows_of_small_cases_scale_the_model_instead_of_setting_the_pace():
    """A results file of smoke rows (0.1 s per pair) predicts seed-sized pairs at the model's size
    ratio, scaled by how fast the machine ran the smoke rows (here twice the model's time)."""
    model = per_pair_s(estimate([SEED] * 4, "run", "cpu"))
    rows = stored(SMOKE, [0.18 * i for i in range(200)])    # 199 pairs of 0.18 s: 2x the model's 0.09 s, 18 s in all
    line = estimate([SEED] * 4, "run", "cpu", rows, "e1", "x.jsonl")
    assert per_pair_s(line) == pytest.approx(2 * model, rel=0.02) and "x 1.99 to the pace of 199 earlier" in line
    check_rows = [dict(r, timer=None) for r in rows]        # an untimed run is a check: its own model scales
    assert "x 3.41 to the pace" in estimate([SEED] * 4, "run", "cpu", check_rows, "e1", "x.jsonl")


def test_a_few_short_earlier_pairs_do_not_scale_a_long_sweep():
    """`treebench run --suite random --backends torch_sdpa --out X`, stopped after 4 rows, then `--resume
    --dry-run`: its 3 timed pairs (2.1 s as modelled) ran at x 0.26 of the model, which said 2 min 11 s for
    the 78 pairs left; they took 8 min 41 s, the unscaled model's 8 min 24 s. Too little to set the pace."""
    cases = load_suite("random").cases
    rows = [r for case, s in zip(cases, [0.0, 0.19, 0.37, 0.557]) for r in stored(case, [s])]
    line = estimate(cases[4:], "run", "cpu", rows, "e1", "X")
    assert line == estimate(cases[4:], "run", "cpu") + (
        "\nnot scaled: 3 earlier pairs in X, modelled at 2.1 s, too few to set the pace (10.0 s needed)")
    assert line.startswith("about 8 min 2"), line


@pytest.mark.parametrize("earlier, to_run, scaled", [
    (4, [SMOKE] * 10, True),     # 0.27 s as modelled: more than a quarter of the 0.91 s to run
    (4, [SMOKE] * 20, False),    # less than a quarter of 1.8 s
    (200, [SEED] * 4, True),     # 18 s: more than 10 s, a small share of the ~3 min to run
    (100, [SEED] * 4, False),    # 9.0 s
])
def test_earlier_pairs_scale_when_they_cover_10_s_or_a_quarter_of_what_is_left(earlier, to_run, scaled):
    rows = stored(SMOKE, [0.18 * i for i in range(earlier)])     # 2x the model's time
    line = estimate(to_run, "run", "cpu", rows, "e1", "x.jsonl")
    unscaled = per_pair_s(estimate(to_run, "run", "cpu"))
    assert per_pair_s(line) == pytest.approx(2 * unscaled if scaled else unscaled, rel=0.02), line
    assert ("\nscaled x 1.99 to the pace" in line) == scaled and ("too few to set the pace" in line) != scaled


def test_rows_without_a_size_or_a_time_are_left_out_of_the_scale():
    rows = stored(SMOKE, [0, 2, 4]) + [{"env": "e1", "run_id": "r2", "status": "pass", "timestamp": t}
                                       for t in ("2026-01-01T00:00:00+00:00", "2026-01-01T00:01:00+00:00",
                                                 "2026-01-01T00:02:00+00:00")]
    rows[1] = dict(rows[1], timestamp="not a time")
    assert "\nnot scaled: x.jsonl has no earlier run with 3 or more" in estimate([SMOKE], "run", "cpu", rows, "e1",
                                                                               "x.jsonl")


UNSCALED = ("about 4.4 s in all (10 pairs, 0.09 s each on average, + 3.5 s of start-up, summary and report)\n"
            "per run pair on cpu: 0.09 s + 52.6 s per 10^9 K/V values read (2 x S_b x Hq x D per request)\n"
            "figures measured on a 2-core CPU")


@pytest.mark.parametrize("rows", [[], stored(SMOKE, [0, 2]), stored(SMOKE, [5, 5, 5]),
                                  [dict(r, status="skipped") for r in stored(SMOKE, [0, 2, 4])]],
                         ids=["empty", "2 rows", "no time between rows", "skipped rows"])
def test_a_results_file_without_an_earlier_run_to_scale_by_says_so(rows):
    assert estimate([SMOKE] * 10, "run", "cpu", rows, "e1", "x.jsonl") == (
        UNSCALED + "\nnot scaled: x.jsonl has no earlier run with 3 or more rows that ran (not skipped)")


def test_without_a_results_file_the_estimate_says_nothing_of_earlier_runs():
    assert estimate([SMOKE] * 10, "run", "cpu") == UNSCALED


def total_s(line: str) -> float:
    """The seconds in all an estimate's line states ('about 5.9 s in all (...')."""
    assert line.startswith("about ") and " s in all (" in line, line
    return float(line.split()[1])


@pytest.mark.parametrize("mode", ["run", "check"])
@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_the_time_outside_the_pairs_is_added_once_unscaled_and_said(mode, device):
    """Start-up (imports, torch's among them, the env fingerprint) and, for a run, its report cost as much
    for 0 pairs as for 10: added once to the pairs' sum, not scaled by earlier runs' pace, named in the line,
    and left out of `pair_seconds`, the live time left's weights (a sweep under way has started)."""
    from treebench.harness.run.costs import MEASURED_ON

    kind = device[:4].rstrip(":")
    outside = OUTSIDE_PAIRS[(mode, kind)]
    assert outside.seconds >= 1.0
    empty = estimate([], mode, device)
    assert total_s(empty) == pytest.approx(outside.seconds, abs=0.05) and "(0 pairs, + " in empty
    pairs = sum(pair_seconds([(SMOKE, device)] * 10, mode))
    line = estimate([SMOKE] * 10, mode, device)
    assert total_s(line) == pytest.approx(pairs + outside.seconds, abs=0.05)
    assert per_pair_s(line) == pytest.approx(pairs / 10, abs=0.01)
    first, _, source = line.splitlines()
    assert first.endswith(f", + {outside.seconds:g} s of "
                          f"{'start-up, summary and report' if mode == 'run' else 'start-up and summary'})"), line
    assert source == f"figures {MEASURED_ON[(mode, kind)]}"
    slow = stored(SMOKE, [0, 2, 4, 6], timer="wall" if mode == "run" else None)    # pairs far slower than modelled
    scaled = estimate([SMOKE] * 10, mode, device, slow, "e1", "x.jsonl")
    assert total_s(scaled) == pytest.approx(10 * per_pair_s(scaled) + outside.seconds, abs=0.1)


@pytest.mark.parametrize("mode", ["run", "check"])
def test_an_isolate_worker_adds_its_start_up_once_where_it_was_measured(mode):
    """--isolate starts one worker when a pair runs: on a CPU its measured start-up is added once and said;
    with no pair to run no worker starts; on CUDA, where it was not measured, the lines say it is left out."""
    from treebench.harness.run.costs import WORKER_START_S

    plain, isolated = estimate([SMOKE] * 10, mode, "cpu"), estimate([SMOKE] * 10, mode, "cpu", isolate=True)
    assert WORKER_START_S["cpu"] >= 0.5
    assert total_s(isolated) == pytest.approx(total_s(plain) + WORKER_START_S["cpu"], abs=0.05)
    assert isolated.splitlines()[0].endswith(f", + {WORKER_START_S['cpu']:g} s for the --isolate worker)"), isolated
    assert per_pair_s(isolated) == per_pair_s(plain)
    assert estimate([], mode, "cpu", isolate=True) == estimate([], mode, "cpu")
    gpu = estimate([SMOKE] * 10, mode, "cuda:0", isolate=True)
    assert total_s(gpu) == total_s(estimate([SMOKE] * 10, mode, "cuda:0")) and "--isolate worker)" not in gpu
    assert gpu.endswith("\nnot included: the --isolate worker's start-up on cuda (not measured)"), gpu


def test_the_start_up_of_gpus_ranks_is_said_to_be_left_out():
    """`run --gpus N` (N > 1) relaunches under torchrun: its ranks' start-up, not measured, is named as left
    out, and so is their sharing of the pairs; --gpus 1 starts no rank."""
    line = estimate([SMOKE] * 10, "run", "cuda:0", ranks=4)
    assert total_s(line) == total_s(estimate([SMOKE] * 10, "run", "cuda:0"))
    assert line.endswith("\nnot included: the start-up of the 4 torchrun ranks of --gpus 4 (not measured); the time is "
                         "that of one GPU running every pair"), line
    assert "not included" not in estimate([SMOKE] * 10, "run", "cuda:0", ranks=1)


def test_a_dry_run_passes_isolate_and_gpus_to_the_estimate():
    """`treebench run --gpus N --isolate --dry-run` reaches the estimate: --gpus through the sweep options,
    --isolate through the run request."""
    from treebench.harness.cli.common import sweep_options
    from treebench.harness.cli.main import build_parser
    from treebench.harness.sweep.execute import SweepOptions, execute

    assert sweep_options(build_parser().parse_args(["run", "--gpus", "3", "--dry-run"]), "run").gpus == 3
    assert sweep_options(build_parser().parse_args(["check", "--backend", "reference"]), "check").gpus is None

    class Ready:
        name, mask_kind = "ready", "tree"

        def availability(self):
            return None

        def supports(self, case):
            return None

    run = RunConfig(mode="run", quiet=True, device="cpu", check_memory=False, isolate=True)
    plan = execute([SMOKE], [Ready()], SweepOptions(run=run, dry_run=True, gpus=3))
    assert ", + 1 s for the --isolate worker)\n" in plan.estimate, plan.estimate
    assert plan.estimate.endswith("\nnot included: the start-up of the 3 torchrun ranks of --gpus 3 (not measured); "
                                  "the time is that of one GPU running every pair"), plan.estimate


INTERPRETED_LINE = ("not included: Triton's CPU interpreter (TRITON_INTERPRET is on), in which {names}: the estimate "
                    "does not model interpreted Triton, whose pairs take many times longer")


class Ready:
    """A backend that runs every case; `runs_triton` as given."""

    mask_kind = "tree"

    def __init__(self, name: str, runs_triton: bool = False):
        self.name, self.runs_triton = name, runs_triton

    def availability(self):
        return None

    def supports(self, case):
        return None


@pytest.mark.parametrize("interpret", ["1", "true", "0", ""])
def test_a_dry_run_says_its_estimate_leaves_out_interpreted_triton_backends(interpret, monkeypatch):
    """TRITON_INTERPRET on and a backend declaring `runs_triton` with a pair to run: the last line says the
    estimate does not model it (a smoke run of triton_tree took 38 s against 4.2 s estimated); off, or
    only other backends: no such line, and the time is the same."""
    from treebench.harness.sweep.execute import SweepOptions, execute

    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    run = RunConfig(mode="run", quiet=True, device="cpu", check_memory=False)
    mixed = execute([SMOKE], [Ready("mine_triton", runs_triton=True), Ready("plain")],
                    SweepOptions(run=run, dry_run=True)).estimate
    plain = execute([SMOKE, SMOKE], [Ready("plain")], SweepOptions(run=run, dry_run=True)).estimate
    on = interpret in ("1", "true")
    assert mixed.endswith("\n" + INTERPRETED_LINE.format(names="mine_triton runs")) is on, mixed
    assert mixed.splitlines()[0] == plain.splitlines()[0] and "interpret" not in plain


def test_the_interpreted_line_names_only_backends_with_a_pair_to_run(monkeypatch):
    from treebench.harness.run.costs import interpreted_triton

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    found = interpreted_triton([Ready("a", True), Ready("b"), Ready("c", True)])
    assert found == {"a", "c"}
    assert estimate([SMOKE] * 2, "check", "cpu", backends=["c", "b"], interpreted=found).endswith(
        "\n" + INTERPRETED_LINE.format(names="c runs"))
    assert estimate([SMOKE] * 3, "run", "cpu", backends=["c", "b", "a"], interpreted=found).endswith(
        "\n" + INTERPRETED_LINE.format(names="a, c run"))
    assert "interpret" not in estimate([SMOKE], "run", "cpu", backends=["b"], interpreted=found)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert interpreted_triton([Ready("a", True)]) == set()


def test_the_registered_triton_backends_declare_it():
    from treebench.harness.run.loading import registered_backends

    declared = {name for name, cls in registered_backends().items() if cls.runs_triton}
    assert declared == {"triton_tree", "triton_tree_bias", "triton_causal", "vllm_triton", "sglang_triton"}


@pytest.mark.parametrize("command", [["run", "--suite", "smoke", "--backends", "triton_tree,torch_sdpa"],
                                     ["check", "--backend", "triton_tree"]])
def test_the_dry_run_of_triton_tree_in_the_interpreter_says_so(command, monkeypatch, capsys):
    pytest.importorskip("triton")
    from treebench.harness.cli.main import main

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert main([*command, "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert printed.rstrip().endswith("  " + INTERPRETED_LINE.format(names="triton_tree runs")), printed


def test_the_smoke_run_estimate_on_the_cpu_is_near_its_measured_time():
    """A model check, timing nothing: `treebench run --suite smoke --backends torch_sdpa` (8 pairs of ~0.1 s)
    took 4.0-4.5 s from start to exit on a 2-core CPU, ~1.3 s of it start-up and ~2.2 s its report."""
    line = estimate(load_suite("smoke").cases, "run", "cpu", backends=["torch_sdpa"] * 8)
    assert 4.0 / 1.5 < total_s(line) < 4.5 * 1.5


@pytest.mark.parametrize("out", [None, "new", "empty"])
def test_the_dry_run_line_names_the_results_file_only_when_there_is_one(out, tmp_path, capsys):
    """No --out (a fresh file of its own) or an --out not there yet: nothing to scale by, nothing said of
    earlier runs; an --out without an earlier run to scale by: the line says so."""
    from treebench.harness.cli.main import main
    path = tmp_path / "x.jsonl"
    if out == "empty":
        path.write_text("")
    assert main(["run", "--suite", "smoke", "--backends", "reference", "--dry-run"]
                + (["--out", str(path)] if out else [])) == 0
    printed = capsys.readouterr().out
    lines = printed[printed.index("estimated time: "):].splitlines()
    assert lines[0] == "estimated time: about 4.2 s in all (8 pairs, 0.09 s each on average, + 3.5 s of start-up, " \
                       "summary and report)"
    assert lines[1] == "  per run pair on cpu: 0.09 s + 52.6 s per 10^9 K/V values read (2 x S_b x Hq x D per request)"
    assert lines[2] == "  figures measured on a 2-core CPU"
    assert lines[3:] == ([f"  not scaled: {path} has no earlier run with 3 or more rows that ran (not skipped)"]
                         if out == "empty" else []), printed


def sweep(backends: list[str], cases: int, first_s: float, then_s: float, plan: bool = True,
          skipped: frozenset = frozenset()) -> tuple[list[tuple[float, float | None]], list[str]]:
    """A case-major sweep on the fake clock: each backend's first pair that runs takes first_s
    seconds, its others then_s, the (case, backend) pairs in `skipped` none (skipped rows).
    Returns (true seconds left, LineProgress.left_s) after each pair, and the lines."""
    clock, out = Clock(), io.StringIO()
    pairs = [(c, b) for c in range(cases) for b in backends]
    ran: set[str] = set()
    cost = []
    for c, b in pairs:
        cost.append(0.0 if (c, b) in skipped else then_s if b in ran else first_s)
        ran |= set() if (c, b) in skipped else {b}
    shown = LineProgress(len(pairs), out, clock, [b for _, b in pairs] if plan else None)
    lefts = []
    for i, ((c, b), s) in enumerate(zip(pairs, cost)):
        clock.now += s
        shown.finish(row(c, b, "skipped" if (c, b) in skipped else "pass"))
        lefts.append((sum(cost[i + 1:]), shown.left_s()))
    return lefts, out.getvalue().splitlines()


@pytest.mark.parametrize("backends", [["a", "b", "c"], [f"b{i}" for i in range(14)]])
@pytest.mark.parametrize("cases", [31, 8])
def test_the_time_left_leaves_each_backends_warm_up_out(backends, cases):
    """First pairs of 40 s, then 1 s: scaling the mean pair up would say ~40x the time left."""
    lefts, lines = sweep(backends, cases, first_s=40.0, then_s=1.0)
    n = len(backends)
    assert done_of(lines)[:n] == list(range(1, n + 1))    # warm-ups of 40 s: a line after each
    for line in lines[:n]:                                # only first pairs timed: no figure
        assert line.endswith(" elapsed, warming up, time left not known yet)"), line
    for (true_s, left_s) in lefts[n:-1]:
        assert left_s == pytest.approx(true_s)
    for done, line in zip(done_of(lines)[n:-1], lines[n:-1]):
        assert line.endswith(f", about {format_duration(lefts[done - 1][0])} left)"), line
    assert lines[-1].endswith(", done)")


def test_backends_yet_to_start_add_a_warm_up():
    """A sweep of one case: every pair is a first pair, each costing the warm-up seen."""
    lefts, _ = sweep(["a", "b", "c", "d"], 1, first_s=40.0, then_s=1.0)
    assert [left_s for _, left_s in lefts] == [120.0, 80.0, 40.0, 0.0]


def test_each_backend_is_timed_at_its_own_pace():
    clock, out = Clock(), io.StringIO()
    pairs = [(c, b) for c in range(5) for b in ("slow", "fast")]
    shown = LineProgress(len(pairs), out, clock, [b for _, b in pairs])
    for c, b in pairs[:4]:                         # warm-ups, then one steady pair each: 10 s and 2 s
        clock.now += 30.0 if c == 0 else 10.0 if b == "slow" else 2.0
        shown.finish(row(c, b))
    assert shown.left_s() == 3 * 10.0 + 3 * 2.0


def test_a_skipped_first_pair_is_no_warm_up():
    """b skips case 0 (a skipped row, no time): its warm-up comes with its first pair that runs."""
    lefts, _ = sweep(["a", "b"], 6, first_s=40.0, then_s=1.0, skipped=frozenset({(0, "b")}))
    (true_a, left_a), (true_b, left_b) = lefts[2:4]
    assert (true_a, true_b) == (48.0, 8.0)
    assert left_a == 40.0 + 4 * 1.0 + 4 * 0.0     # b's warm-up still to come (its pairs at its 0 s so far)
    assert left_b == 4 * 1.0 + 4 * 0.0           # b's warm-up done: not counted again


def test_skipped_pairs_alone_give_no_time_left():
    lefts, _ = sweep(["a", "b"], 3, first_s=5.0, then_s=1.0, skipped=frozenset({(0, "a"), (0, "b")}))
    assert [left_s for _, left_s in lefts[:2]] == [None, None]          # no warm-up seen to count b's by
    assert lefts[2][1] == 5.0                   # a's warm-up done: b's to come, the pairs left at their 0 s


def test_without_the_plan_the_pairs_left_cost_the_steady_mean():
    lefts, lines = sweep(["a", "b", "c"], 31, first_s=40.0, then_s=1.0, plan=False)
    assert [left_s for _, left_s in lefts[:3]] == [None, None, None] and "not known yet" in lines[2]
    for true_s, left_s in lefts[3:]:
        assert left_s == pytest.approx(true_s)


def test_a_plan_of_another_size_is_refused():
    with pytest.raises(ValueError, match="names 2 pairs, total is 3"):
        LineProgress(3, io.StringIO(), backends=["a", "b"])


@pytest.mark.parametrize("backends, costs", [(None, [1.0, 1.0]), (["a", "b"], [1.0]), (["a", "b"], [1.0, 0.0])])
def test_costs_without_a_plan_of_their_size_or_not_positive_are_refused(backends, costs):
    with pytest.raises(ValueError, match="positive cost for each of the 2 pairs"):
        LineProgress(2, io.StringIO(), backends=backends, costs=costs)


def follow(pairs: list[tuple[int, str]], seconds: list[float], costs: list[float] | None,
           skipped: frozenset = frozenset()) -> list[float | None]:
    """LineProgress.left_s after each (case, backend) pair of `pairs`, pair i taking seconds[i] on the
    fake clock and predicted to cost costs[i] (None: no costs given)."""
    clock = Clock()
    shown = LineProgress(len(pairs), io.StringIO(), clock, [b for _, b in pairs], costs)
    lefts = []
    for (c, b), s in zip(pairs, seconds):
        clock.now += s
        shown.finish(row(c, b, "skipped" if (c, b) in skipped else "pass"))
        lefts.append(shown.left_s())
    return lefts


@pytest.mark.parametrize("pace", [0.5, 3.0])
def test_the_time_left_follows_each_pairs_cost(pace):
    """Small cases first, then cases of 20x their predicted cost: past the warm-ups (40 s) the time left
    is the predicted seconds left x the measured / predicted seconds of the pairs done, the true time
    left here. Counting the pairs left at the small pairs' mean would say ~1/9 of it."""
    sizes = [1.0] * 4 + [20.0] * 3
    pairs = [(c, b) for c in range(len(sizes)) for b in ("a", "b")]
    costs = [sizes[c] for c, _ in pairs]
    seconds = [40.0 if c == 0 else pace * sizes[c] for c, _ in pairs]
    lefts = follow(pairs, seconds, costs)
    assert lefts[:2] == [None, None]
    for i, left in enumerate(lefts[2:], start=2):
        assert left == pytest.approx(sum(seconds[i + 1:])), i
    before_big = 7                                      # the last small pair done
    assert follow(pairs, seconds, None)[before_big] < sum(seconds[before_big + 1:]) / 8


@pytest.mark.parametrize("cost", [1.0, 0.37, 52.6])
def test_pairs_of_one_size_give_the_time_left_they_gave_without_costs(cost):
    """A warm-up of 30 s each, then 10 s (slow) and 2 s (fast) pairs, fast skipping case 2 and slow's
    first pair a skipped one: the costs, all alike, change no figure."""
    pairs = [(c, b) for c in range(6) for b in ("slow", "fast", "late")]
    skipped = frozenset({(2, "fast"), (0, "slow"), (0, "late"), (1, "late")})
    seconds = [0.0 if (c, b) in skipped else 30.0 if (c, b) in ((1, "slow"), (0, "fast"), (2, "late")) else
               10.0 if b == "slow" else 2.0 for c, b in pairs]
    unweighted = follow(pairs, seconds, None, skipped)
    assert unweighted[0] is None and unweighted[1:4] == [60.0, 60.0, 30.0] and unweighted[-1] == 0.0
    assert follow(pairs, seconds, [cost] * len(pairs), skipped) == pytest.approx(unweighted)


def test_the_runner_gives_the_progress_each_pairs_predicted_seconds(monkeypatch):
    from treebench.harness.adapter.contract import Capabilities
    from treebench.harness.run import runner

    class Away:                       # unavailable: skipped rows, nothing built
        mask_kind, capabilities = "tree", Capabilities()

        def __init__(self, name):
            self.name = name

        def availability(self):
            return "not here"

        def supports(self, case):
            return None

    seen = {}

    class Recorded(progress):
        def __init__(self, total, quiet, console, backends=None, costs=None, after_s=0.0, then=""):
            seen.update(backends=list(backends or []), costs=costs, after_s=after_s, then=then)
            super().__init__(total, True, console, backends, costs, after_s, then)

    monkeypatch.setattr(runner, "progress", Recorded)
    rows = runner.run_cases([SMOKE, SEED], [Away("a"), Away("b")], RunConfig(mode="check", device="cpu", quiet=True))
    assert [r["status"] for r in rows] == ["skipped"] * 4 and seen["backends"] == ["a", "b", "a", "b"]
    assert seen["costs"] == pair_seconds([(SMOKE, "cpu")] * 2 + [(SEED, "cpu")] * 2, "check")
    assert seen["costs"][2] > 100 * seen["costs"][0]
    assert seen["after_s"] == OUTSIDE_PAIRS[("check", "cpu")].after_s == 0.5       # the check's summary
    assert seen["then"] == ""                                                      # the check is then done
    runner.run_cases([SMOKE], [Away("a")], RunConfig(mode="run", device="cpu", quiet=True))
    assert seen["then"] == ""                                    # no report asked for: none is said to follow
    assert seen["after_s"] == OUTSIDE_PAIRS[("check", "cpu")].after_s   # nor counted: the summary alone
    runner.run_cases([SMOKE], [Away("a")], RunConfig(mode="run", device="cpu", quiet=True, report=True))
    assert seen["then"] == REPORT_NEXT and seen["after_s"] == OUTSIDE_PAIRS[("run", "cpu")].after_s
    wait = "waiting for ranks 1-3"   # torchrun rank 0: the others first, for as long as they take
    runner.run_cases([SMOKE], [Away("a")], RunConfig(mode="run", device="cpu", quiet=True, report=True, wait_note=wait))
    assert seen["then"] == wait and seen["after_s"] == 0.0


def test_run_alone_asks_for_the_report_the_runner_says_comes_next(monkeypatch, tmp_path):
    """`treebench run` sets RunConfig.report, the one flag the runner's progress and run's writing of the
    report both read; a check leaves it off, and a check cannot ask for one."""
    import treebench.harness.sweep.execute
    from treebench.harness.cli.main import main
    from treebench.harness.run.config import RunConfig
    from treebench.harness.sweep.execute import SweepResult

    seen = []

    def record(cases, backends, opts, console):
        seen.append((opts.run.mode, opts.run.report))
        return SweepResult(primary=False)              # a torchrun rank > 0: nothing more to do
    monkeypatch.setattr(treebench.harness.sweep.execute, "execute", record)
    monkeypatch.chdir(tmp_path)
    main(["run", "--suite", "smoke", "--backends", "reference", "--quiet"])
    main(["check", "--suite", "smoke", "--backend", "reference", "--quiet"])
    assert seen == [("run", True), ("check", False)]
    with pytest.raises(ValueError, match="only a run ends with a report"):
        RunConfig(mode="check", report=True)


def bar_text(shown: BarProgress) -> str:
    """What the bar shows now, as plain text on a wide terminal."""
    out = io.StringIO()
    Console(file=out, force_terminal=True, color_system=None, width=300).print(shown.bar.get_renderable())
    return out.getvalue()


@pytest.mark.parametrize("plan", [True, False])
def test_the_bar_shows_the_time_left_the_lines_show(plan):
    """On a terminal the bar says after each pair what the plain lines say: first pairs of 40 s, then
    1 s (rich's own figure, from the mean pace so far, would say ~10x the time left), and 'warming
    up' before a steady pair."""
    pairs = [(c, b) for c in range(8) for b in ("a", "b", "c")]
    clock, out = Clock(), io.StringIO()
    names = [b for _, b in pairs] if plan else None
    lines = LineProgress(len(pairs), out, clock, names)
    bar = BarProgress(len(pairs), Console(file=io.StringIO(), force_terminal=True), clock, names)
    assert "warming up, time left not known yet" in bar_text(bar)
    for c, b in pairs:
        bar.start(b, f"case{c}")
        clock.now += 40.0 if c == 0 else 1.0
        lines.finish(row(c, b))
        bar.finish(row(c, b))
        last = out.getvalue().splitlines()[-1]
        said = last.rsplit(" elapsed, ", 1)[1].removesuffix(")")
        if not last.startswith(f"[{lines.done_pairs}/"):    # no line for this pair: what one would say
            said = lines.left_text()
        shown = bar_text(bar)
        assert said in shown and f"{lines.done_pairs}/{len(pairs)}" in shown, (said, shown)
        assert not re.search(r"\d+:\d\d:\d\d|-:--:--", shown), shown      # no figure of rich's own
    printed = out.getvalue().splitlines()
    assert done_of(printed) == [1, 2, 3, 5, 10, 15, 20, 24]    # 40 s warm-ups: a line after each
    assert [ln.rsplit(" elapsed, ", 1)[1] for ln in printed[2:4]] == [
        "warming up, time left not known yet)", "about 19.0 s left)"]


def test_the_bar_is_given_each_pairs_backend_and_cost():
    """On a terminal the bar is told each pair's backend, so it counts a warm-up for those yet to run,
    and its predicted cost."""
    with progress(4, False, Console(file=io.StringIO(), force_terminal=True), ["a", "a", "b", "b"],
                  [1.0, 2.0, 3.0, 4.0]) as shown:
        assert isinstance(shown, BarProgress)
        assert {name: list(costs) for name, costs in shown.to_do.items()} == {"a": [1.0, 2.0], "b": [3.0, 4.0]}


@pytest.mark.parametrize("name", ["flex[bold]", "two_pass[/x]", "[red]B1-L16-full:2:2[/red] | a\\"])
@pytest.mark.parametrize("backend_named", [True, False])
def test_the_bar_shows_a_name_with_brackets_as_written(name, backend_named):
    """A case id or backend name is no rich markup: '[bold]' stays in the bar, '[/x]' raises nothing."""
    bar = BarProgress(1, Console(file=io.StringIO(), force_terminal=True))
    bar.start(name, "case0") if backend_named else bar.start("a", name)
    assert (f"{name} on case0" if backend_named else f"a on {name}") in bar_text(bar)


CASE_ID = "B1-L16-eagle:mc_sim_7b_63-same-H4x2-D64-P16-bfloat16-shuffled-a9615797cd"


@pytest.mark.parametrize("width", [80, 100, 60])
def test_a_narrow_terminal_cuts_the_case_id_not_the_count_or_the_time_left(width):
    """On an 80-column terminal the bar's line keeps the backend, N/M and the time left whole, on one
    line, and cuts the long case id short with "…"; at 60 columns too, the case id all but gone."""
    clock = Clock()
    bar = BarProgress(378, Console(file=io.StringIO(), force_terminal=True), clock)
    bar.start("torch_sdpa", CASE_ID)
    for _ in range(40):
        clock.now += 0.5
        bar.finish(row(0))
    screen = Console(file=io.StringIO(), force_terminal=True, color_system=None, width=width, record=True)
    screen.print(bar.bar.get_renderable())
    (line,) = screen.export_text().splitlines()
    assert line.startswith("torch_sdpa on ") and line.rstrip().endswith(" 40/378 about 2 min 49 s left"), line
    assert len(line) <= width and CASE_ID not in line and (width < 80 or "B1-L16-eagle" in line), line
    assert width < 80 or "… " in line, line


def test_a_backend_that_compiles_each_shape_costs_more_per_pair():
    """flex compiles each new shape on a CPU: its pairs cost COMPILE_S more, in the dry run's line (which
    says so) and in the live time left's weights; other backends' pairs do not."""
    from treebench.harness.run.costs import COMPILE_S

    extra = COMPILE_S[("flex", "cpu")]
    plain, flex = pair_seconds([(SMOKE, "cpu")] * 2, "run", ["torch_sdpa", "flex"])
    assert flex == pytest.approx(plain + extra)
    assert pair_seconds([(SMOKE, "cuda")], "run", ["flex"]) == pair_seconds([(SMOKE, "cuda")], "run")
    line = estimate([SMOKE] * 2, "run", "cpu", backends=["torch_sdpa", "flex"])
    assert line.splitlines()[1].endswith(f" per request), flex + {extra:g} s (it compiles each shape)")
    assert per_pair_s(line) == pytest.approx((plain + flex) / 2, abs=0.01)


@pytest.mark.parametrize("quiet", [False, True])
def test_a_runs_last_progress_line_says_the_report_is_next(tmp_path, capsys, quiet):
    """Off a terminal, `treebench run`'s last progress line says that the report is being written,
    and the report is there when the run ends; --quiet prints no progress line."""
    from tests.tiny_suites import tiny_suite
    from treebench.harness.cli.main import main

    suite, report = tmp_path / "tiny.toml", tmp_path / "r.html"
    suite.write_text(tiny_suite())
    argv = ["run", "--suite", str(suite), "--backends", "reference", "--out", str(tmp_path / "r.jsonl"),
            "--report", str(report), *(["--quiet"] if quiet else [])]
    assert main(argv) == 0 and report.is_file()
    lines = [ln for ln in capsys.readouterr().err.splitlines() if re.match(r"\[\d+/\d+\] ", ln)]
    after_s = OUTSIDE_PAIRS[("run", "cpu")].after_s
    assert lines == [] if quiet else lines[-1].endswith(f", writing the report, about {after_s} s left)"), lines
