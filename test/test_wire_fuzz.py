"""Property-based fuzzing of every decoder that takes bytes from the wire (Hypothesis).

Properties, for wire frames (``decode_frame``), experience records (``decode_experience``,
``decode_experiences``) and bundle push bodies (``decode_frame`` + ``handle_push``):

* anything at all raises nothing but the module's own error type (a robot or the
  consolidator never dies of an unexpected exception on input);
* decoding costs a bounded multiple of the input's size (``tracemalloc`` peak);
* what the encoders produce decodes back to the same thing.

Each test is bounded (``max_examples``) so the suite stays fast; ``derandomize`` keeps the
examples the same on every run, so a failure reproduces.
"""

from __future__ import annotations

import math
import tracemalloc

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thinkmem_ros.link import delta, protocol
from thinkmem_ros.link.experience import (
    LIMITS,
    Experience,
    ExperienceError,
    decode_experience,
    decode_experiences,
    encode_experience,
)
from thinkmem_ros.link.protocol import Kind, ProtocolError, decode_frame

FUZZ = settings(max_examples=200, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
HEAVY = settings(FUZZ, max_examples=60)  # nested values are slow to generate, not to decode

# msgpack-able values of every type, nested: what a hostile peer can put in a body
scalars = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1)
           | st.floats(allow_nan=True) | st.text(max_size=40) | st.binary(max_size=64))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=8)
                      | st.dictionaries(st.text(max_size=12), inner, max_size=6),
                      max_leaves=16)
kinds = st.sampled_from(list(Kind)) | st.integers(0, 255)
names = st.from_regex(r"[A-Za-z0-9_.:\-]{1,20}", fullmatch=True)


def packed(value) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def header(kind, version=protocol.PROTOCOL_VERSION) -> bytes:
    return protocol.MAGIC + bytes((version, int(kind)))


def peak_bytes(fn, *args):
    """Peak Python allocation while ``fn(*args)`` runs (its result or error dropped)."""
    tracemalloc.start()
    try:
        try:
            fn(*args)
        except (ProtocolError, ExperienceError):
            pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# --------------------------------------------------------------------------- frames

@FUZZ
@given(st.binary(max_size=2048))
def test_frames_of_random_bytes_raise_only_protocol_error(data):
    try:
        frame = decode_frame(data)
    except ProtocolError:
        return
    assert isinstance(frame.body, dict)


@HEAVY
@given(kinds, st.sampled_from([protocol.PROTOCOL_VERSION, 0, 2, 255]), values)
def test_frames_with_a_valid_header_and_any_msgpack_body(kind, version, body):
    try:
        frame = decode_frame(header(kind, version) + packed(body))
    except ProtocolError as exc:
        assert exc.version in (None, version)
        return
    assert frame.kind == kind and isinstance(frame.body, dict)
    # what the receiver relies on after decoding
    if frame.kind in (Kind.EXPERIENCE_BATCH, Kind.EXPERIENCE_DELTA_BATCH):
        assert all(type(item) is bytes for item in frame.body["items"])
        assert 0 < len(frame.body["robot_id"]) <= protocol.MAX_ID


@HEAVY
@given(kinds, st.dictionaries(st.sampled_from(["batch", "robot_id", "items", "stored",
                                               "duplicates", "rejected", "reason", "server",
                                               "artefacts", "version", "manifest", "onnx",
                                               "signature", "id", "k", "embedding"]),
                              values, max_size=8))
def test_frames_with_the_real_field_names_and_any_values(kind, body):
    try:
        frame = decode_frame(header(kind) + packed(body))
    except ProtocolError:
        return
    if frame.kind is Kind.ACK:
        assert all(len(reason) <= protocol.MAX_REASON for _, reason in frame.body["rejected"])
    if frame.kind is Kind.HELLO:
        assert all(len(frame.body[k]) <= protocol.MAX_ID
                   for k in ("robot_id", "server") if k in frame.body)


@HEAVY
@given(st.data())
def test_truncations_and_bit_flips_of_valid_frames_raise_only_protocol_error(data):
    frame = data.draw(valid_frames)[0]
    cut = data.draw(st.integers(0, len(frame)))
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(frame) - 1), st.integers(1, 255)),
                               max_size=4))
    mutated = bytearray(frame[:cut] if data.draw(st.booleans()) else frame)
    for index, xor in flips:
        if index < len(mutated):
            mutated[index] ^= xor
    try:
        decoded = decode_frame(bytes(mutated))
    except ProtocolError:
        return  # refused with the protocol's own error: what the property asks
    assert decoded.kind is not None  # a mutation that still decodes is a well-formed frame


