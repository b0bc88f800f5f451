"""One process per spool: an exclusive lock held beside the spool for the holder's life.

Two nodes that resolve to the same spool (two namespaces on one machine, both left at the
default ``robot_id``) would each re-send, acknowledge and shed the other's rows, and the
consolidator would file both streams under one robot. SQLite's own locking serialises
their writes but cannot tell them apart, so the second one is refused at start instead.

``fcntl.flock`` on ``<spool>.lock`` (never on the database itself, whose locks SQLite
owns): the kernel drops the lock when the holder exits, even on ``kill -9``, so a crash
never leaves a stale lock behind. The file holds one line describing the holder (pid,
node, since when) for the refusal message; it is left in place when released.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

LOCK_SUFFIX = ".lock"


class SpoolInUse(RuntimeError):
    """Another process holds the spool; the message says who and how to fix it."""


class SpoolLock:
    """Exclusive hold on a spool path for this process (``acquire`` ... ``release``)."""

    def __init__(self, spool_path: Path | str, holder: str) -> None:
        self.path = Path(f"{spool_path}{LOCK_SUFFIX}")
        self.holder = holder
        self._fd: int | None = None

    def acquire(self) -> SpoolLock:
        """Take the lock or raise SpoolInUse naming the other holder; OSError if unusable."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            other = _read_holder(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise SpoolInUse(f"in use by {other or 'another process'}") from None
            raise
        self._fd = fd
        self._write_holder()
        return self

    def release(self) -> None:
        """Let go of the lock (closing the descriptor releases it); idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    @property
    def held(self) -> bool:
        """True while this object holds the lock."""
        return self._fd is not None

    def _write_holder(self) -> None:
        since = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        line = f"pid {os.getpid()} ({self.holder}) since {since}\n".encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, line, 0)


def _read_holder(fd: int) -> str:
    """The holder's line (best effort: '' when unreadable or being rewritten)."""
    try:
        return os.pread(fd, 512, 0).decode("utf-8", "replace").strip()
    except OSError:
        return ""
