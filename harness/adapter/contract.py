"""The adapter contract (public: users plug in their own kernels) and the registry.

A backend is a class with `name`, `availability()`, `supports(case)` and
`prepare(inputs) -> Callable[[], Tensor]` (see docs/design.md). Register
it with `@register`; load a user's with `load_backend("pkg.mod:Class")` or
`load_backend("path/file.py:Class")`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from treebench.harness.model.cases import Case
from treebench.harness.errors import BackendUnavailable, ConfigError
from treebench.harness.model.paged import BatchInputs

REGISTRY: dict[str, type["Backend"]] = {}


@dataclass(frozen=True)
class Capabilities:
    """What a backend can run, as data the runner reads before running anything.

    None in a field means "any".
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


class Backend:
    """Base class of adapters. Subclasses set `name` and `capabilities` and
    implement `prepare`; they may override `availability` and `supports`."""

    name: ClassVar[str] = ""
    capabilities: ClassVar[Capabilities] = Capabilities()
    mask_kind: ClassVar[str] = "tree"   # "tree", or "causal": checked against a causal reference
    device: ClassVar[str | None] = None  # preferred torch device type; None = the runner's
    install_hint: ClassVar[str] = ""     # how to get the optional package, prefixed to its ImportError

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

    def prepare(self, inputs: BatchInputs) -> Callable[[], torch.Tensor]:
        """Untimed setup; returns the timed zero-argument callable producing
        (sum T_b, Hq, D) in inputs.dtype."""
        raise NotImplementedError


def capability_skip(caps: Capabilities, case: Case) -> str | None:
    """The first reason `caps` rules `case` out, or None."""
    P, D, G = case.page_size, case.head_dim, case.group_size
    if caps.dtypes is not None and case.dtype not in caps.dtypes:
        return f"dtype {case.dtype} not supported (supports {', '.join(caps.dtypes)})"
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


def register(cls: type[Backend]) -> type[Backend]:
    """Class decorator: adds `cls` to REGISTRY under `cls.name`.

    Raises:
        ValueError: empty or duplicate name.
    """
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} has no name")
    if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
        raise ValueError(f"backend name {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls


def _load_class(spec: str) -> type:
    target, _, cls_name = spec.rpartition(":")
    if target.endswith(".py") or "/" in target:
        path = Path(target)
        if not path.is_file():
            raise ConfigError(f"--backend {spec!r}: file {target} not found")
        mod_name = f"treebench_user_{abs(hash(str(path.resolve())))}"
        s = importlib.util.spec_from_file_location(mod_name, path)
        if s is None or s.loader is None:
            raise ConfigError(f"--backend {spec!r}: {target} is not a Python file (.py)")
        module = importlib.util.module_from_spec(s)
        sys.modules[mod_name] = module
        s.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise ConfigError(f"--backend {spec!r}: cannot import {target} ({e})") from None
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise ConfigError(f"--backend {spec!r}: {target} has no class {cls_name}")
    return cls


def load_backend(spec: str) -> Backend:
    """A backend instance from a registry name, 'pkg.mod:Class' or 'path/file.py:Class'.

    Raises:
        ConfigError: unknown name, unimportable module, missing class, or a class
            without the adapter contract's methods.
    """
    import treebench.backends  # noqa: F401  (registers the built-in adapters)

    if ":" not in spec:
        if spec not in REGISTRY:
            raise ConfigError(f"unknown backend {spec!r}; known: {', '.join(sorted(REGISTRY))} "
                              "(or give package.module:Class / path/file.py:Class)")
        return REGISTRY[spec]()
    cls = _load_class(spec)
    for attr in ("name", "availability", "supports", "prepare"):
        if not hasattr(cls, attr):
            raise ConfigError(f"--backend {spec!r}: {cls.__name__} lacks `{attr}` of the adapter contract")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"--backend {spec!r}: {getattr(cls, '__name__', cls)!r}.name is {name!r}; "
                          "set `name` to a non-empty string")
    return cls()


def check_unique_names(backends) -> None:
    """Refuses two backends of one name in a run (their rows would be merged under that name).

    Raises:
        ConfigError: naming the duplicate and the classes that share it.
    """
    seen: dict[str, object] = {}
    for b in backends:
        name = getattr(b, "name", type(b).__name__)
        if name in seen:
            raise ConfigError(f"backend name {name!r} is used by both {type(seen[name]).__name__} and "
                              f"{type(b).__name__}; give each backend class its own `name`")
        seen[name] = b
