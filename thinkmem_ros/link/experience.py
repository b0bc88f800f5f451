"""The experience record e_t = (s, a, h, y, f) and its versioned msgpack wire codec.

This is the one definition both sides import: the node builds ``Experience`` objects, the
shipper encodes them, the consolidator decodes and stores them. Decoding trusts nothing
that came over the network: every field is checked for presence, exact type, range and
size, and a bad record is refused with an ``ExperienceError`` that names the field, so a
faulty or hostile robot can never push a malformed row into the store.

Wire format (schema version 3): a msgpack map with exactly the keys of ``_FIELDS``.
Older versions are still decoded, so spools and stores written before a field existed stay
readable: version 2 records (no ``signal_set`` key) get ``signal_set = ''``, version 1
records (no ``required`` either) also get ``required = None``. Each version's key set is
exact: a v3 record without ``signal_set`` or a v2 record with it is refused.
The signal window travels as raw little-endian float32 bytes plus its ``[K, F]`` shape;
the mask as one uint8 per cell (1 = observed); probabilities as float32 bytes, one per
label. Dropouts are expressed through the mask, so the window itself must be finite.

Size limits (``LIMITS``) bound what one record may cost the consolidator:
window <= 4096 frames x 64 features, <= 1024 events, <= 256 labels, names <= 64
characters, ids <= 128, action/outcome text <= 4096, reasoning trace <= 65536 characters.
"""

from __future__ import annotations

import itertools
import math
import operator
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

SCHEMA_VERSION = 3
SUPPORTED_VERSIONS = (1, 2, 3)

LIMITS: dict[str, int] = {
    "max_frames": 4096,
    "max_features": 64,
    "max_events": 1024,
    "max_labels": 256,
    "max_name": 64,
    "max_id": 128,
    "max_text": 4096,
    "max_trace": 65536,
}
"""Upper bounds on one record; a record above any of them is refused, never truncated."""

MAX_RECORD_BYTES = 3 * 1024 * 1024
"""Cap on one encoded record, above the most the limits allow (window 1 MiB, mask 256 KiB,
UTF-8 trace <= 256 KiB, names <= 400 KiB, ids and hashes < 1 KiB), so a record is refused
before it is parsed."""

# msgpack's own container limits: twice the field limits, so a near miss still gets the
# error naming its field, and a gross one is refused before it is built
_MAX_STR_BYTES = 2 * 4 * LIMITS["max_trace"]  # the longest text field, as UTF-8
_MAX_LIST = 2 * max(LIMITS["max_events"], LIMITS["max_labels"])
_MAX_MAP = 64  # a record has 19 fields
# all lists and maps of one record together: a valid one has at most ~1,560 entries
# (events, labels, required, shape, fields); checked only above _BUDGET_FROM_BYTES, since
# a smaller record cannot unpack into much more than its own size
_MAX_ELEMENTS = 4096
_BUDGET_FROM_BYTES = 32 * 1024

_ID_RE = re.compile(r"[A-Za-z0-9_.:\-]+")
_NAME_RE = re.compile(r"[A-Za-z0-9_.:\-/]+")
_SHA_RE = re.compile(r"(|[0-9a-f]{64})")


def valid_name(name: object) -> bool:
    """Whether ``name`` can travel as an event or label name in a record.

    One rule for every place that holds names the wire carries (the robot's episode
    history, the consolidator's knowledge units), so a name kept in one is never refused
    by another.
    """
    return (type(name) is str and 0 < len(name) <= LIMITS["max_name"]
            and _NAME_RE.fullmatch(name) is not None)
_SIGNAL_SET_ERROR = ("signal_set: expected '' or the bundle's signal-set fingerprint "
                     "(64 lowercase hex characters)")
_MAX_INT64 = 2**63 - 1


class ExperienceError(ValueError):
    """A record is malformed: the message names the field and what is wrong with it."""


