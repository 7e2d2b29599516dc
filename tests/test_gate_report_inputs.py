"""Regression tests for bad or incomplete inputs to `treebench gate` and `treebench report`
(new-user findings): partial candidates, --threshold units, rows missing fields, unwritable
outputs, the CPU peak cell, and noisy timings."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from treebench.harness.cli import main as cli
from treebench.harness.analyze import gate, gate_inputs, gate_render
from treebench.harness.cli import gate as gate_cmd
from treebench.harness.analyze import report
from treebench.harness.analyze.gate import GateConfig, compare_runs
from treebench.harness.errors import ConfigError
from treebench.harness.model.cases import Case
from treebench.harness.timing.stats import is_noisy
from treebench.harness.store import validate

DATA = Path(__file__).parent / "data" / "results"
BASE = DATA / "h200-baseline"
_CASE = Case(batch_size=1, context_len=16, tree="chain:3").axes   # a row's case: every axis, as treebench writes it


def _row(case_id="c1", backend="k", median=100.0, spread=0.01, n=50, seed=0, **kw) -> dict:
    s = (median * np.random.default_rng(seed).lognormal(0, spread, n)).tolist()
    p25, med, p75 = np.percentile(s, [25, 50, 75])
    return {"schema": 1, "case_id": case_id, "backend": backend,
            "case": dict(_CASE), "status": "pass", "reason": None,
            "timer": "cuda_graph", "median_us": float(med), "p25_us": float(p25), "p75_us": float(p75),
            "cv": float(np.std(s, ddof=1) / np.mean(s)), "samples_us": s, **kw}


def _write(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _main(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# ---- 1. incomplete candidates ------------------------------------------------------------------

def test_missing_pairs_fail_unless_allowed(tmp_path, capsys):
    base = _write(tmp_path / "b.jsonl", [_row("c1"), _row("c2", seed=1)])
    cand = _write(tmp_path / "c.jsonl", [_row("c1", seed=2)])
    rc, out, _ = _main(capsys, "gate", "--baseline", str(base), "--candidate", str(cand))
    assert rc == 1 and "FAIL" in out and "1 missing" in out and "--allow-missing" in out
    rc, out, _ = _main(capsys, "gate", "--baseline", str(base), "--candidate", str(cand), "--allow-missing")
    assert rc == 0 and "PASS" in out


def test_no_overlap_fails_even_with_allow_missing(tmp_path, capsys):
    base = _write(tmp_path / "b.jsonl", [_row("c1")])
    cand = _write(tmp_path / "c.jsonl", [_row("c9")])
    rc, out, _ = _main(capsys, "gate", "--baseline", str(base), "--candidate", str(cand), "--allow-missing")
    assert rc == 1 and "Nothing was compared" in out


def test_everything_incomparable_fails(tmp_path, capsys):
    base = _write(tmp_path / "b.jsonl", [_row("c1")])
    cand = _write(tmp_path / "c.jsonl", [_row("c1", seed=3)])
    rc, out, _ = _main(capsys, "gate", "--baseline", str(base), "--candidate", str(cand), "--min-samples", "100000")
    assert rc == 1 and "Nothing was compared" in out
    result = compare_runs([_row("c1")], [_row("c1", seed=3)], GateConfig(min_samples=100000))
    assert result.failed and result.comparable == 0


# ---- 2. --threshold units --------------------------------------------------------------------

@pytest.mark.parametrize("text, value", [("5%", 0.05), ("0.05", 0.05), ("12.5%", 0.125), ("1e-1", 0.1)])
def test_threshold_accepts_percent_or_fraction(text, value):
    assert gate_cmd._fraction(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["5", "1", "20"])
def test_bare_threshold_of_one_or_more_is_refused(tmp_path, capsys, text):
    base = _write(tmp_path / "b.jsonl", [_row("c1")])
    rc, out, err = _main(capsys, "gate", "--baseline", str(base), "--candidate", str(base), "--threshold", text)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("treebench: error:") and "--threshold" in err
    assert f"{text}%" in err and "0.05" in err and "Traceback" not in err


@pytest.mark.parametrize("text, why", [("inf", "not a finite number"), ("-inf", "not a finite number"),
                                       ("nan", "not a finite number"), ("inf%", "not a finite number"),
                                       ("0", "must be positive"), ("-0.5", "must be positive"),
                                       ("1e9", "a bare number must be a fraction below 1"),
                                       ("1000", "a bare number must be a fraction below 1"),
                                       ("1e9%", "a percentage must be below 1000%"),
                                       ("1000%", "a percentage must be below 1000%")])
def test_unusable_threshold_says_why_and_what_is_accepted(tmp_path, capsys, text, why):
    """Each refusal gives its own reason and the accepted range, and proposes no value that is refused."""
    base = _write(tmp_path / "b.jsonl", [_row("c1")])
    rc, out, err = _main(capsys, "gate", "--baseline", str(base), "--candidate", str(base), f"--threshold={text}")
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert why in err and gate_cmd.ACCEPTED in err and "write " not in err, err


@pytest.mark.parametrize("text", ["1", "5", "37", "999", "9.99e2"])
def test_suggested_percentage_is_accepted(text):
    with pytest.raises(ConfigError, match="bare number") as e:
        gate_cmd._fraction(text)
    suggested = str(e.value).split("write ", 1)[1].split(" ", 1)[0]
    assert suggested == f"{text}%" and 0 < gate_cmd._fraction(suggested) < 1000 / 100


@pytest.mark.parametrize("text, why", [("1e-400", "too small, it rounds to 0"), ("1e-400%", "too small, it rounds to 0"),
                                       ("1_0%", "ASCII digits"), ("0.0_5", "ASCII digits"),
                                       ("\uff15%", "ASCII digits"), ("0.\u0665", "ASCII digits")])
def test_threshold_that_underflows_or_is_not_ascii_is_refused(tmp_path, capsys, text, why):
    """1e-400 rounds to 0 (not 'must be positive'); float() reads '1_0' as 10 and a full-width
    '５' as 5, which the gate refuses: one line, exit 2."""
    base = _write(tmp_path / "b.jsonl", [_row("c1")])
    rc, out, err = _main(capsys, "gate", "--baseline", str(base), "--candidate", str(base), f"--threshold={text}")
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert why in err and "must be positive" not in err and gate_cmd.ACCEPTED in err, err


@pytest.mark.parametrize("text, bound", [("0.999", "1.999"), ("999%", "10.99"), ("12.345%", "1.12345"),
                                         ("5%", "1.05"), ("0.05", "1.05"), ("33.3%", "1.333"), ("0.7%", "1.007"),
                                         ("1e-12", "1 + 1e-12")])
def test_summary_shows_the_threshold_unrounded(tmp_path, capsys, text, bound):
    """The summary's ratio bound keeps every digit given: 0.999 is '> 1.999', not '> 2'."""
    from treebench.harness.analyze.gate import ratio_bound

    assert ratio_bound(gate_cmd._fraction(text)) == bound
    base, cand = _write(tmp_path / "b.jsonl", [_row("c1")]), _write(tmp_path / "c.jsonl", [_row("c1", seed=3)])
    summary = tmp_path / "summary.md"
    rc, out, _ = _main(capsys, "gate", "--baseline", str(base), "--candidate", str(cand), f"--threshold={text}",
                       "--summary", str(summary))
    assert rc == 0 and f"slower means median ratio > {bound} and" in out
    assert f"slower means median ratio > {bound} and" in summary.read_text(encoding="utf-8")


def test_threshold_bound_is_the_gates():
    GateConfig(threshold=gate_cmd._fraction("999.9%"))
    with pytest.raises(ConfigError):
        GateConfig(threshold=gate_cmd.MAX_PERCENT / 100)


# ---- 3. rows missing fields ------------------------------------------------------------------

@pytest.mark.parametrize("row, field", [({"schema": 1}, "backend"),
                                        ({**_row(), "case": "x"}, "case"),
                                        ({k: v for k, v in _row().items() if k != "case_id"}, "case_id"),
                                        ({k: v for k, v in _row().items() if k != "status"}, "status"),
                                        ({**_row(), "l2_flushed": "yes"}, "l2_flushed")])
