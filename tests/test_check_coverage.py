"""The default check: built from a backend's capabilities, its coverage record and table,
the new case axes, and the repeat / re-prepare / backend-view steps that a pass needs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import treebench.backends  # noqa: F401  (registers the built-in adapters)
from treebench.harness.adapter.contract import REGISTRY, Capabilities
from treebench.harness.checking.default_check import default_check, default_check_cases, tree_spec
from treebench.harness.cli.main import main
from treebench.harness.errors import ConfigError
from treebench.harness.model.cases import Case
from treebench.harness.model.coverage import coverage_from_rows, coverage_lines
from treebench.harness.model.paged import build_inputs
from treebench.harness.model.reference import paged_reference_attention, reference_attention
from treebench.harness.model.suites import load_suite
from treebench.harness.model.tree_specs import parse_tree
from treebench.harness.store.rows import read_rows
from tests import coverage_faults

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ROOT / "tests" / "coverage_faults.py"


class Caps:
    """A backend of given capabilities (nothing runs)."""

    def __init__(self, **caps):
        self.capabilities = Capabilities(**caps)


def _check(spec: str, tmp_path: Path, *extra: str) -> tuple[int, list[dict]]:
    out = tmp_path / "rows.jsonl"
    rc = main(["check", "--backend", spec, "--out", str(out), "--quiet", *extra])
    return rc, read_rows([out])


@pytest.mark.parametrize("t", [1, 2, 7, 31, 32, 33, 63, 64, 65, 127, 128, 129, 256, 257, 513])
def test_tree_specs_hit_t_exactly(t):
    assert parse_tree(tree_spec(t)).size == t


def test_a_dense_backend_gets_every_axis_with_nothing_skipped():
    cases, cov = default_check_cases(REGISTRY["torch_sdpa"]())
    assert len(cases) == len({c.case_id for c in cases}) < 60
    assert {"31", "32", "33", "63", "64", "65", "127", "128", "129", "256"} <= set(cov["tree_size"]["ran"])
    assert cov["page_size"]["ran"] == ["1", "16", "24", "64", "128", "256"]
    assert set(cov["dtype"]["ran"]) == {"bfloat16", "float16", "float32"}
    assert {"1", "2", "4"} <= set(cov["group_size"]["ran"])
    assert {"0", "1", "15", "16", "17"} <= set(cov["context_len"]["ran"])
    assert cov["shape"]["ran"] == ["Hq=T", "B=T", "T=P", "G=T"]
    assert cov["num_kv_heads"]["ran"] == ["1", "2", "3", "8"] and cov["batch_size"]["ran"] == ["2", "11", "33"]
    assert cov["sm_scale"]["ran"] == ["1/sqrt(D)", "0.3"]
    assert all(not e["skipped"] for a, e in cov.items() if a != "device")
    sizes = {c.trees()[0].size for c in cases}
    assert {31, 32, 33, 63, 64, 65, 127, 128, 129, 256} <= sizes


def test_an_fp16_only_backend_gets_every_fp8_format_in_range():
    """e5m2 codes at the check's scales (0.25, 0.5) fall below float16's smallest normal, so an fp16-only
    backend's e5m2 case takes bf16 queries (a skip with its reason) instead of breaking the check."""
    cases, cov = default_check_cases(Caps(dtypes=("float16",), kv_dtypes=("float8_e4m3fn", "float8_e5m2")))
    fp8 = {c.kv_dtype: c.dtype for c in cases if c.kv_fp8}
    assert fp8 == {"float8_e4m3fn": "float16", "float8_e5m2": "bfloat16"}
    assert "float8_e5m2" in cov["kv_dtype"]["skipped"] and "float8_e4m3fn" in cov["kv_dtype"]["ran"]


