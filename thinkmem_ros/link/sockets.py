"""ZeroMQ plumbing both ends share: the process's one Context, one error type, quiet logs.

One ``zmq.Context`` per process (``context()``): sockets share its I/O thread and its ZAP
handler, and the recall client, the shipper and the receiver all live in one process in
tests. Errors from ZeroMQ that reach a caller are re-raised as ``TransportError``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

import zmq


class TransportError(RuntimeError):
    """A socket, spool or store operation of the transport failed."""


def context() -> zmq.Context:
    """Return the process's one ZeroMQ Context (sockets share its I/O thread and ZAP)."""
    _seed_routing_ids()
    return zmq.Context.instance()


_SEEDED: list[bool] = []


def _seed_routing_ids() -> None:
    """Make the routing ids a ROUTER gives anonymous peers unpredictable.

    libzmq (4.3.5) numbers them from the C library's ``rand()``, which nothing seeds: the
    first ROUTER of every process starts at the same id, and the id of the next peer is
    not checked against ids that peers chose themselves. A peer that connects with the
    next few ids first makes the next genuine connection abort the whole process (an
    assertion in libzmq, found by a hostile-input audit). Seeded from the OS, the next id
    is one of 2^32 and cannot be claimed in advance. Done once, before any socket exists.
    """
    if _SEEDED:
        return
    _SEEDED.append(True)
    seed = _libc_function("srand")
    if seed is not None:
        seed(ctypes.c_uint(int.from_bytes(os.urandom(4), "little")))


class RateLimitedLog:
    """Log the first occurrence and then every ``every``-th, so floods stay readable."""

    def __init__(self, logger: logging.Logger, every: int = 100) -> None:
        self.logger = logger
        self.every = every
        self.count = 0

    def __call__(self, level: int, message: str, *args: object) -> None:
        self.count += 1
        if self.count == 1 or self.count % self.every == 0:
            self.logger.log(level, message + " (%d so far)", *args, self.count)


_LIBC: list = []


def release_freed_memory() -> bool:
    """Hand the C heap's free pages back to the OS (glibc ``malloc_trim``); False elsewhere.

    Large frames are allocated by ZeroMQ's I/O thread and freed by ours; glibc keeps such
    freed memory in its arenas, so after a burst of big (even refused) frames the process
    would look hundreds of MB bigger for good. Trimming after a burst makes that memory
    the system's again; it costs a few milliseconds, so callers do it when idle.
    """
    trim = _libc_function("malloc_trim")  # glibc only (musl, macOS: nothing to trim)
    if trim is None:
        return False
    trim(0)
    return True


def _libc_function(name: str):
    """The C library's ``name``, or None where the library or the function is missing."""
    if not _LIBC:
        path = ctypes.util.find_library("c")
        try:
            _LIBC.append(ctypes.CDLL(path) if path else None)
        except OSError:
            _LIBC.append(None)
    return getattr(_LIBC[0], name, None) if _LIBC[0] is not None else None
