"""End-to-end latency and CPU of the thinking node over real DDS, as a robot would run it.

Reproduce: ``thinkmem bench node --json bench_results/node.json --plot bench_results/node.png``
(``--quick``: 15 s per case instead of 60 s).

Cases (``CASES``), each a fresh node process (one ONNX thread, default sensor-data QoS)
with **experience shipping on** unless the case says otherwise (a real experience receiver,
the consolidator's ingest, in its own process on 127.0.0.1) and /diagnostics at its
default 1 s period:

- ``hz10`` / ``hz100``: seven sensors publish one sample each per frame, at 10 and 100 Hz,
  with ``frame_trigger: samples`` (a frame is assembled the moment the last sample of the
  set arrives);
- ``hz100_single``: ``hz100`` with rclpy's SingleThreadedExecutor instead of the node's
  default events executor, side by side in the same run (its CPU is what the default saves);
- ``hz100_noship``: ``hz100`` without experience shipping, side by side (what shipping
  every frame costs);
- ``sensors1khz``: the seven sensors publish at 1 kHz into 100 Hz frames with
  ``frame_trigger: timer`` (the sample trigger would assemble a frame per sample set,
  1 kHz, ten times the rate the bundle was trained at); ``wait_us`` then holds how old
  the newest sample is when the tick assembles the frame.

Every case runs a bundle made for its frame rate: the default bundle when its
``frame_rate_hz`` matches, else a bundle of the same preset trained here on a few minutes
of streams at that rate (same window K, so the per-frame cost is the default's; its
quality is not what this benchmark measures).

Measured per case:

- inside the node (its stats file, written at shutdown): ``latency`` = ``perf_counter`` on
  entry to the newest sample's callback -> return of the activation ``publish()``, split
  into ``wait`` (that sample -> frame assembled) and ``compute`` (frame -> publish);
- by an external subscriber in this process (sample trigger only: there a frame is one
  published sample set): just before the last ``publish()`` of the set -> the
  activation's arrival here (adds DDS both ways and this process's executor);
- ``cpu_percent``: user+system CPU of the node process over the measured span / wall
  time (100 = one core);
- ``lost``: samples published minus samples the node handled (accepted or refused and
  counted), both over the measured span: the node's cumulative counters are read from
  /diagnostics after a quiet pause before and after it; ``activations_lost``: frames of
  the measured span whose activation never reached the external subscriber.

``middleware_floor.hz100``: right after ``hz100``, the same traffic into
``bench.bare_node`` (the same subscriptions, QoS and executor, one activation-sized String
back per sample set, nothing else): the CPU any rclpy node pays for it, so the node's own
share is ``hz100.cpu_percent`` minus it.

A 2 s warm-up is excluded. Sample values are a seeded random walk (``seeds`` only changes
the values, one run per case).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from thinkmem_ros.bench.common import bench_progress, percentiles_ms
from thinkmem_ros.core.paths import default_bundle


@dataclass(frozen=True)
class Case:
    """One measured configuration: frame rate, sensor rate and frame trigger."""

    frame_rate_hz: float
    sensor_rate_hz: float
    trigger: str
    executor: str = "events"
    shipping: bool = True


CASES = {"hz10": Case(10.0, 10.0, "samples"), "hz100": Case(100.0, 100.0, "samples"),
         "hz100_single": Case(100.0, 100.0, "samples", executor="single"),
         "hz100_noship": Case(100.0, 100.0, "samples", shipping=False),
         "sensors1khz": Case(100.0, 1000.0, "timer")}
WARMUP_S = 2.0
QUIET_S = 1.5
"""Pause without samples before reading the node's counters from /diagnostics."""
QUANTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99, 99.9, 100)
TARGETS = {"hz100.p99_ms": 1.0, "hz100.cpu_percent": 10.0, "sensors1khz.lost": 0}
HANDLED = ("samples", "invalid", "duplicate", "out_of_order", "future")
FLOOR_CASES = ("hz100",)
"""Cases followed by the same traffic into a bare rclpy node (``middleware_floor``)."""
"""Diagnostics counters that together count every sample the node received."""
TRAIN_STREAMS, TRAIN_SECONDS, TRAIN_STEPS = 2, 120.0, 60


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` from /proc (psutil is not a dependency)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bundle_for_rate(rate: float, folder: Path, base: Path | None = None) -> tuple[Path, str]:
    """A bundle whose ``frame_rate_hz`` is ``rate``: ``base`` if it is, else one trained here.

    Returns (path, how): ``how`` is "default" or a note of what was trained. The trained
    bundle keeps the base bundle's preset, window, signals and labels, trained for a few
    dozen steps on ``mixed`` streams rendered at ``rate``.
    """
    from thinkmem_ros.policy.bundle import read_manifest

    base = Path(base) if base else default_bundle()
    manifest = read_manifest(base)
    if abs(manifest.frame_rate_hz - rate) < 1e-9:
        return base, "default"
    out = folder / f"bundle_{rate:g}hz"
    found = re.search(r"--preset\s+(\S+)", (manifest.extras or {}).get("command", ""))
    preset = found.group(1) if found else "default"
    how = f"trained here: preset {preset}, K={manifest.window}, {rate:g} Hz"
    if (out / "bundle.json").is_file():
        return out, how
    import torch

    from thinkmem_ros.policy.training.export import export_bundle
    from thinkmem_ros.policy.training.train import train_policy
    from thinkmem_ros.world.recipe import StreamRecipe

    torch.set_num_threads(1)
    recipe = StreamRecipe(scenario=(manifest.extras or {}).get("scenario", "mixed"),
                          duration=TRAIN_SECONDS, streams=TRAIN_STREAMS, rate=rate,
                          window=manifest.window, max_events=manifest.max_events,
                          stride=max(1, int(rate // 10)), seed=int(rate))
    trained = train_policy(recipe.windows(), preset, seed=0, epochs=1, min_steps=TRAIN_STEPS,
                           progress=False)
    export_bundle(trained, out, frame_rate_hz=rate,
                  extras={"command": f"bench node: preset {preset}, {TRAIN_STEPS} steps at "
                                     f"{rate:g} Hz", "scenario": recipe.scenario})
    return out, how


def _interrupt(proc: subprocess.Popen, timeout: float) -> None:
    """SIGINT (the clean shutdown a node handles), then SIGKILL after ``timeout`` s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5.0)


def _signals(bundle: Path) -> tuple[str, ...]:
    from thinkmem_ros.policy.bundle import read_manifest

    return tuple(read_manifest(bundle).signals)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_receiver(db: Path) -> tuple[subprocess.Popen, str]:
    """The consolidator's experience receiver in its own process; returns (proc, endpoint)."""
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    proc = subprocess.Popen([sys.executable, "-m", "thinkmem_ros.consolidator.ingest", "serve",
                             "--db", str(db), "--bind", endpoint, "--curve", "off"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if not line.startswith("READY"):
        proc.kill()
        raise RuntimeError(f"experience receiver did not start: {line!r}")
    return proc, endpoint


def _start_node(bundle: Path, case: Case, stats: Path, tmp: Path, endpoint: str,
                env: dict) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "thinkmem_ros.robot.node", "--ros-args",
           "-p", f"bundle_path:={bundle}", "-p", f"frame_trigger:={case.trigger}",
           "-p", f"executor:={case.executor}",
           "-p", f"stale_after_s:={max(0.5, 5.0 / case.frame_rate_hz)}",
           "-p", f"stats_file:={stats}", "-p", "watch_bundle:=false",
           "-p", "qos_depth:=50", "-p", "robot_id:=bench"]
    if case.shipping:
        cmd += ["-p", f"consolidator_endpoint:={endpoint}",
                "-p", f"spool_path:={tmp / 'spool.db'}"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


class _Reader(threading.Thread):
    """Collects the node's output so a full pipe never stalls it."""

    def __init__(self, proc: subprocess.Popen) -> None:
        super().__init__(daemon=True)
        self.proc, self.lines = proc, []

    def run(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any("ready:" in line for line in self.lines):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError("thinking_node did not start:\n" + "".join(self.lines[-30:]))


def _messages(signals: tuple[str, ...]):
    """(topic, message class, setter) per signal from the node's default signal map."""
    from thinkmem_ros.robot.msg_fields import FieldPath, message_class
    from thinkmem_ros.robot.node_config import DEFAULT_SIGNAL_MAP

    out = []
    for name in signals:
        src = DEFAULT_SIGNAL_MAP[name]
        cls = message_class(src.msg_type)
        path = FieldPath.compile(src.msg_type, src.field)
        out.append((src.topic, cls, path.segments))
    return out


def _set(msg, segments, value: float) -> None:
    target = msg
    for seg in segments[:-1]:
        target = getattr(target, seg)
    setattr(target, segments[-1], value)


class _Client:
    """The bench side: sensor publishers, activation and diagnostics subscribers."""

    def __init__(self, signals: tuple[str, ...], domain: int, rate: float) -> None:
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from std_msgs.msg import String

        self.rate = rate
        self.base = float(int(time.time()))  # stamps near the node's clock: no offset note
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=domain)
        self.node = rclpy.create_node("bench_node_client", context=self.context)
        self.received: dict[int, float] = {}
        self.activations = 0
        self.diag: list[tuple[float, dict]] = []
        reliable = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        self.node.create_subscription(String, "/thinking/activation", self._on_activation,
                                      reliable)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 10)
        self.pubs = [(self.node.create_publisher(cls, topic, reliable), cls, seg)
                     for topic, cls, seg in _messages(signals)]
        self.sent = 0
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.spinner = threading.Thread(target=self.executor.spin, daemon=True)
        self.spinner.start()

    def _on_activation(self, msg) -> None:
        at = time.perf_counter()
        self.activations += 1
        stamp = json.loads(msg.data).get("inputs_stamp")
        if stamp is not None:
            self.received[int(round((stamp - self.base) * self.rate))] = at

    def _on_diag(self, msg) -> None:
        statuses = {s.name.rsplit(": ", 1)[-1] if s.name.count(":") > 1 else "node":
                    {kv.key: kv.value for kv in s.values} for s in msg.status}
        self.diag.append((time.monotonic(), statuses))

    def send(self, k: int, values: np.ndarray) -> float:
        """Publish sample set ``k``; returns the time just before its last ``publish()``."""
        sec, frac = divmod(self.base + k / self.rate, 1.0)
        msgs = []
        for (_, cls, seg), value in zip(self.pubs, values, strict=True):
            msg = cls()
            if hasattr(msg, "header"):
                msg.header.stamp.sec = int(sec)
                msg.header.stamp.nanosec = int(round(frac * 1e9)) % 1_000_000_000
            _set(msg, seg, float(value))
            msgs.append(msg)
        for (pub, _, _), msg in zip(self.pubs[:-1], msgs[:-1], strict=True):
            pub.publish(msg)
        before_last = time.perf_counter()
        self.pubs[-1][0].publish(msgs[-1])
        self.sent += len(msgs)
        return before_last

    def handled(self, after: float, timeout: float = 10.0) -> tuple[int, dict]:
        """Samples the node handled (cumulative) from the first diagnostics after ``after``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for at, statuses in list(self.diag):
                if at > after and "samples" in statuses.get("node", {}):
                    node = statuses["node"]
                    return sum(int(node.get(k, 0)) for k in HANDLED), statuses
            time.sleep(0.05)
        raise RuntimeError("no /diagnostics from the node within the timeout")

    def close(self) -> None:
        import rclpy

        self.executor.shutdown(timeout_sec=2.0)
        self.node.destroy_node()
        rclpy.shutdown(context=self.context)
        self.spinner.join(timeout=2.0)


def measure_case(case: Case, duration_s: float, bundle: Path, endpoint: str, seed: int,
                 progress=None) -> dict:
    """Publish ``duration_s`` of samples into a fresh node process and time its frames."""
    signals = _signals(bundle)
    domain = os.getpid() % 100 + 101 + int(case.sensor_rate_hz) % 13
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST")
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory(prefix="thinkmem-bench-node-") as tmp:
        stats_path = Path(tmp) / "stats.json"
        proc = _start_node(bundle, case, stats_path, Path(tmp), endpoint, env)
        reader = _Reader(proc)
        reader.start()
        client = _Client(signals, domain, case.sensor_rate_hz)
        try:
            reader.wait_ready(timeout=60.0)
            sent = _publish(client, case, duration_s, rng, progress, proc.pid)
        finally:
            _interrupt(proc, timeout=15.0)
            client.close()
        if not stats_path.is_file():
            raise RuntimeError("node wrote no stats:\n" + "".join(reader.lines[-30:]))
        stats = json.loads(stats_path.read_text())
    return _summarise(case, sent, client.received, stats, proc.returncode)


def _publish(client: _Client, case: Case, duration_s: float, rng, progress, pid: int) -> dict:
    """Discovery, quiet, warm-up + measured sample sets on a fixed schedule, quiet again."""
    period = 1.0 / case.sensor_rate_hz
    warm = int(WARMUP_S * case.sensor_rate_hz)
    total = warm + int(duration_s * case.sensor_rate_hz)
    values = rng.normal(size=len(client.pubs))
    task = progress.add_task(f"node {case.trigger} {case.sensor_rate_hz:g} Hz samples -> "
                             f"{case.frame_rate_hz:g} Hz frames", total=total) \
        if progress else None
    _discover(client, values, "the node")  # before anything is counted
    time.sleep(QUIET_S)
    handled0, _ = client.handled(after=time.monotonic())
    sent0 = client.sent
    out = _schedule(client, period, warm, total, values, rng, pid,
                    lambda k: progress.update(task, completed=k) if progress else None)
    time.sleep(QUIET_S)
    handled1, statuses = client.handled(after=time.monotonic())
    return {**out, "samples_published": client.sent - sent0,
            "samples_handled": handled1 - handled0, "diagnostics": statuses}


def _discover(client: _Client, values: np.ndarray, who: str) -> None:
    """Send probe sample sets until an activation stamped with one comes back.

    Discovery is then done both ways: the far-past stamps keep probes out of the span.
    """
    deadline, probe = time.monotonic() + 30.0, -10**6
    while time.monotonic() < deadline and not client.received:
        client.send(probe, values)
        probe += 1
        time.sleep(0.05)
    if not client.received:
        raise RuntimeError(f"no activation came back from {who} within 30 s "
                           "(discovery failed?)")


def _schedule(client: _Client, period: float, warm: int, total: int, values: np.ndarray,
              rng, pid: int, tick) -> dict:
    """Publish ``total`` sample sets every ``period`` s; CPU of ``pid`` after ``warm``."""
    client.received.clear()
    sent_at: dict[int, float] = {}
    cpu0 = wall0 = None
    start = time.perf_counter()
    for k in range(total):
        delay = start + k * period - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        if k == warm:
            cpu0, wall0 = _cpu_seconds(pid), time.perf_counter()
        values += rng.normal(scale=0.05, size=values.shape)
        sent_at[k] = client.send(k, values)
        if k % 100 == 0:
            tick(k)
    wall = time.perf_counter() - wall0
    tick(total)
    return {"sent_at": sent_at, "warm": warm, "total": total,
            "cpu_percent": (_cpu_seconds(pid) - cpu0) / wall * 100.0,
            "stamp_base": client.base,
            "sensor_rate_achieved_hz": total / (time.perf_counter() - start)}


def measure_floor(case: Case, duration_s: float, signals: tuple[str, ...], seed: int,
                  progress=None) -> dict:
    """CPU of ``bench.bare_node`` under ``case``'s traffic: the middleware floor.

    Same schedule, topics, QoS and executor as the thinking node gets, one activation-sized
    String back per sample set; the external latency is measured the same way too.
    """
    domain = os.getpid() % 100 + 131
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST")
    proc = subprocess.Popen([sys.executable, "-m", "thinkmem_ros.bench.bare_node",
                             "--executor", case.executor, "--signals", ",".join(signals)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    client = None
    try:
        ready = proc.stdout.readline()
        if not ready.startswith("READY"):
            raise RuntimeError(f"bare node did not start: {ready!r}")
        client = _Client(signals, domain, case.sensor_rate_hz)
        rng = np.random.default_rng(seed)
        values = rng.normal(size=len(signals))
        _discover(client, values, "the bare node")
        time.sleep(QUIET_S)
        task = progress.add_task(f"middleware floor (bare rclpy node), "
                                 f"{case.sensor_rate_hz:g} Hz", total=1) if progress else None
        warm = int(WARMUP_S * case.sensor_rate_hz)
        total = warm + int(duration_s * case.sensor_rate_hz)
        sent = _schedule(client, 1.0 / case.sensor_rate_hz, warm, total, values, rng,
                         proc.pid, lambda k: progress.update(task, completed=k / total)
                         if progress else None)
        time.sleep(QUIET_S)
    finally:
        _interrupt(proc, timeout=10.0)
        if client is not None:
            client.close()
    measured = [k for k in sent["sent_at"] if k >= warm]
    external = [client.received[k] - sent["sent_at"][k] for k in measured
                if k in client.received]
    ext = percentiles_ms(external)
    return {"cpu_percent": sent["cpu_percent"], "executor": case.executor,
            "external_p50_ms": ext["p50_ms"], "external_p99_ms": ext["p99_ms"],
            "frames": len(measured), "activations_lost": len(measured) - len(external),
            "sensor_rate_achieved_hz": sent["sensor_rate_achieved_hz"]}


def _quantiles(values_s: list[float]) -> dict[str, float]:
    arr = np.asarray(values_s) * 1e3
    return {str(q): float(np.percentile(arr, q)) for q in QUANTILES} if arr.size else {}


def _summarise(case: Case, sent: dict, received: dict, stats: dict, rc: int) -> dict:
    base = sent.pop("sent_at")
    measured = [k for k in base if k >= sent["warm"]]
    inside, wait, compute = [], [], []
    for row in stats["frames"]:
        stamp, lat, w, c = (list(row) + [None, None])[:4]
        if stamp is None or lat is None:
            continue
        k = int(round((stamp - sent["stamp_base"]) * case.sensor_rate_hz))
        if not sent["warm"] <= k < sent["total"]:  # probes, warm-up
            continue
        inside.append(lat * 1e-6)
        if w is not None:
            wait.append(w * 1e-6)
        if c is not None:
            compute.append(c * 1e-6)
    node, w, c = percentiles_ms(inside), percentiles_ms(wait), percentiles_ms(compute)
    out = {"p50_ms": node["p50_ms"], "p99_ms": node["p99_ms"], "p999_ms": node["p999_ms"],
           "max_ms": node["max_ms"],
           "wait_p50_ms": w["p50_ms"], "wait_p99_ms": w["p99_ms"],
           "compute_p50_ms": c["p50_ms"], "compute_p99_ms": c["p99_ms"],
           "compute_p999_ms": c["p999_ms"],
           "cpu_percent": sent["cpu_percent"],
           "lost": int(sent["samples_published"] - sent["samples_handled"]),
           "samples_published": int(sent["samples_published"]),
           "samples_handled": int(sent["samples_handled"]),
           "sensor_rate_hz": case.sensor_rate_hz, "frame_rate_hz": case.frame_rate_hz,
           "sensor_rate_achieved_hz": sent["sensor_rate_achieved_hz"],
           "frame_trigger": case.trigger, "executor": case.executor,
           "shipping_on": case.shipping,
           "node_frames": len(inside), "node_exit_code": rc,
           "inference_p50_ms": float(np.percentile(stats["inference_us"], 50)) * 1e-3
           if stats["inference_us"] else float("nan"),
           "quantiles_ms": _quantiles(inside), "wait_quantiles_ms": _quantiles(wait),
           "compute_quantiles_ms": _quantiles(compute),
           "shipping": sent["diagnostics"].get("shipping", {})}
    if case.trigger == "samples":
        external = [received[k] - base[k] for k in measured if k in received]
        ext = percentiles_ms(external)
        out.update({"external_p50_ms": ext["p50_ms"], "external_p99_ms": ext["p99_ms"],
                    "external_p999_ms": ext["p999_ms"], "external_max_ms": ext["max_ms"],
                    "frames": len(measured), "activations_lost": len(measured) - len(external),
                    "external_quantiles_ms": _quantiles(external)})
    return out


def run(quick: bool, seeds: int, duration_s: float | None = None,
        bundle: str | Path | None = None, cases: tuple[str, ...] | None = None) -> dict:
    """Every case; ``duration_s`` overrides the 60 s (quick: 15 s) measured span."""
    duration = duration_s if duration_s is not None else (15.0 if quick else 60.0)
    base = Path(bundle) if bundle else default_bundle()
    names = cases or tuple(CASES)
    results, bundles, floor = {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="thinkmem-bench-node-") as tmp:
        receiver, endpoint = _start_receiver(Path(tmp) / "experiences.db")
        try:
            with bench_progress() as progress:
                for name in names:
                    case = CASES[name]
                    path, how = bundle_for_rate(case.frame_rate_hz, Path(tmp), base)
                    bundles[name] = {"path": str(path) if how == "default" else how,
                                     "frame_rate_hz": case.frame_rate_hz}
                    results[name] = measure_case(case, duration, path, endpoint, seed=seeds,
                                                 progress=progress)
                    if name in FLOOR_CASES:
                        floor[name] = measure_floor(case, duration, _signals(path), seeds,
                                                    progress)
        finally:
            receiver.send_signal(signal.SIGTERM)
            try:
                receiver.wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                receiver.kill()
    met = {}
    for key, target in TARGETS.items():
        case, field = key.split(".")
        if case in results:
            value = results[case][field]
            met[key] = bool(value == target if field == "lost" else value <= target
                            if field == "cpu_percent" else value < target)
    return {
        "metric": "latency_ms",
        "results": results,
        "curves": {f"{key}_quantiles_ms": results[key]["quantiles_ms"] for key in results},
        "targets": dict(TARGETS), "met": met, "duration_s": duration, "bundles": bundles,
        "middleware_floor": floor,
        "shipping": True, "diagnostics_period_s": 1.0,
    }


def plot(result: dict, path) -> None:
    """Latency quantiles per case: inside the node, its wait/compute parts, external."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["results"]
    fig, axes = plt.subplots(1, len(rows), figsize=(5 * len(rows), 4), sharey=True,
                             squeeze=False)
    for ax, (key, row) in zip(axes[0], rows.items(), strict=True):
        for name, label in (("quantiles_ms", "inside node (sample -> publish)"),
                            ("wait_quantiles_ms", "wait (sample -> frame)"),
                            ("compute_quantiles_ms", "compute (frame -> publish)"),
                            ("external_quantiles_ms", "external subscriber")):
            q = row.get(name, {})
            if q:
                ax.plot([float(x) for x in q], list(q.values()), marker="o", label=label)
        ax.axhline(TARGETS["hz100.p99_ms"], color="red", linestyle="--", linewidth=1,
                   label="target p99 (100 Hz, inside)")
        ax.set_yscale("log")
        ax.set_xlabel("percentile")
        floor = result.get("middleware_floor", {}).get(key)
        ax.set_title(f"{key}: p99 {row['p99_ms']:.3f} ms, CPU {row['cpu_percent']:.0f}%"
                     + (f" (bare rclpy node {floor['cpu_percent']:.0f}%)" if floor else "")
                     + f", lost {row['lost']}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("ms")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("thinking_node latency and CPU (shipping and diagnostics on)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
