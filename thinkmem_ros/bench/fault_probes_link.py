"""Fault probes of the experience link: spoofed identities, hostile frames, full disks.

Each probe is a plain function that starts real processes and sockets on 127.0.0.1 at
random ports, runs one hostile or faulty situation against them, and returns::

    {"probe": name, "crashed": bool, "lost": int, "spoofed_accepted": int,
     "rss_growth_mb": float, "detail": str}

``crashed``: a process of the link (consolidator or robot) died or its serving thread
stopped. ``lost``: experiences ``ship()`` accepted (or a genuine robot sent) that are
neither stored, nor still spooled, nor counted as shed/refused. ``spoofed_accepted``:
frames or rows the consolidator took in a robot's name from a key bound to another robot
(or a revoked key). ``rss_growth_mb``: resident memory the target process kept after the
probe (measured after it settled), the sign of unbounded per-peer state.

``PROBES`` names them; ``run_probes`` runs a selection (``thinkmem bench faults`` calls
these). The consolidator runs as ``python -m thinkmem_ros.consolidator.ingest serve``; the
robot, where a probe needs it in its own process, as ``python -m
thinkmem_ros.bench.fault_probes_link robot``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgpack
import numpy as np
import zmq

from thinkmem_ros.consolidator.store import ExperienceStore
from thinkmem_ros.core.arguments import OneLineParser
from thinkmem_ros.link import protocol
from thinkmem_ros.link.experience import Experience, encode_experience
from thinkmem_ros.link.security import (
    load_curve_keypair,
    load_curve_public,
    write_curve_keypair,
)
from thinkmem_ros.link.shipper import ExperienceShipper, ShipperConfig

ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- helpers

def _result(name: str, *, crashed: bool = False, lost: int = 0, spoofed: int = 0,
            rss_growth_mb: float = 0.0, detail: str = "") -> dict:
    return {"probe": name, "crashed": bool(crashed), "lost": int(lost),
            "spoofed_accepted": int(spoofed), "rss_growth_mb": round(float(rss_growth_mb), 1),
            "detail": detail}


def rss_mb(pid: int) -> float:
    """Resident memory of a process in MB (``/proc``); NaN when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def settled_rss_mb(pid: int, timeout_s: float = 8.0) -> float:
    """RSS once it stopped moving (two readings 0.5 s apart within 1 MB), or at timeout."""
    deadline = time.monotonic() + timeout_s
    last = rss_mb(pid)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = rss_mb(pid)
        if abs(now - last) < 1.0:
            return now
        last = now
    return last


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH",
                                                                               ""))


def _exp(robot: str, seq: int | None, trace: str, i: int = 0) -> Experience:
    return Experience(robot_id=robot, episode_id="probe", stamp=float(i), seq=seq,
                      window=np.full((16, 7), i % 5, np.float32), labels=["trend", "hazard"],
                      probabilities=[0.5, 0.2], bundle_version=1, trace=trace)


