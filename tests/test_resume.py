"""A sweep killed with SIGKILL loses at most the row in flight, and
`treebench run --resume` finishes it without running a stored pair twice."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from treebench.harness.cli.main import main
from treebench.harness.run.runner import row_satisfies
from treebench.harness.store.rows import ROW_FIELDS, read_rows

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ROOT / "tests" / "fault_backends.py"
SLOW = f"{FAULTS}:Slow"
SUITE = """
[axes]
batch_size = [1, 2]
context_len = [5, 33]
tree = ["full:2:1", "chain:2", "random:4:7"]
num_q_heads = [2]
num_kv_heads = [1]
head_dim = [16]
"""
N_CASES = 12


@pytest.fixture
def suite(tmp_path) -> Path:
    p = tmp_path / "s.toml"
    p.write_text(SUITE)
    return p


def _run(suite, out, *extra, backends=SLOW) -> list[str]:
    return ["run", "--suite", str(suite), "--backends", backends, "--out", str(out),
            "--report", str(out.with_suffix(".html")), "--quiet", *extra]


def _whole_lines(path: Path) -> int:
    """How many newline-terminated lines `path` holds (a torn last line does not count)."""
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _kill_after_rows(cmd: list[str], out: Path, n_rows: int, timeout_s: float = 120) -> None:
    """Starts `cmd`, SIGKILLs it once `out` holds at least `n_rows` newline-terminated lines."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TREEBENCH_TEST_SLOW_S": "0.4"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout_s
    try:
        while _whole_lines(out) < n_rows:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the sweep wrote too few rows in time"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


def _split_tail(out: Path) -> tuple[bytes, bytes]:
    """(the whole lines of `out`, each with its newline; what follows its last newline: b"" or a torn row)."""
    data = out.read_bytes()
    cut = data.rfind(b"\n") + 1
    return data[:cut], data[cut:]


def _is_whole(line: bytes) -> bool:
    """True for a line that parses as JSON: a row whole but for its newline."""
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def _assert_whole_rows(out: Path, n: int, caplog) -> list[dict]:
    """`out` holds exactly `n` rows, every line a whole row, and reads without a torn-line warning."""
    data = out.read_bytes()
    assert data.endswith(b"\n")
    assert [set(json.loads(line)) for line in data.splitlines()] == [set(ROW_FIELDS)] * n
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="treebench"):
        rows = read_rows([out])
    assert not [m for m in caplog.messages if "torn" in m], caplog.messages
    assert len(rows) == n
    return rows


def test_sigkill_mid_sweep_then_resume(suite, tmp_path, monkeypatch, caplog):
    """The SIGKILL may land mid-row: a row longer than a page is then cut at a page boundary (a
    short write), the file's only torn line, its last. The --resume sets those bytes aside in
    OUT.torn and leaves OUT holding every row whole."""
    out = tmp_path / "r.jsonl"
    _kill_after_rows([sys.executable, "-m", "treebench", *_run(suite, out)], out, 3)
    whole, tail = _split_tail(out)
    left = whole.splitlines()
    assert 3 <= len(left) < N_CASES
    for line in left:                                       # every line but a torn last one: a whole row
        assert set(json.loads(line)) == set(ROW_FIELDS)

    monkeypatch.setenv("TREEBENCH_TEST_SLOW_S", "0")
    with caplog.at_level(logging.WARNING, logger="treebench"):
        assert main(_run(suite, out, "--resume")) == 0
    torn = tmp_path / "r.jsonl.torn"
    if tail and not _is_whole(tail):                        # a torn row: set aside, OUT cut back to its last newline
        assert torn.read_bytes() == tail + b"\n" and out.read_bytes().startswith(whole)
    else:                                                   # nothing torn (or cut just before its newline)
        assert not torn.exists() and out.read_bytes().startswith(whole + tail + (b"\n" if tail else b""))
    rows = _assert_whole_rows(out, N_CASES, caplog)
    keys = [(r["case_id"], r["backend"]) for r in rows]
    assert len(set(keys)) == N_CASES
    assert all(r["status"] == "pass" for r in rows)
    assert len({r["run_id"] for r in rows}) == 2 and len({r["env"] for r in rows}) == 1


