import math

import msgpack
import numpy as np
import pytest

from thinkmem_ros.link.experience import (
    LIMITS,
    Experience,
    ExperienceError,
    decode_experience,
    decode_experiences,
    encode_experience,
)


def make(**kw):
    base = dict(robot_id="robot-1", episode_id="ep.7", stamp=12.5,
                window=np.arange(12, dtype=np.float32).reshape(4, 3),
                labels=["trend", "hazard"], probabilities=[0.25, 0.75], bundle_version=3,
                mask=np.ones((4, 3)), events=["E001", "E017"], bundle_sha256="a" * 64,
                action="slow_down", trace="rising temp", outcome=1.5, reward=-0.5, seq=41)
    base.update(kw)
    return Experience(**base)


def wire(**overrides):
    data = make().to_wire()
    data.update(overrides)
    return msgpack.packb(data, use_bin_type=True)


def test_roundtrip_keeps_every_field():
    exp = make(mask=np.array([[1, 0, 1]] * 4), outcome="ok")
    back = decode_experience(encode_experience(exp))
    assert back.to_wire() == exp.to_wire()
    assert back.window.dtype == np.float32 and back.window.shape == (4, 3)
    assert back.mask[0].tolist() == [1, 0, 1]
    assert back.key == ("robot-1", 41)


def test_seq_override_and_missing_seq():
    exp = make(seq=None)
    assert decode_experience(encode_experience(exp, seq=9)).seq == 9
    with pytest.raises(ExperienceError, match="seq"):
        encode_experience(exp)


def test_numpy_scalars_accepted_at_construction():
    exp = make(stamp=np.float64(3.0), bundle_version=np.int64(2), reward=np.float32(0.5))
    assert type(exp.stamp) is float and type(exp.bundle_version) is int
    assert decode_experience(encode_experience(exp)).reward == 0.5


@pytest.mark.parametrize("kw, field", [
    (dict(window=np.full((2, 2), np.nan)), "window"),
    (dict(window=np.zeros((LIMITS["max_frames"] + 1, 1))), "frames"),
    (dict(window=np.zeros(5)), "window"),
    (dict(probabilities=[0.5, 1.5]), "probabilities"),
    (dict(probabilities=[0.5, math.nan]), "probabilities"),
    (dict(probabilities=[0.5]), "probabilities"),
    (dict(labels=["a", "a"], probabilities=[0.1, 0.2]), "labels"),
    (dict(events=["bad name"]), r"events\[0\]"),
    (dict(events=["x" * 65]), r"events\[0\]"),
    (dict(robot_id=""), "robot_id"),
    (dict(stamp=-1.0), "stamp"),
    (dict(stamp=math.inf), "stamp"),
    (dict(reward=math.nan), "reward"),
    (dict(reward=2**63), "reward"),
    (dict(reward=-10**400), "reward"),
    (dict(outcome=math.inf), "outcome"),
    (dict(outcome=[1]), "outcome"),
    (dict(trace="x" * (LIMITS["max_trace"] + 1)), "trace"),
    (dict(bundle_sha256="XYZ"), "bundle_sha256"),
    (dict(mask=np.ones((2, 2))), "mask"),
    (dict(mask=np.full((4, 3), 2)), "mask"),
    (dict(seq=-1), "seq"),
])
def test_construction_rejects_bad_fields(kw, field):
    with pytest.raises(ExperienceError, match=field):
        make(**kw)


@pytest.mark.parametrize("overrides, field", [
    (dict(v=99), "schema version"),
    (dict(v=True), "schema version"),
    (dict(seq=True), "seq: expected int"),
    (dict(seq="7"), "seq: expected int"),
    (dict(stamp="now"), "stamp"),
    (dict(window=b"\x00" * 7), "window"),
    (dict(shape=[4]), "shape"),
    (dict(shape=[4096 * 2, 3]), "frames"),
    (dict(probabilities=b"\x00" * 4), "probabilities"),
    (dict(window=np.full((4, 3), np.nan, dtype="<f4").tobytes()), "NaN"),
    (dict(extra=1), "unknown fields"),
    (dict(events="E001"), "events"),
])
def test_decode_rejects_wrong_types_and_sizes(overrides, field):
    with pytest.raises(ExperienceError, match=field):
        decode_experience(wire(**overrides))


