"""The thinking node's configuration: one validated dataclass, and the parameters behind it.

ROS parameters are declared from ``PARAMETERS`` (name, default, description, range) and
copied once into ``NodeConfig``; everything after that reads the dataclass. Validation
lives in ``__post_init__`` and raises a ValueError naming the bad key and value, so a
wrong parameter stops the node at start instead of letting it run wrong. No rclpy here:
the node shell turns ``ParamSpec`` into descriptors, tests use the dataclass directly.

``DEFAULT_SIGNAL_MAP`` and ``DEFAULT_EVENTS_TOPIC`` are the one definition of where each
signal travels; bag writing and the demo import them, and ``config/thinkmem.yaml`` must
agree with them (a test checks). Input topics are relative names, as ROS users expect: a
node without a namespace reads ``/sensors/<signal>``, one launched in ``robot1`` reads
``/robot1/sensors/<signal>``, so two robots never read each other's sensors.

A signal entry may also carry a signal adapter (``scale``, ``offset``, ``absolute``,
``norm``, ``index``, ``element``, ``name_field``, ``remove_gravity``, ``unit``: see
``core/signal_adapters``) so a real sensor's message lands in the bundle's unit, or
``absent: true`` for a sensor the robot does not have. Adapter keys are declared with
dynamic typing and checked here, so ``scale: 2`` works and ``scale: "2"`` stops the node
naming ``signals.<name>.scale``; every adapter is checked against its message type.

Parameter files are outside input too: ``validate_ros_args`` checks every ``--params-file``
before rcl parses it (a readable regular file, YAML, ``ros__parameters`` structure, no
parameter this node does not declare, no unknown signal-map key, no parameter given twice,
since rcl keeps the last silently, and some section that applies to this node: an empty
file or one for other nodes only started the node on defaults without a word), and
``unknown_parameters`` names
overrides that match no declared parameter (a typo must not be silently ignored).
"""

from __future__ import annotations

import difflib
import errno
import math
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thinkmem_ros.core.input_files import input_file
from thinkmem_ros.core.signal_adapters import (
    ADAPTER_KEYS,
    SignalAdapter,
    parse_adapter,
)
from thinkmem_ros.core.vocabulary import SIGNALS
from thinkmem_ros.link.security import CURVE_MODES, SecurityError, curve_enabled
from thinkmem_ros.robot.experience_builder import MAX_ROBOT_ID_CHARS
from thinkmem_ros.robot.msg_fields import canonical_type, check_adapter, message_class

MIN_FRAME_RATE_HZ, MAX_FRAME_RATE_HZ = 0.01, 1000.0
"""Frame rates the node's timer can keep: one frame every 100 s to one per millisecond."""
QOS_CHOICES = ("sensor_data", "reliable", "best_effort")
TRIGGER_CHOICES = ("timer", "samples")
EXECUTOR_CHOICES = ("events", "single")
NODE_NAME = "thinking_node"


@dataclass(frozen=True)
class SignalSource:
    """Where one signal comes from: topic, message type, and how its number is read.

    ``adapter`` (None = read ``field`` as it is) scales, offsets, norms or picks an array
    element so a real sensor's message lands in the bundle's unit; ``absent`` declares a
    signal this robot does not have: it is never subscribed, its input stays masked and
    /diagnostics reports it as absent by design instead of stale.
    """

    topic: str
    msg_type: str
    field: str
    adapter: SignalAdapter | None = None
    absent: bool = False

    def reader(self) -> SignalAdapter:
        """The adapter that turns one message into the signal's number."""
        return self.adapter if self.adapter is not None else SignalAdapter(self.field)

    def validated(self, name: str) -> SignalSource:
        """Canonical copy, or ValueError naming ``signals.<name>.<key>``."""
        if not isinstance(self.absent, bool):
            raise ValueError(f"signals.{name}.absent must be true or false, got {self.absent!r}")
        if self.adapter is not None and self.adapter.field != self.field:
            raise ValueError(f"signals.{name}.field {self.field!r} differs from its adapter's "
                             f"{self.adapter.field!r}")
        if self.absent:
            # Never subscribed: its type need not even be installed on this robot.
            return self
        if not self.topic or " " in self.topic:
            raise ValueError(f"signals.{name}.topic must be a topic name, got {self.topic!r}")
        try:
            msg_type = canonical_type(self.msg_type)
            message_class(msg_type)
        except ValueError as exc:
            raise ValueError(f"signals.{name}.type: {exc}") from None
        try:
            check_adapter(msg_type, self.reader())
        except ValueError as exc:
            key = getattr(exc, "key", "field")
            raise ValueError(f"signals.{name}.{key}: {exc}") from None
        return SignalSource(self.topic, msg_type, self.field, self.adapter, self.absent)


def _float32(name: str) -> SignalSource:
    return SignalSource(f"sensors/{name}", "std_msgs/msg/Float32", "data")


DEFAULT_SIGNAL_MAP: dict[str, SignalSource] = {
    name: _float32(name) for name in SIGNALS}
DEFAULT_SIGNAL_MAP["temperature"] = SignalSource(
    "sensors/temperature", "sensor_msgs/msg/Temperature", "temperature")
DEFAULT_SIGNAL_MAP["distance"] = SignalSource(
    "sensors/distance", "sensor_msgs/msg/Range", "range")
DEFAULT_EVENTS_TOPIC = "sensors/events"
ACTIVATION_TOPIC = "thinking/activation"
PROBABILITIES_TOPIC = "thinking/probabilities"
DIAGNOSTICS_TOPIC = "/diagnostics"
DEFAULT_FEEDBACK_TOPIC = "thinking/feedback"
ADAPTER_PARAMS: tuple[tuple[str, Any, str], ...] = (
    ("scale", 1.0, "multiply the (normed, gravity-free, absolute) value by this"),
    ("offset", 0.0, "add this after scaling (e.g. -273.15 for kelvin to celsius)"),
    ("absolute", False, "take the absolute value (before scale and offset)"),
    ("norm", False, "Euclidean norm of a Vector3/Quaternion/Point field or number array"),
    ("index", -1, "element of an array field by position; -1 = not an array"),
    ("element", "", "element of an array field by name, looked up in name_field; '' = none"),
    ("name_field", "name", "array of element names (JointState.name) for element"),
    ("remove_gravity", 0.0, "subtract this (m/s^2; true = 9.80665) after the norm"),
    ("unit", "", "unit of the adapted value, compared with the bundle's; '' = undeclared"),
    ("absent", False, "this robot has no such sensor: never subscribed, masked, reported as "
     "absent by design"),
)
"""Optional keys of one signal entry beyond topic/type/field: defaults and descriptions.
Declared with dynamic typing (``scale: 2`` is as good as ``scale: 2.0``); the types are
checked by ``parse_adapter``, whose messages name ``signals.<name>.<key>``."""
SIGNAL_MAP_KEYS: tuple[str, ...] = ("topic", "type", "field",
                                    *(key for key, _, _ in ADAPTER_PARAMS))
