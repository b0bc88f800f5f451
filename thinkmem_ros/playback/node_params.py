"""A params file read as rcl gives it to the thinking node: sections, merging and types.

Why offboard: ``thinkmem calibrate`` and ``thinkmem train --bag`` read the file the node
reads. Read more loosely (any section, last key wins, any YAML type), a file the node
refuses trained at the wrong rate or calibrated against the wrong bundle with exit 0; these
functions apply rcl's section matching and merging and the node's declared types.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from typing import Any

_SHORT = reprlib.Repr()  # Python 3.11's takes no keyword arguments
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict = 2, 4, 4
_SHORT.maxstring = _SHORT.maxlong = _SHORT.maxother = 40


def short_repr(value: Any) -> str:
    """A bounded ``repr`` cut to 40 characters.

    A 400-digit number must not fill the line, and a list shared through YAML aliases
    (9^9 values in nine lines) must not be printed whole.
    """
    text = _SHORT.repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def node_sections(raw: Any) -> list[tuple[str, dict]]:
    """(node-name key, its ``ros__parameters`` mapping) of each section, in file order.

    The key is the path of node-name levels joined with '/', as rcl joins them
    (``/**``, ``thinking_node``, ``robot1/thinking_node``). Each mapping is walked once:
    YAML aliases share one object, and a chain of aliases to aliases is 2^26 paths.
    """
    found: list[tuple[str, dict]] = []
    seen: set[int] = set()
    stack: list[tuple[Any, list[str]]] = [(raw, [])]
    while stack:
        node, path = stack.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        below = []
        for key, value in node.items():
            if key == "ros__parameters":
                if isinstance(value, dict):
                    found.append(("/".join(path), value))
            else:
                below.append((value, [*path, str(key)]))
        stack.extend(reversed(below))  # depth first, in file order
    return found


def node_name_of(keys: list[str], source: str = "params") -> str:
    """The node name a parameter file configures: ``/thinking_node`` or its namespaced name.

    A section naming thinking_node in a namespace (``/robot1/thinking_node:``, or
    ``robot1: thinking_node:``) is read as the node launched there reads it, with the
    ``/**`` sections; two different names (two robots in one file) cannot be told apart
    offboard and are refused.
    """
    from thinkmem_ros.robot.node_config import NODE_NAME

    named = sorted({"/" + "/".join(parts) for parts in
                    ([part for part in key.split("/") if part] for key in keys if "*" not in key)
                    if parts[-1:] == [NODE_NAME]})
    if len(named) > 1:
        raise ValueError(f"{source}: configures {NODE_NAME} under several names {named}; "
                         f"the offboard tools read one node's parameters, so keep one "
                         f"robot per file")
    return named[0] if named else f"/{NODE_NAME}"


def node_parameters(raw: Any, source: str = "params") -> dict[str, Any]:
    """The parameters a file gives the thinking node: its sections merged as rcl merges them.

    Only sections whose node-name key matches the node (``/**``, ``/thinking_node``,
    ``/*``, or its namespaced name) are read, later ones overriding earlier ones name by
    name: a section for another node is not the thinking node's. A mapping without any
    ``ros__parameters`` is taken as the parameters themselves.
    """
    from thinkmem_ros.robot.node_config import selector_matches

    sections = node_sections(raw)
    if not sections:
        return raw if isinstance(raw, dict) else {}
    fqn = node_name_of([key for key, _ in sections], source)
    merged: dict[str, Any] = {}
    for key, section in sections:
        if selector_matches(key, fqn):
            _merge(merged, section)
    if not merged:
        keys = sorted({key for key, _ in sections})
        raise ValueError(f"{source}: no parameters for {fqn} (under '/**:' or "
                         f"'{fqn.rsplit('/', 1)[-1]}:'); the file only configures {keys}")
    return merged


def _merge(into: dict[str, Any], section: Mapping[str, Any]) -> None:
    """Merge ``section`` into ``into`` name by name (nested mappings are copied).

    A dotted key (``signals.speed.topic: x``) is the name rcl makes of nested ones.
    """
    for key, value in section.items():
        *outer, last = str(key).split(".")
        target = into
        for part in outer:
            if not isinstance(target.get(part), dict):
                target[part] = {}
            target = target[part]
        if isinstance(value, dict):
            if not isinstance(target.get(last), dict):
                target[last] = {}
            _merge(target[last], value)
        else:
            target[last] = value


def flat_parameters(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{'signals': {'a': {'topic': t}}}`` -> ``{'signals.a.topic': t}`` (rcl's names)."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_parameters(value, name + "."))
        else:
            out[name] = value
    return out


_RCL_TYPES = {bool: "bool", int: "integer", float: "double", str: "string"}
_WANT = {"bool": "true or false", "integer": "a whole number",
         "double": "a number with a decimal point", "string": "a string"}


def _rcl_type(value: Any) -> str:
    """The ROS parameter type of a YAML value, as rcl types its text."""
    if isinstance(value, (list, tuple)):
        return "array"
    return _RCL_TYPES.get(type(value), type(value).__name__)


def _in_range(spec, value: Any) -> bool:
    """Whether ``value`` lies in the range the node declares for ``spec``.

    rcl's bounds are inclusive; a parameter without one, or a non-number, is in range.
    """
    if spec.min is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return True
    return spec.min <= value <= spec.max


def check_parameter_types(params: Mapping[str, Any], source: str = "params") -> None:
    """ValueError naming a parameter whose YAML type or value the node refuses at start.

    rcl types a value by its text (``10`` an integer, ``10.0`` a double, ``"10"`` a
    string) and the node declares each parameter with one type, so ``frame_rate_hz: 10``
    stops the node at start; the signal adapter keys are declared with dynamic typing and
    checked by the adapter instead.
    """
    from thinkmem_ros.robot.node_config import PARAMETERS, ROS_PARAMETERS, signal_params

    specs = {spec.name: spec for spec in PARAMETERS}
    for name, value in flat_parameters(params).items():
        parts = name.split(".")
        if name in ROS_PARAMETERS:
            want = "bool"
        else:
            spec = specs.get(name)
            if spec is None and len(parts) == 3 and parts[0] == "signals":
                spec = next((s for s in signal_params(parts[1]) if s.name == name), None)
            if spec is None or spec.dynamic:
                continue
            want = _rcl_type(spec.default)
        got = _rcl_type(value)
        if got != want:
            hint = (f"; write {value}.0" if (got, want) == ("integer", "double")
                    and abs(value) < 10**15 else "")
            raise ValueError(f"{source}: {name} must be {_WANT[want]}, got {short_repr(value)} "
                             f"(a YAML {got}): the node declares it a {want} and does not "
                             f"start with it{hint}")
        if spec is not None and not _in_range(spec, value):
            raise ValueError(f"{source}: {name} must be in [{spec.min:g}, {spec.max:g}], got "
                             f"{short_repr(value)}: the node declares that range and does "
                             "not start with a value outside it")
