"""What the CLI's tests read from a command that refused its input."""

from __future__ import annotations


def one_line_error(capsys) -> str:
    """The one stderr line of a refused command ("treebench: error: ..."), after asserting it is one
    line with no traceback."""
    _, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("treebench: error: ") and "Traceback" not in err
    return lines[0]
