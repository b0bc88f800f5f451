"""Versioned wire frames between robots and the consolidator (transport-agnostic).

A frame is a 4-byte header ``b"TM" + version (u8) + kind (u8)`` followed by a msgpack map
whose shape depends on the kind. The header lets a receiver tell a peer speaking another
protocol version (answered with REFUSED) from garbage (dropped and counted) without
parsing the body. Decoding checks size, header and every body field, and raises
``ProtocolError`` for anything else, so the transport never handles half-valid frames.

Everything that arrives is bounded before it can be kept: msgpack itself refuses any
string, byte string, list or map longer than ``MAX_STR``/``MAX_FRAME_BYTES``/twice
``MAX_BATCH_ITEMS``/``MAX_MAP``, and all lists and maps of a frame together may hold at
most ``MAX_ELEMENTS`` entries (so a frame costs a small multiple of its own size to
decode, whatever its shape); the fields a peer's state keeps (``robot_id``, ``server``,
reasons) have their own limits (``MAX_ID``, ``MAX_REASON``). A 7.9 MB robot id is
refused, not stored.

Kinds:
- HELLO (client <-> server): ``{"robot_id": str}`` / ``{"server": str}`` (<= ``MAX_ID``
  characters); a liveness probe.
- REFUSED (server -> client): ``{"reason": str}`` (<= ``MAX_REASON`` characters); the frame
  was understood but refused.
- EXPERIENCE_BATCH (robot -> consolidator): ``{"batch": int, "robot_id": str,
  "items": [bytes]}``; each item is one ``experience.encode_experience`` record.
- EXPERIENCE_DELTA_BATCH (robot -> consolidator): the same body; each item is a full record
  or a delta against the previous item (``link.delta``), so consecutive records of an
  episode carry each new window row once. Acknowledged like EXPERIENCE_BATCH (rejections
  by item index). A consolidator that predates it drops the frame as an unknown kind (no
  ACK): robots shipping to one turn ``ShipperConfig.delta_batches`` off.
- ACK (consolidator -> robot): ``{"batch": int, "stored": int, "duplicates": int,
  "rejected": [[index, reason]]}``; sent only after the batch is committed to the store.
- BUNDLE_PUSH (consolidator -> robot): ``{"version": int, "manifest": bytes, "onnx": bytes,
  "signature": bytes}`` plus, when the bundle carries value/memctl artefacts, an optional
  ``"artefacts": {filename: bytes}``: a published model bundle's files as they are on disk
  (``signature`` empty = unsigned, which robots refuse). Here it is checked for being a
  map, and ``artefacts`` (when present) for plain, bounded file names and sizes, so no
  frame can name a path outside the bundle folder; ``bundle_receiver`` checks every field
  again on the robot (the files against the signed manifest's hashes) and trusts nothing.
  Frames without ``artefacts`` (older consolidators, artefact-free bundles) still decode.
  Bundles can be MBs; they travel consolidator -> robot only, where the frame limit is
  ``MAX_FRAME_BYTES`` (the receiver's own inbound limit stays small), so a bundle's files
  may total at most ``MAX_BUNDLE_BYTES``.
- RECALL_REQ, RECALL_REP: reserved for episodic recall; their bodies are maps checked only
  for shape until that feature defines them.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any

import msgpack

from thinkmem_ros.link.experience import LIMITS

PROTOCOL_VERSION = 1
MAGIC = b"TM"
HEADER_BYTES = 4
MAX_FRAME_BYTES = 32 * 1024 * 1024
"""Largest frame accepted; the receiver also sets ZMQ_MAXMSGSIZE a little above it. A
BUNDLE_PUSH is the largest frame there is, so this is the one number every bundle size
limit comes from (``MAX_BUNDLE_BYTES``): raising it alone would let robots that predate
the change refuse what the consolidator sends."""
PUSH_ENVELOPE_BYTES = 4096
"""Most bytes a BUNDLE_PUSH adds to the files it carries: header, field names, byte-string
lengths, a 64-bit version and ``MAX_ARTEFACTS`` names of ``MAX_ARTEFACT_NAME`` characters
come to about 1.2 KB, so this bound holds with room to spare."""
MAX_BUNDLE_BYTES = MAX_FRAME_BYTES - PUSH_ENVELOPE_BYTES
"""Largest bundle one push can carry: manifest, ONNX, signature and artefacts together.
The publisher refuses a bigger one before it is signed or linked (a version no robot can
receive must never become ``current``) and the robot's receiver refuses one by default, so
what one side sends the other accepts, by the same number."""
MAX_BATCH_ITEMS = 8192
"""Most records in one EXPERIENCE_BATCH (msgpack refuses any list over twice this)."""
MAX_REASON = 512
"""Longest REFUSED reason or ACK rejection reason, in characters."""
MAX_ID = LIMITS["max_id"]
"""Longest robot id (the experience record's own limit) or server name, in characters."""
MAX_STR = 65536
"""Longest text string anywhere in a frame (bytes of UTF-8), before any field check."""
MAX_MAP = 256
"""Most keys in any map of a frame (bodies have a handful, artefacts ``MAX_ARTEFACTS``)."""
MAX_ELEMENTS = 4 * MAX_BATCH_ITEMS
"""Most list and map entries in one frame, all containers together (an ACK rejecting a
whole batch of the largest size needs 3 per record)."""
MAX_ARTEFACTS = 16
"""Most artefact files one BUNDLE_PUSH may carry (a bundle has four today)."""
MAX_RECALL_K = 64  # evidence items one RECALL_REQ may ask for
MAX_RECALL_REQUEST_BYTES = 256 * 1024
"""Largest RECALL_REQ the recall server reads (ZMQ_MAXMSGSIZE): an embedding of up to
65,536 float32 values and its envelope; a bigger frame drops its connection unread."""
MAX_RECALL_REPLY_BYTES = 4 * 1024 * 1024
"""Largest RECALL_REP the robot reads (ZMQ_MAXMSGSIZE): ``MAX_RECALL_K`` evidence maps at
up to 64 KiB each; a bigger reply drops the connection and the request times out."""
MAX_ARTEFACT_NAME = 64
RESERVED_NAMES = frozenset({"bundle.json", "policy.onnx", "bundle.sig"})
"""The bundle's own files, which travel in their own fields and are never artefacts."""
_ARTEFACT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class ProtocolError(ValueError):
    """A frame is garbage, truncated, oversized, of another version, or has a bad body."""

    def __init__(self, message: str, *, version: int | None = None) -> None:
        super().__init__(message)
        self.version = version  # the peer's protocol version when the header was readable


class Kind(enum.IntEnum):
    """Message kinds; the numeric values are part of the wire format and never change."""

    HELLO = 1
    REFUSED = 2
    EXPERIENCE_BATCH = 3
    ACK = 4
    BUNDLE_PUSH = 5
    RECALL_REQ = 6
    RECALL_REP = 7
    EXPERIENCE_DELTA_BATCH = 8


@dataclass(frozen=True)
class Frame:
    """A decoded frame: its kind and validated body."""

    kind: Kind
    body: dict[str, Any]


def encode_frame(kind: Kind, body: dict[str, Any]) -> bytes:
    """Serialise a frame after checking its body, so a sender cannot emit what we reject."""
    _check_body(Kind(kind), body)
    data = MAGIC + bytes((PROTOCOL_VERSION, int(kind))) + msgpack.packb(body, use_bin_type=True)
    if len(data) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
    return data


def decode_frame(data: bytes) -> Frame:
    """Parse and validate one frame; raises ``ProtocolError`` naming what is wrong."""
    if len(data) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
    if len(data) < HEADER_BYTES or data[:2] != MAGIC:
        raise ProtocolError("frame: no thinkmem header (garbage or truncated)")
    version, kind_id = data[2], data[3]
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"frame: protocol version {version}, this side speaks {PROTOCOL_VERSION}",
            version=version)
    try:
        kind = Kind(kind_id)
    except ValueError:
        raise ProtocolError(f"frame: unknown kind {kind_id}", version=version) from None
    try:
        body = _unpack_body(memoryview(data)[HEADER_BYTES:])
    except ProtocolError as exc:
        exc.version = version
        raise
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(
            f"frame: {kind.name} body is not msgpack ({type(exc).__name__}: truncated?)",
            version=version) from exc
    _check_body(kind, body)
    return Frame(kind, body)


