"""Robot identity is bound to its CURVE key: no key can speak for another robot.

Real CURVE + ZAP on 127.0.0.1 random ports, a real SQLite store. A raw DEALER plays the
dishonest robot, because the shipper itself always speaks for its configured robot id.
"""

from __future__ import annotations

import argparse
import shutil

import numpy as np
import pytest
import zmq
from waiting import wait

from thinkmem_ros.commands import keys as keys_cmd
from thinkmem_ros.consolidator.ingest import open_receiver
from thinkmem_ros.consolidator.store import ExperienceStore
from thinkmem_ros.link import protocol
from thinkmem_ros.link.experience import Experience, encode_experience
from thinkmem_ros.link.protocol import Kind
from thinkmem_ros.link.receiver import ReceiverConfig
from thinkmem_ros.link.security import (
    SecurityError,
    load_allow_list,
    load_curve_keypair,
    load_curve_public,
    write_allow_list,
    write_curve_keypair,
)
from thinkmem_ros.link.shipper import ExperienceShipper, ShipperConfig
from thinkmem_ros.link.sockets import context


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    out = tmp_path_factory.mktemp("idkeys")
    args = argparse.Namespace(out=str(out), name=["server"], robot=["alpha", "bravo"],
                              sign_name=None, no_sign=True, force=False)
    assert keys_cmd.main(args) == 0
    write_curve_keypair(out, "stranger")
    return out


def exp(robot, seq, trace):
    return Experience(robot_id=robot, episode_id="e", stamp=float(seq), seq=seq,
                      window=np.zeros((4, 2)), labels=["trend"], probabilities=[0.5],
                      bundle_version=1, trace=trace)



def receiver_cfg(tmp_path, keys, allowed, **kw):
    return ReceiverConfig(bind="tcp://127.0.0.1:*", db_path=tmp_path / "db.sqlite",
                          curve="on", server_secret_file=keys / "server.key_secret",
                          allowed_clients=allowed, poll_s=0.02, **kw)


def curve_dealer(keys, name, endpoint):
    sock = context().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    public, secret = load_curve_keypair(keys / f"{name}.key_secret")
    sock.curve_publickey, sock.curve_secretkey = public, secret
    sock.curve_serverkey = load_curve_public(keys / "server.key")
    sock.connect(endpoint)
    return sock


def reply(sock, timeout_ms=5000):
    assert sock.poll(timeout_ms), "no reply from the receiver"
    return protocol.decode_frame(sock.recv())


def shipper_cfg(tmp_path, keys, endpoint, robot, **kw):
    return ShipperConfig(endpoint=endpoint, robot_id=robot, spool_path=tmp_path / f"{robot}.db",
                         curve="on", server_public_key=keys / "server.key",
                         client_secret_file=keys / f"{robot}.key_secret", ack_timeout_s=0.3,
                         backoff_initial_s=0.05, backoff_max_s=0.3, **kw)


def test_a_key_cannot_store_or_ack_in_another_robots_name(tmp_path, keys):
    with open_receiver(receiver_cfg(tmp_path, keys, keys / "allowed")) as rx:
        bravo = curve_dealer(keys, "bravo", rx.endpoint)
        try:
            # bravo's key, alpha's name, alpha's sequence numbers: the attack
            items = [encode_experience(exp("alpha", seq, "spoofed")) for seq in range(10)]
            bravo.send(protocol.experience_batch(1, "alpha", items))
            answer = reply(bravo)
            assert answer.kind is Kind.REFUSED and "'bravo'" in answer.body["reason"]
            bravo.send(protocol.hello("alpha"))
            assert reply(bravo).kind is Kind.REFUSED
            # the same key in its own name is served
            bravo.send(protocol.experience_batch(2, "bravo", [encode_experience(
                exp("bravo", 0, "bravo's own"))]))
            assert reply(bravo).body["stored"] == 1
        finally:
            bravo.close(0)
        assert rx.stats.identity_refused == 2
        assert set(rx.peers.values()) == {"bravo"}
        # the real alpha then delivers its own experiences under the same keys
        with ExperienceShipper(shipper_cfg(tmp_path, keys, rx.endpoint, "alpha")) as alpha:
            for seq in range(10):
                alpha.ship(exp("alpha", seq, "genuine"))
            assert alpha.flush(10.0)
            assert alpha.stats()["stored"] == 10 and alpha.stats()["duplicates"] == 0
    with ExperienceStore(tmp_path / "db.sqlite") as store:
        traces = [e.trace for _, e in store.iter_experiences(robot_id="alpha")]
        assert traces == ["genuine"] * 10
        assert store.count() == 11


