"""backends/ADD_BACKEND.md stays true: its worked example adapter, extracted from the
document, passes `treebench check` (default suite, in a subprocess, as a user runs it),
and copies of it with one fault injected fail with exit 1.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "backends" / "ADD_BACKEND.md"
EXAMPLE = re.compile(r"<!-- example: (?P<file>[\w.]+) -->\n```python\n(?P<code>.*?)\n```", re.S)

# (id, line of the example, its faulty replacement): each must make `check` fail.
FAULTS = [
    ("mask_dropped", '                scores = scores.masked_fill(~mask, float("-inf"))\n', ""),
    ("gqa_h_mod_hkv", "k = k.repeat_interleave(G, dim=1).float()", "k = k.repeat(1, G, 1).float()"),
]


def example() -> tuple[str, str, str]:
    """(file name, source, class name) of the document's one worked example."""
    found = EXAMPLE.findall(DOC.read_text())
    assert len(found) == 1, f"{DOC.name}: expected one `<!-- example: FILE.py -->` python block, found {len(found)}"
    name, code = found[0]
    classes = re.findall(r"^class (\w+)\(Backend\):", code, re.M)
    assert len(classes) == 1, f"the example should define one Backend subclass, found {classes}"
    return name, code + "\n", classes[0]


def check(path: Path, cls: str, cwd: Path) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """`python -m treebench check --backend path:cls` (default suite) from `cwd`; the process and its rows."""
    out = cwd / f"{path.stem}.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "treebench", "check", "--quiet", "--backend", f"{path}:{cls}", "--out", str(out)],
        cwd=cwd, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return proc, rows


def test_the_example_passes_check(tmp_path):
    name, code, cls = example()
    path = tmp_path / name
    path.write_text(code)
    proc, rows = check(path, cls, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    fp8 = [r for r in rows if "kv_dtype" in r["case"]]                  # fp8 KV is opt-in: the example does not
    assert rows and {r["status"] for r in rows if r not in fp8} == {"pass"}, [(r["status"], r["reason"]) for r in rows]
    assert fp8 and all(r["status"] == "skipped" and "Capabilities.kv_dtypes" in r["reason"] for r in fp8)
    assert {r["backend"] for r in rows} == {re.search(r'name = "(\w+)"', code)[1]}


@pytest.mark.parametrize("old, new", [f[1:] for f in FAULTS], ids=[f[0] for f in FAULTS])
def test_a_broken_copy_fails_check(tmp_path, old, new):
    name, code, cls = example()
    assert code.count(old) == 1, f"the example no longer contains {old.strip()!r}: update FAULTS"
    path = tmp_path / f"broken_{name}"
    path.write_text(code.replace(old, new))
    proc, rows = check(path, cls, tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert any(r["status"] == "mismatch" for r in rows), [(r["status"], r["reason"]) for r in rows]
    assert "Traceback" not in proc.stderr


def test_a_backend_file_imports_a_module_beside_it(tmp_path):
    """As under `python path/file.py`, the file's folder is on sys.path: its helpers import."""
    name, code, cls = example()
    (tmp_path / "kernels_here").mkdir()
    (tmp_path / "kernels_here" / "shared_helper.py").write_text("ANSWER = 42\n")
    path = tmp_path / "kernels_here" / name
    path.write_text(code + "\nimport shared_helper  # noqa: E402\nassert shared_helper.ANSWER == 42\n")
    proc, rows = check(path, cls, tmp_path)                       # run from the folder above
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_example_file_alone_names_its_one_backend_class(tmp_path):
    """`--backend my_backend.py` (no :Class) takes the one backend class the file defines; a backend
    class it imports from elsewhere does not count. `run --backends` takes the same form."""
    name, code, _ = example()
    path = tmp_path / name
    path.write_text(code + "\nfrom treebench.backends.torch_sdpa import TorchSdpaBackend  # noqa: E402,F401\n")
    backend = re.search(r'name = "(\w+)"', code)[1]
    out = tmp_path / "rows.jsonl"
    for argv in (["check", "--backend", name], ["run", "--backends", f"reference,{name}", "--report",
                                                 str(tmp_path / "r.html")]):
        proc = subprocess.run([sys.executable, "-m", "treebench", *argv, "--suite", "smoke", "--quiet", "--out",
                               str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["backend"] for r in rows].count(backend) == 2 * sum(r["backend"] == "reference" for r in rows) > 0
    assert {r["backend"] for r in rows} == {backend, "reference"}
    assert {r["status"] for r in rows if r["backend"] == backend} <= {"pass", "skipped"}
