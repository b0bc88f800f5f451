"""The node's health as an operator reads it: OK / WARN / ERROR plus the numbers behind it.

Plain Python so the level rules are unit-tested without ROS; the node copies the result
into a ``diagnostic_msgs/DiagnosticStatus``. Counters are cumulative in the values (so a
tool can difference them) while the level reacts to what happened since the previous
report, so a burst of bad messages an hour ago does not keep the robot in WARN forever.

Three things a real robot gets wrong without noticing are reported here too: a window
whose span differs from the one the bundle was trained on (frames, or the sensors that
drive them with ``frame_trigger: samples``, at another rate: ``RateMonitor``), a
publisher whose QoS can never reach the node (counted per signal from rclpy's
incompatible-QoS events), and header stamps far from the node's clock (a recording's
stamps, a sensor with its own clock: a note, not a fault). Signals declared absent are
reported as "absent by design", never as stale, so a robot without some sensor is not
in WARN forever.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

import numpy as np

OK, WARN, ERROR = 0, 1, 2
LEVEL_NAMES = {OK: "OK", WARN: "WARN", ERROR: "ERROR"}

COUNTERS = ("frames", "invalid", "duplicate", "out_of_order", "unknown_events",
            "frames_skipped", "inference_errors", "stale_frames", "samples", "future",
            "time_jumps", "invalid_events", "input_errors", "no_input_frames",
            "rate_mismatch_frames", "qos_incompatible", "stamp_offset_samples",
            "stamp_restarts")
"""Cumulative counters the node reports, in the order they appear in the values.

``future``: samples refused because their stamp was further ahead of the node's clock
than ``future_stamp_tolerance_s``; ``time_jumps``: backward clock steps that reset the
window; ``invalid_events``: events-topic messages refused (too long); ``input_errors``:
input messages whose handling raised (the node counts them and goes on);
``no_input_frames``: frames published with every signal stale and so no active thinking;
``rate_mismatch_frames``: frames published while the window's span differed from the
bundle's by more than ``RATE_TOLERANCE``; ``qos_incompatible``: publishers on signal
topics whose QoS can never match the node's subscription (rclpy incompatible-QoS events);
``stamp_offset_samples``: samples whose header stamp was more than ``STAMP_NOTE_S`` behind
the node's clock; ``stamp_restarts``: signals whose header stamps went back without a clock
jump (a bag looped without ``--clock``, a restarted driver clock) and whose new timeline
was taken once the old one had gone stale.
"""

RATE_TOLERANCE = 0.05
"""Relative difference of the window span from the bundle's that is reported (5 %)."""
STAMP_NOTE_S = 10.0
"""A header stamp further behind the node's clock than this is noted (never refused)."""
SIGNAL_MIN_INTERVALS = 16
"""Intervals a signal's rate needs before it is reported. Fewer than a frame verdict needs:
the frame ring also holds the 'samples' watchdog's frames from before the sensors started,
so it can fill (and show a mismatch) while the sensors driving it have fewer samples than
a window; the driver is named as soon as its own rate is measurable."""


@dataclass(frozen=True)
class RateCheck:
    """What the measured rates say about the window's span against the bundle's."""

    frame_rate_hz: float  # over the last frames (up to 64); NaN until enough frames
    span_s: float  # K frame intervals at that rate: what the window covers
    expected_span_s: float  # K / the bundle's frame rate
    bundle_rate_hz: float
    mismatch: bool
    fast_signals: tuple[str, ...] = ()  # samples faster than the bundle's rate (drive frames)
    signal_rates_hz: dict[str, float] = field(default_factory=dict)

    def reason(self) -> str:
        """One clause for the diagnostics message ('' without a mismatch)."""
        if not self.mismatch:
            return ""
        drivers = (f"; driven by {', '.join(self.fast_signals)}" if self.fast_signals else "")
        return (f"window spans {self.span_s:.2f} s, bundle trained on "
                f"{self.expected_span_s:.2f} s (frames at {self.frame_rate_hz:.1f} Hz, "
                f"bundle {self.bundle_rate_hz:.1f} Hz{drivers})")


