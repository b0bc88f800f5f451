"""Hostile-input and fault probes of the robot side: the real node and player as processes.

Each probe starts what it tests as a child process (``thinking_node``, ``thinkmem bag
play``, a bundle install), feeds it ONE hostile input or fault through its real interface
(a DDS topic, a params file, a parameter service call, a signal, a full disk) and returns

    {"probe": name, "crashed": bool, "ok": bool, "lost": int, "rss_growth_mb": float,
     "detail": str}

``crashed``: the process died, exited with a traceback, or exited with a status the
interface does not promise. ``ok``: the documented behaviour held (refused and counted,
window reset, one-line refusal, ...); ``detail`` says what was seen either way.
``lost``: messages the probe could account for that went missing (0 where nothing is
counted end to end). ``rss_growth_mb``: growth of the tested process's resident memory
over the probe (peak for the player).

The probes are plain functions of a ``ProbeContext`` so ``thinkmem bench faults`` and the
tests call the same code; ``PROBES`` lists them and ``run_probes`` runs a selection.
Every child gets its own DDS domain (``ProbeContext.domain_id``) on localhost only.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import thinkmem_ros
from thinkmem_ros.core.paths import default_bundle

SOURCE_ROOT = Path(thinkmem_ros.__file__).resolve().parents[1]
NODE_STATUS = "main"  # key of the node's own DiagnosticStatus in Observer.status()
FUTURE_2038 = 2_145_916_800


@dataclass
class ProbeContext:
    """Where probes run: a scratch folder, the bundle the node loads, a DDS domain."""

    workdir: Path
    bundle: Path | None = None  # None = the shipped default bundle
    domain_id: int | None = None  # None = $ROS_DOMAIN_ID, else derived from the pid
    start_timeout_s: float = 40.0

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.bundle is None:
            self.bundle = default_bundle()
        if self.domain_id is None:
            env = os.environ.get("ROS_DOMAIN_ID", "")
            self.domain_id = int(env) if env.isdigit() else os.getpid() % 200 + 1
        if not 0 <= self.domain_id <= 232:
            raise ValueError(f"domain_id must be in [0, 232], got {self.domain_id}")
        if self.start_timeout_s <= 0:
            raise ValueError(f"start_timeout_s must be > 0, got {self.start_timeout_s}")

    def env(self) -> dict[str, str]:
        """Environment of every child: this domain, localhost discovery, this source tree."""
        path = os.pathsep.join(p for p in (str(SOURCE_ROOT), os.environ.get("PYTHONPATH", ""))
                               if p)
        return dict(os.environ, ROS_DOMAIN_ID=str(self.domain_id),
                    ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", PYTHONPATH=path,
                    PYTHONDONTWRITEBYTECODE="1", RCUTILS_COLORIZED_OUTPUT="0")

    def folder(self, name: str) -> Path:
        """A fresh sub-folder for one probe."""
        path = self.workdir / name
        path.mkdir(parents=True, exist_ok=True)
        return path


def result(probe: str, *, crashed: bool, ok: bool, detail: str, lost: int = 0,
           rss_growth_mb: float = 0.0) -> dict:
    """One probe's record (the shape ``thinkmem bench faults`` aggregates)."""
    return {"probe": probe, "crashed": bool(crashed), "ok": bool(ok and not crashed),
            "lost": int(lost), "rss_growth_mb": round(float(rss_growth_mb), 2),
            "detail": detail}


# ------------------------------------------------------------------ child processes

def _rss_mb(pid: int, key: str = "VmRSS") -> float:
    """Resident (or peak, ``VmHWM``) memory of ``pid`` in MB; nan once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    except (OSError, ValueError):
        pass
    return float("nan")


class Child:
    """A child process whose output is collected on a thread (reads never block)."""

    def __init__(self, cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> None:
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, errors="replace")
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(stream, sink), daemon=True)
                         for stream, sink in ((self.proc.stdout, self.out),
                                              (self.proc.stderr, self.err))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream, sink: list[str]) -> None:
        for line in stream:
            sink.append(line)

    @property
    def output(self) -> str:
        """Everything written so far, stdout then stderr."""
        return "".join(self.out) + "".join(self.err)

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.proc.pid

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.proc.poll() is None

    def wait_for(self, text: str, timeout: float) -> bool:
        """Until ``text`` appears in the output; False on timeout or exit."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output:
                return True
            if not self.alive():
                time.sleep(0.1)  # let the readers drain
                return text in self.output
            time.sleep(0.05)
        return False

    def finish(self, timeout: float = 15.0) -> int:
        """Wait for exit (killing after ``timeout``); returns the status (-9 when killed)."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait(timeout=5.0)
        for reader in self._readers:
            reader.join(timeout=2.0)
        return rc

    def stop(self, sig: int = signal.SIGINT, timeout: float = 15.0) -> int:
        """Send ``sig`` if still running, then ``finish``."""
        if self.alive():
            self.proc.send_signal(sig)
        return self.finish(timeout)

    def tail(self, lines: int = 6) -> str:
        """The last lines of output, for a detail string."""
        text = self.output.strip().splitlines()[-lines:]
        return " | ".join(line.strip()[:200] for line in text)


def node_cmd(params: dict[str, object], *extra: str) -> list[str]:
    """``python -m thinkmem_ros.robot.node --ros-args -p k:=v ...``."""
    args = [sys.executable, "-m", "thinkmem_ros.robot.node", "--ros-args"]
    for key, value in params.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        args += ["-p", f"{key}:={text}"]
    return [*args, *extra]


def player_cmd(bag: Path, *args: str) -> list[str]:
    """``python -m thinkmem_ros.cli bag play BAG ...``."""
    return [sys.executable, "-m", "thinkmem_ros.cli", "bag", "play", str(bag), *args]


def free_port() -> int:
    """A TCP port nobody listens on right now (a consolidator that is down)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ------------------------------------------------------------------ the observer

