"""The Triton tree kernel at page sizes that are not a multiple of its tile: P 1, 3, 8, 24
(a tile spans several pages, a page lookup per token or per page), the block-table
paths that must agree bit for bit, and the `kernel` attribute naming the path taken.

CPU: Triton's interpreter (TRITON_INTERPRET=1, 16 x 16 tiles), tiny shapes. The `gpu`
tests compile the kernel for a CUDA GPU (64-token tiles).
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.kernel_device import DEVICE, TINY, triton  # noqa: E402,F401  (sets TRITON_INTERPRET first)
from tests.kernel_device import run_checked as run  # noqa: E402
from treebench.backends.triton_tree import TRITON_CAPABILITIES, TritonTreeBackend  # noqa: E402
from treebench.harness.adapter.contract import capability_skip  # noqa: E402
from treebench.harness.checking.default_check import default_check  # noqa: E402
from treebench.harness.model.cases import Case  # noqa: E402
from treebench.harness.model.compare import compare  # noqa: E402
from treebench.harness.model.paged import build_inputs  # noqa: E402
from treebench.harness.model.reference import reference_attention  # noqa: E402
from treebench.kernels.options import KernelOptions  # noqa: E402
from treebench.kernels.tree_attention_plan import KernelConfig  # noqa: E402

from treebench.kernels.tree_attention import TreeAttention  # noqa: E402





@pytest.mark.parametrize("page_size", [1, 3, 8, 24])
@pytest.mark.parametrize("splits", [1, 3])
def test_any_page_size_ragged_contexts_mixed_trees(page_size, splits):
    """B 4, L_b drawn in [0, 50] (pages cut mid-tile, a NaN page after each row's last),
    a random tree per request; with split-KV some splits hold no tile of a short request."""
    case = Case(batch_size=4, context_len="ragged:0-50", tree="full:2:2", tree_per_request="mixed",
                page_size=page_size, **TINY)
    ta = run(case, num_splits=splits)
    assert ta.kernel == f"tl gather splits={splits}"


@pytest.mark.parametrize("page_size", [1, 8, 24])
def test_any_page_size_bias_and_causal_modes(page_size):
    case = Case(batch_size=2, context_len="ragged:0-40", tree="full:2:2", page_size=page_size, **TINY)
    for mode in ("bias", "causal"):
        inputs = build_inputs(case, DEVICE)
        if mode == "causal":
            inputs = inputs.causal()
        out = TreeAttention(inputs, mode)()
        assert compare(out, reference_attention(inputs), inputs.qo_indptr, case.dtype).passed


@pytest.mark.parametrize("page_size,block_n", [(4, 16), (8, 16), (8, 32), (16, 32)])
@pytest.mark.parametrize("bt_ahead", [0, 1])
def test_page_gather_matches_the_token_gather_bit_for_bit(page_size, block_n, bt_ahead):
    """options.page_gather (one block-table entry per page of a tile that spans whole pages)
    reads the same rows as a lookup per token: the same output, bit for bit."""
    case = Case(batch_size=3, context_len="ragged:0-90", tree="full:2:2", tree_per_request="mixed",
                page_size=page_size, **TINY)
    cfg = KernelConfig(16, block_n, 1, 1, bt_ahead=bt_ahead)
    token = run(case, config=cfg, num_splits=2)
    page = run(case, config=cfg, num_splits=2, options=KernelOptions(page_gather=True))
    assert (token.kernel, page.kernel) == ("tl gather splits=2", "tl gather-page splits=2")
    torch.testing.assert_close(page.out, token.out, rtol=0, atol=0)


@pytest.mark.parametrize("page_size", [1, 8, 16, 32])
@pytest.mark.parametrize("splits,bt_ahead", [(1, 0), (3, 0), (3, 1)])
def test_early_first_tile_matches_the_default_bit_for_bit(page_size, splits, bt_ahead):
    """options.early_first (a split's first tile's pages loaded before the lengths) gives
    the same output: one-tile requests (L_b 0-12), requests whose first split tile is a
    context tile, and splits that hold nothing."""
    case = Case(batch_size=4, context_len="list:0,5,12,70", tree="full:2:1", tree_per_request="mixed",
                page_size=page_size, **TINY)
    cfg = KernelConfig(16, 16, 1, 1, bt_ahead=bt_ahead)
    base = run(case, config=cfg, num_splits=splits, options=KernelOptions(kv_desc=False, early_first=False))
    early = run(case, config=cfg, num_splits=splits, options=KernelOptions(kv_desc=False, early_first=True))
    torch.testing.assert_close(early.out, base.out, rtol=0, atol=0)


def test_kernel_attribute_names_the_page_path():
    """tile: a tile inside one page; tma: the same through descriptors; splits as planned."""
    case = Case(batch_size=2, context_len=40, tree="full:2:2", page_size=32, **TINY)
    assert run(case, options=KernelOptions(kv_desc=False)).kernel == "tl tile splits=1"
    assert run(case, options=KernelOptions(kv_desc=True), num_splits=2).kernel == "tl tma splits=2"


def test_triton_capabilities_take_every_page_size():
    """The adapter declares any P, so the runner takes every P and the default check runs
    P 1 (and with --deep 8 and 24) instead of recording them as skipped."""
    for p in (1, 3, 8, 24, 48, 256):
        case = Case(batch_size=1, context_len=p + 1, tree="full:2:2", page_size=p, **TINY)
        assert capability_skip(TRITON_CAPABILITIES, case) is None
    for deep, want in ((False, {"1", "16"}), (True, {"1", "8", "24"})):
        pages = default_check(TritonTreeBackend(), deep=deep, device="cpu").coverage["page_size"]
        assert want <= set(pages["ran"]) and not pages["skipped"], pages


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("page_size", [1, 3, 8, 24, 16, 40])
@pytest.mark.parametrize("opts", [{}, dict(page_gather=True), dict(early_first=True)], ids=["base", "page", "early"])
@pytest.mark.parametrize("tree,splits", [("random:40:3", None), ("full:3:1", None), ("full:2:2", 4)])
def test_any_page_size_on_gpu(page_size, opts, tree, splits):
    """64-token tiles (GPU configs) over pages of 1-40 tokens: 16, 28 and 164 packed rows."""
    case = Case(batch_size=5, context_len="ragged:0-700", tree=tree, tree_per_request="mixed",
                page_size=page_size, num_q_heads=32, num_kv_heads=8, head_dim=128)
    ta = run(case, num_splits=splits, options=KernelOptions(**opts))
    assert ta.kernel.startswith("tl gather")


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("page_size", [16, 32])
@pytest.mark.parametrize("tree,batch,splits", [("vllm:pr_27", 64, None), ("full:3:3", 16, None),
                                               ("random:40:3", 5, 3)])
def test_ws_kernel_one_tma_box_per_page_on_gpu(page_size, tree, batch, splits):
    """options.ws_page_tma (the default): the warp-specialised kernel at P 16 / 32 loads each 64-token tile
    as 4 / 2 page boxes; ragged contexts end mid-page and mid-tile (the last tile's rows past
    S_b are zeroed in shared memory, its later pages clamped to the request's last page)."""
    case = Case(batch_size=batch, context_len="ragged:0-900", tree=tree, tree_per_request="mixed",
                page_size=page_size, num_q_heads=32, num_kv_heads=8, head_dim=128)
    ta = run(case, ws=True, num_splits=splits)
    assert ta.kernel.startswith("ws tma-page")
    off = TreeAttention(build_inputs(case, DEVICE), options=KernelOptions(ws_page_tma=False))
    assert off.kernel.startswith("tl gather")


def test_latency_sweep_refuses_bad_arguments_and_runs_in_the_interpreter(tmp_path):
    """lab/latency_sweep.py: one line and exit 2 on bad input, nothing written; --smoke
    runs its two tiny cells in the interpreter and writes every candidate's row."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parents[1] / "lab" / "latency_sweep.py"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    for args, needle in ((["--out", str(tmp_path / "x.txt")], "want a new .json"),
                         (["--out", str(tmp_path / "a.json"), "--groups", "nope"], "--groups"),
                         (["--out", str(tmp_path / "a.json"), "--budget-s", "0"], "--budget-s")):
        r = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env)
        assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not list(tmp_path.iterdir())
    out = tmp_path / "smoke.json"
    r = subprocess.run([sys.executable, str(script), "--smoke", "--out", str(out)], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert {r["status"] for r in rows} == {"pass"} and {"default", "early", "tl16x32w2s2+early"} <= \
        {r["candidate"] for r in rows}
    out = tmp_path / "smoke-fp8.json"
    r = subprocess.run([sys.executable, str(script), "--smoke", "--groups", "fp8,b1", "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert {r["group"] for r in rows} == {"fp8", "b1"} and {r["status"] for r in rows} == {"pass"}
    assert {"bf16_default", "default", "fp8_cast", "fp8_bits", "tl16x64w2s4", "tl16x64w2s4+cast", "splits4",
            "swap_ab", "tl16x64w4s4+swap", "ws_fp8"} <= {r["candidate"] for r in rows}
    assert {r["splits"] for r in rows if r["candidate"] == "splits32"} == {32}
    twin = next(r for r in rows if r["candidate"] == "bf16_default")
    assert twin["kv_dtype"] == "bfloat16" and "kvfp8" not in twin["case_id"]
    assert "/bf16" in r.stdout


def test_latency_sweep_makes_a_raising_candidate_a_row_and_goes_on():
    """A candidate whose build raises something other than ConfigError (out of resources, a
    compiler error) is an "error" row with the reason, not the end of the sweep."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "latency_sweep", Path(__file__).resolve().parents[1] / "lab" / "latency_sweep.py")
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    case = Case(batch_size=1, context_len=8, tree="chain:2", num_q_heads=2, num_kv_heads=1, head_dim=16,
                page_size=8)
    inputs = build_inputs(case, "cpu")
    row = sweep.run_candidate(inputs, None, case, None, KernelOptions(), "cpu", True, {"no_such_option": 1})
    assert row["status"] == "error" and "TypeError" in row["reason"] and "no_such_option" in row["reason"]