class RateMonitor:
    """Rates of frames and of each signal's samples over their last 64 intervals.

    The rate is (intervals) / (time they span), i.e. what a window of that many frames
    really covers: a burst of messages delivered together by a busy executor averages
    out (a median of intervals would not), and one late timer tick moves it by about
    1/64. Nothing is judged before a window's worth (K) of intervals has been seen; a
    30 Hz stream driving a 10 Hz bundle (``frame_trigger: samples``) is then reported at
    the next diagnostics tick. Times are the node's clock (sim time under a bag's /clock).
    """

    def __init__(self, signals: tuple[str, ...], bundle_rate_hz: float, window: int,
                 *, keep: int = 65, min_intervals: int | None = None,
                 tolerance: float = RATE_TOLERANCE) -> None:
        self.signals = signals
        self.bundle_rate_hz = float(bundle_rate_hz)
        self.window = int(window)
        self.tolerance = tolerance
        # Judged once a full window of intervals is seen: a few start-up ticks delayed by
        # loading must not read as another rate.
        self.min_intervals = (min(self.window, keep - 1) if min_intervals is None
                              else min_intervals)
        self.signal_min_intervals = min(self.min_intervals, SIGNAL_MIN_INTERVALS)
        self._lock = threading.Lock()
        self._frames: deque[float] = deque(maxlen=keep)
        self._samples = [deque(maxlen=keep) for _ in signals]

    def frame(self, t: float) -> None:
        """Record a frame assembled at node time ``t``."""
        with self._lock:
            self._frames.append(t)

    def sample(self, index: int, t: float) -> None:
        """Record an accepted sample of signal ``index`` at node time ``t``."""
        with self._lock:
            self._samples[index].append(t)

    def reset(self) -> None:
        """Forget the history (the clock jumped: old intervals mean nothing now)."""
        with self._lock:
            self._frames.clear()
            for ring in self._samples:
                ring.clear()

    def _rate(self, ring: deque, min_intervals: int) -> float:
        if len(ring) <= min_intervals:
            return float("nan")
        spanned = ring[-1] - ring[0]
        return (len(ring) - 1) / spanned if spanned > 0 else float("nan")

    def check(self, samples_trigger: bool) -> RateCheck:
        """Judge the current rates; a mismatch is a span more than ``tolerance`` off."""
        with self._lock:
            frame_rate = self._rate(self._frames, self.min_intervals)
            rates = {name: self._rate(ring, self.signal_min_intervals) for name, ring in zip(
                self.signals, self._samples, strict=True)}
        expected = self.window / self.bundle_rate_hz
        span = self.window / frame_rate if frame_rate > 0 else float("nan")
        mismatch = bool(np.isfinite(span) and abs(span / expected - 1.0) > self.tolerance)
        fast = tuple(name for name, rate in rates.items() if samples_trigger and np.isfinite(
            rate) and rate > self.bundle_rate_hz * (1.0 + self.tolerance))
        return RateCheck(frame_rate, span, expected, self.bundle_rate_hz, mismatch,
                         fast if mismatch else (),
                         {k: v for k, v in rates.items() if np.isfinite(v)})



@dataclass
class HealthSnapshot:
    """What the node knows at one diagnostics tick."""

    robot_id: str
    expected_rate_hz: float
    elapsed_s: float  # since the previous report
    uptime_s: float
    totals: dict[str, int]  # COUNTERS, cumulative
    previous: dict[str, int]  # COUNTERS at the previous report
    inference_us: np.ndarray  # recent inference durations
    latency_us: np.ndarray  # recent last-sample-arrival -> publication durations
    signals: tuple[str, ...]
    stale: tuple[str, ...]  # masked in the newest frame (stale or never seen)
    type_mismatch: dict[str, list[str]] = field(default_factory=dict)  # topic -> foreign types
    bundle_version: int = 0
    bundle_sha256: str = ""
    bundle_path: str = ""
    bundle_error: str = ""  # last rejected bundle, '' once a good one is running again
    bundle_swaps: int = 0
    absent: tuple[str, ...] = ()  # declared absent by design: never stale, never a warning
    rate: RateCheck | None = None
    qos_incompatible: dict[str, tuple[int, str]] = field(default_factory=dict)
    stamp_offset_s: float = float("nan")  # node clock minus the latest far-off header stamp
    wait_us: np.ndarray = field(default_factory=lambda: np.zeros(0))  # sample -> frame
    compute_us: np.ndarray = field(default_factory=lambda: np.zeros(0))  # frame -> publish
    ros_time_still_s: float = 0.0  # steady seconds sim time has not moved (0: it moves)


