"""Statistics of timing samples: median, quartiles, CV (all samples kept).

The timing function (`treebench.harness.timing.timers.time_callable`) returns raw per-iteration
samples; everything derived from them is computed here, from the samples alone,
so a stored row can always be re-summarised. Nothing is dropped: no outlier
rejection, no trimming (asv keeps every sample; tritonbench's `Latency` drops
them, which hides bimodal kernels).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class SampleStats:
    """Summary of one set of timing samples (microseconds)."""

    n: int              # number of samples
    median_us: float    # 50th percentile
    p25_us: float       # 25th percentile (linear interpolation, numpy's default)
    p75_us: float       # 75th percentile
    mean_us: float      # arithmetic mean
    std_us: float       # sample standard deviation (ddof=1; 0.0 for n == 1)
    cv: float           # coefficient of variation std / mean (0.0 for n == 1)
    min_us: float       # fastest sample
    max_us: float       # slowest sample

    @property
    def iqr_us(self) -> float:
        """Interquartile range p75 - p25."""
        return self.p75_us - self.p25_us

    def as_dict(self) -> dict:
        return asdict(self)


def summarize(samples_us: Sequence[float]) -> SampleStats:
    """Median, quartiles, mean, std and CV of `samples_us`.

    Args:
        samples_us: per-iteration times in microseconds, any order, at least one.

    Raises:
        ValueError: no samples, or a sample that is not a finite number >= 0.
    """
    a = np.asarray(samples_us, dtype=np.float64)        # (n,)
    if a.size == 0:
        raise ValueError("no timing samples to summarise")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError("timing samples must be finite and >= 0")
    p25, med, p75 = np.percentile(a, [25, 50, 75])
    mean = float(a.mean())
    std = float(a.std(ddof=1)) if a.size > 1 else 0.0
    return SampleStats(n=int(a.size), median_us=float(med), p25_us=float(p25), p75_us=float(p75),
                       mean_us=mean, std_us=std, cv=std / mean if mean > 0 else 0.0,
                       min_us=float(a.min()), max_us=float(a.max()))


def cv_of_medians(runs: Sequence[Sequence[float]]) -> float:
    """Run-to-run CV of the median: std / mean of each run's median.

    Args:
        runs: one list of samples (microseconds) per run; at least two runs.

    Raises:
        ValueError: fewer than two runs, or a run without samples.
    """
    if len(runs) < 2:
        raise ValueError("run-to-run CV needs at least two runs")
    meds = np.array([summarize(r).median_us for r in runs])  # (runs,)
    return float(meds.std(ddof=1) / meds.mean()) if meds.mean() > 0 else 0.0


def geometric_mean(values: Sequence[float]) -> float:
    """Geometric mean of positive ratios (NaN when `values` is empty).

    The mean of speedups across cases is geometric, so a 2x win and a 2x loss
    cancel (Fleming & Wallace, CACM 1986).

    Raises:
        ValueError: a value <= 0.
    """
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return math.nan
    if np.any(a <= 0):
        raise ValueError("geometric mean needs positive values")
    return float(np.exp(np.log(a).mean()))


NOISY_CV = 0.1          # a row is noisy when its CV exceeds this ...
NOISY_IQR_RATIO = 0.2   # ... or its IQR / median exceeds this
NOISE_RULE = f"CV > {NOISY_CV:g} or IQR/median > {NOISY_IQR_RATIO:g}"


def is_noisy(row: dict) -> bool:
    """Whether a result row's timing spread is high: CV > NOISY_CV or (p75 - p25) / median > NOISY_IQR_RATIO.

    Uses the row's stored cv / quartiles, or its samples when those are absent; a row
    without timing is not noisy.
    """
    cv, med, p25, p75 = (row.get(k) for k in ("cv", "median_us", "p25_us", "p75_us"))
    samples = row.get("samples_us")
    if (cv is None or p25 is None or p75 is None) and isinstance(samples, list) and len(samples) > 1:
        try:
            s = summarize(samples)
        except (ValueError, TypeError):
            return False
        cv = s.cv if cv is None else cv
        med, p25, p75 = (s.median_us if med is None else med), s.p25_us, s.p75_us
    num = (int, float)
    if isinstance(cv, num) and not isinstance(cv, bool) and cv > NOISY_CV:
        return True
    if (isinstance(med, num) and isinstance(p25, num) and isinstance(p75, num)
            and not any(isinstance(x, bool) for x in (med, p25, p75)) and med > 0):
        return (p75 - p25) / med > NOISY_IQR_RATIO
    return False


def mannwhitney_pvalues(tests: Sequence[tuple[Sequence[float], Sequence[float], str]],
                        chunk: int = 2048) -> list[float]:
    """One-sided Mann-Whitney U p-values of many sample pairs, equal to one
    `scipy.stats.mannwhitneyu(x, y, alternative=alt)` call per pair, in a few calls.

    The pairs are grouped by (len(x), len(y), alternative, whether x and y together hold a
    tie), and each group of at most `chunk` pairs is one `mannwhitneyu(X, Y, axis=1)` call on
    (pairs, len(x)) and (pairs, len(y)) float64 arrays. Ties are a key because scipy's
    `method="auto"` looks at the ties of the whole call: with a sample of 8 or fewer, one pair
    with a tie would send the exact pairs of its call to the normal approximation
    (scipy/stats/_mannwhitneyu.py, `_mwu_choose_method`, scipy 1.11-1.17).

    Args:
        tests: (x, y, alternative) per pair: samples (microseconds, any order, at least one
            each, finite) and "greater" or "less" (x stochastically greater / less than y).
        chunk: most pairs per scipy call (bounds the arrays' memory).

    Returns:
        The p-values, in the order of `tests`.

    Raises:
        ValueError: as scipy's, for an empty sample or an unknown alternative.
    """
    from scipy.stats import mannwhitneyu  # here: importing scipy.stats takes a second that a run does not need

    groups: dict[tuple[int, int, str], list[int]] = {}
    for i, (x, y, alternative) in enumerate(tests):
        groups.setdefault((len(x), len(y), alternative), []).append(i)
    out = [math.nan] * len(tests)
    for (nx, ny, alternative), members in groups.items():
        for start in range(0, len(members), chunk):
            part = members[start:start + chunk]
            xs = np.array([tests[i][0] for i in part], dtype=np.float64).reshape(len(part), nx)  # (pairs, nx)
            ys = np.array([tests[i][1] for i in part], dtype=np.float64).reshape(len(part), ny)  # (pairs, ny)
            xy = np.sort(np.concatenate([xs, ys], axis=1), axis=1)                               # (pairs, nx + ny)
            tied = (np.diff(xy, axis=1) == 0).any(axis=1)                                        # (pairs,)
            for mask in (tied, ~tied):
                if mask.any():
                    p = mannwhitneyu(xs[mask], ys[mask], alternative=alternative, axis=1).pvalue  # (sum(mask),)
                    for i, pi in zip(np.asarray(part)[mask], np.atleast_1d(p)):
                        out[i] = float(pi)
    return out
