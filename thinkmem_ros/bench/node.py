"""End-to-end latency of the thinking node over real DDS, at 10 Hz and at 100 Hz.

Reproduce: ``thinkmem bench node --json bench_results/node.json --plot bench_results/node.png``
(``--quick``: 15 s per rate instead of 60 s).

The node runs as its own process (shipped default bundle, one ONNX thread, default
sensor-data QoS) with ``frame_trigger: samples``: a frame is assembled the moment the
last of its seven samples arrives, so "latency" is exactly the time from the arrival of
a frame's last sample to the publication of its activation. It is measured twice:

- inside the node: ``perf_counter`` on entry to the last sample's callback -> return of
  the activation ``publish()`` (the node writes these to its stats file at shutdown);
- by an external subscriber in this process: just before the publisher's last
  ``publish()`` of the frame -> the activation's arrival in a callback here (this adds the
  publish call, DDS transport both ways and this process's executor and GIL; both
  processes read the same CLOCK_MONOTONIC). Taking the time *after* ``publish()`` returns
  would understate it: the node often has the sample before the call returns.

Frames are matched by their header stamp (the frame number), which the node echoes as
``inputs_stamp``. A 2 s warm-up is excluded. ``lost``: frames published in the measured
span whose activation never reached the external subscriber. ``cpu_percent``: user+system
CPU time of the node process over the measured span / wall time (100 = one core).
Sample values are a seeded random walk (``seeds`` only changes the values, one run per rate).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from thinkmem_ros.bench.common import bench_progress, percentiles_ms
from thinkmem_ros.core.paths import default_bundle

RATES = {"hz10": 10.0, "hz100": 100.0}
WARMUP_S = 2.0
STAMP_BASE = 1000  # frame k carries header stamp STAMP_BASE + k seconds
QUANTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99, 99.9, 100)
TARGET_P99_MS = 2.0


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` from /proc (psutil is not a dependency)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start_node(bundle: Path, rate: float, stats: Path, env: dict) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "thinkmem_ros.robot.node", "--ros-args",
           "-p", f"bundle_path:={bundle}", "-p", "frame_trigger:=samples",
           "-p", f"frame_rate_hz:={rate}", "-p", f"stale_after_s:={max(0.5, 5.0 / rate)}",
           "-p", f"stats_file:={stats}", "-p", "watch_bundle:=false",
           "-p", "qos_depth:=50"]
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


def measure_rate(rate: float, duration_s: float, bundle: Path, seed: int, progress=None) -> dict:
    """Publish ``duration_s`` of frames at ``rate`` into a fresh node process and time them."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from std_msgs.msg import String

    from thinkmem_ros.policy.bundle import read_manifest

    signals = tuple(read_manifest(bundle).signals)
    env = dict(os.environ, ROS_DOMAIN_ID=str(os.getpid() % 100 + 101 + int(rate) % 7),
               ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST")
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory(prefix="thinkmem-bench-node-") as tmp:
        stats_path = Path(tmp) / "stats.json"
        proc = _start_node(bundle, rate, stats_path, env)
        reader = _Reader(proc)
        reader.start()
        context = rclpy.Context()
        rclpy.init(context=context, domain_id=int(env["ROS_DOMAIN_ID"]))
        client = rclpy.create_node("bench_node_client", context=context)
        received: dict[int, float] = {}

        def on_activation(msg: String) -> None:
            at = time.perf_counter()
            stamp = json.loads(msg.data).get("inputs_stamp")
            if stamp is not None:
                received[int(round(stamp)) - STAMP_BASE] = at

        reliable = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        client.create_subscription(String, "/thinking/activation", on_activation, reliable)
        pubs = [(client.create_publisher(cls, topic, reliable), cls, seg)
                for topic, cls, seg in _messages(signals)]
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(client)
        spinner = threading.Thread(target=executor.spin, daemon=True)
        spinner.start()
        try:
            reader.wait_ready(timeout=60.0)
            sent = _publish(pubs, rate, duration_s, rng, received, progress, proc.pid)
            time.sleep(1.0)  # trailing activations
            cpu = sent.pop("cpu_pid")
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=15.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5.0)
            executor.shutdown(timeout_sec=2.0)
            client.destroy_node()
            rclpy.shutdown(context=context)
            spinner.join(timeout=2.0)
        if not stats_path.is_file():
            raise RuntimeError("node wrote no stats:\n" + "".join(reader.lines[-30:]))
        stats = json.loads(stats_path.read_text())
    return _summarise(sent, received, stats, cpu, proc.returncode)