@dataclass(eq=False)
class Experience:
    """One experience e_t = (s situation, a action, h reasoning trace, y outcome, f feedback).

    ``seq`` is the per-robot monotonic sequence number; leave it ``None`` and the
    ``ExperienceShipper`` assigns one that survives restarts. Construction validates,
    so a bad record fails on the robot where it is made, not later on the consolidator.
    """

    robot_id: str
    episode_id: str
    stamp: float  # seconds (ROS time or wall clock) of the situation's last frame
    window: np.ndarray  # (K, F) float32 signal window, oldest frame first
    labels: list[str]  # thinking labels in the bundle's output order
    probabilities: np.ndarray  # (L,) float32, P(g | s_t) per label
    bundle_version: int
    mask: np.ndarray | None = None  # (K, F) 1 = observed, 0 = dropout; None = all observed
    events: list[str] = field(default_factory=list)  # event history, oldest first
    bundle_sha256: str = ""
    action: str | None = None
    trace: str | None = None  # reasoning trace h_t
    outcome: str | float | None = None
    reward: float | None = None  # later feedback f_t
    seq: int | None = None
    # thinking labels that hindsight (trace h_t / feedback f_t) says the situation needed:
    # the g_i of direct material (s_i, g_i); None = unknown (the record feeds discovery only)
    required: list[str] | None = None
    # signal-set fingerprint of the producing bundle (bundle.json ``signal_set``): what the
    # consolidator matches against the lines it serves, so a bundle it never published (one
    # trained on the robot) is accepted when its signals, units and rate are the line's;
    # '' = unknown (the consolidator falls back to the bundle hash, then the window width)
    signal_set: str = ""

    def __post_init__(self) -> None:
        self.window = np.ascontiguousarray(self.window, dtype="<f4")
        self.probabilities = np.ascontiguousarray(self.probabilities, dtype="<f4").reshape(-1)
        if self.mask is not None:
            self.mask = np.ascontiguousarray(self.mask, dtype=np.uint8)
        # numpy scalars from the node are accepted here; the wire decoder is exact.
        self.stamp = _plain(self.stamp)
        self.bundle_version = _plain(self.bundle_version)
        self.reward = _plain(self.reward)
        self.outcome = _plain(self.outcome)
        if self.seq is not None:
            self.seq = _plain(self.seq)
        if isinstance(self.required, tuple):
            self.required = list(self.required)
        _validate(self)

    @property
    def key(self) -> tuple[str, int]:
        """Idempotency key (robot_id, seq) under which the store keeps exactly one copy."""
        if self.seq is None:
            raise ExperienceError("seq: not assigned yet")
        return (self.robot_id, self.seq)

    def with_seq(self, seq: int) -> Experience:
        """Return a copy carrying ``seq`` (arrays shared, not copied)."""
        return _build(_to_wire(self, seq))

    def to_wire(self, seq: int | None = None) -> dict[str, Any]:
        """Return the msgpack-ready map; ``seq`` overrides the record's own sequence number."""
        return _to_wire(self, seq)


_MISSING = object()
_FIELDS: dict[str, tuple[type, ...]] = {
    "v": (int,),
    "robot_id": (str,),
    "episode_id": (str,),
    "seq": (int,),
    "stamp": (float, int),
    "shape": (list,),
    "window": (bytes,),
    "mask": (bytes, type(None)),
    "events": (list,),
    "labels": (list,),
    "probabilities": (bytes,),
    "bundle_version": (int,),
    "bundle_sha256": (str,),
    "action": (str, type(None)),
    "trace": (str, type(None)),
    "outcome": (str, float, int, type(None)),
    "reward": (float, int, type(None)),
    "required": (list, type(None)),
    "signal_set": (str,),
}
_V2_FIELDS = {k: v for k, v in _FIELDS.items() if k != "signal_set"}
_V1_FIELDS = {k: v for k, v in _V2_FIELDS.items() if k != "required"}
_VERSION_FIELDS: dict[int, dict[str, tuple[type, ...]]] = {
    1: _V1_FIELDS, 2: _V2_FIELDS, 3: _FIELDS}


