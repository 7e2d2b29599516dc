"""Acceptance models: how likely the target is to accept each draft node.

The positional model of Sequoia (Chen et al. 2024, "Sequoia: Scalable, Robust,
and Hardware-aware Speculative Decoding", arXiv 2402.12374, section 3.1, the
"positional acceptance assumption"), with one row per depth as EAGLE's tree
construction uses depth-dependent confidence (Li et al. 2024, arXiv 2401.15077):

    p[d][r] = P(the rank-r child of a depth-d node is accepted | that node was accepted)

- d is the depth of the *parent* (row 0: the root's children, the depth-1
  nodes); r is the child's sibling rank, 0-based, in sibling order (as
  ``treebench.harness.model.trees`` ranks siblings: order of appearance; rank 0 is the draft's
  most likely token).
- Depths past the table reuse its last row (a one-row table is Sequoia's
  depth-free vector).
- A rank past the end of its row has probability 0: the row's length is the
  widest branching the model describes.
- The target samples one token per accepted node, and at most the child that
  matches it is accepted, so the children's events are mutually exclusive:
  every row sums to at most 1. Tokens are independent given their path.

File format (TOML, or JSON with the same keys; ``.json`` files are read as JSON)::

    name = "illustrative-geometric"
    kind = "illustrative"          # "published" (re-typed from a cited table) | "illustrative"
    citation = "..."               # paper + where the numbers come from, or why they are synthetic
    draft = "..."                  # draft model
    target = "..."                 # target model
    p = [[0.6, 0.15, 0.05], [0.5, 0.15, 0.05]]
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

from treebench.harness.errors import ConfigError

__all__ = ["AcceptanceModel", "load_model", "model_file", "model_from_dict", "shipped_models", "shipped_names",
           "DATA_DIR"]

DATA_DIR = Path(__file__).resolve().parent / "data"
KINDS = ("published", "illustrative")
TEXT_FIELDS = ("name", "kind", "citation", "draft", "target")
ROW_SUM_SLACK = 1e-9  # float slack on "a row sums to at most 1"


@dataclass(frozen=True)
class AcceptanceModel:
    """A positional acceptance model (see the module docstring).

    Attributes:
        name: short name, e.g. "illustrative-geometric".
        kind: "published" (re-typed from the cited source) or "illustrative" (synthetic).
        citation: paper and table the numbers come from, or why they are synthetic.
        draft: the draft model the numbers describe.
        target: the target model.
        p: p[d][r], probabilities in [0, 1]; rows non-empty, non-increasing in r, summing to <= 1.
        path: the file it was read from ("" when built in code).
    """

    name: str
    kind: str
    citation: str
    draft: str
    target: str
    p: tuple[tuple[float, ...], ...]
    path: str = ""

    def row(self, depth: int) -> tuple[float, ...]:
        """The row for the children of a depth-`depth` node (the last row past the table)."""
        return self.p[min(depth, len(self.p) - 1)]

    def prob(self, depth: int, rank: int) -> float:
        """p[depth][rank]: acceptance of a depth-`depth` node's rank-`rank` child; 0 past the row."""
        row = self.row(depth)
        return row[rank] if rank < len(row) else 0.0

    @property
    def width(self) -> int:
        """Widest row: the most children a node can usefully have."""
        return max(len(r) for r in self.p)


def load_model(given: str | Path) -> AcceptanceModel:
    """Reads an acceptance model: a file (TOML, or JSON when the name ends in .json), or a shipped model
    by name (`model_file`: a path that exists wins).

    Raises:
        ConfigError: one line naming the file: neither a file nor a shipped name, unreadable, not UTF-8,
            bad TOML or JSON, or any field error of ``model_from_dict``.
    """
    path = model_file(given)
    try:
        text = path.read_bytes().decode("utf-8-sig")   # -sig: a BOM a Windows editor put first
    except UnicodeDecodeError as e:
        raise ConfigError(f"acceptance file {path}: not UTF-8 text ({e.reason} at byte {e.start}); "
                          "save it as UTF-8") from None
    except OSError as e:
        raise ConfigError(f"acceptance file {path}: cannot read ({e.strerror}); give a .toml or .json "
                          f"acceptance model file, or a shipped model's name: {', '.join(shipped_names())}") from None
    try:
        doc = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"acceptance file {path}: bad TOML ({' '.join(str(e).split())})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"acceptance file {path}: bad JSON ({e.msg} at line {e.lineno})") from None
    except RecursionError:  # both parsers recurse into nested arrays and tables
        raise ConfigError(f"acceptance file {path}: nested too deeply to parse; see "
                          f"{DATA_DIR / 'illustrative-geometric.toml'} for the format") from None
    return model_from_dict(doc, str(path))