def _publish(pubs, rate: float, duration_s: float, rng, received, progress,
             pid: int) -> dict:
    """Publish warm-up then measured frames on a fixed schedule; returns per-frame send times."""
    period = 1.0 / rate
    warm = int(WARMUP_S * rate)
    total = warm + int(duration_s * rate)
    values = rng.normal(size=len(pubs))
    sent_at: dict[int, float] = {}
    task = progress.add_task(f"node @ {rate:g} Hz", total=total) if progress else None
    # wait until the node hears us (discovery) before starting the clock
    deadline = time.monotonic() + 30.0
    probe = -1
    while time.monotonic() < deadline and not received:
        _send_frame(pubs, probe, values)
        probe -= 1
        time.sleep(0.05)
    if not received:
        raise RuntimeError("no activation came back within 30 s (discovery failed?)")
    received.clear()
    cpu0 = wall0 = None
    start = time.perf_counter()
    for k in range(total):
        target = start + k * period
        delay = target - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        if k == warm:
            cpu0, wall0 = _cpu_seconds(pid), time.perf_counter()
        values += rng.normal(scale=0.05, size=values.shape)
        sent_at[k] = _send_frame(pubs, k, values)
        if progress:
            progress.update(task, advance=1)
    wall = time.perf_counter() - wall0
    cpu = (_cpu_seconds(pid) - cpu0) / wall * 100.0
    return {"sent_at": sent_at, "warm": warm, "total": total, "cpu_pid": cpu}



def _send_frame(pubs, k: int, values: np.ndarray) -> float:
    """Publish frame ``k``; returns the time just before the last sample's ``publish()``."""
    sec = STAMP_BASE + k
    msgs = []
    for (_, cls, seg), value in zip(pubs, values, strict=True):
        msg = cls()
        if hasattr(msg, "header"):
            msg.header.stamp.sec = sec
        _set(msg, seg, float(value))
        msgs.append(msg)
    for (pub, _, _), msg in zip(pubs[:-1], msgs[:-1], strict=True):
        pub.publish(msg)
    before_last = time.perf_counter()
    pubs[-1][0].publish(msgs[-1])
    return before_last


def _summarise(sent: dict, received: dict, stats: dict, cpu: float, rc: int) -> dict:
    measured = [k for k in sent["sent_at"] if k >= sent["warm"]]
    external = [received[k] - sent["sent_at"][k] for k in measured if k in received]
    keep = set(measured)
    inside = [lat * 1e-6 for stamp, lat in stats["frames"]
              if stamp is not None and lat is not None
              and int(round(stamp)) - STAMP_BASE in keep]
    node = percentiles_ms(inside)
    ext = percentiles_ms(external)
    return {
        "p50_ms": node["p50_ms"], "p99_ms": node["p99_ms"], "p999_ms": node["p999_ms"],
        "max_ms": node["max_ms"],
        "external_p50_ms": ext["p50_ms"], "external_p99_ms": ext["p99_ms"],
        "external_p999_ms": ext["p999_ms"], "external_max_ms": ext["max_ms"],
        "cpu_percent": cpu, "frames": len(measured), "lost": len(measured) - len(external),
        "node_frames": len(inside), "node_exit_code": rc,
        "inference_p50_ms": float(np.percentile(stats["inference_us"], 50)) * 1e-3
        if stats["inference_us"] else float("nan"),
        "quantiles_ms": {str(q): float(np.percentile(np.asarray(inside) * 1e3, q))
                         for q in QUANTILES} if inside else {},
        "external_quantiles_ms": {str(q): float(np.percentile(np.asarray(external) * 1e3, q))
                                  for q in QUANTILES} if external else {},
    }


def run(quick: bool, seeds: int, duration_s: float | None = None,
        bundle: str | Path | None = None) -> dict:
    """Both rates; ``duration_s`` overrides the 60 s (quick: 15 s) measured span."""
    duration = duration_s if duration_s is not None else (15.0 if quick else 60.0)
    bundle = Path(bundle) if bundle else default_bundle()
    results = {}
    with bench_progress() as progress:
        for key, rate in RATES.items():
            results[key] = measure_rate(rate, duration, bundle, seed=seeds, progress=progress)
    return {
        "metric": "latency_ms",
        "results": results,
        "curves": {f"{key}_quantiles_ms": results[key]["quantiles_ms"] for key in results},
        "targets": {"hz100.p99_ms": TARGET_P99_MS, "hz100.lost": 0},
        "met": {"hz100.p99_ms": results["hz100"]["p99_ms"] < TARGET_P99_MS,
                "hz100.lost": results["hz100"]["lost"] == 0},
        "duration_s": duration, "bundle": str(bundle), "frame_trigger": "samples",
    }


def plot(result: dict, path) -> None:
    """Latency quantiles inside the node and at the external subscriber, per rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, (key, row) in zip(axes, result["results"].items(), strict=True):
        for name, label in (("quantiles_ms", "inside node"),
                            ("external_quantiles_ms", "external subscriber")):
            q = row.get(name, {})
            if q:
                ax.plot([float(x) for x in q], list(q.values()), marker="o", label=label)
        ax.axhline(TARGET_P99_MS, color="red", linestyle="--", linewidth=1,
                   label="target p99 (100 Hz, inside)")
        ax.set_yscale("log")
        ax.set_xlabel("percentile")
        ax.set_title(f"{key}: p99 {row['p99_ms']:.3f} ms inside, lost {row['lost']}, "
                     f"CPU {row['cpu_percent']:.0f}%", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("last sample -> activation published (ms)")
    axes[0].legend(fontsize=8)
    fig.suptitle("thinking_node end-to-end latency (frame_trigger: samples)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
