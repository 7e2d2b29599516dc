"""--isolate: every fault a backend can have becomes an error row with its cause,
and the sweep goes on in a fresh worker when the old one is gone.

CPU only except the last test: the sticky illegal memory access needs a GPU
(tests/gpu_illegal_access.py); on the CPU it is imitated by a backend raising
the error text torch gives for it.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from treebench.harness.run import isolate
from treebench.harness.model.cases import Case
from treebench.harness.cli.main import main
from treebench.harness.run.loading import load_one
from treebench.harness.run.isolate import WorkerPool, backend_spec, describe_exit
from treebench.harness.run.config import MAX_WAIT_S, MIN_CASE_TIMEOUT_S, RunConfig, wait_s
from treebench.harness.run.runner import run_cases
from treebench.harness.store.rows import read_rows
from tests.tiny_suites import tiny_suite

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ROOT / "tests" / "fault_backends.py"
CASE = Case(2, "ragged:3-37", "full:2:2", 4, 2, 32, "bfloat16", 16, "shuffled")
CHECK = RunConfig(mode="check", quiet=True, device="cpu", run_id="r", env_id="e")
TIMEOUT_S = 4.0


def _fault(cls: str):
    return load_one(f"{FAULTS}:{cls}")


def test_a_pool_turns_each_fault_into_an_error_row_and_restarts_only_after_a_lost_worker():
    pool = WorkerPool("cpu", case_timeout_s=TIMEOUT_S)
    expect = [  # backend, status, words in the reason, workers started once its row is back
        ("Exact", "pass", None, 1),
        ("Raises", "error", "RuntimeError: kernel launch failed", 1),
        ("WrongShape", "error", "output shape (14, 3, 32)", 1),
        ("WrongDtype", "error", "output dtype torch.float64", 1),
        ("Hangs", "error", f"timed out after {TIMEOUT_S:g}s", 1),
        ("Exact", "pass", None, 2),
        ("ExitsHard", "error", "the worker died with exit code 7", 2),
        ("Segfaults", "error", f"the worker died with signal SIGSEGV (-{int(signal.SIGSEGV)})", 3),
        ("LosesContext", "error", "illegal memory access was encountered (CUDA context lost", 4),
        ("Exact", "pass", None, 5),
    ]
    try:
        for cls, status, words, started in expect:
            row = pool.run(_fault(cls), CASE, "cpu", CHECK)
            assert (row["status"], pool.started) == (status, started), (cls, row["reason"])
            assert words is None and row["reason"] is None or words in row["reason"]
            assert row["case_id"] == CASE.case_id and row["run_id"] == "r" and row["env"] == "e"
            assert row["timestamp"]
    finally:
        pool.close()
    assert pool._proc is None


def test_the_row_of_a_worker_that_died_or_timed_out_names_the_step_it_was_in():
    """A killed or timed-out worker's error row carries the step its pair was in (as the in-process row
    of an exception raised there would), or "worker died" / "worker timed out" where it had entered none
    (supports() here); a step of the pool's earlier pair is never taken for it."""
    run = RunConfig(mode="run", quiet=True, device="cpu", run_id="r", env_id="e")
    pool = WorkerPool("cpu", case_timeout_s=TIMEOUT_S)
    expect = [  # backend, config, failed_step
        ("Exact", CHECK, None),
        ("SegfaultsInSupports", CHECK, "worker died"),
        ("Exact", run, None),
        ("HangsInSupports", run, "worker timed out"),
        ("Hangs", CHECK, "first prepare"),
        ("Segfaults", run, "first prepare"),
        ("SegfaultsOnSecondPrepare", CHECK, "re-prepare"),
        ("HangsWhenTimed", run, "timing"),
    ]
    try:
        got = [(cls, pool.run(_fault(cls), CASE, "cpu", config)["failed_step"]) for cls, config, _ in expect]
    finally:
        pool.close()
    assert got == [(cls, step) for cls, _, step in expect]


def test_run_cases_isolated_keeps_going_and_appends_every_row(tmp_path):
    cases = [CASE, Case(1, 16, "chain:3", 4, 1, 32, "float32", 8, "interleaved")]
    out = tmp_path / "rows.jsonl"
    bks = [_fault("Raises"), _fault("WrongDtype"), _fault("Exact")]
    config = RunConfig(mode="check", quiet=True, device="cpu", store_path=out, isolate=True, case_timeout_s=60)
    rows = run_cases(cases, bks, config)
    assert [r["status"] for r in rows] == ["error", "error", "pass"] * 2
    assert [(r["case_id"], r["backend"]) for r in read_rows([out])] == [(r["case_id"], r["backend"]) for r in rows]


