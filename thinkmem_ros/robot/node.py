"""``thinking_node``: sensor topics -> situation window -> on-device thinking activation.

A thin rclpy shell around plain-Python parts (``situation``, ``node_config``,
``activation``, ``diagnostics``, ``hotswap``): it subscribes, stamps and hands samples to
the ``SituationBuffer``, assembles frames on a timer (``frame_trigger: timer``, the fixed
frame rate the policy was trained at) or as soon as every fresh signal has a new sample
(``frame_trigger: samples``, lowest latency), runs one inference per frame and publishes
the activation, the probabilities and 1 Hz diagnostics. With the timer, inference runs on
a dedicated thread so subscription callbacks stay responsive; with the sample trigger it
runs inline in the callback of the frame's last sample, because a hand-off to another
Python thread costs a GIL switch (up to milliseconds under load) on the latency path, and
the callbacks it delays wait at most one inference (about 1 ms). Nothing on the frame path
touches disk or network: bundle loading happens on the hot-swap thread, the stats file is
written at shutdown.

Experience shipping (on when ``consolidator_endpoint`` is set): every published frame goes
to the ``ExperienceBuilder`` through the ``frame_listeners`` hook (an O(1) append), waits
``feedback_window_s`` for ``/thinking/feedback`` (hindsight ``required`` labels, ``reward``),
and is then built into an ``Experience`` on a small release thread and handed to the
``ExperienceShipper``, whose own thread does the encoding, the SQLite spool and ZeroMQ.
Bundles the consolidator pushes over the same connection are verified by the
``BundleReceiver`` on the shipper's thread (signature with ``bundle_signing_public_key``,
sha256, a version above the running one) and installed under ``bundles_dir``; its
``on_install`` hands the folder to the hot-swap, which checks shapes/labels/format and
swaps between frames. With a signing key configured the hot-swap also verifies the
signature of the watched bundle and of any bundle under ``bundles_dir`` (files on disk
can change after a push) and keeps ``pin_bundle_version`` (``hotswap.SwapGuard``).
Without a signing key every push is refused and counted. At start,
a signed bundle installed under ``bundles_dir`` that is newer than ``bundle_path``'s is
used instead (a robot restarted after a push keeps the pushed model). Both paths report
in ``/diagnostics`` as their own statuses ("shipping", "bundle push").

Value-aware thinking and memory control (``thinking_gates``): when the running
bundle's folder carries ``values.npz`` the activation is reranked and low-value thinking
suppressed (``value_mode`` deploy, the default; learn = decayed epsilon-greedy; off); hazard
is never suppressed. When it carries ``memctl.npz`` each frame gets p_compress / p_recall
from the embedding; RECALL sends a non-blocking request to ``recall_endpoint`` and the
evidence that comes back (within ``recall_deadline_s``) is published on
``/thinking/evidence`` with the next activation. When it carries ``rules.json``, every
event also feeds the anticipation tracker and ``consider:C`` of each shipped A...B...C rule is
held from A...B until C or the rule's horizon (``policy/anticipation.py``). The artefacts
are loaded on the hot-swap thread with their bundle; a gate failure never stops
activations. Status "memory" in ``/diagnostics`` counts suppressions, recalls, evidence and
failures.

Latency, as reported: from the ``perf_counter`` reading taken on entry to the callback of
the newest sample used by a frame to the return of the activation ``publish()``, split into
``wait_us`` (that sample -> the frame assembled; with the timer trigger mostly the wait for
the next tick) and ``compute_us`` (frame assembled -> publish returned: hand-off, inference,
gates), in the stats file and /diagnostics; the activation's own fields stop just before
its ``publish()``.

Outside input cannot stop the node: every subscription callback is guarded and counts what
it could not handle (``input_errors``); feedback and events are size-bounded; header stamps
too far ahead of the node's clock are refused (``future_stamp_tolerance_s``); a backward
ROS-time jump (a looped bag, a restarted simulation) resets the window; with every signal
stale a frame claims no active thinking (``no_input``). Parameters are checked before rcl
reads them and a set of ``bundle_path`` that cannot work is refused with its reason.
"""

from __future__ import annotations

import difflib
import errno
import faulthandler
import functools
import json
import os
import stat
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import (
    FloatingPointRange,
    IntegerRange,
    ParameterDescriptor,
    SetParametersResult,
)
from rclpy.clock import Clock, ClockChange, ClockType, JumpThreshold, TimeJump
from rclpy.duration import Duration
from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.exceptions import InvalidHandle, NameValidationException, ParameterException
from rclpy.executors import ExternalShutdownException
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from rclpy.signals import SignalHandlerOptions
from rclpy.utilities import remove_ros_args
from std_msgs.msg import Float32MultiArray, MultiArrayDimension, MultiArrayLayout, String

from thinkmem_ros.core.paths import resolve_bundle_path
from thinkmem_ros.core.signal_adapters import SignalAdapter
from thinkmem_ros.link.security import (
    SecurityError,
    load_verify_key,
)
from thinkmem_ros.policy.bundle import ONNX_FILE, Bundle, BundleError, read_manifest
from thinkmem_ros.policy.situation import (
    JUMP_BACK_S,
    BufferConfig,
    Frame,
    SituationBuffer,
    Verdict,
)
from thinkmem_ros.policy.streaming_runtime import warm_up
from thinkmem_ros.robot.activation import (
    FrameResult,
    activation_json,
    active_labels,
    probabilities_layout,
)
from thinkmem_ros.robot.diagnostics import (
    STAMP_NOTE_S,
    ClockWatch,
    GateSnapshot,
    HealthSnapshot,
    RateMonitor,
    StatusReport,
    build_status,
    gate_status,
)
from thinkmem_ros.robot.hotswap import (
    HotSwapper,
    LoadedPolicy,
    PolicySlot,
    SwapGuard,
    load_policy,
)
from thinkmem_ros.robot.msg_fields import extract_stamp, message_class
from thinkmem_ros.robot.node_config import (
    ACTIVATION_TOPIC,
    DIAGNOSTICS_TOPIC,
    EVIDENCE_TOPIC,
    NODE_NAME,
    PARAMETERS,
    PROBABILITIES_TOPIC,
    NodeConfig,
    ParamsFileError,
    ParamSpec,
    args_outside_ros,
    check_parameter_names,
    signal_params,
    topic_key,
    validate_ros_args,
)
from thinkmem_ros.robot.recall import BackgroundRecall, RecallClient
from thinkmem_ros.robot.shipping_link import (
    ShippingLink,
    newer_installed_bundle,
    verified_like_a_push,
)
from thinkmem_ros.robot.spinning import StopSignals, make_executor, spin
from thinkmem_ros.robot.thinking_gates import (
    GateArtefacts,
    GateConfig,
    ThinkingGates,
    load_gate_artefacts,
)
from thinkmem_ros.robot.trust_store import TrustStore, TrustStoreConfig

FrameListener = Callable[[FrameResult], None]