@pytest.mark.parametrize("cut", ["20 bytes", "half", "all but the brace"])
def test_resume_sets_a_torn_last_row_aside_and_keeps_every_row_whole(suite, tmp_path, caplog, cut):
    """A file left ending in part of a row (as a SIGKILL mid-write leaves it: no newline): the
    --resume moves those bytes to OUT.torn (kept, not lost), cuts OUT back to its last newline,
    says so in one warning line naming both files and the byte count, and appends the missing rows
    after the whole ones, so that no reader warns of a torn line afterwards."""
    out = tmp_path / "r.jsonl"
    assert main(_check(suite, out)) == 0
    lines = out.read_bytes().splitlines(keepends=True)
    row = lines[5]
    partial = row[:{"20 bytes": 20, "half": len(row) // 2, "all but the brace": len(row) - 2}[cut]]   # no newline
    out.write_bytes(b"".join(lines[:5]) + partial)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="treebench"):
        assert main(_check(suite, out, "--resume")) == 0
    torn = tmp_path / "r.jsonl.torn"
    said = [m for m in caplog.messages if "moved to" in m]
    assert said == [(f"{out} ended in a torn line ({len(partial)} bytes, a row cut short by a killed writer): "
                     f"moved to {torn} before appending")]
    assert torn.read_bytes() == partial + b"\n"
    assert out.read_bytes().startswith(b"".join(lines[:5]))
    rows = read_rows([out])
    assert len(rows) == N_CASES and len({(r["case_id"], r["backend"]) for r in rows}) == N_CASES
    assert [json.loads(line) for line in out.read_bytes().splitlines()] == rows   # every line whole


def test_resume_keeps_a_whole_last_row_missing_only_its_newline(suite, tmp_path, caplog):
    """A file edited by hand may lose its final newline: that last row is whole, so the --resume
    writes the newline and appends after it; nothing is set aside, nothing warned of."""
    out = tmp_path / "r.jsonl"
    assert main(_check(suite, out)) == 0
    lines = out.read_bytes().splitlines(keepends=True)
    kept = b"".join(lines[:5])[:-1]
    out.write_bytes(kept)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="treebench"):
        assert main(_check(suite, out, "--resume")) == 0
    assert not [m for m in caplog.messages if "torn" in m], caplog.messages
    assert not (tmp_path / "r.jsonl.torn").exists()
    assert out.read_bytes().startswith(kept + b"\n")
    rows = read_rows([out])
    assert [json.loads(line) for line in lines[:5]] == rows[:5]
    assert len(rows) == N_CASES and len({(r["case_id"], r["backend"]) for r in rows}) == N_CASES


def _check(suite, out, *extra) -> list[str]:
    return ["check", "--suite", str(suite), "--backend", f"{FAULTS}:Exact", "--out", str(out), "--quiet", *extra]


@pytest.mark.parametrize("command", ["run", "check"])
@pytest.mark.parametrize("timer, said", [(5, "is a number, expected a string or null"),
                                         (["wall"], "is an array, expected a string or null"),
                                         (None, "is null, expected the timer of a timed row")])
def test_resume_refuses_a_stored_row_whose_timer_is_not_a_string(suite, tmp_path, capsys, command, timer, said):
    """A stored timed row whose `timer` is not a string is refused before anything runs, as gate and
    report refuse it: one line naming the file, the line and the field; the file left as it was."""
    out = tmp_path / "r.jsonl"
    assert main(_check(suite, out)) == 0
    rows = read_rows([out])
    rows[1].update(timer=timer, median_us=10.0, samples_us=[10.0])
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = out.read_bytes()
    capsys.readouterr()
    argv = _check(suite, out, "--resume") if command == "check" else _run(suite, out, "--resume",
                                                                          backends=f"{FAULTS}:Exact")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"field 'timer' {said}" in err and f"{out}:2" in err, err
    assert out.read_bytes() == before


def test_resume_of_a_finished_sweep_runs_nothing_and_reports_all(suite, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    assert main(_check(suite, out)) == 0
    before = out.read_bytes()
    assert main(_check(suite, out, "--resume", "--dry-run")) == 0
    text = " ".join(capsys.readouterr().out.split())          # rich may wrap the line
    assert "0 pairs to run here, 12 already stored (skipped by --resume)" in text
    assert "estimated time" not in text and "scaled" not in text, text   # nothing to run: nothing to estimate
    assert main(_check(suite, out, "--resume")) == 0
    assert out.read_bytes() == before
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("│ exact ")]
    assert [c.strip() for c in line.split("│")][1:6] == ["exact", "12", "0", "0", "0"]   # stored rows summarised


