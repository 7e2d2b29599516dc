"""Backend loading: a backend instance from a registry name, ``package.module:Class``,
``path/file.py:Class`` or ``path/file.py`` (the one backend class the file defines), and the
backends of one invocation.

A backend's module that exits while it loads (sys.exit, os._exit) is bad input, and so is one that raises
KeyboardInterrupt itself: one is a Ctrl-C's only where a SIGINT came while it loaded (`inflight.signal_stop`,
as for one raised in a pair).

The only module of the harness that imports the built-in adapters (the
``backends`` package, which registers them): the adapter contract below it
never imports its plug-ins.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NoReturn

from treebench.harness.adapter.contract import (
    FILE_MODULE_PREFIX,
    REGISTRY,
    Backend,
    Capabilities,
    check_unique_names,
    source_of,
)
from treebench.harness.errors import ConfigError
from treebench.harness.run.inflight import signal_stop, sigints_noted
from treebench.harness.store.validate import name_flaw

SPEC_ATTR = "treebench_spec"   # attribute load_one sets on a backend: how an --isolate worker loads it again
FORMS = "PATH.py:Class or package.module:Class (or PATH.py, or a registered backend name)"   # what --backend takes
CONTRACT = ("name", "availability", "supports", "prepare")   # the members a backend class has
BACKEND_CLASS = ("a class with a non-empty string `name` and `availability`, `supports` and `prepare`, "
                 "e.g. a subclass of treebench.Backend")   # what a backend class is, in a line


class _SpecError(ConfigError):
    """A backend spec that cannot be loaded: "--backend 'SPEC': DETAIL", the option renamed as the
    command line spelt it by `load_one` (run takes --backends)."""

    def __init__(self, spec: str, detail: str) -> None:
        super().__init__(spec, detail)
        self.spec, self.detail = spec, detail

    def __str__(self) -> str:
        return f"--backend {self.spec!r}: {self.detail}"


class ExitAtLoad(_SpecError):
    """A backend module (or its __init__) that called sys.exit() or os._exit() while it was loaded."""


class _ExitCalled(BaseException):
    """Raised by the stand-in for os._exit while a backend loads (`_as_its_own_program`)."""

    def __init__(self, code: object) -> None:
        super().__init__(code)
        self.code = code


def _exit_raising(pid: int, real: Callable[[int], NoReturn]) -> Callable[[int], NoReturn]:
    """os._exit for the time a backend loads in process `pid`: raises _ExitCalled there (its exit
    would end treebench silently, with its code: 0 reads as a verdict); a child forked meanwhile exits."""
    def _exit(code: int) -> NoReturn:
        if os.getpid() != pid:
            real(code)
        raise _ExitCalled(code)
    return _exit


@contextlib.contextmanager
def _as_its_own_program(spec: str, argv0: str) -> Iterator[None]:
    """While a backend module is imported: sys.argv is [argv0] (a module that parses its command line
    at import sees no treebench arguments), and its sys.exit() or os._exit() is an ExitAtLoad (a
    ConfigError), not treebench's exit."""
    saved, real_exit = sys.argv, os._exit
    sys.argv, os._exit = [argv0], _exit_raising(os.getpid(), real_exit)   # type: ignore[assignment]
    try:
        yield
    except (SystemExit, _ExitCalled) as e:
        call = "sys.exit" if isinstance(e, SystemExit) else "os._exit"
        raise ExitAtLoad(spec, f"loading it called {call}({e.code!r}); a backend module "
                         "must not exit at import or in __init__ (move the call under "
                         "`if __name__ == \"__main__\":`)") from None
    finally:
        sys.argv, os._exit = saved, real_exit


def _a_directory(spec: str, target: str) -> ConfigError:
    return _SpecError(spec, f"{target} is a directory; give a Python file, PATH.py:Class")


def _is_namespace(module) -> bool:
    """Whether `module` is a namespace package: a folder without __init__.py, which imports as an empty module
    (no file; its spec's origin is None, or "namespace" on newer Pythons)."""
    spec = getattr(module, "__spec__", None)
    return getattr(module, "__file__", None) is None and (spec is None or spec.origin in (None, "namespace"))