"""Keys of one signal's map entry (``signals.<name>.<key>``): the parameters declared per
signal and the only keys a params file may give; extend it together with
``signal_params`` and ``NodeConfig.from_parameters``."""
ROS_PARAMETERS: tuple[str, ...] = ("use_sim_time", "start_type_description_service")
"""Parameters rclpy declares on every node; a params file may set them."""
EVIDENCE_TOPIC = "thinking/evidence"
VALUE_MODE_CHOICES = ("off", "deploy", "learn")


@dataclass(frozen=True)
class ParamSpec:
    """One ROS parameter: default, what it is for, and the range ROS enforces."""

    name: str
    default: Any
    description: str
    min: float | None = None
    max: float | None = None
    read_only: bool = True
    dynamic: bool = False  # any type accepted by rcl; the config checks it (naming the key)


PARAMETERS: tuple[ParamSpec, ...] = (
    ParamSpec("bundle_path", "", "model bundle folder; '' = the shipped default bundle. "
              "Changing it at run time verifies and hot-swaps the bundle", read_only=False),
    ParamSpec("robot_id", "robot", "robot identity reported in diagnostics and experiences; "
              "it names this robot's state folder, so one folder name, not starting with '.'"),
    ParamSpec("frame_rate_hz", 0.0, "frame rate; 0 = the bundle's frame_rate_hz", 0.0,
              1000.0),
    ParamSpec("frame_trigger", "timer", "'timer': frames at a fixed rate; 'samples': a frame "
              "as soon as every fresh signal has a new sample (lowest latency)"),
    ParamSpec("executor", "events", "'events': rclpy's C++ events executor (about half the "
              "CPU of 'single' under sensor load); 'single': rclpy's SingleThreadedExecutor. "
              "'events' falls back to 'single' where rclpy has no events executor"),
    ParamSpec("stale_after_s", 0.5, "a signal whose latest sample is older is masked", 0.001,
              3600.0),
    ParamSpec("thresholds", "", "per-label threshold overrides, 'label=tau,label=tau'; '' = "
              "the bundle's thresholds"),
    ParamSpec("qos", "sensor_data", "input QoS: sensor_data | reliable | best_effort"),
    ParamSpec("qos_depth", 10, "input queue depth", 1, 1000),
    ParamSpec("events_topic", DEFAULT_EVENTS_TOPIC, "std_msgs/String discrete events; '' = none"),
    ParamSpec("future_stamp_tolerance_s", 1.0, "a header stamp further ahead of the node's "
              "clock is refused (counted as 'future'), so one bad stamp cannot make later "
              "samples out of order", 0.001, 1e9),
    ParamSpec("event_horizon_s", 0.0, "events older than this leave the history; 0 = keep "
              "the last M regardless of age", 0.0, 1e6),
    ParamSpec("diagnostics_period_s", 1.0, "period of /diagnostics", 0.05, 60.0),
    ParamSpec("watch_bundle", True, "poll the bundle files and hot-swap when they change"),
    ParamSpec("watch_period_s", 1.0, "bundle file polling period", 0.05, 3600.0),
    ParamSpec("inference_threads", 1, "ONNX Runtime intra-op threads", 1, 64),
    ParamSpec("stats_file", "", "write latency samples and counters here as JSON at "
              "shutdown (benchmarks); '' = off"),
    # -- experience shipping and verified bundle pushes
    ParamSpec("consolidator_endpoint", "", "ZeroMQ endpoint of the consolidator, e.g. "
              "tcp://10.0.0.5:5755, or several receivers comma-separated (the robot picks "
              "one by its id and fails over to the next); '' = experience shipping off"),
    ParamSpec("curve", "auto", "CURVE encryption + client auth: auto (on for non-loopback "
              "endpoints, and on loopback when keys are given) | on | off"),
    ParamSpec("server_public_key", "", "the consolidator's CURVE public key file (.key)"),
    ParamSpec("client_secret_key", "", "this robot's CURVE key pair file (.key_secret)"),
    ParamSpec("spool_path", "", "durable SQLite spool for unacknowledged experiences; '' = "
              "$XDG_STATE_HOME (~/.local/state)/thinkmem_ros/<robot_id>/spool.db"),
    ParamSpec("spool_max_mb", 256, "spool size cap in payload bytes; beyond it the oldest "
              "rows are shed (counted). The files on disk add SQLite's page overhead, the "
              "WAL (16 MB, or half the cap below 32 MB) and a 1 MB reserve file", 1,
              1_000_000),
    ParamSpec("bundle_signing_public_key", "", "Ed25519 public key (.sign.pub file or hex) "
              "that pushed bundles must be signed with; '' = every push is refused"),
    ParamSpec("bundles_dir", "", "where verified pushed bundles are installed; '' = "
              "$XDG_STATE_HOME (~/.local/state)/thinkmem_ros/<robot_id>/bundles. At start "
              "a newer signed bundle installed here replaces bundle_path"),
    ParamSpec("pin_bundle_version", 0, "run only this bundle version: pushes of any other "
              "version are refused (counted as rejected_pinned) and at start only bundle_path "
              "or bundles_dir/v<pin> of this version is used; 0 = off", 0, 1_000_000_000),
    ParamSpec("feedback_topic", DEFAULT_FEEDBACK_TOPIC, "std_msgs/String JSON {stamp, "
              "required: [labels], reward}: the thinking hindsight says a frame needed; "
              "'' = none"),
    ParamSpec("feedback_window_s", 2.0, "how long a frame waits for its feedback before "
              "it is shipped", 0.0, 3600.0),
    ParamSpec("ship_every_n_frames", 1, "ship every n-th frame (frames with feedback "
              "always)", 1, 1_000_000),
    ParamSpec("ship_delta_batches", True, "send batches delta-encoded (each record against "
              "the one before it: ~17x fewer bytes); false for a consolidator older than "
              "the delta frame"),
    ParamSpec("episode_gap_s", 5.0, "a gap between frames longer than this starts a new "
              "episode (so does an 'episode_start' event)", 0.001, 1e6),
    # -- value-aware thinking and memory control; used when the bundle carries
    #    values.npz / memctl.npz
    ParamSpec("value_mode", "deploy", "with a value table in the bundle: off | deploy "
              "(greedy rerank + suppression; never suppresses hazard) | learn (decayed "
              "epsilon-greedy exploration, eps0 0.95, beta 6 over value_horizon frames)"),
    ParamSpec("value_horizon", 10_000, "frames over which learn-mode exploration decays",
              1, 1_000_000_000),
    ParamSpec("recall_endpoint", "", "ZeroMQ endpoint of the consolidator's recall service, "
              "e.g. tcp://10.0.0.5:5756; '' = RECALL decisions are published, not served"),
    ParamSpec("recall_deadline_s", 0.05, "a recall request that takes longer is dropped "
              "(counted); never waited for on the tick", 0.001, 10.0),
    ParamSpec("recall_k", 4, "past episodes per recall", 1, 64),
)