valid_frames = st.one_of(
    st.builds(lambda b, r, items: (protocol.experience_batch(b, r, items),
                                   {"batch": b, "robot_id": r, "items": items}),
              st.integers(0, 2**63 - 1), names, st.lists(st.binary(max_size=200), min_size=1,
                                                         max_size=20)),
    st.builds(lambda b, r, items: (protocol.experience_delta_batch(b, r, items),
                                   {"batch": b, "robot_id": r, "items": items}),
              st.integers(0, 2**63 - 1), names, st.lists(st.binary(max_size=200), min_size=1,
                                                         max_size=20)),
    st.builds(lambda b, s, d, rej: (protocol.ack(b, s, d, rej), {
        "batch": b, "stored": s, "duplicates": d,
        "rejected": [[i, r[:protocol.MAX_REASON]] for i, r in rej]}),
        st.integers(0, 2**63 - 1), st.integers(0, 8192), st.integers(0, 8192),
        st.lists(st.tuples(st.integers(0, 8191), st.text(max_size=600)), max_size=10)),
    st.builds(lambda r: (protocol.hello(r), {"robot_id": r}), names),
    st.builds(lambda r: (protocol.refused(r), {"reason": r[:protocol.MAX_REASON]}),
              st.text(max_size=700)),
    st.builds(lambda v, m, o, s, a: (protocol.bundle_push(v, m, o, s, a),
                                     {"version": v, "manifest": m, "onnx": o, "signature": s,
                                      **({"artefacts": a} if a else {})}),
              st.integers(0, 2**31), st.binary(max_size=100), st.binary(max_size=100),
              st.binary(max_size=64),
              st.dictionaries(st.from_regex(r"[a-z][a-z0-9_]{0,10}\.(bin|json)",
                                            fullmatch=True), st.binary(max_size=50),
                              max_size=4)),
)


@FUZZ
@given(valid_frames)
def test_valid_frames_round_trip(case):
    data, body = case
    frame = decode_frame(data)
    assert frame.body == body


def test_body_fields_are_bounded_before_they_can_be_kept():
    long_id = "r" * (protocol.MAX_ID + 1)
    for body, kind in (({"robot_id": long_id}, Kind.HELLO),
                       ({"server": "s" * 10_000}, Kind.HELLO),
                       ({"batch": 1, "robot_id": long_id, "items": [b"x"]},
                        Kind.EXPERIENCE_BATCH),
                       ({"batch": -1, "robot_id": "r", "items": [b"x"]},
                        Kind.EXPERIENCE_BATCH),
                       ({"reason": "x" * (protocol.MAX_REASON + 1)}, Kind.REFUSED),
                       ({"batch": 1, "stored": 0, "duplicates": 0,
                         "rejected": [[0, "x" * 10_000]]}, Kind.ACK),
                       ({"batch": 1, "stored": 0, "duplicates": 0,
                         "rejected": [[0, "x"]] * (protocol.MAX_BATCH_ITEMS + 1)}, Kind.ACK)):
        with pytest.raises(ProtocolError):
            decode_frame(header(kind) + packed(body))


@pytest.mark.parametrize("body", [
    {"batch": 1, "robot_id": "r", "items": [[0] * 8000] * 500},  # 4 MB of one-byte entries
    {"batch": 1, "robot_id": "r", "items": [b"x"], "extra": [[0] * 8000] * 500},
    {"batch": 1, "robot_id": "r", "items": [b"x"], "extra": ["ab"] * 500_000},
    {"robot_id": "r", "pad": [{"a": [0] * 8000}] * 500},
])
def test_a_frame_costs_about_its_own_size_to_refuse(body):
    kind = Kind.HELLO if "pad" in body else Kind.EXPERIENCE_BATCH
    data = header(kind) + packed(body)
    peak = peak_bytes(decode_frame, data)
    assert peak < 3 * len(data), f"decoding {len(data)} bytes allocated {peak}"


@HEAVY
@given(kinds, values)
def test_decoding_any_frame_allocates_a_bounded_multiple_of_its_size(kind, body):
    data = header(kind) + packed(body)
    assert peak_bytes(decode_frame, data) < 64 * len(data) + (1 << 20)


# -------------------------------------------------------------------------- records

