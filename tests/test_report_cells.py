"""The report's first table and its headline, on rendered HTML, and the figures' text size in
headless Chromium at 1400 px.

The headline is checked against a hand computation on three cells whose times are set by hand;
the size check reads each figure's smallest font (points, from the figure's own text artists),
its dpi and its natural and shown width in the browser: px = pt * dpi / 72 * shown / natural.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from test_report import BASE, CHROMIUM, open_in_chromium
from treebench.harness.analyze import cells, headline, plots, report
from treebench.harness.analyze.tables import timed_frame
from treebench.harness.cli import report as report_cmd
from treebench.harness.errors import ConfigError
from treebench.harness.model import workload
from treebench.harness.store.env import read_envs

from treebench.harness.store.rows import read_rows

SEED = Path(__file__).resolve().parents[1] / "results" / "h200" / "seed" / "seed.jsonl"
MIN_TEXT_PX = 10

# case -> backend -> median µs: the hand-set times of three cells (None: skipped)
TIMES = [
    {"triton_tree": 10.0, "flashinfer_mask": 20.0, "xformers_tree": 25.0, "triton_causal": 5.0, "causal_baseline": 4.0},
    {"triton_tree": 30.0, "flashinfer_mask": 20.0, "xformers_tree": 15.0, "triton_causal": 9.0, "causal_baseline": 8.0},
    {"triton_tree": 8.0, "flashinfer_mask": 10.0, "xformers_tree": None, "triton_causal": 2.0, "causal_baseline": 1.0},
]


def three_cells() -> list[dict]:
    """Rows of three stored cases with the TIMES above (triton_causal without mask_kind, as in old rows)."""
    base = [r for r in read_rows(BASE) if r["backend"] == "triton_tree"][:3]
    out = []
    for r, times in zip(base, TIMES):
        for b, t in times.items():
            out.append(dict(r, backend=b, median_us=t, status="pass") if t is not None else
                       dict(r, backend=b, median_us=None, status="skipped", reason="tree too large"))
    return out


@pytest.fixture(scope="module")
def three_cell_html(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("cells") / "three.html"
    return report.write_report(three_cells(), read_envs([BASE]), out, "three cells").read_text()


def _section(html: str, name: str) -> str:
    return re.search(rf'<section id="{name}">(.*?)</section>', html, re.S).group(1)


def test_the_headline_matches_a_hand_computation(three_cell_html):
    # ratios 10/20 = 0.5 (flashinfer_mask), 30/15 = 2.0 (xformers_tree), 8/10 = 0.8 (flashinfer_mask)
    line = re.search(r'<p class="headline">(.*?)</p>', three_cell_html).group(1)
    assert line == ("triton_tree / best peer: min 0.50×, median 0.80×, max 2.00× over 3 cells; "
                    "slower on 1 (xformers_tree 1)")
    assert three_cell_html.index('id="cells"') < three_cell_html.index('id="summary"')   # the first section


def test_a_cell_without_a_peers_row_is_named_in_the_headline_and_the_table(tmp_path):
    """A peer with rows elsewhere but none for a cell (a run cut before it) is counted in the
    headline and named beside that cell's best peer; a peer's skipped row is no gap."""
    rows = three_cells()
    first = rows[0]["case_id"]
    cut = [r for r in rows if not (r["case_id"] == first and r["backend"] == "xformers_tree")]
    assert headline.missing_peers(cut, ["flashinfer_mask", "xformers_tree"]) == {first: ["xformers_tree"]}
    assert headline.missing_peers(rows, ["flashinfer_mask", "xformers_tree", "vllm_triton"]) == {}
    html = report.write_report(cut, read_envs([BASE]), tmp_path / "cut.html", "cut").read_text()
    line = re.search(r'<p class="headline">(.*?)</p>', html).group(1)
    assert line == ("triton_tree / best peer: min 0.50×, median 0.80×, max 2.00× over 3 cells; "
                    "slower on 1 (xformers_tree 1); 1 cell without a row of every peer (xformers_tree 1)")
    assert _section(html, "cells").count("flashinfer_mask (not run: xformers_tree)") == 1


def test_a_case_without_a_backends_row_is_flagged_in_any_report(tmp_path):
    """A report of peers alone (no own kernel, so no headline) still says which backend lacks a
    row for some case it ran elsewhere; a skipped row is a row, and a complete run says nothing."""
    peers = [r for r in three_cells() if r["backend"] in ("flashinfer_mask", "xformers_tree")]
    first = peers[0]["case_id"]
    assert report.missing_row_warnings(peers) == []           # xformers_tree's skip is a row
    cut = [r for r in peers if not (r["case_id"] == first and r["backend"] == "flashinfer_mask")]
    ((level, text),) = report.missing_row_warnings(cut)
    assert level == "warn" and text.startswith("1 case of 3 lacks a row of a backend")
    assert "(flashinfer_mask 1)" in text and "--resume" in text
    html = report.write_report(cut, read_envs([BASE]), tmp_path / "peers.html", "peers").read_text()
    assert 'class="headline"' not in html and "(flashinfer_mask 1)" in html
    complete = report.write_report(peers, read_envs([BASE]), tmp_path / "all.html", "all").read_text()
    assert "a row of a backend that has rows" not in complete


def test_report_says_on_the_terminal_which_backend_lacks_rows(tmp_path, caplog, capsys):
    """`treebench report` on a cut file logs the gap as a warning beside the page's path; a complete
    file logs no such line."""
    import json
    import logging
    import shutil

    from treebench.harness.cli.main import main

    peers = [r for r in three_cells() if r["backend"] in ("flashinfer_mask", "xformers_tree")]
    for name, rows in (("cut", peers[1:]), ("all", peers)):
        src = tmp_path / f"{name}.jsonl"
        src.write_text("".join(json.dumps(r) + "\n" for r in rows))
        for env in BASE.parent.glob("env-*.json"):
            shutil.copy(env, tmp_path)
    caplog.set_level(logging.WARNING)
    assert main(["report", str(tmp_path / "cut.jsonl"), "-o", str(tmp_path / "cut.html")]) == 0
    assert [m for m in caplog.messages if "lacks a row of a backend" in m and "(flashinfer_mask 1)" in m]
    assert capsys.readouterr().out.strip().endswith("cut.html")
    caplog.clear()
    assert main(["report", str(tmp_path / "all.jsonl"), "-o", str(tmp_path / "all.html")]) == 0
    assert not [m for m in caplog.messages if "a row of a backend" in m]


def test_the_first_table_has_every_cell_with_its_columns(three_cell_html):
    first = _section(three_cell_html, "cells")
    assert 'class="scroll tall"' in first
    head = re.findall(r"<th(?: [^>]*)?>(.*?)</th>", first)
    assert head == ["B", "L", "tree", "T", "triton_tree µs", "best peer µs", "best peer", "triton_tree / best peer",
                    "roofline µs", "triton_tree / roofline"]
    body = re.findall(r"<tr>(.*?)</tr>", first.split("<tbody>")[1])
    assert len(body) == 3
    texts = [re.findall(r"<td[^>]*>(.*?)</td>", tr) for tr in body]
    assert sorted((t[5], t[6], t[7]) for t in texts) == [
        ("10.00", "flashinfer_mask", "0.80×"), ("15.00", "xformers_tree", "2.00×"), ("20.00", "flashinfer_mask", "0.50×")]
    assert 'class="n slower">2.00×' in first and 'class="n faster">0.50×' in first


def test_the_roofline_column_is_bytes_over_measured_bandwidth_or_flops_over_the_datasheet_peak():
    rows, envs = three_cells(), read_envs([BASE])
    r = next(r for r in rows if r["backend"] == "triton_tree")
    env = envs[r["env"]]
    by_hand = 1e6 * max(r["bytes"] / env["peak_bw_bytes_per_s"], r["flops"] / 989.4e12)   # H200 bf16 dense
    frame = headline.cell_frame(rows, envs, "triton_tree", ["flashinfer_mask", "xformers_tree"])
    got = frame.set_index("case_id").loc[r["case_id"]]
    assert got["roofline_us"] == pytest.approx(by_hand)
    assert got["roofline_pct"] == pytest.approx(100 * by_hand / r["median_us"])
    assert got["roofline_ratio"] == pytest.approx(r["median_us"] / by_hand)


@pytest.mark.parametrize("tflops", [0.37, 232.0])
def test_a_measured_matrix_rate_is_the_compute_roof(tflops):
    """A fake env with a measured rate: the roofline is max(bytes / bandwidth, FLOPs / measured rate), whichever
    roof binds, and the datasheet peak is not used."""
    rows = three_cells()
    r = next(r for r in rows if r["backend"] == "triton_tree")
    envs = {r["env"]: {"gpu_name": "NVIDIA H200", "peak_bw_bytes_per_s": 3.7e12, "peak_matmul_tflops": tflops}}
    by_hand = 1e6 * max(r["bytes"] / 3.7e12, r["flops"] / (tflops * 1e12))
    frame = headline.cell_frame(rows, envs, "triton_tree", ["flashinfer_mask", "xformers_tree"])
    got = frame.set_index("case_id").loc[r["case_id"]]
    assert got["roofline_us"] == pytest.approx(by_hand)
    assert got["roofline_ratio"] == pytest.approx(r["median_us"] / by_hand)
    assert workload.compute_roof(envs[r["env"]]) == (tflops, "measured")
    assert workload.compute_roof({"gpu_name": "NVIDIA H200"}) == (989.4, "datasheet")
    assert workload.compute_roof({"gpu_name": None}) == (None, "")


def test_every_seed_table_row_has_its_roofline_and_the_caption_names_the_peaks(tmp_path):
    rows = three_cells()
    env_id = rows[0]["env"]
    envs = {env_id: {"env_id": env_id, "gpu_name": "NVIDIA H200", "peak_bw_bytes_per_s": 3.7e12,
                     "peak_matmul_tflops": 650.0}}
    seed = report.mask_overhead_table(rows, "causal_baseline", envs)
    assert len(seed) == sum(r["status"] == "pass" for r in rows)
    for rec in seed.to_dict("records"):
        assert rec["Time / roofline"] == pytest.approx(rec["Time (us)"] / rec["Roofline (us)"])
    r = next(r for r in rows if r["backend"] == "xformers_tree" and r["status"] == "pass")
    line = seed[(seed["Backend"] == "xformers_tree") & (seed["Batch Size"] == r["case"]["batch_size"])
                & (seed["Sequence Position"] == r["case"]["context_len"])].iloc[0]
    assert line["Roofline (us)"] == pytest.approx(1e6 * max(r["bytes"] / 3.7e12, r["flops"] / 650e12))
    html = report.write_report(rows, envs, tmp_path / "r.html").read_text()
    basis = f"env {env_id}: 3.7 TB/s measured copy bandwidth, 650 TFLOP/s measured bf16 matmul rate"
    assert _section(html, "cells").count(basis) == 1 and _section(html, "seed").count(basis) == 1
    assert "| Roofline (us) | Time / roofline |" in html                           # the Markdown export too
    assert "measured bf16 matmul TFLOP/s" in _section(html, "env")
    no_rate = report.write_report(rows, {env_id: {**envs[env_id], "peak_matmul_tflops": None}},
                                  tmp_path / "d.html").read_text()
    assert "989.4 TFLOP/s datasheet 16-bit peak (no measured matrix rate in the env)" in no_rate


def test_own_kernels_and_causal_backends_are_never_peers(three_cell_html):
    rows = three_cells()
    assert headline.peers(rows, "triton_tree", "causal_baseline") == ["flashinfer_mask", "xformers_tree"]
    summary = {s["backend"]: s for s in report.backend_summary(
        rows, sorted({r["backend"] for r in rows}), report.pd.DataFrame(), report.mask_overhead_table(rows),
        report.non_contenders(rows, "causal_baseline"), headline.contenders(rows, "triton_tree", "causal_baseline"),
        headline.own_kernels("triton_tree"))}
    # triton_causal is the fastest on every case, yet no rival: triton_tree wins 2, xformers_tree 1
    assert summary["triton_causal"]["wins"] is None and summary["causal_baseline"]["wins"] is None
    assert (summary["triton_tree"]["wins"], summary["xformers_tree"]["wins"]) == (2, 1)
    assert summary["triton_causal"]["own"] and not summary["flashinfer_mask"]["own"]
    assert "triton_tree: geometric-mean" in three_cell_html or "triton_tree: fastest on 2/3 cases" in three_cell_html
    assert "triton_causal: fastest" not in three_cell_html and "causal_baseline: fastest" not in three_cell_html


def test_own_picks_the_backend_under_test(tmp_path):
    rows = three_cells()
    html = report.write_report(rows, {}, tmp_path / "fi.html", own="flashinfer_mask").read_text()
    line = re.search(r'<p class="headline">(.*?)</p>', html).group(1)
    # flashinfer_mask against xformers_tree alone (triton_tree is one of treebench's own kernels)
    assert line == "flashinfer_mask / best peer: min 0.80×, median 1.07×, max 1.33× over 2 cells; slower on 1 (xformers_tree 1)"
    with pytest.raises(ConfigError, match="--own 'nope'"):
        report.write_report(rows, {}, tmp_path / "nope.html", own="nope")


def test_the_cli_passes_own(tmp_path):
    p = argparse.ArgumentParser()
    report_cmd.add_arguments(p)
    out = tmp_path / "r.html"
    assert report_cmd.run(p.parse_args([str(BASE), "-o", str(out), "--own", "flashinfer_mask"])) == 0
    assert '<p class="headline">flashinfer_mask / best peer:' in out.read_text()


@pytest.mark.parametrize("x, text", [(0.00031, "0.00031×"), (0.017, "0.017×"), (0.1, "0.10×"), (0.667, "0.67×"),
                                     (37.0, "37.00×"), (float("nan"), "")])
def test_small_ratios_keep_two_significant_digits(x, text):
    assert cells.ratio(x) == text


def test_a_cpu_report_has_no_empty_columns_or_gpu_wording(tmp_path):
    rows = [dict(r, env="cpu0", timer="wall", cv=0.5, median_us=r["median_us"] * (1e3 if r["backend"] == "triton_tree" else 1))
            for r in read_rows(BASE) if r["backend"] in ("triton_tree", "xformers_tree") and r["status"] == "pass"]
    rows = [dict(r, backend="flex") if r["backend"] == "triton_tree" else r for r in rows]   # no own kernel
    one_l = [r for r in rows if r["case"]["context_len"] == 16]
    html = report.write_report(one_l, {"cpu0": {"gpu_name": None, "peak_bw_bytes_per_s": None}},
                               tmp_path / "cpu.html").read_text()
    assert "0.00×" not in html and "quieter GPU" not in html and "( aside" not in html
    assert "Overhead (%)" not in html and "roofline µs" not in html        # empty columns dropped
    assert "No latency plot" in html                                        # one context length: no plot
    assert "Fastest backend per cell" in html


def test_latency_needs_two_context_lengths():
    df = timed_frame(read_rows(BASE))
    assert plots.latency_plots(df[df["context_len"] == 16], ["triton_tree"]) is None
    assert plots.latency_plots(df, sorted(df["backend"].unique())) is not None


@pytest.fixture(scope="module")
def seed_report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("seed") / "seed.html"
    return report.write_report(read_rows(SEED), read_envs([SEED]), out, "treebench seed")


def test_seed_headline_is_the_readme_figure(seed_report):
    """The README's seed-suite row quotes the report built from the committed seed rows."""
    line = re.search(r'<p class="headline">(.*?)</p>', seed_report.read_text()).group(1)
    got = re.match(r"triton_tree / best peer: min ([0-9.]+)×, median ([0-9.]+)×, max ([0-9.]+)× over 126 cells; "
                   r"slower on ([0-9]+)", line)
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    quoted = re.search(r"\| seed suite, 126 cells \| 1-64 \| ([0-9.]+)-([0-9.]+)x of the best peer, median ([0-9.]+)x; "
                       r"slower on ([0-9]+) cells?", readme)
    assert got and quoted, (line, "README has no seed-suite row")
    assert (got[1], got[3], got[2], got[4]) == quoted.groups()


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium; .ci/run does)")
@pytest.mark.parametrize("which", ["seed", "three"])
def test_every_figure_text_is_at_least_10_px_at_1400(which, seed_report, tmp_path):
    page = seed_report if which == "seed" else report.write_report(three_cells(), read_envs([BASE]),
                                                                   tmp_path / "three.html")
    shot = tmp_path / "page.png"
    facts = open_in_chromium(page, shot, width=1400)
    assert facts["errors"] == [] and facts["figures"], facts["errors"]
    assert all(f["pt"] and f["dpi"] and f["natural"] for f in facts["figures"]), "a figure without its font size"
    small = [(f["alt"], round(px, 1)) for f in facts["figures"]
             if (px := f["pt"] * f["dpi"] / 72 * f["shown"] / f["natural"]) < MIN_TEXT_PX]
    assert not small, f"figure text under {MIN_TEXT_PX} px at 1400 px: {small}"


