"""Sharding and merging: --shard i/n, torchrun ranks with per-rank files and rank
0's merge, `treebench merge`, and results that do not depend on how many
processes ran them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from treebench.harness.cli.main import main
from treebench.harness.errors import ConfigError
from treebench.harness.model.cases import Case
from treebench.harness.run.config import MAX_WAIT_S
from treebench.harness.store.merge import merge_results
from treebench.harness.store.rows import ROW_FIELDS, SCHEMA, read_rows
from treebench.harness.sweep import shard
from treebench.harness.sweep.shard import Rank, Shard, parse_shard, rank_path, strip_option, torchrun_rank

ROOT = Path(__file__).resolve().parent.parent
SUITE = """
[axes]
batch_size = [1, 3]
context_len = [7, "ragged:1-40"]
tree = ["full:2:1", "chain:3", "random:5:1"]
num_q_heads = [4]
num_kv_heads = [2]
head_dim = [16]
"""
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", shard.RUN_ID_ENV)


@pytest.fixture
def suite(tmp_path) -> Path:
    p = tmp_path / "s.toml"
    p.write_text(SUITE)
    return p


@pytest.fixture(autouse=True)
def _no_torchrun_env(monkeypatch):
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)


def _results(paths) -> dict:
    """(case_id, backend) -> (status, max_abs_err, mismatch_frac): what must not depend on the process count."""
    rows = read_rows(paths)
    keys = [(r["case_id"], r["backend"]) for r in rows]
    assert len(keys) == len(set(keys)), "duplicate rows"
    return {(r["case_id"], r["backend"]): (r["status"], r["max_abs_err"], r["mismatch_frac"]) for r in rows}


def _check(suite, out, *extra) -> int:
    return main(["check", "--suite", str(suite), "--backend", "torch_sdpa", "--out", str(out), "--quiet", *extra])


# ---- selection ------------------------------------------------------------------------------


@pytest.mark.parametrize("text, want", [("0/1", Shard(0, 1)), ("3/4", Shard(3, 4)), ("01/2", Shard(1, 2))])
def test_parse_shard(text, want):
    assert parse_shard(text) == want


@pytest.mark.parametrize("text", ["", "1", "2/2", "-1/2", "1/0", "a/b", "1/2/3", "0.5/2", "1/-2",
                                  " 1 / 2 ", "0 /2", "0/\t2", "0/2\n"])
def test_bad_shards_are_one_line_config_errors(text):
    with pytest.raises(ConfigError, match="--shard") as e:
        parse_shard(text)
    assert "\n" not in str(e.value)


@given(n_items=st.integers(0, 60), count=st.integers(1, 9))
def test_shards_partition_the_cases_in_order(n_items, count):
    items = list(range(n_items))
    parts = [Shard(i, count).select(items) for i in range(count)]
    assert sorted(x for p in parts for x in p) == items
    assert all(p == sorted(p) for p in parts)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1           # round robin: balanced


def test_torchrun_rank_from_the_environment():
    assert torchrun_rank({}) is None
    assert torchrun_rank({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}) == Rank(3, 4, 1)
    assert torchrun_rank({"RANK": "1", "WORLD_SIZE": "2"}) == Rank(1, 2, 1)
    for env in ({"RANK": "2", "WORLD_SIZE": "2"}, {"RANK": "x", "WORLD_SIZE": "2"}, {"WORLD_SIZE": "2"},
                {"RANK": "0", "WORLD_SIZE": "0"}, {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "-1"}):
        with pytest.raises(ConfigError, match="torchrun environment"):
            torchrun_rank(env)


@pytest.mark.parametrize("rank, said", [(None, ""), (Rank(0, 1, 0), ""), (Rank(1, 2, 1), ""), (Rank(0, 2, 0), "rank 1"),
                                        (Rank(0, 4, 2), "ranks 1-3"), (Rank(0, 37, 0), "ranks 1-36")])
def test_rank_0_alone_waits_for_the_others(rank, said):
    assert shard.others(rank) == said


def test_rank_files_sit_beside_out(tmp_path):
    out = tmp_path / "sweep.jsonl"
    assert rank_path(out, Rank(1, 8, 1)) == tmp_path / "sweep.rank1-of-8.jsonl"
    assert shard.done_path(out, Rank(0, 2, 0)) == tmp_path / "sweep.rank0-of-2.done"
    for name in ("sweep.rank1-of-8.jsonl", "sweep.rank0-of-3.jsonl", "other.rank0-of-2.jsonl"):
        (tmp_path / name).write_text("")
    assert [p.name for p in shard.rank_files(out)] == ["sweep.rank0-of-3.jsonl", "sweep.rank1-of-8.jsonl"]


def test_torchrun_command_and_strip_option():
    argv = ["run", "--gpus", "2", "--suite", "seed", "--gpus=4", "--quiet"]
    assert strip_option(argv, "--gpus") == ["run", "--suite", "seed", "--quiet"]
    cmd = shard.torchrun_command(2, ["run", "--suite", "seed"])
    assert cmd[1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "treebench",
                       "run", "--suite", "seed"]


# ---- merge ----------------------------------------------------------------------------------


def _row(case_id, backend="b", env="e1", run_id="r1", status="pass"):
    return {"schema": SCHEMA, "run_id": run_id, "env": env, "backend": backend, "case_id": case_id,
            "case": Case(batch_size=1, context_len=4, tree="chain:1").axes, "status": status}


def _write(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_merge_drops_rows_already_stored_and_copies_env_files(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "env-e2.json").write_text(json.dumps({"env_id": "e2", "gpu_name": "H200"}))
    out = _write(tmp_path / "out.jsonl", [_row("c0")])
    a = _write(tmp_path / "a" / "a.jsonl", [_row("c0", run_id="r2"), _row("c1"), _row("c1", env="e2")])
    b = _write(tmp_path / "b.jsonl", [_row("c1"), _row("c2", backend="x")])
    before = out.read_bytes()
    added = merge_results(out, [a, b])
    assert [(r["case_id"], r["env"]) for r in added] == [("c1", "e1"), ("c1", "e2"), ("c2", "e1")]
    assert out.read_bytes().startswith(before) and len(read_rows([out])) == 4
    assert json.loads((tmp_path / "env-e2.json").read_text())["gpu_name"] == "H200"
    assert merge_results(out, [a, b]) == []                           # idempotent


def test_merge_keeps_a_later_rerun_of_a_stored_pair_so_the_gate_sees_its_crash(tmp_path):
    """Crash, pass, crash appended to one file, then merged: the later crash is kept (the
    gate reads each pair's latest row, so an older row must not stand in for it), and so
    is a later mismatch timed like an earlier pass; merging the result again adds nothing."""
    from treebench.harness.analyze.gate import compare_runs

    def row(status, ts, timer=None):
        return {**_row("c0"), "status": status, "timestamp": ts, "timer": timer,
                "median_us": 1.0 if timer else None, "samples_us": [1.0] * 9 if timer else None}
    ts = [f"2026-01-01T00:00:0{i}.000+00:00" for i in range(5)]   # as treebench writes them
    seq = [row("error", ts[1]), row("pass", ts[2], "wall"), row("error", ts[3]), row("mismatch", ts[4], "wall")]
    a = _write(tmp_path / "a.jsonl", seq)
    out = tmp_path / "m.jsonl"
    assert [r["timestamp"] for r in merge_results(out, [a])] == ts[1:]
    assert merge_results(out, [a]) == [] and merge_results(out, [_write(tmp_path / "b.jsonl", seq[:2])]) == []
    (v,) = compare_runs([row("pass", ts[0], "wall")], read_rows([out])).verdicts
    assert v.kind == "correctness_loss"
    (v,) = compare_runs([row("pass", ts[0], "wall")], read_rows([out])[:3]).verdicts   # without the mismatch
    assert v.kind == "correctness_loss" and v.cand_status == "error"


def test_merge_orders_timestamps_by_the_instant_they_name(tmp_path):
    """A row stored at 12:00:00.500+00:00 is later than one at 12:00:00Z (whose text sorts after
    it): merging the earlier one adds nothing, and neither does the same instant spelled with Z."""
    def row(ts):
        return {**_row("c0"), "status": "error", "timestamp": ts}
    out = _write(tmp_path / "out.jsonl", [row("2026-01-31T12:00:00.500+00:00")])
    assert merge_results(out, [_write(tmp_path / "a.jsonl", [row("2026-01-31T12:00:00Z")])]) == []
    assert merge_results(out, [_write(tmp_path / "b.jsonl", [row("2026-01-31T12:00:00.5Z")])]) == []
    later = row("2026-01-31T12:00:01Z")
    assert merge_results(out, [_write(tmp_path / "c.jsonl", [later])]) == [later]


def test_merge_with_run_ids_keeps_repeated_measurements(tmp_path):
    out = _write(tmp_path / "out.jsonl", [_row("c0")])
    a = _write(tmp_path / "a.jsonl", [_row("c0"), _row("c0", run_id="r2")])
    assert [r["run_id"] for r in merge_results(out, [a], with_run=True)] == ["r2"]


def test_merge_keeps_one_pair_timed_in_two_ways(tmp_path):
    """Rows of one (case, backend, env) timed with another timer or L2 state are other
    measurements, not duplicates (a file of --l2 cold rows merged with --l2 warm rows)."""
    def timed(timer, l2):
        return {**_row("c0"), "timer": timer, "l2_flushed": l2, "median_us": 1.0}
    cold, warm, loop = timed("cuda_graph", True), timed("cuda_graph", False), timed("cuda_graph_loop", False)
    old = {**_row("c0"), "timer": "cuda_graph", "median_us": 1.0}          # before l2_flushed: flushed
    out = _write(tmp_path / "out.jsonl", [cold])
    a = _write(tmp_path / "a.jsonl", [old, warm, loop, warm])
    assert [(r["timer"], r["l2_flushed"]) for r in merge_results(out, [a])] == [("cuda_graph", False),
                                                                               ("cuda_graph_loop", False)]


def test_the_architecture_doc_says_what_merge_keys_its_rows_on():
    """docs/architecture.md says what merge_results does, as README and `merge --help` do: the key takes
    timer and L2 state too, and a later re-run's row of a known key is kept."""
    doc = " ".join((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").split())
    merge = doc[doc.index("`treebench merge OUT INPUT...` reads"):][:1200]
    assert "(case_id, backend, env) plus how the row was timed, timer and L2 state" in merge, merge
    assert "a later re-run's row of a known key is appended too" in merge, merge
    assert "Running it twice adds nothing" not in doc and "key run_id, case_id, backend, env;" not in doc


def test_merge_validates_every_input_before_writing(tmp_path, capsys):
    out = _write(tmp_path / "out.jsonl", [_row("c0")])
    good = _write(tmp_path / "good.jsonl", [_row("c1")])
    bad = _write(tmp_path / "bad.jsonl", [{"schema": 99, "case_id": "x"}])
    before = out.read_bytes()
    assert main(["merge", str(out), str(good), str(bad)]) == 2
    assert main(["merge", str(out), str(good), str(tmp_path / "missing.jsonl")]) == 2
    assert main(["merge", str(out), str(out)]) == 2
    toml = tmp_path / "s.toml"
    toml.write_text("[axes]\nbatch_size = [1]\n")
    assert main(["merge", str(toml), str(good)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(line.startswith("treebench: error: ") for line in err)
    assert "schema 99" in err[0] and "not found" in err[1] and "both the output and an input" in err[2]
    assert "not a treebench results file" in err[3]
    assert out.read_bytes() == before and toml.read_text() == "[axes]\nbatch_size = [1]\n"


@pytest.mark.parametrize("bad, problem", [({"status": "fine"}, "field 'status' is 'fine'"),
                                          ({"case_id": None}, "field 'case_id' is null"),
                                          ({"median_us": -1.0}, "field 'median_us' is -1.0")])
def test_rank_merge_refuses_a_bad_row_as_treebench_merge_does(tmp_path, bad, problem):
    """Rank 0 merges the rank files with the checks of `treebench merge`: a rank that wrote a row report or
    gate would refuse fails the merge with one line naming file, line and field; OUT and the rank files stay."""
    out = _write(tmp_path / "sweep.jsonl", [_row("c0")])
    _write(rank_path(out, Rank(0, 2, 0)), [_row("c1")])
    r1 = _write(rank_path(out, Rank(1, 2, 1)), [_row("c2"), {**_row("c3"), **bad}])
    before = out.read_bytes()
    with pytest.raises(ConfigError, match=f"{r1}:2: {problem}") as e:
        shard.merge_ranks(out)
    assert "\n" not in str(e.value) and out.read_bytes() == before and len(shard.rank_files(out)) == 2


def test_rank_merge_skips_a_rank_file_torn_by_a_killed_rank(tmp_path):
    out = tmp_path / "sweep.jsonl"
    rank_path(out, Rank(0, 1, 0)).write_text('{"schema": 2, "case_id": "c0", "ba')    # killed mid-row
    assert shard.merge_ranks(out) == [] and not shard.rank_files(out)


def test_shards_merged_equal_one_run(suite, tmp_path, capsys):
    assert _check(suite, tmp_path / "all.jsonl") == 0
    for i in range(3):
        assert _check(suite, tmp_path / f"part{i}.jsonl", "--shard", f"{i}/3") == 0
    parts = [tmp_path / f"part{i}.jsonl" for i in range(3)]
    assert [len(read_rows([p])) for p in parts] == [4, 4, 4]
    assert main(["merge", str(tmp_path / "merged.jsonl"), *map(str, parts)]) == 0
    assert "merged 12 rows" in capsys.readouterr().out
    assert _results([tmp_path / "merged.jsonl"]) == _results([tmp_path / "all.jsonl"])


# ---- torchrun ranks ------------------------------------------------------------------------


def _as_rank(monkeypatch, rank, world, run_id="launch-1"):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("LOCAL_RANK", str(rank))
    monkeypatch.setenv(shard.RUN_ID_ENV, run_id)


def test_ranks_write_their_own_files_and_rank_0_merges(suite, tmp_path, monkeypatch):
    assert _check(suite, tmp_path / "one.jsonl") == 0
    out = tmp_path / "two.jsonl"
    _as_rank(monkeypatch, 1, 2)
    assert _check(suite, out) == 0
    assert not out.exists() or not read_rows([out])
    assert len(read_rows([tmp_path / "two.rank1-of-2.jsonl"])) == 6
    assert (tmp_path / "two.rank1-of-2.done").is_file()
    _as_rank(monkeypatch, 0, 2)
    assert _check(suite, out) == 0
    rows = read_rows([out])
    assert len(rows) == 12 and {r["run_id"] for r in rows} == {"launch-1"}
    assert all(set(r) == set(ROW_FIELDS) for r in rows)
    assert _results([out]) == _results([tmp_path / "one.jsonl"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["s.toml", "one.jsonl", "two.jsonl",
                                                                  *(p.name for p in tmp_path.glob("env-*.json"))])


def test_rank_0s_last_line_says_it_waits_for_the_others_and_the_report_comes_after(tmp_path, monkeypatch, capsys):
    """Off a terminal rank 0's last progress line says that it waits for the other ranks, not that the
    report is being written; a line of its own says that once the wait is over, before the summary."""
    import re

    from tests.tiny_suites import tiny_suite

    (tmp_path / "t.toml").write_text(tiny_suite(context_lens=(8, 9, 10)))
    argv = ["run", "--suite", str(tmp_path / "t.toml"), "--backends", "reference", "--out", str(tmp_path / "t.jsonl"),
            "--report", str(tmp_path / "t.html")]
    for rank in (2, 1, 0):
        _as_rank(monkeypatch, rank, 3)
        assert main(argv) == 0
    lines = capsys.readouterr().err.splitlines()
    shown = [i for i, line in enumerate(lines) if re.match(r"\[\d+/\d+\] ", line)]
    assert lines[shown[-1]].endswith(" elapsed, waiting for ranks 1-2)"), lines
    assert not any("writing the report" in lines[i] for i in shown), lines
    assert lines.index("writing the report") > shown[-1] and (tmp_path / "t.html").is_file(), lines
    assert len(read_rows([tmp_path / "t.jsonl"])) == 3


def test_quiet_rank_0_still_says_what_it_waits_for(tmp_path, monkeypatch, capsys):
    """--quiet hides progress, not rank 0's line that it waits for the other ranks and for how long:
    without it a run in a shell with a stray RANK and WORLD_SIZE would wait without a word."""
    from tests.tiny_suites import tiny_suite

    (tmp_path / "t.toml").write_text(tiny_suite())
    _as_rank(monkeypatch, 0, 2)
    assert main(["run", "--suite", str(tmp_path / "t.toml"), "--backends", "reference", "--out",
                 str(tmp_path / "t.jsonl"), "--quiet", "--merge-timeout", "0.3"]) == 1
    err = capsys.readouterr().err
    (waiting,) = [line for line in err.splitlines() if "rank 0 of 2: waiting for rank 1 to finish" in line]
    assert "for up to 0.3 s (--merge-timeout)" in waiting and "unset RANK and WORLD_SIZE" in waiting, err
    assert "writing the report" not in err and "[1/1]" not in err, err


def test_only_rank_0_is_told_that_a_report_follows(tmp_path, monkeypatch):
    """Under torchrun rank 0 alone writes the run's report: the run request of a rank past 0 says that
    none follows (RunConfig.report False), rank 0's that one does; rank 0 writes it."""
    import treebench.harness.sweep.execute as execute

    from tests.tiny_suites import tiny_suite

    told: dict[int, bool] = {}
    run_cases = execute.run_cases

    def recorded(cases, backends, config, console=None):
        told[rank] = config.report
        return run_cases(cases, backends, config, console=console)
    monkeypatch.setattr(execute, "run_cases", recorded)
    (tmp_path / "two.toml").write_text(tiny_suite(context_lens=(8, 9)))
    for rank in (1, 0):
        _as_rank(monkeypatch, rank, 2)
        assert main(["run", "--suite", str(tmp_path / "two.toml"), "--backends", "torch_sdpa", "--out",
                     str(tmp_path / "two.jsonl"), "--report", str(tmp_path / "two.html"), "--quiet"]) == 0
    assert told == {1: False, 0: True}
    assert len(read_rows([tmp_path / "two.jsonl"])) == 2 and (tmp_path / "two.html").is_file()


def test_only_a_second_launch_under_one_run_id_is_warned_of(suite, tmp_path, monkeypatch, caplog):
    """The ranks of one launch share its run id and rank 0 merges their rows into --out: no warning.
    The same launch id run again into that --out (a restart, a job run twice): rank 0 warns once."""
    out = tmp_path / "two.jsonl"
    for launch in range(2):
        caplog.clear()
        for rank in (1, 0):
            _as_rank(monkeypatch, rank, 2)
            assert _check(suite, out) == 0
        warned = [m for m in caplog.messages if "already names" in m]
        assert len(warned) == launch and all(m.startswith(f"run id launch-1 ($TREEBENCH_RUN_ID) already names 12 "
                                                          f"rows in {out}, ") for m in warned), warned
    assert len(read_rows([out])) == 24


def test_rank_0_gives_up_waiting_without_losing_rows(suite, tmp_path, monkeypatch, caplog):
    out = tmp_path / "two.jsonl"
    _as_rank(monkeypatch, 0, 2)
    assert _check(suite, out, "--merge-timeout", "0.3") == 1
    assert not read_rows([out])
    assert len(read_rows([tmp_path / "two.rank0-of-2.jsonl"])) == 6
    assert any("ranks [1] not done" in m and "treebench merge" in m for m in caplog.messages)


@pytest.mark.parametrize("timeout_s, missing", [(3600.0, [1]), (MAX_WAIT_S + 1, []), (1e308, [])])
def test_rank_0_waits_without_limit_for_a_merge_timeout_past_the_longest_wait(timeout_s, missing, tmp_path,
                                                                              monkeypatch):
    """--merge-timeout past MAX_WAIT_S is no limit, as --case-timeout: rank 0 waits for a rank done after more
    than a day of polls (a clock that jumps 10^7 s a poll), where an hour's limit gives up on it."""
    out, polls = tmp_path / "two.jsonl", []
    shard.mark_done(out, Rank(0, 2, 0), "launch-1", 6)

    def sleep(_):
        polls.append(1)
        if len(polls) == 3:
            shard.mark_done(out, Rank(1, 2, 1), "launch-1", 6)
    monkeypatch.setattr(shard, "time", SimpleNamespace(monotonic=lambda: 1e7 * len(polls), sleep=sleep))
    assert shard.wait_for_ranks(out, 2, "launch-1", timeout_s) == missing


def test_a_stale_done_marker_of_another_launch_is_not_taken_for_this_one(suite, tmp_path, monkeypatch):
    out = tmp_path / "two.jsonl"
    shard.mark_done(out, Rank(1, 2, 1), "launch-0", 6)                   # left by an earlier launch
    _as_rank(monkeypatch, 0, 2, run_id="launch-1")
    assert _check(suite, out, "--merge-timeout", "0.3") == 1


@pytest.mark.parametrize("argv, words", [
    (["run", "--gpus", "2"], "--gpus 2: needs CUDA GPUs, and torch sees none here"),
    (["run", "--gpus", "0"], "'0' is not a GPU count"),
    (["check", "--backend", "torch_sdpa", "--shard", "2/2"], "--shard 2/2"),
])
def test_bad_scale_options_exit_2(argv, words, capsys, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]


def test_gpus_beyond_the_visible_ones_says_how_many_there_are(monkeypatch, capsys):
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    assert main(["run", "--gpus", "2", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--gpus 2: torch sees 1 CUDA GPU(s); ask for at most 1" in err[0]


def test_under_torchrun_out_is_required_and_gpus_refused(monkeypatch, capsys):
    _as_rank(monkeypatch, 0, 2)
    assert main(["check", "--backend", "torch_sdpa", "--quiet"]) == 2
    assert "under torchrun give --out" in capsys.readouterr().err
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    assert main(["run", "--gpus", "2", "--quiet"]) == 2
    assert "already running under torchrun" in capsys.readouterr().err


def test_torchrun_with_two_processes_matches_one(suite, tmp_path):
    """The real launcher (python -m torch.distributed.run, two CPU processes) against one process."""
    assert _check(suite, tmp_path / "one.jsonl") == 0
    out = tmp_path / "two.jsonl"
    env_before = dict(os.environ)
    rc = shard.launch_torchrun(2, ["check", "--suite", str(suite), "--backend", "torch_sdpa", "--out", str(out),
                                   "--quiet"])
    assert dict(os.environ) == env_before
    assert rc == 0
    rows = read_rows([out])
    assert len(rows) == 12 and len({r["run_id"] for r in rows}) == 1
    assert _results([out]) == _results([tmp_path / "one.jsonl"])
    assert not shard.rank_files(out) and not list(tmp_path.glob("*.done"))


def test_gpus_relaunches_the_command_line_under_torchrun(suite, tmp_path, monkeypatch):
    from treebench.harness.cli import run as cli_sweep

    launched = []
    monkeypatch.setattr(cli_sweep, "_check_gpus", lambda n: None)
    monkeypatch.setattr(shard, "launch_torchrun",
                        lambda n, argv, run_id=None: launched.append((n, argv, run_id)) or 7)
    monkeypatch.chdir(tmp_path)
    argv = ["run", "--suite", str(suite), "--gpus", "2", "--backends", "torch_sdpa", "--quiet"]
    assert main(argv) == 7                                             # torchrun's exit code is ours
    ((n, relaunched, run_id),) = launched
    assert n == 2 and relaunched[:6] == ["run", "--suite", str(suite), "--backends", "torch_sdpa", "--quiet"]
    assert relaunched[6] == "--out" and relaunched[7].startswith("results/local/s-")   # one file for all ranks
    assert relaunched[8] == "--report" and relaunched[9].startswith("reports/local/s-")
    assert relaunched[7] == f"results/local/s-{run_id}.jsonl"          # the ranks' run id names the files
    assert main(["run", "--suite", str(suite), "--gp", "2"]) == 2        # no abbreviations: they would survive


def test_gpus_removes_the_empty_default_file_of_a_crashed_launch_before_relaunching(suite, tmp_path, monkeypatch):
    """`run --gpus N` without --out gives its ranks the default --out, so they leave crash leftovers alone:
    the command that relaunches removes them first (an empty default file a launch of the suite named
    after its id left, with its lock and its ranks' sidecars), never the file of the launch it starts."""
    from treebench.harness.cli import run as cli_sweep

    monkeypatch.setattr(cli_sweep, "_check_gpus", lambda n: None)
    monkeypatch.setattr(shard, "launch_torchrun", lambda n, argv, run_id=None: 0)
    monkeypatch.chdir(tmp_path)
    local = tmp_path / "results" / "local"
    local.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    left = [local / "s-torchrun-9c1e.jsonl", local / "s-torchrun-9c1e.jsonl.lock",
            local / "s-torchrun-9c1e.rank1-of-2.jsonl.lock"]
    for path, text in zip(left, ["", f"{dead}\ntorchrun-9c1e\n", f"{dead}\n"]):
        path.write_text(text)
    monkeypatch.setenv(shard.RUN_ID_ENV, "job7")
    (local / "s-job7.jsonl").write_text("")                              # the file of the launch it starts
    (local / "s-job7.jsonl.lock").write_text(f"{dead}\njob7\n")
    assert main(["run", "--suite", str(suite), "--gpus", "2", "--backends", "torch_sdpa", "--quiet"]) == 0
    assert not any(p.exists() for p in left) and (local / "s-job7.jsonl").exists()


@pytest.mark.parametrize("command", ["run", "check"])
@pytest.mark.parametrize("text", ["3/2", "0/0", "a"])
def test_a_bad_shard_creates_no_output(command, text, tmp_path, monkeypatch, capsys):
    """A refused --shard writes nothing: no --out file, no folder for it, no report folder."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "sub" / "x.jsonl"
    argv = [command, "--suite", "smoke", "--shard", text, "--out", str(out)]
    argv += ["--backends", "torch_sdpa"] if command == "run" else ["--backend", "torch_sdpa"]
    assert main(argv) == 2
    assert not (tmp_path / "sub").exists() and not (tmp_path / "reports").exists()
    assert "--shard" in capsys.readouterr().err


# ---- RANK and WORLD_SIZE where no torchrun launched the command ------------------------------


def test_run_without_out_under_ranks_that_share_no_run_id_is_refused(tmp_path, monkeypatch, capsys):
    """Each rank would name a default file after a run id of its own, and rank 0 would wait for rank files
    that never come: refused in one line, as `check` without --out is, nothing written. A run id every rank
    shares names one default file: that run goes on."""
    from tests.cli_errors import one_line_error
    from tests.tiny_suites import tiny_suite

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.toml").write_text(tiny_suite())
    _as_rank(monkeypatch, 0, 2)
    monkeypatch.delenv(shard.RUN_ID_ENV)
    argv = ["run", "--suite", "tiny.toml", "--backends", "reference", "--quiet"]
    assert main(argv) == 2
    assert one_line_error(capsys) == (
        "treebench: error: under torchrun (RANK=0, WORLD_SIZE=2) give --out: ranks write <out>.rank<i>-of-<n>.jsonl "
        "and rank 0 merges them (the default file is named after a run id, and no $TREEBENCH_RUN_ID or torchrun's "
        "run id gives one to every rank); where no torchrun launched this command, unset RANK and WORLD_SIZE")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.toml"]
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job3")
    assert main([*argv, "--dry-run"]) == 0


def _rank_0_alone(tmp_path: Path, *extra: str) -> subprocess.Popen:
    """`treebench run --out e10.jsonl` under RANK=0 and WORLD_SIZE=2 with no other rank, stderr piped."""
    from tests.tiny_suites import tiny_suite

    (tmp_path / "tiny.toml").write_text(tiny_suite())
    environ = {k: v for k, v in os.environ.items() if k not in (*TORCHRUN_VARS, "COLUMNS", "LINES")}
    environ |= {"PYTHONPATH": str(ROOT), "RANK": "0", "WORLD_SIZE": "2"}
    proc = subprocess.Popen([sys.executable, "-m", "treebench", "run", "--suite", "tiny.toml", "--backends",
                             "reference", "--out", "e10.jsonl", *extra], cwd=tmp_path, env=environ,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    killer = threading.Timer(240, proc.kill)   # a rank 0 that waits without a word fails the test, not the suite
    killer.daemon = True
    killer.start()
    return proc


def _until_waiting(proc: subprocess.Popen) -> str:
    """What `proc` says on stderr up to its line that it waits for the other ranks (all of it, where none comes);
    its last progress line, which says so too, comes before."""
    assert proc.stderr is not None
    said = []
    for line in proc.stderr:
        said.append(line)
        if "rank 0 of 2: waiting for" in line:
            break
    return "".join(said)


def test_rank_0_says_what_it_waits_for_and_a_stop_names_the_rank_file(tmp_path):
    """A RANK and WORLD_SIZE left in a shell make a plain run rank 0 of a launch that never started: it
    says once whom it waits for, how long and how to stop; stopped, its line names the rank file that
    holds the rows, and the `treebench rm` and `--resume` it gives work on it."""
    import signal

    proc = _rank_0_alone(tmp_path)
    said = _until_waiting(proc)
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read() if proc.stderr else ""
    assert proc.wait(timeout=60) == 143, said + rest
    waiting = " ".join((said + rest).split())
    assert ("rank 0 of 2: waiting for rank 1 to finish (its done marker e10.rank1-of-2.done) to merge their rows "
            "into e10.jsonl, for up to 24 h 0 min (--merge-timeout); this rank's rows are in e10.rank0-of-2.jsonl. "
            "No other rank running (RANK and WORLD_SIZE set where no torchrun launched this command)? Stop it "
            "(Ctrl-C), unset RANK and WORLD_SIZE, and run it again with --resume") in waiting, waiting
    (stopped,) = [line for line in rest.splitlines() if line.startswith("treebench: terminated")]
    (row,) = read_rows([tmp_path / "e10.rank0-of-2.jsonl"])
    run_id = row["run_id"]
    assert stopped == (f"treebench: terminated (SIGTERM); rows already written are kept in e10.rank0-of-2.jsonl "
                       f"(--out e10.jsonl's rank file, not merged yet), run_id {run_id}; to finish, run the same "
                       "command with --out e10.jsonl --resume (it merges e10.rank0-of-2.jsonl into e10.jsonl; unset "
                       "RANK and WORLD_SIZE first where no torchrun launched this command), or remove them with "
                       f"treebench rm e10.rank0-of-2.jsonl --run-id {run_id}")
    environ = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS} | {"PYTHONPATH": str(ROOT)}
    resumed = subprocess.run([sys.executable, "-m", "treebench", "run", "--suite", "tiny.toml", "--backends",
                              "reference", "--out", "e10.jsonl", "--resume"], cwd=tmp_path, env=environ,
                             capture_output=True, text=True, timeout=300, check=False)
    assert resumed.returncode == 0 and "nothing to resume" not in resumed.stderr, resumed.stderr
    assert read_rows([tmp_path / "e10.jsonl"]) == [row] and not shard.rank_files(tmp_path / "e10.jsonl")


def test_the_rm_a_stopped_rank_names_removes_its_rows(tmp_path):
    """The `treebench rm RANKFILE --run-id ID` of the line after a stop works as given."""
    import shlex
    import signal

    proc = _rank_0_alone(tmp_path, "--merge-timeout", "600")
    _until_waiting(proc)
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read() if proc.stderr else ""
    assert proc.wait(timeout=60) == 130, rest
    rm = shlex.split(" ".join(rest.split()).split("or remove them with ")[1])
    environ = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS} | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "treebench", *rm[1:]], cwd=tmp_path, env=environ,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert read_rows([tmp_path / "e10.rank0-of-2.jsonl"]) == []