def test_a_spoofing_shipper_keeps_its_rows_and_is_refused_each_time(tmp_path, keys):
    with open_receiver(receiver_cfg(tmp_path, keys, keys / "allowed")) as rx:
        # bravo's key, configured (wrongly or maliciously) as robot alpha
        cfg = shipper_cfg(tmp_path, keys, rx.endpoint, "bravo")
        cfg.robot_id = "alpha"
        with ExperienceShipper(cfg) as liar:
            for seq in range(5):
                liar.ship(exp("alpha", seq, "spoofed"))
            assert wait(lambda: liar.stats()["refused"] >= 2)
            stats = liar.stats()
            assert stats["acked"] == 0 and stats["spool_rows"] == 5  # nothing deleted
    with ExperienceStore(tmp_path / "db.sqlite") as store:
        assert store.count() == 0


def test_revoked_key_stops_being_served_without_a_restart(tmp_path, keys):
    allowed = tmp_path / "allowed"
    shutil.copytree(keys / "allowed", allowed)
    with open_receiver(receiver_cfg(tmp_path, keys, allowed, allow_reload_s=0.05)) as rx:
        with ExperienceShipper(shipper_cfg(tmp_path, keys, rx.endpoint, "alpha")) as alpha:
            alpha.ship(exp("alpha", 0, "before"))
            assert alpha.flush(10.0)
            assert set(rx.peers.values()) == {"alpha"}
            (allowed / "alpha.key").unlink()  # revoke alpha
            assert wait(lambda: rx.stats.allow_reloads >= 1)
            assert rx.peers == {}
            alpha.ship(exp("alpha", 1, "after revocation"))
            assert wait(lambda: rx.stats.revoked_refused >= 1)
            assert alpha.stats()["spool_rows"] == 1  # refused, so kept for later
            # a fresh connection with the revoked key fails the handshake itself
            sock = curve_dealer(keys, "alpha", rx.endpoint)
            try:
                sock.send(protocol.hello("alpha"))
                assert wait(lambda: rx.stats.auth_refused >= 1)
                assert not sock.poll(300)
            finally:
                sock.close(0)
            # reinstated: the kept row goes through
            shutil.copy(keys / "allowed" / "alpha.key", allowed / "alpha.key")
            assert alpha.flush(10.0)
    with ExperienceStore(tmp_path / "db.sqlite") as store:
        assert sorted(e.trace for _, e in store.iter_experiences()) == [
            "after revocation", "before"]


def test_an_allow_list_that_stops_parsing_admits_nobody(tmp_path, keys):
    allow = write_allow_list(tmp_path / "robots.toml",
                             {"alpha": load_curve_public(keys / "alpha.key")})
    with open_receiver(receiver_cfg(tmp_path, keys, allow, allow_reload_s=0.05)) as rx:
        sock = curve_dealer(keys, "alpha", rx.endpoint)
        try:
            sock.send(protocol.hello("alpha"))
            assert reply(sock).kind is Kind.HELLO
            allow.write_text("[robots\nalpha = 'half an edit")
            assert wait(lambda: rx.stats.allow_reload_errors >= 1)
            sock.send(protocol.hello("alpha"))
            assert reply(sock).kind is Kind.REFUSED
            assert rx.stats.revoked_refused == 1
        finally:
            sock.close(0)


# ------------------------------------------------------------------ allow-list formats

