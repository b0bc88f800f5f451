"""Delta-encoded experience batches: each record once, each frame of a window once.

Consecutive experiences of one episode repeat almost all of each other: the K x F window
slides by the frames between two experiences (31 of 32 rows are the previous window's at
``ship_every_n_frames = 1``), and labels, ids, hashes, signal set and most of the event
history are the same. An EXPERIENCE_DELTA_BATCH therefore carries, per item, either a
full record (``experience.encode_experience`` bytes, unchanged) or a DELTA against the
PREVIOUS item of the same batch, a msgpack map:

- ``"d": 1`` marks a delta (format version); a full record never has this key.
- Every record field (``v``, ``robot_id``, ..., ``signal_set``) equal to the base's is
  omitted; a present key replaces the base's value. ``seq`` is omitted when it is the
  base's + 1.
- ``"s": shift, "r": rows``: the window is the base's last K - s rows followed by ``s`` new
  rows (``s * F`` float32 little-endian); used only when those K - s rows are the same
  float32 bytes. Otherwise ``"window"`` (and ``"shape"`` if it changed) in full.
- mask: omitted when equal to the base's; ``"m": rows`` = shifted like the window (``s * F``
  uint8 new rows); else ``"mask"`` in full (bytes or None).
- events: omitted when equal; ``"x": n, "a": [...]`` = the base's events without the
  oldest ``n``, then ``a`` (the history grows by appending and is capped by dropping the
  oldest); else ``"events"`` in full.
- ``"t"`` (stamp) and ``"p"`` (probabilities) are always sent: they change every frame.
  The keys every delta carries are one letter: at ~110 bytes a delta, ``"probabilities"``
  spelled out would cost a tenth of it.

A record of another robot or episode, or of another window shape, is sent in full: a delta
across an episode boundary would save little and tie two unrelated records together.

Decoding (``expand_items``) trusts nothing: a delta without a base (first item), whose base
was rejected, with unknown keys, wrong types, a shift outside [0, K], rows of the wrong
length, or rebuilding more than ``MAX_REBUILT_BYTES`` for the batch becomes an
``ExperienceError`` in its slot, and so does every delta that depends on it; the rest of
the batch is unaffected. The rebuilt records are packed back into full record bytes (for
a record the robot encoded, exactly the bytes it would have sent in a plain
EXPERIENCE_BATCH), then validated by ``decode_experiences`` like any other record, so the
store sees exactly what a plain batch would have given it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from thinkmem_ros.link.experience import (
    LIMITS,
    Experience,
    ExperienceError,
    decode_experiences,
    unpack_bounded,
)

DELTA_VERSION = 1
MAX_REBUILT_BYTES = 32 * 1024 * 1024
"""Most full-record bytes one delta batch may rebuild into: a delta of a few bytes can stand
for a 3 MB record, so without this bound a small frame could cost the receiver GBs. A
shipper's batch holds at most ``max_batch_bytes`` (1 MiB) of full records plus one, far
below it."""

_RECORD_KEYS = ("v", "robot_id", "episode_id", "seq", "stamp", "shape", "window", "mask",
                "events", "labels", "probabilities", "bundle_version", "bundle_sha256",
                "action", "trace", "outcome", "reward", "required", "signal_set")
# fields carried as "omitted when equal to the base's" (the rest have their own rules)
_PLAIN_KEYS = tuple(k for k in _RECORD_KEYS
                    if k not in ("seq", "stamp", "shape", "window", "mask", "events",
                                 "probabilities"))
_RECORD_KEY_SET = frozenset(_RECORD_KEYS)
# the delta's own keys, and the fields every delta carries, are one letter on the wire
_SHORT = {"stamp": "t", "probabilities": "p", "shift": "s", "rows": "r", "mrows": "m",
          "edrop": "x", "eadd": "a"}
_LONG = {short: long for long, short in _SHORT.items()}
_DELTA_KEYS = frozenset(("d", *_LONG, *(k for k in _RECORD_KEYS if k not in _SHORT)))
_ABSENT = object()
_EDROP_CANDIDATES = 8  # drop counts tried when the event history is not a pure append
_MAX_STR = 2 * 4 * LIMITS["max_trace"]
_MAX_LIST = 2 * max(LIMITS["max_events"], LIMITS["max_labels"])
_MAX_ELEMENTS = 4096


def _unpack(payload: Any) -> Any:
    """Unpack one item under a record's own bounds (sizes and container entries)."""
    return unpack_bounded(payload, "item", max_str=_MAX_STR, max_map=64,
                          max_elements=_MAX_ELEMENTS, budget_from=0)