def signal_params(name: str) -> tuple[ParamSpec, ...]:
    """Return the parameters of signal ``name``, one per ``SIGNAL_MAP_KEYS`` entry."""
    src = DEFAULT_SIGNAL_MAP.get(name, _float32(name))
    prefix = f"signals.{name}"
    specs = {"topic": (src.topic, f"topic carrying {name} (relative to the namespace)"),
             "type": (src.msg_type, f"message type of {name}'s topic"),
             "field": (src.field, f"dotted numeric field holding {name}")}
    out = [ParamSpec(f"{prefix}.{key}", *specs[key]) for key in ("topic", "type", "field")]
    out += [ParamSpec(f"{prefix}.{key}", default, description, dynamic=True)
            for key, default, description in ADAPTER_PARAMS]
    return tuple(out)


def parse_thresholds(text: str) -> dict[str, float]:
    """``'hazard=0.3,trend=0.6'`` -> ``{'hazard': 0.3, 'trend': 0.6}``; ValueError naming it."""
    if not isinstance(text, str):
        raise ValueError(f"thresholds must be a string 'label=tau,...', got {text!r}")
    out: dict[str, float] = {}
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        label, sep, value = str(entry).partition("=")
        try:
            tau = float(value)
        except ValueError:
            tau = math.nan
        if not sep or not label.strip() or not 0.0 <= tau <= 1.0:
            raise ValueError(f"thresholds entry {entry!r} must be 'label=tau' with tau in [0, 1]")
        if label.strip() in out:  # which one was meant? the last silently won
            raise ValueError(f"thresholds names {label.strip()!r} twice")
        out[label.strip()] = tau
    return out


