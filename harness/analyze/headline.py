"""The report's first table: per cell (case), our time, the best peer's, their ratio and the roofline.

Who competes with whom, from the rows alone (the backend registry is not read):

- **own**: the kernel the report is about (`--own`, default triton_tree) and the rest of
  `OWN_KERNELS`, treebench's own kernels. A second own kernel is never a rival of the first.
- **non-contenders**: backends that solve the easier causal task (a row with ``mask_kind``
  "causal", and the --causal-backend) and the float64 reference.
- **peers**: every other timed backend; the best peer of a cell is the fastest of them.

The headline, own / best peer over every cell both timed (min, median, max, cells slower),
is the README's figure, read off one line.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

from treebench.harness.analyze.cells import Table, num, ratio, us
from treebench.harness.analyze.roles import DEFAULT_OWN, OWN_KERNELS
from treebench.harness.analyze.tables import order_key, timed_frame, varying_axes
from treebench.harness.errors import ConfigError
from treebench.harness.model.workload import compute_roof, row_roofline_us

AXIS_LABELS = {"batch_size": "B", "context_len": "L", "tree": "tree", "T": "T", "page_size": "P",
               "num_q_heads": "Hq", "num_kv_heads": "Hkv", "head_dim": "D"}


def non_contenders(rows: Sequence[dict], causal: str) -> set[str]:
    """Backends kept out of speedups, wins and 'fastest': they solve the easier causal task,
    or they are the float64 reference.

    A backend is causal when one of its rows says ``mask_kind`` "causal"; rows stored
    without ``mask_kind`` leave only `causal` (the --causal-backend name, causal_baseline
    by default) marked so. The rows alone decide: the backend registry is not read.

    Args:
        rows: result rows (any status).
        causal: the causal backend the tree-mask overhead is measured against.

    Returns:
        `causal`, "reference" and every backend with a row of mask_kind "causal".
    """
    return {causal, "reference"} | {r["backend"] for r in rows if r.get("mask_kind") == "causal"}


def timed_backends(rows: Sequence[dict], requested: str | None = None, flag: str = "") -> list[str]:
    """The backends with passing timed rows, sorted; checks a backend the user asked for by `flag`.

    Raises:
        ConfigError: `requested` (given) has no passing timed rows.
    """
    timed = sorted({r["backend"] for r in rows if r.get("status") == "pass" and r.get("median_us")})
    if requested and requested not in timed:
        raise ConfigError(f"report {flag} {requested!r}: no passing timed rows; "
                          f"timed backends here: {', '.join(timed) or 'none'}")
    return timed


def pick_own(rows: Sequence[dict], requested: str | None) -> str | None:
    """The report's own backend: `requested`, else DEFAULT_OWN when it has timed rows, else None.

    Raises:
        ConfigError: `requested` has no passing timed rows.
    """
    timed = timed_backends(rows, requested, "--own")
    return requested or (DEFAULT_OWN if DEFAULT_OWN in timed else None)


def own_kernels(own: str | None) -> set[str]:
    """OWN_KERNELS plus `own` (a kernel under test given by --own is ours too)."""
    return set(OWN_KERNELS) | ({own} if own else set())


def peers(rows: Sequence[dict], own: str | None, causal: str) -> list[str]:
    """Backends that compete with `own`, sorted: not ours, not causal, not the reference."""
    out = own_kernels(own) | non_contenders(rows, causal)
    return sorted({r["backend"] for r in rows} - out)


def contenders(rows: Sequence[dict], own: str | None, causal: str) -> set[str]:
    """Backends that may be 'fastest' on a case: `own` and its peers."""
    return set(peers(rows, own, causal)) | ({own} if own else set())


# ---- the table --------------------------------------------------------------------------------

def cell_frame(rows: Sequence[dict], envs: dict[str, dict], own: str | None, rivals: Sequence[str]) -> pd.DataFrame:
    """One line per case: its axes, own_us, peer_us, peer, ratio, roofline_us, roofline_pct, roofline_ratio.

    own_us and peer_us are medians (µs) over the case's passing rows; peer is the fastest of
    `rivals`; ratio = own_us / peer_us (< 1: ours is faster). roofline_us is
    `treebench.harness.model.workload.row_roofline_us` of the case's work on its env's measured
    bandwidth and measured matrix rate (the GPU's datasheet compute peak when the env has no
    rate); roofline_pct = 100 * roofline_us / own_us (100: at the hardware's limit) and
    roofline_ratio = own_us / roofline_us (1: at the limit). Without `own` the best peer stands in for own_us.
    Sorted by B, L, T and the other varying axes; empty when nothing is timed.
    """
    df = timed_frame(rows)
    if df.empty:
        return df
    med = df.groupby(["case_id", "backend"])["median_us"].median().unstack()   # (case, backend) -> µs
    keys = ["batch_size", "context_len", "tree", "T", *varying_axes(df, exclude=("batch_size", "context_len",
                                                                                   "tree", "T", "seed"))]
    out = df.drop_duplicates("case_id").set_index("case_id")[keys]
    rival = med[[b for b in rivals if b in med.columns]].dropna(how="all")
    out["peer_us"] = rival.min(axis=1)
    out["peer"] = rival.idxmin(axis=1) if not rival.empty else None
    out["own_us"] = med[own] if own in med.columns else out["peer_us"]
    out["ratio"] = out["own_us"] / out["peer_us"] if own in med.columns else math.nan
    out["roofline_us"] = pd.Series(_roofline_by_case(rows, envs, own))
    out["roofline_pct"] = 100 * out["roofline_us"] / out["own_us"]
    out["roofline_ratio"] = out["own_us"] / out["roofline_us"]
    return _sorted(out.reset_index(), ["batch_size", "context_len", "T", "tree", *keys[4:]])


def _roofline_by_case(rows: Sequence[dict], envs: dict[str, dict], own: str | None) -> dict[str, float]:
    """case_id -> roofline µs, from the own backend's row (else any passing row) of the case."""
    out: dict[str, float] = {}
    for r in sorted((r for r in rows if r.get("status") == "pass" and r.get("median_us")),
                    key=lambda r: r["backend"] != own):                      # own's rows first
        if r["case_id"] in out:
            continue
        t = row_roofline_us(r, envs.get(r.get("env") or "", {}))
        out[r["case_id"]] = math.nan if t is None else t
    return out


def _sorted(df: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """`df` sorted by `keys`, integers numerically before text ('ragged:1-48')."""
    return df.sort_values(list(keys), key=lambda c: c.map(order_key)).reset_index(drop=True)


CELL_VALUES = ("case_id", "own_us", "peer_us", "peer", "ratio", "roofline_us", "roofline_pct", "roofline_ratio")


def axis_columns(frame: pd.DataFrame) -> list[str]:
    """The case-axis columns of a `cell_frame`, in order."""
    return [c for c in frame.columns if c not in CELL_VALUES]


def headline_table(frame: pd.DataFrame, own: str | None, missing: dict[str, list[str]] | None = None) -> Table:
    """The first table: axes, own µs, best peer µs and name, own / best peer, roofline µs, own / roofline.

    Cells where ours is slower than the best peer carry css class 'slower', faster ones 'faster'.
    Without `own`, the best backend and its time only. A cell `missing` (`missing_peers`) names
    has its best peer followed by "(not run: peer, ...)".
    """
    axes = axis_columns(frame)
    head = [(AXIS_LABELS.get(a, a.replace("_", " ")), "n" if a in ("batch_size", "T") else "") for a in axes]
    if own:
        head += [(f"{own} µs", "n"), ("best peer µs", "n"), ("best peer", ""), (f"{own} / best peer", "n")]
    else:
        head += [("fastest µs", "n"), ("fastest", "")]
    head += [("roofline µs", "n"), (f"{own or 'fastest'} / roofline", "n")]
    rows = []
    for rec in frame.to_dict("records"):
        cells = [(str(rec[a]), "n" if a in ("batch_size", "T") else "") for a in axes]
        if own:
            r = rec["ratio"]
            cls = "n" if r != r else ("n slower" if r > 1 else "n faster")
            gone = (missing or {}).get(rec["case_id"])
            peer = rec["peer"] or ""
            if gone and isinstance(peer, str):
                peer += f" (not run: {', '.join(gone)})"
            cells += [(us(rec["own_us"]), "n"), (us(rec["peer_us"]), "n"), (peer, ""), (ratio(r), cls)]
        else:
            cells += [(us(rec["own_us"]), "n"), (rec["peer"] or "", "")]
        cells += [(num(rec["roofline_us"], ".3g"), "n"), (ratio(rec["roofline_ratio"]), "n")]
        rows.append(cells)
    return Table(head, rows)


# ---- the headline -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Headline:
    """own / best peer over the cells both timed."""

    own: str                     # the report's own backend
    n: int                       # cells with a time of own and of at least one peer
    lo: float                    # smallest own / best peer ratio (< 1: ours faster)
    median: float                # median ratio over the n cells
    hi: float                    # largest ratio
    slower: int                  # cells with ratio > 1
    slower_to: dict[str, int]    # peer -> cells where it beats own
    roofline_pct: float | None   # median % of roofline reached by own (None: no measured peak)
    lacking_cells: int = 0       # cells of the n with no row of some peer that ran elsewhere in the results
    lacking: dict[str, int] = field(default_factory=dict)   # peer -> cells of the n with no row of it

    @property
    def text(self) -> str:
        """'triton_tree / best peer: min 0.27×, median 0.67×, max 1.47× over 126 cells; slower on 22 (...)',
        and, when some of those cells have no row of a peer that ran elsewhere in the results (a cut or
        partial run), '; N cells without a row of every peer (peer k, ...)'."""
        by = ", ".join(f"{p} {k}" for p, k in sorted(self.slower_to.items(), key=lambda pk: -pk[1]))
        text = (f"{self.own} / best peer: min {ratio(self.lo)}, median {ratio(self.median)}, max {ratio(self.hi)} "
                f"over {self.n} cells; slower on {self.slower}" + (f" ({by})" if by else ""))
        if self.lacking_cells:
            who = ", ".join(f"{p} {k}" for p, k in sorted(self.lacking.items(), key=lambda pk: (-pk[1], pk[0])))
            text += f"; {self.lacking_cells} cell{'s' if self.lacking_cells > 1 else ''} without a row of every peer ({who})"
        return text


def missing_peers(rows: Sequence[dict], rivals: Sequence[str]) -> dict[str, list[str]]:
    """case_id -> the `rivals` with no row of any status for that case, over the cases some row names.

    A peer that skipped a case by capability has a row (status "skipped") and is not missing;
    a peer with no row at all for a case it has rows elsewhere for was not run there (a sweep cut
    by its time limit, a shard not yet run), so that case's best peer is over fewer peers.
    Only rivals with at least one row count. Cases with nothing missing are left out.
    """
    have: dict[str, set[str]] = {}
    for r in rows:
        have.setdefault(r["case_id"], set()).add(r["backend"])
    present = {b for bs in have.values() for b in bs}
    wanted = [b for b in rivals if b in present]
    out = {c: [b for b in wanted if b not in bs] for c, bs in have.items()}
    return {c: m for c, m in out.items() if m}


def missing_row_warnings(rows: Sequence[dict]) -> list[tuple[str, str]]:
    """('warn', sentence) when some case has no row of a backend that has rows for other cases (a
    sweep cut by its limit, a shard not yet run, results merged from runs over other backends):
    that case's comparisons are over fewer backends. A skipped row is a row. [] when every case
    has a row of every backend (`missing_peers` over all of them)."""
    missing = missing_peers(rows, sorted({r["backend"] for r in rows}))
    if not missing:
        return []
    per: dict[str, int] = {}
    for names in missing.values():
        for b in names:
            per[b] = per.get(b, 0) + 1
    who = ", ".join(f"{b} {k}" for b, k in sorted(per.items(), key=lambda bk: (-bk[1], bk[0])))
    n = len(missing)
    return [("warn", f"{n} case{'s' if n > 1 else ''} of {len({r['case_id'] for r in rows})} "
                     f"lack{'' if n > 1 else 's'} a row of a backend "
                     f"that has rows for other cases ({who}): a cut or partial run; their comparisons are over "
                     "fewer backends; the same sweep with `--out FILE --resume` runs only the missing pairs.")]


def headline(frame: pd.DataFrame, own: str | None, missing: dict[str, list[str]] | None = None) -> Headline | None:
    """The headline of a `cell_frame`, or None without `own` or without a cell both timed.

    Args:
        frame: `cell_frame`'s table.
        own: the report's own backend.
        missing: `missing_peers` of the rows (None: every cell counted as complete); the cells of the
            headline it names are counted in `Headline.lacking`.
    """
    if not own or frame.empty:
        return None
    both = frame.dropna(subset=["ratio"])
    if both.empty:
        return None
    slow = both[both["ratio"] > 1]
    roof = frame["roofline_pct"].dropna()
    short = [missing[c] for c in both["case_id"] if missing and c in missing]
    return Headline(own, len(both), float(both["ratio"].min()), float(both["ratio"].median()),
                    float(both["ratio"].max()), len(slow), dict(Counter(slow["peer"])),
                    float(roof.median()) if not roof.empty else None, len(short),
                    dict(Counter(b for m in short for b in m)))


def roofline_basis(envs: dict[str, dict], ids: Sequence[str]) -> list[str]:
    """One phrase per env of `ids` saying which peaks its roofline uses, e.g. 'env 3f1c: 3.95 TB/s
    measured copy bandwidth, 712 TFLOP/s measured bf16 matmul rate' ('no measured bandwidth, no
    roofline' on the CPU; the datasheet's 16-bit peak when the env holds no measured rate)."""
    out = []
    for i in ids:
        env = envs.get(i, {})
        bw = env.get("peak_bw_bytes_per_s")
        if not bw:
            out.append(f"env {i}: no measured bandwidth, so no roofline")
            continue
        tflops, source = compute_roof(env)
        rate = (f"{tflops:.4g} TFLOP/s measured bf16 matmul rate" if source == "measured" else
                f"{tflops:.4g} TFLOP/s datasheet 16-bit peak (no measured matrix rate in the env)" if tflops else
                "no compute roof (unknown GPU, no measured matrix rate)")
        out.append(f"env {i}: {bw / 1e12:.3g} TB/s measured copy bandwidth, {rate}")
    return out
