import msgpack
import pytest

from thinkmem_ros.link import protocol
from thinkmem_ros.link.protocol import Kind, ProtocolError, decode_frame


def test_roundtrip_each_kind():
    batch = decode_frame(protocol.experience_batch(7, "r1", [b"a", b"b"]))
    assert batch.kind is Kind.EXPERIENCE_BATCH and batch.body["items"] == [b"a", b"b"]
    ack = decode_frame(protocol.ack(7, 1, 0, [(1, "bad")]))
    assert ack.kind is Kind.ACK and ack.body["rejected"] == [[1, "bad"]]
    assert decode_frame(protocol.hello("r1")).body == {"robot_id": "r1"}
    assert decode_frame(protocol.refused("x" * 2000)).body["reason"] == "x" * 512
    for kind in (Kind.BUNDLE_PUSH, Kind.RECALL_REQ, Kind.RECALL_REP):
        assert decode_frame(protocol.encode_frame(kind, {"any": 1})).kind is kind


def test_kind_values_are_frozen():
    assert [k.value for k in Kind] == [1, 2, 3, 4, 5, 6, 7, 8]


@pytest.mark.parametrize("data, match", [
    (b"", "no thinkmem header"),
    (b"GET / HTTP/1.1", "no thinkmem header"),
    (b"TM", "no thinkmem header"),
    (b"TM\x01\x63" + msgpack.packb({}), "unknown kind"),
    (b"TM\x01\x03" + msgpack.packb({"batch": 1})[:-1], "not msgpack|missing"),
    (b"TM\x01\x03" + msgpack.packb([1, 2]), "must be a map"),
    (b"TM\x01\x03" + msgpack.packb({"batch": 1, "robot_id": "r", "items": []}), "items"),
    (b"TM\x01\x03" + msgpack.packb({"batch": "1", "robot_id": "r", "items": [b"x"]}),
     "batch"),
    (b"TM\x01\x03" + msgpack.packb({"batch": 1, "robot_id": "r", "items": ["s"]}), "bytes"),
    (b"TM\x01\x04" + msgpack.packb({"batch": 1, "stored": 1, "duplicates": 0,
                                    "rejected": [[1]]}), "rejected"),
])
def test_bad_frames_raise_protocol_error(data, match):
    with pytest.raises(ProtocolError, match=match):
        decode_frame(data)


def test_truncated_batch_is_rejected():
    frame = protocol.experience_batch(1, "r1", [b"x" * 100])
    with pytest.raises(ProtocolError):
        decode_frame(frame[:-10])


def test_wrong_version_reports_peer_version():
    frame = bytearray(protocol.hello("r1"))
    frame[2] = 9
    with pytest.raises(ProtocolError, match="version 9") as info:
        decode_frame(bytes(frame))
    assert info.value.version == 9


def test_oversized_frame_rejected_both_ways(monkeypatch):
    monkeypatch.setattr(protocol, "MAX_FRAME_BYTES", 1000)
    with pytest.raises(ProtocolError, match="exceeds"):
        protocol.experience_batch(1, "r1", [b"x" * 2000])
    with pytest.raises(ProtocolError, match="exceeds"):
        decode_frame(b"TM\x01\x03" + b"x" * 2000)


def test_encoder_refuses_invalid_bodies():
    with pytest.raises(ProtocolError, match="missing"):
        protocol.encode_frame(Kind.ACK, {"batch": 1})