def test_capabilities_become_skipped_values_with_reasons():
    d = default_check(Caps(dtypes=("bfloat16",), page_size_multiple=16, head_dims=(64, 128), group_sizes=(1, 4),
                           max_tree_size=64, per_request_trees=False, ragged_context=False))
    cov = d.coverage
    assert cov["tree_size"]["ran"][-1] == "64" and "exceeds the backend's maximum 64" in cov["tree_size"]["skipped"]["65"]
    assert "127" not in cov["tree_size"]["skipped"]                 # only the first size past the maximum
    assert set(cov["page_size"]["skipped"]) == {"1", "24"} and "multiple of 16" in cov["page_size"]["skipped"]["1"]
    assert "256" in cov["head_dim"]["skipped"] and "2" in cov["group_size"]["skipped"]
    assert "per-request trees" in cov["tree_per_request"]["skipped"]["mixed"]
    assert all("ragged" in why for v, why in cov["context_len"]["skipped"].items())
    big = next(c for c in d.cases if c.batch_size == 33)            # past 32 requests at uniform contexts
    assert "33" in cov["batch_size"]["ran"] and not big.is_ragged and big.num_kv_heads == 1
    assert "0" in cov["context_len"]["ran"]                         # uniform contexts still run
    base = next(c for c in d.cases if d.check_axes[c.case_id].get("values") == "random")
    assert (base.group_size, base.dtype, base.page_size) == (1, "bfloat16", 16)   # inside the capabilities


@pytest.mark.parametrize("axis, mutant", [("num_kv_heads", "mutant_kv_head_clamped"),
                                           ("batch_size", "mutant_batch_cut_at_8"),
                                           ("batch_size", "mutant_batch_cut_at_32"),
                                           ("sm_scale", "mutant_fixed_sm_scale")])
def test_the_axis_kills_the_mutant_that_the_base_case_passes(axis, mutant):
    """Hkv 3 and 8, B 11 and 33 and sm_scale 0.3 each kill a kernel right on the base case (Hkv 2, B 2,
    1/sqrt(D)): the KV head clamped to 1, requests from 8 (or 32) on dropped, inputs.sm_scale ignored."""
    from treebench.harness.selftest.dense import Dense
    from treebench.harness.selftest.mutants_field import ALL_MUTANTS
    from treebench.harness.selftest.power import selftest

    d = default_check(Dense())
    base = [c for c in d.cases if d.check_axes[c.case_id].get("values") == "random"]
    on_axis = [c for c in d.cases if axis in d.check_axes[c.case_id] and c not in base]
    cls = next(m for m in ALL_MUTANTS if m.name == mutant)
    (on_base,), (caught, dense) = (selftest(b, cases_for=lambda _, cs=cs: cs, device="cpu")
                                   for b, cs in (([cls], base), ([cls, Dense], on_axis)))
    assert not on_base.failed_check and caught.failed_check and not dense.failed_check, dense.evidence
    assert axis != "num_kv_heads" or "-H6x3-" in caught.evidence, caught.evidence   # Hkv 1 passes, 3 fails
    assert mutant != "mutant_batch_cut_at_32" or caught.evidence.startswith("B33-"), caught.evidence   # B 11 passes


def test_deep_adds_values():
    shallow, deep = (default_check_cases(REGISTRY["torch_sdpa"](), deep=d) for d in (False, True))
    assert len(deep[0]) > len(shallow[0])
    assert {"8", "24", "32"} <= set(deep[1]["page_size"]["ran"]) and "512" in deep[1]["tree_size"]["ran"]


def test_per_request_context_list():
    c = Case(batch_size=3, context_len="list:0,16,17", tree="chain:2", num_q_heads=2, num_kv_heads=1, head_dim=16)
    assert c.context_lens() == [0, 16, 17] and c.is_ragged
    assert build_inputs(c).seq_lens.tolist() == [3, 19, 20]
    for bad, msg in [("list:1,2", "2 context lengths for batch_size=3"), ("list:a,b,c", "write list:L0,L1"),
                     ("list:0,-1,2", "in \\[0, 2\\*\\*24\\]")]:
        with pytest.raises(ConfigError, match=msg):
            Case(batch_size=3, context_len=bad, tree="chain:2")


