"""``thinkmem bench transport``: shipper -> receiver throughput and fault accounting.

Reproduce: ``thinkmem bench transport --json transport.json --plot transport.png``.

Throughput is stored-and-acknowledged experiences per second on loopback, with CURVE on
and off: the receiver runs in its own process (``python -m thinkmem_ros.consolidator.ingest
serve``) writing a real SQLite store, the shipper runs here with its durable spool; the
clock runs from the first ``ship`` to the moment the last ACK has emptied the spool. A
warm-up stream (connection, CURVE handshake, SQLite page cache) is excluded.

CPU cost: the machine this runs on may be shared, so wall-clock rates depend on its load.
Each run also records the process CPU time (user + system, all threads: encoding, SQLite,
ZeroMQ's I/O thread with CURVE) that each side spent in the timed window, per experience:
``cpu_us_per_exp.shipper`` (this process, ``getrusage``) and ``cpu_us_per_exp.receiver``
(the receiver process, from ``/proc/PID/stat``). Their sum bounds the rate one free core
could reach; their maximum, the rate with one core per side.

Faults: (1) the receiver is killed with SIGKILL in the middle of the stream and
restarted; (2) the node (shipper) is restarted with a non-empty spool while the
consolidator was down. Every experience carries a unique trace marker, so ``lost`` counts
markers missing from the store and ``duplicated`` counts extra rows for a marker; both
must be 0.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from thinkmem_ros.consolidator.store import ExperienceStore
from thinkmem_ros.core.metrics import mean_std
from thinkmem_ros.link.experience import Experience
from thinkmem_ros.link.security import write_curve_keypair
from thinkmem_ros.link.shipper import ExperienceShipper, ShipperConfig

TARGET_PER_S = 20_000
ROOT = Path(__file__).resolve().parents[2]


def _experiences(n: int, rng: np.random.Generator, tag: str = "") -> list[Experience]:
    """``n`` realistic records (32 x 7 window, 10 labels, events), distinct trace markers."""
    labels = [f"g{i}" for i in range(10)]
    out = []
    for i in range(n):
        out.append(Experience(
            robot_id="bench-robot", episode_id=f"ep{i // 500}", stamp=float(i) * 0.1,
            window=rng.normal(size=(32, 7)).astype(np.float32),
            mask=np.ones((32, 7), dtype=np.uint8), labels=labels,
            probabilities=rng.random(10).astype(np.float32), bundle_version=1,
            events=["E001", "E002", "E017"], trace=f"{tag}{i}" if tag else None,
            reward=float(rng.random())))
    return out


class _Receiver:
    """A receiver subprocess, killable with SIGKILL and restartable on the same endpoint."""

    def __init__(self, db: Path, keys: Path | None) -> None:
        self.db = db
        self.keys = keys
        self.proc: subprocess.Popen | None = None
        self.endpoint = "tcp://127.0.0.1:*"

    def start(self) -> str:
        cmd = [sys.executable, "-m", "thinkmem_ros.consolidator.ingest", "serve",
               "--db", str(self.db), "--bind", self.endpoint]
        if self.keys is not None:
            cmd += ["--curve", "on", "--server-key", str(self.keys / "server.key_secret"),
                    "--allow", str(self.keys / "allowed")]
        else:
            cmd += ["--curve", "off"]
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get(
            "PYTHONPATH", ""))
        # cwd=ROOT: ``-m`` puts the working directory first on sys.path, so another
        # checkout's package there would be served instead of this one
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=env, cwd=ROOT)
        line = self.proc.stdout.readline()
        if not line.startswith("READY "):
            raise RuntimeError(f"receiver did not start: {line!r}")
        self.endpoint = line.split()[1]
        return self.endpoint

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(10)


def _keys(folder: Path) -> Path:
    write_curve_keypair(folder, "server")
    write_curve_keypair(folder, "robot")
    (folder / "allowed").mkdir()
    # the allow-list binds the key to the robot id it ships as (<robot_id>.key)
    (folder / "allowed" / "bench-robot.key").write_bytes((folder / "robot.key").read_bytes())
    return folder


def _shipper(endpoint: str, spool: Path, keys: Path | None, **kw) -> ShipperConfig:
    curve = {}
    if keys is not None:
        curve = dict(curve="on", server_public_key=keys / "server.key",
                     client_secret_file=keys / "robot.key_secret")
    base = dict(endpoint=endpoint, robot_id="bench-robot", spool_path=spool,
                batch_size=1024, max_inflight=8, queue_size=50_000, ack_timeout_s=1.0,
                backoff_initial_s=0.05, backoff_max_s=0.5)
    base.update(kw)
    return ShipperConfig(**base, **curve)


def _ship_all(shipper: ExperienceShipper, items: list[Experience], repeat: int = 1) -> None:
    for _ in range(repeat):
        for experience in items:
            while not shipper.ship(experience):
                time.sleep(0.0005)


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of another process (Linux ``/proc``); NaN elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _throughput(work: Path, n: int, rng: np.random.Generator, curve: bool) -> dict:
    keys = _keys(work / "keys") if curve else None
    receiver = _Receiver(work / "store.db", keys)
    pool = _experiences(1000, rng)
    try:
        endpoint = receiver.start()
        with ExperienceShipper(_shipper(endpoint, work / "spool.db", keys)).start() as ship:
            _ship_all(ship, pool, repeat=2)  # warm-up, excluded
            if not ship.flush(60):
                raise RuntimeError(f"warm-up did not drain: {ship.stats()}")
            cpu_rx, cpu_tx = _proc_cpu_s(receiver.proc.pid), _own_cpu_s()
            start = time.perf_counter()
            _ship_all(ship, pool, repeat=n // len(pool))
            if not ship.flush(300):
                raise RuntimeError(f"stream did not drain: {ship.stats()}")
            elapsed = time.perf_counter() - start
            cpu_tx = _own_cpu_s() - cpu_tx
            cpu_rx = _proc_cpu_s(receiver.proc.pid) - cpu_rx
    finally:
        receiver.stop()
    with ExperienceStore(work / "store.db") as store:
        stored = store.count()
    expected = 2 * len(pool) + (n // len(pool)) * len(pool)
    if stored != expected:
        raise RuntimeError(f"stored {stored} experiences, expected {expected}")
    timed = (n // len(pool)) * len(pool)
    return {"per_s": timed / elapsed, "shipper_cpu_us": 1e6 * cpu_tx / timed,
            "receiver_cpu_us": 1e6 * cpu_rx / timed}


def _count(db: Path, n: int, tag: str) -> tuple[int, int]:
    """(lost, duplicated) for markers ``tag0..tag{n-1}`` in the store."""
    with ExperienceStore(db) as store:
        traces = [e.trace for _, e in store.iter_experiences()]
    wanted = {f"{tag}{i}" for i in range(n)}
    found = [t for t in traces if t in wanted]
    return len(wanted - set(found)), len(found) - len(set(found))


def _kill_run(work: Path, n: int, rng: np.random.Generator) -> dict:
    """SIGKILL the consolidator after a third of the stream is acked, restart it."""
    items = _experiences(n, rng, tag="k")
    receiver = _Receiver(work / "store.db", None)
    endpoint = receiver.start()
    cfg = _shipper(endpoint, work / "spool.db", None, batch_size=256)
    try:
        with ExperienceShipper(cfg).start() as shipper:
            killed = False
            for experience in items:
                while not shipper.ship(experience):
                    time.sleep(0.0005)
                if not killed and shipper.stats()["acked"] >= n // 3:
                    receiver.kill()
                    killed = True
            if not killed:
                receiver.kill()
            time.sleep(0.3)
            receiver.start()
            drained = shipper.flush(120)
            stats = shipper.stats()
    finally:
        receiver.stop()
    lost, duplicated = _count(work / "store.db", n, "k")
    return {"lost": lost, "duplicated": duplicated, "drained": drained,
            "resent": stats["resent"], "dedup_on_replay": stats["duplicates"]}


def _restart_run(work: Path, n: int, rng: np.random.Generator) -> dict:
    """Node restart with a non-empty spool: ship while the consolidator is down, restart."""
    items = _experiences(n, rng, tag="r")
    receiver = _Receiver(work / "store.db", None)
    endpoint = receiver.start()
    receiver.stop()  # consolidator down; its port is reused below
    receiver.endpoint = endpoint
    half = n // 2
    with ExperienceShipper(_shipper(endpoint, work / "spool.db", None)).start() as shipper:
        _ship_all(shipper, items[:half])
    receiver.start()
    try:
        with ExperienceShipper(_shipper(endpoint, work / "spool.db", None)).start() as shipper:
            spooled_at_start = shipper.stats()["spool_rows"]
            _ship_all(shipper, items[half:])
            drained = shipper.flush(120)
    finally:
        receiver.stop()
    lost, duplicated = _count(work / "store.db", n, "r")
    return {"lost": lost, "duplicated": duplicated, "drained": drained,
            "spooled_at_restart": spooled_at_start}


def run(quick: bool, seeds: int) -> dict:
    """Throughput with CURVE on/off and fault runs, ``seeds`` repetitions each."""
    from rich.progress import Progress

    n = 20_000 if quick else 100_000
    n_fault = 5_000 if quick else 20_000
    rates: dict[str, list[float]] = {"curve_off": [], "curve_on": []}
    cpu: dict[str, dict[str, list[float]]] = {
        name: {"shipper": [], "receiver": []} for name in rates}
    faults: list[dict] = []
    with Progress() as progress, tempfile.TemporaryDirectory(prefix="tm-bench-") as tmp:
        task = progress.add_task("transport", total=4 * seeds)
        for seed in range(seeds):
            rng = np.random.default_rng(seed)
            for name, curve in (("curve_off", False), ("curve_on", True)):
                work = Path(tmp) / f"{name}-{seed}"
                work.mkdir()
                run_ = _throughput(work, n, rng, curve)
                rates[name].append(run_["per_s"])
                cpu[name]["shipper"].append(run_["shipper_cpu_us"])
                cpu[name]["receiver"].append(run_["receiver_cpu_us"])
                progress.advance(task)
            for kind, fn in (("kill9", _kill_run), ("node_restart", _restart_run)):
                work = Path(tmp) / f"{kind}-{seed}"
                work.mkdir()
                faults.append({"fault": kind, "seed": seed, **fn(work, n_fault, rng)})
                progress.advance(task)
    results = {}
    for name, values in rates.items():
        stats = mean_std(values)
        costs = {side: float(np.mean(v)) for side, v in cpu[name].items()}
        results[name] = {"per_s": stats["mean"], **stats, "target": TARGET_PER_S,
                         "runs": values, "cpu_us_per_exp": costs,
                         "cpu_us_per_exp_runs": cpu[name],
                         # the rate if each side had one core of its own, from CPU cost
                         "per_s_cpu_bound": 1e6 / max(costs.values())}
    results["faults"] = {
        "lost": sum(f["lost"] for f in faults),
        "duplicated": sum(f["duplicated"] for f in faults),
        "runs": faults,
    }
    return {"metric": "experiences_per_s", "results": results, "curves": {},
            "experiences_per_run": n, "fault_experiences_per_run": n_fault}


def plot(report: dict, path: str | Path) -> None:
    """Bar chart of throughput (CURVE off/on) against the target, fault counts in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    names = ["curve_off", "curve_on"]
    means = [results[n]["per_s"] for n in names]
    stds = [results[n].get("std", 0.0) for n in names]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(["CURVE off", "CURVE on"], means, yerr=stds, color=["#8aa", "#2a7"], capsize=6)
    ax.axhline(TARGET_PER_S, color="r", linestyle="--", label=f"target {TARGET_PER_S}/s")
    ax.set_ylabel("stored + acked experiences / s")
    for x, name in enumerate(names):
        cost = results[name].get("cpu_us_per_exp")
        if cost:
            ax.text(x, means[x] / 2, f"CPU per experience\nshipper {cost['shipper']:.1f} us\n"
                    f"receiver {cost['receiver']:.1f} us", ha="center", va="center",
                    fontsize=8, color="white")
    ax.set_ylim(0, 1.15 * max(TARGET_PER_S, *[m + e for m, e in zip(means, stds)]))
    faults = results["faults"]
    load = report.get("machine", {}).get("load_avg_1_5_15")
    where = f"; load {load[0]:.1f}" if load else ""
    ax.set_title(f"loopback shipper -> receiver; faults: lost {faults['lost']}, "
                 f"duplicated {faults['duplicated']}{where}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
