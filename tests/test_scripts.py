"""The kernel-development tools in lab/ refuse what they cannot do with one line and exit 2
(lab/profile_case.py, lab/bench_kernel.py); their GPU work is not run here."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from treebench.kernels.tree_attention_plan import parse_kernel_config

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "lab"


def _import_script(name: str) -> types.ModuleType:
    """lab/<name>.py imported as a module (lab/ is not a package)."""
    sys.path.insert(0, str(LAB))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(LAB))


def _script(name: str, *args: str, interpret: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, str(LAB / name), *args], capture_output=True, text=True,
                          env=env, timeout=300)


def _parser_calls(tree: ast.AST) -> list[ast.Call]:
    """The calls in `tree` that build an argparse parser: ArgumentParser(...) or a class of the module
    derived from it."""
    def name(node: ast.expr) -> str:
        return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    parsers = {"ArgumentParser"} | {c.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
                                    and any(name(b) == "ArgumentParser" for b in c.bases)}
    return [c for c in ast.walk(tree) if isinstance(c, ast.Call) and name(c.func) in parsers]


def test_every_lab_parser_refuses_abbreviated_options():
    """argparse takes an unambiguous prefix (`--batch` for `--batch-sizes`) unless told not to: every
    parser of lab/*.py is built with allow_abbrev=False, so an option is spelled out in full, as in
    `treebench`'s own commands."""
    seen = {}
    for path in sorted(LAB.glob("*.py")):
        for call in _parser_calls(ast.parse(path.read_text(), str(path))):
            given = {k.arg: k.value for k in call.keywords}
            ok = isinstance(given.get("allow_abbrev"), ast.Constant) and given["allow_abbrev"].value is False
            seen[f"{path.name}:{call.lineno}"] = ok
    assert len(seen) >= 10 and [where for where, ok in seen.items() if not ok] == []


@pytest.mark.parametrize("config, needle", [
    ("64,64", "want BLOCK_M,BLOCK_N,warps,stages"),
    ("abc", "want BLOCK_M,BLOCK_N,warps,stages"),
    ("64,64,4,3,0,5", "bt_ahead=5"),
    ("64,48,4,3", "block_n=48"),
    ("64,64,4,3 --calls 0", "--calls 0"),
])
def test_profile_case_refuses_a_bad_config(config, needle):
    value, *more = config.split(" ")
    r = _script("profile_case.py", "--config", value, *more, interpret=True)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("mode", ["bias", "causal"])
def test_profile_case_runs_each_mask_mode_in_the_interpreter(mode):
    r = _script("profile_case.py", "--tree", "full:1:1", "--batch-size", "1", "--context-len", "16",
                "--page-size", "16", "--calls", "1", "--mode", mode, interpret=True)
    assert r.returncode == 0, r.stderr
    assert f"mode {mode}" in r.stdout and "ws False" in r.stdout, r.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU refusal")
def test_scripts_without_a_gpu_say_so(tmp_path):
    r = _script("profile_case.py")
    assert r.returncode == 2 and "no CUDA GPU" in r.stderr and "Traceback" not in r.stderr
    r = _script("bench_kernel.py", "--phases", "big", "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "no CUDA GPU" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()
    r = _script("flush_probe.py", "--out", str(tmp_path / "flush"))
    assert r.returncode == 2 and "no CUDA GPU" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "flush").exists()
    r = _script("floor_probe.py", "--out", str(tmp_path / "floor"))
    assert r.returncode == 2 and "no CUDA GPU" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "floor").exists()


def test_floor_probe_reader_sums_the_span_it_names_in_the_interpreter():
    """lab/floor_probe.py's read kernel sums exactly the first n bytes of the K and the V pool, over one step and over
    several (a grid-stride loop), and its page bytes are the batch's whole K and V pages."""
    pytest.importorskip("triton")
    code = ("import sys, torch; sys.path.insert(0, 'lab'); import floor_probe as f\n"
            "from treebench.harness.model.cases import Case\n"
            "k, v = torch.randn(6, 4, 2, 8), torch.randn(6, 4, 2, 8)\n"
            "for block, per_sm, sms in ((16, 2, 2), (4, 1, 2)):\n"
            "    call, out, grid, steps = f.reader(k, v, 200, block, per_sm, sms)\n"
            "    call()\n"
            "    want = k.view(-1)[:50].sum().item() + v.view(-1)[:50].sum().item()\n"
            "    print(grid, steps, abs(out.sum().item() - want) < 1e-4)\n"
            "print(f.page_bytes(Case(batch_size=1, context_len=2048, tree='vllm:pr_27', page_size=128)))\n")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    # 50 words: 4 programs of 16 in one step; 2 programs of 4 in 7 steps; 2076 tokens in 17 pages of 128
    assert r.stdout.split("\n")[:3] == ["4 1 True", "2 7 True", str(17 * 128 * 8 * 128 * 2 * 2)], r.stdout


def test_bench_kernel_smoke_runs_three_checks_on_the_cpu(tmp_path):
    """--smoke: three tiny variants through the interpreter, checked against the float64
    reference, one CSV row each, all passing (exit 0)."""
    pytest.importorskip("triton")
    r = _script("bench_kernel.py", "--smoke", "--out", str(tmp_path), interpret=True)
    assert r.returncode == 0, r.stderr[-2000:]
    import csv
    rows = list(csv.DictReader((tmp_path / "kernel-smoke.csv").open()))
    assert [(row["mode"], row["splits"], row["passed"]) for row in rows] == [
        ("tree", "1", "True"), ("tree", "2", "True"), ("causal", "1", "True")]


def test_bench_kernel_refuses_an_unknown_phase(tmp_path):
    r = _script("bench_kernel.py", "--phases", "env,nosuch", "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "unknown phase(s) nosuch" in r.stderr and not (tmp_path / "out").exists()


def test_bench_kernel_phases_plan_every_variant():
    """Every variant of every bench_kernel phase (lab/bench_variants.py) is a valid
    case whose plan resolves for an H200 (132 SMs) as the run would: a typo in a phase's
    table fails here, not on the GPU. The tiles phase's warp-specialised configs fit one
    CTA's shared memory and name the PIPE they run with."""
    bk, bv = _import_script("bench_kernel"), _import_script("bench_variants")
    from treebench.kernels.tree_attention_plan import SMEM_PER_SM
    for phase, variants in bv.PHASE_VARIANTS.items():
        for v in variants():
            assert v.phase == phase
            r = bk.resolve(v, 132)
            assert r.config is not None and r.splits >= 1, v
            if r.config.ws:
                assert r.config.ws_shared_bytes(v.case.get("head_dim", 128)) <= SMEM_PER_SM, v
    tiles = bv.tiles_variants()
    assert {(v.config.block_n, v.ws_pipe) for v in tiles if v.config and v.config.ws == 3} == {
        (32, True), (32, False), (64, True), (64, False)}
    assert sum(v.time_it for v in tiles) == 16 and all(v.case["page_size"] in (64, 128, 256) for v in tiles)


def _base_copy(tmp_path: Path) -> Path:
    """A --base folder for ab_kernel.py: this tree's kernels/*.py."""
    base = tmp_path / "base"
    base.mkdir()
    for f in (ROOT / "kernels").glob("*.py"):
        (base / f.name).write_text(f.read_text())
    return base


@pytest.mark.parametrize("args, needle", [
    (["--base", "{missing}"], "lacks __init__.py"),
    (["--base", "{base}", "--cells", "1:x:full:3:1"], "'1:x:full:3:1' is not B:L:tree"),
    (["--base", "{base}", "--cells", "0:2048:full:3:1"], "batch_size=0"),
    (["--base", "{base}", "--pages", "0"], "page_size=0"),
    (["--base", "{base}", "--cells", "1:16:nosuch"], "tree 'nosuch'"),
    (["--base", "{base}", "--rounds", "0"], "--rounds 0"),
    (["--base", "{base}", "--pages", "16,abc"], "--pages '16,abc'"),
    (["--base", "{base}", "--variant", "v1"], "--variant 'v1': NAME=DIR"),
    (["--base", "{base}", "--variant", "1x={base}"], "--variant '1x="),
    (["--base", "{base}", "--variant", "new={base}"], "the side name 'new' is taken"),
    (["--base", "{base}", "--variant", "a={base}", "--variant", "a={base}"], "the side name 'a' is taken"),
    (["--base", "{base}", "--variant", "a={missing}"], "lacks __init__.py"),
])
def test_ab_kernel_refuses_bad_input_before_writing(tmp_path, args, needle):
    base = _base_copy(tmp_path)
    args = [a.format(missing=tmp_path / "nothing", base=base) for a in args]
    r = _script("ab_kernel.py", *args, "--out", str(tmp_path / "out"))
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU refusal")
def test_ab_kernel_without_a_gpu_says_so(tmp_path):
    r = _script("ab_kernel.py", "--base", str(_base_copy(tmp_path)), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "no CUDA GPU" in r.stderr and not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="parses up to the no-GPU refusal")
def test_ab_kernel_cells_take_trees_with_commas(tmp_path):
    """A new cell starts at each "B:L:", so levels:4,2,1 is one tree, not three cells."""
    r = _script("ab_kernel.py", "--base", str(_base_copy(tmp_path)), "--cells",
                "1:2048:levels:4,2,1,16:1024:full:3:2", "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "no CUDA GPU" in r.stderr, r.stderr


def test_ab_kernel_alternates_which_side_runs_first(monkeypatch):
    """Base first in even rounds, new first in odd ones; each side keeps its own medians."""
    ab_kernel = _import_script("ab_kernel")
    calls = []

    def fake_timer(fn, **kw):
        calls.append(fn)
        return types.SimpleNamespace(samples_us=[10.0 if fn == "base" else 20.0])
    monkeypatch.setattr(ab_kernel, "time_callable", fake_timer)
    medians = ab_kernel.time_sides({"base": "base", "new": "new"}, rounds=3)
    assert calls == ["base", "new", "new", "base", "base", "new"]
    assert medians == {"base": [10.0] * 3, "new": [20.0] * 3}
    calls.clear()
    ab_kernel.time_sides({"base": "base", "v1": "v1", "new": "new"}, rounds=2)
    assert calls == ["base", "v1", "new", "new", "v1", "base"]
    assert ab_kernel.parse_cells("1:2048:levels:4,2,1,16:1024:full:3:2") == [(1, 2048, "levels:4,2,1"),
                                                                              (16, 1024, "full:3:2")]


def test_ab_kernel_timer_loop_times_back_to_back_warm(monkeypatch):
    """--timer loop asks the harness for cuda_graph_loop without a flush; the default, the
    flushed CUDA-graph timer."""
    ab_kernel = _import_script("ab_kernel")
    seen = []

    def fake_timer(fn, **kw):
        seen.append((kw["mode"], kw["flush_l2"]))
        return types.SimpleNamespace(samples_us=[1.0])
    monkeypatch.setattr(ab_kernel, "time_callable", fake_timer)
    ab_kernel.time_sides({"base": "base", "new": "new"}, rounds=1, timer="loop")
    ab_kernel.time_sides({"base": "base"}, rounds=1)
    assert seen == [("cuda_graph_loop", False)] * 2 + [("cuda_graph", True)]


def test_bench_kernel_report_refuses_a_missing_csv(tmp_path):
    for args in (["report"], ["report", str(tmp_path / "nothing.csv")]):
        r = _script("bench_kernel.py", *args)
        assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr



def test_sm90_compile_refuses_a_bad_config():
    r = _script("sm90_compile.py", "--config", "64,48,4,3")
    assert r.returncode == 2 and "block_n=48" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_sm90_compile_shows_the_look_ahead_keeps_gathered_tiles_in_flight():
    """docs/kernel.md's P 16 finding, from a local sm_90 compile (a subprocess: the kernel
    must not be the interpreter's): without the block-table look-ahead the context loop
    waits for every async copy (num 0); with it, copies stay in flight across iterations."""
    pytest.importorskip("triton")
    builds = []
    for ahead in (0, 1):
        r = _script("sm90_compile.py", "--config", f"64,64,4,3,0,{ahead}", "--page-size", "16", "--kv-desc", "off")
        if r.returncode != 0 and ("cuobjdump" in r.stderr or "ptxas" in r.stderr):
            pytest.skip(f"no sm_90 toolchain in this Triton: {r.stderr.strip().splitlines()[-1]}")
        assert r.returncode == 0, r.stderr
        builds.append(ast.literal_eval(r.stdout.strip().splitlines()[-1].split(": ", 1)[1]))
    off, on = builds
    assert off["loop_async_wait"] == [0] and min(on["loop_async_wait"]) > 0, (off, on)
    assert off["spill_loads"] == on["spill_loads"] == 0 and on["hgmma"] > 0


def test_sm90_compile_short_builds_have_less_code():
    """docs/kernel.md's short build, from a local sm_90 compile: the 16-row short config at P 16
    without any loop (one-tile) has fewer SASS instructions than today's build; a short build
    with TMA context tiles is refused."""
    pytest.importorskip("triton")
    ins = []
    for short in ([], ["--short-build", "one-tile"]):
        r = _script("sm90_compile.py", "--config", "16,32,2,2", "--page-size", "16", "--kv-desc", "off", *short)
        if r.returncode != 0 and ("cuobjdump" in r.stderr or "ptxas" in r.stderr):
            pytest.skip(f"no sm_90 toolchain in this Triton: {r.stderr.strip().splitlines()[-1]}")
        assert r.returncode == 0, r.stderr
        build = ast.literal_eval(r.stdout.strip().splitlines()[-1].split(": ", 1)[1])
        ins.append(build["ins"])
        assert build["spill_loads"] == 0 and build["loop_async_wait"] == ([] if "one-tile" in short else [0])
    assert ins[0] > ins[1], ins
    r = _script("sm90_compile.py", "--config", "16,32,2,2", "--short-build", "one-tile")
    assert r.returncode == 2 and "--kv-desc off" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_sm90_compile_cvt_path_keeps_fp16_tiles_in_shared_memory():
    """docs/kernel.md's fp8 operand paths, from a local sm_90 compile of the 16-row tile at P 16
    over an e4m3 pool: Triton moves the fp16 path's cast past the shared-memory round trip, so
    the operands are read from fp8 tiles by plain loads; the cvt path's conversion (inline PTX)
    stays beside the load, the tiles are stored in fp16 and read by ldmatrix, with fewer
    instructions and no spills, one-tile build and context loop alike."""
    pytest.importorskip("triton")
    for shape in (["--config", "16,32,2,2", "--short-build", "one-tile"], ["--config", "16,64,2,4"]):
        got = {}
        for path in ("fp16", "cvt"):
            r = _script("sm90_compile.py", *shape, "--page-size", "16", "--kv-desc", "off", "--ops",
                        "--kv-dtype", "float8_e4m3fn", "--fp8-path", path)
            if r.returncode != 0 and ("cuobjdump" in r.stderr or "ptxas" in r.stderr):
                pytest.skip(f"no sm_90 toolchain in this Triton: {r.stderr.strip().splitlines()[-1]}")
            assert r.returncode == 0, r.stderr
            got[path] = ast.literal_eval(r.stdout.strip().splitlines()[-1].split(": ", 1)[1])
        fp16, cvt = got["fp16"], got["cvt"]
        assert cvt["sass"]["LDSM"] > fp16["sass"]["LDSM"] and cvt["sass"]["LDS"] < fp16["sass"]["LDS"], (shape, got)
        assert cvt["ins"] < fp16["ins"] and cvt["spill_loads"] == 0, (shape, got)


def test_sm90_compile_counts_the_tree_mask_and_the_lse_store():
    """docs/kernel.md's one-tile 64-row build at P 16: the LSE store adds SASS instructions to
    either mask's build, the tree bitmask's 64-bit window per row leaves its build below the
    causal one (1150 against 1228 with Triton 3.9, 1208 against 1287 with 3.6), and none spills."""
    pytest.importorskip("triton")
    ins = {}
    for mask, lse in (("tree", []), ("tree", ["--lse"]), ("causal", []), ("causal", ["--lse"])):
        r = _script("sm90_compile.py", "--config", "64,64,4,2", "--page-size", "16", "--kv-desc", "off",
                    "--short-build", "one-tile", "--mask", mask, *lse)
        if r.returncode != 0 and ("cuobjdump" in r.stderr or "ptxas" in r.stderr):
            pytest.skip(f"no sm_90 toolchain in this Triton: {r.stderr.strip().splitlines()[-1]}")
        assert r.returncode == 0, r.stderr
        head, build = r.stdout.strip().splitlines()[-1].split(": ", 1)
        assert head == f"64,64,4,2, {mask}{', LSE' if lse else ''}, bf16 pool", head
        got = ast.literal_eval(build)
        assert got["spill_loads"] == got["spill_stores"] == 0 and got["hgmma"] > 0, got
        ins[mask, bool(lse)] = got["ins"]
    assert ins["tree", False] < ins["causal", False] < ins["causal", True], ins
    assert ins["tree", False] < ins["tree", True], ins


@pytest.mark.parametrize("config, pipe, warps", [("128,64,4,4,168,0,2", "auto", 12), ("192,32,4,4,128,0,3", "on", 16)])
def test_sm90_compile_builds_the_warp_specialised_kernel(config, pipe, warps):
    """The Gluon kernel compiles for sm_90 with this machine's Triton (a subprocess: no
    GPU needed): 12 warps (2 consumer warpgroups and the producer's) or 16 (3), wgmma,
    TMA loads, setmaxnreg and the Q rows' cp.async in the SASS, and shared memory within one CTA's and within
    KernelConfig.ws_shared_bytes's estimate, which plans its occupancy; --pipe on builds
    the pipelined 3-warpgroup kernel on 32-token tiles (auto: the config's choice)."""
    pytest.importorskip("triton")
    from treebench.kernels.tree_attention_plan import SMEM_PER_SM
    cfg = parse_kernel_config(config)
    r = _script("sm90_compile.py", "--ws", "--config", config, "--pipe", pipe)
    if r.returncode != 0 and ("cuobjdump" in r.stderr or "ptxas" in r.stderr):
        pytest.skip(f"no sm_90 toolchain in this Triton: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr
    got = ast.literal_eval(r.stdout.strip().splitlines()[-1].split(": ", 1)[1])
    assert got["pipe"] is (cfg.ws_pipe_for(33) if pipe == "auto" else pipe == "on"), got   # 33 tiles: L 2048
    assert got["num_warps"] == warps and got["hgmma"] > 0 and got["utmaldg"] > 0 and got["setmaxnreg"] > 0, got
    # each consumer copies its next item's Q rows with cp.async (16-byte LDGSTS, 8 per thread at D 128)
    assert got["ldgsts"] >= 8 * (warps // 4 - 1), got
    # each consumer warpgroup's tile loops issue wgmma: at least one innermost wgmma loop per consumer
    assert len(got["tile_loops"]) >= warps // 4 - 1 and all(n > h > 0 <= sp for n, h, sp in got["tile_loops"]), got
    assert got["shared_bytes"] <= cfg.ws_shared_bytes(128) <= SMEM_PER_SM, got
    bad = _script("sm90_compile.py", "--ws", "--config", "64,64,4,3")
    assert bad.returncode == 2 and "--ws needs a warp-specialised config" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("config, page", [("128,64,4,4,168,0,2", 8), ("192,64,4,3,128,0,3", 1)])
def test_sm90_compile_builds_the_gathering_producer(config, page):
    """docs/kernel.md's ws_gather build, from a local sm_90 compile: no TMA load, the
    producer's tile loop issues 8 cp.async (LDGSTS) per thread for K and 8 for V (64-token
    tiles, D 128, 4 producer warps) and spills nothing at its 56 registers; no consumer tile
    loop spills; the warps and shared memory of the TMA build."""
    pytest.importorskip("triton")
    r = _script("sm90_compile.py", "--ws", "--ws-gather", "--page-size", str(page), "--config", config)
    if r.returncode != 0 and ("cuobjdump" in r.stderr or "ptxas" in r.stderr):
        pytest.skip(f"no sm_90 toolchain in this Triton: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr
    assert f"P {page} gather: " in r.stdout
    got = ast.literal_eval(r.stdout.strip().splitlines()[-1].split(": ", 1)[1])
    cfg = parse_kernel_config(config)
    assert got["utmaldg"] == 0 and got["hgmma"] > 0 and got["num_warps"] == 4 * (cfg.ws + 1), got
    n, copies, spills = got["producer_loop"]
    assert copies >= 16 and spills == 0, got
    assert all(sp == 0 for _, _, sp in got["tile_loops"][:2 * cfg.ws]), got    # the consumers' tile loops
    assert got["shared_bytes"] <= cfg.ws_shared_bytes(128), got


@pytest.mark.parametrize("kv", ["float8_e4m3fn", "float8_e5m2"])
def test_sm90_compile_builds_the_warp_specialised_kernel_over_fp8_pools(kv):
    """docs/kernel.md's ws_fp8 figures, from a local sm_90 compile: over fp8 pools the 2-warpgroup
    build has 16 warps (the converter's warpgroup more), its converter loop converts a K and a V
    tile per iteration by integer ops and bf16x2 multiplies (64 HMUL2, no F2F) without spilling,
    the consumers' context tile loops do not spill, and shared memory (both rings) stays within
    the config's estimate and one CTA's."""
    pytest.importorskip("triton")
    from treebench.kernels.tree_attention_plan import SMEM_PER_SM, WS2_FP8
    r = _script("sm90_compile.py", "--ws", "--kv-dtype", kv, "--config", "128,64,4,3,128,0,2,4")
    if r.returncode != 0 and ("cuobjdump" in r.stderr or "ptxas" in r.stderr):
        pytest.skip(f"no sm_90 toolchain in this Triton: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr
    got = ast.literal_eval(r.stdout.strip().splitlines()[-1].split(": ", 1)[1])
    assert got["num_warps"] == 16 and got["pipe"] and got["hgmma"] > 0 and got["utmaldg"] > 0, got
    (loop,) = got["convert_loops"]
    assert loop["HMUL2"] == 64 and loop["F2F"] == loop["LDL"] == loop["STL"] == 0 and loop["STS"] == 16, got
    assert all(sp == 0 for _, _, sp in got["tile_loops"][:4]), got      # the context tile loops
    assert got["shared_bytes"] <= WS2_FP8.ws_shared_bytes(128) <= SMEM_PER_SM, got
    bad = _script("sm90_compile.py", "--ws", "--kv-dtype", kv, "--config", "128,64,4,4,168,0,2")
    assert bad.returncode == 2 and "fp8_stages (its 8th field) > 0 exactly when" in bad.stderr, bad.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU refusal")
def test_ws_probe_run_without_a_gpu_says_so():
    r = _script("ws_probe.py", "run")
    assert r.returncode == 2 and "sm_90" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("args", [[], ["nosuch"], ["compile", "--x"]])
def test_ws_probe_refuses_bad_arguments_in_one_line(args):
    r = _script("ws_probe.py", *args)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "compile|run" in r.stderr, r.stderr


def test_ws_probe_compile_shows_what_hopper_warp_specialisation_does_with_the_context_loop():
    """docs/kernel.md's warp-specialisation finding, from a local sm_90 compile with Triton 3.9:
    with 64 rows the loop is split into a producer and two consumers that both compute (and
    store) the same rows; with 128 rows in 4 warps the compile fails; with 8 warps the
    loop is not specialised at all."""
    triton = pytest.importorskip("triton")
    if not triton.__version__.startswith("3.9"):
        pytest.skip(f"the finding was recorded with Triton 3.9 (this is {triton.__version__})")
    r = _script("ws_probe.py", "compile")
    if r.returncode != 0 and ("cuobjdump" in r.stderr or "ptxas" in r.stderr):
        pytest.skip(f"no sm_90 toolchain in this Triton: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr
    lines = dict(ln.split(": ", 1) for ln in r.stdout.strip().splitlines()[1:])
    plain, ws = (ast.literal_eval(lines[k]) for k in ("64 rows, no WS", "64 rows, WS"))
    assert plain["ws_regions"] == 0 and plain["warps"] == 4
    assert ws["ws_regions"] == 1 and ws["warps"] == 12
    assert ws["dots_per_partition"] == [0, 2, 2] and ws["stores_per_partition"] == [0, 1, 1]
    assert lines["128 rows, 4 warps, WS"].startswith("compile failed: ")
    assert ast.literal_eval(lines["128 rows, 8 warps, WS"])["ws_regions"] == 0


def test_bench_kernel_report_counts_failures_of_every_phase(tmp_path):
    """A failed variant of any phase (wscheck here) is counted and makes `report` exit 1;
    the env rows, which check nothing, are not."""
    import csv
    path = tmp_path / "kernel.csv"
    fields = ["phase", "tree", "B", "L", "P", "D", "Hq", "mode", "splits", "max_abs_err", "error", "passed",
              "median_us"]
    rows = [dict(phase="env", tree="copy", passed=""), dict(phase="wscheck", tree="full:3:3", passed="True"),
            dict(phase="wscheck", tree="random:30:5", passed="False", error="mismatch")]
    for failed in (1, 0):
        rows[2]["passed"] = str(not failed)
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)
        r = _script("bench_kernel.py", "report", str(path))
        assert r.returncode == failed and f"failed {failed}" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("args, needle", [
    (["--config", "128,64,4,4,168,0,2"], "is a warp-specialised config (7th field ws > 0): add --ws"),
    (["--ws", "--config", "128,64,4,6,168,0,2"], "over one CTA's 232448: fewer stages"),
    (["--ws", "--config", "128,64,4,4,64,0,2"], "each consumer warpgroup keeps at least 128"),
    (["--config", "192,64,4,3"], "192 rows are the 3 consumer warpgroups"),
    (["--config", "64,64,4,3", "--pipe", "on"], "--pipe applies to the warp-specialised build only: add --ws"),
    (["--ws", "--lse"], "--lse applies to the tl builds only: drop --ws"),
    (["--ws-gather", "--page-size", "8"], "--ws-gather applies to the warp-specialised build only: add --ws"),
    (["--ws", "--ws-gather", "--page-size", "0"], "--page-size 0: must be a positive number of tokens"),
    (["--ws", "--kv-dtype", "float8_e4m3fn", "--fp8-path", "fp16"], "--fp8-path applies to the tl builds only"),
])
def test_sm90_compile_refuses_ws_configs_it_cannot_build(args, needle):
    pytest.importorskip("triton")
    r = _script("sm90_compile.py", *args)
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_ncu_sass_segments_groups_by_execution_count(tmp_path):
    """Consecutive instructions executed equally often form one segment; a file that is
    not an ncu SASS export is one line, exit 2."""
    hdr = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_wait",
           "stall_long_sb", "stall_wait (Not Issued)"]
    rows = [["0x0", "LDG", "50", "8", "0", "50", "0"], ["0x10", "STS", "30", "8", "0", "30", "0"],
            ["0x20", "HGMMA", "100", "264", "100", "0", "0"]]
    export = tmp_path / "sass.csv"
    export.write_text("\n".join(",".join(f'"{c}"' for c in r) for r in [["Kernel Name", "k"], hdr, *rows]) + "\n")
    r = _script("ncu_sass_segments.py", str(export), "--min", "1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert "3 instructions, 180 samples" in lines[0] and len(lines) == 3
    assert "[0,2) executed      8 n    2 samples    80" in lines[1] and "'long_sb': 80" in lines[1]
    assert "[2,3) executed    264 n    1 samples   100" in lines[2]
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    bad = _script("ncu_sass_segments.py", str(tmp_path / "bad.csv"))
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "not an ncu" in bad.stderr


def test_clock_probe_parses_smi_lines_and_summarizes():
    """nvidia-smi's csv lines -> (time, SM MHz, mem MHz, W, C, reasons); headers and [N/A]
    give None; a timer's summary ORs the throttle reasons and takes the samples' median clock."""
    clock_probe = _import_script("clock_probe")
    s = clock_probe.parse_smi_line("2026/12/01 03:35:12.250, 1845, 3201, 609.52, 58, 0x0000000000000004")
    assert s is not None and s[1:] == (1845.0, 3201.0, 609.52, 58.0, 4) and abs(s[0] % 1 - 0.25) < 1e-6
    assert clock_probe.parse_smi_line("timestamp, clocks.current.sm [MHz], x, y, z, w") is None
    assert clock_probe.parse_smi_line("2026/12/01 03:35:12.250, [N/A], 3201, 609.52, 58, 0x4") is None
    samples = [(0.0, 1500.0, 0, 600.0, 58.0, 4), (0.1, 1600.0, 0, 700.0, 59.0, 1), (0.2, 1700.0, 0, 650.0, 60.0, 0)]
    row = clock_probe.summarize("loop", [225.0, 227.0, 221.0], samples)
    assert row["calls_median_us"] == 225.0 and row["sm_mhz_median"] == 1600.0 and row["sm_mhz_min"] == 1500.0
    assert row["power_w_max"] == 700.0 and row["throttle_reasons"] == "0x5" and row["smi_samples"] == 3


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusals before any GPU work")
def test_clock_probe_refuses_bad_input_with_one_line(tmp_path):
    for args in (["--timers", "bogus"], ["--seconds", "0"], []):
        r = _script("clock_probe.py", "--out", str(tmp_path / "o"), *args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


def test_ab_kernel_base_imports_its_own_modules(tmp_path):
    """load_base copies every module of the base folder and points the base's package imports at
    the copy: a marker in the base's tl kernel module is what its tree_attention sees."""
    base = _base_copy(tmp_path)
    tl = base / "tree_attention_tl.py"
    tl.write_text(tl.read_text() + "\nAB_BASE_MARKER = 'base'\n")
    mod = _import_script("ab_kernel").load_base(base, "marker")
    tl_mod = sys.modules[mod.tree_attn_fwd_kernel.fn.__module__]
    assert tl_mod.__name__ == "kernels_marker.tree_attention_tl" and tl_mod.AB_BASE_MARKER == "base"
    assert not any(getattr(v, "__module__", "").startswith("treebench.kernels.")
                   for v in vars(mod).values() if callable(v) and not isinstance(v, type(sys)))


STUB_PYTHON = """#!/usr/bin/env bash
# stands in for `python3 -m treebench`: `run` appends its arguments as one row to --out, exits $STUB_RC
[ "$3" = run ] || exit 0
echo "$*" >> "$STUB_LOG"
while [ $# -gt 0 ]; do [ "$1" = --out ] && echo '{}' >> "$2"; shift; done
exit "${STUB_RC:-0}"
"""


def _baseline(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """lab/h200_baseline.sh with a stand-in python3 first on PATH (no treebench run, no GPU)."""
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    (stub / "python3").write_text(STUB_PYTHON)
    (stub / "python3").chmod(0o755)
    full = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "STUB_LOG": str(tmp_path / "runs.log"),
            "BACKENDS": "triton_tree", **env}
    return subprocess.run(["bash", str(LAB / "h200_baseline.sh")], cwd=ROOT, capture_output=True, text=True,
                          env=full, timeout=60)


@pytest.mark.parametrize("env", [{"SHARDS": "0"}, {"SHARDS": "two"}, {"SHARDS": "2", "SHARD": "0/2"},
                                 {"SHARDS": "2", "RESUME_FROM": "x.jsonl"}, {"SHARDS": "2", "STAGE": "checks"}])
def test_h200_baseline_refuses_bad_shards_with_one_line(tmp_path, env):
    out = tmp_path / "out"
    r = _baseline(tmp_path, OUT=str(out), **{"STAGE": "seed", **env})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "SHARDS=" in r.stderr, r.stderr
    assert not out.exists()


def test_h200_baseline_shards_resume_and_finish_across_calls(tmp_path):
    """SHARDS=3: a cut shard stops the call; the next call resumes it and runs the rest; a third
    call finds every shard done and runs nothing; with under 45 s of budget nothing starts."""
    out, log = tmp_path / "out", tmp_path / "runs.log"
    r = _baseline(tmp_path, OUT=str(out), STAGE="seed", SHARDS="3", STUB_RC="124")
    assert r.returncode == 0, r.stderr
    assert log.read_text().count(" run ") == 1 and "--shard 0/3" in log.read_text()
    assert not list((out / "seed").glob("*.done"))
    r = _baseline(tmp_path, OUT=str(out), STAGE="seed", SHARDS="3")
    runs = log.read_text().splitlines()[1:]
    assert [(" --shard 0/3 --resume" in x, f"--shard {i}/3" in x) for i, x in enumerate(runs)] == [
        (True, True), (False, True), (False, True)], runs
    assert sorted(p.name for p in (out / "seed").glob("*.done")) == [f"seed-shard{i}.done" for i in range(3)]
    assert (out / "seed" / "seed-shard0.jsonl").read_text().count("{}") == 2
    _baseline(tmp_path, OUT=str(out), STAGE="seed", SHARDS="3")
    assert len(log.read_text().splitlines()) == 4
    fresh = tmp_path / "fresh"
    _baseline(tmp_path, OUT=str(fresh), STAGE="seed", SHARDS="2", BUDGET="30")
    assert "not started" in (fresh / "seed" / "exit-codes.txt").read_text() and not (fresh / "seed" / "seed-shard0.jsonl").exists()
