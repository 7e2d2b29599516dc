"""The CLI as a user (or CI) meets it, through real subprocesses: exit 3 when nothing ran,
plain progress lines off a terminal, SIGTERM and crash lines, closed pipes, and the lock
that keeps two runs from appending to one results file."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from treebench.harness.cli.main import COMMANDS
from treebench.harness.store.rows import read_rows

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ROOT / "tests" / "fault_backends.py"
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "TREEBENCH_RUN_ID")

TINY = """
[suite]
name = "tiny"
[axes]
batch_size = [2]
context_len = [37]
tree = ["full:2:2"]
num_q_heads = [4]
num_kv_heads = [2]
head_dim = [32]
dtype = ["bfloat16"]
page_size = [16]
layout = ["shuffled", "interleaved"]
"""

GPU_ONLY = ("class GpuOnly:\n    name = 'gpu_only'\n    def availability(self): return 'needs a CUDA GPU'\n"
            "    def supports(self, case): return None\n    def prepare(self, inputs): raise AssertionError\n")


def env() -> dict[str, str]:
    """The environment of a CLI subprocess: this checkout importable, no terminal width hint, outside torchrun."""
    e = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", *TORCHRUN_VARS)}
    return {**e, "PYTHONPATH": str(ROOT)}


def treebench(*argv: str, cwd: Path, timeout: float = 300, environ: dict[str, str] | None = None,
              **kw) -> subprocess.CompletedProcess:
    """`python -m treebench ARGV` in `cwd` (`environ` added to `env()`), output captured as text."""
    return subprocess.run([sys.executable, "-m", "treebench", *map(str, argv)], cwd=cwd,
                          env={**env(), **(environ or {})}, capture_output=True, text=True, timeout=timeout,
                          check=False, **kw)


@pytest.fixture
def tiny(tmp_path) -> Path:
    p = tmp_path / "tiny.toml"
    p.write_text(TINY)
    return p


@pytest.fixture
def gpu_only(tmp_path) -> str:
    mod = tmp_path / "gpu_only.py"
    mod.write_text(GPU_ONLY)
    return f"{mod}:GpuOnly"


def test_a_check_in_which_nothing_ran_exits_3_with_one_line_and_keeps_its_rows(tiny, gpu_only, tmp_path):
    out = tmp_path / "rows.jsonl"
    done = treebench("check", "--suite", tiny, "--backend", gpu_only, "--out", out, "--quiet", cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    lines = [line for line in done.stderr.splitlines() if "no case ran" in line]
    assert len(lines) == 1 and "gpu_only: needs a CUDA GPU" in lines[0] and "--allow-skip" in lines[0], done.stderr
    assert {r["status"] for r in read_rows([out])} == {"skipped"}
    again = treebench("check", "--suite", tiny, "--backend", gpu_only, "--allow-skip", "--quiet", cwd=tmp_path)
    assert again.returncode == 0 and "accepted by --allow-skip" in again.stderr, again.stderr


def test_a_run_whose_named_backends_all_skipped_exits_3(tiny, gpu_only, tmp_path):
    out = tmp_path / "rows.jsonl"
    argv = ("run", "--suite", tiny, "--backends", f"{gpu_only},xformers_tree", "--out", out,
            "--report", tmp_path / "r.html", "--quiet")
    done = treebench(*argv, cwd=tmp_path)
    if any(r["status"] != "skipped" for r in read_rows([out])):
        pytest.skip("xformers_tree runs here")
    assert done.returncode == 3, done.stderr
    assert "no case ran: gpu_only: needs a CUDA GPU; xformers_tree: " in done.stderr
    assert len(read_rows([out])) == 4 and (tmp_path / "r.html").exists()
    assert treebench(*argv, "--allow-skip", cwd=tmp_path).returncode == 0


def test_a_run_in_which_one_backend_ran_exits_0(tiny, gpu_only, tmp_path):
    done = treebench("run", "--suite", tiny, "--backends", f"torch_sdpa,{gpu_only}", "--out", tmp_path / "rows.jsonl",
                     "--report", tmp_path / "r.html", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "no case ran: needs a CUDA GPU" in done.stderr and "this proves nothing" not in done.stderr


CRASHED = ("treebench: a backend crashed the process (the stack below names it and its case); rerun with --isolate "
           "to make a crash an error row and go on")


@pytest.mark.parametrize("out", [None, "rows.jsonl"])
def test_a_segfault_without_isolate_names_the_backend_and_case_in_flight(tiny, tmp_path, out):
    """A crash outside --isolate in the first pair: one plain line before the stack names --isolate and,
    with --out, that no row was written yet and the command that reruns it; the stack's frames name the
    backend and case."""
    argv = ["check", "--suite", tiny, "--backend", f"{FAULTS}:Segfaults", "--quiet"]
    done = treebench(*argv, *(["--out", out] if out else []), cwd=tmp_path)
    assert done.returncode == -signal.SIGSEGV, done.stderr
    named = [line for line in done.stderr.splitlines() if "crashed running backend segfaults on case B2-L37-" in line]
    assert len(named) == 1 and "--isolate" in named[0], done.stderr
    assert done.stderr.splitlines()[:2] == [
        CRASHED + ("" if out is None else f": no row was written yet to {out}; run the same command with "
                   f"--isolate --out {out}"),
        "Fatal Python error: Segmentation fault"], done.stderr
    if out:
        assert (tmp_path / out).stat().st_size == 0
        again = treebench(*argv, "--isolate", "--out", out, cwd=tmp_path)
        assert again.returncode == 1 and {r["status"] for r in read_rows([tmp_path / out])} == {"error"}


@pytest.mark.parametrize("before", [0, 1])
def test_a_segfault_after_a_row_names_the_rows_kept_and_the_resume_that_finishes(tiny, tmp_path, before):
    """A crash outside --isolate once a row of the run is written (in a file empty, or holding another
    run's row, before): the line names the rows kept, the run_id, the --resume that finishes the run and
    the `treebench rm` that removes them. In a file that held a row before, a crash before this run's first
    row says no row was written yet."""
    out = tmp_path / "rows.jsonl"
    argv = ["run", "--suite", tiny, "--out", out, "--report", tmp_path / "r.html", "--quiet"]
    if before:
        assert treebench(*argv, "--backends", f"{FAULTS}:Exact", cwd=tmp_path).returncode == 0
        done = treebench(*argv, "--backends", f"{FAULTS}:Segfaults", cwd=tmp_path)
        assert done.stderr.splitlines()[0] == (f"{CRASHED}: no row was written yet to {out}; run the same "
                                               f"command with --isolate --out {out}"), done.stderr
    done = treebench(*argv, "--backends", f"{FAULTS}:Exact,{FAULTS}:Segfaults", cwd=tmp_path)
    assert done.returncode == -signal.SIGSEGV, done.stderr
    rows = read_rows([out])
    run_id = rows[-1]["run_id"]
    assert [r["run_id"] for r in rows].count(run_id) == 1 and done.stderr.splitlines()[0] == (
        f"{CRASHED}: rows already written are kept in {out}, run_id {run_id}; to finish, run the same command "
        f"with --isolate --out {out} --resume, or remove them with treebench rm {out} --run-id {run_id}"
    ), done.stderr
    if not before:
        again = treebench(*argv, "--backends", f"{FAULTS}:Exact,{FAULTS}:Segfaults", "--isolate", "--resume",
                          cwd=tmp_path)
        assert again.returncode == 1, again.stderr
        assert [r["status"] for r in read_rows([out])] == ["pass", "error", "pass", "error"]


RANK_1 = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}   # torchrun's second rank of two


def test_a_crash_on_a_torchrun_rank_names_its_rank_file_and_hints_that_work_there(tiny, tmp_path):
    """Under torchrun a rank appends its rows to its own file, not to --out: the line before an abort's stack
    names that file, before the rank's first row as holding none yet (the rerun takes --resume: the other ranks
    may have written rows), after it with the rows' run_id; the --resume it gives finishes the rank without
    running a stored pair again, and the `treebench rm` it gives removes the crashed run's rows from that file."""
    import shlex

    argv = ["run", "--suite", tiny, "--out", "e.jsonl", "--report", "r.html", "--quiet"]
    held = tmp_path / "e.rank1-of-2.jsonl"
    first = treebench(*argv, "--backends", f"{FAULTS}:Aborts", cwd=tmp_path, environ=RANK_1)
    assert first.returncode == -signal.SIGABRT, first.stderr
    assert first.stderr.splitlines()[:2] == [
        f"{CRASHED}: no row was written yet to e.rank1-of-2.jsonl (--out e.jsonl's rank file); run the same command "
        "with --isolate --out e.jsonl --resume (it skips the pairs whose rows the other ranks wrote, and merges those "
        "into e.jsonl; unset RANK and WORLD_SIZE first where no torchrun launched this command)",
        "Fatal Python error: Aborted"], first.stderr
    crashed = [*argv, "--backends", f"{FAULTS}:Exact,{FAULTS}:Aborts"]
    done = treebench(*crashed, cwd=tmp_path, environ=RANK_1)
    assert done.returncode == -signal.SIGABRT, done.stderr
    (row,) = read_rows([held])
    run_id, line = row["run_id"], done.stderr.splitlines()[0]
    assert line == (f"{CRASHED}: rows already written are kept in e.rank1-of-2.jsonl (--out e.jsonl's rank file, not "
                    f"merged yet), run_id {run_id}; to finish, run the same command with --isolate --out e.jsonl "
                    "--resume (it merges e.rank1-of-2.jsonl into e.jsonl; unset RANK and WORLD_SIZE first where no "
                    f"torchrun launched this command), or remove them with treebench rm e.rank1-of-2.jsonl --run-id "
                    f"{run_id}"), done.stderr
    again = treebench(*crashed, "--isolate", "--resume", cwd=tmp_path, environ=RANK_1)
    assert again.returncode == 0, again.stderr
    assert [(r["backend"], r["status"], r["run_id"] == run_id) for r in read_rows([held])] == [
        ("exact", "pass", True), ("aborts", "error", False)]
    rm = shlex.split(line.split("or remove them with ")[1])
    assert rm[:2] == ["treebench", "rm"] and treebench(*rm[1:], cwd=tmp_path).returncode == 0
    assert [r["backend"] for r in read_rows([held])] == ["aborts"]