# the fp8 target cells in bf16 and e4m3 in one run, triton_tree and vllm_triton (an H100)
FP8_TARGETS = Path(__file__).resolve().parents[1] / "results" / "h100" / "fp8" / "fp8_targets.jsonl"


def test_bf16_and_fp8_cells_get_their_own_heatmap_panels_and_latency_lines():
    rows = read_rows(FP8_TARGETS)
    frame = headline.cell_frame(rows, read_envs(FP8_TARGETS.parent), "triton_tree",
                                ["vllm_triton", "flashinfer_mask", "flashinfer_xqa"])
    panels = plots.heatmap_panels(frame.dropna(subset=["ratio"]))
    assert [t for t, _ in panels] == [f"page size {p}, kv dtype {k}" for p in (16, 128)
                                      for k in ("bfloat16", "float8_e4m3fn")]
    assert all(len(g) == 3 for _, g in panels)            # the three trees of each panel, nothing averaged
    fixed, note = plots._fixed_axes(timed_frame(rows))
    assert fixed["kv_dtype"].nunique() == 1 and "kv dtype" in note


def test_the_kv_dtype_table_divides_each_fp8_time_by_the_same_cell_in_bf16():
    from treebench.harness.analyze.tables import kv_dtype_table
    rows = read_rows(FP8_TARGETS)
    t = kv_dtype_table(rows)
    def cells(kv):   # (backend, tree, page size) of the passing rows over a pool of `kv`
        return {(r["backend"], r["case"]["tree"], r["case"]["page_size"]) for r in rows
                if r["status"] == "pass" and r["case"].get("kv_dtype") == kv}
    twins = cells("float8_e4m3fn") & cells(None)     # flashinfer_xqa skips these scales: no fp8 row, no ratio
    assert len(twins) == 24 and set(t["KV dtype"]) == {"float8_e4m3fn"}   # 4 backends x 3 trees x 2 page sizes
    assert set(zip(t["Backend"], t["Tree"], t["Page Size"])) == twins
    one = t[(t["Backend"] == "triton_tree") & (t["Tree"] == "vllm:pr_27") & (t["Page Size"] == 128)].iloc[0]
    mine = {(r["case"].get("kv_dtype") or "bf16"): r["median_us"] for r in rows if r["backend"] == "triton_tree"
            and r["case"]["tree"] == "vllm:pr_27" and r["case"]["page_size"] == 128}
    assert one["Time (us)"] == mine["float8_e4m3fn"] and one["Query-dtype time (us)"] == mine["bf16"]
    assert one["Ratio"] == pytest.approx(mine["float8_e4m3fn"] / mine["bf16"])
    assert kv_dtype_table([r for r in rows if not r["case"].get("kv_dtype")]).empty   # no fp8 rows: no table


