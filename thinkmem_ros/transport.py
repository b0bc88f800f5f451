"""ZeroMQ experience transport: robot-side shipper, consolidator-side receiver.

The robot runs ``ExperienceShipper``, the consolidator ``ExperienceReceiver``.

Delivery is at-least-once with idempotent keys, which the store turns into exactly-once:
the shipper assigns every experience a per-robot monotonic ``seq``, writes it to the
durable ``Spool`` before sending, and deletes it only when the receiver's ACK says the
batch was committed; the receiver validates every record, inserts with
``UNIQUE(robot_id, seq)`` and acknowledges only after the commit. Lost frames, lost ACKs,
a killed consolidator or a restarted node therefore lead to re-sends, never to loss or
duplicate rows.

The node's tick never blocks: ``ExperienceShipper.ship`` is an O(1) append to a bounded
in-memory queue (a full queue drops the new record and counts it); encoding, SQLite and
sockets live on one background thread. Sends use ``NOBLOCK``, a high-water mark and
``ZMQ_IMMEDIATE`` (nothing piles up in ZeroMQ while disconnected: the spool holds it).
Unacknowledged batches are re-sent after ``ack_timeout_s`` with exponential backoff.

Cost per experience (what ``thinkmem bench transport`` measures as CPU us/experience):
fresh rows are spooled and then sent from memory, not read back from SQLite (the spool is
read only to catch up after an outage, a restart or a go-back); an ACK deletes its batch
as one primary-key range; the receiver validates a whole batch in one
``decode_experiences`` call (each field checked once, array values batch-wide) and
stores it in one transaction.

One ``zmq.Context`` per process (``context()``). Errors from ZeroMQ that reach a caller are
re-raised as ``TransportError``. A CURVE client whose key the server refuses is detected
from socket-monitor events and logged/counted as ``auth_failures``, not mistaken for a
dead server.

Run a receiver: ``python -m thinkmem_ros.transport serve --db PATH --bind ENDPOINT``.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import logging
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import zmq
from zmq.utils.monitor import recv_monitor_message

from . import protocol
from .consolidator.store import ExperienceStore, StoreError
from .experience import Experience, ExperienceError, decode_experiences, encode_experience
from .protocol import Kind, ProtocolError
from .security import (
    SecurityError,
    authorise_clients,
    curve_enabled,
    load_allowed_keys,
    load_curve_keypair,
    load_curve_public,
    release_domain,
)
from .spool import Spool, SpoolError

log = logging.getLogger(__name__)


class TransportError(RuntimeError):
    """A socket, spool or store operation of the transport failed."""


def context() -> zmq.Context:
    """Return the process's one ZeroMQ Context (sockets share its I/O thread and ZAP)."""
    return zmq.Context.instance()


class _RateLimitedLog:
    """Log the first occurrence and then every ``every``-th, so floods stay readable."""

    def __init__(self, every: int = 100) -> None:
        self.every = every
        self.count = 0

    def __call__(self, level: int, message: str, *args: object) -> None:
        self.count += 1
        if self.count == 1 or self.count % self.every == 0:
            log.log(level, message + " (%d so far)", *args, self.count)


# ------------------------------------------------------------------------------- shipper

@dataclass
class ShipperConfig:
    """Robot-side shipping settings (ROS parameters are copied into this once)."""

    endpoint: str
    robot_id: str
    spool_path: Path | str
    spool_max_bytes: int = 256 * 1024 * 1024
    queue_size: int = 20000
    batch_size: int = 512
    max_inflight: int = 8
    ack_timeout_s: float = 2.0
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 5.0
    send_hwm: int = 64
    curve: str = "auto"
    server_public_key: Path | str | bytes | None = None  # the consolidator's .key (Z85)
    client_secret_file: Path | str | None = None  # this robot's .key_secret
    idle_poll_s: float = 0.02
    # Called with a BUNDLE_PUSH body (dict) on the shipper's thread, never on the tick;
    # e.g. ``BundleReceiver.handle_push``. When set, the shipper says HELLO on every
    # connect so the consolidator knows where to push before any experience is shipped.
    on_bundle_push: Callable[[dict], object] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        positive = ("spool_max_bytes", "queue_size", "batch_size", "max_inflight",
                    "ack_timeout_s", "backoff_initial_s", "backoff_max_s", "send_hwm",
                    "idle_poll_s")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"ShipperConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.batch_size > protocol.MAX_BATCH_ITEMS:
            raise ValueError(f"ShipperConfig.batch_size must be <= {protocol.MAX_BATCH_ITEMS}, "
                             f"got {self.batch_size}")
        if not self.endpoint or "://" not in self.endpoint:
            raise ValueError(f"ShipperConfig.endpoint must look like tcp://host:port, "
                             f"got {self.endpoint!r}")
        if not self.robot_id:
            raise ValueError("ShipperConfig.robot_id must not be empty")
        have = self.server_public_key is not None and self.client_secret_file is not None
        self.use_curve = curve_enabled(self.curve, self.endpoint, have)


