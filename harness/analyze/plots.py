"""The report's figures, as PNG data URIs (matplotlib's object API, no pyplot state).

Every function takes plain data (DataFrames from `treebench.harness.analyze.tables`, trees,
peaks) and returns ``data:image/png;base64,...`` for an ``<img>`` tag, so the
HTML report opens offline with its images embedded.
"""

from __future__ import annotations

import base64
import functools
import io
import itertools
import logging
import math
import warnings
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.ticker import FuncFormatter, LogFormatterSciNotation, LogLocator, NullFormatter
from PIL import Image

from treebench.harness.analyze.cells import ratio
from treebench.harness.analyze.tables import order_key

from treebench.harness.model.workload import DevicePeak
from treebench.harness.timing.stats import geometric_mean
from treebench.harness.model.trees import TokenTree, shape_text

DPI = 100                # pixels per inch of every PNG: 1 pt of text is DPI / 72 px at full size
FIG_WIDTH = 11.5         # inches: 1150 px, the page's content width at 1400 px, shown unscaled
RC = {"font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10.5, "xtick.labelsize": 10,
      "ytick.labelsize": 10, "legend.fontsize": 10, "figure.titlesize": 11}   # pt: 10 pt = 14 px
PLAIN = FuncFormatter(lambda v, _: f"{v:g}")   # 20 rather than 2x10^1 on log axes
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
           "#7f7f7f", "#bcbd22")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")
F = TypeVar("F", bound=Callable[..., Any])
FACETS = ("page_size", "kv_dtype", "layout", "tree_per_request", "num_q_heads", "num_kv_heads", "head_dim", "dtype",
          "k_scale", "v_scale", "values", "logit_scale", "sm_scale")
MAX_HEATMAP_FACETS = 2   # heatmap panels per value pair of the first two varying FACETS (page size x kv dtype)


@dataclass(frozen=True)
class Picture:
    """A rendered figure for an ``<img>``: its data URI and what the text-size check needs."""

    uri: str              # data:image/png;base64,...
    min_font_pt: float    # smallest font of any visible text in the figure, points
    dpi: int              # pixels per inch of the PNG: a font is min_font_pt * dpi / 72 px unscaled
    note: str = ""        # what the figure holds fixed, for its caption ('' when nothing)


def colors(backends: Sequence[str]) -> dict[str, str]:
    """A stable colour per backend (in the given order)."""
    return {b: PALETTE[i % len(PALETTE)] for i, b in enumerate(backends)}


def markers(backends: Sequence[str]) -> dict[str, str]:
    """A stable marker per backend (in the given order), so colours need not be told apart."""
    return {b: MARKERS[i % len(MARKERS)] for i, b in enumerate(backends)}


def styled(fn: F) -> F:
    """Runs a figure function under RC (fonts large enough to read at the page's width)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with matplotlib.rc_context(RC):
            return fn(*args, **kwargs)
    return cast(F, wrapper)


def quietly(fn: F) -> F:
    """Runs `fn` (the report's making) with no Python warning printed: a ratio or sum that overflows
    (`median_us: 1e308`) is inf with numpy silent, a label's character the font lacks (a backend named with
    a NUL) is drawn as a box, and any other warning of its libraries is one line on the treebench logger."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"), \
                warnings.catch_warnings(record=True) as caught:
            warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from", category=UserWarning)
            try:
                return fn(*args, **kwargs)
            finally:
                for line in sorted({f"{w.category.__name__}: {' '.join(str(w.message).split())}" for w in caught}):
                    logging.getLogger(__name__).warning("report: %s", line)
    return cast(F, wrapper)


PNG_COLORS = 256          # palette entries of every PNG (`png_uri`)


