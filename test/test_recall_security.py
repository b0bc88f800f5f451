"""Security of episodic recall: who may ask, what a hostile peer can cost, what it breaks.

Every test runs real ZeroMQ sockets (and real CURVE keys where authentication is
checked) against a ``RecallServer`` over a synthetic index; no model is needed.
"""

from __future__ import annotations

import shutil
import threading
import time

import consolidator_world as world
import numpy as np
import pytest
import zmq
import zmq.auth
from conftest import wait_for

from thinkmem_ros.consolidator.recall_server import (
    EpisodeRef,
    RecallIndex,
    RecallServer,
)
from thinkmem_ros.consolidator.service import ConsolidatorConfig, ConsolidatorService
from thinkmem_ros.link.protocol import Kind, decode_frame, encode_frame
from thinkmem_ros.link.security import write_curve_keypair, write_signing_keypair
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


@pytest.fixture
def fleet_keys(tmp_path):
    """The consolidator's key pair and an allow-list folder binding r1 and r2 to their keys."""
    keys = tmp_path / "keys"
    write_curve_keypair(keys, "server")
    for robot in ("r1", "r2", "stranger"):
        public, _ = write_curve_keypair(keys, robot)
        if robot != "stranger":
            (keys / "allowed").mkdir(exist_ok=True)
            shutil.copy(public, keys / "allowed" / f"{robot}.key")
    return keys


def _curve_client(endpoint: str, keys, robot: str, as_robot: str | None = None,
                  deadline_s: float = 2.0) -> RecallClient:
    return RecallClient(endpoint, as_robot or robot, deadline_s=deadline_s, k=2, curve="on",
                        server_public_key=keys / "server.key",
                        client_secret_file=keys / f"{robot}.key_secret")


def test_with_keys_only_allow_listed_robots_asking_in_their_own_name_are_answered(fleet_keys):
    index, emb = _index(20)
    with RecallServer(index, server_secret_file=fleet_keys / "server.key_secret",
                      allowed_clients=fleet_keys / "allowed") as server:
        assert server.authenticated
        own = _curve_client(server.endpoint, fleet_keys, "r1")
        posing = _curve_client(server.endpoint, fleet_keys, "r1", as_robot="r2")
        stranger = _curve_client(server.endpoint, fleet_keys, "stranger", deadline_s=0.5)
        plain = RecallClient(server.endpoint, "r1", deadline_s=0.5, k=2, curve="off")
        try:
            assert own.recall(emb[4])[0]["seq"] == 4
            with pytest.raises(RecallError, match="speaks for robot 'r1'"):
                posing.recall(emb[4])
            with pytest.raises(RecallError, match="timed out|unreachable"):
                stranger.recall(emb[4])  # its handshake is refused by ZAP
            with pytest.raises(RecallError, match="timed out|unreachable"):
                plain.recall(emb[4])  # no CURVE: no handshake at all
        finally:
            for client in (own, posing, stranger, plain):
                client.close()
    assert server.served == 1


def test_the_consolidator_serves_recall_with_its_receivers_keys(tmp_path, fleet_keys):
    _, signing = write_signing_keypair(tmp_path / "sign", "c")
    config = ConsolidatorConfig(db_path=tmp_path / "c.db", publish_dir=tmp_path / "pub",
                                signing_key=signing, initial_bundle=world.running_bundle(
                                    tmp_path / "running"),
                                bind="tcp://127.0.0.1:*", recall_bind="tcp://127.0.0.1:*",
                                server_secret_file=fleet_keys / "server.key_secret",
                                allowed_clients=fleet_keys / "allowed")
    with ConsolidatorService(config) as service:
        assert service.recall.authenticated
        dim = service.recall.index.dim
        client = _curve_client(service.recall.endpoint, fleet_keys, "r2", as_robot="r1")
        try:
            with pytest.raises(RecallError, match="speaks for robot 'r2'"):
                client.recall(np.ones(dim))
        finally:
            client.close()


def test_a_reachable_recall_endpoint_without_keys_is_refused_at_both_ends(tmp_path):
    _, signing = write_signing_keypair(tmp_path / "sign", "c")
    with pytest.raises(ValueError, match="recall_bind"):
        ConsolidatorConfig(db_path=tmp_path / "c.db", signing_key=signing,
                           recall_bind="tcp://0.0.0.0:5757")
    with pytest.raises(RecallError, match="CURVE is required"):
        RecallClient("tcp://10.0.0.5:5757", "r1")


