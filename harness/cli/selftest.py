"""`treebench selftest`: the check's own power, by mutation testing (treebench.harness.selftest).

Runs the default check on every shipped mutant (a deliberately broken dense backend) and
every correct variant; prints one line per backend and a summary. Exit 0 when the check
kills every mutant and passes every correct variant, else 1 (a surviving mutant names the
coverage axis the check lacks); 2 on bad input.
"""

from __future__ import annotations

import logging

from treebench.harness.cli.common import add_threads_option

log = logging.getLogger(__name__)

# The time said: `treebench selftest` on a 2-core CPU (torch 2.13.0, one torch thread: `--threads 1`, the default on the
# CPU) takes 62-67 s of CPU time: 96 s of wall time at load average 2-3, 9 min at load average 7-9 (four spinning
# processes beside the other work); with torch's two threads (`--threads 2`) it had not finished after 10 min at load
# average 2-4 nor after 25 min at load average 7-9 (the threads wait on cores that other work holds).
DESCRIPTION = ("The default check's own power: runs it on broken variants of a dense PyTorch backend (mutants, each "
               "a known bug it must catch) and on correct variants (each of which it must pass); a line per variant, "
               "then a summary. On a 2-core CPU about 1.5 min at load average 2-3, 9 min at load average 7-9. Exit 0 "
               "when every mutant is killed and every correct variant passes, 1 otherwise, 2 on bad input.")


def add_arguments(p) -> None:
    """The description and options of `treebench selftest`."""
    p.description = DESCRIPTION
    p.add_argument("--determinism", action="store_true",
                   help="run each prepared callable twice, as `check --determinism` does (a bitwise difference fails)")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available, else cpu)")
    add_threads_option(p)


def _line(o) -> str:
    """One line for one backend: verdict, name, axis, and why."""
    if o.mutant:
        verdict = "killed  " if o.failed_check else "SURVIVED"
        why = o.evidence if o.failed_check else f"needs: {o.axis}"
        src = f" [{o.upstream}]" if o.upstream else ""
        return f"{verdict} {o.name:<32} {o.description}{src} -- {why}"
    verdict = "pass    " if not o.failed_check else "FAILED  "
    return f"{verdict} {o.name:<32} {o.description}{' -- ' + o.evidence if o.evidence else ''}"


def _summary(outcomes) -> str:
    """The summary line: mutants killed, correct variants passed, survivors and failed variants by name.
    Kills count as the check's power only where a correct variant passes and none errored: a check that
    fails the correct variants too, or errors rather than finds a backend wrong (a --threads torch cannot
    take once did: every pair errored), kills every mutant without telling it from a correct backend."""
    from treebench.harness.cli.common import plural

    mutants = [o for o in outcomes if o.mutant]
    survivors = [o for o in mutants if not o.failed_check]
    correct = [o for o in outcomes if not o.mutant]
    broken = [o for o in correct if o.failed_check]
    cases = plural(max((o.cases for o in outcomes), default=0), "case")
    kills = f"{len(mutants) - len(survivors)} of {plural(len(mutants), 'mutant')}"
    passed = f"{len(correct) - len(broken)} of {plural(len(correct), 'correct variant')} pass"
    if correct and (len(broken) == len(correct) or any(o.errored for o in broken)):
        why = "errored on" if any(o.errored for o in broken) else "failed"
        summary = (f"the default check ({cases}) {why} correct variants: its kills ({kills}) are no evidence of "
                   f"its power, since correct variants fail too; {passed}")
    else:
        summary = f"the default check ({cases}) kills {kills}; {passed}"
    if survivors:
        summary += "; survivors: " + ", ".join(f"{o.name} (needs {o.axis})" for o in survivors)
    if broken:
        summary += "; correct variants failed: " + ", ".join(o.name for o in broken)
    return summary


def _console():
    """selftest's console on stdout. Where its reader leaves mid-run (`treebench selftest | head -0`), the rest
    goes to /dev/null and the selftest runs on to its verdict (rich's console would exit 1 there, a failure that
    none was); its `reader_gone` then says so."""
    from treebench.harness.cli import stdout_to_devnull
    from treebench.harness.run.progress import TerminalConsole

    class Lines(TerminalConsole):
        reader_gone = False

        def on_broken_pipe(self) -> None:
            self.quiet = self.reader_gone = True   # nothing more is printed
            stdout_to_devnull()

    return Lines(highlight=False, soft_wrap=True)


def run(args) -> int:
    """`treebench selftest`: 0 when every mutant is killed and every correct variant passes, else 1, also where
    stdout's reader left before the end (the summary then goes to stderr, led by the command).

    Raises:
        ConfigError: a --device that is not a torch device, not cpu or cuda, or not available here
            (checked before anything runs); the default check's suite cannot be read.
    """
    from treebench.harness.run.config import check_threads
    from treebench.harness.selftest.power import selftest, selftest_device

    out = _console()
    threads = check_threads(args.threads, selftest_device(args.device).type)
    outcomes = selftest(determinism=args.determinism, device=args.device, threads=threads,
                        on_outcome=lambda o: out.print(_line(o), style="green" if o.ok else "bold red", markup=False))
    summary = _summary(outcomes)
    out.print(f"treebench selftest: {summary}", markup=False)
    if out.reader_gone:   # the verdict is still said
        log.info("selftest: %s", summary)
    return 0 if all(o.ok for o in outcomes) else 1