def _signatures(fields: dict[str, tuple[type, ...]]) -> frozenset[tuple[type, ...]]:
    """Every allowed tuple of exact field types (a few hundred), for a one-lookup check."""
    return frozenset(itertools.product(*fields.values()))


# per schema version: (getter of the field values in order, the field names, every valid
# type signature)
_SCHEMAS: dict[int, tuple[Callable[[dict], tuple], frozenset[str], frozenset[tuple]]] = {
    version: (operator.itemgetter(*fields), frozenset(fields), _signatures(fields))
    for version, fields in _VERSION_FIELDS.items()}


_PACKERS = threading.local()  # a Packer per thread: packb would build one per record


def encode_experience(experience: Experience, seq: int | None = None) -> bytes:
    """Serialise one record (schema ``SCHEMA_VERSION``); ``seq`` overrides the record's own."""
    packer = getattr(_PACKERS, "packer", None)
    if packer is None:
        packer = _PACKERS.packer = msgpack.Packer(use_bin_type=True)
    return packer.pack(_to_wire(experience, seq))


def decode_experience(payload: bytes) -> Experience:
    """Parse and fully validate one record; raises ``ExperienceError`` with the reason."""
    result = decode_experiences([payload])[0]
    if isinstance(result, ExperienceError):
        raise result
    return result


def decode_experiences(payloads: Sequence[bytes]) -> list[Experience | ExperienceError]:
    """Parse and fully validate a batch of records; one result per payload, in order.

    The receiver's hot path. Every field gets the same checks as ``Experience``'s
    constructor, but each check runs once (construction does not validate again) and the
    numeric ones (finite window, 0/1 mask, probabilities in [0, 1]) run over the whole
    batch in one numpy call each; only when a batch fails one of them are its records
    checked one by one, to name the bad ones. A bad record becomes an ``ExperienceError``
    in its slot and never affects its neighbours. The arrays of the records are views into
    one read-only array per field and batch (one numpy object per record, not three).
    """
    out: list[Any] = []
    for payload in payloads:
        try:
            out.append(_checked_map(_unpack(payload)))
        except ExperienceError as exc:
            # kept without its traceback: its frames would hold the payload (and what was
            # unpacked of it) in a reference cycle until the next full garbage collection
            exc.__traceback__ = exc.__context__ = exc.__cause__ = None
            out.append(exc)
    return _build_checked(out)


def from_wire(data: Any) -> Experience:
    """Validate a decoded msgpack map and build the ``Experience`` it describes."""
    result = _build_checked([_checked_map(data)])[0]
    if isinstance(result, ExperienceError):
        raise result
    return result


def _unpack(payload: Any) -> Any:
    return unpack_bounded(payload, "payload")


def unpack_bounded(payload: Any, what: str, *, max_str: int = _MAX_STR_BYTES,
                   max_map: int = _MAX_MAP, max_elements: int = _MAX_ELEMENTS,
                   budget_from: int = _BUDGET_FROM_BYTES) -> Any:
    """Unpack untrusted msgpack bytes under a record's bounds; ExperienceError naming ``what``.

    Container limits first: a 3 MB record of one-byte list entries would otherwise unpack
    into millions of objects before any field check could refuse it; each list is bounded
    by msgpack, all of them together by a budget of ``max_elements`` entries, charged only
    for payloads above ``budget_from`` bytes (a smaller one cannot hold a costly shape).
    The delta batches of ``link.delta`` unpack their items with this too.
    """
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise ExperienceError(f"{what}: expected bytes, got {type(payload).__name__}")
    if len(payload) > MAX_RECORD_BYTES:
        raise ExperienceError(f"{what}: {len(payload)} bytes exceeds {MAX_RECORD_BYTES}")
    hooks = {}
    if len(payload) > budget_from:
        budget = [max_elements]

        def charge(container: Any) -> Any:
            budget[0] -= len(container)
            if budget[0] < 0:
                raise _TooManyElements
            return container

        hooks = {"list_hook": charge, "object_hook": charge}
    try:
        return msgpack.unpackb(payload, raw=False, strict_map_key=True, use_list=True,
                               max_str_len=max_str, max_bin_len=MAX_RECORD_BYTES,
                               max_array_len=_MAX_LIST, max_map_len=max_map, max_ext_len=0,
                               **hooks)
    except _TooManyElements:
        raise ExperienceError(f"{what}: more than {max_elements} list or map entries "
                              "in one record") from None
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ExperienceError(f"{what}: not a msgpack record ({type(exc).__name__})") \
            from None


