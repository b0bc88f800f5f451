import time

import msgpack
import numpy as np
import pytest
import zmq
from waiting import wait

from thinkmem_ros.consolidator.ingest import open_receiver
from thinkmem_ros.consolidator.store import ExperienceStore
from thinkmem_ros.link import protocol
from thinkmem_ros.link.experience import Experience, encode_experience
from thinkmem_ros.link.protocol import Kind
from thinkmem_ros.link.receiver import ReceiverConfig
from thinkmem_ros.link.shipper import ExperienceShipper, ShipperConfig
from thinkmem_ros.link.sockets import TransportError, context


def exp(i, robot="r1"):
    return Experience(robot_id=robot, episode_id=f"ep{i // 100}", stamp=float(i),
                      window=np.full((8, 3), i % 7, dtype=np.float32), labels=["trend"],
                      probabilities=[0.5], bundle_version=1, trace=f"x{i}")



def shipper_cfg(tmp_path, endpoint, **kw):
    base = dict(endpoint=endpoint, robot_id="r1", spool_path=tmp_path / "spool.db",
                ack_timeout_s=0.5, backoff_initial_s=0.05, backoff_max_s=0.5, batch_size=64)
    base.update(kw)
    return ShipperConfig(**base)


def traces(db):
    with ExperienceStore(db) as store:
        return [e.trace for _, e in store.iter_experiences()]


@pytest.fixture
def raw_dealer():
    sock = context().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    yield sock
    sock.close(0)


def recv_frame(sock, timeout_ms=5000):
    assert sock.poll(timeout_ms), "no reply from receiver"
    return protocol.decode_frame(sock.recv())


def test_delivers_everything_once_with_counters(tmp_path, receiver):
    with ExperienceShipper(shipper_cfg(tmp_path, receiver.endpoint)) as shipper:
        for i in range(500):
            assert shipper.ship(exp(i))
        assert shipper.flush(15.0)
        stats = shipper.stats()
    assert stats["acked"] == 500 and stats["stored"] == 500 and stats["spool_rows"] == 0
    assert sorted(traces(tmp_path / "store.db")) == sorted(f"x{i}" for i in range(500))
    with ExperienceStore(tmp_path / "store.db") as store:
        seqs = store.seqs("r1")
    assert len(set(seqs)) == 500 and seqs == sorted(seqs)


def test_bad_frames_do_not_disturb_valid_traffic(tmp_path, receiver, raw_dealer):
    raw_dealer.connect(receiver.endpoint)
    good = encode_experience(exp(0, robot="raw"), seq=1)
    wrong_version = bytearray(protocol.experience_batch(1, "raw", [good]))
    wrong_version[2] = 99
    bad = [b"", b"garbage" * 10, protocol.experience_batch(2, "raw", [good])[:-5],
           b"TM\x01\x03" + b"\x00" * (1 << 20) + b"x", b"TM\x01\x42" + msgpack.packb({})]
    with ExperienceShipper(shipper_cfg(tmp_path, receiver.endpoint)) as shipper:
        for i in range(300):
            shipper.ship(exp(i))
            if i % 60 == 0:
                for frame in bad:
                    raw_dealer.send(frame)
                raw_dealer.send_multipart([b"two", b"parts"])
        raw_dealer.send(bytes(wrong_version))
        reply = recv_frame(raw_dealer)
        assert reply.kind is Kind.REFUSED and "version 99" in reply.body["reason"]
        assert shipper.flush(15.0)
    assert receiver.stats.bad_frames >= 5 * 5 + 5 + 1
    assert len(traces(tmp_path / "store.db")) == 300
    # the receiver still answers after all of that
    raw_dealer.send(protocol.experience_batch(3, "raw", [good]))
    assert recv_frame(raw_dealer).body["stored"] == 1


def test_replayed_batches_are_stored_once(tmp_path, receiver, raw_dealer):
    raw_dealer.connect(receiver.endpoint)
    items = [encode_experience(exp(i, robot="raw"), seq=i) for i in range(10)]
    frame = protocol.experience_batch(5, "raw", items)
    raw_dealer.send(frame)
    first = recv_frame(raw_dealer).body
    raw_dealer.send(frame)
    raw_dealer.send(protocol.experience_batch(6, "raw", items[3:5]))
    second, third = recv_frame(raw_dealer).body, recv_frame(raw_dealer).body
    assert (first["stored"], first["duplicates"]) == (10, 0)
    assert (second["stored"], second["duplicates"]) == (0, 10)
    assert (third["stored"], third["duplicates"]) == (0, 2)
    assert len(traces(tmp_path / "store.db")) == 10


