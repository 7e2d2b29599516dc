"""Suite files: TOML sweep definitions (see docs/design.md "Suite file").

A suite declares axes only; treebench.harness.model.cases.expand_axes turns them into cases.
Two forms are accepted:

    [suite]                      # optional: name (default: file stem), description
    name = "smoke"
    description = "..."

    [axes]                       # one group: the product of all axes
    batch_size = [1, 3]
    ...

or several groups, each expanded on its own and then concatenated (a case two groups
share taken once; a group that repeats another, or adds no case to the groups before it,
refused), for suites that one product of axes cannot cover:

    [[axes]]
    batch_size = [5]
    ...
    [[axes]]
    tree_per_request = ["mixed"]
    ...

A name (``smoke``) is looked up as <repo root>/suites/NAME.toml; anything with
a ``/`` or ending in ``.toml`` is a path.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from treebench.harness.model.cases import AXIS_VALUES, Case, canonical_context, expand_axes
from treebench.harness.model.tree_specs import parse_tree
from treebench.harness.errors import ConfigError

SUITES_DIR = Path(__file__).resolve().parents[2] / "suites"   # the suites folder beside harness/ (checkout or install)
SUITE_KEYS = ("name", "description")
_FIELD_TYPES = {f.name: f.type for f in fields(Case)}


@dataclass(frozen=True)
class Suite:
    """A loaded suite, or one built in code (a backend's default check).

    Attributes:
        name: the suite's name ([suite] name, else the file stem); for one built in code, what
            output lines call it ("the default check").
        description: free text ("" when absent).
        axes: the axis groups as written (one dict per [axes] / [[axes]] table).
        cases: the expanded cases, in file order, duplicates dropped.
        path: the file it was read from; None for a suite built in code.
    """

    name: str
    description: str
    axes: tuple[dict, ...]
    cases: tuple[Case, ...]
    path: Path | None

    @property
    def title(self) -> str:
        """How output lines name it: 'suite smoke' (what --suite takes), or the name of one built in
        code as it is ('the default check': no --suite names it)."""
        return self.name if self.path is None else f"suite {self.name}"


FINDINGS = "findings"   # suites/findings/: peers' bugs kept as suites, named findings/NAME


def available_suites(findings: bool = False) -> list[str]:
    """Names of the suites in <repo root>/suites/; with findings, those of suites/findings/ too,
    as findings/NAME."""
    return sorted(p.stem for p in SUITES_DIR.glob("*.toml")) + (
        sorted(f"{FINDINGS}/{p.stem}" for p in (SUITES_DIR / FINDINGS).glob("*.toml")) if findings else [])


def suite_path(name_or_path: str | Path) -> Path:
    """Resolves a suite name (`available_suites`: NAME or findings/NAME, with or without .toml)
    or path to an existing file. A path that exists wins over a shipped suite of the same name.

    Raises:
        ConfigError: no such file or suite name.
    """
    s = str(name_or_path)
    if s.endswith(".toml") or "/" in s or Path(s).is_file():
        p = Path(s)
        shipped = SUITES_DIR / (s if s.endswith(".toml") else f"{s}.toml")
        if not p.is_file() and s.startswith(f"{FINDINGS}/") and shipped.is_file():
            return shipped
        if not p.is_file():
            raise ConfigError(f"--suite {s}: file not found; give a TOML file or one of: "
                              f"{', '.join(available_suites(findings=True))}")
        return p
    p = SUITES_DIR / f"{s}.toml"
    if not p.is_file():
        raise ConfigError(f"--suite {s}: unknown suite; known: {', '.join(available_suites(findings=True))} "
                          "(or give a path to a .toml file)")
    return p


def _allowed_types(field: str) -> tuple[type, ...]:
    """Python types a TOML value of axis `field` may have (bool is never an int here)."""
    ann = _FIELD_TYPES[field]
    names = [a.strip() for a in ann.split("|")] if isinstance(ann, str) else [ann]
    table = {"int": int, "str": str, "float": float, "bool": bool}
    if "float" in names:
        names.append("int")   # a TOML integer is a valid float axis value (logit_scale = [1000])
    return tuple(table.get(n, object) if isinstance(n, str) else n for n in names)


def _check_axis(path: Path, group: str, field: str, values) -> list:
    """Type-checks one axis (values as a list); returns it as a list.

    Raises:
        ConfigError: a value of the wrong type (a TOML true where a number goes included), naming
            file, group and axis, and what the axis takes (cases.AXIS_VALUES); a value given twice
            (page_size = [16, 16]), naming file, group, axis and value; one tree spelled twice in the
            tree axis (`_refuse_one_tree_twice`), or one context spec in the context_len axis
            (`_refuse_one_context_twice`), naming both spellings.
    """
    values = values if isinstance(values, list) else [values]
    ok = _allowed_types(field)
    for i, v in enumerate(values):
        shown = str(v).lower() if isinstance(v, bool) else repr(v)   # as TOML spells it
        if (isinstance(v, bool) and bool not in ok) or not isinstance(v, ok):
            raise ConfigError(f"suite {path}: {group}: axis {field} value {shown}: "
                              f"must be {AXIS_VALUES[field]}")
        if v in values[:i]:
            raise ConfigError(f"suite {path}: {group}: axis {field} value {shown} given twice; "
                              "give each once")
    if field == "tree":
        _refuse_one_tree_twice(path, group, values)
    if field == "context_len":
        _refuse_one_context_twice(path, group, values)
    return values


def _refuse_one_context_twice(path: Path, group: str, specs: list) -> None:
    """Refuses two spellings of one context spec in a context_len axis (`ragged:16-2048` and
    `ragged:016-2048`, `list:1,2` and `list:01,2`): a case holds it as `canonical_context` writes it,
    so the cases of one would repeat the other's, as a value given twice would. A spec that does not
    read is left to the case that reads it (which names what is wrong).

    Raises:
        ConfigError: naming file, group and both spellings.
    """
    first: dict[object, object] = {}   # the spec as a case holds it -> the spelling that first gave it
    for spec in specs:
        try:
            held = canonical_context(spec)
        except ConfigError:
            continue
        if held in first:
            raise ConfigError(f"suite {path}: {group}: axis context_len values {first[held]!r} and {spec!r} are "
                              f"one context spec ({held}); give it once")
        first[held] = spec


def _refuse_one_tree_twice(path: Path, group: str, specs: list) -> None:
    """Refuses two spellings of one tree in a tree axis (`full:2:1` and `levels:2`, `chain:2` and
    `parents:-1,0,1`, `FULL:3:2` and `full:3:2`): parse_tree gives both the same parent list (its
    canonical numbering), so the cases of one would repeat the other's, as a value given twice would.
    A spec that does not parse is left to the case that reads it (which names what is wrong).

    Raises:
        ConfigError: naming file, group and both spellings.
    """
    first: dict[tuple[int, ...], str] = {}   # parent list -> the spec that first gave it
    for spec in specs:
        try:
            parents = parse_tree(spec).parents
        except (ConfigError, ValueError, TypeError, IndexError):
            continue
        if parents in first:
            raise ConfigError(f"suite {path}: {group}: axis tree values {first[parents]!r} and {spec!r} are one "
                              f"tree ({len(parents)} nodes, parents {_shown(parents)}); give it once")
        first[parents] = spec


def _shown(parents: tuple[int, ...], most: int = 12) -> str:
    """A parent list as `parents:` spells it, cut after `most` entries ('-1,0,0,1,...')."""
    return ",".join(map(str, parents[:most])) + (",..." if len(parents) > most else "")


def _expand_group(path: Path, group: str, axes) -> list[Case]:
    """Validates and expands one axes table; `group` names it in messages ("axes", or
    "axes group N" in a suite of several).

    Raises:
        ConfigError: not a table, unknown axis, wrong value type, or an invalid case.
    """
    if not isinstance(axes, dict) or not axes:
        raise ConfigError(f"suite {path}: {group} must be a non-empty table of axis = [values]")
    known = set(_FIELD_TYPES)
    for field in axes:
        if field not in known:
            raise ConfigError(f"suite {path}: {group}: unknown axis {field!r}; "
                              f"known axes are {', '.join(_FIELD_TYPES)}")
    checked = {f: _check_axis(path, group, f, v) for f, v in axes.items()}
    try:
        return expand_axes(checked)
    except ConfigError as e:
        raise ConfigError(f"suite {path}: {group}: {e}") from None
    except (ValueError, TypeError, IndexError) as e:  # a parser that did not say ConfigError
        raise ConfigError(f"suite {path}: {group}: invalid value ({type(e).__name__}: {e})") from None


def _read_toml(path: Path, source: Path | None = None) -> dict:
    """Parses a TOML file, UTF-8 with or without a BOM (a Windows editor's first bytes): `source`
    (default `path`), named `path` in messages. Raises ConfigError naming `path` on unreadable or bad TOML."""
    try:
        return tomllib.loads((source or path).read_bytes().decode("utf-8-sig"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"suite {path}: bad TOML ({e})") from None
    except RecursionError:  # tomllib parses nested arrays recursively
        raise ConfigError(f"suite {path}: arrays nested too deeply to parse; an axis is a flat list "
                          "such as batch_size = [1, 16]") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"suite {path}: not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8") from None
    except OSError as e:
        raise ConfigError(f"suite {path}: cannot read ({e.strerror})") from None


def _header(path: Path, doc: dict) -> tuple[str, str]:
    """(name, description) from the optional [suite] table."""
    head = doc.get("suite", {})
    if not isinstance(head, dict):
        raise ConfigError(f"suite {path}: [suite] must be a table with name and description")
    for key, value in head.items():
        if key not in SUITE_KEYS:
            raise ConfigError(f"suite {path}: [suite] has unknown key {key!r}; allowed: {', '.join(SUITE_KEYS)}")
        if not isinstance(value, str):
            raise ConfigError(f"suite {path}: [suite] {key} must be a string")
    if "name" in head and not head["name"].strip():   # lines would read "suite , 1 case"
        raise ConfigError(f"suite {path}: [suite] name is {head['name']!r}; give it a name or leave it out "
                          f"(default: the file's stem, {path.stem})")
    return head.get("name", path.stem), head.get("description", "")


def load_suite(name_or_path: str | Path, source: Path | None = None) -> Suite:
    """Loads a suite by name (<repo root>/suites/NAME.toml) or path.

    Args:
        source: the file to read in place of the path `name_or_path`, which names it in messages and
            gives its default name: a file written whole, checked before it is renamed to that path
            (`outputs.write_whole`'s `check`), which need not exist yet.

    Returns:
        Suite whose `cases` are the concatenated expansions of its axes groups.

    Raises:
        ConfigError: unknown name, missing file, bad TOML, unknown top-level key,
            missing or empty axes, unknown axis, wrong value type, invalid case, a value given
            twice in an axis (one tree spelled two ways in the tree axis included, or in two groups'
            otherwise equal cases; one context spec spelled two ways in the context_len axis), a group that
            repeats an earlier one or adds no case to them; the message names the file and field
            (or groups).
    """
    path = suite_path(name_or_path) if source is None else Path(name_or_path)
    doc = _read_toml(path, source)
    extra = sorted(set(doc) - {"suite", "axes"})
    if extra:
        raise ConfigError(f"suite {path}: unknown top-level key {extra[0]!r}; "
                          "a suite has [suite] and [axes] / [[axes]]")
    if "axes" not in doc:
        raise ConfigError(f"suite {path}: no [axes] table; declare at least one axis, e.g. batch_size = [1]")
    name, description = _header(path, doc)
    groups = doc["axes"] if isinstance(doc["axes"], list) else [doc["axes"]]
    if not groups:
        raise ConfigError(f"suite {path}: [[axes]] is empty; give at least one axes table")
    cases: dict[str, tuple[Case, int]] = {}   # case_id -> (case, the group that first yields it)
    spelled: dict[tuple, tuple[Case, int]] = {}   # the case with its tree as a parent list -> the first
    for i, axes in enumerate(groups):
        expanded = _expand_group(path, f"axes group {i}" if len(groups) > 1 else "axes", axes)
        _refuse_repeated_group(path, groups, i, [cases[c.case_id][1] for c in expanded if c.case_id in cases],
                               len(expanded))
        for case in expanded:
            cases.setdefault(case.case_id, (case, i))
            _refuse_tree_spelled_again(path, spelled, case, i)
    return Suite(name, description, tuple(groups), tuple(c for c, _ in cases.values()), path)


def _refuse_tree_spelled_again(path: Path, seen: dict[tuple, tuple[Case, int]], case: Case, i: int) -> None:
    """Refuses `case` of axes group `i` where an earlier group yields the same case with its tree
    spelled another way (`full:2:1` there, `levels:2` here: one workload under two case ids), as
    one axis refuses two spellings (`_refuse_one_tree_twice`); records it in `seen` otherwise. The axis
    check stays beside this one: a case holds its tree's normalised spelling (`FULL:2:1` as `full:2:1`),
    so only that check names the values as written, and catches two that normalise to one case.

    Raises:
        ConfigError: naming the file, both groups and both spellings.
    """
    parents = parse_tree(case.tree).parents   # the case has parsed it already
    key = tuple((f.name, parents if f.name == "tree" else getattr(case, f.name)) for f in fields(case))
    first, j = seen.setdefault(key, (case, i))
    if first.tree != case.tree:
        raise ConfigError(f"suite {path}: axes group {i}'s tree {case.tree!r} and axes group {j}'s {first.tree!r} "
                          f"are one tree ({len(parents)} nodes, parents {_shown(parents)}) in otherwise equal "
                          "cases; spell it one way")


def _refuse_repeated_group(path: Path, groups: list, i: int, earlier: list[int], n: int) -> None:
    """Refuses axes group `i` of `groups` when it repeats an earlier group, or yields only cases that
    earlier groups yield already (it adds nothing), as a value given twice in one axis is refused.
    Groups that share some cases are taken, each case once.

    Args:
        earlier: for each of the group's cases that an earlier group yields, that group's index.
        n: how many cases the group yields.

    Raises:
        ConfigError: naming the file, the group and the earlier groups it repeats.
    """
    same = next((j for j in range(i) if groups[j] == groups[i]), None)
    if same is not None:
        raise ConfigError(f"suite {path}: axes group {i} is the same as axes group {same}; give each group once")
    if n and len(earlier) == n:
        held = sorted(set(earlier))
        others = (f"axes group {held[0]} already yields" if len(held) == 1 else
                  f"axes groups {', '.join(map(str, held[:-1]))} and {held[-1]} already yield")
        raise ConfigError(f"suite {path}: axes group {i} yields only cases that {others}; "
                          "remove it or change its axes")