class _TooManyElements(Exception):
    """A record's lists and maps hold more entries than any valid record can."""


def _checked_map(data: Any) -> dict[str, Any]:
    """Check everything but the array values of a wire map; returns it.

    A map of an older version gains the fields it predates: ``signal_set = ''`` (v1, v2)
    and ``required = None`` (v1).
    """
    if type(data) is not dict:
        raise ExperienceError(f"record: expected a map, got {type(data).__name__}")
    version = data.get("v")
    if type(version) is not int or version not in SUPPORTED_VERSIONS:
        raise ExperienceError(
            f"v: schema version {version!r} is not supported; this side reads "
            f"{list(SUPPORTED_VERSIONS)}")
    values, keys, signatures = _SCHEMAS[version]
    # exact types (a bool is not an int here), checked as one tuple in one set lookup;
    # the per-field loop runs only to name what is wrong
    if data.keys() != keys or tuple(map(type, values(data))) not in signatures:
        _explain_fields(data, _VERSION_FIELDS[version])
    if version < 2:
        data["required"] = None
    if version < 3:
        data["signal_set"] = ""
    _check_id("robot_id", data["robot_id"])
    _check_id("episode_id", data["episode_id"])
    _check_range("seq", data["seq"], 0, _MAX_INT64)
    stamp = data["stamp"]
    if not math.isfinite(stamp) or stamp < 0:
        raise ExperienceError(f"stamp: expected a finite number >= 0, got {stamp!r}")
    data["stamp"] = float(stamp)
    _check_shape(data)
    labels = data["labels"]
    _check_names("events", data["events"], LIMITS["max_events"])
    _check_names("labels", labels, LIMITS["max_labels"])
    if len(set(labels)) != len(labels):
        raise ExperienceError("labels: duplicate label names")
    if len(data["probabilities"]) != 4 * len(labels):
        raise ExperienceError(
            f"probabilities: {len(data['probabilities'])} bytes, expected {4 * len(labels)} "
            f"for {len(labels)} labels")
    _check_range("bundle_version", data["bundle_version"], 0, _MAX_INT64)
    sha = data["bundle_sha256"]
    if sha and not _SHA_RE.fullmatch(sha):
        raise ExperienceError("bundle_sha256: expected '' or 64 lowercase hex characters")
    fingerprint = data["signal_set"]
    if fingerprint and not _SHA_RE.fullmatch(fingerprint):
        raise ExperienceError(_SIGNAL_SET_ERROR)
    _check_optional_text("action", data["action"], LIMITS["max_text"])
    _check_optional_text("trace", data["trace"], LIMITS["max_trace"])
    _check_outcome(data["outcome"])
    if data["required"] is not None:
        _check_names("required", data["required"], LIMITS["max_labels"])
    _check_reward(data["reward"])
    return data


def _explain_fields(data: dict[str, Any], fields: dict[str, tuple[type, ...]]) -> None:
    """Raise the error naming the first missing, unknown or mistyped field."""
    for name, types in fields.items():
        value = data.get(name, _MISSING)
        if type(value) not in types:
            if value is _MISSING:
                raise ExperienceError(f"record: missing fields {sorted(set(fields) - set(data))}")
            allowed = "/".join(t.__name__ for t in types)
            raise ExperienceError(f"{name}: expected {allowed}, got {type(value).__name__}")
    unknown = sorted(str(k) for k in set(data) - set(fields))
    raise ExperienceError(f"record: unknown fields {unknown}")


