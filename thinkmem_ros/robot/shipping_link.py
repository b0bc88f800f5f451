"""The node's link to the consolidator: experiences out, signed bundles in.

Plain Python (no rclpy), so it is tested without ROS: the node hands it frames, events and
feedback, and asks it for two diagnostic statuses ("shipping", "bundle push"). Every
published frame waits ``feedback_window_s`` in the ``ExperienceBuilder`` for hindsight
feedback, is built into an ``Experience`` on a small release thread and handed to the
``ExperienceShipper``; bundles the consolidator pushes over the same connection are
verified by the ``BundleReceiver`` on the shipper's thread and handed to the hot-swap.
Nothing here runs on the tick except O(1) appends.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from thinkmem_ros.core.paths import resolve_bundle_path
from thinkmem_ros.link.security import (
    SecurityError,
    load_curve_keypair,
    load_curve_public,
)
from thinkmem_ros.link.shipper import ExperienceShipper, ShipperConfig
from thinkmem_ros.link.sockets import TransportError
from thinkmem_ros.link.spool_lock import SpoolInUse, SpoolLock
from thinkmem_ros.policy.bundle import (
    MANIFEST,
    MAX_MANIFEST_BYTES,
    Bundle,
    BundleError,
    read_bundle_file,
    read_manifest,
)
from thinkmem_ros.robot.activation import FrameResult
from thinkmem_ros.robot.bundle_receiver import (
    CURRENT_LINK,
    BundleReceiver,
    BundleReceiverConfig,
    intact_installed,
    point_current,
    version_folders,
)
from thinkmem_ros.robot.diagnostics import (
    PushSnapshot,
    ShippingSnapshot,
    StatusReport,
    push_status,
    shipping_status,
)
from thinkmem_ros.robot.experience_builder import (
    BuilderConfig,
    ExperienceBuilder,
    FeedbackError,
    parse_feedback,
)
from thinkmem_ros.robot.hotswap import LoadedPolicy, load_policy
from thinkmem_ros.robot.node_config import NodeConfig
from thinkmem_ros.robot.trust_store import TrustStore, TrustStoreConfig, log_outcome


def newer_installed_bundle(config: NodeConfig, verify_key, logger) -> Path | None:
    """Return the signed bundle in ``bundles_dir/current`` if newer than ``bundle_path``'s.

    A robot restarted after a push keeps the pushed model instead of rolling back. The
    installed bundle is verified again (signature and hash): files on disk may have changed.
    The signature is checked against the trust list in ``bundles_dir`` (after applying the
    key chain the installed manifest carries, as a push would: a no-op unless the trust
    file was lost), so a bundle signed by a rotated key survives the restart. When
    ``current`` is lost or damaged, the newest version folder that verifies the same way
    takes its place (see ``_current_bundle``).

    With ``pin_bundle_version`` set, only that version is ever returned: ``bundle_path`` when
    it is the pinned version (None), else ``bundles_dir/v<pin>`` when it verifies; if
    neither is, the robot runs ``bundle_path`` and says so (a push of the pin installs it).
    """
    folder = config.bundles_folder()
    pin = config.pin_bundle_version
    configured = read_manifest(resolve_bundle_path(config.bundle_path)).model_version
    if pin and configured == pin:
        return None
    installed = None
    if verify_key is not None:
        installed = (_pinned_bundle(folder, pin, verify_key, logger) if pin
                     else _current_bundle(folder, verify_key, configured, logger))
    if pin and (installed is None or installed.version != pin):
        logger.error(f"pin_bundle_version {pin}: neither bundle_path (v{configured}) nor a "
                     f"verified bundle in {folder} is v{pin}; running bundle_path and "
                     f"installing only a push of v{pin}")
        return None
    if installed is None or (not pin and installed.version <= configured):
        return None
    why = (f"pin_bundle_version; bundle_path is v{configured}" if pin
           else f"newer than bundle_path's v{configured}")
    logger.info(f"using the installed pushed bundle v{installed.version} at {installed.path} "
                f"({why})")
    return installed.path


def _pinned_bundle(folder: Path, pin: int, verify_key, logger) -> Bundle | None:
    candidate = folder / f"v{pin:06d}"
    if not candidate.exists():
        return None
    try:
        trust = TrustStore(TrustStoreConfig(folder, verify_key))
        return verified_like_a_push(trust, candidate.resolve())
    except (BundleError, ValueError, OSError) as exc:
        logger.error(f"ignoring the installed bundle {candidate}: {exc}")
        return None


def _current_bundle(folder: Path, verify_key, configured: int, logger) -> Bundle | None:
    """``current`` when it verifies, else the newest version folder that does.

    Power loss or a failing disk can truncate a graph, NUL-fill a manifest or lose the
    folder ``current`` names while older signed versions still sit intact beside it;
    running ``bundle_path`` then would be a silent rollback. One ERROR line says what was
    wrong and what runs instead, and ``current`` is pointed at the bundle that verified,
    so the receiver and the next start agree with this one.
    """
    link = folder / CURRENT_LINK
    if not os.path.lexists(link) and not version_folders(folder):
        return None  # nothing was ever pushed here
    try:
        trust = TrustStore(TrustStoreConfig(folder, verify_key))
    except ValueError as exc:  # a corrupt trust file: no installed bundle can be verified
        logger.error(f"ignoring the installed bundle {link}: {exc}")
        return None
    bundle, problem = intact_installed(folder, functools.partial(verified_like_a_push, trust))
    if problem:
        logger.error(f"installed bundle {link} {problem}; "
                     f"{_fallback(folder, bundle, configured)}")
    return bundle


def _fallback(folder: Path, bundle: Bundle | None, configured: int) -> str:
    """Point ``current`` at ``bundle``; say what runs now and what became of ``current``."""
    if bundle is None:
        return f"no intact installed bundle in {folder}: running bundle_path v{configured}"
    runs = (f"running v{bundle.version} ({bundle.path}) instead" if bundle.version > configured
            else f"running bundle_path v{configured} (the newest intact installed bundle "
                 f"is v{bundle.version})")
    try:
        aside = point_current(folder, bundle.path.name)
    except OSError as exc:
        return f"{runs}; cannot repoint {CURRENT_LINK}: {exc}"
    moved = f", the old one moved to {aside.name}" if aside is not None else ""
    return f"{runs}; {CURRENT_LINK} now points to {bundle.path.name}{moved}"


def verified_like_a_push(trust: TrustStore, folder: Path) -> Bundle:
    """Verify an installed bundle as a push is verified (key chain first, then signature).

    A manifest that does not even parse was damaged, not tampered with: no signature was
    ever checked on it, so it is reported as such. It is read capped and refused when it is
    no regular file (OSError): a FIFO blocked the node's start forever and a link to
    /dev/zero filled memory, where the caller falls back to another bundle instead.
    """
    raw = read_bundle_file(folder / MANIFEST, MAX_MANIFEST_BYTES)
    try:
        json.loads(raw)
    except (ValueError, RecursionError):
        raise BundleError(f"{folder / MANIFEST} is damaged: it does not parse as JSON") from None
    log_outcome(trust.apply_manifest(raw))
    return trust.verify_bundle(folder)


class ShippingLink:
    """Builder -> shipper for experiences, shipper -> receiver -> hot-swap for pushed bundles.

    Plain Python (no rclpy): the node hands it frames, events and feedback, and asks it for
    the two diagnostic statuses. Nothing here runs on the tick except O(1) appends.
    """

    def __init__(self, config: NodeConfig, policy: LoadedPolicy, frame_rate_hz: float,
                 verify_key, request_swap: Callable[[Path], object], logger, *,
                 holder: str = "") -> None:
        self.config = config
        self.log = logger
        self.failure = ""
        self._lock = threading.Lock()
        self._previous: dict = {}
        self._previous_builder: dict = {}
        self.rejected_unconfigured = 0
        self.last_outcome = ""
        self.last_reason = ""
        self.receiver: BundleReceiver | None = None
        if verify_key is not None:
            try:
                self.receiver = BundleReceiver(BundleReceiverConfig(
                    config.bundles_folder(), verify_key, current_version=policy.version,
                    current_sha256=policy.sha256, pin_version=config.pin_bundle_version),
                    on_install=request_swap,
                    check=functools.partial(load_policy, signals=tuple(config.signal_map),
                                            thresholds=config.thresholds, threads=1))
            except OSError as exc:
                raise ValueError(f"bundles_dir {str(config.bundles_folder())!r}: {exc}") from None
        self.builder = ExperienceBuilder(
            BuilderConfig(config.robot_id, 1.0 / frame_rate_hz, config.feedback_window_s,
                          config.ship_every_n_frames, config.episode_gap_s), self._sink)
        shipper_config = ShipperConfig(
            endpoint=config.consolidator_endpoint, robot_id=config.robot_id,
            spool_path=config.spool_file(), spool_max_bytes=config.spool_max_mb << 20,
            curve=config.curve, server_public_key=config.server_public_key or None,
            client_secret_file=config.client_secret_key or None, on_bundle_push=self._on_push,
            delta_batches=config.ship_delta_batches)
        self.curve = shipper_config.use_curve
        if self.curve:  # unreadable keys are a configuration error: refuse to start
            for key, loader in (("client_secret_key", load_curve_keypair),
                                ("server_public_key", load_curve_public)):
                try:
                    loader(getattr(config, key))
                except SecurityError as exc:
                    raise ValueError(f"{key}: {exc}") from None
        self.shipper: ExperienceShipper | None = None
        self._spool_lock = SpoolLock(config.spool_file(),
                                     f"{holder or 'a thinking node'}, robot_id {config.robot_id}")
        try:
            config.spool_file().parent.mkdir(parents=True, exist_ok=True)
            self._lock_spool()
            self.shipper = ExperienceShipper(shipper_config).start()
        except (TransportError, OSError) as exc:  # the robot keeps thinking without shipping
            self.failure = str(exc)
            logger.error(f"experience shipping disabled: {exc}")
        self._stop = threading.Event()
        self._period = min(0.1, max(0.01, config.feedback_window_s / 4.0))
        self._thread = threading.Thread(target=self._release_loop, name="thinkmem-experience",
                                        daemon=True)
        self._thread.start()

    def _lock_spool(self) -> None:
        """Hold the spool for this node's life, or refuse: it belongs to another node.

        Two nodes on one spool (two namespaces left at the default robot_id) would ship,
        acknowledge and shed each other's rows under one robot id; one line says who holds
        it and what to change.
        """
        try:
            self._spool_lock.acquire()
        except SpoolInUse as exc:
            raise ValueError(
                f"spool {str(self.config.spool_file())!r} is {exc}: two nodes cannot share "
                f"one spool (robot_id {self.config.robot_id!r}); give each robot its own "
                "robot_id (or its own spool_path)") from None

    # ---- inputs
    def on_frame(self, result: FrameResult) -> None:
        """Frame listener: hold the frame for feedback (O(1))."""
        self.builder.add_frame(result, now=time.monotonic())

    def on_event(self, name: str, stamp: float) -> None:
        """Events-topic message: episode history, or an episode boundary."""
        self.builder.add_event(name, stamp)

    def on_feedback(self, text: str) -> None:
        """Feedback-topic message: parse and attach; a bad one is counted and logged."""
        try:
            feedback = parse_feedback(text)
        except FeedbackError as exc:
            self.builder.feedback_invalid()
            self.log.warning(f"feedback refused: {exc}", throttle_duration_sec=5.0)
            return
        self.builder.add_feedback(feedback, now=time.monotonic())

    def on_swapped(self, policy: LoadedPolicy) -> None:
        """Keep the receiver's 'running' version >= what the node runs (no rollback)."""
        if self.receiver is not None and policy.version > self.receiver.version:
            self.receiver.set_running(policy.version, policy.sha256)

    # ---- shipper thread and release thread
    def _sink(self, experience) -> bool:
        return self.shipper is not None and self.shipper.ship(experience)

    def _release_loop(self) -> None:
        while not self._stop.wait(self._period):
            try:
                self.builder.release(time.monotonic())
            except Exception as exc:  # noqa: BLE001 - shipping must never stop the node
                self.log.error(f"experience release failed: {exc}", throttle_duration_sec=5.0)

    def _on_push(self, body: dict) -> None:
        """BUNDLE_PUSH on the shipper's thread: verify and install, or refuse with a reason."""
        if self.receiver is None:
            with self._lock:
                self.rejected_unconfigured += 1
                self.last_outcome = "rejected"
                self.last_reason = ("unconfigured: no bundle_signing_public_key is set, so no "
                                    "pushed bundle can be verified")
            self.log.warning(f"REFUSED a pushed bundle: {self.last_reason}")
            return
        replayed = self.receiver.stats()["replayed"]
        path = self.receiver.handle_push(body)  # on success calls request_swap(path)
        with self._lock:
            if path is not None:
                self.last_outcome, self.last_reason = "accepted", f"installed {path}"
            elif self.receiver.stats()["replayed"] > replayed:
                self.last_outcome, self.last_reason = "replayed", self.receiver.last_reason
            else:
                self.last_outcome, self.last_reason = "rejected", self.receiver.last_reason
        if path is not None:
            self.log.info(f"pushed bundle v{self.receiver.version} verified and installed at "
                          f"{path}; hot-swapping")
        elif self.last_outcome == "rejected":
            self.log.warning(f"REFUSED a pushed bundle ({self.last_reason}); keeping "
                             f"v{self.receiver.version}")

    # ---- diagnostics
    def statuses(self, running_version: int, swap_error: str) -> list[StatusReport]:
        """Build the "shipping" and "bundle push" reports for this diagnostics tick."""
        builder = self.builder.stats()
        if self.shipper is not None:
            stats = dict(self.shipper.stats())
            if not self.shipper.alive() \
                    and not self.failure:
                self.failure = "shipper thread stopped (see the log)"
        else:
            stats = {}
        stats["dropped"] = (int(stats.get("dropped_queue_full", 0)) + builder["sink_refused"]
                            + builder["dropped_pending"])
        shipping = shipping_status(ShippingSnapshot(
            self.config.consolidator_endpoint, self.curve, stats, self._previous, builder,
            self._previous_builder, self.failure))
        self._previous, self._previous_builder = stats, builder
        with self._lock:
            outcome, reason = self.last_outcome, self.last_reason
            counters: dict = {"rejected_unconfigured": self.rejected_unconfigured,
                              "pushes": self.rejected_unconfigured}
        installed = running_version
        if self.receiver is not None:
            counters.update(self.receiver.stats())
            counters["pushes"] += self.rejected_unconfigured
            installed = self.receiver.version
        push = push_status(PushSnapshot(self.receiver is not None, counters, outcome, reason,
                                        installed, running_version, swap_error))
        return [shipping, push]

    def close(self) -> None:
        """Hand every held frame to the shipper, which spools what it could not send."""
        self._stop.set()
        self._thread.join(timeout=2.0)
        self.builder.release(time.monotonic(), everything=True)
        if self.shipper is not None:
            self.shipper.close(timeout_s=5.0)
        self._spool_lock.release()