def _unpack_body(view: memoryview) -> Any:
    """Unpack a frame body, building at most ``MAX_ELEMENTS`` list and map entries in all.

    ``msgpack`` checks each container's length but not how many there are: a 30 MB frame
    of one-byte list entries would become hundreds of MB of Python objects before any
    field check could refuse it. Every list and map, once built, is charged to one budget
    for the frame (the hooks run as each container completes), so decoding stops after a
    few containers of such a bomb, having built a fraction of the frame's size.
    """
    budget = [MAX_ELEMENTS]

    def charge(container: Any) -> Any:
        budget[0] -= len(container)
        if budget[0] < 0:
            raise ProtocolError(f"frame: body holds more than {MAX_ELEMENTS} list or map "
                                "entries")
        return container

    return msgpack.unpackb(view, raw=False, strict_map_key=True, use_list=True,
                           list_hook=charge, object_hook=charge, max_str_len=MAX_STR,
                           max_bin_len=MAX_FRAME_BYTES, max_array_len=2 * MAX_BATCH_ITEMS,
                           max_map_len=MAX_MAP, max_ext_len=0)


def hello(robot_id: str) -> bytes:
    """Build a HELLO from a robot."""
    return encode_frame(Kind.HELLO, {"robot_id": robot_id})


def refused(reason: str) -> bytes:
    """Build a REFUSED reply carrying the reason (trimmed to ``MAX_REASON``)."""
    return encode_frame(Kind.REFUSED, {"reason": reason[:MAX_REASON]})