@dataclass
class StatusReport:
    """Level, one-line message and key/value strings for a DiagnosticStatus."""

    level: int
    message: str
    values: list[tuple[str, str]]

    @property
    def level_name(self) -> str:
        """'OK', 'WARN' or 'ERROR'."""
        return LEVEL_NAMES[self.level]


def _pct(samples: np.ndarray, q: float) -> float:
    return float(np.percentile(samples, q)) if samples.size else float("nan")


class ClockWatch:
    """How long ROS time has stood still, measured on the steady clock.

    With ``use_sim_time`` a paused bag, a stalled simulator or no ``/clock`` at all stops
    ROS time, and with it every ROS-clock timer and frame: the node looks dead. The node's
    diagnostics run on the steady clock and ask this, so they say why instead.
    """

    def __init__(self) -> None:
        self._ros_now: float | None = None
        self._since = 0.0

    def still_for(self, ros_now: float, steady_now: float) -> float:
        """Steady seconds since ROS time last moved (0.0 at the first reading or a move)."""
        if ros_now != self._ros_now:
            self._ros_now, self._since = ros_now, steady_now
        return steady_now - self._since


def build_status(snap: HealthSnapshot, *, rate_tolerance: float = 0.9,
                 warmup_s: float = 2.0, clock_still_warn_s: float = 2.0) -> StatusReport:
    """Judge the snapshot; each reason names what is wrong so the message is actionable."""
    delta = {k: snap.totals.get(k, 0) - snap.previous.get(k, 0) for k in COUNTERS}
    rate = delta["frames"] / snap.elapsed_s if snap.elapsed_s > 0 else 0.0
    errors: list[str] = []
    warns: list[str] = []
    notes: list[str] = []
    warmed = snap.uptime_s >= warmup_s
    stale = tuple(s for s in snap.stale if s not in snap.absent)
    present = [s for s in snap.signals if s not in snap.absent]
    if delta["inference_errors"]:
        errors.append(f"{delta['inference_errors']} inference errors")
    if stale and len(stale) == len(present) and warmed:
        errors.append("no fresh input: every signal is stale")
    elif stale:
        warns.append(f"stale: {', '.join(stale)}")
    if snap.rate is not None and snap.rate.mismatch:
        warns.append(snap.rate.reason())
    for signal, (count, policy) in sorted(snap.qos_incompatible.items()):
        warns.append(f"incompatible QoS on {signal} ({count} publisher"
                     f"{'s' if count != 1 else ''}, {policy}): its messages never arrive")
    if delta["stamp_offset_samples"]:
        notes.append(f"note: {delta['stamp_offset_samples']} samples stamped "
                     f"{snap.stamp_offset_s:.3g} s behind the node's clock (a recording's "
                     "or a sensor's own clock?)")
    if snap.absent:
        notes.append(f"absent by design: {', '.join(snap.absent)}")
    if warmed and rate < 0.5 * snap.expected_rate_hz:
        errors.append(f"frame rate {rate:.1f} Hz of {snap.expected_rate_hz:.1f} Hz")
    elif warmed and rate < rate_tolerance * snap.expected_rate_hz:
        warns.append(f"frame rate {rate:.1f} Hz of {snap.expected_rate_hz:.1f} Hz")
    for topic, types in sorted(snap.type_mismatch.items()):
        warns.append(f"wrong type on {topic}: {', '.join(types)}")
    for key, what in (("invalid", "NaN/inf messages dropped"),
                      ("duplicate", "duplicate stamps dropped"),
                      ("out_of_order", "out-of-order stamps dropped"),
                      ("future", "future stamps dropped (sensor clock ahead of ours?)"),
                      ("time_jumps", "backward clock jumps (window reset)"),
                      ("stamp_restarts", "signal stamp restarts taken as a new timeline "
                       "(a bag looped without --clock?)"),
                      ("invalid_events", "invalid event messages dropped"),
                      ("input_errors", "input messages that could not be handled"),
                      ("frames_skipped", "frames skipped (inference too slow)")):
        if delta[key]:
            warns.append(f"{delta[key]} {what}")
    if snap.ros_time_still_s >= clock_still_warn_s:
        warns.append(f"ROS time not advancing for {snap.ros_time_still_s:.0f} s "
                     "(use_sim_time: is /clock paused or not published?)")
    if snap.bundle_error:
        warns.append(f"bundle rejected, running version {snap.bundle_version}: "
                     f"{snap.bundle_error}")
    p99 = _pct(snap.inference_us, 99)
    if snap.expected_rate_hz > 0 and p99 > 0.5e6 / snap.expected_rate_hz:
        warns.append(f"inference p99 {p99:.0f} us exceeds half the frame period")
    level = ERROR if errors else WARN if warns else OK
    message = "; ".join(errors + warns) or "running"
    if notes:
        message += "; " + "; ".join(notes)
    return StatusReport(level, message, _values(snap, rate))