def _same(a: Any, b: Any) -> bool:
    """Equal values of the same type (so 1 and 1.0, or 0 and False, never count as equal)."""
    return type(a) is type(b) and a == b


def _shift_of(new: bytes, old: bytes, row: int) -> int | None:
    """Smallest s < K with ``new[:K-s] == old[s:]`` (rows of ``row`` bytes), or None.

    Candidates are where ``new``'s first row occurs in ``old`` at a row boundary, found by
    ``bytes.find`` (one C scan: a window that does not slide costs one pass, not K
    comparisons).
    """
    if len(new) != len(old) or row <= 0 or not new:
        return None
    first = new[:row]
    at = old.find(first)
    while at >= 0:
        if at % row == 0 and new[:len(new) - at] == old[at:]:
            return at // row
        at = old.find(first, at + 1)
    return None


def _events_delta(new: list, old: list) -> dict[str, Any]:
    """``{}`` if equal, ``{edrop, eadd}`` if ``new`` = old[n:] + added, else ``{events}``."""
    if new == old:
        return {}
    candidates = [0] + [i for i, name in enumerate(old) if i and new
                        and name == new[0]][:_EDROP_CANDIDATES]
    for drop in candidates:
        keep = len(old) - drop
        if keep <= len(new) and new[:keep] == old[drop:]:
            return {"edrop": drop, "eadd": new[keep:]}
    return {"events": new}


def delta_item(record: dict[str, Any], base: dict[str, Any]) -> dict[str, Any] | None:
    """The delta map of ``record`` against ``base`` (two wire maps), or None = send in full."""
    if not (_same(record["robot_id"], base["robot_id"])
            and _same(record["episode_id"], base["episode_id"])
            and record["shape"] == base["shape"] and record.keys() == base.keys()):
        return None
    out: dict[str, Any] = {"d": DELTA_VERSION}
    for key in _PLAIN_KEYS:  # an older record lacks some (same keys as its base: checked)
        value = record.get(key, _ABSENT)
        old = base.get(key)
        # _same, inlined: this loop runs for every record the robot ships
        if value is not _ABSENT and not (type(value) is type(old) and value == old):
            out[key] = value
    if record["seq"] != base["seq"] + 1:
        out["seq"] = record["seq"]
    features = record["shape"][1]
    shift = _shift_of(record["window"], base["window"], 4 * features)
    if shift is None:
        out["window"] = record["window"]
    else:
        out["shift"] = shift
        out["rows"] = record["window"][len(record["window"]) - 4 * features * shift:]
    mask, base_mask = record["mask"], base["mask"]
    if not _same(mask, base_mask):
        cells = features * (shift or 0)
        if (shift is not None and type(mask) is bytes and type(base_mask) is bytes
                and mask[:len(mask) - cells] == base_mask[cells:]):
            out["mrows"] = mask[len(mask) - cells:]
        else:
            out["mask"] = mask
    out.update(_events_delta(record["events"], base["events"]))
    out["probabilities"] = record["probabilities"]
    out["stamp"] = record["stamp"]
    return {_SHORT.get(key, key): value for key, value in out.items()}