def png_uri(fig: Figure, note: str = "") -> Picture:
    """Renders `fig` to a base64 PNG data URI, with the smallest font size of its visible text.

    The PNG is stored with a palette of PNG_COLORS colours (Pillow's median cut, no dithering),
    not as RGBA: on the seed report's figures that is about 3.2x fewer bytes, with no visible
    change to the colour scales or the text."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", facecolor="white")
    buf.seek(0)
    with Image.open(buf) as img:
        small = img.convert("RGB").quantize(colors=PNG_COLORS, method=Image.Quantize.MEDIANCUT,
                                            dither=Image.Dither.NONE)
    out = io.BytesIO()
    small.save(out, format="PNG", optimize=True)
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    return Picture("data:image/png;base64," + base64.b64encode(out.getvalue()).decode("ascii"),
                   float(min(sizes, default=RC["font.size"])), DPI, note)


def _by_size(df: pd.DataFrame) -> list[str]:
    """The trees of `df`, smallest T first."""
    return sorted(df["tree"].unique(), key=lambda t: (df.loc[df["tree"] == t, "T"].iloc[0], t))


def _tree_label(df: pd.DataFrame, tree: str) -> str:
    t = df.loc[df["tree"] == tree, "T"].iloc[0]
    return f"{tree} (T={t})"


@styled
def best_peer_heatmaps(cells: pd.DataFrame, own: str) -> Picture | None:
    """own / best peer per (B, L) row and tree column, the best peer named in each cell; one panel
    per value of the first varying axes of FACETS, at most MAX_HEATMAP_FACETS of them (page size,
    and kv dtype where a report holds bf16 and fp8 rows). `cells` is
    `treebench.harness.analyze.headline.cell_frame`'s; a cell over other varying axes shows their
    geometric mean and its most frequent best peer. None when no cell has a ratio."""
    d = cells.dropna(subset=["ratio"])
    d = d[np.isfinite(d["ratio"]) & (d["ratio"] > 0)]        # a 0 µs median (a coarse CPU clock) has no ratio
    if d.empty:
        return None
    groups = heatmap_panels(d)
    trees = _by_size(d)
    bl = sorted({(b, str(c)) for b, c in zip(d["batch_size"], d["context_len"])},
                key=lambda k: (k[0], order_key(k[1])))
    k = max(float(d["ratio"].max()), 1 / float(d["ratio"].min()), 1.25)
    norm = LogNorm(vmin=1 / k, vmax=k)                                   # 1 in the middle, x and 1/x alike
    fig = Figure(figsize=(FIG_WIDTH, len(groups) * (0.46 * len(bl) + 1.5)), layout="constrained")
    axes = fig.subplots(len(groups), 1, squeeze=False)[:, 0]
    for ax, (where, g) in zip(axes, groups):
        grid = np.full((len(bl), len(trees)), np.nan)
        names = np.full((len(bl), len(trees)), "", dtype=object)
        for (b, c, t), cell in g.groupby([g["batch_size"], g["context_len"].astype(str), g["tree"]]):
            i, j = bl.index((b, c)), trees.index(t)
            grid[i, j], names[i, j] = geometric_mean(cell["ratio"].tolist()), cell["peer"].mode().iloc[0]
        im = ax.imshow(grid, cmap="RdYlGn_r", norm=norm, aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            ax.text(j, i, "—" if math.isnan(v) else f"{ratio(v)}\n{names[i, j]}", ha="center", va="center",
                    fontsize=9, linespacing=1.1)
        ax.set_xticks(range(len(trees)), [_tree_label(d, t).replace(" (", "\n(") for t in trees])
        ax.set_yticks(range(len(bl)), [f"B={b}, L={c}" for b, c in bl])
        ax.xaxis.tick_top()
        ax.set_title(f"{own} / best peer" + (f", {where}" if where else ""), loc="left")
    bar = fig.colorbar(im, ax=list(axes), shrink=0.8, label=f"{own} time / best peer time (< 1: {own} faster)",
                       ticks=[t for t in (0.1, 0.25, 0.33, 0.5, 0.67, 1, 1.5, 2, 3, 4, 10) if 1 / k <= t <= k],
                       format=PLAIN)
    bar.ax.yaxis.set_minor_formatter(NullFormatter())
    return png_uri(fig)


def heatmap_panels(cells: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(title words, cells) per heatmap panel: one per value combination of the first
    MAX_HEATMAP_FACETS varying FACETS ("page size 16, kv dtype float8_e4m3fn"), in their
    sorted order; one untitled panel when none varies."""
    facets = [a for a in FACETS if a in cells and cells[a].astype(str).nunique() > 1][:MAX_HEATMAP_FACETS]
    if not facets:
        return [("", cells)]
    return [(", ".join(f"{a.replace('_', ' ')} {v}" for a, v in zip(facets, key)), g)
            for key, g in cells.groupby(facets, sort=True, dropna=False)]


