"""The report's figures, as PNG data URIs (matplotlib's object API, no pyplot state).

Every function takes plain data (DataFrames from `treebench.harness.analyze.tables`, trees,
peaks) and returns ``data:image/png;base64,...`` for an ``<img>`` tag, so the
HTML report opens offline with its images embedded.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from treebench.harness.model.workload import DevicePeak
from treebench.harness.timing.stats import geometric_mean
from treebench.harness.model.trees import TokenTree

DPI = 110
PLAIN = FuncFormatter(lambda v, _: f"{v:g}")   # 20 rather than 2x10^1 on log axes
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
           "#7f7f7f", "#bcbd22")


def colors(backends: Sequence[str]) -> dict[str, str]:
    """A stable colour per backend (in the given order)."""
    return {b: PALETTE[i % len(PALETTE)] for i, b in enumerate(backends)}


def png_uri(fig: Figure) -> str:
    """Renders `fig` to a base64 PNG data URI."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", facecolor="white")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _grid(nrows: int, ncols: int, w: float, h: float) -> tuple[Figure, np.ndarray]:
    fig = Figure(figsize=(w * ncols, h * nrows), layout="constrained")
    axes = np.atleast_2d(fig.subplots(nrows, ncols, squeeze=False))
    return fig, axes


def _tree_label(df: pd.DataFrame, tree: str) -> str:
    t = df.loc[df["tree"] == tree, "T"].iloc[0]
    return f"{tree} (T={t})"


def speedup_heatmaps(sp: pd.DataFrame, baseline: str) -> str | None:
    """Speedup over `baseline` (batch size x context length), one row per backend, one column
    per tree; cells are the geometric mean over any other varying axes. None when empty."""
    sp = sp[sp["context_len"].map(lambda c: isinstance(c, int))] if not sp.empty else sp
    if sp.empty:
        return None
    backends, trees = sorted(sp["backend"].unique()), sorted(sp["tree"].unique(), key=lambda t: (
        sp.loc[sp["tree"] == t, "T"].iloc[0], t))
    lo, hi = sp["speedup"].min(), sp["speedup"].max()
    norm = TwoSlopeNorm(vcenter=1.0, vmin=min(lo, 0.95), vmax=max(hi, 1.05))
    fig, axes = _grid(len(backends), len(trees), 3.1, 2.5)
    for i, b in enumerate(backends):
        for j, t in enumerate(trees):
            cell = sp[(sp["backend"] == b) & (sp["tree"] == t)]
            grid = cell.pivot_table(index="batch_size", columns="context_len", values="speedup",
                                    aggfunc=geometric_mean)
            _heatmap(axes[i, j], grid, norm)
            axes[i, j].set_title(f"{b}\n{_tree_label(sp, t)}", fontsize=9)
    mappable = next(a.images[0] for a in axes.flat if a.images)
    fig.colorbar(mappable, ax=axes, shrink=0.6, label=f"speedup vs {baseline} (>1 faster)")
    return png_uri(fig)


def _heatmap(ax, grid: pd.DataFrame, norm) -> None:
    """One annotated batch x context heatmap ('no timed cases' when `grid` is empty)."""
    if grid.empty:
        ax.text(0.5, 0.5, "no timed cases", ha="center", va="center", fontsize=9, color="#888",
                transform=ax.transAxes)
        ax.set_axis_off()
        return
    ax.imshow(grid.to_numpy(dtype=float), cmap="RdYlGn", norm=norm, aspect="auto")
    ax.set_xticks(range(grid.shape[1]), [str(c) for c in grid.columns], fontsize=8)
    ax.set_yticks(range(grid.shape[0]), [str(r) for r in grid.index], fontsize=8)
    ax.set_xlabel("context length L", fontsize=8)
    ax.set_ylabel("batch size B", fontsize=8)
    for (r, c), v in np.ndenumerate(grid.to_numpy(dtype=float)):
        ax.text(c, r, "—" if math.isnan(v) else f"{v:.2f}×", ha="center", va="center", fontsize=8)


