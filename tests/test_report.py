"""The HTML report: built from stored results, opened in headless Chromium.

The browser test drives Debian's `chromium` through the DevTools protocol over
`--remote-debugging-pipe` (stdlib only: JSON messages ended by NUL on fds 3/4),
takes a screenshot, and asserts no console errors or uncaught exceptions and
that every image decoded. It skips when chromium is not installed.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import itertools
import json
import os
import re
import select
import shutil
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from treebench.harness.analyze import report
from treebench.harness.cli import report as report_cmd
from treebench.harness.errors import ConfigError
from treebench.harness.store.rows import read_rows

DATA = Path(__file__).parent / "data" / "results"
BASE, SLOW = DATA / "h200-baseline", DATA / "h200-slow10"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


# ---- a minimal DevTools-protocol client over a pipe ----------------------------------------------

class Chromium:
    """Headless Chromium driven over --remote-debugging-pipe (fd 3: commands in, fd 4: replies out)."""

    FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--remote-debugging-pipe", "--hide-scrollbars", "--window-size=1300,900")

    def __init__(self, exe: str, profile: Path, timeout_s: float = 60.0):
        cmd_r, self._cmd_w = os.pipe()      # we write commands, chromium reads fd 3
        self._out_r, out_w = os.pipe()      # chromium writes fd 4, we read replies
        def to_3_4():                       # in the child: move the ends to fds 3 and 4
            a, b = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10), fcntl.fcntl(out_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)
        self.proc = subprocess.Popen([exe, *self.FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                     pass_fds=(3, 4), preexec_fn=to_3_4, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(cmd_r)
        os.close(out_w)
        self.timeout_s, self._buf, self._id, self.events = timeout_s, b"", 0, []

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """Sends one command and returns its result (events seen meanwhile go to self.events)."""
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        while True:
            m = self._read()
            if m.get("id") == self._id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m["result"]
            self.events.append(m)

    def wait_event(self, method: str) -> dict:
        """Reads until an event named `method` arrives (or one already did)."""
        for m in self.events:
            if m.get("method") == method:
                return m
        while True:
            m = self._read()
            self.events.append(m)
            if m.get("method") == method:
                return m

    def _read(self) -> dict:
        deadline = time.monotonic() + self.timeout_s
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._out_r], [], [], left)[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._out_r, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except Exception:  # noqa: BLE001 -- already gone
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_w)
        os.close(self._out_r)


IMAGES_JS = """Promise.all(Array.from(document.images).map(img =>
    img.decode().then(() => img.complete && img.naturalWidth > 0, () => false)))"""


FIGURES_JS = """JSON.stringify(Array.from(document.querySelectorAll('img.fig')).map(img => ({
    alt: img.alt, natural: img.naturalWidth, shown: img.clientWidth,
    pt: parseFloat(img.dataset.fontPt), dpi: parseFloat(img.dataset.dpi)})))"""


def open_in_chromium(html: Path, shot: Path, full_page: bool = False, width: int = 1300) -> dict:
    """Loads `html` in a `width` px wide window, saves a PNG screenshot to `shot`; returns errors,
    image results, page facts and per figure its natural and shown width and smallest font."""
    profile = shot.parent / "chromium-profile"
    browser = Chromium(CHROMIUM, profile)
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        s = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            browser.send(f"{domain}.enable", session=s)
        browser.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": 900, "deviceScaleFactor": 1,
                                                            "mobile": False}, session=s)
        browser.send("Page.navigate", {"url": html.resolve().as_uri()}, session=s)
        browser.wait_event("Page.loadEventFired")
        images = browser.send("Runtime.evaluate", {"expression": IMAGES_JS, "awaitPromise": True,
                                                   "returnByValue": True}, session=s)["result"]["value"]
        facts = browser.send("Runtime.evaluate", {"expression": "JSON.stringify({title: document.title, "
                             "h2: Array.from(document.querySelectorAll('h2')).map(h => h.textContent), "
                             "height: document.documentElement.scrollHeight})", "returnByValue": True},
                             session=s)["result"]["value"]
        figures = browser.send("Runtime.evaluate", {"expression": FIGURES_JS, "returnByValue": True},
                               session=s)["result"]["value"]
        # click a sortable header: the page's only script must run without errors
        browser.send("Runtime.evaluate", {"expression": "document.querySelector('table.sortable th').click()"},
                     session=s)
        params = {"format": "png"}
        if full_page:
            h = json.loads(facts)["height"]
            params.update(captureBeyondViewport=True, clip={"x": 0, "y": 0, "width": width, "height": h, "scale": 1})
        shot.write_bytes(base64.b64decode(browser.send("Page.captureScreenshot", params, session=s)["data"]))
        time.sleep(0.2)  # let late console messages arrive
        browser.send("Runtime.evaluate", {"expression": "1"}, session=s)
    finally:
        browser.close()
    errors = [e for e in browser.events if _is_error(e)]
    return {"errors": errors, "images": images, "figures": json.loads(figures), **json.loads(facts)}


def _is_error(event: dict) -> bool:
    """Uncaught exceptions, console.error/assert, and error log entries (e.g. failed loads)."""
    m, p = event.get("method"), event.get("params", {})
    return (m == "Runtime.exceptionThrown"
            or (m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"))
            or (m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error"))


# ---- tests --------------------------------------------------------------------------------------

def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    report_cmd.add_arguments(p)
    return p.parse_args(argv)


@pytest.fixture(scope="module")
def slow_report(tmp_path_factory) -> Path:
    """The report of the planted-slowdown run, gated against the baseline (built once)."""
    out = tmp_path_factory.mktemp("report") / "slow10.html"
    assert report_cmd.run(_args([str(SLOW), "-o", str(out), "--against", str(BASE)])) == 0
    return out


def test_report_is_self_contained_with_every_section(slow_report):
    html = slow_report.read_text()
    for section in ("summary", "env", "seed", "speedup", "latency", "roofline", "correctness", "trees"):
        assert f'<section id="{section}">' in html
    assert not re.search(r'(src|href)="(https?:)?//', html), "the report must not load anything from the network"
    imgs = re.findall(r'<img class="fig" src="data:image/png;base64,([^"]+)"', html)
    # heatmaps, latency, roofline, and one figure per tree (full:3:0..3)
    assert len(imgs) == 3 + 4
    assert all(base64.b64decode(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in imgs)


def test_report_shows_gate_verdicts_and_mismatch_worst_element(slow_report):
    html = slow_report.read_text()
    assert "FAIL" in html and html.count("slower</span>") == 36      # triton_tree planted 10% slower, 36 cases
    assert "b=37, i=12, h=5" in html                                  # the stored mismatch's worst element
    assert "tree of 40 nodes exceeds the backend&#39;s maximum 32" in html


@pytest.mark.parametrize("side", ["baseline", "candidate"])
def test_against_a_results_file_without_its_env_file_is_reported_with_a_line_naming_it(tmp_path, capsys, side):
    """With --allow-env-mismatch, an env-<id>.json not copied along is no fingerprint difference: the
    report is written, and a line on the terminal and in the gate section names the env id and the
    results file (without it, the comparison is refused, as the gate refuses it)."""
    from html import escape

    from treebench.harness.cli.main import main

    noenv = tmp_path / "noenv"
    noenv.mkdir()
    rows = Path(shutil.copy((BASE if side == "baseline" else SLOW) / "seed.jsonl", noenv / "seed.jsonl"))
    (env_id,) = {r["env"] for r in read_rows([rows])}
    base, cand = (noenv, SLOW) if side == "baseline" else (BASE, rows)
    out = tmp_path / "r.html"
    assert main(["report", str(cand), "-o", str(out), "--against", str(base), "--allow-env-mismatch"]) == 0
    line = (f"{side}: the env file for env id {env_id} is missing next to {rows} (env-{env_id}.json, which the "
            "run wrote beside its rows); its rows were compared without their env fingerprint")
    err = capsys.readouterr().err
    assert f"report --against: {line}\n" in err and "fingerprints differ" not in err, err
    html = out.read_text()
    assert html.count(escape(line)) == 1 and html.count("slower</span>") == 36


def test_against_env_fingerprints_that_differ_are_refused_in_the_gates_words(tmp_path, capsys):
    """The baseline's env file differs from the candidate's: refused as the gate refuses it (exit 2,
    one line), and a report already at -o is left as it was."""
    from treebench.harness.cli.main import main

    other = Path(shutil.copytree(BASE, tmp_path / "other"))
    for f in other.glob("env-*.json"):
        f.write_text(json.dumps({**json.loads(f.read_text()), "driver": "575.51.03"}))
    out = tmp_path / "r.html"
    out.write_text('<meta name="generator" content="treebench"> an earlier report')
    assert main(["report", str(SLOW), "-o", str(out), "--against", str(other)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["treebench: error: report: env fingerprints differ (driver: 575.51.03 -> 570.124.06); "
                   "compare runs from the same GPU and software, or pass --allow-env-mismatch"], err
    assert out.read_text().endswith("an earlier report")


def test_against_other_env_fingerprints_with_allow_env_mismatch_lists_each_differing_field(tmp_path, slow_report):
    """--allow-env-mismatch compares across envs, and a banner at the top of the page lists every
    env field that differs with this run's value and the baseline's; envs alike on the compared
    fields (the planted-slowdown run differs from its baseline only in git commit and peaks) get none."""
    other = Path(shutil.copytree(BASE, tmp_path / "other"))
    for f in other.glob("env-*.json"):
        f.write_text(json.dumps({**json.loads(f.read_text()), "driver": "575.51.03", "torch": "2.10.0"}))
    out = tmp_path / "r.html"
    assert report_cmd.run(_args([str(SLOW), "-o", str(out), "--against", str(other), "--allow-env-mismatch"])) == 0
    html = out.read_text()
    banner = re.search(r'<div class="banner" id="env-differences">(.*?)</div>', html, re.S)
    assert banner and "Compared across environments." in banner.group(1), html[:6000]
    cells = re.findall(r"<tr><td>(\w+)</td><td><code>([^<]*)</code></td><td><code>([^<]*)</code></td></tr>",
                       banner.group(1))
    torch = json.loads(next(SLOW.glob("env-*.json")).read_text())["torch"]
    assert cells == [("driver", "570.124.06", "575.51.03"), ("torch", torch, "2.10.0")], cells
    assert html.index("env-differences") < html.index('<section id="cells">')   # before any table
    assert "env-differences" not in slow_report.read_text()


def test_seed_table_has_the_seed_layout(slow_report):
    html = slow_report.read_text()
    head = re.search(r"Markdown of this table.*?<pre>(.*?)\n", html, re.S).group(1)
    assert head == ("| Backend | Batch Size | Sequence Position | Seqlen Q | Time (us) | Overhead (%) "   # the seed's
                    "| Roofline (us) | Time / roofline |")                                             # then ours


def test_write_report_without_causal_or_env(tmp_path):
    rows = [r for r in read_rows(BASE) if r["backend"] in ("triton_tree", "flashinfer_mask")]
    out = report.write_report(rows, {}, tmp_path / "sub" / "r.html", "two backends", baseline="triton_tree")
    html = out.read_text()
    assert "No causal_baseline rows" in html and "No env fingerprint" not in html  # ids listed as '?'
    assert "flashinfer_mask" in html


def test_causal_kernels_and_the_reference_do_not_compete():
    said = [{"backend": b, "mask_kind": k} for b, k in (("triton_tree", "tree"), ("triton_causal", "causal"),
                                                        ("reference", "tree"))]
    assert report.non_contenders([*said, {"backend": "mine"}], "causal_baseline") == {
        "causal_baseline", "triton_causal", "reference"}
    rows = read_rows(BASE)
    fast_causal = [dict(r, backend="triton_causal", mask_kind="causal", median_us=r["median_us"] / 2) for r in rows
                   if r["backend"] == "causal_baseline"]
    order = report.backend_order(rows + fast_causal, "flashinfer_mask", "causal_baseline")
    skip = report.non_contenders(rows + fast_causal, "causal_baseline")
    summary = {s["backend"]: s for s in report.backend_summary(rows + fast_causal, order, pd.DataFrame(),
                                                               report.mask_overhead_table(rows), skip)}
    assert summary["triton_causal"]["wins"] is None and summary["causal_baseline"]["wins"] is None
    assert summary["triton_tree"]["wins"] + summary["flashinfer_mask"]["wins"] + summary["xformers_tree"]["wins"] == 36


@pytest.mark.parametrize("causal", ["causal_baseline", "my_causal"])
def test_rows_without_mask_kind_leave_only_the_causal_backend_out(causal):
    rows = [{"backend": "triton_causal"}, {"backend": causal}, {"backend": "triton_tree", "mask_kind": "tree"}]
    assert report.non_contenders(rows, causal) == {causal, "reference"}   # no registry look-up by name


def test_the_summary_names_each_timer_with_its_l2_state():
    rows = read_rows(BASE)                     # stored before rows had l2_flushed: GPU rows, so flushed
    order = report.backend_order(rows, "flashinfer_mask", "causal_baseline")
    summary = report.backend_summary(rows, order, pd.DataFrame(), report.mask_overhead_table(rows), set())
    timers = {s["backend"]: s["timers"] for s in summary}
    assert timers["triton_tree"] == ["cuda_graph, L2 flushed"] and timers["xformers_tree"] == ["cuda_event, L2 flushed"]
    assert report.l2_warnings(summary) == []


def test_a_report_mixing_l2_states_says_so(tmp_path):
    rows = read_rows(BASE)
    warm = [dict(r, l2_flushed=False, run_id="warm", median_us=r["median_us"] * 0.8) for r in rows
            if r["backend"] == "triton_tree"]
    html = report.write_report(rows + warm, {}, tmp_path / "mixed.html").read_text()
    assert "<td>cuda_graph, L2 flushed; cuda_graph, warm L2" in html
    assert "triton_tree: 36 row(s) timed with the L2 flushed and 36 with a warm L2 are mixed" in html
    assert "different L2 states" not in html
    apart = [dict(r, l2_flushed=False) if r["backend"] == "triton_tree" else r for r in rows]
    html = report.write_report(apart, {}, tmp_path / "apart.html").read_text()
    assert "backends were timed in different L2 states (" in html and "triton_tree warm L2" in html
    assert "flashinfer_mask L2 flushed" in html and "are mixed" not in html


def test_a_report_averaging_rows_of_different_timers_says_so(tmp_path):
    rows = [r for r in read_rows(BASE) if r["backend"] == "triton_tree"]
    loop = [dict(r, timer="cuda_graph_loop", l2_flushed=False, run_id="loop") for r in rows]
    warm = [dict(r, l2_flushed=False, run_id="warm") for r in rows]
    assert report.mixed_timing_warnings(rows) == []
    (line,) = report.mixed_timing_warnings(warm + loop)
    assert line[1].startswith(f"triton_tree: {len(rows)} case(s) have rows timed with different timers "
                              "(cuda_graph, cuda_graph_loop)")
    assert report.mixed_timing_warnings(rows + warm) == []            # L2 states: l2_warnings says it
    html = report.write_report(warm + loop, {}, tmp_path / "two-timers.html").read_text()
    assert "timed with different timers" in html


def test_write_report_for_a_cpu_run_and_for_no_rows(tmp_path):
    rows = [dict(r, env="cpu0", timer="wall") for r in read_rows(BASE)[:20]]
    cpu_env = {"cpu0": {"env_id": "cpu0", "gpu_name": None, "peak_bw_bytes_per_s": None}}
    html = report.write_report(rows, cpu_env, tmp_path / "cpu.html").read_text()
    assert "· CPU ·" in html and "alt=\"roofline" in html and "measured peak (copy) TB/s" in html
    assert "<td>wall<" in html and "L2 states" not in html   # the CPU never flushes: one state
    empty = report.write_report([], {}, tmp_path / "empty.html").read_text()
    assert "No passing timed rows." in empty and "<img" not in empty


def test_a_report_of_rows_whose_axis_text_isdigit_takes_but_int_refuses(tmp_path):
    """A results file may hold any text: an L of '²' (str.isdigit() takes it, int() fails on it) or of more
    digits than int() reads, and a check axis value of '²' or '--5', sort as text; never a traceback. Read from
    a file, such rows are refused (no suite gives that case): exit 2, not a traceback."""
    from treebench.harness.model.coverage import coverage_from_rows
    from treebench.harness.store.rows import append_rows

    rows = [dict(r) for r in read_rows(BASE)[:24]]
    for i, (r, text) in enumerate(zip(rows, itertools.cycle(["²", "１２", "1" * 5000, "--5", "2048"]))):
        r["case"] = {**r["case"], "context_len": text}
        r["check_axes"] = {"page_size": text, "tree_size": str(i)}
    html = report.write_report(rows, {}, tmp_path / "odd.html").read_text()
    assert "²" in html and "１２" in html
    cov = coverage_from_rows(rows)
    assert cov["tree_size"]["ran"][:3] == ["0", "1", "2"] and "²" in cov["page_size"]["ran"]
    results = tmp_path / "odd.jsonl"
    append_rows(results, rows)
    cli = pytest.importorskip("treebench.harness.cli.main")
    assert cli.main(["report", str(results), "-o", str(tmp_path / "cli.html")]) == 2   # no case a suite gives


@pytest.mark.parametrize("argv, field", [
    (["--baseline-backend", "nope"], "--baseline-backend"),
    (["-o", "report.txt"], "-o"),
])
def test_bad_input_is_a_config_error(tmp_path, argv, field):
    with pytest.raises(ConfigError, match=re.escape(field)):
        report_cmd.run(_args([str(BASE), *argv] if "-o" in argv else [str(BASE), "-o", str(tmp_path / "r.html"), *argv]))


def test_missing_results_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        report_cmd.run(_args([str(tmp_path / "nothing.jsonl"), "-o", str(tmp_path / "r.html")]))


def test_cli_report_subcommand(tmp_path):
    cli = pytest.importorskip("treebench.harness.cli.main")
    out = tmp_path / "cli.html"
    assert cli.main(["report", str(BASE), "-o", str(out)]) in (0, None)
    assert out.stat().st_size > 10_000


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium; .ci/run does)")
def test_report_opens_in_headless_chromium(slow_report, tmp_path):
    shot = tmp_path / "report.png"
    page = open_in_chromium(slow_report, shot)
    assert page["errors"] == [], f"console errors: {page['errors']}"
    assert len(page["images"]) == 7 and all(page["images"]), f"images not decoded: {page['images']}"
    assert page["title"].startswith("treebench") and "Correctness" in page["h2"]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed")
def test_chromium_check_catches_a_broken_page(tmp_path):
    """The browser check itself can fail: a script error and an undecodable image are caught."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!doctype html><title>bad</title><img src="data:image/png;base64,AAAA">'
                   "<script>undefinedFunction()</script>")
    page = open_in_chromium(bad, tmp_path / "bad.png")
    assert any(e["method"] == "Runtime.exceptionThrown" for e in page["errors"])
    assert page["images"] == [False]


def test_tree_layout_handles_deep_trees_and_centres_parents():
    """A chain of 1000 nodes (valid: the limit is 1024) is laid out without recursion,
    and a branching tree gets leaves 1 apart with parents centred over their children."""
    from treebench.harness.analyze.plots import _tree_xy, tree_figure
    from treebench.harness.model.tree_specs import parse_tree
    chain = parse_tree("chain:1000")
    x, d = _tree_xy(chain)
    assert d == list(range(chain.size)) and len(set(x)) == 1
    assert tree_figure(chain, "chain").uri.startswith("data:image/png;base64,")
    t = parse_tree("full:2:2")            # root, 2 children, 4 grandchildren
    x, d = _tree_xy(t)
    leaves = sorted(x[i] for i in range(t.size) if not t.children[i])
    assert leaves == [0.0, 1.0, 2.0, 3.0]
    for i in range(t.size):
        if t.children[i]:
            assert x[i] == sum(x[c] for c in t.children[i]) / len(t.children[i])