@pytest.mark.parametrize("command", ["gate", "report"])
def test_rows_missing_fields_are_one_line(tmp_path, capsys, row, field, command):
    good = _write(tmp_path / "good.jsonl", [_row("c1")])
    bad = _write(tmp_path / "m.jsonl", [_row("c2"), row])
    argv = (["gate", "--baseline", str(good), "--candidate", str(bad)] if command == "gate"
            else ["report", str(bad), "-o", str(tmp_path / "r.html")])
    rc, _, err = _main(capsys, *argv)
    assert rc == 2 and err.count("\n") == 1 and err.startswith("treebench: error:")
    assert f"{bad}:2" in err and repr(field) in err and "Traceback" not in err
    assert ("every row needs backend, case, case_id, status" in err) == (field in validate.REQUIRED_FIELDS), err
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("change, said", [
    ({"case": {"batch_size": "one", "context_len": 16, "tree": "chain:3"}},
     "field 'case.batch_size' is \"one\", expected an integer"),
    ({"case": {}}, "field 'case.batch_size' is missing"),
    ({"case": {"batch_size": 1, "context_len": 16, "tree": 7}}, "field 'case.tree' is 7, expected a string"),
    ({"env": None}, "field 'env' is null, expected the run's env id"),
    ({"env": ""}, "field 'env' is an empty string, expected the run's env id"),
    ({"case": {"batch_size": 1, "context_len": 16, "tree": "full:9:9"}},
     "field 'case.tree': tree 'full:9:9': 435848050 nodes, more than MAX_NODES = 1024; use a smaller tree"),
    ({"case": {"batch_size": 1, "context_len": 16, "tree": "bogus:3"}}, "field 'case.tree': "),
    ({"timestamp": "yesterday"}, "field 'timestamp' is \"yesterday\", expected a UTC time in ISO 8601 as treebench "
                                 "writes it, such as 2026-01-31T23:04:02.725+00:00"),
    ({"timestamp": "2026-02-30T10:00:00+00:00"}, "field 'timestamp' is \"2026-02-30T10:00:00+00:00\""),
    ({"timestamp": "2026-01-31T10:00:00+02:00"}, "field 'timestamp' is \"2026-01-31T10:00:00+02:00\""),
    ({"timestamp": 1767225600}, "field 'timestamp' is a number, expected a UTC time in ISO 8601"),
    ({"samples_us": [100.0, float("nan")]}, "field 'samples_us' holds a value that is not a finite number >= 0"),
    ({"samples_us": [100.0, 10**400]}, "field 'samples_us' holds a value that is not a finite number >= 0"),
    ({"median_us": 10**400}, "field 'median_us' is an integer too large for a float, expected a finite number >= 0"),
    ({"tree_sizes": [10**400]}, "field 'tree_sizes' must be a list of integers >= 0"),
    ({"context_lens": [16, "x"]}, "field 'context_lens' must be a list of integers >= 0"),
    ({"timer": 5}, "field 'timer' is a number, expected a string or null"),
    ({"timer": ["cuda_graph"]}, "field 'timer' is an array, expected a string or null"),
    ({"timer": None}, "field 'timer' is null, expected the timer of a timed row (a string: median_us is given)"),
    ({"timer": ""}, "field 'timer' is an empty string, expected the timer of a timed row (a string: median_us is given)"),
    ({"timer_fallback": ["x"]}, "field 'timer_fallback' is an array, expected a string or null"),
    ({"reason": {"why": "x"}}, "field 'reason' is a JSON object, expected a string or null"),
    ({"suite": 7}, "field 'suite' is a number, expected a string or null"),
    ({"mask_kind": True}, "field 'mask_kind' is a boolean, expected a string or null"),
    ({"kernel": [1]}, "field 'kernel' is an array, expected a string or null"),
    ({"failed_step": 1.5}, "field 'failed_step' is a number, expected a string or null")])
@pytest.mark.parametrize("command", ["gate", "report", "merge", "plan"])
def test_gate_merge_and_plan_refuse_the_rows_report_refuses(tmp_path, capsys, change, said, command):
    """A row report refuses (a case axis mistyped or absent, an env null, which would leave the row
    out of the gate's env check, a NaN sample) is refused by gate, merge and plan in the same line:
    exit 2, no PASS, no plan."""
    from treebench.harness.speculation.acceptance import shipped_models

    good = _write(tmp_path / "good.jsonl", [_row("c1", env="e1")])
    bad = _write(tmp_path / "m.jsonl", [_row("c1", env="e1"), {**_row("c2", env="e1"), **change}])
    argv = {"gate": ["gate", "--baseline", str(good), "--candidate", str(bad), "--allow-env-mismatch"],
            "report": ["report", str(bad), "-o", str(tmp_path / "r.html")],
            "merge": ["merge", str(tmp_path / "out.jsonl"), str(bad)],
            "plan": ["plan", "--results", str(bad), "--acceptance", str(shipped_models()[0])]}[command]
    rc, out, err = _main(capsys, *argv)
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert f"{bad}:2: {said}" in err and err.endswith("; edit or delete that line\n"), err
    assert not (tmp_path / "out.jsonl").exists() and not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("command", ["gate", "report", "merge"])
def test_a_bad_timestamp_is_one_line_naming_the_field_and_what_is_wrong(tmp_path, capsys, command):
    """The line names file:line, the field and what is wrong with it, and nothing else: the fields
    every row needs are named only where one of them is what is wrong."""
    bad = _write(tmp_path / "m.jsonl", [_row("c1"), _row("c2", timestamp="yesterday")])
    good = _write(tmp_path / "good.jsonl", [_row("c1")])
    argv = {"gate": ["gate", "--baseline", str(bad), "--candidate", str(good)],
            "report": ["report", str(bad), "-o", str(tmp_path / "r.html")],
            "merge": ["merge", str(tmp_path / "out.jsonl"), str(bad)]}[command]
    rc, out, err = _main(capsys, *argv)
    flag = {"gate": "gate --baseline", "report": "report", "merge": "merge"}[command]
    assert rc == 2 and out == "" and err == (
        f"treebench: error: {flag}: results file {bad}:2: field 'timestamp' is \"yesterday\", expected a UTC time "
        f"in ISO 8601 as treebench writes it, such as {validate.TIMESTAMP_EXAMPLE}; edit or delete that line\n"), err


@pytest.mark.parametrize("timer, timed", [(None, False), ("wall", True), ("cuda_graph", True)])
def test_an_untimed_row_may_name_no_timer(timer, timed):
    """A check row, a skip or an error before timing has no timer (null, as treebench writes it): it
    is read; a timed row names its timer."""
    row = {**_row("c1", timer=timer), **({} if timed else {"median_us": None, "p25_us": None, "p75_us": None,
                                                            "samples_us": None})}
    assert validate.row_problem(row) is None


@pytest.mark.parametrize("stamp", ["2026-01-31T23:04:02.725+00:00", "2025-06-11T12:00:00+00:00",
                                   "2025-06-11T12:00:00Z", None])
def test_timestamps_as_treebench_writes_them_are_read(tmp_path, capsys, stamp):
    """Milliseconds (treebench now), seconds (older rows), Z (UTC spelled short), or none at all."""
    path = _write(tmp_path / "m.jsonl", [_row("c1", timestamp=stamp)])
    rc, _, err = _main(capsys, "merge", str(tmp_path / "out.jsonl"), str(path))
    assert rc == 0 and "error" not in err, err


@pytest.mark.parametrize("change, said", [({"case": None}, "field 'case' is null, expected a JSON object"),
                                         ({"case": [1, 2]}, "field 'case' is an array, expected a JSON object"),
                                         ({"case": "x"}, "field 'case' is a string, expected a JSON object"),
                                         ({"backend": None}, "field 'backend' is null, expected a string"),
                                         ({"status": True}, "field 'status' is a boolean, expected a string"),
                                         ({"case": {"batch_size": 1, "context_len": 16, "tree": None}},
                                          "field 'case.tree' is null, expected a string"),
                                         ({"case": {"batch_size": True, "context_len": 16, "tree": "chain:3"}},
                                          "field 'case.batch_size' is true, expected an integer")])
def test_a_null_or_mistyped_field_is_said_to_be_so_not_missing(tmp_path, capsys, change, said):
    """A field that is there but null, or not the JSON type asked for, is named as such: one line,
    exit 2, naming the file and line; only an absent field is 'missing'."""
    bad = _write(tmp_path / "m.jsonl", [_row("c1"), {**_row("c2"), **change}])
    rc, out, err = _main(capsys, "report", str(bad), "-o", str(tmp_path / "r.html"))
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert f"{bad}:2: {said}; " in err and "missing" not in err, err
    assert not (tmp_path / "r.html").exists()


def test_an_absent_case_is_still_missing(tmp_path, capsys):
    bad = _write(tmp_path / "m.jsonl", [_row("c1"), {k: v for k, v in _row("c2").items() if k != "case"}])
    rc, _, err = _main(capsys, "report", str(bad), "-o", str(tmp_path / "r.html"))
    assert rc == 2 and f"{bad}:2: field 'case' is missing; " in err, err


_OTHER_ID = "B2-L16-chain:3-same-H32x8-D128-P16-bfloat16-shuffled-"   # + the hash Case gives it (below)


