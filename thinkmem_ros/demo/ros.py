"""The main job through ROS: bag -> thinking_node -> activations -> score against truth.

The stream is written as a rosbag2 bag, the real node runs as its own process with the
shipped bundle, the bag is played into DDS with its recorded timing and every activation
is matched to the ground-truth frame it could have seen: the latest frame whose last
sample had been published when the node stamped the activation (both on the wall clock,
so no simulated time is needed and end-to-end latency is real).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from thinkmem_ros.demo.common import GENERATE, LOAD_BUNDLE, PLOT, REPORT, SCORE
from thinkmem_ros.demo.own_folders import check_out_step, mark, remove_own
from thinkmem_ros.demo.scoring import build_timeline, label_matrix, match_frames, percentiles
from thinkmem_ros.demo.steps import DemoContext, Step
from thinkmem_ros.playback.bag_files import GROUND_TRUTH_TOPIC, read_bag, write_stream
from thinkmem_ros.playback.player import BagPlayer, PlayConfig, Published
from thinkmem_ros.robot.node_config import ACTIVATION_TOPIC

COUNTERS = ("frames", "samples", "stale_frames", "invalid", "duplicate", "out_of_order",
            "frames_skipped", "inference_errors", "unknown_events")
"""Cumulative counters of the node's /diagnostics that the summary reports."""
LATE_FACTOR = 2.0
"""Activations stamped more than this many frame periods after their frame are left out
(the node ticking on after playback ended, or a frame it never saw)."""


def write_own_bag(stream, path: Path, **kwargs):
    """Record ``stream`` at ``path``, replacing only a bag the demo made (``own_folders``).

    ``write_stream(overwrite=True)`` would delete any rosbag2 folder there, a user's
    recorded bag included; the mark goes in once the bag is complete.
    """
    remove_own(path)
    info = write_stream(stream, path, **kwargs)
    mark(path)
    return info


def write_bag_step(ctx: DemoContext) -> None:
    """Record the generated stream as an MCAP bag on the node's topics."""
    path = ctx.config.out_dir / "bag"
    info = write_own_bag(ctx.artefacts["stream"], path)
    ctx.artefacts["bag"] = path
    ctx.summary["bag"] = {"path": str(path), "messages": info.message_count,
                          "duration_s": round(info.duration_s, 3), "topics": len(info.topics)}
    ctx.console.print(f"  {path}: {info.message_count} messages on {len(info.topics)} topics")


def isolate_dds(config_domain: int | None) -> int:
    """Pick the DDS domain (random unless given or set) and keep discovery on this host."""
    if config_domain is not None:
        os.environ["ROS_DOMAIN_ID"] = str(config_domain)
    elif "ROS_DOMAIN_ID" not in os.environ:
        os.environ["ROS_DOMAIN_ID"] = str(random.SystemRandom().randint(1, 200))
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    return int(os.environ["ROS_DOMAIN_ID"])


def start_ros_step(ctx: DemoContext) -> None:
    """Init rclpy in a private context and start the collector node."""
    import rclpy

    from thinkmem_ros.demo.collector import Collector

    domain = isolate_dds(ctx.config.ros_domain_id)
    context = rclpy.Context()
    rclpy.init(context=context)
    collector = Collector(context)
    ctx.artefacts["collector"] = collector
    ctx.summary["ros"] = {"domain_id": domain,
                          "discovery_range": os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"]}

    def shutdown() -> None:
        collector.close()
        rclpy.shutdown(context=context)

    ctx.cleanups.append(shutdown)
    ctx.console.print(f"  ROS_DOMAIN_ID={domain}, discovery "
                      f"{os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE']}")


def node_command() -> tuple[list[str], dict[str, str]]:
    """Return how to start thinking_node: this install's console script, or ``python -m``.

    A source checkout next to an older pip install must not run the installed node, so
    the console script is used only when this package itself is the installed one.
    """
    import thinkmem_ros

    package_root = Path(thinkmem_ros.__file__).resolve().parent.parent
    script = Path(sys.executable).parent / "thinking_node"
    env = dict(os.environ)
    if script.is_file() and "site-packages" in package_root.parts:
        return [str(script)], env
    env["PYTHONPATH"] = os.pathsep.join(
        [str(package_root), *filter(None, [env.get("PYTHONPATH")])])
    return [sys.executable, "-m", "thinkmem_ros.robot.node"], env


def start_node_step(ctx: DemoContext) -> None:
    """Start thinking_node with the bundle and wait until it publishes activations."""
    cfg = ctx.config
    command, env = node_command()
    if cfg.node_command is not None:
        command = list(cfg.node_command)
    params = {"bundle_path": ctx.summary["bundle"]["path"], "frame_trigger": cfg.frame_trigger,
              **ctx.artefacts.get("node_params", {})}  # e.g. shipping, set by earlier steps
    command += ["--ros-args"]
    for key, value in params.items():
        command += ["-p", f"{key}:={value}"]
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    log_path = cfg.out_dir / "node.log"
    log = log_path.open("w")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    ctx.artefacts["node_process"] = process
    ctx.summary["node"] = {"command": command, "log": str(log_path)}

    def stop() -> None:
        stop_node(ctx)
        log.close()

    ctx.cleanups.append(stop)
    collector = ctx.artefacts["collector"]
    up = collector.wait_for_publisher(ACTIVATION_TOPIC, cfg.node_start_timeout_s,
                                      alive=lambda: process.poll() is None)
    if not up:
        tail = log_path.read_text()[-2000:] if log_path.exists() else ""
        state = (f"exited with code {process.returncode}" if process.poll() is not None
                 else f"did not publish {ACTIVATION_TOPIC} within {cfg.node_start_timeout_s} s")
        raise RuntimeError(f"thinking_node {state}; log {log_path}:\n{tail}")
    ctx.console.print(f"  thinking_node pid {process.pid} is up (log {log_path})")


def stop_node(ctx: DemoContext, timeout_s: float = 10.0) -> None:
    """SIGINT the node, escalate to SIGKILL after ``timeout_s``; record its exit code."""
    process = ctx.artefacts.get("node_process")
    if process is None or ctx.summary["node"].get("exit_code") is not None:
        return
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout_s)
            ctx.summary["node"]["killed"] = True
    ctx.summary["node"]["exit_code"] = process.returncode


