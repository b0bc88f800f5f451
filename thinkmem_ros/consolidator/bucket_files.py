"""Records appended to one of many files by bucket, then read back one bucket at a time.

The shuffle step of an out-of-core group-by: a scan that produces rows for many groups,
part by part, appends each row to the file of its group's bucket; afterwards every bucket
holds all rows of its groups and fits in memory alone. Discovery uses it for the keys it
counts (``KeyTally``) and for the frames of its candidates, so a fleet-sized log is tested
in memory bounded by one part and one bucket.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np

_OWNED = re.compile(r"thinkmem-spill-(\d+)-")


def sweep_orphans(parent: Path) -> int:
    """Delete spill folders whose process is gone (killed mid-scan: gigabytes at 10^7).

    A folder's name carries its process id; a live process with that id keeps it, even
    if the id was reused, so nothing in use is ever removed. Returns folders removed.
    """
    removed = 0
    for path in parent.glob("thinkmem-spill-*"):
        match = _OWNED.match(path.name)
        if match is None or not path.is_dir():
            continue
        try:
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
        except OSError:  # alive, owned by another user: not ours to judge
            continue
    return removed


class BucketFiles:
    """Append-only files of ``dtype`` records, one per bucket, in a private temp folder."""

    def __init__(self, buckets: int, dtype: np.dtype, directory: str | None = None) -> None:
        if buckets < 1:
            raise ValueError(f"buckets must be >= 1, got {buckets}")
        self.buckets, self.dtype = buckets, np.dtype(dtype)
        parent = Path(directory or tempfile.gettempdir())
        sweep_orphans(parent)
        self._root: Path | None = Path(tempfile.mkdtemp(
            prefix=f"thinkmem-spill-{os.getpid()}-", dir=parent))
        self.rows = 0

    def _path(self, bucket: int) -> Path:
        if self._root is None:
            raise RuntimeError("BucketFiles used after close")
        return self._root / f"{bucket}.bin"

    def append(self, bucket: np.ndarray, **columns: np.ndarray) -> None:
        """Append rows, given as one plain array per field of ``dtype``, to their buckets."""
        # bucket ids fit 16 bits here, where numpy's stable sort is a linear radix sort
        small = np.uint16 if self.buckets <= 1 << 16 else np.int64
        order = np.argsort(np.asarray(bucket).astype(small), kind="stable")
        bounds = np.searchsorted(bucket[order], np.arange(self.buckets + 1))
        records = np.empty(order.size, self.dtype)
        for name in self.dtype.names:  # plain gathers: a structured one is ~10x slower
            records[name] = np.asarray(columns[name])[order]
        for b in np.flatnonzero(np.diff(bounds)).tolist():
            with open(self._path(b), "ab") as fh:
                records[bounds[b]:bounds[b + 1]].tofile(fh)
        self.rows += records.size

    def read(self, bucket: int) -> np.ndarray:
        """Every record appended to ``bucket``, in the order appended."""
        path = self._path(bucket)
        if not path.exists():
            return np.zeros(0, self.dtype)
        return np.fromfile(path, self.dtype)

    def drop(self, bucket: int) -> None:
        """Delete one bucket's file once it has been read (frees the disk early)."""
        self._path(bucket).unlink(missing_ok=True)

    def close(self) -> None:
        """Delete every file."""
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def __enter__(self) -> BucketFiles:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_root", None) is not None:  # not when __init__ refused its arguments
            self.close()


class ParkedArray:
    """One array kept on disk while a scan's peak passes, then read back whole.

    A scan's result can include an array the scan itself no longer needs (discovery's
    frequent pairs: ~2 x 10^7 keys, 0.18 GB on a fleet log, needed only by the caller);
    holding it through the scan's peak costs that much of the memory bound for nothing.
    """

    def __init__(self, array: np.ndarray, directory: str | None = None) -> None:
        self._files = BucketFiles(1, [("value", array.dtype)], directory)
        self.dtype, self.size = array.dtype, int(array.size)
        with open(self._files._path(0), "wb") as fh:
            np.ascontiguousarray(array).tofile(fh)

    def load(self) -> np.ndarray:
        """The array as parked (the file is deleted: a parked array is read back once)."""
        out = np.fromfile(self._files._path(0), self.dtype, count=self.size) \
            if self.size else np.zeros(0, self.dtype)
        self._files.close()
        return out

    def close(self) -> None:
        """Delete the file without reading it (the scan failed)."""
        self._files.close()
