"""`treebench selftest`: the check kills every shipped mutant it has the coverage for, passes
every correct variant, and each mutant it cannot kill yet is killed by a case on the axis it
names (so it is a real bug, not an equivalent mutant, and the new default suite can kill it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from treebench.harness.model.cases import Case
from treebench.harness.model.compare import compare
from treebench.harness.model.paged import build_inputs
from treebench.harness.model.reference import reference_attention
from treebench.harness.selftest.mutants import AXES, CLASSIC
from treebench.harness.selftest.mutants_field import ALL_MUTANTS
from treebench.harness.selftest.power import selftest
from treebench.harness.selftest.variants import CORRECT

from tests import broken_backends

ROOT = Path(__file__).resolve().parent.parent

BY_NAME = {cls.name: cls for cls in ALL_MUTANTS}
SMALL = {"num_q_heads": 2, "num_kv_heads": 1, "head_dim": 64}
WITNESSES = {  # axis -> cases on that axis (run in order on one instance) that kill its mutant
    "mask words": [Case(batch_size=1, context_len=5, tree="chain:40", **SMALL)],
    "page size": [Case(batch_size=2, context_len=100, tree="full:2:1", page_size=64, **SMALL),
                  Case(batch_size=2, context_len=25, tree="full:2:2", page_size=24, **SMALL)],
    "G = 1": [Case(batch_size=2, context_len=20, tree="full:2:1", num_q_heads=2, num_kv_heads=2, head_dim=64)],
    # outputs average ~L values of N(0, 1), so they are ~1/sqrt(L) and bf16's atol hides a wrong
    # denominator until L is large: at 8192 a 40% error still passes
    "long context": [Case(batch_size=1, context_len=32768, tree="chain:1", num_q_heads=1, num_kv_heads=1,
                          head_dim=64)],
    "context 0": [Case(batch_size=2, context_len=0, tree="full:2:1", **SMALL)],
    "shape coincidences": [Case(batch_size=1, context_len=10, tree="full:3:1", num_q_heads=4, num_kv_heads=2,
                                head_dim=64)],
    "re-prepare": [Case(batch_size=2, context_len=10, tree="full:2:2", **SMALL),
                   Case(batch_size=2, context_len=10, tree="chain:6", **SMALL)],   # same (B, sum T_b)
    "repeat": [Case(batch_size=1, context_len=10, tree="full:2:1", **SMALL)],      # with determinism
}


@pytest.fixture(scope="module")
def outcomes():
    return {o.name: o for o in selftest(device="cpu", threads=1)}   # as `treebench selftest` runs on the CPU


def test_the_table_names_shipped_mutants_and_their_axes():
    assert {cls.axis for cls in ALL_MUTANTS} <= set(AXES)
    assert len({cls.name for cls in (*ALL_MUTANTS, *CORRECT)}) == len(ALL_MUTANTS) + len(CORRECT)
    assert all(cls.description and "\n" not in cls.description for cls in (*ALL_MUTANTS, *CORRECT))
    assert all(cls.upstream for cls in ALL_MUTANTS if cls.name.startswith("field_"))


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_the_default_check_kills_the_mutant(outcomes, name):
    assert outcomes[name].failed_check, f"{name} ({BY_NAME[name].description}) survived the default check"


def test_a_weaker_check_leaves_survivors_and_says_which():
    """The measure can fail: the base case alone (no axis varied) kills the classic faults but
    not the mutants that need an axis, and those are reported as survivors."""
    base = [Case(batch_size=2, context_len=17, tree="full:2:2", **SMALL)]
    found = {o.name: o for o in selftest(ALL_MUTANTS, cases_for=lambda b: base, device="cpu")}
    assert not found["mutant_mask_word_32"].failed_check and not found["mutant_page64_offset"].failed_check
    assert found["broken_causal_mask"].failed_check


def test_a_mask_kept_by_batch_shape_is_a_wrong_answer_on_the_re_prepare():
    """The re-prepare twin keeps B, L_b and T_b and gives each request another tree of its size, so a
    mask cached by batch shape (FlashInfer PR #1028) gives a wrong output there, not a shape error,
    with a shared tree as with per-request trees."""
    for per_request in ("same", "mixed"):
        case = Case(batch_size=2, context_len=17, tree="full:2:2", tree_per_request=per_request, **SMALL)
        (found,) = selftest([BY_NAME["field_stale_mask"]], cases_for=lambda b: [case], device="cpu")
        assert found.failed_check and ": mismatch: re-prepare on a second batch" in found.evidence, found.evidence


@pytest.mark.parametrize("name", [cls.name for cls in CORRECT])
def test_the_default_check_passes_the_correct_variant(outcomes, name):
    assert not outcomes[name].failed_check, outcomes[name].evidence


def test_the_classic_mutants_are_the_ones_tests_load_by_path():
    assert broken_backends.BROKEN == CLASSIC and len(CLASSIC) == 11


@pytest.mark.parametrize("axis", sorted(WITNESSES))
def test_a_case_on_the_axis_kills_the_survivor_and_passes_the_variants(axis):
    listed = [cls for cls in ALL_MUTANTS if cls.axis == axis]
    found = {o.name: o for o in selftest((*listed, *CORRECT), cases_for=lambda b: WITNESSES[axis],
                                         determinism=axis == "repeat", device="cpu")}
    for cls in listed:
        assert found[cls.name].failed_check, f"{cls.name} survives its own axis {axis!r}"
    assert not [o.evidence for o in found.values() if not o.mutant and o.failed_check]


def test_large_logits_kill_the_unsubtracted_softmax_and_pass_the_variants():
    inputs = build_inputs(Case(batch_size=2, context_len=30, tree="full:2:2", **SMALL))
    inputs.q = inputs.q * 64                                   # scores ~ N(0, 64²): past exp's float32 range
    ref = reference_attention(inputs)

    def passes(cls) -> bool:
        out = cls().prepare(inputs)()
        out = out[0] if getattr(cls, "returns_lse", False) else out      # (out, lse): the output part here
        return compare(out, ref, inputs.qo_indptr, "bfloat16").passed

    assert not passes(BY_NAME["mutant_no_max_subtraction"])
    assert all(passes(cls) for cls in CORRECT)
    assert torch.isfinite(ref).all()


def test_the_readme_counts_the_shipped_variants():
    readme = (ROOT / "README.md").read_text()
    assert (f"kills all {len(ALL_MUTANTS)} shipped broken" in readme
            and f"passes {len(CORRECT)} correct ones" in readme.replace("\n", " "))


def _replayed(monkeypatch, found) -> dict:
    """Makes `treebench selftest`'s selftest call hand `found` (Outcomes) to its on_outcome and return
    them; returns the keyword arguments the CLI passed (filled in when it runs)."""
    from treebench.harness.selftest import power

    asked: dict = {}

    def replay(**kwargs):
        asked.update(kwargs)
        for o in found:
            kwargs["on_outcome"](o)
        return list(found)
    monkeypatch.setattr(power, "selftest", replay)
    return asked


def test_selftest_cli_kills_every_mutant_and_exits_0(outcomes, monkeypatch, capsys):
    """`treebench selftest --device cpu` makes the module fixture's call (every shipped backend, the
    default check, cpu, no determinism, one torch thread: the CPU's default) and prints its outcomes:
    one line per backend, then the summary; exit 0. The outcomes are the fixture's, replayed, not a
    second full selftest: that one ran in a subprocess for minutes and ran past its 600 s limit where
    several test processes shared two cores."""
    from treebench.harness.cli.main import main

    asked = _replayed(monkeypatch, outcomes.values())
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert main(["selftest", "--device", "cpu"]) == 0
    assert {k: v for k, v in asked.items() if k != "on_outcome"} == {"determinism": False, "device": "cpu",
                                                                     "threads": 1}
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(ALL_MUTANTS) + len(CORRECT) + 1          # one line per backend, then the summary
    assert not any(line.startswith("SURVIVED") for line in lines)
    assert f"kills {len(ALL_MUTANTS)} of {len(ALL_MUTANTS)}" in lines[-1]


def test_selftest_cli_names_a_survivor_and_exits_1(outcomes, monkeypatch, capsys):
    from dataclasses import replace

    from treebench.harness.cli.main import main

    found = [replace(o, failed_check=False, evidence="") if o.name == "mutant_mask_word_32" else o
             for o in outcomes.values()]
    _replayed(monkeypatch, found)
    assert main(["selftest", "--device", "cpu"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines if line.startswith("SURVIVED")] == [["SURVIVED", "mutant_mask_word_32"]]
    assert lines[-1].endswith("; survivors: mutant_mask_word_32 (needs mask words)"), lines[-1]


@pytest.mark.parametrize("status", ["error", "mismatch"])
def test_kills_are_not_the_checks_power_where_the_correct_variants_fail_too(status, monkeypatch, capsys):
    """A check that fails every correct variant (a mismatch on each), or errors on one rather than finds it
    wrong (a --threads torch could not take errored every pair), kills every mutant without telling one from a
    correct backend: the summary says its kills are no evidence, never "kills N of N" as its power; exit 1."""
    from treebench.harness.cli.main import main
    from treebench.harness.selftest import power

    def every_pair_fails(backend, case, *args):
        return {"case_id": case.case_id, "status": status, "reason": "ValueError: Overflow"}
    monkeypatch.setattr(power, "run_case_backend", every_pair_fails)
    case = Case(batch_size=1, context_len=8, tree="chain:2", num_q_heads=2, num_kv_heads=1, head_dim=16)
    found = power.selftest(backends=(*CORRECT[:2], *ALL_MUTANTS[:3]), cases_for=lambda b: [case], device="cpu")
    assert all(o.failed_check and o.errored == (status == "error") for o in found)
    _replayed(monkeypatch, found)
    assert main(["selftest", "--device", "cpu"]) == 1
    summary = capsys.readouterr().out.splitlines()[-1]
    assert "kills 3 of 3" not in summary
    assert summary.startswith(f"treebench selftest: the default check (1 case) "
                              f"{'errored on' if status == 'error' else 'failed'} correct variants: its kills (3 of 3 "
                              "mutants) are no evidence of its power, since correct variants fail too; 0 of 2 correct "
                              "variants pass"), summary
