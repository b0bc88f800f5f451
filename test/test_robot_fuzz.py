"""Property-based fuzzing of the robot side's decoders of outside input (Hypothesis).

Feedback JSON (any publisher on the feedback topic), bundle manifests (files on disk and
pushes), params files and command-line ROS arguments (operators), and header stamps (any
sensor): whatever they hold, each decoder returns its value or raises its one documented
error, and the situation window's ordering rules hold.
"""

from __future__ import annotations

import json
import math

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from thinkmem_ros.policy.bundle import BundleError, BundleManifest, parse_manifest  # noqa: E402
from thinkmem_ros.policy.situation import (  # noqa: E402
    JUMP_BACK_S,
    BufferConfig,
    SituationBuffer,
    Verdict,
)
from thinkmem_ros.robot.experience_builder import (  # noqa: E402
    MAX_FEEDBACK_CHARS,
    Feedback,
    FeedbackError,
    parse_feedback,
)
from thinkmem_ros.robot.node_config import (  # noqa: E402
    ParamsFileError,
    node_fqn_from_args,
    params_files_from_args,
    read_params_file,
    unknown_parameters,
)

# derandomize: CI runs the same examples every time (as test_wire_fuzz does), so a red run
# names a case anyone can rerun; a case a random run found is kept as an @example
FUZZ = settings(max_examples=100, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

FUZZ_FILES = settings(FUZZ, max_examples=40)  # each example writes and parses a file

numbers = st.one_of(st.integers(min_value=-10**30, max_value=10**30),
                    st.floats(allow_nan=True, allow_infinity=True))
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=20))
json_values = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                     st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=20)


def _dumps(value) -> str:
    return json.dumps(value, allow_nan=True)


# ------------------------------------------------------------------ feedback

def _feedback_outcome(text: str) -> Feedback | None:
    try:
        return parse_feedback(text)
    except FeedbackError:
        return None


@FUZZ
@given(st.text(max_size=300))
def test_feedback_arbitrary_text_is_parsed_or_refused(text):
    outcome = _feedback_outcome(text)  # any exception but FeedbackError fails the test
    assert outcome is None or isinstance(outcome, Feedback)


@FUZZ
@given(st.dictionaries(st.sampled_from(["stamp", "required", "reward", "other"]), json_values,
                       max_size=4))
def test_feedback_objects_of_any_shape_are_parsed_or_refused(data):
    feedback = _feedback_outcome(_dumps(data))
    if feedback is not None:  # what is accepted is exactly what the contract promises
        assert math.isfinite(feedback.stamp) and feedback.stamp >= 0
        assert feedback.reward is None or math.isfinite(feedback.reward)
        assert feedback.required is not None or feedback.reward is not None


@FUZZ
@given(st.integers(min_value=1, max_value=200_000), st.sampled_from(["[", "{\"a\":", "[{\"b\":"]))
def test_feedback_nesting_of_any_depth_is_refused(depth, opener):
    text = opener * depth
    assert _feedback_outcome(text) is None
    if len(text) > MAX_FEEDBACK_CHARS:
        with pytest.raises(FeedbackError, match="exceed"):
            parse_feedback(text)


@FUZZ
@given(st.integers(min_value=309, max_value=6000), st.sampled_from(["stamp", "reward"]))
def test_feedback_huge_integers_are_refused(digits, key):  # 1e309 and up overflow a float
    other = "reward" if key == "stamp" else "stamp"
    text = f'{{"{key}": 1{"0" * digits}, "{other}": 1}}'
    assert _feedback_outcome(text) is None


@FUZZ
@given(st.floats(min_value=0, max_value=1e12), st.lists(
    st.from_regex(r"[A-Za-z0-9_.:\-/]{1,64}", fullmatch=True), max_size=5),
    st.one_of(st.none(), st.floats(min_value=-1e6, max_value=1e6)))
def test_valid_feedback_round_trips(stamp, required, reward):
    text = json.dumps({"stamp": stamp, "required": required, "reward": reward})
    feedback = parse_feedback(text)
    assert feedback.stamp == stamp and feedback.reward == reward
    assert feedback.required == tuple(dict.fromkeys(required))


# ------------------------------------------------------------------ bundle manifests

VALID_MANIFEST = {
    "model_version": 3, "sha256": "0" * 64, "labels": ["trend", "hazard"],
    "signals": ["temperature", "load"], "window": 8, "frame_rate_hz": 10.0,
    "normalisation": {"mean": [0.0, 1.0], "std": [1.0, 2.0]},
    "thresholds": {"trend": 0.5, "hazard": 0.3}, "event_vocabulary": ["door_open"],
    "max_events": 4}


def _manifest_outcome(text) -> BundleManifest | None:
    try:
        return parse_manifest(text, source="fuzz/bundle.json")
    except BundleError:
        return None


@FUZZ
@given(json_values)
def test_manifest_of_any_json_value_is_parsed_or_refused(value):
    outcome = _manifest_outcome(_dumps(value))  # any exception but BundleError fails
    assert outcome is None or isinstance(outcome, BundleManifest)


