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