@pytest.mark.parametrize("change, said", [
    ({"case": {**_CASE, "batch_size": -3}}, "field 'case': case field batch_size=-3: must be a positive integer (B)"),
    ({"case": {**_CASE, "batch_size": 0}}, "field 'case': case field batch_size=0: must be a positive integer (B)"),
    ({"case": {**_CASE, "batch_size": 10**30}},
     f"field 'case': case field batch_size={10**30}: exceeds the limit 65536"),
    ({"case": {**_CASE, "context_len": -1}}, "field 'case': case field context_len=-1: must be >= 0"),
    ({"case": {**_CASE, "context_len": "ragged:9-3"}}, "field 'case': case field context_len='ragged:9-3': need"),
    ({"case": {**_CASE, "head_dim": 0}}, "field 'case': case field head_dim=0: must be a positive integer (D)"),
    ({"case": {**_CASE, "num_q_heads": 6, "num_kv_heads": 4}}, "field 'case': case num_q_heads=6 is not a multiple"),
    ({"case": {**_CASE, "dtype": "int8"}}, "field 'case': case field dtype='int8': use one of bfloat16, float16"),
    ({"case": {**_CASE, "layout": None}}, "field 'case': case field layout=None: use one of contiguous"),
    ({"case": {**_CASE, "seed": 1.5}}, "field 'case': case field seed=1.5: must be an integer"),
    ({"case": {**_CASE, "colour": "red"}}, "field 'case.colour' is no case axis; the axes are batch_size, "),
    ({"backend": ""}, "field 'backend' is an empty string, expected the backend's name"),
    ({"backend": "a/b"}, "field 'backend' is \"a/b\", which holds \"/\": no backend of that name loads"),
    ({"backend": "a\nb"}, "field 'backend' is \"a\\nb\", which holds \"\\n\": no backend of that name loads"),
    ({"n_samples": -1}, "field 'n_samples' is -1, expected an integer >= 0"),
    ({"n_samples": "50"}, "field 'n_samples' is a string, expected an integer >= 0"),
    ({"samples_us": []}, "field 'samples_us' is an empty array on a timed row (median_us is given)"),
    ({"case_id": "OTHER"}, "field 'case_id' is \"B2-L16-chain:3-"),
    ({"case": {k: v for k, v in _CASE.items() if k != "head_dim"}},
     "field 'case.head_dim' is missing; a row's case holds every axis (only logit_scale, values, "),
    ({"timer": "cuda_grpah"}, "field 'timer' is \"cuda_grpah\", expected one of cuda_graph, cuda_event, "
                              "host_inclusive, cuda_graph_loop, wall or null"),
    ({"cpu_threads": "1"}, "field 'cpu_threads' is a string, expected an integer >= 1"),
    ({"cpu_threads": -2}, "field 'cpu_threads' is -2, expected an integer >= 1"),
    ({"run_id": ""}, "field 'run_id' is \"\", expected a run id as treebench writes it"),
    ({"run_id": "../r1"}, "field 'run_id' is \"../r1\", expected a run id as treebench writes it"),
    ({"run_id": None}, "field 'run_id' is null, expected a string"),
    (b"\xff", "byte 0xff at column ")])
@pytest.mark.parametrize("command", ["gate", "report", "merge", "plan", "run --resume", "check --resume", "rm"])
def test_a_row_no_case_or_run_gives_is_refused_by_every_reader(tmp_path, capsys, change, said, command):
    """A case the suite loader refuses (an axis out of its range, an unknown dtype, a key that is no
    axis, an axis missing that would be read as its default), an empty backend, a negative n_samples,
    a timed row without samples, a case_id of another case, a timer no timer of treebench's is named,
    a cpu_threads that is no thread count, a run id treebench could not have written (null: every run
    writes one), and a line that is not UTF-8 (read as U+FFFD it would name another backend): each reader
    refuses it in one line naming file:line and the field, exit 2, writing nothing; rm too, which
    would remove the first row (backend k) and rewrite the file."""
    from treebench.harness.speculation.acceptance import shipped_models

    good_id = Case(**_CASE).case_id
    first, second = _row(good_id, env="e1"), _row(good_id, backend="k2", env="e1")
    if change == {"case_id": "OTHER"}:
        change = {"case_id": Case(**{**_CASE, "batch_size": 2}).case_id}
        assert change["case_id"].startswith(_OTHER_ID)
    lines = [json.dumps(first).encode(), json.dumps({**second, **change}).encode() if isinstance(change, dict)
             else json.dumps(second).encode().replace(b'"k2"', b'"k2' + change + b'"')]   # backend 'k2' + a byte
    good, bad = _write(tmp_path / "good.jsonl", [first]), tmp_path / "m.jsonl"
    bad.write_bytes(b"".join(x + b"\n" for x in lines))
    before = bad.read_bytes()
    (tmp_path / "s.toml").write_text('[axes]\nbatch_size = [1]\ncontext_len = [16]\ntree = ["chain:3"]\n')
    sweep = ["--suite", str(tmp_path / "s.toml"), "--out", str(bad), "--resume", "--quiet"]
    argv = {"gate": ["gate", "--baseline", str(good), "--candidate", str(bad), "--allow-env-mismatch"],
            "report": ["report", str(bad), "-o", str(tmp_path / "r.html")],
            "merge": ["merge", str(tmp_path / "out.jsonl"), str(bad)],
            "plan": ["plan", "--results", str(bad), "--acceptance", str(shipped_models()[0])],
            "run --resume": ["run", "--backends", "torch_sdpa", *sweep],
            "check --resume": ["check", "--backend", "torch_sdpa", *sweep],
            "rm": ["rm", str(bad), "--backend", "k"]}[command]
    rc, out, err = _main(capsys, *argv)
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert f"{bad}:2" in err and said in err and "Traceback" not in err, err
    assert bad.read_bytes() == before and not (tmp_path / "out.jsonl").exists() and not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("change", [{"samples_us": [], "median_us": None, "p25_us": None, "p75_us": None,
                                     "timer": None}, {"n_samples": 0}, {"n_samples": None},
                                    {"case_id": "a label"}])
def test_rows_the_new_rules_leave_alone_are_read(change):
    """An untimed row without samples, n_samples 0 or null, and a case_id that is no case's id (a label:
    no case's id is mistaken for it) are read."""
    assert validate.row_problem({**_row(), **change}) is None


@pytest.mark.parametrize("schema", [1, 2])
@pytest.mark.parametrize("axis", [a for a in validate.CASE_FIELDS_WRITTEN if a not in validate.CASE_FIELDS_REQUIRED])
def test_a_case_without_an_axis_is_not_read_as_its_default(schema, axis):
    """Rows of every schema hold each axis but LATER_AXES (schema 1 wrote all of Case's fields): one
    without an axis that has a default was edited, and would be read, grouped and paired as the case
    of its default."""
    row = {**_row(), "schema": schema, "case": {k: v for k, v in _CASE.items() if k != axis}}
    assert validate.row_problem(row) == (f"field 'case.{axis}' is missing; a row's case holds every axis (only "
                                         "logit_scale, values, kv_dtype, k_scale, v_scale, sm_scale are left out, "
                                         "at their defaults)")


@pytest.mark.parametrize("change, said", [
    ({"timer": "auto"}, "field 'timer' is \"auto\", expected one of "),   # asked for, never recorded: it picks one
    ({"timer": "Wall"}, "field 'timer' is \"Wall\", expected one of "),
    ({"timer": "cuda_graph "}, "field 'timer' is \"cuda_graph \", expected one of "),
    ({"timer": "", "median_us": None, "p25_us": None, "p75_us": None, "samples_us": None},
     "field 'timer' is \"\", expected one of "),
    ({"cpu_threads": 0}, "field 'cpu_threads' is 0, expected an integer >= 1 (the torch threads it was timed under) "
                         "or null"),
    ({"cpu_threads": 1.0}, "field 'cpu_threads' is 1.0, expected an integer >= 1"),
    ({"cpu_threads": True}, "field 'cpu_threads' is true, expected an integer >= 1"),
    ({"cpu_threads": [1]}, "field 'cpu_threads' is an array, expected an integer >= 1"),
    ({"run_id": None}, "field 'run_id' is null, expected a string"),   # every run writes its id
    ({"run_id": " "}, "field 'run_id' is \" \", expected a run id as treebench writes it (ASCII letters, digits, "
                      "'-', '_' and '.', the first a letter or digit, such as "),
    ({"run_id": "r 1"}, "field 'run_id' is \"r 1\", expected a run id"),
    ({"run_id": "r1/x"}, "field 'run_id' is \"r1/x\", expected a run id"),
    ({"run_id": "r1\\x"}, "field 'run_id' is \"r1\\\\x\", expected a run id"),
    ({"run_id": "-r1"}, "field 'run_id' is \"-r1\", expected a run id"),
    ({"run_id": ".r1"}, "field 'run_id' is \".r1\", expected a run id"),
    ({"run_id": "r1\n"}, "field 'run_id' is \"r1\\n\", expected a run id"),
    ({"run_id": "r\x001"}, "field 'run_id' is \"r\\u00001\", expected a run id"),
    ({"run_id": "r\u00e9"}, "field 'run_id' is \"r\\u00e9\", expected a run id"),
    ({"run_id": "x" * 101}, "field 'run_id' is \"xxx"),
    ({"run_id": "torchrun-" + "x" * 101}, "field 'run_id' is \"torchrun-xxx")])
