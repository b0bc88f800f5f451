"""ROS message types by name, and numeric values reached by a dotted field path.

The node's signal map names a message type as text (``sensor_msgs/msg/Temperature``) and
the number inside it as a dotted path (``temperature``, ``pose.position.x``,
``data.0``). Resolving both once at configuration time means a typo is refused at start
with a message naming it, and the per-message work is a precompiled chain of getattr.
"""

from __future__ import annotations

import importlib
import math
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

_TYPE_RE = re.compile(r"^([A-Za-z][A-Za-z0-9_]*)/(?:msg/)?([A-Z][A-Za-z0-9]*)$")
_NUMERIC = (int, float)


class FieldError(ValueError):
    """A field path does not lead to a number in this message."""


def canonical_type(name: str) -> str:
    """``pkg/Name`` or ``pkg/msg/Name`` -> ``pkg/msg/Name`` (the form the ROS graph reports)."""
    match = _TYPE_RE.match(name.strip())
    if not match:
        raise ValueError(
            f"message type {name!r} is not of the form 'package/msg/Type' "
            f"(e.g. 'sensor_msgs/msg/Temperature')")
    return f"{match.group(1)}/msg/{match.group(2)}"


@cache
def message_class(name: str) -> type:
    """Import the Python class of message type ``name``; ValueError naming it if unknown."""
    canonical = canonical_type(name)
    package, _, cls_name = canonical.split("/")
    try:
        module = importlib.import_module(f"{package}.msg")
    except ImportError as exc:
        raise ValueError(f"message type {name!r}: package {package!r} is not installed") from exc
    cls = getattr(module, cls_name, None)
    if cls is None or not hasattr(cls, "get_fields_and_field_types"):
        raise ValueError(f"message type {name!r}: {package}.msg has no message {cls_name!r}")
    return cls


def _segments(path: str) -> tuple[str | int, ...]:
    if not path or path.strip() != path:
        raise ValueError(f"field path {path!r} must be a non-empty dotted path")
    out: list[str | int] = []
    for part in path.split("."):
        if part.isdigit():
            out.append(int(part))
        elif part.isidentifier():
            out.append(part)
        else:
            raise ValueError(f"field path {path!r}: bad segment {part!r}")
    if isinstance(out[0], int):
        raise ValueError(f"field path {path!r} must start with a field name")
    return tuple(out)


@dataclass(frozen=True)
class FieldPath:
    """A validated dotted path into one message type that yields a float."""

    msg_type: str
    path: str
    segments: tuple[str | int, ...]

    @classmethod
    def compile(cls, msg_type: str, path: str) -> FieldPath:
        """Check ``path`` against a default instance of ``msg_type`` and return the getter."""
        msg_cls = message_class(msg_type)
        segments = _segments(path)
        value: Any = msg_cls()
        for depth, seg in enumerate(segments):
            if isinstance(seg, int):
                if not hasattr(value, "__getitem__"):
                    raise ValueError(f"field {path!r} of {msg_type}: "
                                     f"{'.'.join(map(str, segments[:depth]))} is not an array")
                if len(value) > seg:
                    value = value[seg]
                else:  # an empty sequence in the default message: elements are numbers
                    value = 0.0
                continue
            fields = getattr(type(value), "get_fields_and_field_types", None)
            if fields is None or seg not in fields():
                known = sorted(fields()) if fields else []
                raise ValueError(f"field {path!r} of {msg_type}: no field {seg!r} "
                                 f"(fields here: {known})")
            value = getattr(value, seg)
        if isinstance(value, bool) or not isinstance(value, _NUMERIC):
            raise ValueError(f"field {path!r} of {msg_type} is {type(value).__name__}, "
                             "not a number")
        return cls(msg_type=canonical_type(msg_type), path=path, segments=segments)

    def extract(self, msg: Any) -> float:
        """Return the number at this path; FieldError when the message holds none there."""
        value = msg
        try:
            for seg in self.segments:
                value = value[seg] if isinstance(seg, int) else getattr(value, seg)
            return float(value)
        except (AttributeError, IndexError, TypeError, ValueError) as exc:
            raise FieldError(f"{self.msg_type} has no number at {self.path!r}: {exc}") from exc


def extract_stamp(msg: Any) -> float | None:
    """Header stamp in seconds, or None when the message has no header or it is unset (0)."""
    header = getattr(msg, "header", None)
    stamp = getattr(header, "stamp", None)
    if stamp is None:
        return None
    seconds = stamp.sec + stamp.nanosec * 1e-9
    return seconds if seconds > 0.0 else None


def is_finite(value: float) -> bool:
    """Tell ordinary numbers from NaN and +-inf, which never enter a window."""
    return math.isfinite(value)
