"""Tables built from result rows, for the report: timed rows, speedups, the seed-style
tree-mask overhead table.

Every function takes rows as the store holds them (`treebench.harness.store.rows`) and
returns a pandas DataFrame; only passing, timed rows count (a wrong kernel's speed is
not a result).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from treebench.harness.model.cases import CASE_FIELDS, LATER_AXES
from treebench.harness.model.workload import row_roofline_us


def order_key(v) -> tuple:
    """Where an axis value (B, L, a facet) sorts in a table: integers numerically before text ('ragged:1-48').
    An integer is text of ASCII digits 0-9, compared by its digits (no int(): a results file may hold any
    text, '²', which str.isdigit() takes and int() fails on, or more digits than int() reads)."""
    s = str(v)
    digits = s.lstrip("0") or "0"
    return (0, len(digits), digits) if s.isascii() and s.isdigit() else (1, 0, s)


def timed_frame(rows: Sequence[dict], envs: dict[str, dict] | None = None) -> pd.DataFrame:
    """One line per passing, timed row: case axes flattened, T (root tree size), median/quartiles.

    Columns: case_id, backend, batch_size, context_len, tree, T, ... (every case
    axis; a row's case leaves LATER_AXES at their defaults out, filled in here, kv_dtype
    with the query dtype and sm_scale as text, '1/sqrt(D)' by default, so an axis varies only
    where values differ), median_us,
    p25_us, p75_us, timer, env, run_id, and with `envs` (env fingerprints by env id)
    roofline_us (`treebench.harness.model.workload.row_roofline_us` on the row's env; NaN
    without a measured bandwidth). Mismatching rows are left out: a wrong kernel's
    speed is not a result.
    """
    recs = []
    for r in rows:
        if r.get("status") != "pass" or r.get("median_us") is None:
            continue
        sizes = r.get("tree_sizes") or [None]
        case = {**LATER_AXES, "kv_dtype": r["case"].get("dtype"), **r["case"]}
        scale = case["sm_scale"]   # as text, one type to sort; a number the way a suite writes it
        case["sm_scale"] = ("1/sqrt(D)" if scale is None else f"{scale:g}" if isinstance(scale, float | int)
                            else str(scale))
        recs.append({"case_id": r["case_id"], "backend": r["backend"], **case, "T": sizes[0],
                     "median_us": r["median_us"], "p25_us": r.get("p25_us"), "p75_us": r.get("p75_us"),
                     "timer": r.get("timer"), "env": r.get("env"), "run_id": r.get("run_id")})
        if envs is not None:
            roof = row_roofline_us(r, envs.get(r.get("env") or "", {}))
            recs[-1]["roofline_us"] = math.nan if roof is None else roof
    return pd.DataFrame.from_records(recs)


def speedup_table(rows: Sequence[dict], baseline: str, exclude: Sequence[str] = ()) -> pd.DataFrame:
    """Speedup of each backend over `baseline` per case: baseline median / backend median.

    Args:
        rows: result rows; only passing timed rows count.
        baseline: backend name the others are compared with.
        exclude: backends left out (e.g. the causal baseline, which solves an easier task).

    Returns:
        timed_frame(rows) of the other backends plus columns baseline_us and
        speedup (> 1: faster than the baseline); empty when nothing is comparable.
    """
    df = timed_frame(rows)
    if df.empty or baseline not in set(df["backend"]):
        return pd.DataFrame()
    base = df[df["backend"] == baseline][["case_id", "median_us"]].rename(columns={"median_us": "baseline_us"})
    others = df[(df["backend"] != baseline) & ~df["backend"].isin(list(exclude))]
    out = others.merge(base, on="case_id", how="inner")
    out["speedup"] = out["baseline_us"] / out["median_us"]
    return out.reset_index(drop=True)


OTHER_RUN = "_other_run"   # bool column, present when a line's ratio divides by the median over other runs
SEED_COLUMNS = {"backend": "Backend", "batch_size": "Batch Size", "context_len": "Sequence Position",
                "T": "Seqlen Q"}


def mask_overhead_table(rows: Sequence[dict], causal_backend: str = "causal_baseline",
                        envs: dict[str, dict] | None = None) -> pd.DataFrame:
    """Tree-mask overhead against `causal_backend`, laid out as the seed PR's table.

    Columns: Backend, Batch Size, Sequence Position (L), Seqlen Q (T), any other
    case axis that varies across rows, Time (us) (median), and Overhead (%) =
    100 * (time / causal time of the same case - 1), empty for the causal rows; with
    `envs` (env fingerprints by env id) also Roofline (us) (`timed_frame`'s roofline_us)
    and Time / roofline (1: at the hardware's limit), NaN without a measured bandwidth.
    The causal time is the one measured in the same run (run_id) when there is one,
    else the median over every run of the case (rows of several result sets may
    repeat a case; those lines are True in an OTHER_RUN column, present only when
    there are some); with rows of several runs a Run column says which is which.
    Sorted as the seed table: batch size, position, T, causal row first.
    (Seed layout: vLLM PR #20401, "Add tree attention backend for v1".)
    """
    df = timed_frame(rows, envs)
    roof = {"roofline_us": "Roofline (us)", "roofline_ratio": "Time / roofline"} if envs is not None else {}
    if df.empty:
        return pd.DataFrame(columns=[*SEED_COLUMNS.values(), "Time (us)", "Overhead (%)", *roof.values()])
    causal_us, other = same_run_median(df[df["backend"] == causal_backend], df, ["case_id"])
    df["overhead_pct"] = 100.0 * (df["median_us"] / causal_us - 1.0)
    df.loc[df["backend"] == causal_backend, "overhead_pct"] = float("nan")
    df[OTHER_RUN] = other & df["overhead_pct"].notna()
    if roof:
        df["roofline_ratio"] = df["median_us"] / df["roofline_us"]
    df["_causal_first"] = df["backend"] != causal_backend
    df["_pos"] = df["context_len"].map(lambda c: c if isinstance(c, int) else -1)
    extra = varying_axes(df, exclude=("batch_size", "context_len", "tree", "T", "seed"))
    if df["run_id"].astype(str).nunique() > 1:          # rows of several runs: say which is which
        extra.append("run_id")
    df = df.sort_values(["batch_size", "_pos", "context_len", "T", *extra, "_causal_first", "backend"],
                        key=lambda s: s.astype(str) if s.name == "context_len" else s)
    cols = {**SEED_COLUMNS, **{a: "Run" if a == "run_id" else a.replace("_", " ").title() for a in extra},
            "median_us": "Time (us)", "overhead_pct": "Overhead (%)", **roof}
    cols |= {OTHER_RUN: OTHER_RUN} if df[OTHER_RUN].any() else {}
    return df[list(cols)].rename(columns=cols).reset_index(drop=True)


def same_run_median(base: pd.DataFrame, df: pd.DataFrame, on: list[str]) -> tuple[pd.Series, pd.Series]:
    """Per line of `df`, the median_us (µs) of the `base` lines that match it on the columns `on`:
    those of its own run (run_id) when `base` has any, else those of every run; NaN when none
    matches; and whether it is the latter (bool: another run's time). Both are `timed_frame`
    frames; both Series have df's index. Raises nothing."""
    def key(d: pd.DataFrame) -> list[tuple]:
        return list(zip(*(d[c].astype(str) for c in on)))
    b = base.assign(_k=key(base), _run=base["run_id"].astype(str))
    same_run = b.groupby(["_run", "_k"])["median_us"].median()
    any_run = b.groupby("_k")["median_us"].median()
    pairs = list(zip(df["run_id"].astype(str), key(df)))
    other = pd.Series([p not in same_run.index and p[1] in any_run.index for p in pairs], index=df.index, dtype=bool)
    return (pd.Series([same_run.get(p, any_run.get(p[1], math.nan)) for p in pairs], index=df.index, dtype=float),
            other)


def varying_axes(df: pd.DataFrame, exclude: Sequence[str] = ()) -> list[str]:
    """Case-axis columns of `df` with more than one distinct value, minus `exclude`."""
    return [a for a in CASE_FIELDS if a in df and a not in exclude and df[a].astype(str).nunique() > 1]


KV_AXES = ("kv_dtype", "k_scale", "v_scale")


def kv_dtype_table(rows: Sequence[dict]) -> pd.DataFrame:
    """Each backend's time over a KV pool stored in another dtype than the queries (fp8 codes, or
    a float16 pool under bf16 queries) against the same case over a pool in the query dtype,
    where the rows hold both.

    Columns: Backend, the case axes that vary across those rows besides KV_AXES and seed (Batch
    Size, Context Len, Tree, Page Size, ...), KV dtype, Time (us) (median), Query-dtype time (us)
    (the same case and backend with kv_dtype = dtype and unit scales, from the same run when one
    has it, else the median over runs) and Ratio = Time / Query-dtype time (< 1: the other pool
    is faster), and OTHER_RUN (True where that time is the median over other runs; present only
    when there are such lines). Empty when no case has both (or the rows name no dtype). Raises nothing.
    """
    df = timed_frame(rows)
    if df.empty or "dtype" not in df or "kv_dtype" not in df:
        return pd.DataFrame()
    cell_axes = [a for a in CASE_FIELDS if a in df and a not in (*KV_AXES, "seed")]
    narrow = df["kv_dtype"].notna() & (df["kv_dtype"] != df["dtype"])
    base = df[~narrow & (df["k_scale"] == 1.0) & (df["v_scale"] == 1.0)]
    out = df[narrow].copy()
    if out.empty:
        return pd.DataFrame()
    out["base_us"], out[OTHER_RUN] = same_run_median(base, out, [*cell_axes, "backend"])
    out = out.dropna(subset=["base_us"])
    if out.empty:
        return pd.DataFrame()
    out["ratio"] = out["median_us"] / out["base_us"]
    extra = varying_axes(out, exclude=(*KV_AXES, "seed", "T"))
    out = out.sort_values(["backend", *extra, "kv_dtype"])
    cols = {"backend": "Backend", **{a: a.replace("_", " ").title() for a in extra}, "kv_dtype": "KV dtype",
            "median_us": "Time (us)", "base_us": "Query-dtype time (us)", "ratio": "Ratio"}
    cols |= {OTHER_RUN: OTHER_RUN} if out[OTHER_RUN].any() else {}
    return out[list(cols)].rename(columns=cols).reset_index(drop=True)
