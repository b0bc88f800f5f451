"""``thinkmem calibrate``: a real recording's adapted signals against a bundle's declared set."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml

from thinkmem_ros.commands import calibrate as command
from thinkmem_ros.policy.bundle import BundleManifest, write_bundle

REAL = Path(__file__).parent / "data" / "real"
BAG = REAL / "husky_outdoor.bag"
PARAMS = REAL / "husky_params.yaml"
NAMES = ["speed", "yaw_rate", "vibration", "gyro"]
UNITS = {"speed": "m/s", "yaw_rate": "rad/s", "vibration": "m/s^2", "gyro": "rad/s"}


def _bundle(folder: Path, **overrides) -> Path:
    fields = dict(model_version=1, sha256="", labels=["turning"], signals=list(NAMES),
                  window=32, frame_rate_hz=10.0,
                  normalisation={"mean": [0.0] * 4, "std": [1.0] * 4},
                  thresholds={"turning": 0.5}, signal_units=dict(UNITS),
                  signal_ranges={"speed": [0.0, 1.1], "yaw_rate": [-0.4, 0.4],
                                 "vibration": [0.0, 1.5], "gyro": [0.0, 0.6]})
    fields.update(overrides)
    write_bundle(folder, b"not-read-by-calibrate", BundleManifest(**fields))
    return folder


def test_matching_bundle_gives_no_warning(tmp_path):
    report = command.calibrate(BAG, PARAMS, _bundle(tmp_path / "b"))
    assert report["warnings"] == []
    assert report["signals"]["vibration"]["rate_hz"] == pytest.approx(30.0, rel=0.01)
    assert report["signals"]["speed"]["bundle_unit"] == "m/s"


def test_unit_range_and_rate_mismatches_are_reported(tmp_path):
    units = dict(UNITS, vibration="mm/s")
    report = command.calibrate(BAG, PARAMS, _bundle(
        tmp_path / "b", signal_units=units, frame_rate_hz=20.0,
        signal_ranges={"speed": [2.0, 5.0]}))
    text = "\n".join(report["warnings"])
    assert "vibration: unit mismatch: the adapter declares 'm/s^2', the bundle was trained " \
           "on 'mm/s'" in text
    assert "speed: median 0.985" in text and "outside the bundle's training range" in text
    assert "speed: 9.99 Hz is slower than the bundle's 20 Hz frames" in text
    assert "vibration: 30 Hz" not in text  # fast enough


def test_default_bundle_names_missing_and_unused_signals(tmp_path):
    from thinkmem_ros.core.paths import default_bundle

    report = command.calibrate(BAG, PARAMS, default_bundle())
    text = "\n".join(report["warnings"])
    assert "speed: not a signal of the bundle" in text
    assert "temperature: the bundle needs it but the params file has no signals entry" in text


def test_cli_exit_codes_and_json(tmp_path, capsys):
    bundle = _bundle(tmp_path / "b")
    out = tmp_path / "report.json"
    args = argparse.Namespace(bag=str(BAG), params=str(PARAMS), bundle=str(bundle),
                              json=str(out))
    assert command.main(args) == 0
    assert "0 warning(s)" in capsys.readouterr().out
    assert json.loads(out.read_text())["signals"]["gyro"]["unit"] == "rad/s"
    raw = yaml.safe_load(PARAMS.read_text())
    raw["/**"]["ros__parameters"]["signals"]["gyro"]["nrom"] = True
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    args.params = str(bad)
    assert command.main(args) == 2
    assert "signals.gyro: unknown key 'nrom'" in capsys.readouterr().err


@pytest.mark.parametrize("entry, key", [
    ({"field": "linear_acceleration.nope"}, "field"),
    ({"field": "linear_acceleration", "norm": False}, "field"),
    ({"field": "linear_acceleration.x", "norm": True}, "norm"),
], ids=["missing-field", "vector-read-plainly", "norm-of-a-number"])
def test_what_the_node_refuses_at_start_is_refused(tmp_path, capsys, entry, key):
    """Such mistakes only show as "no usable sample" in the data; the node names them."""
    raw = yaml.safe_load(PARAMS.read_text())
    vibration = raw["/**"]["ros__parameters"]["signals"]["vibration"]
    for drop in ("norm", "remove_gravity", "absolute"):
        vibration.pop(drop, None)
    vibration.update(entry)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    args = argparse.Namespace(bag=str(BAG), params=str(bad), bundle=None, json=None)
    assert command.main(args) == 2
    err = capsys.readouterr().err
    assert f"signals.vibration.{key}" in err and "refuses to start" in err, err


def test_a_bundle_whose_model_fails_its_checksum_is_refused(tmp_path, capsys):
    """A report against a model no node would load is no advice: refused, by name."""
    bundle = _bundle(tmp_path / "b")
    (bundle / "policy.onnx").write_bytes(b"tampered")
    args = argparse.Namespace(bag=str(BAG), params=str(PARAMS), bundle=str(bundle), json=None)
    assert command.main(args) == 2
    captured = capsys.readouterr()
    assert "does not match the manifest's expected sha256" in captured.err
    assert len(captured.err.strip().splitlines()) == 1 and "0 warning(s)" not in captured.out


def test_a_topic_missing_from_a_bag_of_many_names_only_the_first_few(tmp_path, capsys):
    """The error listed every topic of the bag: 3000 topics made a 29 KB line."""
    from test_bag_hostile import START_NS, float64, params, write_bag

    from thinkmem_ros.playback.bag_files import _typestore

    store = _typestore()
    bag = write_bag(tmp_path / "many", [(START_NS + k, f"/t{k:03d}", "std_msgs/msg/Float64",
                                         float64(store, 1.0)) for k in range(300)])
    args = argparse.Namespace(bag=str(bag), params=str(params(tmp_path)), bundle=None,
                              json=None)
    assert command.main(args) == 2
    err = capsys.readouterr().err
    assert "'/x' is not in" in err and "'/t009'] and 290 more" in err, err
    assert "/t010" not in err and len(err) < 400


def test_a_type_not_installed_here_is_read_with_a_warning_the_node_would_refuse(tmp_path,
                                                                               capsys):
    """Calibrate read a robot's own type from the bag's definition without a word, while
    the node on the same machine refuses to start on the same file."""
    from test_bag_hostile import START_NS, WHEEL, _store, params, write_bag

    from thinkmem_ros.robot.node_config import source_from_entry

    store = _store(custom=True)
    rows = [(START_NS + k * 100_000_000, "/wheel", WHEEL, bytes(store.serialize_cdr(
        store.types[WHEEL](speed=0.5, note="x"), WHEEL))) for k in range(50)]
    bag = write_bag(tmp_path / "b", rows, store=store)
    params_file = params(tmp_path, "speed", "/wheel", WHEEL)
    entry = yaml.safe_load(params_file.read_text())["/**"]["ros__parameters"]["signals"]
    with pytest.raises(ValueError, match="signals.motion.type: .*'acme_msgs' is not installed"):
        source_from_entry("motion", entry["motion"]).validated("motion")
    args = argparse.Namespace(bag=str(bag), params=str(params_file), bundle=None, json=None)
    assert command.main(args) == 0
    out = capsys.readouterr().out
    assert f"WARN motion: the node on this machine cannot subscribe to {WHEEL} until its " \
           "package is installed, and refuses to start with this file (signals.motion.type: " \
           in out and "read with the bag's own definition" in out, out
    row = next(line for line in out.splitlines() if line.startswith("motion "))
    assert "0.5" in row.split()  # the values are still read


def _joint_bag(tmp_path: Path, joints: list[int]) -> Path:
    """``/joint_states`` at 10 Hz, message k naming ``joints[k]`` rotors."""
    import numpy as np
    from test_bag_hostile import START_NS, _store, write_bag

    store, kind = _store(), "sensor_msgs/msg/JointState"
    t = store.types

    def message(n: int) -> bytes:
        header = t["std_msgs/msg/Header"](stamp=t["builtin_interfaces/msg/Time"](
            sec=0, nanosec=0), frame_id="")
        return bytes(store.serialize_cdr(t[kind](
            header=header, name=[f"rotor_{j}" for j in range(n)], position=np.ones(n),
            velocity=np.zeros(n), effort=np.zeros(0)), kind))

    rows = [(START_NS + k * 100_000_000, "/joint_states", kind, message(n))
            for k, n in enumerate(joints)]
    return write_bag(tmp_path / "joints", rows, store=store)


@pytest.mark.parametrize("joints, key, says", [
    ([4] * 50, {"index": 7}, "rotor3: no usable sample on /joint_states: index 7 is past "
     "the end of position (4 elements) in every message"),
    ([4] * 50, {"element": "rotor_9"}, "rotor3: no usable sample on /joint_states: element "
     "'rotor_9' is missing from name in every message"),
    ([4, 8] * 25, {"index": 7}, "rotor3: 25 of 50 messages gave no number: index 7 is past "
     "the end of position (4 elements) in 25 of 50 messages"),
    ([4] * 50, {"index": 0, "scale": 1e300}, "rotor3: no usable sample on /joint_states: the "
     "adapted value is beyond float32 (the node's window type) in every message"),
], ids=["index-past-the-end", "element-nobody-names", "some-messages-too-short",
        "beyond-float32"])
def test_a_signal_without_numbers_is_told_why(tmp_path, capsys, joints, key, says):
    """An index past the end of a JointState array, or a name no message carries, said
    only "no usable sample on /joint_states": nothing to tell which key to fix."""
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump({"/**": {"ros__parameters": {
        "frame_rate_hz": 10.0, "signals": {"rotor3": {
            "topic": "/joint_states", "type": "sensor_msgs/msg/JointState",
            "field": "position", **key}}}}}))
    args = argparse.Namespace(bag=str(_joint_bag(tmp_path, joints)), params=str(params_file),
                              bundle=None, json=None)
    assert command.main(args) == 0
    out = capsys.readouterr().out
    assert f"WARN {says}\n" in out, out