def _check_shape(data: dict[str, Any]) -> None:
    shape = data["shape"]
    if len(shape) != 2 or type(shape[0]) is not int or type(shape[1]) is not int:
        raise ExperienceError(f"shape: expected [frames, features] ints, got {shape!r}")
    frames, features = shape
    _check_range("shape[0] (frames)", frames, 1, LIMITS["max_frames"])
    _check_range("shape[1] (features)", features, 1, LIMITS["max_features"])
    cells = frames * features
    if len(data["window"]) != 4 * cells:
        raise ExperienceError(
            f"window: {len(data['window'])} bytes, expected {4 * cells} for shape {shape}")
    if data["mask"] is not None and len(data["mask"]) != cells:
        raise ExperienceError(
            f"mask: {len(data['mask'])} bytes, expected {cells} for shape {shape}")


_F4 = np.dtype("<f4")
_U1 = np.dtype(np.uint8)
_NUMERIC_CHECKS: tuple[tuple[str, np.dtype, Callable[[np.ndarray], bool], str], ...] = (
    ("window", _F4, lambda a: bool(np.isfinite(a).all()),
     "window: NaN/inf values; mark dropouts in the mask, value 0"),
    ("mask", _U1, lambda a: a.max(initial=0) <= 1, "mask: values must be 0 or 1"),
    ("probabilities", _F4, lambda a: bool(((a >= 0) & (a <= 1)).all()),  # NaN fails both
     "probabilities: every value must be finite and in [0, 1]"),
)


def _build_checked(items: list[Any]) -> list[Experience | ExperienceError]:
    """Check the array values of the checked maps in ``items`` and build their records."""
    arrays = {key: _checked_arrays(items, key, dtype, ok, message)
              for key, dtype, ok, message in _NUMERIC_CHECKS}
    windows, masks, probabilities = arrays["window"], arrays["mask"], arrays["probabilities"]
    return [_assemble(item, windows[i], masks[i], probabilities[i]) if type(item) is dict
            else item for i, item in enumerate(items)]


def _checked_arrays(items: list[Any], key: str, dtype: np.dtype,
                    ok: Callable[[np.ndarray], bool], message: str) -> list[Any]:
    """Arrays of field ``key`` per slot, checked batch-wide; failing maps become errors.

    Records of one shape (the usual batch) get views into one array made from the joined
    bytes; mixed shapes fall back to one ``frombuffer`` per record.
    """
    arrays: list[Any] = [None] * len(items)
    slots = [i for i, item in enumerate(items) if type(item) is dict and item[key] is not None]
    if not slots:
        return arrays
    joined = np.frombuffer(b"".join([items[i][key] for i in slots]), dtype)
    if not ok(joined):
        for i in slots:  # rare: find the offenders
            if not ok(np.frombuffer(items[i][key], dtype)):
                items[i] = ExperienceError(message)
        slots = [i for i in slots if type(items[i]) is dict]
        if not slots:
            return arrays
        joined = np.frombuffer(b"".join([items[i][key] for i in slots]), dtype)
    shapes = {_shape_of(items[i], key) for i in slots}
    if len(shapes) == 1:
        views = list(joined.reshape((len(slots), *shapes.pop())))
        for i, view in zip(slots, views):
            arrays[i] = view
    else:
        for i in slots:
            arrays[i] = np.frombuffer(items[i][key], dtype).reshape(_shape_of(items[i], key))
    return arrays


def _shape_of(data: dict[str, Any], key: str) -> tuple[int, ...]:
    if key == "probabilities":
        return (len(data["labels"]),)
    return (data["shape"][0], data["shape"][1])


