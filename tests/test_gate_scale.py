"""The gate at scale: the Mann-Whitney test runs only for pairs whose ratio is past the
threshold, in batched scipy calls, and the verdicts and p-values are those of one
`scipy.stats.mannwhitneyu` call per pair; a gate over 10^5 rows a side finishes with the
right verdicts."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.stats
from scipy.stats import mannwhitneyu

from treebench.harness.analyze.gate import GateConfig, compare_runs
from treebench.harness.cli import main as cli
from treebench.harness.model.cases import Case
from treebench.harness.timing.stats import mannwhitney_pvalues

RATIOS = (1.0, 1.01, 1.03, 1.049, 1.05, 1.051, 1.06, 1.2, 0.97, 0.95, 1 / 1.05, 0.94, 0.8)


def _samples(rng: np.random.Generator, m: float, spread: float, n: int, tied: bool) -> list[float]:
    """n lognormal samples around m; rounded to a few levels when `tied` (many ties within and across sides)."""
    s = m * rng.lognormal(0, spread, n)
    return (np.round(s / 5) * 5 if tied else s).tolist()


def _rows(n_pairs: int, seed: int, sizes=(5, 37, 232)) -> tuple[list[dict], list[dict]]:
    """(baseline, candidate): pairs at every ratio of RATIOS, tight and wildly noisy, samples of `sizes`
    (the two sides' counts drawn apart), every third pair with ties."""
    rng = np.random.default_rng(seed)
    base, cand = [], []
    for i in range(n_pairs):
        ratio, spread = RATIOS[i % len(RATIOS)], (0.005, 0.4)[i % 2]
        for side, m in ((base, 100.0), (cand, 100.0 * ratio)):
            s = _samples(rng, m, spread, int(rng.choice(sizes)), tied=i % 3 == 0)
            side.append({"case_id": f"c{i}", "backend": "k", "case": {"batch_size": i}, "status": "pass",
                         "timer": "cuda_graph", "l2_flushed": True, "median_us": float(np.median(s)),
                         "samples_us": s, "timestamp": "t"})
    return base, cand


def _old_kind(b: dict, c: dict, config: GateConfig) -> tuple[str, str, float]:
    """The verdict (kind, detail, p) of testing every pair, one scipy call each, as the gate did before."""
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


@pytest.mark.parametrize("sizes, min_samples", [((5, 37, 232), 5), ((2, 3, 5, 8, 9, 13), 2)])
def test_verdicts_equal_testing_every_pair(sizes, min_samples):
    base, cand = _rows(390, seed=3, sizes=sizes)
    config = GateConfig(min_samples=min_samples)
    found = {v.case_id: v for v in compare_runs(base, cand, config).verdicts}
    for b, c in zip(base, cand):
        kind, detail, p = _old_kind(b, c, config)
        v = found[b["case_id"]]
        assert (v.kind, v.detail.split("noisy ")[0].rstrip("; ")) == (kind, detail), b["case_id"]
        assert v.p_value == (p if _past(b, c, config) else None), b["case_id"]
    assert {v.kind for v in found.values()} == {"slower", "faster", "unchanged"}


def test_batched_pvalues_equal_one_call_per_pair():
    """Random pairs of 1 to 12 samples (scipy's exact method below 9, with ties or without, in one
    batch) and larger ones, both alternatives: every p-value equals its own scipy call, to the bit."""
    rng = np.random.default_rng(11)
    tests = []
    for i in range(1500):
        nx, ny = (int(rng.integers(1, 13)), int(rng.integers(1, 13))) if i % 4 else (37, int(rng.choice([37, 232])))
        shift = float(rng.choice([0.8, 1.0, 1.3]))
        x, y = _samples(rng, 100 * shift, 0.2, nx, i % 3 == 0), _samples(rng, 100, 0.2, ny, i % 5 == 0)
        tests.append((x, y, ("greater", "less")[i % 2]))
    want = [float(mannwhitneyu(x, y, alternative=alt).pvalue) for x, y, alt in tests]
    assert mannwhitney_pvalues(tests) == want
    assert mannwhitney_pvalues(tests, chunk=7) == want
    assert mannwhitney_pvalues([]) == []


def test_mannwhitneyu_runs_batched_and_only_past_the_threshold(monkeypatch):
    base, cand = _rows(130, seed=5)
    config = GateConfig(threshold=0.05)
    tested = []
    real = scipy.stats.mannwhitneyu

    def counting(x, y, **kw):
        tested.append(np.shape(x)[0])   # pairs in this call
        return real(x, y, **kw)
    monkeypatch.setattr(scipy.stats, "mannwhitneyu", counting)
    compare_runs(base, cand, config)
    past = sum(_past(b, c, config) for b, c in zip(base, cand))
    assert 0 < sum(tested) == past < len(base)
    assert len(tested) < past / 2   # batched: pairs of equal sample counts share a call


def _write_side(path, n: int, slow: set[int], fast: set[int]) -> None:
    """n rows of 6 samples each; the pairs in `slow` / `fast` take twice / half as long."""
    base = [10.0, 10.1, 10.2, 10.3, 10.4, 10.5]
    axes = Case(batch_size=1, context_len=0, tree="chain:3").axes   # every axis, as a row's case holds them
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            k = 2.0 if i in slow else 0.5 if i in fast else 1.0
            s = [round(x * k * (1 + i % 97 / 100), 4) for x in base]
            f.write(f'{{"schema": 2, "run_id": "r-{path.stem}", "env": "e1", "timestamp": "2026-01-01T00:00:00+00:00", '
                    f'"backend": "k", '
                    f'"mask_kind": "tree", "case": {json.dumps({**axes, "batch_size": i % 64 + 1, "context_len": i})}, '
                    f'"case_id": "c{i}", "status": "pass", "reason": null, "timer": "cuda_graph", '
                    f'"l2_flushed": true, "median_us": {(s[2] + s[3]) / 2}, "p25_us": {s[1]}, "p75_us": {s[4]}, '
                    f'"cv": 0.02, "n_samples": 6, "samples_us": {json.dumps(s)}}}\n')


def test_gate_over_100k_rows_a_side(tmp_path, capsys):
    n = 100_000
    slow, fast = set(range(0, n, 997)), set(range(5, n, 1999))
    _write_side(tmp_path / "base.jsonl", n, set(), set())
    _write_side(tmp_path / "cand.jsonl", n, slow, fast)
    (tmp_path / "env-e1.json").write_text(json.dumps({"env_id": "e1", "gpu_name": "H200"}), encoding="utf-8")
    rc = cli.main(["gate", "--baseline", str(tmp_path / "base.jsonl"), "--candidate", str(tmp_path / "cand.jsonl")])
    out = capsys.readouterr().out
    assert rc == 1
    assert f"| Slower (fails the gate) | {len(slow)} |" in out
    assert f"| Faster | {len(fast)} |" in out
    assert f"| Unchanged | {n - len(slow) - len(fast)} |" in out
