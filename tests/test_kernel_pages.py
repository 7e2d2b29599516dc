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
from tests.kernel_device import assert_graph_replays  # noqa: E402
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
    off = TreeAttention(build_inputs(case, DEVICE), ws=True, num_splits=splits,
                        options=KernelOptions(ws_page_tma=False))
    assert off.kernel.startswith("ws gather")      # the producer's gathers (ws_gather, the default)
    off = TreeAttention(build_inputs(case, DEVICE), options=KernelOptions(ws_page_tma=False, ws_gather=False))
    assert off.kernel.startswith("tl gather")      # the plan's kernel: no TMA path reads these pages


def _run_b16_one_wave(case):
    """`run(case)` for a B 16, Hkv 8 case; skips (after checking that the plan took the tl kernel)
    on a GPU whose SM count those 128 programs do not fill in one wave (`ws1_config`'s rule)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ta = run(case)
    if not 0.9 * sms <= 16 * 8 <= sms:
        assert not ta.ws            # another GPU's SM count: the rule does not hold
        pytest.skip(f"{sms} SMs: B 16 x Hkv 8 programs are not one wave that fills them")
    return ta


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("page_size", [16, 32])
@pytest.mark.parametrize("context_len", [1024, "ragged:900-1100"])
def test_plan_takes_one_consumer_warpgroup_for_full32_at_b16_on_gpu(page_size, context_len):
    """full:3:2 (52 rows at G 4) at B 16, Hkv 8 over P 16 / 32: where the B * Hkv programs fill
    the GPU in one wave (128 on an H200's 132 SMs, `ws1_config`) the plan reads the pages one TMA
    box each with one consumer warpgroup; without ws_page_tma, at B 64 or at P 128 it keeps the tl
    kernel. An e4m3 pool takes WS1_FP8 there (`ws1_config`), the tl kernel with ws_fp8 off."""
    import dataclasses

    from treebench.kernels.tree_attention_plan import WS1, WS1_FP8
    case = Case(batch_size=16, context_len=context_len, tree="full:3:2", page_size=page_size,
                num_q_heads=32, num_kv_heads=8, head_dim=128)
    ta = _run_b16_one_wave(case)
    assert ta.plan.config == WS1 and ta.kernel == "ws tma-page splits=1"
    assert run(case, options=KernelOptions(ws_page_tma=False)).kernel.startswith("tl gather")
    for other in (dict(batch_size=64), dict(page_size=128)):
        assert not run(dataclasses.replace(case, **other)).ws, other
    fp8 = dataclasses.replace(case, kv_dtype="float8_e4m3fn")   # fp8 pools: WS1_FP8, its converter beside
    assert TreeAttention(build_inputs(fp8, DEVICE)).plan.config == WS1_FP8
    assert not TreeAttention(build_inputs(fp8, DEVICE), options=KernelOptions(ws_fp8=False)).ws


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("page_size", [16, 128])
@pytest.mark.parametrize("context_len", [1024, "ragged:900-1100"])
def test_plan_takes_one_consumer_warpgroup_for_full31_at_b16_on_gpu(page_size, context_len):
    """full:3:1 (16 rows at G 4) at B 16, Hkv 8: where the B * Hkv programs fill the GPU in one
    wave the plan takes WS1 with one split at P 16 (a TMA box per page) and P 128 (whole tiles),
    and the output matches the float64 reference; full:3:0 (4 rows), B 64 and e4m3 pools keep the
    tl kernel (`ws1_config`)."""
    import dataclasses

    from treebench.kernels.tree_attention_plan import WS1
    case = Case(batch_size=16, context_len=context_len, tree="full:3:1", page_size=page_size,
                num_q_heads=32, num_kv_heads=8, head_dim=128)
    ta = _run_b16_one_wave(case)
    assert ta.plan.config == WS1 and ta.plan.num_splits == 1
    assert ta.kernel == f"ws {'tma-page' if page_size == 16 else 'tma'} splits=1"
    for other in (dict(tree="full:3:0"), dict(batch_size=64), dict(kv_dtype="float8_e4m3fn")):
        assert not run(dataclasses.replace(case, **other)).ws, other


# ---- the warp-specialised kernel's page paths (KernelOptions.ws_gather) ----------------


@pytest.mark.parametrize("page_size,block_n,page_tma,gather,expect", [
    (128, 64, False, False, "tma"), (64, 64, True, True, "tma"), (96, 32, False, True, "tma"),
    (16, 64, True, False, "tma-page"), (32, 64, True, True, "tma-page"), (16, 32, True, True, "tma-page"),
    (16, 64, False, False, ""), (16, 64, False, True, "gather"), (96, 64, True, False, ""),
    *((p, 64, True, False, "") for p in (1, 3, 8, 24, 40, 48, 96, 232)),
    *((p, 64, True, True, "gather") for p in (1, 3, 8, 24, 40, 48, 96, 232)),
    (8, 32, True, True, "gather"), (48, 32, True, True, "gather"),
])
def test_ws_page_path_takes_any_page_size_only_with_gather(page_size, block_n, page_tma, gather, expect):
    """TMA boxes of a tile where P % BLOCK_N == 0, of a page where P is a multiple of 16
    dividing the tile (with ws_page_tma); any other P only with ws_gather."""
    from treebench.kernels.tree_attention_plan import ws_page_path
    assert ws_page_path(page_size, block_n, page_tma, gather) == expect


@pytest.mark.parametrize("page_size,gather,why,box", [
    (8, False, "page size 8 is not a multiple of BLOCK_N 64 (KernelOptions.ws_gather=True reads any page size)", 64),
    (8, True, "", 8), (24, True, "", 24), (1, True, "", 1), (96, True, "", 96),
    (128, True, "", 64), (16, True, "", 16), (16, False, "", 16),
])
def test_ws_unsupported_page_reasons_with_and_without_gather(monkeypatch, page_size, gather, why, box):
    """ws_unsupported on a stand-in sm_90 batch: without ws_gather a pool TMA cannot read is
    refused with the page size and the option that takes it; with it the pool's layout is
    still checked (`kv_desc_unsupported` with P-token boxes), and pools TMA can read keep
    their TMA checks (a tile, or a page with ws_page_tma)."""
    import types

    from treebench.kernels import tree_attention
    seen = []

    def kv_desc(inputs, block_n):
        seen.append(block_n)
        p = inputs.k_cache.shape[1]
        return f"page size {p} is not a multiple of BLOCK_N {block_n}" if p % block_n else ""

    monkeypatch.setattr(tree_attention, "interpreting", lambda: False)
    monkeypatch.setattr(tree_attention, "kv_desc_unsupported", kv_desc)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    q = torch.zeros(3, 8, 128, dtype=torch.bfloat16)
    pool = torch.zeros(4, page_size, 2, 128, dtype=torch.bfloat16)
    inputs = types.SimpleNamespace(device=torch.device("cuda"), q=q, k_cache=pool, v_cache=pool,
                                   k_scale=1.0, v_scale=1.0)
    assert tree_attention.ws_unsupported(inputs, 64, True, gather) == why
    assert seen == [box]
    monkeypatch.setattr(tree_attention, "kv_desc_unsupported", lambda inputs, block_n: "the K/V pools are not "
                        "contiguous (N, P, Hkv, D)")
    assert "not contiguous" in tree_attention.ws_unsupported(inputs, 64, True, gather)
    fp8 = types.SimpleNamespace(**{**vars(inputs), "k_cache": pool.to(torch.float8_e4m3fn)})
    assert "kv dtype" in tree_attention.ws_unsupported(fp8, 64, True, gather)


def test_ws_gather_option_plumbing_on_the_cpu():
    """KernelOptions.ws_gather: on by default, a bool; without a GPU the plan keeps the tl
    kernel (same output, bit for bit) and ws=True names why; the gathering producer's
    registers (`KernelConfig.ws_regs_for`) leave every table config's consumers their floor."""
    from treebench.harness.errors import ConfigError
    from treebench.kernels.tree_attention_plan import (WS2, WS3, WS_GATHER_PRODUCER_REGS, WS_MIN_CONSUMER_REGS,
                                                       WS_PRODUCER_REGS)
    assert KernelOptions().ws_gather is True and KernelOptions(ws_gather=False).changed() == {"ws_gather": False}
    for bad in (1, None, "yes"):
        with pytest.raises(ConfigError, match=f"ws_gather={bad!r}: must be True or False"):
            KernelOptions(ws_gather=bad)
    assert WS2.ws_regs_for(True) == (224, WS_GATHER_PRODUCER_REGS)     # (3 * 168 - 56) / 2, a multiple of 8
    assert WS3.ws_regs_for(True) == (152, WS_GATHER_PRODUCER_REGS) and WS3.ws_regs == (152, WS_PRODUCER_REGS)
    assert WS2.ws_regs_for(False) == WS2.ws_regs
    assert KernelConfig(64, 64, 4, 2, 88, 0, 1).ws_regs_for(True)[0] < WS_MIN_CONSUMER_REGS   # refused with gather
    case = Case(batch_size=2, context_len="ragged:0-40", tree="full:2:2", page_size=8, **TINY)
    base = run(case)
    on = run(case, options=KernelOptions(ws_gather=True))
    assert on.kernel == base.kernel == "tl gather splits=1" and on.ws_path == "" and not on.ws
    torch.testing.assert_close(on.out, base.out, rtol=0, atol=0)
    if DEVICE == "cpu":
        with pytest.raises(ConfigError, match="ws=True: the warp-specialised kernel needs a CUDA GPU"):
            TreeAttention(build_inputs(case, DEVICE), ws=True, options=KernelOptions(ws_gather=True))


SM90 = DEVICE == "cuda" and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("page_size", [1, 3, 8, 24, 48])
@pytest.mark.parametrize("tree,context,splits", [
    ("vllm:pr_27", "list:1000", None),                       # B 1: 112 rows, split-KV over the one request
    ("full:3:3", "list:0,37,64,130,700,1001", 1),            # B 6: 160 rows (3 warpgroups), L_b 0 and ragged
    ("random:40:3", "ragged:0-900", 3),                      # B 5: mixed trees, several M-tiles, idle consumers
])
def test_ws_gather_any_page_size_on_gpu(page_size, tree, context, splits):
    """options.ws_gather: the warp-specialised kernel gathers each tile by cp.async at pages no
    TMA path reads (P 1-48), against the float64 reference (output and LSE): GQA 4, the tree
    bitmask, split-KV on and off, L_b 0 and lengths that end mid-page and mid-tile (rows past
    S_b zero-filled, never read from the NaN slots); replayed from a CUDA graph."""
    batch = len(context.split(":")[1].split(",")) if context.startswith("list:") else 5
    case = Case(batch_size=batch, context_len=context, tree=tree, tree_per_request="mixed",
                page_size=page_size, num_q_heads=32, num_kv_heads=8, head_dim=128)
    ta = run(case, ws=True, num_splits=splits, options=KernelOptions(ws_gather=True))
    assert ta.ws and ta.ws_path == "gather" and not ta.kv_desc
    assert ta.kernel == f"ws gather splits={ta.plan.num_splits}"
    assert ta.plan.num_splits == splits if splits else ta.plan.num_splits > 1
    assert_graph_replays(ta, ta.out.clone())


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU")
def test_ws_gather_reasons_and_paths_on_gpu():
    """Without ws_gather P 8 names the option and keeps the tl kernel; with it the default plan
    takes the gathers for a large batch of the 27-node tree (bias and causal modes too), while
    pools TMA can read (P 16, 128) keep their TMA paths."""
    import dataclasses

    from treebench.kernels.tree_attention import ws_unsupported
    case = Case(batch_size=48, context_len="ragged:100-400", tree="vllm:pr_27", page_size=8,
                num_q_heads=32, num_kv_heads=8, head_dim=128)
    inputs = build_inputs(case, DEVICE)
    assert "ws_gather" in ws_unsupported(inputs, 64, True) and ws_unsupported(inputs, 64, True, True) == ""
    assert TreeAttention(inputs, options=KernelOptions(ws_gather=False)).kernel.startswith("tl gather")
    assert TreeAttention(inputs).kernel == "ws gather splits=1"                  # the default
    for mode in ("tree", "bias", "causal"):
        assert run(case, mode, options=KernelOptions(ws_gather=True)).kernel == "ws gather splits=1"
    for p, path in ((16, "tma-page"), (128, "tma")):
        ta = TreeAttention(build_inputs(dataclasses.replace(case, page_size=p), DEVICE),
                           options=KernelOptions(ws_gather=True))
        assert ta.ws_path == path and ta.kv_desc


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
                         (["--out", str(tmp_path / "a.json"), "--budget-s", "0"], "--budget-s"),
                         (["--out", str(tmp_path / "a.json"), "--candidates", "default,nope"], "no candidate nope in groups latency,pages; known: "),
                         (["--out", str(tmp_path / "a.json"), "--page-sizes", "16,x"], "--page-sizes"),
                         (["--out", str(tmp_path / "a.json"), "--batch-sizes", "1,x"], "--batch-sizes"),
                         (["--out", str(tmp_path / "a.json"), "--trees", "full:3:3,nope"], "no cell of tree nope")):
        r = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env)
        assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not list(tmp_path.iterdir())
    out = tmp_path / "smoke.json"
    r = subprocess.run([sys.executable, str(script), "--smoke", "--out", str(out)], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert {r["status"] for r in rows} == {"pass"} and {"default", "early", "tl16x32w2s2+early", "short_build",
                                                        "no_short_build"} <= {r["candidate"] for r in rows}
    kernels = {r["candidate"]: r["kernel"] for r in rows if r["group"] == "latency"}      # S_b 19: two tiles
    assert kernels["short_build"] == kernels["no_short_build"] == kernels["default"]     # one-tile cannot run
    assert kernels["tl16x32w4s2+short"].endswith(" one-tile") and kernels["tl16x64w8s2+short"].endswith(" one-tile")
    gather = [r["candidate"] for r in rows if r["group"] == "pages" and r["page_size"] == 8]
    assert gather == ["default", "no_ws_gather"]        # P 8: the default against the tl kernel's gather only
    out = tmp_path / "smoke-fp8.json"
    r = subprocess.run([sys.executable, str(script), "--smoke", "--groups", "fp8,b1,fp8_latency,decode", "--out",
                        str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert {r["group"] for r in rows} == {"fp8", "b1", "fp8_latency", "decode"} and {r["status"] for r in rows} == {"pass"}
    decode = {r["candidate"]: r for r in rows if r["group"] == "decode"}       # split counts and tiles
    assert set(decode) == {"default", "tl", "splits1", "splits8", "tl16x64w4s3", "tl16x128w4s3", "tl16x32w2s3 splits6",
                           "tl16x64w2s3 splits6"}
    assert decode["splits8"]["splits"] == 8 and "block_n=128" in decode["tl16x128w4s3"]["config"]
    assert decode["tl16x32w2s3 splits6"]["splits"] == 6 and "block_n=32" in decode["tl16x32w2s3 splits6"]["config"]
    short = {r["candidate"]: r for r in rows if r["group"] == "fp8_latency"}   # an L 16 cell over the e4m3 pool
    assert set(short) == {"bf16_default", "default", "fp8_fp16", "fp8_cast", "fp8_bits", "fp8_cvt", "fp8_split",
                          "token_pages", "token_pages+fp16", "no_token_pages", "no_short_build",
                          "tl16x32w4s2+short",
                          "tl32x64w8s2+short", "tl16x128w4s2+short"}
    assert short["tl16x32w4s2+short"]["kernel"].endswith(" one-tile")          # S_b 19 fits its 32-token tile
    assert short["default"]["kv_dtype"] == "float8_e4m3fn" and short["bf16_default"]["kv_dtype"] == "bfloat16"
    assert {"bf16_default", "default", "fp8_cast", "fp8_bits", "fp8_split", "tl16x64w2s4", "tl16x64w2s4+cast",
            "tl16x64w2s4+split", "splits4", "ws_fp8", "no_ws_fp8"} <= {r["candidate"] for r in rows}
    assert {r["splits"] for r in rows if r["candidate"] == "splits32"} == {32}
    twin = next(r for r in rows if r["candidate"] == "bf16_default")
    assert twin["kv_dtype"] == "bfloat16" and "kvfp8" not in twin["case_id"]
    assert "/bf16" in r.stdout
    out = tmp_path / "smoke-short.json"                # batched L 16: the plan's build with the LSE store beside it
    r = subprocess.run([sys.executable, str(script), "--smoke", "--groups", "batched_short,ws1", "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    every = json.loads(out.read_text())["rows"]
    rows = {r["candidate"]: r for r in every if r["group"] == "batched_short"}
    assert {"default", "lse", "tl", "tl16x64w8s2+short"} <= set(rows) and {r["status"] for r in every} == {"pass"}
    assert rows["lse"]["kernel"] == rows["default"]["kernel"]
    ws1 = {r["candidate"]: r for r in every if r["group"] == "ws1"}   # the tl kernel's splits (Gluon needs a GPU)
    assert set(ws1) == {"default", "tl splits1", "tl splits2"} and ws1["tl splits2"]["splits"] == 2
    out = tmp_path / "smoke-only.json"
    r = subprocess.run([sys.executable, str(script), "--smoke", "--groups", "fp8,pages", "--candidates", "fp8_cast",
                        "--page-sizes", "16", "--out", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert {r["candidate"] for r in rows} == {"bf16_default", "fp8_cast"} and {r["group"] for r in rows} == {"fp8"}


def _latency_sweep():
    """lab/latency_sweep.py as a module (lab/ is no package)."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "latency_sweep", Path(__file__).resolve().parents[1] / "lab" / "latency_sweep.py")
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    return sweep


EMPTY = "is empty: give comma-separated entries, or leave it out"
EMPTY_ENTRY = "an empty entry (two commas in a row, or a comma at an end); separate the entries with single commas"


@pytest.mark.parametrize("flag, a, b", [("--groups", "latency", "pages"), ("--candidates", "default", "early"),
                                        ("--trees", "full:3:1", "full:3:3"), ("--page-sizes", "16", "128"),
                                        ("--batch-sizes", "1", "16")])
@pytest.mark.parametrize("text, words", [("", EMPTY), (" , ", EMPTY), ("{a},,{b}", EMPTY_ENTRY), ("{a},", EMPTY_ENTRY),
                                         (",{a}", EMPTY_ENTRY), ("{a},{b},{a}", "{a} given twice; give each entry once")])
def test_latency_sweep_refuses_empty_and_repeated_list_entries(tmp_path, capsys, flag, a, b, text, words):
    """lab/latency_sweep.py's comma-separated flags: an empty entry or one given twice is one line
    and exit 2 (the script's `refuse`), before any kernel runs and with nothing written."""
    given = text.format(a=a, b=b)
    with pytest.raises(SystemExit) as stop:
        _latency_sweep().parse(["--out", str(tmp_path / "a.json"), flag, given, "--smoke"])
    said = f"{flag} {EMPTY}" if words == EMPTY else f"{flag} {given!r}: {words.format(a=a)}"
    assert (stop.value.code, capsys.readouterr().err) == (2, f"latency_sweep: {said}\n")
    assert not list(tmp_path.iterdir())


def test_latency_sweep_reads_an_integer_given_twice_by_its_value(tmp_path, capsys):
    """'16,016' names page size 16 twice: refused like '16,16'."""
    with pytest.raises(SystemExit) as stop:
        _latency_sweep().parse(["--out", str(tmp_path / "a.json"), "--page-sizes", "16,016", "--smoke"])
    assert stop.value.code == 2
    assert capsys.readouterr().err == "latency_sweep: --page-sizes '16,016': 016 given twice; give each entry once\n"


@pytest.mark.parametrize("flag, value", [("--page-sizes", "0"), ("--batch-sizes", "-3"), ("--page-sizes", "48")])
def test_latency_sweep_refuses_filters_that_leave_no_cell(tmp_path, capsys, flag, value):
    """A page or batch size no cell of the groups has (0, negative, unknown) is one line and exit 2,
    naming the sizes there are, not a sweep that times nothing."""
    with pytest.raises(SystemExit) as stop:
        _latency_sweep().parse(["--out", str(tmp_path / "a.json"), "--groups", "latency", flag, value, "--smoke"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("latency_sweep: no cell of groups latency at the --page-sizes")
    assert "their cells have page sizes [" in err and err.count("\n") == 1 and not list(tmp_path.iterdir())


def test_latency_sweep_makes_a_raising_candidate_a_row_and_goes_on():
    """A candidate whose build raises something other than ConfigError (out of resources, a
    compiler error) is an "error" row with the reason, not the end of the sweep."""
    sweep = _latency_sweep()
    case = Case(batch_size=1, context_len=8, tree="chain:2", num_q_heads=2, num_kv_heads=1, head_dim=16,
                page_size=8)
    inputs = build_inputs(case, "cpu")
    row = sweep.run_candidate(inputs, None, case, None, KernelOptions(), "cpu", True, {"no_such_option": 1})
    assert row["status"] == "error" and "TypeError" in row["reason"] and "no_such_option" in row["reason"]
