"""Tree specs: every text (or list) form a tree is read from, parsed into a `TokenTree`.

Formats read by ``parse_tree`` (every format ends in the same canonical form):

- choices: a list of paths, e.g. ``[(0,), (1,), (0, 0)]`` or its text (EAGLE,
  Medusa, vLLM's ``speculative_token_tree``); the root is implicit;
- ``parents:-1,0,0,1``: parent of each node, each parent before its children,
  siblings ranked in order of appearance; re-ordered canonically if needed;
- generators: ``chain:N``, ``full:BRANCHING:DEPTH``, ``levels:4,2,1``,
  ``random:N:SEED`` (SEED an integer >= 0, of any size);
- named published trees (``treebench.harness.model.named_trees``), e.g. ``eagle:mc_sim_7b_63``, read in
  any case as generator keywords are (``EAGLE:MC_SIM_7B_63``, written in lower case in a case's id).

A generator spec has no spaces inside and its integers are ASCII digits (`chain: 3` and `chain:３` are
refused); its keyword is read in any case and its integers with leading zeros (`FULL:03:2` is `full:3:2`, as
canonical_spec writes it: a case's id holds that spelling, so one tree has one id in every suite). Too
large a tree of any format is refused in one wording, naming its node count (`trees.check_size`).

Errors are `TreeError` (a ConfigError: one line, exit 2 at the CLI), naming the spec.
"""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Sequence

from treebench.harness.errors import TreeError
from treebench.harness.model import named_trees
from treebench.harness.model.trees import MAX_NODES, TokenTree, check_size, from_choices, from_parents

__all__ = ["canonical_spec", "parse_tree"]

# --------------------------------------------------------------------------- generators


def _int_arg(text: str, name: str, low: int | None, spec: str) -> int:
    """The integer `text`, in ASCII digits with no spaces ('3', '-1'; not ' 3', '３', '1_0' or '+3'), of
    at most sys.get_int_max_str_digits() digits (4300: int() reads no more)."""
    if not re.fullmatch(r"-?[0-9]+", text):
        raise TreeError(f"tree {spec!r}: {name} must be an integer in ASCII digits with no spaces, got {text!r}")
    try:
        value = int(text)
    except ValueError:   # the digits are ASCII: only int()'s limit on their number is left
        raise TreeError(f"tree {spec!r}: {name} has {len(text.lstrip('-'))} digits, more than an integer "
                        "may have here; give a smaller one") from None
    if low is not None and (value < low or (low >= 0 and text.startswith("-"))):   # '-0' too: a second spelling
        raise TreeError(f"tree {spec!r}: {name} must be >= {low}, got {text}")
    return value


def _args(rest: str, n: int, usage: str, spec: str) -> list[str]:
    args = rest.split(":")
    if len(args) != n:
        raise TreeError(f"tree {spec!r}: {len(args)} argument(s) given; write {usage}")
    return args


def _levels_tree(counts: Sequence[int], spec: str, total: int | None = None) -> TokenTree:
    """Tree with counts[k] children under every node of depth k (1+c0+c0*c1+... nodes); `total`: that
    count where the caller has it (check_size first: no list of more than MAX_NODES nodes is built)."""
    if total is None:
        total, width = 1, 1
        for c in counts:
            width *= c
            total += width
    check_size(total, spec)
    parents, frontier = [-1], [0]
    for c in counts:
        nxt = []
        for node in frontier:
            for _ in range(c):
                parents.append(node)
                nxt.append(len(parents) - 1)
        frontier = nxt
    return from_parents(parents, spec)


def _gen_chain(rest: str, spec: str) -> TokenTree:
    (n,) = _args(rest, 1, "chain:N (N draft tokens)", spec)
    count = _int_arg(n, "chain N", 0, spec)
    check_size(count + 1, spec)
    return _levels_tree([1] * count, spec)


def _gen_full(rest: str, spec: str) -> TokenTree:
    """1 + b + b^2 + ... + b^DEPTH nodes; past MAX_NODES levels, or with b past 2^64, a lower bound of at
    least 2^64 (b^min(DEPTH, 64), or b), which check_size words as 'at least 10^k' nodes."""
    b, d = _args(rest, 2, "full:BRANCHING:DEPTH, e.g. full:3:2", spec)
    branching, depth = _int_arg(b, "full BRANCHING", 1, spec), _int_arg(d, "full DEPTH", 0, spec)
    if branching == 1 or depth == 0:
        total = depth + 1
    elif depth <= MAX_NODES and branching < 2**64:
        total = (branching ** (depth + 1) - 1) // (branching - 1)
    else:
        total = branching ** min(depth, 64) if branching < 2**64 else branching
    check_size(total, spec)
    return _levels_tree([branching] * depth, spec, total)


def _gen_levels(rest: str, spec: str) -> TokenTree:
    if not rest.strip():
        raise TreeError(f"tree {spec!r}: levels needs children counts per depth, e.g. levels:4,2,1")
    return _levels_tree([_int_arg(c, "levels count", 1, spec) for c in rest.split(",")], spec)


def _gen_random(rest: str, spec: str) -> TokenTree:
    """N draft nodes, each under a uniformly chosen earlier node, from random.Random(SEED); SEED >= 0, of any
    size (random.Random would take -SEED for SEED: one tree under two specs, two case ids)."""
    n, seed = _args(rest, 2, "random:N:SEED, e.g. random:20:0", spec)
    count = _int_arg(n, "random N", 0, spec)
    check_size(count + 1, spec)
    rng = random.Random(_int_arg(seed, "random SEED", 0, spec))
    return from_parents([-1] + [rng.randrange(i) for i in range(1, count + 1)], spec)


