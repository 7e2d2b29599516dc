"""The verdict: which tree to verify, on which kernel, for the most accepted tokens per time.

For a verify curve (``treebench.harness.speculation.cost``) and an acceptance model, a
tree of T nodes (root included) on B requests gives

    tokens_per_ms = B * E(T) / (verify_us(T) + step_us(B, T)) * 1000

accepted tokens per millisecond of step time, across the batch: E(T) is the
best tree's expected accepted tokens per request (``search_trees``, bonus
token included), verify_us the measured tree-attention time, step_us the rest
of the step (``StepCost``; 0 by default, then it is tokens per ms of verify
attention alone). The best tree of each measured size is compared with the
best chain (T - 1 rank-0 drafts in a row) and with no speculation (T = 1:
B tokens per step). Only sizes inside the measured range are considered.
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from dataclasses import dataclass

from treebench.harness.errors import ConfigError
from treebench.harness.speculation.acceptance import AcceptanceModel
from treebench.harness.speculation.cost import CurveKey, StepCost, VerifyCurve
from treebench.harness.speculation.expected import chain_expected
from treebench.harness.speculation.search import MAX_SEARCH_NODES, SearchedTree, search_trees

__all__ = ["Option", "Verdict", "verdict", "plan", "format_table", "table_rows", "speculation_section", "shape_text"]


@dataclass(frozen=True)
class Option:
    """One tree on one curve.

    Attributes:
        size: T, nodes per request including the root.
        expected: E, accepted tokens per request per step.
        verify_us: verify time, µs: measured at T, or interpolated between the nearest measured sizes.
        step_us: the rest of the step, µs.
        choices: the tree's choices paths (root implicit).
        measured: True when verify_us is a measurement at exactly T, False when interpolated.
    """

    size: int
    expected: float
    verify_us: float
    step_us: float
    choices: tuple[tuple[int, ...], ...]
    measured: bool = True

    def tokens_per_ms(self, batch_size: int) -> float:
        """B * E / (verify_us + step_us) * 1000: accepted tokens per ms across the batch."""
        return batch_size * self.expected / (self.verify_us + self.step_us) * 1000.0


@dataclass(frozen=True)
class Verdict:
    """Best tree, best chain and no speculation for one curve (None where unmeasured).

    Attributes:
        key: the curve's backend, B, L and configuration.
        best: the tree maximising tokens per ms over the measured sizes.
        chain: the best chain over the measured sizes.
        none: T = 1 (E = 1), None when T = 1 was not measured.
        reason: why `best` is None ("" otherwise).
    """

    key: CurveKey
    best: Option | None
    chain: Option | None
    none: Option | None
    reason: str = ""


def _option(curve: VerifyCurve, step: StepCost, t: int, e: float, choices) -> Option | None:
    """The Option of T = `t` on `curve`; None where T was not measured (nor lies between measured sizes).

    Raises:
        ConfigError: a step cost that, with the verify time, is not a finite number of µs at this B and T
            (--step-us 1e308*tokens at B * T = 2): every rate would read 0 tokens per ms.
    """
    us, _ = curve.lookup(t)
    if us is None:
        return None
    b = curve.key.batch_size
    step_us = step.us(b, t)
    if not math.isfinite(us + step_us):
        raise ConfigError(f"{step.shown}: at B {b}, T {t} ({b * t} tokens) the step takes more µs than a float "
                          "holds; give a smaller step time")
    return Option(t, e, us, step_us, tuple(choices), measured=t in curve.sizes)


def _best(options: list[Option | None], b: int) -> Option | None:
    real = [o for o in options if o is not None]
    return max(real, key=lambda o: o.tokens_per_ms(b)) if real else None


def verdict(curve: VerifyCurve, model: AcceptanceModel, trees: dict[int, SearchedTree], step: StepCost,
            max_depth: int | None = None) -> Verdict:
    """The verdict for one curve, from the searched trees (``search_trees``) of the model.

    Raises:
        ConfigError: a step cost not finite at the curve's B and a T it considers (`_option`).
    """
    b, sizes = curve.key.batch_size, curve.sizes
    span = range(max(1, sizes[0]), min(sizes[-1], MAX_SEARCH_NODES) + 1)
    best = _best([_option(curve, step, t, trees[t].expected, trees[t].choices) for t in span if t in trees], b)
    chain_t = [t for t in span if max_depth is None or t - 1 <= max_depth]
    chain = _best([_option(curve, step, t, chain_expected(t - 1, model), [(0,) * k for k in range(1, t)])
                   for t in chain_t], b)
    none = _option(curve, step, 1, 1.0, ())
    reason = "" if best else f"no searched tree size within measured T {', '.join(map(str, sizes))}"
    return Verdict(curve.key, best, chain, none, reason)


def plan(curves: dict[CurveKey, VerifyCurve], model: AcceptanceModel, step: StepCost | None = None,
         max_depth: int | None = None) -> list[Verdict]:
    """Verdicts for every curve, in key order (see the module docstring for the rate).

    Args:
        curves: verify curves, e.g. from ``load_curves``.
        model: the acceptance model.
        step: the rest of the step; None = 0 µs.
        max_depth: deepest draft token allowed in trees and chains, None for no limit.

    Raises:
        ConfigError: a step cost not finite at some curve's B and a T it considers (`_option`).
    """
    step = step or StepCost()
    top = min(MAX_SEARCH_NODES, max((c.sizes[-1] for c in curves.values()), default=1))
    trees = search_trees(model, top, max_depth)
    return [verdict(curves[k], model, trees, step, max_depth) for k in sorted(curves)]


def shape_text(choices) -> str:
    """Nodes per level of a tree: "d3: 3,4,2" (depth 3; 3 nodes at depth 1, ...); "root" for T = 1."""
    counts: dict[int, int] = defaultdict(int)
    for c in choices:
        counts[len(c)] += 1
    return f"d{max(counts)}: " + ",".join(str(counts[d]) for d in sorted(counts)) if counts else "root"


INTERPOLATED_NOTE = "~: verify us interpolated in T between the nearest measured tree sizes (cost assumed to depend on T only)"
HEADERS = ("backend", "B", "L", "config", "best T", "shape", "E", "verify us", "tok/ms",
           "chain T", "chain tok/ms", "none tok/ms")


def _cells(v: Verdict, config: bool) -> list[str]:
    k, b = v.key, v.key.batch_size
    cells = [k.backend, str(b), str(k.context_len)] + ([k.config] if config else [])
    if v.best is None:
        cells += ["-", v.reason, "-", "-", "-"]
    else:
        o = v.best
        cells += [str(o.size), shape_text(o.choices), f"{o.expected:.3f}",
                  f"{o.verify_us:.1f}" if o.measured else f"~{o.verify_us:.1f}", f"{o.tokens_per_ms(b):.1f}"]
    cells += [str(v.chain.size), f"{v.chain.tokens_per_ms(b):.1f}"] if v.chain else ["-", "-"]
    return cells + [f"{v.none.tokens_per_ms(b):.1f}" if v.none else "n/a (T=1 not measured)"]


def table_rows(verdicts: list[Verdict]) -> list[list[str]]:
    """Header then one row of cells per verdict (a config column only when curves differ in it)."""
    config = len({v.key.config for v in verdicts}) > 1
    return [[h for h in HEADERS if config or h != "config"]] + [_cells(v, config) for v in verdicts]


def format_table(verdicts: list[Verdict]) -> str:
    """The verdicts as a fixed-width text table (see ``table_rows``)."""
    rows = table_rows(verdicts)
    heads = rows[0]
    widths = [max(len(r[i]) for r in rows) for i in range(len(heads))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
    if any(v.best is not None and not v.best.measured for v in verdicts):
        text += f"\n{INTERPOLATED_NOTE}"
    return text


# ---- HTML for reports ---------------------------------------------------------------------------

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
W_PX, H_PX, PAD = 420, 240, 36


def _svg(curves: list[VerifyCurve], trees: dict[int, SearchedTree], title: str) -> str:
    """Inline SVG: E of the best tree (y) against its verify µs (x), one polyline per backend."""
    series: list[tuple[str, list[tuple[float, float]]]] = []
    for c in curves:
        pts: list[tuple[float, float]] = []
        for t in range(c.sizes[0], c.sizes[-1] + 1):
            us = c.lookup(t)[0]
            if t in trees and us is not None:
                pts.append((us, trees[t].expected))     # (verify µs, E) of the best T-node tree
        series.append((c.key.backend, pts))
    xs = [x for _, p in series for x, _ in p] or [0.0, 1.0]
    ys = [y for _, p in series for _, y in p] or [1.0, 2.0]
    x0, x1, y0, y1 = min(xs), max(xs) or 1.0, 1.0, max(ys)

    def sx(x: float) -> float:
        return PAD + (x - x0) / ((x1 - x0) or 1.0) * (W_PX - 2 * PAD)

    def sy(y: float) -> float:
        return H_PX - PAD - (y - y0) / ((y1 - y0) or 1.0) * (H_PX - 2 * PAD)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W_PX}" height="{H_PX}" role="img">',
             f'<title>{html.escape(title)}</title>',
             f'<text x="{PAD}" y="14" font-size="11">{html.escape(title)}</text>',
             f'<text x="{W_PX // 2}" y="{H_PX - 6}" font-size="10">verify us ({x0:.0f} to {x1:.0f})</text>',
             f'<text x="2" y="{PAD - 4}" font-size="10">E (1 to {y1:.2f})</text>']
    for i, (name, pts) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        line = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{line}"/>')
        parts.append(f'<text x="{W_PX - PAD - 90}" y="{PAD + 12 * i}" font-size="10" fill="{color}">'
                     f'{html.escape(name)}</text>')
    return "".join(parts) + "</svg>"


def speculation_section(rows: list[dict], model: AcceptanceModel, step: StepCost | None = None) -> str:
    """An HTML fragment for a report: E against verify µs per backend, then the verdict table.

    Args:
        rows: stored result rows (``treebench.harness.store.rows.read_rows``).
        model: the acceptance model.
        step: the rest of the step; None = 0 µs.

    Returns:
        A <section> element; a paragraph counts the rows no curve uses (`cost.left_out_note`), and one
        says so when no row is usable.

    Raises:
        ConfigError: a step cost not finite at some curve's B and a T it considers (`_option`).
    """
    from treebench.harness.speculation.cost import left_out_note, verify_curves

    curves = verify_curves(rows)
    left = left_out_note(rows, "this section")
    head = (f"<section class=\"speculation\"><h2>Speculation: accepted tokens per ms</h2><p>Acceptance model "
            f"{html.escape(model.name)} ({html.escape(model.kind)}): {html.escape(model.citation)}. Step cost "
            f"{html.escape(str(step or StepCost()))} us. tok/ms = B * E / (verify us + step us) * 1000.</p>"
            + (f"<p>{html.escape(left)}.</p>" if left else ""))
    if not curves:
        return head + "<p>No status=pass rows with one context length and one tree per batch.</p></section>"
    verdicts = plan(curves, model, step)
    top = min(MAX_SEARCH_NODES, max(c.sizes[-1] for c in curves.values()))
    trees = search_trees(model, top)
    groups: dict[tuple, list[VerifyCurve]] = defaultdict(list)
    for k, c in curves.items():
        groups[(k.batch_size, k.context_len, k.config)].append(c)
    figs = "".join(_svg(cs, trees, f"B {b}, L {ctx}, {cfg}") for (b, ctx, cfg), cs in sorted(groups.items()))
    table = table_rows(verdicts)
    header = "<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in table[0]) + "</tr>"
    cells = ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in table[1:]]
    note = (f"<p>{html.escape(INTERPOLATED_NOTE)}</p>"
            if any(v.best is not None and not v.best.measured for v in verdicts) else "")
    return head + f"<div>{figs}</div><table>{header}{''.join(cells)}</table>{note}</section>"
