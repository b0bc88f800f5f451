"""Fleet ingest: several receive-only processes on one store, and one of them killed.

Measurement functions for the future ``thinkmem bench fleet`` (not registered yet):

- ``ingest_rate(receivers, robots, records)``: stored-and-acknowledged experiences per
  second when ``robots`` shippers (one process each, real spools) stream ``records``
  experiences in all to ``receivers`` receive-only processes
  (``python -m thinkmem_ros.consolidator.receive``) writing ONE SQLite store;
  ``results.ingest_per_s_1`` / ``results.ingest_per_s_2`` are this with 1 and 2
  receivers and the same fleet.
- ``receiver_kill(...)``: the same fleet over two receivers; receiver 0 is SIGKILLed
  once a fraction of the stream is in the store, its robots fail over to the other one.
  Every experience carries a unique trace marker: ``lost`` counts markers missing from
  the store, ``duplicated`` extra rows for a marker (``results.receiver_kill.lost`` /
  ``.duplicated``, both must be 0); ``resent_duplicates`` counts re-sent rows the store
  recognised and did not store again (the exactly-once index at work).
- ``bytes_per_experience(records, ship_every)``: wire bytes per experience in plain
  EXPERIENCE_BATCH frames (``before``) and delta batches (``after``, ``link.delta``) for
  records the node's ``ExperienceBuilder`` makes from a world stream; no processes, no
  sockets (see docs/deployment.md, "Bytes per experience").

Robot ids are picked so the fleet spreads evenly over the receivers by the shippers'
own rule (``link.shipper.endpoint_order``): a measurement of two receivers should not
depend on how a hash happened to fall for four names. Robots run in their own processes
(spawned) so the shippers do not share one interpreter lock; the clock runs from the
moment all robots are released (connected and warmed up) to the last robot's drained
spool. ``ack_timeout_s`` is the shipper's default (2 s): shorter than a loaded
receiver's queueing delay, it makes robots re-send whole windows that were only late
(``timeouts``, ``resent_duplicates``). Every process shares this machine's cores: on a
small machine robots and receivers compete for CPU, and the figure says so rather than
what more cores would do.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from thinkmem_ros.consolidator.store import ExperienceStore
from thinkmem_ros.link.experience import Experience
from thinkmem_ros.link.shipper import ExperienceShipper, ShipperConfig, endpoint_order

ROOT = Path(__file__).resolve().parents[2]
WARMUP = 64  # experiences per robot before the clock starts (connection, page cache)


class _Receiver:
    """A receive-only subprocess on the shared store; killable with SIGKILL."""

    def __init__(self, db: Path) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get(
            "PYTHONPATH", ""))
        # cwd=ROOT: ``-m`` puts the working directory first on sys.path
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "thinkmem_ros.consolidator.receive", "--db", str(db),
             "--bind", "tcp://127.0.0.1:*", "--curve", "off"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
        line = self.proc.stdout.readline()
        if not line.startswith("READY "):
            self.proc.kill()
            raise RuntimeError(f"receiver did not start: {line!r}")
        self.endpoint = line.split()[1]

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int | None:
        """SIGTERM and wait; the exit status (0 = clean), None if it would not stop."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return None
        return self.proc.returncode


