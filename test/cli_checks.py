"""What the command-line tests share: run one command in-process, the one-line rule, and a
prefix that makes a root session obey file permissions."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

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


def unprivileged() -> list[str]:
    """A command prefix that cannot bypass file permissions: as root, setpriv drops the
    capabilities that override them (a root session reads a chmod 000 folder anyway)."""
    if os.geteuid() != 0:
        return []
    drop = [shutil.which("setpriv") or "setpriv", "--bounding-set=-dac_override,-dac_read_search",
            "--inh-caps=-dac_override,-dac_read_search"]
    try:
        works = subprocess.run([*drop, "true"], capture_output=True, timeout=30).returncode == 0
    except OSError:
        works = False
    if not works:
        pytest.skip("running as root, and setpriv cannot drop the capabilities that make "
                    "root ignore permission bits")
    return drop