class _Mailbox:
    """One-slot hand-off from the executor to the inference thread; newest frame wins."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._frame: Frame | None = None
        self.closed = False

    def put(self, frame: Frame) -> bool:
        """Store ``frame``; True when it replaced one the worker had not taken (a skip)."""
        with self._cond:
            skipped = self._frame is not None
            self._frame = frame
            self._cond.notify()
            return skipped

    def take(self, timeout: float) -> Frame | None:
        """Return the pending frame, waiting at most ``timeout`` seconds."""
        with self._cond:
            if self._frame is None and not self.closed:
                self._cond.wait(timeout)
            frame, self._frame = self._frame, None
            return frame

    def close(self) -> None:
        """Wake the worker so it can exit."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()


class _Stats:
    """Timing samples and counters shared by the worker and the diagnostics timer."""

    def __init__(self, keep_all: bool) -> None:
        self.lock = threading.Lock()
        self.inference_us: deque[float] = deque(maxlen=2000)
        self.latency_us: deque[float] = deque(maxlen=2000)
        self.wait_us: deque[float] = deque(maxlen=2000)  # newest sample -> frame assembled
        self.compute_us: deque[float] = deque(maxlen=2000)  # frame assembled -> published
        # per published frame, kept only for a stats file: (inputs_stamp, latency_us)
        self.all_latency_us: list[tuple] | None = [] if keep_all else None
        self.all_inference_us: list[float] | None = [] if keep_all else None
        self.published = 0
        self.frames_skipped = 0
        self.inference_errors = 0
        self.input_errors = 0  # input messages whose handling raised (counted, node goes on)
        self.invalid_events = 0  # events-topic messages refused (too long)
        self.no_input_frames = 0  # frames with every signal stale: nothing claimed active
        self.rate_mismatch_frames = 0  # frames while the window span was off the bundle's
        self.stamp_offset_samples = 0  # samples stamped far behind the node's clock
        self.stamp_offset_s = float("nan")  # the latest such offset

    def record(self, inference_us: float, latency_us: float | None,
               inputs_stamp: float | None, wait_us: float | None = None,
               compute_us: float | None = None) -> None:
        with self.lock:
            self.published += 1
            self.inference_us.append(inference_us)
            if latency_us is not None:
                self.latency_us.append(latency_us)
            if wait_us is not None:
                self.wait_us.append(wait_us)
            if compute_us is not None:
                self.compute_us.append(compute_us)
            if self.all_latency_us is not None and len(self.all_latency_us) < 2_000_000:
                self.all_inference_us.append(inference_us)
                self.all_latency_us.append((inputs_stamp, latency_us, wait_us, compute_us))


class NonFiniteOutput(ValueError):
    """The policy answered NaN or inf for a frame."""


def _finite(pred):
    """Return ``pred``, or raise NonFiniteOutput when its outputs are not all finite.

    NaN passes no threshold, so a model that answers NaN on real input would keep every
    label, hazard included, silently off while the activation JSON carried the
    non-standard token NaN. Such a frame is an inference error instead: counted, logged,
    reported in /diagnostics, and not published. One ``isfinite`` per output array: the
    normal path costs about a microsecond more.
    """
    if not (np.isfinite(pred.probabilities).all() and np.isfinite(pred.embedding).all()):
        raise NonFiniteOutput("the policy answered NaN/inf probabilities or embedding")
    return pred


def _verify_installed(bundles_dir: Path, key, folder: Path) -> Bundle:
    """Verify ``folder`` exactly as a push and a restart verify an installed bundle.

    The trust list is read afresh each time, not kept from the start: pushes may have
    rotated the signing key since.
    """
    return verified_like_a_push(TrustStore(TrustStoreConfig(bundles_dir, key)), folder)


MAX_EVENT_CHARS = 256
"""Longest events-topic message handled; event names are short words, and anything longer
is refused (counted as ``invalid_events``) before it is stripped, matched or shipped."""


def _input_callback(method: Callable) -> Callable:
    """Guard a subscription callback: nothing one message holds may stop the node.

    An exception escaping a callback ends ``executor.spin()`` and with it the node, so
    whatever a handler raises is counted (``input_errors`` in /diagnostics), logged at
    most every 5 s, and the next message is handled as usual.
    """
    @functools.wraps(method)
    def guarded(self, *args) -> None:
        try:
            method(self, *args)
        except Exception as exc:  # noqa: BLE001 - one message must never stop the node
            self._input_error(method.__name__, exc)
    return guarded


DRAIN_MAX = 64
"""Samples of one topic handled per executor wake-up at most, so a flooded topic cannot
hold back timers and the other topics for long."""


