"""The subcommands that show what treebench knows and run nothing: `treebench list` (the
backends, available or not, and why) and `treebench tree` (a token tree). Two commands
in one module: `LIST` and `TREE` (the cli package holds at most ten modules)."""

from __future__ import annotations

import json
import os
import sys

from rich.markup import escape
from rich.table import Table

from treebench.harness.cli import emit
from treebench.harness.cli.common import OFF_TERMINAL_WIDTH, Command, console
from treebench.harness.run.progress import terminal_size

PIPE_WIDTH = 160   # columns of `treebench list`'s table off a terminal when COLUMNS is not set (or not a size)


def _list_arguments(p) -> None:
    """The description of `treebench list`, which takes no arguments."""
    p.description = ("List every registered backend: available here or not and why (when it is, which path it "
                     "takes), its mask kind and devices. Runs nothing; exit 0.")


def _safe_note(note) -> str:
    """A backend's note() for `treebench list`; a raising note() becomes its error."""
    try:
        return str(note() or "")
    except Exception as e:  # noqa: BLE001 -- a listing never fails on one backend
        return f"note() raised {type(e).__name__}: {e}"


def run_list(args) -> int:
    """`treebench list`: every registered backend with its availability and reason
    (for an available backend, its optional `note()`: which path it takes here), in a table
    as wide as the terminal (off one: COLUMNS, else PIPE_WIDTH), long reasons folded."""
    from treebench.harness.run.loading import availability_of, registered_backends

    table = Table(title="treebench backends")
    for col in ("backend", "available", "mask", "devices", "reason"):
        table.add_column(col, overflow="fold")   # narrow pipes wrap a long reason, never cut it
    for name, cls in sorted(registered_backends().items()):
        b = cls()
        reason = availability_of(b)
        devices = ",".join(getattr(getattr(b, "capabilities", None), "devices", ()) or ())
        note = getattr(b, "note", None)
        detail = reason or (_safe_note(note) if callable(note) else "")
        table.add_row(name, "no" if reason else "yes", getattr(b, "mask_kind", "tree"), devices,
                      escape(detail))   # install hints hold brackets: .[gpu]
    out = console()
    if out.width >= OFF_TERMINAL_WIDTH:      # a pipe or a file: a table as wide as its longest reason is unreadable
        out.width = terminal_size(os.environ.get("COLUMNS")) or PIPE_WIDTH   # a bad COLUMNS is ignored
    out.print(table, soft_wrap=False)         # the reason column folds to the width
    return 0


def add_tree_arguments(p) -> None:
    """The description and arguments of `treebench tree`."""
    p.description = ("Print a token tree: its drawing, parents, depths and ancestor mask (--json: those, its paths, "
                     "choices and sizes as JSON). Exit 0, 2 on a malformed spec.")
    p.add_argument("spec", help="tree spec: chain:4, full:3:2, levels:4,2,1, parents:-1,0,0, [(0,), (1,)], "
                                "eagle:mc_sim_7b_63, ...")
    p.add_argument("--json", action="store_true", help="print the tree summary as JSON")


def run_tree(args) -> int:
    """`treebench tree SPEC [--json]`: drawing, parents, depths and mask of a tree.

    Raises:
        TreeError: a malformed SPEC.
    """
    from treebench.harness.model.trees import render_tree, tree_summary

    from treebench.harness.model.tree_specs import parse_tree

    tree = parse_tree(args.spec)
    summary = tree_summary(tree)
    if args.json:
        emit(json.dumps(summary) + "\n")
        return 0
    utf8 = (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "") == "utf8"
    lines = [render_tree(tree, ascii=not utf8)]
    lines += [f"parents: {' '.join(map(str, summary['parents']))}",
              f"depths:  {' '.join(map(str, summary['depths']))}", "mask (row i: 1 where node j is i or its ancestor):"]
    lines += [f"  {i:>3} {row}" for i, row in enumerate(summary["ancestor_mask"])]
    emit("\n".join(lines) + "\n")
    return 0


LIST = Command(_list_arguments, run_list)
TREE = Command(add_tree_arguments, run_tree)
