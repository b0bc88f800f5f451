"""ZeroMQ plumbing both ends share: the process's one Context, one error type, quiet logs.

One ``zmq.Context`` per process (``context()``): sockets share its I/O thread and its ZAP
handler, and the recall client, the shipper and the receiver all live in one process in
tests. Errors from ZeroMQ that reach a caller are re-raised as ``TransportError``.
"""

from __future__ import annotations

import logging

import zmq


class TransportError(RuntimeError):
    """A socket, spool or store operation of the transport failed."""


def context() -> zmq.Context:
    """Return the process's one ZeroMQ Context (sockets share its I/O thread and ZAP)."""
    return zmq.Context.instance()


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