class Observer:
    """An rclpy node in its own context: publishes hostile input, reads what comes back."""

    def __init__(self, domain_id: int, name: str = "fault_probe") -> None:
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.executors import SingleThreadedExecutor
        from std_msgs.msg import String

        os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
        self._rclpy = rclpy
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node(name, context=self.context)
        self.lock = threading.Lock()
        self.statuses: dict[str, dict[str, str]] = {}
        self.messages: dict[str, str] = {}
        self.activations: list[dict] = []
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 10)
        self.node.create_subscription(String, "/thinking/activation", self._on_act, 100)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._spin = threading.Thread(target=self._spin_quietly, daemon=True)
        self._spin.start()

    def _spin_quietly(self) -> None:
        try:
            self.executor.spin()
        except Exception:  # noqa: BLE001 - the context is shut down under it at close
            pass

    def _on_diag(self, msg) -> None:
        with self.lock:
            for status in msg.status:
                parts = status.name.split(": ")
                key = parts[2] if len(parts) > 2 else NODE_STATUS
                self.statuses[key] = {kv.key: kv.value for kv in status.values}
                self.messages[key] = status.message

    def _on_act(self, msg) -> None:
        try:
            record = json.loads(msg.data)
        except ValueError:
            return
        with self.lock:
            self.activations.append(record)
            del self.activations[:-500]

    def status(self, key: str = NODE_STATUS) -> dict[str, str]:
        """Latest values of one DiagnosticStatus ('main', 'shipping', 'bundle push')."""
        with self.lock:
            return dict(self.statuses.get(key, {}))

    def counter(self, name: str, key: str = NODE_STATUS) -> int:
        """One counter of the latest status (0 before any)."""
        try:
            return int(self.status(key).get(name, "0"))
        except ValueError:
            return 0

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Until ``predicate()`` holds; False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.05)
        return predicate()

    def activation_count(self) -> int:
        """Sequence number of the newest activation received (0 before any)."""
        with self.lock:
            return int(self.activations[-1].get("seq", 0)) if self.activations else 0

    def recent_activations(self, n: int) -> list[dict]:
        """The last ``n`` activations."""
        with self.lock:
            return list(self.activations[-n:])

    def publisher(self, msg_type, topic: str, *, reliable: bool = True, depth: int = 10,
                  wait_s: float = 10.0):
        """A publisher that has matched the node's subscription (or waited ``wait_s``)."""
        from rclpy.qos import QoSProfile, ReliabilityPolicy

        qos = QoSProfile(depth=depth, reliability=ReliabilityPolicy.RELIABLE if reliable
                         else ReliabilityPolicy.BEST_EFFORT)
        pub = self.node.create_publisher(msg_type, topic, qos)
        self.wait(lambda: pub.get_subscription_count() > 0, wait_s)
        return pub

    def stamp_now(self):
        """The observer's clock as a builtin_interfaces/Time."""
        return self.node.get_clock().now().to_msg()

    def call(self, srv_type, name: str, request, timeout: float = 10.0):
        """Call a service of the node; None when it does not answer."""
        client = self.node.create_client(srv_type, name)
        try:
            if not client.wait_for_service(timeout_sec=timeout):
                return None
            future = client.call_async(request)
            self.wait(future.done, timeout)
            return future.result() if future.done() else None
        finally:
            self.node.destroy_client(client)

    def close(self) -> None:
        """Stop spinning and shut the context down."""
        self.executor.shutdown(timeout_sec=2.0)
        self.node.destroy_node()
        if self.context.ok():
            self._rclpy.shutdown(context=self.context)
        self._spin.join(timeout=2.0)


# ------------------------------------------------------------------ node probes

BASE_PARAMS = {"frame_rate_hz": 20.0, "stale_after_s": 0.5, "diagnostics_period_s": 0.25,
               "watch_bundle": False}


def _shipping_params(folder: Path) -> dict[str, object]:
    """Shipping on (feedback is subscribed only then), to a consolidator that is down."""
    return {"consolidator_endpoint": f"tcp://127.0.0.1:{free_port()}",
            "spool_path": str(folder / "spool.db"), "bundles_dir": str(folder / "bundles"),
            "robot_id": "probe-bot"}


def _with_node(ctx: ProbeContext, name: str, params: dict[str, object],
               body: Callable[[Child, Observer], tuple[bool, str]], *,
               extra_args: tuple[str, ...] = (), wait_frames: bool = True) -> dict:
    """Start the node, run ``body`` against it, stop it with SIGINT and judge the run."""
    params = {"bundle_path": str(ctx.bundle), **BASE_PARAMS, **params}
    node = Child(node_cmd(params, *extra_args), ctx.env())
    observer = Observer(ctx.domain_id)
    ok, detail, rss0, rss1 = False, "", float("nan"), float("nan")
    try:
        if not node.wait_for("ready:", ctx.start_timeout_s):
            return result(name, crashed=True, ok=False,
                          detail=f"node did not start: {node.tail()}")
        if wait_frames and not observer.wait(lambda: observer.counter("frames") > 0, 20.0):
            detail = "no diagnostics from the node; "
        rss0 = _rss_mb(node.pid)
        body_ok, body_detail = body(node, observer)
        ok, detail = body_ok and not detail, detail + body_detail
        rss1 = _rss_mb(node.pid)
        died = not node.alive()
    finally:
        observer.close()
        rc = node.stop()
    crashed = died or rc != 0 or "Traceback" in node.output
    if crashed:
        detail += f"; node exit {rc}: {node.tail()}"
    growth = rss1 - rss0 if np.isfinite(rss1 - rss0) else 0.0
    return result(name, crashed=crashed, ok=ok, detail=detail, rss_growth_mb=max(0.0, growth))


def _still_publishing(observer: Observer, frames: int = 3, timeout: float = 5.0) -> bool:
    before = observer.activation_count()
    return observer.wait(lambda: observer.activation_count() >= before + frames, timeout)


def _feedback_probe(ctx: ProbeContext, name: str, payloads: list[str]) -> dict:
    """Publish ``payloads`` on the feedback topic; each must be counted as invalid."""
    from std_msgs.msg import String

    def body(node: Child, obs: Observer) -> tuple[bool, str]:
        pub = obs.publisher(String, "/thinking/feedback", depth=100)
        obs.wait(lambda: "experiences_feedback_invalid" in obs.status("shipping"), 10.0)
        before = obs.counter("experiences_feedback_invalid", "shipping")
        for payload in payloads:
            pub.publish(String(data=payload))
        counted = obs.wait(lambda: obs.counter("experiences_feedback_invalid", "shipping")
                           >= before + len(payloads), 15.0)
        running = _still_publishing(obs)
        got = obs.counter("experiences_feedback_invalid", "shipping") - before
        return counted and running, (f"{got}/{len(payloads)} counted as feedback_invalid; "
                                     f"activations {'continue' if running else 'STOPPED'}")

    return _with_node(ctx, name, _shipping_params(ctx.folder(name)), body)


def probe_feedback_deep_nesting(ctx: ProbeContext) -> dict:
    """``"[" * 100000`` on /thinking/feedback (once a RecursionError that ended the node)."""
    return _feedback_probe(ctx, "feedback_deep_nesting",
                           ["[" * 100_000, "[" * 60_000, '{"a":' * 12_000])


def probe_feedback_oversize(ctx: ProbeContext) -> dict:
    """A 4 MB feedback message: refused by size before the JSON parser sees it."""
    return _feedback_probe(ctx, "feedback_oversize",
                           ['{"stamp": 1, "required": ["' + "x" * 4_000_000 + '"]}'])


def probe_feedback_malformed(ctx: ProbeContext) -> dict:
    """Huge numbers, wrong types, unknown keys, NUL bytes and non-JSON feedback."""
    payloads = ['{"stamp": 1' + "0" * 5000 + ', "reward": 1}',  # int beyond the digit limit
                '{"stamp": 5, "reward": 1' + "0" * 400 + '}',  # int beyond float range
                '{"stamp": 1e999, "reward": 1}', '{"stamp": -1, "reward": 1}',
                '{"stamp": 1, "required": "hazard"}', '{"stamp": 1, "required": [[[]]]}',
                '{"stamp": 1, "required": ["' + "a" * 100 + '"]}', '{"stamp": true}',
                '{"stamp": 1, "surprise": 2, "reward": 0}', "null", "\x00\x01", "{" * 10]
    return _feedback_probe(ctx, "feedback_malformed", payloads)