def test_a_field_treebench_could_not_have_written_is_refused(change, said):
    """A timer treebench has none of, a thread count torch could not have run under, a run id no run of
    treebench's could carry (`names.is_run_id`): each is named with what is expected."""
    problem = validate.row_problem({**_row(), **change})
    assert (problem or "").startswith(said), problem


@pytest.mark.parametrize("change", [{"timer": t} for t in ("cuda_graph", "cuda_event", "host_inclusive",
                                                           "cuda_graph_loop", "wall")] +
                         [{"cpu_threads": None}, {"cpu_threads": 1}, {"cpu_threads": 37}] +
                         [{"run_id": r} for r in ("r1", "2025-06-11-seed-3f1c2a9", "20261201T214637Z-b172dc",
                                                  "x" * 100, "torchrun-" + "x" * 100, "job_7.2")] +
                         [{"case": Case(batch_size=1, context_len=16, tree="chain:3", logit_scale=1000.0).axes}])
def test_fields_as_treebench_writes_them_are_read(change):
    """Every timer treebench records, a thread count or none, a run id of any form treebench writes (its
    own, one given in $TREEBENCH_RUN_ID, torchrun's; `_row` has none at all, as a row written by hand),
    and a case whose later axes are left out at their defaults (or given, away from them) are read."""
    assert validate.row_problem({**_row(), **change}) is None


def test_the_run_ids_treebench_writes_are_read():
    import uuid

    from treebench.harness.store.names import new_run_id
    from treebench.harness.sweep.shard import shared_run_id

    ids = [new_run_id(), shared_run_id({"TORCHELASTIC_RUN_ID": str(uuid.uuid4())}),
           shared_run_id({"TREEBENCH_RUN_ID": "nightly-7"})]
    assert all(validate.row_problem({**_row(), "run_id": run_id}) is None for run_id in ids), ids


def test_a_row_written_before_its_tree_spelling_was_normalised_keeps_its_id():
    """A case_id hashed from the case's axes as stored ('random:8:01') is read, as docs/architecture.md says."""
    import copy

    case = Case(batch_size=1, context_len=16, tree="random:8:1")
    older = copy.copy(case)
    object.__setattr__(older, "tree", "random:8:01")
    row = {**_row(older.case_id), "case": {**case.axes, "tree": "random:8:01"}}
    assert validate.row_problem(row) is None and validate.row_problem({**row, "case_id": case.case_id}) is None


def test_every_committed_row_is_valid():
    """Every results file the repository ships, and every env file beside them, passes every reader's check."""
    from treebench.harness.store.env import read_envs

    root = Path(__file__).parent.parent
    files = [f for d in (root / "results", DATA) for f in sorted(d.rglob("*.jsonl"))]
    assert files and validate.validated_rows(files, "test") is not None
    envs = sorted(f for d in (root / "results", DATA) for f in d.rglob("env-*.json"))
    assert envs and len(read_envs(envs)) == len({f.name for f in envs})


# ---- 4. unwritable outputs ---------------------------------------------------------------------

def test_report_to_unwritable_path_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "afile"
    blocker.write_text("keep me", encoding="utf-8")
    rc, _, err = _main(capsys, "report", str(BASE), "-o", str(blocker / "r.html"))
    assert rc == 2 and err.count("\n") == 1 and "report -o" in err
    assert blocker.read_text(encoding="utf-8") == "keep me"


def test_report_to_an_empty_path_is_one_line(tmp_path, capsys, monkeypatch):
    """-o '' is refused as run --out '' is, not taken for the default path."""
    monkeypatch.chdir(tmp_path)
    rc, _, err = _main(capsys, "report", str(BASE), "-o", "")
    assert rc == 2 and err.count("\n") == 1 and "report -o is empty" in err
    assert not (tmp_path / "reports").exists()


@pytest.mark.parametrize("flag", ["--junit", "--summary"])
def test_gate_empty_output_path_is_one_line(capsys, flag):
    """--junit '' / --summary '' are refused (`check_output_path`), not taken for the option left out."""
    rc, out, err = _main(capsys, "gate", "--baseline", str(BASE), "--candidate", str(BASE), flag, "")
    assert rc == 2 and out == "" and err.count("\n") == 1 and f"gate {flag} is empty" in err


@pytest.mark.parametrize("flag", ["--junit", "--summary"])
def test_gate_unwritable_output_is_checked_first(tmp_path, capsys, flag):
    blocker = tmp_path / "afile"
    blocker.write_text("keep me", encoding="utf-8")
    rc, out, err = _main(capsys, "gate", "--baseline", str(BASE), "--candidate", str(BASE),
                         flag, str(blocker / "x" / "out.xml"))
    assert rc == 2 and out == "" and err.count("\n") == 1 and flag in err
    assert blocker.read_text(encoding="utf-8") == "keep me"


def test_gate_output_to_a_folder_is_refused(tmp_path, capsys):
    folder = tmp_path / "x.xml"
    folder.mkdir()
    rc, out, err = _main(capsys, "gate", "--baseline", str(BASE), "--candidate", str(BASE), "--junit", str(folder))
    assert rc == 2 and out == "" and "--junit" in err and "folder" in err


def test_gate_junit_must_be_an_xml_path(tmp_path, capsys):
    """--junit overwrites its file, so it takes only a .xml path: a user's notes.txt is left alone."""
    notes = tmp_path / "notes.txt"
    notes.write_text("mine", encoding="utf-8")
    rc, out, err = _main(capsys, "gate", "--baseline", str(BASE), "--candidate", str(BASE), "--junit", str(notes))
    assert rc == 2 and out == "" and "must end in .xml" in err and notes.read_text(encoding="utf-8") == "mine"


# ---- 5. the CPU peak cell -----------------------------------------------------------------------

def test_env_table_says_peak_not_measured_on_cpu():
    envs = {"e1": {"gpu_name": None, "peak_bw_bytes_per_s": None}}
    _, table = report.env_table(envs, [{"env": "e1"}])
    peak = dict(table)["measured peak (copy) TB/s"]
    assert peak == ["not measured (CPU)"]
    assert "None" not in [v for _, vals in table for v in vals]


# ---- 6. noisy timings ---------------------------------------------------------------------------

def test_is_noisy():
    assert not is_noisy(_row(spread=0.01))
    assert is_noisy(_row(spread=0.3))
    assert is_noisy({"median_us": 100.0, "p25_us": 80.0, "p75_us": 130.0, "cv": 0.05})
    assert not is_noisy({"status": "skipped"})


def test_gate_markdown_mentions_noise(tmp_path):
    result = compare_runs([_row(spread=0.3)], [_row(spread=0.01, seed=1)])
    text = gate_render.markdown(result)
    assert "noisy" in text and result.verdicts[0].noisy and "noisy baseline" in result.verdicts[0].detail
    quiet = gate_render.markdown(compare_runs([_row()], [_row(seed=1)]))
    assert "noisy" not in quiet


def test_report_marks_noisy_rows(tmp_path):
    rows = [_row("c1", "a", spread=0.3), _row("c1", "b", spread=0.01, seed=1)]
    html = report.write_report(rows, {}, tmp_path / "r.html").read_text(encoding="utf-8")
    assert "⚠noisy" in html and "1 timed row(s) are noisy" in html


@pytest.mark.parametrize("flag", ["--junit", "--summary"])
def test_gate_refuses_to_write_over_its_inputs(tmp_path, capsys, flag):
    """--junit / --summary naming an input file (or a .jsonl in an input folder) would
    destroy or pollute the results: exit 2, the inputs unchanged (new-user finding)."""
    a = _write(tmp_path / "a.jsonl", [_row()])
    before = a.read_bytes()
    rc, _, err = _main(capsys, "gate", "--baseline", str(a), "--candidate", str(a), flag, str(a))
    refused = "must end in .xml" if flag == "--junit" else "is one of the results being compared"
    assert rc == 2 and refused in err and a.read_bytes() == before
    rc, _, err = _main(capsys, "gate", "--baseline", str(tmp_path), "--candidate", str(a),
                       flag, str(tmp_path / "new.jsonl"))
    assert rc == 2 and not (tmp_path / "new.jsonl").exists()
    b = _write(tmp_path / "b.jsonl", [_row()])
    rc, _, _ = _main(capsys, "gate", "--baseline", str(a), "--candidate", str(b), flag, str(tmp_path / "g.xml"))
    assert rc == 0 and (tmp_path / "g.xml").exists()


def test_merge_of_nothing_is_bad_input_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out.jsonl"
    rc, _, err = _main(capsys, "merge", str(out), str(tmp_path / "empty"))
    assert rc == 2 and "no result rows" in err and not out.exists()


def test_gate_says_whether_a_skip_is_new():
    """A pair skipped in both runs and one newly skipped read differently (new-user finding:
    189 'Skipped in the candidate' lines when comparing a run with itself)."""
    both = gate.classify(_row(status="skipped", reason="P 16"), _row(status="skipped", reason="P 16"), GateConfig())
    new = gate.classify(_row(), _row(status="skipped", reason="no GPU"), GateConfig())
    assert both.kind == new.kind == "skipped" and not both.failed
    assert both.detail.startswith("skipped in both") and new.detail.startswith("newly skipped (baseline was pass)")


