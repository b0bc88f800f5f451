"""Robot end of the experience transport: spool, send, re-send until acknowledged.

Delivery is at-least-once with idempotent keys, which the consolidator's store turns into
exactly-once: the shipper assigns every experience a per-robot monotonic ``seq``, writes it
to the durable ``Spool`` before sending, and deletes it only when the receiver's ACK says
the batch was committed. Lost frames, lost ACKs, a killed consolidator or a restarted node
therefore lead to re-sends, never to loss or duplicate rows.

The node's tick never blocks: ``ExperienceShipper.ship`` is an O(1) append to a bounded
in-memory queue (a full queue drops the new record and counts it); encoding, SQLite and
sockets live on one background thread. Sends use ``NOBLOCK``, a high-water mark and
``ZMQ_IMMEDIATE`` (nothing piles up in ZeroMQ while disconnected: the spool holds it).
Unacknowledged batches are re-sent after ``ack_timeout_s`` with exponential backoff.

Cost per experience (what ``thinkmem bench transport`` measures as CPU us/experience):
fresh rows are spooled and then sent from memory, not read back from SQLite (the spool is
read only to catch up after an outage, a restart or a go-back); an ACK deletes its batch
as one primary-key range.

A CURVE client whose key the server refuses is detected from socket-monitor events and
logged/counted as ``auth_failures``, not mistaken for a dead server. ZeroMQ never retries
a connection that ended in a protocol error (a refused key, a frame above
``max_reply_bytes``), so the shipper then opens a new socket itself (``reopens``, with
backoff): a robot whose key is allowed later connects without a restart.

Bounds: batches hold at most ``max_batch_bytes`` of records (so frames stay far below the
consolidator's inbound limit), and the socket reads no frame above ``max_reply_bytes``
(ZMQ_MAXMSGSIZE: ZeroMQ drops such a connection before the frame is in memory).

A full spool disk is never silent: the spool sheds its oldest rows to make room
(``shed_disk_full``) and, when even that fails, ``ship`` refuses for a second at a time
(``refused_disk_full``); acknowledged rows are deleted even on a full disk, so the spool
drains when the consolidator is back (see ``spool``).

A damaged spool never stops shipping: damage met at start or while running makes the spool
move its file aside and go on with a fresh one holding every row that could still be read
(rows that could not are counted in ``spool_failed``); then everything unacknowledged is
re-sent from it. A large spool is read in full only once the thread runs (``verify``,
before the first send), so a slow SD card cannot make ``start`` time out. Should the thread
stop all the same, ``ship`` refuses (and counts) what it could no longer deliver.

Several receivers (``consolidator.receive``: receive-only processes sharing one store):
``endpoint`` may name several, as a list or comma-separated. The robot talks to ONE at a
time: it starts at a home endpoint picked from a stable hash of its robot id (so a fleet
spreads evenly, and a robot keeps its receiver across restarts), and fails over to the
next in the list when the current one is unreachable (no connection for
``ack_timeout_s``) or silent (a batch unacknowledged past ``ack_timeout_s`` and no reply
at all since it was sent: a receiver that acknowledges late is busy, and is kept). A failover
opens a new socket and re-sends everything unacknowledged from the spool; a batch the
dead receiver had already committed arrives again and is counted as a duplicate by the
store's ``UNIQUE(robot_id, seq)`` index, never stored twice. After ``rehome_s`` away the
robot tries its home endpoint again (when nothing is in flight), so a fleet re-spreads
once a restarted receiver is back.

Why not one DEALER connected to every endpoint at once (ZeroMQ round-robins over them)?
Batches queued on the pipe of a peer that just died are dropped with the pipe and then
wait for the ack timeout anyway; a receiver that hangs while its TCP connection stays up
keeps taking its share of every window, so each window times out and is re-sent in full,
and round-robin gives the robot no way to steer around it; every robot would hold a
connection (and a CURVE handshake) on every receiver, so no receiver sheds load; and a
HELLO would reach only one of them, so which receiver pushes bundles to the robot would
be chance. One endpoint at a time keeps the failure of one receiver a single, observable
event (``failovers``) with one well-defined recovery: the spool resend.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import zmq
from zmq.utils.monitor import recv_monitor_message

from thinkmem_ros.link import delta, protocol
from thinkmem_ros.link.experience import Experience, ExperienceError, encode_experience
from thinkmem_ros.link.protocol import Kind, ProtocolError
from thinkmem_ros.link.security import (
    SecurityError,
    curve_enabled,
    load_curve_keypair,
    load_curve_public,
    tcp_port_problem,
)
from thinkmem_ros.link.sockets import RateLimitedLog, TransportError, context
from thinkmem_ros.link.spool import Spool, SpoolDamaged, SpoolError, SpoolFull

log = logging.getLogger(__name__)

_REOPEN_GRACE_S = 3.0  # a drop not followed by a ZeroMQ retry within this: new socket
_REOPEN_MAX_S = 60.0  # longest wait between new sockets while we keep being refused
_RECOVER_RETRY_S = 5.0  # a damaged spool that could not be moved aside: next try


@dataclass
class ShipperConfig:
    """Robot-side shipping settings (ROS parameters are copied into this once)."""

    # one endpoint, or several (a list, or comma-separated): see the module docstring
    endpoint: str | Sequence[str]
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
    # largest frame the robot reads from its consolidator (ZMQ_MAXMSGSIZE): a bigger one
    # drops the connection inside ZeroMQ before it is read, whoever sent it
    max_reply_bytes: int = protocol.MAX_FRAME_BYTES
    # payload bytes per batch (at least one record): frames stay far below the
    # consolidator's inbound limit (a record is at most experience.MAX_RECORD_BYTES)
    max_batch_bytes: int = 1024 * 1024
    # send EXPERIENCE_DELTA_BATCH frames (link.delta: each window row once, repeated fields
    # omitted: ~17x fewer bytes per experience shipping every frame, ~7x every 5th, see
    # docs/deployment.md); False = plain EXPERIENCE_BATCH, for a consolidator that
    # predates delta batches. The spool keeps full records either way.
    delta_batches: bool = True
    curve: str = "auto"
    server_public_key: Path | str | bytes | None = None  # the consolidator's .key (Z85)
    client_secret_file: Path | str | None = None  # this robot's .key_secret
    idle_poll_s: float = 0.02
    # with several endpoints: seconds away from the home endpoint before trying it again
    # (when nothing is in flight); 0 = stay on the receiver that works
    rehome_s: float = 300.0
    # Called with a BUNDLE_PUSH body (dict) on the shipper's thread, never on the tick;
    # e.g. ``BundleReceiver.handle_push``. When set, the shipper says HELLO on every
    # connect so the consolidator knows where to push before any experience is shipped.
    on_bundle_push: Callable[[dict], object] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        positive = ("spool_max_bytes", "queue_size", "batch_size", "max_inflight",
                    "ack_timeout_s", "backoff_initial_s", "backoff_max_s", "send_hwm",
                    "idle_poll_s", "max_reply_bytes", "max_batch_bytes")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"ShipperConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.max_reply_bytes > protocol.MAX_FRAME_BYTES:
            raise ValueError(f"ShipperConfig.max_reply_bytes must be <= "
                             f"{protocol.MAX_FRAME_BYTES}, got {self.max_reply_bytes}")
        if self.batch_size > protocol.MAX_BATCH_ITEMS:
            raise ValueError(f"ShipperConfig.batch_size must be <= {protocol.MAX_BATCH_ITEMS}, "
                             f"got {self.batch_size}")
        if not isinstance(self.delta_batches, bool):
            raise ValueError(f"ShipperConfig.delta_batches must be a bool, "
                             f"got {self.delta_batches!r}")
        if self.rehome_s < 0:
            raise ValueError(f"ShipperConfig.rehome_s must be >= 0, got {self.rehome_s}")
        self.endpoints = parse_endpoints(self.endpoint)
        if not self.robot_id:
            raise ValueError("ShipperConfig.robot_id must not be empty")
        have = self.server_public_key is not None and self.client_secret_file is not None
        # every receiver serves with the same key pair and allow-list, so one decision
        # holds for all (curve_enabled raises when any endpoint needs keys we lack)
        self.use_curve = any([curve_enabled(self.curve, e, have) for e in self.endpoints])


def parse_endpoints(endpoint: str | Sequence[str]) -> tuple[str, ...]:
    """The endpoints named by ``endpoint`` (one, a list, or comma-separated), validated.

    Raises ValueError naming the bad entry: empty, without ``scheme://``, or repeated.
    """
    items = endpoint.split(",") if isinstance(endpoint, str) else list(endpoint)
    out: list[str] = []
    for item in items:
        text = item.strip() if isinstance(item, str) else item
        if not isinstance(text, str) or "://" not in text or " " in text:
            raise ValueError(f"ShipperConfig.endpoint must look like tcp://host:port (or "
                             f"several, comma-separated), got {item!r} in {endpoint!r}")
        problem = tcp_port_problem(text)
        if problem:
            raise ValueError(f"ShipperConfig.endpoint: {problem}")
        if text in out:
            raise ValueError(f"ShipperConfig.endpoint names {text!r} twice: {endpoint!r}")
        out.append(text)
    if not out:
        raise ValueError(f"ShipperConfig.endpoint names no endpoint: {endpoint!r}")
    return tuple(out)


def endpoint_order(robot_id: str, endpoints: Sequence[str]) -> list[str]:
    """The order in which ``robot_id`` tries ``endpoints``: its home first, then the rest.

    The home is ``crc32(robot_id) % len(endpoints)``: stable across processes and restarts
    (Python's ``hash`` is salted per process), and spread evenly over a fleet.
    """
    start = zlib.crc32(robot_id.encode()) % len(endpoints)
    return [*endpoints[start:], *endpoints[:start]]


@dataclass
class _Stats:
    queued: int = 0
    dropped_queue_full: int = 0  # also: refused after close() or once the thread stopped
    spooled: int = 0
    sent: int = 0
    resent: int = 0
    acked: int = 0
    stored: int = 0
    duplicates: int = 0
    rejected: int = 0
    shed: int = 0  # spooled experiences dropped by the spool's size bound (oldest first)
    shed_disk_full: int = 0  # experiences dropped because the spool's disk was full
    refused_disk_full: int = 0  # ship() calls refused while nothing could be spooled
    # experiences lost to a spool error other than a full disk: a write that failed, or
    # spooled rows a damaged spool could no longer read
    spool_failed: int = 0
    timeouts: int = 0
    send_blocked: int = 0
    auth_failures: int = 0
    handshake_failures: int = 0
    refused: int = 0
    bad_replies: int = 0
    disconnects: int = 0
    errors: int = 0
    bundle_pushes: int = 0
    reopens: int = 0  # sockets replaced because ZeroMQ had stopped reconnecting
    failovers: int = 0  # moves to the next endpoint (current one unreachable or silent)
    rehomes: int = 0  # returns to the home endpoint after rehome_s elsewhere


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
        self._disk_full = False
        self._handled = 0  # experiences the thread took from the queue and dealt with
        self._refuse_until = 0.0  # monotonic time until which ship() refuses (disk full)
        self._drop_log = RateLimitedLog(log, 1000)
        self._auth_log = RateLimitedLog(log, 20)
        self._endpoint_now = endpoint_order(config.robot_id, config.endpoints)[0]

    @property
    def endpoint_now(self) -> str:
        """The endpoint the robot ships to now (its home unless it failed over)."""
        return self._endpoint_now

    # ---- API for the node (any thread)
    def start(self, timeout_s: float = 10.0) -> ExperienceShipper:
        """Open the spool and socket on the background thread; re-sends the spool first."""
        if self._thread is not None:
            return self
        keys = self._load_keys()  # here, so a bad key file fails start() at once, by name
        for endpoint in self.config.endpoints:  # a bad endpoint fails start(), by name
            probe = context().socket(zmq.DEALER)
            try:
                probe.connect(endpoint)
            except zmq.ZMQError as exc:
                raise TransportError(f"shipper cannot connect to {endpoint!r}: {exc}") \
                    from exc
            finally:
                probe.close(0)
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
        """Queue one experience (O(1), never blocks); False when it cannot be kept.

        False (and counted) when the memory queue is full, the shipper was closed or its
        thread stopped (``dropped_queue_full``: nothing would take the record off the
        queue), or when the spool's disk is so full that nothing could be written even
        after shedding (``refused_disk_full``; tried again every second). A disk that is
        merely full still takes new experiences by shedding the oldest spooled ones,
        counted in ``shed_disk_full``.
        """
        if self._refuse_until and time.monotonic() < self._refuse_until:
            self._stats.refused_disk_full += 1
            self._drop_log(logging.ERROR, "spool disk full: refused an experience")
            return False
        if self._thread is not None and not self._stop.is_set() \
                and not self._thread.is_alive():
            self._stats.dropped_queue_full += 1
            self._drop_log(logging.ERROR, "experience shipper is not running: dropped an "
                           "experience")
            return False
        if self._stop.is_set() or len(self._queue) >= self.config.queue_size:
            self._stats.dropped_queue_full += 1
            self._drop_log(logging.WARNING, "shipper queue full (%d): dropped an experience",
                           self.config.queue_size)
            return False
        self._queue.append(experience)
        self._stats.queued += 1
        return True

    def stats(self) -> dict[str, int | bool]:
        """Counters and gauges for ``/diagnostics`` (a snapshot, safe from any thread).

        Every experience ``ship`` accepted ends in ``queue``, ``spool_rows``,
        ``stored``/``duplicates`` (acknowledged), or is counted as ``rejected``, ``shed``,
        ``shed_disk_full`` or ``spool_failed`` (a batch being written to the spool is in
        none of them for that moment). ``disk_full`` says the spool's filesystem is full
        right now: /diagnostics should show it, and any growth of ``shed_disk_full``,
        ``refused_disk_full`` or ``spool_failed``, as an ERROR.
        """
        out: dict[str, int | bool] = dict(vars(self._stats))
        out.update(queue=len(self._queue), spool_rows=self._spool_rows,
                   spool_bytes=self._spool_bytes, inflight=self._inflight_count,
                   connected=self._connected, disk_full=self._disk_full)
        return out

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued experience is acknowledged; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            # _handled catches up with queued only once taken rows reached the spool
            # gauges: an empty queue alone may mean "being written to the spool right now"
            if (self._handled == self._stats.queued and not self._queue
                    and self._spool_rows == 0 and self._inflight_count == 0):
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
            socket, monitor = self._open_socket(keys, self._endpoint_now)
        except Exception as exc:  # any startup failure goes to start(), never a hang
            if spool is not None:
                spool.close()
            self._startup_error = exc
            self._started.set()
            return
        loop = _ShipLoop(self, spool, socket, monitor,
                         lambda endpoint: self._open_socket(keys, endpoint))
        self._started.set()
        try:
            loop.verify_spool()
            loop.run()
        except Exception:  # the node must keep running even if shipping dies
            self._stats.errors += 1
            log.exception("experience shipper stopped on an unexpected error")
        finally:
            loop.finish()
            spool.close()

    def _open_socket(self, keys: tuple[bytes, bytes, bytes] | None, endpoint: str
                     ) -> tuple[zmq.Socket, zmq.Socket]:
        cfg = self.config
        socket = context().socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, cfg.send_hwm)
        # what the consolidator can make this process hold: at most RCVHWM frames of at
        # most max_reply_bytes each (ACKs are small; one bundle push is the big one)
        socket.setsockopt(zmq.MAXMSGSIZE, cfg.max_reply_bytes)
        socket.setsockopt(zmq.RCVHWM, 4 * cfg.max_inflight + 16)
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
                | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_CONNECTED)
            socket.connect(endpoint)
        except Exception:
            socket.close(0)
            raise
        log.info("shipper %s -> %s (CURVE %s)", cfg.robot_id, endpoint,
                 "on" if cfg.use_curve else "off")
        return socket, monitor


class _ShipLoop:
    """State of the shipper thread: spool cursor, in-flight batches and backoff."""

    def __init__(self, owner: ExperienceShipper, spool: Spool, socket: zmq.Socket,
                 monitor: zmq.Socket,
                 open_socket: Callable[[str], tuple[zmq.Socket, zmq.Socket]]) -> None:
        self.owner = owner
        self.cfg = owner.config
        self.stats = owner._stats
        self.spool = spool
        self.open_socket = open_socket
        self.socket = socket
        self.monitor = monitor
        self.poller = zmq.Poller()
        self.poller.register(socket, zmq.POLLIN)
        self.poller.register(monitor, zmq.POLLIN)
        # ZeroMQ gives up on a connection for good after a protocol error (a refused CURVE
        # key, a frame above max_reply_bytes): no retry ever follows. When a drop is not
        # followed by a retry within the grace, the socket is opened afresh (backing off
        # while the consolidator keeps refusing us), so a robot whose key is allowed later
        # connects without a restart.
        self.reopen_at = 0.0
        self.reopen_backoff = _REOPEN_GRACE_S
        # Several endpoints: the order to try them (home first), the one in use, since when
        # it has had no connection (0 = connected), and since when we are away from home.
        self.endpoints = endpoint_order(self.cfg.robot_id, self.cfg.endpoints)
        self.index = 0
        self.unreachable_since = time.monotonic()
        self.away_since = 0.0
        self.last_reply_at = 0.0  # monotonic time of the last frame the receiver sent us
        self.failover_log = RateLimitedLog(log, 20)
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
        self.reject_log = RateLimitedLog(log, 100)
        self.spool_log = RateLimitedLog(log, 100)
        self.refused_log = RateLimitedLog(log, 100)
        self.reply_log = RateLimitedLog(log, 100)
        self.recover_at = 0.0  # monotonic time before which a damaged spool is not retried
        self._publish_gauges()

    def run(self) -> None:
        stop = self.owner._stop
        space_check_at = 0.0
        while not stop.is_set():
            if self.reopen_at and time.monotonic() >= self.reopen_at:
                self.reopen()
            if len(self.endpoints) > 1:
                self.check_failover()
            if self.spool.disk_full and time.monotonic() >= space_check_at:
                space_check_at = time.monotonic() + 1.0
                try:
                    self.spool.check_space()
                except SpoolError as exc:
                    self.on_spool_error(exc, "could not check the spool's disk")
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

    def finish(self) -> None:
        """Spool what is still queued and close the socket; never raises (thread's end).

        What cannot be spooled is counted in ``spool_failed``, not left to vanish.
        """
        try:
            self.spool_queue()
        except Exception as exc:  # anything unforeseen: count, do not re-raise
            left = len(self.owner._queue)
            self.owner._queue.clear()
            self.stats.spool_failed += left
            self.stats.errors += 1
            log.error("could not spool %d queued experiences at shutdown: %s", left, exc)
        self.close_socket()

    def verify_spool(self) -> None:
        """Read every page the spool's open left unread, before anything is sent from it.

        Here rather than at open, where it could take longer than ``start`` waits; damage
        found renews the spool as any damage met later does (its unreadable rows counted).
        """
        lost = self.spool.lost
        try:
            renewed = self.spool.verify()
        except SpoolError as exc:  # shipping goes on; damage a read or write meets renews it
            self.on_spool_error(exc, "could not check the spool")
            return
        if renewed:
            self.stats.spool_failed += self.spool.lost - lost
            self.go_back()
            self._publish_gauges()

    def on_spool_error(self, exc: SpoolError, what: str) -> bool:
        """Log and count a spool error; recover from damage. True if the spool was renewed.

        Anything else (the file or folder went read-only, say) leaves the spool as it is:
        what it holds stays, and the next try may work.
        """
        self.stats.errors += 1
        if isinstance(exc, SpoolDamaged):
            return self.recover(exc)
        self.spool_log(logging.ERROR, "%s: %s", what, exc)
        return False

    def recover(self, exc: SpoolError) -> bool:
        """Go on with a fresh spool holding what the damaged one could still give.

        The spool logs what it found and saved; here the rows it could not read are
        counted, and everything unacknowledged goes again from the fresh spool.
        """
        if time.monotonic() < self.recover_at:
            return False
        lost = self.spool.lost
        try:
            self.spool.recover(str(exc))
        except SpoolError as again:  # e.g. a read-only folder: try again later
            self.recover_at = time.monotonic() + _RECOVER_RETRY_S
            self.spool_log(logging.ERROR, "%s", again)
            return False
        self.stats.spool_failed += self.spool.lost - lost
        self.go_back()
        self._publish_gauges()
        return True

    def put(self, rows: list[tuple[int, bytes]]) -> int:
        """``Spool.put``; after damage, once more into the fresh spool."""
        try:
            return self.spool.put(rows)
        except SpoolDamaged as exc:
            self.stats.errors += 1
            if not self.recover(exc):
                raise
        return self.spool.put(rows)

    def spool_queue(self, limit: int | None = None) -> bool:
        """Move queued experiences to the spool (encoding them); True if any moved."""
        queue = self.owner._queue
        rows: list[tuple[int, bytes]] = []
        lowest = None  # lowest seq spooled below next_seq (given by the caller), if any
        popped = 0
        while queue and (limit is None or len(rows) < limit):
            experience = queue.popleft()
            popped += 1
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
            self.owner._handled += popped
            return popped > 0
        written = len(rows)
        try:
            shed = self.put(rows)
        except SpoolFull as exc:  # the rows not written are counted in shed_disk_full
            self.owner._refuse_until = time.monotonic() + 1.0
            self.spool_log(logging.ERROR, "%s; refusing new experiences for 1 s", exc)
            written, shed = exc.written, len(rows) - exc.written
        except SpoolError as exc:  # not spooled, so not sent either (and fresh stays exact)
            self.stats.errors += 1
            self.stats.spool_failed += len(rows) - exc.written
            self.spool_log(logging.ERROR, "could not spool %d experiences: %s",
                           len(rows) - exc.written, exc)
            written, shed = exc.written, len(rows) - exc.written
        else:
            self.owner._refuse_until = 0.0
        self.stats.shed = self.spool.shed
        self.stats.spooled += written
        if written and lowest is not None:
            self.ooo_epoch += 1
            # a row behind the cursor would never be read: move the cursor back to it
            # (rows in flight in between may go twice; the store keeps one copy)
            self.cursor = min(self.cursor, lowest - 1)
        if shed or lowest is not None or len(self.fresh) + len(rows) > self.fresh_cap:
            self.unsync()
        elif self.synced:
            self.fresh.extend(rows)
        self._publish_gauges()
        self.owner._handled += popped  # after the gauges: flush() must never see a gap
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
                read = list(itertools.islice(self.fresh, size))
            else:
                try:
                    read = self.spool.read_after(self.cursor, size)
                except SpoolError as exc:  # a renewed spool is read again next turn
                    if not self.on_spool_error(exc, "could not read the spool"):
                        self.resume_at = time.monotonic() + self.backoff
                        self.backoff = min(2 * self.backoff, self.cfg.backoff_max_s)
                    break
                if not read:  # nothing spooled after the cursor: new rows go via memory
                    self.synced = True
            rows = _cap_bytes(read, self.cfg.max_batch_bytes)
            if not rows or not self.send_batch(rows):
                break
            if from_memory:
                for _ in rows:
                    self.fresh.popleft()
            elif len(read) < size and len(rows) == len(read):
                self.synced = True  # this read reached the end of the spool
            self.cursor = rows[-1][0]
            progressed = True
        return progressed

    def send_batch(self, rows: Sequence[tuple[int, bytes]]) -> bool:
        batch = next(self.batch_ids)
        payloads = [p for _, p in rows]
        if self.cfg.delta_batches:  # deltas against the previous row, formed per batch, so
            # every batch (and every re-send after a go-back or failover) stands alone
            frame = protocol.experience_delta_batch(batch, self.cfg.robot_id,
                                                    delta.encode_items(payloads))
        else:
            frame = protocol.experience_batch(batch, self.cfg.robot_id, payloads)
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
            self.last_reply_at = time.monotonic()
            try:
                frame = protocol.decode_frame(data)
            except ProtocolError as exc:
                self.stats.bad_replies += 1
                self.reply_log(logging.WARNING, "bad reply from consolidator: %s", exc)
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
                self.refused_log(logging.ERROR, "consolidator REFUSED our frame: %s",
                                 frame.body["reason"])
            else:
                self.stats.bad_replies += 1

    def on_ack(self, body: dict) -> None:
        batch = body["batch"]
        entry = self.sent.pop(batch, None)
        self.inflight.pop(batch, None)
        if entry is None:  # an ACK for a batch we forgot long ago: nothing left to do
            return
        seqs, epoch = entry
        self.remove_acked(seqs, epoch)
        self.stats.acked += len(seqs)
        self.stats.stored += body["stored"]
        self.stats.duplicates += body["duplicates"]
        if body["rejected"]:
            self.stats.rejected += len(body["rejected"])
            self.reject_log(logging.WARNING, "consolidator rejected an experience: %s",
                            body["rejected"][0][1])
        self.backoff = self.cfg.backoff_initial_s

    def remove_acked(self, seqs: list[int], epoch: int) -> None:
        """Delete an acknowledged batch; rows that stay go again (the store keeps one copy)."""
        for _ in range(2):  # twice when the first try met damage and renewed the spool
            try:
                if epoch == self.ooo_epoch:  # the range holds only rows this batch carried
                    self.spool.remove_range(seqs[0], seqs[-1])
                else:
                    self.spool.remove(seqs)
                return
            except SpoolError as exc:
                if not self.on_spool_error(exc, "could not remove acknowledged rows"):
                    return

    def on_monitor(self) -> None:
        while True:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            kind = event["event"]
            if kind in (zmq.EVENT_CONNECT_RETRIED, zmq.EVENT_CONNECTED):
                self.reopen_at = 0.0  # ZeroMQ is still trying on its own
            elif kind in (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                          zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_DISCONNECTED):
                self.reopen_at = time.monotonic() + self.reopen_backoff
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.reopen_at = 0.0
                self.reopen_backoff = _REOPEN_GRACE_S
                self.unreachable_since = 0.0
                self.owner._connected = True
                log.info("connected to consolidator %s", self.endpoint)
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
                    "public key to the consolidator's allowed keys", self.endpoint,
                    event["value"])
            elif kind in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                          zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
                self.stats.handshake_failures += 1
                self.owner._auth_log(
                    logging.ERROR, "handshake with %s failed (%s): wrong server key or CURVE "
                    "mismatch?", self.endpoint, zmq.Event(kind).name)
            elif kind == zmq.EVENT_DISCONNECTED:
                self.stats.disconnects += 1
                if self.owner._connected:
                    log.warning("consolidator %s disconnected; unacked experiences stay "
                                "spooled and are re-sent", self.endpoint)
                self.owner._connected = False
                self.unreachable_since = self.unreachable_since or time.monotonic()
                self.go_back()

    @property
    def endpoint(self) -> str:
        """The endpoint the socket is connected to now."""
        return self.endpoints[self.index]

    def check_failover(self) -> None:
        """Move on from an unreachable receiver; go home again after ``rehome_s`` away."""
        now = time.monotonic()
        if self.unreachable_since and now - self.unreachable_since >= self.cfg.ack_timeout_s:
            self.fail_over(f"unreachable for {now - self.unreachable_since:.1f} s")
        elif (self.index and self.cfg.rehome_s and not self.inflight
              and now - self.away_since >= self.cfg.rehome_s):
            self.stats.rehomes += 1
            log.info("trying the home endpoint %s again after %.0f s on %s",
                     self.endpoints[0], now - self.away_since, self.endpoint)
            self.switch_to(0)

    def fail_over(self, why: str) -> None:
        """Ship to the next endpoint; what is unacknowledged goes again from the spool."""
        self.stats.failovers += 1
        nxt = (self.index + 1) % len(self.endpoints)
        self.failover_log(logging.WARNING, "consolidator %s %s: failing over to %s (unacked "
                          "experiences are re-sent from the spool)", self.endpoint, why,
                          self.endpoints[nxt])
        self.switch_to(nxt)

    def switch_to(self, index: int) -> None:
        """Replace the socket with one connected to ``endpoints[index]``; re-send unacked."""
        self.close_socket()
        self.index = index
        self.owner._endpoint_now = self.endpoint
        self.away_since = time.monotonic() if index else 0.0
        self.replace_socket()

    def replace_socket(self) -> None:
        """Open a new socket to the current endpoint; everything unacked goes again."""
        self.socket, self.monitor = self.open_socket(self.endpoint)
        self.poller = zmq.Poller()
        self.poller.register(self.socket, zmq.POLLIN)
        self.poller.register(self.monitor, zmq.POLLIN)
        self.owner._connected = False
        self.reopen_at = 0.0
        self.unreachable_since = time.monotonic()
        self.go_back()

    def reopen(self) -> None:
        """Replace a socket ZeroMQ stopped reconnecting; re-send everything unacked."""
        self.stats.reopens += 1
        log.warning("no connection to %s and ZeroMQ is not retrying (refused key or "
                    "protocol error): opening a new socket (next try in %.0f s)",
                    self.endpoint, min(2 * self.reopen_backoff, _REOPEN_MAX_S))
        self.close_socket()
        self.reopen_backoff = min(2 * self.reopen_backoff, _REOPEN_MAX_S)
        self.replace_socket()

    def close_socket(self) -> None:
        """Close the socket and its monitor (idempotent per pair)."""
        try:
            self.socket.disable_monitor()
        except zmq.ZMQError:  # already closed
            pass
        self.monitor.close(0)
        self.socket.close(0)

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
        # Connected but silent (nothing at all since the overdue batch went out): another
        # receiver may answer. One that still acknowledges, only late, is busy, not hung:
        # leaving it would move its load onto the others and make the fleet flap.
        if len(self.endpoints) > 1 and self.last_reply_at < oldest - self.cfg.ack_timeout_s:
            self.fail_over(f"sent nothing for {self.cfg.ack_timeout_s:.2f} s")

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
        self.owner._disk_full = self.spool.disk_full
        self.stats.shed_disk_full = self.spool.shed_disk_full
        self.owner._inflight_count = len(self.inflight)


def _cap_bytes(rows: list[tuple[int, bytes]], limit: int) -> list[tuple[int, bytes]]:
    """The leading rows whose payloads fit ``limit`` bytes (always at least one row)."""
    total = 0
    for index, (_, payload) in enumerate(rows):
        total += len(payload)
        if total > limit and index:
            return rows[:index]
    return rows


# ------------------------------------------------------------------------------ receiver
