"""A backend file whose loading ends the process (os._exit, sys.exit, a segfault) or hangs it.

Under --isolate it is loaded first in a worker process: its pairs become error rows with
`failed_step` "import" and the sweep goes on with the other backends. Without --isolate an
os._exit or sys.exit while it loads is bad input (one line, exit 2), never a silent exit with
the backend's code, and a segfault gets a line naming the file and --isolate before the stack.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny_suites import tiny_suite
from treebench.harness.errors import ConfigError
from treebench.harness.run.loading import load_one
from treebench.harness.sweep.imports import probe

ROOT = Path(__file__).resolve().parent.parent
GOOD = "from tests.broken_backends import Correct\nclass B(Correct):\n    name = 'good_import'\n"
BODIES = {   # file name -> its code
    "exit0.py": "import os\nos._exit(0)\n",
    "exit3.py": "import os\nos._exit(3)\n",
    "sysexit.py": "raise SystemExit(0)\n",
    "segv.py": "import ctypes\nctypes.string_at(0)\n",
    "posix_exit.py": "import posix\nprint('going now', flush=True)\nposix._exit(5)\n",   # os._exit's twin, not replaced
    "hangs.py": "import time\ntime.sleep(120)\n",
    "good.py": GOOD,
}


def _files(tmp_path: Path, *names: str) -> list[str]:
    for name in names:
        (tmp_path / name).write_text(BODIES[name])
    return [str(tmp_path / n) for n in names]


def _cli(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "treebench", *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _suite(tmp_path: Path) -> str:
    (tmp_path / "tiny.toml").write_text(tiny_suite("tiny", (8, 37)))
    return str(tmp_path / "tiny.toml")


def test_a_prober_names_each_backend_whose_loading_ended_or_hung_it_and_goes_on(tmp_path):
    """One prober loads the files in turn; a death or a hang is blamed on the file it was loading, and
    a fresh prober loads the files after it; a file that loads is not named."""
    files = _files(tmp_path, "exit0.py", "segv.py", "exit3.py", "posix_exit.py", "sysexit.py", "hangs.py", "good.py")
    dead = probe(files, case_timeout_s=3)
    exit0, segv, exit3, posix_exit, sysexit, hangs, good = files
    assert "called os._exit(0)" in dead[exit0] and "called os._exit(3)" in dead[exit3]
    assert "called sys.exit(0)" in dead[sysexit]
    assert f"with signal SIGSEGV (-{int(signal.SIGSEGV)})" in dead[segv]
    assert dead[posix_exit] == ("loading it ended the worker process it was loaded in with exit code 5 "
                                "(its last output: going now)")
    assert "did not end within 3s (--case-timeout)" in dead[hangs]
    assert good not in dead and len(dead) == 6


@pytest.mark.parametrize("name, words", [("exit0.py", "called os._exit(0)"), ("exit3.py", "called os._exit(3)"),
                                         ("sysexit.py", "sys.exit(0)")])
def test_without_isolate_an_exit_while_loading_is_bad_input(tmp_path, name, words):
    """os._exit or sys.exit: not treebench ending with the backend's code and no line (0 read as a verdict): one line, exit 2."""
    (f,) = _files(tmp_path, name)
    out = tmp_path / "rows.jsonl"
    proc = _cli(tmp_path, "check", "--suite", _suite(tmp_path), "--backend", f, "--out", str(out))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("treebench: error: ") and words in lines[0] and f in lines[0]
    assert not out.exists()


def test_a_keyboard_interrupt_a_backend_raises_while_loading_is_bad_input_a_ctrl_c_an_interrupt(tmp_path, capsys):
    """`raise KeyboardInterrupt` in a backend's module is its own, as sys.exit there is: one line saying so,
    exit 2, as for one raised in a pair ("raised by the backend, not by a Ctrl-C"); a real SIGINT while the
    module loads stops the command as ever (exit 130)."""
    from treebench.harness.cli.main import main

    suite, out = _suite(tmp_path), tmp_path / "rows.jsonl"
    (tmp_path / "kbi.py").write_text("raise KeyboardInterrupt\n")
    (tmp_path / "init_kbi.py").write_text(GOOD + "    def __init__(self):\n        raise KeyboardInterrupt('mine')\n")
    (tmp_path / "ctrl_c.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGINT)\n" + GOOD)
    for name, words in (("kbi.py", ""), ("init_kbi.py", ": mine")):
        f = str(tmp_path / name)
        assert main(["check", "--suite", suite, "--backend", f, "--out", str(out)]) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"treebench: error: --backend '{f}': loading it raised KeyboardInterrupt (raised by the backend, not by "
            f"a Ctrl-C){words}"]
    assert main(["check", "--suite", suite, "--backend", str(tmp_path / "ctrl_c.py"), "--out", str(out)]) == 130
    assert capsys.readouterr().err.splitlines() == [
        "treebench: interrupted before this run's first row; nothing was written"]
    assert not out.exists()