def play_step(ctx: DemoContext) -> None:
    """Play the bag into ROS with live progress; record when each frame was complete."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    cfg = ctx.config
    collector = ctx.artefacts["collector"]
    info, messages = read_bag(ctx.artefacts["bag"])
    ready: dict[int, int] = {}  # bag stamp ns -> wall ns when its last message went out
    latest = [info.start_ns]  # read by the display while the player thread writes

    def on_publish(sent: Published) -> None:
        ready[sent.bag_ns] = sent.wall_ns
        latest[0] = sent.bag_ns

    player = BagPlayer(collector.node, messages, PlayConfig(), on_publish=on_publish)
    ctx.cleanups.append(player.destroy)
    signal_topics = sorted(t for t in info.topics if t != GROUND_TRUTH_TOPIC
                           and info.topics[t][0] != "std_msgs/msg/String")
    if not player.wait_for_subscribers(signal_topics, cfg.node_start_timeout_s):
        raise RuntimeError(f"thinking_node did not subscribe to {signal_topics} "
                           f"within {cfg.node_start_timeout_s} s")
    thread = threading.Thread(target=player.play, name="demo-player", daemon=True)
    received = collector.received
    total = info.duration_s
    columns = (TextColumn("[progress.description]{task.description}"), BarColumn(),
               TextColumn("{task.completed:5.1f}/{task.total:.1f} s"), TimeRemainingColumn())
    with Progress(*columns, console=ctx.console, disable=cfg.quiet) as progress:
        task = progress.add_task("playing", total=total)
        thread.start()
        while thread.is_alive():
            thread.join(timeout=0.2)
            played = (latest[0] - info.start_ns) / 1e9
            last = received.activations[-1][1] if received.activations else {}
            active = ",".join(a["label"] for a in last.get("active", [])) or "-"
            progress.update(task, completed=played,
                            description=f"{len(received.activations):5d} activations, "
                                        f"now: {active:<48.48}")
        time.sleep(cfg.settle_s)
        progress.update(task, completed=total)
    ctx.artefacts["ready"] = ready
    ctx.artefacts["bag_start_ns"] = info.start_ns
    ctx.summary["playback"] = {"published": player.stats.published,
                               "activations_received": len(received.activations),
                               "ground_truth_received": len(received.truth),
                               "bad_json": received.bad_json}


def stop_node_step(ctx: DemoContext) -> None:
    """Stop the node cleanly (SIGINT) and keep its last diagnostics."""
    stop_node(ctx)
    received = ctx.artefacts["collector"].received
    last = dict(received.diagnostics)
    counts = {key: int(last[key]) for key in COUNTERS if str(last.get(key, "")).isdigit()}
    ctx.summary["diagnostics"] = {"levels": dict(received.diagnostic_levels),
                                  "counts": counts, "last": last}
    for kind in ("shipping", "bundle push"):
        if kind in received.statuses:
            values = received.statuses[kind]
            ctx.summary["diagnostics"][kind.replace(" ", "_")] = {
                key: int(v) if str(v).isdigit() else v for key, v in values.items()}
    ctx.console.print(f"  node exit code {ctx.summary['node']['exit_code']}")


def match_step(ctx: DemoContext) -> None:
    """Match activations to frames by stamp and collect the latency samples."""
    stream = ctx.artefacts["stream"]
    received = ctx.artefacts["collector"].received
    ready = ctx.artefacts["ready"]
    truth_msgs = dict(received.truth)  # snapshot, as for the activations below
    frames_n = stream.values.shape[0]
    period_ns = 1e9 / stream.rate_hz
    start_ns = ctx.artefacts["bag_start_ns"]
    stamps = [start_ns + round(f * period_ns) for f in range(frames_n)]
    if any(s not in ready for s in stamps):
        raise RuntimeError("playback did not publish every frame; cannot score")
    frame_ready = np.array([ready[s] for s in stamps], dtype=np.int64)
    truth = np.zeros_like(stream.labels)
    have_truth = np.zeros(frames_n, dtype=bool)
    for frame, record in truth_msgs.items():
        if 0 <= frame < frames_n:
            truth[frame] = label_matrix([record["active"]], stream.label_names)[0]
            have_truth[frame] = True
    # a snapshot: the collector thread may still append (the node keeps publishing until
    # it is stopped), and every array below must describe the same activations
    acts = list(received.activations)
    receipt = np.array([r for r, _ in acts], dtype=np.int64)
    stamp_ns = np.array([round(a["stamp"] * 1e9) for _, a in acts], dtype=np.int64)
    frames = match_frames(stamp_ns, frame_ready)
    lag = stamp_ns - frame_ready[np.clip(frames, 0, None)]
    ok = (frames >= 0) & (lag <= LATE_FACTOR * period_ns)
    ok &= have_truth[np.clip(frames, 0, None)]
    active = [[x["label"] for x in a["active"]] for _, a in acts]
    rows = label_matrix(active, stream.label_names)
    min_frame = ctx.artefacts["runtime"].window
    ctx.artefacts["timeline"] = build_timeline(
        stream.times, stream.values, truth, frames[ok], rows[ok], min_frame=min_frame,
        signal_names=stream.signal_names, label_names=stream.label_names)
    used = ok & (frames >= min_frame)
    ctx.artefacts["matched"] = {"frames": frames[used],
                                "active": [active[i] for i in np.flatnonzero(used)],
                                "bundle_version": [int(acts[i][1].get("bundle_version", -1))
                                                   for i in np.flatnonzero(used)]}
    ctx.summary["latency"] = {
        "inference_us": percentiles([a["inference_us"] for _, a in acts]),
        "node_latency_us": percentiles([a["latency_us"] for _, a in acts
                                        if a.get("latency_us") is not None]),
        "end_to_end_ms": percentiles(receipt[used] - frame_ready[frames[used]], 1e-6),
        "stamp_to_receipt_ms": percentiles(receipt[used] - stamp_ns[used], 1e-6),
    }
    late, after_end = late_and_after_end(frames, lag, frames_n, period_ns)
    ctx.summary["matching"] = {"activations": len(acts), "matched": int(used.sum()),
                               "before_window_full_or_unmatched": int((~used).sum()),
                               "frames_without_truth": int((~have_truth).sum()),
                               "late": int(late.sum()), "after_end": int(after_end.sum()),
                               "missed_ticks": missed_ticks(stamp_ns[used], period_ns)}


def late_and_after_end(frames: np.ndarray, lag_ns: np.ndarray, frames_n: int,
                       period_ns: float) -> tuple[np.ndarray, np.ndarray]:
    """Split the activations that came too long after their frame into late and after-end.

    ``frames``: each activation's matched frame (-1: none yet); ``lag_ns``: its stamp minus
    that frame's ready time. The node's timer keeps ticking after the bag's last frame
    (while the demo settles), and each of those ticks is matched to the last frame with a
    lag that grows by a period per tick. They are not late, there was simply nothing newer
    to assess: counting them as late charged every run about ``settle_s * rate`` load
    losses that no load caused.
    """
    overdue = (frames >= 0) & (lag_ns > LATE_FACTOR * period_ns)
    after_end = overdue & (frames == frames_n - 1)
    return overdue & ~after_end, after_end


def missed_ticks(stamps_ns: np.ndarray, period_ns: float) -> int:
    """Count the frame ticks a timer-driven node did not make between its activations.

    A node starved of CPU (a loaded 2-core CI machine) fires its timer late, and rcl skips
    the periods it missed instead of bursting: those frames were never assessed, which is a
    load effect, not a loss in transport or matching, so it is reported apart. A gap counts
    a tick as missed only past 1.75 periods: a late tick followed by one on schedule
    (gaps 1.6 and 0.4 periods) missed nothing.
    """
    if len(stamps_ns) < 2:
        return 0
    gaps = np.diff(np.sort(stamps_ns)) / period_ns
    return int(np.clip(np.floor(gaps + 0.25) - 1, 0, None).sum())


WRITE_BAG = Step("write bag", write_bag_step, "the stream as rosbag2 MCAP on the node's topics")
START_ROS = Step("start ROS", start_ros_step, "private DDS domain and the collector node")
START_NODE = Step("start node", start_node_step, "thinking_node with the bundle")
PLAY = Step("play bag", play_step, "recorded timing into DDS, live activations")
STOP_NODE = Step("stop node", stop_node_step, "SIGINT and collect diagnostics")
MATCH = Step("match", match_step, "activations to ground-truth frames by stamp")


def ros_steps() -> list[Step]:
    """Return the ROS job; add later stages with ``steps.insert_before(..., 'report', step)``."""
    return [check_out_step(["bag"]), LOAD_BUNDLE, GENERATE, WRITE_BAG, START_ROS, START_NODE,
            PLAY, STOP_NODE, MATCH, SCORE, PLOT, REPORT]