def _fixed_axes(df: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """`df` at one value of every varying axis besides B, L and tree (its most timed value,
    the largest on a tie), and a note saying which."""
    note = []
    for a in FACETS:
        if a in df and df[a].astype(str).nunique() > 1:
            counts = df[a].value_counts()
            value = max(counts[counts == counts.max()].index, key=order_key)
            df = df[df[a] == value]
            note.append(f"{a.replace('_', ' ')} {value}")
    return df, ", ".join(note)


def _spread(values: Sequence, most: int) -> list:
    """At most `most` of `values` (sorted): the first, the last and evenly between."""
    if len(values) <= most:
        return list(values)
    return [values[round(i * (len(values) - 1) / (most - 1))] for i in range(most)]


@styled
def latency_plots(df: pd.DataFrame, order: Sequence[str]) -> Picture | None:
    """Median latency (p25-p75 band) against context length, a line per backend, for the smallest
    and largest tree (rows) at up to three batch sizes (columns), other axes fixed (`_fixed_axes`).
    None when fewer than two integer context lengths were timed (a one-point line says nothing)."""
    df = df[df["context_len"].map(lambda c: isinstance(c, int))] if not df.empty else df
    if df.empty or df["context_len"].nunique() < 2:
        return None
    df, note = _fixed_axes(df)
    batches, trees = _spread(sorted(df["batch_size"].unique()), 3), _spread(_by_size(df), 2)
    fig = Figure(figsize=(FIG_WIDTH, 3.4 * len(trees) + 0.6), layout="constrained")
    axes = fig.subplots(len(trees), len(batches), squeeze=False)
    col, mark = colors(order), markers(order)
    for (i, t), (j, bs) in itertools.product(enumerate(trees), enumerate(batches)):
        ax = axes[i, j]
        for b in order:
            d = df[(df["backend"] == b) & (df["batch_size"] == bs) & (df["tree"] == t)]
            d = d.groupby("context_len")[["median_us", "p25_us", "p75_us"]].median().sort_index()
            if not d.empty:
                ax.plot(d.index, d["median_us"], marker=mark[b], ms=6, lw=1.6, color=col[b], label=b)
                ax.fill_between(d.index, d["p25_us"], d["p75_us"], color=col[b], alpha=0.2, lw=0)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(PLAIN)
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set(title=f"B={bs}, {_tree_label(df, t)}", xlabel="context length L", ylabel="median µs")
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper center", ncols=min(len(labels), 7))
    return png_uri(fig, note)


@styled
def roofline(points: pd.DataFrame, order: Sequence[str], measured_bw: float | None,
             peak: DevicePeak | None, own: Set[str] = frozenset(), measured_tflops: float | None = None
             ) -> Picture | None:
    """Roofline (TFLOP/s against arithmetic intensity, log-log) and % of the measured HBM peak
    against bytes moved, a colour and a marker per backend (`own`: treebench's kernels, drawn
    larger). `points` has backend, flops, bytes, tflops, tb_per_s, pct_peak_bw. The solid roof
    is the measured bandwidth (bytes/s) capped by the measured bf16 matrix rate (TFLOP/s;
    the datasheet's where none was measured), the dashed one the datasheet's."""
    pts = points.dropna(subset=["tflops"]) if not points.empty else points
    if pts.empty:
        return None
    fig = Figure(figsize=(FIG_WIDTH, 4.8), layout="constrained")
    ax, ax2 = fig.subplots(1, 2)
    col, mark = colors(order), markers(order)
    ai = pts["flops"] / pts["bytes"]                                        # FLOP per byte
    x = np.logspace(math.log10(ai.min() / 2), math.log10(ai.max() * 4), 100)
    cap = peak.tflops_16bit if peak else math.inf                              # datasheet compute roof, TFLOP/s
    if measured_bw:
        rate = f", {measured_tflops:.0f} TFLOP/s" if measured_tflops else ""
        ax.plot(x, np.minimum(x * measured_bw / 1e12, measured_tflops or cap), "k-", lw=1.3,
                label=f"roof: measured {measured_bw / 1e12:.2f} TB/s{rate}")
    if peak:
        ax.plot(x, np.minimum(x * peak.hbm_tb_per_s, cap), "k--", lw=1,
                label=f"roof: datasheet {peak.hbm_tb_per_s} TB/s")
    for b in order:
        d = pts[pts["backend"] == b]
        if not d.empty:
            style = dict(s=46 if b in own else 26, color=col[b], marker=mark[b], alpha=0.75,
                         edgecolors="black" if b in own else "none", linewidths=0.6)
            ax.scatter(d["flops"] / d["bytes"], d["tflops"], label=b + (" (own)" if b in own else ""), **style)
            ax2.scatter(d["bytes"], d["pct_peak_bw"] if measured_bw else d["tb_per_s"], **style)
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP / byte)", ylabel="achieved TFLOP/s",
           title="roofline")
    ax2.set(xscale="log", xlabel="bytes moved per call",
            ylabel="% of measured HBM peak" if measured_bw else "achieved TB/s", title="bandwidth achieved")
    for a in (ax, ax2):
        a.grid(True, which="both", alpha=0.3)
        for axis in (a.xaxis, a.yaxis) if a is ax else (a.xaxis,):
            lo, hi = axis.get_view_interval()
            if lo > 0 and math.log10(hi) - math.log10(lo) < 1.5:             # too few powers of ten to read it by
                axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
                axis.set_major_formatter(LogFormatterSciNotation(labelOnlyBase=False))
            axis.set_minor_formatter(NullFormatter())            # 3x10^4 4x10^4 ... would overlap
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", markerscale=1.3)
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