def test_gate_summary_folds_pairs_skipped_in_both_by_backend_and_reason():
    """Pairs skipped in both runs for one reason are one summary line with their count
    (126 'vllm not installed' lines once crowded the summary); a single
    such pair keeps its case id, and newly skipped pairs keep a line each."""
    rows_b, rows_c = [], []
    for i in range(5):
        kw = dict(case_id=f"c{i}", backend="vllm_triton", status="skipped", reason="vllm not installed")
        rows_b.append(_row(**kw))
        rows_c.append(_row(**kw))
    rows_b += [_row(case_id="x", backend="flex", status="skipped", reason="no GPU"), _row(case_id="y", backend="flex")]
    rows_c += [_row(case_id="x", backend="flex", status="skipped", reason="no GPU"),
               _row(case_id="y", backend="flex", status="skipped", reason="compile failed")]
    verdicts = [gate.classify(b, c, GateConfig()) for b, c in zip(rows_b, rows_c)]
    md = gate_render.markdown(gate.GateResult(verdicts=tuple(verdicts), config=GateConfig()))
    lines = [ln for ln in md.splitlines() if ln.startswith("| vllm_triton") or ln.startswith("| flex")]
    assert lines[0].startswith("| vllm_triton |  |  |  |  | 5 cases | skipped in both: vllm not installed")
    assert "`x`" in lines[1] and "skipped in both: no GPU" in lines[1]
    assert "`y`" in lines[2] and "newly skipped (baseline was pass): compile failed" in lines[2]
    assert len(lines) == 3 and "Skipped in the candidate (each line says whether the baseline skipped it too) (7)" in md


def test_gate_outputs_never_land_on_files_read_with_the_inputs(tmp_path, capsys):
    """Second new-user pass: --junit/--summary on an env file beside the inputs, or both
    on one path, are refused with exit 2 and every input file is left as it was."""
    base = tmp_path / "base"
    base.mkdir()
    a = _write(base / "a.jsonl", [_row()])
    env = base / "env-0123.json"
    env.write_text("{}")
    before = {p: p.read_bytes() for p in (a, env)}
    for flag in ("--junit", "--summary"):
        for inputs in ([str(base)], [str(a)]):
            rc, _, err = _main(capsys, "gate", "--baseline", *inputs, "--candidate", str(a), flag, str(env))
            assert rc == 2 and ("must end in .xml" if flag == "--junit" else "write it somewhere else") in err
    rc, _, err = _main(capsys, "gate", "--baseline", str(a), "--candidate", str(a),
                       "--junit", str(tmp_path / "o.xml"), "--summary", str(tmp_path / "o.xml"))
    assert rc == 2 and "same file" in err and not (tmp_path / "o.xml").exists()
    assert {p: p.read_bytes() for p in (a, env)} == before


def test_merge_out_must_be_a_jsonl_outside_the_input_folders(tmp_path, capsys):
    src = tmp_path / "in"
    src.mkdir()
    a = _write(src / "a.jsonl", [_row()])
    before = a.read_bytes()
    for out in (src / "new.jsonl", src / "a.jsonl", tmp_path / "out.html"):
        rc, _, err = _main(capsys, "merge", str(out), str(src))
        assert rc == 2, out
    assert sorted(p.name for p in src.iterdir()) == ["a.jsonl"] and a.read_bytes() == before
    assert _main(capsys, "merge", str(tmp_path / "out.jsonl"), str(src))[0] == 0


def test_backend_option_given_twice_is_refused(capsys):
    rc, _, err = _main(capsys, "run", "--suite", "smoke", "--backends", "reference", "--backend", "flex", "--dry-run")
    assert rc == 2 and "given 2 times" in err
    rc, _, err = _main(capsys, "check", "--backend", "all")
    assert rc == 2 and "check takes one backend" in err


@pytest.mark.parametrize("option, argv", [
    ("--baseline", ["gate", "--baseline", "{a}", "--baseline", "{b}", "--candidate", "{a}"]),
    ("--candidate", ["gate", "--baseline", "{a}", "--candidate", "{a}", "--candidate", "{b}"]),
    ("--threshold", ["gate", "--baseline", "{a}", "--candidate", "{b}", "--threshold", "5%", "--threshold=90%",
                     "--summary", "{o}"]),
    ("--results", ["plan", "--results", "{a}", "--results", "{b}", "--acceptance", "{a}"]),
    ("--against", ["report", "{a}", "--against", "{a}", "--against", "{b}", "-o", "{o}"]),
    ("-o / --output", ["report", "{a}", "-o", "{o}", "--output", "{o}.html"]),
    ("--suite", ["run", "--suite", "smoke", "--suite", "seed", "--out", "{o}"]),
    ("--out", ["check", "--backend", "reference", "--out", "{o}", "--out={o}2"]),
    ("--max-nodes", ["tree-search", "--acceptance", "{a}", "--max-nodes", "3", "--max-nodes", "4"]),
])
def test_an_option_of_one_value_or_one_list_given_twice_is_refused(tmp_path, capsys, option, argv):
    """argparse keeps the last of a repeated option: `--baseline a --baseline b` would drop a."""
    a, b = (_write(tmp_path / f"{n}.jsonl", [_row()]) for n in "ab")
    argv = [x.format(a=a, b=b, o=tmp_path / "out") for x in argv]
    rc, out, err = _main(capsys, *argv)
    assert rc == 2 and len(err.splitlines()) == 1 and f"error: {argv[0]}: {option} given 2 times; give it once" in err
    assert not out and sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "b.jsonl"]


@pytest.mark.parametrize("option, argv", [
    ("--baseline", ["gate", "--baseline", "{a}", "--baseline", "{b}"]),                     # no --candidate
    ("--baseline", ["gate", "--baseline", "{a}", "--baseline", "{b}", "--candidate"]),      # --candidate empty
    ("--against", ["report", "--against", "{a}", "--against", "{b}", "--bogus"]),           # an unknown option
    ("--threshold", ["gate", "--threshold", "5%", "--threshold", "9%", "--alpha", "x"]),    # a bad --alpha
    ("--out", ["check", "--out", "{o}", "--out", "{o}2"]),                                  # no --backend
])
def test_an_option_given_twice_is_refused_before_the_other_errors_after_it(tmp_path, capsys, option, argv):
    """The repeat is named first, whatever else argparse finds wrong after it: mending that other
    error alone would only meet the repeat next."""
    a, b = (_write(tmp_path / f"{n}.jsonl", [_row()]) for n in "ab")
    rc, out, err = _main(capsys, *[x.format(a=a, b=b, o=tmp_path / "out") for x in argv])
    assert rc == 2 and not out and len(err.splitlines()) == 1
    assert err.startswith(f"treebench: error: {argv[0]}: {option} given 2 times; give it once"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "b.jsonl"]


def test_every_option_that_takes_a_value_is_given_once_or_accumulates():
    """Each subcommand's value options are StoreOnce; the ones that accumulate (rm's filters,
    tree-search --acceptance) append or extend, and say so in their help."""
    import argparse

    from treebench.harness.cli import StoreOnce

    accumulate = set()
    for name in cli.COMMANDS:
        for action in cli.command_parser(name)._actions:
            if action.option_strings and action.nargs != 0 and not isinstance(action, argparse._HelpAction):
                if not isinstance(action, StoreOnce):
                    accumulate.add((name, action.option_strings[0]))
    assert accumulate == {("rm", "--run-id"), ("rm", "--backend"), ("rm", "--env"), ("tree-search", "--acceptance")}


def test_ctrl_c_while_starting_is_one_line(monkeypatch, capsys):
    """Ctrl-C while the console script imports torch and the harness: one line, exit 130."""
    import sys
    import types

    import treebench as entry

    class Interrupting(types.ModuleType):
        def __getattr__(self, name):
            raise KeyboardInterrupt
    monkeypatch.setitem(sys.modules, "treebench.harness.cli.main", Interrupting("treebench.harness.cli.main"))
    assert entry.main() == 130
    assert capsys.readouterr().err.strip() == "treebench: interrupted while starting; nothing was written"


def test_a_results_file_given_twice_is_read_once(caplog):
    """The same run's rows twice (a file or folder named twice) are kept once, with a warning;
    rows of another run with the same cases are kept."""
    from treebench.harness.store.validate import drop_repeated_rows, read_checked_rows

    files = sorted(str(p) for p in BASE.glob("*.jsonl"))
    once = read_checked_rows(files, "report")
    assert len(read_checked_rows(files + files, "report")) == len(once)
    assert any(f"{len(once)} repeated rows dropped, one of each kept (the same row read twice: a results file given "
               "twice" in m for m in caplog.messages)
    other_run = [{**r, "run_id": "another"} for r in once]
    assert len(drop_repeated_rows(once + other_run, "report")) == 2 * len(once)


