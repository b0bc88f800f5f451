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


def load_numbers_yaml(text: str) -> Any:
    """``yaml.safe_load`` of ``text``, with exponent floats read as numbers."""
    return yaml.load(text, Loader=NumberLoader)  # noqa: S506 - a SafeLoader subclass
