"""Where a command writes its outputs: checked before the work that fills them.

Shared by the ``thinkmem`` verbs and the benchmark modules run by hand
(``python -m thinkmem_ros.bench.X``), so an output path is refused the same way wherever
it is given: one line naming the option, before minutes of results depend on it.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

REPORT_READ_LIMIT = 64 << 20
"""An existing output larger than this is never taken for an earlier report of ours."""


def one_line(exc: BaseException | str) -> str:
    """``exc``'s text on one line: YAML and library errors span several, a refusal must not."""
    return " ".join(str(exc).split())


def _fifo_has_reader(path: Path) -> bool:
    """Whether a write to the FIFO ``path`` would go somewhere rather than block for ever.

    A FIFO with a reader is a fine output (``--json >(jq .)`` hands the command a pipe); one
    without blocks the write, after the whole run, until someone opens it. A non-blocking
    open for writing tells the two apart (ENXIO: no reader) without waiting.
    """
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError as exc:
        return exc.errno != errno.ENXIO
    return True


_FULL_DEVICE = (1, 7)  # Linux's /dev/full: major, minor


def _device_problem(path: Path) -> str | None:
    """Why the device at ``path`` cannot take an output, or None (no device, /dev/null, a tty).

    Why: ``--json /dev/full`` was accepted and failed (no space left) only after the whole
    run, and a block device (a disk) would have had a report written over its first bytes.
    """
    try:
        info = path.stat()
    except OSError:
        return None
    if stat.S_ISBLK(info.st_mode):
        return "is a block device (a disk); refusing to write onto it"
    if stat.S_ISSOCK(info.st_mode):
        return "is a socket, not a file"
    if stat.S_ISCHR(info.st_mode) and (os.major(info.st_rdev),
                                       os.minor(info.st_rdev)) == _FULL_DEVICE:
        return "is /dev/full, where every write fails (no space left)"
    return None


def check_output(path: str | Path, option: str, *, folder: bool = False,
                 replaces: tuple[str, Callable[[Path], bool]] | None = None) -> Path:
    """``path`` when an output can be written there; else exit with one line naming ``option``.

    Called before the work that fills the output, so a typo'd or unwritable path costs
    nothing. The nearest existing folder is probed with a temporary file: permission bits
    say nothing to root, and /proc refuses only the actual write. ``replaces`` is (what,
    test): an existing non-empty file (or a link's target) is overwritten only when
    ``test`` says it is such an output of ours, so a typo'd ``--json`` can never turn a
    recording, a store or a model into a report.
    """
    path = Path(path)
    if path.exists() and path.is_dir() != folder:
        raise SystemExit(f"{option} {path}: " + ("not a folder" if folder else "is a folder"))
    if (not folder and replaces is not None and path.is_file() and path.stat().st_size
            and not replaces[1](path)):
        raise SystemExit(f"{option} {path}: exists and is not {replaces[0]}; refusing to "
                         "overwrite it (remove it or choose another path)")
    if not folder and path.is_fifo() and not _fifo_has_reader(path):
        raise SystemExit(f"{option} {path}: is a FIFO nobody reads (writing would block)")
    if not folder and (problem := _device_problem(path)):
        raise SystemExit(f"{option} {path}: {problem}")
    parent = next(p for p in path.absolute().parents if p.exists())
    try:
        tempfile.TemporaryFile(dir=parent).close()
    except OSError as exc:
        raise SystemExit(f"{option} {path}: cannot write in {parent} "
                         f"({exc.strerror or one_line(exc)})") from None
    return path


def json_report(*keys: str) -> tuple[str, Callable[[Path], bool]]:
    """``check_output``'s ``replaces`` for a JSON report holding ``keys`` at its top."""
    def test(path: Path) -> bool:
        if path.stat().st_size > REPORT_READ_LIMIT:
            return False
        try:
            doc = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return False
        return isinstance(doc, dict) and all(k in doc for k in keys)
    return f"a JSON report of this command (with {', '.join(keys)})", test
