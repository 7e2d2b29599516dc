"""Verify cost from measured result rows, and the rest of the model's step.

``verify_curves`` turns stored result rows (``load_curves`` reads them as the gate does) into,
for each backend, B, L and the other case axes, the tree-attention time
median_us as a function of T. Only rows with status "pass", one fixed context
length (no ``ragged:``) and one tree for every request (tree_per_request
"same") count. Rows of one curve at the same T (reruns, or trees of the same
size and different shape) are folded into the median of their median_us: the
curve treats the verify time as a function of T alone. Between measured sizes
the time is interpolated linearly in T; outside them there is no answer
(never extrapolated).

``StepCost`` is the rest of a decoding step (the other layers, the draft):
a + b * tokens µs, tokens = B * T query tokens in the verify batch.
"""

from __future__ import annotations

import math
import re
import statistics
from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass, field

from treebench.harness.errors import ConfigError
from treebench.harness.store.rows import timing_label
from treebench.harness.store.validate import read_checked_rows
from treebench.harness.model.tree_specs import parse_tree

__all__ = ["CurveKey", "VerifyCurve", "StepCost", "parse_step_us", "verify_curves", "left_out_note", "load_curves"]


@dataclass(frozen=True, order=True)
class CurveKey:
    """What one verify curve was measured on.

    Attributes:
        backend: the backend's registry name.
        batch_size: B.
        context_len: L (every request's).
        config: the other axes and the timing, e.g. "H32x8 D128 P16 bfloat16 shuffled, cuda_graph, L2 flushed".
    """

    backend: str
    batch_size: int
    context_len: int
    config: str


@dataclass(frozen=True)
class VerifyCurve:
    """Verify time against tree size for one CurveKey.

    Attributes:
        key: what was measured.
        points: ((T, median_us), ...) sorted by T, T = nodes per request including the root.
    """

    key: CurveKey
    points: tuple[tuple[int, float], ...]

    @property
    def sizes(self) -> list[int]:
        """The measured T, ascending."""
        return [t for t, _ in self.points]

    def lookup(self, t: int) -> tuple[float | None, str]:
        """Verify time at tree size `t`, interpolated linearly between the nearest measured sizes.

        Returns:
            (median_us, "") inside the measured range; (None, reason) outside it, reason =
            "no measurement at T=.. for backend .. at B .., L ..; measured T: ..".
        """
        ts = self.sizes
        if not ts or t < ts[0] or t > ts[-1]:
            k = self.key
            return None, (f"no measurement at T={t} for backend {k.backend} at B {k.batch_size}, L {k.context_len}; "
                          f"measured T: {', '.join(map(str, ts))}")
        i = bisect_left(ts, t)
        if ts[i] == t:
            return self.points[i][1], ""
        (t0, y0), (t1, y1) = self.points[i - 1], self.points[i]
        return y0 + (y1 - y0) * (t - t0) / (t1 - t0), ""


@dataclass(frozen=True)
class StepCost:
    """The rest of a decoding step: fixed_us + per_token_us * tokens µs, tokens = B * T.

    Attributes:
        fixed_us: µs per step whatever the batch (a in a + b*tokens).
        per_token_us: µs per query token in the verify batch (b).
        given: the --step-us text it was read from, as the user wrote it ("" for one built in code): what a line
            refusing it quotes (`shown`); not part of its value.
    """

    fixed_us: float = 0.0
    per_token_us: float = 0.0
    given: str = field(default="", compare=False)

    def us(self, batch_size: int, tree_size: int) -> float:
        """Step cost in µs for B requests of T tree nodes each."""
        return self.fixed_us + self.per_token_us * batch_size * tree_size

    def __str__(self) -> str:
        return f"{self.fixed_us:g}+{self.per_token_us:g}*tokens" if self.per_token_us else f"{self.fixed_us:g}"

    @property
    def shown(self) -> str:
        """How a line refusing it names it: "--step-us '2e3 + 0.5*tokens'", the user's own text (its
        normalised form, for one built in code)."""
        return f"--step-us {self.given or str(self)!r}"


_NUMBER = r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"   # ASCII digits, no '_', as every numeric option


def parse_step_us(text: str) -> StepCost:
    """Parses --step-us: "2000" (fixed µs), "2000+0.5*tokens", "0.5*tokens" (tokens = B * T).

    Raises:
        ConfigError: anything else (a number in other than ASCII digits 0-9, such as '1_0' or '５'), or a number
            or a sum of two terms (1e308+1e308) that is not finite (a cost finite here may not be at some B and T,
            1e308*tokens at 2 tokens: the plan refuses it there, quoting `text`: StepCost.given).
    """
    hint = f"--step-us {text!r}: write µs per step, e.g. 2000, or a+b*tokens, e.g. 2000+0.5*tokens (tokens = B*T)"
    fixed, per_token = 0.0, 0.0
    terms = text.replace(" ", "").split("+") if text.strip() else []
    if not terms or len(terms) > 2:
        raise ConfigError(hint)
    for term in terms:
        m = re.fullmatch(rf"({_NUMBER})(\*tokens)?|tokens\*({_NUMBER})", term)
        if m is None:
            raise ConfigError(hint)
        value = float(m.group(1) or m.group(4))
        if not math.isfinite(value):
            raise ConfigError(hint)
        if m.group(3) or m.group(4):
            per_token += value
        else:
            fixed += value
    if not (math.isfinite(fixed) and math.isfinite(per_token)):
        raise ConfigError(f"--step-us {text!r}: its terms add up to more µs than a float holds; "
                          "give a smaller step time")
    return StepCost(fixed, per_token, text)