def probe_events_hostile(ctx: ProbeContext) -> dict:
    """Deep nesting, 2 MB and control characters on the events topic: counted, not fatal."""
    from std_msgs.msg import String

    def body(node: Child, obs: Observer) -> tuple[bool, str]:
        pub = obs.publisher(String, "/sensors/events", depth=50)
        invalid0, unknown0 = obs.counter("invalid_events"), obs.counter("unknown_events")
        # best-effort input QoS: DDS may drop the fragmented 100 kB and 2 MB ones; the
        # 300-character one (over the limit, one datagram) is the oversize that must arrive
        for payload in ("[" * 100_000, "x" * 2_000_000, "y" * 300, "\x00" * 16, "a" * 200):
            pub.publish(String(data=payload))
        counted = obs.wait(lambda: obs.counter("invalid_events") >= invalid0 + 1
                           and obs.counter("unknown_events") >= unknown0 + 2, 10.0)
        running = _still_publishing(obs)
        return counted and running and obs.counter("input_errors") == 0, (
            f"invalid_events +{obs.counter('invalid_events') - invalid0}, unknown_events "
            f"+{obs.counter('unknown_events') - unknown0}, input_errors "
            f"{obs.counter('input_errors')}")

    return _with_node(ctx, "events_hostile", {}, body)


def _temperature_feed(obs: Observer, pub, stop: threading.Event, rate_hz: float = 20.0,
                      stamp: Callable[[], object] | None = None) -> threading.Thread:
    """Genuine Temperature samples stamped with the observer's clock, until ``stop``."""
    from sensor_msgs.msg import Temperature

    def feed() -> None:
        step = 0
        while not stop.wait(1.0 / rate_hz):
            step += 1
            msg = Temperature(temperature=20.0 + 0.01 * step)
            msg.header.stamp = stamp() if stamp is not None else obs.stamp_now()
            try:
                pub.publish(msg)
            except Exception:  # noqa: BLE001 - the context closes under it at the end
                return

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    return thread


def _temperature_fresh(obs: Observer) -> bool:
    values = obs.status()
    return bool(values) and "temperature" not in values.get("stale_signals", "").split(",")


def _stamp_probe(ctx: ProbeContext, name: str, stamps: list[tuple[int, int]]) -> dict:
    """Rogue Temperature stamps amid genuine samples: refused, the sensor stays live."""
    from sensor_msgs.msg import Temperature

    def body(node: Child, obs: Observer) -> tuple[bool, str]:
        pub = obs.publisher(Temperature, "/sensors/temperature")
        stop = threading.Event()
        feeder = _temperature_feed(obs, pub, stop)
        try:
            obs.wait(lambda: _temperature_fresh(obs), 5.0)
            future0, ooo0 = obs.counter("future"), obs.counter("out_of_order")
            for sec, nanosec in stamps:
                rogue = Temperature(temperature=99.0)
                rogue.header.stamp.sec, rogue.header.stamp.nanosec = sec, nanosec
                pub.publish(rogue)
            time.sleep(2.0)  # genuine samples go on meanwhile
            fresh = obs.wait(lambda: _temperature_fresh(obs), 3.0)
            future = obs.counter("future") - future0
            ooo = obs.counter("out_of_order") - ooo0
        finally:
            stop.set()
            feeder.join(timeout=2.0)
        ok = fresh and ooo <= 1 and future >= 1
        return ok, (f"future +{future}, out_of_order +{ooo} over 2 s of genuine samples; "
                    f"temperature {'fresh' if fresh else 'STALE (blinded)'}")

    return _with_node(ctx, name, {}, body)


def probe_future_stamp(ctx: ProbeContext) -> dict:
    """One Temperature stamped 2038 (it once blinded the sensor until restart)."""
    return _stamp_probe(ctx, "future_stamp", [(FUTURE_2038, 0)])


def probe_extreme_stamps(ctx: ProbeContext) -> dict:
    """The largest stamp a header holds, an out-of-range nanosec and a negative second."""
    return _stamp_probe(ctx, "extreme_stamps",
                        [(2**31 - 1, 2**32 - 1), (FUTURE_2038, 1_999_999_999), (-(2**31), 5)])


def probe_sim_clock_backward(ctx: ProbeContext) -> dict:
    """With use_sim_time, /clock steps back 500 s (a restarted simulation): window reset.

    Then one /clock message with negative seconds: rclpy's own clock callback raises on
    it, which used to stop the node; it is counted (``input_errors``) and the node goes on.
    """
    from rosgraph_msgs.msg import Clock
    from sensor_msgs.msg import Temperature

    sim = {"now": 1000.0}

    def sim_stamp():
        from builtin_interfaces.msg import Time

        sec = sim["now"]
        return Time(sec=int(sec), nanosec=int((sec % 1) * 1e9))

    def body(node: Child, obs: Observer) -> tuple[bool, str]:
        clock = obs.publisher(Clock, "/clock", depth=10)
        pub = obs.publisher(Temperature, "/sensors/temperature")
        stop = threading.Event()

        paused = threading.Event()

        def tick() -> None:
            while not stop.wait(0.02):
                if paused.is_set():
                    continue
                sim["now"] += 0.02
                try:
                    clock.publish(Clock(clock=sim_stamp()))
                except Exception:  # noqa: BLE001 - the context closes under it at the end
                    return

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        feeder = _temperature_feed(obs, pub, stop, stamp=sim_stamp)
        try:
            if not obs.wait(lambda: _temperature_fresh(obs), 10.0):
                return False, "temperature never fresh under sim time"
            ooo0 = obs.counter("out_of_order")
            sim["now"] -= 500.0  # the simulation restarts
            reset = obs.wait(lambda: obs.counter("time_jumps") >= 1, 5.0)
            time.sleep(1.5)
            fresh = obs.wait(lambda: _temperature_fresh(obs), 3.0)
            ooo = obs.counter("out_of_order") - ooo0
            errors0 = obs.counter("input_errors")
            from builtin_interfaces.msg import Time

            # rclpy's /clock subscription keeps only the last message, best effort: the
            # ticks stop while the broken simulator's message goes out (again, until the
            # node has seen one) so that a loaded node cannot have it overwritten unread.
            paused.set()
            counted = False
            for _ in range(25):
                clock.publish(Clock(clock=Time(sec=-5, nanosec=0)))  # a broken simulator
                if obs.wait(lambda: obs.counter("input_errors") > errors0, 0.2):
                    counted = True
                    break
            paused.clear()
            time.sleep(1.0)
            survived = node.proc.poll() is None and obs.wait(
                lambda: _temperature_fresh(obs), 5.0)
        finally:
            stop.set()
            ticker.join(timeout=2.0)
            feeder.join(timeout=2.0)
        ok = reset and fresh and ooo <= 3 and counted and survived
        return ok, (f"time_jumps {obs.counter('time_jumps')}, out_of_order +{ooo} after the "
                    f"jump; temperature {'fresh' if fresh else 'STALE (blinded)'}; negative "
                    f"/clock {'counted' if counted else 'NOT counted'}, node "
                    f"{'running' if survived else 'STOPPED'}")

    return _with_node(ctx, "sim_clock_backward", {"use_sim_time": True}, body,
                      wait_frames=False)


def probe_no_input(ctx: ProbeContext) -> dict:
    """Nothing publishes at all: no activation may claim active thinking."""
    def body(node: Child, obs: Observer) -> tuple[bool, str]:
        obs.wait(lambda: len(obs.recent_activations(20)) >= 20, 10.0)
        recent = obs.recent_activations(20)
        claimed = [a for a in recent if a.get("active")]
        flagged = all(a.get("no_input") is True for a in recent)
        return bool(recent) and not claimed and flagged, (
            f"{len(claimed)}/{len(recent)} frames claimed active thinking without input; "
            f"no_input flagged on {'all' if flagged else 'NOT all'}")

    return _with_node(ctx, "no_input", {}, body, wait_frames=False)