record_fields = {
    "v": st.sampled_from([1, 2, 3]) | values, "robot_id": names | values,
    "episode_id": names | values, "seq": st.integers(0, 2**63 - 1) | values,
    "stamp": st.floats(0, 1e9) | values, "shape": st.just([2, 3]) | values,
    "window": st.binary(min_size=24, max_size=24) | values,
    "mask": st.none() | st.just(bytes(6)) | values, "events": st.lists(names, max_size=4)
    | values, "labels": st.just(["a"]) | values,
    "probabilities": st.just(np.float32(0.5).tobytes()) | values,
    "bundle_version": st.integers(0, 5) | values, "bundle_sha256": st.just("") | values,
    "action": st.none() | values, "trace": st.none() | st.text(max_size=50) | values,
    "outcome": st.none() | values, "reward": st.none() | values,
    "required": st.none() | st.lists(names, max_size=3) | values,
    "signal_set": st.sampled_from(["", "cd" * 32]) | values,
}


@HEAVY
@given(st.fixed_dictionaries({}, optional=record_fields)
       | st.dictionaries(st.text(max_size=10), values, max_size=20))
def test_records_with_any_fields_raise_only_experience_error(record):
    try:
        experience = decode_experience(packed(record))
    except ExperienceError:
        return
    assert isinstance(experience, Experience)
    assert 0 < len(experience.robot_id) <= LIMITS["max_id"]
    assert np.isfinite(experience.window).all()


@HEAVY
@given(st.lists(st.binary(max_size=300) | st.builds(packed, values), max_size=12))
def test_a_batch_of_garbage_gives_one_error_per_slot_and_never_raises(payloads):
    out = decode_experiences(payloads)
    assert len(out) == len(payloads)
    assert all(isinstance(r, (Experience, ExperienceError)) for r in out)


@HEAVY
@given(values)
def test_decoding_any_record_allocates_a_bounded_multiple_of_its_size(record):
    data = packed(record)
    assert peak_bytes(decode_experience, data) < 64 * len(data) + (1 << 20)


def test_a_record_of_one_byte_list_entries_is_refused_before_it_is_built():
    data = packed({"v": 2, "events": [0] * 1_000_000})  # 1 MB -> 8 MB of list if unpacked
    assert peak_bytes(decode_experience, data) < 3 * len(data)


finite = st.floats(-1e6, 1e6, allow_nan=False, width=32)


@st.composite
def experiences(draw):
    frames, features = draw(st.integers(1, 6)), draw(st.integers(1, 5))
    labels = draw(st.lists(names, min_size=1, max_size=5, unique=True))
    masked = draw(st.booleans())
    return Experience(
        robot_id=draw(names), episode_id=draw(names), stamp=draw(st.floats(0, 1e9)),
        window=np.array(draw(st.lists(finite, min_size=frames * features,
                                      max_size=frames * features)),
                        dtype=np.float32).reshape(frames, features),
        mask=(np.array(draw(st.lists(st.integers(0, 1), min_size=frames * features,
                                     max_size=frames * features)), dtype=np.uint8)
              .reshape(frames, features) if masked else None),
        labels=labels,
        probabilities=draw(st.lists(st.floats(0, 1, width=32), min_size=len(labels),
                                    max_size=len(labels))),
        bundle_version=draw(st.integers(0, 2**40)), events=draw(st.lists(names, max_size=6)),
        bundle_sha256=draw(st.sampled_from(["", "ab" * 32])),
        action=draw(st.none() | st.text(max_size=30)), trace=draw(st.none() | st.text(
            max_size=60)), outcome=draw(st.none() | st.text(max_size=20) | finite),
        reward=draw(st.none() | finite), seq=draw(st.integers(0, 2**63 - 1)),
        required=draw(st.none() | st.lists(names, max_size=3)),
        signal_set=draw(st.sampled_from(["", "cd" * 32])))


@HEAVY
@given(experiences())
def test_valid_records_round_trip(experience):
    back = decode_experience(encode_experience(experience))
    for name in ("robot_id", "episode_id", "stamp", "labels", "bundle_version", "events",
                 "bundle_sha256", "action", "trace", "outcome", "reward", "seq", "required",
                 "signal_set"):
        a, b = getattr(back, name), getattr(experience, name)
        assert a == b or (isinstance(a, float) and math.isclose(a, b)), name
    np.testing.assert_array_equal(back.window, experience.window)
    np.testing.assert_array_equal(back.probabilities, experience.probabilities)
    if experience.mask is None:
        assert back.mask is None
    else:
        np.testing.assert_array_equal(back.mask, experience.mask)