def test_a_child_forked_while_a_backend_loads_exits_as_it_asked(tmp_path):
    """os._exit is replaced for the loading process alone: a child forked meanwhile really exits."""
    f = tmp_path / "forks.py"
    f.write_text("import os, warnings\n"
                 "with warnings.catch_warnings():\n"
                 "    warnings.simplefilter('ignore')\n"
                 "    pid = os.fork()\n"
                 "if pid == 0:\n"
                 "    os._exit(7)\n"
                 "STATUS = os.waitpid(pid, 0)[1]\n" + GOOD)
    backend = load_one(str(f))
    assert sys.modules[type(backend).__module__].STATUS == 7 << 8   # exit code 7
    assert os._exit.__module__ in ("posix", "nt")   # the real one is back


def test_without_isolate_an_os_exit_in_init_is_bad_input(tmp_path):
    f = tmp_path / "init_exits.py"
    f.write_text(GOOD + "    def __init__(self):\n        import os\n        os._exit(4)\n")
    with pytest.raises(ConfigError, match=r"loading it called os._exit\(4\)"):
        load_one(str(f))


def test_without_isolate_a_segfault_while_loading_names_the_file_and_isolate(tmp_path):
    (f,) = _files(tmp_path, "segv.py")
    proc = _cli(tmp_path, "check", "--suite", _suite(tmp_path), "--backend", f)
    assert proc.returncode in (-signal.SIGSEGV, 128 + signal.SIGSEGV), proc.stderr[-2000:]
    assert proc.stderr.startswith(f"treebench: loading backend {f} crashed the process"), proc.stderr[:2000]
    assert "--isolate" in proc.stderr.splitlines()[0] and f'File "{f}", line 2' in proc.stderr


def test_under_isolate_a_backend_whose_loading_ends_the_process_is_error_rows_and_the_sweep_goes_on(tmp_path):
    """run --isolate: os._exit and a segfault while loading are error rows at "import"; reference runs."""
    exit0, segv = _files(tmp_path, "exit0.py", "segv.py")
    out = tmp_path / "rows.jsonl"
    proc = _cli(tmp_path, "run", "--suite", _suite(tmp_path), "--backends", f"{exit0},{segv},reference", "--isolate",
                "--quiet", "--out", str(out), "--report", str(tmp_path / "r.html"))
    assert proc.returncode == 1, proc.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    by = {b: [r for r in rows if r["backend"] == b] for b in (exit0, segv, "reference")}
    assert [r["status"] for r in by["reference"]] == ["pass", "pass"]
    for spec, words in ((exit0, "loading it called os._exit(0)"), (segv, "with signal SIGSEGV")):
        assert len(by[spec]) == 2 and all(r["status"] == "error" and r["failed_step"] == "import" and
                                          words in r["reason"] for r in by[spec]), by[spec]
        assert f"--backends '{spec}': " in proc.stderr and "its pairs are error rows (failed_step import)" in proc.stderr


def test_under_isolate_a_backend_that_cannot_be_loaded_is_said_once_not_once_per_pair(tmp_path):
    """run --isolate of a file whose loading ends the worker: one warning line names it and why (as the README
    promises), not an INFO line per pair besides; the summary gives its error rows one line, not one per row;
    the rows are written as before, one error row per pair with failed_step import."""
    (f,) = _files(tmp_path, "exit3.py")
    out = tmp_path / "rows.jsonl"
    proc = _cli(tmp_path, "run", "--suite", _suite(tmp_path), "--backends", f"{f},reference", "--isolate",
                "--out", str(out), "--report", str(tmp_path / "r.html"))
    assert proc.returncode == 1, proc.stderr[-3000:]
    cause = "loading it called os._exit(3)"
    said = [line for line in proc.stderr.splitlines() if cause in line]
    assert len(said) == 1 and said[0].startswith(f"WARNING  --backends '{f}': {cause}"), proc.stderr
    assert "its pairs are error rows (failed_step import)" in said[0]
    summary = [line for line in proc.stdout.splitlines() if cause in line]
    assert len(summary) == 1 and summary[0].startswith(f"error: {f} on 2 cases: {cause}"), proc.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    mine = [r for r in rows if r["backend"] == f]
    assert len(mine) == 2 and all(r["status"] == "error" and r["failed_step"] == "import" and cause in r["reason"]
                                  for r in mine), mine
    assert [r["status"] for r in rows if r["backend"] == "reference"] == ["pass", "pass"]


