"""Rendering of the regression gate's verdicts (`treebench.harness.analyze.gate`): Markdown and JUnit XML.

The Markdown summary (fit for `$GITHUB_STEP_SUMMARY`) opens with PASS or FAIL and the
failing counts (the newly failing and missing counts as the counts table and the log line give
them, saying why: `GateResult.kind_detail`), warns when nothing was compared, when baseline pairs
it ran are missing and when timings are noisy, counts the verdicts per kind, then gives one table
per kind in `KIND_TITLES` order (unchanged folded; pairs skipped in both runs for one reason folded
to one line per backend and reason). The JUnit XML holds one testcase per verdict: a failure for
what fails the gate, skipped for what was not compared.

The verdict kinds (`FAILING`, `KIND_TITLES`) and the verdicts themselves come from
`treebench.harness.analyze.gate`, which never imports this module.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from typing import cast

from treebench.harness.analyze.gate import FAILING, KIND_TITLES, GateResult, Verdict, ratio_bound
from treebench.harness.timing.stats import NOISE_RULE


def _fmt(x: float | None, spec: str) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _case_cells(v: Verdict) -> list[str]:
    c = v.case
    return [v.backend, str(c.get("batch_size", "")), str(c.get("context_len", "")), str(c.get("page_size", "")),
            str(c.get("tree", "")), f"`{v.case_id}`"]


def _md_table(verdicts: Sequence[Verdict], timed: bool, limit: int = 60) -> list[str]:
    head = ["backend", "B", "L", "P", "tree", "case"]
    head += ["baseline µs", "candidate µs", "ratio", "p"] if timed else []
    head += ["detail"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in verdicts[:limit]:
        cells = _case_cells(v)
        if timed:
            cells += [_fmt(v.base_median_us, ".2f"), _fmt(v.cand_median_us, ".2f"), _fmt(v.ratio, ".4f"),
                      _fmt(v.p_value, ".2g")]
        lines.append("| " + " | ".join(cells + [v.detail.replace("|", "\\|")]) + " |")
    if len(verdicts) > limit:
        lines.append(f"\n… and {len(verdicts) - limit} more")
    return lines


def _skipped_table(verdicts: Sequence[Verdict], limit: int = 60) -> list[str]:
    """The skipped pairs: those skipped in both runs for one reason are one line per
    (backend, reason) with their case count (a backend not installed on either side
    would otherwise fill the table); newly skipped pairs keep a line each."""
    groups: dict[tuple[str, str], list[Verdict]] = {}
    single = []
    for v in verdicts:
        if v.base_status == "skipped":          # skipped in both runs (classify's detail says so)
            groups.setdefault((v.backend, v.detail), []).append(v)
        else:
            single.append(v)
    lines = ["| backend | B | L | P | tree | case | detail |", "|---|---|---|---|---|---|---|"]
    for (backend, detail), vs in groups.items():
        cases = f"`{vs[0].case_id}`" if len(vs) == 1 else f"{len(vs)} cases"
        lines.append("| " + " | ".join([backend, "", "", "", "", cases, detail.replace("|", "\\|")]) + " |")
    return lines + _md_table(single, False, limit)[2:]


def markdown(result: GateResult, baseline: str = "baseline", candidate: str = "candidate") -> str:
    """The gate's Markdown summary (headline, counts, one table per kind; unchanged folded)."""

    cfg, counts = result.config, result.counts()
    fails = ", ".join(f"{counts.get(k, 0)} {KIND_TITLES[k].split(' (')[0].lower()}"
                      + (f" {d}" if (d := result.kind_detail(k)) else "") for k in FAILING)
    missing = sum(v.kind == "missing" and v.failed for v in result.verdicts)   # not those the baseline skipped
    detail = result.missing_detail()   # which missing pairs are only listed, where some are
    if not cfg.allow_missing or counts.get("missing"):
        fails += f", {counts.get('missing', 0)} missing" + (f" {detail}" if detail else "")
    head = "❌ FAIL" if result.failed else "✅ PASS"
    if result.comparable == 0:
        fails += ", nothing compared"
    out = [f"## treebench gate: {head} ({fails})", ""]
    if result.comparable == 0:
        what = result.counts_text() or "no rows"
        unlike = Counter(v.detail for v in result.verdicts if v.timed_unlike)
        why = (f"; the runs were timed differently ({', '.join(f'{n} x {d}' for d, n in unlike.most_common(3))}): "
               "compare runs made with the same --timer and --l2" if unlike else
               "; check that both runs cover the same cases and backends with enough samples")
        out += [f"**Nothing was compared:** no (case, backend) pair of the baseline could be compared with the "
                f"candidate ({what}){why}.", ""]
    if missing:
        others = f" ({counts['missing'] - missing} more only listed: see the table)" if detail else ""
        out += [f"**{missing} baseline pair(s) missing from the candidate** fail the gate{others}; "
                "pass --allow-missing to accept a partial candidate.", ""]
    noisy = [v for v in result.verdicts if v.noisy]
    if noisy:
        out += [f"⚠ **{len(noisy)} comparison(s) involve noisy timings** ({NOISE_RULE}); their verdicts are less "
                "reliable (see the detail column).", ""]
    out += [f"Baseline `{baseline}` vs candidate `{candidate}`: slower means median ratio > "
            f"{ratio_bound(cfg.threshold)} and one-sided Mann–Whitney U p < {cfg.alpha:g}.", "",
            "| verdict | count |", "|---|---|",
            *[f"| {KIND_TITLES[k]} | {n}{f' {d}' if (d := result.kind_detail(k)) else ''} |" for k, n in counts.items()]]
    if result.env_notes:
        out += ["", "**Env differences (allowed):** " + "; ".join(result.env_notes)]
    for kind, title in KIND_TITLES.items():
        vs = result.of_kind(kind)
        if not vs:
            continue
        timed = kind in ("slower", "faster", "unchanged", "incomparable")
        table = _skipped_table(vs) if kind == "skipped" else _md_table(vs, timed)
        if kind == "unchanged":
            out += ["", f"<details><summary>{title} ({len(vs)})</summary>", "", *table, "", "</details>"]
        else:
            out += ["", f"### {title} ({len(vs)})", "", *table]
    return "\n".join(out) + "\n"


