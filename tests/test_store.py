"""The results store: atomic appends, torn lines, schema, env fingerprints."""

from __future__ import annotations

import errno
import importlib.metadata
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from treebench.harness.errors import ConfigError, ResultsWriteError
from treebench.harness.model.cases import Case
from treebench.harness.store import env as store_env
from treebench.harness.store import rows as store
from treebench.harness.store.env import env_fingerprint, env_id_of, read_envs, write_env
from treebench.harness.store.paths import check_writable
from treebench.harness.store.remove import Removed, describe, remove_rows
from treebench.harness.store import names as store_names
from treebench.harness.store.names import new_run_id
from treebench.harness.store.rows import SCHEMA, append_row, find_row, migrate_row, read_rows

ROOT = Path(__file__).resolve().parent.parent


def _row(i: int, **extra) -> dict:
    return {"schema": SCHEMA, "run_id": "r", "backend": "b", "case_id": f"c{i}", "status": "pass",
            "case": Case(batch_size=1, context_len=16, tree="chain:3").axes, **extra}


def test_a_results_file_may_start_with_a_utf8_byte_order_mark(tmp_path):
    """As a Windows editor saves one: its rows are read, placed and appended to (not "not a treebench
    results file")."""
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + (json.dumps(_row(0)) + "\n").encode())
    check_writable(path)
    append_row(path, _row(1))
    assert [r["case_id"] for r in read_rows([path])] == ["c0", "c1"]
    assert find_row([path], lambda r: r["case_id"] == "c0").line == 1


def test_append_is_one_write_of_one_full_line(tmp_path, monkeypatch):
    calls = []
    real_write = os.write
    monkeypatch.setattr(store.os, "write", lambda fd, data: calls.append(data) or real_write(fd, data))
    path = tmp_path / "sub" / "r.jsonl"
    for i in range(3):
        append_row(path, _row(i, samples_us=[1.5] * 37))
    assert len(calls) == 3
    assert all(c.endswith(b"\n") and c.count(b"\n") == 1 for c in calls)
    assert [r["case_id"] for r in read_rows([path])] == ["c0", "c1", "c2"]


def test_append_never_truncates(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(_row(0)) + "\n")
    before = path.read_bytes()
    check_writable(path)
    append_row(path, _row(1))
    assert path.read_bytes().startswith(before)
    assert len(read_rows([path])) == 2


def test_torn_last_line_is_skipped_with_a_warning(tmp_path, caplog):
    path = tmp_path / "r.jsonl"
    append_row(path, _row(0))
    with open(path, "ab") as f:
        f.write(b'{"schema": 1, "run_id": "r", "backe')   # a run killed mid-row
    with caplog.at_level(logging.WARNING, logger="treebench.harness.store.rows"):
        rows = read_rows([path])
    assert [r["case_id"] for r in rows] == ["c0"]
    assert any("r.jsonl:2" in m and "torn" in m for m in caplog.messages)


@pytest.mark.parametrize("size", [17, 4155, 200_000])   # a row cut in its first page, at a page, past CHUNK
@pytest.mark.parametrize("many", [False, True])
def test_append_after_a_torn_line_sets_it_aside_and_keeps_every_row_whole(tmp_path, caplog, size, many):
    """The torn row a killed writer left is moved to r.jsonl.torn, byte for byte and with a newline,
    before the next append (append_row, and append_rows as merge appends); the results file is cut back
    to its last newline, so it reads without a torn-line warning. One warning line says so."""
    path = tmp_path / "r.jsonl"
    append_row(path, _row(0))
    before = path.read_bytes()
    torn = (b'{"schema": 1, "case_id": "c9", "pad": "' + b"x" * size)[:size]
    with open(path, "ab") as f:
        f.write(torn)
    with caplog.at_level(logging.WARNING, logger="treebench"):
        if many:
            store.append_rows(path, [_row(1), _row(2)])
        else:
            append_row(path, _row(1))
    side = tmp_path / "r.jsonl.torn"
    assert caplog.messages == [(f"{path} ended in a torn line ({size} bytes, a row cut short by a killed writer): "
                                f"moved to {side} before appending")]
    assert side.read_bytes() == torn + b"\n"
    assert path.read_bytes().startswith(before) and path.read_bytes().count(b"\n") == (3 if many else 2)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="treebench"):
        rows = read_rows([path])
    assert [r["case_id"] for r in rows] == (["c0", "c1", "c2"] if many else ["c0", "c1"])
    assert not caplog.messages


def test_torn_lines_of_later_kills_are_added_to_the_side_file(tmp_path):
    """A file torn again, after a side file holds an earlier torn row, and a file whose only line is
    torn (killed in its first row): each torn row is added to the side file, one line each."""
    path, side = tmp_path / "r.jsonl", tmp_path / "r.jsonl.torn"
    path.write_bytes(b'{"schema": 2, "run_id": "a')
    append_row(path, _row(0))
    with open(path, "ab") as f:
        f.write(b'{"schema": 2, "run_id": "b')
    append_row(path, _row(1))
    assert side.read_bytes() == b'{"schema": 2, "run_id": "a\n{"schema": 2, "run_id": "b\n'
    assert [r["case_id"] for r in read_rows([path])] == ["c0", "c1"]


@pytest.mark.parametrize("last", [json.dumps(_row(0)), json.dumps(_row(0)) + " \r", "  "])
def test_a_whole_last_line_without_its_newline_is_kept(tmp_path, caplog, last):
    """A file edited by hand may lose its final newline: a last line that parses (or is blank) is
    whole, so the append only writes the newline first; nothing is set aside or warned of."""
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(_row(5)) + "\n" + last)
    before = path.read_bytes()
    with caplog.at_level(logging.WARNING, logger="treebench"):
        append_row(path, _row(1))
        rows = read_rows([path])
    assert path.read_bytes() == before + b"\n" + (json.dumps(_row(1)) + "\n").encode()
    assert [r["case_id"] for r in rows] == (["c5", "c1"] if not last.strip() else ["c5", "c0", "c1"])
    assert not (tmp_path / "r.jsonl.torn").exists() and not caplog.messages