def _assemble(data: dict[str, Any], window: np.ndarray, mask: np.ndarray | None,
              probabilities: np.ndarray) -> Experience:
    """Build an ``Experience`` from a fully checked map without validating it again."""
    exp = object.__new__(Experience)
    exp.__dict__ = {  # every dataclass field, as __init__ would set them
        "robot_id": data["robot_id"], "episode_id": data["episode_id"],
        "stamp": data["stamp"], "window": window, "labels": data["labels"],
        "probabilities": probabilities, "bundle_version": data["bundle_version"],
        "mask": mask, "events": data["events"], "bundle_sha256": data["bundle_sha256"],
        "action": data["action"], "trace": data["trace"], "outcome": data["outcome"],
        "reward": data["reward"], "seq": data["seq"], "required": data["required"],
        "signal_set": data["signal_set"]}
    return exp


def _build(data: dict[str, Any]) -> Experience:
    shape = data["shape"]
    if len(shape) != 2 or any(type(n) is not int for n in shape):
        raise ExperienceError(f"shape: expected [frames, features] ints, got {shape!r}")
    frames, features = shape
    _check_range("shape[0] (frames)", frames, 1, LIMITS["max_frames"])
    _check_range("shape[1] (features)", features, 1, LIMITS["max_features"])
    cells = frames * features
    if len(data["window"]) != 4 * cells:
        raise ExperienceError(
            f"window: {len(data['window'])} bytes, expected {4 * cells} for shape {shape}")
    window = np.frombuffer(data["window"], dtype="<f4").reshape(frames, features)
    mask = None
    if data["mask"] is not None:
        if len(data["mask"]) != cells:
            raise ExperienceError(
                f"mask: {len(data['mask'])} bytes, expected {cells} for shape {shape}")
        mask = np.frombuffer(data["mask"], dtype=np.uint8).reshape(frames, features)
    labels = data["labels"]
    probabilities = data["probabilities"]
    if len(probabilities) != 4 * len(labels):
        raise ExperienceError(
            f"probabilities: {len(probabilities)} bytes, expected {4 * len(labels)} "
            f"for {len(labels)} labels")
    return Experience(
        robot_id=data["robot_id"], episode_id=data["episode_id"], seq=data["seq"],
        stamp=float(data["stamp"]), window=window, mask=mask, events=data["events"],
        labels=labels, probabilities=np.frombuffer(probabilities, dtype="<f4"),
        bundle_version=data["bundle_version"], bundle_sha256=data["bundle_sha256"],
        action=data["action"], trace=data["trace"], outcome=data["outcome"],
        reward=data["reward"], required=data.get("required"),
        signal_set=data.get("signal_set", ""))


def _to_wire(exp: Experience, seq: int | None) -> dict[str, Any]:
    seq = exp.seq if seq is None else seq
    if seq is None:
        raise ExperienceError("seq: not assigned; the shipper assigns it before encoding")
    _check_range("seq", seq, 0, _MAX_INT64)
    return {
        "v": SCHEMA_VERSION, "robot_id": exp.robot_id, "episode_id": exp.episode_id,
        "seq": seq, "stamp": exp.stamp, "shape": list(exp.window.shape),
        "window": exp.window.tobytes(),
        "mask": None if exp.mask is None else exp.mask.tobytes(),
        "events": list(exp.events), "labels": list(exp.labels),
        "probabilities": exp.probabilities.tobytes(), "bundle_version": exp.bundle_version,
        "bundle_sha256": exp.bundle_sha256, "action": exp.action, "trace": exp.trace,
        "outcome": exp.outcome, "reward": exp.reward,
        "required": None if exp.required is None else list(exp.required),
        "signal_set": exp.signal_set,
    }


