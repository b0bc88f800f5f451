"""Episodic recall, offboard end: an index of past experiences answering over ZeroMQ.

Why: when the robot's RECALL probe fires, the LLM should see explicit past evidence, not
only the policy's compressed knowledge. The consolidator keeps an index of past
experiences' embeddings (``RecallIndex``, exact cosine top-k in numpy) and answers requests
on a ROUTER socket (``RecallServer``); the robot asks through ``robot.recall``.

Wire (protocol.py kinds RECALL_REQ / RECALL_REP, msgpack maps):
- RECALL_REQ ``{"id": int, "robot_id": str, "k": int, "embedding": bytes (<f4, d values)}``
- RECALL_REP ``{"id": int, "items": [{"robot_id", "episode_id", "seq", "stamp", "score",
  "labels", "reward"}]}``; a bad request gets REFUSED ``{"reason": str, "id": int}`` (the
  id when the request carried one, so the robot can tell which request it answers).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zmq

from thinkmem_ros.link.experience import Experience
from thinkmem_ros.link.protocol import (
    MAX_REASON,
    MAX_RECALL_K,
    MAX_RECALL_REQUEST_BYTES,
    Kind,
    ProtocolError,
    decode_frame,
    encode_frame,
    refused,
)
from thinkmem_ros.link.security import (
    SecurityError,
    authorise_clients,
    load_allow_list,
    load_curve_keypair,
    release_domain,
)
from thinkmem_ros.link.sockets import RateLimitedLog, context

log = logging.getLogger(__name__)


@dataclass
class EpisodeRef:
    """What the index remembers about one past experience."""

    robot_id: str
    episode_id: str
    seq: int
    stamp: float
    labels: list[str]
    reward: float | None

    def as_evidence(self, score: float) -> dict:
        """Return the evidence map sent to the robot."""
        return {"robot_id": self.robot_id, "episode_id": self.episode_id, "seq": self.seq,
                "stamp": self.stamp, "score": float(score), "labels": list(self.labels),
                "reward": self.reward}


class RecallIndex:
    """Exact cosine top-k over stored embeddings (numpy; fine for 10^5 rows of d <= 256).

    Rows arrive a batch at a time while the store is read (``index_experiences``); they are
    kept as batches and joined into one matrix once, at the first query after them. Joining
    at every batch copied the whole matrix each time: a build quadratic in the store.
    """

    def __init__(self, dim: int) -> None:
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        self.dim = dim
        self._pending: list[np.ndarray] = []
        self._matrix = np.zeros((0, dim), dtype=np.float32)
        self.refs: list[EpisodeRef] = []

    def __len__(self) -> int:
        return len(self.refs)

    def add(self, embeddings: np.ndarray, refs: list[EpisodeRef]) -> None:
        """Add (n, d) embeddings with their references."""
        e = np.asarray(embeddings, dtype=np.float32).reshape(-1, self.dim)
        if e.shape[0] != len(refs):
            raise ValueError(f"{e.shape[0]} embeddings for {len(refs)} references")
        if not np.isfinite(e).all():
            raise ValueError("embeddings contain NaN or inf")
        self._pending.append(unit_rows(e))
        self.refs.extend(refs)

    def matrix(self) -> np.ndarray:
        """The unit-norm embeddings, one row per reference (joins pending batches once)."""
        if self._pending:
            self._matrix = np.concatenate([self._matrix, *self._pending])
            self._pending = []
        return self._matrix

    def query(self, embedding: np.ndarray, k: int, exclude_robot_episode: tuple[str, str] | None
              = None) -> list[dict]:
        """Return the k most similar past experiences as evidence maps, best first."""
        q = np.asarray(embedding, dtype=np.float32).reshape(-1)
        if q.shape[0] != self.dim or not np.isfinite(q).all():
            raise ValueError(f"query must be {self.dim} finite values, got shape {q.shape}")
        if not len(self.refs) or k < 1:
            return []
        scores = self.matrix() @ unit_query(q)
        k = min(k, scores.size)
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        return [self.refs[i].as_evidence(scores[i]) for i in top]


def unit_rows(e: np.ndarray) -> np.ndarray:
    """Each row of ``e`` scaled to unit length (float64 inside, as ``unit_query``)."""
    e64 = e.astype(np.float64)
    peak = np.max(np.abs(e64), axis=1, keepdims=True) if e64.size else np.ones((0, 1))
    e64 /= np.where(peak > 0, peak, 1.0)
    norms = np.linalg.norm(e64, axis=1, keepdims=True)
    return (e64 / np.where(norms > 0, norms, 1.0)).astype(np.float32)


def unit_query(q: np.ndarray) -> np.ndarray:
    """``q`` scaled to unit length, as float32; zeros stay zeros.

    Why float64: cosine ignores scale, but a float32 norm of a query scaled by 1e20
    overflows to inf (every score 0, arbitrary rows returned) and one scaled by 1e-25
    underflows to 0. Dividing by the largest magnitude first keeps every finite float32
    query within float64's range before the norm is taken.
    """
    q64 = q.astype(np.float64)
    peak = float(np.max(np.abs(q64))) if q64.size else 0.0
    if peak == 0.0:
        return np.zeros_like(q, dtype=np.float32)
    q64 /= peak
    return (q64 / np.linalg.norm(q64)).astype(np.float32)


def index_experiences(experiences: Iterable[Experience], embed: Callable[[list[Experience]],
                      np.ndarray], dim: int, batch: int = 256) -> RecallIndex:
    """Build an index from experiences; ``embed`` maps a batch to (n, d) embeddings.

    ``consolidator.values.embed_experiences`` is the usual ``embed`` (the policy runtime).
    """
    index = RecallIndex(dim)
    chunk: list[Experience] = []

    def flush() -> None:
        if chunk:
            refs = [EpisodeRef(e.robot_id, e.episode_id, int(e.seq or 0), e.stamp,
                               [lab for lab, p in zip(e.labels, e.probabilities, strict=True)
                                if p >= 0.5], e.reward) for e in chunk]
            index.add(embed(chunk), refs)
            chunk.clear()

    for exp in experiences:
        chunk.append(exp)
        if len(chunk) >= batch:
            flush()
    flush()
    index.matrix()  # joined here, not inside the server thread's first answer
    return index


DEFAULT_RECALL_EXPERIENCES = 200_000  # ~0.36 GB of 448-dim embeddings; 0 = every one


def index_store(db_path: Path | str, bundle, batch: int = 256,
                limit: int = DEFAULT_RECALL_EXPERIENCES) -> RecallIndex:
    """An index of the newest ``limit`` stored experiences (0: every one), by ``bundle``.

    The robot asks with the embedding of its running bundle, so the index must be built
    by the same model: the consolidator rebuilds it whenever ``current`` moves. That
    re-embeds what the index holds and keeps it in memory, so without a bound every new
    bundle would cost the whole store; the newest rows (by row id, the order they arrived
    in) are the evidence of the fleet as it is now.
    """
    from thinkmem_ros.consolidator.store import ExperienceStore
    from thinkmem_ros.consolidator.values import embed_experiences
    from thinkmem_ros.policy.runtime import PolicyRuntime

    runtime = PolicyRuntime(bundle, threads=1)
    dim = int(runtime.predict(*_probe_inputs(runtime)).embedding.shape[1])
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    want = (runtime.window, len(runtime.manifest.signals))
    skipped = 0

    def fitting(experiences: Iterable[Experience]) -> Iterator[Experience]:
        """Only the windows this bundle can embed.

        A robot that ran a bundle of another window length (its records are stored) made
        the whole index, and so the consolidator's start, fail on a shape error.
        """
        nonlocal skipped
        for exp in experiences:
            if exp.window.shape == want:
                yield exp
            else:
                skipped += 1

    with ExperienceStore(db_path) as store:
        after = max(0, store.last_id() - limit) if limit else 0
        index = index_experiences(fitting(store.iter_all(after_id=after)),
                                  lambda chunk: embed_experiences(runtime, chunk), dim, batch)
    if skipped:
        log.warning("recall index: %d stored experiences with windows other than %s left "
                    "out (recorded under another bundle)", skipped, want)
    return index


def _probe_inputs(runtime) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One all-zero input, to read the embedding width off the model itself."""
    shape = (1, runtime.window, len(runtime.manifest.signals))
    return (np.zeros(shape, np.float32), np.ones(shape, np.float32),
            np.zeros((1, runtime.max_events), np.int64))


