"""The gate at scale: the Mann-Whitney test runs only for pairs whose ratio is past the
threshold, and the verdicts are those of testing every pair."""

from __future__ import annotations

import numpy as np
from scipy.stats import mannwhitneyu

from treebench.harness.analyze import gate
from treebench.harness.analyze.gate import GateConfig, compare_runs

RATIOS = (1.0, 1.01, 1.03, 1.049, 1.05, 1.051, 1.06, 1.2, 0.97, 0.95, 1 / 1.05, 0.94, 0.8)


def _rows(n_pairs: int, seed: int) -> tuple[list[dict], list[dict]]:
    """(baseline, candidate): pairs at every ratio of RATIOS, tight and wildly noisy, 5 to 232 samples."""
    rng = np.random.default_rng(seed)
    base, cand = [], []
    for i in range(n_pairs):
        ratio, spread, n = RATIOS[i % len(RATIOS)], (0.005, 0.4)[i % 2], (5, 37, 232)[i % 3]
        for side, m in ((base, 100.0), (cand, 100.0 * ratio)):
            s = (m * rng.lognormal(0, spread, n)).tolist()
            side.append({"case_id": f"c{i}", "backend": "k", "case": {"batch_size": i}, "status": "pass",
                         "timer": "cuda_graph", "l2_flushed": True, "median_us": float(np.median(s)),
                         "samples_us": s, "timestamp": "t"})
    return base, cand


def _old_kind(b: dict, c: dict, config: GateConfig) -> tuple[str, str, float]:
    """The verdict (kind, detail, p) of testing every pair, as the gate did before it skipped the test."""
    ratio, up = c["median_us"] / b["median_us"], 1 + config.threshold
    p = float(mannwhitneyu(c["samples_us"], b["samples_us"], alternative="greater" if ratio >= 1 else "less").pvalue)
    if ratio > up and p < config.alpha:
        return "slower", "", p
    if ratio < 1 / up and p < config.alpha:
        return "faster", "", p
    beyond = ratio > up or ratio < 1 / up
    return "unchanged", f"ratio beyond threshold but p = {p:.2g}" if beyond else "", p


def _past(b: dict, c: dict, config: GateConfig) -> bool:
    ratio, up = c["median_us"] / b["median_us"], 1 + config.threshold
    return ratio > up or ratio < 1 / up


def test_verdicts_equal_testing_every_pair():
    base, cand = _rows(260, seed=3)
    config = GateConfig()
    found = {v.case_id: v for v in compare_runs(base, cand, config).verdicts}
    for b, c in zip(base, cand):
        kind, detail, p = _old_kind(b, c, config)
        v = found[b["case_id"]]
        assert (v.kind, v.detail.split("noisy ")[0].rstrip("; ")) == (kind, detail), b["case_id"]
        assert v.p_value == (p if _past(b, c, config) else None)
    assert {v.kind for v in found.values()} == {"slower", "faster", "unchanged"}


def test_mannwhitneyu_runs_only_past_the_threshold(monkeypatch):
    base, cand = _rows(130, seed=5)
    config = GateConfig(threshold=0.05)
    calls = []
    real = gate.mannwhitneyu
    monkeypatch.setattr(gate, "mannwhitneyu", lambda *a, **k: calls.append(1) or real(*a, **k))
    compare_runs(base, cand, config)
    past = sum(_past(b, c, config) for b, c in zip(base, cand))
    assert 0 < len(calls) <= past < len(base)