# ------------------------------------------------------------------- delta batches

def _delta_batch() -> list[bytes]:
    """A valid delta batch: one robot, one episode, a window sliding one row per record."""
    rng = np.random.default_rng(5)
    frames = rng.normal(size=(12, 3)).astype(np.float32)
    records = [Experience(robot_id="r", episode_id="ep", stamp=float(i), seq=i,
                          window=frames[i:i + 6], mask=np.ones((6, 3), np.uint8),
                          labels=["a", "b"], probabilities=[0.25, 0.5], bundle_version=1,
                          events=["E1"] * (1 + i // 2)) for i in range(6)]
    return delta.encode_items([encode_experience(e) for e in records])


DELTA_BATCH = _delta_batch()
delta_keys = st.sampled_from(sorted(delta._DELTA_KEYS))


@HEAVY
@given(st.data())
def test_delta_batches_of_mutated_and_garbage_items_never_raise(data):
    maps = [msgpack.unpackb(item) for item in DELTA_BATCH]
    for _ in range(data.draw(st.integers(0, 4))):  # fields of any value, deltas or not
        index = data.draw(st.integers(0, len(maps) - 1))
        maps[index][data.draw(delta_keys)] = data.draw(values | st.integers(-3, 12))
    items = [packed(m) for m in maps]
    for _ in range(data.draw(st.integers(0, 2))):  # whole items of garbage
        index = data.draw(st.integers(0, len(items) - 1))
        items[index] = data.draw(st.binary(max_size=80) | st.builds(packed, values))
    out = delta.decode_items(items, "r")
    assert len(out) == len(items)
    for result in out:
        if not isinstance(result, ExperienceError):
            experience, full = result
            assert np.isfinite(experience.window).all() and experience.robot_id == "r"
            assert decode_experience(full).key == experience.key


@HEAVY
@given(st.lists(experiences(), min_size=1, max_size=6), st.booleans())
def test_any_valid_records_round_trip_through_a_delta_batch(records, one_episode):
    if one_episode:  # so that records of one window shape become deltas
        records = [Experience(**{**e.__dict__, "robot_id": "r", "episode_id": "ep"})
                   for e in records]
    payloads = [encode_experience(e) for e in records]
    out = delta.decode_items(delta.encode_items(payloads))
    assert [full for _, full in out] == payloads


# ----------------------------------------------------------------- bundle push bodies

@pytest.fixture(scope="module")
def push_rig(tmp_path_factory, source_bundle):
    from conftest import copy_bundle

    from thinkmem_ros.consolidator.publish import push_frame
    from thinkmem_ros.link.security import sign_bundle, write_signing_keypair
    from thinkmem_ros.robot.bundle_receiver import BundleReceiver, BundleReceiverConfig

    root = tmp_path_factory.mktemp("pushfuzz")
    public, secret = write_signing_keypair(root / "keys", "consolidator")
    folder = copy_bundle(source_bundle, root / "signed", model_version=5)
    sign_bundle(folder, secret)
    installed: list = []
    receiver = BundleReceiver(BundleReceiverConfig(root / "robot", public, current_version=1),
                              on_install=installed.append)
    return {"frame": push_frame(folder), "receiver": receiver, "installed": installed}


@HEAVY
@given(st.fixed_dictionaries({}, optional={
    "version": st.integers(-5, 2**31) | values, "manifest": st.binary(max_size=300) | values,
    "onnx": st.binary(max_size=300) | values, "signature": st.binary(max_size=80) | values,
    "artefacts": st.dictionaries(st.text(max_size=20), st.binary(max_size=40) | values,
                                 max_size=4) | values}) | values)
def test_push_bodies_of_any_shape_are_refused_without_raising(push_rig, body):
    try:
        frame = decode_frame(header(Kind.BUNDLE_PUSH) + packed(body))
    except ProtocolError:
        return
    assert push_rig["receiver"].handle_push(frame.body) is None
    assert push_rig["installed"] == []


@HEAVY
@given(st.data())
def test_any_change_to_a_signed_push_is_refused(push_rig, data):
    body = dict(decode_frame(push_rig["frame"]).body)
    field = data.draw(st.sampled_from(["manifest", "onnx", "signature"]))
    raw = bytearray(body[field])
    index = data.draw(st.integers(0, len(raw) - 1))
    raw[index] ^= data.draw(st.integers(1, 255))
    body[field] = bytes(raw)
    assert push_rig["receiver"].handle_push(body) is None
    assert push_rig["installed"] == []