def refusal(reason: str, req_id: object) -> bytes:
    """A REFUSED frame that names the request it answers (when it had an int id).

    Why: the robot asks again while an earlier request may still be answered, so a
    refusal without an id that arrived late failed the next request instead of its own.
    """
    if type(req_id) is not int:
        return refused(reason)
    return encode_frame(Kind.REFUSED, {"reason": reason[:MAX_REASON], "id": req_id})


DEFAULT_MAX_AGE_S = 0.25
"""Oldest request answered: a robot waits ``recall_deadline_s`` (50 ms by default)."""
DEFAULT_PEER_QUEUE = 4
"""Requests one asker (a robot's key; a connection without keys) may have waiting; beyond
it its oldest is shed."""
_RCVHWM = 16  # requests ZeroMQ holds per connection before the peer's TCP backs up
_DRAIN_MAX = 1024  # requests read per turn before one per peer is answered


class _PeerQueues:
    """Waiting requests per asker, answered one per asker in turn.

    Why: answered in arrival order, one peer's backlog delayed every other robot by the
    whole backlog; in turns, a robot waits at most one query per other asking peer. With
    keys the asker is the key, not the connection: one allow-listed key opening 40
    connections took 40 turns for each one of another robot's and made its recall time out.
    """

    def __init__(self, per_peer: int) -> None:
        self._per_peer = per_peer
        self._queues: dict[bytes, collections.deque] = {}
        self.shed = 0

    def __bool__(self) -> bool:
        return bool(self._queues)

    def put(self, asker: bytes, item: tuple) -> None:
        queue = self._queues.setdefault(asker, collections.deque())
        if len(queue) >= self._per_peer:
            queue.popleft()  # the newest situation is the one the robot still waits on
            self.shed += 1
        queue.append(item)

    def one_each(self) -> list[tuple[bytes, tuple]]:
        """The oldest request of every waiting asker (removed from its queue)."""
        out = []
        for asker in list(self._queues):
            queue = self._queues[asker]
            out.append((asker, queue.popleft()))
            if not queue:
                del self._queues[asker]
        return out