def test_resume_reruns_rows_of_another_env_and_new_backends(suite, tmp_path):
    out = tmp_path / "r.jsonl"
    assert main(_run(suite, out, backends=f"{FAULTS}:Exact")) == 0
    rows = read_rows([out])
    foreign = {**rows[0], "env": "another-machine", "backend": "twin", "run_id": "old"}
    with open(out, "a") as f:
        f.write(json.dumps(foreign) + "\n")
    assert main(_run(suite, out, "--resume", backends=f"{FAULTS}:Exact,{FAULTS}:Twin")) == 0
    rows = read_rows([out])
    assert len(rows) == 12 + 1 + 12                      # the other env's twin row does not count as stored
    assert sum(r["backend"] == "exact" for r in rows) == 12
    assert sum(r["backend"] == "twin" and r["env"] != "another-machine" for r in rows) == 12


def test_resume_warns_once_of_stored_rows_another_env_measured_naming_what_differs(suite, tmp_path, capsys):
    """The stored rows of an env whose triton version differs are not skipped: one warning line says how
    many and what differs ('triton: none -> 3.x'), not a silent rerun of every pair; a pair stored for
    this env too, or a later resume that finds every pair stored here, draws none."""
    out = tmp_path / "r.jsonl"
    assert main(_check(suite, out)) == 0
    (env_file,) = tmp_path.glob("env-*.json")
    env = json.loads(env_file.read_text())
    was = None if env["triton"] else "3.9.0"
    old = {**env, "env_id": "0123456789ab", "triton": was, "torch_threads": env["torch_threads"] + 3}
    (tmp_path / "env-0123456789ab.json").write_text(json.dumps(old))
    rows = [{**r, "env": "0123456789ab"} for r in read_rows([out])]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows[:-1]) + json.dumps(read_rows([out])[-1]) + "\n")
    capsys.readouterr()
    assert main(_check(suite, out, "--resume")) == 0
    warned = [ln for ln in capsys.readouterr().err.splitlines() if "another env" in ln]
    assert len(warned) == 1, warned
    assert (f"--resume: 11 stored rows of this sweep's pairs in {out} were measured in another env "
            f"(triton: {was or 'none'} -> {env['triton'] or 'none'}; torch_threads: {env['torch_threads'] + 3} -> {env['torch_threads']}), "
            "so they are not skipped: their pairs are run again") in warned[0]
    assert len(read_rows([out])) == 12 + 11
    assert main(_check(suite, out, "--resume")) == 0
    assert "another env" not in capsys.readouterr().err


def test_resume_merges_rank_files_a_killed_launch_left(suite, tmp_path):
    out = tmp_path / "r.jsonl"
    part = tmp_path / "r.rank1-of-2.jsonl"
    assert main(_check(suite, part, "--shard", "1/2")) == 0
    assert main(_check(suite, out, "--resume")) == 0
    rows = read_rows([out])
    assert len(rows) == 12 and len({(r["case_id"], r["backend"]) for r in rows}) == 12
    assert not part.exists()


