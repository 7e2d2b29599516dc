"""The distribution installs one import package, `treebench`, whose subpackages are the
repository's folders (pyproject's `[tool.setuptools.package-dir]`):

- every package folder is listed in `[tool.setuptools] packages` under its `treebench.`
  name, and every data file is matched by a `package-data` glob;
- a built wheel holds `treebench` and nothing else at the top level, data files
  included, and runs `treebench check` when installed without the checkout;
- installed beside Hugging Face's `kernels` package (the kernel hub transformers
  uses), in either order, both import: `kernels` is theirs, ours is `treebench.kernels`.

The wheel is built from a copy of the files the build reads (pyproject.toml, README.md
and the mapped folders), not in the checkout: an in-tree build writes build/ and
*.egg-info there, and a stale build/lib from an older layout would leak into the wheel.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
PACKAGE_DIR: dict[str, str] = SETUPTOOLS["package-dir"]   # package name -> folder, relative to ROOT
FOLDERS = ("harness", "backends", "kernels", "suites")
GENERIC_NAMES = {"harness", "backends", "kernels", "suites"}
BUILD_FILES = ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "setup.py", "setup.cfg")
NOT_DATA = {".py", ".pyc", ".md"}   # sources, bytecode and how-tos next to the code are not package data


def folder_of(package: str) -> Path:
    """The folder a package name maps to under package-dir (its longest mapped prefix)."""
    parts = package.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in PACKAGE_DIR:
            return ROOT / PACKAGE_DIR[prefix] / Path(*parts[n:])
    return ROOT / Path(*parts)


def package_name(folder: Path) -> str:
    """harness/run -> treebench.harness.run."""
    return "treebench." + ".".join(folder.relative_to(ROOT).parts)


def source_folders() -> list[Path]:
    """Every folder under FOLDERS, __pycache__ excluded."""
    out = []
    for top in FOLDERS:
        out += [ROOT / top] + [p for p in sorted((ROOT / top).rglob("*")) if p.is_dir() and p.name != "__pycache__"]
    return out


def data_files() -> list[Path]:
    """Files under FOLDERS that a package ships as data (not sources, bytecode or docs)."""
    return [p for top in FOLDERS for p in sorted((ROOT / top).rglob("*"))
            if p.is_file() and p.suffix not in NOT_DATA and "__pycache__" not in p.parts]


# ---- (a) pyproject against the tree ------------------------------------------------------------

def test_every_package_folder_is_listed():
    listed = set(SETUPTOOLS["packages"])
    folders = [f for f in source_folders() if (f / "__init__.py").is_file()]
    missing = sorted(package_name(f) for f in folders if package_name(f) not in listed)
    assert not missing, f"add to pyproject's [tool.setuptools] packages: {missing}"
    for top in FOLDERS:
        assert PACKAGE_DIR.get(f"treebench.{top}") == top, f"package-dir must map treebench.{top} to {top}/"


def test_every_listed_package_exists():
    gone = [p for p in SETUPTOOLS["packages"] if not (folder_of(p) / "__init__.py").is_file()]
    assert not gone, f"listed in pyproject but without an __init__.py where package-dir maps it: {gone}"


def test_no_module_outside_a_package():
    """A folder with .py files but no __init__.py would be left out of the wheel."""
    bare = [str(f.relative_to(ROOT)) for f in source_folders()
            if any(f.glob("*.py")) and not (f / "__init__.py").is_file()]
    assert not bare, f"folders with modules but no __init__.py: {bare}"


def test_package_data_globs_match_files():
    for package, globs in SETUPTOOLS["package-data"].items():
        assert package in SETUPTOOLS["packages"], f"package-data names {package}, which is not a listed package"
        for glob in globs:
            assert list(folder_of(package).glob(glob)), f"package-data {package}: {glob!r} matches no file"


def test_every_data_file_is_package_data():
    covered = {p.resolve() for package, globs in SETUPTOOLS["package-data"].items()
               for glob in globs for p in folder_of(package).glob(glob)}
    loose = [str(p.relative_to(ROOT)) for p in data_files() if p.resolve() not in covered]
    assert not loose, f"files no package-data glob ships (the wheel would lack them): {loose}"


# ---- (b) the wheel -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """treebench's wheel, built without build isolation from a clean copy of the sources."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for name in BUILD_FILES:
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for folder in sorted(set(PACKAGE_DIR.values())):
        shutil.copytree(ROOT / folder, src / folder, ignore=ignore)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (whl,) = out.glob("treebench-*.whl")
    return whl


