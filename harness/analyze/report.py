"""The HTML performance report of result rows (`treebench report`, in `treebench.harness.cli.report`).

One self-contained file (CSS inline, images as PNG data URIs, no network) that
a kernel engineer can attach to a pull request: summary and verdicts, the env
fingerprints, the seed-style table (tree-mask overhead against the causal
baseline, vLLM PR #20401's layout), speedup heatmaps over batch x context per
tree size, latency against context length, a roofline, correctness badges with
the worst element of every mismatch, and every tree drawn with its mask.
Built with pandas (tables), matplotlib (figures, `treebench.harness.analyze.plots`) and
jinja2 (`templates/report.html.j2`). Reads only the results store.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence, Set
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

import jinja2
import pandas as pd

from treebench.harness.analyze import plots as plots
from treebench.harness.analyze.cells import Table, frame_cells, kv_table_cells, num, ratio, us
from treebench.harness.analyze.roles import DEFAULT_BASELINES
from treebench.harness.analyze.headline import (OWN_KERNELS, timed_backends, cell_frame, contenders, headline,
                                                headline_table, missing_peers, missing_row_warnings, non_contenders, own_kernels, peers, pick_own,
                                                roofline_basis)
from treebench.harness.errors import ConfigError
from treebench.harness.analyze.tables import (kv_dtype_table, mask_overhead_table, order_key, speedup_table,
                                              timed_frame, varying_axes)
from treebench.harness.model.coverage import coverage_by_backend
from treebench.harness.model.workload import device_peak, rates, row_work
from treebench.harness.timing.stats import NOISE_RULE, geometric_mean, is_noisy
from treebench.harness.store.outputs import write_whole
from treebench.harness.store.paths import folder_problem
from treebench.harness.store.rows import STATUSES, l2_label, row_l2_flushed, timing_label
from treebench.harness.model.tree_specs import parse_tree

log = logging.getLogger(__name__)

TEMPLATES = Path(__file__).resolve().parent / "templates"


# ---- formatting -------------------------------------------------------------------------------

def _roof_us(x) -> str:
    return num(x, ".3g")                 # a roofline time: 0.0342 µs keeps its digits


COLUMN_FORMATS = {"Time / roofline": ratio, "Roofline (us)": _roof_us}   # float columns not shown as `us`


# ---- choosing backends ------------------------------------------------------------------------

def pick_baseline(rows: Sequence[dict], requested: str | None, causal: str) -> str | None:
    """The speedup baseline: `requested`, else the first of DEFAULT_BASELINES with timed
    rows, else the alphabetically first timed backend other than `causal` and the reference.

    Raises:
        ConfigError: `requested` has no timed rows.
    """
    timed = timed_backends(rows, requested, "--baseline-backend")
    if requested:
        return requested
    skip = non_contenders(rows, causal)
    for b in (*DEFAULT_BASELINES, *timed):
        if b in timed and b not in skip:
            return b
    return timed[0] if timed else None


def backend_order(rows: Sequence[dict], baseline: str | None, causal: str) -> list[str]:
    """Causal baseline first, then the speedup baseline, then the others alphabetically."""
    names = sorted({r["backend"] for r in rows})
    first = [b for b in (causal, baseline) if b is not None and b in names]
    return first + [b for b in names if b not in first]


# ---- sections ---------------------------------------------------------------------------------

def backend_summary(rows: Sequence[dict], order: Sequence[str], sp: pd.DataFrame, overhead: pd.DataFrame,
                    skip: set[str], racing: set[str] | None = None, own: Set[str] = frozenset()) -> list[dict]:
    """Per backend: status counts, the kernel paths its rows name (`kernel`), timers with their L2 state ("cuda_graph, L2 flushed"), timed rows
    per L2 state, geomean speedup and mask overhead, median % peak, whether it is one of `own`
    (treebench's kernels), and wins (cases where it is the fastest passing backend of `racing`,
    default every backend not in `skip`; `skip` also has no mask overhead)."""
    racing = set(order) - skip if racing is None else racing
    df = timed_frame(rows)
    df = df[df["backend"].isin(list(racing))] if not df.empty else df
    best = df.loc[df.groupby("case_id")["median_us"].idxmin(), "backend"].value_counts() if not df.empty else {}
    out = []
    for b in order:
        mine = [r for r in rows if r["backend"] == b]
        counts = Counter(r["status"] for r in mine)
        fallbacks = sorted({r["timer_fallback"] for r in mine if r.get("timer_fallback")})
        s = sp[sp["backend"] == b]["speedup"].tolist() if not sp.empty else []
        o = overhead[(overhead["Backend"] == b)]["Overhead (%)"].dropna().tolist() if b not in skip else []
        pct = [r["pct_peak_bw"] for r in mine if r.get("status") == "pass" and r.get("pct_peak_bw") is not None]
        out.append({"backend": b, "counts": {k: counts.get(k, 0) for k in STATUSES}, "n": len(mine),
                    "timers": sorted({t for r in mine if (t := timing_label(r))}), "fallbacks": fallbacks,
                    "kernels": sorted({str(k) for r in mine if (k := r.get("kernel"))}),   # the paths it ran
                    "l2": Counter(f for r in mine if (f := row_l2_flushed(r)) is not None),
                    "speedup": geometric_mean(s) if s else None,
                    "overhead_pct": 100 * (geometric_mean([1 + x / 100 for x in o]) - 1) if o else None,
                    "pct_peak": float(pd.Series(pct).median()) if pct else None,
                    "own": b in own, "wins": int(best.get(b, 0)) if b in racing else None})
    return out


def verdict_lines(summary: Sequence[dict], baseline: str | None, causal: str, n_cases: int) -> list[tuple[str, str]]:
    """(css class, sentence) findings for the top of the report."""
    lines = []
    for s in summary:
        c, b = s["counts"], s["backend"]
        bad = c["mismatch"] + c["error"]
        if bad:
            lines.append(("bad", f"{b}: {c['mismatch']} mismatch(es), {c['error']} error(s) out of {s['n']} cases "
                                 "— see Correctness."))
        if s["wins"] is not None and (s["speedup"] is not None or b == baseline):
            vs = f"geometric-mean speedup {ratio(s['speedup'])} over {baseline}; " if s["speedup"] else ""
            lines.append(("info", f"{b}: {vs}fastest on {s['wins']}/{n_cases} cases."))
        if s["overhead_pct"] is not None:
            lines.append(("info", f"{b}: time {s['overhead_pct']:+.1f}% relative to {causal} on the same cases "
                                  "(geometric mean; negative: faster)."))
        for f in s["fallbacks"]:
            lines.append(("warn", f"{b}: timed with {'; '.join(s['timers'])} — {f}."))
    return lines + l2_warnings(summary)


def interpreter_warnings(envs: dict[str, dict], ids: Sequence[str]) -> list[tuple[str, str]]:
    """A warning when an env of the report ran Triton through its CPU interpreter
    (TRITON_INTERPRET=1): its Triton kernels' times measure the interpreter, not the kernel."""
    interp = [i for i in ids if envs.get(i, {}).get("triton_interpret")]
    if not interp:
        return []
    return [("warn", f"env {', '.join(interp)} ran Triton kernels in the CPU interpreter (TRITON_INTERPRET=1): "
                     "their times measure the interpreter, so ratios against other backends say nothing about "
                     "the kernels' speed.")]