def test_resume_needs_out(suite, capsys):
    assert main(["run", "--suite", str(suite), "--resume", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--resume needs --out" in err[0]


@pytest.mark.parametrize("out_given", [False, True])
def test_resume_names_its_report_after_the_results_file_it_finishes(tmp_path, monkeypatch, capsys, out_given):
    """`run --resume` without --report named its report after a new run id, beside the run_id of the
    rows it finished; now after the results file (`treebench report`'s default name too), which for
    a default --out is the first run's report, named by the run id it resumes."""
    from tests.tiny_suites import tiny_suite

    monkeypatch.chdir(tmp_path)
    Path("tiny.toml").write_text(tiny_suite())
    argv = ["run", "--suite", "tiny.toml", "--backends", "torch_sdpa", "--quiet"]
    assert main([*argv, *(["--out", "mine.jsonl"] if out_given else [])]) == 0
    (out,) = [Path("mine.jsonl")] if out_given else Path("results/local").glob("*.jsonl")
    run_id = read_rows([out])[0]["run_id"]
    page = Path("reports/local") / (f"{out.stem}.html" if out_given else f"tiny-{run_id}.html")
    capsys.readouterr()
    assert main([*argv, "--out", str(out), "--resume"]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[-3:] == [f"run_id: {run_id}", f"rows: {out}",
                         f"report: {page} (every row of {out}, among them 1 row written before this run)"], said
    assert page.exists()


def test_dry_run_counts_the_pairs_that_will_be_skipped(suite, tmp_path, capsys):
    """--dry-run says how many planned pairs will only be skipped rows (an
    unavailable backend, an unsupported case), apart from those that will run: 24 to run, not 36."""
    out = tmp_path / "r.jsonl"
    args = ["run", "--suite", str(suite), "--backends", f"reference,{FAULTS}:Exact,xformers_tree",
            "--out", str(out), "--quiet", "--dry-run"]
    assert main(args) == 0
    text = " ".join(capsys.readouterr().out.split())
    # xformers is not installed on the CPU (and needs CUDA): its 12 pairs are skips
    assert ("3 backends: 24 pairs to run here, 12 to be recorded as skipped (backend unavailable or case "
            "unsupported) estimated time: ") in text and "(24 pairs, " in text
    assert not out.exists()


def test_the_dry_run_says_which_stored_pairs_run_again_and_times_only_those_that_run(suite, tmp_path, capsys,
                                                                                     monkeypatch):
    """Without --resume the stored pairs are counted apart: those that run again, those only recorded
    as skipped again; the estimate counts the pairs that run. With --resume all are skipped: nothing to run, so no
    estimate, and no pace of earlier runs."""
    monkeypatch.chdir(tmp_path)
    out = Path("r.jsonl")
    assert main(_run(suite, out, backends="reference,xformers_tree")) == 0   # xformers: 12 skipped rows
    capsys.readouterr()
    assert main(_run(suite, out, "--dry-run", backends="reference,xformers_tree")) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert str(tmp_path) not in text
    assert (f"2 backends: 12 pairs to run here, 12 to be recorded as skipped (backend unavailable or case "
            f"unsupported); already stored in {out} for this env: 12 of the 12 pairs to run (they run again) and "
            "12 of those to be recorded as skipped (recorded again); add --resume to skip them estimated time: "
            "about ") in text and "in all (12 pairs, " in text, text
    assert main(_run(suite, out, "--dry-run", "--resume", backends="reference,xformers_tree")) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "2 backends: 0 pairs to run here, 24 already stored (skipped by --resume)" in text
    assert "estimated time" not in text and "scaled" not in text and "(0 pairs" not in text, text


def test_the_dry_run_line_counts_the_pairs_predicted_not_to_fit_apart_from_those_to_run(capsys):
    from types import SimpleNamespace

    from treebench.harness.cli.common import print_plan
    from treebench.harness.sweep.execute import SweepResult

    suite = SimpleNamespace(title="suite s", cases=[1] * 5)
    print_plan(suite, ["a", "b"], SweepResult(planned=10, will_skip=4, will_skip_memory=1, resumed=None))
    assert " ".join(capsys.readouterr().out.split()) == (
        "dry run: suite s, 5 cases x 2 backends: 6 pairs to run here, 4 to be recorded as skipped (backend "
        "unavailable or case unsupported, or for 1 of them predicted not to fit the free memory (--no-memory-check "
        "runs them))")


# ---- --resume and the timer / L2 state ------------------------------------------------------------

def _timed(timer: str, **kw) -> dict:
    return {"status": "pass", "median_us": 3.0, "timer": timer, **kw}


GRAPH_COLD = _timed("cuda_graph", l2_flushed=True)
GRAPH_WARM = _timed("cuda_graph", l2_flushed=False)
GRAPH_OLD = _timed("cuda_graph")                                   # written before l2_flushed existed
EVENTS_FALLBACK = _timed("cuda_event", timer_fallback="CUDA graph capture failed: x", l2_flushed=True)
EVENTS = _timed("cuda_event", timer_fallback=None, l2_flushed=True)
HOST = _timed("host_inclusive", l2_flushed=False)
LOOP = _timed("cuda_graph_loop", l2_flushed=False)
WALL = _timed("wall", timer_fallback="timer 'cuda_event' needs a CUDA device", l2_flushed=False)


@pytest.mark.parametrize("row, timing_mode, flush_l2, done", [
    (GRAPH_COLD, "auto", True, True),
    (GRAPH_COLD, "cuda_graph", True, True),          # auto and cuda_graph are the same timer on a GPU
    (GRAPH_COLD, "auto", False, False),              # another L2 state: timed again
    (GRAPH_COLD, "cuda_event", True, False),
    (GRAPH_COLD, "host_inclusive", True, False),
    (GRAPH_WARM, "auto", False, True),
    (GRAPH_WARM, "auto", True, False),
    (GRAPH_OLD, "auto", True, True),                 # no field on a GPU row: flushed, the old default
    (GRAPH_OLD, "auto", False, False),
    (EVENTS_FALLBACK, "auto", True, True),           # the graph timer's fallback
    (EVENTS_FALLBACK, "cuda_graph_loop", False, False),   # another L2 state
    ({**EVENTS_FALLBACK, "l2_flushed": False}, "cuda_graph_loop", False, True),   # the loop timer's fallback
    (LOOP, "cuda_graph_loop", False, True),
    (LOOP, "auto", False, False),                    # back-to-back calls are another timer
    ({**GRAPH_WARM}, "cuda_graph_loop", False, False),
    (EVENTS_FALLBACK, "cuda_event", True, False),
    (EVENTS, "cuda_event", True, True),
    (EVENTS, "auto", True, False),
    (HOST, "host_inclusive", False, True),
    (HOST, "host_inclusive", True, False),
    (WALL, "auto", True, True),                      # the CPU has one timer and never flushes
    (WALL, "host_inclusive", False, True),
    ({"status": "pass", "median_us": None, "timer": None}, "auto", True, False),   # a check row: timed now
    ({"status": "error", "timer": None}, "cuda_event", False, True),              # failed rows stay done
    ({"status": "skipped"}, "host_inclusive", False, True),
])
def test_resume_skips_only_rows_timed_as_this_run_would(row, timing_mode, flush_l2, done):
    assert row_satisfies(row, "run", timing_mode, flush_l2) is done
    assert row_satisfies(row, "check", timing_mode, flush_l2)                    # check times nothing


def _as_gpu_rows(path: Path, run_id: str, **fields) -> None:
    """Rewrites `path`'s rows as if timed on a GPU with `fields` (the CPU can only time with `wall`)."""
    rows = [{**r, "run_id": run_id, "timer": "cuda_graph", "timer_fallback": None, **fields} for r in read_rows([path])]
    for r in rows:
        if "l2_flushed" in r and "l2_flushed" not in fields:
            del r["l2_flushed"]                                                   # an older row
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("fields, extra, to_run", [
    ({"l2_flushed": True}, [], 0),
    ({"l2_flushed": True}, ["--timer", "cuda_graph", "--l2", "cold"], 0),
    ({"l2_flushed": True}, ["--l2", "warm"], 12),
    ({"l2_flushed": True}, ["--timer", "host_inclusive"], 12),
    ({"l2_flushed": False}, ["--l2", "warm"], 0),
    ({"l2_flushed": False}, [], 12),
    ({}, [], 0),                                   # older rows, no l2_flushed: flushed
    ({}, ["--l2", "warm"], 12),
])
def test_resume_with_another_timer_or_l2_state_times_the_pairs_again(suite, tmp_path, capsys, fields, extra, to_run):
    out = tmp_path / "r.jsonl"
    assert main(_run(suite, out, backends=f"{FAULTS}:Exact")) == 0
    _as_gpu_rows(out, "gpu-run", **fields)
    capsys.readouterr()
    assert main(_run(suite, out, "--resume", "--dry-run", *extra, backends=f"{FAULTS}:Exact")) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"{to_run} pairs to run here" in text and f"{12 - to_run} already stored" in text


def _summary_timer(out: str) -> str:
    (line,) = [ln for ln in out.splitlines() if ln.startswith("timer: ")]
    return line.removeprefix("timer: ")


def test_a_resumed_run_reports_the_stored_rows_of_its_own_l2_state(suite, tmp_path, capsys):
    """A file holding a cold and a warm pass over the same pairs: a --resume that runs nothing
    summarises the rows of the L2 state it asked for, not the first ones stored."""
    cold, warm = tmp_path / "cold.jsonl", tmp_path / "warm.jsonl"
    for path in (cold, warm):
        assert main(_run(suite, path, backends=f"{FAULTS}:Exact")) == 0
    _as_gpu_rows(cold, "cold-run", l2_flushed=True)
    _as_gpu_rows(warm, "warm-run", l2_flushed=False)
    out = tmp_path / "both.jsonl"
    out.write_text(cold.read_text() + warm.read_text())
    capsys.readouterr()
    for extra, label in ((["--l2", "warm"], "cuda_graph, warm L2"), ([], "cuda_graph, L2 flushed")):
        before = out.read_bytes()
        assert main(_run(suite, out, "--resume", *extra, backends=f"{FAULTS}:Exact")) == 0
        assert out.read_bytes() == before                                     # nothing ran
        assert _summary_timer(capsys.readouterr().out) == label


def test_a_resumed_run_summarises_each_pairs_latest_stored_row(suite, tmp_path, monkeypatch, capsys):
    """Run A stopped after 3 rows, then a full run B on the same --out: a --resume that runs
    nothing summarises each pair's latest row (B's), as report and gate take them, and names only
    B's run id; its report holds every row of the file, as `treebench report OUT` does."""
    import treebench.harness.analyze.report as report
    from treebench.harness.sweep import shard

    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    a, b, out = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "r.jsonl"
    for path, run_id in ((a, "run-a"), (b, "run-b")):
        monkeypatch.setenv(shard.RUN_ID_ENV, run_id)
        assert main(_run(suite, path, backends=f"{FAULTS}:Exact")) == 0
    out.write_text("".join(a.read_text().splitlines(keepends=True)[:3]) + b.read_text())
    monkeypatch.setenv(shard.RUN_ID_ENV, "run-c")
    capsys.readouterr()
    reported = []
    monkeypatch.setattr(report, "write_report", lambda rows, *a, **k: reported.extend(rows))
    assert main(_run(suite, out, "--resume", backends=f"{FAULTS}:Exact")) == 0
    said = capsys.readouterr().out
    assert "run_id: run-b" in said.splitlines(), said
    assert reported == read_rows([out]) and len(reported) == 3 + N_CASES
    (line,) = [ln for ln in said.splitlines() if ln.startswith("report: ")]
    assert line.endswith(f"(every row of {out}, among them {3 + N_CASES} rows written before this run)"), line


@pytest.mark.parametrize("first, resumed, new", [("reference,torch_sdpa", "reference", 0),
                                                 ("torch_sdpa", "reference", 2)])
def test_a_resume_with_other_backends_reports_every_row_of_the_file(tmp_path, monkeypatch, capsys, first, resumed,
                                                                     new):
    """A check and a run into one file, then a --resume with fewer or other --backends: its report holds
    every row of the file (every backend's and the check's, the rows `treebench report OUT` shows), not
    only the resumed backends', and its report line counts every row written before it."""
    import treebench.harness.analyze.report as report
    from tests.tiny_suites import tiny_suite

    monkeypatch.chdir(tmp_path)
    Path("tiny.toml").write_text(tiny_suite(context_lens=(8, 33)))
    out = Path("r.jsonl")
    assert main(["check", "--suite", "tiny.toml", "--backend", "reference", "--out", str(out), "--quiet"]) == 0
    assert main(["run", "--suite", "tiny.toml", "--backends", first, "--out", str(out), "--quiet"]) == 0
    earlier = len(read_rows([out]))
    reported: list[list[dict]] = []
    real = report.write_report
    monkeypatch.setattr(report, "write_report", lambda rows, *a, **k: reported.append(rows) or real(rows, *a, **k))
    capsys.readouterr()
    assert main(["run", "--suite", "tiny.toml", "--backends", resumed, "--out", str(out), "--resume", "--quiet"]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[-1] == (f"report: reports/local/r.html (every row of {out}, among them {earlier} rows written before "
                        "this run)")
    assert main(["report", str(out), "-o", "all.html"]) == 0
    mine, of_file = reported
    assert len(mine) == earlier + new == len(read_rows([out])) and mine == of_file
    assert {r["backend"] for r in mine} == {"reference", "torch_sdpa"} and any(r["median_us"] is None for r in mine)


def test_a_resume_with_nothing_left_to_run_says_so(suite, tmp_path, capsys):
    """A --resume that finds every pair stored says that nothing ran, on stderr, and exits as the
    stored rows decide; one that runs a pair does not say it."""
    out = tmp_path / "r.jsonl"
    argv = [a for a in _run(suite, out, "--resume", backends=f"{FAULTS}:Exact") if a != "--quiet"]
    assert main(argv) == 0
    assert "nothing to run" not in capsys.readouterr().err
    assert main(argv) == 0
    err = capsys.readouterr().err.splitlines()
    assert f"INFO     nothing to run: all {N_CASES} pairs already stored in {out}" in err, err


@pytest.mark.parametrize("backend, code", [("Exact", 0), ("Raises", 1)])
def test_a_check_resume_with_nothing_left_to_run_says_so(suite, tmp_path, capsys, backend, code):
    """A check --resume that finds every case stored says so as run's does (one INFO line on stderr,
    counting cases: a check has one backend) and exits as the stored rows decide; one that runs a case,
    and one given --quiet, do not say it."""
    out = tmp_path / "r.jsonl"
    argv = ["check", "--suite", str(suite), "--backend", f"{FAULTS}:{backend}", "--out", str(out), "--resume"]
    assert main(argv) == code
    assert "nothing to run" not in capsys.readouterr().err
    assert main(argv) == code
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "nothing to run" in line] == [
        f"INFO     nothing to run: all {N_CASES} cases already stored in {out}"], err
    assert main([*argv, "--quiet"]) == code
    assert "nothing to run" not in capsys.readouterr().err


def _tiny_twice(tmp_path: Path) -> tuple[Path, Path]:
    """Suite files tiny.toml (suite "tiny", L 8) and other.toml (suite "other", L 9: another case id)."""
    from tests.tiny_suites import tiny_suite

    (tmp_path / "tiny.toml").write_text(tiny_suite())
    (tmp_path / "other.toml").write_text(tiny_suite("other", (9,)))
    return tmp_path / "tiny.toml", tmp_path / "other.toml"


@pytest.mark.parametrize("command, isolate", [("run", False), ("run", True), ("check", False)])
def test_a_resume_into_a_file_of_another_suites_rows_is_refused_and_writes_nothing(tmp_path, capsys, command,
                                                                                     isolate):
    """Rows record their suite's name (also from an isolated worker); a --resume of another suite into
    their file is refused in one line naming the suite they are of, exit 2, the file and its folder
    left as they were; the same suite resumes, and a file of both suites' rows resumes either."""
    tiny, other = _tiny_twice(tmp_path)
    out = tmp_path / "r.jsonl"
    argv = (_run(tiny, out, backends="torch_sdpa") if command == "run" else
            ["check", "--suite", str(tiny), "--backend", "torch_sdpa", "--out", str(out), "--quiet"])
    assert main([*argv, *(["--isolate"] if isolate else [])]) == 0
    assert [r["suite"] for r in read_rows([out])] == ["tiny"]
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    capsys.readouterr()
    resumed = [str(other) if a == str(tiny) else a for a in argv]
    assert main([*resumed, "--resume"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"treebench: error: --resume --out {out}: its rows are of suite tiny, not of suite other; resuming would "
        "add suite other's rows to that run's file: resume it with its own suite, or give suite other another --out"]
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert main([*argv, "--resume"]) == 0 and len(read_rows([out])) == 1
    assert main(resumed) == 0                          # without --resume: appended, as asked
    assert main([*resumed, "--resume"]) == 0 and main([*argv, "--resume"]) == 0
    assert sorted(r["suite"] for r in read_rows([out])) == ["other", "tiny"]


def test_a_resume_names_out_as_given_in_every_line(tmp_path, monkeypatch, capsys):
    """--out given relative: every line of a --resume names it so, never made absolute (the run keeps the
    absolute path only to find the file wherever a backend moves the working directory): the torn line it
    reads past, the torn line it sets aside before appending, the report it writes, and the refusal of a
    file of another suite's rows; the lines about the rows it reads are led by --resume."""
    tiny, other = _tiny_twice(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--suite", "tiny.toml", "--backend", "torch_sdpa", "--out", "r.jsonl", "--quiet"]) == 0
    with open("r.jsonl", "ab") as f:
        f.write(b'{"schema": 2, "backe')   # a writer killed mid-row
    capsys.readouterr()
    assert main(["run", "--suite", "tiny.toml", "--backends", "torch_sdpa,reference", "--out", "r.jsonl",
                 "--resume"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert not [line for line in err if str(tmp_path) in line], err
    assert "WARNING  --resume: r.jsonl:2: skipping a torn or malformed result line" in err, err
    assert ("WARNING  r.jsonl ended in a torn line (20 bytes, a row cut short by a killed writer): moved to "
            "r.jsonl.torn before appending") in err, err
    assert [line for line in err if line.startswith("INFO     report written to reports/local/r.html (")], err
    assert main(["run", "--suite", "other.toml", "--backends", "torch_sdpa", "--out", "r.jsonl", "--resume"]) == 2
    assert capsys.readouterr().err.startswith("treebench: error: --resume --out r.jsonl: its rows are of suite tiny")


def test_a_resume_reads_the_suite_of_older_rows_from_their_case_ids(tmp_path, capsys):
    """Rows written before rows recorded their suite: a --resume of a suite none of whose cases they
    hold is refused (their suite is not known); one of the suite whose cases they hold resumes."""
    tiny, other = _tiny_twice(tmp_path)
    out = tmp_path / "r.jsonl"
    argv = ["check", "--suite", str(tiny), "--backend", "torch_sdpa", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    out.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "suite"}) + "\n"
                           for r in read_rows([out])))
    before = out.read_bytes()
    capsys.readouterr()
    assert main(["check", "--suite", str(other), *argv[3:], "--resume"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"treebench: error: --resume --out {out}: none of its 1 rows is of a case of suite other (they are another "
        "suite's, written before rows recorded their suite); resuming would add suite other's rows to that run's "
        "file: resume it with its own suite, or give suite other another --out"]
    assert out.read_bytes() == before
    assert main([*argv, "--resume"]) == 0 and out.read_bytes() == before   # tiny's case: stored, nothing ran


def test_shards_of_one_suite_resume_into_one_file(suite, tmp_path):
    """Shards of one suite appended to one --out, the second with --resume: its rows are the same suite's."""
    out = tmp_path / "r.jsonl"
    assert main(_check(suite, out, "--shard", "0/2")) == 0
    assert main(_check(suite, out, "--shard", "1/2", "--resume")) == 0
    rows = read_rows([out])
    assert len({(r["case_id"], r["backend"]) for r in rows}) == N_CASES and {r["suite"] for r in rows} == {"s"}


def test_a_resume_of_the_default_check_into_a_suites_file_names_both(tmp_path, capsys):
    """A check without --suite records the default check as its suite: a --resume of it into a file
    of a suite's rows is refused, the line naming each as the output names it."""
    tiny, _ = _tiny_twice(tmp_path)
    out = tmp_path / "r.jsonl"
    assert main(["check", "--suite", str(tiny), "--backend", "torch_sdpa", "--out", str(out), "--quiet"]) == 0
    before = out.read_bytes()
    capsys.readouterr()
    assert main(["check", "--backend", "torch_sdpa", "--out", str(out), "--quiet", "--resume"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"treebench: error: --resume --out {out}: its rows are of suite tiny, not of the default check; resuming "
        "would add the default check's rows to that run's file: resume it with its own suite, or give the default "
        "check another --out"]
    assert out.read_bytes() == before


def test_a_check_resumed_into_a_runs_file_shows_no_time_in_its_summary(tmp_path, capsys):
    """A check --resume whose --out holds a run's timed rows of its cases counts them (their status is
    correctness, which the check verifies) but shows none of their time: the check times nothing,
    so its summary's median_us is "-" and it names no timer."""
    tiny, _ = _tiny_twice(tmp_path)
    out = tmp_path / "r.jsonl"
    assert main(["run", "--suite", str(tiny), "--backends", "reference", "--out", str(out), "--report",
                 str(tmp_path / "r.html"), "--quiet"]) == 0
    assert read_rows([out])[0]["median_us"] > 0
    capsys.readouterr()
    assert main(["check", "--suite", str(tiny), "--backend", "reference", "--out", str(out), "--resume"]) == 0
    out_text = capsys.readouterr().out
    [line] = [x for x in out_text.splitlines() if "reference" in x and "│" in x]
    cells = [cell.strip() for cell in line.strip("│ ").split("│")]
    assert cells == ["reference", "1", "0", "0", "0", "-"], out_text
    assert "timer:" not in out_text


@pytest.mark.parametrize("command", ["run", "check"])
@pytest.mark.parametrize("there", [False, True], ids=["no file", "empty file"])
def test_a_resume_with_nothing_to_resume_warns_and_starts_a_new_run(suite, tmp_path, capsys, monkeypatch, command,
                                                                    there):
    """`--resume` into a missing (or empty) --out: one warning line, naming --out as given, then the
    sweep runs every pair; a resume that finds rows does not warn."""
    monkeypatch.chdir(tmp_path)
    out = Path("new.jsonl")
    if there:
        out.touch()
    argv = [command, "--suite", str(suite), "--backend" + ("s" if command == "run" else ""), f"{FAULTS}:Exact",
            "--out", str(out), "--resume", "--quiet"] + (["--report", str(tmp_path / "r.html")] if command == "run"
                                                         else [])
    assert main(argv) == 0
    warned = [ln for ln in capsys.readouterr().err.splitlines() if "nothing to resume" in ln]
    assert warned == [f"WARNING  --resume: nothing to resume in {out} (no rows there): starting a new run"]
    assert len(read_rows([out])) == N_CASES
    assert main(argv) == 0 and "nothing to resume" not in capsys.readouterr().err