@pytest.mark.parametrize("second", ["timed", "timed later", "timed warm"])
def test_two_measurements_of_a_pair_under_one_run_id_are_both_kept(caplog, second):
    """One run id naming two rows of a pair measured apart (a check's untimed row, then a run's timed
    one under a reused $TREEBENCH_RUN_ID; a job run twice; another L2 state) is no repeat: gate and
    report read both, and the gate compares the later."""
    from treebench.harness.store.rows import read_rows
    from treebench.harness.store.validate import drop_repeated_rows

    (first,) = [r for r in read_rows([BASE / "seed.jsonl"]) if r["status"] == "pass"][:1]
    untimed = {**first, "timer": None, "median_us": None, "samples_us": None, "l2_flushed": None}
    timed = {**first, "timestamp": "2999-01-01T00:00:00.000+00:00"}
    earlier = {"timed": untimed, "timed later": first, "timed warm": {**timed, "l2_flushed": False}}
    rows = [earlier[second], timed]
    assert drop_repeated_rows(rows, "report") == rows and not caplog.messages
    assert validate.latest_rows(rows)[(first["case_id"], first["backend"])] is timed


def test_gate_orders_a_cells_page_sizes_numerically():
    """P 16 before P 128 of the same cell, side by side (the case ids sort P128 first)."""
    rows = [_row(case_id=f"B1-L16-t-P{p}-x", case=dict(batch_size=1, context_len=16, tree="t", page_size=p))
            for p in (128, 16, 64)]
    result = compare_runs(rows, rows, GateConfig())
    assert [v.case.get("page_size") for v in result.verdicts] == [16, 64, 128]



# ---- flags that named nothing, or something absent, must not be silently ignored ----------

@pytest.mark.parametrize("same", ["one path", "a folder and its file", "a link", "among others"])
def test_gate_given_one_file_on_both_sides_says_so(tmp_path, capsys, same):
    """The same results file as baseline and candidate compared a run with itself and passed; now
    it is bad input, one line naming the file, exit 2, whichever way the file is named twice."""
    a = _write(tmp_path / "a.jsonl", [_row()])
    other = tmp_path / "other"
    other.mkdir()
    b = _write(other / "b.jsonl", [_row(seed=2)])
    (tmp_path / "link.jsonl").symlink_to(a)
    base, cand = {"one path": ([a], [a]), "a folder and its file": ([tmp_path], [a]),
                  "a link": ([a], [tmp_path / "link.jsonl"]), "among others": ([b, a], [other, a])}[same]
    rc, out, err = _main(capsys, "gate", "--baseline", *map(str, base), "--candidate", *map(str, cand))
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "--baseline and --candidate both read" in err and "a run with itself" in err
    assert _main(capsys, "gate", "--baseline", str(a), "--candidate", str(b))[0] == 0


def test_gate_backends_must_name_backends_present_in_the_rows(tmp_path, capsys):
    """--backends '' (or only commas) compared every backend, and a name in neither file was
    dropped without a word; both are bad input now, one line and exit 2."""
    a = _write(tmp_path / "a.jsonl", [_row(backend="k"), _row("c2", backend="m", seed=1)])
    b = _write(tmp_path / "b.jsonl", [_row(backend="k"), _row("c2", backend="m", seed=1)])
    for value in ("", " , ", "k,nosuch"):
        rc, _, err = _main(capsys, "gate", "--baseline", str(a), "--candidate", str(b), "--backends", value)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "--backends" in err, (value, err)
    assert "nosuch" in err and "k, m" in err                     # says which backends are there
    rc, out, _ = _main(capsys, "gate", "--baseline", str(a), "--candidate", str(b), "--backends", "m")
    assert rc == 0 and "c2" in out and "c1" not in out


def test_report_causal_backend_must_have_rows(tmp_path, capsys):
    a = _write(tmp_path / "a.jsonl", [_row(backend="k")])
    rc, _, err = _main(capsys, "report", str(a), "-o", str(tmp_path / "r.html"), "--causal-backend", "nosuch")
    assert rc == 2 and "--causal-backend" in err and "k" in err and not (tmp_path / "r.html").exists()
    rc, out, _ = _main(capsys, "report", str(a), "-o", str(tmp_path / "r.html"))   # default: absent is fine
    assert rc == 0 and (tmp_path / "r.html").exists()


def test_negative_threshold_gets_the_gates_own_message(tmp_path, capsys):
    """`--threshold -5%` read as an option gave argparse's "expected one argument"."""
    a = _write(tmp_path / "a.jsonl", [_row()])
    rc, _, err = _main(capsys, "gate", "--baseline", str(a), "--candidate", str(a), "--threshold", "-5%")
    assert rc == 2 and "must be positive" in err and len(err.strip().splitlines()) == 1, err