@dataclass
class NodeConfig:
    """Everything the node reads after start; invalid values raise ValueError naming the key."""

    bundle_path: str = ""
    robot_id: str = "robot"
    frame_rate_hz: float = 0.0
    frame_trigger: str = "timer"
    executor: str = "events"
    stale_after_s: float = 0.5
    thresholds: dict[str, float] = field(default_factory=dict)
    qos: str = "sensor_data"
    qos_depth: int = 10
    events_topic: str = DEFAULT_EVENTS_TOPIC
    future_stamp_tolerance_s: float = 1.0
    event_horizon_s: float = 0.0
    diagnostics_period_s: float = 1.0
    watch_bundle: bool = True
    watch_period_s: float = 1.0
    inference_threads: int = 1
    stats_file: str = ""
    consolidator_endpoint: str = ""
    curve: str = "auto"
    server_public_key: str = ""
    client_secret_key: str = ""
    spool_path: str = ""
    spool_max_mb: int = 256
    bundle_signing_public_key: str = ""
    bundles_dir: str = ""
    pin_bundle_version: int = 0
    feedback_topic: str = DEFAULT_FEEDBACK_TOPIC
    feedback_window_s: float = 2.0
    ship_every_n_frames: int = 1
    ship_delta_batches: bool = True
    episode_gap_s: float = 5.0
    value_mode: str = "deploy"
    value_horizon: int = 10_000
    recall_endpoint: str = ""
    recall_deadline_s: float = 0.05
    recall_k: int = 4
    signal_map: dict[str, SignalSource] = field(default_factory=lambda: dict(DEFAULT_SIGNAL_MAP))

    def __post_init__(self) -> None:
        _positive_or_zero("frame_rate_hz", self.frame_rate_hz, upper=MAX_FRAME_RATE_HZ)
        if 0 < self.frame_rate_hz < MIN_FRAME_RATE_HZ:
            raise ValueError(f"frame_rate_hz must be 0 (the bundle's) or in "
                             f"[{MIN_FRAME_RATE_HZ:g}, {MAX_FRAME_RATE_HZ:g}], got "
                             f"{self.frame_rate_hz}")
        _positive("stale_after_s", self.stale_after_s)
        _positive_or_zero("event_horizon_s", self.event_horizon_s)
        _positive("future_stamp_tolerance_s", self.future_stamp_tolerance_s)
        _positive("diagnostics_period_s", self.diagnostics_period_s)
        _positive("watch_period_s", self.watch_period_s)
        _choice("frame_trigger", self.frame_trigger, TRIGGER_CHOICES)
        _choice("executor", self.executor, EXECUTOR_CHOICES)
        _choice("qos", self.qos, QOS_CHOICES)
        _integer("qos_depth", self.qos_depth, 1)
        _integer("inference_threads", self.inference_threads, 1)
        if not isinstance(self.robot_id, str) or not self.robot_id.strip():
            raise ValueError(f"robot_id must be a non-empty string, got {self.robot_id!r}")
        problem = robot_id_path_problem(self.robot_id)
        if problem:
            raise ValueError(f"robot_id {self.robot_id!r} {problem}")
        for label, tau in self.thresholds.items():
            if not (isinstance(tau, (int, float)) and 0.0 <= tau <= 1.0):
                raise ValueError(f"thresholds[{label!r}] must be in [0, 1], got {tau!r}")
        if not self.signal_map:
            raise ValueError("signal_map must name at least one signal")
        self.signal_map = {name: src.validated(name) for name, src in self.signal_map.items()}
        if all(src.absent for src in self.signal_map.values()):
            raise ValueError(f"every signal ({sorted(self.signal_map)}) is declared absent; "
                             "at least one must be read")
        topics = [topic_key(src.topic) for src in self.signal_map.values() if not src.absent]
        _one_type_per_topic(self.signal_map)
        if self.events_topic and topic_key(self.events_topic) in topics:
            raise ValueError(f"events_topic {self.events_topic!r} is also a signal topic")
        outputs = {topic_key(t) for t in (ACTIVATION_TOPIC, PROBABILITIES_TOPIC,
                                           DIAGNOSTICS_TOPIC, EVIDENCE_TOPIC)}
        for what, topic in ([("events_topic", self.events_topic),
                             ("feedback_topic", self.feedback_topic)]
                            + [(f"signals.{n}.topic", src.topic)
                               for n, src in self.signal_map.items() if not src.absent]):
            if topic and topic_key(topic) in outputs:  # the node would read itself
                raise ValueError(f"{what} {topic!r} is one of the node's own outputs")
        self._validate_shipping(topics)
        self._validate_memory()

    def _validate_memory(self) -> None:
        _choice("value_mode", self.value_mode, VALUE_MODE_CHOICES)
        _integer("value_horizon", self.value_horizon, 1)
        _positive("recall_deadline_s", self.recall_deadline_s)
        _integer("recall_k", self.recall_k, 1)
        if self.recall_k > 64:
            raise ValueError(f"recall_k must be <= 64, got {self.recall_k!r}")
        if self.recall_endpoint:
            problem = connect_endpoint_problem(self.recall_endpoint)
            if problem:
                raise ValueError(f"recall_endpoint {problem}")
            self._validate_recall_keys()

    def _validate_recall_keys(self) -> None:
        """Recall uses the shipping link's CURVE settings: refuse them here, not per request.

        Why: with keys missing or half given the recall client could only fail every
        request at run time (counted, but recall silently off).
        """
        if bool(self.server_public_key) != bool(self.client_secret_key):
            raise ValueError("server_public_key and client_secret_key go together (recall "
                             f"uses them too); got server_public_key="
                             f"{self.server_public_key!r}, client_secret_key="
                             f"{self.client_secret_key!r}")
        try:
            curve_enabled(self.curve, self.recall_endpoint, bool(self.server_public_key))
        except SecurityError as exc:
            raise ValueError(f"recall_endpoint: {exc}") from None

    def recall_keys(self) -> dict:
        """The recall client's CURVE settings: the robot's own keys, as its shipping link."""
        return {"curve": self.curve, "server_public_key": self.server_public_key or None,
                "client_secret_file": self.client_secret_key or None}

    def _validate_shipping(self, topics: list[str]) -> None:
        _positive_or_zero("feedback_window_s", self.feedback_window_s, upper=3600.0)
        _positive("episode_gap_s", self.episode_gap_s)
        _integer("ship_every_n_frames", self.ship_every_n_frames, 1)
        if not isinstance(self.ship_delta_batches, bool):
            raise ValueError(f"ship_delta_batches must be true or false, got "
                             f"{self.ship_delta_batches!r}")
        _integer("spool_max_mb", self.spool_max_mb, 1)
        _integer("pin_bundle_version", self.pin_bundle_version, 0)
        _choice("curve", self.curve, CURVE_MODES)
        if self.feedback_topic and topic_key(self.feedback_topic) in (
                *topics, topic_key(self.events_topic)):
            raise ValueError(f"feedback_topic {self.feedback_topic!r} is also an input topic")
        endpoint = self.consolidator_endpoint
        if not endpoint:
            return
        if (len(self.robot_id) > MAX_ROBOT_ID_CHARS
                or not re.fullmatch(r"[A-Za-z0-9_:\-][A-Za-z0-9_.:\-]*", self.robot_id)):
            raise ValueError(f"robot_id {self.robot_id!r} cannot name experiences: use "
                             f"letters, digits and _.:-, not starting with '.' (at most "
                             f"{MAX_ROBOT_ID_CHARS}, so its episode ids fit)")
        endpoints = [e.strip() for e in endpoint.split(",")]  # several receivers
        for one in endpoints:
            problem = connect_endpoint_problem(one)
            if problem:
                several = f" (one of {endpoint!r})" if len(endpoints) > 1 else ""
                raise ValueError(f"consolidator_endpoint {problem}{several}; several "
                                 "receivers are comma-separated")
        if len(set(endpoints)) != len(endpoints):
            raise ValueError(f"consolidator_endpoint names an endpoint twice: {endpoint!r}")
        have_keys = bool(self.server_public_key and self.client_secret_key)
        if bool(self.server_public_key) != bool(self.client_secret_key):
            raise ValueError("server_public_key and client_secret_key go together; got "
                             f"server_public_key={self.server_public_key!r}, "
                             f"client_secret_key={self.client_secret_key!r}")
        try:
            for one in endpoints:
                curve_enabled(self.curve, one, have_keys)
        except SecurityError as exc:
            raise ValueError(f"server_public_key/client_secret_key: {exc}") from None

    @property
    def shipping(self) -> bool:
        """True when experiences are shipped (a consolidator endpoint is configured)."""
        return bool(self.consolidator_endpoint)

    def spool_file(self) -> Path:
        """Return the spool path, or the per-robot default under the state directory."""
        return (Path(self.spool_path).expanduser() if self.spool_path
                else state_dir(self.robot_id) / "spool.db")

    def bundles_folder(self) -> Path:
        """Return the pushed-bundle folder, or the per-robot default in the state dir."""
        return (Path(self.bundles_dir).expanduser() if self.bundles_dir
                else state_dir(self.robot_id) / "bundles")

    def check_spool_path(self) -> None:
        """Refuse a spool location that can never hold a spool, before shipping starts.

        A folder at the path, or a folder that cannot be created or written (a typo,
        ``/proc``, a read-only mount, permissions), would leave the node running with every
        experience dropped. A full disk is not refused: that is a runtime fault the spool
        handles by shedding the oldest rows, and the node must keep thinking through it.
        """
        if not self.shipping:
            return
        path = self.spool_file()
        try:
            _check_writable_file(path)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                return
            raise ValueError(f"spool_path {str(path)!r} cannot hold the spool: "
                             f"{exc.strerror or exc}; set spool_path to a file in a "
                             "writable folder") from None

    def check_stats_file(self) -> None:
        """Refuse a ``stats_file`` that cannot be written now, not at shutdown after a run.

        Opening it for append creates it (the node overwrites it at shutdown) and is the
        one check that holds for every cause: a missing folder, a folder at that path, a
        read-only file system, permissions. Only a regular file is opened: a FIFO hung the
        node in that open (SIGTERM could not stop it) and a device is no stats file.
        """
        if not self.stats_file:
            return
        path = Path(self.stats_file).expanduser()
        input_file(path, "stats_file")  # a folder, FIFO, device or socket: ValueError
        try:
            # O_NONBLOCK: a FIFO swapped in since the check fails the open, never blocks it
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o666)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OSError(errno.EINVAL, "it is not a regular file")
            finally:
                os.close(fd)
        except OSError as exc:
            raise ValueError(f"stats_file {self.stats_file!r} cannot be written: "
                             f"{exc.strerror or exc}") from None

    @classmethod
    def from_parameters(cls, values: Mapping[str, Any], signals: tuple[str, ...]) -> NodeConfig:
        """Copy flat ROS parameter values (``signals.<name>.topic`` ...) into a NodeConfig."""
        plain = {spec.name: values.get(spec.name, spec.default) for spec in PARAMETERS}
        plain["thresholds"] = parse_thresholds(plain["thresholds"])
        signal_map = {}
        for name in signals:
            entry = {spec.name.rsplit(".", 1)[1]: values.get(spec.name, spec.default)
                     for spec in signal_params(name)}
            signal_map[name] = source_from_entry(name, entry)
        return cls(**plain, signal_map=signal_map)

    def check_units(self, bundle_units: Mapping[str, str]) -> None:
        """ValueError naming ``signals.<name>.unit`` when it contradicts the bundle's unit.

        A declared unit is a claim about the numbers; running a bundle trained on another
        unit would feed it numbers off by a factor, so the node refuses instead. An
        undeclared unit on either side is not checked.
        """
        for name, src in self.signal_map.items():
            unit = src.adapter.unit if src.adapter is not None else ""
            expected = bundle_units.get(name, "")
            if unit and expected and unit != expected and not src.absent:
                raise ValueError(f"signals.{name}.unit {unit!r} differs from the bundle's "
                                 f"{expected!r} for {name}: adapt the value (scale/offset) "
                                 "and declare the bundle's unit, or run a bundle trained "
                                 f"in {unit!r}")

    @property
    def absent_signals(self) -> tuple[str, ...]:
        """Signals declared ``absent: true`` (never subscribed, masked by design)."""
        return tuple(name for name, src in self.signal_map.items() if src.absent)

    def effective_rate(self, bundle_rate_hz: float) -> float:
        """Return the configured frame rate, or the bundle's when left at 0.

        A bundle's rate outside what a timer can keep (1e-12 Hz: a timer period past the
        clock's range; 1e9 Hz: a busy loop) is refused here, as a configured one is.
        """
        rate = self.frame_rate_hz if self.frame_rate_hz > 0 else float(bundle_rate_hz)
        if not MIN_FRAME_RATE_HZ <= rate <= MAX_FRAME_RATE_HZ:
            raise ValueError(f"the bundle's frame_rate_hz {rate:g} is outside "
                             f"[{MIN_FRAME_RATE_HZ:g}, {MAX_FRAME_RATE_HZ:g}] Hz; set "
                             f"frame_rate_hz to run it at another rate")
        return rate