def experience_batch(batch: int, robot_id: str, items: list[bytes]) -> bytes:
    """Build an EXPERIENCE_BATCH of encoded experience records."""
    return encode_frame(Kind.EXPERIENCE_BATCH,
                        {"batch": batch, "robot_id": robot_id, "items": items})


def experience_delta_batch(batch: int, robot_id: str, items: list[bytes]) -> bytes:
    """Build an EXPERIENCE_DELTA_BATCH of ``delta.encode_items`` items."""
    return encode_frame(Kind.EXPERIENCE_DELTA_BATCH,
                        {"batch": batch, "robot_id": robot_id, "items": items})


def ack(batch: int, stored: int, duplicates: int,
        rejected: list[tuple[int, str]] | None = None) -> bytes:
    """Build an ACK for a committed batch."""
    return encode_frame(Kind.ACK, {
        "batch": batch, "stored": stored, "duplicates": duplicates,
        "rejected": [[i, reason[:MAX_REASON]] for i, reason in (rejected or [])]})


def bundle_push(version: int, manifest: bytes, onnx: bytes, signature: bytes,
                artefacts: dict[str, bytes] | None = None) -> bytes:
    """Build a BUNDLE_PUSH carrying a bundle's manifest, ONNX, signature and artefact bytes.

    ``artefacts`` is left out of the frame when empty, so a robot running an older
    receiver (which wants exactly the four base fields) still installs artefact-free
    bundles.
    """
    body: dict[str, Any] = {"version": version, "manifest": manifest, "onnx": onnx,
                            "signature": signature}
    if artefacts:
        body["artefacts"] = dict(artefacts)
    return encode_frame(Kind.BUNDLE_PUSH, body)


def check_artefact_name(name: object) -> str:
    """Return ``name`` if it is a plain file name fit to create inside a bundle folder.

    Only ``[A-Za-z0-9_.-]`` (no separators, no leading dot, no ``..``), at most
    ``MAX_ARTEFACT_NAME`` characters and none of the bundle's own files: the receiver
    writes these names under its staging folder, so anything else could escape it or
    overwrite the signed files.
    """
    if type(name) is not str:
        raise ProtocolError(f"artefact name must be a str, got {type(name).__name__}")
    if (len(name) > MAX_ARTEFACT_NAME or not _ARTEFACT_NAME.fullmatch(name) or ".." in name
            or name in RESERVED_NAMES):
        raise ProtocolError(f"artefact name {name[:MAX_ARTEFACT_NAME + 8]!r} is not a plain "
                            f"file name (letters, digits, '_.-', no '..', no bundle file)")
    return name