def _gen_parents(rest: str, spec: str) -> TokenTree:
    if not rest.strip():
        raise TreeError(f"tree {spec!r}: empty parent array; write e.g. parents:-1,0,0,1")
    return from_parents([_int_arg(p, f"parent of node {i}", None, spec) for i, p in enumerate(rest.split(","))],
                        spec)


# Explicit registry: format prefix -> reader of the text after "prefix:".
_GENERATORS = {
    "chain": _gen_chain,
    "full": _gen_full,
    "levels": _gen_levels,
    "random": _gen_random,
    "parents": _gen_parents,
}


# --------------------------------------------------------------------------- parsing


def canonical_spec(spec: str) -> str:
    """`spec` as parse_tree reads it: without surrounding white space, a generator
    keyword in lower case (" FULL:3:2" -> "full:3:2"), a generator's integers without
    leading zeros ("random:8:01" -> "random:8:1", "parents:-1,00,-0" -> "parents:-1,0,0"),
    a named tree's name in lower case and an alias as its name ("VLLM:PR_27",
    "vllm_pr_27_node_tree" -> "vllm:pr_27"), and a
    choices list as EAGLE writes it, tuples in (depth, path) order (`[[0],[1],[0,0]]`,
    `[(1,),(0,),(0,0)]` -> `[(0,), (1,), (0, 0)]`), so that spellings parse_tree takes
    alike give one case id. Does not
    validate: parse_tree does (text that is not a list of integer paths is only stripped)."""
    s = spec.strip()
    if (key := named_trees.registry_key(s)) is not None:
        return key
    kind, sep, rest = s.partition(":")
    if sep and kind.strip().lower() in _GENERATORS:
        return f"{kind.strip().lower()}:{''.join(map(_no_leading_zeros, re.split(r'([:,])', rest.strip())))}"
    if s[:1] in "[(" and s:
        return _canonical_choices(s) or s
    return s


def _no_leading_zeros(arg: str) -> str:
    """A generator's integer argument as str(int()) writes it ('007' -> '7', '-01' -> '-1', '000' and
    '-0' -> '0'), without int()'s limit on the digits it reads; any other text as it is."""
    if not re.fullmatch(r"-?[0-9]+", arg):
        return arg
    digits = arg.lstrip("-").lstrip("0")
    return f"-{digits}" if digits and arg.startswith("-") else digits or "0"


def _canonical_choices(text: str) -> str | None:
    """The choices text `text` with its paths as tuples in (depth, path) order; None when it
    is not a list of paths of integers."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(p, (list, tuple)) and all(type(i) is int for i in p) for p in value):
        return None
    return repr(sorted((tuple(p) for p in value), key=lambda p: (len(p), p)))


def parse_tree(spec: str | Sequence[Sequence[int]] | TokenTree) -> TokenTree:
    """Parses any tree format of DESIGN.md into a canonical TokenTree.

    Args:
        spec: a format string (see the module docstring), a choices list of
            paths, or an already built TokenTree (returned as is). Choices text
            is read with ``ast.literal_eval``, never ``eval``.

    Returns:
        The tree in canonical order; ``spec`` keeps the text given (a list is
        kept as its repr).

    Raises:
        TreeError: empty text, an unknown format or name (the message lists the
            known ones), bad generator arguments, or any malformed tree (see
            ``from_parents`` and ``from_choices``).
    """
    if isinstance(spec, TokenTree):
        return spec
    if not isinstance(spec, str):
        return from_choices(spec, repr(spec))
    s = spec.strip()
    if not s:
        raise TreeError("tree '': empty spec; give e.g. chain:4, full:3:2, parents:-1,0,0 or [(0,), (1,)]")
    if s[0] in "[(":
        return _parse_choices_text(s, spec)
    named = _named(s, spec)
    if named is not None:
        return named
    kind, sep, rest = s.partition(":")
    reader = _GENERATORS.get(kind.strip().lower())
    if reader is None or not sep:
        raise TreeError(f"tree {spec!r}: unknown format or name; use a choices list [(0,), (1,), (0, 0)], "
                        f"{', '.join(f'{k}:...' for k in _GENERATORS)}, or a named tree "
                        f"({', '.join(named_trees.known_names())})")
    if any(c.isspace() for c in s):
        raise TreeError(f"tree {spec!r}: a generator spec has no spaces; write {kind.strip().lower()}:"
                        f"{''.join(rest.split())}")
    return reader(rest, spec)


def _parse_choices_text(text: str, spec: str) -> TokenTree:
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise TreeError(f"tree {spec!r}: not a Python list of tuples; write e.g. [(0,), (1,), (0, 0)]") from None
    return from_choices(value, spec)


def _named(name: str, spec: str) -> TokenTree | None:
    """The named published tree, None if `name` (in any case) is not a tree name."""
    key = named_trees.registry_key(name)   # in any case, as generator keywords
    if key is not None:
        return from_choices(named_trees.NAMED_TREES[key].choices, spec)
    why = named_trees.unavailable_reason(name)
    if why is not None:
        raise TreeError(f"tree {spec!r}: {why}")
    return None


# --------------------------------------------------------------------------- display