def test_cli_isolate_runs_and_times_in_the_worker(tmp_path):
    suite = tmp_path / "s.toml"
    suite.write_text("[axes]\nbatch_size = [1]\ncontext_len = [9]\ntree = ['full:2:1']\nnum_q_heads = [2]\n"
                     "num_kv_heads = [1]\nhead_dim = [16]\n")
    out = tmp_path / "rows.jsonl"
    rc = main(["run", "--suite", str(suite), "--backends", f"{FAULTS}:Exact,{FAULTS}:Raises", "--out", str(out),
               "--report", str(tmp_path / "r.html"), "--isolate", "--quiet"])
    assert rc == 1
    exact, raises = read_rows([out])
    assert exact["status"] == "pass" and exact["timer"] == "wall" and exact["median_us"] > 0
    assert raises["status"] == "error" and raises["reason"].startswith("RuntimeError: kernel launch failed")


def test_cli_isolate_times_in_the_worker_with_the_requested_timer(tmp_path):
    """--timer reaches the worker: on the CPU the worker's wall timer says which CUDA timer it
    could not use (and that it flushed nothing)."""
    suite = tmp_path / "s.toml"
    suite.write_text("[axes]\nbatch_size = [1]\ncontext_len = [9]\ntree = ['chain:2']\nnum_q_heads = [2]\n"
                     "num_kv_heads = [1]\nhead_dim = [16]\n")
    out = tmp_path / "rows.jsonl"
    assert main(["run", "--suite", str(suite), "--backends", f"{FAULTS}:Exact", "--out", str(out), "--report",
                 str(tmp_path / "r.html"), "--isolate", "--timer", "host_inclusive", "--l2", "warm", "--quiet"]) == 0
    (row,) = read_rows([out])
    assert (row["status"], row["timer"], row["l2_flushed"]) == ("pass", "wall", False)
    assert "'host_inclusive' needs a CUDA device" in row["timer_fallback"]


def test_a_workers_task_carries_the_timer_and_l2_state(monkeypatch):
    sent = []
    monkeypatch.setattr(WorkerPool, "_send", lambda self, payload: sent.append(pickle.loads(payload)))
    monkeypatch.setattr(WorkerPool, "_answer", lambda self, name, case, config: {"status": "pass"})
    config = RunConfig(mode="run", device="cpu", timing_mode="cuda_event", flush_l2=False, store_path=Path("r.jsonl"))
    assert WorkerPool("cpu").run(_fault("Exact"), CASE, "cpu", config) == {"status": "pass"}
    ((task),) = sent
    assert (task.config.timing_mode, task.config.flush_l2, task.config.store_path) == ("cuda_event", False, None)


@pytest.mark.gpu
@pytest.mark.parametrize("l2, flushed", [("cold", True), ("warm", False)])
def test_cli_isolate_on_a_gpu_times_with_the_requested_l2_state(tmp_path, l2, flushed):
    out = tmp_path / "rows.jsonl"
    suite = tmp_path / "s.toml"
    suite.write_text("[axes]\nbatch_size = [2]\ncontext_len = [300]\ntree = ['full:2:2']\nnum_q_heads = [4]\n"
                     "num_kv_heads = [2]\nhead_dim = [64]\n")
    assert main(["run", "--suite", str(suite), "--backends", "torch_sdpa", "--out", str(out), "--report",
                 str(tmp_path / "r.html"), "--isolate", "--l2", l2, "--timer", "cuda_event", "--quiet"]) == 0
    (row,) = read_rows([out])
    assert (row["timer"], row["timer_fallback"], row["l2_flushed"]) == ("cuda_event", None, flushed)


def test_an_unavailable_backend_is_skipped_without_a_worker(monkeypatch):
    def no_pool(*a, **k):
        raise AssertionError("a worker was asked for")

    monkeypatch.setattr(WorkerPool, "run", no_pool)
    b = _fault("Exact")
    b.availability = lambda: "needs a CUDA GPU"
    (row,) = run_cases([CASE], [b], RunConfig(mode="check", quiet=True, device="cpu", isolate=True))
    assert (row["status"], row["reason"]) == ("skipped", "needs a CUDA GPU")


class _Unpicklable:
    name = "unpicklable"

    def __init__(self):
        self.fn = lambda: None  # a lambda cannot be pickled

    def availability(self):
        return None

    def supports(self, case):
        return None

    def prepare(self, inputs):
        raise AssertionError


def test_a_backend_that_cannot_reach_a_worker_is_an_error_row_and_no_worker_starts():
    pool = WorkerPool("cpu")
    row = pool.run(_Unpicklable(), CASE, "cpu", CHECK)
    assert row["status"] == "error" and row["backend"] == "unpicklable"
    assert "cannot send the backend to a worker" in row["reason"] and "path/file.py:Class" in row["reason"]
    assert pool.started == 0


