"""The speculation subcommands: `treebench tree-search` (the tree of each size that
maximises expected accepted tokens) and `treebench plan` (the best tree per backend,
B and L from stored results). Two commands in one module: `TREE_SEARCH` and `PLAN`
(the cli package holds at most ten modules); the logic is treebench.harness.speculation.

    treebench tree-search --acceptance MODEL [--acceptance MODEL ...] --max-nodes N [--max-depth D]
                          [--sizes 4,8,16] [--suite-out FILE [--batch-sizes 1,16,64] [--context-lens 2048]]
    treebench plan --results FILE... --acceptance MODEL [--step-us 2000+0.5*tokens] [--backends a,b]
                   [--max-depth D]

MODEL is a shipped acceptance model's name (illustrative-geometric) or a TOML/JSON file; a path that
exists wins. Sizes are T, nodes per request including the root. Bad input raises
``ConfigError`` with one line (the CLI prints it and exits 2).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from treebench.harness.cli import NUMBER_RULE, emit, integer_option, read_number
from treebench.harness.cli.common import Command, comma_list, plural
from treebench.harness.errors import ConfigError, led_by, said_by
from treebench.harness.speculation.acceptance import shipped_names
from treebench.harness.speculation.commands import AXIS_OPTIONS
from treebench.harness.speculation.search import MAX_SEARCH_NODES
from treebench.harness.store.outputs import will_write, write_whole
from treebench.harness.store.paths import check_output_path, folder_problem, missing_folders, remove_empty_folders


def _int_list(text: str, least: int = 1) -> list[int]:
    """argparse type: "4,8,16" -> [4, 8, 16], each >= `least` and given once (a repeat would repeat a
    printed tree or a suite's cases), each written as every numeric option (`read_number`)."""
    try:
        values = [int(read_number(x, integer=True)) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < least:
        what = "positive integers" if least == 1 else f"integers >= {least}"
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {what} {NUMBER_RULE}, "
                                         "e.g. 4,8,16")
    twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
    if twice is not None:
        raise argparse.ArgumentTypeError(f"{twice} given twice in {text!r}; give each once")
    return values


BATCH_SIZES, CONTEXT_LENS = [1, 16, 64], [2048]   # a --suite-out suite's B and L axes unless given


def _axis_text(values: list[int]) -> str:
    """[1, 16, 64] -> '1,16,64', as the options take them."""
    return ",".join(map(str, values))


def _context_lens(text: str) -> list[int]:
    """argparse type of --context-lens: `_int_list` taking 0 (no context before the tree), as suites do."""
    return _int_list(text, least=0)


ACCEPTANCE_HELP = (f"acceptance model: a shipped model's name ({', '.join(shipped_names())}) or a TOML/JSON "
                   "file; a path that exists wins")


def add_tree_search_arguments(p) -> None:
    """The description and options of `treebench tree-search`."""
    p.description = ("For each tree size T up to --max-nodes, the tree that maximises the expected accepted tokens "
                     "under an acceptance model (Sequoia's dynamic program), printed as choices lists; --suite-out "
                     "also writes a suite of them. Exit 0, 2 on bad input.")
    p.add_argument("--acceptance", action="append", required=True, metavar="MODEL",
                   help=f"{ACCEPTANCE_HELP} (repeat for several)")
    p.add_argument("--max-nodes", type=integer_option, required=True, metavar="N",
                   help=f"largest tree size T, root included (1..{MAX_SEARCH_NODES})")
    p.add_argument("--max-depth", type=integer_option, default=None, metavar="D", help="deepest draft token allowed")
    p.add_argument("--sizes", type=_int_list, default=None, metavar="T,T,...",
                   help="print / write only these sizes (default: every size 1..N)")
    p.add_argument("--suite-out", default=None, metavar="FILE",
                   help="write a suite TOML whose tree axis lists them (missing folders are created); an existing "
                        "FILE is refused (exit 2, left as it is) unless --force is given, and a file tree-search "
                        "did not write is refused even then")
    p.add_argument("--force", action="store_true",
                   help="with --suite-out: replace an existing suite that tree-search wrote (edits to it are lost)")
    p.add_argument("--batch-sizes", type=_int_list, default=None, metavar="B,B,...",
                   help=f"with --suite-out: the suite's batch_size axis, each 1..{AXIS_OPTIONS['--batch-sizes'][1]} "
                        f"(default {_axis_text(BATCH_SIZES)})")
    p.add_argument("--context-lens", type=_context_lens, default=None, metavar="L,L,...",
                   help=f"with --suite-out: the suite's context_len axis, each 0..{AXIS_OPTIONS['--context-lens'][1]} "
                        f"(default {_axis_text(CONTEXT_LENS)})")


def _command_line(args) -> str:
    """The tree-search command line that a --suite-out file records."""
    parts = [TREE_SEARCH_LINE] + [f"--acceptance {shlex.quote(a)}" for a in args.acceptance]
    parts.append(f"--max-nodes {args.max_nodes}")
    if args.max_depth is not None:
        parts.append(f"--max-depth {args.max_depth}")
    if args.sizes:
        parts.append(f"--sizes {','.join(map(str, args.sizes))}")
    parts.append(f"--suite-out {shlex.quote(args.suite_out)} --batch-sizes {_axis_text(args.batch_sizes or BATCH_SIZES)} "
                 f"--context-lens {_axis_text(CONTEXT_LENS if args.context_lens is None else args.context_lens)}")
    return " ".join(parts)


TREE_SEARCH_LINE = "treebench tree-search"   # how the command line a --suite-out file records begins


def check_suite_out(path_text: str, force: bool = False) -> Path:
    """Checks a --suite-out path before the search: a new .toml file, or where `force` (--force) one that
    tree-search wrote (its second line is `suite_text`'s GENERATED_BY and a TREE_SEARCH_LINE command line),
    which is replaced; never another file.

    Raises:
        ConfigError: an empty path, not .toml, a folder, an existing file tree-search did not
            write, an existing file without `force`, or a path that cannot be written (`check_output_path`).
    """
    from treebench.harness.speculation.commands import GENERATED_BY

    path = check_output_path(path_text, "--suite-out")
    if path.suffix.lower() != ".toml":
        raise ConfigError(f"--suite-out {path}: give a .toml path, e.g. suites/local/searched.toml")
    if path.exists():
        try:
            head = path.read_text(encoding="utf-8", errors="replace").splitlines()[1:2]
        except OSError as e:
            raise ConfigError(f"--suite-out {path}: cannot read it ({e.strerror})") from None
        if not head or not head[0].startswith(GENERATED_BY + TREE_SEARCH_LINE):
            raise ConfigError(f"--suite-out {path}: exists and was not written by tree-search; "
                              "choose a new path (it is left as it is)")
        if not force:
            raise ConfigError(f"--suite-out {path}: exists (it is left as it is, edits and all); choose a new path, "
                              "or add --force to replace it")
    return path


def _refuse_repeated_acceptance(paths: list[str]) -> None:
    """Refuses one acceptance model given twice to tree-search (as written, by its name or by another
    path to its file): its trees would be searched and printed twice.

    Raises:
        ConfigError: naming both spellings, or a value `model_file` refuses.
    """
    from treebench.harness.speculation.acceptance import model_file

    seen: dict[Path, str] = {}
    for text in paths:
        try:
            key = model_file(text).resolve()
        except (OSError, RuntimeError):   # a link loop: load_model names it
            continue
        if key in seen:
            again = f"--acceptance {text}" + ("" if seen[key] == text else f" (the file of --acceptance {seen[key]})")
            raise ConfigError(f"tree-search: {again} given twice; give each acceptance model once")
        seen[key] = text


@said_by("tree-search")   # each refusal led by the command's name, as `tree-search: ...`
def run_tree_search(args) -> int:
    """Prints each model's best tree per size ("T=.. E=.. depth=.. [choices]"); --suite-out also writes a
    suite (`_write_suite`), before the trees are printed.

    Raises:
        ConfigError: a bad acceptance file or one given twice, --max-nodes / --max-depth / --sizes out of range,
            --batch-sizes, --context-lens or --force without --suite-out, or those axes past a suite's limits (`check_axis_options`),
            a --suite-out that `check_suite_out` refuses or that cannot be written, or a suite that does not load
            (then not written).
    """
    from treebench.harness.speculation.commands import check_axis_options, searched
    from treebench.harness.speculation.search import choices_text

    _refuse_repeated_acceptance(args.acceptance)
    given = [flag for flag, v in (("--batch-sizes", args.batch_sizes), ("--context-lens", args.context_lens))
             if v is not None]
    if given and args.suite_out is None:   # they shape the suite --suite-out writes, and nothing else
        flags, what = " and ".join(given), "it sets an axis" if len(given) == 1 else "they set axes"
        raise ConfigError(f"tree-search {flags} without --suite-out: {what} of the suite that --suite-out FILE "
                          f"writes, and nothing else; give --suite-out, or leave {flags} out")
    if args.force and args.suite_out is None:
        raise ConfigError("tree-search --force without --suite-out: it lets --suite-out replace a suite tree-search "
                          "wrote, and nothing else; give --suite-out, or leave --force out")
    check_axis_options({"--batch-sizes": args.batch_sizes, "--context-lens": args.context_lens})
    if args.suite_out is not None:                  # before the search: a bad path costs nothing
        will_write(check_suite_out(args.suite_out, args.force), "--suite-out")
    found = searched(args.acceptance, args.max_nodes, args.max_depth, args.sizes)
    suite = None if args.suite_out is None else _write_suite(args, found)
    out = []
    for model, trees in found:
        out.append(f"# {model.name} ({model.kind}; draft {model.draft}, target {model.target}): {model.citation}")
        out += [f"T={t.size} E={t.expected:.4f} depth={t.depth} {choices_text(t.choices)}" for t in trees]
    emit("\n".join(out) + "\n")
    if suite is not None:
        sys.stderr.write(f"{led_by('tree-search')}wrote {suite.path}: {plural(len(suite.cases), 'case')}\n")
    return 0


def _write_suite(args, found):
    """Writes the --suite-out suite of the searched trees `found` (`suite_text`), creating its missing folders
    (as run --out and report -o do). The text is read back as `load_suite` reads it before it replaces the
    file (`write_whole`'s check), so a suite the suite reader refuses is never written: the file there is left
    as it was, and a folder made for it is removed again.

    Returns:
        The suite written, as `load_suite` reads it.

    Raises:
        ConfigError: the suite cannot be written, or the suite reader refuses it.
    """
    from treebench.harness.model.suites import load_suite
    from treebench.harness.speculation.commands import suite_text

    path = Path(args.suite_out)
    text = suite_text(found, path.stem, _command_line(args), args.batch_sizes or BATCH_SIZES,
                      CONTEXT_LENS if args.context_lens is None else args.context_lens)
    loaded, made = [], missing_folders(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_whole(path, text, check=lambda tmp: loaded.append(load_suite(path, source=tmp)))
    except BaseException as e:
        remove_empty_folders(made)
        if isinstance(e, OSError):
            raise ConfigError(f"--suite-out {path}: cannot write ({folder_problem(path) or e.strerror})") from None
        raise
    return loaded[0]


def add_plan_arguments(p) -> None:
    """The description and options of `treebench plan`."""
    p.description = ("From measured rows and an acceptance model: per backend, batch size B and context length L, "
                     "the best tree size and shape, its expected accepted tokens, verify time and accepted tokens "
                     "per ms, against a chain and no speculation. Exit 0, 2 on bad input.")
    p.add_argument("--results", nargs="+", required=True, metavar="FILE", help="result JSONL files or folders")
    p.add_argument("--acceptance", required=True, metavar="MODEL", help=ACCEPTANCE_HELP)
    p.add_argument("--step-us", default="0", metavar="US",
                   help="rest of the step in µs: 2000, or a+b*tokens such as 2000+0.5*tokens (tokens = B*T); default 0; "
                        "refused where, with the verify µs, it is not a finite number at some B and T")
    p.add_argument("--backends", default=None, metavar="A,B", help="only these backends (default: all in the results)")
    p.add_argument("--max-depth", type=integer_option, default=None, metavar="D", help="deepest draft token allowed")


@said_by("plan")   # each refusal led by the command's name: `plan --step-us ...`, `plan: acceptance file ...`
def run_plan(args) -> int:
    """Prints the verdict table (``treebench.harness.speculation.plan``) and the best trees' choices lists,
    after a line counting the rows (of the backends shown) that no curve uses (`cost.left_out_note`), where
    there are any; reads --results as gate and report do (`cost.load_curves`: rows validated, a warning for
    a results file a run is still writing).

    Raises:
        ConfigError: bad --step-us, acceptance file or results (a row gate and report refuse included), or a
            --backends that names nothing, names one twice or one not in the results.
    """
    from treebench.harness.speculation.acceptance import load_model
    from treebench.harness.speculation.commands import only_backends
    from treebench.harness.speculation.cost import left_out_note, load_curves, parse_step_us
    from treebench.harness.speculation.plan import format_table, plan
    from treebench.harness.speculation.search import choices_text

    step = parse_step_us(args.step_us)
    model = load_model(args.acceptance)
    if args.max_depth is not None and args.max_depth < 1:
        raise ConfigError(f"--max-depth {args.max_depth}: give a depth >= 1")
    curves, rows = load_curves(args.results, "plan")   # validated as gate and report read them; warns of writers
    if args.backends is not None:
        names = comma_list(args.backends, "--backends")
        if not names:
            raise ConfigError(f"--backends {args.backends!r} names no backend: give names such as a,b, or leave "
                              "it out for every backend in the results")
        curves = only_backends(curves, rows, names)
        rows = [r for r in rows if r.get("backend") in names]
    verdicts = plan(curves, model, step, args.max_depth)
    note = left_out_note(rows, "plan")
    lines = [f"acceptance model {model.name} ({model.kind}): {model.citation}",
             f"step cost {step} us; tok/ms = B * E / (verify us + step us) * 1000; T counts the root",
             *([note] if note else []), "", format_table(verdicts), ""]
    best = {v.best.size: v.best.choices for v in verdicts if v.best}
    lines += [f"T={t}: {choices_text(c)}" for t, c in sorted(best.items())]
    emit("\n".join(lines) + "\n")
    return 0


TREE_SEARCH = Command(add_tree_search_arguments, run_tree_search)
PLAN = Command(add_plan_arguments, run_plan)