def encode_items(records: Sequence[bytes]) -> list[bytes]:
    """Delta-encode encoded records (in batch order) into EXPERIENCE_DELTA_BATCH items.

    The first record, and each one that cannot be a delta of its predecessor (another
    robot, episode or window shape), is sent as its own bytes, unchanged.
    """
    packer = msgpack.Packer(use_bin_type=True)
    out: list[bytes] = []
    base = None
    for payload in records:
        try:
            record = msgpack.unpackb(payload, raw=False, strict_map_key=True)
            delta = None if base is None else delta_item(record, base)
        except (ValueError, TypeError, KeyError):  # msgpack's errors are ValueErrors too:
            # not a record this side encoded (a damaged spool row?) goes as it is, and the
            # receiver judges it
            record = delta = None
        out.append(payload if delta is None else packer.pack(delta))
        base = record if type(record) is dict else None
    return out


def _rebuild(delta: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The full wire map a delta stands for; raises ``ExperienceError`` naming the problem."""
    if delta.get("d") != DELTA_VERSION or type(delta["d"]) is not int:
        raise ExperienceError(f"delta: format {delta.get('d')!r} is not {DELTA_VERSION}")
    unknown = sorted(str(k) for k in set(delta) - _DELTA_KEYS)
    if unknown:
        raise ExperienceError(f"delta: unknown fields {unknown}")
    delta = {_LONG.get(key, key): value for key, value in delta.items()}
    if type(delta.get("stamp")) not in (float, int):
        raise ExperienceError("delta: the stamp (t) must be sent as a number in every delta")
    if not set(base) <= _RECORD_KEY_SET:
        raise ExperienceError("delta: its base is not a record")
    out = {key: delta.get(key, base[key]) for key in base}
    for key in _RECORD_KEYS:  # a delta may add a field its (older) base predates
        if key in delta and key not in out:
            out[key] = delta[key]
    if "seq" not in delta:
        seq = base.get("seq")
        if type(seq) is not int:
            raise ExperienceError("delta: base seq is not an int")
        out["seq"] = seq + 1
    if type(delta.get("probabilities")) is not bytes:
        raise ExperienceError("delta: probabilities (p) must be sent as bytes in every delta")
    _rebuild_window(delta, base, out)
    _rebuild_events(delta, base, out)
    return out


def _rebuild_window(delta: dict[str, Any], base: dict[str, Any], out: dict[str, Any]) -> None:
    if "shift" not in delta:
        for key in ("rows", "mrows"):
            if key in delta:
                raise ExperienceError(f"delta: {key} without shift")
        return
    if "window" in delta or "shape" in delta:
        raise ExperienceError("delta: shift together with a full window or shape")
    shape, window = base.get("shape"), base.get("window")
    if (type(shape) is not list or len(shape) != 2 or any(type(n) is not int for n in shape)
            or type(window) is not bytes or not 0 < shape[1] <= LIMITS["max_features"]
            or len(window) != 4 * shape[0] * shape[1]):
        raise ExperienceError("delta: base window is not a valid [frames, features] window")
    frames, features = shape
    shift, rows = delta["shift"], delta.get("rows")
    if type(shift) is not int or not 0 <= shift <= frames:
        raise ExperienceError(f"delta: shift {shift!r} outside [0, {frames}]")
    if type(rows) is not bytes or len(rows) != 4 * features * shift:
        raise ExperienceError(f"delta: rows must be {4 * features * shift} bytes for shift "
                              f"{shift} x {features} features, got "
                              f"{len(rows) if type(rows) is bytes else type(rows).__name__}")
    out["window"] = window[4 * features * shift:] + rows
    if "mrows" in delta:
        if "mask" in delta:
            raise ExperienceError("delta: mrows together with a full mask")
        mask, mrows = base.get("mask"), delta["mrows"]
        if type(mask) is not bytes or len(mask) != frames * features:
            raise ExperienceError("delta: mrows against a base without a valid mask")
        if type(mrows) is not bytes or len(mrows) != features * shift:
            raise ExperienceError(f"delta: mrows must be {features * shift} bytes")
        out["mask"] = mask[features * shift:] + mrows


def _rebuild_events(delta: dict[str, Any], base: dict[str, Any], out: dict[str, Any]) -> None:
    if "edrop" not in delta and "eadd" not in delta:
        return
    if "events" in delta:
        raise ExperienceError("delta: edrop/eadd together with full events")
    drop, add, events = delta.get("edrop"), delta.get("eadd"), base.get("events")
    if type(events) is not list:
        raise ExperienceError("delta: base events are not a list")
    if type(drop) is not int or not 0 <= drop <= len(events):
        raise ExperienceError(f"delta: edrop {drop!r} outside [0, {len(events)}]")
    if type(add) is not list:
        raise ExperienceError(f"delta: eadd must be a list, got {type(add).__name__}")
    if len(events) - drop + len(add) > LIMITS["max_events"]:
        raise ExperienceError(f"delta: events would exceed {LIMITS['max_events']}")
    out["events"] = events[drop:] + add


def expand_items(items: Sequence[Any]) -> tuple[list[bytes | ExperienceError], list[bool]]:
    """Full record bytes (or the error refusing it) per item, and which items are deltas.

    Only the delta layer is checked here (the records themselves are validated by
    ``decode_items``); a delta whose base failed here is refused too.
    """
    packer = msgpack.Packer(use_bin_type=True)
    out: list[bytes | ExperienceError] = []
    deltas: list[bool] = []
    base: dict[str, Any] | None = None
    total = 0
    for index, item in enumerate(items):
        is_delta = False
        try:
            data = _unpack(item)
            if type(data) is not dict:
                raise ExperienceError(f"item: expected a map, got {type(data).__name__}")
            is_delta = "d" in data
            if not is_delta:
                full = item
            elif base is None:
                raise ExperienceError("delta: its base (the previous item) is missing or "
                                      "was rejected" if index else
                                      "delta: the first item of a batch must be a full record")
            else:
                data = _rebuild(data, base)
                full = packer.pack(data)
            total += len(full)
            if total > MAX_REBUILT_BYTES:
                raise ExperienceError(f"delta: batch rebuilds into more than "
                                      f"{MAX_REBUILT_BYTES} bytes")
        except ExperienceError as exc:
            exc.__traceback__ = exc.__context__ = exc.__cause__ = None
            error: ExperienceError = exc
        except Exception as exc:  # a hostile item (e.g. a seq past 2**64) must not crash
            error = ExperienceError(f"delta: malformed ({type(exc).__name__})")
        else:
            out.append(full)
            deltas.append(is_delta)
            base = data
            continue
        out.append(error)
        deltas.append(is_delta)
        base = None
    return out, deltas


def decode_items(items: Sequence[Any], robot_id: str | None = None
                 ) -> list[tuple[Experience, bytes] | ExperienceError]:
    """Rebuild and validate a delta batch: ``(record, full bytes)`` or the error, per item.

    Records are validated by ``decode_experiences`` exactly as in a plain batch (and, given
    ``robot_id``, must be that robot's); a delta whose base record was refused is refused
    as well (it was built on a record the store will not have).
    """
    expanded, deltas = expand_items(items)
    slots = [i for i, full in enumerate(expanded) if type(full) is bytes]
    decoded = decode_experiences([expanded[i] for i in slots])
    out: list[Any] = list(expanded)
    for i, result in zip(slots, decoded):
        if isinstance(result, ExperienceError):
            out[i] = result
        elif robot_id is not None and result.robot_id != robot_id:
            out[i] = ExperienceError(f"robot_id {result.robot_id!r} != batch's {robot_id!r}")
        else:
            out[i] = (result, expanded[i])
    for i in range(1, len(out)):
        if isinstance(out[i - 1], ExperienceError) and not isinstance(out[i], ExperienceError) \
                and deltas[i]:
            out[i] = ExperienceError(f"delta: its base (item {i - 1}) was rejected")
    return out