def _worker_raises(tmp_path: Path) -> Path:
    """A file whose backend (named good_import) loads in treebench's process but raises in a worker process."""
    f = tmp_path / "worker_raises.py"
    f.write_text("import multiprocessing\nif multiprocessing.parent_process() is not None:\n"
                 "    raise RuntimeError('no kernel in a worker')\n" + GOOD)
    return f


def test_under_isolate_a_backend_whose_workers_cannot_load_it_is_said_once_not_once_per_pair(tmp_path):
    """A file that loads in treebench's process but raises as each pair's worker loads it: its rows are error rows
    with failed_step import, said in one warning line naming it and why, and in one summary line; the line and the
    rows name it by the name it has in treebench's process, as its rows of a working run do, not by the file."""
    f = _worker_raises(tmp_path)
    out = tmp_path / "rows.jsonl"
    proc = _cli(tmp_path, "run", "--suite", _suite(tmp_path), "--backends", f"{f},reference", "--isolate",
                "--out", str(out), "--report", str(tmp_path / "r.html"))
    assert proc.returncode == 1, proc.stderr[-3000:]
    cause = "loading the backend in the worker: RuntimeError: no kernel in a worker"
    said = [line for line in proc.stderr.splitlines() if "no kernel in a worker" in line]
    assert said == [f"WARNING  good_import: {cause}; each pair whose worker cannot load it is an error row "
                    "(failed_step import)"], proc.stderr
    assert [line for line in proc.stdout.splitlines() if "no kernel" in line] == [
        f"error: good_import on 2 cases: {cause}"]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["status"], r["failed_step"], r["reason"]) for r in rows if r["backend"] == "good_import"] == [
        ("error", "import", cause)] * 2, rows
    assert {r["backend"] for r in rows} == {"good_import", "reference"}, rows


@pytest.mark.parametrize("command", ["run", "check"])
def test_under_isolate_a_resume_finds_the_rows_of_a_backend_its_workers_cannot_load(tmp_path, command):
    """Those rows carry the backend's name as loaded in treebench's process, not the --backends text as typed
    (`path/file.py`): a --resume matches them with the backend's pairs, finds each stored and runs none again."""
    f = _worker_raises(tmp_path)
    out = tmp_path / "rows.jsonl"
    argv = [command, "--suite", _suite(tmp_path), "--backends", str(f), "--isolate", "--out", str(out),
            *(["--report", str(tmp_path / "r.html")] if command == "run" else [])]
    assert _cli(tmp_path, *argv).returncode == 1
    first = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["backend"], r["failed_step"]) for r in first] == [("good_import", "import")] * 2, first
    again = _cli(tmp_path, *argv, "--resume")
    assert again.returncode == 1, again.stderr[-3000:]
    assert "nothing to run: all 2 " in again.stderr and "no kernel in a worker" not in again.stderr, again.stderr
    assert [json.loads(line) for line in out.read_text().splitlines()] == first


def test_check_under_isolate_of_a_backend_that_exits_while_loading_fails_with_its_error_rows(tmp_path):
    (f,) = _files(tmp_path, "exit0.py")
    out = tmp_path / "rows.jsonl"
    proc = _cli(tmp_path, "check", "--suite", _suite(tmp_path), "--backend", f, "--isolate", "--quiet",
                "--out", str(out))
    assert proc.returncode == 1, proc.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and {(r["backend"], r["status"], r["failed_step"]) for r in rows} == {(f, "error", "import")}


@pytest.mark.parametrize("name, words", [("exit3.py", "loading it called os._exit(3)"),
                                         ("segv.py", "with signal SIGSEGV")])