def probe_nan_inf_samples(ctx: ProbeContext) -> dict:
    """NaN, +-inf and 1e39 (beyond float32) sensor values: counted invalid, frames go on."""
    from sensor_msgs.msg import Temperature
    from std_msgs.msg import Float32

    def body(node: Child, obs: Observer) -> tuple[bool, str]:
        current = obs.publisher(Float32, "/sensors/current")
        temperature = obs.publisher(Temperature, "/sensors/temperature")
        invalid0 = obs.counter("invalid")
        bad = 0
        for value in (float("nan"), float("inf"), float("-inf")):
            current.publish(Float32(data=value))
            bad += 1
        for value in (1e39, -1e39, float("nan"), float("inf")):
            msg = Temperature(temperature=value)
            msg.header.stamp = obs.stamp_now()
            temperature.publish(msg)
            bad += 1
        counted = obs.wait(lambda: obs.counter("invalid") >= invalid0 + bad, 10.0)
        running = _still_publishing(obs)
        recent = obs.recent_activations(10)
        finite = all(np.isfinite(float(p)) for a in recent
                     for p in (a.get("probabilities") or {}).values())
        got = obs.counter("invalid") - invalid0
        return counted and running and finite and obs.counter("input_errors") == 0, (
            f"invalid +{got}/{bad}; activations {'continue' if running else 'STOPPED'}; "
            f"probabilities {'finite' if finite else 'NOT finite'}; input_errors "
            f"{obs.counter('input_errors')}")

    return _with_node(ctx, "nan_inf_samples", {}, body)


def probe_burst_10khz(ctx: ProbeContext, seconds: float = 2.0, rate_hz: float = 10_000.0
                      ) -> dict:
    """One sensor published at ~10 kHz for 2 s: frames keep to the frame rate, RSS bounded."""
    from std_msgs.msg import Float32

    def body(node: Child, obs: Observer) -> tuple[bool, str]:
        pub = obs.publisher(Float32, "/sensors/motion", depth=100)
        frames0, samples0 = obs.counter("frames"), obs.counter("samples")
        skipped0, errors0 = obs.counter("frames_skipped"), obs.counter("inference_errors")
        rss0, peak = _rss_mb(node.pid), _rss_mb(node.pid)
        sent = 0
        start = time.monotonic()
        while (elapsed := time.monotonic() - start) < seconds:
            while sent < elapsed * rate_hz:  # paced: catch up to the target rate
                sent += 1
                pub.publish(Float32(data=float(sent % 1000)))
            if sent % 500 == 0:
                peak = max(peak, _rss_mb(node.pid))
            time.sleep(0.0005)
        elapsed = time.monotonic() - start
        time.sleep(1.0)  # two diagnostics periods and more: the counters catch up
        peak = max(peak, _rss_mb(node.pid))
        frames = obs.counter("frames") - frames0
        samples = obs.counter("samples") - samples0
        expected = BASE_PARAMS["frame_rate_hz"] * (time.monotonic() - start)
        paced = 0.7 * expected <= frames <= 1.3 * expected + 2
        clean = (obs.counter("frames_skipped") == skipped0
                 and obs.counter("inference_errors") == errors0)
        running = _still_publishing(obs)
        growth = peak - rss0
        ok = paced and clean and running and samples > 0 and growth < 50.0
        return ok, (f"{sent} messages in {elapsed:.2f} s ({sent / elapsed:.0f}/s); node took "
                    f"{samples} samples, published {frames} frames (expected ~{expected:.0f}"
                    f"); frames_skipped +{obs.counter('frames_skipped') - skipped0}, "
                    f"inference_errors +{obs.counter('inference_errors') - errors0}; RSS "
                    f"{rss0:.0f} -> peak {peak:.0f} MB")

    return _with_node(ctx, "burst_10khz", {}, body)


def probe_param_set_bad_bundle(ctx: ProbeContext) -> dict:
    """``ros2 param set /thinking_node bundle_path /nonexistent`` must fail with a reason."""
    from rcl_interfaces.srv import GetParameters, SetParameters
    from rclpy.parameter import Parameter

    def set_bundle(obs: Observer, value: str):
        request = SetParameters.Request(parameters=[
            Parameter("bundle_path", value=value).to_parameter_msg()])
        answer = obs.call(SetParameters, "/thinking_node/set_parameters", request)
        return None if answer is None else answer.results[0]

    def body(node: Child, obs: Observer) -> tuple[bool, str]:
        outcome = set_bundle(obs, "/nonexistent/bundle")
        # a name past the file system's limit (ENAMETOOLONG) stopped the node once
        too_long = set_bundle(obs, "/tmp/" + "y" * 300)
        if outcome is None or too_long is None:
            return False, "set_parameters did not answer"
        now = obs.call(GetParameters, "/thinking_node/get_parameters",
                       GetParameters.Request(names=["bundle_path"]))
        kept = now is not None and now.values[0].string_value == str(ctx.bundle)
        running = _still_publishing(obs)
        ok = (not outcome.successful and "not found" in outcome.reason
              and not too_long.successful and kept and running)
        return ok, (f"successful={outcome.successful} reason={outcome.reason!r}; a 300-"
                    f"character name: {too_long.reason[:60]!r}; parameter "
                    f"{'kept' if kept else 'CHANGED'}")

    return _with_node(ctx, "param_set_bad_bundle", {}, body)


# ------------------------------------------------------------------ start-up refusals

def _refusal_probe(ctx: ProbeContext, name: str, args: list[str], named: str) -> dict:
    """The node must exit 2 with one line naming ``named`` (no traceback)."""
    node = Child([sys.executable, "-m", "thinkmem_ros.robot.node", "--ros-args", *args],
                 ctx.env())
    started = node.wait_for("ready:", ctx.start_timeout_s)  # False once it exits
    rc = node.stop(signal.SIGINT) if started else node.finish(timeout=5.0)
    lines = [line for line in node.output.splitlines() if line.strip()]
    refusals = [line for line in lines if "refusing to start" in line]
    crashed = rc not in (0, 2) or "Traceback" in node.output
    ok = (not started and rc == 2 and len(lines) == 1 and len(refusals) == 1
          and named in refusals[0])
    detail = (f"{'STARTED anyway, ' if started else ''}exit {rc}, {len(lines)} line(s): "
              + " | ".join(line[:240] for line in lines[:3]))
    return result(name, crashed=crashed, ok=ok, detail=detail)


def _params_file(folder: Path, text: str) -> Path:
    path = folder / "params.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _default_params_text() -> str:
    from thinkmem_ros.core.paths import default_params

    return default_params().read_text(encoding="utf-8")


def probe_params_missing(ctx: ProbeContext) -> dict:
    """``--params-file`` naming a file that does not exist."""
    missing = ctx.folder("params_missing") / "nope.yaml"
    return _refusal_probe(ctx, "params_missing", ["--params-file", str(missing)], "nope.yaml")


def probe_params_unparsable(ctx: ProbeContext) -> dict:
    """A params file that is not YAML."""
    path = _params_file(ctx.folder("params_unparsable"), "/**:\n  ros__parameters: {{{\n")
    return _refusal_probe(ctx, "params_unparsable", ["--params-file", str(path)], "not YAML")