@dataclass
class _Stats:
    queued: int = 0
    dropped_queue_full: int = 0
    spooled: int = 0
    sent: int = 0
    resent: int = 0
    acked: int = 0
    stored: int = 0
    duplicates: int = 0
    rejected: int = 0
    shed: int = 0
    timeouts: int = 0
    send_blocked: int = 0
    auth_failures: int = 0
    handshake_failures: int = 0
    refused: int = 0
    bad_replies: int = 0
    disconnects: int = 0
    errors: int = 0
    bundle_pushes: int = 0


class ExperienceShipper:
    """Ships experiences to the consolidator from a background thread; never blocks a tick.

    Usage from the node::

        shipper = ExperienceShipper(ShipperConfig(endpoint, robot_id, spool_path)).start()
        shipper.ship(experience)       # on every tick; False if the memory queue is full
        shipper.stats()                # counters for /diagnostics
        shipper.close()                # on shutdown: the queue is spooled, not lost
    """

    def __init__(self, config: ShipperConfig) -> None:
        self.config = config
        self._queue: collections.deque[Experience] = collections.deque()
        self._stats = _Stats()
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread: threading.Thread | None = None
        self._startup_error: BaseException | None = None
        self._connected = False
        self._spool_rows = 0
        self._spool_bytes = 0
        self._inflight_count = 0
        self._drop_log = _RateLimitedLog(1000)
        self._auth_log = _RateLimitedLog(20)

    # ---- API for the node (any thread)
    def start(self, timeout_s: float = 10.0) -> ExperienceShipper:
        """Open the spool and socket on the background thread; re-sends the spool first."""
        if self._thread is not None:
            return self
        keys = self._load_keys()  # here, so a bad key file fails start() at once, by name
        self._thread = threading.Thread(target=self._run, args=(keys,),
                                        name="experience-shipper", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout_s):
            raise TransportError(f"shipper did not start within {timeout_s} s")
        if self._startup_error is not None:
            raise TransportError(f"shipper failed to start: {self._startup_error}") \
                from self._startup_error
        return self

    def alive(self) -> bool:
        """Tell whether the background thread runs (False before start, after close or a crash)."""
        return self._thread is not None and self._thread.is_alive()

    def ship(self, experience: Experience) -> bool:
        """Queue one experience (O(1), never blocks); False when the memory queue is full."""
        if self._stop.is_set() or len(self._queue) >= self.config.queue_size:
            self._stats.dropped_queue_full += 1
            self._drop_log(logging.WARNING, "shipper queue full (%d): dropped an experience",
                           self.config.queue_size)
            return False
        self._queue.append(experience)
        self._stats.queued += 1
        return True

    def stats(self) -> dict[str, int | bool]:
        """Counters and gauges for ``/diagnostics`` (a snapshot, safe from any thread)."""
        out: dict[str, int | bool] = dict(vars(self._stats))
        out.update(queue=len(self._queue), spool_rows=self._spool_rows,
                   spool_bytes=self._spool_bytes, inflight=self._inflight_count,
                   connected=self._connected)
        return out

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued experience is acknowledged; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self._queue and self._spool_rows == 0 and self._inflight_count == 0:
                return True
            if self._thread is None or not self._thread.is_alive():
                return False
            time.sleep(0.005)
        return False

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the thread after moving the memory queue to the spool (resent next start)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.error("shipper thread did not stop within %.1f s", timeout_s)

    def __enter__(self) -> ExperienceShipper:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- background thread
    def _load_keys(self) -> tuple[bytes, bytes, bytes] | None:
        """``(public, secret, server public)`` CURVE keys, None without CURVE."""
        cfg = self.config
        if not cfg.use_curve:
            return None
        try:
            public, secret = load_curve_keypair(cfg.client_secret_file)
            server = cfg.server_public_key
            if not isinstance(server, bytes):
                server = load_curve_public(server)
        except SecurityError as exc:  # the message names the file
            raise TransportError(f"shipper cannot start: {exc}") from exc
        return public, secret, server

    def _run(self, keys: tuple[bytes, bytes, bytes] | None) -> None:
        spool = None
        try:
            spool = Spool(self.config.spool_path, self.config.spool_max_bytes)
            socket, monitor = self._open_socket(keys)
        except Exception as exc:  # any startup failure goes to start(), never a hang
            if spool is not None:
                spool.close()
            self._startup_error = exc
            self._started.set()
            return
        loop = _ShipLoop(self, spool, socket, monitor)
        self._started.set()
        try:
            loop.run()
        except Exception:  # the node must keep running even if shipping dies
            self._stats.errors += 1
            log.exception("experience shipper stopped on an unexpected error")
        finally:
            loop.spool_queue()
            socket.disable_monitor()
            monitor.close(0)
            socket.close(0)
            spool.close()

    def _open_socket(self, keys: tuple[bytes, bytes, bytes] | None
                     ) -> tuple[zmq.Socket, zmq.Socket]:
        cfg = self.config
        socket = context().socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, cfg.send_hwm)
        socket.setsockopt(zmq.RCVHWM, 10 * cfg.max_inflight + 100)
        socket.setsockopt(zmq.IMMEDIATE, 1)
        socket.setsockopt(zmq.RECONNECT_IVL, 100)
        socket.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        try:
            if keys is not None:
                public, secret, server = keys
                socket.curve_publickey = public
                socket.curve_secretkey = secret
                socket.curve_serverkey = server
            monitor = socket.get_monitor_socket(
                zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                | zmq.EVENT_DISCONNECTED)
            socket.connect(cfg.endpoint)
        except Exception:
            socket.close(0)
            raise
        log.info("shipper %s -> %s (CURVE %s)", cfg.robot_id, cfg.endpoint,
                 "on" if cfg.use_curve else "off")
        return socket, monitor