def test_new_axes_keep_old_case_ids():
    c = Case(batch_size=32, context_len="ragged:1-60", tree="full:2:2", num_q_heads=8, num_kv_heads=2, head_dim=64,
             dtype="bfloat16", page_size=16, layout="shuffled")
    assert c.case_id == load_suite("check").cases[0].case_id
    assert "logit_scale" not in c.axes and "values" not in c.axes
    scaled = Case(**{**c.axes, "logit_scale": 1000})
    assert scaled.case_id != c.case_id and "logit1000-" in scaled.case_id
    assert Case(**scaled.axes) == scaled and Case(**{**c.axes, "logit_scale": 1000.0}).case_id == scaled.case_id
    with pytest.raises(ConfigError, match="logit_scale"):
        Case(**{**c.axes, "logit_scale": float("inf")})
    with pytest.raises(ConfigError, match="values"):
        Case(**{**c.axes, "values": "ones"})


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_large_logits_are_finite_and_reach_1e3(dtype):
    c = Case(batch_size=2, context_len=17, tree="full:2:2", num_q_heads=4, num_kv_heads=2, head_dim=64,
             dtype=dtype, logit_scale=1000)
    inputs = build_inputs(c)
    q, k = inputs.q[:7].double(), inputs.k_logical[:24, 0].double()
    top = float((q @ k.T * inputs.sm_scale).abs().max())
    assert 1e3 <= top <= 1e4 and torch.isfinite(inputs.q).all()
    assert torch.isfinite(reference_attention(inputs)).all()


def test_position_values_spell_position_and_head():
    c = Case(batch_size=1, context_len=5, tree="chain:1", num_q_heads=2, num_kv_heads=2, head_dim=16,
             values="position")
    v = build_inputs(c).v_logical.float()                          # (S, Hkv, D)
    assert torch.equal(v[3, 0, :2], torch.tensor([1.0, 1.0])) and v[3, 0, 2] == -1.0   # 3 = 0b011
    assert torch.equal(v[:, 1].abs(), torch.full_like(v[:, 1], 1.5))                  # head 1: magnitude 1.5


def test_paged_reference_reads_the_pool_and_agrees():
    c = Case(batch_size=3, context_len="ragged:0-40", tree="full:2:2", num_q_heads=4, num_kv_heads=2, head_dim=32)
    inputs = build_inputs(c)
    assert torch.equal(paged_reference_attention(inputs.for_backend()), reference_attention(inputs))


def test_the_backend_view_has_no_reference_fields():
    view = build_inputs(Case(batch_size=1, context_len=3, tree="chain:1")).for_backend()
    for name in ("k_logical", "v_logical", "kv_indptr"):
        with pytest.raises(AttributeError, match=f"inputs.{name} is reference-only"):
            getattr(view, name)
    assert view.page_size == 16 and view.host_lists() == ([3], [2], [5])


@pytest.mark.parametrize("cls, step, failed_step",
                         [(coverage_faults.CachesFirstBlockTable, "re-prepare", "re-prepare"),
                          (coverage_faults.DriftsBetweenCalls, "repeat", "repeat"),
                          (coverage_faults.RaisesOnSecondPrepare, "stale plan", "re-prepare"),
                          (coverage_faults.ReadsLogicalKV, "k_logical is reference-only", "first prepare")],
                         ids=lambda x: getattr(x, "__name__", x))
def test_the_check_fails_each_fault_naming_the_step(cls, step, failed_step, tmp_path):
    rc, rows = _check(f"{FAULTS}:{cls.__name__}", tmp_path)
    assert rc == 1
    assert rows[0]["status"] in ("mismatch", "error") and step in rows[0]["reason"], rows[0]["reason"]
    assert rows[0]["failed_step"] == failed_step


def _coverage_out(capsys) -> str:
    out = capsys.readouterr().out
    return out[out.index("coverage ("):]


