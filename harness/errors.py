"""The harness's exception tree (after httpx ``_exceptions.py``).

::

    HarnessError                 base of everything the harness raises on purpose
    ├── ConfigError              bad input: tree spec, suite file, CLI value, case
    │   └── TreeError            a malformed token tree
    ├── BackendUnavailable       a backend cannot run on this machine
    ├── CorrectnessError         an output failed its comparison (used by callers
    │                            that want an exception instead of a record)
    └── ResultsWriteError        rows could not be appended to a results file (a full
                                 disk, an I/O error, a read-only file system); also an
                                 OSError, with the file's errno, strerror and filename

The CLI turns ``ConfigError`` and ``ResultsWriteError`` into one line on stderr and exit code 2.
Each such line starts with the command that said it (`report: results file r.jsonl:3: ...`,
`gate --threshold '5': ...`); a reader shared by several commands raises its refusal inside
``said_by(command)``, which puts the command in front.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class HarnessError(Exception):
    """Base class of the harness's deliberate errors."""


class ConfigError(HarnessError):
    """Bad user input; the message names the field and the fix."""


class TreeError(ConfigError):
    """A malformed token tree spec; the message names the problem."""


class BackendUnavailable(HarnessError):
    """A backend cannot be used here; the message gives the reason."""


class CorrectnessError(HarnessError):
    """A backend's output did not match the reference."""


class ResultsWriteError(HarnessError, OSError):
    """Appending rows to a results file failed part-way (`store.rows.append_row`); the file is cut
    back to the rows it held before. Built as OSError(errno, strerror, filename)."""


def led_by(command: str) -> str:
    """The lead of a warning line `command` says: 'report: ', or '' for no command (a library call)."""
    return f"{command}: " if command else ""


@contextlib.contextmanager
def said_by(command: str) -> Iterator[None]:
    """A ConfigError of the block raised again with `command` in front: `report: ` + 'results file
    r.jsonl:3: schema 9, ...'; an option's refusal joined by a space, as a command's own are
    (`plan --step-us 'x': ...`). A message that already starts with the command's name (`gate --baseline
    r.jsonl: no result rows` inside said_by("gate --baseline")), or an empty `command`, is left as it is.

    Raises:
        ConfigError: the block's, led by `command`; other exceptions pass as they are.
    """
    try:
        yield
    except ConfigError as e:
        text, name = str(e), command.split(" ", 1)[0]
        if not command or text == name or text.startswith((f"{name} ", f"{name}:")):
            raise
        raise ConfigError(f"{command}{' ' if text.startswith('-') else ': '}{text}") from e