def test_allow_list_formats_bind_each_key_to_one_robot(tmp_path, keys):
    alpha, bravo = (load_curve_public(keys / f"{r}.key") for r in ("alpha", "bravo"))
    folder = load_allow_list(keys / "allowed")  # what `thinkmem keys --robot` wrote
    assert dict(folder.robots) == {alpha: "alpha", bravo: "bravo"}
    assert load_allow_list(keys / "allowed" / "alpha.key").robots == {alpha: "alpha"}
    stranger = load_curve_public(keys / "stranger.key")
    toml = write_allow_list(tmp_path / "a.toml", {"alpha": alpha,
                                                  "dock.2": [bravo, stranger]})
    table = load_allow_list(toml)
    assert table.robot_of(alpha) == "alpha" and table.robot_of(stranger.decode()) == "dock.2"
    assert table.robot_of(b"x" * 40) is None
    assert load_allow_list({alpha: "alpha"}).robot_of(alpha) == "alpha"


@pytest.mark.parametrize("text, match", [
    ('[robots]\na = "{k}"\nb = "{k}"\n', "one robot only"),
    ('[robots]\n"bad id!" = "{k}"\n', "no valid robot id"),
    ('[robots]\na = "short"\n', "no Z85"),
    ('[robots]\na = []\n', "expected a Z85 key"),
    ('[robots]\na = "{k}"\n[extra]\n', "unknown top-level"),
    ('robots = 3\n', "must be a table"),
    ('[robots\n', "cannot read"),
    ('[robots]\n', "no client public keys"),
])
def test_ambiguous_or_malformed_allow_lists_are_refused_by_name(tmp_path, keys, text, match):
    key = load_curve_public(keys / "alpha.key").decode()
    path = tmp_path / "allow.toml"
    path.write_text(text.replace("{k}", key))
    with pytest.raises(SecurityError, match=match):
        load_allow_list(path)


def test_key_folders_refuse_bad_names_duplicates_and_bare_key_sets(tmp_path, keys):
    folder = tmp_path / "allowed"
    folder.mkdir()
    shutil.copy(keys / "alpha.key", folder / "alpha.key")
    shutil.copy(keys / "alpha.key", folder / "alpha-copy.key")
    with pytest.raises(SecurityError, match="one robot only"):
        load_allow_list(folder)
    (folder / "alpha-copy.key").unlink()
    shutil.copy(keys / "bravo.key", folder / "bra vo.key")
    with pytest.raises(SecurityError, match="no valid robot id"):
        load_allow_list(folder)
    with pytest.raises(SecurityError, match="robot ids"):
        load_allow_list({load_curve_public(keys / "alpha.key")})


def test_keys_command_writes_the_allow_list_and_refuses_bad_robot_ids(tmp_path, keys):
    assert (keys / "allowed" / "alpha.key").read_bytes() == (keys / "alpha.key").read_bytes()
    assert (keys / "allowed" / "alpha.key").stat().st_mode & 0o777 == 0o644
    assert not list((keys / "allowed").glob("*secret*"))
    args = argparse.Namespace(out=str(tmp_path), name=None, robot=["no/slash"],
                              sign_name=None, no_sign=True, force=False)
    with pytest.raises(SystemExit, match="robot"):
        keys_cmd.main(args)


def test_a_robot_allowed_later_connects_without_a_restart(tmp_path, keys):
    # ZeroMQ never retries after a refused CURVE handshake; the shipper opens a new socket
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    shutil.copy(keys / "allowed" / "bravo.key", allowed / "bravo.key")
    with open_receiver(receiver_cfg(tmp_path, keys, allowed, allow_reload_s=0.05)) as rx:
        with ExperienceShipper(shipper_cfg(tmp_path, keys, rx.endpoint, "alpha")) as alpha:
            alpha.ship(exp("alpha", 0, "waited"))
            assert wait(lambda: alpha.stats()["auth_failures"] >= 1)
            shutil.copy(keys / "allowed" / "alpha.key", allowed / "alpha.key")
            assert alpha.flush(15.0), alpha.stats()
            assert alpha.stats()["reopens"] >= 1
    with ExperienceStore(tmp_path / "db.sqlite") as store:
        assert [e.trace for _, e in store.iter_experiences()] == ["waited"]