class RecallServer:
    """Answers RECALL_REQ on a ROUTER socket from a background thread.

    With ``server_secret_file`` and ``allowed_clients`` the socket is a CURVE server
    whose ZAP handler admits only the allow-list's keys (``link.security``, as the
    receiver), and a request is answered only when its ``robot_id`` is the robot its
    sender's key is bound to: the answers name the fleet's robots, episodes, labels and
    rewards. ``allowed_clients`` is anything ``load_allow_list`` reads, or a callable
    returning the allow-list in force (the service passes the receiver's, so an edit the
    receiver picks up revokes recall too). Without keys nothing is authenticated.
    """

    def __init__(self, index: RecallIndex, endpoint: str = "tcp://127.0.0.1:*",
                 poll_ms: int = 50, *, server_secret_file: Path | str | None = None,
                 allowed_clients: object = None, max_age_s: float = DEFAULT_MAX_AGE_S,
                 peer_queue: int = DEFAULT_PEER_QUEUE) -> None:
        if max_age_s <= 0 or peer_queue < 1:
            raise ValueError(f"recall: max_age_s must be > 0 and peer_queue >= 1, got "
                             f"{max_age_s}, {peer_queue}")
        self.max_age_s = max_age_s
        self._queues = _PeerQueues(peer_queue)
        self.expired = 0
        if (server_secret_file is None) != (allowed_clients is None):
            raise SecurityError("recall: CURVE needs both the server key pair and the "
                                "allow-list")
        self.index = index
        self._lock = threading.Lock()
        # a flood of bad requests must not flood the log: the first, then every 100th
        self._refusal_log = RateLimitedLog(log, 100)
        self._allow_source = allowed_clients if callable(allowed_clients) else None
        self._domain = f"thinkmem-recall-{id(self):x}"
        self._auth = None
        self._socket = self._bind(endpoint, server_secret_file, allowed_clients)
        self.endpoint = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._poll_ms = poll_ms
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="recall-server", daemon=True)
        self.served = 0
        self.refused = 0

    @property
    def shed(self) -> int:
        """Requests dropped because their asker had ``peer_queue`` waiting."""
        return self._queues.shed

    @property
    def authenticated(self) -> bool:
        """True when only allow-listed CURVE keys are answered."""
        return self._auth is not None

    def _bind(self, endpoint: str, secret_file: Path | str | None,
              allowed: object) -> zmq.Socket:
        sock = context().socket(zmq.ROUTER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            # a request is an embedding and a few ints: anything far bigger is not one, and
            # ZeroMQ drops its connection before the frame is in memory
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_RECALL_REQUEST_BYTES)
            # a flooding peer's excess waits in its own TCP buffers, not in this process
            sock.setsockopt(zmq.RCVHWM, _RCVHWM)
            if secret_file is not None:
                self._curve_server(sock, secret_file, allowed)
            sock.bind(endpoint)
        except BaseException:
            sock.close(0)
            self._release()
            raise
        return sock

    def _curve_server(self, sock: zmq.Socket, secret_file: Path | str,
                      allowed: object) -> None:
        allow = load_allow_list(allowed() if callable(allowed) else allowed)
        public, secret = load_curve_keypair(secret_file)
        self._auth = authorise_clients(context(), self._domain, allow, "recall")
        sock.curve_server = True
        sock.curve_publickey = public
        sock.curve_secretkey = secret
        sock.zap_domain = self._domain.encode()
        log.info("recall: CURVE on, %d client keys allowed", len(allow.robots))

    def _release(self) -> None:
        if self._auth is not None:
            release_domain(context(), self._domain)

    def start(self) -> RecallServer:
        """Start serving; returns self."""
        self._thread.start()
        return self

    def replace_index(self, index: RecallIndex) -> None:
        """Swap in a rebuilt index (after a consolidation round)."""
        with self._lock:
            self.index = index

    def _follow_allow_list(self) -> None:
        """Take the allow-list now in force from the source (a reload revokes keys here too)."""
        if self._allow_source is None or self._auth is None:
            return
        fresh = self._allow_source()
        if fresh is not None and fresh is not self._auth.allow:
            self._auth.allow = load_allow_list(fresh)

    def _identity_problem(self, claimed: object, user: str | None) -> str | None:
        """Why the sender may not ask as ``claimed`` (None: it may, or nothing is checked)."""
        if self._auth is None:
            return None
        bound = self._auth.allow.robot_of(user)
        if bound is None:
            return "this key is not (or no longer) on the allow-list"
        if claimed != bound:
            return f"this key speaks for robot {bound!r}, not {str(claimed)[:64]!r}"
        return None

    def _answer(self, data: bytes, user: str | None = None,
                arrived: float | None = None) -> bytes | None:
        """The reply to one request; None when it arrived ``max_age_s`` before its turn."""
        req_id = None
        try:
            frame = decode_frame(data)
            if frame.kind is not Kind.RECALL_REQ:
                raise ProtocolError(f"expected RECALL_REQ, got {frame.kind.name}")
            body = frame.body
            req_id, k, raw = body.get("id"), body.get("k"), body.get("embedding")
            problem = self._identity_problem(body.get("robot_id"), user)
            if problem:
                raise ProtocolError(f"RECALL_REQ refused: {problem}")
            if type(req_id) is not int or type(k) is not int or type(raw) is not bytes:
                raise ProtocolError("RECALL_REQ needs int id, int k, bytes embedding")
            if not 1 <= k <= MAX_RECALL_K or len(raw) % 4:
                raise ProtocolError(f"RECALL_REQ: k {k} outside [1, {MAX_RECALL_K}] "
                                    "or bad embedding")
            with self._lock:  # the age that counts is the one when the query would run
                if arrived is not None and time.monotonic() - arrived > self.max_age_s:
                    self.expired += 1
                    return None
                items = self.index.query(np.frombuffer(raw, dtype="<f4"), k)
        except (ProtocolError, ValueError) as exc:
            self.refused += 1
            self._refusal_log(logging.WARNING, "recall request refused: %s", exc)
            return refusal(str(exc), req_id)
        self.served += 1
        return encode_frame(Kind.RECALL_REP, {"id": req_id, "items": items})

    def _serve(self) -> None:
        sock = self._socket
        while not self._stop.is_set():
            self._follow_allow_list()
            if not self._queues and not sock.poll(self._poll_ms, zmq.POLLIN):
                continue
            self._drain()
            for request in self._queues.one_each():
                self._serve_one(request)
                self._drain()  # arrival stamps stay within one query of the truth

    def _drain(self) -> None:
        """Move what has arrived into the per-peer queues, stamped with its arrival."""
        for _ in range(_DRAIN_MAX):
            try:
                parts = self._socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(parts) < 2:
                continue
            # ZAP's User-Id (the sender's Z85 key) travels with every message
            user = parts[-1].get("User-Id") if self._auth is not None else None
            identity = parts[0].bytes
            asker = identity if user is None else user.encode()
            self._queues.put(asker, (time.monotonic(), parts[-1].bytes, user, identity))

    def _serve_one(self, request: tuple[bytes, tuple[float, bytes, str | None, bytes]]) -> None:
        """Answer one queued request, or drop it unanswered when its asker has given up.

        Why: a few peers queueing hundreds of requests made every robot's recall time
        out behind them; a request older than ``max_age_s`` (about the robot's deadline)
        is answered to nobody, so its query is not paid for.
        """
        _, (arrived, data, user, identity) = request
        reply = self._answer(data, user, arrived)
        if reply is not None:
            self._socket.send_multipart([identity, reply], zmq.NOBLOCK)

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the thread (bounded wait), close the socket and forget its ZAP domain."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self._socket.close(0)
        self._release()

    def __enter__(self) -> RecallServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