def _validate(exp: Experience) -> None:
    _check_text("robot_id", exp.robot_id, LIMITS["max_id"], _ID_RE)
    _check_text("episode_id", exp.episode_id, LIMITS["max_id"], _ID_RE)
    if exp.seq is not None:
        if type(exp.seq) is not int:
            raise ExperienceError(f"seq: expected int, got {type(exp.seq).__name__}")
        _check_range("seq", exp.seq, 0, _MAX_INT64)
    if type(exp.stamp) not in (float, int) or not math.isfinite(exp.stamp) or exp.stamp < 0:
        raise ExperienceError(f"stamp: expected a finite number >= 0, got {exp.stamp!r}")
    _check_window(exp)
    _check_names("events", exp.events, LIMITS["max_events"])
    _check_names("labels", exp.labels, LIMITS["max_labels"])
    if len(set(exp.labels)) != len(exp.labels):
        raise ExperienceError("labels: duplicate label names")
    probs = exp.probabilities
    if probs.shape != (len(exp.labels),):
        raise ExperienceError(
            f"probabilities: {probs.shape[0]} values for {len(exp.labels)} labels")
    if probs.size and not ((probs >= 0) & (probs <= 1)).all():  # NaN fails both tests
        raise ExperienceError("probabilities: every value must be finite and in [0, 1]")
    if type(exp.bundle_version) is not int:
        raise ExperienceError(
            f"bundle_version: expected int, got {type(exp.bundle_version).__name__}")
    _check_range("bundle_version", exp.bundle_version, 0, _MAX_INT64)
    if type(exp.bundle_sha256) is not str or not _SHA_RE.fullmatch(exp.bundle_sha256):
        raise ExperienceError("bundle_sha256: expected '' or 64 lowercase hex characters")
    if type(exp.signal_set) is not str or not _SHA_RE.fullmatch(exp.signal_set):
        raise ExperienceError(_SIGNAL_SET_ERROR)
    _check_optional_text("action", exp.action, LIMITS["max_text"])
    _check_optional_text("trace", exp.trace, LIMITS["max_trace"])
    _check_outcome(exp.outcome)
    if exp.required is not None:
        _check_names("required", exp.required, LIMITS["max_labels"])
    if exp.reward is not None and type(exp.reward) not in (float, int):
        raise ExperienceError(f"reward: expected a finite number or None, got {exp.reward!r}")
    _check_reward(exp.reward)


MAX_REWARD = 1e15
"""Largest reward magnitude: feedback is a score, and an integer past 2**63 cannot be
stored (one such record stopped the consolidator's receiver on every re-send)."""


LEARNED_REWARD_BOUND = 1.0
"""What learning reads of a reward: clipped to [-1, 1], the range feedback rewards are
defined in (``learned_reward``). The wire admits up to ``MAX_REWARD``; one such record must
not outweigh a fleet's evidence in values or a canary's figures."""


def learned_reward(reward: float) -> float:
    """``reward`` clipped to [-LEARNED_REWARD_BOUND, LEARNED_REWARD_BOUND]."""
    return min(LEARNED_REWARD_BOUND, max(-LEARNED_REWARD_BOUND, float(reward)))


def _check_reward(reward: float | int | None) -> None:
    # abs() first: an int past float range would overflow math.isfinite; NaN compares False
    if reward is not None and not abs(reward) <= MAX_REWARD:
        raise ExperienceError(f"reward: expected a finite number of magnitude at most "
                              f"{MAX_REWARD:g}, or None, got {reward!r}")


def _check_window(exp: Experience) -> None:
    window = exp.window
    if window.ndim != 2:
        raise ExperienceError(f"window: expected (frames, features), got shape {window.shape}")
    frames, features = window.shape
    _check_range("window frames", frames, 1, LIMITS["max_frames"])
    _check_range("window features", features, 1, LIMITS["max_features"])
    if not np.isfinite(window).all():
        raise ExperienceError("window: NaN/inf values; mark dropouts in the mask, value 0")
    if exp.mask is not None:
        if exp.mask.shape != window.shape:
            raise ExperienceError(f"mask: shape {exp.mask.shape} != window {window.shape}")
        if exp.mask.max(initial=0) > 1:
            raise ExperienceError("mask: values must be 0 or 1")


