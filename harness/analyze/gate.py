"""The regression gate's verdicts: what changed between two result sets, pair by pair.

Per (case, backend), after asv's ``compare.py``: a candidate is *slower* only
when the ratio of medians (candidate / baseline) exceeds 1 + threshold (5% by
default) AND a one-sided Mann-Whitney U test on the raw samples agrees
(p < alpha, 0.01 by default; `scipy.stats.mannwhitneyu`, run only for pairs whose
ratio is beyond the threshold, as only those can change verdict, and batched: pairs of
equal sample counts share one 2-D call, `treebench.harness.timing.stats.mannwhitney_pvalues`).
Either alone is not enough: with hundreds of samples the test finds 1% drifts significant, and a
ratio alone flags noise. A case that passed and now mismatches or errors is a
*correctness loss* and always fails, as does a mismatch or an error where the baseline skipped or
lacks the pair (*newly failing*: a kernel wrong from its first row must not pass; `--allow-missing`,
which concerns baseline pairs the candidate lacks, does not touch it). New, missing, fixed, skipped, still
failing and incomparable (different timers or L2 states, too few samples) cases are
reported apart and do not fail the gate, except: a baseline (case, backend)
the candidate lacks ("missing") fails unless `--allow-missing` or the baseline
skipped it (a pair it could not run has nothing to regress from), and a
comparison where no (case, backend) pair could be compared at all fails.
A pair that both runs hold timed in several ways (merged files of `--l2 cold`
and `--l2 warm` runs, say) is compared once per timing they share.
Timings whose spread is high (CV > 0.1 or IQR/median > 0.2,
`treebench.harness.timing.stats.is_noisy`) are flagged "noisy" in the Markdown.

Env fingerprints (GPU, SM count, driver, CUDA, torch, triton, xformers,
flashinfer) must match (`gate_inputs.env_differences` lists what differs), else the
comparison is refused unless `--allow-env-mismatch`. This module holds the verdict kinds
(`KIND_TITLES`, `FAILING`) and the comparison, pure functions over rows;
`treebench.harness.analyze.gate_render` draws the Markdown and the JUnit XML, and
`treebench.harness.cli.gate` is `treebench gate` (reading files, exit codes).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from treebench.harness.analyze.gate_inputs import EnvDifference
from treebench.harness.errors import ConfigError
from treebench.harness.store.rows import row_l2_flushed, timing_key, timing_label
from treebench.harness.store.validate import latest_rows
from treebench.harness.timing.stats import NOISE_RULE, is_noisy, mannwhitney_pvalues

FAILING = ("slower", "correctness_loss", "newly_failing")  # the kinds that fail the gate
KIND_TITLES = {  # every verdict kind with its title, in the summary's display order
    "correctness_loss": "Correctness lost (fails the gate)",
    "newly_failing": "Newly failing (fails the gate: mismatch or error where the baseline skipped or lacks the pair)",
    "slower": "Slower (fails the gate)",
    "faster": "Faster",
    "fixed": "Fixed",
    "new": "New",
    "missing": "Missing from the candidate (fails the gate unless --allow-missing or skipped in the baseline)",
    "skipped": "Skipped in the candidate (each line says whether the baseline skipped it too)",
    "still_failing": "Still failing",
    "incomparable": "Incomparable",
    "unchanged": "Unchanged",
}
COMPARED = ("correctness_loss", "slower", "faster", "fixed", "still_failing", "unchanged")
BAD = ("mismatch", "error")
NEW_FAILURE_WHY = {False: "skipped in the baseline", True: "not in the baseline"}   # keyed by: no baseline row


@dataclass(frozen=True)
class GateConfig:
    """Thresholds of the gate."""

    threshold: float = 0.05   # slower when candidate / baseline median > 1 + threshold
    alpha: float = 0.01       # ... and the one-sided Mann-Whitney U p-value < alpha
    min_samples: int = 5      # fewer samples on either side: incomparable
    allow_missing: bool = False  # a baseline pair the candidate lacks does not fail the gate

    def __post_init__(self) -> None:
        if not 0 < self.threshold < 10:
            raise ConfigError(f"gate --threshold {self.threshold!r}: must lie between 0 and 10 (1000%); give a "
                              "fraction such as 0.05 (or 5%)")
        if not 0 < self.alpha < 1:
            raise ConfigError(f"gate --alpha {self.alpha}: must lie in (0, 1), e.g. 0.01")
        if self.min_samples < 2:
            raise ConfigError(f"gate --min-samples {self.min_samples}: must be >= 2")


def ratio_bound(threshold: float) -> str:
    """1 + threshold as the gate prints it, every digit of the threshold kept: 0.999 -> '1.999',
    0.12345 -> '1.12345', 9.99 -> '10.99' (the exact sum of 1 and the shortest decimal that reads back
    as `threshold`); below 1e-9, '1 + 1e-12' (the sum would be a row of zeros)."""
    if threshold < 1e-9:
        return f"1 + {threshold!r}"
    text = f"{Decimal(1) + Decimal(repr(threshold)):f}"   # at most 9 + 17 digits: exact in Decimal's 28
    return text.rstrip("0").rstrip(".") if "." in text else text


@dataclass(frozen=True)
class Verdict:
    """What the gate found for one (case, backend)."""

    case_id: str
    backend: str
    kind: str                              # a key of KIND_TITLES
    case: dict = field(default_factory=dict)  # the case axes (for display)
    base_status: str | None = None
    cand_status: str | None = None
    base_median_us: float | None = None
    cand_median_us: float | None = None
    ratio: float | None = None             # candidate median / baseline median
    p_value: float | None = None           # one-sided Mann-Whitney U, in the ratio's direction; None within
                                           # the threshold (the test cannot change that verdict, so it is not run)
    detail: str = ""                       # one line: reason, error, or why incomparable
    blocking: bool = False                 # fails the gate although its kind alone does not (missing)
    noisy: bool = False                    # a timed side has high spread (treebench.harness.timing.stats.is_noisy)
    timed_unlike: bool = False             # incomparable because the rows were timed differently
    timing: str = ""                       # set on a pair's extra verdict for another timing (compare_runs)

    @property
    def failed(self) -> bool:
        return self.kind in FAILING or self.blocking


@dataclass(frozen=True)
class GateResult:
    """All verdicts of one comparison."""

    verdicts: tuple[Verdict, ...]
    config: GateConfig
    env_notes: tuple[str, ...] = ()        # env differences that were allowed
    env_missing: tuple[str, ...] = ()      # env files missing beside their rows: those fingerprints not compared
    env_fields: tuple[EnvDifference, ...] = ()  # env fields whose values differ (allowed), for the report page

    @property
    def comparable(self) -> int:
        """How many (case, backend) pairs were actually compared (timing or correctness)."""
        return sum(v.kind in COMPARED for v in self.verdicts)

    @property
    def failed(self) -> bool:
        return any(v.failed for v in self.verdicts) or self.comparable == 0

    def of_kind(self, kind: str) -> list[Verdict]:
        return [v for v in self.verdicts if v.kind == kind]

    def counts(self) -> dict[str, int]:
        n = Counter(v.kind for v in self.verdicts)
        return {k: n[k] for k in KIND_TITLES if n[k]}

    def missing_detail(self) -> str:
        """Which missing pairs fail the gate, where some do not ('' where all do, or none is missing):
        '(0 failing; 1 listed only: skipped in the baseline)', '(1 failing; 3 listed only: 1 skipped in
        the baseline, 2 allowed by --allow-missing)'. The headline, the counts table and the log line
        all write the missing count followed by this."""
        missing = self.of_kind("missing")
        why = Counter("skipped in the baseline" if v.base_status == "skipped" else "allowed by --allow-missing"
                      for v in missing if not v.failed)
        listed = sum(why.values())
        if not listed:
            return ""
        reasons = ", ".join(f"{n} {w}" for w, n in why.items()) if len(why) > 1 else next(iter(why))
        return f"({len(missing) - listed} failing; {listed} listed only: {reasons})"

    def failing_detail(self) -> str:
        """Why the newly failing pairs fail, '(skipped in the baseline)', '(1 skipped in the baseline,
        2 not in the baseline)'; '' where there is none."""
        why = Counter(NEW_FAILURE_WHY[v.base_status is None] for v in self.of_kind("newly_failing"))
        if len(why) < 2:
            return f"({next(iter(why))})" if why else ""
        return f"({', '.join(f'{n} {w}' for w, n in why.items())})"

    def kind_detail(self, kind: str) -> str:
        """What follows `kind`'s count in the headline, the counts table and the log line."""
        return {"missing": self.missing_detail, "newly_failing": self.failing_detail}.get(kind, str)()

    def counts_text(self) -> str:
        """Each kind's count, '1 newly failing (skipped in the baseline), 1 missing (0 failing; ...),
        3 unchanged' (`kind_detail`)."""
        return ", ".join(f"{n} {k.replace('_', ' ')}" + (f" {d}" if (d := self.kind_detail(k)) else "")
                         for k, n in self.counts().items())


