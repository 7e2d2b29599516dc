"""Device-memory prediction: the arithmetic against real tensors, and the runner's skip path."""

from __future__ import annotations

import pytest
import torch

from treebench.harness.run import memory
from treebench.harness.model.cases import Case
from treebench.harness.run.memory import (TIMING_FLUSH_BYTES, fit_reason, format_bytes, inputs_bytes,
                                          predict_device_bytes, reference_bytes)
from treebench.harness.model.paged import build_inputs
from treebench.harness.run.config import RunConfig
from treebench.harness.run.runner import run_cases
from treebench.harness.timing.timers import FLUSH_BYTES

CASES = [Case(1, 16, "chain:3", 4, 1, 32, "float32", 8, "interleaved"),
         Case(3, "ragged:0-37", "full:2:2", 4, 2, 32, "bfloat16", 16, "shuffled"),
         Case(5, 232, "eagle:mc_sim_7b_63", 6, 3, 16, "float16", 128, "contiguous"),
         Case(2, 37, "random:9:4", 8, 8, 64, "bfloat16", 32, "shuffled", "mixed")]


class Workspace:
    """A backend that declares scratch memory through the optional hook."""

    name = "workspace"

    def __init__(self, nbytes):
        self.nbytes = nbytes

    def workspace_bytes(self, case):
        if isinstance(self.nbytes, Exception):
            raise self.nbytes
        return self.nbytes


class NoHook:
    name = "no_hook"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.case_id[:40])
def test_inputs_bytes_equal_the_tensors_build_inputs_makes(case):
    inputs = build_inputs(case, "cpu")
    tensors = [inputs.q, inputs.k_cache, inputs.v_cache, inputs.block_table, inputs.context_lens,
               inputs.seq_lens, inputs.qo_indptr, inputs.k_logical, inputs.v_logical]
    assert inputs_bytes(case) == sum(t.nbytes for t in tensors)


def test_reference_bytes_by_hand():
    # B=1, L=16, chain:3 -> T=4, S=20; Hq=4, Hkv=1, D=32
    case = CASES[0]
    t, s, hq, hkv, d = 4, 20, 4, 1, 32
    per_request = (t * hq * d + 2 * s * hkv * d + 2 * s * hq * d + 3 * hq * t * s) * 8 + t * s
    assert reference_bytes(case) == per_request + 2 * t * hq * d * 8


def test_reference_bytes_follow_the_largest_request():
    small, big = Case(4, 100, "chain:3", 4, 2, 32), Case(1, 100, "chain:3", 4, 2, 32)
    per_b = reference_bytes(big) - 2 * 4 * 4 * 32 * 8
    assert reference_bytes(small) == per_b + 2 * 16 * 4 * 32 * 8  # one request's peak, four requests' outputs


@pytest.mark.parametrize("device, mode, flush", [("cpu", "run", 0), ("cuda", "check", 0), ("cuda", "run", 1)])
def test_prediction_parts(device, mode, flush):
    case = CASES[1]
    out = sum(t.size for t in case.trees()) * 4 * 32 * 2                 # (sum T, Hq, D) bf16
    p = predict_device_bytes(case, Workspace(12345), device, mode)
    assert (p.output, p.workspace, p.timing) == (out, 12345, flush * TIMING_FLUSH_BYTES)
    assert p.total == p.inputs + p.reference + p.output + p.compare + p.timing + p.workspace
    assert predict_device_bytes(case, NoHook(), device, mode, determinism=True).output == 2 * out
    assert TIMING_FLUSH_BYTES == FLUSH_BYTES


def test_a_raising_workspace_hook_counts_zero_and_warns(caplog):
    assert predict_device_bytes(CASES[0], Workspace(RuntimeError("x"))).workspace == 0
    assert any("workspace_bytes raised RuntimeError" in m for m in caplog.messages)


def test_fit_reason(monkeypatch):
    case = CASES[2]
    need = predict_device_bytes(case, NoHook(), "cpu", "check").total
    monkeypatch.setattr(memory, "free_device_bytes", lambda device: need)
    assert fit_reason(case, NoHook(), "cpu", "check") is None
    monkeypatch.setattr(memory, "free_device_bytes", lambda device: need - 1)
    reason = fit_reason(case, NoHook(), "cpu", "check")
    assert reason.startswith(f"predicted {format_bytes(need)} > free {format_bytes(need - 1)} on cpu (inputs ")
    p = predict_device_bytes(case, NoHook(), "cpu", "check")
    assert fit_reason(case, NoHook(), "cpu", "check", inputs_built=True) is None    # built inputs count no more
    monkeypatch.setattr(memory, "free_device_bytes", lambda device: need - p.inputs - p.reference)
    assert fit_reason(case, NoHook(), "cpu", "check", inputs_built=True, reference_built=True) is None
    assert fit_reason(case, NoHook(), "cpu", "check", inputs_built=True) is not None
    monkeypatch.setattr(memory, "free_device_bytes", lambda device: None)        # unknown: no check
    assert fit_reason(case, Workspace(2**62), "cpu") is None


