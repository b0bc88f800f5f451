"""Where discovery's passes over the parts of a log run: this process, or a Ray cluster.

A scan in parts (``discovery.scan._scan_parts``) runs three passes, each a function applied to
every part of the log with the same inputs; the results come back in part order and are
summed in the calling process, which also runs the tests. ``EmbeddedEngine`` applies the
function in a loop; ``RayEngine`` puts the log and the shared inputs in Ray's object store
once and runs each part as a Ray task (``ray.remote``) on whatever cluster ``address``
names (``None``: a local one started for this process), keeping at most ``in_flight``
parts' results pending so the caller's memory stays bounded. Both give the same numbers:
the functions are the same and the sums are taken in the same order.

``EmbeddedEngine`` runs up to ``threads`` parts at once on threads of this process: the
passes are numpy sorts, gathers and ufuncs, which release the GIL, so a second core
nearly halves a fleet log's passes while the memory stays one process's (no copy of the
log per worker process; discovery cuts parts, key buckets and test buckets smaller per
thread, so together they hold about what one did). ``ordered_map`` is that pool;
discovery's key counts and tests use it for their buckets too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import cache

ENGINES = ("embedded", "ray")


class EngineError(RuntimeError):
    """An engine could not start (Ray missing, no cluster at the address)."""


MAX_THREADS = 4
"""Default ceiling on threads: each holds one part's or one bucket's temporaries (~0.1-0.2
GB on a fleet log), and past a few cores the shared sums in the caller are the limit."""


def default_threads() -> int:
    """The cores this process may run on, at most ``MAX_THREADS``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_THREADS))


def ordered_map(fn: Callable, items: Iterable, threads: int) -> Iterator:
    """``fn(item)`` for each item on ``threads`` threads, yielded in the items' order.

    At most ``threads`` results wait beside the one the caller holds, so memory is bounded
    by the thread count, not by the number of items. One thread: a plain loop (no pool).
    An exception in ``fn`` is raised here; work not yet started is cancelled.
    """
    todo = iter(items)
    if threads <= 1:
        for item in todo:
            yield fn(item)
        return
    pool = ThreadPoolExecutor(threads, thread_name_prefix="thinkmem-part")
    try:
        pending = deque(pool.submit(fn, item) for _, item in zip(range(threads), todo))
        while pending:
            result = pending.popleft().result()
            for item in todo:
                pending.append(pool.submit(fn, item))
                break
            yield result
            del result
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def release_free_memory() -> None:
    """Give the heap pages freed so far back to the operating system (glibc only).

    glibc keeps freed blocks below its mmap threshold (which grows to 32 MB) in the heap
    of the thread arena that freed them, so with parts on several threads each arena
    keeps a part's worth of freed temporaries: a 3 x 10^6-event discovery on two threads
    peaked at 1.52 GB, 1.12 GB with this after each part and pass (and smaller parts).
    ``malloc_trim`` returns them; elsewhere a no-op.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@cache
def _malloc_trim():
    """The C library's ``malloc_trim``, looked up once; None where it has none.

    Once: ``find_library`` reads the loader cache (~1 ms), and a trim runs after every
    part and test bucket of a fleet log (thousands).
    """
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: its allocator is its own business
        return None


class EmbeddedEngine:
    """Every part in this process, up to ``threads`` at once (see the module docstring)."""

    name = "embedded"

    def __init__(self, threads: int | None = None) -> None:
        if threads is not None and threads < 1:
            raise EngineError(f"threads must be >= 1, got {threads}")
        self.threads = threads or default_threads()
        # parts in flight at once in this process: smaller parts keep their sum one part's
        self.concurrent_parts = self.threads

    def map(self, fn: Callable, log, parts: list[tuple[int, int]], *args) -> Iterator:
        """``fn(log, first, last, *args)`` for each part, results in part order."""
        def one(part: tuple[int, int]):
            out = fn(log, part[0], part[1], *args)
            if self.threads > 1:  # see release_free_memory: each thread's arena keeps a part
                release_free_memory()
            return out

        return ordered_map(one, parts, self.threads)

    def close(self) -> None:
        """Nothing to release."""


class RayEngine:
    """Each part as a Ray task; see the module docstring."""

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None,
                 in_flight: int | None = None, threads: int | None = None) -> None:
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
        self.threads = threads or default_threads()  # for what stays in the driver
        self.concurrent_parts = 1  # the parts run in other processes
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


def make_engine(name: str, address: str | None = None, num_cpus: int | None = None,
                threads: int | None = None):
    """The engine called ``name`` (one of ``ENGINES``).

    ``num_cpus``: the cores of a local Ray instance; ``threads``: this process's threads
    (the embedded engine's parts and both engines' tests; ``None``: ``default_threads``).
    """
    if threads is not None and threads < 1:
        raise EngineError(f"threads must be >= 1, got {threads}")
    if name == "embedded":
        if address:
            raise EngineError("--address only applies to --engine ray")
        return EmbeddedEngine(threads=threads)
    if name == "ray":
        return RayEngine(address=address, num_cpus=num_cpus, threads=threads)
    raise EngineError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")
