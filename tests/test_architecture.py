"""The package's structure, read from source: no import cycle, the layer rule of
docs/architecture.md, and the size limits (modules, subpackages).

Imports are collected with `ast` from every module of harness/, backends/ and
kernels/, imports inside functions included and `if TYPE_CHECKING:` blocks
excluded, so a cycle that only bites at run time is still found.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("harness", "backends", "kernels")

# Which layers each layer may import (docs/architecture.md, "The layer rule"): the key's
# modules import only their own package and the packages listed.
ALLOWED = {
    "harness.errors": set(),
    "harness.model": {"harness.errors"},
    "harness.timing": {"harness.errors", "harness.model"},
    "harness.store": {"harness.errors", "harness.model", "harness.timing"},
    "harness.adapter": {"harness.errors", "harness.model"},
    "kernels": {"harness.errors", "harness.model"},
    "backends": {"harness.errors", "harness.model", "harness.adapter", "kernels"},
    "harness.checking": {"harness.errors", "harness.model", "harness.adapter"},
    "harness.run": {"harness.errors", "harness.model", "harness.timing", "harness.store", "harness.adapter",
                    "harness.checking", "backends"},
    "harness.sweep": {"harness.errors", "harness.model", "harness.timing", "harness.store", "harness.adapter",
                      "harness.run"},
    "harness.selftest": {"harness.errors", "harness.model", "harness.timing", "harness.store", "harness.adapter",
                         "harness.checking", "harness.run", "backends"},
    "harness.analyze": {"harness.errors", "harness.model", "harness.timing", "harness.store"},
    "harness.speculation": {"harness.errors", "harness.model", "harness.timing", "harness.store"},
    "harness.cli": {"harness.errors", "harness.model", "harness.timing", "harness.store", "harness.adapter",
                    "harness.checking", "harness.run", "harness.sweep", "harness.analyze", "harness.speculation", "harness.selftest",
                    "backends"},
    "harness": set(),   # harness/__init__.py (the public API, lazy) and __main__: exempt
}
MAX_MODULE_LINES = 400
MAX_MODULES_PER_PACKAGE = 10


def module_name(path: Path) -> str:
    """harness/run/pair.py -> harness.run.pair (the name under `treebench.`)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules() -> dict[str, Path]:
    mods = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            mods[module_name(path)] = path
    return mods


def _type_checking_lines(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skip.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return skip


def _strip(name: str) -> str | None:
    """treebench.harness.x -> harness.x; a name outside treebench -> None."""
    if name == "treebench" or not name.startswith("treebench."):
        return None
    return name.removeprefix("treebench.")


def imports_of(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The internal modules `name` imports (resolved to modules of `mods`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _type_checking_lines(tree)
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [t for a in node.names if (t := _strip(a.name))]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = _strip(node.module or "") or ""
            if not mod:
                continue
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod for a in node.names]
        for t in targets:
            while t and t not in mods:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = source_modules()
    return {name: imports_of(name, path, mods) for name, path in mods.items()}


def layer_of(module: str) -> str:
    """The ALLOWED key a module belongs to (its longest matching prefix)."""
    best = ""
    for key in ALLOWED:
        if (module == key or module.startswith(key + ".")) and len(key) > len(best):
            best = key
    return best


def test_no_import_cycle():
    graph = import_graph()
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        pytest.fail(f"import cycle: {' -> '.join(e.args[1])}")


def test_layer_rule():
    bad = []
    for mod, deps in import_graph().items():
        layer = layer_of(mod)
        assert layer, f"{mod} belongs to no layer of ALLOWED: add it there and to docs/architecture.md"
        if layer == "harness":
            continue
        for dep in deps:
            dep_layer = layer_of(dep)
            if dep_layer != layer and dep_layer not in ALLOWED[layer]:
                bad.append(f"{mod} imports {dep} ({layer} may not import {dep_layer})")
    assert not bad, "\n".join(bad)


def test_layer_rule_is_documented():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    for layer in ALLOWED:
        if layer != "harness":
            assert f"`{layer.split('.')[-1]}" in doc or f"`{layer}" in doc, f"docs/architecture.md omits {layer}"


def test_the_cycle_finder_finds_cycles(tmp_path):
    """The graph check can fail: a two-module cycle is reported."""
    graph = {"a": {"b"}, "b": {"a"}}
    with pytest.raises(graphlib.CycleError):
        list(graphlib.TopologicalSorter(graph).static_order())
    assert layer_of("harness.run.pair") == "harness.run"
    assert layer_of("harness.errors") == "harness.errors"


@pytest.mark.parametrize("folder", ["harness"])
def test_module_and_package_sizes(folder):
    too_long = [f"{p.relative_to(ROOT)}: {n} lines" for p in (ROOT / folder).rglob("*.py")
                if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines: {too_long}"
    for pkg in [p.parent for p in (ROOT / folder).rglob("__init__.py")]:
        n = len([p for p in pkg.glob("*.py") if p.name not in ("__init__.py", "__main__.py")])
        assert n <= MAX_MODULES_PER_PACKAGE, f"{pkg.relative_to(ROOT)} holds {n} modules"
