"""One consolidator runs rounds on a store and a publish folder at a time.

Why: two consolidators on one store, or one publish folder, both stage version N+1: one
fails on the other's staging files and a half-written rehearsal set is left behind, or
each publishes a different v(N+1). Receivers that only ingest may share a store (the
store's SQLite lock orders their writes); rounds may not. An advisory ``flock`` on a file
beside the store and one in the publish folder says so at start, in one line, and is
released by the kernel when the process dies, so a killed consolidator never leaves a
stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class RoundLockError(RuntimeError):
    """Another consolidator already runs rounds on this store or publish folder."""


class RoundLock:
    """Held for as long as this process runs rounds; ``release`` (or exit) frees it."""

    def __init__(self, db_path: Path | str, publish_dir: Path | str) -> None:
        self._fds: list[int] = []
        publish = Path(publish_dir)
        # beside the store file itself: through a symlink to it (or a second link) a lock
        # file beside the link let a second consolidator run rounds on the same store
        store_lock = Path(f"{os.path.realpath(db_path)}.rounds.lock")
        try:
            publish.mkdir(parents=True, exist_ok=True)
            for path, what in ((store_lock, f"the store {db_path}"),
                               (publish / ".rounds.lock", f"the publish folder {publish}")):
                self._take(path, what)
        except BaseException:
            self.release()
            raise

    def _take(self, path: Path, what: str) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RoundLockError(f"another consolidator runs rounds on {what} (it holds "
                                 f"{path}); stop it first, or give this one its own --db "
                                 f"and --publish-dir") from None
        self._fds.append(fd)

    def release(self) -> None:
        """Free both locks (idempotent)."""
        while self._fds:
            os.close(self._fds.pop())

    def __enter__(self) -> RoundLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()