def test_a_report_with_fp8_and_bf16_rows_has_the_kv_dtype_section(tmp_path):
    html = report.write_report(read_rows(FP8_TARGETS), read_envs(FP8_TARGETS.parent), tmp_path / "r.html").read_text()
    section = _section(html, "kv-dtype")
    mine = {(r["case"].get("kv_dtype") or "bf16"): r["median_us"] for r in read_rows(FP8_TARGETS)
            if r["backend"] == "vllm_triton" and r["case"]["tree"] == "vllm:pr_27" and r["case"]["page_size"] == 16}
    assert "Query-dtype time (us)" in section and f"{mine['float8_e4m3fn'] / mine['bf16']:.2f}×" in section
    seedless = report.write_report(three_cells(), {}, tmp_path / "s.html").read_text()
    assert 'id="kv-dtype"' not in seedless


def test_a_report_of_an_interpreted_run_says_its_triton_times_measure_the_interpreter(tmp_path):
    rows = three_cells()
    env = {"env_id": rows[0]["env"], "triton_interpret": True}
    html = report.write_report(rows, {rows[0]["env"]: env}, tmp_path / "r.html").read_text()
    assert "CPU interpreter (TRITON_INTERPRET=1)" in html
    assert "CPU interpreter" not in report.write_report(rows, {}, tmp_path / "s.html").read_text()


