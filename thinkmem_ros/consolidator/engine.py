"""Where discovery's passes over the parts of a log run: this process, or a Ray cluster.

A scan in parts (``discovery._scan_parts``) runs three passes, each a function applied to
every part of the log with the same inputs; the results come back in part order and are
summed in the calling process, which also runs the tests. ``EmbeddedEngine`` applies the
function in a loop; ``RayEngine`` puts the log and the shared inputs in Ray's object store
once and runs each part as a Ray task (``ray.remote``) on whatever cluster ``address``
names (``None``: a local one started for this process), keeping at most ``in_flight``
parts' results pending so the caller's memory stays bounded. Both give the same numbers:
the functions are the same and the sums are taken in the same order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

ENGINES = ("embedded", "ray")


class EngineError(RuntimeError):
    """An engine could not start (Ray missing, no cluster at the address)."""


class EmbeddedEngine:
    """Every part in this process, one after the other."""

    name = "embedded"

    def map(self, fn: Callable, log, parts: list[tuple[int, int]], *args) -> Iterator:
        """``fn(log, first, last, *args)`` for each part, in order."""
        for first, last in parts:
            yield fn(log, first, last, *args)

    def close(self) -> None:
        """Nothing to release."""


class RayEngine:
    """Each part as a Ray task; see the module docstring."""

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None,
                 in_flight: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise EngineError("the ray engine needs Ray: pip install 'ray==2.60.0'") from None
        self._ray = ray
        self._started = False
        if address and address != "auto":
            _check_reachable(address)
        if not ray.is_initialized():
            try:
                ray.init(address=address, num_cpus=None if address else num_cpus,
                         include_dashboard=False, log_to_driver=False,
                         configure_logging=False)
            except Exception as exc:  # noqa: BLE001 - ConnectionError and Ray's own errors
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise EngineError(f"cannot start or reach a Ray cluster at "
                                  f"{address or 'a new local instance'}: {first}") from None
            self._started = True
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.in_flight = in_flight or max(2, cpus)
        self._remote: dict[Callable, object] = {}

    def map(self, fn: Callable, log, parts: list[tuple[int, int]], *args) -> Iterator:
        """``fn(log, first, last, *args)`` for each part as a Ray task; results in order."""
        ray = self._ray
        task = self._remote.get(fn)
        if task is None:
            task = self._remote[fn] = ray.remote(fn)
        log_ref = ray.put(log)
        arg_refs = [ray.put(a) for a in args]
        pending: deque = deque()
        todo = iter(parts)
        for first, last in todo:
            pending.append(task.remote(log_ref, first, last, *arg_refs))
            if len(pending) >= self.in_flight:
                break
        while pending:
            result = ray.get(pending.popleft())
            nxt = next(todo, None)
            if nxt is not None:
                pending.append(task.remote(log_ref, nxt[0], nxt[1], *arg_refs))
            yield result
        del log_ref, arg_refs

    def close(self) -> None:
        """Shut down the local Ray instance this engine started (not a cluster it joined)."""
        if self._started and self._ray.is_initialized():
            self._ray.shutdown()
        self._started = False


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds on an address nothing listens at (Ray itself retries for minutes)."""
    import socket

    host_port = address.split("://", 1)[-1]
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        raise EngineError(f"Ray address must look like host:port or ray://host:port, got "
                          f"{address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise EngineError(f"no Ray cluster answers at {address}: {exc}") from None


def make_engine(name: str, address: str | None = None, num_cpus: int | None = None):
    """The engine called ``name`` (one of ``ENGINES``)."""
    if name == "embedded":
        if address:
            raise EngineError("--address only applies to --engine ray")
        return EmbeddedEngine()
    if name == "ray":
        return RayEngine(address=address, num_cpus=num_cpus)
    raise EngineError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")