class _ShipLoop:
    """State of the shipper thread: spool cursor, in-flight batches and backoff."""

    def __init__(self, owner: ExperienceShipper, spool: Spool, socket: zmq.Socket,
                 monitor: zmq.Socket) -> None:
        self.owner = owner
        self.cfg = owner.config
        self.stats = owner._stats
        self.spool = spool
        self.socket = socket
        self.monitor = monitor
        self.poller = zmq.Poller()
        self.poller.register(socket, zmq.POLLIN)
        self.poller.register(monitor, zmq.POLLIN)
        # seqs stay monotonic across restarts even if the spool file is lost: never below
        # the wall clock in microseconds, never below what the spool last handed out.
        self.next_seq = max(spool.next_seq, int(time.time() * 1e6))
        self.cursor = -1  # highest seq sent since the last go-back
        # Fresh rows are sent from memory, not read back from the spool: while ``synced``,
        # ``fresh`` holds exactly the spooled rows after the cursor, in seq order. Anything
        # that could break that (a go-back, shedding, a seq below one already spooled, a
        # long outage) drops to reading the spool until it is caught up again.
        self.fresh: collections.deque[tuple[int, bytes]] = collections.deque()
        self.synced = False
        self.fresh_cap = 2 * self.cfg.batch_size * self.cfg.max_inflight
        # Bumped when a row is spooled below next_seq: batches sent before then may share
        # their seq range with a row they did not carry, so their ACK deletes by id list.
        self.ooo_epoch = 0
        self.batch_ids = itertools.count(1)
        self.sent: collections.OrderedDict[int, tuple[list[int], int]] = \
            collections.OrderedDict()
        self.inflight: collections.OrderedDict[int, float] = collections.OrderedDict()
        self.backoff = self.cfg.backoff_initial_s
        self.resume_at = 0.0
        self.reject_log = _RateLimitedLog(100)
        self._publish_gauges()

    def run(self) -> None:
        stop = self.owner._stop
        while not stop.is_set():
            busy = self.spool_queue(limit=4 * self.cfg.batch_size)
            busy |= self.send_window()
            timeout = 0 if busy else self.cfg.idle_poll_s
            for sock, _ in self.poller.poll(timeout * 1000):
                if sock is self.monitor:
                    self.on_monitor()
                else:
                    self.on_replies()
            self.check_timeouts()
            self._publish_gauges()

    def spool_queue(self, limit: int | None = None) -> bool:
        """Move queued experiences to the spool (encoding them); True if any moved."""
        queue = self.owner._queue
        rows: list[tuple[int, bytes]] = []
        lowest = None  # lowest seq spooled below next_seq (given by the caller), if any
        while queue and (limit is None or len(rows) < limit):
            experience = queue.popleft()
            seq = experience.seq if experience.seq is not None else self.next_seq
            if seq < self.next_seq and (lowest is None or seq < lowest):
                lowest = seq
            self.next_seq = max(self.next_seq, seq + 1)
            try:
                rows.append((seq, encode_experience(experience, seq=seq)))
            except ExperienceError as exc:  # mutated after construction: refuse, go on
                self.stats.rejected += 1
                log.warning("dropped an experience that no longer validates: %s", exc)
        if not rows:
            return False
        try:
            shed = self.spool.put(rows)
        except SpoolError as exc:  # not spooled, so not sent either (and fresh stays exact)
            self.stats.errors += 1
            log.error("could not spool %d experiences: %s", len(rows), exc)
            shed = 0
        else:
            self.stats.shed += shed
            self.stats.spooled += len(rows)
            if lowest is not None:
                self.ooo_epoch += 1
                # a row behind the cursor would never be read: move the cursor back to it
                # (rows in flight in between may go twice; the store keeps one copy)
                self.cursor = min(self.cursor, lowest - 1)
            if shed or lowest is not None or len(self.fresh) + len(rows) > self.fresh_cap:
                self.unsync()
            elif self.synced:
                self.fresh.extend(rows)
        self._publish_gauges()
        return True

    def unsync(self) -> None:
        """Send from the spool again (after the cursor) until caught up with fresh rows."""
        self.synced = False
        self.fresh.clear()

    def send_window(self) -> bool:
        """Send spooled rows after the cursor while the in-flight window has room."""
        if time.monotonic() < self.resume_at:
            return False
        progressed = False
        size = self.cfg.batch_size
        while len(self.inflight) < self.cfg.max_inflight:
            from_memory = self.synced
            if from_memory:
                rows = list(itertools.islice(self.fresh, size))
            else:
                rows = self.spool.read_after(self.cursor, size)
                if not rows:  # nothing spooled after the cursor: new rows go via memory
                    self.synced = True
            if not rows or not self.send_batch(rows):
                break
            if from_memory:
                for _ in rows:
                    self.fresh.popleft()
            elif len(rows) < size:  # this read reached the end of the spool
                self.synced = True
            self.cursor = rows[-1][0]
            progressed = True
        return progressed

    def send_batch(self, rows: Sequence[tuple[int, bytes]]) -> bool:
        batch = next(self.batch_ids)
        frame = protocol.experience_batch(batch, self.cfg.robot_id, [p for _, p in rows])
        try:
            self.socket.send(frame, zmq.NOBLOCK, copy=False)
        except zmq.Again:  # not connected yet, or HWM reached: the spool keeps the rows
            self.stats.send_blocked += 1
            return False
        seqs = [seq for seq, _ in rows]
        self.sent[batch] = (seqs, self.ooo_epoch)
        while len(self.sent) > 16 * self.cfg.max_inflight:
            self.sent.popitem(last=False)
        self.inflight[batch] = time.monotonic() + self.cfg.ack_timeout_s
        self.stats.sent += len(seqs)
        return True

    def on_replies(self) -> None:
        for _ in range(256):
            try:
                data = self.socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                frame = protocol.decode_frame(data)
            except ProtocolError as exc:
                self.stats.bad_replies += 1
                log.warning("bad reply from consolidator: %s", exc)
                continue
            if frame.kind is Kind.ACK:
                self.on_ack(frame.body)
            elif frame.kind is Kind.BUNDLE_PUSH and self.cfg.on_bundle_push is not None:
                self.stats.bundle_pushes += 1
                try:
                    self.cfg.on_bundle_push(frame.body)
                except Exception:  # a consumer bug must not stop shipping
                    self.stats.errors += 1
                    log.exception("on_bundle_push callback failed")
            elif frame.kind is Kind.HELLO:
                pass  # the server's answer to our HELLO: it knows us now
            elif frame.kind is Kind.REFUSED:
                self.stats.refused += 1
                log.error("consolidator REFUSED our frame: %s", frame.body["reason"])
            else:
                self.stats.bad_replies += 1

    def on_ack(self, body: dict) -> None:
        batch = body["batch"]
        entry = self.sent.pop(batch, None)
        self.inflight.pop(batch, None)
        if entry is None:  # an ACK for a batch we forgot long ago: nothing left to do
            return
        seqs, epoch = entry
        try:
            if epoch == self.ooo_epoch:  # the range holds only rows this batch carried
                self.spool.remove_range(seqs[0], seqs[-1])
            else:
                self.spool.remove(seqs)
        except SpoolError as exc:
            self.stats.errors += 1
            log.error("could not remove acknowledged rows: %s", exc)
        self.stats.acked += len(seqs)
        self.stats.stored += body["stored"]
        self.stats.duplicates += body["duplicates"]
        if body["rejected"]:
            self.stats.rejected += len(body["rejected"])
            self.reject_log(logging.WARNING, "consolidator rejected an experience: %s",
                            body["rejected"][0][1])
        self.backoff = self.cfg.backoff_initial_s

    def on_monitor(self) -> None:
        while True:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            kind = event["event"]
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.owner._connected = True
                log.info("connected to consolidator %s", self.cfg.endpoint)
                if self.cfg.on_bundle_push is not None:
                    try:
                        self.socket.send(protocol.hello(self.cfg.robot_id), zmq.NOBLOCK)
                    except zmq.ZMQError:  # the next batch introduces us instead
                        pass
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self.stats.auth_failures += 1
                self.owner._connected = False
                self.owner._auth_log(
                    logging.ERROR, "consolidator %s REFUSED our CURVE key (ZAP status %s): "
                    "this is an authorisation failure, not a dead server; add this robot's "
                    "public key to the consolidator's allowed keys", self.cfg.endpoint,
                    event["value"])
            elif kind in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                          zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
                self.stats.handshake_failures += 1
                self.owner._auth_log(
                    logging.ERROR, "handshake with %s failed (%s): wrong server key or CURVE "
                    "mismatch?", self.cfg.endpoint, zmq.Event(kind).name)
            elif kind == zmq.EVENT_DISCONNECTED:
                self.stats.disconnects += 1
                if self.owner._connected:
                    log.warning("consolidator %s disconnected; unacked experiences stay "
                                "spooled and are re-sent", self.cfg.endpoint)
                self.owner._connected = False
                self.go_back()

    def check_timeouts(self) -> None:
        if not self.inflight:
            return
        oldest = next(iter(self.inflight.values()))
        if time.monotonic() < oldest:
            return
        self.stats.timeouts += 1
        log.info("no ACK within %.2f s for %d batches; re-sending from the spool after %.2f s",
                 self.cfg.ack_timeout_s, len(self.inflight), self.backoff)
        self.go_back()
        self.resume_at = time.monotonic() + self.backoff
        self.backoff = min(2 * self.backoff, self.cfg.backoff_max_s)

    def go_back(self) -> None:
        """Forget what is in flight and re-send the spool from its oldest row."""
        resent = sum(len(self.sent[b][0]) for b in self.inflight if b in self.sent)
        self.stats.resent += resent
        self.inflight.clear()
        self.cursor = -1
        self.unsync()

    def _publish_gauges(self) -> None:
        self.owner._spool_rows = self.spool.rows
        self.owner._spool_bytes = self.spool.bytes
        self.owner._inflight_count = len(self.inflight)


