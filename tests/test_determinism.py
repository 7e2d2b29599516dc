"""--determinism: each pair's prepared callable runs twice and the outputs are
compared bit for bit; a nondeterministic backend keeps its status but gets a
reason, `deterministic: false`, a summary line and exit code 1."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from treebench.harness.checking.default_check import FAILED_STEPS
from treebench.harness.model.cases import Case
from treebench.harness.cli.main import main
from treebench.harness.run.loading import load_one
from treebench.harness.run.verify import NONDETERMINISM_HINT, bitwise_diff_count
from treebench.harness.run.config import RunConfig
from treebench.harness.run.runner import run_cases
from treebench.harness.store.rows import read_rows

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ROOT / "tests" / "fault_backends.py"
CASES = [Case(2, "ragged:3-37", "full:2:2", 4, 2, 32, "bfloat16", 16, "shuffled"),
         Case(1, 16, "chain:3", 4, 1, 32, "float32", 8, "interleaved"),
         Case(3, 5, "full:3:1", 2, 2, 16, "float16", 16, "contiguous")]


def _rows(names, determinism=True, mode="check"):
    bks = [load_one(f"{FAULTS}:{n}") for n in names]
    return run_cases(CASES, bks, RunConfig(mode=mode, quiet=True, device="cpu", determinism=determinism))


def test_deterministic_backends_are_marked_so():
    rows = _rows(["Exact", "PersistentBuffer"])
    assert [(r["status"], r["deterministic"], r["reason"]) for r in rows] == [("pass", True, None)] * 6


def test_a_nondeterministic_backend_is_caught_even_through_one_reused_buffer():
    rows = _rows(["Nondeterministic"], mode="run")
    for r in rows:
        assert r["status"] == "pass" and r["deterministic"] is False   # within tolerance, yet not reproducible
        assert r["reason"].startswith("nondeterministic: 1 of ") and "differ bitwise between two calls" in r["reason"]
        assert r["reason"].endswith(f"; {NONDETERMINISM_HINT}")                # the opt-out it has not taken
        assert r["median_us"] > 0


def test_the_hint_to_declare_nondeterminism_ends_a_checks_repeat_reason_only_where_undeclared():
    rows = _rows(["Nondeterministic"], determinism=False)
    assert all(r["status"] == "mismatch" and r["reason"].endswith("between two calls; declare `deterministic = False` "
                                                                   "on the backend if its calls may differ in the last "
                                                                   "bits (atomics, split-K order)") for r in rows)
    declared = [load_one(f"{ROOT / 'tests' / 'coverage_faults.py'}:DeclaredNondeterministic")]
    for mode in ("check", "run"):
        rows = run_cases(CASES[:1], declared, RunConfig(mode=mode, quiet=True, device="cpu", determinism=True))
        assert rows[0]["status"] == "pass" and NONDETERMINISM_HINT not in rows[0]["reason"]


def test_a_check_always_repeats_and_re_prepares():
    calls = []

    class Once:
        name, mask_kind = "once", "tree"

        def availability(self):
            return None

        def supports(self, case):
            return None

        def prepare(self, inputs):
            from treebench.harness.model.reference import paged_reference_attention as reference_attention

            out = reference_attention(inputs).to(inputs.dtype)
            return lambda: calls.append(1) or out

    rows = run_cases(CASES[:1], [Once()], RunConfig(mode="check", quiet=True, device="cpu"))
    assert rows[0]["deterministic"] is True and len(calls) == 6   # two prepares, three calls each
    rows = run_cases(CASES[:1], [Once()], RunConfig(mode="check", quiet=True, device="cpu", determinism=True))
    assert rows[0]["deterministic"] is True and len(calls) == 12


def test_a_mismatch_keeps_its_reason_and_adds_the_nondeterminism():
    class WrongAndNoisy:
        name, mask_kind = "wrong_and_noisy", "tree"

        def availability(self):
            return None

        def supports(self, case):
            return None

        def prepare(self, inputs):
            return lambda: torch.randn(inputs.q.shape).to(inputs.dtype)

    (row,) = run_cases(CASES[:1], [WrongAndNoisy()], RunConfig(mode="check", quiet=True, determinism=True))
    assert row["status"] == "mismatch" and row["deterministic"] is False
    assert row["reason"].startswith("first prepare: max_abs_err ") and "; repeat: " in row["reason"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_bitwise_diff_count(dtype):
    a = torch.tensor([0.0, 1.5, float("nan"), -2.0, float("inf")], dtype=dtype)
    assert bitwise_diff_count(a, a.clone()) == 0                         # NaN == NaN bit for bit
    b = a.clone()
    b[0] = -0.0                                                          # equal as numbers, not as bits
    b[3] = torch.nextafter(b[3:4], torch.zeros(1, dtype=dtype))[0]      # one ulp towards 0
    assert bitwise_diff_count(a, b) == 2
    assert bitwise_diff_count(a[::2], b[::2]) == 1                       # strided views


def test_cli_determinism_exit_codes_and_summary(tmp_path, capsys):
    suite = tmp_path / "s.toml"
    suite.write_text("[axes]\nbatch_size = [1, 2]\ncontext_len = [9]\ntree = ['full:2:1']\nnum_q_heads = [2]\n"
                     "num_kv_heads = [1]\nhead_dim = [16]\n")
    out = tmp_path / "rows.jsonl"
    base = ["check", "--suite", str(suite), "--out", str(out), "--quiet", "--determinism", "--backend"]
    assert main(base + [f"{FAULTS}:PersistentBuffer"]) == 0
    assert main(base + [f"{FAULTS}:Nondeterministic"]) == 1
    assert "nondeterministic: nondeterministic on 2 cases" in capsys.readouterr().out
    # a check always calls twice: an undeclared nondeterministic backend fails it even without --determinism
    assert main(["check", "--suite", str(suite), "--quiet", "--backend", f"{FAULTS}:Nondeterministic"]) == 1
    assert [r["deterministic"] for r in read_rows([out])] == [True, True, False, False]


def test_the_re_prepare_twin_keeps_every_shape_and_changes_the_trees():
    from treebench.harness.run.pair import CaseData

    for per_request in ("same", "mixed"):
        case = Case(batch_size=3, context_len=9, tree="full:2:2", tree_per_request=per_request,
                    num_q_heads=2, num_kv_heads=1, head_dim=16)
        twin = CaseData(case).alternate()
        trees, other = case.trees(), twin.trees
        assert [t.size for t in other] == [t.size for t in trees]
        assert all(a.parents != b.parents for a, b in zip(trees, other) if a.size > 2)
        assert (len({t.parents for t in other}) == 1) == (per_request == "same")
        assert twin.case.seed != case.seed and CaseData(case).alternate().trees == other   # drawn from the seed


class _DriftsAfter:
    """Right for its first `right` calls, then 1.0 added to every output element."""
    name, mask_kind = "drifts", "tree"

    def __init__(self, right):
        self.right = right

    def availability(self):
        return None

    def supports(self, case):
        return None

    def prepare(self, inputs):
        from treebench.harness.model.reference import paged_reference_attention

        out, calls = paged_reference_attention(inputs).to(inputs.dtype), [0]

        def run():
            calls[0] += 1
            return out if calls[0] <= self.right else out + 1
        return run


def test_a_check_catches_an_answer_that_changes_on_the_third_call():
    (row,) = run_cases(CASES[:1], [_DriftsAfter(2)], RunConfig(mode="check", quiet=True, device="cpu"))
    assert row["status"] == "mismatch" and "differ bitwise between calls 1 and 3" in row["reason"], row["reason"]
    (row,) = run_cases(CASES[:1], [_DriftsAfter(3)], RunConfig(mode="check", quiet=True, device="cpu"))
    assert row["status"] == "pass"          # what three calls cannot see: the run's timed calls below can


def test_a_run_compares_once_more_after_the_timed_calls():
    (row,) = run_cases(CASES[:1], [_DriftsAfter(3)], RunConfig(mode="run", quiet=True, device="cpu"))
    assert row["status"] == "mismatch" and row["reason"].startswith("after the timed calls: "), row["reason"]
    assert row["median_us"] > 0
    (row,) = run_cases(CASES[:1], [_DriftsAfter(10**9)], RunConfig(mode="run", quiet=True, device="cpu"))
    assert row["status"] == "pass" and row["reason"] is None


class _FailsAfter(_DriftsAfter):
    """Right for its first `right` calls, then `how`: "drift" (1.0 added), "raise" (a RuntimeError) or
    "mutate" (the right output, its queries zeroed after); "prepare" raises in prepare itself."""

    def __init__(self, right, how):
        super().__init__(right)
        self.how = how

    def prepare(self, inputs):
        if self.how == "prepare":
            raise RuntimeError("no plan")
        run, calls = super().prepare(inputs), [0]

        def call():
            calls[0] += 1
            if calls[0] <= self.right or self.how == "drift":
                return run()
            if self.how == "raise":
                raise RuntimeError("launch failed")
            out = run()
            inputs.q.zero_()
            return out
        return call


@pytest.mark.parametrize("right, how, status, step", [
    (10**9, "drift", "pass", None),
    (0, "prepare", "error", "first prepare"),
    (0, "drift", "mismatch", "first prepare"),     # wrong from the first call: found before timing, timed all the same
    (3, "drift", "mismatch", "timing"),            # right until the timed calls
    (1, "raise", "error", "timing"),
    (0, "raise", "error", "first prepare"),
    (1, "mutate", "error", "timing"),
])
def test_a_run_row_names_the_step_its_failure_was_found_in(right, how, status, step):
    (row,) = run_cases(CASES[:1], [_FailsAfter(right, how)], RunConfig(mode="run", quiet=True, device="cpu"))
    assert (row["status"], row["failed_step"]) == (status, step), row["reason"]
    assert step is None or step in FAILED_STEPS
    assert (row["reason"] or "").startswith("while timing: ") == (how == "raise" and step == "timing")