def _values(snap: HealthSnapshot, rate: float) -> list[tuple[str, str]]:
    mismatch = ";".join(f"{topic}={','.join(types)}"
                        for topic, types in sorted(snap.type_mismatch.items()))
    values = [
        ("robot_id", snap.robot_id),
        ("frame_rate_expected_hz", f"{snap.expected_rate_hz:.3f}"),
        ("frame_rate_hz", f"{rate:.3f}"),
        ("inference_p50_us", f"{_pct(snap.inference_us, 50):.1f}"),
        ("inference_p99_us", f"{_pct(snap.inference_us, 99):.1f}"),
        ("latency_p50_us", f"{_pct(snap.latency_us, 50):.1f}"),
        ("latency_p99_us", f"{_pct(snap.latency_us, 99):.1f}"),
        ("wait_p50_us", f"{_pct(snap.wait_us, 50):.1f}"),
        ("wait_p99_us", f"{_pct(snap.wait_us, 99):.1f}"),
        ("compute_p50_us", f"{_pct(snap.compute_us, 50):.1f}"),
        ("compute_p99_us", f"{_pct(snap.compute_us, 99):.1f}"),
        ("stale_signals", ",".join(s for s in snap.stale if s not in snap.absent)),
        ("stale_count", str(sum(s not in snap.absent for s in snap.stale))),
        ("absent_signals", ",".join(snap.absent)),
        ("absent_count", str(len(snap.absent))),
        ("type_mismatch", mismatch),
        ("type_mismatch_count", str(len(snap.type_mismatch))),
    ]
    values += [(key, str(snap.totals.get(key, 0))) for key in COUNTERS]
    check = snap.rate
    values += [
        ("frame_rate_measured_hz", "nan" if check is None else f"{check.frame_rate_hz:.3f}"),
        ("window_span_s", "nan" if check is None else f"{check.span_s:.3f}"),
        ("window_span_expected_s", "nan" if check is None else f"{check.expected_span_s:.3f}"),
        ("rate_mismatch", str(bool(check is not None and check.mismatch)).lower()),
        ("signal_rates_hz", "" if check is None else ",".join(
            f"{name}={rate_hz:.2f}" for name, rate_hz in check.signal_rates_hz.items())),
        ("qos_incompatible_signals", ",".join(
            f"{name}={count}" for name, (count, _) in sorted(snap.qos_incompatible.items()))),
        ("stamp_offset_s", f"{snap.stamp_offset_s:.3f}"),
        ("ros_time_still_s", f"{snap.ros_time_still_s:.1f}")]
    values += [("bundle_version", str(snap.bundle_version)),
               ("bundle_sha256", snap.bundle_sha256),
               ("bundle_path", snap.bundle_path),
               ("bundle_error", snap.bundle_error),
               ("bundle_swaps", str(snap.bundle_swaps))]
    return values


# ------------------------------------------------------------------ experience shipping

SHIPPING_VALUES = ("queue", "spool_rows", "spool_bytes", "inflight", "sent", "resent", "acked",
                   "stored", "duplicates", "shed", "dropped", "rejected", "auth_failures",
                   "handshake_failures", "refused", "disconnects", "errors", "bundle_pushes",
                   "shed_disk_full", "refused_disk_full", "spool_failed", "reopens",
                   "failovers", "rehomes")
"""Shipper gauges and counters reported in the "shipping" status, in this order."""