# ---- comparison (pure) -----------------------------------------------------------------------

def compare_runs(base_rows: Iterable[dict], cand_rows: Iterable[dict], config: GateConfig = GateConfig(),
                 env_notes: Sequence[str] = ()) -> GateResult:
    """Verdicts for every (case, backend) in either result set, sorted by backend then case axes.

    Each side's latest row per pair is compared, except that when the candidate holds a pair
    timed in several ways (say a merged file of `--l2 cold` and `--l2 warm` runs) and its
    latest row passed, its latest passing row timed like the baseline's (`store.timing_key`)
    is taken. A candidate whose latest row mismatched, errored or skipped is judged by that
    row, whatever an older row says. When the baseline too holds a pair timed in several
    ways and both runs' latest rows passed, each other timing that both runs hold, passing,
    is compared as well, row against row timed alike: one more verdict per timing, whose
    `timing` (and that of the pair's first verdict) names it."""
    base_list, cand_list = list(base_rows), list(cand_rows)
    base, base_alike = latest_rows(base_list), latest_rows(base_list, by_timing=True)
    cand, alike = latest_rows(cand_list), latest_rows(cand_list, by_timing=True)

    def passed(row: dict | None) -> bool:
        return row is not None and row.get("status") == "pass"

    def cand_for(k: tuple[str, str]) -> dict | None:
        match = alike.get((*k, *timing_key(base[k]))) if k in base else None
        return match if passed(match) and passed(cand.get(k)) else cand.get(k)
    pairs = {k: (base.get(k), cand_for(k)) for k in set(base) | set(cand)}
    extra = []
    for key, b in base_alike.items():          # the baseline's other timings of a pair
        k, timing = key[:2], key[2:]
        if (timing[0] is None or not (passed(base.get(k)) and passed(cand.get(k))) or timing == timing_key(base[k])
                or not (passed(b) and passed(alike.get(key)))):
            continue                           # untimed, a pair that failed, the pair's first verdict, or none alike
        extra.append((b, alike[key]))
    p_values = significance_tests([*pairs.values(), *extra], config)
    verdicts = {k: classify(b, c, config, p_values) for k, (b, c) in pairs.items()}
    extra_verdicts = [_with_timing(classify(b, c, config, p_values), b) for b, c in extra]
    for k in {(v.case_id, v.backend) for v in extra_verdicts}:   # name the timing of a pair's first verdict too
        verdicts[k] = _with_timing(verdicts[k], base[k])
    found = [*verdicts.values(), *extra_verdicts]
    found = [_missing_rule(v, config) if v.kind == "missing" and v.base_status != "skipped" else v for v in found]
    return GateResult(tuple(sorted(found, key=_order)), config, tuple(env_notes))