def _left_out(row: dict) -> tuple[str, str] | None:
    """Why no curve may use `row`, as (reason, the value that shows it, or ""), e.g. ("a context of several
    lengths", "ragged:16-2048"); None for a row a curve may use."""
    case, us = row.get("case"), row.get("median_us")
    if row.get("status") != "pass":
        return "status other than pass", str(row.get("status"))
    if us is None:
        return "untimed (as check's rows)", ""
    if not isinstance(case, dict):
        return "no case", ""
    ctx = case.get("context_len")
    if not isinstance(ctx, int) or isinstance(ctx, bool):
        return "a context of several lengths", str(ctx)
    if case.get("tree_per_request", "same") != "same":
        return "a tree per request", f"tree_per_request {case.get('tree_per_request')}"
    sizes = row.get("tree_sizes")
    if isinstance(sizes, list) and len(set(sizes)) > 1:
        return "trees of several sizes in a batch", ""
    if not isinstance(us, (int, float)) or not (math.isfinite(us) and us > 0):
        return "no positive median_us", repr(us)
    return None


def _usable(row: dict) -> tuple[CurveKey, int, float] | None:
    """(key, T, median_us) of a row a curve may use, None for any other row (`_left_out` says why)."""
    if _left_out(row) is not None:
        return None
    case, us = row["case"], float(row["median_us"])
    sizes = row.get("tree_sizes")
    t = int(sizes[0]) if isinstance(sizes, list) and sizes else parse_tree(str(case.get("tree", ""))).size
    config = (f"H{case.get('num_q_heads')}x{case.get('num_kv_heads')} D{case.get('head_dim')} "
              f"P{case.get('page_size')} {case.get('dtype')} {case.get('layout')}, {timing_label(row)}")
    return CurveKey(str(row.get("backend")), int(case.get("batch_size", 0)), case["context_len"], config), t, us


def verify_curves(rows: list[dict]) -> dict[CurveKey, VerifyCurve]:
    """Verify curves from result rows (see the module docstring for which rows count).

    Returns:
        CurveKey -> VerifyCurve, sorted by key; empty when no row counts.
    """
    samples: dict[CurveKey, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        got = _usable(row)
        if got is not None:
            key, t, us = got
            samples[key][t].append(us)
    return {k: VerifyCurve(k, tuple((t, statistics.median(v)) for t, v in sorted(samples[k].items())))
            for k in sorted(samples)}


NOTE_VALUES = 3   # values a left-out note shows per reason, then "... (N more)"


def left_out_note(rows: list[dict], command: str = "plan", of_all: bool = False) -> str:
    """One line counting the rows no verify curve uses, by reason, with the values that show it: "12 rows
    left out: a context of several lengths (ragged:1-48); plan reads timed status=pass rows of one context
    length and one tree size per batch" ("all 12 rows left out: ..." where `of_all`: none is used); "" when
    every row is used."""
    found: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))   # reason -> value -> rows
    for row in rows:
        why = _left_out(row)
        if why is not None:
            found[why[0]][why[1]] += 1
    if not found:
        return ""
    parts = []
    for reason, values in sorted(found.items(), key=lambda kv: (-sum(kv[1].values()), kv[0])):
        shown = sorted(v for v in values if v)
        more = f", ... ({len(shown) - NOTE_VALUES} more)" if len(shown) > NOTE_VALUES else ""
        what = f" ({', '.join(shown[:NOTE_VALUES])}{more})" if shown else ""
        parts.append(f"{sum(values.values()) if len(found) > 1 else ''} {reason}{what}".lstrip())
    total = sum(sum(v.values()) for v in found.values())
    counted = f"{total} row{'' if total == 1 else 's'}"
    if of_all:   # none is used
        counted = f"all {counted}" if total > 1 else "its one row"
    return (f"{counted} left out: {', '.join(parts)}; {command} reads timed status=pass rows of one context "
            "length and one tree size per batch")


def load_curves(paths: list[str], command: str = "plan") -> tuple[dict[CurveKey, VerifyCurve], list[dict]]:
    """Reads result files (or folders of them) as gate, report and merge read them
    (``treebench.harness.store.validate.read_checked_rows``: every field checked, a row read twice
    kept once, a warning for a file another run is still writing) and builds their verify curves.

    Returns:
        (the curves, the rows read: `left_out_note` counts those the curves leave out).

    Raises:
        ConfigError: a path is missing, unreadable or not a results file, a row fails validation
            (named by file and line, with `command`), or no row is usable: the line counts the rows left out
            by reason (`left_out_note`: every row untimed, as check's, among them).
    """
    rows = read_checked_rows(paths, command)
    curves = verify_curves(rows)
    given = f"{command} --results {' '.join(map(str, paths))}"
    if not rows:
        raise ConfigError(f"{given}: no result rows; give result files written by treebench run")
    if not curves:
        raise ConfigError(f"{given}: {left_out_note(rows, command, of_all=True)}; give result files written by "
                          "treebench run")
    return curves, rows
