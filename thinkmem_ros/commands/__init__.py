"""Sub-commands of the ``thinkmem`` command, one module per verb.

Shared here: what every verb needs to answer bad input with one line on stderr.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path


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


def check_output(path: str | Path, option: str, *, folder: bool = False) -> Path:
    """``path`` when an output can be written there; else exit with one line naming ``option``.

    Called before the work that fills the output, so a typo'd or unwritable path costs
    nothing. The nearest existing folder is probed with a temporary file: permission bits
    say nothing to root, and /proc refuses only the actual write.
    """
    path = Path(path)
    if path.exists() and path.is_dir() != folder:
        raise SystemExit(f"{option} {path}: " + ("not a folder" if folder else "is a folder"))
    if not folder and path.is_fifo() and not _fifo_has_reader(path):
        raise SystemExit(f"{option} {path}: is a FIFO nobody reads (writing would block)")
    parent = next(p for p in path.absolute().parents if p.exists())
    try:
        tempfile.TemporaryFile(dir=parent).close()
    except OSError as exc:
        raise SystemExit(f"{option} {path}: cannot write in {parent} "
                         f"({exc.strerror or one_line(exc)})") from None
    return path


def check_plot(path: str | Path, option: str) -> Path:
    """``path`` when matplotlib can save a figure in its format and it can be written there.

    The figure is saved after the run: an unknown suffix (``lat.txt``) used to be refused
    by matplotlib only then, and the minutes of results went with it. No suffix is fine:
    matplotlib then saves a PNG and appends ``.png``.
    """
    from matplotlib.backend_bases import FigureCanvasBase

    path = check_output(path, option)
    suffix = path.suffix.removeprefix(".").lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix and suffix not in formats:
        raise SystemExit(f"{option} {path}: cannot save a plot as {path.suffix!r}; use one of "
                         f"{', '.join('.' + f for f in sorted(formats))}")
    return path
