"""The default check of a backend, built from its Capabilities: `treebench check`
without --suite.

One small base case (B 2, Hq 4, Hkv 2, D 64, L_b = P + 1, the branching tree
full:2:2 of T 7, shuffled pages), chosen inside the backend's capabilities, and
around it one axis varied at a time, never a product:

| axis | values (default) | what a wrong kernel gets wrong there |
| --- | --- | --- |
| tree_size | 31/32/33, 63/64/65, 127/128/129, the maximum (256 when none), maximum + 1 | mask words of 32 and 64 bits, tiles of 64 and 128 rows |
| page_size | 1, 16, 24, 64, 128, 256 (L_b = P + 1: two pages, a NaN tail) | page arithmetic per page-size class; 24 is not a power of two (an offset taken as pos & (P - 1)) |
| dtype | bfloat16, float16 (float32 when the backend takes any dtype) | the dtype's kernel path |
| head_dim | 64, 128, 256 | the head-dim instantiation |
| group_size | G = 1, 2, 4, 8 with Hkv = 2 | the GQA mapping h // G |
| num_kv_heads | Hkv = 1, 2, 3, 8 at the base G | a KV head index clamped or wrapped at 2, per-KV-head strides |
| batch_size | B = 2, 11; 33 at Hkv 1 with ragged contexts 0-2P (uniform P + 1 without ragged support) | requests past a fixed 8, 16 or 32 (grid programs per dimension, per-request tables) skipped or zeroed; 11 and 33 are no powers of two |
| context_len | L_b = 0, 1, P - 1, P, P + 1 each, one list of those plus S_b = P, 2P (B 8), ragged:0-3P (B 8), 16384 with position values (B 1) | empty contexts, page edges, a NaN page after a full last page, per-request offsets, a softmax sum that drifts over a long context |
| tree_per_request | same, mixed (B 4, T 13) | one request's tree used for another |
| layout | shuffled, contiguous, interleaved | the block table |
| shape | Hq = T, B = T, T = P, G = T | an index swapped with another of the same extent |
| logit_scale | 1, 1000 (scores of magnitude 1e3-1e4) | softmax without the running max, overflow |
| sm_scale | 1/sqrt(D), 0.3 (1/sqrt(D) for no integer D) | inputs.sm_scale ignored for 1/sqrt(D) |
| values | random, position (V rows spell their own position and head) | a wrong mask or head by whole channels |
| kv_dtype | same (the query dtype); float8_e4m3fn and float8_e5m2 with k_scale 0.25, v_scale 0.5; e4m3 with G 6 (Hq 12, Hkv 2), with "mean" values (Q = K = 0: each row the mean of the V rows it sees) and with k_scale = v_scale = 0.5 | scales ignored, swapped or applied twice, NaN slots read, the wrong fp8 format decoded, a causal mask on fp8 data, GQA on fp8 |

`deep=True` adds tree sizes 1, 2, 15-17, 255-257, 511-513, page sizes 8, 24, 32,
head dims 32, 80, 96, G 16, more seeds, logit scales 300 and 3000 and the
position values on mixed trees.

A value the backend cannot take (its `supports(case)`, by default
treebench.harness.adapter.contract.capability_skip) stays in the suite as a case
the runner records as skipped, and in the coverage record with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from treebench.harness.adapter.contract import Capabilities, capability_skip
from treebench.harness.model.cases import FP8_DTYPES, Case, fp8_scale_error
from treebench.harness.model.coverage import RE_PREPARE, new_coverage, note

BASE_HQ_PER_G, BASE_HKV = 2, 2            # Hkv 2, Hq = 2 G
TREE_SIZES = (31, 32, 33, 63, 64, 65, 127, 128, 129)
DEEP_TREE_SIZES = (1, 2, 15, 16, 17, 255, 256, 257, 511, 512, 513)
UNBOUNDED_MAX_T, DEEP_UNBOUNDED_MAX_T = 256, 512   # the largest T tried when a backend declares no maximum
PAGE_SIZES, DEEP_PAGE_SIZES = (1, 16, 24, 64, 128, 256), (3, 8, 32)
HEAD_DIMS, DEEP_HEAD_DIMS = (64, 128, 256), (32, 80, 96)
GROUP_SIZES, DEEP_GROUP_SIZES = (1, 2, 4, 8), (16,)
KV_HEADS = (1, 3, 8)                      # Hkv besides the base's 2, at the base G: 3 is past 2 and no power of two
BATCH_SIZES = (11,)                       # B besides the base's 2: past 8 and no power of two
LARGE_BATCH = 33                          # B past 32 (and 16), no power of two; at Hkv 1, the grid's smallest
SM_SCALES = (0.3,)                        # scales that are 1/sqrt(D) for no integer D (0.3: D = 11.1)
DTYPES_ANY = ("bfloat16", "float16", "float32")
LOGIT_SCALES, DEEP_LOGIT_SCALES = (1000.0,), (300.0, 3000.0)
DEEP_SEEDS = (1, 2)                       # extra seeds of the base case and the mixed-tree case
FP8_SCALES = (0.25, 0.5)                  # (k_scale, v_scale) of the fp8 cases: powers of two, unequal, so the
                                          # codes of "position" values are exact and a swap or a miss shows
FP8_EQUAL_SCALE = 0.5                     # one fp8 case with k_scale = v_scale (kernels with one kv_scale)


@dataclass(frozen=True)
class DefaultCheck:
    """The default check of one backend.

    Attributes:
        cases: every case, skipped values included (the runner records their skips).
        coverage: {axis: {"ran": [value, ...], "skipped": {value: reason}}}, values as strings.
        check_axes: case_id -> {axis: value}: the axis values each case stands for
            (RunConfig.check_axes; each row's `check_axes`).
    """

    cases: tuple[Case, ...]
    coverage: dict
    check_axes: dict


def default_check_cases(backend, deep: bool = False) -> tuple[list[Case], dict]:
    """The default check suite for `backend` and its coverage record.

    Args:
        backend: an adapter (its `capabilities` and `supports(case)` are read; nothing runs).
        deep: more values on every axis (`treebench check --deep`).

    Returns:
        (cases, coverage): see DefaultCheck.
    """
    d = default_check(backend, deep)
    return list(d.cases), d.coverage


CHECK_CALLS = 3   # calls of each prepared callable in a check: the later ones must repeat the first bitwise
REPREPARE = "a second batch of the same shapes with other Q/K/V and block tables and other trees of the same sizes"
REPREPARE_STEP = "re-prepare on a second batch"   # how a row's reason names a failure of that step (run.verify)
# A row's `failed_step`, the step where its failure was found (None: it passed), by run.verify.check_pair in a
# check, by run.pair in a run (FIRST_PREPARE, then TIMING):
FIRST_PREPARE = "first prepare"   # the first batch: prepare, its first call, the comparison, the inputs left as given
REPEAT = "repeat"                 # the first batch's later calls: the first call's output passed the comparison
# RE_PREPARE (model.coverage): the second batch (REPREPARE), its later calls included
TIMING = "timing"                 # a run's timed calls, the call after them compared again, the inputs left as given
FAILED_STEPS = (FIRST_PREPARE, REPEAT, RE_PREPARE, TIMING)
# The `failed_step` of an --isolate worker that died or timed out before its pair entered a step (loading the
# backend, building the inputs, supports(), the memory check), by run.isolate; past that, the step it was in
WORKER_DIED = "worker died"
WORKER_TIMED_OUT = "worker timed out"
# The `failed_step` of every pair of a backend whose file or module, loaded first in a worker process under
# --isolate, ended that process (os._exit, sys.exit, a crash) or hung it there (sweep.imports), and of a pair
# whose worker could not load it (run.isolate): nothing of it ran
IMPORT = "import"


def default_check(backend, deep: bool = False, device: str | None = None) -> DefaultCheck:
    """The default check for `backend` (see the module docstring for its axes).

    Args:
        backend: an adapter; `capabilities` (default: any) and `supports(case)` are read.
        deep: more values on every axis.
        device: the runner's torch device type; None: cuda when torch sees one, else cpu.
    """
    caps = getattr(backend, "capabilities", None) or Capabilities()
    base = base_case(caps)
    coverage = new_coverage()
    labels: dict[str, dict[str, str]] = {}
    cases: dict[str, Case] = {}
    for axis, value, case in axis_values(base, caps, deep):
        reason = _declined(backend, caps, case)
        note(coverage, axis, value, reason)
        cases.setdefault(case.case_id, case)
        labels.setdefault(case.case_id, {})[axis] = value
    _note_device(coverage, caps, device)
    return DefaultCheck(tuple(cases.values()), coverage, labels)


def check_steps(rows: list[dict]) -> dict:
    """The coverage entries of the steps no axis names, as the rows found them: "re-prepare"
    (in the rows that reached it: a pass, or `failed_step` RE_PREPARE) and "repeat" (the rows whose
    later calls were compared: `deterministic` set); a step no row reached has no entry."""
    reprepared = [r for r in rows if r.get("status") == "pass" or _failed_step(r) == RE_PREPARE]
    repeated = [r for r in rows if r.get("deterministic") is not None]
    steps = {}
    if reprepared:
        failed = sum(r.get("status") != "pass" for r in reprepared)
        steps[RE_PREPARE] = f"{REPREPARE}: {_tally(len(reprepared), failed, 'passed', 'failed')}"
    if repeated:
        differ = sum(r["deterministic"] is False for r in repeated)
        steps[REPEAT] = (f"{CHECK_CALLS} calls per prepare, the later ones against the first: "
                         + _tally(len(repeated), differ, "bitwise equal", "bitwise different"))
    return {step: {"ran": [found], "skipped": {}} for step, found in steps.items()}


def _failed_step(row: dict) -> str | None:
    """The row's `failed_step`; for a row written before the field existed (no such key), RE_PREPARE
    when its reason names that step (REPREPARE_STEP), else None: its other steps are not told apart."""
    if "failed_step" in row:
        return row["failed_step"]
    return RE_PREPARE if REPREPARE_STEP in str(row.get("reason") or "") else None


def _tally(n: int, bad: int, good_word: str, bad_word: str) -> str:
    """'good_word on all N cases' or 'good_word on N - bad, bad_word on bad of N cases'."""
    cases = "case" if n == 1 else "cases"
    if not bad:
        return f"{good_word} on {'the' if n == 1 else 'all'} {n} {cases}"
    return f"{good_word} on {n - bad}, {bad_word} on {bad} of {n} {cases}"


def _declined(backend, caps: Capabilities, case: Case) -> str | None:
    """The backend's reason not to run `case` (its supports(); capability_skip when it has none)."""
    supports = getattr(backend, "supports", None)
    if supports is None:
        return capability_skip(caps, case)
    try:
        reason = supports(case)
    except Exception:  # noqa: BLE001 -- a raising supports() is an error row when the case runs
        return None
    return reason if isinstance(reason, str) and reason else None


def _note_device(coverage: dict, caps: Capabilities, device: str | None) -> None:
    """The device axis: where the runner will put the backend's inputs, and the declared others."""
    gpu = torch.cuda.is_available()
    here = device or ("cuda" if gpu else "cpu")
    ran = here if here in caps.devices else caps.devices[0]
    for d in ("cpu", "cuda"):
        if d not in caps.devices:
            note(coverage, "device", d, "not among the backend's devices")
        elif d == "cuda" and not gpu:
            note(coverage, "device", d, "no CUDA GPU visible to torch here")
        else:
            note(coverage, "device", d, None if d == ran else f"this check ran on {ran}")


# ---- the base case and the axes --------------------------------------------------------


def _allowed_page(caps: Capabilities, p: int) -> bool:
    return (caps.page_sizes is None or p in caps.page_sizes) and p % caps.page_size_multiple == 0


def _pick(preferred, allowed):
    """`preferred` when `allowed` (None: any) admits it, else the smallest allowed value."""
    return preferred if allowed is None or preferred in allowed else sorted(allowed)[0]


def base_case(caps: Capabilities) -> Case:
    """The small case every axis varies from, inside `caps` where it can be."""
    P = 16 if _allowed_page(caps, 16) else (min(p for p in caps.page_sizes if _allowed_page(caps, p))
                                            if caps.page_sizes else caps.page_size_multiple)
    G = int(_pick(2, caps.group_sizes))
    tree = "full:2:2" if caps.max_tree_size is None or caps.max_tree_size >= 7 else f"chain:{caps.max_tree_size - 1}"
    return Case(batch_size=2, context_len=P + 1, tree=tree, num_q_heads=BASE_HQ_PER_G * G, num_kv_heads=BASE_HKV,
                head_dim=int(_pick(64, caps.head_dims)), dtype=str(_pick("bfloat16", caps.dtypes)), page_size=P,
                layout="shuffled", tree_per_request="same")


def tree_spec(t: int) -> str:
    """A spec of exactly T nodes: a full binary tree at 2^k - 1, a chain at multiples of 32, else random."""
    if t > 2 and (t + 1) & t == 0:
        return f"full:2:{(t + 1).bit_length() - 2}"
    return f"chain:{t - 1}" if t % 32 == 0 or t <= 2 else f"random:{t - 1}:{t}"


def _tree_sizes(caps: Capabilities, deep: bool) -> list[int]:
    top = caps.max_tree_size or (DEEP_UNBOUNDED_MAX_T if deep else UNBOUNDED_MAX_T)
    sizes = set(TREE_SIZES) | ({*DEEP_TREE_SIZES} if deep else set()) | {top}
    if caps.max_tree_size:
        sizes.add(top + 1)                                   # just past the maximum: a skip with its reason
    return sorted(t for t in sizes if t <= top + 1)


def axis_values(base: Case, caps: Capabilities, deep: bool):
    """(axis, value label, case) for every axis value, the base case under every axis."""
    P, T = base.page_size, base.trees()[0].size
    yield "tree_size", str(T), base
    yield from (("tree_size", str(t), replace(base, tree=tree_spec(t))) for t in _tree_sizes(caps, deep))
    for p in sorted(set(PAGE_SIZES) | ({*DEEP_PAGE_SIZES} if deep else set())):
        yield "page_size", str(p), replace(base, page_size=p, context_len=p + 1)
    for dt in caps.dtypes or DTYPES_ANY:
        yield "dtype", dt, replace(base, dtype=dt)
    for d in sorted(set(HEAD_DIMS) | ({*DEEP_HEAD_DIMS} if deep else set()) | {base.head_dim}):
        yield "head_dim", str(d), replace(base, head_dim=d)
    for g in sorted(set(GROUP_SIZES) | ({*DEEP_GROUP_SIZES} if deep else set()) | {base.group_size}):
        yield "group_size", str(g), replace(base, num_q_heads=BASE_HKV * g, num_kv_heads=BASE_HKV)
    for h in sorted({*KV_HEADS, base.num_kv_heads}):
        yield "num_kv_heads", str(h), replace(base, num_q_heads=h * base.group_size, num_kv_heads=h)
    for b in sorted({*BATCH_SIZES, base.batch_size}):
        yield "batch_size", str(b), replace(base, batch_size=b)
    yield "batch_size", str(LARGE_BATCH), _large_batch(base, caps)
    yield from _context_values(base, P, T)
    yield "tree_per_request", "same", base
    yield "tree_per_request", "mixed", replace(base, batch_size=4, tree="full:3:2", tree_per_request="mixed")
    for layout in ("shuffled", "contiguous", "interleaved"):
        yield "layout", layout, replace(base, layout=layout)
    yield from _shape_values(base, P)
    for s in (1.0, *LOGIT_SCALES, *(DEEP_LOGIT_SCALES if deep else ())):
        yield "logit_scale", f"{s:g}", replace(base, logit_scale=s)
    yield "sm_scale", "1/sqrt(D)", base
    yield from (("sm_scale", f"{s:g}", replace(base, sm_scale=s)) for s in SM_SCALES)
    yield "values", "random", base
    yield "values", "position", replace(base, values="position")
    yield from _kv_values(base)
    if deep:
        yield from _deep_extras(base)


def _large_batch(base: Case, caps: Capabilities) -> Case:
    """B = LARGE_BATCH at Hkv 1 (one KV head: half the base's programs, cheap in Triton's interpreter),
    with contexts ragged over 0-2P where the backend takes them, so that per-request lengths
    clamped or wrapped at 32 requests differ from the right ones, else the base's."""
    context = f"ragged:0-{2 * base.page_size}" if caps.ragged_context else base.context_len
    return replace(base, batch_size=LARGE_BATCH, num_q_heads=base.group_size, num_kv_heads=1, context_len=context)


LONG_CONTEXT = 16384   # L_b of the long-context case: tokens enough for a float16 running sum to stall


def _context_values(base: Case, P: int, T: int):
    """L_b = 0, 1, P - 1, P, P + 1 for every request, then per request in one batch with
    S_b = P and 2P (a full last page, the next block-table entry a NaN page), then ragged."""
    for L in sorted({0, 1, max(P - 1, 0), P, P + 1}):
        yield "context_len", str(L), replace(base, context_len=L)
    per_request = [0, 1, max(P - 1, 0), P, P + 1, max(P - T, 0), 2 * P - T, 2 * P - T + 1]
    spec = "list:" + ",".join(map(str, per_request))
    yield "context_len", spec, replace(base, batch_size=len(per_request), context_len=spec)
    yield "context_len", f"ragged:0-{3 * P}", replace(base, batch_size=8, context_len=f"ragged:0-{3 * P}")
    # A long context with position-coded V: the channels of position bits above log2(L) are the
    # same in every row, so the output there is O(1) whatever L and a softmax denominator that
    # drifts over many tokens (accumulated in low precision) moves it past the tolerance.
    yield "context_len", f"{LONG_CONTEXT} (position values)", replace(base, batch_size=1, context_len=LONG_CONTEXT,
                                                                     values="position")


def _kv_values(base: Case):
    """The pool dtype: the query dtype, then each fp8 format with unequal power-of-two scales,
    and e4m3 on GQA G = 6, on "mean" values (a wrong mask moves a mean of position-coded V rows
    by whole fractions of a channel, far outside the fp8 tolerance) and with equal scales."""
    yield "kv_dtype", "same", base
    fp8 = base if base.dtype != "float32" else replace(base, dtype="bfloat16")   # fp8 KV takes bf16/fp16 queries
    ks, vs = FP8_SCALES
    for kv in FP8_DTYPES:
        # e5m2 codes x 0.25 fall below float16's smallest normal: such a format takes bf16 queries
        fits = not any(fp8_scale_error(kv, fp8.dtype, "k_scale", s) for s in FP8_SCALES)
        yield "kv_dtype", kv, replace(fp8 if fits else replace(fp8, dtype="bfloat16"), kv_dtype=kv, k_scale=ks,
                                      v_scale=vs)
    e4m3 = replace(fp8, kv_dtype=FP8_DTYPES[0], k_scale=ks, v_scale=vs)
    yield "kv_dtype", f"{FP8_DTYPES[0]} G=6", replace(e4m3, num_q_heads=12, num_kv_heads=2)
    yield "kv_dtype", f"{FP8_DTYPES[0]} mean values", replace(e4m3, values="mean")
    yield "kv_dtype", f"{FP8_DTYPES[0]} k_scale=v_scale", replace(e4m3, k_scale=FP8_EQUAL_SCALE,
                                                                    v_scale=FP8_EQUAL_SCALE)


def _shape_values(base: Case, P: int):
    """Shape coincidences, each a case where two extents a kernel could confuse are equal."""
    yield "shape", "Hq=T", replace(base, tree=tree_spec(8), num_q_heads=8, num_kv_heads=2)
    yield "shape", "B=T", replace(base, batch_size=base.trees()[0].size)
    yield "shape", "T=P", replace(base, tree=tree_spec(P))
    yield "shape", "G=T", replace(base, tree="full:3:1", num_q_heads=8, num_kv_heads=2)


def _deep_extras(base: Case):
    """More seeds of the base and mixed-tree cases, and position values on mixed trees."""
    mixed = replace(base, batch_size=4, tree="full:3:2", tree_per_request="mixed")
    for s in DEEP_SEEDS:
        yield "seed", str(s), replace(base, seed=s)
        yield "tree_per_request", f"mixed seed {s}", replace(mixed, seed=s)
    yield "values", "position on mixed trees", replace(mixed, values="position")
