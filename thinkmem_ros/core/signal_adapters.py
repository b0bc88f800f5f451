"""Signal adapters: how one number is read from a real sensor message and put in the bundle's unit.

A bundle is trained on signals in fixed units (``motion`` in m/s, ``vibration`` in mm/s,
...), but a robot's sensors publish whatever their drivers publish: an IMU's acceleration
as a Vector3 that includes gravity, a joint's effort as one element of a ``JointState``
array, a battery's temperature in kelvin. An adapter turns one message into one number
in the bundle's unit, so a user never has to write a republisher.

The value is computed in a fixed order, the one a user reasons in:

1. **select**: the dotted ``field`` (``twist.twist.linear``, ``data.0``); with ``index`` or
   ``element`` the field is an array and one element is taken, by position or by the
   position of ``element`` in the ``name_field`` array (``JointState.name``);
2. **norm**: with ``norm: true`` the selected value is a vector (anything with x/y/z(/w)
   numbers, or a sequence of numbers) and its Euclidean norm is taken;
3. **gravity**: ``remove_gravity`` (m/s^2, e.g. 9.80665) is subtracted, so an IMU at rest
   reads about 0 instead of 9.8;
4. **absolute**: with ``absolute: true`` the magnitude is kept (a reversing robot moves
   too);
5. **scale**, then 6. **offset**: ``value * scale + offset`` (kelvin to celsius is
   ``offset: -273.15``, m to mm ``scale: 1000``).

``unit`` declares the unit after adaptation; it is compared with the bundle's declared
units (a mismatch is reported, never silently accepted).

This module is torch-free and ROS-free on purpose: it reads any object with attributes,
so the same adapter serves rclpy messages on the robot and the dataclasses ``rosbags``
deserialises when a recording is calibrated or trained on. ``read`` never raises on bad
data: a missing field, an unknown element name or a non-finite number gives NaN, which
the situation window counts as an invalid sample. ``why_nan`` says why, for the tools that
read a recording offboard; ``read`` never pays for it.

One exception to "non-finite is invalid": a ranger's infinities are readings (REP 117).
``sensor_msgs/Range.range`` and ``sensor_msgs/LaserScan.ranges`` use +inf for "nothing
within range" and -inf for "closer than the minimum", so ``read`` turns them into the
message's own ``max_range``/``min_range`` (``range_max``/``range_min``) before adapting:
counted invalid, an ultrasound facing open space would look like a dead sensor.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

ADAPTER_KEYS: frozenset[str] = frozenset({
    "field", "scale", "offset", "absolute", "norm", "index", "element", "name_field",
    "remove_gravity", "unit"})
"""Keys of one signal entry that describe how its number is read (``field`` included)."""

SOURCE_KEYS: frozenset[str] = frozenset({"topic", "type", "absent"})
"""Keys of one signal entry that say where it comes from (or that it never comes)."""

SIGNAL_ENTRY_KEYS: frozenset[str] = ADAPTER_KEYS | SOURCE_KEYS
"""Every key one ``signals.<name>`` entry may hold; any other key is refused."""

STANDARD_GRAVITY = 9.80665
"""m/s^2; the value ``remove_gravity: true`` stands for."""

_VECTOR_ATTRS = ("x", "y", "z", "w")
RANGE_LIMITS: dict[str, tuple[str, str]] = {
    "range": ("min_range", "max_range"),  # sensor_msgs/Range
    "ranges": ("range_min", "range_max"),  # sensor_msgs/LaserScan
}
"""Ranger fields whose -inf/+inf mean "closer than min" / "nothing within max" (REP 117),
with the message fields holding those limits."""
_MAX_UNIT_CHARS = 32


def split_path(path: str) -> tuple[str | int, ...]:
    """``'data.0'`` -> ``('data', 0)``; ValueError when it is no dotted field path."""
    if not isinstance(path, str) or not path or path.strip() != path:
        raise ValueError(f"field path {path!r} must be a non-empty dotted path")
    out: list[str | int] = []
    for part in path.split("."):
        if part.isdigit():
            out.append(int(part))
        elif part.isidentifier():
            out.append(part)
        else:
            bracket = re.fullmatch(r"([A-Za-z_]\w*)\[(\d+)\]", part)
            hint = (f" (an element is a segment of its own: "
                    f"{bracket.group(1)}.{bracket.group(2)})") if bracket else ""
            raise ValueError(f"field path {path!r}: bad segment {part!r}{hint}")
    if isinstance(out[0], int):
        raise ValueError(f"field path {path!r} must start with a field name")
    return tuple(out)


def _walk(obj: Any, segments: tuple[str | int, ...]) -> Any:
    for seg in segments:
        obj = obj[seg] if isinstance(seg, int) else getattr(obj, seg)
    return obj


def _number(value: Any) -> float:
    if isinstance(value, (bool, str, bytes)):
        raise TypeError(f"{type(value).__name__} is not a number")
    return float(value)


def vector_norm(value: Any) -> float:
    """Euclidean norm of a Vector3/Quaternion/Point-like object or a sequence of numbers.

    An empty sequence has no norm: a sensor that sent no numbers is a missing sample,
    not a reading of 0.
    """
    parts = [getattr(value, attr) for attr in _VECTOR_ATTRS if hasattr(value, attr)]
    if not parts:
        if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
            raise TypeError(f"{type(value).__name__} is not a vector")
        parts = list(value)
        if not parts:
            raise ValueError("an empty sequence has no norm")
    return math.sqrt(sum(_number(p) ** 2 for p in parts))


@dataclass(frozen=True)
class SignalAdapter:
    """How one signal is read from one message field and turned into the bundle's unit."""

    field: str
    scale: float = 1.0
    offset: float = 0.0
    absolute: bool = False
    norm: bool = False
    index: int | None = None
    element: str | None = None
    name_field: str = "name"
    remove_gravity: float = 0.0
    unit: str = ""

    def __post_init__(self) -> None:
        # Paths are split once here so ``read`` is a chain of getattr per message.
        object.__setattr__(self, "_segments", split_path(self.field))
        object.__setattr__(self, "_name_segments", split_path(self.name_field))
        if self.index is not None and self.element is not None:
            raise ValueError("index and element exclude each other")

    @property
    def segments(self) -> tuple[str | int, ...]:
        """The dotted ``field`` split into attribute names and array positions."""
        return self._segments  # type: ignore[attr-defined]

    @property
    def name_segments(self) -> tuple[str | int, ...]:
        """The dotted ``name_field`` split like ``segments``."""
        return self._name_segments  # type: ignore[attr-defined]

    @property
    def is_plain(self) -> bool:
        """True when the adapter only reads a number (what a signal map did before adapters)."""
        return self == SignalAdapter(self.field, unit=self.unit)

    def select(self, msg: Any) -> Any:
        """The selected field (the element, with ``index``/``element``); raises on bad data."""
        value = _walk(msg, self.segments)
        if self.index is not None:
            value = value[self.index]
        elif self.element is not None:
            names = list(_walk(msg, self.name_segments))
            value = value[names.index(self.element)]
        return value

    def read(self, msg: Any) -> float:
        """The adapted number in ``unit``; NaN when the message holds none (never raises)."""
        try:
            value = self.select(msg)
            value = vector_norm(value) if self.norm else _number(value)
            if math.isinf(value) and not self.norm:
                value = ranger_limit(msg, self.segments, value)
        except Exception:  # noqa: BLE001 - bad data is a NaN sample, never an exception
            return math.nan
        return self.adapt(value)

    def why_nan(self, msg: Any) -> str:
        """Why ``read`` gives NaN for ``msg``, in the terms of the signal's keys.

        ``read`` runs on every message on the robot and only says NaN; "no usable sample"
        leaves a user guessing between a wrong index, a name no message carries and a
        sensor sending NaN. The cause is worked out again here, offboard (calibrate),
        for the messages that gave no number only.
        """
        value, why = self._selected(msg)
        if why:
            return why
        what = self.field if self.index is None and self.element is None else (
            f"the selected element of {self.field}")
        try:
            number = vector_norm(value) if self.norm else _number(value)
        except Exception as exc:  # noqa: BLE001 - the reason is the answer
            return f"{what} is not a {'vector' if self.norm else 'number'} ({exc})"
        if not math.isfinite(number):
            return f"{what} is {number}, not a finite number"
        return f"{what} is {number:g}, not finite after remove_gravity, scale and offset"

    def _selected(self, msg: Any) -> tuple[Any, str]:
        """(the selected value, '') as ``select`` picks it, or (None, why it has none)."""
        value, why = _walk_why(msg, self.segments)
        if why or (self.index is None and self.element is None):
            return value, why
        if self.index is not None:
            return _element_why(value, self.index, self.field, f"index {self.index}")
        names, why = _walk_why(msg, self.name_segments)
        if why:
            return None, why
        try:
            position = list(names).index(self.element)
        except ValueError:
            return None, f"element {self.element!r} is missing from {self.name_field}"
        except TypeError:
            return None, f"{self.name_field} is not a list of names"
        return _element_why(value, position, self.field, f"element {self.element!r} "
                            f"(position {position} in {self.name_field})")

    def adapt(self, value: float) -> float:
        """Steps 3-6 on an already selected (and normed) number: gravity, abs, scale, offset."""
        value = value - self.remove_gravity
        if self.absolute:
            value = abs(value)
        value = value * self.scale + self.offset
        return value if math.isfinite(value) else math.nan

    def to_dict(self) -> dict[str, Any]:
        """The keys that differ from the defaults (plus ``field``): what a config file holds."""
        defaults = SignalAdapter(self.field)
        out: dict[str, Any] = {"field": self.field}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "field" and value != getattr(defaults, f.name):
                out[f.name] = value
        return out