def test_a_side_file_that_cannot_be_written_leaves_the_results_file_as_it_was(tmp_path):
    """Where the torn row cannot be kept (its side file cannot be written), nothing is cut and
    nothing appended: the error names the side file."""
    path, side = tmp_path / "r.jsonl", tmp_path / "r.jsonl.torn"
    append_row(path, _row(0))
    with open(path, "ab") as f:
        f.write(b'{"schema": 2, "run_id": "a')
    before = path.read_bytes()
    side.mkdir()                                                  # a folder in its way
    with pytest.raises(ResultsWriteError) as e:
        append_row(path, _row(1))
    assert e.value.filename == str(side)
    assert path.read_bytes() == before


def test_killed_writer_leaves_only_whole_rows(tmp_path):
    path = tmp_path / "r.jsonl"
    code = ("import sys; from treebench.harness.store.rows import append_row\n"
            "for i in range(10**6): append_row(sys.argv[1], {'schema': 1, 'i': i, 'pad': 'x' * 3000})\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 60
        while (not path.exists() or path.stat().st_size < 200_000) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    rows = read_rows([path])
    assert len(rows) >= 50
    assert [r["i"] for r in rows] == list(range(len(rows)))


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EDQUOT])
@pytest.mark.parametrize("fails", ["write", "fsync"])
@pytest.mark.parametrize("many", [False, True])
def test_an_append_that_fails_part_way_leaves_exactly_the_earlier_rows(tmp_path, monkeypatch, caplog, err, fails,
                                                                       many):
    """A full disk mid-row (half the bytes written, then ENOSPC or EDQUOT; or the fsync refusing
    them): the file is cut back to the rows before, reads without a torn-line warning, and the
    error names the file."""
    path = tmp_path / "r.jsonl"
    for i in range(2):
        append_row(path, _row(i))
    before, real_write = path.read_bytes(), os.write

    def half_then_full(fd, data):
        real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(err, os.strerror(err))

    def written_then_full(fd, data):
        return real_write(fd, data) if fails == "fsync" else half_then_full(fd, data)

    with monkeypatch.context() as m, pytest.raises(OSError) as e:
        m.setattr(store.os, "write", written_then_full)
        if fails == "fsync":
            m.setattr(store.os, "fsync", lambda fd: half_then_full(fd, b""))
        store.append_rows(path, [_row(2), _row(3)]) if many else append_row(path, _row(2, samples_us=[1.5] * 37))
    assert (e.value.errno, e.value.filename) == (err, str(path))
    assert path.read_bytes() == before
    check_writable(path)                                     # a file that --out takes as it is
    with caplog.at_level(logging.WARNING, logger="treebench"):
        assert [r["case_id"] for r in read_rows([path])] == ["c0", "c1"]
    assert not caplog.records
    append_row(path, _row(2))                                # and the next row lands on a line of its own
    assert [r["case_id"] for r in read_rows([path])] == ["c0", "c1", "c2"]


@pytest.mark.parametrize("bad", [{"schema": 0}, {"schema": "2"}, {"schema": None}])
def test_unknown_schema_is_refused(tmp_path, bad):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(_row(0)) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ConfigError, match=rf"r\.jsonl:2: schema {bad['schema']!r}, this treebench reads schemas 1 to"):
        read_rows([path])


@pytest.mark.parametrize("line, n, what", [('{"x": 1}', 1, "has no schema field"),
                                           ('[1, 2]', 1, "is not a JSON object"),
                                           ("ROW\n{}", 2, "has no schema field")])
def test_json_without_a_schema_field_is_not_a_results_file(tmp_path, line, n, what):
    """JSON lines of something else are named as such, not as rows of schema None."""
    path = tmp_path / "r.jsonl"
    path.write_text(line.replace("ROW", json.dumps(_row(0))) + "\n")
    with pytest.raises(ConfigError) as e:
        read_rows([path])
    assert str(e.value) == (f"results file {path}: not a treebench results file (line {n} {what}); give .jsonl "
                            "files written by treebench run")
    with pytest.raises(ConfigError, match=rf"not a treebench results file \(line {n}: "
                                          f"{'no schema field' if 'schema' in what else 'not a result row'};"):
        check_writable(path)


def test_read_rows_takes_folders_and_rejects_missing_paths(tmp_path):
    append_row(tmp_path / "a.jsonl", _row(0))
    append_row(tmp_path / "b.jsonl", _row(1))
    assert [r["case_id"] for r in read_rows([tmp_path])] == ["c0", "c1"]
    assert len(read_rows(tmp_path / "a.jsonl")) == 1
    with pytest.raises(ConfigError, match="nope.jsonl: not found"):
        read_rows([tmp_path / "nope.jsonl"])
    with pytest.raises(ConfigError, match="/dev/null: is not a regular file"):   # it exists: not "not found"
        read_rows(["/dev/null"])


def test_find_row_names_the_file_and_line_of_the_first_match(tmp_path):
    """The one search the readers name a row's file and line with (a bad row, a row of a missing
    env): files in read_rows' order, folders expanded, lines counted over torn and blank lines,
    older rows matched as migrated, None when no row matches."""
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text(json.dumps(_row(0)) + "\n")
    second.write_text('{"schema": 2, "run_id": "r", "backe\n' + "\n"          # a torn line, a blank one
                      + json.dumps({**_row(1), "schema": 1, "backend": "triton_causal"}) + "\n"
                      + json.dumps(_row(2, env="e9")) + "\n")
    hit = find_row([tmp_path], lambda r: r.get("env") == "e9")
    assert hit is not None and (hit.path, hit.line, hit.row["case_id"]) == (second, 4, "c2")
    hit = find_row([tmp_path], lambda r: r.get("mask_kind") == "causal")       # schema 1: mask_kind migrated
    assert hit is not None and (hit.path, hit.line) == (second, 3)
    assert find_row([second, first], lambda r: r["backend"] == "b").path == second
    assert find_row([first, second], lambda r: r["backend"] == "b").path == first
    hit = find_row([tmp_path], lambda r: True, containing="e9")                 # only lines holding e9 parsed
    assert hit is not None and hit.line == 4
    assert find_row([tmp_path], lambda r: r["case_id"] == "c7") is None
    with pytest.raises(ConfigError, match="nope.jsonl: not found"):
        find_row([tmp_path / "nope.jsonl"], lambda r: True)