def _wait(pred: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


class Consolidator:
    """The consolidator's receiver in its own process (what robots talk to)."""

    def __init__(self, work: Path, keys: Path | None = None, allow: Path | None = None,
                 bind: str = "tcp://127.0.0.1:*") -> None:
        self.db = work / "store.db"
        cmd = [sys.executable, "-m", "thinkmem_ros.consolidator.ingest", "serve",
               "--db", str(self.db), "--bind", bind]
        if keys is not None:
            cmd += ["--curve", "on", "--server-key", str(keys / "server.key_secret"),
                    "--allow", str(allow or keys / "allowed")]
        else:
            cmd += ["--curve", "off"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=_env(), cwd=ROOT)
        line = self.proc.stdout.readline()
        if not line.startswith("READY "):
            self.stop()
            raise RuntimeError(f"consolidator did not start: {line!r}")
        self.endpoint = line.split()[1]

    def alive(self) -> bool:
        """Tell whether the process still runs."""
        return self.proc.poll() is None

    def rss_mb(self) -> float:
        """Its resident memory now."""
        return rss_mb(self.proc.pid)

    def rows(self, robot: str | None = None) -> list[Experience]:
        """What its store holds (of one robot, if given)."""
        if not self.db.exists():
            return []
        with ExperienceStore(self.db) as store:
            return [e for _, e in store.iter_experiences(robot_id=robot)]

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not stop."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def make_keys(folder: Path, robots: tuple[str, ...] = ("alpha", "bravo")) -> Path:
    """Server pair, one pair per robot and the allow-list folder ``allowed/<robot>.key``."""
    write_curve_keypair(folder, "server")
    (folder / "allowed").mkdir(parents=True, exist_ok=True)
    for robot in robots:
        public, _ = write_curve_keypair(folder, robot)
        shutil.copyfile(public, folder / "allowed" / f"{robot}.key")
    return folder


@contextlib.contextmanager
def _dealer(endpoint: str, keys: Path | None = None, name: str | None = None
            ) -> Iterator[zmq.Socket]:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        public, secret = load_curve_keypair(keys / f"{name}.key_secret")
        sock.curve_publickey, sock.curve_secretkey = public, secret
        sock.curve_serverkey = load_curve_public(keys / "server.key")
    sock.connect(endpoint)
    try:
        yield sock
    finally:
        sock.close(0)


def _reply_kind(sock: zmq.Socket, timeout_ms: int = 5000) -> str:
    if not sock.poll(timeout_ms):
        return "none"
    try:
        return protocol.decode_frame(sock.recv()).kind.name
    except protocol.ProtocolError:
        return "garbage"


def _shipper_cfg(endpoint: str, spool: Path, robot: str, keys: Path | None = None,
                 **kw) -> ShipperConfig:
    curve: dict = {"curve": "off"}
    if keys is not None:
        curve = dict(curve="on", server_public_key=keys / "server.key",
                     client_secret_file=keys / f"{robot}.key_secret")
    base = dict(endpoint=endpoint, robot_id=robot, spool_path=spool, ack_timeout_s=0.5,
                backoff_initial_s=0.05, backoff_max_s=0.5)
    base.update(kw)
    return ShipperConfig(**base, **curve)


def _accounted(stats: dict) -> int:
    """Experiences a shipper can account for (stored, spooled, queued or counted as lost)."""
    keys = ("stored", "duplicates", "spool_rows", "queue", "shed", "shed_disk_full",
            "rejected", "spool_failed")
    return sum(int(stats.get(k, 0)) for k in keys)


# ------------------------------------------------------------------------------ probes

def probe_spoofed_batch(work: Path, quick: bool = False) -> dict:
    """Key ``bravo`` sends a batch as robot ``alpha`` (alpha's seqs), then alpha ships.

    Before identity binding the store kept the spoofed rows and ACKed alpha's genuine
    ones as duplicates (lost from alpha's spool).
    """
    keys = make_keys(work / "keys")
    cons = Consolidator(work, keys)
    n = 10
    try:
        with _dealer(cons.endpoint, keys, "bravo") as liar:
            items = [encode_experience(_exp("alpha", seq, "spoofed", seq)) for seq in range(n)]
            liar.send(protocol.experience_batch(1, "alpha", items))
            answer = _reply_kind(liar)
        with ExperienceShipper(_shipper_cfg(cons.endpoint, work / "alpha.db", "alpha",
                                            keys)) as alpha:
            for seq in range(n):
                alpha.ship(_exp("alpha", seq, "genuine", seq))
            alpha.flush(15.0)
            stats = alpha.stats()
        traces = [e.trace for e in cons.rows("alpha")]
        crashed = not cons.alive()
    finally:
        cons.stop()
    genuine = traces.count("genuine")
    return _result("link_spoofed_batch", crashed=crashed, lost=n - genuine - stats["spool_rows"],
                   spoofed=traces.count("spoofed"),
                   detail=f"reply to the spoofed batch: {answer}; alpha stored {genuine}/{n}, "
                          f"acked as duplicates {stats['duplicates']}")


def probe_spoofed_hello(work: Path, quick: bool = False) -> dict:
    """Key ``bravo`` says HELLO as ``alpha`` (it would then receive alpha's bundle pushes)."""
    keys = make_keys(work / "keys")
    cons = Consolidator(work, keys)
    try:
        with _dealer(cons.endpoint, keys, "bravo") as liar:
            liar.send(protocol.hello("alpha"))
            answer = _reply_kind(liar)
            liar.send(protocol.hello("bravo"))
            own = _reply_kind(liar)
        crashed = not cons.alive()
    finally:
        cons.stop()
    return _result("link_spoofed_hello", crashed=crashed, spoofed=int(answer == "HELLO"),
                   detail=f"HELLO as alpha -> {answer}; HELLO as itself -> {own}")


def probe_revoked_key(work: Path, quick: bool = False) -> dict:
    """Delete alpha's key from the allow-list while alpha is connected; it ships on."""
    keys = make_keys(work / "keys")
    cons = Consolidator(work, keys)
    try:
        cfg = _shipper_cfg(cons.endpoint, work / "alpha.db", "alpha", keys)
        with ExperienceShipper(cfg) as alpha:
            for i in range(5):
                alpha.ship(_exp("alpha", None, "before", i))
            alpha.flush(10.0)
            (keys / "allowed" / "alpha.key").unlink()
            time.sleep(2.5)  # the receiver re-reads the allow-list every second
            for i in range(5):
                alpha.ship(_exp("alpha", None, "after", i))
            time.sleep(2.0)
            stats = alpha.stats()
        after = [e.trace for e in cons.rows("alpha")].count("after")
        with _dealer(cons.endpoint, keys, "alpha") as again:  # a fresh handshake
            again.send(protocol.hello("alpha"))
            fresh = _reply_kind(again, 1500)
        crashed = not cons.alive()
    finally:
        cons.stop()
    return _result("link_revoked_key", crashed=crashed, spoofed=after + int(fresh == "HELLO"),
                   lost=5 - after - stats["spool_rows"],
                   detail=f"rows stored after revocation {after}, kept in the spool "
                          f"{stats['spool_rows']}, refused {stats['refused']}; a new "
                          f"connection with the revoked key -> {fresh}")


def _flood(work: Path, name: str, frame: bytes, connections: int) -> dict:
    cons = Consolidator(work)
    try:
        time.sleep(0.3)
        before = cons.rss_mb()
        peak = before
        socks = [zmq.Context.instance().socket(zmq.DEALER) for _ in range(connections)]
        try:
            for sock in socks:
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(cons.endpoint)
            for sock in socks:
                sock.send(frame, copy=False)
                peak = max(peak, cons.rss_mb())
            replies = 0
            deadline = time.monotonic() + 3.0  # refused frames get no reply: wait a while
            pending = list(socks)
            while pending and time.monotonic() < deadline:
                pending = [s for s in pending if not s.poll(20)]
                peak = max(peak, cons.rss_mb())
            replies = len(socks) - len(pending)
        finally:
            for sock in socks:
                sock.close(0)
        after = settled_rss_mb(cons.proc.pid)
        with _dealer(cons.endpoint) as probe:  # still serving?
            probe.send(protocol.hello("probe"))
            serving = _reply_kind(probe) == "HELLO"
        crashed = not cons.alive() or not serving
    finally:
        cons.stop()
    return _result(name, crashed=crashed, rss_growth_mb=after - before,
                   detail=f"{connections} connections x {len(frame) / 1e6:.1f} MB: RSS "
                          f"{before:.0f} -> peak {peak:.0f} -> {after:.0f} MB settled; "
                          f"{replies} replies")


def _raw_frame(kind: protocol.Kind, body: dict) -> bytes:
    """A frame with this body, built without the encoder's checks (what an attacker sends)."""
    return protocol.MAGIC + bytes((protocol.PROTOCOL_VERSION, int(kind))) + msgpack.packb(
        body, use_bin_type=True)


def probe_hello_flood(work: Path, quick: bool = False) -> dict:
    """60 connections each say HELLO with a 7.9 MB robot id (loopback, CURVE off)."""
    frame = _raw_frame(protocol.Kind.HELLO, {"robot_id": "r" * 7_900_000})
    return _flood(work, "link_hello_flood", frame, 20 if quick else 60)


def probe_batch_long_robot_id(work: Path, quick: bool = False) -> dict:
    """60 connections each send a batch whose robot id is 7.9 MB (records are garbage)."""
    frame = _raw_frame(protocol.Kind.EXPERIENCE_BATCH,
                       {"batch": 1, "robot_id": "r" * 7_900_000, "items": [b"x"]})
    return _flood(work, "link_batch_long_robot_id", frame, 20 if quick else 60)


def probe_msgpack_bomb(work: Path, quick: bool = False) -> dict:
    """Batches just under the frame limit made of lists of one-byte entries (7 MB -> GBs)."""
    inner = [0] * 8000
    body = {"batch": 1, "robot_id": "r", "items": [inner] * 900}  # 7.2 MB on the wire
    return _flood(work, "link_msgpack_bomb", _raw_frame(protocol.Kind.EXPERIENCE_BATCH, body),
                  10 if quick else 30)


def probe_record_bomb(work: Path, quick: bool = False) -> dict:
    """Batches of records whose 2.8 MB are lists of one-byte entries (decoded one by one)."""
    record = msgpack.packb({"v": 2, "events": [[0] * 2000] * 1400})
    body = {"batch": 1, "robot_id": "r", "items": [record, record]}
    return _flood(work, "link_record_bomb", _raw_frame(protocol.Kind.EXPERIENCE_BATCH, body),
                  10 if quick else 30)


def probe_big_frame_flood(work: Path, quick: bool = False) -> dict:
    """60 connections each send a frame just above the inbound limit (8 MiB + 32 KiB)."""
    frame = _raw_frame(protocol.Kind.EXPERIENCE_BATCH, {
        "batch": 1, "robot_id": "r", "items": [bytes(8 * 1024 * 1024 + 32 * 1024)]})
    return _flood(work, "link_big_frame_flood", frame, 20 if quick else 60)


def probe_oversize_frame(work: Path, quick: bool = False) -> dict:
    """Frames above the consolidator's limit (200 MB): dropped before they are read."""
    frame = b"TM\x01\x03" + bytes(200_000_000)
    return _flood(work, "link_oversize_frame_to_consolidator", frame, 1 if quick else 2)


def probe_malformed_frames(work: Path, quick: bool = False) -> dict:
    """Twenty kinds of malformed frames between the batches of a genuine robot."""
    good = encode_experience(_exp("probe", 1, "x"))
    bads = [b"", b"x", b"TM", b"TM\x01", b"GET / HTTP/1.1\r\n\r\n", b"TM\x09\x03\x80",
            b"TM\x01\x63\x80", b"TM\x01\x03\xc1", b"TM\x01\x03" + b"\xdd\xff\xff\xff\xff",
            _raw_frame(protocol.Kind.EXPERIENCE_BATCH, {"batch": -1, "robot_id": "r",
                                                        "items": [good]}),
            _raw_frame(protocol.Kind.EXPERIENCE_BATCH, {"batch": 1, "robot_id": 5,
                                                        "items": [good]}),
            _raw_frame(protocol.Kind.EXPERIENCE_BATCH, {"batch": 1, "robot_id": "r",
                                                        "items": [b"\x00" * 1000]}),
            _raw_frame(protocol.Kind.EXPERIENCE_BATCH, {"batch": 2**64 - 1, "robot_id": "r",
                                                        "items": [good]}),
            _raw_frame(protocol.Kind.EXPERIENCE_BATCH, {"batch": 1, "robot_id": "r",
                                                        "items": [[0] * 5000] * 10}),
            _raw_frame(protocol.Kind.ACK, {"batch": 1, "stored": 1, "duplicates": 0,
                                           "rejected": [["x"] * 10]}),
            _raw_frame(protocol.Kind.HELLO, {}),
            _raw_frame(protocol.Kind.HELLO, {"robot_id": ["a"] * 1000}),
            _raw_frame(protocol.Kind.REFUSED, {"reason": "r" * 100_000}),
            _raw_frame(protocol.Kind.BUNDLE_PUSH, {"artefacts": {"../x": b"1"}}),
            _raw_frame(protocol.Kind.RECALL_REQ, {"k": 2**64 - 1}),
            b"TM\x01\x03" + msgpack.packb({"batch": 1, "robot_id": "r",
                                           "items": [good]})[:-3]]
    cons = Consolidator(work)
    try:
        before = cons.rss_mb()
        with ExperienceShipper(_shipper_cfg(cons.endpoint, work / "spool.db", "probe")) as ship:
            with _dealer(cons.endpoint) as raw:
                for i in range(100):
                    ship.ship(_exp("probe", None, f"m{i}", i))
                    for frame in bads:
                        raw.send(frame)
                    raw.send_multipart([b"two", b"parts"])
            ship.flush(20.0)
            stats = ship.stats()
        stored = len(cons.rows("probe"))
        growth = settled_rss_mb(cons.proc.pid) - before
        crashed = not cons.alive()
    finally:
        cons.stop()
    return _result("link_malformed_frames", crashed=crashed,
                   lost=100 - stored - stats["spool_rows"], rss_growth_mb=growth,
                   detail=f"{len(bads) + 1} kinds x 100 among 100 genuine experiences: "
                          f"{stored} stored")


def probe_huge_reply_frame(work: Path, quick: bool = False) -> dict:
    """A fake consolidator answers a robot with a 600 MB frame; the robot must not read it."""
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    robot = _Robot(endpoint, work / "robot-spool.db", "victim")
    size = 200_000_000 if quick else 600_000_000
    try:
        if not router.poll(10_000):
            raise RuntimeError("the robot never sent anything")
        identity = router.recv_multipart()[0]
        time.sleep(0.3)
        before = robot.rss_mb()
        peak = before
        router.send_multipart([identity, b"TM\x01\x04" + bytes(size)], copy=False)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            peak = max(peak, robot.rss_mb())
            time.sleep(0.05)
        after = robot.rss_mb()
        crashed = not robot.alive()
        stats = robot.stop()
    finally:
        router.close(0)
        robot.kill()
    return _result("link_huge_reply_frame", crashed=crashed, rss_growth_mb=max(peak, after)
                   - before, detail=f"{size / 1e6:.0f} MB frame to the robot: RSS {before:.0f}"
                   f" -> peak {peak:.0f} -> {after:.0f} MB; bad_replies "
                   f"{stats.get('bad_replies')}, disconnects {stats.get('disconnects')}")


@contextlib.contextmanager
def tiny_filesystem(work: Path, size: str = "2m") -> Iterator[Path | None]:
    """Mount a tmpfs of ``size`` (root only); yields None when mounting is not permitted."""
    target = work / "tinyfs"
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                           str(target)], capture_output=True, text=True)
    if done.returncode != 0:
        yield None
        return
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