def _missing_rule(v: Verdict, config: GateConfig) -> Verdict:
    """A missing pair the baseline ran: failing, or with `allow_missing` saying it is allowed."""
    if config.allow_missing:
        return dataclasses.replace(v, detail=f"{v.detail}; allowed by --allow-missing, so it does not fail the gate")
    return dataclasses.replace(v, blocking=True)


def significance_tests(pairs: Iterable[tuple[dict | None, dict | None]], config: GateConfig) -> dict[tuple, float]:
    """The one-sided Mann-Whitney U p-value of every (baseline, candidate) row pair whose verdict hangs
    on it (both passed, timed alike, enough samples, median ratio past the threshold), keyed by
    (id(baseline row), id(candidate row)) for `classify`; computed in a few batched scipy calls
    (`treebench.harness.timing.stats.mannwhitney_pvalues`), equal to one call per pair."""
    tests = {(id(b), id(c)): t for b, c in pairs if b is not None and c is not None
             and (t := _test_of(b, c, config)) is not None}
    return dict(zip(tests, mannwhitney_pvalues(list(tests.values()))))


def _with_timing(v: Verdict, base_row: dict) -> Verdict:
    """v with `timing` set to how base_row was timed, and its detail starting with it."""
    label = timing_label(base_row) or ""
    return dataclasses.replace(v, timing=label, detail=f"{label}: {v.detail}" if v.detail else label)