def spread_robot_ids(robots: int, endpoints: list[str], prefix: str = "fleet-robot"
                     ) -> list[str]:
    """``robots`` ids whose home endpoints (the shippers' own rule) are evenly spread."""
    per = -(-robots // len(endpoints))
    count = dict.fromkeys(endpoints, 0)
    out: list[str] = []
    k = 0
    while len(out) < robots:
        robot = f"{prefix}-{k}"
        home = endpoint_order(robot, endpoints)[0]
        if count[home] < per:
            count[home] += 1
            out.append(robot)
        k += 1
    return out


def _experiences(robot: str, n: int, tag: str, rng: np.random.Generator) -> list[Experience]:
    """``n`` realistic records (32 x 7 window as the default bundle, 10 labels, events)."""
    labels = [f"g{i}" for i in range(10)]
    return [Experience(
        robot_id=robot, episode_id=f"ep{i // 500}", stamp=float(i) * 0.1,
        window=rng.normal(size=(32, 7)).astype(np.float32),
        mask=np.ones((32, 7), dtype=np.uint8), labels=labels,
        probabilities=rng.random(10).astype(np.float32), bundle_version=1,
        events=["E001", "E002", "E017"], trace=f"{tag}{i}") for i in range(n)]


def _robot(robot: str, endpoints: list[str], spool: str, n: int, seed: int,
           ack_timeout_s: float, go, out) -> None:
    """One robot process: warm up, wait for ``go``, ship ``n``, drain, report."""
    rng = np.random.default_rng(seed)
    warm = _experiences(robot, WARMUP, f"{robot}/w", rng)
    items = _experiences(robot, n, f"{robot}/", rng)
    cfg = ShipperConfig(endpoint=endpoints, robot_id=robot, spool_path=spool,
                        batch_size=256, max_inflight=8, queue_size=50_000,
                        ack_timeout_s=ack_timeout_s, backoff_initial_s=0.05,
                        backoff_max_s=0.3)
    report: dict = {"robot": robot, "ok": False}
    try:
        with ExperienceShipper(cfg) as shipper:
            report["home"] = shipper.endpoint_now
            for experience in warm:
                while not shipper.ship(experience):
                    time.sleep(0.0005)
            report["warm"] = shipper.flush(60.0)
            out.put(("ready", robot))
            go.wait(120)
            report["start"] = time.monotonic()
            for experience in items:
                while not shipper.ship(experience):
                    time.sleep(0.0005)
            report["drained"] = shipper.flush(120.0)
            report["end"] = time.monotonic()
            report["stats"] = shipper.stats()
            report["endpoint_now"] = shipper.endpoint_now
            report["ok"] = bool(report["warm"] and report["drained"])
    except Exception as exc:  # noqa: BLE001 - reported to the parent, never a hang
        report["error"] = f"{type(exc).__name__}: {exc}"
    out.put(("done", report))


def _fleet(work: Path, receivers: int, robots: int, records: int, seed: int,
           kill_fraction: float | None, ack_timeout_s: float) -> dict:
    """Run one fleet; with ``kill_fraction`` SIGKILL receiver 0 when that much is stored."""
    if receivers < 1 or robots < 1 or records < robots:
        raise ValueError(f"need receivers >= 1, robots >= 1, records >= robots; got "
                         f"{receivers}, {robots}, {records}")
    db = work / "store.db"
    ExperienceStore(db).close()  # one migration before anyone races for it
    procs = [_Receiver(db) for _ in range(receivers)]
    endpoints = [p.endpoint for p in procs]
    ids = spread_robot_ids(robots, endpoints)
    per_robot = [records // robots + (i < records % robots) for i in range(robots)]
    ctx = mp.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    workers = [ctx.Process(target=_robot, args=(robot, endpoints, str(work / f"{robot}.db"),
                                                n, seed * 1000 + i, ack_timeout_s, go,
                                                out), daemon=True)
               for i, (robot, n) in enumerate(zip(ids, per_robot, strict=True))]
    reports: list[dict] = []
    killed_at = None
    exit_codes: list[int | None] = []
    try:
        for worker in workers:
            worker.start()
        for _ in workers:  # every robot connected and warmed up (or failed: reported)
            kind, value = out.get(timeout=180)
            if kind == "done":
                reports.append(value)
        go.set()
        released = time.monotonic()
        wanted = int(WARMUP * robots + (kill_fraction or 0.0) * records)
        with ExperienceStore(db) as watch:
            while len(reports) < robots:
                armed = kill_fraction is not None and killed_at is None
                if armed and watch.count() >= wanted:
                    procs[0].kill()
                    killed_at = time.monotonic()
                    armed = False
                try:
                    kind, value = out.get(timeout=0.02 if armed else 180)
                except queue.Empty:
                    continue
                if kind == "done":
                    reports.append(value)
    finally:
        go.set()
        for worker in workers:
            worker.join(30)
            if worker.is_alive():
                worker.kill()
        exit_codes = [p.stop() for p in procs]
    failed = [r for r in reports if not r["ok"]]
    if failed:
        raise RuntimeError(f"robots did not drain: {failed[0]}")
    with ExperienceStore(db) as store:
        traces = [e.trace for _, e in store.iter_experiences()]
        rows = store.count()
    wanted_traces = {f"{r}/w{i}" for r in ids for i in range(WARMUP)}
    wanted_traces |= {f"{r}/{i}" for r, n in zip(ids, per_robot, strict=True)
                      for i in range(n)}
    found = [t for t in traces if t in wanted_traces]
    start = min(r["start"] for r in reports)
    end = max(r["end"] for r in reports)
    stats = [r["stats"] for r in reports]
    return {
        "receivers": receivers, "robots": robots, "records": records,
        "ack_timeout_s": ack_timeout_s,
        "seconds": round(end - start, 3),
        "ingest_per_s": round(records / (end - start), 1),
        "rows": rows, "lost": len(wanted_traces - set(found)),
        "duplicated": len(found) - len(set(found)),
        "resent_duplicates": sum(s["duplicates"] for s in stats),
        "failovers": sum(s["failovers"] for s in stats),
        "timeouts": sum(s["timeouts"] for s in stats),
        "robots_per_receiver": [sum(r["home"] == e for r in reports) for e in endpoints],
        "killed": killed_at is not None,
        "killed_after_s": None if killed_at is None else round(killed_at - released, 3),
        "robots_moved": [r["robot"] for r in reports if r["endpoint_now"] != r["home"]],
        "receiver_exit_codes": exit_codes,
    }


def ingest_rate(receivers: int, robots: int, records: int, seed: int = 0,
                ack_timeout_s: float = 2.0) -> dict:
    """Experiences per second stored and acknowledged into one store (``ingest_per_s``).

    ``records`` is the fleet's total (split evenly over the robots). The returned dict
    also holds ``lost``/``duplicated`` (both 0 when ingest is exactly-once), how the
    robots spread (``robots_per_receiver``) and the shippers' failover/timeout counts.
    """
    with tempfile.TemporaryDirectory(prefix="fleet-ingest-") as tmp:
        return _fleet(Path(tmp), receivers, robots, records, seed, kill_fraction=None,
                      ack_timeout_s=ack_timeout_s)


def receiver_kill(robots: int = 4, records: int = 8000, kill_fraction: float = 0.3,
                  seed: int = 0, ack_timeout_s: float = 2.0) -> dict:
    """Two receivers, receiver 0 SIGKILLed mid-stream: ``{"lost", "duplicated", ...}``.

    The kill comes once ``kill_fraction`` of the stream is in the store; the robots homed
    on it must fail over (``failovers``, ``robots_moved``) and re-send from their spools.
    """
    if not 0.0 < kill_fraction < 1.0:
        raise ValueError(f"kill_fraction must be in (0, 1), got {kill_fraction}")
    with tempfile.TemporaryDirectory(prefix="fleet-kill-") as tmp:
        return _fleet(Path(tmp), 2, robots, records, seed, kill_fraction=kill_fraction,
                      ack_timeout_s=ack_timeout_s)


def realistic_experiences(records: int, ship_every: int, seed: int = 0,
                          robot_id: str = "wire-robot") -> list[Experience]:
    """``records`` experiences as a robot running the default bundle ships them.

    A planted ``mixed`` world stream goes through the node's own ``ExperienceBuilder``
    (``bench.rounds.robot_experiences``): 32-frame windows with masks, the bundle's labels,
    probabilities, ids, hashes, signal set and the growing event history. Numbered from
    seq 0, as the shipper would. ``robot_experiences`` gives feedback on every frame, and
    the builder always ships a frame with feedback, so every ``ship_every``-th record is
    kept here: what ``ship_every_n_frames`` ships of frames without feedback.
    """
    from thinkmem_ros.bench.rounds import RATE_HZ, RULES, planted_stream, robot_experiences
    from thinkmem_ros.core.paths import default_bundle
    from thinkmem_ros.world.rule_overlay import mission_kinds

    if records < 1 or ship_every < 1:
        raise ValueError(f"records and ship_every must be >= 1, got {records}, {ship_every}")
    rng = np.random.default_rng([seed, 77])
    duration = (records * ship_every + 64) / RATE_HZ  # + the first window's frames
    missions = max(2, int(duration // 30))
    plan = [(kind, RULES[i % len(RULES)]) for i, kind in
            enumerate(mission_kinds(missions, rng))]
    stream, placed = planted_stream(duration, plan, rng)
    shipped = robot_experiences(default_bundle(), stream, placed, robot_id, 1)[::ship_every]
    if len(shipped) < records:
        raise RuntimeError(f"the stream gave {len(shipped)} experiences, wanted {records}")
    return [e.with_seq(i) for i, e in enumerate(shipped[:records])]


def bytes_per_experience(records: int, ship_every: int, seed: int = 0,
                         batch_size: int = 512) -> dict:
    """Wire bytes per experience, plain vs delta batches: ``{"before", "after", "ratio"}``.

    Records from ``realistic_experiences`` are cut into batches as the shipper cuts them
    (``batch_size`` rows, at most its default ``max_batch_bytes`` of full records) and each
    batch is framed twice: EXPERIENCE_BATCH (``before``) and EXPERIENCE_DELTA_BATCH
    (``after``); bytes are whole frames (header and msgpack body) over ``records``.
    ``after_zlib`` is the delta frame compressed with zlib (level 6), to tell whether
    compression would add anything on top of the delta. Every delta batch is decoded
    again and checked equal to the full records, so the figure is of a working encoding.
    """
    import zlib

    from thinkmem_ros.link import delta, protocol
    from thinkmem_ros.link.experience import encode_experience
    from thinkmem_ros.link.shipper import ShipperConfig

    limit = ShipperConfig.max_batch_bytes
    payloads = [encode_experience(e) for e in realistic_experiences(records, ship_every, seed)]
    before = after = after_zlib = 0
    start = 0
    batch = 0
    while start < len(payloads):
        chunk, size = [], 0
        for payload in payloads[start:start + batch_size]:
            size += len(payload)
            if chunk and size > limit:
                break
            chunk.append(payload)
        start += len(chunk)
        batch += 1
        plain = protocol.experience_batch(batch, "wire-robot", chunk)
        items = delta.encode_items(chunk)
        framed = protocol.experience_delta_batch(batch, "wire-robot", items)
        back = delta.expand_items(protocol.decode_frame(framed).body["items"])[0]
        if back != chunk:
            raise RuntimeError(f"delta batch {batch} did not rebuild its records")
        before += len(plain)
        after += len(framed)
        after_zlib += len(zlib.compress(framed, 6))
    n = len(payloads)
    return {"before": before / n, "after": after / n, "ratio": before / after,
            "after_zlib": after_zlib / n, "ratio_zlib": before / after_zlib,
            "records": n, "ship_every": ship_every, "batches": batch}