def _passed(v: Verdict) -> bool:
    """A testcase that passes: compared and not failing, or new (no baseline to compare) and passing."""
    return not v.failed and (v.kind in ("unchanged", "faster", "fixed") or v.kind == "new" and v.cand_status == "pass")


def junit_xml(result: GateResult) -> str:
    """JUnit XML: one testcase per verdict, so per (case, backend) and per extra timing of
    one (named "case [timing]"); failure for what fails the gate, a plain (passing) testcase for a
    compared pair that does not and a new pair that passes, skipped for everything else."""
    suite = ET.Element("testsuite", name="treebench.gate", tests=str(len(result.verdicts)),
                       failures=str(sum(v.failed for v in result.verdicts)),
                       skipped=str(sum(not v.failed and not _passed(v) for v in result.verdicts)))
    for v in result.verdicts:
        tc = ET.SubElement(suite, "testcase", classname=f"treebench.{v.backend}",
                           name=f"{v.case_id} [{v.timing}]" if v.timing else v.case_id)
        numbers = [f"{name} {_fmt(x, spec)}" for name, x, spec in (("ratio", v.ratio, ".4f"), ("p", v.p_value, ".2g"))
                   if x is not None]
        msg = f"{v.kind}: {' '.join([*numbers, v.detail]).strip()}".rstrip(": ")
        if v.failed:
            ET.SubElement(tc, "failure", type=v.kind, message=msg)
        elif not _passed(v):
            ET.SubElement(tc, "skipped", message=msg)
        else:
            ET.SubElement(tc, "system-out").text = msg
    return ET.tostring(cast(ET.Element, ET.ElementTree(suite).getroot()), encoding="unicode",
                       xml_declaration=True) + "\n"