def test_the_robot_asks_with_its_shipping_keys_and_refuses_a_reachable_endpoint_without(
        fleet_keys):
    from thinkmem_ros.robot.node_config import NodeConfig

    with pytest.raises(ValueError, match="recall_endpoint: CURVE is required"):
        NodeConfig(recall_endpoint="tcp://10.0.0.5:5757")
    with pytest.raises(ValueError, match="go together"):
        NodeConfig(recall_endpoint="tcp://127.0.0.1:5757",
                   client_secret_key=str(fleet_keys / "r1.key_secret"))
    config = NodeConfig(recall_endpoint="tcp://10.0.0.5:5757", robot_id="r1",
                        server_public_key=str(fleet_keys / "server.key"),
                        client_secret_key=str(fleet_keys / "r1.key_secret"))
    client = RecallClient(config.recall_endpoint, config.robot_id, **config.recall_keys())
    try:
        assert client.curve
    finally:
        client.close()


def _flood(endpoint: str, request: bytes, stop: threading.Event, peers: int,
           keys=None) -> None:
    """``peers`` connections that send requests as fast as ZeroMQ takes them, never reading.

    With ``keys`` every connection is CURVE with robot r1's key pair.
    """
    socks = []
    for _ in range(peers):
        sock = context().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if keys is not None:
            sock.curve_serverkey = zmq.auth.load_certificate(keys / "server.key")[0]
            sock.curve_publickey, sock.curve_secretkey = zmq.auth.load_certificate(
                keys / "r1.key_secret")
        sock.connect(endpoint)
        socks.append(sock)
    try:
        while not stop.is_set():
            for sock in socks:
                try:
                    sock.send(request, zmq.NOBLOCK)
                except zmq.Again:
                    pass
            time.sleep(0.0005)
    finally:
        for sock in socks:
            sock.close(0)


def _answered_under_flood(server, request: bytes, client, query, *, peers: int,
                         keys=None) -> int:
    """How many of 20 recalls ``client`` gets answered while ``peers`` connections flood.

    The flood runs until the server has answered 50 of its requests (the backlog is
    built), and stops, and the client is closed, whatever happens.
    """
    stop = threading.Event()
    flood = threading.Thread(target=_flood, args=(server.endpoint, request, stop, peers, keys),
                             daemon=True)
    flood.start()
    try:
        wait_for(lambda: server.served > 50, 10.0, "the flood answered")
        answered = 0
        for _ in range(20):
            try:
                client.recall(query)
                answered += 1
            except RecallError:
                pass
        return answered
    finally:
        stop.set()
        flood.join(5.0)
        client.close()


def test_flooding_peers_do_not_make_a_robots_recall_time_out():
    index, emb = _index(20_000, dim=448)
    index.matrix()
    request = encode_frame(Kind.RECALL_REQ, {"id": 1, "robot_id": "x", "k": 64,
                                             "embedding": emb[1].tobytes()})
    with RecallServer(index) as server:
        client = RecallClient(server.endpoint, "r0", deadline_s=0.05, k=4)
        answered = _answered_under_flood(server, request, client, emb[7], peers=4)
    assert answered >= 15, f"{answered}/20 answered within 50 ms"
    assert server.served > 100, server.served
    assert server.shed > 0


def test_one_key_flooding_over_many_connections_gets_one_turn_not_one_per_connection(
        fleet_keys):
    """An allow-listed key may open as many connections as it likes; turns go per key."""
    index, emb = _index(20_000, dim=448)
    index.matrix()
    request = encode_frame(Kind.RECALL_REQ, {"id": 1, "robot_id": "r1", "k": 64,
                                             "embedding": emb[1].tobytes()})
    with RecallServer(index, server_secret_file=fleet_keys / "server.key_secret",
                      allowed_clients=fleet_keys / "allowed") as server:
        client = _curve_client(server.endpoint, fleet_keys, "r2", deadline_s=0.05)
        answered = _answered_under_flood(server, request, client, emb[7], peers=40,
                                         keys=fleet_keys)
    assert answered >= 15, f"{answered}/20 answered within 50 ms"
    assert server.shed > 0


def test_a_request_older_than_max_age_is_dropped_unanswered():
    index, emb = _index(10)
    with RecallServer(index, max_age_s=0.1) as server:
        client = RecallClient(server.endpoint, "r0", deadline_s=0.05, k=1)
        try:
            with server._lock:  # the server is busy (a slow query) for 0.3 s
                with pytest.raises(RecallError, match="timed out"):
                    client.recall(emb[2])
                time.sleep(0.25)
            wait_for(lambda: server.expired == 1, 5.0, "the stale request dropped")
            assert server.served == 0
            assert client.recall(emb[2])  # the next one, fresh, is answered
        finally:
            client.close()
