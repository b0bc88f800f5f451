"""Episodic recall: top-k nearest past episodes by policy embedding, over ZeroMQ with a deadline.

Why: when the RECALL probe fires, the LLM should see explicit past evidence, not only the
policy's compressed knowledge. The consolidator keeps an index of past experiences'
embeddings (``RecallIndex``, exact cosine top-k in numpy) and answers requests on a ROUTER
socket (``RecallServer``). The robot asks through a DEALER (``RecallClient``) that never
waits longer than its deadline and raises ``RecallError`` otherwise, so the caller keeps the
original situation; ``BackgroundRecall`` moves even that wait off the control tick.

Wire (protocol.py kinds RECALL_REQ / RECALL_REP, msgpack maps):
- RECALL_REQ ``{"id": int, "robot_id": str, "k": int, "embedding": bytes (<f4, d values)}``
- RECALL_REP ``{"id": int, "items": [{"robot_id", "episode_id", "seq", "stamp", "score",
  "labels", "reward"}]}``; a bad request gets REFUSED with the reason.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import zmq

from .experience import Experience
from .protocol import Kind, ProtocolError, decode_frame, encode_frame, refused
from .transport import context

log = logging.getLogger(__name__)
MAX_K = 64


class RecallError(RuntimeError):
    """Recall did not produce evidence in time (timeout, refusal, bad reply)."""


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
    """Exact cosine top-k over stored embeddings (numpy; fine for 10^5 rows of d <= 256)."""

    def __init__(self, dim: int) -> None:
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        self.dim = dim
        self._rows: list[np.ndarray] = []
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
        norms = np.linalg.norm(e, axis=1, keepdims=True)
        self._matrix = np.vstack([self._matrix, e / np.maximum(norms, 1e-12)])
        self.refs.extend(refs)

    def query(self, embedding: np.ndarray, k: int, exclude_robot_episode: tuple[str, str] | None
              = None) -> list[dict]:
        """Return the k most similar past experiences as evidence maps, best first."""
        q = np.asarray(embedding, dtype=np.float32).reshape(-1)
        if q.shape[0] != self.dim or not np.isfinite(q).all():
            raise ValueError(f"query must be {self.dim} finite values, got shape {q.shape}")
        if not len(self.refs) or k < 1:
            return []
        scores = self._matrix @ (q / max(float(np.linalg.norm(q)), 1e-12))
        k = min(k, scores.size)
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        return [self.refs[i].as_evidence(scores[i]) for i in top]


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
    return index


class RecallServer:
    """Answers RECALL_REQ on a ROUTER socket from a background thread."""

    def __init__(self, index: RecallIndex, endpoint: str = "tcp://127.0.0.1:*",
                 poll_ms: int = 50) -> None:
        self.index = index
        self._lock = threading.Lock()
        self._socket = context().socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(endpoint)
        self.endpoint = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._poll_ms = poll_ms
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="recall-server", daemon=True)
        self.served = 0
        self.refused = 0

    def start(self) -> RecallServer:
        """Start serving; returns self."""
        self._thread.start()
        return self

    def replace_index(self, index: RecallIndex) -> None:
        """Swap in a rebuilt index (after a consolidation round)."""
        with self._lock:
            self.index = index

    def _answer(self, data: bytes) -> bytes:
        try:
            frame = decode_frame(data)
            if frame.kind is not Kind.RECALL_REQ:
                raise ProtocolError(f"expected RECALL_REQ, got {frame.kind.name}")
            body = frame.body
            req_id, k, raw = body.get("id"), body.get("k"), body.get("embedding")
            if type(req_id) is not int or type(k) is not int or type(raw) is not bytes:
                raise ProtocolError("RECALL_REQ needs int id, int k, bytes embedding")
            if not 1 <= k <= MAX_K or len(raw) % 4:
                raise ProtocolError(f"RECALL_REQ: k {k} outside [1, {MAX_K}] or bad embedding")
            with self._lock:
                items = self.index.query(np.frombuffer(raw, dtype="<f4"), k)
        except (ProtocolError, ValueError) as exc:
            self.refused += 1
            log.warning("recall request refused: %s", exc)
            return refused(str(exc))
        self.served += 1
        return encode_frame(Kind.RECALL_REP, {"id": req_id, "items": items})

    def _serve(self) -> None:
        sock = self._socket
        while not self._stop.is_set():
            if not sock.poll(self._poll_ms, zmq.POLLIN):
                continue
            parts = sock.recv_multipart()
            if len(parts) < 2:
                continue
            sock.send_multipart([parts[0], self._answer(parts[-1])])

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the thread (bounded wait) and close the socket."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self._socket.close(0)

    def __enter__(self) -> RecallServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class RecallClient:
    """Robot-side requester: one outstanding request, a hard deadline, stale replies dropped."""

    def __init__(self, endpoint: str, robot_id: str, deadline_s: float = 0.05, k: int = 4) -> None:
        if deadline_s <= 0 or not 1 <= k <= MAX_K:
            raise ValueError(f"deadline_s must be > 0 and k in [1, {MAX_K}], got "
                             f"{deadline_s}, {k}")
        self.endpoint = endpoint
        self.robot_id = robot_id
        self.deadline_s = deadline_s
        self.k = k
        self._socket = context().socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, 4)
        self._socket.connect(endpoint)
        self._next_id = 0
        self.timeouts = 0

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
            except ProtocolError as exc:
                raise RecallError(f"bad recall reply: {exc}") from exc
            if reply.kind is Kind.REFUSED:
                raise RecallError(f"recall refused: {reply.body.get('reason')}")
            if reply.kind is Kind.RECALL_REP and reply.body.get("id") == req_id:
                items = reply.body.get("items")
                if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
                    raise RecallError("bad recall reply: items must be a list of maps")
                return items
            remaining_ms = clock.remaining_ms()  # a stale reply to an earlier request
        self.timeouts += 1
        raise RecallError(f"recall timed out after {self.deadline_s * 1000:.0f} ms")

    def close(self) -> None:
        """Close the socket without lingering."""
        self._socket.close(0)


class _Deadline:
    def __init__(self, seconds: float) -> None:
        import time

        self._clock = time.monotonic
        self._end = self._clock() + seconds

    def remaining_ms(self) -> int:
        return max(0, int((self._end - self._clock()) * 1000))


class BackgroundRecall:
    """Runs recall off the control tick: ``submit`` never blocks, ``take`` polls results.

    At most one request waits; a submit while one is waiting replaces it (the newest
    situation matters). Each result is ``(tag, evidence | None, error | None)``.
    The client is created inside the worker thread (ZeroMQ sockets are not thread-safe).
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
        client = self._make()
        try:
            while not self._stop.is_set():
                try:
                    tag, emb = self._requests.get(timeout=0.05)
                except queue.Empty:
                    continue
                try:
                    result = (tag, client.recall(emb), None)
                except RecallError as exc:
                    result = (tag, None, str(exc))
                try:
                    self._results.put_nowait(result)
                except queue.Full:
                    self.dropped += 1
        finally:
            client.close()

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the worker (bounded wait)."""
        self._stop.set()
        self._thread.join(timeout_s)
