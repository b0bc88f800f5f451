"""Bundle hot-swap: verify a new bundle off the tick path, swap it in between two frames.

A new bundle arrives either as a ``bundle_path`` parameter change or as the bundle's files
replaced on disk (the consolidator's push). Loading hashes files and builds an ONNX
Runtime session, which takes milliseconds to seconds, so it runs on the ``HotSwapper``
thread; the inference thread only calls ``PolicySlot.current()``, which picks up a
verified candidate at the start of a frame. A bad bundle never reaches the slot: the old
policy keeps running and the error is kept for the diagnostics until a good one arrives.

On a robot configured with a bundle-signing key, loading cleanly is not enough: a
``SwapGuard`` makes the watched bundle, and any bundle under ``bundles_dir``, pass the same
signature check as a push before it is loaded, and keeps ``pin_bundle_version``.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from thinkmem_ros.core.paths import resolve_bundle_path
from thinkmem_ros.policy.bundle import (
    MANIFEST,
    ONNX_FILE,
    Bundle,
    BundleError,
    load_bundle,
    signal_set_fingerprint,
)


@dataclass(frozen=True)
class LoadedPolicy:
    """A verified bundle with its runtime and effective thresholds, immutable once built."""

    path: Path
    runtime: object  # thinkmem_ros.policy.runtime.PolicyRuntime
    labels: tuple[str, ...]
    signals: tuple[str, ...]
    window: int
    max_events: int
    event_vocabulary: tuple[str, ...]
    thresholds: np.ndarray  # (L,) float32
    version: int
    sha256: str
    frame_rate_hz: float
    # bundle.json's signal-set fingerprint (computed for a bundle that declares none): every
    # experience carries it, so the consolidator can accept a bundle it never published
    signal_set: str = ""


def load_policy(path: str | Path, *, signals: tuple[str, ...] | None = None,
                thresholds: dict[str, float] | None = None, threads: int = 1,
                like: LoadedPolicy | None = None) -> LoadedPolicy:
    """Load and verify a bundle (sha256, format, graph shapes, labels) and probe it once.

    ``signals`` are the signals the node can subscribe to; ``like`` is the running policy,
    whose window and signal order a replacement must keep (changing them needs a restart).
    Raises BundleError naming the bundle and the reason.
    """
    from thinkmem_ros.policy.runtime import PolicyRuntime

    folder = resolve_bundle_path(path)
    bundle = load_bundle(folder)
    m = bundle.manifest
    if signals is not None:
        missing = [s for s in m.signals if s not in signals]
        if missing:
            raise BundleError(f"{folder}: bundle needs signals {missing} that have no topic "
                              f"configured (configured: {list(signals)})")
    if like is not None:
        if tuple(m.signals) != like.signals:
            raise BundleError(f"{folder}: signals {m.signals} differ from the running "
                              f"{list(like.signals)}; restart the node to change them")
        if m.window != like.window or m.max_events != like.max_events:
            raise BundleError(f"{folder}: window K={m.window}, M={m.max_events} differ from "
                              f"the running K={like.window}, M={like.max_events}; restart "
                              "the node to change them")
    try:
        runtime = PolicyRuntime(bundle, threads=threads, thresholds=thresholds or None)
    except ValueError as exc:  # thresholds naming labels this bundle does not have
        raise BundleError(f"{folder}: {exc}") from exc
    if list(runtime.labels) != list(m.labels) or runtime.window != m.window:
        raise BundleError(f"{folder}: runtime labels/window disagree with bundle.json")
    _probe(runtime, m, folder)
    return LoadedPolicy(
        path=folder, runtime=runtime, labels=tuple(m.labels), signals=tuple(m.signals),
        window=m.window, max_events=m.max_events, event_vocabulary=tuple(m.event_vocabulary),
        thresholds=np.asarray(runtime.thresholds, np.float32), version=m.model_version,
        sha256=m.sha256, frame_rate_hz=m.frame_rate_hz,
        signal_set=m.signal_set or signal_set_fingerprint(m))


def _probe(runtime, m, folder: Path) -> None:
    """Run the load-time test inference; BundleError (one line) when it fails or lies.

    A graph can load and still fail its first run (a Reshape impossible at run time), or
    answer probabilities outside [0, 1] or a non-finite embedding: each would break every
    frame, so such a bundle is refused here, before it can become the running policy. The
    probe runs on zeros and on realistic windows (``_probe_windows``).
    """
    for signals in _probe_windows(m):
        _probe_one(runtime, m, folder, signals)


def _probe_windows(m) -> list[np.ndarray]:
    """The probe's inputs: an all-zero window, then windows of realistic values.

    Zeros alone let through a graph that answers zeros correctly and NaN for anything a
    robot actually sends (hazard could then never fire); the training mean, and the mean
    one standard deviation up, are what real frames look like, taken from the manifest.
    """
    k, f = m.window, len(m.signals)
    mean = np.asarray(m.normalisation["mean"], np.float32)
    std = np.asarray(m.normalisation["std"], np.float32)
    return [np.zeros((k, f), np.float32), np.broadcast_to(mean, (k, f)).copy(),
            np.broadcast_to(mean + std, (k, f)).copy()]


def _probe_one(runtime, m, folder: Path, signals: np.ndarray) -> None:
    """One probe inference; BundleError (one line) when it fails or its outputs lie."""
    try:
        probe = runtime.predict_one(signals, np.ones_like(signals),
                                    np.zeros(m.max_events, np.int64))
        probs = np.asarray(probe.probabilities)
        embedding = np.asarray(probe.embedding)
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own unexported types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise BundleError(f"{folder}: the load-time test inference failed (sha256 "
                          f"{m.sha256}): {type(exc).__name__}: {first}") from None
    if probs.shape != (1, len(m.labels)) or not np.isfinite(probs).all() \
            or probs.min() < 0.0 or probs.max() > 1.0:
        raise BundleError(f"{folder}: the load-time test inference gave probabilities of "
                          f"shape {probs.shape} (expected (1, {len(m.labels)})) or values "
                          f"outside [0, 1] (NaN/inf included) for {_probe_name(signals)}")
    width = runtime.embedding_dim
    if embedding.shape != (1, width) or not np.isfinite(embedding).all():
        raise BundleError(f"{folder}: the load-time test inference gave an embedding of "
                          f"shape {embedding.shape} (expected (1, {width})) or with NaN/inf "
                          f"values for {_probe_name(signals)}")


def _probe_name(signals: np.ndarray) -> str:
    """Which probe input failed, in words (the operator's first question)."""
    return "an all-zero window" if not signals.any() else "a window of realistic values"


class PolicySlot:
    """The running policy plus at most one verified candidate, swapped between frames."""

    def __init__(self, policy: LoadedPolicy) -> None:
        self._lock = threading.Lock()
        self._current = policy
        self._pending: LoadedPolicy | None = None
        self.swaps = 0

    def offer(self, policy: LoadedPolicy) -> None:
        """Queue ``policy`` for the next frame; a newer offer replaces an unused one."""
        with self._lock:
            self._pending = policy

    def current(self) -> tuple[LoadedPolicy, bool]:
        """Return the policy for this frame and whether it was just swapped in."""
        with self._lock:
            if self._pending is None:
                return self._current, False
            self._current, self._pending = self._pending, None
            self.swaps += 1
            # A streaming policy's state belongs to the stream it last saw: the swapped-in
            # one starts afresh (it replays the node's window at its first frame).
            reset = getattr(self._current.runtime, "reset", None)
            if reset is not None:
                reset("start")
            return self._current, True

    def peek(self) -> LoadedPolicy:
        """Return the policy the next frame will use (pending if any), without swapping."""
        with self._lock:
            return self._pending or self._current


@dataclass(frozen=True)
class SwapGuard:
    """What a bundle must prove, beyond loading cleanly, before it may be swapped in.

    The receiver verifies each push, but the installed files stay writable afterwards: an
    edited ``bundles_dir/v<N>/bundle.json`` (thresholds at 1.0, so nothing, hazard
    included, can fire) was swapped in by the watcher as if pushed. On a robot configured
    with a signing key (``verify`` set), a watched bundle and any bundle under
    ``bundles_dir`` must therefore pass the push's signature check, and the loaded
    manifest must be the verified one. Without a key (a developer's local, unsigned
    bundle) nothing can be verified and nothing is, as before. ``pin`` > 0 refuses every
    other version, as the receiver refuses a push of one.
    """

    verify: Callable[[Path], Bundle] | None = None  # raises when the signature fails
    bundles_dir: Path | None = None
    pin: int = 0

    def check_signature(self, path: Path, *, watched: bool) -> Bundle | None:
        """The verified bundle when ``path`` needs a signature, else None; raises if bad."""
        if self.verify is None or not (watched or self._installed(path)):
            return None
        return self.verify(path)

    def check_loaded(self, policy: LoadedPolicy, signed: Bundle | None) -> None:
        """Refuse a loaded policy that is not the signed one, or not the pinned version."""
        if signed is not None and policy.runtime.manifest != signed.manifest:
            raise BundleError(f"{policy.path}: bundle.json changed while it was being "
                              "verified; not swapping in a manifest whose signature was "
                              "not checked")
        if self.pin and policy.version != self.pin:
            raise BundleError(f"{policy.path}: v{policy.version} is not the pinned "
                              f"v{self.pin} (pin_bundle_version)")

    def _installed(self, path: Path) -> bool:
        """True when ``path`` lies under ``bundles_dir`` (links resolved on both sides)."""
        if self.bundles_dir is None:
            return False
        return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(self.bundles_dir))


