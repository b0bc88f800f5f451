"""Offboard tools read ``1e-3`` in a params or rules file as the number the node gets."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from thinkmem_ros.core.label_rules import load_rules
from thinkmem_ros.core.yaml_numbers import load_numbers_yaml
from thinkmem_ros.playback.recording import load_signal_map

REAL = Path(__file__).resolve().parent / "data" / "real"


def test_exponent_floats_are_numbers_and_the_rest_is_safe_load():
    text = ("a: 1e-3\nb: -2E+4\nc: 1.5\nd: 10\ne: .inf\nf: abc\ng: '1e3'\nh: 0x10\n"
            "i: true\nj: 1.0e3\nk: .5\nl: 1e\n")
    got = load_numbers_yaml(text)
    assert got == {"a": 0.001, "b": -20000.0, "c": 1.5, "d": 10, "e": float("inf"),
                   "f": "abc", "g": "1e3", "h": 16, "i": True, "j": 1000.0, "k": 0.5,
                   "l": "1e"}
    plain = yaml.safe_load(text)  # YAML 1.1: a, b and even j (no exponent sign) are text
    assert plain["a"] == "1e-3" and plain["j"] == "1.0e3"
    assert {k: v for k, v in plain.items() if k not in ("a", "b", "j")} == \
        {k: v for k, v in got.items() if k not in ("a", "b", "j")}


def test_params_and_rules_take_exponent_numbers(tmp_path):
    params = (REAL / "husky_params.yaml").read_text().replace(
        'unit: "m/s^2"}', 'unit: "m/s^2", scale: 1e0, offset: -1e-3}', 1)
    assert "offset: -1e-3" in params
    (tmp_path / "p.yaml").write_text(params)
    adapter = load_signal_map(tmp_path / "p.yaml").bindings["vibration"].adapter
    assert adapter.scale == 1.0 and adapter.offset == -0.001
    rules = (REAL / "husky_rules.yaml").read_text().replace("above: 0.6", "above: 6e-1")
    (tmp_path / "r.yaml").write_text(rules)
    assert load_rules(tmp_path / "r.yaml") is not None


def test_the_node_reads_the_same_text_as_a_double(tmp_path):
    """What the offboard loader agrees with: rcl's params-file parser (a real rclpy node)."""
    pytest.importorskip("rclpy")
    (tmp_path / "p.yaml").write_text("/**:\n  ros__parameters:\n    x: 1e-3\n")
    code = ("import rclpy, sys\nfrom rclpy.node import Node\n"
            "rclpy.init(args=['--ros-args', '--params-file', sys.argv[1]])\n"
            "n = Node('t', automatically_declare_parameters_from_overrides=True)\n"
            "p = n.get_parameter('x'); print(p.type_.name, repr(p.value))\n"
            "rclpy.shutdown()\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "p.yaml")],
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, ROS_DOMAIN_ID="93"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["DOUBLE", "0.001"]
    assert load_numbers_yaml("x: 1e-3")["x"] == 0.001
