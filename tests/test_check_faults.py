"""`treebench check` with its default check (built from the backend's capabilities,
harness/checking/default_check.py) and with the named suite suites/check.toml
catches every deliberately injected fault of tests/broken_backends.py and passes
the correct backends."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import treebench.backends  # noqa: F401  (registers the built-in adapters)
from treebench.harness.adapter.contract import REGISTRY
from treebench.harness.cli.main import main
from treebench.harness.store.rows import read_rows
from treebench.harness.model.paged import triton_interpret
from treebench.harness.model.suites import load_suite
from tests import broken_backends

ROOT = Path(__file__).resolve().parent.parent
MODULE = ROOT / "tests" / "broken_backends.py"


def _check(spec: str, tmp_path: Path, suite: str | None = None) -> tuple[int, list[dict]]:
    out = tmp_path / "rows.jsonl"
    rc = main(["check", "--backend", spec, "--out", str(out), "--quiet", *(["--suite", suite] if suite else [])])
    return rc, read_rows([out])


@pytest.mark.parametrize("suite", [None, "check"], ids=["default", "check.toml"])
@pytest.mark.parametrize("cls", broken_backends.BROKEN, ids=lambda c: c.__name__)
def test_check_catches_the_fault(cls, suite, tmp_path):
    rc, rows = _check(f"{MODULE}:{cls.__name__}", tmp_path, suite)
    assert rc == 1
    # caught by comparison on the first prepare, not only by the re-prepare
    assert any(r["status"] == "mismatch" and r["reason"].startswith("first prepare:") for r in rows), \
        [r["reason"] for r in rows]


@pytest.mark.parametrize("suite", [None, "check"], ids=["default", "check.toml"])
def test_check_passes_the_correct_backend(suite, tmp_path):
    rc, rows = _check(f"{MODULE}:Correct", tmp_path, suite)
    assert rc == 0
    assert rows and {r["status"] for r in rows} == {"pass"}


def _interpreted(name: str) -> bool:
    """True for a Triton backend that would run in the CPU interpreter (tests/test_triton_tree.py
    sets TRITON_INTERPRET=1): far too slow for the default check, so it gets suites/check.toml."""
    return name.startswith("triton") and triton_interpret() and not torch.cuda.is_available()


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_check_passes_every_built_in_backend(name, tmp_path):
    """Every built-in backend passes where it runs; one unavailable here ran nothing (exit 3)."""
    rc, rows = _check(name, tmp_path, "check" if _interpreted(name) else None)
    ran_nothing = rows and all(r["status"] == "skipped" for r in rows)
    assert rc == (3 if ran_nothing else 0), [r["reason"] for r in rows if r["status"] != "pass"]


def test_check_from_a_real_subprocess():
    proc = subprocess.run([sys.executable, "-m", "treebench", "check", "--quiet",
                           "--backend", "tests/broken_backends.py:BrokenGqaMapping"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1, proc.stderr
    assert "mismatch" in proc.stdout and "Traceback" not in proc.stderr


def _requests(case):
    """(L_b, T_b, S_b, pages_b) per request of a case, from its seed alone."""
    ls, trees, P = case.context_lens(), case.trees(), case.page_size
    return [(l, t.size, l + t.size, -(-(l + t.size) // P)) for l, t in zip(ls, trees)]


def _has_cousins(tree) -> bool:
    """Two nodes at the same depth with different parents."""
    by_depth: dict[int, set[int]] = {}
    for i in range(1, tree.size):
        by_depth.setdefault(tree.depths[i], set()).add(tree.parents[i])
    return any(len(parents) > 1 for parents in by_depth.values())


def test_check_suite_still_covers_every_fault():
    """If a change to the case RNG moves the draws, this names the property lost:
    pick another `seed` or batch size in suites/check.toml."""
    cases = load_suite("check").cases
    covered = set()
    for c in cases:
        reqs = _requests(c)
        most = max(r[3] for r in reqs)
        trees = c.trees()
        if any(s % c.page_size == 0 and n < most for _, _, s, n in reqs):
            covered.add("S_b an exact multiple of P, a NaN page next in the block table")
        if any(s % c.page_size for _, _, s, _ in reqs):
            covered.add("S_b mid-page (a NaN tail)")
        if any(l < c.page_size for l, *_ in reqs):
            covered.add("a short context")
        if len({l for l, *_ in reqs}) > 1:
            covered.add("ragged contexts")
        if any(len(ch) > 1 for t in trees for ch in t.children):
            covered.add("siblings")
        if any(_has_cousins(t) for t in trees):
            covered.add("cousins")
        if c.tree_per_request == "mixed" and any(t.parents != trees[0].parents[:t.size] for t in trees[1:]):
            covered.add("per-request trees that differ from request 0's")
        if c.group_size > 1 and c.num_kv_heads > 1:
            covered.add("GQA with G > 1 and Hkv > 1")
        covered.add(f"layout {c.layout}")
    missing = {"S_b an exact multiple of P, a NaN page next in the block table", "S_b mid-page (a NaN tail)",
               "a short context", "ragged contexts", "siblings", "cousins",
               "per-request trees that differ from request 0's", "GQA with G > 1 and Hkv > 1",
               "layout shuffled", "layout interleaved"} - covered
    assert not missing, f"suites/check.toml no longer covers: {sorted(missing)}"
    assert {c.dtype for c in cases} == {"bfloat16"} and {c.head_dim for c in cases} <= {64, 128}