def test_backend_spec_prefers_the_loaded_spec_then_the_registry_name():
    import treebench.backends  # noqa: F401
    from treebench.harness.adapter.contract import REGISTRY

    assert backend_spec(_fault("Exact")) == f"{FAULTS}:Exact"
    assert backend_spec(REGISTRY["torch_sdpa"]()) == "torch_sdpa"
    odd = _Unpicklable()
    assert backend_spec(odd) is odd


@pytest.mark.parametrize("code, words", [(7, "exit code 7"), (-signal.SIGKILL, "signal SIGKILL (-9)"),
                                         (-signal.SIGSEGV, f"signal SIGSEGV (-{int(signal.SIGSEGV)})"),
                                         (None, "an unknown exit status"), (-250, "signal 250")])
def test_describe_exit(code, words):
    assert describe_exit(code) == words


@pytest.mark.parametrize("reason, lost", [
    ("RuntimeError: CUDA error: an illegal memory access was encountered", True),
    ("RuntimeError: Triton Error [CUDA]: an illegal memory access was encountered", True),
    ("RuntimeError: CUDA error: unspecified launch failure", True),
    ("RuntimeError: CUDA error: device-side assert triggered", True),
    ("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", False),
    ("ValueError: output shape (3, 4) != expected", False),
])
def test_context_lost_reads_sticky_cuda_errors(reason, lost):
    import torch

    assert isolate.context_lost({"status": "error", "reason": reason}, torch.device("cpu")) is lost
    assert isolate.context_lost({"status": "pass", "reason": reason}, torch.device("cpu")) is False


@pytest.mark.parametrize("limit_s", [0.5, 37.0, MAX_WAIT_S, MAX_WAIT_S + 1, 99999999.0, 1e10, 1e308])
def test_wait_s_gives_multiprocessing_a_timeout_it_takes(limit_s):
    """Past MAX_WAIT_S (poll()'s int32 milliseconds) wait() raises OverflowError, or ValueError once the
    milliseconds are infinite: wait_s makes such a limit no limit (None), and keeps every other one."""
    a, b = multiprocessing.Pipe()
    b.send("ready")
    assert multiprocessing.connection.wait([a], wait_s(limit_s)) == [a]
    assert wait_s(limit_s) == (None if limit_s > MAX_WAIT_S else limit_s) and wait_s(None) is None


@pytest.mark.parametrize("argv", [
    ["check", "--case-timeout", "2147484", "--backend", f"{FAULTS}:Exact"],
    ["check", "--case-timeout", "1e308", "--backend", f"{FAULTS}:Exact"],
    ["check", "--case-timeout", "1e999", "--backend", f"{FAULTS}:Exact"],   # float() reads inf: no limit likewise
    ["check", "--case-timeout", "99999999999999999999", "--backend", f"{FAULTS}:Exact"],
    ["run", "--case-timeout", "99999999", "--backends", f"torch_sdpa,{FAULTS}:Exact"],
])
def test_a_case_timeout_past_the_longest_wait_is_no_limit(argv, tmp_path):
    """A huge --case-timeout says "no limit": the prober and the workers wait without one (no overflow)."""
    (tmp_path / "tiny.toml").write_text(tiny_suite())
    out = tmp_path / "rows.jsonl"
    report = ["--report", str(tmp_path / "r.html")] if argv[0] == "run" else []
    assert main([*argv, "--suite", str(tmp_path / "tiny.toml"), "--out", str(out), *report, "--quiet"]) == 0
    assert {r["status"] for r in read_rows([out])} == {"pass"}


def test_the_docs_and_help_name_the_longest_wait(capsys):
    longest = f"past {MAX_WAIT_S:.0f} s"
    for doc in ("README.md", "docs/architecture.md"):
        assert longest in (ROOT / doc).read_text(encoding="utf-8"), doc
    assert main(["check", "--help"]) == 0
    assert " ".join(capsys.readouterr().out.split()).count(longest) == 2   # --case-timeout and --merge-timeout