def fingerprint(folder: Path) -> tuple:
    """(inode, size, mtime_ns) of both bundle files; changes when either is replaced."""
    out = []
    for name in (MANIFEST, ONNX_FILE):
        try:
            st = os.stat(folder / name)
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


class HotSwapper(threading.Thread):
    """Background thread: loads requested bundles and polls the running one's files."""

    def __init__(self, slot: PolicySlot, load: Callable[..., LoadedPolicy], *,
                 watch: bool, period_s: float,
                 on_result: Callable[[LoadedPolicy | None, str], None],
                 guard: SwapGuard | None = None) -> None:
        super().__init__(name="thinkmem-hotswap", daemon=True)
        self._slot = slot
        self._load = load
        self._guard = guard or SwapGuard()
        self._watch = watch
        self._period = period_s
        self._on_result = on_result  # (policy, '') on success, (None, error) on refusal
        self._requests: queue.Queue[Path] = queue.Queue()
        self._stop_event = threading.Event()
        self._path = slot.peek().path
        self._seen = fingerprint(self._path)
        self.error = ""

    def request(self, path: str | Path) -> None:
        """Ask for ``path`` ('' = default bundle) to be verified and swapped in."""
        self._requests.put(resolve_bundle_path(path))

    def stop(self, timeout: float = 2.0) -> None:
        """Stop polling and wait (bounded) for the thread to end."""
        self._stop_event.set()
        self._requests.put(Path())  # wake the thread
        if self.is_alive():
            self.join(timeout)

    def run(self) -> None:
        """Serve requests; between them, poll the running bundle's files."""
        while not self._stop_event.is_set():
            try:
                path = self._requests.get(timeout=self._period)
            except queue.Empty:
                path = None
            if self._stop_event.is_set():
                return
            if path is not None:
                self._attempt(path, watched=False)
            elif self._watch:
                current = fingerprint(self._path)
                if current != self._seen:
                    self._seen = current
                    self._attempt(self._path, watched=True)

    def _attempt(self, path: Path, *, watched: bool) -> None:
        running = self._slot.peek()
        try:
            # the signature before the graph: an unverified ONNX file is never parsed
            signed = self._guard.check_signature(path, watched=watched)
            policy = self._load(path, like=running)
            self._guard.check_loaded(policy, signed)
            if watched and policy.version < running.version:
                raise BundleError(f"{path}: version {policy.version} is older than the "
                                  f"running version {running.version}")
        except Exception as exc:  # noqa: BLE001 - any failure must leave the old policy running
            self.error = str(exc)  # said once, by on_result (the node logs it to /rosout)
            self._on_result(None, self.error)
            return
        self._path = path
        self._seen = fingerprint(path)
        self.error = ""
        if policy.sha256 == running.sha256 and policy.version == running.version and watched:
            self._on_result(None, "")  # same model touched on disk: nothing to swap
            return
        self._slot.offer(policy)
        self._on_result(policy, "")