def test_a_backend_failing_only_on_the_second_batch_fails_the_re_prepare_step(tmp_path, capsys):
    """Every case's first batch passes (prepare, compare, repeat) and its second prepare raises:
    every row that ran says re-prepare, and the table counts them as reaching that step."""
    rc, rows = _check(f"{FAULTS}:RaisesOnSecondPrepare", tmp_path)
    ran = [r for r in rows if r["status"] != "skipped"]
    assert rc == 1 and ran and {r["status"] for r in ran} == {"error"}
    assert {r["failed_step"] for r in ran} == {"re-prepare"} and all(r["deterministic"] is True for r in ran)
    assert all(r["failed_step"] is None for r in rows if r["status"] == "skipped")
    lines = _coverage_out(capsys).splitlines()
    n = len(ran)
    assert any(ln.split()[:2] == ["re-prepare", "ran"] and ln.endswith(f"passed on 0, failed on {n} of {n} cases")
               for ln in lines), lines
    assert any(ln.split()[:2] == ["repeat", "ran"] and ln.endswith(f"bitwise equal on all {n} cases")
               for ln in lines), lines
    # every value's first batch was compared: it ran, its re-prepare failure named below it; none errored
    assert not any(ln.split()[:1] == ["errored"] for ln in lines), lines
    page = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["page_size", "ran"])
    assert lines[page].split()[2:] == ["1,", "16,", "24,", "64,", "128,", "256"], lines[page]
    assert lines[page + 1].split()[:4] == ["re-prepare", "errored", "on", "all"], lines[page + 1]
    cov = coverage_from_rows(rows)
    assert cov["page_size"]["reprepare_errored"] == cov["page_size"]["ran"] and "errored" not in cov["page_size"]
    assert main(["report", str(tmp_path / "rows.jsonl"), "-o", str(tmp_path / "r.html")]) == 0
    assert "re-prepare errored (first batch compared, second batch raised) on: 1, 16, 24" in (
        tmp_path / "r.html").read_text()


def test_a_backend_failing_only_on_repeat_fails_the_repeat_step(tmp_path, capsys):
    """Every case's first call is right and the later ones drift: every row that ran says repeat,
    none reached the second batch, so the table has a repeat line and no re-prepare line."""
    rc, rows = _check(f"{FAULTS}:DriftsBetweenCalls", tmp_path)
    ran = [r for r in rows if r["status"] != "skipped"]
    assert rc == 1 and ran and {r["status"] for r in ran} == {"mismatch"}
    assert {r["failed_step"] for r in ran} == {"repeat"} and all(r["deterministic"] is False for r in ran)
    assert all(r["reason"].startswith("first prepare: repeat: ") for r in ran)   # the first call passed
    lines = _coverage_out(capsys).splitlines()
    n = len(ran)
    assert not any(ln.split()[:1] == ["re-prepare"] for ln in lines), lines
    assert any(ln.split()[:2] == ["repeat", "ran"] and ln.endswith(f"bitwise equal on 0, bitwise different on {n} "
                                                                   f"of {n} cases") for ln in lines), lines


def test_a_declared_nondeterministic_backend_passes_and_says_so(tmp_path):
    rc, rows = _check(f"{FAULTS}:DeclaredNondeterministic", tmp_path)
    assert rc == 0 and {r["status"] for r in rows} == {"pass"}
    assert all(r["deterministic"] is False and "declared nondeterministic" in r["reason"] for r in rows)


def test_a_correct_backend_passes_and_the_table_is_printed(tmp_path, capsys):
    rc, rows = _check("tests/broken_backends.py:Correct", tmp_path)
    assert rc == 0 and {r["status"] for r in rows} == {"pass"}
    assert all(r["deterministic"] is True and r["check_axes"] for r in rows)
    out = capsys.readouterr().out
    assert "coverage (values that ran" in out and "tree_size" in out and "skipped cuda" in out
    cov = coverage_from_rows(rows)
    assert "129" in cov["tree_size"]["ran"] and "position" in cov["values"]["ran"]


