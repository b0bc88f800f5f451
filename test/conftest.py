"""Shared fixtures: ROS traffic isolation per test module and throw-away bundle copies."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent


def domain_id_for(name: str) -> int:
    """A ROS_DOMAIN_ID in 1..200 that differs between modules and between concurrent runs."""
    return (os.getpid() * 7 + zlib.crc32(name.encode())) % 200 + 1


def pytest_configure(config):
    """Give the processes the tests start the Ctrl-C a terminal's user has.

    A suite started with SIGINT ignored (a background job of a non-interactive shell, as
    ``make test &`` is) passes that on to every process it starts, and the tests of
    Ctrl-C handling then send a SIGINT nobody receives: they failed that way, and only
    behind tests that happen to install a handler of their own.
    """
    del config
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="module")
def ros_env(request) -> dict[str, str]:
    """Put this module on its own DDS domain, localhost only; returns the env for children."""
    saved = {k: os.environ.get(k) for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE")}
    os.environ["ROS_DOMAIN_ID"] = str(domain_id_for(request.module.__name__))
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    yield dict(os.environ)
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def stop_ros(executor, spin_thread, nodes, context, timeout: float = 2.0) -> None:
    """Tear down in the only safe order: the spin thread must have returned before any node
    is destroyed, or a timer callback still in flight touches a destroyed handle."""
    executor.shutdown(timeout_sec=timeout)
    if spin_thread is not None:
        spin_thread.join(timeout=2 * timeout)
    for node in nodes:
        node.destroy_node()
    if context.ok():
        import rclpy
        rclpy.shutdown(context=context)


class SpinningPair:
    """Mixin of the node-test harnesses: the node under test and a helper node spun on one
    thread, a feeder thread (``self._feed`` until ``self.stop``), and the safe teardown."""

    def start_spinning(self) -> None:
        from rclpy.executors import SingleThreadedExecutor

        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.executor.add_node(self.helper)
        self.spin = threading.Thread(target=self.executor.spin, daemon=True)
        self.spin.start()
        self.stop = threading.Event()
        self.feeder = threading.Thread(target=self._feed, daemon=True)
        self.feeder.start()

    def close(self) -> None:
        if getattr(self, "closed", False):
            return
        self.closed = True
        self.stop.set()
        self.feeder.join(timeout=2.0)
        stop_ros(self.executor, self.spin, (self.node, self.helper), self.context)


@contextlib.contextmanager
def spinning_node(name: str, domain: str):
    """A plain rclpy node on ``domain`` (localhost only), spun on its own thread."""
    os.environ["ROS_DOMAIN_ID"] = domain
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    import rclpy
    from rclpy.executors import SingleThreadedExecutor

    context = rclpy.Context()
    rclpy.init(context=context)
    node = rclpy.create_node(name, context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    thread = threading.Thread(target=executor.spin, daemon=True)
    thread.start()
    try:
        yield node
    finally:
        stop_ros(executor, thread, (node,), context)


def tiny_window_bundle(folder: Path) -> Path:
    """Export an untrained-ish tiny window policy (needs torch): the fallback when no shipped
    bundle exists, and a window bundle whatever form the default has."""
    torch = pytest.importorskip("torch")
    from thinkmem_ros.core.data import SituationSet
    from thinkmem_ros.core.vocabulary import SIGNALS, THINKING
    from thinkmem_ros.policy.config import PolicyConfig
    from thinkmem_ros.policy.training.export import export_bundle
    from thinkmem_ros.policy.training.train import train_policy

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    n, k = 32, 8
    data = SituationSet(
        signals=rng.normal(size=(n, k, len(SIGNALS))).astype(np.float32),
        labels=(rng.random((n, len(THINKING))) < 0.3).astype(np.float32),
        events=rng.integers(0, 3, size=(n, 4)), event_vocabulary=("door_open", "alarm"))
    config = PolicyConfig(window=k, n_signals=len(SIGNALS), n_labels=len(THINKING),
                          d_model=16, n_layers=1, n_heads=2, d_ff=32, max_events=4,
                          n_event_vocab=2)
    trained = train_policy(data, config, seed=0, epochs=1, val_fraction=0.0, progress=False)
    export_bundle(trained, folder, model_version=1, frame_rate_hz=10.0)
    return folder


def _shipped_or_tiny(name: str, tmp_path_factory) -> Path:
    """models/<name> when it loads, else a tiny exported window bundle."""
    from thinkmem_ros.policy.bundle import BundleError, load_bundle

    shipped = REPO / "models" / name
    try:
        load_bundle(shipped)
        return shipped
    except BundleError:
        return tiny_window_bundle(tmp_path_factory.mktemp("bundles") / f"tiny_{name}")


@pytest.fixture(scope="session")
def source_bundle(tmp_path_factory) -> Path:
    """A valid bundle: the shipped models/default (a streaming policy) if present."""
    return _shipped_or_tiny("default", tmp_path_factory)


@pytest.fixture(scope="session")
def window_bundle(tmp_path_factory) -> Path:
    """A window-form (format 1) bundle: the shipped models/window if present.

    The default bundle is a streaming one; the window form must keep loading and running.
    """
    return _shipped_or_tiny("window", tmp_path_factory)


@pytest.fixture
def bundle_copy(source_bundle, tmp_path) -> Path:
    """A private copy of the bundle a test may tamper with."""
    return Path(shutil.copytree(source_bundle, tmp_path / "bundle"))


def copy_bundle(source: Path, dest: Path, *, model_version: int | None = None) -> Path:
    """Copy ``source`` to ``dest``, optionally re-versioned (same ONNX, new manifest)."""
    from thinkmem_ros.policy.bundle import load_bundle, write_bundle

    if model_version is None:
        return Path(shutil.copytree(source, dest))
    bundle = load_bundle(source)
    manifest = bundle.manifest
    manifest.model_version = model_version
    manifest.created_at = ""
    write_bundle(dest, bundle.onnx_path.read_bytes(), manifest)
    return dest


@pytest.fixture
def receiver(tmp_path):
    """A real ZeroMQ receiver on a free loopback port, storing into a fresh SQLite store."""
    from thinkmem_ros.consolidator.ingest import open_receiver
    from thinkmem_ros.link.receiver import ReceiverConfig

    cfg = ReceiverConfig(bind="tcp://127.0.0.1:*", db_path=tmp_path / "store.db",
                         max_frame_bytes=1 << 20, poll_s=0.02)
    with open_receiver(cfg) as rx:
        yield rx


def recorded_qos(depth: int):
    """(volatile, latched) rosbags QoS offers, as a recorder stores them in metadata.yaml."""
    from rosbags.interfaces import (
        Qos,
        QosDurability,
        QosHistory,
        QosLiveliness,
        QosReliability,
        QosTime,
    )

    zero = QosTime(0, 0)
    volatile = Qos(QosHistory.KEEP_LAST, depth, QosReliability.RELIABLE,
                   QosDurability.VOLATILE, zero, zero, QosLiveliness.AUTOMATIC, zero, False)
    return volatile, volatile._replace(durability=QosDurability.TRANSIENT_LOCAL)


def wait_for(predicate, timeout: float = 10.0, what: str = "the condition"):
    """Poll ``predicate`` until it returns something truthy and return that; fail the
    test naming ``what`` when ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


def run_bounded(fn, timeout: float = 10.0):
    """Run ``fn`` on a daemon thread: (finished, its result or exception). A read that
    blocks for ever (a FIFO) leaves the thread behind instead of the test."""
    box: list = []

    def target():
        try:
            box.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    return (not thread.is_alive()), (box[0] if box else None)