def test_check_writable_refuses_a_directory(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        check_writable(tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="cannot write"):
        check_writable(blocker / "r.jsonl")


def test_env_fingerprint_on_cpu(monkeypatch):
    monkeypatch.setitem(store_env.PACKAGES, "not_here", "treebench-no-such-distribution")
    env = env_fingerprint("cpu", peak_bw_bytes_per_s=None)
    for key in ("env_id", "gpu_name", "sm_count", "driver", "cuda", "python", "torch", "triton", "xformers",
                "flashinfer", "git_commit", "hostname", "platform", "peak_bw_bytes_per_s"):
        assert key in env
    assert env["torch"] == importlib.metadata.version("torch")
    assert env["not_here"] is None
    assert env["gpu_name"] is None and env["peak_bw_bytes_per_s"] is None
    assert env["env_id"] == env_id_of(env) == env_fingerprint("cpu")["env_id"]
    assert "treebench-no-such-distribution" not in sys.modules


def test_env_id_ignores_the_measured_peak_only():
    env = {"torch": "2.6", "hostname": "h", "peak_bw_bytes_per_s": 1e12}
    assert env_id_of(env) == env_id_of({**env, "peak_bw_bytes_per_s": 2e12})
    assert env_id_of(env) != env_id_of({**env, "torch": "2.7"})
    assert len(env_id_of(env)) == 12


def test_env_files_round_trip(tmp_path):
    env = {"env_id": "abc123", "torch": "2.6", "peak_bw_bytes_per_s": 1.0}
    path = write_env(tmp_path, env)
    assert path.name == "env-abc123.json"
    write_env(tmp_path, {**env, "peak_bw_bytes_per_s": 9.0})           # kept as it was
    append_row(tmp_path / "run.jsonl", _row(0, env="abc123"))
    for source in ([path], [tmp_path], [tmp_path / "run.jsonl"]):
        assert read_envs(source) == {"abc123": env}
    (tmp_path / "env-bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="env-bad.json"):
        read_envs([tmp_path])


@pytest.mark.parametrize("row, flushed, label", [
    ({"timer": "cuda_graph", "l2_flushed": True}, True, "cuda_graph, L2 flushed"),
    ({"timer": "cuda_graph", "l2_flushed": False}, False, "cuda_graph, warm L2"),
    ({"timer": "cuda_event"}, True, "cuda_event, L2 flushed"),        # older rows: the default flushed on a GPU
    ({"timer": "host_inclusive", "l2_flushed": None}, True, "host_inclusive, L2 flushed"),
    ({"timer": "wall"}, False, "wall"),                                                   # ... never on the CPU
    ({"timer": "wall", "l2_flushed": False}, False, "wall"),
    ({"timer": None, "l2_flushed": None}, None, None),                # check and skipped rows: no timing
    ({}, None, None),
])
def test_l2_state_of_new_and_older_rows(row, flushed, label):
    assert store.row_l2_flushed(row) is flushed and store.timing_label(row) == label


def test_rows_have_an_l2_flushed_field_after_timer_fallback():
    i = store.ROW_FIELDS.index("timer_fallback")
    assert store.ROW_FIELDS[i + 1] == "l2_flushed"


# ---- schema: migration of older rows, refusal of newer ones -------------------------------

def test_a_newer_schema_is_refused_in_one_line_naming_file_line_and_fix(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(_row(0)) + "\n" + json.dumps({**_row(1), "schema": SCHEMA + 1}) + "\n")
    with pytest.raises(ConfigError, match=r"r\.jsonl:2: schema 3, newer .*upgrade treebench") as e:
        read_rows([path])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("backend, kind", [("triton_causal", "causal"), ("causal_baseline", "causal"),
                                           ("triton_tree", "tree"), ("some_plugin", "tree")])
def test_schema_1_rows_are_migrated_with_the_mask_kind_guessed_from_the_backend(tmp_path, backend, kind):
    old = {**_row(0, backend=backend), "schema": 1, "timer": "wall"}
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old) + "\n")
    (row,) = read_rows([path])
    assert row == {**old, "schema": SCHEMA, "mask_kind": kind, "cpu_threads": None}
    assert migrate_row(row) is row                      # a current row is left as it is
    append_row(path, _row(1))                           # a schema-1 file takes new rows
    assert [r["schema"] for r in read_rows([path])] == [SCHEMA, SCHEMA]


def test_committed_results_stay_readable():
    files = sorted((ROOT / "results").rglob("*.jsonl"))
    assert files, "no committed results to read"
    rows = read_rows(files[:5])
    assert rows and all(r["schema"] == SCHEMA and r["mask_kind"] in ("tree", "causal") for r in rows)


def test_run_ids_are_unique_and_start_with_the_utc_time():
    ids = {new_run_id() for _ in range(200)}
    assert len(ids) == 200 and all(len(i) == 23 and i[8] == "T" and i[15:17] == "Z-" for i in ids)


def test_the_run_ids_treebench_makes_pass_the_check_of_ids_given_from_outside():
    """Fresh ids and torchrun's (`torchrun-` + its uuid4 rendezvous id) stay valid; what breaks a
    file name or a command line does not."""
    import uuid

    for run_id in [new_run_id() for _ in range(50)] + [f"torchrun-{uuid.uuid4()}" for _ in range(50)]:
        assert store_names.check_run_id(run_id, "id", "fix") == run_id
    assert store_names.check_run_id("x" * store_names.RUN_ID_MAX, "id", "fix")
    for bad in ("", "a/b", "a b", "-a", ".a", "a\n", "é", "x" * (store_names.RUN_ID_MAX + 1)):
        with pytest.raises(ConfigError, match=r"^id '.*': a run id may hold only .*; fix$"):
            store_names.check_run_id(bad, "id", "fix")


# ---- the env fingerprint: CPU and threads, the peak handed in -------------------------------

