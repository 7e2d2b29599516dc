"""Bad input through `python -m treebench`: one line on stderr, exit 2, nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEEP = 5000  # nesting depth past Python's recursion limit


def _cli(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "treebench", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _one_line_exit_2(proc: subprocess.CompletedProcess, *words: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("treebench: error: "), proc.stderr[-2000:]
    assert all(w in lines[0] for w in words), lines[0][:500]


def _deep_suite(tmp_path: Path, axis: str) -> Path:
    values = {"batch_size": "[1]", "context_len": "[4]", "tree": '["chain:1"]'}
    values[axis] = "[" * DEEP + ('"chain:1"' if axis == "tree" else "1") + "]" * DEEP
    p = tmp_path / "deep.toml"
    p.write_text('[suite]\nname = "deep"\n[axes]\n' + "".join(f"{k} = {v}\n" for k, v in values.items()))
    return p


@pytest.mark.parametrize("axis", ["batch_size", "tree"])
def test_a_deeply_nested_suite_is_bad_input(tmp_path, axis):
    out = tmp_path / "rows.jsonl"
    proc = _cli("check", "--suite", str(_deep_suite(tmp_path, axis)), "--backend", "reference", "--out", str(out))
    _one_line_exit_2(proc, "nested too deeply")
    assert not out.exists()


def test_a_value_given_twice_in_a_suite_axis_is_bad_input(tmp_path):
    """`page_size = [16, 16]` would run each case twice over: one line naming the axis and the value, exit 2."""
    p = tmp_path / "twice.toml"
    p.write_text('[axes]\nbatch_size = [1]\ncontext_len = [4]\ntree = ["chain:1"]\npage_size = [16, 16]\n')
    out = tmp_path / "rows.jsonl"
    proc = _cli("run", "--suite", str(p), "--backends", "reference", "--out", str(out))
    _one_line_exit_2(proc, f"suite {p}: axes: axis page_size value 16 given twice; give each once")
    assert not out.exists()


@pytest.mark.parametrize("values, words", [
    ('"ragged:1_6-20"', ["context_len='ragged:1_6-20': '1_6' is not an integer (ASCII digits 0-9, no '_')"]),
    ('"list:１,2"', ["context_len='list:１,2': '１' is not an integer (ASCII digits 0-9, no '_')"]),
    ('"ragged:16-2048", "ragged:016-2048"', ["axis context_len values 'ragged:16-2048' and 'ragged:016-2048' are "
                                             "one context spec (ragged:16-2048); give it once"]),
])
def test_a_context_spec_int_reads_but_treebench_does_not_is_bad_input(tmp_path, values, words):
    """A '_' or another script's digits in a context spec, or one spec spelled twice in the axis: one line
    naming the suite and the spec as given, exit 2, nothing written."""
    p = tmp_path / "lens.toml"
    p.write_text(f'[axes]\nbatch_size = [2]\ncontext_len = [{values}]\ntree = ["chain:1"]\n', encoding="utf-8")
    out = tmp_path / "rows.jsonl"
    proc = _cli("check", "--suite", str(p), "--backend", "reference", "--out", str(out))
    _one_line_exit_2(proc, f"suite {p}: axes: ", *words)
    assert not out.exists()


def test_a_deeply_nested_tree_spec_is_bad_input():
    _one_line_exit_2(_cli("tree", "[" * DEEP + "(0,)" + "]" * DEEP), "not a Python list of tuples")


@pytest.mark.parametrize("spec", ["[" * DEEP + "(0,)" + "]" * DEEP, "[" + "(" * DEEP + "0," + ")" * DEEP + "]"])
def test_a_deeply_nested_tree_spec_in_a_suite_is_one_short_line(tmp_path, spec):
    """The spec is echoed cut to its ends: the line stays readable and keeps its fix."""
    p = tmp_path / "deep.toml"
    p.write_text(f'[suite]\nname = "deep"\n[axes]\nbatch_size = [1]\ncontext_len = [4]\ntree = ["{spec}"]\n')
    out = tmp_path / "rows.jsonl"
    proc = _cli("check", "--suite", str(p), "--backend", "reference", "--out", str(out))
    _one_line_exit_2(proc, "not a Python list of tuples", "characters]", str(p))
    assert len(proc.stderr) < 1000 and not out.exists()


def test_a_deeply_nested_acceptance_model_is_bad_input(tmp_path):
    p = tmp_path / "deep.toml"
    p.write_text("p = " + "[" * DEEP + "0.5" + "]" * DEEP + "\n")
    _one_line_exit_2(_cli("tree-search", "--acceptance", str(p), "--max-nodes", "4"), "nested too deeply")


def test_a_backend_module_sees_its_own_argv_at_import(tmp_path):
    f = tmp_path / "argv_backend.py"
    f.write_text("import argparse, sys\n"
                 "from tests.broken_backends import Correct\n"
                 "SEEN = list(sys.argv)\n"
                 "argparse.ArgumentParser().parse_args()   # a script-style module: fails on foreign options\n"
                 "class B(Correct):\n"
                 "    name = 'argv_' + str(len(SEEN)) + '_' + SEEN[0].rsplit('/', 1)[-1].replace('.', '_')\n")
    proc = _cli("check", "--backend", f"{f}:B", "--quiet", "--suite", "smoke")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "argv_1_argv_backend_py" in proc.stdout


@pytest.mark.parametrize("where", ["prepare", "call"])
def test_a_backend_that_exits_while_running_is_its_error_row(tmp_path, where):
    f = tmp_path / "exits_later.py"
    body = ("    def prepare(self, inputs):\n        raise SystemExit(0)\n" if where == "prepare" else
            "    def prepare(self, inputs):\n        def run():\n            raise SystemExit(0)\n        return run\n")
    f.write_text("from tests.broken_backends import Correct\nclass B(Correct):\n    name = 'exits'\n" + body)
    out = tmp_path / "rows.jsonl"
    proc = _cli("check", "--backend", f"{f}:B", "--quiet", "--out", str(out))
    assert proc.returncode == 1, proc.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all(r["status"] == "error" and r["reason"] == "backend called sys.exit(0)" for r in rows)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """A folder with one small check's rows and its env file."""
    d = tmp_path_factory.mktemp("results")
    proc = _cli("check", "--backend", "reference", "--suite", "smoke", "--quiet", "--out", str(d / "a.jsonl"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return d


def _commands(a: Path, b: Path, out: Path) -> list[list[str]]:
    return [["report", str(a), "-o", str(out.with_suffix(".html"))],
            ["gate", "--baseline", str(a), "--candidate", str(b), "--allow-env-mismatch"],
            ["merge", str(out), str(a)]]


@pytest.mark.parametrize("i", range(3), ids=["report", "gate", "merge"])
def test_a_non_utf8_env_file_is_bad_input(tmp_path, results, i):
    d = tmp_path / "r"
    d.mkdir()
    (d / "a.jsonl").write_bytes((results / "a.jsonl").read_bytes())
    (d / "env-0000.json").write_bytes(b'{"env_id": "\xff\xfe"}')
    out = tmp_path / "merged.jsonl"
    _one_line_exit_2(_cli(*_commands(d / "a.jsonl", results / "a.jsonl", out)[i]), "env file", "env-0000.json")
    assert not out.exists() and not out.with_suffix(".html").exists()


@pytest.mark.parametrize("i", range(3), ids=["report", "gate", "merge"])
def test_a_file_holding_only_a_torn_10mb_line_is_one_line(tmp_path, results, i):
    torn = tmp_path / "torn.jsonl"
    torn.write_text('{"schema": 1, "backend": "' + "x" * 10_000_000)
    out = tmp_path / "merged.jsonl"
    _one_line_exit_2(_cli(*_commands(torn, results / "a.jsonl", out)[i]), "torn", f"{torn}:1")
    assert not out.exists() and not out.with_suffix(".html").exists()


def _renamed_rows(src: Path, suffix: str) -> list[dict]:
    """The rows of `src` as new measurements (their case ids changed), so a merge would append them."""
    return [dict(json.loads(line), case_id=json.loads(line)["case_id"] + suffix) for line in src.read_text().splitlines()]


def _merge_out(tmp_path: Path, results: Path) -> tuple[Path, bytes]:
    """A merge OUT already holding rows, in a folder of its own, and its bytes."""
    out = tmp_path / "out" / "merged.jsonl"
    out.parent.mkdir()
    out.write_bytes((results / "a.jsonl").read_bytes())
    return out, out.read_bytes()


@pytest.mark.parametrize("field, value, words", [("status", 5, ["field 'status' is a number, expected a string"]),
                                                 ("median_us", "fast", ["field 'median_us' is a string, expected a number"]),
                                                 ("case", None, ["field 'case' is missing"])])
def test_merge_refuses_a_row_that_report_and_gate_refuse(tmp_path, results, field, value, words):
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text("".join(json.dumps(r) + "\n" for r in _renamed_rows(results / "a.jsonl", "-g")))
    first, second, *_ = _renamed_rows(results / "a.jsonl", "-b")
    second = {k: v for k, v in second.items() if k != field} if value is None else {**second, field: value}
    bad.write_text(json.dumps(first) + "\n" + json.dumps(second) + "\n")
    out, before = _merge_out(tmp_path, results)
    proc = _cli("merge", str(out), str(good), str(bad))
    _one_line_exit_2(proc, f"{bad}:2", *words)
    assert out.read_bytes() == before and sorted(p.name for p in out.parent.iterdir()) == ["merged.jsonl"]


def test_merge_of_a_deeply_nested_line_is_bad_input(tmp_path, results):
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100_000 + "\n")
    out, before = _merge_out(tmp_path, results)
    _one_line_exit_2(_cli("merge", str(out), str(results / "a.jsonl"), str(deep)), str(deep), "result row")
    assert out.read_bytes() == before


@pytest.mark.parametrize("i", range(3), ids=["report", "gate", "merge"])
def test_a_deep_line_before_a_bad_row_is_one_line(tmp_path, results, i):
    """A line that starts like a row and nests too deeply (skipped as torn, with its warning), then a row
    with a bad field: the bad row's error, no traceback."""
    bad = tmp_path / "bad.jsonl"
    row = {**_renamed_rows(results / "a.jsonl", "-d")[0], "status": 5}
    bad.write_text('{"a": ' + "[" * 100_000 + "\n" + json.dumps(row) + "\n")
    out, before = _merge_out(tmp_path, results)
    proc = _cli(*_commands(bad, results / "a.jsonl", out)[i])
    *warnings, error = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and error.startswith("treebench: error: ") and "Traceback" not in proc.stderr
    assert len(warnings) <= 1 and f"{bad}:2: field 'status'" in error, proc.stderr[-2000:]
    assert out.read_bytes() == before and not out.with_suffix(".html").exists()


@pytest.mark.parametrize("torn", ['{"sch', '{"run_id": "2026', '{"schema": 2, "backend": "ref'])
def test_merge_skips_a_torn_last_line_as_report_and_gate_do(tmp_path, results, torn):
    src = tmp_path / "torn.jsonl"
    rows = _renamed_rows(results / "a.jsonl", "-t")
    src.write_text("".join(json.dumps(r) + "\n" for r in rows) + torn)
    out, before = _merge_out(tmp_path, results)
    proc = _cli("merge", str(out), str(src))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"{src}:{len(rows) + 1}: skipping a torn" in proc.stderr
    assert out.read_bytes().startswith(before) and len(out.read_text().splitlines()) == 2 * len(rows)


@pytest.mark.parametrize("text", ["hello\n", '{"schema": 2, "case_id": "x"}\n[1, 2]\n', '{"env_id": "e"}\n'])
def test_merge_names_a_bad_input_without_offering_a_new_path(tmp_path, results, text):
    """'give a new path' is advice for OUT: an input is read, not written."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text(text)
    out, before = _merge_out(tmp_path, results)
    proc = _cli("merge", str(out), str(results / "a.jsonl"), str(bad))
    _one_line_exit_2(proc, str(bad))
    assert "new path" not in proc.stderr and out.read_bytes() == before


@pytest.mark.parametrize("device, words", [("bogus", ["--device bogus: not a torch device"]),
                                           ("cuda:x", ["--device cuda:x: not a torch device"]),
                                           ("meta", ["--device meta: not a device selftest can run on"]),
                                           ("cuda:64", ["--device cuda:64", "not available"])])
def test_selftest_refuses_a_device_it_cannot_run_on(device, words):
    _one_line_exit_2(_cli("selftest", "--device", device), *words)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="CUDA is available here")
def test_selftest_refuses_cuda_without_cuda():
    proc = _cli("selftest", "--device", "cuda")
    _one_line_exit_2(proc, "--device cuda", "not available")
    assert not proc.stdout


@pytest.mark.parametrize("spec, words", [
    ("{dir}:X", ["{dir}", "is a directory", "PATH.py:Class"]),
    ("math:pi", ["math:pi is not a class"]),
    ("os.path:join", ["os.path:join is not a class"]),
    (":", ["malformed", "PATH.py:Class", "package.module:Class"]),
    ("math:", ["malformed", "PATH.py:Class"]),
    ("{file}:A:B", ["malformed", "PATH.py:Class or package.module:Class"]),
])
def test_a_bad_backend_string_says_what_is_wrong_with_it(tmp_path, spec, words):
    (tmp_path / "d").mkdir()
    (tmp_path / "file.py").write_text("class A:\n    pass\n")
    fill = {"dir": str(tmp_path / "d"), "file": str(tmp_path / "file.py")}
    out = tmp_path / "rows.jsonl"
    proc = _cli("check", "--backend", spec.format(**fill), "--out", str(out))
    _one_line_exit_2(proc, *(w.format(**fill) for w in words))
    assert "not found" not in proc.stderr and "Error" not in proc.stderr and not out.exists()


@pytest.mark.parametrize("argv", [["--bogus"], ["--bogus", "list"], ["--quiet=1", "run"]])
def test_an_option_before_the_command_is_refused_not_ignored(argv, tmp_path):
    """`treebench --bogus run` once ran `run` with --bogus dropped: any option before the command
    but -h, --help and --version is one line and exit 2, and nothing runs (no results folder)."""
    proc = _cli(*argv, cwd=tmp_path)
    _one_line_exit_2(proc, "unrecognized option", argv[0], "before the command")
    assert not (tmp_path / "results").exists() and not (tmp_path / "reports").exists()


@pytest.mark.parametrize("argv, meant", [(["--vers"], "--version"), (["--hel", "list"], "--help"),
                                         (["--v=1"], "--version")])
def test_an_abbreviated_option_before_the_command_names_the_option(argv, meant, tmp_path):
    """`treebench --vers` is not told to move --vers after a command (--version goes before one): the
    line names the option it abbreviates, as every subcommand's abbreviation line does."""
    proc = _cli(*argv, cwd=tmp_path)
    _one_line_exit_2(proc, f"{argv[0].split('=')[0]} is abbreviated", meant)
    assert "before the command" not in proc.stderr


@pytest.mark.parametrize("caps", ["{'devices': ('cpu',)}", "('cpu',)"])
def test_a_backend_whose_capabilities_is_not_a_capabilities_is_refused_before_any_row(tmp_path, caps):
    """A dict or tuple where `Capabilities(...)` belongs is the backend file's mistake, found when
    it loads: one line and exit 2, no rows (not an error row per case)."""
    (tmp_path / "mine.py").write_text(
        "from treebench import Backend\n\n\nclass Mine(Backend):\n    name = 'mine'\n"
        f"    capabilities = {caps}\n\n    def prepare(self, inputs):\n        return lambda: None\n")
    out = tmp_path / "rows.jsonl"
    for argv in (("check", "--backend"), ("run", "--backends")):
        proc = _cli(*argv, f"{tmp_path / 'mine.py'}:Mine", "--out", str(out), cwd=tmp_path)
        _one_line_exit_2(proc, "Mine.capabilities is a", "not a Capabilities", "treebench.Capabilities(...)")
        assert not out.exists()


CORRECT = "from tests.broken_backends import Correct\n"
BACKEND_FILES = {   # a backend file given without :Class, and what the one line says of it
    "two": (CORRECT + "class Helper:\n    pass\n\n\nclass A(Correct):\n    name = 'a'\n\n\nclass B(Correct):\n"
            "    name = 'b'\n", ["defines 2 backend classes (A, B)", "pick one as {f}:CLASS, e.g. {f}:A"]),
    "none": ("class Helper:\n    pass\n", ["{f} defines no backend class", "non-empty string `name`", "`prepare`"]),
    "imported": (CORRECT, ["{f} defines no backend class", "it imports Correct from elsewhere", "e.g. {f}:Correct"]),
    "nameless": (("from treebench import Backend\n\n\nclass Mine(Backend):\n    def prepare(self, inputs):\n"
                  "        return lambda: None\n"), ["{f} defines no backend class", "set `name` on Mine to"]),
}


@pytest.mark.parametrize("kind", BACKEND_FILES)
def test_a_backend_file_without_a_class_needs_exactly_one_backend_class(tmp_path, kind):
    """`--backend mine.py` takes the one backend class mine.py defines; none or several is one line, exit 2."""
    body, words = BACKEND_FILES[kind]
    f = tmp_path / "mine.py"
    f.write_text(body)
    out = tmp_path / "rows.jsonl"
    commands = [("check", "--backend", str(f))] + ([("run", "--backends", f"reference,{f}")] if kind == "two" else [])
    for argv in commands:
        proc = _cli(*argv, "--out", str(out), "--suite", "smoke", cwd=tmp_path)
        _one_line_exit_2(proc, f"{argv[1]} {str(f)!r}", *(w.format(f=f) for w in words))
        assert not out.exists()


@pytest.mark.parametrize("spec, argv", [
    ("nothere.py", ("check", "--backend", "{}")),
    ("sub/nothere", ("check", "--backend", "{}")),
    ("sub/nothere.py", ("check", "--backend", "{}")),
    ("nothere.py", ("run", "--backends", "reference,{}")),
])
def test_a_missing_backend_file_is_named_missing_not_unknown(tmp_path, spec, argv):
    proc = _cli(*argv[:2], argv[2].format(spec), "--out", str(tmp_path / "rows.jsonl"), cwd=tmp_path)
    _one_line_exit_2(proc, f"{argv[1]} {spec!r}: file {spec} not found")
    assert "unknown backend" not in proc.stderr and not (tmp_path / "rows.jsonl").exists()


def _user_backend(path: Path, cls: str, name: str, registered: bool = False) -> Path:
    head = "from treebench import register\n" + CORRECT + "\n\n@register\n" if registered else CORRECT + "\n\n"
    path.write_text(f"{head}class {cls}(Correct):\n    name = {name!r}\n")
    return path


@pytest.mark.parametrize("name, what", [("two\nlines", "the unprintable character '\\n'"),
                                        ("nul\x00", "the unprintable character '\\x00'"), ("a/b", "'/'")])
@pytest.mark.parametrize("argv", [("check", "--backend", "mine.py:Mine"), ("run", "--backends", "reference,mine.py")])
def test_a_backend_name_with_a_control_character_or_a_slash_is_refused_at_load(tmp_path, name, what, argv):
    """Such a name would split the terminal table's rows or read as a path: one line naming it, exit 2."""
    _user_backend(tmp_path / "mine.py", "Mine", name)
    out = tmp_path / "rows.jsonl"
    proc = _cli(*argv, "--suite", "smoke", "--out", str(out), cwd=tmp_path)
    _one_line_exit_2(proc, f"{argv[1]} {argv[2].split(',')[-1]!r}: Mine.name is {name!r}, which holds {what}")
    assert not out.exists()


@pytest.mark.parametrize("registered", [False, True], ids=["unregistered", "registered"])
@pytest.mark.parametrize("name", ["", "   "])
def test_an_empty_backend_name_is_refused_in_the_words_of_any_bad_name(tmp_path, name, registered):
    """An empty or blank `name` is named as a name holding '/' is, `Mine.name is '...'` (the class unquoted), also
    where @register refuses it as the module loads."""
    _user_backend(tmp_path / "mine.py", "Mine", name, registered)
    out = tmp_path / "rows.jsonl"
    proc = _cli("check", "--backend", "mine.py:Mine", "--suite", "smoke", "--out", str(out), cwd=tmp_path)
    _one_line_exit_2(proc, f"Mine.name is {name!r}; set `name` to a non-empty string")
    assert not out.exists()


@pytest.mark.parametrize("registered", [False, True], ids=["unregistered", "registered"])
@pytest.mark.parametrize("other", ["built_in", "user_file", "same_file"])
def test_two_backend_classes_of_one_name_are_named_by_their_sources(tmp_path, other, registered):
    """A backend name held by two classes is one line naming where each is defined (file or module, and
    class), so the user knows which to rename; the same file given twice is named as given twice."""
    mine = _user_backend(tmp_path / "mine.py", "Mine", "flex" if other == "built_in" else "twin", registered)
    theirs = {"built_in": "flex", "user_file": str(_user_backend(tmp_path / "b.py", "B", "twin", registered)),
              "same_file": "./mine.py:Mine"}[other]
    out = tmp_path / "rows.jsonl"
    proc = _cli("run", "--backends", f"{theirs},mine.py", "--suite", "smoke", "--out", str(out), cwd=tmp_path)
    verb = "registered by" if registered else "used by"
    built_in = (f"backend name 'flex' is registered by both treebench.backends.flex:FlexTree and {mine}:Mine"
                if registered else "backend name 'flex' is the built-in treebench.backends.flex:FlexTree's; give Mine")
    words = {"built_in": [built_in],
             "user_file": [f"backend name 'twin' is {verb} both {theirs}:B and {mine}:Mine", "`name`"],
             "same_file": [f"{mine}:Mine (backend name 'twin') is given twice; name each backend once"]}[other]
    _one_line_exit_2(proc, *words)
    assert not out.exists()


def test_a_user_backend_may_not_take_a_built_in_name_even_alone(tmp_path):
    """A user class named like a built-in adapter is refused on its own too: its rows would read as
    that adapter's in a results file, a report and the gate."""
    _user_backend(tmp_path / "mine.py", "Mine", "flex")
    out = tmp_path / "rows.jsonl"
    proc = _cli("check", "--backend", "mine.py:Mine", "--suite", "smoke", "--out", str(out), cwd=tmp_path)
    _one_line_exit_2(proc, "backend name 'flex' is the built-in treebench.backends.flex:FlexTree's",
                     "give Mine its own `name`")
    assert not out.exists()