def mixed_timing_warnings(rows: Sequence[dict]) -> list[tuple[str, str]]:
    """('warn', sentence) per backend with a (case, backend) pair timed with more than one
    timer: its rows are averaged into one median here, so that median mixes unlike timings.
    (Mixed L2 states are `l2_warnings`' business; different timers across cases, a capture
    fallback, the fallback lines'.)"""
    ways: dict[tuple, set] = {}
    for r in rows:
        if r.get("median_us") is not None and r.get("timer"):
            ways.setdefault((r.get("backend"), r.get("case_id")), set()).add(r["timer"])
    out = []
    for b in sorted({b for (b, _), timers in ways.items() if len(timers) > 1}):
        pairs = [timers for (bb, _), timers in ways.items() if bb == b and len(timers) > 1]
        timers = sorted(set().union(*pairs))
        out.append(("warn", f"{b}: {len(pairs)} case(s) have rows timed with different timers ({', '.join(timers)}), "
                            "averaged into one median in this report; report each timer from its own results file."))
    return out


def l2_warnings(summary: Sequence[dict]) -> list[tuple[str, str]]:
    """('warn', sentence) when rows timed with the L2 flushed and with a warm L2 meet in one report:
    per backend that has both (its medians, speedups and plots mix them), else once when
    backends differ (speedups and wins compare unlike timings). Nothing is split or dropped."""
    mixed = [s for s in summary if len(s["l2"]) > 1]
    lines = [("warn", f"{s['backend']}: {s['l2'][True]} row(s) timed with the L2 flushed and {s['l2'][False]} "
                      "with a warm L2 are mixed in this report's tables and plots; report each L2 state from its "
                      "own results file (treebench run --l2 cold|warm).") for s in mixed]
    if not mixed and len({f for s in summary for f in s["l2"]}) > 1:
        each = "; ".join(f"{s['backend']} {l2_label(next(iter(s['l2'])))}" for s in summary if s["l2"])
        lines.append(("warn", f"backends were timed in different L2 states ({each}): speedups and the fastest "
                              "backend compare unlike timings."))
    return lines