TREE_FIG_WIDTH = 5.8        # inches: two trees side by side at the page's width, unscaled
LABELLED_LEAVES = 24        # node numbers are drawn when the tree has at most this many leaves


@styled
def tree_figure(tree: TokenTree, title: str) -> Picture:
    """The tree drawn (root at top) beside its (T, T) ancestor mask."""
    fig = Figure(figsize=(TREE_FIG_WIDTH, min(1.8 + 0.55 * max(tree.depth, 2), MAX_TREE_FIG_HEIGHT)),
                 layout="constrained")
    ax, ax2 = fig.subplots(1, 2, width_ratios=[1.5, 1])
    x, d = _tree_xy(tree)
    for i, p in enumerate(tree.parents):
        if p >= 0:
            ax.plot([x[p], x[i]], [-d[p], -d[i]], color="#888", lw=0.8, zorder=1)
    labelled = len(tree.leaves) <= LABELLED_LEAVES and tree.size <= 64
    ax.scatter(x, [-v for v in d], s=150 if labelled else 30, color="#4c72b0", zorder=2)
    if labelled:
        for i in range(tree.size):
            ax.text(x[i], -d[i], str(i), color="white", ha="center", va="center", fontsize=8, zorder=3)
    fig.suptitle(f"{title}: {shape_text(tree)}")
    step = max(1, -(-(tree.depth + 1) // 12))     # at most ~12 depth labels
    levels = range(0, tree.depth + 1, step)
    ax.set_yticks([-k for k in levels], [f"depth {k}" for k in levels])
    ax.set_xticks([])
    ax.margins(0.08, 0.15)
    for s in ("top", "right", "bottom"):
        ax.spines[s].set_visible(False)
    ax2.imshow(tree.ancestor_mask.numpy(), cmap="Blues", vmin=0, vmax=1.3, interpolation="nearest")
    ax2.set(title="mask: query i sees key j", xlabel="key node j", ylabel="query node i")
    ticks = list(range(0, tree.size, max(1, math.ceil(tree.size / 6))))
    ax2.set_xticks(ticks)
    ax2.set_yticks(ticks)
    return png_uri(fig)