def wheel_names(whl: Path) -> list[str]:
    with zipfile.ZipFile(whl) as z:
        return z.namelist()


def test_wheel_has_one_top_level_package(wheel):
    names = wheel_names(wheel)
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"treebench"}, f"top-level names in the wheel: {sorted(tops)}"
    (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")] or [None]
    if top_level:  # setuptools writes it; the file list above is what counts
        with zipfile.ZipFile(wheel) as z:
            assert z.read(top_level).decode().split() == ["treebench"]
    assert not GENERIC_NAMES & tops


def test_wheel_holds_the_data_files(wheel):
    names = set(wheel_names(wheel))
    expected = {"treebench/" + str(p.relative_to(ROOT)) for p in data_files()}
    assert expected - names == set(), f"data files missing from the wheel: {sorted(expected - names)}"
    for glob in ("treebench/suites/*.toml", "treebench/harness/analyze/templates/*",
                 "treebench/harness/speculation/data/*.toml"):
        assert any(re.fullmatch(glob.replace("*", "[^/]+"), n) for n in names), f"nothing matches {glob}"
    modules = {"treebench/" + str(p.relative_to(ROOT)) for top in FOLDERS for p in (ROOT / top).rglob("*.py")}
    assert modules - names == set(), f"modules missing from the wheel: {sorted(modules - names)}"


def clean_env(pythonpath: Path) -> dict[str, str]:
    """This environment with PYTHONPATH set to `pythonpath` alone (no checkout on it)."""
    return {**os.environ, "PYTHONPATH": str(pythonpath)}


def pip_target(target: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--target", str(target), *args],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_installed_wheel_runs_without_the_checkout(wheel, tmp_path):
    """Installed (not editable) into a bare folder, the mapped packages import and the
    CLI finds its suites as package data."""
    target = tmp_path / "site"
    pip_target(target, "--no-deps", str(wheel))
    assert {p.name for p in target.iterdir()} & GENERIC_NAMES == set()
    probe = ("import treebench, treebench.harness, treebench.backends, treebench.kernels, treebench.suites; "
             "print(*treebench.__path__, sep='\\n')")
    env = clean_env(target)
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(target / "treebench")], "treebench must come from the install alone"
    proc = subprocess.run([sys.executable, "-m", "treebench", "check", "--quiet", "--backend", "torch_sdpa",
                           "--suite", "smoke"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- (c) beside Hugging Face's `kernels` -------------------------------------------------------

PROBE = """
import sys
target = sys.argv[1]
import kernels
assert callable(kernels.get_kernel), "kernels.get_kernel"
assert kernels.__file__.startswith(target), kernels.__file__
import treebench.kernels.tree_attention_plan as plan
assert plan.__file__.startswith(target + "/treebench/kernels/"), plan.__file__
import torch
print("ok", kernels.__file__, plan.__file__, torch.__version__)
"""


@pytest.fixture(scope="module")
def hub_kernels(tmp_path_factory) -> None:
    """Skips when the `kernels` distribution cannot be downloaded (no index reachable)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--retries", "1",
                           "--timeout", "20", "kernels", "-d", str(tmp_path_factory.mktemp("dl"))],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode:
        pytest.skip("cannot download Hugging Face's `kernels` package (no package index reachable): "
                    + (proc.stderr.strip().splitlines() or ["pip download failed"])[-1])


@pytest.mark.slow
@pytest.mark.parametrize("order", ["treebench_first", "kernels_first"])
def test_installs_beside_hugging_face_kernels(wheel, hub_kernels, tmp_path, order):
    target = tmp_path / "site"
    steps = [("--no-deps", str(wheel)), ("kernels",)]
    warnings = []
    for args in steps if order == "treebench_first" else steps[::-1]:
        proc = pip_target(target, *args)
        warnings += re.findall(r"Target directory (\S+) already exists", proc.stdout + proc.stderr)
    clashes = {Path(w).name for w in warnings} - {"bin"}   # both ship a console script in bin/
    assert not clashes, f"the second install skipped folders the first one wrote: {sorted(clashes)}"
    proc = subprocess.run([sys.executable, "-c", PROBE, str(target)], cwd=tmp_path, env=clean_env(target),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