def _load_file(spec: str, target: str):
    """The module of the Python file `target` ('path/file.py'), its folder put on sys.path as under
    `python path/file.py`; ConfigError when it is missing, a directory or not a Python file."""
    path = Path(target)
    if path.is_dir():
        raise _a_directory(spec, target)
    if not path.is_file():
        raise _SpecError(spec, f"file {target} not found")
    mod_name = f"{FILE_MODULE_PREFIX}{abs(hash(str(path.resolve())))}"
    s = importlib.util.spec_from_file_location(mod_name, path)
    if s is None or s.loader is None:
        raise _SpecError(spec, f"{target} is not a Python file (.py)")
    module = importlib.util.module_from_spec(s)
    sys.modules[mod_name] = module
    folder = str(path.resolve().parent)     # its siblings import, as under `python path/file.py`
    if folder not in sys.path:
        sys.path.insert(0, folder)
    with _as_its_own_program(spec, str(path)):
        s.loader.exec_module(module)
    return module


def _load_class(spec: str) -> type:
    """The class `spec` ('pkg.mod:Class' or 'path/file.py:Class') names; ConfigError when it cannot be had."""
    target, _, cls_name = spec.rpartition(":")
    if not target.strip() or not cls_name.strip() or (":" in target and not Path(target).exists()):
        raise _SpecError(spec, f"malformed; give {FORMS}")
    if _names_a_file(target):
        module = _load_file(spec, target)
    else:
        try:
            with _as_its_own_program(spec, target):
                module = importlib.import_module(target)
        except ImportError as e:
            raise _SpecError(spec, f"cannot import {target} ({e})") from None
        if _is_namespace(module) and Path(target).is_dir():     # a folder of the working directory, not a module
            raise _a_directory(spec, target)
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise _SpecError(spec, f"{target} has no class {cls_name}")
    if not isinstance(cls, type):
        raise _SpecError(spec, f"{spec} is not a class (a {type(cls).__name__}); give {FORMS}")
    return cls


def _names_a_file(target: str) -> bool:
    """Whether `target` (a --backend value or the part before ':Class') is a file path: it ends in .py
    or holds a path separator."""
    return target.endswith(".py") or any(sep and sep in target for sep in (os.sep, os.altsep))


def from_user_code(spec: str) -> bool:
    """Whether `spec` (a --backend value) loads code of the user's: 'pkg.mod:Class', 'path/file.py:Class'
    or 'path/file.py', not a registry name."""
    import treebench.backends  # noqa: F401  (registers the built-in adapters)

    return ":" in spec or (spec not in REGISTRY and _names_a_file(spec))


def _is_backend_class(obj) -> bool:
    """Whether `obj` is a class that meets the adapter contract: CONTRACT's members, a non-empty str `name`."""
    name = getattr(obj, "name", None)
    return (isinstance(obj, type) and all(hasattr(obj, attr) for attr in CONTRACT)
            and isinstance(name, str) and bool(name.strip()))


def _classes(module, defined: bool) -> list[type]:
    """The classes bound in `module`, once each in order: those it defines (`defined`), or those it imports."""
    found = (v for v in vars(module).values() if isinstance(v, type))
    return list(dict.fromkeys(c for c in found if (c.__module__ == module.__name__) == defined))


def _the_backend_class(spec: str, module) -> type:
    """The one backend class the file `spec` defines (classes it imports do not count).

    Raises:
        ConfigError: it defines none, or several (listing them: the user picks one as spec:Class).
    """
    found = [c for c in _classes(module, defined=True) if _is_backend_class(c)]
    if len(found) == 1:
        return found[0]
    if found:
        names = [c.__name__ for c in found]
        raise _SpecError(spec, f"{spec} defines {len(names)} backend classes ({', '.join(names)}); "
                         f"pick one as {spec}:CLASS, e.g. {spec}:{names[0]}")
    nameless = [c.__name__ for c in _classes(module, defined=True)
                if all(hasattr(c, attr) for attr in CONTRACT[1:]) and not _is_backend_class(c)]
    imported = [c.__name__ for c in _classes(module, defined=False) if _is_backend_class(c)]
    why = (f"; set `name` on {', '.join(nameless)} to a non-empty string" if nameless else
           f"; it imports {', '.join(imported)} from elsewhere: name one to use it, e.g. {spec}:{imported[0]}"
           if imported else "")
    raise _SpecError(spec, f"{spec} defines no backend class ({BACKEND_CLASS}){why}")


