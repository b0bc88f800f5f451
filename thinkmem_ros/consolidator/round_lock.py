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
        self._made: list[Path] = []  # the files and folders taking the locks created
        publish = Path(publish_dir)
        # beside the store file itself: through a symlink to it (or a second link) a lock
        # file beside the link let a second consolidator run rounds on the same store
        store_lock = Path(f"{os.path.realpath(db_path)}.rounds.lock")
        try:
            self._make_folder(publish)
            self._make_folder(store_lock.parent)  # a new store's folder: the store makes it too
            for path, what in ((store_lock, f"the store {db_path}"),
                               (publish / ".rounds.lock", f"the publish folder {publish}")):
                self._take(path, what)
        except BaseException:
            self.discard()
            raise

    def _make_folder(self, folder: Path) -> None:
        missing = [p for p in (folder, *folder.parents) if not p.exists()]
        folder.mkdir(parents=True, exist_ok=True)
        self._made += reversed(missing)

    def _take(self, path: Path, what: str) -> None:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            self._made.append(path)
        except FileExistsError:
            fd = os.open(path, os.O_RDWR)
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

    def discard(self) -> None:
        """Free both locks and remove the lock files and folders taking them created.

        Why: a start refused after the lock was taken (its address in use) left
        ``<db>.rounds.lock`` and a publish folder behind, where a refused command
        changes nothing. The files go while still locked, so a consolidator starting
        meanwhile either meets the lock or makes a file of its own.
        """
        for path in reversed(self._made):
            try:
                path.rmdir() if path.is_dir() else path.unlink()
            except OSError:  # a folder something else has written into since: kept
                pass
        self._made.clear()
        self.release()

    def __enter__(self) -> RoundLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()