def source_from_entry(name: str, entry: Mapping[str, Any]) -> SignalSource:
    """One ``signals.<name>`` entry (a params-file mapping or declared values) as a source.

    ``topic``, ``type`` and ``field`` are required strings; the adapter keys are parsed
    strictly by ``parse_adapter``; an unknown key raises ValueError naming it.
    """
    unknown = sorted(set(entry) - set(SIGNAL_MAP_KEYS))
    if unknown:
        raise ValueError(f"signals.{name}: unknown key {unknown[0]!r}"
                         f"{_suggest(str(unknown[0]), SIGNAL_MAP_KEYS)}; a signal takes "
                         f"{list(SIGNAL_MAP_KEYS)}")
    defaults = DEFAULT_SIGNAL_MAP.get(name, _float32(name))
    topic = entry.get("topic", defaults.topic)
    msg_type = entry.get("type", defaults.msg_type)
    field_path = entry.get("field", defaults.field)
    for key, value in (("topic", topic), ("type", msg_type), ("field", field_path)):
        if not isinstance(value, str):
            raise ValueError(f"signals.{name}.{key} must be a string, got {value!r}")
    absent = entry.get("absent", False)
    if not isinstance(absent, bool):
        raise ValueError(f"signals.{name}.absent must be true or false, got {absent!r}")
    raw = {key: value for key, value in entry.items() if key in ADAPTER_KEYS}
    raw["field"] = field_path
    adapter = parse_adapter(name, raw)
    return SignalSource(topic, msg_type, field_path,
                        None if adapter.is_plain and not adapter.unit else adapter, absent)


def connect_endpoint_problem(endpoint: str) -> str | None:
    """Why the node cannot connect to ``endpoint`` (None when it can try).

    ZeroMQ accepts at connect time what only a bind can use: a ``*`` port or host, or an
    out-of-range port read as "any port". Such an endpoint connects nowhere, so every
    request would fail in silence; the node refuses it at start instead.
    """
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme not in ("tcp", "ipc", "inproc") or not rest or " " in endpoint:
        return f"must look like tcp://host:port, got {endpoint!r}"
    if scheme != "tcp":
        return None
    host, _, port = rest.rpartition(":")
    if not host or host == "*" or not port.isdigit() or not 1 <= int(port) <= 65535:
        return (f"must name a host and a port 1-65535 to connect to ('*' only binds), "
                f"got {endpoint!r}")
    return None