def load_backend(spec: str) -> Backend:
    """A backend instance from a registry name, 'pkg.mod:Class', 'path/file.py:Class' or 'path/file.py'
    (a value ending in .py or holding a path separator: the one backend class the file defines).

    Raises:
        ConfigError: unknown name, a malformed spec (an empty side of the colon, or a second colon),
            a missing file, a directory, unimportable module, missing class, a name that is not a class,
            a file without exactly one backend class, a class without the adapter contract's methods,
            a `capabilities` that is not a `Capabilities`, a name registered by another class, or a
            module (or __init__) that called sys.exit or os._exit.
    """
    import treebench.backends  # noqa: F401  (registers the built-in adapters)

    if ":" in spec:
        return _instance(spec, _load_class(spec))
    if spec in REGISTRY:
        return REGISTRY[spec]()
    if _names_a_file(spec):
        return _instance(spec, _the_backend_class(spec, _load_file(spec, spec)))
    raise _SpecError(spec, f"unknown backend; known: {', '.join(sorted(REGISTRY))} "
                           "(or give path/file.py, path/file.py:Class or package.module:Class)")


def _instance(spec: str, cls: type) -> Backend:
    """An instance of the class `spec` gave, once it meets the adapter contract.

    Raises:
        ConfigError: a member of CONTRACT missing, an empty `name` or one holding '/' or an unprintable
            character (newline, NUL), a `capabilities` that is not a Capabilities, or an __init__ that
            called sys.exit or os._exit.
    """
    for attr in CONTRACT:
        if not hasattr(cls, attr):
            raise _SpecError(spec, f"{cls.__name__} lacks `{attr}` of the adapter contract")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.strip():
        raise _SpecError(spec, f"{cls.__name__}.name is {name!r}; set `name` to a non-empty string")
    if (bad := name_flaw(name)) is not None:
        what = "'/'" if bad == "/" else f"the unprintable character {bad!r}"
        raise _SpecError(spec, f"{cls.__name__}.name is {name!r}, which holds {what}; give it a name of "
                         "printable characters without '/' (tables and rows show it)")
    _refuse_a_built_in_name(spec, cls, name)
    with _as_its_own_program(spec, spec.rpartition(":")[0] or spec):
        backend = cls()
    caps = getattr(backend, "capabilities", None)
    if caps is not None and not isinstance(caps, Capabilities):
        raise _SpecError(spec, f"{cls.__name__}.capabilities is a {type(caps).__name__}, not a "
                         "Capabilities; set it to treebench.Capabilities(...) or leave "
                         "it out (any case)")
    return backend


def _refuse_a_built_in_name(spec: str, cls: type, name: str) -> None:
    """A class given by module or file must not take a built-in adapter's name: its rows would read
    as that adapter's in a results file, a report and the gate.

    Raises:
        ConfigError: naming the built-in that holds the name.
    """
    import treebench.backends  # noqa: F401  (registers the built-in adapters)

    held = REGISTRY.get(name)
    if held is not None and held is not cls and held.__module__.startswith("treebench.backends."):
        raise _SpecError(spec, f"backend name {name!r} is the built-in {source_of(held)}'s; "
                         f"give {cls.__name__} its own `name` (its rows would read as that adapter's)")