@pytest.mark.parametrize("dry_run", [False, True])
def test_the_default_check_of_a_backend_that_cannot_be_loaded_says_so_once_and_writes_nothing(tmp_path, name, words,
                                                                                              dry_run):
    """check --isolate without --suite: the default check is built from the capabilities the backend declares,
    and one whose loading ended the worker declared none; so no case is checked or written (no error rows of a
    check built without them), one line names the backend and why, and the check exits 1, as on error rows;
    its dry run says the same and exits as the check would."""
    (f,) = _files(tmp_path, name)
    out = tmp_path / "rows.jsonl"
    proc = _cli(tmp_path, "check", "--backend", f, "--isolate", "--out", str(out), *(["--dry-run"] if dry_run else []))
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert not out.exists() and not list(tmp_path.glob("env-*.json"))
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(said) == 1 and words in said[0] and f"--backend '{f}' could not be loaded: " in said[0], said
    assert "the default check is built from the capabilities" in said[0] and "nothing was checked" in said[0]


def test_check_under_isolate_of_a_file_that_raises_while_loading_is_bad_input_with_or_without_suite(tmp_path):
    """A file whose import raises is loaded again in treebench's process, where that is bad input (exit 2,
    one line), as in `run`: with --suite and for the default check alike."""
    f = tmp_path / "raises.py"
    f.write_text("raise RuntimeError('no kernel here')\n")
    for suite in ([], ["--suite", _suite(tmp_path)]):
        proc = _cli(tmp_path, "check", *suite, "--backend", str(f), "--isolate")
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
            f"treebench: error: --backend '{f}': loading it raised RuntimeError: no kernel here"], proc.stderr


@pytest.mark.parametrize("command", ["run", "check"])
def test_a_dry_run_counts_the_pairs_of_a_backend_that_cannot_be_loaded_as_errors_not_as_pairs_to_run(tmp_path,
                                                                                                    command):
    """--dry-run --isolate loads each backend file in a worker first, as the run does: the pairs of one whose
    loading ended the worker are counted as error rows to come, not as pairs to run (nor in the time
    estimate), the line names the backend, and the dry run exits 1, as the run will."""
    (f,) = _files(tmp_path, "exit3.py")
    backends = ["--backends", f"{f},reference"] if command == "run" else ["--backend", f]
    proc = _cli(tmp_path, command, "--suite", _suite(tmp_path), *backends, "--isolate", "--dry-run")
    assert proc.returncode == 1, proc.stderr[-3000:]
    plan = " ".join(proc.stdout.split())
    to_run = "2 pairs to run here, 2 to be recorded as" if command == "run" else "0 pairs to run here, 2 would be"
    assert f"{to_run} errors ({f}: cannot be loaded)" in plan, plan   # a check without --out records nothing
    assert ("(2 pairs, " in plan) if command == "run" else ("estimated time" not in plan), plan
    assert proc.stderr.count("loading it called os._exit(3)") == 1, proc.stderr


def test_the_plan_of_a_sweep_counts_the_pairs_that_will_be_error_rows_before_they_run():
    """runner.plan_pairs (what --dry-run counts): the pairs of a backend that could not be loaded, or whose
    availability() raised, are errors to come, each backend named with why, neither pairs to run nor skips;
    a stored pair is not counted; the run then writes exactly that many error rows."""
    from dataclasses import replace

    from tests.broken_backends import Correct
    from treebench.harness.model.cases import Case
    from treebench.harness.run.config import RunConfig
    from treebench.harness.run.runner import plan_pairs, run_cases
    from treebench.harness.sweep.imports import UnloadedBackend

    class Raises(Correct):
        name = "raises"

        def availability(self):
            raise RuntimeError("no driver")

    case = Case(batch_size=2, context_len=5, tree="chain:2", num_q_heads=2, num_kv_heads=1, head_dim=8,
                dtype="float32", page_size=4)
    cases = [case, replace(case, context_len=37)]
    backends = [UnloadedBackend("gone.py", "loading it called os._exit(3)"), Raises(), Correct()]
    config = RunConfig(mode="check", device="cpu", quiet=True)
    plan = plan_pairs(cases, backends, frozenset({(cases[1].case_id, "raises")}), config, "cpu")
    assert (plan.failed, plan.skipped, [n for _, n in plan.to_run]) == (3, 0, ["correct", "correct"])
    assert plan.failing["gone.py"] == "cannot be loaded"
    raised = plan.failing["raises"]
    assert raised.startswith("availability() raised RuntimeError") and "no driver" in raised
    rows = run_cases(cases, backends, replace(config, skip=frozenset({(cases[1].case_id, "raises")})))
    assert sum(r["status"] == "error" for r in rows) == plan.failed