BUILDER_VALUES = ("frames", "pending", "shipped", "skipped", "feedback", "feedback_matched",
                  "feedback_late", "feedback_unmatched", "feedback_invalid", "episodes",
                  "build_errors", "events_invalid", "feedback_waiting", "feedback_dropped")
"""Experience-builder counters reported (prefixed ``experiences_``) in the same status."""


@dataclass
class ShippingSnapshot:
    """Shipper and builder statistics at one diagnostics tick, and at the previous one."""

    endpoint: str
    curve: bool
    shipper: dict  # ExperienceShipper.stats() plus 'dropped' (queue full + builder refusals)
    previous: dict  # the same at the previous report ({} at the first)
    builder: dict  # ExperienceBuilder.stats()
    previous_builder: dict = field(default_factory=dict)
    failure: str = ""  # the shipper could not start or its thread died


def shipping_status(snap: ShippingSnapshot) -> StatusReport:
    """Judge shipping: ERROR on auth failures or a dead shipper, WARN on loss risk."""
    cur, prev = snap.shipper, snap.previous

    def delta(key: str) -> int:
        return int(cur.get(key, 0)) - int(prev.get(key, 0))

    errors: list[str] = []
    warns: list[str] = []
    connected = bool(cur.get("connected"))
    rows = int(cur.get("spool_rows", 0))
    if snap.failure:
        errors.append(f"shipper not running: {snap.failure}")
    if delta("auth_failures") or (not connected and cur.get("auth_failures", 0)):
        errors.append(f"consolidator refused our CURVE key ({cur.get('auth_failures', 0)} "
                      "auth failures): add this robot's public key to its allowed keys")
    if delta("errors"):
        errors.append(f"{delta('errors')} spool/shipper errors")
    if cur.get("disk_full"):
        errors.append("spool disk full: new experiences are shed or refused (free space on "
                      "the spool's filesystem)")
    for key, what in (("shed_disk_full", "oldest spooled experiences shed (disk full)"),
                      ("refused_disk_full", "experiences refused (disk full)"),
                      ("spool_failed", "experiences the spool could not write")):
        if delta(key):
            errors.append(f"{delta(key)} {what}")
    if not connected and rows:
        growing = rows > int(prev.get("spool_rows", 0))
        warns.append(f"not connected to {snap.endpoint}; {rows} experiences spooled"
                     + (" and growing" if growing else ""))
    for key, what in (("shed", "experiences shed (spool full)"),
                      ("dropped", "experiences dropped (queue full)"),
                      ("handshake_failures", "handshake failures (wrong server key?)"),
                      ("refused", "frames refused by the consolidator"),
                      ("rejected", "experiences rejected by the consolidator")):
        if delta(key):
            warns.append(f"{delta(key)} {what}")
    for key, what in (("build_errors", "frames could not become experiences"),
                      ("feedback_invalid", "malformed feedback messages"),
                      ("feedback_dropped", "feedback messages dropped while waiting for "
                       "their frame (too many ahead of the frames: stamps in the future?)"),
                      ("events_invalid", "malformed event names")):
        count = int(snap.builder.get(key, 0)) - int(snap.previous_builder.get(key, 0))
        if count:
            warns.append(f"{count} {what}")
    level = ERROR if errors else WARN if warns else OK
    if errors or warns:
        message = "; ".join(errors + warns)
    elif connected:
        message = f"connected, {cur.get('acked', 0)} experiences acknowledged"
    else:
        message = f"waiting for {snap.endpoint} (nothing spooled)"
    values = [("endpoint", snap.endpoint), ("curve", str(snap.curve).lower()),
              ("connected", str(connected).lower())]
    values += [(key, str(cur.get(key, 0))) for key in SHIPPING_VALUES]
    values += [(f"experiences_{key}", str(snap.builder.get(key, 0))) for key in BUILDER_VALUES]
    values += [("episode_id", str(snap.builder.get("episode_id", "")))]
    return StatusReport(level, message, values)


# ---------------------------------------------------------------------- bundle pushes

PUSH_VALUES = ("pushes", "accepted", "replayed", "rejected_unconfigured", "rejected_malformed",
               "rejected_unsigned", "rejected_pinned", "rejected_signature", "rejected_hash",
               "rejected_version", "rejected_artefact",
               "rejected_install", "callback_errors", "trusted_keys", "trust_serial",
               "endorsements_applied", "endorsements_refused", "endorsements_untrusted",
               "endorsements_stale")