def test_the_roofline_caption_names_the_compute_roof_it_drew(tmp_path):
    html = report.write_report(read_rows(FP8_TARGETS), read_envs(FP8_TARGETS.parent), tmp_path / "r.html").read_text()
    section = _section(html, "roofline")
    rate = {e["peak_matmul_tflops"] for e in read_envs(FP8_TARGETS.parent).values()}
    assert len(rate) == 1
    assert f"compute roof: the bf16 matrix rate measured on the run's machine ({rate.pop():.0f} TFLOP/s)" in section
    assert "compute roof: the datasheet" not in section


def test_a_ratio_whose_denominator_is_another_runs_is_marked(tmp_path):
    """The kv-dtype ratio and the tree-mask overhead of a run without its own bf16 (causal) row divide by
    the median over other runs: the cell says so with a † and a footnote under the table; a ratio within
    one run is not marked."""
    from treebench.harness.analyze.tables import OTHER_RUN, kv_dtype_table, mask_overhead_table
    rows = read_rows(FP8_TARGETS)
    later = [{**r, "run_id": "later"} for r in rows if r["case"].get("kv_dtype")]      # fp8 rows only
    kv, n = kv_dtype_table(rows + later), len(kv_dtype_table(rows))
    assert OTHER_RUN not in kv_dtype_table(rows)
    assert kv[OTHER_RUN].sum() == n and len(kv) == 2 * n
    base = [r for r in read_rows(BASE) if r["status"] == "pass"]
    tree_only = [{**r, "run_id": "later"} for r in base if r["backend"] == "triton_tree"]
    seed = mask_overhead_table(base + tree_only)
    assert OTHER_RUN not in mask_overhead_table(base) and seed[OTHER_RUN].sum() == len(tree_only)
    html = report.write_report(rows + later, read_envs(FP8_TARGETS.parent), tmp_path / "r.html").read_text()
    section = _section(html, "kv-dtype")
    assert section.count("×†") == n and "† the query-dtype time is the median over other runs" in section
    assert OTHER_RUN not in html
    html = report.write_report(base + tree_only, {}, tmp_path / "s.html").read_text()
    section = _section(html, "seed")
    assert section.count("†</td>") == len(tree_only)
    assert "† the causal_baseline time is the median over other runs" in section
    md = re.search(r"<pre>(.*?)</pre>", section, re.DOTALL).group(1)
    assert md.count("† |") == len(tree_only) and OTHER_RUN not in md