def _plain(value: Any) -> Any:
    """Turn a numpy scalar into the Python number it holds; leave anything else alone."""
    if isinstance(value, np.generic) and not isinstance(value, np.bool_):
        return value.item()
    return value


def _check_range(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ExperienceError(f"{name}: {value} outside [{low}, {high}]")


def _check_text(name: str, value: Any, limit: int, pattern: re.Pattern | None = None) -> None:
    if type(value) is not str:
        raise ExperienceError(f"{name}: expected str, got {type(value).__name__}")
    if not 0 < len(value) <= limit:
        raise ExperienceError(f"{name}: length {len(value)} outside [1, {limit}]")
    if pattern is not None and not pattern.fullmatch(value):
        raise ExperienceError(f"{name}: {value[:80]!r} has characters outside {pattern.pattern}")


def _check_optional_text(name: str, value: Any, limit: int) -> None:
    if value is None:
        return
    if type(value) is not str:
        raise ExperienceError(f"{name}: expected str or None, got {type(value).__name__}")
    if len(value) > limit:
        raise ExperienceError(f"{name}: length {len(value)} exceeds {limit}")


_KNOWN_NAMES: set[str] = set()
_KNOWN_IDS: set[str] = set()
_KNOWN_NAMES_MAX = 65536


def check_robot_id(value: Any) -> str:
    """Return ``value`` if it is a valid robot id (what a record's ``robot_id`` may be).

    The consolidator's allow-list binds keys to robot ids with this same rule, so a key can
    only ever be bound to an id that its records are able to carry.
    """
    _check_text("robot_id", value, LIMITS["max_id"], _ID_RE)
    return value


def check_robot_ids(ids, option: str) -> tuple[str, ...]:
    """``ids`` as a tuple when each is a valid robot id; ValueError naming ``option`` and it.

    For command-line options that list robots (``--robot``, ``--canary-robots``): an id no
    record can carry would bind a key, or wait for a canary, that never reports.
    """
    ids = tuple(ids)
    for robot in ids:
        try:
            check_robot_id(robot)
        except ExperienceError as exc:
            raise ValueError(f"{option} {robot!r}: not a valid robot id ({exc})") from None
    return ids


def _check_id(name: str, value: str) -> None:
    """Check a robot/episode id; ids seen valid before skip the regex (they repeat a lot)."""
    if value in _KNOWN_IDS:
        return
    _check_text(name, value, LIMITS["max_id"], _ID_RE)
    if len(_KNOWN_IDS) < _KNOWN_NAMES_MAX:
        _KNOWN_IDS.add(value)


def _check_names(name: str, values: Any, limit: int) -> None:
    if type(values) is not list:
        raise ExperienceError(f"{name}: expected a list, got {type(values).__name__}")
    if len(values) > limit:
        raise ExperienceError(f"{name}: {len(values)} entries exceed {limit}")
    known = _KNOWN_NAMES
    try:
        if known.issuperset(values):  # the usual case: every name was seen valid before
            return
    except TypeError:  # an unhashable entry: the loop below names it
        pass
    for index, value in enumerate(values):
        if type(value) is str and value in known:  # labels and events repeat in every record
            continue
        _check_text(f"{name}[{index}]", value, LIMITS["max_name"], _NAME_RE)
        if len(known) < _KNOWN_NAMES_MAX:
            known.add(value)


def _check_outcome(outcome: Any) -> None:
    if outcome is None:
        return
    if type(outcome) is str:
        _check_optional_text("outcome", outcome, LIMITS["max_text"])
    elif type(outcome) in (float, int):
        if not math.isfinite(outcome):
            raise ExperienceError(f"outcome: number must be finite, got {outcome!r}")
    else:
        raise ExperienceError(
            f"outcome: expected str, number or None, got {type(outcome).__name__}")