def _dead_pid() -> int:
    """The pid of a process that has exited (a crashed run's, as its lock sidecar names it)."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(proc.stdout)


def _crash_leftovers(out: Path, pid: int | None = None, run_id: str | None = None) -> None:
    """What a crash before the first row leaves: `out` empty, its lock sidecar naming the dead run (and the
    run id that named `out` where it is that run's default file), an env file."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("")
    Path(f"{out}.lock").write_text(f"{pid or _dead_pid()}\n" + (f"{run_id}\n" if run_id else ""))
    (out.parent / "env-0123456789ab.json").write_text('{"env_id": "0123456789ab", "gpu_name": null}')


@pytest.mark.parametrize("resume", [False, True])
def test_a_rerun_into_the_empty_file_a_crash_left_runs_from_the_start(tiny, tmp_path, resume):
    """The same command again, with or without --resume, after a crash before the first row: the run
    appends to the empty file, takes its lock over (and deletes it when done) and writes its report."""
    out = tmp_path / "rows.jsonl"
    _crash_leftovers(out)
    argv = ["run", "--suite", tiny, "--backends", f"{FAULTS}:Exact", "--out", out, "--report", tmp_path / "r.html",
            "--quiet"]
    done = treebench(*argv, *(["--resume"] if resume else []), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [r["status"] for r in read_rows([out])] == ["pass", "pass"]
    assert not Path(f"{out}.lock").exists() and (tmp_path / "r.html").is_file()


def test_a_rerun_with_the_default_out_removes_the_empty_file_a_crash_left(tiny, tmp_path):
    """The same command again without --out gets a new default file: the crashed run's empty default
    file and its sidecar go; a file holding a row, one whose writer is alive, another suite's, a rank
    file, an --out whose launch left a rank file holding a row beside it and the env file stay."""
    local = tmp_path / "results" / "local"
    crashed = local / "tiny-20260101T000000Z-aaaaaa.jsonl"
    _crash_leftovers(crashed)
    kept = [local / "tiny-20260101T000001Z-bbbbbb.jsonl", local / "tiny-20260101T000002Z-cccccc.jsonl",
            local / "other-20260101T000003Z-dddddd.jsonl", local / "tiny-20260101T000004Z-eeeeee.rank0-of-2.jsonl",
            local / "tiny-20260101T000005Z-ffffff.jsonl"]
    for path in kept:
        _crash_leftovers(path, os.getpid() if path == kept[1] else None)   # kept[1]: its writer still runs
    (local / "tiny-20260101T000005Z-ffffff.rank1-of-2.jsonl").write_text('{"a row": 1}\n')   # kept[4]: a rank file
                                                                                            # beside, holding a row
    row = treebench("run", "--suite", tiny, "--backends", f"{FAULTS}:Exact", "--out", tmp_path / "one.jsonl",
                    "--report", tmp_path / "one.html", "--quiet", cwd=tmp_path)
    assert row.returncode == 0, row.stderr
    kept[0].write_text((tmp_path / "one.jsonl").read_text())
    done = treebench("run", "--suite", tiny, "--backends", f"{FAULTS}:Exact", cwd=tmp_path)   # info lines shown
    assert done.returncode == 0, done.stderr
    assert f"removed {crashed.relative_to(tmp_path)}: the empty results file of a run of suite tiny that crashed " \
           "before its first row" in " ".join(done.stderr.split()), done.stderr
    assert not crashed.exists() and not Path(f"{crashed}.lock").exists()
    assert [(p.exists(), Path(f"{p}.lock").exists()) for p in kept] == [(True, True)] * 5, kept
    assert (local / "env-0123456789ab.json").exists()
    new = {p for p in local.glob("tiny-*.jsonl") if ".rank" not in p.name} - {*kept}
    assert len(new) == 1 and [r["status"] for r in read_rows(list(new))] == ["pass", "pass"]


def test_crash_leftovers_are_only_the_suites_default_file_names(tmp_path):
    """Only `<suite>-<fresh run id>.jsonl` is a default file of the suite: the empty, abandoned files of
    suite `tiny-x` and a user's own `--out tiny-mine.jsonl` stay when suite `tiny` clears its leftovers."""
    from treebench.harness.store.names import new_run_id
    from treebench.harness.sweep.crash import drop_crash_leftovers

    crashed = tmp_path / f"tiny-{new_run_id()}.jsonl"
    kept = [tmp_path / f"tiny-x-{new_run_id()}.jsonl", tmp_path / "tiny-mine.jsonl",
            tmp_path / "tiny-20260101T000000Z-aaaaaa-old.jsonl", tmp_path / "tiny-20260101T000000Z.jsonl"]
    for path in [crashed, *kept]:
        _crash_leftovers(path)
    assert drop_crash_leftovers(tmp_path, "tiny") == [crashed]
    assert [(p.exists(), Path(f"{p}.lock").exists()) for p in kept] == [(True, True)] * len(kept)


def test_crash_leftovers_named_after_a_run_id_from_outside_are_only_the_suites(tmp_path):
    """A default file named after a run id from $TREEBENCH_RUN_ID or torchrun is told by the id its lock
    (or its ranks' locks) records: such an empty file of a dead run goes, with what its torchrun launch
    left beside it (empty rank files, their sidecars, done markers); another suite's (`tiny-x-job8`
    recording job8), a user's own (recording none), one recording another id, one holding a row, a live
    writer's, one whose launch left a rank file holding a row or still being written, one without a lock
    or whose rank's lock records no id, and this run's own stay."""
    from treebench.harness.sweep.crash import drop_crash_leftovers

    crashed = [tmp_path / "tiny-job7.jsonl", tmp_path / "tiny-torchrun-3f2a.jsonl", tmp_path / "tiny-torchrun-77.jsonl"]
    _crash_leftovers(crashed[0], run_id="job7")
    _crash_leftovers(crashed[1], run_id="torchrun-3f2a")
    crashed[2].write_text("")   # its rank 0, stopped by torchrun, took its lock away; the rank that crashed did not
    launch = [tmp_path / f"tiny-torchrun-3f2a.rank{r}-of-3.{kind}" for r, kind in
              ((0, "jsonl.lock"), (1, "jsonl"), (1, "jsonl.lock"), (2, "done"))]
    launch.append(tmp_path / "tiny-torchrun-77.rank1-of-2.jsonl.lock")
    for path in launch:
        path.write_text(f"{_dead_pid()}\n{'torchrun-77' if '77' in path.name else ''}\n" if path.name.endswith(".lock")
                        else "")
    kept = {tmp_path / "tiny-x-job8.jsonl": "job8", tmp_path / "tiny-mine.jsonl": None,
            tmp_path / "tiny-job9.jsonl": "job9-other", tmp_path / "tiny-job10.jsonl": "job10",
            tmp_path / "tiny-job11.jsonl": "job11", tmp_path / "tiny-job12.jsonl": "job12",
            tmp_path / "tiny-job13.jsonl": "job13", tmp_path / "tiny-job14.jsonl": "job14"}
    for path, run_id in kept.items():
        _crash_leftovers(path, os.getpid() if "job11" in path.name else None, run_id)
    (tmp_path / "tiny-job10.jsonl").write_text('{"a row": 1}\n')
    (tmp_path / "tiny-job12.rank1-of-2.jsonl").write_text('{"a row": 1}\n')   # waits for a --resume
    (tmp_path / "tiny-job13.rank0-of-2.jsonl.lock").write_text(f"{os.getpid()}\n")   # a rank still writing
    for name in ("tiny-job15.jsonl", "tiny-job16.jsonl"):   # no lock: a run's still to come, or a user's
        (tmp_path / name).write_text("")
    (tmp_path / "tiny-job16.rank1-of-2.jsonl.lock").write_text(f"{_dead_pid()}\n")   # a rank's, recording no id
    assert drop_crash_leftovers(tmp_path, "tiny", keep=tmp_path / "tiny-job14.jsonl") == crashed
    assert not any(p.exists() or Path(f"{p}.lock").exists() for p in [*crashed, *launch])
    assert all(p.exists() and Path(f"{p}.lock").exists() for p in kept)
    assert all((tmp_path / name).exists() for name in ("tiny-job12.rank1-of-2.jsonl", "tiny-job15.jsonl",
                                                         "tiny-job13.rank0-of-2.jsonl.lock", "tiny-job16.jsonl"))


@pytest.mark.parametrize("source", ["$TREEBENCH_RUN_ID", "torchrun"])
def test_the_empty_file_of_a_crash_under_a_run_id_from_outside_goes_at_the_next_run(tiny, tmp_path, source):
    """A run without --out whose id comes from $TREEBENCH_RUN_ID, or from torchrun (two ranks, each
    writing a rank file), crashes before its first row: the next run of the suite without --out, under
    an id of its own, removes the empty default file it left, its lock and its ranks' leftovers."""
    crash = ["run", "--suite", str(tiny), "--backends", f"{FAULTS}:Segfaults", "--quiet"]
    if source == "torchrun":
        crash = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "treebench", *crash]
    else:
        crash = ["-m", "treebench", *crash]
    environ = {**env(), "TREEBENCH_RUN_ID": "job7"} if source != "torchrun" else env()
    done = subprocess.run([sys.executable, *crash], cwd=tmp_path, env=environ, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode != 0, done.stderr
    local = tmp_path / "results" / "local"
    (left,) = [p for p in local.glob("tiny-*.jsonl") if ".rank" not in p.name]
    run_id = left.name.removeprefix("tiny-").removesuffix(".jsonl")
    assert run_id == "job7" if source != "torchrun" else run_id.startswith("torchrun-")
    recorded = [p.read_text().splitlines()[1:] for p in local.glob(f"{left.stem}*.lock")]   # its and its ranks'
    assert left.read_text() == "" and [run_id] in recorded and all(r in ([run_id], []) for r in recorded), recorded
    again = treebench("run", "--suite", tiny, "--backends", f"{FAULTS}:Exact", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert f"removed {left.relative_to(tmp_path)}: the empty results file of a run of suite tiny that crashed " \
           "before its first row" in " ".join(again.stderr.split()), again.stderr
    (new,) = [p.name for p in local.iterdir() if not p.name.startswith("env-")]
    assert new.endswith(".jsonl") and run_id not in new


def test_a_backend_ending_the_process_without_isolate_ends_treebench_with_its_code_and_no_line(tiny, tmp_path):
    """The README's exit-code table: `os._exit(7)` in a backend outside --isolate is exit 7, nothing
    said on stderr (no handler runs); --isolate makes it an error row (tests/test_isolate.py)."""
    done = treebench("check", "--suite", tiny, "--backend", f"{FAULTS}:ExitsHard", "--quiet", cwd=tmp_path)
    assert (done.returncode, done.stderr.strip()) == (7, ""), done.stderr
    assert "| the backend's | a backend ended the process itself (`os._exit(n)`" in (ROOT / "README.md").read_text()


def stop_when_hung(argv, tmp_path: Path, signum: int) -> tuple[int, str]:
    """Runs `python -m treebench ARGV` with the Hangs backend, sends `signum` once its first pair
    hangs; (exit code, stderr)."""
    mark = tmp_path / "hang.pid"
    proc = subprocess.Popen([sys.executable, "-m", "treebench", *map(str, argv)], cwd=tmp_path,
                            env={**env(), "TREEBENCH_TEST_HANG_MARK": str(mark)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not mark.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def test_sigterm_in_the_first_pair_exits_143_and_leaves_the_results_file_as_it_was(tiny, tmp_path):
    out = tmp_path / "rows.jsonl"
    out.touch()                           # there before: kept; the first pair hangs, so this run wrote no row
    code, err = stop_when_hung(["check", "--suite", tiny, "--backend", f"{FAULTS}:Hangs", "--out", out, "--quiet"],
                               tmp_path, signal.SIGTERM)
    assert code == 143, err
    line = re.sub(r"env-\w+", "env-ID", err.strip().splitlines()[-1])
    assert line == (f"treebench: terminated (SIGTERM) before this run's first row; {out} is left as it was; the env "
                    f"file {tmp_path}/env-ID.json it had written beside it is removed"), line
    assert out.exists()


@pytest.mark.parametrize("argv", [["run", "--backends", f"{FAULTS}:Hangs", "--isolate", "--report", "r.html"],
                                  ["check", "--backend", f"{FAULTS}:Hangs"]])
def test_ctrl_c_before_the_first_row_removes_the_results_file_the_sweep_created(tiny, tmp_path, argv):
    """Ctrl-C while the first pair runs (in a worker under --isolate, or in the process): no row
    was written, so the --out file that the run or check created is removed, and the line says so."""
    out = tmp_path / "d" / "rows.jsonl"
    code, err = stop_when_hung([*argv, "--suite", tiny, "--out", out, "--quiet"], tmp_path, signal.SIGINT)
    assert code == 130, err
    line = re.sub(r"env-\w+", "env-ID", err.strip().splitlines()[-1])
    said = "the env file {}/env-{}.json it had written beside it is removed"
    assert line == (f"treebench: interrupted before any row was written: the empty results file {out} it had created "
                    f"is removed; {said.format(out.parent, 'ID')}"), line
    assert not out.exists() and not list(out.parent.glob("*.jsonl*")) and not list(out.parent.glob("env-*.json"))
    assert said.format("d", "<env_id>") in " ".join((ROOT / "README.md").read_text().split())   # the README says so


@pytest.mark.parametrize("argv, code", [
    (("list",), 141),                                                   # nothing decided: 128 + SIGPIPE
    (("check", "--suite", "{tiny}", "--backend", "torch_sdpa"), 0),     # the rows passed: still 0
])
def test_a_closed_stdout_keeps_the_exit_code_of_the_rows(tiny, tmp_path, argv, code):
    proc = subprocess.Popen([sys.executable, "-m", "treebench", *(a.format(tiny=tiny) for a in argv)], cwd=tmp_path,
                            env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()   # the reader is gone before the first line (`| head -0`)
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == code, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


GATE_RESULTS = ROOT / "tests" / "data" / "results"   # a baseline, a rerun of it, and a run 10% slower


@pytest.mark.parametrize("candidate, verdict", [("h200-rerun", 0), ("h200-slow10", 1)])
@pytest.mark.parametrize("closed", ["reader gone", "fd 1 closed"])
def test_a_gate_whose_stdout_is_closed_keeps_its_verdict(tmp_path, candidate, verdict, closed):
    """`treebench gate ... | head -0` or `... >&-` in CI: the Markdown summary has nowhere to go, but the exit
    code is still the verdict's (a regression never a pass, a pass never 141 or a traceback's 1), and
    nothing else is lost: --summary is written, and the counts reach stderr."""
    summary = tmp_path / "summary.md"
    argv = [sys.executable, "-m", "treebench", "gate", "--baseline", str(GATE_RESULTS / "h200-baseline"),
            "--candidate", str(GATE_RESULTS / candidate), "--summary", str(summary)]
    if closed == "reader gone":
        proc = subprocess.Popen(argv, cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        proc.stdout.close()   # the reader is gone before the summary is written (`| head -0`)
    else:                     # file descriptor 1 closed before the command starts (`>&-`)
        proc = subprocess.Popen(["sh", "-c", 'exec "$@" >&-', "sh", *argv], cwd=tmp_path, env=env(),
                                stderr=subprocess.PIPE, text=True)
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == verdict, err
    assert "Traceback" not in err and "Error" not in err, err
    assert len([line for line in err.splitlines() if line.startswith("INFO     gate: ")]) == 1, err
    assert summary.read_text(encoding="utf-8").startswith(f"## treebench gate: {'❌ FAIL' if verdict else '✅ PASS'}")


# `treebench selftest --device cpu` on two of its backends, the dense one and a mutant that scales the scores by
# 1/D, checked on one case (which kills the mutant) or on none (it survives): the command's own code path, its
# output and exit code, in seconds instead of the minutes of every shipped variant on the default check.
NARROWED_SELFTEST = """import functools, sys
import treebench.harness.selftest.power as power
from treebench.harness.cli.main import main
from treebench.harness.model.cases import Case
from treebench.harness.selftest.mutants_field import ALL_MUTANTS
from treebench.harness.selftest.dense import Dense

mutant = {m.name: m for m in ALL_MUTANTS}["broken_softmax_scale"]
cases = [Case(batch_size=1, context_len=10, tree="full:2:1", num_q_heads=2, num_kv_heads=1, head_dim=64)]
power.selftest = functools.partial(power.selftest, backends=(Dense, mutant),
                                   cases_for=lambda backend: cases[:int(sys.argv[1])])
sys.exit(main(["selftest", "--device", "cpu"]))
"""


@pytest.mark.parametrize("cases, verdict, said", [
    (1, 0, "the default check (1 case) kills 1 of 1 mutant; 1 of 1 correct variant pass"),
    (0, 1, "the default check (0 cases) kills 0 of 1 mutant; 1 of 1 correct variant pass; survivors: "
           "broken_softmax_scale (needs any case)"),
])
def test_a_selftest_whose_stdout_is_closed_runs_on_to_its_verdict(tmp_path, cases, verdict, said):
    """`treebench selftest | head -0`: the reader is gone before the first line; the selftest checks every
    backend all the same and exits with its verdict (0 when every mutant is killed and every correct
    variant passes), where it exited 1 at its first line whatever it would have found. Its summary, which
    had nowhere to go, reaches stderr led by the command."""
    proc = subprocess.Popen([sys.executable, "-c", NARROWED_SELFTEST, str(cases)], cwd=tmp_path, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()   # the reader is gone before the first line (`| head -0`)
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == verdict, err
    assert err.splitlines() == [f"INFO     selftest: {said}"], err


@pytest.mark.parametrize("argv", [("tree", "full:2:2"), ("tree", "random:1000:1", "--json"), ("list",)])
def test_a_stdout_closed_before_the_command_is_taken_as_devnull(tmp_path, argv):
    """`treebench tree SPEC >&-`: Python starts with no sys.stdout; the output is dropped as `>&-` asks and the
    command exits with its own code, where `emit` met None with an AttributeError's traceback."""
    done = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-m", "treebench", *argv], cwd=tmp_path,
                          env=env(), stderr=subprocess.PIPE, text=True, timeout=300, check=False)
    assert done.returncode == 0 and done.stderr == "", done.stderr


@pytest.mark.parametrize("spec", ["random:1000:1", "full:3:5"])
def test_a_reader_that_leaves_mid_output_gives_141(tmp_path, spec):
    """Output larger than a pipe buffer, read one line and closed (`treebench tree SPEC | head -1`):
    the write that finds the reader gone raises, so the command exits 141, not 0 with the rest
    dropped."""
    proc = subprocess.Popen([sys.executable, "-m", "treebench", "tree", spec], cwd=tmp_path, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


@pytest.mark.parametrize("argv", [("run", "--suite", "{tiny}", "--backends", "reference", "--out", "{out}", "--quiet"),
                                  ("check", "--suite", "{tiny}", "--backend", "reference", "--out", "{out}", "--quiet"),
                                  ("list",), ("tree", "full:2:2"), ("--version",), ("--help",), ("tree", "--help")])
def test_a_stdout_that_cannot_be_written_is_named_as_such(tiny, tmp_path, argv):
    """`> /dev/full`: one line naming standard output (not the results file, not "a file"), exit 2, as any
    failed write; a run or check whose rows are all in --out says so, with no --resume to suggest."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    out = tmp_path / "d" / "r.jsonl"
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "treebench", *(a.format(tiny=tiny, out=out) for a in argv)],
                              cwd=tmp_path, env=env(), stdout=full, stderr=subprocess.PIPE, text=True, timeout=300,
                              check=False)
    said = f"treebench: error: could not write standard output: {os.strerror(28)}"
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    if argv[0] in ("run", "check"):
        run_id = read_rows([out])[0]["run_id"]
        assert len(read_rows([out])) == 2 and proc.stderr.startswith(
            f"{said}; every row of this {argv[0]} is in {out}, run_id {run_id}: the results file is complete, only "
            "what was printed is lost"), proc.stderr
        assert "--resume" not in proc.stderr
    else:
        assert proc.stderr == said + "\n"


@pytest.mark.parametrize("command", ["run", "check"])
def test_a_resume_with_nothing_left_whose_stdout_cannot_be_written_names_the_run_of_its_rows(command, tiny, tmp_path):
    """`run --resume > /dev/full` (and check's) with every pair stored: the line names the run id of the rows in
    --out (the earlier run's, as the `run_id:` line it could not print does), not this run's fresh id, which holds
    no row."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    out = tmp_path / "r.jsonl"
    backend = ["--backends" if command == "run" else "--backend", "reference"]
    argv = [command, "--suite", tiny, *backend, "--out", out, "--quiet"]
    assert treebench(*argv, cwd=tmp_path).returncode == 0
    (run_id,) = {r["run_id"] for r in read_rows([out])}
    if command == "run":
        printed = treebench(*argv, "--resume", cwd=tmp_path)
        assert printed.returncode == 0 and f"run_id: {run_id}\n" in printed.stdout, printed.stdout
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "treebench", *map(str, argv), "--resume"], cwd=tmp_path,
                              env=env(), stdout=full, stderr=subprocess.PIPE, text=True, timeout=300, check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"; every row of this {command} is in {out}, run_id {run_id}: the results file is complete" in proc.stderr
    assert len(read_rows([out])) == 2


def test_a_merge_whose_stdout_cannot_be_written_says_whether_its_rows_went_in(tiny, tmp_path):
    """`merge OUT IN > /dev/full`: the line names standard output and says the rows were merged (or,
    merged again, that OUT is left as it was), as rm and report say what they did."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    rows, out = tmp_path / "in.jsonl", tmp_path / "m.jsonl"
    assert subprocess.run([sys.executable, "-m", "treebench", "run", "--suite", str(tiny), "--backends", "reference",
                           "--out", str(rows), "--quiet"], cwd=tmp_path, env=env(), capture_output=True,
                          timeout=300, check=False).returncode == 0
    said = f"treebench: error: could not write standard output: {os.strerror(28)}; "
    for then in (f"the rows were merged into {out}", f"merge OUT {out} was not written: the file already there is "
                 "left as it was"):
        with open("/dev/full", "w") as full:
            proc = subprocess.run([sys.executable, "-m", "treebench", "merge", str(out), str(rows)], cwd=tmp_path,
                                  env=env(), stdout=full, stderr=subprocess.PIPE, text=True, timeout=300, check=False)
        assert proc.returncode == 2 and proc.stderr == said + then + "\n", proc.stderr
    assert len(read_rows([out])) == 2


@pytest.mark.parametrize("errno_name", ["ENOSPC", "EIO"])
def test_a_failed_write_to_stdout_is_told_from_a_failed_write_to_a_file(monkeypatch, capsys, errno_name):
    """In the process: a stdout whose writes fail (a full disk under a redirect, an I/O error), through
    every way the commands print (a rich table, `emit`, the last flush, argparse's --help)."""
    import errno

    from treebench.harness.cli.main import main

    code = getattr(errno, errno_name)

    class Failing:
        def write(self, text):
            raise OSError(code, os.strerror(code))

        def flush(self):
            pass

        def isatty(self):
            return False

    for argv in (["list"], ["tree", "chain:2"], ["tree", "--help"], ["--help"]):
        monkeypatch.setattr(sys, "stdout", Failing())
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err == f"treebench: error: could not write standard output: {os.strerror(code)}\n", (argv, err)


def test_plain_console_writes_in_pieces_that_see_a_closed_reader(monkeypatch):
    """A rich table printed through `PlainConsole` reaches the stream in pieces of at most
    WRITE_CHUNK characters, each flushed, so a closed pipe raises on the next piece."""
    from rich.table import Table

    from treebench.harness.cli import WRITE_CHUNK
    from treebench.harness.cli.common import PlainConsole

    class Pipe:
        def __init__(self):
            self.writes, self.flushes = [], 0

        def write(self, text):
            if len(self.writes) == 2:
                raise BrokenPipeError(32, "closed")
            self.writes.append(text)
            return len(text)

        def flush(self):
            self.flushes += 1

        def isatty(self):
            return False

    pipe = Pipe()
    table = Table("row")
    for i in range(5000):
        table.add_row(f"{i:>8} " + "x" * 60)
    console = PlainConsole(file=pipe, width=100)
    with pytest.raises(BrokenPipeError):
        console.print(table)
    assert [len(w) for w in pipe.writes] == [WRITE_CHUNK, WRITE_CHUNK] and pipe.flushes == 2


def test_rm_and_merge_wait_for_the_run_writing_the_file(tiny, tmp_path):
    """`rm` and `merge` rewrite a results file: while another process holds its write lock they
    are refused in one line (exit 2) and the file is unchanged."""
    from treebench.harness.store.lock import hold

    out = tmp_path / "rows.jsonl"
    assert treebench("check", "--suite", tiny, "--backend", "torch_sdpa", "--out", out, "--quiet",
                     cwd=tmp_path).returncode == 0
    before = out.read_bytes()
    with hold(out):   # a run in the middle of appending to it
        done = treebench("rm", out, "--backend", "torch_sdpa", cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip() == (f"treebench: error: rm: results file {out} is being written by another "
                                       f"treebench process (pid {os.getpid()}); wait for it to finish, then remove the "
                                       "rows")
        other = tmp_path / "other.jsonl"
        other.write_bytes(before)
        done = treebench("merge", out, other, cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().startswith(f"treebench: error: merge: results file {out} is being written by ")
        assert done.stderr.strip().endswith("wait for it to finish or merge into another OUT"), done.stderr
        assert out.read_bytes() == before
    done = treebench("rm", out, "--backend", "torch_sdpa", cwd=tmp_path)
    assert done.returncode == 0 and out.read_text() == "", done.stderr


def test_version_names_the_distribution_version(tmp_path):
    from treebench.harness import __version__

    done = treebench("--version", cwd=ROOT)
    assert done.returncode == 0 and done.stdout.startswith(f"treebench {__version__}"), done.stderr
    if (ROOT / ".git").exists():
        assert " (git " in done.stdout


def test_a_second_writer_of_one_results_file_is_refused_and_writes_nothing(tiny, tmp_path):
    from treebench.harness.store.lock import hold, lock_path

    out = tmp_path / "rows.jsonl"
    out.write_text("")
    with hold(out):   # another treebench process in the middle of its run
        done = treebench("check", "--suite", tiny, "--backend", "torch_sdpa", "--out", out, cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip() == (f"treebench: error: results file {out} is being written by another treebench "
                                       f"process (pid {os.getpid()}); wait for it to finish or choose another --out")
        done = treebench("run", "--suite", tiny, "--backends", "torch_sdpa", "--out", out.name, cwd=tmp_path)
        assert done.returncode == 2, done.stderr     # run's refusal names --out as given
        assert done.stderr.strip() == (f"treebench: error: results file {out.name} is being written by another "
                                       f"treebench process (pid {os.getpid()}); wait for it to finish or choose "
                                       "another --out")
        assert out.read_text() == "" and not list(tmp_path.glob("env-*.json"))
    assert not lock_path(out).exists()
    done = treebench("check", "--suite", tiny, "--backend", "torch_sdpa", "--out", out, "--quiet", cwd=tmp_path)
    assert done.returncode == 0 and len(read_rows([out])) == 2 and not lock_path(out).exists(), done.stderr


def test_torchrun_ranks_lock_their_own_files_and_rank_0_the_merged_one(tmp_path):
    from treebench.harness.sweep.execute import SweepOptions, _written
    from treebench.harness.sweep.shard import Rank, rank_path

    out = tmp_path / "rows.jsonl"
    ranks = [Rank(r, 2, r) for r in range(2)]
    locked = [_written(SweepOptions(out=out), r) for r in ranks]
    assert locked == [[rank_path(out, ranks[0]), out], [rank_path(out, ranks[1])]]
    assert _written(SweepOptions(out=out), None) == [out] and _written(SweepOptions(), None) == []


def test_a_run_into_a_log_file_prints_plain_progress_lines(tiny, tmp_path):
    out = tmp_path / "rows.jsonl"
    done = treebench("run", "--suite", tiny, "--backends", "torch_sdpa", "--out", out, "--report", tmp_path / "r.html",
                     cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("[")]
    assert lines and lines[-1].startswith("[2/2] torch_sdpa on B2-L37-full:2:2-") and ", writing the report, about " in lines[-1]
    dry = treebench("run", "--suite", tiny, "--backends", "torch_sdpa", "--out", out, "--dry-run", cwd=tmp_path)
    said = " ".join(dry.stdout.split())
    assert (f"already stored in {out} for this env: 2 of the 2 pairs to run (they run again); add --resume to skip "
            "them") in said, said
    assert "estimated time: about " in dry.stdout


def test_plain_output_keeps_emoji_codes_and_long_lines(tmp_path):
    suite = tmp_path / "wide.toml"
    suite.write_text(TINY.replace('"full:2:2"', '"full:100:1"').replace(', "interleaved"', ""))
    done = treebench("check", "--suite", suite, "--backend", f"{ROOT / 'tests' / 'broken_backends.py'}:BrokenRootHidden",
                     "--quiet", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("mismatch: ")]
    assert "-full:100:1-same-" in line and "\U0001f4af" not in done.stdout        # no emoji for :100:
    assert line.endswith("of elements out of tolerance") and len(line) > 80        # one line, not wrapped
    listing = treebench("list", cwd=tmp_path).stdout
    assert "pip install -e '.[gpu]'" in listing and "treebench[gpu]" not in listing
def test_a_mismatching_pair_keeps_its_timing_but_the_summary_shows_none(tiny, tmp_path):
    """As in the report: a wrong answer's speed is not a result (the row keeps it)."""
    out = tmp_path / "rows.jsonl"
    done = treebench("run", "--suite", tiny, "--backends", f"{ROOT / 'tests' / 'broken_backends.py'}:BrokenRootHidden",
                     "--out", out, "--report", tmp_path / "r.html", "--quiet", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    rows = read_rows([out])
    assert [r["status"] for r in rows] == ["mismatch"] * 2 and all(r["median_us"] is not None for r in rows)
    table = [line for line in done.stdout.splitlines() if "broken_root_hidden" in line and "│" in line]
    assert table and table[0].rstrip(" │").endswith("-"), done.stdout


@pytest.mark.parametrize("command, backend", [("run", "--backends"), ("check", "--backend")])
def test_a_full_disk_is_one_line_exit_2_and_keeps_the_rows_written(tiny, tmp_path, monkeypatch, capsys, command,
                                                                    backend):
    """A write that finds no space (ENOSPC) mid-run: one line naming the file, the run_id of the
    rows written with the --resume and `rm --run-id` commands, exit 2; the rows before it stay
    readable."""
    import errno

    from treebench.harness.cli.main import main
    from treebench.harness.run import runner

    real, calls = runner.append_row, []

    def append_then_full(path, row, named=None):
        calls.append(row)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, row, named)

    monkeypatch.setattr(runner, "append_row", append_then_full)
    out = tmp_path / "r.jsonl"
    rc = main([command, "--suite", str(tiny), backend, "reference", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "Traceback" not in err[0], err
    (row,) = read_rows([out])
    assert err[0] == (f"treebench: error: could not write {out}: {os.strerror(errno.ENOSPC)}; rows already written "
                      f"are kept in {out}, run_id {row['run_id']}; free space, then run the same command with --out "
                      f"{out} --resume, or remove them with treebench rm {out} --run-id {row['run_id']}")


@pytest.mark.parametrize("command, backend", [("run", "--backends"), ("check", "--backend")])
@pytest.mark.parametrize("code", ["EIO", "EROFS"])
def test_a_failed_append_is_one_line_exit_2_and_keeps_the_rows_written(tiny, tmp_path, monkeypatch, capsys, command,
                                                                        backend, code):
    """Any OSError while a row is appended (an I/O error, a file system remounted read-only), not only a
    full disk: the row is cut off again, and the run ends as on a full disk, in one line naming the file
    and the error, exit 2, the rows before it intact; the fix it names is not to free space."""
    import errno

    from treebench.harness.cli.main import main
    from treebench.harness.store import torn

    real, calls = torn.fsync, []

    def fsync_then_fail(fd):
        calls.append(fd)
        if len(calls) > 1:   # the second row reached the file: the failed fsync must cut it off again
            raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)))
        real(fd)

    monkeypatch.setattr(torn, "fsync", fsync_then_fail)
    out = tmp_path / "r.jsonl"
    rc = main([command, "--suite", str(tiny), backend, "reference", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "Traceback" not in err[0], err
    (row,) = read_rows([out])
    assert out.read_bytes().count(b"\n") == 1
    assert err[0] == (f"treebench: error: could not write {out}: {os.strerror(getattr(errno, code))}; rows already "
                      f"written are kept in {out}, run_id {row['run_id']}; once {out} can be written, run the same "
                      f"command with --out {out} --resume, or remove them with treebench rm {out} --run-id "
                      f"{row['run_id']}")


def test_top_level_help_imports_no_torch():
    """`treebench --help` lists the subcommands without loading torch (a tenth of a second, not seconds)."""
    code = ("import sys\nfrom treebench.harness.cli.main import main\ntry:\n    main(['--help'])\n"
            "except SystemExit:\n    pass\nprint('torch loaded' if 'torch' in sys.modules else 'no torch')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.stdout.strip().endswith("no torch"), proc.stdout[-500:] + proc.stderr[-2000:]
    assert "run" in proc.stdout and "check" in proc.stdout


@pytest.mark.parametrize("argv", [[name, "--help"] for name in COMMANDS] + [["check", "-h"],
                                                                            ["run", "--suite", "smoke", "--help"]])
def test_a_subcommand_help_imports_no_torch(argv):
    """`treebench COMMAND --help` prints the command's usage, its defaults read, without loading torch."""
    code = ("import sys\nfrom treebench.harness.cli.main import main\n"
            f"code = main({argv!r})\nprint('torch loaded' if 'torch' in sys.modules else 'no torch', code)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.stdout.strip().endswith("no torch 0"), proc.stdout[-500:] + proc.stderr[-2000:]
    assert proc.stdout.startswith(f"usage: treebench {argv[0]} ") and not proc.stderr


def test_report_help_imports_no_pandas_or_matplotlib():
    """`treebench report --help` names the report's defaults (`analyze.roles`) without loading pandas
    or matplotlib, half a second of imports that only writing a report needs."""
    code = ("import sys\nfrom treebench.harness.cli.main import main\n"
            "code = main(['report', '--help'])\nprint(sorted({'pandas', 'matplotlib'} & set(sys.modules)), code)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.stdout.strip().endswith("[] 0"), proc.stdout[-500:] + proc.stderr[-2000:]
    assert "(default: first of flashinfer_mask, xformers_tree, torch_sdpa)" in " ".join(proc.stdout.split())


def test_gate_help_imports_no_numpy_pandas_or_torch():
    """`treebench gate --help` lists the gate's options without loading numpy (the statistics that
    `analyze.gate` compares samples with), pandas or torch: imports that only a comparison needs."""
    code = ("import sys\nfrom treebench.harness.cli.main import main\n"
            "code = main(['gate', '--help'])\nprint(sorted({'numpy', 'pandas', 'torch'} & set(sys.modules)), code)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.stdout.strip().endswith("[] 0"), proc.stdout[-500:] + proc.stderr[-2000:]
    assert "--min-samples" in proc.stdout and "--allow-env-mismatch" in proc.stdout
