"""How every subcommand reads its command line (treebench.harness.cli.Parser): options spelled out in
full (an abbreviation is one line naming the option it may stand for, exit 2), and each option and
flag given once (a repeat is one line, exit 2), except the options documented to accumulate."""

from __future__ import annotations

import argparse

import pytest
from treebench.harness.cli import main as cli
from treebench.harness.cli.main import main
from tests.cli_errors import one_line_error

COMMANDS = sorted(cli.COMMANDS)


def long_options(name: str) -> list[str]:
    """The long options of subcommand `name`'s parser, --help among them."""
    return sorted({o for a in cli.command_parser(name)._actions for o in a.option_strings if o.startswith("--")})


def flags(name: str) -> list[argparse.Action]:
    """The options of subcommand `name` that take no value (but -h / --help)."""
    return [a for a in cli.command_parser(name)._actions
            if a.option_strings and a.nargs == 0 and not isinstance(a, argparse._HelpAction)]


@pytest.mark.parametrize("name", COMMANDS)
@pytest.mark.parametrize("with_value", [False, True])
def test_every_subcommand_refuses_every_abbreviated_option(name, with_value, capsys):
    """`check --sui seed`, `gate --base x`, `tree SPEC --js`, `run --hel`: refused as abbreviations,
    with the option(s) they may stand for named; `--sui=seed` alike."""
    options = long_options(name)
    tried = 0
    for option in options:
        short = option[:-1]                    # one letter short: a prefix of this option, maybe of others
        if short in options:                   # --backend of --backends is an option of its own
            continue
        meant = " or ".join(o for o in options if o.startswith(short))
        assert main([name, short + ("=x" if with_value else "")]) == 2
        line = one_line_error(capsys)
        assert f"error: {name}: {short} is abbreviated; spell the option out: {meant} " in line, line
        tried += 1
    assert tried >= 1


def test_an_ambiguous_abbreviation_names_each_option_it_may_stand_for(capsys):
    assert main(["gate", "--allow", "--baseline", "a", "--candidate", "b"]) == 2
    assert "gate: --allow is abbreviated; spell the option out: --allow-env-mismatch or --allow-missing " \
           "(options are never abbreviated; see treebench gate --help)" in one_line_error(capsys)


def test_after_a_double_dash_nothing_is_read_as_an_abbreviation(capsys):
    """`tree -- --js`: --js is the tree spec (a malformed one), not an abbreviation of --json."""
    assert main(["tree", "--", "--js"]) == 2
    line = one_line_error(capsys)
    assert "abbreviated" not in line and "--js" in line, line


@pytest.mark.parametrize("name", COMMANDS)
def test_every_flag_given_twice_is_refused(name, capsys):
    """`tree SPEC --json --json`, `run --dry-run --dry-run`: refused as a value option given twice is,
    before anything runs (a missing required option is not reached)."""
    for action in flags(name):
        flag = action.option_strings[-1]
        assert main([name, flag, flag]) == 2
        assert f"error: {name}: {' / '.join(action.option_strings)} given 2 times; give it once" \
            in one_line_error(capsys)


@pytest.mark.parametrize("name", COMMANDS)
def test_no_flag_accumulates(name):
    """Every flag is given once (there is no count-style flag such as -vv); a flag that should count would
    say so here and in the README's bad-input paragraph."""
    from treebench.harness.cli import StoreConstOnce, StoreFalseOnce, StoreTrueOnce

    assert all(isinstance(a, (StoreTrueOnce, StoreFalseOnce, StoreConstOnce)) for a in flags(name)), flags(name)


def test_a_flag_once_still_works(capsys):
    assert main(["tree", "full:2:2", "--json"]) == 0
    assert '"parents"' in capsys.readouterr().out


@pytest.mark.parametrize("argv, extra", [(["--version", "extra"], "extra"), (["--version", "run"], "run"),
                                         (["--version", "list", "--help"], "list")])
def test_version_refuses_another_argument(argv, extra, capsys):
    """`treebench --version extra` printed the version and dropped `extra` unread."""
    assert main(argv) == 2
    assert one_line_error(capsys).endswith(f"error: --version takes no other argument, got {extra!r}: run "
                                           "treebench --version alone")


def test_version_given_twice_is_refused(capsys):
    assert main(["--version", "--version"]) == 2
    assert one_line_error(capsys).endswith("error: --version given 2 times; give it once")