def model_from_dict(doc: object, where: str = "<dict>") -> AcceptanceModel:
    """Validates a parsed model document (see the module docstring for the keys).

    Raises:
        ConfigError: not a table, an unknown or missing key, a non-string text
            field, an unknown kind, or a bad ``p`` (see ``_check_p``).
    """
    if not isinstance(doc, dict):
        raise ConfigError(f"acceptance file {where}: must be a table of name, kind, citation, draft, target, p")
    unknown = sorted(set(doc) - {*TEXT_FIELDS, "p"})
    if unknown:
        raise ConfigError(f"acceptance file {where}: unknown key {unknown[0]!r}; "
                          f"allowed: {', '.join((*TEXT_FIELDS, 'p'))}")
    for key in (*TEXT_FIELDS, "p"):
        if key not in doc:
            raise ConfigError(f"acceptance file {where}: missing field {key!r}")
    for key in TEXT_FIELDS:
        if not isinstance(doc[key], str) or not doc[key].strip():
            raise ConfigError(f"acceptance file {where}: field {key!r} must be a non-empty string")
    if doc["kind"] not in KINDS:
        raise ConfigError(f"acceptance file {where}: kind {doc['kind']!r}; use one of {', '.join(KINDS)}")
    p = _check_p(doc["p"], where)
    return AcceptanceModel(doc["name"], doc["kind"], doc["citation"], doc["draft"], doc["target"], p, where)


def _check_p(p: object, where: str) -> tuple[tuple[float, ...], ...]:
    """Validates p: a non-empty list of non-empty rows of numbers in [0, 1],
    non-increasing in rank, each row summing to at most 1.

    Raises:
        ConfigError: naming the first bad entry as p[d][r].
    """
    if not isinstance(p, list) or not p:
        raise ConfigError(f"acceptance file {where}: p must be a non-empty list of rows, e.g. p = [[0.6, 0.2]]")
    rows = []
    for d, row in enumerate(p):
        if not isinstance(row, list) or not row:
            raise ConfigError(f"acceptance file {where}: p[{d}] must be a non-empty list of probabilities")
        rows.append(tuple(_check_prob(x, d, r, where) for r, x in enumerate(row)))
        for r in range(1, len(row)):
            if row[r] > row[r - 1]:
                raise ConfigError(f"acceptance file {where}: p[{d}][{r}] = {row[r]} exceeds p[{d}][{r - 1}] = "
                                  f"{row[r - 1]}; rows must be non-increasing in rank (rank 0 = top draft token)")
        if sum(row) > 1 + ROW_SUM_SLACK:
            raise ConfigError(f"acceptance file {where}: p[{d}] sums to {sum(row):g} > 1; at most one child "
                              "of a node is accepted, so a row's probabilities must sum to at most 1")
    return tuple(rows)


def _check_prob(x: object, d: int, r: int, where: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ConfigError(f"acceptance file {where}: p[{d}][{r}] = {x!r} is not a number")
    if not (math.isfinite(x) and 0 <= x <= 1):
        raise ConfigError(f"acceptance file {where}: p[{d}][{r}] = {x} is outside [0, 1]")
    return float(x)


def shipped_models() -> list[Path]:
    """The model files shipped in harness/speculation/data/ (package data), sorted."""
    return sorted([*DATA_DIR.glob("*.toml"), *DATA_DIR.glob("*.json")])


def shipped_names() -> list[str]:
    """The shipped models' names, their file stems: ["illustrative-depth-decay", ...]."""
    return [p.stem for p in shipped_models()]


def model_file(given: str | Path) -> Path:
    """The file an --acceptance value names: `given` itself where that path exists (a file, or anything
    else there, which reading then names), else the shipped model whose name (file stem) it is, from any
    working directory.

    Raises:
        ConfigError: `given` is empty, or neither an existing path nor a shipped name, listing the names.
    """
    path = Path(given)
    try:
        there = bool(str(given)) and (path.exists() or path.is_symlink())   # a dangling link: reading names it
    except OSError:      # a name too long, a folder that cannot be searched: reading it names the cause
        there = True
    except ValueError:   # a NUL in it: no path
        there = False
    if there:
        return path
    shipped = {p.stem: p for p in shipped_models()}
    if str(given) in shipped:
        return shipped[str(given)]
    raise ConfigError(f"acceptance model {str(given)!r}: no such file and no shipped model of that name; give a "
                      f".toml or .json file, or one of: {', '.join(shipped)}")
