"""Versioned wire frames between robots and the consolidator (transport-agnostic).

A frame is a 4-byte header ``b"TM" + version (u8) + kind (u8)`` followed by a msgpack map
whose shape depends on the kind. The header lets a receiver tell a peer speaking another
protocol version (answered with REFUSED) from garbage (dropped and counted) without
parsing the body. Decoding checks size, header and every body field, and raises
``ProtocolError`` for anything else, so the transport never handles half-valid frames.

Kinds:
- HELLO (client <-> server): ``{"robot_id": str}`` / ``{"server": str}``; a liveness probe.
- REFUSED (server -> client): ``{"reason": str}``; the frame was understood but refused.
- EXPERIENCE_BATCH (robot -> consolidator): ``{"batch": int, "robot_id": str,
  "items": [bytes]}``; each item is one ``experience.encode_experience`` record.
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
  ``MAX_FRAME_BYTES`` (the receiver's own inbound limit stays small).
- RECALL_REQ, RECALL_REP: reserved for episodic recall; their bodies are maps checked only
  for shape until that feature defines them.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any

import msgpack

PROTOCOL_VERSION = 1
MAGIC = b"TM"
HEADER_BYTES = 4
MAX_FRAME_BYTES = 32 * 1024 * 1024
"""Largest frame accepted; the receiver also sets ZMQ_MAXMSGSIZE a little above it."""
MAX_BATCH_ITEMS = 8192
MAX_REASON = 512
MAX_ARTEFACTS = 16
MAX_RECALL_K = 64  # evidence items one RECALL_REQ may ask for
"""Most artefact files one BUNDLE_PUSH may carry (a bundle has four today)."""
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
        body = msgpack.unpackb(memoryview(data)[HEADER_BYTES:], raw=False,
                               strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(
            f"frame: {kind.name} body is not msgpack ({type(exc).__name__}: truncated?)",
            version=version) from exc
    _check_body(kind, body)
    return Frame(kind, body)


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
    if kind is Kind.EXPERIENCE_BATCH:
        items = body["items"]
        if not 0 < len(items) <= MAX_BATCH_ITEMS:
            raise ProtocolError(f"EXPERIENCE_BATCH: {len(items)} items outside "
                                f"[1, {MAX_BATCH_ITEMS}]")
        if any(type(item) is not bytes for item in items):
            raise ProtocolError("EXPERIENCE_BATCH.items: every item must be bytes")
    if kind is Kind.ACK:
        for entry in body["rejected"]:
            if (type(entry) is not list or len(entry) != 2 or type(entry[0]) is not int
                    or type(entry[1]) is not str):
                raise ProtocolError("ACK.rejected: entries must be [index, reason]")
    if kind is Kind.BUNDLE_PUSH and "artefacts" in body:
        check_artefacts(body["artefacts"])
    if kind is Kind.HELLO and not any(k in body for k in ("robot_id", "server")):
        raise ProtocolError("HELLO: needs 'robot_id' (client) or 'server' (server)")