def _walk_why(obj: Any, segments: tuple[str | int, ...]) -> tuple[Any, str]:
    """(the value at ``segments``, '') or (None, why the walk stopped there)."""
    for depth, seg in enumerate(segments):
        where = ".".join(map(str, segments[:depth])) or "the message"
        if isinstance(seg, int):
            obj, why = _element_why(obj, seg, where, f"position {seg}")
            if why:
                return None, why
        elif hasattr(obj, seg):
            obj = getattr(obj, seg)
        else:
            return None, f"{where} has no field {seg!r}"
    return obj, ""


def _element_why(array: Any, position: int, name: str, what: str) -> tuple[Any, str]:
    """(``array[position]``, '') or (None, why ``what`` is not there)."""
    try:
        return array[position], ""
    except IndexError:
        size = len(array)
        return None, f"{what} is past the end of {name} ({size} element{'s' * (size != 1)})"
    except Exception:  # noqa: BLE001 - the reason is the answer
        kind = getattr(array, "__msgtype__", type(array).__name__)  # rosbags' message name
        return None, f"{name} is {kind}, not an array"


def ranger_limit(msg: Any, segments: tuple[str | int, ...], value: float) -> float:
    """The limit an infinite ranger reading stands for (REP 117); ``value`` unchanged else.

    Only a reading of a ranger's own field (``range``, an element of ``ranges``) of a
    message carrying both limits qualifies: an infinity anywhere else stays one (NaN later).
    """
    limits = RANGE_LIMITS.get(str(segments[0]))
    if limits is None or not all(isinstance(seg, int) for seg in segments[1:]):
        return value
    low, high = limits
    if not (hasattr(msg, low) and hasattr(msg, high)):
        return value
    return _number(getattr(msg, high if value > 0 else low))


