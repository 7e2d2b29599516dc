"""Cases: one point of a suite's axes, frozen and validated.

The runner alone expands a suite's axes into cases (`expand_axes`); suites only
declare axes (see suites/*.toml and docs/design.md "Suite file").
"""

from __future__ import annotations

import hashlib
import itertools
import math
import json
import random
import re
from dataclasses import dataclass, fields
from typing import TypeGuard

from treebench.harness.errors import ConfigError
from treebench.harness.model.trees import TokenTree

from treebench.harness.model.tree_specs import canonical_spec, parse_tree

DTYPES = ("bfloat16", "float16", "float32")
LAYOUTS = ("contiguous", "shuffled", "interleaved")
TREE_MODES = ("same", "mixed")
VALUE_MODES = ("random", "position", "mean")
FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")   # KV pools of 8-bit codes: a stored code c means float(c) * scale
KV_DTYPES = ("bfloat16", "float16", *FP8_DTYPES)  # kv_dtype values (None: the query dtype)
FP8_PREFIX = {"float8_e4m3fn": "kvfp8e4m3", "float8_e5m2": "kvfp8e5m2"}  # case-id prefix of an fp8 pool
# (finite max, smallest normal) of the fp8 formats and of the query dtypes fp8 pools take: OCP 8-bit Floating
# Point Specification (OFP8) rev 1.0, table 1 (E4M3: 448, 2^-6; E5M2: 57344, 2^-14); IEEE 754 binary16; bfloat16
# has float32's exponents. They equal torch.finfo(dtype).max / .smallest_normal (tests/test_fp8.py checks).
FLOAT_RANGE = {"float8_e4m3fn": (448.0, 2.0**-6), "float8_e5m2": (57344.0, 2.0**-14),
               "bfloat16": (3.3895313892515355e38, 2.0**-126), "float16": (65504.0, 2.0**-14)}
PHYSICAL_AXES = ("layout", "page_size")  # how K/V are stored, not what they are
STORAGE_AXES = ("kv_dtype", "k_scale", "v_scale")  # the pool's number format: no stream's seed reads them
UNSEEDED_AXES = (*STORAGE_AXES, "sm_scale")  # read by no stream's seed: such a case draws its default twin's values
# Axes added after case ids were first stored: left out of `axes` (so of the id and the seeds)
# while they hold these defaults, so every earlier case keeps its id and its draws.
# kv_dtype None means "the query dtype" (a kv_dtype equal to `dtype` is stored as None).
LATER_AXES = {"logit_scale": 1.0, "values": "random", "kv_dtype": None, "k_scale": 1.0, "v_scale": 1.0,
              "sm_scale": None}
MAX_LOGIT_SCALE = 1e6  # sqrt(1e6) * N(0, 1) draws stay far inside fp16's range (65504)
# Upper bounds: a value past these is a typo (1e9 requests would hang in context_lens before any memory check).
MAX_AXIS = {"batch_size": 65536, "num_q_heads": 1024, "num_kv_heads": 1024, "head_dim": 1024, "page_size": 4096}
MAX_CONTEXT_LEN = 2**24
CONTEXT_FORMS = {"ragged": ("-", "ragged:LO-HI, e.g. ragged:16-2048"),   # context_len text: form -> (separator, usage)
                 "list": (",", "list:L0,L1,... with one integer >= 0 per request, e.g. list:0,1,15,16,17")}
# What each axis takes, in words: the fix that the line refusing a value gives (a suite's axis or a Case field).
AXIS_VALUES = {
    "batch_size": "a positive integer (B), e.g. 4",
    "context_len": "an integer >= 0, 'ragged:LO-HI' or 'list:L0,L1,...'",
    "tree": "a tree spec string, e.g. 'full:3:2', 'chain:4' or 'parents:-1,0,0'",
    "num_q_heads": "a positive integer (Hq), e.g. 32",
    "num_kv_heads": "a positive integer (Hkv) that divides num_q_heads, e.g. 8",
    "head_dim": "a positive integer (D), e.g. 128",
    "dtype": f"one of {', '.join(DTYPES)}",
    "page_size": "a positive integer (P), e.g. 16",
    "layout": f"one of {', '.join(LAYOUTS)}",
    "tree_per_request": "'same' or 'mixed'",
    "seed": "an integer, e.g. 0",
    "logit_scale": f"a number in (0, {MAX_LOGIT_SCALE:g}], e.g. 1.0",
    "values": f"one of {', '.join(VALUE_MODES)}",
    "kv_dtype": f"one of {', '.join(KV_DTYPES)} (leave kv_dtype out for the query dtype)",
    "k_scale": "a positive finite number (other than 1.0 on an fp8 kv_dtype only)",
    "v_scale": "a positive finite number (other than 1.0 on an fp8 kv_dtype only)",
    "sm_scale": "a positive finite number, e.g. 0.125 (leave sm_scale out for 1/sqrt(D))",
}


