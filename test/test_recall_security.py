"""Security of episodic recall: who may ask, what a hostile peer can cost, what it breaks.

Every test runs real ZeroMQ sockets (and real CURVE keys where authentication is
checked) against a ``RecallServer`` over a synthetic index; no model is needed.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import zmq

from thinkmem_ros.consolidator.recall_server import (
    EpisodeRef,
    RecallIndex,
    RecallServer,
)
from thinkmem_ros.link.protocol import Kind, decode_frame, encode_frame
from thinkmem_ros.link.sockets import context
from thinkmem_ros.robot.recall import RecallClient, RecallError

D = 16


def _index(n: int, dim: int = D, seed: int = 0) -> tuple[RecallIndex, np.ndarray]:
    emb = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    index = RecallIndex(dim)
    index.add(emb, [EpisodeRef("r0", f"e{i}", i, float(i), [], None) for i in range(n)])
    return index, emb


@pytest.mark.parametrize("scale", [1.0, 1e20, 1e-25, 1e37, 1e-36])
def test_a_query_finds_its_own_row_at_any_finite_scale(scale):
    index, emb = _index(50)
    items = index.query(emb[5] * np.float32(scale), 3)
    assert items[0]["seq"] == 5
    assert items[0]["score"] == pytest.approx(1.0, abs=1e-5)


def test_rows_of_extreme_magnitude_are_indexed_by_direction():
    index, emb = _index(20)
    huge = RecallIndex(D)
    huge.add(emb * np.float32(1e30), index.refs)
    assert huge.query(emb[3], 1)[0]["seq"] == 3
    assert huge.query(emb[3], 1)[0]["score"] == pytest.approx(1.0, abs=1e-5)


def _router() -> tuple[zmq.Socket, str]:
    sock = context().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    return sock, f"tcp://127.0.0.1:{port}"


def test_a_refusal_names_the_request_it_refuses():
    index, _ = _index(10)
    with RecallServer(index) as server:
        raw = context().socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(server.endpoint)
        try:
            raw.send(encode_frame(Kind.RECALL_REQ, {"id": 41, "robot_id": "r0", "k": 999,
                                                    "embedding": b"\0" * 4 * D}))
            assert raw.poll(5000)
            reply = decode_frame(raw.recv())
        finally:
            raw.close(0)
    assert reply.kind is Kind.REFUSED and reply.body["id"] == 41


def test_a_late_refusal_of_an_earlier_request_does_not_fail_the_next():
    router, endpoint = _router()
    evidence = {"robot_id": "r", "episode_id": "e", "seq": 1, "stamp": 1.0, "score": 0.5,
                "labels": [], "reward": None}

    def late_server() -> None:
        who, first = router.recv_multipart()
        who, second = router.recv_multipart()
        first_id = decode_frame(first).body["id"]
        router.send_multipart([who, encode_frame(Kind.REFUSED, {
            "reason": "late refusal of the first request", "id": first_id})])
        router.send_multipart([who, encode_frame(Kind.RECALL_REP, {
            "id": decode_frame(second).body["id"], "items": [evidence]})])

    worker = threading.Thread(target=late_server, daemon=True)
    worker.start()
    client = RecallClient(endpoint, "r", deadline_s=0.3, k=1)
    try:
        with pytest.raises(RecallError, match="timed out"):
            client.recall(np.ones(4))  # the server sits on it
        assert client.recall(np.ones(4)) == [evidence]
        assert client.stale == 1
    finally:
        client.close()
        worker.join(5.0)
        router.close(0)
