"""--threads of run, check and selftest: the torch intra-op threads of a pair's correctness work
(inputs, reference, prepare, the calls compared, the comparisons), 1 on the CPU by default unless
OMP_NUM_THREADS is set; the timed calls keep the wall timer's CPU_TIMING_THREADS."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from treebench.harness.cli.main import main
from treebench.harness.run import pair
from treebench.harness.cli import thread_count
from treebench.harness.run.config import CPU_CHECK_THREADS, MAX_THREADS, RunConfig, check_threads
from treebench.harness.timing.wall import CPU_TIMING_THREADS

from tests.cli_errors import one_line_error
from tests.tiny_suites import tiny_suite

SEEN_BACKEND = '''
import torch

from tests.fault_backends import Exact


def note(step):
    """Appends "STEP THREADS" (torch's intra-op threads now) to the file the test reads."""
    with open({path!r}, "a") as f:
        f.write(f"{{step}} {{torch.get_num_threads()}}\\n")


class Seen(Exact):
    """Correct (the float64 reference in the case dtype); notes the threads at prepare and at each call."""

    name = "seen"

    def prepare(self, inputs):
        note("prepare")
        out = self.answer(inputs)

        def call():
            note("call")
            return out.clone()
        return call
'''


@pytest.fixture
def seen(tmp_path, monkeypatch):
    """(the backend's --backend spec, a function returning [(step, threads)] noted so far: the backend's
    prepare and calls, and the harness's "reference" computations). torch's threads are set to 2 first
    (so that 1 is a choice, not the count of a 1-core machine) and restored after."""
    path = tmp_path / "seen.txt"
    backend = tmp_path / "seen.py"
    backend.write_text(SEEN_BACKEND.format(path=str(path)))
    real = pair.reference_attention

    def reference(*args, **kwargs):
        with open(path, "a") as f:
            f.write(f"reference {torch.get_num_threads()}\n")
        return real(*args, **kwargs)
    monkeypatch.setattr(pair, "reference_attention", reference)
    monkeypatch.chdir(tmp_path)   # run's report and default results go here
    (tmp_path / "tiny.toml").write_text(tiny_suite())
    before = torch.get_num_threads()
    torch.set_num_threads(2)

    def noted() -> list[tuple[str, int]]:
        return [(step, int(n)) for step, n in (line.split() for line in path.read_text().splitlines())]
    yield f"{backend}:Seen", noted
    torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 3])
def test_check_threads_reach_torch_in_every_step_and_are_restored_after(seen, threads, monkeypatch):
    spec, noted = seen
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert main(["check", "--suite", "tiny.toml", "--backend", spec, "--threads", str(threads), "--quiet"]) == 0
    steps = noted()
    assert {step for step, _ in steps} == {"reference", "prepare", "call"}   # re-prepare and repeat calls too
    assert {n for _, n in steps} == {threads}, steps
    assert torch.get_num_threads() == 2


def test_check_takes_one_thread_by_default_on_the_cpu(seen, monkeypatch):
    spec, noted = seen
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert main(["check", "--suite", "tiny.toml", "--backend", spec, "--quiet"]) == 0
    assert {n for _, n in noted()} == {CPU_CHECK_THREADS} == {1}
    assert torch.get_num_threads() == 2


def test_check_keeps_torchs_count_where_omp_num_threads_is_set(seen, monkeypatch):
    """OMP_NUM_THREADS is the user's choice (torch read it at start-up; here the count the fixture set
    stands for it): the default leaves torch's count as it is."""
    spec, noted = seen
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert main(["check", "--suite", "tiny.toml", "--backend", spec, "--quiet"]) == 0
    assert {n for _, n in noted()} == {2}


def test_run_threads_reach_the_correctness_work_and_the_timed_calls_keep_the_timers(seen, tmp_path):
    spec, noted = seen
    assert main(["run", "--suite", "tiny.toml", "--backends", spec, "--threads", "3", "--out",
                 str(tmp_path / "out.jsonl"), "--quiet"]) == 0
    steps = noted()
    calls = [n for step, n in steps if step == "call"]
    assert [n for step, n in steps if step != "call"] == [3, 3]   # the reference, then prepare
    assert calls[0] == calls[-1] == 3   # the call compared first, and the one compared after the timed calls
    assert set(calls[1:-1]) == {CPU_TIMING_THREADS}, calls
    assert torch.get_num_threads() == 2


def test_selftest_threads_reach_its_check(seen, monkeypatch):
    """The selftest's check (one correct variant on one case here) runs under `threads`; the CLI passes
    --threads, and 1 on the CPU without it."""
    from treebench.harness.model.cases import Case
    from treebench.harness.selftest import power
    from treebench.harness.selftest.variants import CORRECT

    _, noted = seen
    case = Case(batch_size=1, context_len=8, tree="chain:2", num_q_heads=2, num_kv_heads=1, head_dim=16,
                dtype="float32")
    [outcome] = power.selftest(backends=CORRECT[:1], cases_for=lambda b: [case], device="cpu", threads=3)
    assert not outcome.failed_check and {n for _, n in noted()} == {3}
    asked: dict = {}
    monkeypatch.setattr(power, "selftest", lambda **kwargs: asked.update(kwargs) or [])
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for argv, want in ((["--threads", "5"], 5), ([], 1)):
        assert main(["selftest", "--device", "cpu", *argv]) == 0
        assert asked["threads"] == want


@pytest.mark.parametrize("command", [["check", "--backend", "torch_sdpa"], ["run"], ["selftest"]])
@pytest.mark.parametrize("value", ["0", "-1", "x", "2.5"])
def test_bad_thread_counts_are_refused_in_one_line(command, value, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([*command, "--threads", value]) == 2
    assert (f"argument --threads: {value!r} is not a thread count; give an integer >= 1" in one_line_error(capsys))
    assert not any(Path(tmp_path).iterdir())   # nothing written


@pytest.mark.parametrize("command", [["check", "--backend", "torch_sdpa", "--dry-run"], ["run", "--dry-run"],
                                     ["selftest"]])
@pytest.mark.parametrize("value", [str(MAX_THREADS + 1), "100000", "99999999999999999999"])
def test_thread_counts_past_the_most_taken_are_refused_in_one_line(command, value, tmp_path, monkeypatch, capsys):
    """100000 threads crashed the float64 reference (SIGSEGV) and a count past a C long long errored every pair:
    both are refused before anything runs, dry runs too, and MAX_THREADS itself is taken."""
    monkeypatch.chdir(tmp_path)
    assert main([*command, "--threads", value]) == 2
    assert (f"argument --threads: {value!r} is more than {MAX_THREADS} threads, the most taken"
            in one_line_error(capsys))
    assert not any(Path(tmp_path).iterdir())   # nothing written
    assert thread_count(str(MAX_THREADS)) == MAX_THREADS


def test_the_default_applies_on_the_cpu_alone_and_the_config_refuses_bad_counts(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert (check_threads(None, "cpu"), check_threads(None, "cuda"), check_threads(4, "cuda")) == (1, None, 4)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert (check_threads(None, "cpu"), check_threads(2, "cpu")) == (None, 2)
    for bad in (0, -1, 2.0, MAX_THREADS + 1, 10**20):
        with pytest.raises(ValueError, match="threads="):
            RunConfig(threads=bad)
    assert RunConfig(threads=MAX_THREADS).threads == MAX_THREADS