def latency_plots(df: pd.DataFrame, order: Sequence[str]) -> str | None:
    """Median latency (p25-p75 band) against context length, a line per backend; one panel
    per (batch size, tree). None when nothing has an integer context length."""
    df = df[df["context_len"].map(lambda c: isinstance(c, int))] if not df.empty else df
    if df.empty:
        return None
    batches = sorted(df["batch_size"].unique())
    trees = sorted(df["tree"].unique(), key=lambda t: (df.loc[df["tree"] == t, "T"].iloc[0], t))
    fig, axes = _grid(len(batches), len(trees), 3.0, 2.4)
    col = colors(order)
    for i, bs in enumerate(batches):
        for j, t in enumerate(trees):
            ax = axes[i, j]
            for b in order:
                d = df[(df["backend"] == b) & (df["batch_size"] == bs) & (df["tree"] == t)]
                d = d.groupby("context_len")[["median_us", "p25_us", "p75_us"]].median().sort_index()
                if d.empty:
                    continue
                ax.plot(d.index, d["median_us"], "o-", ms=3, lw=1.4, color=col[b], label=b)
                ax.fill_between(d.index, d["p25_us"], d["p75_us"], color=col[b], alpha=0.2, lw=0)
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(PLAIN)
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.set_title(f"B={bs}, {_tree_label(df, t)}", fontsize=9)
            ax.set_xlabel("context length L", fontsize=8)
            ax.set_ylabel("median µs", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper center", ncols=min(len(order), 6), fontsize=9)
    return png_uri(fig)


def roofline(points: pd.DataFrame, order: Sequence[str], measured_bw: float | None,
             peak: DevicePeak | None) -> str | None:
    """Roofline (TFLOP/s against arithmetic intensity, log-log) and % of the measured HBM peak
    against bytes moved. `points` has backend, flops, bytes, tflops, tb_per_s, pct_peak_bw."""
    pts = points.dropna(subset=["tflops"]) if not points.empty else points
    if pts.empty:
        return None
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax, ax2 = fig.subplots(1, 2)
    col = colors(order)
    ai = pts["flops"] / pts["bytes"]                                        # FLOP per byte
    x = np.logspace(math.log10(ai.min() / 2), math.log10(ai.max() * 4), 100)
    cap = peak.tflops_16bit if peak else math.inf                              # compute roof, TFLOP/s
    if measured_bw:
        ax.plot(x, np.minimum(x * measured_bw / 1e12, cap), "k-", lw=1.3,
                label=f"roof: measured copy {measured_bw / 1e12:.2f} TB/s")
    if peak:
        ax.plot(x, np.minimum(x * peak.hbm_tb_per_s, cap), "k--", lw=1,
                label=f"roof: datasheet {peak.hbm_tb_per_s} TB/s, {peak.tflops_16bit:.0f} TFLOP/s")
    for b in order:
        d = pts[pts["backend"] == b]
        if not d.empty:
            ax.scatter(d["flops"] / d["bytes"], d["tflops"], s=14, color=col[b], label=b, alpha=0.8)
            ax2.scatter(d["bytes"], d["pct_peak_bw"] if measured_bw else d["tb_per_s"], s=14,
                        color=col[b], label=b, alpha=0.8)
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP / byte)", ylabel="achieved TFLOP/s",
           title="roofline")
    ax.legend(fontsize=7, loc="lower right")
    ax2.set(xscale="log", xlabel="bytes moved per call",
            ylabel="% of measured HBM peak" if measured_bw else "achieved TB/s",
            title="bandwidth achieved")
    for a in (ax, ax2):
        a.grid(True, which="both", alpha=0.3)
    return png_uri(fig)


def _tree_xy(tree: TokenTree) -> tuple[list[float], list[int]]:
    """Node x (leaves spaced 1 apart in DFS order, parents centred over children) and depth.

    Iterative (a chain of 1000 nodes is a valid tree, deeper than Python's recursion limit).
    """
    order, stack = [], [0]
    while stack:                                   # pre-order DFS, children in index order
        i = stack.pop()
        order.append(i)
        stack.extend(reversed(tree.children[i]))
    x = [0.0] * tree.size
    leaves = [i for i in order if not tree.children[i]]
    for k, i in enumerate(leaves):
        x[i] = float(k)
    for i in reversed(order):                      # every node's descendants before the node
        if tree.children[i]:
            x[i] = sum(x[c] for c in tree.children[i]) / len(tree.children[i])
    return x, list(tree.depths)


MAX_TREE_FIG_HEIGHT = 9.0   # inches: deep trees (chains) are squeezed, not drawn 500 inches tall


def tree_figure(tree: TokenTree, title: str) -> str:
    """The tree drawn (root at top) beside its (T, T) ancestor mask."""
    fig = Figure(figsize=(7.2, min(1.4 + 0.55 * max(tree.depth, 2), MAX_TREE_FIG_HEIGHT)), layout="constrained")
    ax, ax2 = fig.subplots(1, 2, width_ratios=[1.7, 1])
    x, d = _tree_xy(tree)
    for i, p in enumerate(tree.parents):
        if p >= 0:
            ax.plot([x[p], x[i]], [-d[p], -d[i]], color="#888", lw=0.8, zorder=1)
    ax.scatter(x, [-v for v in d], s=130 if tree.size <= 40 else 30, color="#4c72b0", zorder=2)
    if tree.size <= 64:
        for i in range(tree.size):
            ax.text(x[i], -d[i], str(i), color="white", ha="center", va="center", fontsize=6, zorder=3)
    ax.set_title(f"{title}: T={tree.size}, depth {tree.depth}, {len(tree.leaves)} leaves", fontsize=9)
    step = max(1, -(-(tree.depth + 1) // 16))     # at most ~16 depth labels
    levels = range(0, tree.depth + 1, step)
    ax.set_yticks([-k for k in levels], [f"depth {k}" for k in levels], fontsize=7)
    ax.set_xticks([])
    ax.margins(0.08, 0.15)
    for s in ("top", "right", "bottom"):
        ax.spines[s].set_visible(False)
    ax2.imshow(tree.ancestor_mask.numpy(), cmap="Blues", vmin=0, vmax=1.3, interpolation="nearest")
    ax2.set_title("mask: query i sees key j", fontsize=8)
    ax2.set_xlabel("key node j", fontsize=8)
    ax2.set_ylabel("query node i", fontsize=8)
    ax2.tick_params(labelsize=7)
    ticks = list(range(0, tree.size, max(1, math.ceil(tree.size / 8))))
    ax2.set_xticks(ticks)
    ax2.set_yticks(ticks)
    return png_uri(fig)