def robot_id_path_problem(robot_id: str) -> str | None:
    """Why ``robot_id`` cannot be one folder name under the state directory (None if it can).

    The node's default spool and bundles folders are ``state_dir(robot_id)``: ``..`` put
    the spool in ``~/.local/state`` itself, outside ``thinkmem_ros/``, and ``a/b`` nests
    one robot's state inside another's. Like ``thinkmem keys --name``, no leading '.'.
    """
    if robot_id.startswith("."):
        return "must not start with '.' (it names this robot's state folder)"
    if "/" in robot_id or "\\" in robot_id:
        return "must be one folder name, without '/' or '\\' (it names this robot's state folder)"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in robot_id):
        return "must not hold control characters (it names this robot's state folder)"
    if len(robot_id.encode("utf-8", "surrogatepass")) > 255:
        return "is longer than a folder name may be (255 bytes)"
    return None


def state_dir(robot_id: str) -> Path:
    """Return ``$XDG_STATE_HOME/thinkmem_ros/<robot_id>`` (default ``~/.local/state``)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "thinkmem_ros" / robot_id


def _check_writable_file(path: Path) -> None:
    """OSError unless ``path`` is (or can become) a regular file this process may write.

    The file itself is left untouched: an existing one is opened for update and closed,
    a new one is tried as an anonymous temporary file in its folder.
    """
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "it is a folder")
    if path.exists() and not path.is_file():
        raise OSError(errno.EINVAL, "it is not a regular file")
    folder = next((p for p in path.parents if p.exists()), None)
    if folder is not None and not folder.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"{folder} is a file, not a folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        with open(path, "r+b"):
            return
    with tempfile.TemporaryFile(dir=path.parent):
        return


def _positive(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            value > 0 and math.isfinite(value)):
        raise ValueError(f"{key} must be a number > 0, got {value!r}")


def _positive_or_zero(key: str, value: Any, upper: float = math.inf) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            0 <= value <= upper and math.isfinite(value)):
        raise ValueError(f"{key} must be a number in [0, {upper}], got {value!r}")


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{key} must be one of {list(choices)}, got {value!r}")


def _integer(key: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{key} must be an integer >= {minimum}, got {value!r}")


def _one_type_per_topic(signal_map: dict[str, SignalSource]) -> None:
    """Refuse two signals that read one topic as different message types.

    Signals may share a topic (speed and yaw rate from one Odometry, two numbers of one
    IMU): the node subscribes once and reads every signal from each message. A topic
    carries one type, so two types on it mean a wrong ``type`` parameter.
    """
    seen: dict[str, tuple[str, str]] = {}
    for name, src in signal_map.items():
        if src.absent:
            continue
        first = seen.setdefault(topic_key(src.topic), (name, src.msg_type))
        if first[1] != src.msg_type:
            raise ValueError(f"signals {first[0]!r} and {name!r} read topic {src.topic!r} as "
                             f"{first[1]} and {src.msg_type}; one topic carries one type")


def topic_key(topic: str) -> str:
    """Compare topics as a node without a namespace resolves them ('/a/b' == 'a/b')."""
    return topic.lstrip("/")


# ------------------------------------------------------------------ parameter names

class ParamsFileError(ValueError):
    """A ``--params-file`` this node cannot use; the message names the file and the key."""


def _suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def parameter_name_error(name: str, signals: Iterable[str] | None = None) -> str:
    """Why ``name`` is no parameter of this node ('' when it is one).

    ``signals`` are the signal names the node knows (the bundle's and the base
    vocabulary's); None checks only the shape of ``signals.<name>.<key>``, for a caller
    that does not know the bundle yet.
    """
    plain = {spec.name for spec in PARAMETERS} | set(ROS_PARAMETERS)
    if name in plain:
        return ""
    if name == "signals" or name.startswith("signals."):
        parts = name.split(".")
        if len(parts) != 3:
            return (f"{name!r} must be signals.<signal>.<key> with key one of "
                    f"{list(SIGNAL_MAP_KEYS)}")
        _, signal, key = parts
        if signals is not None:
            known = sorted(set(signals) | set(SIGNALS))
            if signal not in known:
                return (f"unknown signal {signal!r} in {name!r}{_suggest(signal, known)}; "
                        f"known signals: {known}")
        if key not in SIGNAL_MAP_KEYS:
            return (f"unknown key {key!r} in {name!r}{_suggest(key, SIGNAL_MAP_KEYS)}; a "
                    f"signal map takes {list(SIGNAL_MAP_KEYS)}")
        return ""
    return f"unknown parameter {name!r}{_suggest(name, plain)}"


def unknown_parameters(names: Iterable[str], signals: Iterable[str] | None = None
                       ) -> list[str]:
    """Reasons for every name in ``names`` that this node does not declare, sorted."""
    signals = None if signals is None else tuple(signals)
    return [error for error in (parameter_name_error(n, signals) for n in sorted(names))
            if error]


def check_parameter_names(names: Iterable[str], signals: Iterable[str] | None = None,
                          source: str = "parameter overrides") -> None:
    """Raise ValueError naming the first unknown parameter (and how many there are)."""
    errors = unknown_parameters(names, signals)
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ValueError(f"{source}: {errors[0]}{more}")


# ------------------------------------------------------------------ params files

MAX_PARAMS_FILE_BYTES = 1024 * 1024
"""A parameter file larger than this is refused before it is parsed."""


def _selector_regex(selector: str) -> re.Pattern:
    """The rcl node-name pattern (``/**``, ``/*``, ``/ns/node``) as a regex over a full name."""
    parts = [p for p in selector.strip("/").split("/") if p]
    regex = ""
    for part in parts:
        if part == "**":
            regex += "(?:/[^/]+)*"
        else:
            regex += "/" + "[^/]*".join(re.escape(piece) for piece in part.split("*"))
    return re.compile(regex or "/")


def selector_matches(selector: str, node_fqn: str) -> bool:
    """Whether a params-file node key (``/**``, ``thinking_node``, ``/a/*``) names ``node_fqn``."""
    return _selector_regex(selector).fullmatch(node_fqn) is not None


def read_params_file(path: str | Path, node_fqn: str = f"/{NODE_NAME}") -> dict[str, str]:
    """Flat ``{name: raw value}`` of the parameters ``path`` gives ``node_fqn``.

    See ``params_and_sections``, which also names the file's node sections.
    """
    return params_and_sections(path, node_fqn)[0]


def params_and_sections(path: str | Path, node_fqn: str = f"/{NODE_NAME}"
                        ) -> tuple[dict[str, str], list[str]]:
    """The parameters ``path`` gives ``node_fqn`` (as ``read_params_file``), and its sections.

    The sections are the node-name keys above each ``ros__parameters`` in the file, as
    written (``/**``, ``robot1/thinking_node``), whichever node they match.

    Structure is checked for the whole file the way rcl will read it (a mapping of node
    names, optionally nested in namespaces, each holding ``ros__parameters``; no value
    outside it, none empty), so rcl never refuses it later with a traceback; names are
    collected only from the sections that match ``node_fqn``. Values stay raw YAML text:
    the node validates them after rcl has typed them. Raises ParamsFileError.

    A key given twice in one mapping, a parameter given twice in one section (``a.b: 1``
    beside ``a: {b: 2}``), and a parameter set by two sections that both match the node
    (``/**`` and ``/thinking_node``) are refused naming the key and both lines: rcl
    silently keeps the value that comes last in the file (not the more specific section),
    so a file meaning 5 Hz ran at 20 Hz.
    """
    import yaml

    path = Path(path)
    where = f"params file {str(path)!r}"
    try:
        # a FIFO blocked the node in open() and /dev/zero read until memory ran out: only
        # a regular file is read, and never more than the cap (a file may grow meanwhile)
        input_file(path, "params file")
    except ValueError as exc:
        raise ParamsFileError(str(exc)) from None
    try:
        with open(path, "rb") as stream:
            data = stream.read(MAX_PARAMS_FILE_BYTES + 1)
        if len(data) > MAX_PARAMS_FILE_BYTES:
            raise ParamsFileError(f"{where}: larger than {MAX_PARAMS_FILE_BYTES} bytes")
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ParamsFileError(f"{where}: cannot read: {reason}") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ParamsFileError(f"{where}: not YAML{at}: {problem}") from None
    except RecursionError:
        raise ParamsFileError(f"{where}: nested too deeply") from None
    if root is None:
        return {}, []
    _refuse_aliases(text, where)
    out: dict[str, str] = {}
    sections: list[str] = []
    _walk_nodes(root, [], node_fqn, out, {}, where, sections)
    return out, sections


def _refuse_aliases(text: str, where: str) -> None:
    """Rcl refuses YAML aliases (``*name``) in a params file; say so before reading on.

    Walking an alias graph is where a recursive alias (``a: &a [x, *a]``) ran out of stack
    and 535 bytes of nested aliases expanded without end, before rcl could refuse them.
    """
    import yaml

    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            line = event.start_mark.line + 1 if event.start_mark else "?"
            raise ParamsFileError(f"{where}: line {line}: YAML aliases (*{event.anchor}) "
                                  f"are not supported in a params file (rcl refuses them)")


def _line(node) -> str:
    return f"line {node.start_mark.line + 1}"


def _key_text(key, where: str) -> str:
    import yaml

    if not isinstance(key, yaml.ScalarNode) or not key.value:
        raise ParamsFileError(f"{where}: {_line(key)}: keys must be plain names")
    return key.value


def _unique_keys(node, where: str, prefix: str = "") -> list[str]:
    """The key texts of mapping ``node``; ParamsFileError naming a key given twice in it."""
    keys = [_key_text(k, where) for k, _ in node.value]
    first: dict[str, int] = {}
    for index, key in enumerate(keys):
        if key in first:
            earlier, later = node.value[first[key]][0], node.value[index][0]
            at = ("on that line" if earlier.start_mark.line == later.start_mark.line
                  else f"first at {_line(earlier)}")
            raise ParamsFileError(f"{where}: {_line(later)}: {prefix + key!r} is given twice "
                                  f"in one mapping ({at}); rcl would silently use the last")
        first[key] = index
    return keys


def _walk_nodes(node, path: list[str], node_fqn: str, out: dict[str, str],
                origins: dict[str, tuple[str, str]], where: str,
                sections: list[str]) -> None:
    """Node-name levels: mappings down to ``ros__parameters``.

    ``origins`` holds, per parameter collected into ``out``, its section and line;
    ``sections`` gets every section's node-name key, matching ``node_fqn`` or not.
    """
    import yaml

    if not isinstance(node, yaml.MappingNode):
        what = "/".join(path) or "the file"
        raise ParamsFileError(f"{where}: {_line(node)}: {what} must map node names to "
                              "'ros__parameters:' (got a value outside ros__parameters)")
    keys = _unique_keys(node, where)
    if "ros__parameters" in keys and len(keys) > 1 and path:
        other = next(k for k in keys if k != "ros__parameters")
        raise ParamsFileError(f"{where}: {'/'.join(path)}: {other!r} beside "
                              "ros__parameters (every parameter goes inside it)")
    for (key_node, value), key in zip(node.value, keys, strict=True):
        if key == "ros__parameters":
            if not path:
                raise ParamsFileError(f"{where}: {_line(key_node)}: ros__parameters needs a "
                                      "node name above it (e.g. '/**:')")
            if not isinstance(value, yaml.MappingNode):
                raise ParamsFileError(f"{where}: {'/'.join(path)}: ros__parameters must be "
                                      "a mapping of parameter names")
            params: dict[str, str] = {}
            lines: dict[str, str] = {}
            _flatten(value, "", params, lines, where)
            section = "/".join(path)
            sections.append(section)
            if selector_matches(section, node_fqn):
                for name in params:
                    if name in origins:
                        other, line = origins[name]
                        raise ParamsFileError(
                            f"{where}: parameter {name!r} is set by two sections that both "
                            f"match {node_fqn}: {other!r} ({line}) and {section!r} "
                            f"({lines[name]}); rcl would silently use the last in the "
                            "file, so set it in one")
                    origins[name] = (section, lines[name])
                out.update(params)
        else:
            _walk_nodes(value, [*path, key], node_fqn, out, origins, where, sections)


def _flatten(node, prefix: str, out: dict[str, str], lines: dict[str, str],
             where: str) -> None:
    """Parameters of a ``ros__parameters`` mapping into ``out`` by their dotted names.

    ``lines`` gets each one's line; a name given twice is refused naming both lines.
    """
    import yaml

    for (key_node, value), key in zip(node.value, _unique_keys(node, where, prefix),
                                      strict=True):
        name = prefix + key
        if isinstance(value, yaml.MappingNode):
            _flatten(value, name + ".", out, lines, where)
            continue
        if name in out:  # 'a.b: 1' beside 'a: {b: 2}': one parameter to rcl
            raise ParamsFileError(f"{where}: {_line(key_node)}: parameter {name!r} is "
                                  f"given twice (first at {lines[name]}); rcl would "
                                  "silently use the last")
        lines[name] = _line(key_node)
        if isinstance(value, yaml.SequenceNode):
            out[name] = _raw(value)
        elif value.tag.endswith(":null") and value.value == "":
            raise ParamsFileError(f"{where}: {_line(value)}: parameter {name!r} has no value")
        else:
            out[name] = value.value


def _raw(node) -> str:
    """Source-like text of a YAML node (values are only named in messages, never used)."""
    if isinstance(node.value, str):
        return node.value
    return "[" + ", ".join(_raw(item) if not isinstance(item, tuple) else "{...}"
                           for item in node.value) + "]"


def _pairs(section: list[str]) -> list[tuple[str, str]]:
    """Each argument with the one after it ('' after the last): flag/value pairs."""
    return list(zip(section, [*section[1:], ""][:len(section)], strict=True))


def _ros_sections(argv: Sequence[str]) -> list[list[str]]:
    """The argument lists between ``--ros-args`` and ``--`` (or the end), in order."""
    sections: list[list[str]] = []
    current: list[str] | None = None
    for arg in argv:
        if arg == "--ros-args":
            current = []
            sections.append(current)
        elif arg == "--" and current is not None:
            current = None
        elif current is not None:
            current.append(arg)
    return sections


def args_outside_ros(argv: Sequence[str]) -> list[str]:
    """The arguments of ``argv`` outside every ``--ros-args ... [--]`` section, in order.

    The split rcl makes, made without rcl: rcl reads every params file while it splits,
    and ``--help`` must answer, and a stray argument be named, before a params file is
    read. ``argv[0]`` (the program) is kept, as rcl keeps it.
    """
    outside: list[str] = []
    inside = False
    for arg in argv:
        if arg == "--ros-args":
            inside = True
        elif arg == "--" and inside:
            inside = False
        elif not inside:
            outside.append(arg)
    return outside


def _remap_rules(argv: Sequence[str]) -> list[str]:
    """Every remap rule of ``argv``, in order.

    Each ``-r``/``--remap`` value in a ``--ros-args`` section, and each deprecated
    ``from:=to`` outside one: rcl still applies those.
    """
    rules: list[str] = []
    inside, flag = False, ""
    for arg in argv:
        if inside and flag in ("-r", "--remap"):
            rules.append(arg)
        elif arg == "--ros-args":
            inside = True
        elif arg == "--" and inside:
            inside = False
        elif not inside and ":=" in arg:
            rules.append(arg)
        flag = arg if inside else ""
    return rules


def node_fqn_from_args(argv: Sequence[str], default_name: str = NODE_NAME) -> str:
    """Fully qualified node name after the ``__node:=`` / ``__ns:=`` remaps in ``argv``.

    As rcl: the first rule that applies wins, a rule prefixed with another node's name
    (``other:__node:=x``) does not apply, and a deprecated rule outside ``--ros-args``
    counts. Why: the params files are checked for the node rcl will create, and one that
    gives it no parameter is refused (``validate_ros_args``).
    """
    found: dict[str, str] = {}
    for rule in _remap_rules(argv):
        lhs, sep, rhs = rule.partition(":=")
        node, _, key = lhs.rpartition(":")
        if sep and (not node or node == default_name):
            found.setdefault("__node" if key == "__name" else key, rhs)
    name, namespace = found.get("__node", default_name), found.get("__ns", "/")
    namespace = namespace if namespace.startswith("/") else "/" + namespace
    return namespace.rstrip("/") + "/" + name


def params_files_from_args(argv: Sequence[str]) -> list[str]:
    """Every ``--params-file F`` inside the ``--ros-args`` sections of ``argv``."""
    files = []
    for section in _ros_sections(argv):
        for flag, value in _pairs(section):
            if flag == "--params-file":
                if not value or value.startswith("-"):
                    raise ParamsFileError("--params-file needs a file name")
                files.append(value)
    return files


def validate_ros_args(argv: Sequence[str], signals: Iterable[str] | None = None) -> None:
    """Check every params file in ``argv`` before rcl reads it; ParamsFileError naming it."""
    fqn = node_fqn_from_args(argv)
    for path in params_files_from_args(argv):
        params, sections = params_and_sections(path, fqn)
        _require_a_section(path, fqn, sections)
        errors = unknown_parameters(params, signals)
        if errors:
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            raise ParamsFileError(f"params file {path!r}: {errors[0]}{more}")


def _require_a_section(path: str, node_fqn: str, sections: list[str]) -> None:
    """ParamsFileError when no section of params file ``path`` applies to ``node_fqn``.

    Why: rcl reads such a file without a word (0 bytes, comments only, sections for
    other nodes or another namespace) and the node ran on the defaults the file was
    meant to replace. A section for this node that sets nothing is deliberate (launch_ros
    writes one for an empty parameter dict) and passes, as does a file that leaves every
    parameter to another file given with it.
    """
    if any(selector_matches(section, node_fqn) for section in sections):
        return
    found = (f"its sections {sections} name other nodes" if sections
             else "it has no node sections (it is empty or holds only comments)")
    names = ["/**", node_fqn] + ([node_fqn[1:]] if node_fqn.count("/") == 1 else [])
    looked = ", ".join(map(repr, names[:-1])) + f" or {names[-1]!r}"
    raise ParamsFileError(
        f"params file {path!r} holds no parameters for this node ({node_fqn}): {found}; "
        f"looked for a section {looked} (or a wildcard matching {node_fqn}) with "
        "ros__parameters; a file meant to set nothing needs '/**:' with "
        "'ros__parameters: {}'")
