"""ROS message types by name, and numeric values reached by a dotted field path.

The node's signal map names a message type as text (``sensor_msgs/msg/Temperature``) and
the number inside it as a dotted path (``temperature``, ``pose.position.x``,
``data.0``). Resolving both once at configuration time means a typo is refused at start
with a message naming it, and the per-message work is a precompiled chain of getattr.
``check_adapter`` does the same for a signal adapter (``core/signal_adapters``): a norm
needs a vector, ``index``/``element`` an array of numbers, ``element`` a string array to
look its name up in; each mistake is named at start, never found on the first message.
"""

from __future__ import annotations

import importlib
import math
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

from thinkmem_ros.core.signal_adapters import SignalAdapter, split_path

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


_segments = split_path
_ARRAY_RE = re.compile(r"^(?:sequence<([^,>]+)(?:, ?\d+)?>|([^\[]+)\[(?:<=)?\d*\])$")
_NUMERIC_TYPES = frozenset({
    "boolean", "octet", "byte", "char", "float", "double", "long double", "int8", "uint8",
    "int16", "uint16", "int32", "uint32", "int64", "uint64", "float32", "float64"})
_STRING_TYPES = frozenset({"string", "wstring"})


class AdapterFieldError(ValueError):
    """An adapter key that does not fit the message; ``key`` names it (field, norm, ...)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def _resolve(msg_type: str, path: str) -> tuple[Any, str]:
    """Default-instance value and declared ROS type (``double``, ``sequence<double>`` ...)."""
    msg_cls = message_class(msg_type)
    segments = _segments(path)
    value: Any = msg_cls()
    declared = ""
    for depth, seg in enumerate(segments):
        if isinstance(seg, int):
            match = _ARRAY_RE.match(declared)
            if not match:
                raise ValueError(f"field {path!r} of {msg_type}: "
                                 f"{'.'.join(map(str, segments[:depth]))} is not an array")
            declared = (match.group(1) or match.group(2)).strip()
            if len(value) > seg:
                value = value[seg]
            elif declared not in _NUMERIC_TYPES | _STRING_TYPES:
                value = message_class(declared)()  # an empty array of messages by default
            else:
                value = 0.0
            continue
        fields = getattr(type(value), "get_fields_and_field_types", None)
        if fields is None or seg not in fields():
            known = sorted(fields()) if fields else []
            raise ValueError(f"field {path!r} of {msg_type}: no field {seg!r} "
                             f"(fields here: {known})")
        declared = fields()[seg]
        value = getattr(value, seg)
    return value, declared


def _element_type(declared: str) -> str | None:
    match = _ARRAY_RE.match(declared)
    return (match.group(1) or match.group(2)).strip() if match else None


def _is_vector(value: Any, declared: str) -> bool:
    """A message with numeric x/y/z(/w) fields, or an array of numbers."""
    element = _element_type(declared)
    if element is not None:
        return element in _NUMERIC_TYPES
    fields = getattr(type(value), "get_fields_and_field_types", None)
    if fields is None:
        return False
    types = fields()
    parts = [name for name in ("x", "y", "z", "w") if name in types]
    return bool(parts) and all(types[name] in _NUMERIC_TYPES for name in parts)


def check_adapter(msg_type: str, adapter: SignalAdapter) -> None:
    """Check ``adapter`` against ``msg_type``; AdapterFieldError naming the key that fails.

    Plain reads keep ``FieldPath.compile``'s checks (and messages); an array selection
    needs an array field, ``element`` a string array at ``name_field``, ``norm`` a vector
    (after the selection) and no norm a number.
    """
    if adapter.index is None and adapter.element is None and not adapter.norm:
        try:
            FieldPath.compile(msg_type, adapter.field)
        except ValueError as exc:
            raise AdapterFieldError("field", str(exc)) from None
        return
    try:
        value, declared = _resolve(msg_type, adapter.field)
    except ValueError as exc:
        raise AdapterFieldError("field", str(exc)) from None
    where = f"field {adapter.field!r} of {msg_type}"
    if adapter.index is not None or adapter.element is not None:
        element = _element_type(declared)
        key = "index" if adapter.index is not None else "element"
        if element is None:
            raise AdapterFieldError(key, f"{where} is {declared or type(value).__name__}, "
                                    f"not an array ({key} picks one array element)")
        if adapter.element is not None:
            try:
                _, names = _resolve(msg_type, adapter.name_field)
            except ValueError as exc:
                raise AdapterFieldError("name_field", str(exc)) from None
            if _element_type(names) not in _STRING_TYPES:
                raise AdapterFieldError("name_field", f"name_field {adapter.name_field!r} of "
                                        f"{msg_type} is {names}, not an array of names")
        if adapter.norm:
            if element in _NUMERIC_TYPES:
                raise AdapterFieldError("norm", f"{where}: its elements are numbers "
                                        f"({element}), not vectors to take the norm of")
            try:
                sample = message_class(element)()
            except ValueError:
                sample = None
            if sample is None or not _is_vector(sample, ""):
                raise AdapterFieldError("norm", f"{where}: its elements ({element}) are "
                                        "not vectors (x/y/z numbers)")
        elif element not in _NUMERIC_TYPES:
            raise AdapterFieldError(key, f"{where}: its elements are {element}, not numbers "
                                    "(norm: true takes a vector element's length)")
        return
    if not _is_vector(value, declared):
        raise AdapterFieldError("norm", f"{where} is {declared or type(value).__name__}, not "
                                "a vector (norm needs x/y/z numbers or an array of numbers)")


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