def test_env_records_cpu_and_threads_and_they_count_in_env_id(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    env = env_fingerprint("cpu")
    assert env["cpu_count"] == os.cpu_count() and env["omp_num_threads"] == "3"
    assert isinstance(env["cpu_model"], (str, type(None))) and env["torch_threads"] >= 1
    for field, other in (("cpu_model", "another CPU"), ("cpu_count", 999), ("torch_threads", 77),
                         ("omp_num_threads", None)):
        assert env_id_of({**env, field: other}) != env["env_id"], field
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert env_fingerprint("cpu")["omp_num_threads"] is None


@pytest.mark.parametrize("threads, shown", [(0, "0"), (-4, "-4"), (1.0, "1.0"), (2.5, "2.5"), (True, "true"),
                                            ("16", "a string"), (None, "null"), ([16], "an array")])
def test_an_env_file_whose_torch_threads_no_run_wrote_is_refused(tmp_path, threads, shown):
    """torch_threads is torch.get_num_threads() as the run began: an integer >= 1, never null. Any other value
    in an env file is refused by every reader of env files (`read_envs`), in one line naming the file and
    the field, as a row's cpu_threads is."""
    env = {**env_fingerprint("cpu"), "torch_threads": threads}
    path = tmp_path / f"env-{env['env_id']}.json"
    path.write_text(json.dumps(env))
    with pytest.raises(ConfigError) as e:
        read_envs([tmp_path])
    assert str(e.value) == (f"env file {path}: field 'torch_threads' is {shown}, expected an integer >= 1 (torch's "
                            "intra-op threads as the run began); remove or repair it (a run on the machine it "
                            "describes writes it again beside its results)")


@pytest.mark.parametrize("threads", [1, 2, 37, "absent"])
def test_an_env_file_with_torch_threads_as_runs_write_it_is_read(tmp_path, threads):
    """A thread count, or none at all (env files written before torch_threads was recorded), is read."""
    env = {**env_fingerprint("cpu"), "torch_threads": threads}
    if threads == "absent":
        del env["torch_threads"]
    (tmp_path / f"env-{env['env_id']}.json").write_text(json.dumps(env))
    assert read_envs([tmp_path]) == {env["env_id"]: env}


def test_report_and_gate_refuse_an_env_file_whose_torch_threads_no_run_wrote(tmp_path, capsys):
    """One line, exit 2, nothing written: the report and the gate read each env file beside their rows."""
    import shutil

    from treebench.harness.cli.main import main

    base = ROOT / "tests" / "data" / "results" / "h200-baseline"
    cand = shutil.copytree(base, tmp_path / "cand")
    (env_file,) = cand.glob("env-*.json")
    env_file.write_text(json.dumps({**json.loads(env_file.read_text()), "torch_threads": -1}))
    for argv in (["report", str(cand), "-o", str(tmp_path / "r.html")],
                 ["gate", "--baseline", str(base), "--candidate", str(cand), "--junit", str(tmp_path / "g.xml")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"env file {env_file}: field 'torch_threads' is -1, expected" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cand"]


def test_cpu_model_from_cpuinfo_else_platform(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Example CPU @ 2.0GHz\n")
    monkeypatch.setattr(store_env, "CPUINFO", info)
    assert store_env._cpu_model() == "Example CPU @ 2.0GHz"
    monkeypatch.setattr(store_env, "CPUINFO", tmp_path / "missing")
    monkeypatch.setattr(store_env.platform, "processor", lambda: "x86_64")
    assert store_env._cpu_model() == "x86_64"


def test_env_records_the_peak_it_is_handed_and_measures_nothing(monkeypatch):
    from treebench.harness.timing import bandwidth

    monkeypatch.setattr(bandwidth, "measure_peak_bandwidth", lambda *a, **k: pytest.fail("measured"))
    monkeypatch.setattr(bandwidth, "measure_matrix_rate", lambda *a, **k: pytest.fail("measured"))
    assert env_fingerprint("cpu", 1.5e12)["peak_bw_bytes_per_s"] == 1.5e12
    assert env_fingerprint("cpu")["peak_bw_bytes_per_s"] is None
    env = env_fingerprint("cpu", 1.5e12, peak_matmul_tflops=712.5)
    assert env["peak_matmul_tflops"] == 712.5 and env_fingerprint("cpu")["peak_matmul_tflops"] is None
    assert env["env_id"] == env_fingerprint("cpu")["env_id"]          # measured peaks do not change the env id
    assert "import" not in "".join(ln for ln in Path(store_env.__file__).read_text().splitlines() if "timing" in ln)


# ---- remove_rows ------------------------------------------------------------------------------

def _store_of(path: Path, rows: list[dict]) -> list[bytes]:
    for r in rows:
        append_row(path, r)
    return path.read_bytes().splitlines(keepends=True)


ROWS = [_row(0, run_id="r1", env="e1", backend="a"), _row(1, run_id="r2", env="e1", backend="b"),
        _row(2, run_id="r2", env="e2", backend="a"), _row(3, run_id="r3", env="e2", backend="c")]


@pytest.mark.parametrize("filters, removed", [
    ({"run_ids": ["r2"]}, {1, 2}),
    ({"backends": ("c",)}, {3}),
    ({"env_ids": {"e1"}}, {0, 1}),
    ({"run_ids": ["r2"], "backends": ["a"]}, {2}),                # kinds combine with AND
    ({"run_ids": ["r1", "r2"], "backends": ["a"]}, {0, 2}),       # values of one kind with OR
    ({"run_ids": ["r2", "r3"], "backends": ["b", "c"], "env_ids": ["e1", "e2"]}, {1, 3}),
    ({"run_ids": "r3"}, {3}),                                      # one string is one value
])
def test_remove_rows_removes_exactly_the_matching_rows(tmp_path, filters, removed):
    path = tmp_path / "r.jsonl"
    lines = _store_of(path, ROWS)
    assert remove_rows(path, **filters) == Removed(len(removed), ())
    assert path.read_bytes() == b"".join(line for i, line in enumerate(lines) if i not in removed)


def test_describe_names_each_kind_and_its_values():
    assert describe(run_ids=["r2", "r1"], env_ids="e1") == "run_id 'r1' or 'r2' and env 'e1'"
    assert describe(backends=("torch_sdpa",)) == "backend 'torch_sdpa'"


def test_remove_rows_keeps_a_torn_line_as_it_is(tmp_path):
    path = tmp_path / "r.jsonl"
    _store_of(path, ROWS[:2])
    with open(path, "ab") as f:
        f.write(b'{"schema": 2, "run_id": "r1", "backe')        # a writer killed mid-row
    assert remove_rows(path, run_ids=["r1"]) == Removed(1, ())
    assert path.read_bytes().endswith(b'\n{"schema": 2, "run_id": "r1", "backe')
    assert [r["case_id"] for r in read_rows([path])] == ["c1"]


def test_remove_rows_warns_of_the_torn_line_it_keeps(tmp_path, caplog):
    """A torn last line is kept (it matches nothing) and named in a warning, as report, merge and
    --resume name it; a blank line is not warned about, and a refused rm warns of nothing."""
    path = tmp_path / "r.jsonl"
    _store_of(path, ROWS[:2])
    with open(path, "ab") as f:
        f.write(b'\n{"schema": 2, "run_id": "r1", "backe')     # a blank line, then a writer killed mid-row
    with caplog.at_level(logging.WARNING, logger="treebench"), pytest.raises(ConfigError, match="no row has"):
        remove_rows(path, run_ids=["nosuch"])
    assert not caplog.records
    with caplog.at_level(logging.WARNING, logger="treebench"):
        assert remove_rows(path, run_ids=["r1"]) == Removed(1, ())
    assert [r.getMessage() for r in caplog.records] == [
        f"rm {path}:4: skipping a torn or malformed result line (kept in the file as it is)"]
    assert path.read_bytes().endswith(b'\n\n{"schema": 2, "run_id": "r1", "backe')


def test_remove_rows_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    _store_of(path, ROWS)
    before = path.read_bytes()

    def fail(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr("os.replace", fail)                         # the temp file is written, the rename fails
    with pytest.raises(ConfigError, match="cannot rewrite it .*unchanged"):
        remove_rows(path, run_ids=["r2"])
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]   # no temporary file left


@pytest.mark.parametrize("filters, match", [
    ({"run_ids": ["nosuch"]}, "no row has run_id 'nosuch' .*run_ids here: r1, r2, r3"),
    ({"run_ids": ["nope"], "env_ids": ["none"]}, "no row has run_id 'nope'"),
    ({"run_ids": ["r1"], "backends": ["typo"]}, "no row has backend 'typo' .*backends here: a, b, c"),   # r1 alone
    ({"env_ids": ["e1", "e9"]}, "no row has env 'e9'"),
    ({"run_ids": ["r1"], "backends": ["c"]},                                    # each names rows, never together
     r"no row has run_id 'r1' and backend 'c' \(each value names rows, but no row matches them all\)"),
    ({"run_ids": ["r1", "r3"], "backends": ["b", "c"], "env_ids": ["e1"]},
     "no row has run_id 'r1' or 'r3' and backend 'b' or 'c' and env 'e1'"),
    ({"run_ids": ["r2", "r3"], "backends": ["a"]},                              # r2 does, r3 has no row of a
     r"no row with backend 'a' has run_id 'r3' \(run_ids of those rows: r1, r2\)"),
])
def test_remove_rows_refuses_a_value_that_names_no_row(tmp_path, filters, match):
    """A value matching no row, or no row the other kinds select, and filters no row matches
    together are typos: rm names them and removes nothing, not even the rows the other values match."""
    path = tmp_path / "r.jsonl"
    _store_of(path, ROWS)
    before = path.read_bytes()
    with pytest.raises(ConfigError, match=match) as e:
        remove_rows(path, **filters)
    assert "\n" not in str(e.value) and "nothing removed" in str(e.value)
    assert path.read_bytes() == before


@pytest.mark.parametrize("filters", [{"run_ids": ["r1"]}, {"run_ids": ["r1"], "backends": ["a"]}])
def test_rm_by_run_id_of_rows_without_one_says_so_and_what_selects_them(tmp_path, filters):
    """Rows that carry no run_id (schema 1, some written by hand; a newer row without one is refused): rm
    --run-id says so plainly and names the options that select them, with the values the file holds, instead
    of "run_ids here: none"."""
    path = tmp_path / "r.jsonl"
    rows = [{**{k: v for k, v in r.items() if k != "run_id"}, "schema": 1} for r in ROWS]
    _store_of(path, rows)
    before = path.read_bytes()
    with pytest.raises(ConfigError) as e:
        remove_rows(path, **filters)
    assert str(e.value) == (f"rm {path}: no row has run_id 'r1': the rows of this file carry no run_id; nothing "
                            "removed: leave out --run-id and select rows by --backend (backends here: a, b, c) or "
                            "--env (envs here: e1, e2)")
    assert path.read_bytes() == before


@pytest.mark.parametrize("content, said", [(b"", ""), (b"\n", ""),
                                           (b'{"schema": 2, "backend": "a", "run_', " (only torn or malformed lines)")])
@pytest.mark.parametrize("filters", [{"backends": ["reference"]}, {"run_ids": ["r1"], "env_ids": ["e1"]}])
def test_rm_of_a_file_without_rows_says_there_is_nothing_to_remove(tmp_path, content, said, filters):
    """Not "the rows of this file carry no backend; leave out --backend": there are no rows."""
    path = tmp_path / "r.jsonl"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as e:
        remove_rows(path, **filters)
    assert str(e.value) == f"rm {path}: the file holds no result rows{said}; nothing to remove"
    assert path.read_bytes() == content


@pytest.mark.parametrize("check, advice", [
    (lambda p: remove_rows(p, run_ids=["r1"]), "; fix or remove that line first"),
    (check_writable, "; give a new path or a .jsonl results file")])
def test_a_foreign_line_gets_advice_that_fits_the_command(tmp_path, check, advice):
    """rm edits the file in place, so it is not told to give a new path; run --out and merge OUT are."""
    path = tmp_path / "r.jsonl"
    _store_of(path, ROWS)
    path.write_bytes(path.read_bytes() + b"garbage {\n")     # unterminated and not a torn row
    before = path.read_bytes()
    with pytest.raises(ConfigError, match=f"line {len(ROWS) + 1}: not a result row") as e:
        check(path)
    assert str(e.value).endswith(advice) and path.read_bytes() == before


@pytest.mark.parametrize("case, match", [
    ("no filter", "no run id, backend or env id"), ("missing", "no such results file; give an existing .jsonl"),
    ("suffix", "is a .json file, not a .jsonl results file; give a .jsonl results file"),
    ("toml", "is a .toml file, not a .jsonl results file; give a .jsonl results file"),
    ("no suffix", "is a file without a suffix, not a .jsonl results file"),
    ("folder", "is a directory; give the results .jsonl file to remove rows from"),
    ("fifo", "is not a regular file (a FIFO, a device or a socket); give a .jsonl results file"),
    ("foreign", "not a treebench results file")])
def test_remove_rows_refusals_are_one_line(tmp_path, case, match):
    """Each refusal fits what was given: a suite file is not called a folder, nor a FIFO missing."""
    path = tmp_path / "r.jsonl"
    _store_of(path, ROWS)
    target, filters = path, {"run_ids": ["r1"]}
    if case == "no filter":
        filters = {}
    elif case == "missing":
        target = tmp_path / "nope.jsonl"
    elif case == "suffix":
        target = tmp_path / "r.json"
        target.write_bytes(path.read_bytes())
    elif case in ("toml", "no suffix"):
        target = tmp_path / ("tiny.toml" if case == "toml" else "rows")
        target.write_text("[suite]\n")
    elif case == "folder":
        target = tmp_path
    elif case == "fifo":
        target = tmp_path / "pipe.jsonl"
        os.mkfifo(target)
    elif case == "foreign":
        target = tmp_path / "config.jsonl"
        target.write_text('{"a": 1}\n')
    before = target.read_bytes() if target.is_file() else None
    with pytest.raises(ConfigError) as e:
        remove_rows(target, **filters)
    assert match in str(e.value) and "\n" not in str(e.value)
    assert before is None or target.read_bytes() == before


@pytest.mark.parametrize("bad", [{"case": None}, {"case": {}}, {"env": None},
                                 {"case": {"batch_size": "one", "context_len": 16, "tree": "chain:3"}}])
def test_merge_into_a_file_with_one_bad_row_names_that_line_and_no_rm_of_its_run(tmp_path, capsys, bad):
    """OUT holds good rows of run r1 and one bad row of the same run: merge refuses it in one line
    naming OUT:LINE to edit or delete, and suggests no `rm --run-id r1`, which would remove the
    run's good rows too; OUT is left as it was."""
    from treebench.harness.cli.main import main

    out, new = tmp_path / "out.jsonl", tmp_path / "new.jsonl"
    before = _store_of(out, [_row(0, run_id="r1", env="e1"), {**_row(1, run_id="r1", env="e1"), **bad},
                             _row(2, run_id="r1", env="e1")])
    _store_of(new, [_row(5, run_id="r2", env="e1")])
    assert main(["merge", str(out), str(new)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"edit or delete that line ({out}:2)" in err, err
    assert "treebench rm" not in err and "--run-id" not in err
    assert out.read_bytes().splitlines(keepends=True) == before


def test_a_run_records_both_measured_peaks_in_its_env_file(tmp_path, monkeypatch):
    from test_shard import SUITE
    from treebench.harness.cli.main import main
    from treebench.harness.sweep import execute

    monkeypatch.setattr(execute, "measure_peak_bandwidth", lambda device: 3.5e12)   # as a GPU would measure them
    monkeypatch.setattr(execute, "measure_matrix_rate", lambda device: 701.0)
    (tmp_path / "s.toml").write_text(SUITE)
    out = tmp_path / "r.jsonl"
    assert main(["check", "--suite", str(tmp_path / "s.toml"), "--backend", "torch_sdpa", "--out", str(out),
                 "--quiet"]) == 0
    (env_file,) = tmp_path.glob("env-*.json")
    env = json.loads(env_file.read_text())
    assert (env["peak_bw_bytes_per_s"], env["peak_matmul_tflops"]) == (3.5e12, 701.0)


_DROP = object()   # a field of `_store_with_bad_row`'s row left out
_BOM = b"\xef\xbb\xbf"   # UTF-8 byte-order mark, as an editor saving "UTF-8 with BOM" writes it


def _store_with_bad_row(path: Path, bad: dict | bytes) -> bytes:
    """ROWS as lines 1, 2, 3, 4 of `path`, line 3 (ROWS[2]: run r2, backend a, env e2) changed by `bad`: its fields
    replaced (left out where `_DROP`), or (bytes) the field `bad` names ending in a byte that is not UTF-8, or
    (`_BOM`) a byte-order mark before it. The file's bytes."""
    _store_of(path, ROWS[:2])
    line = (json.dumps({k: v for k, v in {**ROWS[2], **bad}.items() if v is not _DROP}) if isinstance(bad, dict)
            else json.dumps(ROWS[2]))
    if bad == _BOM:
        line, bad = _BOM + line.encode(), {}
    if isinstance(bad, bytes):   # b'backend=\xff': '"backend": "a"' -> '"backend": "a\xff"'
        field, byte = bad.split(b"=")
        value = json.dumps(ROWS[2][field.decode()]).encode()
        line = line.encode().replace(b'"%s": %s' % (field, value), b'"%s": %s' % (field, value[:-1] + byte + b'"'))
    path.write_bytes(path.read_bytes() + (line if isinstance(line, bytes) else line.encode()) + b"\n"
                     + json.dumps(ROWS[3]).encode() + b"\n")
    return path.read_bytes()


@pytest.mark.parametrize("bad, filters, removed", [
    ({"run_id": None}, {"backends": ["a"]}, [1, 3]),
    ({"run_id": 7}, {"env_ids": ["e2"]}, [3, 4]),
    ({"run_id": "r2 x"}, {"backends": ["a"], "env_ids": ["e2"]}, [3]),
    ({"status": "weird"}, {"run_ids": ["r2"]}, [2, 3]),
    ({"timer": "stopwatch"}, {"run_ids": ["r2"], "backends": ["a"]}, [3]),
    ({"cpu_threads": 0}, {"env_ids": ["e2"]}, [3, 4]),
    ({"env": None}, {"run_ids": ["r2"], "backends": ["a"]}, [3]),
    ({"backend": "a/b"}, {"run_ids": ["r2"], "env_ids": ["e2"]}, [3]),
    (b"backend=\xff", {"run_ids": ["r2"]}, [2, 3]),                  # a line that is not UTF-8 ...
    (b"run_id=\xe9", {"backends": ["a"], "env_ids": ["e2"]}, [3]),   # ... by its other fields
    (_BOM, {"run_ids": ["r2"]}, [2, 3]),                             # a byte-order mark where JSON reads none
    ({"run_id": _DROP}, {"backends": ["a"]}, [1, 3]),                # no run_id, as a null one
])
def test_rm_removes_a_row_the_readers_refuse_that_its_well_formed_fields_select(tmp_path, bad, filters, removed):
    """A row that gate, report and merge refuse is selected by its well-formed run_id, backend and env as any
    row is, removed with the others, and counted apart (its line); the rewritten file is one they read."""
    path = tmp_path / "r.jsonl"
    lines = _store_with_bad_row(path, bad).splitlines(keepends=True)
    assert remove_rows(path, **filters) == Removed(len(removed), (3,))
    assert path.read_bytes() == b"".join(line for n, line in enumerate(lines, start=1) if n not in removed)
    check_writable(path)
    assert len(read_rows([path])) == 4 - len(removed)


_FIXES = "nothing removed (rm rewrites no file that would keep such a row): "


@pytest.mark.parametrize("bad, filters, said", [
    ({"status": "weird"}, {"run_ids": ["r1"]},                                          # another run's rows
     "(field 'status' is 'weird', expected one of pass, mismatch, error, skipped), which the filters do not select; "
     f"{_FIXES}remove it first (--run-id r2 --backend a --env e2 selects it, with every row holding those values)"),
    ({"cpu_threads": 0}, {"run_ids": ["r3"], "backends": ["c"]},
     "(field 'cpu_threads' is 0, expected an integer >= 1 (the torch threads it was timed under) or null), which "
     f"the filters do not select; {_FIXES}remove it first (--run-id r2 --backend a --env e2 selects it"),
    ({"run_id": 7}, {"run_ids": ["7"]},                                                 # its run_id is no run's
     f"(field 'run_id' is a number, expected a string), so --run-id cannot select it; {_FIXES}remove it first "
     "(--backend a --env e2 selects it, with every row holding those values) or edit or delete that line"),
    ({"run_id": None}, {"run_ids": ["r2"]},
     f"(field 'run_id' is null, expected a string), so --run-id cannot select it; {_FIXES}remove it first "
     "(--backend a --env e2 selects it"),
    ({"backend": "a/b"}, {"backends": ["a/b"], "env_ids": ["e2"]},
     "(field 'backend' is \"a/b\", which holds \"/\": no backend of that name loads (a name is printable characters "
     f"without '/')), so --backend cannot select it; {_FIXES}remove it first (--run-id r2 --env e2 selects it"),
    ({"status": "weird", "run_id": 7}, {"run_ids": ["r2"]},                             # the first problem is another
     "(field 'status' is 'weird', expected one of pass, mismatch, error, skipped), and --run-id cannot select it "
     f"(field 'run_id' is a number, expected a string); {_FIXES}remove it first (--backend a --env e2 selects it"),
    (b"backend=\xff", {"backends": ["a"]},
     "(byte 0xff at column {column} is not UTF-8 text), and --backend cannot select it (field 'backend' holds a byte "
     f"that is not UTF-8 text); {_FIXES}remove it first (--run-id r2 --env e2 selects it"),
    (_BOM, {"run_ids": ["r1"]},
     "(a byte-order mark (U+FEFF) at the start of line 3, where JSON reads none (only one before a file's first "
     f"line is dropped)), which the filters do not select; {_FIXES}remove it first (--run-id r2 --backend a --env e2 selects it"),
    ({"run_id": _DROP}, {"run_ids": ["r2"]},
     f"(field 'run_id' is missing), which the filters do not select; {_FIXES}remove it first (--backend a --env e2 "
     "selects it"),
    ({"run_id": None, "backend": "", "env": None}, {"backends": ["a"]},                # nothing well-formed selects it
     f"(field 'backend' is an empty string, expected the backend's name), so --backend cannot select it; {_FIXES}edit "
     "or delete that line"),
])
def test_rm_refuses_a_row_the_readers_refuse_that_it_would_keep(tmp_path, capsys, bad, filters, said):
    """rm never rewrites a file keeping a row gate, report and merge refuse: where the filters do not select it,
    or cannot (the field an option matches is malformed: --run-id 7 selects no row whose run_id is 7), it is
    refused in one line naming file, line and field, with the options its well-formed fields give, exit 2,
    and the file is left byte for byte as it was."""
    from treebench.harness.cli.main import main

    path = tmp_path / "r.jsonl"
    before = _store_with_bad_row(path, bad)
    said = said.replace("{column}", str(before.splitlines()[2].find(b"\xff") + 1))
    with pytest.raises(ConfigError) as e:
        remove_rows(path, **filters)
    assert str(e.value).startswith(f"rm {path}: line 3 is not a result row that treebench can read {said}"), str(e.value)
    assert str(e.value).endswith(f"edit or delete that line ({path}:3)")
    argv = ["rm", str(path), *[x for kind, option in (("run_ids", "--run-id"), ("backends", "--backend"),
                                                      ("env_ids", "--env")) if kind in filters
                               for x in (option, *filters[kind])]]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and said in err, err
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]


def test_rm_refuses_a_line_not_utf8_that_is_no_whole_row_as_before(tmp_path):
    """A line that is not UTF-8 and no whole row (cut short) holds no field a filter could match: refused,
    nothing removed, whatever the filters select, in the words the readers use."""
    path = tmp_path / "r.jsonl"
    _store_of(path, ROWS[:2])
    path.write_bytes(path.read_bytes() + b'{"schema": 2, "run_id": "r1", "backend": "a\xff\n')
    before = path.read_bytes()
    column = before.splitlines()[2].index(0xff) + 1
    with pytest.raises(ConfigError) as e:
        remove_rows(path, run_ids=["r1"])
    assert str(e.value) == (f"rm {path}: line 3 is not a result row that treebench can read (byte 0xff at column "
                            f"{column} is not UTF-8 text); nothing removed: edit or delete that line ({path}:3)")
    assert path.read_bytes() == before


@pytest.mark.parametrize("bad, argv, said", [
    (3, ["--backend", "a"], "removed 2 rows from {path} (backend 'a'); 1 of them was a row that gate, report and "
                            "merge refuse (line 3)"),
    (3, ["--run-id", "r2", "--backend", "a"], "removed 1 row from {path} (run_id 'r2' and backend 'a'); it was a row "
                                              "that gate, report and merge refuse (line 3)"),
    (4, ["--run-id", "r2", "r3"], "removed 3 rows from {path} (run_id 'r2' or 'r3'); 2 of them were rows that gate, "
                                  "report and merge refuse (lines 3, 4)"),
    (4, ["--env", "e2"], "removed 2 rows from {path} (env 'e2'); all of them were rows that gate, report and merge "
                         "refuse (lines 3, 4)"),
    (0, ["--env", "e1"], "removed 2 rows from {path} (env 'e1')"),
])
def test_rm_says_how_many_of_the_rows_it_removed_the_readers_refuse(tmp_path, capsys, bad, argv, said):
    """The summary counts the removed rows that gate, report and merge refuse, by line, so the user knows rm
    took them out; a removal of good rows alone says nothing of them. `bad`: the last line of ROWS that
    holds a field they refuse (a status or a timer no run writes), from line 3 on; 0: none."""
    from treebench.harness.cli.main import main

    path = tmp_path / "r.jsonl"
    _store_of(path, ROWS[:2])
    changes = [{"status": "weird"}, {"timer": "stopwatch"}]
    for n, row in enumerate(ROWS[2:], start=3):
        path.write_bytes(path.read_bytes() + json.dumps({**row, **(changes[n - 3] if n <= bad else {})}).encode()
                         + b"\n")
    assert main(["rm", str(path), *argv]) == 0
    out, err = capsys.readouterr()
    assert out == said.format(path=path) + "\n" and err == "", (out, err)


def test_run_out_refuses_a_row_that_is_not_utf8_as_the_readers_do(tmp_path):
    """A row holding a byte that is not UTF-8 (rows are ASCII JSON: an edit) is refused by run --out and
    merge OUT before they append, naming its line, as gate, report and merge refuse it."""
    path = tmp_path / "r.jsonl"
    path.write_bytes(json.dumps(ROWS[0]).encode() + b"\n" + json.dumps(ROWS[1]).encode().replace(b'"b"', b'"b\xe9"')
                     + b"\n")
    before = path.read_bytes()
    column = before.splitlines()[1].index(0xe9) + 1
    with pytest.raises(ConfigError) as e:
        check_writable(path)
    assert str(e.value) == (f"--out {path}: line 2 is not a result row that treebench can read (byte 0xe9 at column "
                            f"{column} is not UTF-8 text); give a new path, or edit or delete that line ({path}:2)")
    with pytest.raises(ConfigError, match=f"results file {path}:2: byte 0xe9 at column"):
        read_rows([path])
    assert path.read_bytes() == before


def test_rm_removes_a_row_that_run_out_refuses_to_append_to(tmp_path):
    """A row whose fields the readers refuse (status 'weird'): run --out and merge OUT refuse the
    file, naming the line to edit or delete, and rm, which edits it in place, can take the row out
    (the filters select it by its well-formed run_id), saying that it was such a row."""
    path = tmp_path / "r.jsonl"
    _store_of(path, [ROWS[0], _row(9, run_id="bad", status="weird")])
    with pytest.raises(ConfigError, match="line 2 is not a result row that treebench can read .*'weird'") as e:
        check_writable(path)
    assert str(e.value).endswith(f"give a new path, or edit or delete that line ({path}:2)")
    assert remove_rows(path, run_ids=["bad"]) == Removed(rows=1, refused=(2,))
    check_writable(path)
    assert [r["case_id"] for r in read_rows([path])] == ["c0"]


def test_rm_refuses_a_read_only_file_as_resume_and_merge_do(tmp_path, monkeypatch, capsys):
    """A results file its mode keeps from being written (chmod 444; simulated through os.access, since
    root may write anything) is refused in one line, exit 2, unchanged and read-only, though its folder
    would let the rewrite replace it: as `merge` (and `run --resume`) refuse to append to it."""
    from treebench.harness.cli.main import main

    path = tmp_path / "r.jsonl"
    _store_of(path, ROWS)
    path.chmod(0o444)
    before = path.read_bytes()
    real = os.access

    def access(p, mode, **kw):
        return False if Path(p) == path and mode & os.W_OK else real(p, mode, **kw)
    monkeypatch.setattr(os, "access", access)
    other = tmp_path / "in" / "o.jsonl"
    other.parent.mkdir()
    append_row(other, _row(9, run_id="r9"))
    for argv in (["rm", str(path), "--backend", "a"], ["merge", str(path), str(other)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and f"{argv[0]}{' OUT' if argv[0] == 'merge' else ''} {path}: cannot write there (" \
            in err, err
        assert path.read_bytes() == before and path.stat().st_mode & 0o777 == 0o444


@pytest.mark.parametrize("marks, said", [(1, None), (2, 1)])
def test_one_byte_order_mark_before_line_1_is_read_a_second_is_refused(tmp_path, marks, said):
    """An editor's byte-order mark before the first row is dropped, as it opens the file; one more after it is a
    character JSON does not read: the readers name it and its line, not "not a treebench results file"."""
    path = tmp_path / "r.jsonl"
    path.write_bytes(_BOM * marks + json.dumps(ROWS[0]).encode() + b"\n" + json.dumps(ROWS[1]).encode() + b"\n")
    if said is None:
        assert [r["case_id"] for r in read_rows([path])] == ["c0", "c1"]
        return
    with pytest.raises(ConfigError) as e:
        read_rows([path])
    assert str(e.value) == (f"results file {path}:1: a byte-order mark (U+FEFF) at the start of line 1, where JSON "
                            "reads none (only one before a file's first line is dropped); treebench writes UTF-8: "
                            "edit or delete that line")