"""Push counters reported in the "bundle push" status, in this order."""


@dataclass
class PushSnapshot:
    """What the bundle receiver and the hot-swap say about pushed bundles."""

    configured: bool  # a signing public key is set (otherwise every push is refused)
    counters: dict  # BundleReceiver.stats() plus rejected_unconfigured
    last_outcome: str  # '', 'accepted', 'replayed' or 'rejected'
    last_reason: str
    installed_version: int  # newest version the receiver verified and installed
    running_version: int  # version the node infers with
    swap_error: str = ""  # the hot-swap's last refusal ('' once a good bundle runs)


def push_status(snap: PushSnapshot) -> StatusReport:
    """Judge pushes: WARN while the latest push was refused or an installed one cannot run."""
    warns: list[str] = []
    if snap.last_outcome == "rejected":
        warns.append(f"pushed bundle REJECTED, running v{snap.running_version}: "
                     f"{snap.last_reason}")
    if snap.installed_version > snap.running_version and snap.swap_error:
        warns.append(f"installed v{snap.installed_version} cannot run: {snap.swap_error}")
    level = WARN if warns else OK
    if warns:
        message = "; ".join(warns)
    elif not snap.configured:
        message = "pushes refused: no bundle_signing_public_key configured"
    elif snap.last_outcome == "accepted":
        message = f"running pushed v{snap.running_version}"
    else:
        message = f"running v{snap.running_version}; waiting for pushes"
    values = [("configured", str(snap.configured).lower()),
              ("installed_version", str(snap.installed_version)),
              ("running_version", str(snap.running_version)),
              ("last_outcome", snap.last_outcome), ("last_reason", snap.last_reason)]
    values += [(key, str(snap.counters.get(key, 0))) for key in PUSH_VALUES]
    return StatusReport(level, message, values)


# ------------------------------------------------------------- values and memory control

GATE_VALUES = ("value_suppressed", "value_explored", "memctl_compress", "memctl_recall",
               "memctl_head_errors", "memctl_missing_id", "recall_evidence", "recall_errors",
               "anticipation_added", "anticipation_dropped", "anticipation_opened",
               "anticipation_closed", "anticipation_expired", "anticipation_backwards_resets")
"""Gate counters (``ThinkingGates.stats``) reported in the "memory" status, in this order."""


@dataclass
class GateSnapshot:
    """Value/memory-control state at one diagnostics tick, and counters at the previous."""

    has_values: bool
    has_memctl: bool
    value_mode: str
    recall_endpoint: str
    counters: dict
    previous: dict = field(default_factory=dict)
    artefact_errors: list[str] = field(default_factory=list)


def gate_status(snap: GateSnapshot) -> StatusReport:
    """Judge values and memory control: WARN on recall failures, head errors, bad artefacts."""
    def delta(key: str) -> int:
        return int(snap.counters.get(key, 0)) - int(snap.previous.get(key, 0))

    warns: list[str] = [f"artefact refused: {err}" for err in snap.artefact_errors]
    last_error = str(snap.counters.get("last_recall_error", ""))
    if delta("recall_errors") or last_error:
        warns.append(f"recall failing ({snap.counters.get('recall_errors', 0)} failures; "
                     f"service {snap.recall_endpoint or 'unset'}: {last_error or 'late'}); "
                     "no evidence published")
    if delta("memctl_head_errors"):
        warns.append(f"{delta('memctl_head_errors')} memory-control head errors "
                     "(compression/recall skipped)")
    level = WARN if warns else OK
    parts = [f"values {snap.value_mode if snap.has_values else 'absent'}",
             f"memctl {'on' if snap.has_memctl else 'absent'}"]
    message = "; ".join(warns) if warns else ", ".join(parts)
    values = [("values", str(snap.has_values).lower()), ("value_mode", snap.value_mode),
              ("memctl", str(snap.has_memctl).lower()),
              ("recall_endpoint", snap.recall_endpoint)]
    values += [(key, str(snap.counters.get(key, 0))) for key in GATE_VALUES]
    values += [("last_recall_error", str(snap.counters.get("last_recall_error", ""))),
               ("artefact_errors", "; ".join(snap.artefact_errors))]
    return StatusReport(level, message, values)