@dataclass(frozen=True)
class Case:
    """One benchmark case: a batch of B requests verifying token trees.

    Every field is an axis a suite may sweep.
    """

    batch_size: int                # B: requests in the batch
    context_len: int | str         # L_b for every request, "ragged:LO-HI" drawn per request, or "list:L0,L1,..." (B of them)
    tree: str                      # tree spec (any DESIGN.md format); T = its node count
    num_q_heads: int = 32          # Hq
    num_kv_heads: int = 8          # Hkv; G = Hq / Hkv
    head_dim: int = 128            # D
    dtype: str = "bfloat16"        # input/output dtype: bfloat16 | float16 | float32
    page_size: int = 16            # P: tokens per KV page
    layout: str = "shuffled"       # physical page layout: contiguous | shuffled | interleaved
    tree_per_request: str = "same"  # "same": every request uses `tree`; "mixed": random trees per request
    seed: int = 0                  # base seed; with the case id it fixes every random draw
    logit_scale: float = 1.0       # Q and K scaled by sqrt(this): scores q.k / sqrt(D) of std ~logit_scale
    values: str = "random"         # V: "random" N(0, 1), "position": +-(1 + h/Hkv) by the bits of the position,
                                   # "mean": position V with Q = K = 0 (each output row: the mean of the V rows it sees)
    kv_dtype: str | None = None    # the K/V pool's dtype: None (= dtype), bfloat16, float16, float8_e4m3fn, float8_e5m2
    k_scale: float = 1.0           # per-tensor K scale: a stored K code c means float(c) * k_scale (fp8 pools only)
    v_scale: float = 1.0           # per-tensor V scale, likewise
    sm_scale: float | None = None  # softmax scale (inputs.sm_scale): scores q.k * sm_scale; None: 1/sqrt(D)

    def __post_init__(self) -> None:
        for name in ("batch_size", "num_q_heads", "num_kv_heads", "head_dim", "page_size"):
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                raise _bad_field(name, v)
            if v > MAX_AXIS[name]:
                raise ConfigError(f"case field {name}={v}: exceeds the limit {MAX_AXIS[name]}; use a value <= {MAX_AXIS[name]}")
        if self.num_q_heads % self.num_kv_heads:
            raise ConfigError(
                f"case num_q_heads={self.num_q_heads} is not a multiple of num_kv_heads={self.num_kv_heads}: GQA needs Hq % Hkv == 0")
        if self.dtype not in DTYPES:
            raise ConfigError(f"case field dtype={self.dtype!r}: use one of {', '.join(DTYPES)}")
        if self.layout not in LAYOUTS:
            raise ConfigError(f"case field layout={self.layout!r}: use one of {', '.join(LAYOUTS)}")
        if self.tree_per_request not in TREE_MODES:
            raise ConfigError(f"case field tree_per_request={self.tree_per_request!r}: use 'same' or 'mixed'")
        if self.values not in VALUE_MODES:
            raise ConfigError(f"case field values={self.values!r}: use one of {', '.join(VALUE_MODES)}")
        if not _is_int(self.seed):   # True is an int to Python, and would be a case of its own
            raise _bad_field("seed", self.seed)
        self._check_logit_scale()
        self._check_sm_scale()
        self._check_kv()
        self.context_range()  # validates context_len
        object.__setattr__(self, "context_len", canonical_context(self.context_len))  # one case id per spelling
        if not isinstance(self.tree, str):
            raise _bad_field("tree", self.tree)
        parse_tree(self.tree)  # validates tree; raises TreeError (a ConfigError)
        object.__setattr__(self, "tree", canonical_spec(self.tree))  # one case id per tree spelling

    def _check_logit_scale(self) -> None:
        """Validates logit_scale and stores it as a float (1000 and 1000.0 are one case id).

        Raises:
            ConfigError: not a number, not finite, <= 0 or above MAX_LOGIT_SCALE.
        """
        v = self.logit_scale
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= MAX_LOGIT_SCALE:
            raise ConfigError(f"case field logit_scale={v!r}: must be a number in (0, {MAX_LOGIT_SCALE:g}]")
        object.__setattr__(self, "logit_scale", float(v))

    def _check_sm_scale(self) -> None:
        """Validates sm_scale and stores it as a float (1 and 1.0 are one case id), or as None when
        it equals 1/sqrt(D) (the default spelt out is the default case).

        Raises:
            ConfigError: not None and not a positive finite number.
        """
        v = self.sm_scale
        if v is None:
            return
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
            raise _bad_field("sm_scale", v)
        object.__setattr__(self, "sm_scale", None if v == self.head_dim ** -0.5 else float(v))

    @property
    def softmax_scale(self) -> float:
        """The scale the scores q.k are multiplied by: sm_scale, or 1/sqrt(D) when it is None."""
        return self.head_dim ** -0.5 if self.sm_scale is None else self.sm_scale

    def _check_kv(self) -> None:
        """Validates kv_dtype, k_scale and v_scale; stores a kv_dtype equal to `dtype` as None and the
        scales as floats (one case id per spelling).

        Raises:
            ConfigError: an unknown kv_dtype; an fp8 pool under float32 queries (not supported: fp8
                kernels compute in bf16/fp16); a scale that is not a positive finite number, one whose
                dequantised codes leave the query dtype's normal range (`fp8_scale_error`), or one
                other than 1.0 on a pool that is not fp8 (a bf16/fp16 pool stores values, not codes).
        """
        kv = self.kv_dtype
        if kv == self.dtype:
            kv = None
            object.__setattr__(self, "kv_dtype", None)
        if kv is not None and kv not in KV_DTYPES:
            raise ConfigError(f"case field kv_dtype={kv!r}: use one of {', '.join(KV_DTYPES)} (or leave it out: "
                              "the query dtype)")
        if self.kv_fp8 and self.dtype == "float32":
            raise ConfigError(f"case kv_dtype={kv} with dtype=float32: fp8 KV is not supported with float32 queries; "
                              "use dtype bfloat16 or float16")
        for name in ("k_scale", "v_scale"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
                raise ConfigError(f"case field {name}={v!r}: must be a positive finite number")
            if v != 1.0 and not self.kv_fp8:
                raise ConfigError(f"case field {name}={v!r}: scales apply to fp8 pools only; set kv_dtype to one of "
                                  f"{', '.join(FP8_DTYPES)} or leave {name} at 1.0")
            problem = fp8_scale_error(kv, self.dtype, name, v) if kv in FP8_DTYPES else None
            if problem:
                raise ConfigError(f"case field {name}={v:g}: {problem}")
            object.__setattr__(self, name, float(v))

    @property
    def kv_dtype_name(self) -> str:
        """The pool's dtype name: kv_dtype, or the query dtype when kv_dtype is None."""
        return self.kv_dtype or self.dtype

    @property
    def kv_fp8(self) -> bool:
        """True when the pool holds fp8 codes (kv_dtype float8_e4m3fn or float8_e5m2)."""
        return self.kv_dtype in FP8_DTYPES

    # ---- derived -----------------------------------------------------------------
    @property
    def group_size(self) -> int:
        """G = Hq / Hkv."""
        return self.num_q_heads // self.num_kv_heads

    def context_range(self) -> tuple[int, int]:
        """(LO, HI) inclusive bounds of L_b; LO == HI for a fixed context length.

        Raises:
            ConfigError: malformed context_len (`context_spec_lengths`), or a list of other than B lengths.
        """
        c = self.context_len
        if _is_int(c):
            if c < 0:
                raise ConfigError(f"case field context_len={c}: must be >= 0")
            if c > MAX_CONTEXT_LEN:
                raise ConfigError(f"case field context_len={c}: exceeds the limit 2**24 = {MAX_CONTEXT_LEN}")
            return c, c
        kind, ls = context_spec_lengths(c)
        if kind == "list" and len(ls) != self.batch_size:
            raise ConfigError(f"case field context_len={c!r}: {len(ls)} context lengths for batch_size="
                              f"{self.batch_size}; give one per request")
        return min(ls), max(ls)

    @property
    def is_ragged(self) -> bool:
        lo, hi = self.context_range()
        return lo != hi

    @property
    def axes(self) -> dict:
        """The case's fields as a plain dict (the result row's `case`); LATER_AXES at
        their defaults are left out, so cases written before they existed keep their ids."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}   # every field a scalar: asdict's deep copy is no need
        for name, default in LATER_AXES.items():
            if d[name] == default:
                del d[name]
        return d

    @property
    def case_id(self) -> str:
        """Stable id: readable prefix plus a hash of all axes."""
        axes = self.axes
        h = hashlib.sha1(json.dumps(axes, sort_keys=True).encode()).hexdigest()[:10]
        return (f"B{self.batch_size}-L{self.context_len}-{self.tree}-{self.tree_per_request}-"
                f"H{self.num_q_heads}x{self.num_kv_heads}-D{self.head_dim}-P{self.page_size}-"
                f"{self.dtype}-{self.layout}-{self._later_prefix(axes)}{h}")

    def _later_prefix(self, axes: dict) -> str:
        """'logit1000-vposition-kvfp8e4m3-ks0.25-vs0.5-sm0.3-' for LATER_AXES away from their defaults ('' otherwise);
        `axes` is self.axes."""
        parts = [f"logit{self.logit_scale:g}"] if "logit_scale" in axes else []
        parts += [f"v{self.values}"] if "values" in axes else []
        kv = self.kv_dtype_name
        parts += [FP8_PREFIX.get(kv, f"kv{kv}")] if "kv_dtype" in axes else []
        parts += [f"ks{self.k_scale:g}"] if "k_scale" in axes else []
        parts += [f"vs{self.v_scale:g}"] if "v_scale" in axes else []
        parts += [f"sm{self.sm_scale:g}"] if "sm_scale" in axes else []
        return "".join(p + "-" for p in parts)

    def rng(self, stream: str) -> random.Random:
        """A Python RNG seeded by (seed, case axes, stream name): per-case, order-free.

        The physical layout (`layout`, `page_size`) feeds only the "layout" stream,
        so one logical case (trees, context lengths, Q/K/V) is the same under every
        layout and page size; the pool's format and the softmax scale (UNSEEDED_AXES) feed
        none, so an fp8 case draws the values (and pages) of its bf16/fp16 twin and stores
        their codes, and a case with sm_scale set draws those of its 1/sqrt(D) twin.
        """
        axes = {k: v for k, v in self.axes.items() if k not in UNSEEDED_AXES}
        if stream != "layout":
            axes = {k: v for k, v in axes.items() if k not in PHYSICAL_AXES}
        blob = json.dumps([axes, stream], sort_keys=True)
        return random.Random(int(hashlib.sha1(blob.encode()).hexdigest()[:15], 16))

    def torch_seed(self, stream: str) -> int:
        """An integer seed for torch generators, derived like `rng`."""
        return self.rng(stream).getrandbits(62)

    def context_lens(self) -> list[int]:
        """L_b for b in [0, B): constant, the given list, or drawn uniformly in [LO, HI] from the case seed."""
        lo, hi = self.context_range()
        if isinstance(self.context_len, str) and self.context_len.startswith("list:"):
            return context_spec_lengths(self.context_len)[1]
        r = self.rng("context_lens")
        return [r.randint(lo, hi) for _ in range(self.batch_size)]

    def trees(self) -> list[TokenTree]:
        """The B token trees. "same": `tree` for all. "mixed": request 0 gets `tree`,
        the others random trees of 1..T nodes (spec random:N:SEED) from the case seed."""
        base = parse_tree(self.tree)
        if self.tree_per_request == "same":
            return [base] * self.batch_size
        r = self.rng("trees")
        out = [base]
        for _ in range(1, self.batch_size):
            n = r.randint(0, max(base.size - 1, 1))
            out.append(parse_tree(f"random:{n}:{r.randint(0, 2**31 - 1)}"))
        return out


def _is_int(v: object) -> TypeGuard[int]:
    """Whether `v` is an int and not a bool (which Python counts as one)."""
    return isinstance(v, int) and not isinstance(v, bool)


def context_spec_lengths(c: object) -> tuple[str, list[int]]:
    """The form ('ragged' | 'list') and integers of a context_len spec: 'ragged:16-2048' -> ('ragged', [16, 2048]),
    'list:0,1,15' -> ('list', [0, 1, 15]). Each integer is written in ASCII digits 0-9, as every number treebench
    reads ('016' is 16: `canonical_context` drops the zero); a '_', a sign, a space or another script's digits,
    which int() reads ('ragged:1_6-20', 'list:+1,２'), are refused: each would be a second case id for one case.

    Raises:
        ConfigError: not a 'ragged:' or 'list:' spec; an integer not so written, or outside [0, 2**24]; LO > HI.
    """
    kind, sep, rest = c.partition(":") if isinstance(c, str) else ("", "", "")
    if not sep or kind not in CONTEXT_FORMS:
        raise _bad_field("context_len", c)
    split, usage = CONTEXT_FORMS[kind]
    parts = rest.split(split)
    bad = next((p for p in parts if not re.fullmatch(r"-?[0-9]+", p)), None)
    if bad is not None or (kind == "ragged" and len(parts) != 2):
        what = f"{bad!r} is not an integer (ASCII digits 0-9, no '_')" if bad is not None else "two integers"
        raise ConfigError(f"case field context_len={c!r}: {what}; write {usage}")
    digits = [p.lstrip("0") or "0" for p in parts]   # int() reads at most 4300 digits, leading zeros counted
    if any(p[0] == "-" or len(d) > 8 or int(d) > MAX_CONTEXT_LEN for p, d in zip(parts, digits)):  # 2**24: 8 digits
        raise ConfigError(f"case field context_len={c!r}: every L_b must be in [0, 2**24]; 2**24 = {MAX_CONTEXT_LEN} is the limit")
    if kind == "ragged" and int(digits[0]) > int(digits[1]):
        raise ConfigError(f"case field context_len={c!r}: need 0 <= LO <= HI")
    return kind, [int(d) for d in digits]


def canonical_context(c: object) -> object:
    """A context_len as a case holds it: an int as it is, a spec with its integers as str(int()) writes them
    ('ragged:016-2048' -> 'ragged:16-2048': one case id per set of lengths). Raises ConfigError where
    `context_spec_lengths` does."""
    if not isinstance(c, str):
        return c
    kind, ls = context_spec_lengths(c)
    return f"{kind}:{CONTEXT_FORMS[kind][0].join(map(str, ls))}"


def _bad_field(name: str, value: object) -> ConfigError:
    """The error for Case field `name` given `value`: what the field takes (AXIS_VALUES)."""
    return ConfigError(f"case field {name}={value!r}: must be {AXIS_VALUES[name]}")


def fp8_scale_error(kv_dtype: str, dtype: str, name: str, scale: float) -> str | None:
    """Why codes of the fp8 format `kv_dtype` times `scale` (> 0, finite) are no test for queries of
    `dtype` (bfloat16 | float16), or None when `scale` is fine. Three bounds, each with its reason:
    the largest finite code times `scale` must not exceed the query dtype's max (else it dequantises
    to inf); the smallest normal code times `scale` must not fall below its smallest normal (else
    codes flush towards zero); and a value of magnitude 1 (the draws are N(0, 1)) must code inside
    the format's normal range, 1 / scale in [smallest normal, max] (else every code saturates at the
    max or flushes towards zero and the pool holds no information). The reason names the first bound
    broken and the range all three allow. Ranges: FLOAT_RANGE. `name` (k_scale | v_scale) is the
    field the reason names."""
    (top, tiny), (q_top, q_tiny) = FLOAT_RANGE[kv_dtype], FLOAT_RANGE[dtype]
    lo, hi = max(q_tiny / tiny, 1 / top), min(q_top / top, 1 / tiny)
    if lo <= scale <= hi:
        return None
    if top * scale > q_top:
        why = f"{kv_dtype}'s max {top:g} x {name} overflows {dtype}'s max {q_top:g}"
    elif tiny * scale < q_tiny:
        why = f"{kv_dtype}'s smallest normal {tiny:g} x {name} is below {dtype}'s smallest normal {q_tiny:g}"
    else:
        why = (f"a value of 1 codes to 1 / {name} = {1 / scale:g}, outside {kv_dtype}'s normal range "
               f"[{tiny:g}, {top:g}] (the draws are N(0, 1))")
    return f"{why}; use {lo:g} <= {name} <= {hi:g}"


CASE_FIELDS = tuple(f.name for f in fields(Case))
REQUIRED_AXES = ("batch_size", "context_len", "tree")  # the fields without a default
MAX_CASES = 100_000  # a product of axes larger than this is a typo, not a sweep


def expand_axes(axes: dict) -> list[Case]:
    """Cartesian product of suite axes into cases (the runner's job alone).

    Args:
        axes: field name -> list of values (a scalar counts as a one-item list).

    Raises:
        ConfigError: unknown axis name, empty axis, or an invalid case.
    """
    unknown = sorted(set(axes) - set(CASE_FIELDS))
    if unknown:
        raise ConfigError(f"suite axes: unknown axis {unknown[0]!r}; known axes are {', '.join(CASE_FIELDS)}")
    names = list(axes)
    values = [v if isinstance(v, list) else [v] for v in axes.values()]
    for n, v in zip(names, values):
        if not v:
            raise ConfigError(f"suite axis {n!r} is empty: give at least one value")
    missing = [f for f in REQUIRED_AXES if f not in axes]
    if missing:
        raise ConfigError(f"suite axes: axis {missing[0]!r} is required ({', '.join(REQUIRED_AXES)} must each be given)")
    count = math.prod(len(v) for v in values)
    if count > MAX_CASES:
        raise ConfigError(f"suite axes: {count} cases, more than {MAX_CASES}; split the suite or use fewer values")
    return [Case(**dict(zip(names, combo))) for combo in itertools.product(*values)]
