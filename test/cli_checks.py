"""What the command-line tests share: run one command in-process, and the one-line rule."""

from __future__ import annotations

import sys

from thinkmem_ros import cli


def run(capsys, *argv, entry=cli.main) -> tuple[int, str]:
    """Exit status and stderr of one command, a ``SystemExit`` handled as the interpreter does."""
    try:
        code = entry([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    return code, capsys.readouterr().err


def assert_one_line(code: int, err: str, *names: str) -> None:
    """The rule: non-zero, one line on stderr that names the problem, no traceback."""
    assert code != 0, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for name in names:
        assert name in err, err