def test_the_summary_says_the_tree_time_is_relative_to_the_causal_time(tmp_path):
    """A tree kernel faster than the causal one reads as a negative relative time, never as an 'overhead'."""
    rows = [dict(r, median_us=r["median_us"] * 10) if r["backend"] == "causal_baseline" else r for r in three_cells()]
    summary = _section(report.write_report(rows, {}, tmp_path / "r.html").read_text(), "summary")
    assert "overhead" not in summary.lower()
    assert '<th class="n">tree vs causal_baseline time</th>' in summary
    # triton_tree: 10/40, 30/80, 8/10 of the causal time; geometric mean 0.4217 -> -57.8%
    assert '<td class="n">-57.8%</td>' in summary
    assert "negative: the tree kernel is faster" in summary
    assert "triton_tree: time -57.8% relative to causal_baseline" in summary


def test_a_set_softmax_scale_gets_its_own_heatmap_panel_and_is_fixed_in_the_latency_lines():
    """Rows of a case with sm_scale set and of its default-scale twin are not averaged together: each
    scale is its own heatmap panel ('1/sqrt(D)' for the default), and the latency lines keep one."""
    base = [r for r in read_rows(FP8_TARGETS) if not r["case"].get("kv_dtype") and r["case"]["page_size"] == 16]
    scaled = [{**r, "case": {**r["case"], "sm_scale": 0.3}, "case_id": r["case_id"] + "-sm0.3"} for r in base]
    frame = headline.cell_frame(base + scaled, read_envs(FP8_TARGETS.parent), "triton_tree", ["vllm_triton"])
    panels = plots.heatmap_panels(frame.dropna(subset=["ratio"]))
    assert [t for t, _ in panels] == ["sm scale 0.3", "sm scale 1/sqrt(D)"]
    fixed, note = plots._fixed_axes(timed_frame(base + scaled + scaled[:1]))
    assert set(fixed["sm_scale"]) == {"0.3"} and note == "sm scale 0.3"
