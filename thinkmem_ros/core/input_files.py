"""Paths a command reads: refused in one line when they are not what they claim to be.

Why: a FIFO given where a file is read blocked the command forever (``open`` waits for a
writer; ``bag play`` even ignored SIGINT and SIGTERM, since Python retries an interrupted
open once its handler has run), and a device or a socket is no input either. ``os.stat``
never blocks, so the kind of path is checked before anything opens it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def file_kind(mode: int) -> str:
    """What a ``st_mode`` is, in words (for messages)."""
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR,
             "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK,
             "a socket"), (stat.S_ISREG, "a file"))
    return next((name for test, name in kinds if test(mode)), "not a plain file")


def input_file(path: str | os.PathLike, what: str) -> Path:
    """``path`` if it is a regular file (symlinks followed); ValueError naming it otherwise.

    ``what`` names the input in the message (an option, "rules file"); a missing path is
    left to the caller's open, whose message already says so.
    """
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return path
    if not stat.S_ISREG(mode):
        raise ValueError(f"{what} {str(path)!r} is {file_kind(mode)}, not a file")
    return path


def input_path(path: str | os.PathLike, what: str) -> Path:
    """``path`` if it is a regular file or a folder (a bag is either); ValueError otherwise."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return path
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise ValueError(f"{what} {str(path)!r} is {file_kind(mode)}, not a file or folder")
    return path
