"""Recall service over real ZeroMQ on loopback: top-k, deadline, refusal, background use."""

from __future__ import annotations

import time

import numpy as np
import pytest

from thinkmem_ros.consolidator.recall_server import (
    EpisodeRef,
    RecallIndex,
    RecallServer,
    index_experiences,
)
from thinkmem_ros.link.protocol import Kind, encode_frame
from thinkmem_ros.robot.recall import BackgroundRecall, RecallClient, RecallError

D = 8


def _index(n: int = 50, seed: int = 0) -> tuple[RecallIndex, np.ndarray]:
    rng = np.random.default_rng(seed)
    emb = rng.normal(size=(n, D)).astype(np.float32)
    idx = RecallIndex(D)
    idx.add(emb, [EpisodeRef("r1", f"ep{i}", i, float(i), ["trend"], 1.0) for i in range(n)])
    return idx, emb


def test_index_exact_cosine_top_k():
    idx, emb = _index()
    q = emb[7] * 3.0
    items = idx.query(q, 5)
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    expected = np.argsort(-(unit @ (q / np.linalg.norm(q))))[:5]
    assert [it["seq"] for it in items] == expected.tolist() and items[0]["seq"] == 7
    assert items[0]["score"] == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(ValueError):
        idx.query(np.ones(D + 1), 3)


def test_batches_added_before_and_after_a_query_all_answer():
    whole, emb = _index(60, seed=3)
    idx = RecallIndex(D)
    refs = [EpisodeRef("r1", f"ep{i}", i, float(i), ["trend"], 1.0) for i in range(60)]
    idx.add(emb[:25], refs[:25])
    assert idx.query(emb[30], 1)[0]["seq"] != 30  # not added yet
    idx.add(emb[25:40], refs[25:40])
    idx.add(emb[40:], refs[40:])
    for q in (emb[30], emb[59], emb[0] + emb[45]):
        assert idx.query(q, 6) == whole.query(q, 6)
    assert idx.matrix().shape == (60, D) and len(idx) == 60


def test_server_answers_within_deadline():
    idx, emb = _index()
    with RecallServer(idx) as server:
        client = RecallClient(server.endpoint, "r1", deadline_s=2.0, k=3)
        try:
            items = client.recall(emb[3])
        finally:
            client.close()
    assert len(items) == 3 and items[0]["episode_id"] == "ep3" and server.served == 1


def test_client_times_out_without_server():
    client = RecallClient("tcp://127.0.0.1:1", "r1", deadline_s=0.05)
    start = time.monotonic()
    try:
        with pytest.raises(RecallError, match="timed out"):
            client.recall(np.ones(D))
    finally:
        client.close()
    assert time.monotonic() - start < 1.0 and client.timeouts == 1


def test_server_refuses_bad_requests():
    idx, _ = _index()
    with RecallServer(idx) as server:
        client = RecallClient(server.endpoint, "r1", deadline_s=2.0)
        try:
            with pytest.raises(RecallError, match="refused"):
                client.recall(np.ones(D + 3))  # wrong dimension
        finally:
            client.close()
        import zmq

        from thinkmem_ros.link.sockets import context

        raw = context().socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(server.endpoint)
        raw.send(encode_frame(Kind.RECALL_REQ, {"id": 1, "k": 999, "embedding": b"\0" * 32}))
        assert raw.poll(2000)
        assert raw.recv()[3] == Kind.REFUSED
        raw.close()
    assert server.refused == 2