def test_decode_rejects_missing_field_garbage_and_truncation():
    data = make().to_wire()
    del data["labels"]
    with pytest.raises(ExperienceError, match="missing fields"):
        decode_experience(msgpack.packb(data))
    good = encode_experience(make())
    with pytest.raises(ExperienceError):
        decode_experience(good[: len(good) // 2])
    with pytest.raises(ExperienceError):
        decode_experience(b"\xc1\xff garbage")
    with pytest.raises(ExperienceError, match="expected a map"):
        decode_experience(msgpack.packb([1, 2, 3]))
    with pytest.raises(ExperienceError, match="exceeds"):
        decode_experience(b"\x00" * (4 * 1024 * 1024))


def _f4(*values):
    return np.array(values, dtype="<f4").tobytes()


# The wire path validates once and builds without re-running the constructor's checks, so
# every check the constructor makes must also be made on the wire: one case per check.
@pytest.mark.parametrize("overrides, field", [
    (dict(robot_id=""), "robot_id"),
    (dict(robot_id="has space"), "robot_id"),
    (dict(episode_id="e" * (LIMITS["max_id"] + 1)), "episode_id"),
    (dict(seq=-1), "seq"),
    (dict(stamp=-0.5), "stamp"),
    (dict(stamp=math.inf), "stamp"),
    (dict(stamp=math.nan), "stamp"),
    (dict(shape=[0, 3], window=b""), "frames"),
    (dict(shape=[4, LIMITS["max_features"] + 1]), "features"),
    (dict(mask=b"\x01" * 11), "mask"),
    (dict(mask=b"\x01" * 11 + b"\x02"), "mask: values"),
    (dict(window=_f4(*range(11), np.inf)), "NaN/inf"),
    (dict(events=["bad name"]), r"events\[0\]"),
    (dict(events=["E"] * (LIMITS["max_events"] + 1)), "events"),
    (dict(labels=["a", "a"]), "duplicate"),
    (dict(labels=["a/b", "c d"]), r"labels\[1\]"),
    (dict(probabilities=_f4(0.5, 1.5)), "probabilities"),
    (dict(probabilities=_f4(0.5, np.nan)), "probabilities"),
    (dict(probabilities=_f4(-0.1, 0.5)), "probabilities"),
    (dict(bundle_version=-1), "bundle_version"),
    (dict(bundle_sha256="A" * 64), "bundle_sha256"),
    (dict(action="x" * (LIMITS["max_text"] + 1)), "action"),
    (dict(trace="x" * (LIMITS["max_trace"] + 1)), "trace"),
    (dict(outcome=math.inf), "outcome"),
    (dict(outcome="x" * (LIMITS["max_text"] + 1)), "outcome"),
    (dict(reward=math.nan), "reward"),
    (dict(reward=True), "reward"),
    (dict(reward=2**63), "reward"),
    (dict(reward=1e300), "reward"),
    (dict(required=["ok", "not ok"]), r"required\[1\]"),
])
def test_wire_path_makes_every_constructor_check(overrides, field):
    with pytest.raises(ExperienceError, match=field):
        decode_experience(wire(**overrides))


def test_wire_built_record_equals_a_constructed_one():
    exp = make(stamp=7, required=["trend"])
    back = decode_experience(encode_experience(exp))
    assert vars(back).keys() == vars(exp).keys()
    assert back.to_wire() == exp.to_wire()
    assert type(back.stamp) is float and back.required == ["trend"]
    assert back.window.shape == (4, 3) and back.mask.shape == (4, 3)
    assert back.with_seq(5).seq == 5  # the wire-built record is a full Experience


def test_batch_decode_names_only_the_bad_records():
    good = [encode_experience(make(seq=i, trace=f"t{i}")) for i in range(6)]
    payloads = list(good)
    payloads[1] = wire(window=_f4(*range(11), np.nan))
    payloads[3] = wire(mask=b"\x01" * 11 + b"\x05")
    payloads[4] = wire(probabilities=_f4(0.2, 2.0))
    payloads[5] = b"\xc1 garbage"
    out = decode_experiences(payloads)
    assert [type(x).__name__ for x in out] == [
        "Experience", "ExperienceError", "Experience", "ExperienceError", "ExperienceError",
        "ExperienceError"]
    assert "NaN" in str(out[1]) and "mask" in str(out[3])
    assert "probabilities" in str(out[4]) and "msgpack" in str(out[5])
    assert out[0].trace == "t0" and out[2].trace == "t2" and out[2].seq == 2
    assert decode_experiences([]) == []


@pytest.mark.parametrize("mixed", [False, True])
def test_batch_decode_keeps_every_array_with_its_record(mixed):
    rng = np.random.default_rng(3)
    records = [make(seq=i, window=rng.normal(size=(4, 3)), mask=rng.integers(0, 2, (4, 3)),
                    probabilities=rng.random(2)) for i in range(5)]
    if mixed:  # other shapes and label counts in one batch take the per-record path
        records[2] = make(seq=2, window=rng.normal(size=(6, 2)), mask=None,
                          labels=["a", "b", "c"], probabilities=rng.random(3))
    payloads = [encode_experience(r) for r in records]
    payloads[3] = wire(window=_f4(*range(11), np.inf))  # a bad one in between
    out = decode_experiences(payloads)
    assert isinstance(out[3], ExperienceError)
    for i in (0, 1, 2, 4):
        assert np.array_equal(out[i].window, records[i].window)
        assert np.array_equal(out[i].probabilities, records[i].probabilities)
        if records[i].mask is None:
            assert out[i].mask is None
        else:
            assert np.array_equal(out[i].mask, records[i].mask)
        assert out[i].to_wire() == records[i].to_wire()
        assert not out[i].window.flags.writeable  # views of wire bytes, as before


def test_refused_records_do_not_keep_their_payloads_alive():
    # an error kept with its traceback holds the frames that unpacked the payload, in a
    # reference cycle only a full garbage collection frees: MBs per refused record
    import sys

    payloads = [msgpack.packb({"v": 2, "events": [[0] * 2000] * 40}),  # > budget threshold
                msgpack.packb({"v": 2, "robot_id": 5}), b"\xc1garbage"]
    before = [sys.getrefcount(p) for p in payloads]
    out = decode_experiences(payloads)
    assert all(isinstance(r, ExperienceError) for r in out)
    assert "entries" in str(out[0])
    assert [sys.getrefcount(p) for p in payloads] == before