@pytest.mark.parametrize("name", ["", *COMMANDS])
@pytest.mark.parametrize("twice", [["-h", "-h"], ["--help", "--help"], ["-h", "--help"], ["-hh"]])
def test_help_given_twice_is_refused_as_every_flag_is(name, twice, capsys):
    """`treebench -h -h`, `run --help --help`: refused in one line as `--version --version` and `--json --json`
    are, exit 2, no usage printed (argparse printed it at the first and exited 0). `-hh` is -h twice to
    argparse; before the command only -h, --help and --version are taken, so there it is an unknown option."""
    assert main([*([name] if name else []), *twice]) == 2
    out, err = capsys.readouterr()
    (line,) = err.strip().splitlines()
    assert not out and line.startswith("treebench: error: "), (out, err)
    if name or twice != ["-hh"]:
        assert line.endswith(f"error: {f'{name}: ' if name else ''}-h / --help given 2 times; give it once"), line
    else:
        assert "unrecognized option -hh before the command" in line, line


@pytest.mark.parametrize("argv", [["-h"], ["--help"], ["run", "-h"], ["tree", "--help"], ["report", "-ho", "x"]])
def test_help_once_prints_the_usage(argv, capsys):
    assert main(argv) == 0 and capsys.readouterr().out.startswith("usage: treebench")


def test_version_alone_prints_it(capsys):
    from treebench.harness import __version__

    assert main(["--version"]) == 0 and capsys.readouterr().out.startswith(f"treebench {__version__}")


@pytest.mark.parametrize("argv, launch", [
    (["run", "--backends", "reference", "--dry-run"], "`run --gpus N` with N >= 2, or under torchrun"),
    (["run", "--backends", "reference", "--gpus", "1", "--dry-run"], "`run --gpus N` with N >= 2, or under torchrun"),
    (["check", "--backend", "reference", "--dry-run"], "under torchrun")])
def test_merge_timeout_where_no_torchrun_launch_waits_is_refused(argv, launch, capsys, monkeypatch, tmp_path):
    """It sets how long torchrun's rank 0 waits for the other ranks: without such a launch it did nothing."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    out = tmp_path / "r.jsonl"
    assert main([*argv, "--merge-timeout", "5", "--out", str(out)]) == 2
    assert one_line_error(capsys).endswith(f"error: --merge-timeout without a torchrun launch: it sets how long rank 0 "
                                           f"waits for the other ranks ({launch}), and does nothing here; leave it out")
    assert not out.exists()


def test_tree_search_refuses_one_acceptance_file_given_twice(tmp_path, capsys):
    """Its trees were searched and printed twice; another path to the same file counts too."""
    from pathlib import Path

    model = Path(cli.__file__).resolve().parents[1] / "speculation" / "data" / "illustrative-geometric.toml"
    link = tmp_path / "same.toml"
    link.symlink_to(model)
    base = ["tree-search", "--max-nodes", "3", "--acceptance", str(model), "--acceptance"]
    assert main([*base, str(model)]) == 2
    assert one_line_error(capsys).endswith(f"error: tree-search: --acceptance {model} given twice; give each "
                                           "acceptance model once")
    assert main([*base, str(link)]) == 2
    assert f"--acceptance {link} (the file of --acceptance {model}) given twice" in one_line_error(capsys)
    copy = tmp_path / "copy.toml"
    copy.write_bytes(model.read_bytes())
    assert main([*base, str(copy)]) == 0   # two files: two models, even of the same numbers


# ---- numbers: one rule for every numeric option ---------------------------------------------------------

NUMERIC_OPTIONS = [   # (argv before the value, the option): every option that takes a number or a list of them
    (["check", "--backend", "torch_sdpa", "--case-timeout"], "--case-timeout"),
    (["check", "--backend", "torch_sdpa", "--merge-timeout"], "--merge-timeout"),
    (["run", "--case-timeout"], "--case-timeout"),
    (["run", "--gpus"], "--gpus"),
    (["run", "--threads"], "--threads"),
    (["check", "--backend", "torch_sdpa", "--threads"], "--threads"),
    (["selftest", "--threads"], "--threads"),
    (["gate", "--baseline", "a", "--candidate", "b", "--alpha"], "--alpha"),
    (["gate", "--baseline", "a", "--candidate", "b", "--min-samples"], "--min-samples"),
    (["tree-search", "--acceptance", "a", "--max-nodes"], "--max-nodes"),
    (["tree-search", "--acceptance", "a", "--max-nodes", "8", "--max-depth"], "--max-depth"),
    (["tree-search", "--acceptance", "a", "--max-nodes", "8", "--sizes"], "--sizes"),
    (["tree-search", "--acceptance", "a", "--max-nodes", "8", "--batch-sizes"], "--batch-sizes"),
    (["tree-search", "--acceptance", "a", "--max-nodes", "8", "--context-lens"], "--context-lens"),
    (["plan", "--results", "a", "--acceptance", "b", "--max-depth"], "--max-depth"),
]


@pytest.mark.parametrize("argv, option", NUMERIC_OPTIONS)
@pytest.mark.parametrize("value", ["1_0", "\uff11\uff10", "1,0_1", " 4", "4\t", "2, 3"])
def test_every_numeric_option_refuses_digits_python_alone_reads(argv, option, value, capsys):
    """int() and float() read '1_0', full-width '１０' and ' 10' as 10: every numeric option refuses them in
    one line saying how a number is written, exit 2, as gate --threshold and tree specs do."""
    value = value if option in ("--sizes", "--batch-sizes", "--context-lens") else value.split(",")[-1]
    assert main([*argv, value]) == 2
    line = one_line_error(capsys)
    assert f"argument {option}: {value!r} is not " in line and "(ASCII digits 0-9, no '+', '_' or spaces)" in line, line


def test_shard_refuses_digits_python_alone_reads(capsys):
    for value in ("1_0/40", "\uff11/4", "0/1_0", "0 /2", "0/\t2", " 0/2", "0/2\n"):
        assert main(["check", "--backend", "torch_sdpa", "--shard", value]) == 2
        assert (f"--shard {value!r}: write INDEX/COUNT with integers (ASCII digits 0-9, no '+', '_' or spaces)"
                in one_line_error(capsys))


@pytest.mark.parametrize("name", COMMANDS)
def test_no_option_reads_numbers_with_python_int_or_float(name):
    """argparse's type=int and type=float take '1_0' and '１０': a numeric option reads with read_number."""
    loose = [a.option_strings for a in cli.command_parser(name)._actions if a.type in (int, float)]
    assert not loose, f"{name}: {loose} read numbers with int() or float(); use integer_option or number_option"