def probe_params_aliases(ctx: ProbeContext) -> dict:
    """535 bytes of nested YAML aliases: expanding them hung the start at 100 % CPU."""
    lines = ["/**:", "  ros__parameters:", "    a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"    a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    path = _params_file(ctx.folder("params_aliases"), "\n".join(lines) + "\n")
    return _refusal_probe(ctx, "params_aliases", ["--params-file", str(path)],
                          "YAML aliases")


def probe_ros_args_typo(ctx: ProbeContext) -> dict:
    """``--param-file`` for ``--params-file``: rclpy's error was a traceback."""
    return _refusal_probe(ctx, "ros_args_typo", ["--param-file", "x.yaml"],
                          "unknown ROS arguments")


def probe_params_unknown_parameter(ctx: ProbeContext) -> dict:
    """A misspelt parameter (``frame_rate``) in the params file."""
    text = _default_params_text().replace("frame_rate_hz:", "frame_rate:")
    path = _params_file(ctx.folder("params_unknown_parameter"), text)
    return _refusal_probe(ctx, "params_unknown_parameter",
                          ["--params-file", str(path), "-p", f"bundle_path:={ctx.bundle}"],
                          "frame_rate")


def probe_params_signal_key(ctx: ProbeContext) -> dict:
    """An unknown key in a signal map (``scael: 0.1``)."""
    text = _default_params_text().replace('field: "temperature"}',
                                          'field: "temperature", scael: 0.1}')
    path = _params_file(ctx.folder("params_signal_key"), text)
    return _refusal_probe(ctx, "params_signal_key",
                          ["--params-file", str(path), "-p", f"bundle_path:={ctx.bundle}"],
                          "scael")


def probe_params_signal_name(ctx: ProbeContext) -> dict:
    """A misspelt signal name (``vibrations:``)."""
    text = _default_params_text().replace("      vibration: {", "      vibrations: {")
    path = _params_file(ctx.folder("params_signal_name"), text)
    return _refusal_probe(ctx, "params_signal_name",
                          ["--params-file", str(path), "-p", f"bundle_path:={ctx.bundle}"],
                          "vibrations")


def probe_param_unknown_override(ctx: ProbeContext) -> dict:
    """``-p stale_after:=1.0`` on the command line (a typo of stale_after_s)."""
    return _refusal_probe(ctx, "param_unknown_override",
                          ["-p", f"bundle_path:={ctx.bundle}", "-p", "stale_after:=1.0"],
                          "stale_after")


def probe_frame_rate_tiny(ctx: ProbeContext) -> dict:
    """``-p frame_rate_hz:=1.0e-10``: a timer period past the clock's range (a traceback)."""
    return _refusal_probe(ctx, "frame_rate_tiny",
                          ["-p", f"bundle_path:={ctx.bundle}", "-p", "frame_rate_hz:=1.0e-10"],
                          "frame_rate_hz must be")


def probe_bundle_rate_tiny(ctx: ProbeContext) -> dict:
    """A bundle whose manifest says 1e-12 Hz: the timer's period overflowed (a traceback)."""
    def change(manifest: dict) -> None:
        manifest["frame_rate_hz"] = 1e-12

    folder = _broken_bundle(ctx, "bundle_rate_tiny", change)
    return _refusal_probe(ctx, "bundle_rate_tiny", ["-p", f"bundle_path:={folder}"],
                          "frame_rate_hz")


def _broken_bundle(ctx: ProbeContext, name: str, change: Callable[[dict], object]) -> Path:
    import shutil

    folder = ctx.folder(name) / "bundle"
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(ctx.bundle, folder)
    manifest = json.loads((folder / "bundle.json").read_text(encoding="utf-8"))
    replaced = change(manifest)
    text = replaced if isinstance(replaced, str) else json.dumps(manifest)
    (folder / "bundle.json").write_text(text, encoding="utf-8")
    return folder


def probe_bundle_list_field(ctx: ProbeContext) -> dict:
    """bundle.json with a list where an object belongs (``normalisation``)."""
    folder = _broken_bundle(ctx, "bundle_list_field",
                            lambda m: m.__setitem__("normalisation", [0.0, 1.0]))
    return _refusal_probe(ctx, "bundle_list_field", ["-p", f"bundle_path:={folder}"],
                          "normalisation")


def probe_bundle_deep_nesting(ctx: ProbeContext) -> dict:
    """bundle.json nested 100000 deep."""
    folder = _broken_bundle(ctx, "bundle_deep_nesting", lambda m: "[" * 100_000)
    return _refusal_probe(ctx, "bundle_deep_nesting", ["-p", f"bundle_path:={folder}"],
                          "nested too deeply")


def probe_bundle_not_object(ctx: ProbeContext) -> dict:
    """bundle.json holding a JSON list instead of an object."""
    folder = _broken_bundle(ctx, "bundle_not_object", lambda m: json.dumps([m]))
    return _refusal_probe(ctx, "bundle_not_object", ["-p", f"bundle_path:={folder}"],
                          "expected a JSON object")


def _truncated_onnx_bundle(ctx: ProbeContext, name: str, rehash: bool) -> Path:
    """A copy of the bundle whose policy.onnx is cut to half (manifest re-hashed or not)."""
    import shutil

    from thinkmem_ros.policy.bundle import ONNX_FILE, load_bundle, write_bundle

    folder = ctx.folder(name) / "bundle"
    if folder.exists():
        shutil.rmtree(folder)
    source = load_bundle(ctx.bundle)
    data = source.onnx_path.read_bytes()
    if rehash:  # the manifest names the truncated bytes: only ONNX Runtime can tell
        manifest = source.manifest
        manifest.created_at = ""
        write_bundle(folder, data[: len(data) // 2], manifest)
    else:  # a copy cut short (a full disk, an interrupted transfer)
        shutil.copytree(ctx.bundle, folder)
        (folder / ONNX_FILE).write_bytes(data[: len(data) // 2])
    return folder


def probe_truncated_onnx_at_start(ctx: ProbeContext) -> dict:
    """A bundle whose policy.onnx was cut short: exit 2 with one line naming it."""
    folder = _truncated_onnx_bundle(ctx, "truncated_onnx_at_start", rehash=False)
    return _refusal_probe(ctx, "truncated_onnx_at_start", ["-p", f"bundle_path:={folder}"],
                          "policy.onnx")


def probe_truncated_onnx_rehashed(ctx: ProbeContext) -> dict:
    """A truncated policy.onnx whose manifest carries its sha256: ONNX Runtime refuses it."""
    folder = _truncated_onnx_bundle(ctx, "truncated_onnx_rehashed", rehash=True)
    return _refusal_probe(ctx, "truncated_onnx_rehashed", ["-p", f"bundle_path:={folder}"],
                          "policy.onnx")


def probe_graph_fails_probe(ctx: ProbeContext) -> dict:
    """A graph that loads but fails its first run (a Reshape no input fits): exit 2, one line.

    ONNX Runtime accepts it at session creation; the node's first frame raised (a
    traceback at start) until the load-time test inference caught it.
    """
    import shutil

    from thinkmem_ros.bench.hostile_graphs import hostile_bundle
    from thinkmem_ros.core.paths import window_bundle

    folder = ctx.folder("graph_fails_probe") / "bundle"
    shutil.rmtree(folder, ignore_errors=True)
    hostile_bundle(window_bundle(), folder, "runtime_fail")
    return _refusal_probe(ctx, "graph_fails_probe", ["-p", f"bundle_path:={folder}"],
                          "test inference failed")


def probe_artefact_fifo(ctx: ProbeContext) -> dict:
    """The bundle's values.json is a FIFO nothing writes to: the node starts without values.

    Reading it blocked the start (or the hot-swap thread) forever; an optional artefact that
    cannot be read is skipped with one line naming it.
    """
    import shutil

    from thinkmem_ros.policy.value_table import VALUES_JSON

    folder = ctx.folder("artefact_fifo") / "bundle"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(ctx.bundle, folder)
    os.mkfifo(folder / VALUES_JSON)
    node = Child([sys.executable, "-m", "thinkmem_ros.robot.node", "--ros-args", "-p",
                  f"bundle_path:={folder}"], ctx.env())
    started = node.wait_for("ready:", ctx.start_timeout_s)
    rc = node.stop(signal.SIGINT) if started else node.finish(timeout=5.0)
    named = [line for line in node.output.splitlines()
             if VALUES_JSON in line and "not a regular file" in line]
    crashed = rc != 0 or "Traceback" in node.output
    return result("artefact_fifo", crashed=crashed, ok=started and rc == 0 and len(named) == 1,
                  detail=f"{'ready' if started else 'NEVER READY'}, exit {rc}; "
                         + (named[0][-160:] if named else "no line named the FIFO"))


# ------------------------------------------------------------------ the bag player

def write_probe_bag(folder: Path, seconds: float = 3.0, rate_hz: float = 10.0) -> Path:
    """A small synthetic bag on the node's default topics (every signal, header stamps)."""
    from thinkmem_ros.core.data import SignalStream
    from thinkmem_ros.core.vocabulary import SIGNALS, THINKING
    from thinkmem_ros.playback.bag_files import write_stream

    frames = int(seconds * rate_hz)
    rng = np.random.default_rng(0)
    values = (20.0 + rng.normal(size=(frames, len(SIGNALS)))).astype(np.float32)
    stream = SignalStream(rate_hz=rate_hz, values=values,
                          labels=np.zeros((frames, len(THINKING)), np.float32),
                          scenario="probe")
    out = folder / "bag"
    write_stream(stream, out, overwrite=True)
    return out


def write_big_bag(out: Path, messages: int) -> Path:
    """One Float32 topic, ``messages`` messages 1 ms apart (written raw: fast)."""
    import shutil

    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    if out.exists():
        shutil.rmtree(out)
    store = get_typestore(Stores.ROS2_KILTED)
    kind = "std_msgs/msg/Float32"
    data = bytes(store.serialize_cdr(store.types[kind](data=1.0), kind))
    with Writer(out, version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        conn = writer.add_connection("/probe/float", kind, typestore=store)
        start = 1_700_000_000 * 10**9
        for i in range(messages):
            writer.write(conn, start + i * 1_000_000, data)
    return out


def probe_bag_loop_clock(ctx: ProbeContext, loops: int = 3) -> dict:
    """``bag play --loop --clock`` into a use_sim_time node: header-stamped signals stay live.

    Each loop sends /clock back to the bag's start; before the window reset a node refused
    every later stamped sample as out of order (480 within 45 s).
    """
    name = "bag_loop_clock"
    folder = ctx.folder(name)
    seconds = 2.5
    bag = write_probe_bag(folder, seconds=seconds)

    def body(node: Child, obs: Observer) -> tuple[bool, str]:
        player = Child(player_cmd(bag, "--loop", "--clock", "40", "--delay", "1"), ctx.env())
        fresh_after: list[bool] = []
        try:
            obs.wait(lambda: obs.counter("frames") > 0, 20.0)
            deadline = time.monotonic() + loops * seconds + 20.0
            while obs.counter("time_jumps") < loops and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(1.0)
            for _ in range(5):  # sampled over the last pass
                values = obs.status()
                stale = values.get("stale_signals", "").split(",")
                fresh_after.append("temperature" not in stale and "distance" not in stale)
                time.sleep(0.2)
            jumps, ooo = obs.counter("time_jumps"), obs.counter("out_of_order")
        finally:
            rc = player.stop(signal.SIGINT)
        player_crashed = rc not in (0, 130) or "Traceback" in player.output
        ok = (jumps >= loops and all(fresh_after) and ooo <= 5 * max(1, jumps)
              and not player_crashed)
        return ok, (f"{jumps} clock jumps back, out_of_order {ooo}; temperature+distance "
                    f"fresh in {sum(fresh_after)}/{len(fresh_after)} reports after the "
                    f"loops; player exit {rc}")

    return _with_node(ctx, name, {"use_sim_time": True}, body, wait_frames=False)


def _player_stopped_by(ctx: ProbeContext, name: str, sig: int, expect_rc: int) -> dict:
    """Signal ``thinkmem bag play --loop`` once its messages are seen on the graph."""
    from sensor_msgs.msg import Temperature

    folder = ctx.folder(name)
    bag = write_probe_bag(folder)
    observer = Observer(ctx.domain_id, name="player_probe")
    seen: list[float] = []
    observer.node.create_subscription(Temperature, "/sensors/temperature",
                                      lambda msg: seen.append(msg.temperature), 10)
    player = Child(player_cmd(bag, "--loop"), ctx.env())
    try:
        playing = observer.wait(lambda: len(seen) >= 5, ctx.start_timeout_s)
    finally:
        rc = player.stop(sig)
        observer.close()
    quiet = "Traceback" not in player.output and "RCLError" not in player.output
    ok = playing and rc == expect_rc and quiet and "stopped: published" in player.output
    return result(name, crashed=rc not in (0, 130) or not quiet, ok=ok,
                  detail=f"{'playing' if playing else 'NOT playing'} when signalled; exit "
                         f"{rc}; output: {player.tail(3)}")


def probe_bag_play_sigint(ctx: ProbeContext) -> dict:
    """Ctrl-C while ``thinkmem bag play --loop`` runs: exit 130 quietly."""
    return _player_stopped_by(ctx, "bag_play_sigint", signal.SIGINT, 130)


def probe_bag_play_sigterm(ctx: ProbeContext) -> dict:
    """SIGTERM (ros2 launch's second step) while playing: exit 0 quietly."""
    return _player_stopped_by(ctx, "bag_play_sigterm", signal.SIGTERM, 0)


def _player_peak_mb(ctx: ProbeContext, bag: Path) -> tuple[float, int, str]:
    player = Child(player_cmd(bag, "--rate", "1000"), ctx.env())
    peak = 0.0
    while player.alive():
        value = _rss_mb(player.pid, "VmHWM")
        if np.isfinite(value):
            peak = max(peak, value)
        time.sleep(0.05)
    rc = player.finish()
    return peak, rc, player.output


def probe_bag_play_memory(ctx: ProbeContext, messages: int = 300_000) -> dict:
    """Peak memory of the player on a big bag versus a tiny one: streamed, not listed."""
    folder = ctx.folder("bag_play_memory")
    small = write_big_bag(folder / "small", 1000)
    big = write_big_bag(folder / "big", messages)
    small_mb, rc_small, _ = _player_peak_mb(ctx, small)
    big_mb, rc_big, output = _player_peak_mb(ctx, big)
    played = f"published {messages} messages" in output
    growth = big_mb - small_mb
    crashed = rc_small != 0 or rc_big != 0 or "Traceback" in output
    return result("bag_play_memory", crashed=crashed, ok=played and growth < 50.0,
                  lost=0 if played else messages, rss_growth_mb=max(0.0, growth),
                  detail=f"peak RSS {small_mb:.0f} MB (1000 msgs) -> {big_mb:.0f} MB "
                         f"({messages} msgs); all played: {played}")


def _hostile_bags(folder: Path) -> dict[str, Path]:
    """Broken bag folders: each a way a copied, truncated or foreign bag can look."""
    import shutil

    good = write_probe_bag(folder / "good", seconds=2.0)
    data_files = [p for p in good.iterdir() if p.name != "metadata.yaml"]
    bags: dict[str, Path] = {}

    def variant(name: str) -> Path:
        path = folder / name
        shutil.copytree(good, path)
        bags[name] = path
        return path

    empty = folder / "empty"
    empty.mkdir()
    bags["empty"] = empty
    (variant("metadata_garbage") / "metadata.yaml").write_bytes(b"\x00\xff{{{ not: [yaml")
    (variant("metadata_list") / "metadata.yaml").write_text("- 1\n- 2\n")
    (variant("metadata_deep") / "metadata.yaml").write_text("[" * 100_000)
    (variant("metadata_fields") / "metadata.yaml").write_text(
        "rosbag2_bagfile_information:\n  version: nine\n  storage_identifier: []\n")
    for name in ("data_truncated", "data_garbage", "data_missing", "data_empty"):
        path = variant(name)
        for data in data_files:
            target = path / data.name
            raw = data.read_bytes()
            if name == "data_truncated":
                target.write_bytes(raw[: len(raw) // 2])
            elif name == "data_garbage":
                target.write_bytes(np.random.default_rng(0).bytes(len(raw)))
            elif name == "data_missing":
                target.unlink()
            else:
                target.write_bytes(b"")
    return bags


def probe_hostile_bag(ctx: ProbeContext) -> dict:
    """Truncated, garbage and half-missing bag folders to ``bag info`` and ``bag play``.

    Each must end with a non-zero exit and one error line naming the problem, never a
    traceback (a bag copied off a robot is often cut short).
    """
    name = "hostile_bag"
    bags = _hostile_bags(ctx.folder(name))
    bad: list[str] = []
    crashed = False
    runs = 0
    for kind, bag in bags.items():
        for verb in ("info", "play"):
            args = [sys.executable, "-m", "thinkmem_ros.cli", "bag", verb, str(bag)]
            if verb == "play":
                args += ["--rate", "1000"]
            child = Child(args, ctx.env())
            rc = child.finish(timeout=60.0)
            runs += 1
            err = [line for line in "".join(child.err).splitlines() if line.strip()]
            traceback = "Traceback" in child.output
            crashed |= traceback or rc < 0 or rc == 137
            if rc == 0 or traceback or len(err) != 1 or "error" not in err[0]:
                bad.append(f"{verb} {kind}: exit {rc}, {len(err)} stderr line(s)"
                           f"{' with a TRACEBACK' if traceback else ''}: "
                           f"{(err[-1] if err else child.tail(1))[:160]}")
    detail = (f"{runs - len(bad)}/{runs} runs over {len(bags)} broken bags ended with one "
              f"error line and a non-zero exit")
    if bad:
        detail += "; " + " | ".join(bad[:6])
    return result(name, crashed=crashed, ok=not bad, detail=detail)


# ------------------------------------------------------------------ bundle install

_DISK_FULL_SCRIPT = textwrap.dedent("""
    import json, resource, signal, sys
    from pathlib import Path
    from thinkmem_ros.link.protocol import decode_frame
    from thinkmem_ros.robot.bundle_receiver import BundleReceiver, BundleReceiverConfig

    frame, pub, target, limit = sys.argv[1:5]
    body = decode_frame(Path(frame).read_bytes()).body
    rx = BundleReceiver(BundleReceiverConfig(target, pub, current_version=1))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(limit), int(limit)))
    path = rx.handle_push(body)
    stats = rx.stats()
    print(json.dumps({"installed": str(path) if path else None,
                      "rejected_install": stats["rejected_install"],
                      "reason": stats["last_reason"],
                      "left": sorted(p.name for p in Path(target).iterdir())}))
""")


def probe_bundle_push_disk_full(ctx: ProbeContext) -> dict:
    """A verified push installed onto a disk that fills up: a counted refusal, no OSError.

    The disk limit is the process's file-size limit (RLIMIT_FSIZE: a write past it fails
    with EFBIG, the same OSError path as ENOSPC) so the probe needs no privileges.
    """
    from thinkmem_ros.consolidator.publish import push_frame
    from thinkmem_ros.link.security import sign_bundle, write_signing_keypair
    from thinkmem_ros.policy.bundle import load_bundle, write_bundle

    name = "bundle_push_disk_full"
    folder = ctx.folder(name)
    pub, key = write_signing_keypair(folder / "keys", "consolidator")
    source = load_bundle(ctx.bundle)
    manifest = source.manifest
    manifest.model_version, manifest.created_at = manifest.model_version + 1, ""
    pushed = folder / "pushed"
    write_bundle(pushed, source.onnx_path.read_bytes(), manifest)
    sign_bundle(pushed, key)
    frame = folder / "push.frame"
    frame.write_bytes(push_frame(pushed))
    target = folder / "robot_bundles"
    limit = max(4096, source.onnx_path.stat().st_size // 4)
    child = Child([sys.executable, "-c", _DISK_FULL_SCRIPT, str(frame), str(pub), str(target),
                   str(limit)], ctx.env())
    rc = child.finish(timeout=60.0)
    try:
        report = json.loads("".join(child.out).strip().splitlines()[-1])
    except (ValueError, IndexError):
        return result(name, crashed=True, ok=False, detail=f"exit {rc}: {child.tail()}")
    ok = (rc == 0 and report["installed"] is None and report["rejected_install"] == 1
          and report["left"] == [])
    return result(name, crashed=rc != 0 or "Traceback" in child.output, ok=ok,
                  detail=f"rejected_install={report['rejected_install']}, reason "
                         f"{report['reason'][:160]!r}, left in bundles_dir: {report['left']}")


def _signed_copy(source: Path, folder: Path, version: int, key: Path,
                 onnx: bytes | None = None) -> Path:
    """``source`` re-versioned (optionally other ONNX bytes), its artefacts kept, signed."""
    import shutil

    from thinkmem_ros.link.security import SIGNATURE_FILE, sign_bundle
    from thinkmem_ros.policy.bundle import MANIFEST, ONNX_FILE, load_bundle, write_bundle

    bundle = load_bundle(source)
    manifest = bundle.manifest
    manifest.model_version, manifest.created_at = version, ""
    write_bundle(folder, onnx if onnx is not None else bundle.onnx_path.read_bytes(),
                 manifest)
    for path in Path(source).iterdir():  # listed value/memctl artefacts travel along
        if path.is_file() and path.name not in (MANIFEST, ONNX_FILE, SIGNATURE_FILE):
            shutil.copyfile(path, folder / path.name)
    sign_bundle(folder, key)
    return folder


def probe_tampered_bundle_pushes(ctx: ProbeContext) -> dict:
    """Hostile BUNDLE_PUSH bodies to a robot's receiver: every one refused and counted.

    Bad signature, unsigned, ONNX bytes not the signed ones, a truncated ONNX, a replayed
    older version, a signed old manifest in a frame claiming a newer version, an artefact
    named with a path, wrong field types, and an exact replay of the running bundle. The
    running bundle must stay installed and untouched, nothing may be written outside the
    bundles folder, and a genuine newer push must still install afterwards.
    """
    from thinkmem_ros.consolidator.publish import push_frame
    from thinkmem_ros.link.protocol import decode_frame
    from thinkmem_ros.link.security import write_signing_keypair
    from thinkmem_ros.robot.bundle_receiver import BundleReceiver, BundleReceiverConfig

    name = "tampered_bundle_pushes"
    folder = ctx.folder(name)
    pub, key = write_signing_keypair(folder / "keys", "consolidator")
    _, evil = write_signing_keypair(folder / "keys", "evil")
    onnx = (Path(ctx.bundle) / "policy.onnx").read_bytes()

    def body(version: int, signer: Path = key, data: bytes | None = None) -> dict:
        path = _signed_copy(ctx.bundle, folder / f"v{version}-{len(list(folder.iterdir()))}",
                            version, signer, data)
        return decode_frame(push_frame(path)).body

    target = folder / "robot_bundles"
    rx = BundleReceiver(BundleReceiverConfig(target, pub, current_version=1))
    running = rx.handle_push(body(3))
    if running is None:
        return result(name, crashed=False, ok=False,
                      detail=f"a genuine v3 push was refused: {rx.last_reason}")
    attacks: dict[str, dict] = {"bad_signature": body(4, evil)}
    attacks["unsigned"] = dict(body(4), signature=b"")
    flipped = body(4)
    flipped["onnx"] = flipped["onnx"][:-1] + bytes([flipped["onnx"][-1] ^ 1])
    attacks["wrong_sha256"] = flipped
    attacks["truncated_onnx"] = dict(body(4), onnx=onnx[: len(onnx) // 2])
    attacks["signed_truncated_onnx_older"] = body(2, data=onnx[: len(onnx) // 2])
    attacks["replayed_older_version"] = body(2)
    attacks["old_manifest_claims_newer"] = dict(body(2), version=4)
    attacks["artefact_path"] = dict(body(4), artefacts={"../../escaped.npz": b"x"})
    attacks["artefact_absolute"] = dict(body(4), artefacts={str(folder / "escaped.npz"): b"x"})
    attacks["wrong_types"] = {"version": "4", "manifest": b"{}", "onnx": b"",
                              "signature": b""}
    attacks["not_a_map"] = [b"x"]  # type: ignore[assignment]
    replay = body(3)
    installed_before = rx.installed()
    accepted: list[str] = []
    quiet = logging.NullHandler()  # each refusal is logged; the counters are what we judge
    logger = logging.getLogger("thinkmem_ros.robot.bundle_receiver")
    logger.addHandler(quiet)
    try:
        for kind, hostile in attacks.items():
            if rx.handle_push(hostile) is not None:
                accepted.append(kind)
        replay_ignored = rx.handle_push(replay) is None
    finally:
        logger.removeHandler(quiet)
    stats = rx.stats()
    refused = sum(int(v) for k, v in stats.items() if k.startswith("rejected_"))
    kept = rx.installed() == installed_before and stats["running_version"] == 3
    listing = sorted(p.name for p in target.iterdir())
    escaped = list(folder.parent.rglob("escaped.npz"))
    fresh = rx.handle_push(body(5)) is not None
    ok = (not accepted and refused == len(attacks) and replay_ignored and kept
          and listing == ["current", "v000003"] and not escaped and fresh)
    counters = ", ".join(f"{k[9:]} {v}" for k, v in stats.items()
                         if k.startswith("rejected_") and v)
    return result(name, crashed=False, ok=ok,
                  detail=f"{refused}/{len(attacks)} hostile pushes refused ({counters}); "
                         f"accepted {accepted or 'none'}; exact replay "
                         f"{'ignored' if replay_ignored else 'INSTALLED'}; running v3 "
                         f"{'kept' if kept else 'CHANGED'}; bundles dir {listing}; escaped "
                         f"files {len(escaped)}; a genuine v5 afterwards "
                         f"{'installed' if fresh else 'REFUSED'}")


# ------------------------------------------------------------------ registry

PROBES: dict[str, Callable[[ProbeContext], dict]] = {
    "feedback_deep_nesting": probe_feedback_deep_nesting,
    "feedback_oversize": probe_feedback_oversize,
    "feedback_malformed": probe_feedback_malformed,
    "events_hostile": probe_events_hostile,
    "future_stamp": probe_future_stamp,
    "extreme_stamps": probe_extreme_stamps,
    "sim_clock_backward": probe_sim_clock_backward,
    "no_input": probe_no_input,
    "param_set_bad_bundle": probe_param_set_bad_bundle,
    "params_missing": probe_params_missing,
    "params_unparsable": probe_params_unparsable,
    "params_aliases": probe_params_aliases,
    "ros_args_typo": probe_ros_args_typo,
    "frame_rate_tiny": probe_frame_rate_tiny,
    "bundle_rate_tiny": probe_bundle_rate_tiny,
    "params_unknown_parameter": probe_params_unknown_parameter,
    "params_signal_key": probe_params_signal_key,
    "params_signal_name": probe_params_signal_name,
    "param_unknown_override": probe_param_unknown_override,
    "bundle_list_field": probe_bundle_list_field,
    "bundle_deep_nesting": probe_bundle_deep_nesting,
    "bundle_not_object": probe_bundle_not_object,
    "graph_fails_probe": probe_graph_fails_probe,
    "artefact_fifo": probe_artefact_fifo,
    "bag_loop_clock": probe_bag_loop_clock,
    "bag_play_sigint": probe_bag_play_sigint,
    "bag_play_sigterm": probe_bag_play_sigterm,
    "bag_play_memory": probe_bag_play_memory,
    "bundle_push_disk_full": probe_bundle_push_disk_full,
    "tampered_bundle_pushes": probe_tampered_bundle_pushes,
    "nan_inf_samples": probe_nan_inf_samples,
    "burst_10khz": probe_burst_10khz,
    "truncated_onnx_at_start": probe_truncated_onnx_at_start,
    "truncated_onnx_rehashed": probe_truncated_onnx_rehashed,
    "hostile_bag": probe_hostile_bag,
}
"""Every robot-side probe by name, in the order ``run_probes`` runs them."""


def run_probes(ctx: ProbeContext, names: list[str] | None = None,
               progress: Callable[[dict], None] | None = None) -> list[dict]:
    """Run ``names`` (all when None); a probe that raises is recorded as crashed, not fatal."""
    unknown = sorted(set(names or ()) - set(PROBES))
    if unknown:
        raise KeyError(f"unknown probes {unknown}; known: {', '.join(PROBES)}")
    out = []
    for name in names or list(PROBES):
        try:
            record = PROBES[name](ctx)
        except Exception as exc:  # noqa: BLE001 - one broken probe must not hide the others
            record = result(name, crashed=True, ok=False,
                            detail=f"probe raised {type(exc).__name__}: {exc}")
        out.append(record)
        if progress is not None:
            progress(record)
    return out