def test_gate_refuses_a_copy_of_one_run_on_both_sides(tmp_path):
    """A byte copy of a results file passes the same-file check but holds the same run: refused."""
    import shutil
    import subprocess
    import sys
    rows = [{"schema": 2, "run_id": "r1", "env": "e1", "timestamp": "2026-01-01T00:00:00+00:00", "backend": "k",
             "case_id": f"c{i}",
             "case": dict(_CASE), "status": "pass", "timer": "cuda_graph",
             "median_us": 1.0, "samples_us": [1.0] * 8} for i in range(2)]
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "run.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    shutil.copy(a / "run.jsonl", b / "run.jsonl")
    p = subprocess.run([sys.executable, "-m", "treebench", "gate", "--baseline", str(a / "run.jsonl"),
                        "--candidate", str(b / "run.jsonl")], capture_output=True, text=True)
    assert p.returncode == 2, p.stderr
    assert "run r1 is in both --baseline and --candidate" in p.stderr and len(p.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """The results file of one tiny CPU run of torch_sdpa, its env file beside it."""
    from tests.tiny_suites import tiny_suite

    root = tmp_path_factory.mktemp("tiny_run")
    (root / "tiny.toml").write_text(tiny_suite())
    out = root / "run" / "tiny.jsonl"
    assert cli.main(["run", "--suite", str(root / "tiny.toml"), "--backends", "torch_sdpa", "--out", str(out),
                     "--report", str(root / "tiny.html"), "--quiet"]) == 0
    return out


def _sides(kind: str, run: Path, tmp: Path) -> tuple[Path, Path]:
    """(baseline, candidate) paths that `kind` of refusal is about, made from the tiny run."""
    import shutil

    if kind == "the same file":
        return run, run
    if kind == "a folder and its file":
        return run.parent, run
    if kind == "a copy of the run":
        return run, Path(shutil.copytree(run.parent, tmp / "copy")) / run.name
    if kind.startswith("a baseline without rows"):
        empty = tmp / "empty"
        empty.mkdir()
        (empty / "base.jsonl").touch()
        return (empty / "base.jsonl" if kind.endswith("file") else empty), run
    noenv = tmp / "noenv"
    noenv.mkdir()
    other = _write(noenv / "other.jsonl", [{**r, "run_id": "another-run"} for r in map(json.loads, run.open())])
    return (other, run) if kind == "baseline env file missing" else (run, other)


@pytest.mark.parametrize("kind", ["the same file", "a folder and its file", "a copy of the run",
                                  "baseline env file missing", "candidate env file missing",
                                  "a baseline without rows: an empty file", "a baseline without rows: a folder"])
def test_report_against_refuses_what_the_gate_refuses_in_its_words(tiny_run, tmp_path, capsys, kind):
    """`report --against` refuses what the gate refuses, in its words: a run compared with itself, a
    baseline without its env file or without rows, a candidate without its env file. The same one
    line (its own command and flags named), exit 2, and a report already at -o left as it was."""
    base, cand = _sides(kind, tiny_run, tmp_path)
    rc, out, gate_err = _main(capsys, "gate", "--baseline", str(base), "--candidate", str(cand))
    assert rc == 2 and out == "" and len(gate_err.strip().splitlines()) == 1, gate_err
    page = tmp_path / "r.html"
    page.write_text('<meta name="generator" content="treebench"> an earlier report')
    rc, out, err = _main(capsys, "report", str(cand), "-o", str(page), "--against", str(base))
    assert rc == 2 and out == "" and page.read_text().endswith("an earlier report")
    words = gate_err.replace("error: gate", "error: report").replace("--baseline", "--against") \
        .replace("--candidate", "RESULTS")
    assert err == words, (err, gate_err)
    if "env" in kind:
        assert "copy it there, or pass --allow-env-mismatch" in err
        assert _main(capsys, "report", str(cand), "-o", str(page), "--against", str(base),
                     "--allow-env-mismatch")[0] == 0
        assert "an earlier report" not in page.read_text()
    elif "without rows" in kind:
        assert err == f"treebench: error: report --against {base}: no result rows; point it at a run's .jsonl file " \
            "or folder (folders are not searched recursively)\n", err
        fresh = tmp_path / "fresh.html"
        assert _main(capsys, "report", str(cand), "-o", str(fresh), "--against", str(base))[0] == 2
        assert not fresh.exists()
    else:
        assert "a run with itself" in err


@pytest.mark.parametrize("allow", [False, True])
def test_rows_without_an_env_id_are_compared_with_a_warning_naming_the_first(tiny_run, tmp_path, capsys, allow):
    """Rows that name no env have no fingerprint for the env check: the gate and `report --against`
    compare them and say so, one warning per side naming the file and line of the first such row,
    with or without --allow-env-mismatch; rows that name theirs draw no warning."""
    (row,) = [json.loads(line) for line in tiny_run.open()]
    run_rows = [row, *({**row, "case_id": f"{row['case_id']}-{i}"} for i in (2, 3))]
    other = tmp_path / "other"
    other.mkdir()
    for env in tiny_run.parent.glob("env-*.json"):        # both sides' env file beside their rows
        (tmp_path / env.name).write_bytes(env.read_bytes())
        (other / env.name).write_bytes(env.read_bytes())
    cand = _write(other / "cand.jsonl", [{**r, "run_id": "another-run"} for r in run_rows])
    for r in run_rows[1:]:
        del r["env"]
    base = _write(tmp_path / "base.jsonl", [{**r, "run_id": "hand-made"} for r in run_rows])
    flags = ["--allow-env-mismatch"] * allow
    said = f"2 rows carry no env id (the first at {base}:2); their GPU and software are not compared"
    rc, out, err = _main(capsys, "gate", "--baseline", str(base), "--candidate", str(cand), *flags)
    assert rc == 0 and "PASS" in out, err
    assert [line for line in err.splitlines() if "no env id" in line] == [
        f"WARNING  gate --baseline: {said} with the other side's (rows that treebench writes name their env file)"]
    rc, out, err = _main(capsys, "report", str(base), "-o", str(tmp_path / "r.html"), "--against", str(cand), *flags)
    assert rc == 0 and f"report RESULTS: {said}" in err and err.count("no env id") == 1, err
    rc, _, err = _main(capsys, "gate", "--baseline", str(tiny_run), "--candidate", str(cand), *flags)
    assert rc == 0 and "no env id" not in err


def test_env_records_the_triton_interpreter(monkeypatch):
    from treebench.harness.store.env import env_fingerprint
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    on = env_fingerprint("cpu")
    monkeypatch.delenv("TRITON_INTERPRET")
    off = env_fingerprint("cpu")
    assert on["triton_interpret"] and not off["triton_interpret"] and on["env_id"] != off["env_id"]


@pytest.mark.parametrize("value, on", [("1", True), ("true", True), ("yes", True), ("on", True), ("TRUE", True),
                                       ("Y", True), ("0", False), ("false", False), ("off", False), ("", False),
                                       ("2", False)])
def test_triton_interpret_is_read_as_triton_reads_it(monkeypatch, value, on):
    """`TRITON_INTERPRET=true` runs Triton's interpreter: the env, `list` and the kernels say so too."""
    import torch

    from treebench.backends.triton_tree import triton_availability
    from treebench.harness.model.paged import triton_interpret
    from treebench.harness.store.env import env_fingerprint

    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert triton_interpret() is on and env_fingerprint("cpu")["triton_interpret"] is on
    libtriton = pytest.importorskip("triton._C.libtriton")
    assert libtriton.getenv_bool("TRITON_INTERPRET", False) is on   # Triton's own reading
    if not torch.cuda.is_available():
        assert (triton_availability() is None) is on


@pytest.mark.parametrize("change, word", [
    (lambda r: r["case"].pop("batch_size"), "case.batch_size"),
    (lambda r: r["case"].update(tree=3), "case.tree"),
    (lambda r: r.update(env=7), "'env'"),
])
def test_rows_a_report_cannot_read_are_refused_in_one_line(tmp_path, capsys, change, word):
    row = _row()
    change(row)
    f = _write(tmp_path / "bad.jsonl", [row])
    rc, _, err = _main(capsys, "report", str(f), "-o", str(tmp_path / "r.html"))
    assert rc == 2 and word in err and len(err.strip().splitlines()) == 1, err
    if word == "'env'":                                   # the gate reads env too
        good = _write(tmp_path / "good.jsonl", [_row(seed=3)])
        rc, _, err = _main(capsys, "gate", "--baseline", str(good), "--candidate", str(f))
        assert rc == 2 and word in err and len(err.strip().splitlines()) == 1, err


def test_a_zero_median_does_not_break_the_report(tmp_path):
    rows = [_row("c1", "triton_tree"), _row("c1", "flashinfer_mask", seed=1)]
    rows[0]["median_us"] = 0.0
    html = report.write_report(rows, {}, tmp_path / "r.html").read_text(encoding="utf-8")
    assert "triton_tree" in html


@pytest.mark.parametrize("status", ["mismatch", "error"])
def test_a_failing_row_with_only_the_required_fields_makes_a_report(tmp_path, capsys, status):
    """The failures table shows non-finite count and tolerances where a row has them; a row without
    them (written by hand, or an error row) is a report with those cells empty, not a traceback."""
    row = {"schema": 2, "run_id": "r1", "case_id": "c1", "backend": "k", "status": status, "reason": "boom",
           "case": dict(_CASE)}
    f = _write(tmp_path / "bad.jsonl", [row])
    rc, _, err = _main(capsys, "report", str(f), "-o", str(tmp_path / "r.html"))
    assert rc == 0, err
    assert "boom" in (tmp_path / "r.html").read_text(encoding="utf-8").split("Mismatches and errors")[1]


def test_env_field_differences_name_each_differing_field_with_both_sides_values():
    """Per field of gate_inputs.ENV_FIELDS in order: the baseline's and the candidate's values, ', '-joined when
    a side's rows span several envs; fields alike, fields outside ENV_FIELDS and envs without a file
    are left out, and the gate's note lines are made of the same values."""
    base_envs = {"a": {"driver": "570", "torch": "2.9", "hostname": "x"}}
    cand_envs = {"b": {"driver": "575", "torch": "2.9", "hostname": "y"},
                 "c": {"driver": "580", "torch": "2.9", "hostname": "y"}}
    base_rows, cand_rows = [{"env": "a"}], [{"env": "b"}, {"env": "c"}, {"env": "gone"}]
    assert gate_inputs.env_field_differences(base_envs, cand_envs, base_rows, cand_rows) == [
        gate_inputs.EnvDifference("driver", "570", "575, 580")]
    assert gate_inputs.env_differences(base_envs, cand_envs, base_rows, cand_rows) == [
        "candidate env fingerprint env-gone.json not found beside its results", "driver: 570 -> 575, 580"]
    assert gate_inputs.env_field_differences(base_envs, {"b": base_envs["a"]}, base_rows, [{"env": "b"}]) == []


def test_gate_and_resume_spell_a_value_an_env_lacks_alike(tmp_path):
    """A fingerprint field with no value (a package not installed) reads 'none' in the gate's lines
    and in run --resume's warning, both made by env.field_differences."""
    from treebench.harness.sweep.resume import env_changes

    old, new = {"env_id": "a", "triton": None, "torch": "2.9"}, {"env_id": "b", "triton": "3.1", "torch": "2.9"}
    gate_lines = gate_inputs.env_differences({"a": old}, {"b": new}, [{"env": "a"}], [{"env": "b"}])
    assert gate_lines == env_changes(new, {"a": old}, tmp_path / "r.jsonl") == ["triton: none -> 3.1"]
    assert gate_inputs.env_field_differences({"a": new}, {"b": old}, [{"env": "a"}], [{"env": "b"}]) == [
        gate_inputs.EnvDifference("triton", "3.1", "none")]


@pytest.mark.parametrize("allow", [False, True])
def test_the_gate_shows_a_value_an_env_lacks_as_none(tmp_path, capsys, allow):
    """The gate's refusal, and its summary with --allow-env-mismatch, write a missing value 'none' (not 'None')."""
    for side, triton in (("b", None), ("c", "3.1")):
        (tmp_path / side).mkdir()
        env = {"gpu_name": None, "torch": "2.9", "triton": triton}
        env_id = f"{side}0000000000"
        (tmp_path / side / f"env-{env_id}.json").write_text(json.dumps({**env, "env_id": env_id}))
        _write(tmp_path / side / "r.jsonl", [_row("c1", env=env_id, seed=len(side))])
    rc, out, err = _main(capsys, "gate", "--baseline", str(tmp_path / "b"), "--candidate", str(tmp_path / "c"),
                         *(["--allow-env-mismatch"] if allow else []))
    shown = out if allow else err
    assert rc == (0 if allow else 2) and "triton: none -> 3.1" in shown and "None" not in shown, (out, err)


@pytest.mark.parametrize("gpu", [None, "NVIDIA H200"])
def test_cpu_env_fields_count_between_two_cpu_runs_only(gpu):
    """Two CPU runs on another processor or thread count differ (their times follow them); two GPU
    runs whose hosts' CPUs differ do not (GPU-timed rows)."""
    base = {"a": {"gpu_name": gpu, "torch": "2.9", "cpu_model": "Xeon A", "torch_threads": 1}}
    cand = {"b": {"gpu_name": gpu, "torch": "2.9", "cpu_model": "EPYC B", "torch_threads": 2}}
    found = gate_inputs.env_field_differences(base, cand, [{"env": "a"}], [{"env": "b"}])
    assert found == ([] if gpu else [gate_inputs.EnvDifference("cpu_model", "Xeon A", "EPYC B"),
                                     gate_inputs.EnvDifference("torch_threads", "1", "2")])


def test_report_with_every_file_after_against_says_against_took_them(tmp_path, capsys):
    """`report --against A B` leaves RESULTS empty (--against takes one or more files): one line
    saying --against took them and how to write it, not argparse's missing-argument line."""
    base = _write(tmp_path / "base.jsonl", [_row()])
    rc, _, err = _main(capsys, "report", "--against", str(base), str(base))
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert f"--against took every file after it ({base} {base})" in err and "before --against" in err, err
    rc, _, err = _main(capsys, "report")
    assert rc == 2 and "give the results files (RESULTS)" in err, err


@pytest.mark.parametrize("command", ["gate", "report", "merge", "plan"])
def test_a_results_file_another_run_is_writing_is_read_with_one_warning(tmp_path, capsys, command):
    """A results file whose lock sidecar names a live process (a run still appending): gate, report,
    merge and plan go on, after one warning line that its rows may be partial; once that process is
    gone, no warning."""
    import subprocess

    from treebench.harness.speculation.acceptance import shipped_models

    base = _write(tmp_path / "b.jsonl", [_row("c1")])
    cand = _write(tmp_path / "c.jsonl", [_row("c1", seed=2)])
    out = tmp_path / "out"
    argv = {"gate": ["gate", "--baseline", str(base), "--candidate", str(cand)],
            "report": ["report", str(cand), "-o", str(tmp_path / "r.html")],
            "merge": ["merge", str(out / "m.jsonl"), str(cand)],   # a new OUT each time: the rows are merged twice
            "plan": ["plan", "--results", str(cand), "--acceptance", str(shipped_models()[0])]}[command]
    writer = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / "c.jsonl.lock").write_text(f"{writer.pid}\n")
        rc, _, err = _main(capsys, *argv)
    finally:
        writer.kill()
        writer.wait()
    label = {"gate": "gate --candidate"}.get(command, command)
    assert rc == 0 and [line for line in err.splitlines() if "being written" in line] == [
        f"WARNING  {label}: results file {cand} is still being written by another treebench process (pid "
        f"{writer.pid}): its rows may be partial; read it again once that run ends"], err
    if command == "merge":
        assert len((out / "m.jsonl").read_text().splitlines()) == 1
        (out / "m.jsonl").unlink()
    rc, _, err = _main(capsys, *argv)
    assert rc == 0 and "being written" not in err, err