@pytest.mark.parametrize("option", ["--case-timeout", "--merge-timeout"])
def test_an_infinite_timeout_is_refused_naming_the_number_that_means_no_limit(option, capsys):
    assert main(["check", option, "inf", "--backend", f"{FAULTS}:Exact"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'inf' is not a positive number of seconds" in err
    assert f"any past {MAX_WAIT_S:.0f} is no limit" in err, err


def test_a_zero_case_timeout_is_refused():
    with pytest.raises(ValueError, match="case_timeout_s"):
        run_cases([CASE], [_fault("Exact")], RunConfig(mode="check", quiet=True, isolate=True, case_timeout_s=0))


@pytest.mark.parametrize("seconds", [1e-9, 0.5, MIN_CASE_TIMEOUT_S - 1e-9])
def test_a_case_timeout_under_the_least_is_refused_by_the_run_config(seconds):
    """A limit the harness's own work on a pair would use up times every pair out: RunConfig refuses it."""
    with pytest.raises(ValueError, match=r"case_timeout_s=.*: must be at least MIN_CASE_TIMEOUT_S = 1 seconds"):
        RunConfig(mode="check", isolate=True, case_timeout_s=seconds)
    assert RunConfig(mode="check", isolate=True, case_timeout_s=MIN_CASE_TIMEOUT_S).case_timeout_s == MIN_CASE_TIMEOUT_S


@pytest.mark.parametrize("text", ["1e-9", "0.001", "0.5", "0.999"])
@pytest.mark.parametrize("command", ["run", "check"])
def test_a_case_timeout_too_small_to_run_a_pair_is_one_line_before_anything_runs(text, command, tmp_path, capsys):
    """`--case-timeout 1e-9` ran every pair into its limit: it is refused in one line naming the option and
    the least limit, exit 2, and nothing is written."""
    (tmp_path / "tiny.toml").write_text(tiny_suite())
    out = tmp_path / "rows.jsonl"
    backend = ["--backends", "torch_sdpa", "--report", str(tmp_path / "r.html")] if command == "run" else \
        ["--backend", "torch_sdpa"]
    rc = main([command, "--case-timeout", text, "--suite", str(tmp_path / "tiny.toml"), "--out", str(out), *backend])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert (f"argument --case-timeout: '{text}' is under the least case time limit, {MIN_CASE_TIMEOUT_S:g} s: the "
            "harness's own work on a pair counts in it" in err), err
    assert not out.exists() and not (tmp_path / "r.html").exists()


def test_the_least_case_timeout_is_taken_and_the_help_says_it(capsys):
    from treebench.harness.cli import case_timeout

    assert case_timeout(f"{MIN_CASE_TIMEOUT_S:g}") == MIN_CASE_TIMEOUT_S and case_timeout("600") == 600
    for command in ("run", "check"):
        assert main([command, "--help"]) == 0
        assert f"at least {MIN_CASE_TIMEOUT_S:g} s, as the harness's own work on a pair counts in it" in \
            " ".join(capsys.readouterr().out.split())


def _dead(pid: int) -> bool:
    """True when `pid` is gone or a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_hung_worker_dies_with_a_sigkilled_sweep(tmp_path):
    """No orphan: a worker stuck in a hung kernel must not outlive its killed parent (it could hold a GPU)."""
    mark = tmp_path / "hanging.pid"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TREEBENCH_TEST_HANG_MARK": str(mark)}
    cmd = [sys.executable, "-m", "treebench", "check", "--suite", "check", "--backend", f"{FAULTS}:Hangs",
           "--isolate", "--quiet"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not mark.exists() or not mark.read_text():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        worker = int(mark.read_text())
        assert worker != proc.pid and not _dead(worker)
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while not _dead(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _dead(worker)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.gpu
def test_a_sticky_illegal_memory_access_is_an_error_row_and_the_next_case_runs(tmp_path):
    """A Triton kernel storing far out of bounds poisons its CUDA context; under --isolate the
    row names the fault and the next pairs (same case, next case) run in a fresh worker."""
    triton = pytest.importorskip("triton")  # noqa: F841
    suite = tmp_path / "s.toml"
    suite.write_text("[axes]\nbatch_size = [1, 2]\ncontext_len = [40]\ntree = ['full:2:2']\nnum_q_heads = [4]\n"
                     "num_kv_heads = [2]\nhead_dim = [64]\ndtype = ['bfloat16']\npage_size = [16]\n")
    out = tmp_path / "rows.jsonl"
    bad = ROOT / "tests" / "gpu_illegal_access.py"
    rc = main(["check", "--suite", str(suite), "--backend", f"{bad}:IllegalAccess", "--out", str(out),
               "--case-timeout", "300", "--quiet"])
    assert rc == 1
    rows = read_rows([out])
    assert [r["status"] for r in rows] == ["error", "error"]
    assert all("illegal memory access" in r["reason"] and "CUDA context lost" in r["reason"] for r in rows)
    rc = main(["run", "--suite", str(suite), "--backends", f"{bad}:IllegalAccess,torch_sdpa", "--out", str(out),
               "--report", str(tmp_path / "r.html"), "--isolate", "--quiet"])
    rows = read_rows([out])[2:]
    assert [(r["backend"], r["status"]) for r in rows] == [("illegal_access", "error"), ("torch_sdpa", "pass")] * 2
    assert all(r["median_us"] > 0 for r in rows if r["backend"] == "torch_sdpa")