def test_coverage_from_rows_reads_skips_and_a_suite_check_has_no_table(tmp_path, capsys):
    rows = [{"status": "pass", "check_axes": {"page_size": "16"}},
            {"status": "skipped", "reason": "page size 1 is not a multiple of 16", "check_axes": {"page_size": "1"}}]
    cov = coverage_from_rows(rows)
    assert cov == {"page_size": {"ran": ["16"], "skipped": {"1": "page size 1 is not a multiple of 16"}}}
    assert coverage_lines(cov)[-1].strip() == "skipped 1: page size 1 is not a multiple of 16"
    assert json.loads(json.dumps(cov)) == cov
    rc, rows = _check("torch_sdpa", tmp_path, "--suite", "check")
    assert rc == 0 and all(r["check_axes"] is None for r in rows)
    assert "coverage (" not in capsys.readouterr().out
    assert main(["check", "--backend", "torch_sdpa", "--suite", "check", "--deep"]) == 2


def _variant(tmp_path, cls: str, method: str, body: str):
    """A backend file: tests.broken_backends.Correct as class `cls` (name its lower case) with one
    method replaced by a one-line body."""
    spec = tmp_path / f"{cls.lower()}.py"
    spec.write_text(f"from tests.broken_backends import Correct\n\n\nclass {cls}(Correct):\n"
                    f"    name = '{cls.lower()}'\n\n    def {method}:\n        {body}\n")
    return spec


def test_a_check_where_no_case_ran_shows_no_axis_as_ran(tmp_path, capsys):
    """An unavailable backend: every case is skipped, and the axes no row names (the device,
    the second prepare, the repeated calls) read as skipped too, not as ran."""
    spec = _variant(tmp_path, "Away", "availability(self)", "return 'needs a machine this is not'")
    rc, rows = _check(f"{spec}:Away", tmp_path)
    assert rc == 3 and rows and {r["status"] for r in rows} == {"skipped"}
    captured = capsys.readouterr()
    assert "coverage (" not in captured.out                      # one reason for every case: said once
    assert (captured.out + captured.err).count("needs a machine this is not") == 1, captured
    assert main(["check", "--backend", f"{spec}:Away", "--dry-run"]) == 3
    plan = capsys.readouterr().out
    assert " would be skipped (backend unavailable" in plan and "recorded" not in plan, plan
    cov = coverage_from_rows(rows, base=default_check(Caps()).coverage)
    ran = [e["ran"] for e in cov.values()]
    assert ran and not any(ran) and cov["device"]["skipped"]["cpu"].startswith("no case ran")
    cov = coverage_from_rows(rows + [{"status": "pass", "check_axes": {"page_size": "16"}}],
                             base={"device": {"ran": ["cpu"], "skipped": {}}})
    assert cov["device"] == {"ran": ["cpu"], "skipped": {}}       # one case ran: the device's value stands


@pytest.mark.parametrize("extra, title", [((), "the default check"), (("--deep",), "the deep default check"),
                                          (("--suite", "check"), "suite check")])
