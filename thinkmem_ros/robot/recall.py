"""Episodic recall, robot end: ask the consolidator for past evidence within a deadline.

The robot asks through a DEALER (``RecallClient``) that never waits longer than its
deadline and raises ``RecallError`` otherwise, so the caller keeps the original situation;
``BackgroundRecall`` moves even that wait off the control tick. The index and server live
offboard (``consolidator.recall_server``); the wire format is in ``link.protocol``.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import zmq

from thinkmem_ros.link.protocol import (
    MAX_RECALL_K,
    MAX_RECALL_REPLY_BYTES,
    Kind,
    ProtocolError,
    decode_frame,
    encode_frame,
)
from thinkmem_ros.link.security import (
    SecurityError,
    curve_enabled,
    load_curve_keypair,
    load_curve_public,
)
from thinkmem_ros.link.sockets import context

log = logging.getLogger(__name__)


class RecallError(RuntimeError):
    """Recall did not produce evidence in time (timeout, refusal, bad reply)."""


class RecallClient:
    """Robot-side requester: one outstanding request, a hard deadline, stale replies dropped."""

    def __init__(self, endpoint: str, robot_id: str, deadline_s: float = 0.05, k: int = 4,
                 *, curve: str = "auto", server_public_key: Path | str | bytes | None = None,
                 client_secret_file: Path | str | None = None) -> None:
        """Connect to ``endpoint``; CURVE as the shipping link decides it (``curve_enabled``).

        With CURVE the robot's own key pair (the one it ships with) authenticates it and
        the consolidator's public key authenticates the server: the consolidator answers
        only keys on its allow-list, and only in the name of the robot each is bound to.
        """
        if deadline_s <= 0 or not 1 <= k <= MAX_RECALL_K:
            raise ValueError(f"deadline_s must be > 0 and k in [1, {MAX_RECALL_K}], got "
                             f"{deadline_s}, {k}")
        self.endpoint = endpoint
        self.robot_id = robot_id
        self.deadline_s = deadline_s
        self.k = k
        keys = _curve_keys(curve, endpoint, server_public_key, client_secret_file)
        self.curve = keys is not None
        self._socket = context().socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        if keys is not None:
            self._socket.curve_publickey, self._socket.curve_secretkey, \
                self._socket.curve_serverkey = keys
        self._socket.setsockopt(zmq.SNDHWM, 4)
        # a reply bigger than any legitimate one (a broken or hostile server) drops the
        # connection unread; the request then times out and the caller keeps its situation
        self._socket.setsockopt(zmq.MAXMSGSIZE, MAX_RECALL_REPLY_BYTES)
        try:
            self._socket.connect(endpoint)
        except zmq.ZMQError as exc:  # a '*' port, an unknown scheme: nothing to connect to
            self._socket.close(0)
            raise RecallError(f"cannot connect to {endpoint!r}: {exc}") from exc
        self._next_id = 0
        self.timeouts = 0
        self.bad_frames = 0
        self.stale = 0  # replies and refusals that answered another request (skipped)

    def recall(self, embedding: np.ndarray, robot_id: str | None = None) -> list[dict]:
        """Top-k evidence for ``embedding`` within the deadline; raises RecallError otherwise."""
        self._next_id += 1
        req_id = self._next_id
        emb = np.ascontiguousarray(embedding, dtype="<f4").reshape(-1)
        frame = encode_frame(Kind.RECALL_REQ, {"id": req_id, "robot_id": robot_id or
                                               self.robot_id, "k": self.k,
                                               "embedding": emb.tobytes()})
        try:
            self._socket.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            raise RecallError("recall request not sent: server unreachable (queue full)") \
                from None
        remaining_ms = int(self.deadline_s * 1000)
        clock = _Deadline(self.deadline_s)
        while remaining_ms > 0:
            if not self._socket.poll(remaining_ms, zmq.POLLIN):
                break
            data = self._socket.recv()
            try:
                reply = decode_frame(data)
            except ProtocolError as exc:  # a stray frame: wait on for our reply
                self.bad_frames += 1
                log.debug("recall: undecodable frame skipped: %s", exc)
                remaining_ms = clock.remaining_ms()
                continue
            if _answers(reply, req_id):
                if reply.kind is Kind.REFUSED:
                    raise RecallError(f"recall refused: {reply.body.get('reason')}")
                return checked_evidence(reply.body.get("items"), self.k)
            self.stale += 1  # a late answer (or refusal) to an earlier request
            remaining_ms = clock.remaining_ms()
        self.timeouts += 1
        raise RecallError(f"recall timed out after {self.deadline_s * 1000:.0f} ms")

    def close(self) -> None:
        """Close the socket without lingering."""
        self._socket.close(0)


def _answers(reply, req_id: int) -> bool:
    """Tell whether ``reply`` answers request ``req_id`` (a reply or a refusal naming it).

    Why: a refusal of an earlier, timed-out request arriving late failed the request
    after it; a refusal that names no request cannot be attributed, so it is skipped too
    (the request then times out, as if that server had not answered).
    """
    if reply.kind not in (Kind.RECALL_REP, Kind.REFUSED):
        return False
    rid = reply.body.get("id")
    return type(rid) is int and rid == req_id


_SCHEMES = ("tcp", "ipc", "inproc", "ws", "wss")


def _curve_keys(curve: str, endpoint: str, server_public_key: Path | str | bytes | None,
                client_secret_file: Path | str | None) -> tuple[bytes, bytes, bytes] | None:
    """``(public, secret, server public)`` when CURVE is on; RecallError if keys are bad."""
    if endpoint.split("://", 1)[0] not in _SCHEMES:
        return None  # nothing to connect to: connect() says so in its own words
    try:
        have = server_public_key is not None and client_secret_file is not None
        if not curve_enabled(curve, endpoint, have):
            return None
        public, secret = load_curve_keypair(client_secret_file)
        server = (server_public_key if isinstance(server_public_key, bytes)
                  else load_curve_public(server_public_key))
    except SecurityError as exc:
        raise RecallError(f"recall: {exc}") from exc
    return public, secret, server


_EVIDENCE_FIELDS = {"robot_id": str, "episode_id": str, "seq": int, "stamp": float,
                    "score": float, "labels": list, "reward": float}
_MAX_TEXT = 256


def checked_evidence(items: object, k: int) -> list[dict]:
    """The reply's evidence when every item is what the server sends; else RecallError.

    The node publishes evidence as JSON and the gates read its fields: bytes, NaN, a
    2**64 integer or ten thousand items from a broken or hostile server must be refused
    here, not fail the node's frame (the frame's experience was lost that way).
    """
    if not isinstance(items, list) or len(items) > k:
        raise RecallError(f"bad recall reply: items must be a list of at most {k} maps")
    out = []
    for item in items:
        if not isinstance(item, dict) or set(item) != set(_EVIDENCE_FIELDS):
            raise RecallError("bad recall reply: an item is not an evidence map")
        for name, kind in _EVIDENCE_FIELDS.items():
            value = item[name]
            if name == "reward" and value is None:
                continue
            if not _is_kind(value, kind):
                raise RecallError(f"bad recall reply: {name} {value!r:.40}")
        labels = item["labels"]
        if len(labels) > MAX_RECALL_K * 64 or not all(
                isinstance(x, str) and len(x) <= _MAX_TEXT for x in labels):
            raise RecallError("bad recall reply: labels must be short names")
        out.append(dict(item))
    return out


def _is_kind(value: object, kind: type) -> bool:
    if kind is float:
        return (isinstance(value, int | float) and not isinstance(value, bool)
                and math.isfinite(value) and abs(value) <= 1e300)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63
    if kind is str:
        return isinstance(value, str) and len(value) <= _MAX_TEXT
    return isinstance(value, kind)


class _Deadline:
    def __init__(self, seconds: float) -> None:

        self._clock = time.monotonic
        self._end = self._clock() + seconds

    def remaining_ms(self) -> int:
        return max(0, int((self._end - self._clock()) * 1000))


class BackgroundRecall:
    """Runs recall off the control tick: ``submit`` never blocks, ``take`` polls results.

    At most one request waits; a submit while one is waiting replaces it (the newest
    situation matters). Each result is ``(tag, evidence | None, error | None)``.
    The client is created inside the worker thread (ZeroMQ sockets are not thread-safe).
    Whatever goes wrong there (the client cannot be made, a socket error) answers the
    request as a failure: a dead worker would leave recall silently off and uncounted.
    """

    def __init__(self, make_client: Callable[[], RecallClient]) -> None:
        self._make = make_client
        self._requests: queue.Queue = queue.Queue(maxsize=1)
        self._results: queue.Queue = queue.Queue(maxsize=64)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, name="recall-client", daemon=True)
        self._thread.start()
        self.dropped = 0

    def submit(self, tag: object, embedding: np.ndarray) -> None:
        """Queue a request for ``embedding`` (copied); replaces a still-waiting one."""
        item = (tag, np.array(embedding, dtype=np.float32))
        while True:
            try:
                self._requests.put_nowait(item)
                return
            except queue.Full:
                try:
                    self._requests.get_nowait()
                    self.dropped += 1
                except queue.Empty:
                    pass

    def take(self) -> list[tuple[object, list[dict] | None, str | None]]:
        """Every finished result since the last call (never blocks)."""
        out = []
        while True:
            try:
                out.append(self._results.get_nowait())
            except queue.Empty:
                return out

    def _work(self) -> None:
        client, broken = self._open_client()
        try:
            while not self._stop.is_set():
                try:
                    tag, emb = self._requests.get(timeout=0.05)
                except queue.Empty:
                    continue
                self._put(self._answer(client, broken, tag, emb))
        finally:
            if client is not None:
                client.close()

    def _open_client(self) -> tuple[RecallClient | None, str]:
        """The client, or None and why it could not be made (logged once)."""
        try:
            return self._make(), ""
        except Exception as exc:  # noqa: BLE001 - reported per request, never a dead thread
            reason = f"recall client unavailable: {type(exc).__name__}: {exc}"
            log.error(reason)
            return None, reason

    @staticmethod
    def _answer(client: RecallClient | None, broken: str, tag: object,
                emb: np.ndarray) -> tuple[object, list[dict] | None, str | None]:
        if client is None:
            return tag, None, broken
        try:
            return tag, client.recall(emb), None
        except RecallError as exc:
            return tag, None, str(exc)
        except Exception as exc:  # noqa: BLE001 - a socket error fails this request only
            return tag, None, f"recall failed: {type(exc).__name__}: {exc}"

    def _put(self, result: tuple) -> None:
        try:
            self._results.put_nowait(result)
        except queue.Full:
            self.dropped += 1

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the worker (bounded wait)."""
        self._stop.set()
        self._thread.join(timeout_s)