@FUZZ
@given(st.sampled_from(sorted(BundleManifest.__dataclass_fields__)), json_values)
def test_manifest_with_one_field_replaced_is_parsed_or_refused(key, value):
    data = dict(VALID_MANIFEST, **{key: value})
    manifest = _manifest_outcome(_dumps(data))
    if manifest is not None:  # accepted manifests are usable by the node without surprises
        assert manifest.window >= 1 and manifest.max_events >= 1
        assert all(isinstance(label, str) for label in manifest.labels)
        assert all(math.isfinite(tau) for tau in manifest.thresholds.values())
        assert manifest.frame_rate_hz > 0 and math.isfinite(manifest.frame_rate_hz)


@FUZZ
@given(st.binary(max_size=200))
def test_manifest_of_arbitrary_bytes_is_parsed_or_refused(data):
    outcome = _manifest_outcome(data)  # any exception but BundleError fails
    assert outcome is None or isinstance(outcome, BundleManifest)


@FUZZ
@given(st.integers(min_value=1, max_value=100_000))
def test_manifest_nesting_of_any_depth_is_refused(depth):
    data = dict(VALID_MANIFEST, extras=json.loads("[" * min(depth, 500) + "]" * min(depth, 500)))
    text = _dumps(data).replace('"extras": [', '"extras": ' + "[" * depth, 1)
    assert _manifest_outcome(text) is None


def test_the_valid_manifest_is_accepted():
    assert _manifest_outcome(_dumps(VALID_MANIFEST)) is not None


# ------------------------------------------------------------------ params files

names = st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True)
param_trees = st.recursive(
    st.one_of(st.integers(), st.floats(allow_nan=False), st.text(max_size=10), st.booleans(),
              st.lists(st.integers(), max_size=3)),
    lambda inner: st.dictionaries(names, inner, min_size=1, max_size=4), max_leaves=12)


def _params_outcome(path) -> dict | None:
    try:
        return read_params_file(path)
    except ParamsFileError:
        return None


@FUZZ_FILES
@given(st.text(max_size=400))
def test_params_file_of_arbitrary_text_is_read_or_refused(tmp_path, text):
    path = tmp_path / "fuzz.yaml"
    path.write_text(text, encoding="utf-8")
    outcome = _params_outcome(path)  # any exception but ParamsFileError fails
    assert outcome is None or isinstance(outcome, dict)


@FUZZ_FILES
@given(st.binary(max_size=200))
def test_params_file_of_arbitrary_bytes_is_read_or_refused(tmp_path, data):
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(data)
    outcome = _params_outcome(path)  # any exception but ParamsFileError fails
    assert outcome is None or isinstance(outcome, dict)


@FUZZ_FILES
@given(st.dictionaries(names, param_trees, min_size=1, max_size=5),
       st.sampled_from(["/**", "thinking_node", "/thinking_node", "/*", "other_node"]))
def test_params_file_names_are_flattened_for_matching_nodes_only(tmp_path, tree, selector):
    import yaml

    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump({selector: {"ros__parameters": tree}}), encoding="utf-8")
    params = _params_outcome(path)
    assert params is not None, path.read_text()

    def flat(prefix: str, node) -> set[str]:
        if isinstance(node, dict):
            return set().union(*(flat(f"{prefix}{k}.", v) for k, v in node.items()))
        return {prefix[:-1]}

    expected = flat("", tree) if selector != "other_node" else set()
    assert set(params) == expected
    unknown_parameters(params, signals=())  # any name is judged, never raises


@FUZZ
@given(st.lists(st.one_of(st.sampled_from(["--ros-args", "--", "-r", "--remap", "-p",
                                           "--params-file", "__ns:=/x", "__node:=n",
                                           "a:b:__ns:=/y", ":=", ""]),
                          st.text(max_size=12)), max_size=12))
def test_ros_arguments_of_any_shape_are_read_or_refused(argv):
    fqn = node_fqn_from_args(["prog", *argv])
    assert fqn.startswith("/")
    try:
        params_files_from_args(["prog", *argv])
    except ParamsFileError:
        pass


# ------------------------------------------------------------------ header stamps

@FUZZ
@given(st.lists(st.tuples(st.floats(min_value=-5.0, max_value=5.0),  # clock step
                          st.one_of(st.none(), st.floats(min_value=-1e10, max_value=1e10),
                                    st.sampled_from([math.nan, math.inf, 2.1e9])),
                          st.floats(allow_nan=True, allow_infinity=True)),
                min_size=1, max_size=60))
# two small steps back that together pass JUMP_BACK_S: the buffer resets (its reference is
# the newest clock reading), so the same stamp is legitimately accepted again after them
@example(steps=[(0.0, None, 0.0), (-0.0625, 0.0, 0.0), (-0.0625, 0.0, 0.0)])
def test_the_window_only_moves_forward_and_never_takes_the_future(steps):
    buf = SituationBuffer(BufferConfig(("a",), 4, 0.5, future_tolerance_s=1.0))
    now, newest, last_accepted = 1000.0, 1000.0, -math.inf
    for step, stamp, value in steps:
        now += step
        if now < newest - JUMP_BACK_S:  # back from the newest reading: the window resets
            last_accepted, newest = -math.inf, now
        newest = max(newest, now)
        verdict = buf.offer(0, value, now=now, stamp=stamp)
        if verdict is Verdict.ACCEPTED:
            assert math.isfinite(value)
            if stamp is not None:
                assert stamp <= now + 1.0 and stamp > last_accepted
                last_accepted = stamp
        frame = buf.assemble(now=now)
        assert frame.signals.shape == (4, 1) and frame.mask.shape == (4, 1)
        assert all(math.isfinite(x) for x in frame.signals.ravel())