def load_one(spec: str, option: str = "--backend"):
    """`load_backend(spec)`, remembering `spec` on the instance (SPEC_ATTR) for isolated workers;
    `option`: the command-line option that gave `spec`, as the user spelt it (its errors name it).

    Raises:
        ConfigError: unknown or unloadable backend (also when loading its module raised, a KeyboardInterrupt
            that no signal raised included: `inflight.signal_stop`, as for one raised in a pair).
        KeyboardInterrupt: a Ctrl-C (or SIGTERM's stop) while it loaded.
    """
    try:
        backend = _load_noting_sigints(spec)
    except _SpecError as e:
        raise ConfigError(f"{option} {spec!r}: {e.detail}") from None
    except ConfigError:
        raise
    except BaseException as e:  # noqa: BLE001 -- a user's module that fails to import is bad input
        if isinstance(e, KeyboardInterrupt):   # a Ctrl-C (or SIGTERM's stop) while it loads stops the command
            raise
        raise ConfigError(f"{option} {spec!r}: loading it raised {type(e).__name__}{_colon(e)}") from None
    try:
        setattr(backend, SPEC_ATTR, spec)  # how an --isolate worker loads it again
    except AttributeError:
        pass  # __slots__: the worker gets the pickled instance instead
    return backend


def _load_noting_sigints(spec: str) -> Backend:
    """`load_backend(spec)`, with SIGINTs noted meanwhile (`inflight.sigints_noted`), as a pair's call is:
    a KeyboardInterrupt that no signal can have raised (`inflight.signal_stop`) is the module's own, refused
    as a sys.exit at load is, not taken for a Ctrl-C.

    Raises:
        ConfigError: as load_backend, or a _SpecError for such a KeyboardInterrupt.
        KeyboardInterrupt: a Ctrl-C (or SIGTERM's stop) while it loaded.
    """
    with sigints_noted():
        try:
            return load_backend(spec)
        except KeyboardInterrupt as e:
            if signal_stop(e):   # asked while the handler that notes SIGINTs is in place
                raise
            raise _SpecError(spec, f"loading it raised KeyboardInterrupt (raised by the backend, not by a "
                                   f"Ctrl-C){_colon(e)}") from None


def _colon(e: BaseException) -> str:
    """': MESSAGE' of exception `e`, '' where its message is empty."""
    return f": {e}" if str(e) else ""


def resolve_backends(names: Sequence[str] | None, option: str = "--backends",
                     load: Callable[[str, str], object] = load_one) -> list:
    """Backends for `run`: None -> every available built-in; ["all"] -> every built-in;
    else each registry name or class spec (the CLI splits --backends into them), loaded by
    `load(spec, option)` (`load_one`); `option`: the command-line option that gave `names`, as the
    user spelt it (the errors name it).

    Raises:
        ConfigError: no name, "all" beside other names, an unknown or unloadable backend, or two
            backends of one name.
    """
    import treebench.backends  # noqa: F401  (registers the built-in adapters)

    if names is not None and "all" in names and len(names) > 1:
        raise ConfigError(f"{option}: 'all' names every built-in backend and cannot be combined with other names; "
                          f"give {option} all alone, or list the names")
    if names is None:
        found = [REGISTRY[n]() for n in sorted(REGISTRY)]
        return [b for b in found if availability_of(b) is None]
    if list(names) == ["all"]:
        return [REGISTRY[n]() for n in sorted(REGISTRY)]
    if not names:
        raise ConfigError(f"{option} is empty: give names such as torch_sdpa,reference, or all")
    loaded = [load(n, option) for n in names]
    check_unique_names(loaded)      # before anything is written (the dry run refuses it too)
    return loaded


def availability_of(backend) -> str | None:
    """backend.availability(), or the reason of one that raised or broke the contract, as a sweep
    takes it (`pair.availability_reason`: the same reason strings in `list` and in error rows)."""
    from treebench.harness.run.pair import availability_reason   # torch: imported when a backend is asked

    return availability_reason(backend)


def registered_backends() -> dict[str, type[Backend]]:
    """The registry with every built-in adapter in it: name -> class."""
    import treebench.backends  # noqa: F401  (registers the built-in adapters)

    return dict(REGISTRY)