def _write_regular(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` as a regular file; OSError for anything else.

    ``~`` is expanded as the start-up check expands it (``~/s.json`` passed that check and
    was then written to ``./~/s.json``), and the open never blocks: a FIFO put in the
    file's place since the check would hold the node's shutdown until a reader came.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK, 0o666)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file")
        out.write(text)


Readers = tuple[tuple[int, SignalAdapter], ...]
"""(signal index in the bundle's order, its adapter) for every signal one topic carries."""


def _readers_by_topic(signal_map: dict, signals: tuple[str, ...]
                      ) -> list[tuple[tuple[str, ...], Readers]]:
    """One subscription's worth per topic: the signals it carries and their readers.

    Why one subscription per topic, not per signal: speed and yaw rate come from one
    Odometry, two numbers from one IMU; a robot's own topics had to be split by a
    republisher before. Signals absent by design are masked and never subscribed.
    """
    groups: dict[str, tuple[list[str], list]] = {}
    for index, name in enumerate(signals):
        src = signal_map[name]
        if src.absent:
            continue
        names, readers = groups.setdefault(topic_key(src.topic), ([], []))
        names.append(name)
        readers.append((index, src.reader()))
    return [(tuple(names), tuple(readers)) for names, readers in groups.values()]


def _due(timer) -> bool:
    """True when ``timer`` (the frame timer) should already have run."""
    try:
        left = timer.time_until_next_call()
    except (InvalidHandle, _rclpy.RCLError):
        return True
    return left is not None and left <= 0


def _take(subscription):
    """The next queued message of ``subscription``, or None (empty, or destroyed)."""
    try:
        with subscription.handle:
            taken = subscription.handle.take_message(subscription.msg_type, subscription.raw)
    except (InvalidHandle, _rclpy.RCLError):  # destroyed, or the context shut down
        return None
    return None if taken is None else taken[0]


def _descriptor(spec: ParamSpec) -> ParameterDescriptor:
    desc = ParameterDescriptor(description=spec.description, read_only=spec.read_only,
                               dynamic_typing=spec.dynamic)
    if spec.min is not None and isinstance(spec.default, float):
        desc.floating_point_range = [FloatingPointRange(
            from_value=float(spec.min), to_value=float(spec.max), step=0.0)]
    elif spec.min is not None and isinstance(spec.default, int):
        desc.integer_range = [IntegerRange(
            from_value=int(spec.min), to_value=int(spec.max), step=1)]
    return desc


def _qos(config: NodeConfig) -> QoSProfile:
    if config.qos == "sensor_data":
        profile = QoSProfile(depth=config.qos_depth)
        profile.reliability = qos_profile_sensor_data.reliability
        profile.durability = qos_profile_sensor_data.durability
        profile.history = HistoryPolicy.KEEP_LAST
        return profile
    reliability = (ReliabilityPolicy.RELIABLE if config.qos == "reliable"
                   else ReliabilityPolicy.BEST_EFFORT)
    return QoSProfile(depth=config.qos_depth, reliability=reliability)


class ThinkingNode(Node):
    """Subscribes to the signal map, publishes activations, probabilities and diagnostics."""

    def __init__(self, node_name: str = NODE_NAME, **kwargs) -> None:
        super().__init__(node_name, **kwargs)
        self._shipping: ShippingLink | None = None
        self.frame_listeners: list[FrameListener] = []
        """Called on the inference thread after each activation is published (experience
        shipping hooks in here); a listener must not block and must not raise."""
        self.config = self._read_config()
        self.config.check_stats_file()
        self.config.check_spool_path()
        self._verify_key = self._load_verify_key()
        self._artefacts: dict[tuple[str, str], GateArtefacts] = {}
        self._artefacts_lock = threading.Lock()
        self._policy = self._load_start_policy()
        policy = self._policy
        self.frame_rate_hz = self.config.effective_rate(policy.frame_rate_hz)
        self.buffer = SituationBuffer(BufferConfig(
            signals=policy.signals, window=policy.window,
            stale_after_s=self.config.stale_after_s, max_events=policy.max_events,
            event_vocabulary=policy.event_vocabulary,
            event_horizon_s=self.config.event_horizon_s,
            future_tolerance_s=self.config.future_stamp_tolerance_s))
        # A backward jump of ROS time (a looped bag with --clock, a restarted simulation)
        # resets the window before the next sample; the buffer also notices jumps itself.
        self._jump_handle = self.get_clock().create_jump_callback(
            JumpThreshold(min_forward=None, min_backward=Duration(
                nanoseconds=-int(JUMP_BACK_S * 1e9)), on_clock_change=True),
            post_callback=self._on_time_jump)
        self._stats = _Stats(keep_all=bool(self.config.stats_file))
        # Window span against the bundle's (frames or sensors at another rate), QoS
        # publishers that can never match, per signal: both reported in /diagnostics.
        self._rates = RateMonitor(policy.signals, policy.frame_rate_hz, policy.window)
        self._rate_frames_seen = 0
        self._rate_warned_at = -float("inf")
        self._qos_incompatible: dict[str, tuple[int, str]] = {}
        self._slot = PolicySlot(policy)
        self._layout = self._make_layout(policy)
        self._bundle_error = ""
        self._mismatch_logged: set[tuple[str, str]] = set()
        self._started = time.monotonic()
        self._last_diag = (self._started, self._totals())
        self._last_frame_at = -1.0

        # Deep enough that a subscriber scheduled late (loaded CPU) still gets every frame.
        self._act_pub = self.create_publisher(String, ACTIVATION_TOPIC, 100)
        self._prob_pub = self.create_publisher(Float32MultiArray, PROBABILITIES_TOPIC, 100)
        self._diag_pub = self.create_publisher(DiagnosticArray, DIAGNOSTICS_TOPIC, 10)
        self._evidence_pub = self.create_publisher(String, EVIDENCE_TOPIC, 50)
        self._start_gates(policy)
        self._subscribe(policy)

        self._mailbox = _Mailbox()
        self._worker = threading.Thread(target=self._work, name="thinkmem-infer", daemon=True)
        self._worker.start()
        loader = functools.partial(
            self._load_with_artefacts, signals=tuple(self.config.signal_map),
            thresholds=self.config.thresholds, threads=self.config.inference_threads)
        self._swapper = HotSwapper(self._slot, loader, watch=self.config.watch_bundle,
                                   period_s=self.config.watch_period_s,
                                   on_result=self._on_swap_result, guard=self._swap_guard())
        self._swapper.start()
        if self.config.shipping:
            self._start_shipping(policy)
        self.add_on_set_parameters_callback(self._check_parameters)
        self.add_post_set_parameters_callback(self._apply_parameters)
        self._frame_timer = self.create_timer(1.0 / self.frame_rate_hz, self._on_timer)
        self.drain_queued = True  # take a topic's queued samples per callback (see _on_samples)
        # On the steady clock: with use_sim_time and /clock paused or absent a ROS-clock
        # timer never fires, and a silent node cannot be told from a dead one.
        self._steady = Clock(clock_type=ClockType.STEADY_TIME)
        self._clock_watch = ClockWatch()
        self._time_still(time.monotonic())  # counted from the start: /clock may never come
        self._diag_timer = self.create_timer(self.config.diagnostics_period_s,
                                             self._publish_diagnostics, clock=self._steady)
        self.get_logger().info(
            f"ready: bundle v{policy.version} sha256 {policy.sha256[:12]} from {policy.path}; "
            f"K={policy.window} at {self.frame_rate_hz:g} Hz ({self.config.frame_trigger}); "
            f"signals {list(policy.signals)}")

    # -- configuration ----------------------------------------------------------------------
    def _read_config(self) -> NodeConfig:
        """Declare every parameter with its descriptor and copy the values once."""
        for spec in PARAMETERS:
            self.declare_parameter(spec.name, spec.default, _descriptor(spec))
        bundle_path = self.get_parameter("bundle_path").value
        manifest = read_manifest(resolve_bundle_path(bundle_path))
        signals = tuple(manifest.signals)
        specs = list(PARAMETERS)
        for name in signals:
            for spec in signal_params(name):
                self.declare_parameter(spec.name, spec.default, _descriptor(spec))
                specs.append(spec)
        # A typo (an unknown parameter, signal or signal-map key) must stop the node, not
        # be ignored: rcl hands over every override meant for this node, declared or not.
        check_parameter_names(getattr(self, "_parameter_overrides", {}), signals,
                              source="parameters")
        # A base-vocabulary signal this bundle does not use (config/thinkmem.yaml lists all
        # of them) is not an error, but it is not read either: say so once.
        unused = sorted({name.split(".")[1] for name in getattr(self, "_parameter_overrides", {})
                         if name.startswith("signals.") and name.count(".") == 2}
                        - set(signals))
        if unused:
            self.get_logger().info(f"signals {unused} are configured but not used by this "
                                   f"bundle (it reads {list(signals)})")
        values = {spec.name: self.get_parameter(spec.name).value for spec in specs}
        config = NodeConfig.from_parameters(values, signals)
        config.check_units(getattr(manifest, "signal_units", None) or {})
        return config

    def _load_verify_key(self):
        key = self.config.bundle_signing_public_key
        if not key:
            return None
        try:
            return load_verify_key(key)
        except SecurityError as exc:
            raise ValueError(f"bundle_signing_public_key: {exc}") from None

    def _swap_guard(self) -> SwapGuard:
        """Hot-swaps checked as pushes are: signed (with a key configured) and pinned."""
        verify = None
        if self._verify_key is not None:
            verify = functools.partial(_verify_installed, self.config.bundles_folder(),
                                       self._verify_key)
        return SwapGuard(verify, self.config.bundles_folder(), self.config.pin_bundle_version)

    def _load_with_artefacts(self, path, **kwargs) -> LoadedPolicy:
        """Load a bundle (hot-swap thread) and the value/memctl artefacts beside it."""
        policy = load_policy(path, **kwargs)
        extras = getattr(policy.runtime.manifest, "extras", None)
        artefacts = load_gate_artefacts(policy.path, extras,
                                        getattr(policy.runtime, "embedding_dim", None))
        for err in artefacts.errors:
            self.get_logger().error(f"bundle {policy.path}: {err}; running without it")
        with self._artefacts_lock:
            self._artefacts[(str(policy.path), policy.sha256)] = artefacts
        return policy

    def _artefacts_for(self, policy: LoadedPolicy) -> GateArtefacts:
        with self._artefacts_lock:
            return self._artefacts.get((str(policy.path), policy.sha256), GateArtefacts())

    def _start_gates(self, policy: LoadedPolicy) -> None:
        cfg = self.config
        self._recall: BackgroundRecall | None = None
        if cfg.recall_endpoint:
            self._recall = BackgroundRecall(functools.partial(
                RecallClient, cfg.recall_endpoint, cfg.robot_id, cfg.recall_deadline_s,
                cfg.recall_k, **cfg.recall_keys()))
        session = f"{cfg.robot_id}-{time.time_ns()}"
        self._gates = ThinkingGates(GateConfig(cfg.value_mode, cfg.value_horizon),
                                    cfg.robot_id, session,
                                    recall=None if self._recall is None else self._recall.submit)
        self._gates.use(self._artefacts_for(policy))
        self._gate_previous: dict = {}
        arts = self._gates.artefacts
        self.get_logger().info(
            f"values: {cfg.value_mode if arts.table is not None else 'absent'}; memctl: "
            f"{'on' if arts.heads is not None else 'absent'}; recall: "
            f"{cfg.recall_endpoint or 'off'}")

    def _load_start_policy(self) -> LoadedPolicy:
        """Load ``bundle_path``, or a newer signed bundle a push installed under bundles_dir.

        An installed bundle that cannot run for any reason falls back to ``bundle_path``
        with one logged line: a push must never turn into a crash on every restart.
        """
        load = functools.partial(self._load_with_artefacts,
                                 signals=tuple(self.config.signal_map),
                                 thresholds=self.config.thresholds,
                                 threads=self.config.inference_threads)
        installed = newer_installed_bundle(self.config, self._verify_key, self.get_logger())
        if installed is not None:
            try:
                return load(installed)
            except Exception as exc:  # noqa: BLE001 - BundleError, or a runtime/artefact bug
                self.get_logger().error(f"installed bundle {installed} cannot run here, "
                                        f"using bundle_path: {type(exc).__name__}: {exc}")
        return load(self.config.bundle_path)

    def _start_shipping(self, policy: LoadedPolicy) -> None:
        link = ShippingLink(self.config, policy, self.frame_rate_hz, self._verify_key,
                             self._swapper.request, self.get_logger(),
                             holder=f"node {self.get_fully_qualified_name()}")
        self._shipping = link
        self.frame_listeners.append(link.on_frame)
        if self.config.feedback_topic:
            self._subs.append(self.create_subscription(
                String, self.config.feedback_topic, self._on_feedback,
                QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)))
        if link.shipper is None:  # the spool could not open; ShippingLink logged why
            self.get_logger().info(
                f"experience shipping to {self.config.consolidator_endpoint} is disabled; "
                "no pushed bundles either (they arrive over the same connection)")
            return
        self.get_logger().info(
            f"shipping experiences to {self.config.consolidator_endpoint} (CURVE "
            f"{'on' if link.curve else 'off'}, spool {self.config.spool_file()}); feedback "
            f"on {self.config.feedback_topic or '(none)'}; pushed bundles "
            + (f"verified into {self.config.bundles_folder()}" if link.receiver is not None
               else "refused (no bundle_signing_public_key)"))

    @_input_callback
    def _on_feedback(self, msg: String) -> None:
        if self._shipping is not None:
            self._shipping.on_feedback(msg.data)  # bounded, parsed, invalid ones counted

    def _check_parameters(self, params: list[Parameter]) -> SetParametersResult:
        """Refuse a set that cannot work, with the reason, before the parameter changes.

        Only cheap checks run here (the executor waits for them): the folder, its manifest
        and that it fits the running window. Hashing and loading the graph stay on the
        hot-swap thread, whose refusals show in /diagnostics as ``bundle_error``.
        """
        for param in params:
            if param.name != "bundle_path":
                continue
            if param.type_ != Parameter.Type.STRING:
                return SetParametersResult(successful=False,
                                           reason="bundle_path must be a string")
            problem = self._bundle_path_problem(param.value)
            if problem:
                self.get_logger().warning(f"bundle_path {param.value!r} refused: {problem}")
                return SetParametersResult(successful=False, reason=problem)
        return SetParametersResult(successful=True)

    def _bundle_path_problem(self, value: str) -> str:
        """Why ``value`` cannot become the running bundle ('' when the cheap checks pass)."""
        try:
            folder = resolve_bundle_path(value)
        except FileNotFoundError as exc:  # '' and no shipped default installed
            return str(exc)
        try:
            if not folder.is_dir():
                return f"bundle folder not found: {folder}"
        except OSError as exc:  # a name past the file system's limit (ENAMETOOLONG)
            return f"bundle folder unusable: {folder}: {exc.strerror or exc}"
        try:
            manifest = read_manifest(folder)
        except BundleError as exc:
            return str(exc)
        if not (folder / ONNX_FILE).is_file():
            return f"bundle model not found: {folder / ONNX_FILE}"
        running = self._slot.peek()
        if tuple(manifest.signals) != running.signals:
            return (f"{folder}: signals {manifest.signals} differ from the running "
                    f"{list(running.signals)}; restart the node to change them")
        if (manifest.window, manifest.max_events) != (running.window, running.max_events):
            return (f"{folder}: window K={manifest.window}, M={manifest.max_events} differ "
                    f"from the running K={running.window}, M={running.max_events}; restart "
                    "the node to change them")
        return ""

    def _apply_parameters(self, params: list[Parameter]) -> None:
        for param in params:
            if param.name == "bundle_path":
                self.get_logger().info(f"bundle_path set to {param.value!r}: verifying")
                self._swapper.request(param.value)

    def _subscribe(self, policy: LoadedPolicy) -> None:
        qos = _qos(self.config)
        self._subs = []
        for names, readers in _readers_by_topic(self.config.signal_map, policy.signals):
            src = self.config.signal_map[names[0]]
            events = SubscriptionEventCallbacks(
                incompatible_qos=functools.partial(self._on_incompatible_qos, names))
            holder: list = []  # the subscription, for the callback to drain its queue
            holder.append(self.create_subscription(
                message_class(src.msg_type), src.topic,
                functools.partial(self._on_samples, readers, holder), qos,
                event_callbacks=events))
            self._subs.append(holder[0])
        if self.config.events_topic:
            self._subs.append(self.create_subscription(
                String, self.config.events_topic, self._on_event, qos))

    # -- input path -------------------------------------------------------------------------
    def _now(self) -> float:
        # Clock.now() without the rclpy Time object it builds: this runs once per sample.
        clock = self.get_clock()
        with clock.handle:
            return clock.handle.get_now().nanoseconds * 1e-9

    def _input_error(self, handler: str, exc: BaseException) -> None:
        with self._stats.lock:
            self._stats.input_errors += 1
        self.get_logger().error(f"{handler}: message dropped: {type(exc).__name__}: "
                                f"{str(exc)[:200]}", throttle_duration_sec=5.0)

    def callback_failed(self, exc: BaseException) -> None:
        """Count a callback that raised outside the node's handlers; the node goes on.

        rclpy's own sim-time clock callback raises on a /clock message with negative
        seconds; it is counted as an input error like a bad sensor message.
        """
        self._input_error("callback", exc)

    def _on_time_jump(self, jump: TimeJump) -> None:
        """ROS time jumped back (or switched source): start the window afresh."""
        try:
            if jump.clock_change not in (ClockChange.ROS_TIME_ACTIVATED,
                                         ClockChange.ROS_TIME_DEACTIVATED) \
                    and jump.delta.nanoseconds >= 0:
                return
            now = self._now()
            self.buffer.reset_time(now)
            self._rates.reset()
            self._last_frame_at = -float("inf")  # the 'samples' watchdog restarts too
            self._slot.peek().runtime.reset("backward")  # streaming state: start afresh
            self.get_logger().info(f"clock jumped by {jump.delta.nanoseconds * 1e-9:+.3f} s "
                                   f"to {now:.3f}: situation window reset",
                                   throttle_duration_sec=1.0)
        except Exception as exc:  # noqa: BLE001 - rcl calls this; it must not raise
            self.get_logger().error(f"time jump handling failed: {exc}")

    def _on_incompatible_qos(self, signals: tuple[str, ...], info) -> None:
        """A publisher on the ``signals``' topic whose QoS can never match ours (rclpy event)."""
        try:
            policy = getattr(info.last_policy_kind, "name", str(info.last_policy_kind))
            policy = policy.removeprefix("RMW_QOS_POLICY_")  # 'RELIABILITY', as users say it
            for signal in signals:
                self._qos_incompatible[signal] = (int(info.total_count), policy)
            self.get_logger().warning(
                f"{', '.join(signals)}: {info.total_count} publisher(s) with incompatible QoS "
                f"({policy}); set qos to match them", throttle_duration_sec=10.0)
        except Exception as exc:  # noqa: BLE001 - rcl calls this; it must not raise
            self._input_error("incompatible_qos", exc)

    def _on_samples(self, readers: Readers, holder: list, msg) -> None:
        """Handle ``msg``, then whatever else this topic has queued (up to ``DRAIN_MAX``).

        Every signal read from this topic (``readers``) takes its number from each message.

        The SingleThreadedExecutor (``executor: single``) hands over one message per
        wake-up and rebuilds its wait set (every subscription, timer, service and event
        handler, in Python) before the next: at 1 kHz sensors that bookkeeping, not the
        samples, used most of the core and the reader queues overflowed. Taking the queued
        messages here costs one take each. Under the events executor the queue is mostly
        empty by then, so ``main`` turns the drain off there (``drain_queued``): it would
        cost a timer query and an empty take per sample.
        Draining stops as soon as the frame timer is due, so frames keep their rate.
        """
        for index, adapter in readers:
            self._on_sample(index, adapter, msg)
        if not self.drain_queued:
            return
        for _ in range(DRAIN_MAX - 1):
            if _due(self._frame_timer):
                return  # the frame comes first: the executor runs the timer next
            queued = _take(holder[0])
            if queued is None:
                return
            for index, adapter in readers:
                self._on_sample(index, adapter, queued)

    @_input_callback
    def _on_sample(self, index: int, adapter: SignalAdapter, msg) -> None:
        arrival = time.perf_counter()
        now = self._now()
        value = adapter.read(msg)  # NaN when the message holds no number there (invalid)
        stamp = extract_stamp(msg)
        verdict = self.buffer.offer(index, value, now=now, stamp=stamp, arrival=arrival)
        if verdict is Verdict.ACCEPTED:
            self._rates.sample(index, now)
        if stamp is not None and now - stamp > STAMP_NOTE_S:
            with self._stats.lock:
                self._stats.stamp_offset_samples += 1
                self._stats.stamp_offset_s = now - stamp
        if (verdict is Verdict.ACCEPTED and self.config.frame_trigger == "samples"
                and self.buffer.complete(now)):
            self._emit(now)

    @_input_callback
    def _on_event(self, msg: String) -> None:
        if len(msg.data) > MAX_EVENT_CHARS:
            with self._stats.lock:
                self._stats.invalid_events += 1
            self.get_logger().warning(f"event of {len(msg.data)} characters dropped (more "
                                      f"than {MAX_EVENT_CHARS})", throttle_duration_sec=5.0)
            return
        now = self._now()
        name = msg.data.strip()
        self.buffer.offer_event(name, now=now, stamp=None)
        self._gates.on_event(name, now)  # A...B progress of the bundle's rules (event times)
        if self._shipping is not None:
            self._shipping.on_event(name, now)

    def _on_timer(self) -> None:
        now = self._now()
        if self.config.frame_trigger == "timer" or (
                now - self._last_frame_at >= 2.0 / self.frame_rate_hz):
            self._emit(now)  # in 'samples' mode: a watchdog frame when inputs stall

    def _emit(self, now: float) -> None:
        self._last_frame_at = now
        self._rates.frame(now)
        if self.config.frame_trigger == "samples":
            # Lowest latency: no thread hand-off; callbacks wait at most one inference.
            self._infer(self.buffer.assemble(now))
        elif self._mailbox.put(self.buffer.assemble(now)):
            with self._stats.lock:
                self._stats.frames_skipped += 1

    # -- inference thread -------------------------------------------------------------------
    def _work(self) -> None:
        while not self._mailbox.closed:
            frame = self._mailbox.take(timeout=0.2)
            if frame is None:
                continue
            try:
                self._infer(frame)
            except Exception as exc:  # noqa: BLE001 - the worker must outlive one bad frame
                if not self.context.ok():
                    return  # SIGINT/SIGTERM shut the context down under us: a clean exit
                self.get_logger().error(f"frame {frame.seq} not published: {exc}",
                                        throttle_duration_sec=5.0)

    def _infer(self, frame: Frame) -> None:
        policy, swapped = self._slot.current()
        events = frame.events
        if swapped:
            self._on_swapped(policy)
            if policy.event_vocabulary != self._policy.event_vocabulary:
                events = np.zeros_like(events)  # ids of the old vocabulary mean nothing now
            self._policy = policy
        start = time.perf_counter()
        try:
            # a streaming bundle steps the newest row; its state restarts (from this
            # window) on a swap, a backward stamp or a gap; a window bundle runs the window
            pred = _finite(policy.runtime.predict_frame(frame.signals, frame.mask, events,
                                                        t=frame.stamp, seq=frame.seq))
        except Exception as exc:  # noqa: BLE001 - a bad frame must not stop the node
            if isinstance(exc, NonFiniteOutput):
                # a streaming state gone NaN stays NaN: the next frame replays its window
                policy.runtime.reset("requested")
            with self._stats.lock:
                self._stats.inference_errors += 1
            self.get_logger().error(f"inference failed on frame {frame.seq}: {exc}",
                                    throttle_duration_sec=5.0)
            return
        inference_us = (time.perf_counter() - start) * 1e6
        probs = np.asarray(pred.probabilities[0], dtype=np.float32)
        # Every signal stale: the policy still answers (an empty window looks like
        # something to it), but no input supports any thinking, so none is claimed active.
        no_input = len(frame.stale) == frame.signals.shape[1]
        result = FrameResult(
            seq=frame.seq, stamp=frame.stamp, signals=frame.signals, mask=frame.mask,
            events=events, labels=policy.labels, probabilities=probs,
            active=() if no_input else active_labels(policy.labels, probs, policy.thresholds),
            embedding=np.asarray(pred.embedding[0]), inference_us=inference_us,
            latency_us=None, bundle_version=policy.version, bundle_sha256=policy.sha256,
            stale=frame.stale, inputs_stamp=frame.inputs_stamp, no_input=no_input,
            signal_set=policy.signal_set)
        if no_input:
            with self._stats.lock:
                self._stats.no_input_frames += 1
        else:
            result.gate = self._apply_gates(result)
        built = time.perf_counter()
        if frame.last_arrival is not None:
            result.latency_us = (built - frame.last_arrival) * 1e6
        if frame.assembled_at is not None:  # latency = wait (sample -> frame) + compute
            result.compute_us = (built - frame.assembled_at) * 1e6
            if frame.last_arrival is not None:
                result.wait_us = (frame.assembled_at - frame.last_arrival) * 1e6
        self._act_pub.publish(String(data=activation_json(result, self.config.robot_id)))
        published = time.perf_counter()
        latency = None if frame.last_arrival is None else (published - frame.last_arrival) * 1e6
        compute = None if frame.assembled_at is None else (published - frame.assembled_at) * 1e6
        if self._prob_pub.get_subscription_count():  # nobody listening: skip the conversion
            self._prob_pub.publish(Float32MultiArray(layout=self._layout, data=probs.tolist()))
        self._publish_evidence(result)
        self._stats.record(inference_us, latency, frame.inputs_stamp, result.wait_us, compute)
        for listener in list(self.frame_listeners):
            try:
                listener(result)
            except Exception as exc:  # noqa: BLE001 - a listener must not stop inference
                self.get_logger().error(f"frame listener failed: {exc}",
                                        throttle_duration_sec=5.0)

    def _apply_gates(self, result: FrameResult) -> dict | None:
        """Anticipation, value rerank, memory control for one frame; None when none applies."""
        arts = self._gates.artefacts
        if arts.table is None and arts.heads is None and arts.rules is None:
            return None
        try:
            outcome = self._gates.apply(result.seq, result.active, result.embedding,
                                        dict(zip(result.labels, result.probabilities.tolist(),
                                                 strict=True)), now=result.stamp)
            return outcome.record()
        except Exception as exc:  # noqa: BLE001 - a gate failure must not stop activations
            self.get_logger().error(f"value/memory gates failed on frame {result.seq}: {exc}",
                                    throttle_duration_sec=5.0)
            return None

    def _publish_evidence(self, result: FrameResult) -> None:
        """Publish recall results that finished since the previous frame (never blocks)."""
        if self._recall is None:
            return
        for tag, evidence, error in self._recall.take():
            self._gates.record_recall(evidence, error)
            if evidence is None:
                self.get_logger().warning(f"recall for frame {tag} failed: {error}",
                                          throttle_duration_sec=5.0)
                continue
            self._evidence_pub.publish(String(data=json.dumps({
                "schema": 1, "robot_id": self.config.robot_id, "seq": tag,
                "published_with_seq": result.seq, "stamp": result.stamp,
                "bundle_version": result.bundle_version, "items": evidence},
                separators=(",", ":"))))

    @staticmethod
    def _make_layout(policy: LoadedPolicy) -> MultiArrayLayout:
        return MultiArrayLayout(dim=[MultiArrayDimension(label=label, size=size, stride=stride)
                                     for label, size, stride in probabilities_layout(
                                         policy.labels)], data_offset=0)

    def _on_swapped(self, policy: LoadedPolicy) -> None:
        self._layout = self._make_layout(policy)
        self._rates.bundle_rate_hz = float(policy.frame_rate_hz)
        self._gates.use(self._artefacts_for(policy))
        self.buffer.set_event_vocabulary(policy.event_vocabulary)
        self.get_logger().info(f"swapped to bundle v{policy.version} sha256 "
                               f"{policy.sha256[:12]} from {policy.path}")

    def _on_swap_result(self, policy: LoadedPolicy | None, error: str) -> None:
        self._bundle_error = error
        if policy is not None and self._shipping is not None:
            self._shipping.on_swapped(policy)
        if error:
            self.get_logger().error(f"bundle refused, keeping version "
                                    f"{self._slot.peek().version}: {error}")

    # -- diagnostics ------------------------------------------------------------------------
    def _totals(self) -> dict[str, int]:
        counters = self.buffer.snapshot()
        stats = self._stats
        with stats.lock:
            skipped, errors = stats.frames_skipped, stats.inference_errors
            input_errors, invalid_events = stats.input_errors, stats.invalid_events
            no_input = stats.no_input_frames
            extra = {"rate_mismatch_frames": stats.rate_mismatch_frames,
                     "stamp_offset_samples": stats.stamp_offset_samples,
                     "qos_incompatible": sum(n for n, _ in self._qos_incompatible.values())}
        absent = set(self.config.absent_signals)
        return extra | {"frames": stats.published, "invalid": sum(counters.invalid.values()),
                "duplicate": sum(counters.duplicate.values()),
                "out_of_order": sum(counters.out_of_order.values()),
                "unknown_events": counters.unknown_events, "frames_skipped": skipped,
                "inference_errors": errors, "stale_frames": sum(
                    n for name, n in counters.stale_frames.items() if name not in absent),
                "samples": sum(counters.accepted.values()),
                "future": sum(counters.future.values()), "time_jumps": counters.time_jumps,
                "stamp_restarts": sum(counters.stamp_restarts.values()),
                "invalid_events": invalid_events, "input_errors": input_errors,
                "no_input_frames": no_input}

    def type_mismatches(self) -> dict[str, list[str]]:
        """Topics of the signal map that also carry publishers of another message type."""
        out: dict[str, list[str]] = {}
        expected = {self.resolve_topic_name(self.config.signal_map[s].topic):
                    self.config.signal_map[s].msg_type for s in self.buffer.signals
                    if not self.config.signal_map[s].absent}
        if self.config.events_topic:
            expected[self.resolve_topic_name(self.config.events_topic)] = "std_msgs/msg/String"
        for topic, msg_type in expected.items():
            foreign = sorted({info.topic_type for info in self.get_publishers_info_by_topic(topic)
                              if info.topic_type != msg_type})
            if foreign:
                out[topic] = foreign
                for other in foreign:
                    if (topic, other) not in self._mismatch_logged:
                        self._mismatch_logged.add((topic, other))
                        self.get_logger().warning(
                            f"{topic} has a publisher of {other}, expected {msg_type}; "
                            "its messages cannot reach this node")
        return out

    def _check_rates(self):
        """Judge the window span; count the frames since the last check when it is off."""
        check = self._rates.check(self.config.frame_trigger == "samples")
        with self._stats.lock:
            published = self._stats.published
            if check.mismatch:
                self._stats.rate_mismatch_frames += published - self._rate_frames_seen
            self._rate_frames_seen = published
        if check.mismatch and time.monotonic() - self._rate_warned_at > 60.0:
            self._rate_warned_at = time.monotonic()
            self.get_logger().warning(f"{check.reason()}: the policy sees another time "
                                      "scale than it was trained on; set frame_rate_hz / "
                                      "frame_trigger or train a bundle for this rate")
        return check

    def health(self) -> HealthSnapshot:
        """Snapshot for ``build_status``; advances the 'since previous report' baseline."""
        rate_check = self._check_rates()
        now = time.monotonic()
        totals = self._totals()
        last_at, previous = self._last_diag
        self._last_diag = (now, totals)
        with self._stats.lock:
            inference = np.array(self._stats.inference_us)
            latency = np.array(self._stats.latency_us)
            wait, compute = np.array(self._stats.wait_us), np.array(self._stats.compute_us)
        fresh = self.buffer.fresh(self._now())
        policy = self._slot.peek()
        return HealthSnapshot(
            robot_id=self.config.robot_id, expected_rate_hz=self.frame_rate_hz,
            elapsed_s=now - last_at, uptime_s=now - self._started, totals=totals,
            previous=previous, inference_us=inference, latency_us=latency,
            wait_us=wait, compute_us=compute,
            signals=self.buffer.signals,
            stale=tuple(s for s, ok in zip(self.buffer.signals, fresh, strict=True)
                        if not ok),
            type_mismatch=self.type_mismatches(), bundle_version=policy.version,
            bundle_sha256=policy.sha256, bundle_path=str(policy.path),
            bundle_error=self._bundle_error, bundle_swaps=self._slot.swaps,
            absent=tuple(s for s in self.buffer.signals if s in self.config.absent_signals),
            rate=rate_check, qos_incompatible=dict(self._qos_incompatible),
            stamp_offset_s=self._stats.stamp_offset_s, ros_time_still_s=self._time_still(now))

    def _time_still(self, steady_now: float) -> float:
        """Seconds sim time has stood still (0.0 when the node runs on the system clock)."""
        if not self.get_clock().ros_time_is_active:
            return 0.0
        return self._clock_watch.still_for(self._now(), steady_now)

    def _publish_diagnostics(self) -> None:
        period = self.config.diagnostics_period_s
        report = build_status(self.health(), warmup_s=2.0 * period + self.config.stale_after_s,
                              clock_still_warn_s=max(2.0, 2.0 * period))
        msg = DiagnosticArray()
        msg.header.stamp = self.get_clock().now().to_msg()
        reports = [(f"thinkmem: {self.get_name()}", report)]
        if self._shipping is not None:
            shipping, push = self._shipping.statuses(self._slot.peek().version,
                                                     self._bundle_error)
            reports += [(f"thinkmem: {self.get_name()}: shipping", shipping),
                        (f"thinkmem: {self.get_name()}: bundle push", push)]
        reports.append((f"thinkmem: {self.get_name()}: memory", self._gate_report()))
        msg.status = [DiagnosticStatus(
            level=bytes([rep.level]), name=name, message=rep.message,
            hardware_id=self.config.robot_id,
            values=[KeyValue(key=k, value=v) for k, v in rep.values]) for name, rep in reports]
        self._diag_pub.publish(msg)

    def _gate_report(self) -> StatusReport:
        arts = self._gates.artefacts
        counters = self._gates.stats()
        report = gate_status(GateSnapshot(
            arts.table is not None, arts.heads is not None, self.config.value_mode,
            self.config.recall_endpoint, counters, self._gate_previous, list(arts.errors)))
        self._gate_previous = counters
        return report

    # -- shutdown ---------------------------------------------------------------------------
    def write_stats(self, path: str | Path) -> None:
        """Latency/inference samples and counters as JSON (called at shutdown, off the tick)."""
        with self._stats.lock:
            # per frame: [inputs_stamp, latency_us, wait_us, compute_us] (publish returned)
            data = {"frames": [list(row) for row in self._stats.all_latency_us or []],
                    "inference_us": list(self._stats.all_inference_us or []),
                    "published": self._stats.published}
        data["totals"] = self._totals()
        data["frame_rate_hz"] = self.frame_rate_hz
        data["frame_trigger"] = self.config.frame_trigger
        _write_regular(Path(path).expanduser(), json.dumps(data))

    def destroy_node(self) -> None:
        """Stop the worker and the hot-swap thread (bounded waits), then write stats.

        Also called by rclpy's context clean-up on a node whose ``__init__`` was cut short
        (Ctrl-C while it was still loading): whatever was not built yet is skipped, so the
        interrupt ends the process quietly instead of in a second traceback.
        """
        parts = vars(self)
        if parts.get("_mailbox") is not None:
            self._mailbox.close()
        if parts.get("_worker") is not None:
            self._worker.join(timeout=2.0)
        if parts.get("_shipping") is not None:
            self._shipping.close()  # held frames go to the spool, nothing is lost
        if parts.get("_swapper") is not None:
            self._swapper.stop(timeout=2.0)
        if parts.get("_recall") is not None:
            self._recall.close(timeout_s=2.0)
        if "_stats" in parts and self.config.stats_file:
            try:
                self.write_stats(self.config.stats_file)
            except OSError as exc:
                self.get_logger().error(f"cannot write stats to {self.config.stats_file}: {exc}")
        super().destroy_node()


USAGE = f"""\
usage: {NODE_NAME} [--ros-args -p name:=value | --params-file FILE ...]

The thinkmem robot node: reads the sensor topics, runs the thinking policy of a model
bundle on them and publishes thinking/activation, thinking/probabilities and /diagnostics.

Every parameter, with its default, description and range, is in config/thinkmem.yaml
(installed as share/thinkmem_ros/config/thinkmem.yaml) and in the README ("ROS interface
of thinking_node"). An invalid parameter or params file stops the node at start (exit 2).

options:
  -h, --help  show this help and exit
"""


def _refuse(reason: object) -> int:
    """One line on stderr naming what is wrong; exit status 2."""
    text = " ".join(str(reason).split())
    text = text.split(", at /")[0]  # rcl appends C source locations; they name nothing useful
    print(f"{NODE_NAME}: refusing to start: {text}", file=sys.stderr, flush=True)
    return 2


def _refuse_ros_args(exc: Exception) -> int:
    """Refuse ROS arguments rcl cannot parse; an unknown flag is named as such."""
    if isinstance(exc, _rclpy.UnknownROSArgsError):  # a typo'd --params-file
        return _refuse(f"unknown ROS arguments {exc} (see ros2 run --help; the params file "
                       f"option is --params-file)")
    return _refuse(exc)


def _usage_error(arg: str) -> int:
    """One line on stderr naming an argument the node does not take; exit status 2.

    Why: the node takes no arguments of its own, and one rcl leaves to the program was
    silently ignored: ``--help`` started the node, and ``--ros-arg -p robot_id:=r1`` ran
    it as robot "robot".
    """
    hint = "ROS arguments go after --ros-args"
    if difflib.get_close_matches(arg, ["--ros-args"], n=1, cutoff=0.75):
        hint = "did you mean --ros-args? ROS arguments go after it"
    print(f"{NODE_NAME}: error: unknown argument {arg!r} ({hint}; see {NODE_NAME} --help)",
          file=sys.stderr, flush=True)
    return 2


def _first_stray(args: list[str]) -> str | None:
    """The first of ``args`` that is no deprecated ``from:=to`` remap, or None.

    rcl still applies such a remap outside ``--ros-args`` (warning that it is deprecated),
    so it is left to rcl's own split in ``_command_line``.
    """
    return next((arg for arg in args if ":=" not in arg), None)


def _command_line(argv: list[str]) -> int | None:
    """The exit status of a command line that must not start the node; None to start it.

    ``--help`` is answered, and a stray argument named, before any params file is read
    (rcl's split reads them all). Then the params files are checked (``validate_ros_args``)
    before rcl reads them, and rclpy's own split (``remove_ros_args``) has the last word
    on what is left to the program, as ``ros2 run`` and ``ros2 launch`` arguments go.
    """
    outside = args_outside_ros(argv)[1:]
    if "-h" in outside or "--help" in outside:
        print(USAGE, end="", flush=True)
        return 0
    stray = _first_stray(outside)
    if stray is None:
        try:
            validate_ros_args(argv)
            stray = next(iter(remove_ros_args(argv)[1:]), None)
        except ParamsFileError as exc:
            return _refuse(exc)
        except (_rclpy.UnknownROSArgsError, _rclpy.RCLError) as exc:
            return _refuse_ros_args(exc)
    return None if stray is None else _usage_error(stray)


def main(args: list[str] | None = None) -> int:
    """Run the node until Ctrl-C or SIGTERM (exit 0); exit 2 on an invalid configuration.

    ``args`` is a command line as ``sys.argv`` holds it, the program first. ``--help``
    prints the usage and exits 0 without starting ROS; an argument outside
    ``--ros-args ... [--]`` is refused in one line (exit 2). Params files are checked
    before rcl parses them (``validate_ros_args``) so a missing, unparsable or misspelt
    one is refused in one line; whatever rcl still refuses is reported the same way
    instead of as a traceback. A crash in native code (rcl, DDS, ONNX Runtime) prints
    every thread's Python stack on stderr before the process dies (``faulthandler``), so
    a robot's log says where it happened. The streaming policy's compiled step is loaded
    before rclpy starts, while Ctrl-C is still a plain KeyboardInterrupt.
    """
    faulthandler.enable()
    status = _command_line(list(sys.argv if args is None else args))
    if status is not None:
        return status
    try:
        # before rclpy takes over Ctrl-C: the seconds of numba's import and compile are
        # where a Ctrl-C once crashed the node (see ``warm_up``)
        warm_up()
    except ValueError as exc:  # THINKMEM_STREAMING_ENGINE names no engine
        return _refuse(exc)
    except KeyboardInterrupt:
        return 0
    with StopSignals() as stop:
        try:
            return _run(args, stop)
        except KeyboardInterrupt:  # a second Ctrl-C while still starting
            return 0


def _run(args: list[str] | None, stop: StopSignals) -> int:
    """Start the node and spin it until ``stop`` is requested; the exit status.

    The signal handlers are ours (``StopSignals``), not rclpy's: the context stays valid
    until the executor has let go of the node, so nothing is torn down under it.
    """
    try:
        init = rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    except (_rclpy.UnknownROSArgsError, _rclpy.RCLError) as exc:
        return _refuse_ros_args(exc)
    with init:
        try:
            node = ThinkingNode()
        except (ValueError, BundleError, ParameterException, OSError,
                NameValidationException, _rclpy.RCLError) as exc:
            if stop.requested or not rclpy.ok():
                return 0  # a stop requested while starting: not a refusal
            return _refuse(exc)
        except Exception:
            # A stop requested while still starting: a second signal can land inside an
            # import (onnxruntime re-raises it as ImportError). That is a requested stop,
            # not a crash.
            if stop.requested or not rclpy.ok():
                return 0
            raise
        executor = None
        try:
            if stop.requested or not rclpy.ok():  # stopped while starting; finally cleans up
                return 0
            executor, kind = make_executor(node.config.executor)
            node.drain_queued = kind != "events"  # see ThinkingNode._on_samples
            node.get_logger().info(f"executor: {kind}")
            executor.add_node(node)
            spin(executor, kind, node.context, on_error=node.callback_failed, stop=stop)
        except (_rclpy.RCLError, RuntimeError, ExternalShutdownException):
            # The context shut down by someone else than our signal handlers (an embedding
            # process calling rclpy.shutdown): building the next wait set (RCLError) or the
            # executor's guard condition (RuntimeError "Context must be initialized") then
            # fails instead of raising ExternalShutdownException. A stop, not a crash.
            if rclpy.ok():
                raise
        finally:
            if executor is not None:
                executor.remove_node(node)
                _shut(executor)
            node.destroy_node()
    return 0


def _shut(executor) -> None:
    """Shut the executor down (the context still valid) before Python drops it.

    This is where the C++ events executor lets go of the node's callbacks; one still
    registered when it is destroyed aborts the process.
    """
    try:
        executor.shutdown()
    except Exception:  # noqa: BLE001, S110 - the context is gone: nothing is left to stop
        pass


if __name__ == "__main__":
    sys.exit(main())
