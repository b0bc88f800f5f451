"""YAML reading that types ``1e-3`` as a number, the way ROS 2 reads a params file.

Why: PyYAML follows YAML 1.1, where a float needs a dot and a signed exponent
(``1.0e-3``; even ``1.0e3`` is text), so ``scale: 1e-3`` loads as the string ``'1e-3'``;
rcl's params-file parser reads the same text with
``strtod`` and gives the node the number 0.001. The offboard tools (calibration, training
from recordings, label rules) read the files the node reads, so they take numbers the way
the node does: otherwise a file the robot accepts is refused offboard, or the reverse.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from typing import Any

import yaml

_FLOAT = re.compile(r"""^(?:
     [-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X)


class NumberLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with exponent floats (``1e9``, ``-2E-3``) read as numbers."""


NumberLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:float"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
NumberLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT,
                                   list("-+0123456789."))


class UniqueKeyLoader(NumberLoader):
    """``NumberLoader`` that refuses a key defined twice in one mapping.

    PyYAML keeps the last of two equal keys without a word: a rules file that defines a
    label twice silently lost the first definition.
    """

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<``: merged keys may repeat
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable):
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"{key!r} is defined twice in one mapping",
                        key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_numbers_yaml(text: str, unique_keys: bool = False) -> Any:
    """``yaml.safe_load`` of ``text``, with exponent floats read as numbers.

    ``unique_keys``: refuse a mapping that defines a key twice (files only this package
    reads; a params file keeps rcl's reading, which the node gets).
    """
    loader = UniqueKeyLoader if unique_keys else NumberLoader
    try:
        doc = yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:  # PyYAML's composer recurses once per nesting level
        raise yaml.YAMLError("nested too deeply to read") from None
    _refuse_expansion(doc)
    return doc


MAX_EXPANDED_VALUES = 100_000
"""Values a configuration may hold once its aliases are expanded (a tree walk's cost)."""


def _refuse_expansion(doc: Any) -> None:
    """YAMLError when ``doc``, read as the tree every reader walks, holds too many values.

    Aliases share one object, so nine lines of ``&a [*b, *b, ...]`` load in microseconds
    and small, but are 9^9 values to anything that walks or prints them: validation, an
    error message's repr. That hung a command at 80 MB/s until killed. The walk stops at
    the limit, so it costs at most that many steps.
    """
    stack, seen = [doc], 0
    while stack:
        value = stack.pop()
        seen += 1
        if seen > MAX_EXPANDED_VALUES:
            raise yaml.YAMLError(f"holds more than {MAX_EXPANDED_VALUES} values once its "
                                 "aliases (*name) are expanded")
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
