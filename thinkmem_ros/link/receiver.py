"""Consolidator end of the experience transport: validate, store once, then acknowledge.

The receiver validates a whole batch in one ``decode_experiences`` call (each field checked
once, array values batch-wide), hands the valid records to the store it was given in one
call and acknowledges only after that call returned, so an ACK always means committed. A
delta batch (EXPERIENCE_DELTA_BATCH, ``link.delta``) is first rebuilt into full records,
which then go through the very same validation and store call. The
store is whatever the consolidator opens (``open_store``): this module defines only what it
must do (``ExperienceSink``), so the wire end never depends on the offboard storage.

Identity (with CURVE): the allow-list binds every client key to one robot id, and ZAP
stamps each message with its sender's key (``User-Id``). Every HELLO and batch is checked
against it: a key that speaks in another robot's name gets REFUSED (never an ACK, which
would make the real robot delete rows it still needs) and is counted in
``identity_refused``. The allow-list is re-read when its files change (every
``allow_reload_s``): a revoked key is refused from its next message on, its connections
are dropped from the push list, and new handshakes with it fail; a list that no longer
parses admits nobody until it is fixed (a revocation must never be undone by a typo).
Without CURVE (loopback development) the robot id is whatever the peer says.

Per-peer state is bounded: at most ``MAX_PEERS`` connections are remembered, each with a
ZeroMQ identity (<= 255 bytes), a robot id (<= ``protocol.MAX_ID``) and a key.

Pushes go to every robot connection, or to the robots a ``robots`` predicate selects
(a canary: ``consolidator.canary``). A robot that connects later gets the newest push
meant for it: the newest subset push whose predicate takes its robot id, else the newest
push to all; a push to all supersedes the subset pushes before it.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import zmq

from thinkmem_ros.link import delta, protocol
from thinkmem_ros.link.experience import Experience, ExperienceError, decode_experiences
from thinkmem_ros.link.protocol import Kind, ProtocolError
from thinkmem_ros.link.security import (
    AllowList,
    SecurityError,
    allow_list_signature,
    authorise_clients,
    curve_enabled,
    load_allow_list,
    load_curve_keypair,
    release_domain,
    tcp_port_problem,
)
from thinkmem_ros.link.sockets import (
    RateLimitedLog,
    TransportError,
    context,
    release_freed_memory,
)

log = logging.getLogger(__name__)

MAX_PEERS = 4096
"""Robot connections remembered for pushes (oldest forgotten first)."""
MAX_SUBSET_PUSHES = 16
"""Subset pushes remembered for late robots since the last push to all (oldest dropped)."""
_TRIM_AFTER_BYTES = 64 * 1024 * 1024  # give freed heap back when idle after this much
MAX_INBOUND_FRAME_BYTES = 8 * 1024 * 1024
"""Default inbound frame limit: a shipper's batch (``max_batch_bytes``, 1 MiB) plus one
record of the largest size (``experience.MAX_RECORD_BYTES``) fit with room to spare. A
frame above it (plus a 64 KiB margin) makes ZeroMQ drop the connection before the frame
is read, so a hostile peer cannot make this process hold it."""


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
    # the allow-list: a folder of <robot_id>.key files, a TOML map, one <robot_id>.key, or
    # {Z85 key: robot id}; see link.security
    allowed_clients: Path | str | Mapping[bytes, str] | None = None
    max_frame_bytes: int = MAX_INBOUND_FRAME_BYTES
    poll_s: float = 0.1
    allow_reload_s: float = 1.0  # how often the allow-list files are checked for edits
    name: str = "consolidator"
    on_stored: Callable[[list[Experience]], None] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.bind or "://" not in self.bind:
            raise ValueError(f"ReceiverConfig.bind must look like tcp://host:port, "
                             f"got {self.bind!r}")
        problem = tcp_port_problem(self.bind)
        if problem:
            raise ValueError(f"ReceiverConfig.bind: {problem}")
        if not 0 < self.max_frame_bytes <= protocol.MAX_FRAME_BYTES:
            raise ValueError(f"ReceiverConfig.max_frame_bytes must be in "
                             f"(0, {protocol.MAX_FRAME_BYTES}], got {self.max_frame_bytes}")
        if self.poll_s <= 0:
            raise ValueError(f"ReceiverConfig.poll_s must be > 0, got {self.poll_s}")
        if self.allow_reload_s <= 0:
            raise ValueError(f"ReceiverConfig.allow_reload_s must be > 0, "
                             f"got {self.allow_reload_s}")
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
    identity_refused: int = 0  # frames whose robot id is not the one their key is bound to
    revoked_refused: int = 0  # frames from a key no longer on the allow-list
    allow_reloads: int = 0  # allow-list edits picked up
    allow_reload_errors: int = 0  # edits that did not parse (then nobody is admitted)
    bundle_pushes: int = 0  # BUNDLE_PUSH frames sent (one per robot connection)


class ExperienceReceiver:
    """ROUTER that validates, stores exactly once (commit before ACK) and acknowledges."""

    def __init__(self, config: ReceiverConfig, open_store: Callable[[], ExperienceSink],
                 screen: Callable[[Experience], str | None] | None = None) -> None:
        """Serve ``config``, storing into what ``open_store`` opens.

        ``screen``: why a valid experience is not taken here (None: taken); such records
        are rejected by index in the ACK, so the robot logs the reason and drops them.
        """
        self.config = config
        self._open_sink = open_store
        self._screen = screen
        self.stats = ReceiverStats()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._allow = None
        self._domain = f"thinkmem-{id(self):x}"
        self._bad_log = RateLimitedLog(log, 100)
        self._identity_log = RateLimitedLog(log, 100)
        self._allow_check_at = 0.0
        self._bytes_since_trim = 0  # frame bytes read since the heap was last trimmed
        # robot connections seen (identity -> (robot_id, Z85 key or None)), newest last;
        # pushes go to these
        self._peers: collections.OrderedDict[bytes, tuple[str, bytes | None]] = \
            collections.OrderedDict()
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._latest_push: bytes | None = None  # the newest push to all robots
        # pushes to a subset since then, oldest first: (robot id predicate, frame)
        self._subset_pushes: list[tuple[Callable[[str], bool], bytes]] = []
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

    def push_bundle(self, frame: bytes, timeout_s: float = 10.0,
                    robots: Callable[[str], bool] | None = None) -> int:
        """Send a BUNDLE_PUSH frame to every robot connection seen; returns how many.

        With ``robots`` (a predicate on the robot id) only the connections of the robots it
        selects get the frame (a canary). The socket belongs to the serving thread, so the
        frame is handed to it and this waits (at most ``timeout_s``) until it went out.
        Robots that connect later get the newest frame meant for them on first contact, so
        one that was offline still catches up.
        """
        if self._thread is None or not self._thread.is_alive():
            raise TransportError("push_bundle needs a started receiver")
        done: list[int] = []
        sent = threading.Event()
        self._outbox.put((frame, done, sent, robots))
        if not sent.wait(timeout_s):
            raise TransportError(f"bundle push not sent within {timeout_s} s")
        return done[0]

    @property
    def peers(self) -> dict[bytes, str]:
        """Robot connections seen so far (ZeroMQ identity -> robot id)."""
        return {identity: robot for identity, (robot, _) in self._peers.items()}

    @property
    def allow_list(self) -> AllowList | None:
        """The allow-list in force (None without CURVE)."""
        return None if self._allow is None else self._allow.allow

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
            # a frame a little above the limit is read and counted as bad; a much bigger
            # one never gets into this process. Per connection at most RCVHWM frames wait
            # (a robot has max_inflight batches in flight, 8 by default).
            socket.setsockopt(zmq.MAXMSGSIZE, cfg.max_frame_bytes + 64 * 1024)
            socket.setsockopt(zmq.RCVHWM, 64)
            socket.setsockopt(zmq.SNDHWM, 1000)
            if cfg.use_curve:
                allow = load_allow_list(cfg.allowed_clients)
                public, secret = load_curve_keypair(cfg.server_secret_file)
                self._allow = authorise_clients(context(), self._domain, allow, cfg.name)
                log.info("%s: %d client keys allowed, bound to robots %s", cfg.name,
                         len(allow.robots), sorted(set(allow.robots.values()))[:20])
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
                self._reload_allow_list()
            if not ready:
                if self._bytes_since_trim > _TRIM_AFTER_BYTES:  # idle after a burst
                    self._bytes_since_trim = 0
                    release_freed_memory()
                continue
            for _ in range(64):
                if self._stop.is_set():  # a stop waits for one message, not a backlog of
                    break  # 64 (unacknowledged ones are re-sent by their robots)
                try:
                    parts = socket.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                # ZAP's User-Id (the sender's Z85 key) travels with every message
                user = parts[-1].get("User-Id") if self._allow is not None else None
                try:
                    self._handle(store, parts, user)
                except Exception:  # noqa: BLE001 - one message must not stop the receiver
                    self.stats.bad_frames += 1
                    log.exception("handling a message failed; it is dropped unacknowledged "
                                  "(a robot re-sends its batch) and the receiver serves on")
                # the frames hold ZeroMQ's buffers (copy=False): let them go now, not when
                # the next message arrives, so an idle trim can return a big one's memory
                del parts

    def _send_pushes(self) -> None:
        while True:
            try:
                frame, done, sent, robots = self._outbox.get_nowait()
            except queue.Empty:
                return
            if robots is None:
                self._latest_push = frame
                self._subset_pushes.clear()
            else:
                self._subset_pushes = [*self._subset_pushes, (robots, frame)][
                    -MAX_SUBSET_PUSHES:]
            count = sum(self._push_to(identity, frame) for identity, (robot, _) in
                        list(self._peers.items()) if robots is None or robots(robot))
            log.info("pushed a bundle (%d bytes) to %d robot connections%s", len(frame), count,
                     "" if robots is None else " (a subset)")
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

    def _seen(self, identity: bytes, robot_id: str, key: bytes | None) -> None:
        new = identity not in self._peers
        self._peers[identity] = (robot_id, key)
        self._peers.move_to_end(identity)
        while len(self._peers) > MAX_PEERS:
            self._peers.popitem(last=False)
        if new:
            frame = self._frame_for(robot_id)
            if frame is not None:
                self._push_to(identity, frame)

    def _frame_for(self, robot_id: str) -> bytes | None:
        """The newest push meant for ``robot_id``: a subset push selecting it, else to all."""
        for robots, frame in reversed(self._subset_pushes):
            if robots(robot_id):
                return frame
        return self._latest_push

    def _reload_allow_list(self) -> None:
        """Pick up an edited allow-list (at most every ``allow_reload_s``)."""
        source = self.config.allowed_clients
        now = time.monotonic()
        if now < self._allow_check_at or not isinstance(source, (str, Path)):
            return
        self._allow_check_at = now + self.config.allow_reload_s
        current = self._allow.allow
        if allow_list_signature(source) == current.signature:
            return
        try:
            fresh = load_allow_list(source)
        except SecurityError as exc:  # fail closed: admit nobody until the file is fixed
            self.stats.allow_reload_errors += 1
            fresh = AllowList({}, str(source), allow_list_signature(source))
            log.error("%s: allow-list %s no longer loads, admitting NO robot until it is "
                      "fixed: %s", self.config.name, source, exc)
        self._allow.allow = fresh
        self.stats.allow_reloads += 1
        revoked = {k: r for k, r in current.robots.items() if fresh.robots.get(k) != r}
        if revoked:
            dropped = [i for i, (_, key) in self._peers.items() if key in revoked]
            for identity in dropped:
                del self._peers[identity]
            log.warning("%s: allow-list %s changed: revoked keys of robots %s (%d "
                        "connections dropped); %d keys allowed", self.config.name, source,
                        sorted(set(revoked.values())), len(dropped), len(fresh.robots))
        else:
            log.info("%s: allow-list %s changed: %d keys allowed", self.config.name, source,
                     len(fresh.robots))

    def _refuse(self, identity: bytes, counter: str, reason: str) -> None:
        setattr(self.stats, counter, getattr(self.stats, counter) + 1)
        self.stats.refused_frames += 1
        self._identity_log(logging.WARNING, "%s: REFUSED a frame: %s", self.config.name,
                           reason)
        self._reply(identity, protocol.refused(reason))

    def _check_identity(self, identity: bytes, claimed: str | None,
                        user: str | None) -> tuple[bool, bytes | None]:
        """Tell whether the sender's key may speak for ``claimed``; refuses it if not.

        Returns ``(ok, key)``. Without CURVE every claim is taken (nothing authenticates
        it); with CURVE the claim must be the robot the allow-list binds the key to now.
        """
        if self._allow is None:
            return True, None
        key = (user or "").encode("ascii", "replace")
        bound = self._allow.allow.robot_of(key)
        if bound is None:
            self._peers.pop(identity, None)
            self._refuse(identity, "revoked_refused",
                         f"key {key[:40].decode('ascii', 'replace')} is not (or no longer) "
                         "on the allow-list")
            return False, key
        if claimed is not None and claimed != bound:
            self._refuse(identity, "identity_refused",
                         f"this key speaks for robot {bound!r}, not {claimed[:64]!r}")
            return False, key
        return True, key

    def _handle(self, store: ExperienceSink, parts: list, user: str | None = None) -> None:
        self.stats.frames += 1
        if len(parts) != 2:
            # a many-part message is held whole by ZeroMQ (its size limit is per part):
            # count what it held so the heap is trimmed after it as after big frames
            self._bytes_since_trim += sum(len(p) for p in parts)
            self._bad(f"expected [identity, frame], got {len(parts)} parts")
            return
        # zmq.Frame (the serving loop, copy=False) or bytes (callers that already copied)
        identity = parts[0] if isinstance(parts[0], bytes) else parts[0].bytes
        data = parts[1]
        self._bytes_since_trim += len(data)
        if len(data) > self.config.max_frame_bytes:
            self._bad(f"frame of {len(data)} bytes exceeds {self.config.max_frame_bytes}")
            return
        if not isinstance(data, bytes):
            data = data.bytes
        try:
            frame = protocol.decode_frame(data)
        except ProtocolError as exc:
            self._bad(str(exc))
            if exc.version is not None and exc.version != protocol.PROTOCOL_VERSION:
                self.stats.refused_frames += 1
                self._reply(identity, protocol.refused(str(exc)))
            return
        if frame.kind in (Kind.EXPERIENCE_BATCH, Kind.EXPERIENCE_DELTA_BATCH):
            ok, key = self._check_identity(identity, frame.body["robot_id"], user)
            if ok:
                self._seen(identity, frame.body["robot_id"], key)
                self._on_batch(store, identity, frame.body,
                               frame.kind is Kind.EXPERIENCE_DELTA_BATCH)
        elif frame.kind is Kind.HELLO:
            robot_id = frame.body.get("robot_id")
            ok, key = self._check_identity(identity, robot_id, user)
            if not ok:
                return
            if robot_id is not None:
                self._seen(identity, robot_id, key)
            self._reply(identity, protocol.encode_frame(Kind.HELLO, {"server": self.config.name}))
        else:
            self.stats.refused_frames += 1
            self._reply(identity, protocol.refused(f"{frame.kind.name} is not served here"))

    def _on_batch(self, store: ExperienceSink, identity: bytes, body: dict,
                  deltas: bool = False) -> None:
        valid: list[tuple[Experience, bytes]] = []
        rejected: list[tuple[int, str]] = []
        items = body["items"]
        # a delta batch is rebuilt into full records (and their full bytes, which are what
        # the store keeps) and validated as a plain one; deltas on a refused base fail too
        decoded = (delta.decode_items(items, body["robot_id"]) if deltas else
                   [r if isinstance(r, ExperienceError) else (r, items[i])
                    for i, r in enumerate(decode_experiences(items))])
        for index, result in enumerate(decoded):
            if isinstance(result, ExperienceError):
                rejected.append((index, str(result)))
                continue
            experience = result[0]
            if experience.robot_id != body["robot_id"]:
                rejected.append((index, f"robot_id {experience.robot_id!r} != batch's "
                                        f"{body['robot_id']!r}"))
                continue
            why = self._screen(experience) if self._screen is not None else None
            if why is not None:
                rejected.append((index, why))
                continue
            valid.append(result)
        try:
            stored, duplicates = store.insert_many(valid)
        except SinkError as exc:  # no ACK: the robot keeps the batch and re-sends it
            self.stats.store_errors += 1
            log.error("store write failed, batch %s not acknowledged: %s", body["batch"], exc)
            return
        except Exception:  # noqa: BLE001 - a value validation missed: same, and say where
            self.stats.store_errors += 1
            log.exception("store write failed unexpectedly, batch %s not acknowledged",
                          body["batch"])
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