# ------------------------------------------------------------------------------ receiver

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

    def __init__(self, config: ReceiverConfig) -> None:
        self.config = config
        self.stats = ReceiverStats()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._allow = None
        self._domain = f"thinkmem-{id(self):x}"
        self._bad_log = _RateLimitedLog(100)
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

    def _open_store(self) -> ExperienceStore:
        try:
            return ExperienceStore(self.config.db_path)
        except StoreError as exc:
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

    def _loop(self, store: ExperienceStore) -> None:
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

    def _handle(self, store: ExperienceStore, parts: list[bytes]) -> None:
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

    def _on_batch(self, store: ExperienceStore, identity: bytes, body: dict) -> None:
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
        except StoreError as exc:  # no ACK: the robot keeps the batch and re-sends it
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


# ------------------------------------------------------------------------ serve entry

def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m thinkmem_ros.transport")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run an experience receiver until SIGTERM/SIGINT")
    serve.add_argument("--db", required=True, help="SQLite experience store")
    serve.add_argument("--bind", default="tcp://127.0.0.1:5755", help="ZeroMQ endpoint")
    serve.add_argument("--curve", default="auto", choices=("auto", "on", "off"))
    serve.add_argument("--server-key", help="consolidator .key_secret file (CURVE)")
    serve.add_argument("--allow", help="allowed client .key file or folder (CURVE)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """``serve``: bind, print ``READY <endpoint>`` on stdout, serve until SIGTERM."""
    args = _parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    receiver = ExperienceReceiver(ReceiverConfig(
        bind=args.bind, db_path=args.db, curve=args.curve, server_secret_file=args.server_key,
        allowed_clients=args.allow))
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: receiver._stop.set())
    print(f"READY {receiver.endpoint}", flush=True)
    receiver.serve_forever()
    log.info("receiver stopped cleanly: %s", receiver.stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