def _order(v: Verdict) -> tuple:
    """Sort key: backend, then B, L (numbers where they are numbers), tree, then P as a
    number (so a cell's P 16 row comes before its P 128 row, next to it)."""
    c = v.case
    num = [x if isinstance(x, int) else math.inf for x in (c.get("batch_size"), c.get("context_len"))]
    page = c.get("page_size")
    return (v.backend, *num, str(c.get("context_len")), str(c.get("tree")),
            page if isinstance(page, int) else math.inf, v.case_id, v.timing)


def classify(base: dict | None, cand: dict | None, config: GateConfig,
             p_values: Mapping[tuple, float] | None = None) -> Verdict:
    """The verdict for one (case, backend) from its baseline and candidate rows (either may be None);
    `p_values` are the Mann-Whitney tests already run (`significance_tests`), any other is run here."""
    some = cand or base
    assert some is not None, "classify needs a baseline or a candidate row"
    v = {"case_id": some["case_id"], "backend": some["backend"], "case": some.get("case") or {},
         "base_status": base and base["status"], "cand_status": cand and cand["status"]}
    if base is None:
        assert cand is not None
        if cand["status"] in BAD:
            return Verdict(kind="newly_failing", detail=_new_failure_line(cand, None), **v)
        return Verdict(kind="new", detail=_status_line(cand), **v)
    if cand is None:
        was = (f"skipped: {base.get('reason') or ''}; nothing to regress from, so it does not fail the gate"
               if base["status"] == "skipped" else base["status"])
        return Verdict(kind="missing", detail=f"baseline was {was}", **v)
    bs, cs = base["status"], cand["status"]
    if bs == "pass" and cs in BAD:
        return Verdict(kind="correctness_loss", detail=_status_line(cand), **v)
    if cs == "skipped":
        was = "skipped in both" if bs == "skipped" else f"newly skipped (baseline was {bs})"
        return Verdict(kind="skipped", detail=f"{was}: {cand.get('reason') or ''}", **v)
    if bs in BAD and cs == "pass":
        return Verdict(kind="fixed", detail=f"baseline was {_status_line(base)}", **v)
    if bs == "skipped" and cs in BAD:
        return Verdict(kind="newly_failing", detail=_new_failure_line(cand, base), **v)
    if bs == "skipped":
        return Verdict(kind="new", detail=f"{_status_line(cand)} (baseline skipped: {base.get('reason')})", **v)
    if cs in BAD:
        return Verdict(kind="still_failing", detail=_status_line(cand), **v)
    return timing_verdict(base, cand, config, v, p_values)


def _status_line(row: dict) -> str:
    """'status: reason' of a row (just the status when there is no reason)."""
    reason = row.get("reason")
    return f"{row['status']}: {reason}" if reason else row["status"]


def _new_failure_line(cand: dict, base: dict | None) -> str:
    """'mismatch (skipped in the baseline): <reason> (baseline skipped: <its reason>)' or 'error (not in
    the baseline): <reason>': the candidate's status first."""
    line = f"{cand['status']} ({NEW_FAILURE_WHY[base is None]})" + (f": {cand['reason']}" if cand.get("reason") else "")
    return line if base is None else f"{line} (baseline skipped: {base.get('reason')})"