def test_oversized_request_is_dropped_unread_and_the_server_keeps_serving():
    import zmq

    from thinkmem_ros.link.protocol import MAX_RECALL_REQUEST_BYTES
    from thinkmem_ros.link.sockets import context

    idx, emb = _index()
    with RecallServer(idx) as server:
        raw = context().socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(server.endpoint)
        # a well-formed request, only too big: without the socket limit it would be read
        # whole, decoded and refused (server.refused 1)
        big = np.zeros(MAX_RECALL_REQUEST_BYTES // 4 + 1024, "<f4").tobytes()
        raw.send(encode_frame(Kind.RECALL_REQ, {"id": 1, "k": 3, "embedding": big}))
        assert not raw.poll(500)  # no answer: the connection was dropped
        raw.close()
        client = RecallClient(server.endpoint, "r1", deadline_s=2.0, k=2)
        try:
            items = client.recall(emb[5])
        finally:
            client.close()
    assert items[0]["episode_id"] == "ep5"
    assert server.refused == 0 and server.served == 1


def test_oversized_reply_times_out_instead_of_being_read():
    import threading

    import zmq

    from thinkmem_ros.link.protocol import MAX_RECALL_REPLY_BYTES
    from thinkmem_ros.link.sockets import context

    # a real ROUTER that answers every request with a reply over the robot's limit
    # (64 evidence maps with 80 KB of labels each), as a broken server could
    router = context().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind("tcp://127.0.0.1:*")
    endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
    item = {"robot_id": "r1", "episode_id": "ep", "seq": 0, "stamp": 0.0, "score": 1.0,
            "labels": ["x" * 40_000, "y" * 40_000], "reward": None}
    stop = threading.Event()

    def answer() -> None:
        while not stop.is_set():
            if router.poll(50):
                parts = router.recv_multipart()
                body = {"id": 1, "items": [item] * 64}
                reply = encode_frame(Kind.RECALL_REP, body)
                assert len(reply) > MAX_RECALL_REPLY_BYTES
                router.send_multipart([parts[0], reply])

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    client = RecallClient(endpoint, "r1", deadline_s=1.0, k=64)
    try:
        with pytest.raises(RecallError, match="timed out"):
            client.recall(np.ones(D))
    finally:
        client.close()
        stop.set()
        thread.join(2)
        router.close(0)


def test_background_recall_never_blocks_the_tick():
    idx, emb = _index()
    with RecallServer(idx) as server:
        bg = BackgroundRecall(lambda: RecallClient(server.endpoint, "r1", deadline_s=2.0))
        try:
            start = time.monotonic()
            bg.submit("tick-1", emb[5])
            assert time.monotonic() - start < 0.05
            results = []
            deadline = time.monotonic() + 5.0
            while not results and time.monotonic() < deadline:
                results = bg.take()
                time.sleep(0.01)
        finally:
            bg.close()
    assert results[0][0] == "tick-1" and results[0][1][0]["seq"] == 5 and results[0][2] is None


def test_background_recall_reports_timeout():
    bg = BackgroundRecall(lambda: RecallClient("tcp://127.0.0.1:1", "r1", deadline_s=0.05))
    try:
        bg.submit("t", np.ones(D))
        results = []
        deadline = time.monotonic() + 5.0
        while not results and time.monotonic() < deadline:
            results = bg.take()
            time.sleep(0.01)
    finally:
        bg.close()
    assert results[0][1] is None and "timed out" in results[0][2]


def _results_of(bg: BackgroundRecall, want: int) -> list:
    results: list = []
    deadline = time.monotonic() + 5.0
    while len(results) < want and time.monotonic() < deadline:
        results += bg.take()
        time.sleep(0.01)
    return results


def test_a_client_that_cannot_connect_fails_each_request_and_the_worker_lives():
    # a '*' port: ZeroMQ itself refuses the connect inside the worker thread
    bg = BackgroundRecall(lambda: RecallClient("tcp://127.0.0.1:*", "r1", deadline_s=0.05))
    try:
        bg.submit("a", np.ones(D))
        first = _results_of(bg, 1)
        bg.submit("b", np.ones(D))
        second = _results_of(bg, 1)
        alive = bg._thread.is_alive()
    finally:
        bg.close()
    assert [r[0] for r in first + second] == ["a", "b"]
    for _, evidence, error in first + second:
        assert evidence is None and "cannot connect to 'tcp://127.0.0.1:*'" in error
    assert alive


def test_the_client_refuses_an_endpoint_it_cannot_connect_to_as_a_recall_error():
    with pytest.raises(RecallError, match="cannot connect"):
        RecallClient("bogus://x", "r1")


def test_index_from_experiences_with_the_runtime(source_bundle):
    from thinkmem_ros.consolidator.values import embed_experiences
    from thinkmem_ros.link.experience import Experience
    from thinkmem_ros.policy.runtime import PolicyRuntime

    runtime = PolicyRuntime(source_bundle)
    rng = np.random.default_rng(1)
    k, f = runtime.window, len(runtime.signals)
    exps = [Experience("r1", f"ep{i}", float(i), rng.normal(size=(k, f)) * (i + 1),
                       runtime.labels, np.full(len(runtime.labels), 0.6, np.float32), 1,
                       seq=i, reward=0.5) for i in range(6)]
    idx = index_experiences(exps, lambda b: embed_experiences(runtime, b),
                            dim=embed_experiences(runtime, exps[:1]).shape[1])
    query = embed_experiences(runtime, exps[2:3])[0]
    assert len(idx) == 6 and idx.query(query, 1)[0]["episode_id"] == "ep2"


GOOD_ITEM = {"robot_id": "r1", "episode_id": "ep", "seq": 3, "stamp": 1.5, "score": 0.9,
             "labels": ["trend"], "reward": None}


@pytest.mark.parametrize("items, says", [
    ([{**GOOD_ITEM, "episode_id": b"bytes"}], "episode_id"),
    ([{**GOOD_ITEM, "score": float("nan")}], "score"),
    ([{**GOOD_ITEM, "seq": 2**64 - 1}], "seq"),
    ([{**GOOD_ITEM, "labels": [1, 2]}], "labels"),
    ([{**GOOD_ITEM, "extra": 1}], "not an evidence map"),
    ([GOOD_ITEM] * 5, "at most 4"),
], ids=["bytes", "nan", "big-int", "labels", "extra-key", "too-many"])
def test_evidence_the_node_could_not_publish_is_refused(items, says):
    """A broken or hostile server's evidence must not reach the node's JSON and gates."""
    import threading

    import zmq

    from thinkmem_ros.link.sockets import context

    router = context().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind("tcp://127.0.0.1:*")
    endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)

    def answer() -> None:
        for reply_items in (items, [GOOD_ITEM]):  # the hostile reply, then a good one
            if not router.poll(5000):
                return
            identity, request = router.recv_multipart()
            from thinkmem_ros.link.protocol import decode_frame

            req_id = decode_frame(request).body["id"]
            router.send_multipart([identity, b"garbage, not a frame"])  # a stray frame too
            router.send_multipart([identity, encode_frame(
                Kind.RECALL_REP, {"id": req_id, "items": reply_items})])

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    client = RecallClient(endpoint, "r1", deadline_s=2.0, k=4)
    try:
        with pytest.raises(RecallError, match=says):
            client.recall(np.ones(D))
        assert client.recall(np.ones(D)) == [GOOD_ITEM]  # the stray frame was skipped
        assert client.bad_frames == 2
    finally:
        client.close()
        thread.join(5)
        router.close(0)