@pytest.mark.parametrize("text, integer, want", [("600", False, 600.0), ("1e3", False, 1000.0), (".5", False, 0.5),
                                                 ("1e+3", False, 1000.0), ("-37", True, -37), ("0232", True, 232),
                                                 ("inf", False, float("inf"))])
def test_read_number_takes_ascii_numbers(text, integer, want):
    from treebench.harness.cli import read_number
    assert read_number(text, integer) == want


@pytest.mark.parametrize("text, integer", [("1_000", False), ("1_0", True), ("\uff15", True), ("\u0665.5", False),
                                           ("1.5", True), ("inf", True), ("0x10", True), ("1e", False), ("", False),
                                           (" ", True), ("1 0", True), (" 1e3 ", False), (" 4", True),
                                           ("4\n", True), ("\t5", False), ("+2", True), ("+0.5", False)])
def test_read_number_refuses_anything_else(text, integer):
    from treebench.harness.cli import read_number
    with pytest.raises(ValueError):
        read_number(text, integer)


@pytest.mark.parametrize("argv, option", [(["--verbose", "run"], "--verbose"), (["--json=1", "run"], "--json"),
                                          (["--verbose", "list"], "--verbose")])
def test_an_option_before_the_command_that_the_command_lacks_is_not_suggested_after_it(argv, option, capsys):
    """`treebench --verbose run` is not told to try `treebench run --verbose`, which run refuses too."""
    assert main(argv) == 2
    line = one_line_error(capsys)
    assert f"treebench {argv[1]} takes no {option} either; see treebench {argv[1]} --help" in line, line
    assert f"treebench {argv[1]} {argv[0]}" not in line, line


def test_an_option_before_the_command_that_the_command_has_is_suggested_after_it(capsys):
    assert main(["--quiet", "run"]) == 2
    assert "(options go after it: treebench run --quiet; see treebench --help)" in one_line_error(capsys)


@pytest.mark.parametrize("argv", [["run", "--case-timeout", "+5"], ["run", "--gpus", "+1"],
                                  ["gate", "--baseline", "a", "--candidate", "b", "--min-samples", "+5"],
                                  ["gate", "--baseline", "a", "--candidate", "b", "--alpha", "+0.05"],
                                  ["gate", "--baseline", "a", "--candidate", "b", "--threshold", "+5%"],
                                  ["gate", "--baseline", "a", "--candidate", "b", "--threshold", " 5%"],
                                  ["gate", "--baseline", "a", "--candidate", "b", "--threshold", "5 %"],
                                  ["gate", "--baseline", "a", "--candidate", "b", "--threshold", " 0.1 "]])
def test_a_plus_sign_or_a_space_in_a_number_is_refused_by_every_option_as_by_shard(argv, capsys):
    """One rule: '+5' is refused as `--shard +0/1` is, and gate --threshold takes no spaces, as the others."""
    assert main(argv) == 2
    assert "(ASCII digits 0-9, no '+', '_' or spaces)" in one_line_error(capsys)
