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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .msg_fields import FieldPath, canonical_type, message_class
from .vocabulary import SIGNALS

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
