"""The regression gate: ratio and significance together, correctness losses, env refusal.

Stored runs (tests/data/make_results.py): a baseline, a same-code re-run with
fresh noise, and a run with `triton_tree` planted 10% slower.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from treebench.harness.analyze import gate, gate_render
from treebench.harness.cli import gate as gate_cmd
from treebench.harness.errors import ConfigError
from treebench.harness.model.cases import Case
from treebench.harness.analyze.gate import GateConfig, classify, compare_runs
from treebench.harness.store.rows import read_rows
from treebench.harness.store import validate

DATA = Path(__file__).parent / "data" / "results"
BASE, RERUN, SLOW = DATA / "h200-baseline", DATA / "h200-rerun", DATA / "h200-slow10"


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    gate_cmd.add_arguments(p)
    return p.parse_args(list(argv))


def _row(status="pass", median=100.0, n=50, seed=0, timer="cuda_graph", **kw) -> dict:
    s = (median * np.random.default_rng(seed).lognormal(0, 0.01, n)).tolist() if status != "skipped" else None
    return {"case_id": "c1", "backend": "k", "case": Case(batch_size=1, context_len=16, tree="chain:3").axes,
            "status": status, "reason": kw.pop("reason", None), "timer": timer,
            "median_us": float(np.median(s)) if s else None, "samples_us": s, **kw}


# ---- the stored runs --------------------------------------------------------------------------

def test_same_code_rerun_passes(capsys):
    assert gate_cmd.run(_args("--baseline", str(BASE), "--candidate", str(RERUN))) == 0
    out = capsys.readouterr().out
    assert "✅ PASS" in out and "Slower" not in out


def test_planted_ten_percent_slowdown_fails_on_every_case(capsys):
    assert gate_cmd.run(_args("--baseline", str(BASE), "--candidate", str(SLOW))) == 1
    res = compare_runs(read_rows(BASE), read_rows(SLOW))
    slower = res.of_kind("slower")
    assert len(slower) == 36 and {v.backend for v in slower} == {"triton_tree"}
    assert all(1.05 < v.ratio < 1.2 and v.p_value < 0.01 for v in slower)
    assert "❌ FAIL" in capsys.readouterr().out


def test_threshold_is_settable():
    # the planted slowdown is ~10% (8-13% with run noise): a 15% threshold lets it through
    assert gate_cmd.run(_args("--baseline", str(BASE), "--candidate", str(SLOW), "--threshold", "15%")) == 0
    assert gate_cmd.run(_args("--baseline", str(BASE), "--candidate", str(SLOW), "--threshold", "0.05")) == 1


def test_backends_filter():
    argv = ("--baseline", str(BASE), "--candidate", str(SLOW))
    assert gate_cmd.run(_args(*argv, "--backends", "flashinfer_mask,xformers_tree")) == 0
    with pytest.raises(ConfigError, match="nope in neither side's rows; backends there: .*flashinfer_mask"):
        gate_cmd.run(_args(*argv, "--backends", "nope"))


def test_junit_and_summary_files(tmp_path, capsys):
    junit, summary = tmp_path / "ci" / "gate.xml", tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    gate_cmd.run(_args("--baseline", str(BASE), "--candidate", str(SLOW), "--junit", str(junit), "--summary", str(summary)))
    suite = ET.parse(junit).getroot()
    assert suite.tag == "testsuite" and suite.get("failures") == "36" and suite.get("tests") == "144"
    failed = [tc for tc in suite.iter("testcase") if tc.find("failure") is not None]
    assert {tc.get("classname") for tc in failed} == {"treebench.triton_tree"}
    assert summary.read_text().startswith("earlier step\n## treebench gate: ❌ FAIL")
    fresh = tmp_path / "new" / "dir" / "summary.md"          # a missing folder is made, as for --junit
    gate_cmd.run(_args("--baseline", str(BASE), "--candidate", str(SLOW), "--summary", str(fresh)))
    assert fresh.read_text().startswith("## treebench gate: ❌ FAIL")
    capsys.readouterr()


# ---- verdicts ---------------------------------------------------------------------------------

@pytest.mark.parametrize("base, cand, kind", [
    (_row(), _row(status="mismatch", reason="max_abs_err 0.3"), "correctness_loss"),
    (_row(), _row(status="error", reason="RuntimeError: boom"), "correctness_loss"),
    (_row(status="mismatch"), _row(), "fixed"),
    (_row(status="error"), _row(status="mismatch"), "still_failing"),
    (_row(status="error"), _row(status="error"), "still_failing"),      # a failure the baseline knew of
    (_row(status="mismatch"), _row(status="error"), "still_failing"),
    (_row(status="skipped", reason="no GPU"), _row(status="error", reason="boom"), "newly_failing"),
    (None, _row(status="error", reason="boom"), "newly_failing"),
    (_row(status="skipped", reason="no GPU"), _row(status="mismatch"), "newly_failing"),   # wrong from its first row
    (None, _row(status="mismatch"), "newly_failing"),
    (None, _row(status="skipped", reason="no GPU"), "new"),
    (_row(), _row(status="skipped", reason="page size 32 not supported"), "skipped"),
    (_row(status="skipped", reason="no GPU"), _row(), "new"),
    (None, _row(), "new"),
    (_row(), None, "missing"),
    (_row(), _row(timer="cuda_event"), "incomparable"),
    (_row(), _row(l2_flushed=False), "incomparable"),              # no l2_flushed on a GPU row: flushed
    (_row(l2_flushed=True), _row(median=110, seed=1), "slower"),   # ... so it compares with a flushed row
    (_row(l2_flushed=False), _row(median=110, seed=1, l2_flushed=False), "slower"),
    (_row(), _row(n=3), "incomparable"),
    (_row(median=100), _row(median=110, seed=1), "slower"),
    (_row(median=100), _row(median=90, seed=1), "faster"),
    (_row(median=100), _row(median=102, seed=1), "unchanged"),
])
def test_classify(base, cand, kind):
    v = classify(base, cand, GateConfig())
    assert v.kind == kind
    assert v.failed == (kind in ("slower", "correctness_loss", "newly_failing"))


@pytest.mark.parametrize("base, cand, detail", [
    (_row(), _row(l2_flushed=False), "L2 flushed vs warm"),
    (_row(l2_flushed=False), _row(l2_flushed=True), "L2 warm vs flushed"),
    (_row(), _row(timer="cuda_event"), "timer cuda_graph vs cuda_event"),
    (_row(), _row(timer="host_inclusive", l2_flushed=False), "timer cuda_graph vs host_inclusive; L2 flushed vs warm"),
    (_row(timer="wall", l2_flushed=False), _row(timer="wall"), ""),   # the CPU never flushes, field or no field
])
def test_unlike_timers_and_l2_states_are_incomparable(base, cand, detail):
    v = classify(base, cand, GateConfig())
    assert (v.kind == "incomparable") == bool(detail) and (v.detail == detail if detail else True)


def test_stored_rows_without_l2_flushed_compare_with_flushed_rows_only(capsys):
    """The stored runs predate the field: they were flushed (the default), so a cold candidate
    compares as before and a warm one is incomparable on every timed pair."""
    base = read_rows(BASE)
    assert all("l2_flushed" not in r for r in base)
    cold = [dict(r, l2_flushed=True) if r.get("timer") else r for r in read_rows(RERUN)]
    assert not compare_runs(base, cold).failed
    warm = [dict(r, l2_flushed=False) if r.get("timer") else r for r in read_rows(RERUN)]
    res = compare_runs(base, warm)
    timed = [v for v in res.verdicts if v.base_median_us and v.cand_median_us]
    assert timed and all(v.kind == "incomparable" and v.detail == "L2 flushed vs warm" for v in timed)
    assert not res.of_kind("unchanged") and "L2 flushed vs warm" in gate_render.markdown(res)
    if res.comparable == 0:       # the hint says why: not "cover the same cases", but the timing
        assert "the runs were timed differently" in gate_render.markdown(res) and "--l2" in gate_render.markdown(res)


def test_a_candidate_timed_two_ways_is_compared_by_its_rows_timed_like_the_baseline():
    """A merged candidate holds a pair timed cold and (later) warm: the gate takes the cold row
    for a cold baseline, and the warm one for a warm baseline, not the latest whatever it is."""
    cold, warm = _row(timestamp="1", seed=1), _row(l2_flushed=False, median=80.0, timestamp="2", seed=2)
    (v,) = compare_runs([_row()], [cold, warm]).verdicts
    assert v.kind == "unchanged" and v.cand_median_us == cold["median_us"]
    (v,) = compare_runs([_row(l2_flushed=False)], [cold, warm]).verdicts
    assert v.kind == "faster" and v.cand_median_us == warm["median_us"]          # 80 vs 100 us
    (v,) = compare_runs([_row(timer="host_inclusive")], [cold, warm]).verdicts   # no like row: the latest
    assert v.kind == "incomparable" and v.cand_median_us == warm["median_us"]


def test_a_baseline_timed_two_ways_is_compared_once_per_timing_both_runs_hold(tmp_path):
    """Merged files on both sides (cold, then warm): each timing is compared with its like,
    the cold one too, though the baseline's latest row is warm; a warm-only candidate
    gives one verdict; the extra verdict is named in the Markdown and the JUnit XML, and a
    regression found only in the cold rows fails the gate."""
    base = [_row(timestamp="1", seed=1), _row(l2_flushed=False, median=80.0, timestamp="2", seed=2)]
    cand = [_row(timestamp="3", seed=3), _row(l2_flushed=False, median=80.0, timestamp="4", seed=4)]
    res = compare_runs(base, cand)
    assert sorted((v.kind, v.timing) for v in res.verdicts) == [("unchanged", "cuda_graph, L2 flushed"),
                                                                ("unchanged", "cuda_graph, warm L2")]
    assert not res.failed
    (v,) = compare_runs(base, cand[1:]).verdicts                  # warm only: the latest, alike
    assert v.kind == "unchanged" and v.timing == "" and v.cand_median_us == cand[1]["median_us"]
    # cold only: the baseline's latest (warm) row has nothing alike; its cold row does
    assert sorted((v.kind, v.timing) for v in compare_runs(base, cand[:1]).verdicts) == [
        ("incomparable", "cuda_graph, warm L2"), ("unchanged", "cuda_graph, L2 flushed")]
    slow = [_row(median=120.0, timestamp="3", seed=3), cand[1]]   # 20% slower, cold rows only
    res = compare_runs(base, slow)
    (bad,) = res.of_kind("slower")
    assert res.failed and bad.timing == "cuda_graph, L2 flushed" and bad.detail.startswith("cuda_graph, L2 flushed")
    assert "cuda_graph, L2 flushed" in gate_render.markdown(res)
    names = [tc.get("name") for tc in ET.fromstring(gate_render.junit_xml(res)).iter("testcase")]
    assert sorted(names) == ["c1 [cuda_graph, L2 flushed]", "c1 [cuda_graph, warm L2]"]
    errored = base + [_row(status="error", timer=None, timestamp="9", reason="boom")]   # latest untimed: no extras
    assert len(compare_runs(errored, cand).verdicts) == 1


def test_a_candidate_whose_latest_row_failed_is_judged_by_it_not_by_an_older_passing_row():
    """A merged or appended candidate whose latest row for a pair errored (untimed) or
    mismatched (timed another way) is a correctness loss, though an older row timed like the
    baseline passed; and no extra per-timing verdict is drawn for a pair that failed."""
    base = [_row(timestamp="1", seed=1)]
    older = _row(timestamp="2", seed=2)
    crashed = _row(status="error", timer=None, timestamp="3", reason="RuntimeError: boom")
    (v,) = compare_runs(base, [older, crashed]).verdicts
    assert v.kind == "correctness_loss" and "boom" in v.detail
    warm_mismatch = _row(status="mismatch", l2_flushed=False, timestamp="3", reason="max_abs_err 0.5")
    (v,) = compare_runs(base, [older, warm_mismatch]).verdicts
    assert v.kind == "correctness_loss"
    two_ways = [_row(timestamp="0", seed=3), _row(l2_flushed=False, timestamp="1", seed=4)]
    res = compare_runs(two_ways, [older, _row(l2_flushed=False, timestamp="3", seed=5), crashed])
    assert [v.kind for v in res.verdicts] == ["correctness_loss"] and res.failed


def test_nothing_compared_because_of_the_timing_says_so():
    base = [_row()]
    md = gate_render.markdown(compare_runs(base, [_row(l2_flushed=False)]))
    assert "Nothing was compared" in md and "timed differently (1 x L2 flushed vs warm)" in md
    assert "same cases and backends" not in md


def test_ratio_alone_is_not_a_regression():
    # 10% slower median, but 5 wildly noisy samples: the test does not agree, so no failure
    base = _row() | {"samples_us": [50.0, 150.0, 60.0, 140.0, 100.0], "median_us": 100.0}
    cand = _row() | {"samples_us": [55.0, 165.0, 66.0, 154.0, 110.0], "median_us": 110.0}
    v = classify(base, cand, GateConfig())
    assert v.kind == "unchanged" and v.p_value > 0.01 and "beyond threshold" in v.detail


def test_significance_alone_is_not_a_regression():
    # 3% slower with tight samples: significant, but under the 5% threshold (so the test is not even run)
    v = classify(_row(median=100, n=500), _row(median=103, n=500, seed=1), GateConfig())
    assert v.kind == "unchanged" and v.p_value is None and v.detail == ""


def test_a_correctness_loss_in_stored_rows_fails_the_gate():
    cand = copy.deepcopy(read_rows(RERUN))
    victim = next(r for r in cand if r["backend"] == "xformers_tree" and r["status"] == "pass")
    victim.update(status="mismatch", reason="max_abs_err 0.5 at (request 0, node 3, head 1)")
    res = compare_runs(read_rows(BASE), cand)
    assert res.failed and [v.case_id for v in res.of_kind("correctness_loss")] == [victim["case_id"]]
    assert "Correctness lost (fails the gate) (1)" in gate_render.markdown(res)


def test_latest_row_wins_when_a_case_repeats():
    old, new = _row(median=100) | {"timestamp": "2025-01-01"}, _row(median=200) | {"timestamp": "2025-02-01"}
    assert validate.latest_rows([new, old])[("c1", "k")] is new


@pytest.mark.parametrize("old_ts, new_ts", [
    ("2026-01-31T12:00:00Z", "2026-01-31T12:00:00.500+00:00"),       # 'Z' sorts after '.' as text
    ("2026-01-31T12:00:00.900+00:00", "2026-01-31T12:00:01Z"),
    ("2026-01-31T12:00:00.250Z", "2026-01-31T12:00:00.5+00:00")])
def test_latest_row_is_the_latest_instant_whatever_the_spelling(old_ts, new_ts):
    old, new = _row(median=100) | {"timestamp": old_ts}, _row(median=200) | {"timestamp": new_ts}
    assert validate.latest_rows([new, old])[("c1", "k")] is new
    assert validate.latest_rows([old, new])[("c1", "k")] is new
    same = _row(median=300) | {"timestamp": "2026-01-31T12:00:00.000+00:00"}   # one instant: file order
    assert validate.latest_rows([_row() | {"timestamp": "2026-01-31T12:00:00Z"}, same])[("c1", "k")] is same


@pytest.mark.parametrize("kwargs, flag", [({"threshold": 0}, "--threshold"), ({"alpha": 1.5}, "--alpha"),
                                          ({"min_samples": 1}, "--min-samples")])
def test_bad_config_is_a_config_error(kwargs, flag):
    with pytest.raises(ConfigError, match=flag):
        GateConfig(**kwargs)


def test_junit_message_and_headline_carry_only_what_was_measured():
    """A correctness loss has no ratio or p: its JUnit message gives the kind and the error,
    no empty fields; a gate that compared nothing says so in its headline."""
    res = compare_runs([_row()], [_row(status="error", timer=None, reason="RuntimeError: boom")])
    (fail,) = ET.fromstring(gate_render.junit_xml(res)).iter("failure")
    assert fail.get("message") == "correctness_loss: error: RuntimeError: boom"
    (ok,) = ET.fromstring(gate_render.junit_xml(compare_runs([_row()], [_row(seed=1)]))).iter("system-out")
    assert ok.text.startswith("unchanged: ratio ") and " p " not in ok.text   # within the threshold: not tested
    md = gate_render.markdown(compare_runs([_row()], [_row(l2_flushed=False)]))
    assert md.splitlines()[0].endswith("0 missing, nothing compared)")
    # a new pair (no baseline row) passes as a plain testcase; a new skip stays skipped
    new = ET.fromstring(gate_render.junit_xml(compare_runs([_row()], [_row(), _row(case_id="c2"),
                                                                       _row(case_id="c3", status="skipped")])))
    cases = {tc.get("name"): [child.tag for child in tc] for tc in new.iter("testcase")}
    assert cases == {"c1": ["system-out"], "c2": ["system-out"], "c3": ["skipped"]}, cases
    assert new.get("skipped") == "1" and new.get("failures") == "0"
    with pytest.raises(ConfigError, match="between 0 and 10"):
        GateConfig(threshold=10)


def test_bad_threshold_text():
    with pytest.raises(ConfigError, match="--threshold"):
        gate_cmd.run(_args("--baseline", str(BASE), "--candidate", str(RERUN), "--threshold", "five"))


# ---- env fingerprints -------------------------------------------------------------------------

def _copy_run(src: Path, dst: Path, **env_changes) -> Path:
    shutil.copytree(src, dst)
    for f in dst.glob("env-*.json"):
        env = json.loads(f.read_text())
        env.update(env_changes)
        f.write_text(json.dumps(env))
    return dst


def test_different_env_is_refused_unless_allowed(tmp_path, capsys):
    other = _copy_run(RERUN, tmp_path / "other", driver="575.51.03", torch="2.10.0")
    with pytest.raises(ConfigError, match=r"driver: 570.124.06 -> 575.51.03.*--allow-env-mismatch"):
        gate_cmd.run(_args("--baseline", str(BASE), "--candidate", str(other)))
    assert gate_cmd.run(_args("--baseline", str(BASE), "--candidate", str(other), "--allow-env-mismatch")) == 0
    assert "Env differences (allowed)" in capsys.readouterr().out


@pytest.mark.parametrize("side", ["--baseline", "--candidate"])
@pytest.mark.parametrize("named", ["folder", "file"])
def test_a_missing_env_file_is_named_with_its_env_id_and_results_file(tmp_path, capsys, side, named):
    """Rows whose env-<id>.json is not beside them: one line saying which env file is missing next
    to which results file (exit 2), not that the fingerprints differ; --allow-env-mismatch compares."""
    cli = pytest.importorskip("treebench.harness.cli.main")
    noenv = tmp_path / "noenv"
    noenv.mkdir()
    given = {"--baseline": BASE, "--candidate": RERUN}
    rows = shutil.copy(given[side] / "seed.jsonl", noenv / "seed.jsonl")
    (env_id,) = {r["env"] for r in read_rows([rows])}
    given[side] = noenv if named == "folder" else rows
    argv = ["gate", *(str(a) for flag in given.items() for a in flag)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [(f"treebench: error: gate {side}: the env file for env id {env_id} is missing next to {rows} "
                    f"(env-{env_id}.json, which the run wrote beside its rows); copy it there, or pass "
                    "--allow-env-mismatch to compare without it")], err
    assert cli.main([*argv, "--allow-env-mismatch"]) == 0
    assert "not found beside its results" in capsys.readouterr().out


def test_missing_results_path(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        gate_cmd.run(_args("--baseline", str(tmp_path / "none"), "--candidate", str(RERUN)))


# ---- through the CLI --------------------------------------------------------------------------

@pytest.mark.parametrize("candidate, code", [(RERUN, 0), (SLOW, 1)])
def test_cli_gate_exit_codes(candidate, code, capsys):
    cli = pytest.importorskip("treebench.harness.cli.main")
    assert cli.main(["gate", "--baseline", str(BASE), "--candidate", str(candidate)]) == code
    capsys.readouterr()


def test_cli_gate_bad_input_exits_2(tmp_path, capsys):
    cli = pytest.importorskip("treebench.harness.cli.main")
    assert cli.main(["gate", "--baseline", str(tmp_path / "none"), "--candidate", str(RERUN)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not found" in err


@pytest.mark.parametrize("base_median, cand_median, where", [
    (None, None, "on either side (check rows; both pass)"),
    (None, 100.0, "in the baseline"),
    (100.0, None, "in the candidate"),
])
def test_untimed_pairs_say_which_side_lacks_a_time(base_median, cand_median, where):
    """Check-only rows (passing, no timing) are incomparable, and the detail says on
    which side the time is missing instead of always 'one side'."""
    base = {**_row(), "median_us": base_median, "samples_us": None if base_median is None else _row()["samples_us"]}
    cand = {**_row(), "median_us": cand_median, "samples_us": None if cand_median is None else _row()["samples_us"]}
    v = classify(base, cand, GateConfig())
    assert v.kind == "incomparable" and not v.failed
    assert v.detail == f"not timed {where}"


def _of(row: dict, **kw) -> dict:
    """`row` for another (case_id, backend)."""
    return {**row, **kw}


@pytest.mark.parametrize("allow_missing", [False, True])
def test_a_pair_the_baseline_skipped_and_the_candidate_lacks_does_not_fail_the_gate(allow_missing):
    """A baseline pair skipped by capability has nothing to regress from: the candidate lacking it is
    listed as missing and says why, but fails neither the gate nor its JUnit case; a pair the baseline
    ran and the candidate lacks still fails (without --allow-missing), and so does a candidate's error
    where the baseline passed."""
    skipped = _row(status="skipped", reason="needs a CUDA GPU", backend="gpu_only")
    config = GateConfig(allow_missing=allow_missing)
    res = compare_runs([_row(), skipped], [_row(seed=1)], config)
    (v,) = res.of_kind("missing")
    assert not v.failed and not res.failed and v.detail.startswith("baseline was skipped: needs a CUDA GPU; nothing")
    md = gate_render.markdown(res)
    listed = "1 missing (0 failing; 1 listed only: skipped in the baseline)"
    assert md.splitlines()[0] == f"## treebench gate: ✅ PASS (0 slower, 0 correctness lost, 0 newly failing, {listed})"
    assert "pair(s) missing from the candidate**" not in md
    assert [tc.find("failure") for tc in ET.fromstring(gate_render.junit_xml(res)).iter("testcase")] == [None, None]
    ran = compare_runs([_row(), skipped, _of(_row(), case_id="c2")], [_row(seed=1)], config)
    assert ran.failed is not allow_missing and [v.failed for v in ran.of_kind("missing")] == [False, not allow_missing]
    lost = compare_runs([_row(), skipped], [_row(status="error", reason="boom")], config)
    assert lost.failed and lost.of_kind("correctness_loss")


@pytest.mark.parametrize("allow_missing", [False, True])
def test_the_missing_count_agrees_in_headline_table_log_line_and_junit(allow_missing):
    """One pair the baseline skipped and one it ran, both lacking in the candidate: the headline, the
    counts table and the log line all say 2 missing, how many fail and why the others are only listed;
    the JUnit XML fails just as many."""
    skipped = _row(status="skipped", reason="needs a CUDA GPU", backend="gpu_only")
    base = [_row(), skipped, _of(_row(), case_id="c2")]
    res = compare_runs(base, [_row(seed=1)], GateConfig(allow_missing=allow_missing))
    said = ("2 missing (0 failing; 2 listed only: 1 skipped in the baseline, 1 allowed by --allow-missing)"
            if allow_missing else "2 missing (1 failing; 1 listed only: skipped in the baseline)")
    md = gate_render.markdown(res)
    head = "✅ PASS" if allow_missing else "❌ FAIL"
    assert md.splitlines()[0] == f"## treebench gate: {head} (0 slower, 0 correctness lost, 0 newly failing, {said})"
    assert f" | 2 {said.removeprefix('2 missing ')} |" in md
    assert res.counts_text() == f"{said}, 1 unchanged"
    suite = ET.fromstring(gate_render.junit_xml(res))
    assert suite.get("failures") == ("0" if allow_missing else "1")



@pytest.mark.parametrize("status", ["error", "mismatch"])
@pytest.mark.parametrize("base_row, why", [(_row(status="skipped", reason="no GPU"), "skipped in the baseline"),
                                           (_of(_row(), case_id="c2"), "not in the baseline")])
def test_a_new_failure_fails_the_gate_and_says_why_everywhere(tmp_path, capsys, caplog, base_row, why, status):
    """A candidate mismatch or error on a pair the baseline skipped or lacks fails (exit 1), even with
    --allow-missing (which concerns baseline pairs the candidate lacks), named with its status and
    reason in the headline, counts and verdict tables, log line, --summary and JUnit; a failure the
    baseline had too is still failing and passes."""
    def write(name, rows):
        (tmp_path / name).write_text("".join(json.dumps({"schema": 1, **r}) + "\n" for r in rows))
        return str(tmp_path / name)
    c3 = _of(_row(), case_id="c3")
    base, cand = write("b.jsonl", [base_row, c3]), write("c.jsonl", [_row(status=status, reason="boom"), c3])
    junit, summary = tmp_path / "g.xml", tmp_path / "s.md"
    with caplog.at_level("INFO", logger="treebench.harness.cli.gate"):
        rc = gate_cmd.run(_args("--baseline", base, "--candidate", cand, "--allow-missing", "--junit", str(junit),
                                "--summary", str(summary)))
    out = capsys.readouterr().out
    detail = f"{status} ({why}): boom" + (" (baseline skipped: no GPU)" if "skip" in why else "")
    lines = out.splitlines()
    assert rc == 1 and out == summary.read_text() and f"1 newly failing ({why})" in caplog.text
    assert lines[0].startswith(f"## treebench gate: ❌ FAIL (0 slower, 0 correctness lost, 1 newly failing ({why})")
    assert f"| {gate.KIND_TITLES['newly_failing']} | 1 ({why}) |" in lines
    assert f"| k | 1 | 16 | 16 | chain:3 | `c1` | {detail} |" in lines
    suite = ET.parse(junit).getroot()
    (fail,) = suite.iter("failure")
    assert (fail.get("type"), fail.get("message")) == ("newly_failing", f"newly_failing: {detail}")
    assert suite.get("failures") == "1"
    known = write("k.jsonl", [_row(status=status), c3])
    assert gate_cmd.run(_args("--baseline", known, "--candidate", cand)) == 0
    assert "| Still failing | 1 |" in capsys.readouterr().out


def test_newly_failing_counts_say_each_reason():
    base = [_row(status="skipped"), _of(_row(), case_id="c9")]
    cand = [_row(status="mismatch"), _of(_row(status="error"), case_id="c2"), _of(_row(), case_id="c9")]
    res = compare_runs(base, cand)
    said = "2 newly failing (1 skipped in the baseline, 1 not in the baseline)"
    assert res.failed and res.counts_text() == f"{said}, 1 unchanged"
    assert f"0 correctness lost, {said}, 0 missing)" in gate_render.markdown(res).splitlines()[0]
    assert [v.detail.split(" (")[0] for v in res.of_kind("newly_failing")] == ["mismatch", "error"]


def test_a_new_mismatch_fails_the_gate_section_of_the_report(tmp_path, capsys):
    """`report --against`: a candidate mismatch on a pair the baseline lacks is a failing verdict on
    the page, its count saying why."""
    from treebench.harness.cli import main as cli

    def write(name, rows):
        (tmp_path / name).write_text("".join(json.dumps({"schema": 1, **r}) + "\n" for r in rows))
        return str(tmp_path / name)
    c3 = _of(_row(), case_id="c3")
    base = write("b.jsonl", [c3])
    cand = write("c.jsonl", [_row(status="mismatch", reason="max_abs_err 0.3"), c3])
    page = tmp_path / "r.html"
    assert cli.main(["report", cand, "-o", str(page), "--against", base]) == 0
    html = page.read_text(encoding="utf-8")
    gate_part = html[html.index("Gate against the baseline results"):]
    assert gate_part.index("FAIL") < gate_part.index("</h3>")
    assert "newly failing: 1 (not in the baseline)" in gate_part
    assert "mismatch (not in the baseline): max_abs_err 0.3" in gate_part
    capsys.readouterr()


@pytest.mark.parametrize("allowed", [True, False])
def test_a_missing_pair_allowed_by_allow_missing_says_so_in_junit(allowed):
    res = compare_runs([_row(), _of(_row(), case_id="c2")], [_row(seed=1)], GateConfig(allow_missing=allowed))
    suite = ET.fromstring(gate_render.junit_xml(res))
    (tc,) = [tc for tc in suite.iter("testcase") if tc.get("name") == "c2"]
    (element,) = list(tc)
    assert element.tag == ("skipped" if allowed else "failure") and suite.get("failures") == str(int(not allowed))
    assert element.get("message") == "missing: baseline was pass" + (
        "; allowed by --allow-missing, so it does not fail the gate" if allowed else "")