def _suggest(name: str, known) -> str:
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.7)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _finite(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value):
        raise ValueError(f"{key} must be a finite number, got {value!r}")
    return float(value)


def _flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {value!r}")
    return value


def parse_adapter(name: str, raw: Mapping[str, Any]) -> SignalAdapter:
    """Strictly validated adapter of signal ``name`` from one signal entry.

    ``raw`` is the signal's entry as a config file gives it (``field``, ``scale``, ...;
    ``topic``, ``type`` and ``absent`` may be present and are left to the caller). Any
    other key, a value of the wrong type or an impossible combination raises ValueError
    naming ``signals.<name>.<key>``. ``index: -1``, ``element: ''`` and ``unit: ''`` mean
    unset (the forms a ROS parameter can hold). ``remove_gravity: true`` means
    ``STANDARD_GRAVITY``.
    """
    where = f"signals.{name}"
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must be a mapping of {sorted(SIGNAL_ENTRY_KEYS)}, "
                         f"got {raw!r}")
    for key in raw:
        if key not in SIGNAL_ENTRY_KEYS:
            raise ValueError(f"{where}: unknown key {key!r}{_suggest(str(key), SIGNAL_ENTRY_KEYS)}"
                             f"; a signal takes {sorted(SIGNAL_ENTRY_KEYS)}")
    if "field" not in raw:
        raise ValueError(f"{where}.field is required (the dotted field holding the number)")
    field_path = raw["field"]
    try:
        split_path(field_path)
    except ValueError as exc:
        raise ValueError(f"{where}.field: {exc}") from None
    kwargs: dict[str, Any] = {"field": field_path}
    if "scale" in raw:
        kwargs["scale"] = _finite(f"{where}.scale", raw["scale"])
        if kwargs["scale"] == 0.0:
            raise ValueError(f"{where}.scale must not be 0 (the signal would be constant)")
    if "offset" in raw:
        kwargs["offset"] = _finite(f"{where}.offset", raw["offset"])
    for key in ("absolute", "norm"):
        if key in raw:
            kwargs[key] = _flag(f"{where}.{key}", raw[key])
    index = raw.get("index")
    if index is not None and index != -1:
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"{where}.index must be an integer >= 0 (-1 = unset), "
                             f"got {index!r}")
        kwargs["index"] = index
    element = raw.get("element")
    if element is not None and element != "":
        if not isinstance(element, str) or element.strip() != element:
            raise ValueError(f"{where}.element must be an element name (a string), "
                             f"got {element!r}")
        kwargs["element"] = element
    if "index" in kwargs and "element" in kwargs:
        raise ValueError(f"{where}.element: give index or element, not both "
                         f"(index={kwargs['index']!r}, element={kwargs['element']!r})")
    if "name_field" in raw:
        try:
            split_path(raw["name_field"])
        except ValueError as exc:
            raise ValueError(f"{where}.name_field: {exc}") from None
        if "element" not in kwargs and raw["name_field"] != "name":
            raise ValueError(f"{where}.name_field is only used with element")
        kwargs["name_field"] = raw["name_field"]
    if "remove_gravity" in raw:
        gravity = raw["remove_gravity"]
        if gravity is True:
            gravity = STANDARD_GRAVITY
        elif gravity is False:
            gravity = 0.0
        gravity = _finite(f"{where}.remove_gravity", gravity)
        if not 0.0 <= gravity <= 100.0:
            raise ValueError(f"{where}.remove_gravity must be in [0, 100] m/s^2 (or true for "
                             f"{STANDARD_GRAVITY}), got {raw['remove_gravity']!r}")
        kwargs["remove_gravity"] = gravity
    if "unit" in raw:
        unit = raw["unit"]
        if not isinstance(unit, str) or any(c.isspace() for c in unit) or len(
                unit) > _MAX_UNIT_CHARS:
            raise ValueError(f"{where}.unit must be a unit name such as 'mm/s' or 'N*m' (no "
                             f"spaces, at most {_MAX_UNIT_CHARS} characters), got {unit!r}")
        kwargs["unit"] = unit
    return SignalAdapter(**kwargs)