def check_artefacts(artefacts: object) -> dict[str, bytes]:
    """Validate a BUNDLE_PUSH ``artefacts`` map: bounded count and size, safe names, bytes."""
    if type(artefacts) is not dict:
        raise ProtocolError(f"BUNDLE_PUSH.artefacts: expected map, got "
                            f"{type(artefacts).__name__}")
    if len(artefacts) > MAX_ARTEFACTS:
        raise ProtocolError(f"BUNDLE_PUSH.artefacts: {len(artefacts)} files exceed "
                            f"{MAX_ARTEFACTS}")
    total = 0
    for name, data in artefacts.items():
        check_artefact_name(name)
        if type(data) is not bytes:
            raise ProtocolError(f"BUNDLE_PUSH.artefacts[{name!r}]: expected bytes, got "
                                f"{type(data).__name__}")
        total += len(data)
    if total > MAX_FRAME_BYTES:
        raise ProtocolError(f"BUNDLE_PUSH.artefacts: {total} bytes exceed {MAX_FRAME_BYTES}")
    return artefacts


_SCHEMAS: dict[Kind, dict[str, tuple[type, ...]]] = {
    Kind.HELLO: {},
    Kind.REFUSED: {"reason": (str,)},
    Kind.EXPERIENCE_BATCH: {"batch": (int,), "robot_id": (str,), "items": (list,)},
    Kind.ACK: {"batch": (int,), "stored": (int,), "duplicates": (int,), "rejected": (list,)},
    Kind.BUNDLE_PUSH: {},  # fields checked by bundle_receiver, which trusts nothing
    Kind.RECALL_REQ: {},
    Kind.RECALL_REP: {},
    Kind.EXPERIENCE_DELTA_BATCH: {"batch": (int,), "robot_id": (str,), "items": (list,)},
}


def _check_body(kind: Kind, body: Any) -> None:
    if not isinstance(body, dict):
        raise ProtocolError(f"{kind.name}: body must be a map, got {type(body).__name__}")
    for name, types in _SCHEMAS[kind].items():
        if name not in body:
            raise ProtocolError(f"{kind.name}: missing field {name!r}")
        if type(body[name]) not in types:
            raise ProtocolError(
                f"{kind.name}.{name}: expected {types[0].__name__}, "
                f"got {type(body[name]).__name__}")
    if kind in (Kind.EXPERIENCE_BATCH, Kind.EXPERIENCE_DELTA_BATCH):
        _check_count(kind, "batch", body["batch"])
        _check_text(kind, "robot_id", body["robot_id"], MAX_ID)
        items = body["items"]
        if not 0 < len(items) <= MAX_BATCH_ITEMS:
            raise ProtocolError(f"{kind.name}: {len(items)} items outside "
                                f"[1, {MAX_BATCH_ITEMS}]")
        if any(type(item) is not bytes for item in items):
            raise ProtocolError(f"{kind.name}.items: every item must be bytes")
    elif kind is Kind.ACK:
        for name in ("batch", "stored", "duplicates"):
            _check_count(kind, name, body[name])
        if len(body["rejected"]) > MAX_BATCH_ITEMS:
            raise ProtocolError(f"ACK.rejected: {len(body['rejected'])} entries exceed "
                                f"{MAX_BATCH_ITEMS}")
        for entry in body["rejected"]:
            if (type(entry) is not list or len(entry) != 2 or type(entry[0]) is not int
                    or type(entry[1]) is not str or len(entry[1]) > MAX_REASON):
                raise ProtocolError(f"ACK.rejected: entries must be [index, reason of at "
                                    f"most {MAX_REASON} characters]")
    elif kind is Kind.REFUSED:
        _check_text(kind, "reason", body["reason"], MAX_REASON, empty=True)
    elif kind is Kind.HELLO:
        if not any(k in body for k in ("robot_id", "server")):
            raise ProtocolError("HELLO: needs 'robot_id' (client) or 'server' (server)")
        for name in ("robot_id", "server"):
            if name in body:
                _check_text(kind, name, body[name], MAX_ID)
    elif kind is Kind.BUNDLE_PUSH and "artefacts" in body:
        check_artefacts(body["artefacts"])


def _check_text(kind: Kind, name: str, value: Any, limit: int, empty: bool = False) -> None:
    if type(value) is not str:
        raise ProtocolError(f"{kind.name}.{name}: expected str, got {type(value).__name__}")
    if len(value) > limit or (not value and not empty):
        raise ProtocolError(f"{kind.name}.{name}: length {len(value)} outside "
                            f"[{0 if empty else 1}, {limit}]")


def _check_count(kind: Kind, name: str, value: int) -> None:
    if not 0 <= value < 2**63:
        raise ProtocolError(f"{kind.name}.{name}: {value} outside [0, 2**63)")