ENV_ROWS = ("gpu_name", "sm_count", "driver", "cuda", "python", "torch", "triton", "xformers", "flashinfer",
            "git_commit", "hostname", "platform", "peak_bw_bytes_per_s", "peak_matmul_tflops")


def env_table(envs: dict[str, dict], rows: Sequence[dict]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """(env ids used by `rows`, [(field, value per env)]); missing env files show as '?'."""
    ids = sorted(cast("set[str]", {r.get("env") for r in rows if r.get("env")}))
    table = []
    for f in ENV_ROWS:
        vals = [envs.get(i, {}).get(f, "?") if i in envs else "?" for i in ids]
        if f in ("peak_bw_bytes_per_s", "peak_matmul_tflops"):
            scale = 1e12 if f == "peak_bw_bytes_per_s" else 1.0
            f, vals = ("measured peak (copy) TB/s" if scale != 1 else "measured bf16 matmul TFLOP/s"), [
                num(v / scale, ".3f" if scale != 1 else ".4g") if isinstance(v, (int, float)) else
                (("not measured (CPU)" if not envs.get(i, {}).get("gpu_name") else "not measured")
                 if v is None else str(v)) for i, v in zip(ids, vals)]
        table.append((f, ["" if v is None else str(v) for v in vals]))
    return ids, table


def failure_rows(rows: Sequence[dict]) -> list[dict]:
    """Mismatch and error rows with their worst element (request b, node i, head h); the fields the
    table shows that a row may lack (one written by hand, an error row) are None."""
    out = []
    for r in rows:
        if r["status"] in ("mismatch", "error"):
            w = r.get("worst")
            out.append({"nonfinite": None, "atol": None, "rtol": None, **r, "where": f"b={w[0]}, i={w[1]}, h={w[2]}" if w else "",
                        "err": num(r.get("max_abs_err")), "rel": num(r.get("max_rel_err")),
                        "frac": num(100 * r["mismatch_frac"], ".3g") + "%" if r.get("mismatch_frac") else ""})
    return out


def skip_reasons(rows: Sequence[dict]) -> list[tuple[str, str, int]]:
    """(backend, reason, count) of skipped rows."""
    c = Counter((r["backend"], r.get("reason") or "") for r in rows if r["status"] == "skipped")
    return [(b, reason, n) for (b, reason), n in sorted(c.items())]


def tree_images(rows: Sequence[dict], limit: int = 12) -> list[tuple[str, int, str]]:
    """(spec, T, image) for each distinct tree spec in `rows`, smallest first (at most `limit`)."""
    specs = {r["case"]["tree"] for r in rows if r.get("case", {}).get("tree")}
    trees = sorted(((s, parse_tree(s)) for s in specs), key=lambda st: (st[1].size, st[0]))
    return [(s, t.size, plots.tree_figure(t, s)) for s, t in trees[:limit]]


def roofline_points(rows: Sequence[dict], envs: dict[str, dict]) -> pd.DataFrame:
    """backend, flops, bytes, tflops, tb_per_s, pct_peak_bw of passing timed rows (recomputed when absent)."""
    recs = []
    for r in rows:
        if r.get("status") != "pass" or not r.get("median_us"):
            continue
        flops, nbytes = row_work(r)
        env_id: Any = r.get("env")  # None (no env) finds no peak
        peak = envs.get(env_id, {}).get("peak_bw_bytes_per_s")
        recs.append({"backend": r["backend"], "flops": flops, "bytes": nbytes,
                     **rates(flops, nbytes, r["median_us"], peak)})
    return pd.DataFrame.from_records(recs)


def noisy_rows(rows: Sequence[dict]) -> list[dict]:
    """Passing timed rows whose timing spread is high (`treebench.harness.timing.stats.is_noisy`)."""
    return [r for r in rows if r.get("status") == "pass" and r.get("median_us") is not None and is_noisy(r)]


def time_pivot(df: pd.DataFrame, order: Sequence[str], values: str = "median_us") -> pd.DataFrame:
    """Median µs per case (rows: B, L, T and any varying axis) and backend (columns).

    `values` picks another column of `df` to pivot the same way (e.g. a 0/1 'noisy' flag).
    """
    if df.empty:
        return df
    keys = ["batch_size", "context_len", "T", *varying_axes(df, exclude=("batch_size", "context_len", "tree", "T",
                                                                         "noisy"))]
    df = df.assign(context_len=df["context_len"].astype(str))
    p = df.pivot_table(index=keys, columns="backend", values=values, aggfunc="max" if values != "median_us"
                       else "median", sort=False)
    p = p.reset_index().sort_values(["batch_size", "context_len", "T"],
                                    key=lambda c: c.map(order_key))
    return p[[*keys, *[b for b in order if b in p.columns]]].rename(
        columns={"batch_size": "B", "context_len": "L"}).reset_index(drop=True)


def pivot_table_cells(pivot: pd.DataFrame, order: Sequence[str], skip: set[str],
                      noisy: pd.DataFrame | None = None) -> Table:
    """The time pivot with the fastest backend of each case (backends in `skip` aside) marked 'best'
    and noisy timings (`noisy`: the same pivot of a 0/1 flag) marked '(noisy)'."""
    times = [c for c in pivot.columns if c in order]
    flags = noisy.to_dict("records") if noisy is not None and len(noisy) == len(pivot) else [{}] * len(pivot)
    rows = []
    for rec, flag in zip(pivot.to_dict("records"), flags):
        vals = [rec[b] for b in times if rec[b] == rec[b] and b not in skip]   # NaN != NaN: not timed
        fastest = min(vals) if len(vals) > 1 else None
        cells = []
        for c in pivot.columns:
            if c not in times:
                cells.append((str(rec[c]), ""))
                continue
            cls = "n best" if rec[c] == fastest else "n"
            if flag.get(c) == 1:
                cells.append((f"{us(rec[c])} ⚠noisy", cls + " noisy"))
            else:
                cells.append((us(rec[c]), cls))
        rows.append(cells)
    return Table([(c, "n" if c in times else "") for c in pivot.columns], rows)


def seed_table_cells(seed: pd.DataFrame, causal: str = "causal") -> Table:
    """The seed-style table, times in µs and overhead as a signed percentage (a † where the `causal`
    backend's time is the median over other runs)."""
    fmt = {"Time (us)": us, "Overhead (%)": lambda v: "" if v != v else f"{v:+.1f}", **COLUMN_FORMATS}
    num = {"Batch Size", "Seqlen Q", "Time (us)", "Overhead (%)", *COLUMN_FORMATS}
    return frame_cells(seed, fmt, num, "Overhead (%)", f"{causal} time")


# ---- the page ---------------------------------------------------------------------------------

def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(num=num, us=us, ratio=ratio)
    return env


@plots.quietly
def write_report(rows: list[dict], envs: dict[str, dict], path: str | Path, title: str = "treebench", *,
                 baseline: str | None = None, causal_backend: str = "causal_baseline", gate=None,
                 sources: Sequence[str] = (), sections: Sequence[str] = (), own: str | None = None,
                 shown: Sequence[str] | None = None, named: str | Path | None = None, flag: str = "report -o") -> Path:
    """Writes a self-contained HTML report of `rows` to `path`, whole or not at all
    (`treebench.harness.store.outputs.write_whole`), and returns it.

    Args:
        rows: result rows (schema 1), any mix of backends and cases.
        envs: env fingerprints by env id (peaks, versions).
        path: output .html path; parent folders are created.
        title: page title.
        baseline: backend the speedups are against (default: `pick_baseline`).
        causal_backend: backend whose time the tree-mask overhead is measured against.
        gate: an optional `treebench.harness.analyze.gate.GateResult` to show with the summary.
        sources: result paths, listed in the header and, made absolute, in its
            `<meta name="treebench-results">` tags (`store.names.report_results`).
        shown: the header's names of `sources` (default `sources`): the paths as the user gave them
            where `sources` were made absolute; `named`, likewise, the lines' name of `path`, and `flag`
            the option that gave it, as typed ("report -o", "--report" of run), which a refusal names.
        sections: extra HTML <section>s (already escaped) after the report's own: the CLI's speculation section.
        own: the backend the first table and the headline are about (default triton_tree where timed,
            `treebench.harness.analyze.headline.pick_own`); it and the rest of OWN_KERNELS are never its rivals.

    Raises:
        ConfigError: `baseline` or `own` has no timed rows; `path` cannot be written (led by `flag`).
    """
    baseline = pick_baseline(rows, baseline, causal_backend)
    own = pick_own(rows, own)
    order = backend_order(rows, baseline, causal_backend)
    df = timed_frame(rows)
    skip = non_contenders(rows, causal_backend)
    racing = contenders(rows, own, causal_backend) & set(order)
    sp = speedup_table(rows, baseline, exclude=sorted(skip)) if baseline else pd.DataFrame()
    overhead = mask_overhead_table(rows, causal_backend, envs)
    summary = backend_summary(rows, order, sp, overhead, skip, racing, own_kernels(own))
    noisy = noisy_rows(rows)
    noisy_keys = {(r["case_id"], r["backend"]) for r in noisy}
    ids, env_rows = env_table(envs, rows)
    gpu = next((envs[i].get("gpu_name") for i in ids if i in envs and envs[i].get("gpu_name")), None)
    peak_bw = next((envs[i].get("peak_bw_bytes_per_s") for i in ids if i in envs), None)
    matmul = next((envs[i].get("peak_matmul_tflops") for i in ids if i in envs), None)
    verdicts = verdict_lines(summary, baseline, causal_backend, len({r["case_id"] for r in rows}))
    verdicts += mixed_timing_warnings(rows) + missing_row_warnings(rows) + interpreter_warnings(envs, ids)
    if noisy:
        verdicts.append(("warn", f"{len(noisy)} timed row(s) are noisy ({NOISE_RULE}); marked ⚠noisy in the "
                                 f"time table — rerun them on a quieter {'GPU' if gpu else 'machine'} before "
                                 "trusting small differences."))
    noisy_pivot = (time_pivot(df.assign(noisy=[int((c, b) in noisy_keys) for c, b in zip(df["case_id"], df["backend"])]),
                              order, values="noisy") if not df.empty else None)
    rivals = peers(rows, own, causal_backend)
    cells = cell_frame(rows, envs, own, rivals)
    missing = missing_peers(rows, rivals)     # cells a peer that ran elsewhere has no row for (a cut run)
    n_cases = len({r["case_id"] for r in rows})
    ctx = dict(
        title=title, generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        sources=list(sources if shown is None else shown),
        source_paths=[str(Path(s).resolve()) for s in sources],
        gpu=gpu or "CPU", n_rows=len(rows), n_cases=n_cases, order=order, baseline=baseline,
        causal=causal_backend, has_causal=causal_backend in order, summary=summary,
        not_racing=not_racing_note(order, racing, own, skip),
        own=own, own_kernels=sorted(own_kernels(own) & set(order)), own_kernels_all=OWN_KERNELS, rivals=[b for b in rivals if b in order],
        headline=headline(cells, own, missing),
        cells=headline_table(cells, own, missing).without_empty_columns() if not cells.empty else None,
        summary_columns={k: any(x[k] is not None for x in summary) for k in ("speedup", "overhead_pct", "pct_peak")},
        verdicts=verdicts, gate=gate, n_noisy=len(noisy), noise_rule=NOISE_RULE,
        env_ids=ids, env_rows=env_rows, roofline_basis=roofline_basis(envs, ids),
        pivot=pivot_table_cells(time_pivot(df, order), order, set(order) - racing, noisy_pivot),
        seed=(seed := seed_table_cells(overhead, causal_backend).without_empty_columns()),
        seed_md=seed.markdown() if not overhead.empty else "",
        kv=kv_table_cells(kv) if not (kv := kv_dtype_table(rows)).empty else None,
        failures=failure_rows(rows), skips=skip_reasons(rows), coverage=coverage_by_backend(rows),
        heatmaps=plots.best_peer_heatmaps(cells, own) if own and not cells.empty else None,
        latency=plots.latency_plots(df, order),
        roofline=plots.roofline(roofline_points(rows, envs), order, peak_bw, device_peak(gpu), own_kernels(own),
                                matmul),
        peak=device_peak(gpu), peak_bw=peak_bw, matmul=matmul, trees=tree_images(rows), sections=list(sections))
    html = _environment().get_template("report.html.j2").render(**ctx)
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        write_whole(p, html)      # whole or not at all: an interrupt leaves an earlier report as it was
    except OSError as e:
        raise ConfigError(f"{flag} {named or p}: cannot write ({folder_problem(p) or e.strerror}); "
                          "choose another path") from None
    log.info("report written to %s (%d rows, %.0f kB)", named or p, len(rows), len(html) / 1e3)
    return p


def not_racing_note(order: Sequence[str], racing: set[str], own: str | None, skip: set[str]) -> str:
    """Who is left out of 'fastest' and why, for the time table's caption ('' when nobody is)."""
    ours = [b for b in order if b not in racing and b not in skip]
    causal = [b for b in order if b in skip and b != "reference"]
    parts = [f"{', '.join(ours)}: treebench's own kernels besides {own or 'the one under test'}"] if ours else []
    if causal:
        parts.append(f"{', '.join(causal)}: causal-mask backends, they run the easier causal task")
    if "reference" in order:
        parts.append("reference: the float64 oracle")
    return "; ".join(parts)