@pytest.mark.parametrize("spelled", ["twice", "link"])
def test_merge_reads_a_file_named_twice_once_with_the_readers_warning(tmp_path, caplog, capsys, spelled):
    """merge, as report and gate, keeps the rows of a results file named twice (also through a link) once,
    with the readers' warning; OUT gets each row once."""
    a = _write(tmp_path / "a.jsonl", [_row(f"c{i}", run_id="r1") for i in range(3)])
    again = a
    if spelled == "link":
        again = tmp_path / "l.jsonl"
        again.symlink_to(a.name)
    out = tmp_path / "out" / "o.jsonl"
    rc, printed, _ = _main(capsys, "merge", str(out), str(a), str(again))
    assert rc == 0 and len(out.read_text().splitlines()) == 3
    assert printed == f"merged 3 rows into {out} (3 duplicates dropped, 3 of them read twice)\n", printed
    assert any(m.startswith("merge: 3 repeated rows dropped, one of each kept (the same row read twice: a results "
                            "file given twice") for m in caplog.messages), caplog.messages


def test_gate_junit_replaces_only_junit_the_gate_wrote(tmp_path, capsys):
    """--junit overwrites its own JUnit XML or an empty file, never another file (a pom.xml): exit 2
    in one line, before anything is written (--summary left as it was too)."""
    a = _write(tmp_path / "a.jsonl", [_row()])
    b = _write(tmp_path / "b.jsonl", [_row(seed=1)])
    pom, summary = tmp_path / "pom.xml", tmp_path / "s.md"
    pom.write_text("<project/>\n")
    summary.write_text("earlier\n")
    rc, out, err = _main(capsys, "gate", "--baseline", str(a), "--candidate", str(b), "--junit", str(pom),
                         "--summary", str(summary))
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert f"gate --junit {pom}: exists and was not written by treebench (it is left as it is)" in err, err
    assert pom.read_text() == "<project/>\n" and summary.read_text() == "earlier\n"
    mine = tmp_path / "gate.xml"
    mine.write_text("")                                                        # an empty file may be replaced
    for _ in range(2):                                                         # and then its own JUnit again
        rc, _, _ = _main(capsys, "gate", "--baseline", str(a), "--candidate", str(b), "--junit", str(mine))
        assert rc == 0 and ET.parse(mine).getroot().get("name") == "treebench.gate"


@pytest.mark.parametrize("name, content", [
    ("tiny.toml", '[suite]\nname = "tiny"\n'),
    ("other.jsonl", None),                       # a results file: a row
    ("env-0123.json", '{"env_id": "0123"}\n'),
    ("r.html", "<!doctype html>\n"),
    ("g.XML", "<x/>\n"),
    ("backend.py", "class B: ...\n"),
    ("rows.txt", None),                          # a results file by another name: its first line is a row
    ("rows", None),
])
def test_gate_summary_never_appends_to_a_data_file(tmp_path, capsys, name, content):
    """--summary appends Markdown: an existing, non-empty results file, suite, env file, report or other
    data file (its suffix, or a first line that is a JSON row) is refused in one line, exit 2, before
    anything is written (--junit not written either)."""
    a = _write(tmp_path / "a.jsonl", [_row()])
    b = _write(tmp_path / "b.jsonl", [_row(seed=1)])
    target = tmp_path / "elsewhere" / name
    target.parent.mkdir()
    if content is None:
        _write(target, [_row(), _row("c2")])
    else:
        target.write_text(content)
    before, junit = target.read_bytes(), tmp_path / "g.xml"
    rc, out, err = _main(capsys, "gate", "--baseline", str(a), "--candidate", str(b), "--summary", str(target),
                         "--junit", str(junit))
    assert rc == 2 and out == "" and err.count("\n") == 1 and f"gate --summary {target}: exists and is " in err, err
    assert target.read_bytes() == before and not junit.exists()


@pytest.mark.parametrize("name", ["step_summary_0f1e", "notes.md", "log.txt", "empty.toml"])
def test_gate_summary_appends_to_markdown_text_and_suffixless_files(tmp_path, capsys, name):
    """$GITHUB_STEP_SUMMARY (no suffix), a Markdown or text file, and an empty file of any kind take the summary."""
    a = _write(tmp_path / "a.jsonl", [_row()])
    b = _write(tmp_path / "b.jsonl", [_row(seed=1)])
    target = tmp_path / "elsewhere" / name
    target.parent.mkdir()
    earlier = "" if name.startswith("empty") else "# earlier step\n"
    target.write_text(earlier)
    rc, _, _ = _main(capsys, "gate", "--baseline", str(a), "--candidate", str(b), "--summary", str(target))
    assert rc == 0 and target.read_text().startswith(earlier + "## treebench gate: ")


@pytest.mark.parametrize("lacking", ["--baseline", "--candidate"])
def test_gate_backends_missing_on_one_side_names_that_side_and_fails(tmp_path, caplog, capsys, lacking):
    """--backends naming a backend that only one side holds rows of is no bad input (each name must have
    rows on one side): a warning names the side without them and the backends it holds, no pair can be
    compared, and the gate fails (exit 1), as docs/timing.md says."""
    plain = _write(tmp_path / "cr.jsonl", [_row(backend=b, seed=i) for i, b in enumerate(("flex", "torch_sdpa"))])
    more = _write(tmp_path / "post.jsonl", [_row(backend=b, seed=i + 5)
                                            for i, b in enumerate(("flex", "torch_sdpa", "reference"))])
    base, cand = (plain, more) if lacking == "--baseline" else (more, plain)
    rc, out, err = _main(capsys, "gate", "--baseline", str(base), "--candidate", str(cand), "--backends", "reference")
    assert rc == 1 and "treebench gate" in out and "no result rows" not in err
    assert (f"gate {lacking} {plain} holds no rows of backends reference (it has: flex, torch_sdpa): no pair of "
            "them can be compared") in caplog.messages, caplog.messages
    assert "gate: no (case, backend) pair could be compared; failing" in caplog.messages
    rc, _, err = _main(capsys, "gate", "--baseline", str(base), "--candidate", str(cand), "--backends", "nope")
    assert rc == 2 and "nope in neither side's rows" in err
