"""The adapter contract (public: users plug in their own kernels) and the registry.

A backend is a class with `name`, `availability()`, `supports(case)` and
`prepare(inputs) -> Callable[[], Tensor]` (see docs/design.md), and optionally
`deterministic` (default True: repeated calls agree bitwise) and `returns_lse`
(default False; True: the callable returns `(out, lse)`, lse (sum T_b, Hq) float32
natural log, checked against the reference's). The prepared callable may carry a
`kernel` attribute, a short name of the path it runs (stored in every row). `inputs` is a
treebench.harness.model.paged.BackendInputs: the contract fields, never the
reference's logical K/V. `treebench check` prepares every backend twice (on two
batches of the same axes) and calls each callable twice, so `prepare` must not
keep state from one batch to the next. Register
it with `@register`. This module never imports its plug-ins: loading a backend by
name or by `pkg.mod:Class` / `path/file.py:Class` is treebench.harness.run.loading.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from treebench.harness.model.cases import Case
from treebench.harness.errors import BackendUnavailable, ConfigError
from treebench.harness.model.paged import BackendInputs

REGISTRY: dict[str, type["Backend"]] = {}
# Prefix of the module names under which treebench.harness.run.loading imports a backend file
# (`path/file.py:Class`): `source_of` shows such a class by its file, not by that name.
FILE_MODULE_PREFIX = "treebench_user_"


@dataclass(frozen=True)
class Capabilities:
    """What a backend can run, as data the runner reads before running anything.

    None in a field means "any". `kv_dtypes` is the exception: backends opt in to
    other pool dtypes (fp8 above all), so its default, (), means "KV in the query
    dtype only".
    """

    devices: tuple[str, ...] = ("cpu", "cuda")          # torch device types it runs on
    dtypes: tuple[str, ...] | None = None               # case dtype names
    page_sizes: tuple[int, ...] | None = None           # allowed P values
    page_size_multiple: int = 1                         # P must be a multiple of this
    head_dims: tuple[int, ...] | None = None            # allowed D values
    group_sizes: tuple[int, ...] | None = None          # allowed G = Hq / Hkv
    max_tree_size: int | None = None                    # largest T_b
    per_request_trees: bool = True                      # tree_per_request == "mixed"
    ragged_context: bool = True                         # context_len "ragged:LO-HI"
    min_compute_capability: tuple[int, int] | None = None  # CUDA (major, minor)
    # Pool dtypes read besides the query dtype (always read), e.g. ("float8_e4m3fn",): a stored code c
    # means float(c) * inputs.k_scale (K) or * inputs.v_scale (V). Default (): KV in the query dtype only.
    kv_dtypes: tuple[str, ...] = ()


class Backend:
    """Base class of adapters. Subclasses set `name` and `capabilities` and
    implement `prepare`; they may override `availability` and `supports`."""

    name: ClassVar[str] = ""
    capabilities: ClassVar[Capabilities] = Capabilities()
    mask_kind: ClassVar[str] = "tree"   # "tree", or "causal": checked against a causal reference
    device: ClassVar[str | None] = None  # preferred torch device type; None = the runner's
    install_hint: ClassVar[str] = ""     # how to get the optional package, prefixed to its ImportError
    # True: two calls of one prepared callable return bitwise-equal outputs, which `treebench check`
    # requires (a difference fails the row). False (e.g. split-K with atomic adds): the check compares
    # each call with the reference within tolerance instead and the row's reason says so.
    deterministic: ClassVar[bool] = True
    # True: the prepared callable returns (out, lse), lse (sum T_b, Hq) float32, the natural-log
    # sum of exp of the scaled scores per node and head (-inf for a row that sees nothing), and the
    # check compares it with the reference's (treebench.harness.model.compare.compare_lse).
    returns_lse: ClassVar[bool] = False
    # The base of the returned LSE's logarithm, when it is not e (FlashInfer's kernels write base 2):
    # the check converts it to natural log after the call, so the timed callable does no extra work.
    lse_base: ClassVar[float] = math.e
    # True: the prepared callable launches Triton kernels, which run in Triton's CPU interpreter while
    # TRITON_INTERPRET is on; a dry run's time estimate then says that it does not model them.
    runs_triton: ClassVar[bool] = False

    def availability(self) -> str | None:
        """None when usable here, else the reason (missing package + install hint, no GPU, ...)."""
        caps = self.capabilities
        try:  # the missing package first: its install hint is the first thing to fix
            self.load_optional()
        except ImportError as e:
            return f"{self.install_hint} ({e})"
        if "cpu" not in caps.devices and not torch.cuda.is_available():
            return "needs a CUDA GPU; none is visible to torch"
        if caps.min_compute_capability and torch.cuda.is_available():
            cc = torch.cuda.get_device_capability()
            if cc < caps.min_compute_capability:
                return f"needs compute capability >= {caps.min_compute_capability}, this GPU is {cc}"
        return None

    def load_optional(self) -> object:
        """Imports the adapter's optional package and returns its entry points.

        Override in adapters of an optional package (imports stay inside, so a
        missing package is a skip, not an import crash). Raises ImportError.
        """
        return None

    def optional(self) -> Any:
        """`load_optional()` for `prepare`.

        Raises:
            BackendUnavailable: the package is missing (message: install_hint + cause).
        """
        try:
            return self.load_optional()
        except ImportError as e:
            raise BackendUnavailable(f"{self.install_hint} ({e})") from None

    def supports(self, case: Case) -> str | None:
        """None when `case` can run, else the reason; default reads `capabilities`."""
        return capability_skip(self.capabilities, case)

    def prepare(self, inputs: BackendInputs) -> Callable[[], torch.Tensor]:
        """Untimed setup; returns the timed zero-argument callable producing
        (sum T_b, Hq, D) in inputs.dtype, or (that, lse (sum T_b, Hq) float32) when `returns_lse`."""
        raise NotImplementedError


def capability_skip(caps: Capabilities, case: Case) -> str | None:
    """The first reason `caps` rules `case` out, or None."""
    P, D, G = case.page_size, case.head_dim, case.group_size
    if caps.dtypes is not None and case.dtype not in caps.dtypes:
        return f"dtype {case.dtype} not supported (supports {', '.join(caps.dtypes)})"
    if case.kv_dtype is not None and case.kv_dtype not in caps.kv_dtypes:
        also = f" and {', '.join(caps.kv_dtypes)}" if caps.kv_dtypes else ""
        return (f"kv_dtype {case.kv_dtype} not supported (reads KV in the query dtype{also}; "
                "Capabilities.kv_dtypes opts in)")
    if caps.page_sizes is not None and P not in caps.page_sizes:
        return f"page size {P} not supported (supports {caps.page_sizes})"
    if P % caps.page_size_multiple:
        return f"page size {P} is not a multiple of {caps.page_size_multiple}"
    if caps.head_dims is not None and D not in caps.head_dims:
        return f"head dim {D} not supported (supports {caps.head_dims})"
    if caps.group_sizes is not None and G not in caps.group_sizes:
        return f"GQA group size {G} not supported (supports {caps.group_sizes})"
    if not caps.per_request_trees and case.tree_per_request == "mixed":
        return "per-request trees not supported: one tree bias is shared by the batch"
    if not caps.ragged_context and case.is_ragged:
        return "ragged context lengths not supported"
    if caps.max_tree_size is not None:
        t = max(tr.size for tr in case.trees())
        if t > caps.max_tree_size:
            return f"tree of {t} nodes exceeds the backend's maximum {caps.max_tree_size}"
    return None


def reason_type_error(got: object, method: str, backend: object) -> str | None:
    """None when `got`, what `backend`'s `method` ("availability()" or "supports()") returned,
    keeps the contract (None or a reason string); else the error reason naming the backend and the
    type it returned instead (the pair's row is an error: the backend's code broke the contract)."""
    if got is None or isinstance(got, str):
        return None
    try:
        shown = f" {got!r}"[:81]
    except Exception:  # noqa: BLE001 -- a backend's object: its __repr__ may raise
        shown = ""
    return (f"TypeError: {method} of backend {getattr(backend, 'name', type(backend).__name__)!r} returned "
            f"{type(got).__name__}{shown}, expected None or a reason string")


def source_of(cls: type) -> str:
    """Where a backend class is defined, as `--backend` takes it: 'path/file.py:Class' for a class of a
    file loaded by path (its absolute path), else 'package.module:Class'."""
    where = cls.__module__
    file = getattr(sys.modules.get(where), "__file__", None)
    if where.startswith(FILE_MODULE_PREFIX) and file:
        where = file
    return f"{where}:{cls.__qualname__}"


def register(cls: type[Backend]) -> type[Backend]:
    """Class decorator: adds `cls` to REGISTRY under `cls.name`. The same class imported again (its
    module loaded a second time) replaces itself.

    Raises:
        ValueError: a `name` that is not a string or is empty or blank, in the words loading gives it
            ("Mine.name is ''; set `name` to a non-empty string").
        ConfigError: a name another class holds, naming both classes' sources.
    """
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{cls.__name__}.name is {name!r}; set `name` to a non-empty string")
    old = REGISTRY.get(cls.name)
    if old is not None and source_of(old) != source_of(cls):
        raise ConfigError(f"backend name {cls.name!r} is registered by both {source_of(old)} and "
                          f"{source_of(cls)}; give one of them another `name`")
    REGISTRY[cls.name] = cls
    return cls


def check_unique_names(backends) -> None:
    """Refuses two backends of one name in a run (their rows would be merged under that name).

    Raises:
        ConfigError: naming the duplicate and where each class that shares it is defined.
    """
    seen: dict[str, object] = {}
    for b in backends:
        name = getattr(b, "name", type(b).__name__)
        if name in seen:
            first, second = source_of(type(seen[name])), source_of(type(b))
            if first == second:
                raise ConfigError(f"{first} (backend name {name!r}) is given twice; name each backend once")
            raise ConfigError(f"backend name {name!r} is used by both {first} and {second}; "
                              "give each backend class its own `name`")
        seen[name] = b