def timing_verdict(base: dict, cand: dict, config: GateConfig, v: dict,
                   p_values: Mapping[tuple, float] | None = None) -> Verdict:
    """slower / faster / unchanged / incomparable for two passing rows."""
    bm, cm = base.get("median_us"), cand.get("median_us")
    if not bm or not cm:
        where = "on either side (check rows; both pass)" if not bm and not cm else \
            ("in the baseline" if not bm else "in the candidate")
        return Verdict(kind="incomparable", detail=f"not timed {where}", **v)
    noisy = [side for side, r in (("baseline", base), ("candidate", cand)) if is_noisy(r)]
    v = {**v, "base_median_us": bm, "cand_median_us": cm, "ratio": cm / bm, "noisy": bool(noisy)}
    verdict = _timing_kind(base, cand, config, v, p_values or {})
    if noisy:
        note = f"noisy {' and '.join(noisy)} timing ({NOISE_RULE})"
        verdict = dataclasses.replace(verdict, detail=f"{verdict.detail}; {note}" if verdict.detail else note)
    return verdict


def _timing_kind(base: dict, cand: dict, config: GateConfig, v: dict, p_values: Mapping[tuple, float]) -> Verdict:
    bm, cm = base["median_us"], cand["median_us"]
    unlike = _unlike_timing(base, cand)
    if unlike:
        return Verdict(kind="incomparable", detail=unlike, timed_unlike=True, **v)
    bs, cs = base.get("samples_us") or [], cand.get("samples_us") or []
    if min(len(bs), len(cs)) < config.min_samples:
        return Verdict(kind="incomparable", detail=f"fewer than {config.min_samples} samples "
                       f"({len(bs)} vs {len(cs)})", **v)
    ratio, up = cm / bm, 1 + config.threshold
    if 1 / up <= ratio <= up:   # unchanged whatever the test says: not run (it is most of a large gate's time)
        return Verdict(kind="unchanged", **v)
    key = (id(base), id(cand))
    p = p_values[key] if key in p_values else mannwhitney_pvalues([(cs, bs, "greater" if ratio >= 1 else "less")])[0]
    v["p_value"] = p
    if ratio > up and p < config.alpha:
        return Verdict(kind="slower", **v)
    if ratio < 1 / up and p < config.alpha:
        return Verdict(kind="faster", **v)
    return Verdict(kind="unchanged", detail=f"ratio beyond threshold but p = {p:.2g}", **v)


def _test_of(base: dict, cand: dict, config: GateConfig) -> tuple[list, list, str] | None:
    """(candidate samples, baseline samples, alternative) when the verdict of two rows hangs on the
    Mann-Whitney test (as `_timing_kind` decides), else None."""
    if base.get("status") != "pass" or cand.get("status") != "pass":
        return None
    bm, cm = base.get("median_us"), cand.get("median_us")
    bs, cs = base.get("samples_us") or [], cand.get("samples_us") or []
    if not bm or not cm or _unlike_timing(base, cand) or min(len(bs), len(cs)) < config.min_samples:
        return None
    ratio, up = cm / bm, 1 + config.threshold
    return None if 1 / up <= ratio <= up else (cs, bs, "greater" if ratio >= 1 else "less")


def _unlike_timing(base: dict, cand: dict) -> str:
    """'timer cuda_graph vs cuda_event', 'L2 flushed vs warm' (both, '; '-joined), or '' when the two
    rows were timed alike. Rows without `l2_flushed` count as flushed on a GPU (`row_l2_flushed`)."""
    bl, cl = row_l2_flushed(base), row_l2_flushed(cand)
    words = {True: "flushed", False: "warm", None: "not recorded"}
    what = [f"timer {base.get('timer')} vs {cand.get('timer')}"] if base.get("timer") != cand.get("timer") else []
    what += [f"L2 {words[bl]} vs {words[cl]}"] if bl != cl else []
    return "; ".join(what)
