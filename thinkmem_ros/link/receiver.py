"""Consolidator end of the experience transport: validate, store once, then acknowledge.

The receiver validates a whole batch in one ``decode_experiences`` call (each field checked
once, array values batch-wide), hands the valid records to the store it was given in one
call and acknowledges only after that call returned, so an ACK always means committed. The
store is whatever the consolidator opens (``open_store``): this module defines only what it
must do (``ExperienceSink``), so the wire end never depends on the offboard storage.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import zmq

from thinkmem_ros.link import protocol
from thinkmem_ros.link.experience import Experience, ExperienceError, decode_experiences
from thinkmem_ros.link.protocol import Kind, ProtocolError
from thinkmem_ros.link.security import (
    authorise_clients,
    curve_enabled,
    load_allowed_keys,
    load_curve_keypair,
    release_domain,
)
from thinkmem_ros.link.sockets import RateLimitedLog, TransportError, context

log = logging.getLogger(__name__)


class SinkError(RuntimeError):
    """The store could not take a batch; the receiver does not acknowledge it."""


class ExperienceSink(Protocol):
    """Where received experiences go: one call per batch, committed when it returns."""

    def insert_many(self, rows: list[tuple[Experience, bytes]]) -> tuple[int, int]:
        """Store (record, raw bytes) pairs exactly once; return (stored, duplicates)."""

    def close(self) -> None:
        """Release the store; called on the serving thread when the receiver stops."""



@dataclass
class ReceiverConfig:
    """Consolidator-side receiving settings."""

    bind: str
    db_path: Path | str
    curve: str = "auto"
    server_secret_file: Path | str | None = None  # the consolidator's .key_secret
    allowed_clients: Path | str | set[bytes] | None = None  # .key file, folder, or keys
    max_frame_bytes: int = protocol.MAX_FRAME_BYTES
    poll_s: float = 0.1
    name: str = "consolidator"
    on_stored: Callable[[list[Experience]], None] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.bind or "://" not in self.bind:
            raise ValueError(f"ReceiverConfig.bind must look like tcp://host:port, "
                             f"got {self.bind!r}")
        if not 0 < self.max_frame_bytes <= protocol.MAX_FRAME_BYTES:
            raise ValueError(f"ReceiverConfig.max_frame_bytes must be in "
                             f"(0, {protocol.MAX_FRAME_BYTES}], got {self.max_frame_bytes}")
        if self.poll_s <= 0:
            raise ValueError(f"ReceiverConfig.poll_s must be > 0, got {self.poll_s}")
        have = self.server_secret_file is not None and self.allowed_clients is not None
        self.use_curve = curve_enabled(self.curve, self.bind, have)


@dataclass
class ReceiverStats:
    """What the receiver has seen; refusals of every kind are counted, never silent."""

    frames: int = 0
    batches: int = 0
    stored: int = 0
    duplicates: int = 0
    rejected_records: int = 0
    bad_frames: int = 0
    refused_frames: int = 0
    store_errors: int = 0
    auth_refused: int = 0
    bundle_pushes: int = 0  # BUNDLE_PUSH frames sent (one per robot connection)


class ExperienceReceiver:
    """ROUTER that validates, stores exactly once (commit before ACK) and acknowledges."""

    def __init__(self, config: ReceiverConfig, open_store: Callable[[], ExperienceSink]) -> None:
        self.config = config
        self._open_sink = open_store
        self.stats = ReceiverStats()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._allow = None
        self._domain = f"thinkmem-{id(self):x}"
        self._bad_log = RateLimitedLog(log, 100)
        # robot connections seen (identity -> robot_id), newest last; pushes go to these
        self._peers: collections.OrderedDict[bytes, str] = collections.OrderedDict()
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._latest_push: bytes | None = None
        self._socket = self._bind()
        self.endpoint: str = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        log.info("receiver bound to %s (CURVE %s), store %s", self.endpoint,
                 "on" if config.use_curve else "off", config.db_path)

    def start(self) -> ExperienceReceiver:
        """Serve on a background thread (tests, the consolidator service)."""
        ready = threading.Event()
        errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._serve_thread, args=(ready, errors),
                                        name="experience-receiver", daemon=True)
        self._thread.start()
        if not ready.wait(10.0):
            raise TransportError("receiver did not open its store within 10 s")
        if errors:
            raise TransportError(f"receiver failed to start: {errors[0]}") from errors[0]
        return self

    def push_bundle(self, frame: bytes, timeout_s: float = 10.0) -> int:
        """Send a BUNDLE_PUSH frame to every robot connection seen; returns how many.

        The socket belongs to the serving thread, so the frame is handed to it and this
        waits (at most ``timeout_s``) until it went out. Robots that connect later get the
        latest pushed frame on first contact, so one that was offline still catches up.
        """
        if self._thread is None or not self._thread.is_alive():
            raise TransportError("push_bundle needs a started receiver")
        done: list[int] = []
        sent = threading.Event()
        self._outbox.put((frame, done, sent))
        if not sent.wait(timeout_s):
            raise TransportError(f"bundle push not sent within {timeout_s} s")
        return done[0]

    @property
    def peers(self) -> dict[bytes, str]:
        """Robot connections seen so far (ZeroMQ identity -> robot id)."""
        return dict(self._peers)

    def serve_forever(self) -> None:
        """Serve on the calling thread until ``stop()`` (e.g. from a SIGTERM handler)."""
        store = self._open_store()
        try:
            self._loop(store)
        finally:
            store.close()
            self._close_socket()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Finish the current batch, close the store cleanly and unbind."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    close = stop

    def __enter__(self) -> ExperienceReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _bind(self) -> zmq.Socket:
        cfg = self.config
        socket = context().socket(zmq.ROUTER)
        try:
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.MAXMSGSIZE, 2 * cfg.max_frame_bytes)
            socket.setsockopt(zmq.RCVHWM, 1000)
            socket.setsockopt(zmq.SNDHWM, 1000)
            if cfg.use_curve:
                allowed = cfg.allowed_clients
                keys = allowed if isinstance(allowed, set) else load_allowed_keys(allowed)
                public, secret = load_curve_keypair(cfg.server_secret_file)
                self._allow = authorise_clients(context(), self._domain, keys, cfg.name)
                socket.curve_server = True
                socket.curve_publickey = public
                socket.curve_secretkey = secret
                socket.zap_domain = self._domain.encode()
            socket.bind(cfg.bind)
        except zmq.ZMQError as exc:
            socket.close(0)
            raise TransportError(f"cannot bind receiver to {cfg.bind}: {exc}") from exc
        return socket

    def _open_store(self) -> ExperienceSink:
        try:
            return self._open_sink()
        except SinkError as exc:
            raise TransportError(str(exc)) from exc

    def _serve_thread(self, ready: threading.Event, errors: list[BaseException]) -> None:
        try:
            store = self._open_store()
        except TransportError as exc:
            errors.append(exc)
            ready.set()
            self._close_socket()
            return
        ready.set()
        try:
            self._loop(store)
        except Exception:  # keep the process alive; the loop itself never raises on input
            log.exception("receiver stopped on an unexpected error")
        finally:
            store.close()
            self._close_socket()

    def _close_socket(self) -> None:
        self._socket.close(0)
        if self._allow is not None:
            release_domain(context(), self._domain)

    def _loop(self, store: ExperienceSink) -> None:
        socket = self._socket
        poll_ms = int(self.config.poll_s * 1000)
        while not self._stop.is_set():
            self._send_pushes()
            ready = socket.poll(poll_ms, zmq.POLLIN)
            # refusals happen on the ZAP thread, with no frame ever reaching this socket:
            # copy the count on every turn (at most poll_s late), not only after traffic
            if self._allow is not None:
                self.stats.auth_refused = self._allow.denied
            if not ready:
                continue
            for _ in range(64):
                try:
                    parts = socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._handle(store, parts)

    def _send_pushes(self) -> None:
        while True:
            try:
                frame, done, sent = self._outbox.get_nowait()
            except queue.Empty:
                return
            self._latest_push = frame
            count = sum(self._push_to(identity, frame) for identity in list(self._peers))
            log.info("pushed a bundle (%d bytes) to %d robot connections", len(frame), count)
            done.append(count)
            sent.set()

    def _push_to(self, identity: bytes, frame: bytes) -> bool:
        try:
            self._socket.send_multipart([identity, frame], zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # peer gone: forget it; it gets the bundle when back
            log.debug("bundle push to a peer failed: %s", exc)
            self._peers.pop(identity, None)
            return False
        self.stats.bundle_pushes += 1
        return True

    def _seen(self, identity: bytes, robot_id: str) -> None:
        new = identity not in self._peers
        self._peers[identity] = robot_id
        self._peers.move_to_end(identity)
        while len(self._peers) > 4096:
            self._peers.popitem(last=False)
        if new and self._latest_push is not None:
            self._push_to(identity, self._latest_push)

    def _handle(self, store: ExperienceSink, parts: list[bytes]) -> None:
        self.stats.frames += 1
        if len(parts) != 2:
            self._bad(f"expected [identity, frame], got {len(parts)} parts")
            return
        identity, data = parts
        if len(data) > self.config.max_frame_bytes:
            self._bad(f"frame of {len(data)} bytes exceeds {self.config.max_frame_bytes}")
            return
        try:
            frame = protocol.decode_frame(data)
        except ProtocolError as exc:
            self._bad(str(exc))
            if exc.version is not None and exc.version != protocol.PROTOCOL_VERSION:
                self.stats.refused_frames += 1
                self._reply(identity, protocol.refused(str(exc)))
            return
        if frame.kind is Kind.EXPERIENCE_BATCH:
            self._seen(identity, frame.body["robot_id"])
            self._on_batch(store, identity, frame.body)
        elif frame.kind is Kind.HELLO:
            robot_id = frame.body.get("robot_id")
            if isinstance(robot_id, str):
                self._seen(identity, robot_id)
            self._reply(identity, protocol.encode_frame(Kind.HELLO, {"server": self.config.name}))
        else:
            self.stats.refused_frames += 1
            self._reply(identity, protocol.refused(f"{frame.kind.name} is not served here"))

    def _on_batch(self, store: ExperienceSink, identity: bytes, body: dict) -> None:
        valid: list[tuple[Experience, bytes]] = []
        rejected: list[tuple[int, str]] = []
        items = body["items"]
        for index, experience in enumerate(decode_experiences(items)):
            if isinstance(experience, ExperienceError):
                rejected.append((index, str(experience)))
                continue
            if experience.robot_id != body["robot_id"]:
                rejected.append((index, f"robot_id {experience.robot_id!r} != batch's "
                                        f"{body['robot_id']!r}"))
                continue
            valid.append((experience, items[index]))
        try:
            stored, duplicates = store.insert_many(valid)
        except SinkError as exc:  # no ACK: the robot keeps the batch and re-sends it
            self.stats.store_errors += 1
            log.error("store write failed, batch %s not acknowledged: %s", body["batch"], exc)
            return
        self.stats.batches += 1
        self.stats.stored += stored
        self.stats.duplicates += duplicates
        if rejected:
            self.stats.rejected_records += len(rejected)
            self._bad_log(logging.WARNING, "rejected %d records from %s, first: %s",
                          len(rejected), body["robot_id"], rejected[0][1])
        self._reply(identity, protocol.ack(body["batch"], stored, duplicates, rejected))
        if self.config.on_stored is not None and stored:
            try:
                self.config.on_stored([e for e, _ in valid])
            except Exception:  # a consumer bug must not stop ingestion
                log.exception("on_stored callback failed")

    def _reply(self, identity: bytes, frame: bytes) -> None:
        try:
            self._socket.send_multipart([identity, frame], zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # peer gone or its queue full: it will re-send
            log.debug("reply to a peer failed: %s", exc)

    def _bad(self, reason: str) -> None:
        self.stats.bad_frames += 1
        self._bad_log(logging.WARNING, "dropped bad frame: %s", reason)