def test_the_dry_run_names_the_suite_and_backend_as_the_check_does(tmp_path, capsys, extra, title):
    """The default check is no suite that --suite takes: the dry run and the check's own summary both
    call it the default check, as --help does; a suite file is 'suite NAME' in both. Both name the backend."""
    spec = _variant(tmp_path, "Away", "availability(self)", "return 'needs a machine this is not'")
    argv = ["check", "--backend", f"{spec}:Away", "--quiet", "--allow-skip", *extra]
    assert main([*argv, "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert main(argv) == 0
    summary = capsys.readouterr().out
    assert plan.startswith(f"dry run: {title}, backend away, ") and f"treebench check: {title}, backend away" in summary, (
        plan, summary)
    assert "suite default" not in plan + summary


def test_the_report_shows_the_coverage_of_default_check_rows(tmp_path):
    rc, rows = _check("tests/broken_backends.py:Correct", tmp_path)
    assert rc == 0
    out = tmp_path / "r.html"
    assert main(["report", str(tmp_path / "rows.jsonl"), "-o", str(out)]) == 0
    html = out.read_text()
    assert "What the default check covered" in html and "Hq=T" in html
    rc, _ = _check("torch_sdpa", tmp_path / "suite", "--suite", "check")
    assert main(["report", str(tmp_path / "suite" / "rows.jsonl"), "-o", str(tmp_path / "s.html")]) == 0
    assert "What the default check covered" not in (tmp_path / "s.html").read_text()


def test_a_check_where_every_case_errored_shows_no_value_as_ran(tmp_path, capsys):
    """A backend whose prepare raises: no output was compared, so no axis value ran, every value
    the rows name errored, and neither the re-prepare nor the repeat step is claimed."""
    spec = _variant(tmp_path, "Raises", "prepare(self, inputs)", "raise RuntimeError('no kernel here')")
    rc, rows = _check(f"{spec}:Raises", tmp_path)
    assert rc == 1 and rows and {r["status"] for r in rows} == {"error"}
    out = capsys.readouterr().out
    lines = out[out.index("coverage ("):].splitlines()
    ran = [ln for ln in lines[1:] if ln.split()[1:2] == ["ran"]]
    assert ran and all(ln.rstrip().endswith("ran (none)") for ln in ran), ran
    assert any(ln.split()[:2] == ["errored", "7,"] for ln in lines), lines
    assert "re-prepare" not in out and "repeat" not in out and "bitwise" not in out
    cov = coverage_from_rows(rows)
    assert cov["page_size"]["ran"] == [] and "16" in cov["page_size"]["errored"]


def test_the_steps_say_what_they_found():
    """Rows written before `failed_step` existed (no such key): a re-prepare failure is read from the reason."""
    from treebench.harness.checking.default_check import check_steps
    rows = [{"status": "pass", "deterministic": True, "check_axes": {"page_size": "16"}},
            {"status": "mismatch", "deterministic": True, "check_axes": {"page_size": "1"},
             "reason": "re-prepare on a second batch of the same axes (seed 7920): max |err| 1.0"},
            {"status": "mismatch", "deterministic": False, "check_axes": {"page_size": "24"},
             "reason": "first prepare: repeat: 3 of 8 output elements differ bitwise between two calls"},
            {"status": "error", "check_axes": {"page_size": "64"}, "reason": "first prepare: RuntimeError"}]
    steps = check_steps(rows)
    assert steps["re-prepare"]["ran"][0].endswith(": passed on 1, failed on 1 of 2 cases")
    assert steps["repeat"]["ran"][0].endswith("bitwise equal on 2, bitwise different on 1 of 3 cases")
    cov = coverage_from_rows(rows)
    assert cov["page_size"]["ran"] == ["1", "16", "24"] and cov["page_size"]["errored"] == ["64"]
    assert check_steps([{"status": "error", "reason": "first prepare: x"}]) == {}


def test_the_steps_read_failed_step_not_the_reason():
    from treebench.harness.checking.default_check import check_steps
    rows = [{"status": "pass", "failed_step": None, "deterministic": True},
            {"status": "error", "failed_step": "re-prepare", "deterministic": True, "reason": "RuntimeError: x"},
            {"status": "mismatch", "failed_step": "first prepare", "deterministic": True,
             "reason": "first prepare: a backend's text that says re-prepare on a second batch"},
            {"status": "mismatch", "failed_step": "repeat", "deterministic": False, "reason": "first prepare: repeat"}]
    steps = check_steps(rows)
    assert steps["re-prepare"]["ran"][0].endswith(": passed on 1, failed on 1 of 2 cases")
    assert steps["repeat"]["ran"][0].endswith("bitwise equal on 3, bitwise different on 1 of 4 cases")


def _row(value, status, **fields):
    return {"status": status, "check_axes": {"page_size": value}, **fields}


def test_a_value_whose_cases_errored_at_re_prepare_ran_and_says_so():
    """An error at the re-prepare step came after the first batch was compared: the value ran, and is
    named as re-prepare errored only when none of its rows got further; an error found earlier, or in a
    row written before `failed_step` existed (no such key), is errored as before."""
    rows = [_row("1", "error", failed_step="re-prepare"),
            _row("16", "error", failed_step="re-prepare"), _row("16", "pass", failed_step=None),
            _row("24", "error", failed_step="re-prepare"), _row("24", "error", failed_step="first prepare"),
            _row("32", "error", failed_step="first prepare"),
            _row("64", "error", reason="re-prepare on a second batch of the same axes (seed 7920): RuntimeError"),
            _row("128", "mismatch", failed_step="re-prepare")]
    cov = coverage_from_rows(rows)["page_size"]
    assert cov == {"ran": ["1", "16", "24", "128"], "skipped": {}, "reprepare_errored": ["1", "24"],
                   "errored": ["32", "64"]}
    lines = coverage_lines({"page_size": cov})
    assert lines[1:] == ["  page_size  ran 1, 16, 24, 128",
                         "             re-prepare errored on 1, 24 (first batch compared, second batch raised)",
                         "             errored 32, 64"]


@pytest.mark.parametrize("failed_step, device", [("re-prepare", {"ran": ["cpu"], "skipped": {},
                                                                  "reprepare_errored": ["cpu"]}),
                                                  ("first prepare", {"ran": [], "skipped": {}, "errored": ["cpu"]})])
def test_the_planned_device_ran_when_only_the_re_prepare_step_errored(failed_step, device):
    planned = {"device": {"ran": ["cpu"], "skipped": {}}, "page_size": {"ran": ["16"], "skipped": {}}}
    cov = coverage_from_rows([_row("16", "error", failed_step=failed_step)], base=planned)
    assert cov["device"] == device


@pytest.mark.parametrize("shard", ["0/10", "3/7"])
def test_a_sharded_check_covers_only_the_values_its_cases_ran(tmp_path, capsys, shard):
    """The table lists under "ran" only values some case of this shard ran: the other shards'
    are left out, and a line says whose coverage it is."""
    rc, rows = _check("torch_sdpa", tmp_path, "--shard", shard)
    out = capsys.readouterr().out
    assert rc == 0 and rows and f"--shard {shard}: the coverage of this shard's {len(rows)} case" in out
    table = out[out.index("coverage ("):].splitlines()
    named: dict[str, set[str]] = {}
    for r in rows:
        for axis, value in r["check_axes"].items():
            named.setdefault(axis, set()).add(str(value))
    for axis, values in named.items():
        line = next(ln for ln in table if ln.split()[:2] == [axis, "ran"])
        assert set(line.split(" ran ", 1)[1].split(", ")) == values, (axis, values, line)
    assert len(named["tree_size"]) < 11   # the whole check's 11 tree sizes are not all claimed
    listed = {ln.split()[0] for ln in table[1:] if len(ln.split()) > 1 and ln.split()[1] == "ran"}
    assert listed <= set(named) | {"device", "re-prepare", "repeat"}, listed - set(named)   # no axis they do not vary


def test_the_readmes_sample_of_the_coverage_table_is_what_check_prints_for_torch_sdpa_on_a_cpu(monkeypatch):
    """README's sample, taken from `treebench check --backend torch_sdpa` on a CPU: its coverage lines
    are the ones that check prints when every case passes (rows in the order the check runs them)."""
    from treebench.harness.checking.default_check import check_steps

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)   # the sample's machine: no GPU
    d = default_check(REGISTRY["torch_sdpa"](), device="cpu")
    rows = [{"backend": "torch_sdpa", "status": "pass", "failed_step": None, "deterministic": True,
             "check_axes": d.check_axes[c.case_id]} for c in d.cases]
    printed = coverage_lines(coverage_from_rows(rows, base=d.coverage) | check_steps(rows))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    sample = readme[readme.index("```\ntreebench check: the default check, backend torch_sdpa\n"):]
    sample = sample[:sample.index("\n```", 4)].splitlines()
    assert f"│ torch_sdpa │   {len(rows)} │        0 │     0 │       0 │         - │" in sample
    assert sample[sample.index(printed[0]):] == printed