def test_invalid_record_rejected_with_reason_others_stored(tmp_path, receiver, raw_dealer):
    raw_dealer.connect(receiver.endpoint)
    wire = exp(1, robot="raw").to_wire(seq=1)
    wire["probabilities"] = np.array([2.0], dtype="<f4").tobytes()
    items = [encode_experience(exp(0, robot="raw"), seq=0), msgpack.packb(wire),
             encode_experience(exp(2, robot="other"), seq=2)]
    raw_dealer.send(protocol.experience_batch(1, "raw", items))
    body = recv_frame(raw_dealer).body
    assert body["stored"] == 1
    assert [i for i, _ in body["rejected"]] == [1, 2]
    assert "probabilities" in body["rejected"][0][1] and "robot_id" in body["rejected"][1][1]
    assert receiver.stats.rejected_records == 2


def test_reserved_kinds_and_hello(receiver, raw_dealer):
    raw_dealer.connect(receiver.endpoint)
    raw_dealer.send(protocol.hello("r1"))
    assert recv_frame(raw_dealer).body == {"server": "consolidator"}
    raw_dealer.send(protocol.encode_frame(Kind.BUNDLE_PUSH, {}))
    assert recv_frame(raw_dealer).kind is Kind.REFUSED


def free_endpoint(tmp_path):
    """An endpoint nobody listens on (bound once, then released)."""
    rx = open_receiver(ReceiverConfig(bind="tcp://127.0.0.1:*",
                                           db_path=tmp_path / "probe.db"))
    endpoint = rx.endpoint
    rx._close_socket()
    return endpoint


def test_node_restart_with_non_empty_spool(tmp_path):
    endpoint = free_endpoint(tmp_path)
    with ExperienceShipper(shipper_cfg(tmp_path, endpoint)) as shipper:
        for i in range(150):
            shipper.ship(exp(i))
        assert wait(lambda: shipper.stats()["spool_rows"] == 150)
        first_seqs_max = None
    cfg = ReceiverConfig(bind=endpoint, db_path=tmp_path / "store.db", poll_s=0.02)
    with open_receiver(cfg):
        with ExperienceShipper(shipper_cfg(tmp_path, endpoint)) as shipper:
            assert shipper.stats()["spool_rows"] == 150  # found on start, re-sent
            for i in range(150, 200):
                shipper.ship(exp(i))
            assert shipper.flush(15.0)
    assert sorted(traces(tmp_path / "store.db")) == sorted(f"x{i}" for i in range(200))
    with ExperienceStore(tmp_path / "store.db") as store:
        by_trace = {e.trace: e.seq for _, e in store.iter_experiences()}
    first_seqs_max = max(by_trace[f"x{i}"] for i in range(150))
    assert min(by_trace[f"x{i}"] for i in range(150, 200)) > first_seqs_max


def test_queue_unsent_at_close_is_spooled(tmp_path):
    endpoint = free_endpoint(tmp_path)
    shipper = ExperienceShipper(shipper_cfg(tmp_path, endpoint, idle_poll_s=1.0)).start()
    for i in range(40):
        shipper.ship(exp(i))
    shipper.close()
    assert shipper.stats()["spool_rows"] == 40


def test_full_spool_sheds_oldest_with_counter(tmp_path):
    endpoint = free_endpoint(tmp_path)
    size = len(encode_experience(exp(0), seq=10**15))
    cfg = shipper_cfg(tmp_path, endpoint, spool_max_bytes=50 * size + 10)
    with ExperienceShipper(cfg) as shipper:
        for i in range(200):
            shipper.ship(exp(i))
        assert wait(lambda: shipper.stats()["spooled"] == 200)
        stats = shipper.stats()
        assert stats["shed"] >= 150 and stats["spool_bytes"] <= cfg.spool_max_bytes
    rx_cfg = ReceiverConfig(bind=endpoint, db_path=tmp_path / "store.db", poll_s=0.02)
    with open_receiver(rx_cfg):
        with ExperienceShipper(shipper_cfg(tmp_path, endpoint)) as shipper:
            assert shipper.flush(15.0)
    kept = traces(tmp_path / "store.db")
    assert "x199" in kept and "x0" not in kept and len(kept) == 200 - stats["shed"]


def test_ship_never_blocks_when_queue_full(tmp_path):
    endpoint = free_endpoint(tmp_path)
    cfg = shipper_cfg(tmp_path, endpoint, queue_size=5, idle_poll_s=0.5)
    shipper = ExperienceShipper(cfg)  # not started: nothing drains the queue
    start = time.perf_counter()
    accepted = [shipper.ship(exp(i)) for i in range(20)]
    assert time.perf_counter() - start < 0.5
    assert accepted.count(True) == 5 and shipper.stats()["dropped_queue_full"] == 15


def test_config_validation_and_bind_errors(tmp_path, receiver):
    with pytest.raises(ValueError, match="batch_size"):
        shipper_cfg(tmp_path, "tcp://127.0.0.1:1", batch_size=0)
    with pytest.raises(ValueError, match="endpoint"):
        shipper_cfg(tmp_path, "nowhere")
    with pytest.raises(TransportError, match="cannot bind"):
        open_receiver(ReceiverConfig(bind=receiver.endpoint, db_path=tmp_path / "x.db"))