def probe_store_damaged_at_open(work: Path, quick: bool = False) -> dict:
    """A store file with a damaged page: the receiver refuses it in one line, exit 2.

    It used to open such a file, print READY and refuse every batch forever while looking
    healthy (or die on a traceback): robots kept their spools, so nothing was lost, but
    nothing was stored and nobody was told. The page is overwritten as a failing disk or
    a careless copy does it (4 KiB from the start of the middle page).
    """
    del quick
    import sqlite3

    db = work / "store.db"
    with ExperienceStore(db, flush_rows=0) as store:
        store.insert_many([(e, encode_experience(e))
                           for e in (_exp("alpha", i, f"t{i}", i) for i in range(400))])
    with sqlite3.connect(db) as conn:
        page = conn.execute("PRAGMA page_size").fetchone()[0]
    with open(db, "r+b") as handle:
        handle.seek(db.stat().st_size // page // 2 * page)
        handle.write(b"\xa5" * 4096)
    out = subprocess.run([sys.executable, "-m", "thinkmem_ros.consolidator.ingest", "serve",
                          "--db", str(db), "--bind", "tcp://127.0.0.1:*", "--curve", "off"],
                         capture_output=True, text=True, timeout=60, env=_env(), cwd=ROOT)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    crashed = out.returncode < 0 or "Traceback" in out.stderr
    record = _result("link_store_damaged_at_open", crashed=crashed,
                     detail=f"exit {out.returncode}; {lines[-1][:200] if lines else 'silent'}")
    record["ok"] = (out.returncode == 2 and not out.stdout.startswith("READY")
                    and len(lines) == 1 and "damaged" in lines[0])
    return record


def probe_full_disk(work: Path, quick: bool = False) -> dict:
    """A robot's spool on a 2 MiB filesystem while the consolidator is down, then back."""
    n = 8000 if quick else 30000
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with tiny_filesystem(work) as fs:
        if fs is None:
            return _result("link_full_disk", detail="skipped: cannot mount a tmpfs here")
        cfg = _shipper_cfg(endpoint, fs / "spool.db", "disk-bot")
        accepted = refused = 0
        with ExperienceShipper(cfg) as shipper:
            for i in range(n):
                while len(shipper._queue) > 4000:
                    time.sleep(0.005)
                if shipper.ship(_exp("disk-bot", None, f"d{i}", i)):
                    accepted += 1
                else:
                    refused += 1
            _wait(lambda: _accounted(shipper.stats()) >= accepted, 30)
            offline = shipper.stats()
            cons = Consolidator(work, bind=endpoint)
            try:
                drained = shipper.flush(60.0)
                crashed = not shipper.alive() or not cons.alive()
            finally:
                stats = shipper.stats()
                cons.stop()
        stored = len(cons.rows("disk-bot"))
    lost = accepted - stored - stats["spool_rows"] - stats.get("shed", 0) \
        - stats.get("shed_disk_full", 0) - stats.get("rejected", 0) \
        - stats.get("spool_failed", 0)
    return _result("link_full_disk", crashed=crashed, lost=max(lost, 0),
                   detail=f"{n} shipped, {accepted} accepted ({refused} refused); offline: "
                          f"spooled {offline['spool_rows']}, shed for the disk "
                          f"{offline.get('shed_disk_full', 'n/a')}; back online: stored "
                          f"{stored}, drained {drained}, spool errors {stats['errors']}")


def _stored_traces(cons: Consolidator, robot: str) -> list[str]:
    return [e.trace for e in cons.rows(robot)]


def _stored_count(cons: Consolidator, robot: str) -> int:
    """Rows of one robot in the store (cheap: no decoding), 0 before the store exists."""
    if not cons.db.exists():
        return 0
    with ExperienceStore(cons.db) as store:
        return store.count(robot)


def _exactly_once(shipped: set[str], stored: list[str]) -> tuple[int, int, int]:
    """Compare what was shipped with what the store holds, trace by trace.

    Returns ``(missing, doubled, foreign)``: shipped traces not stored, extra stored copies
    of a trace, and stored traces that were never shipped.
    """
    seen: dict[str, int] = {}
    for trace in stored:
        seen[trace] = seen.get(trace, 0) + 1
    missing = len(shipped - set(seen))
    doubled = sum(count - 1 for count in seen.values())
    foreign = len(set(seen) - shipped)
    return missing, doubled, foreign


def probe_consolidator_kill9_midstream(work: Path, quick: bool = False) -> dict:
    """The receiver process is SIGKILLed while a robot process streams, then restarted.

    Batches are in flight when it dies; the robot resends from its spool after the
    restart. Every experience ``ship()`` accepted must be stored exactly once.
    """
    robot_id = "kill-bot"
    cons = Consolidator(work)
    endpoint = cons.endpoint
    robot = _Robot(endpoint, work / "spool.db", robot_id, "--period", "0.001", "--flush",
                   "60")
    stats: dict = {}
    try:
        before = robot.rss_mb()
        killed_at = 400 if quick else 1500
        streaming = _wait(lambda: time.sleep(0.1) or _stored_count(cons, robot_id)
                          >= killed_at, 60.0)
        cons.proc.send_signal(signal.SIGKILL)  # mid-stream: batches in flight, unacked
        cons.proc.wait(10)
        stored_at_kill = _stored_count(cons, robot_id)
        time.sleep(1.0)  # the robot ships into a dead consolidator meanwhile
        cons = Consolidator(work, bind=endpoint)
        time.sleep(1.0 if quick else 3.0)  # streaming on after the restart
        growth = robot.rss_mb() - before
        robot_alive = robot.alive()
        stats = robot.stop()  # SIGTERM: stops shipping, flushes, prints its stats
        stored = _stored_traces(cons, robot_id)
        crashed = not robot_alive or not stats or not cons.alive()
    finally:
        robot.kill()
        cons.stop()
    queued = int(stats.get("queued", 0))
    missing, doubled, foreign = _exactly_once({f"r{i}" for i in range(queued)}, stored)
    unaccounted = int(stats.get("spool_rows", 0)) + int(stats.get("shed", 0)) \
        + int(stats.get("shed_disk_full", 0)) + int(stats.get("rejected", 0)) \
        + int(stats.get("spool_failed", 0))
    lost = max(0, missing - unaccounted)
    if crashed:
        detail = f"robot alive {robot_alive}, stats {bool(stats)}; "
    else:
        detail = ""
    detail += (f"{'streaming' if streaming else 'NOT streaming'} at the kill "
               f"({stored_at_kill} stored); shipped {queued}, stored {len(set(stored))} "
               f"distinct of {len(stored)} rows (doubled {doubled}, never shipped {foreign}); "
               f"left in the spool {stats.get('spool_rows')}; acked as duplicates "
               f"{stats.get('duplicates')}, resent {stats.get('resent')}, timeouts "
               f"{stats.get('timeouts')}, disconnects {stats.get('disconnects')}")
    record = _result("link_consolidator_kill9_midstream", crashed=crashed, lost=lost,
                     rss_growth_mb=max(0.0, growth) if np.isfinite(growth) else 0.0,
                     detail=detail)
    record["ok"] = (not crashed and streaming and queued > 0 and missing == 0
                    and doubled == 0 and foreign == 0)
    return record


def _spool_traces(path: Path) -> list[str]:
    """Traces of the rows a spool file holds (read after its owner was killed)."""
    from thinkmem_ros.link.experience import decode_experience
    from thinkmem_ros.link.spool import Spool

    spool = Spool(path, 256 * 1024 * 1024)
    try:
        return [decode_experience(payload).trace for _, payload in
                spool.read_after(-1, 10**7)]
    finally:
        spool.close()


def probe_shipper_kill9_with_spool(work: Path, quick: bool = False) -> dict:
    """A robot spools while its consolidator is away, is SIGKILLed, restarts on that spool.

    The restarted robot ships new experiences on top; once the consolidator comes up,
    every spooled and every new experience must be stored exactly once.
    """
    robot_id = "spool-bot"
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    spool = work / "spool.db"
    count = 2000 if quick else 8000
    first = _Robot(endpoint, spool, robot_id, "--prefix", "a", "--count", str(count),
                   "--period", "0")
    try:
        line = first.proc.stdout.readline()  # "SPOOLED n" once every row reached the spool
        spooled_said = int(line.split()[1]) if line.startswith("SPOOLED ") else -1
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
    finally:
        first.kill()
    on_disk = _spool_traces(spool)
    second = _Robot(endpoint, spool, robot_id, "--prefix", "b", "--period", "0.002",
                    "--flush", "60")
    cons = None
    stats: dict = {}
    try:
        time.sleep(0.5)  # the restarted robot ships into the void a little longer
        before = second.rss_mb()
        cons = Consolidator(work, bind=endpoint)
        time.sleep(1.0 if quick else 2.0)
        growth = second.rss_mb() - before
        robot_alive = second.alive()
        stats = second.stop()
        stored = _stored_traces(cons, robot_id)
        crashed = not robot_alive or not stats or not cons.alive()
    finally:
        second.kill()
        if cons is not None:
            cons.stop()
    queued = int(stats.get("queued", 0))
    shipped = {f"a{i}" for i in range(count)} | {f"b{i}" for i in range(queued)}
    missing, doubled, foreign = _exactly_once(shipped, stored)
    unaccounted = int(stats.get("spool_rows", 0)) + int(stats.get("shed", 0)) \
        + int(stats.get("shed_disk_full", 0)) + int(stats.get("rejected", 0)) \
        + int(stats.get("spool_failed", 0))
    detail = (f"first robot: {count} shipped, said spooled {spooled_said}, found in the "
              f"spool after SIGKILL {len(on_disk)}; restarted robot shipped {queued} more; "
              f"stored {len(set(stored))} distinct of {len(stored)} rows for "
              f"{len(shipped)} shipped (missing {missing}, doubled {doubled}, never shipped "
              f"{foreign}); left in the spool {stats.get('spool_rows')}, acked as duplicates "
              f"{stats.get('duplicates')}")
    record = _result("link_shipper_kill9_with_spool", crashed=crashed,
                     lost=max(0, missing - unaccounted),
                     rss_growth_mb=max(0.0, growth) if np.isfinite(growth) else 0.0,
                     detail=detail)
    record["ok"] = (not crashed and spooled_said == count and len(on_disk) == count
                    and missing == 0 and doubled == 0 and foreign == 0)
    return record


def _foreign_wal(folder: Path) -> bytes:
    """A WAL with committed frames of another database (never checkpointed into it)."""
    import sqlite3

    other = folder / "other.db"
    conn = sqlite3.connect(other)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA wal_autocheckpoint=0")
        conn.execute("CREATE TABLE notes(body BLOB)")
        conn.executemany("INSERT INTO notes VALUES (?)", [(b"n" * 500,)] * 50)
        conn.commit()
        return Path(f"{other}-wal").read_bytes()
    finally:
        conn.close()


def probe_spool_foreign_wal_at_start(work: Path, quick: bool = False) -> dict:
    """A robot restarts on a spool of unsent experiences with another database's WAL beside it.

    A WAL left by a copy, a restore or a reused path. Opened read-write, SQLite would
    replay it and checkpoint it into the spool for good: the file would become the other
    database and every unsent experience would be gone without a word. The spool must be
    moved aside with the WAL, every row salvaged, shipped once, and the robot ship on.
    """
    from thinkmem_ros.link.spool import Spool

    robot, count, fresh = "wal-bot", 1000 if quick else 5000, 200
    spool = work / "robot" / "spool.db"
    kept = Spool(spool, 256 * 1024 * 1024)
    kept.put([(i, encode_experience(_exp(robot, i, f"old{i}", i))) for i in range(1, count + 1)])
    kept.close()
    Path(f"{spool}-wal").write_bytes(_foreign_wal(work))
    cons = Consolidator(work)
    try:
        with ExperienceShipper(_shipper_cfg(cons.endpoint, spool, robot)) as shipper:
            accepted = sum(shipper.ship(_exp(robot, None, f"new{i}", i)) for i in range(fresh))
            drained = shipper.flush(60.0)
            alive, stats = shipper.alive(), shipper.stats()
        stored = _stored_traces(cons, robot)
        crashed = not alive or not cons.alive()
    finally:
        cons.stop()
    shipped = {f"old{i}" for i in range(1, count + 1)} | {f"new{i}" for i in range(accepted)}
    missing, doubled, foreign = _exactly_once(shipped, stored)
    aside = sorted(p.name for p in spool.parent.iterdir() if ".damaged-" in p.name)
    detail = (f"{count} spooled under a foreign WAL, {accepted} of {fresh} shipped after "
              f"start; stored {len(set(stored))} distinct of {len(stored)} rows (missing "
              f"{missing}, doubled {doubled}, never shipped {foreign}); drained {drained}; "
              f"spool_failed {stats['spool_failed']}; moved aside: {', '.join(aside) or 'none'}")
    record = _result("link_spool_foreign_wal_at_start", crashed=crashed,
                     lost=max(0, missing - stats["spool_rows"] - stats["spool_failed"]),
                     detail=detail)
    record["ok"] = (not crashed and drained and accepted == fresh and missing == 0
                    and doubled == 0 and foreign == 0
                    and any(name.endswith("-wal") for name in aside))  # the WAL kept aside
    return record


PROBES: dict[str, Callable[..., dict]] = {
    "link_spoofed_batch": probe_spoofed_batch,
    "link_spoofed_hello": probe_spoofed_hello,
    "link_revoked_key": probe_revoked_key,
    "link_hello_flood": probe_hello_flood,
    "link_batch_long_robot_id": probe_batch_long_robot_id,
    "link_msgpack_bomb": probe_msgpack_bomb,
    "link_record_bomb": probe_record_bomb,
    "link_big_frame_flood": probe_big_frame_flood,
    "link_oversize_frame_to_consolidator": probe_oversize_frame,
    "link_malformed_frames": probe_malformed_frames,
    "link_huge_reply_frame": probe_huge_reply_frame,
    "link_full_disk": probe_full_disk,
    "link_store_damaged_at_open": probe_store_damaged_at_open,
    "link_consolidator_kill9_midstream": probe_consolidator_kill9_midstream,
    "link_shipper_kill9_with_spool": probe_shipper_kill9_with_spool,
    "link_spool_foreign_wal_at_start": probe_spool_foreign_wal_at_start,
}
"""Every link probe by name (the names are the ``probe`` field of their results)."""


def run_probes(names: list[str] | None = None, quick: bool = False) -> list[dict]:
    """Run probes (all by default), each in a fresh scratch folder.

    A probe that raises counts as a crash, reported with its error, never silently skipped.
    """
    results = []
    for name in names or list(PROBES):
        with tempfile.TemporaryDirectory(prefix=f"{name}-") as scratch:
            try:
                results.append(PROBES[name](Path(scratch), quick=quick))
            except Exception as exc:  # report, keep probing
                results.append(_result(name, crashed=True,
                                       detail=f"probe failed: {type(exc).__name__}: {exc}"))
    return results


# ----------------------------------------------------------- the robot in its own process

class _Robot:
    """A shipper in its own process, shipping one experience every 10 ms (by default).

    ``extra`` are more ``_robot_main`` options: ``--prefix`` of the traces, ``--count``
    (stop shipping after that many; it then prints ``SPOOLED n`` once they all reached
    the spool or the store), ``--period`` between experiences and ``--flush S`` (on
    SIGTERM, wait up to S seconds for every experience to be acknowledged first).
    """

    def __init__(self, endpoint: str, spool: Path, robot_id: str, *extra: str) -> None:
        cmd = [sys.executable, "-m", "thinkmem_ros.bench.fault_probes_link", "robot",
               "--endpoint", endpoint, "--spool", str(spool), "--robot-id", robot_id, *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=_env(), cwd=ROOT)
        line = self.proc.stdout.readline()
        if not line.startswith("READY"):
            self.kill()
            raise RuntimeError(f"robot did not start: {line!r}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_mb(self) -> float:
        return rss_mb(self.proc.pid)

    def stop(self, timeout_s: float = 90.0) -> dict:
        """SIGTERM; returns the shipper's stats it printed (empty if it had died)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return {}
        with contextlib.suppress(ValueError, IndexError):
            return json.loads(out.strip().splitlines()[-1])
        return {}

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _robot_main(argv: list[str]) -> int:
    parser = OneLineParser(prog="python -m thinkmem_ros.bench.fault_probes_link")
    parser.add_argument("role", choices=["robot"])
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--spool", required=True)
    parser.add_argument("--robot-id", required=True)
    parser.add_argument("--prefix", default="r")
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--period", type=float, default=0.01)
    parser.add_argument("--flush", type=float, default=0.0)
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    cfg = _shipper_cfg(args.endpoint, Path(args.spool), args.robot_id)
    with ExperienceShipper(cfg) as shipper:
        print("READY", flush=True)
        i = 0
        while not stop.is_set() and (not args.count or i < args.count):
            if shipper.ship(_exp(args.robot_id, None, f"{args.prefix}{i}", i)):
                i += 1
            elif args.count:
                time.sleep(0.01)  # the queue is full: a counted robot ships every one
            if args.period > 0:
                stop.wait(args.period)
        if args.count:
            def kept() -> bool:
                done = shipper.stats()
                return (done["queue"] == 0 and done["spool_rows"] + done["stored"]
                        + done["duplicates"] >= i)
            _wait(kept, 60.0)
            print(f"SPOOLED {shipper.stats()['spool_rows']}", flush=True)
            stop.wait()
        if args.flush > 0:
            shipper.flush(args.flush)
        stats = shipper.stats()
    print(json.dumps(stats), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_robot_main(sys.argv[1:]))
