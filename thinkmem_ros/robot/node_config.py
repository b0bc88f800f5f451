"""The thinking node's configuration: one validated dataclass, and the parameters behind it.

ROS parameters are declared from ``PARAMETERS`` (name, default, description, range) and
copied once into ``NodeConfig``; everything after that reads the dataclass. Validation
lives in ``__post_init__`` and raises a ValueError naming the bad key and value, so a
wrong parameter stops the node at start instead of letting it run wrong. No rclpy here:
the node shell turns ``ParamSpec`` into descriptors, tests use the dataclass directly.

``DEFAULT_SIGNAL_MAP`` and ``DEFAULT_EVENTS_TOPIC`` are the one definition of where each
signal travels; bag writing and the demo import them, and ``config/thinkmem.yaml`` must
agree with them (a test checks).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thinkmem_ros.core.vocabulary import SIGNALS
from thinkmem_ros.link.security import CURVE_MODES, SecurityError, curve_enabled
from thinkmem_ros.robot.msg_fields import FieldPath, canonical_type, message_class

QOS_CHOICES = ("sensor_data", "reliable", "best_effort")
TRIGGER_CHOICES = ("timer", "samples")
NODE_NAME = "thinking_node"


@dataclass(frozen=True)
class SignalSource:
    """Where one signal comes from: topic, message type and the dotted numeric field."""

    topic: str
    msg_type: str
    field: str

    def validated(self, name: str) -> SignalSource:
        """Canonical copy, or ValueError naming ``signals.<name>.<key>``."""
        if not self.topic or " " in self.topic:
            raise ValueError(f"signals.{name}.topic must be a topic name, got {self.topic!r}")
        try:
            msg_type = canonical_type(self.msg_type)
            message_class(msg_type)
        except ValueError as exc:
            raise ValueError(f"signals.{name}.type: {exc}") from None
        try:
            FieldPath.compile(msg_type, self.field)
        except ValueError as exc:
            raise ValueError(f"signals.{name}.field: {exc}") from None
        return SignalSource(self.topic, msg_type, self.field)


def _float32(name: str) -> SignalSource:
    return SignalSource(f"/sensors/{name}", "std_msgs/msg/Float32", "data")


DEFAULT_SIGNAL_MAP: dict[str, SignalSource] = {
    name: _float32(name) for name in SIGNALS}
DEFAULT_SIGNAL_MAP["temperature"] = SignalSource(
    "/sensors/temperature", "sensor_msgs/msg/Temperature", "temperature")
DEFAULT_SIGNAL_MAP["distance"] = SignalSource(
    "/sensors/distance", "sensor_msgs/msg/Range", "range")
DEFAULT_EVENTS_TOPIC = "/sensors/events"
ACTIVATION_TOPIC = "thinking/activation"
PROBABILITIES_TOPIC = "thinking/probabilities"
DIAGNOSTICS_TOPIC = "/diagnostics"
DEFAULT_FEEDBACK_TOPIC = "/thinking/feedback"
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


PARAMETERS: tuple[ParamSpec, ...] = (
    ParamSpec("bundle_path", "", "model bundle folder; '' = the shipped default bundle. "
              "Changing it at run time verifies and hot-swaps the bundle", read_only=False),
    ParamSpec("robot_id", "robot", "robot identity reported in diagnostics and experiences"),
    ParamSpec("frame_rate_hz", 0.0, "frame rate; 0 = the bundle's frame_rate_hz", 0.0, 1000.0),
    ParamSpec("frame_trigger", "timer", "'timer': frames at a fixed rate; 'samples': a frame "
              "as soon as every fresh signal has a new sample (lowest latency)"),
    ParamSpec("stale_after_s", 0.5, "a signal whose latest sample is older is masked", 0.001,
              3600.0),
    ParamSpec("thresholds", "", "per-label threshold overrides, 'label=tau,label=tau'; '' = "
              "the bundle's thresholds"),
    ParamSpec("qos", "sensor_data", "input QoS: sensor_data | reliable | best_effort"),
    ParamSpec("qos_depth", 10, "input queue depth", 1, 1000),
    ParamSpec("events_topic", DEFAULT_EVENTS_TOPIC, "std_msgs/String discrete events; '' = none"),
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
              "tcp://10.0.0.5:5755; '' = experience shipping off"),
    ParamSpec("curve", "auto", "CURVE encryption + client auth: auto (on for non-loopback "
              "endpoints, and on loopback when keys are given) | on | off"),
    ParamSpec("server_public_key", "", "the consolidator's CURVE public key file (.key)"),
    ParamSpec("client_secret_key", "", "this robot's CURVE key pair file (.key_secret)"),
    ParamSpec("spool_path", "", "durable SQLite spool for unacknowledged experiences; '' = "
              "$XDG_STATE_HOME (~/.local/state)/thinkmem_ros/<robot_id>/spool.db"),
    ParamSpec("spool_max_mb", 256, "spool size cap; beyond it the oldest rows are shed "
              "(counted)", 1, 1_000_000),
    ParamSpec("bundle_signing_public_key", "", "Ed25519 public key (.sign.pub file or hex) "
              "that pushed bundles must be signed with; '' = every push is refused"),
    ParamSpec("bundles_dir", "", "where verified pushed bundles are installed; '' = "
              "$XDG_STATE_HOME (~/.local/state)/thinkmem_ros/<robot_id>/bundles. At start "
              "a newer signed bundle installed here replaces bundle_path"),
    ParamSpec("feedback_topic", DEFAULT_FEEDBACK_TOPIC, "std_msgs/String JSON {stamp, "
              "required: [labels], reward}: the thinking hindsight says a frame needed; "
              "'' = none"),
    ParamSpec("feedback_window_s", 2.0, "how long a frame waits for its feedback before "
              "it is shipped", 0.0, 3600.0),
    ParamSpec("ship_every_n_frames", 1, "ship every n-th frame (frames with feedback "
              "always)", 1, 1_000_000),
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
    """Return the three parameters of signal ``name`` (defaults from DEFAULT_SIGNAL_MAP)."""
    src = DEFAULT_SIGNAL_MAP.get(name, _float32(name))
    prefix = f"signals.{name}"
    return (ParamSpec(f"{prefix}.topic", src.topic, f"topic carrying {name}"),
            ParamSpec(f"{prefix}.type", src.msg_type, f"message type of {name}'s topic"),
            ParamSpec(f"{prefix}.field", src.field, f"dotted numeric field holding {name}"))


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
        out[label.strip()] = tau
    return out


@dataclass
class NodeConfig:
    """Everything the node reads after start; invalid values raise ValueError naming the key."""

    bundle_path: str = ""
    robot_id: str = "robot"
    frame_rate_hz: float = 0.0
    frame_trigger: str = "timer"
    stale_after_s: float = 0.5
    thresholds: dict[str, float] = field(default_factory=dict)
    qos: str = "sensor_data"
    qos_depth: int = 10
    events_topic: str = DEFAULT_EVENTS_TOPIC
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
    feedback_topic: str = DEFAULT_FEEDBACK_TOPIC
    feedback_window_s: float = 2.0
    ship_every_n_frames: int = 1
    episode_gap_s: float = 5.0
    value_mode: str = "deploy"
    value_horizon: int = 10_000
    recall_endpoint: str = ""
    recall_deadline_s: float = 0.05
    recall_k: int = 4
    signal_map: dict[str, SignalSource] = field(default_factory=lambda: dict(DEFAULT_SIGNAL_MAP))

    def __post_init__(self) -> None:
        _positive_or_zero("frame_rate_hz", self.frame_rate_hz, upper=1000.0)
        _positive("stale_after_s", self.stale_after_s)
        _positive_or_zero("event_horizon_s", self.event_horizon_s)
        _positive("diagnostics_period_s", self.diagnostics_period_s)
        _positive("watch_period_s", self.watch_period_s)
        _choice("frame_trigger", self.frame_trigger, TRIGGER_CHOICES)
        _choice("qos", self.qos, QOS_CHOICES)
        _integer("qos_depth", self.qos_depth, 1)
        _integer("inference_threads", self.inference_threads, 1)
        if not isinstance(self.robot_id, str) or not self.robot_id.strip():
            raise ValueError(f"robot_id must be a non-empty string, got {self.robot_id!r}")
        for label, tau in self.thresholds.items():
            if not (isinstance(tau, (int, float)) and 0.0 <= tau <= 1.0):
                raise ValueError(f"thresholds[{label!r}] must be in [0, 1], got {tau!r}")
        if not self.signal_map:
            raise ValueError("signal_map must name at least one signal")
        self.signal_map = {name: src.validated(name) for name, src in self.signal_map.items()}
        topics = [src.topic for src in self.signal_map.values()]
        dup = sorted({t for t in topics if topics.count(t) > 1})
        if dup:
            raise ValueError(f"signals share topics {dup}; each signal needs its own topic")
        if self.events_topic and self.events_topic in topics:
            raise ValueError(f"events_topic {self.events_topic!r} is also a signal topic")
        self._validate_shipping(topics)
        self._validate_memory()

    def _validate_memory(self) -> None:
        _choice("value_mode", self.value_mode, VALUE_MODE_CHOICES)
        _integer("value_horizon", self.value_horizon, 1)
        _positive("recall_deadline_s", self.recall_deadline_s)
        _integer("recall_k", self.recall_k, 1)
        if self.recall_k > 64:
            raise ValueError(f"recall_k must be <= 64, got {self.recall_k!r}")
        endpoint = self.recall_endpoint
        if endpoint:
            scheme, sep, rest = endpoint.partition("://")
            if not sep or scheme not in ("tcp", "ipc", "inproc") or not rest or " " in endpoint:
                raise ValueError(f"recall_endpoint must look like tcp://host:port, "
                                 f"got {endpoint!r}")

    def _validate_shipping(self, topics: list[str]) -> None:
        _positive_or_zero("feedback_window_s", self.feedback_window_s, upper=3600.0)
        _positive("episode_gap_s", self.episode_gap_s)
        _integer("ship_every_n_frames", self.ship_every_n_frames, 1)
        _integer("spool_max_mb", self.spool_max_mb, 1)
        _choice("curve", self.curve, CURVE_MODES)
        if self.feedback_topic and self.feedback_topic in (*topics, self.events_topic):
            raise ValueError(f"feedback_topic {self.feedback_topic!r} is also an input topic")
        endpoint = self.consolidator_endpoint
        if not endpoint:
            return
        if not re.fullmatch(r"[A-Za-z0-9_.:\-]{1,128}", self.robot_id):
            raise ValueError(f"robot_id {self.robot_id!r} cannot name experiences: use "
                             "letters, digits and _.:- (at most 128)")
        scheme, sep, rest = endpoint.partition("://")
        if not sep or scheme not in ("tcp", "ipc", "inproc") or not rest or " " in endpoint:
            raise ValueError(f"consolidator_endpoint must look like tcp://host:port, "
                             f"got {endpoint!r}")
        have_keys = bool(self.server_public_key and self.client_secret_key)
        if bool(self.server_public_key) != bool(self.client_secret_key):
            raise ValueError("server_public_key and client_secret_key go together; got "
                             f"server_public_key={self.server_public_key!r}, "
                             f"client_secret_key={self.client_secret_key!r}")
        try:
            curve_enabled(self.curve, endpoint, have_keys)
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

    @classmethod
    def from_parameters(cls, values: Mapping[str, Any], signals: tuple[str, ...]) -> NodeConfig:
        """Copy flat ROS parameter values (``signals.<name>.topic`` ...) into a NodeConfig."""
        plain = {spec.name: values.get(spec.name, spec.default) for spec in PARAMETERS}
        plain["thresholds"] = parse_thresholds(plain["thresholds"])
        signal_map = {}
        for name in signals:
            topic, msg_type, path = (values.get(spec.name, spec.default)
                                     for spec in signal_params(name))
            signal_map[name] = SignalSource(topic, msg_type, path)
        return cls(**plain, signal_map=signal_map)

    def effective_rate(self, bundle_rate_hz: float) -> float:
        """Return the configured frame rate, or the bundle's when left at 0."""
        return self.frame_rate_hz if self.frame_rate_hz > 0 else float(bundle_rate_hz)


def state_dir(robot_id: str) -> Path:
    """Return ``$XDG_STATE_HOME/thinkmem_ros/<robot_id>`` (default ``~/.local/state``)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "thinkmem_ros" / robot_id


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