def test_caller_given_seqs_below_the_cursor_are_still_delivered_once(tmp_path, receiver):
    # seqs chosen by the caller may lie below ones already sent; their rows share seq ranges
    # with batches in flight, so those batches' ACKs must not delete them by range
    cfg = shipper_cfg(tmp_path, receiver.endpoint, batch_size=16)
    with ExperienceShipper(cfg) as shipper:
        for i in range(100):
            shipper.ship(exp(i))
        assert shipper.flush(10.0)
        low = [exp(i) for i in range(100, 140)]
        for i, record in enumerate(low):
            record.seq = 1000 + 2 * i  # far below the clock-based automatic seqs
        for record in low[::2] + low[1::2]:  # out of order among themselves too
            shipper.ship(record)
        for i in range(140, 200):
            shipper.ship(exp(i))
        assert shipper.flush(10.0), shipper.stats()
        stats = shipper.stats()
    assert stats["spool_rows"] == 0 and stats["acked"] >= 200
    assert sorted(traces(receiver.config.db_path)) == sorted(f"x{i}" for i in range(200))


def test_long_outage_spools_then_drains_everything_once(tmp_path):
    # the in-memory fresh rows are bounded (2 x batch x in-flight): an outage longer than
    # that falls back to the spool, and every row still arrives exactly once
    endpoint = free_endpoint(tmp_path)
    cfg = shipper_cfg(tmp_path, endpoint, batch_size=8, max_inflight=2)
    with ExperienceShipper(cfg) as shipper:
        for i in range(300):
            shipper.ship(exp(i))
        assert wait(lambda: shipper.stats()["spool_rows"] == 300)
        rx_cfg = ReceiverConfig(bind=endpoint, db_path=tmp_path / "store.db", poll_s=0.02)
        with open_receiver(rx_cfg):
            for i in range(300, 340):
                shipper.ship(exp(i))
            assert shipper.flush(20.0), shipper.stats()
    got = traces(tmp_path / "store.db")
    assert len(got) == 340 and set(got) == {f"x{i}" for i in range(340)}


def test_hello_and_batch_with_huge_robot_ids_are_dropped_not_remembered(receiver, raw_dealer):
    raw_dealer.connect(receiver.endpoint)
    huge = "r" * 500_000
    hello = protocol.MAGIC + bytes((protocol.PROTOCOL_VERSION, Kind.HELLO)) + msgpack.packb(
        {"robot_id": huge})
    batch = protocol.MAGIC + bytes((protocol.PROTOCOL_VERSION, Kind.EXPERIENCE_BATCH)) + \
        msgpack.packb({"batch": 1, "robot_id": huge, "items": [b"x"]}, use_bin_type=True)
    for _ in range(20):
        raw_dealer.send(hello)
        raw_dealer.send(batch)
    assert wait(lambda: receiver.stats.bad_frames >= 40)
    assert receiver.peers == {}  # nothing of them is kept
    raw_dealer.send(protocol.hello("fine"))
    assert recv_frame(raw_dealer).kind is Kind.HELLO
    assert receiver.peers and set(receiver.peers.values()) == {"fine"}


def test_robot_never_reads_a_frame_above_its_limit(tmp_path):
    router = context().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    cfg = shipper_cfg(tmp_path, f"tcp://127.0.0.1:{port}", max_reply_bytes=1 << 20)
    try:
        with ExperienceShipper(cfg) as shipper:
            shipper.ship(exp(0))
            assert router.poll(5000)
            identity = router.recv_multipart()[0]
            # a fake consolidator answers with 8 MB: ZeroMQ drops the connection unread
            router.send_multipart([identity, b"TM\x01\x04" + bytes(8 << 20)])
            assert wait(lambda: shipper.stats()["disconnects"] >= 1)
            assert shipper.stats()["bad_replies"] == 0  # never handed to the shipper
            assert wait(lambda: router.poll(100))  # it reconnects and re-sends its batch
    finally:
        router.close(0)
    with pytest.raises(ValueError, match="max_reply_bytes"):
        shipper_cfg(tmp_path, "tcp://127.0.0.1:1", max_reply_bytes=protocol.MAX_FRAME_BYTES + 1)


def test_batches_are_capped_in_bytes(tmp_path, receiver):
    big = [Experience(robot_id="r1", episode_id="e", stamp=float(i),
                      window=np.zeros((256, 64), np.float32), labels=["trend"],
                      probabilities=[0.5], bundle_version=1, trace=f"b{i}") for i in range(40)]
    size = len(encode_experience(big[0], seq=1))  # ~64 KB each: 40 of them are 2.6 MB
    cfg = shipper_cfg(tmp_path, receiver.endpoint, batch_size=512, max_batch_bytes=4 * size)
    with ExperienceShipper(cfg) as shipper:
        for record in big:
            shipper.ship(record)
        assert shipper.flush(15.0), shipper.stats()
    assert receiver.stats.batches >= 10  # at most 4 records per frame
    assert sorted(traces(receiver.config.db_path)) == sorted(f"b{i}" for i in range(40))