def test_meminfo(tmp_path, monkeypatch):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       16318412 kB\nMemFree:          393216 kB\nMemAvailable:    1048576 kB\n")
    monkeypatch.setattr(memory, "MEMINFO", f)
    assert memory.free_device_bytes("cpu") == 1048576 * 1024
    f.write_text("MemTotal:       16318412 kB\n")
    assert memory.free_device_bytes("cpu") is None
    monkeypatch.setattr(memory, "MEMINFO", tmp_path / "none")
    assert memory.free_device_bytes("cpu") is None
    assert memory.free_device_bytes("meta") is None


class Counting:
    """Exact answers; counts prepare() calls. Declares `scratch` bytes of workspace."""

    name = "counting"
    mask_kind = "tree"

    def __init__(self, scratch=0):
        self.scratch, self.prepared = scratch, 0

    def availability(self):
        return None

    def supports(self, case):
        return None

    def workspace_bytes(self, case):
        return self.scratch

    def prepare(self, inputs):
        from treebench.harness.model.reference import paged_reference_attention as reference_attention

        self.prepared += 1
        out = reference_attention(inputs).to(inputs.dtype)
        return lambda: out


def test_the_runner_skips_what_cannot_fit_and_runs_the_rest(monkeypatch):
    free = 64 * 2**20
    monkeypatch.setattr(memory, "free_device_bytes", lambda device: free)
    small, huge = Counting(), Counting(scratch=free)
    huge.name = "huge"
    rows = run_cases(CASES[:2], [small, huge], RunConfig(mode="check", quiet=True, device="cpu"))
    assert [(r["backend"], r["status"]) for r in rows] == [("counting", "pass"), ("huge", "skipped")] * 2
    assert all(r["reason"].startswith("predicted ") and "> free 64.0 MiB on cpu" in r["reason"]
               for r in rows if r["backend"] == "huge")
    assert (small.prepared, huge.prepared) == (4, 0)   # a check prepares twice: the case and its alternate
    rows = run_cases(CASES[:1], [huge], RunConfig(mode="check", quiet=True, device="cpu", check_memory=False))
    assert rows[0]["status"] == "pass" and huge.prepared == 2


def test_a_case_too_big_for_the_device_is_skipped_before_its_inputs_are_built(monkeypatch):
    from treebench.harness.run import pair

    def no_build(*a, **k):
        raise AssertionError("inputs built for a case that cannot fit")

    monkeypatch.setattr(pair, "build_inputs", no_build)
    monkeypatch.setattr(memory, "free_device_bytes", lambda device: 1000)
    (row,) = run_cases(CASES[2:3], [Counting()], RunConfig(mode="check", quiet=True, device="cpu"))
    assert row["status"] == "skipped" and " > free 1000 B on cpu" in row["reason"]


@pytest.mark.gpu
def test_free_device_bytes_on_cuda_counts_the_allocator_cache():
    free, _ = torch.cuda.mem_get_info()
    x = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    del x  # cached by PyTorch: not free for the driver, free for the next case
    assert memory.free_device_bytes("cuda") >= free - 2**20


@pytest.mark.parametrize("n, text", [(0, "0 B"), (1000, "1000 B"), (1536, "1.50 KiB"), (64 * 2**20, "64.0 MiB"),
                                     (232 * 2**30, "232 GiB"), (9 * 2**30 + 2**29, "9.50 GiB"), (9 * 2**60, "9.00 EiB")])
def test_format_bytes_picks_the_unit(n, text):
    assert format_bytes(n) == text


def test_a_huge_prediction_reads_in_its_own_unit(monkeypatch):
    """A prediction of exbibytes (a workspace hook returning nonsense) reads '9.00 EiB', not
    a byte count labelled GiB."""
    monkeypatch.setattr(memory, "free_device_bytes", lambda device: 16 * 2**30)
    reason = fit_reason(CASES[0], Counting(scratch=9 * 2**60), "cpu", "check")
    assert reason.startswith("predicted 9.00 EiB > free 16.0 GiB on cpu (inputs ") and "workspace 9.00 EiB)" in reason


def test_a_dry_run_counts_the_pairs_the_memory_prediction_will_skip(monkeypatch):
    """--dry-run predicts memory as the run does: the pairs it says will be skipped are the ones
    the run skips; with the check off none are."""
    from treebench.harness.sweep.execute import SweepOptions, execute
    free = 64 * 2**20
    monkeypatch.setattr(memory, "free_device_bytes", lambda device: free)
    small, huge = Counting(), Counting(scratch=free)
    huge.name = "huge"
    for check_memory, skipped in ((True, 2), (False, 0)):
        run = RunConfig(mode="check", quiet=True, device="cpu", check_memory=check_memory)
        plan = execute(CASES[:2], [small, huge], SweepOptions(run=run, dry_run=True))
        assert (plan.planned, plan.will_skip, plan.will_skip_memory) == (4, skipped, skipped)
        assert f"({4 - skipped} pairs, " in plan.estimate                # the time of the pairs that run
        assert small.prepared == huge.prepared == 0                      # a dry run prepares nothing
    rows = run_cases(CASES[:2], [small, huge], RunConfig(mode="check", quiet=True, device="cpu"))
    assert sum(r["status"] == "skipped" for r in rows) == 2
