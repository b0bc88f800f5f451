"""The node's health as an operator reads it: OK / WARN / ERROR plus the numbers behind it.

Plain Python so the level rules are unit-tested without ROS; the node copies the result
into a ``diagnostic_msgs/DiagnosticStatus``. Counters are cumulative in the values (so a
tool can difference them) while the level reacts to what happened since the previous
report, so a burst of bad messages an hour ago does not keep the robot in WARN forever.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

OK, WARN, ERROR = 0, 1, 2
LEVEL_NAMES = {OK: "OK", WARN: "WARN", ERROR: "ERROR"}

COUNTERS = ("frames", "invalid", "duplicate", "out_of_order", "unknown_events",
            "frames_skipped", "inference_errors", "stale_frames", "samples")
"""Cumulative counters the node reports, in the order they appear in the values."""


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


def build_status(snap: HealthSnapshot, *, rate_tolerance: float = 0.9,
                 warmup_s: float = 2.0) -> StatusReport:
    """Judge the snapshot; each reason names what is wrong so the message is actionable."""
    delta = {k: snap.totals.get(k, 0) - snap.previous.get(k, 0) for k in COUNTERS}
    rate = delta["frames"] / snap.elapsed_s if snap.elapsed_s > 0 else 0.0
    errors: list[str] = []
    warns: list[str] = []
    warmed = snap.uptime_s >= warmup_s
    if delta["inference_errors"]:
        errors.append(f"{delta['inference_errors']} inference errors")
    if snap.stale and len(snap.stale) == len(snap.signals) and warmed:
        errors.append("no fresh input: every signal is stale")
    elif snap.stale:
        warns.append(f"stale: {', '.join(snap.stale)}")
    if warmed and rate < 0.5 * snap.expected_rate_hz:
        errors.append(f"frame rate {rate:.1f} Hz of {snap.expected_rate_hz:.1f} Hz")
    elif warmed and rate < rate_tolerance * snap.expected_rate_hz:
        warns.append(f"frame rate {rate:.1f} Hz of {snap.expected_rate_hz:.1f} Hz")
    for topic, types in sorted(snap.type_mismatch.items()):
        warns.append(f"wrong type on {topic}: {', '.join(types)}")
    for key, what in (("invalid", "NaN/inf messages dropped"),
                      ("duplicate", "duplicate stamps dropped"),
                      ("out_of_order", "out-of-order stamps dropped"),
                      ("frames_skipped", "frames skipped (inference too slow)")):
        if delta[key]:
            warns.append(f"{delta[key]} {what}")
    if snap.bundle_error:
        warns.append(f"bundle rejected, running version {snap.bundle_version}: "
                     f"{snap.bundle_error}")
    p99 = _pct(snap.inference_us, 99)
    if snap.expected_rate_hz > 0 and p99 > 0.5e6 / snap.expected_rate_hz:
        warns.append(f"inference p99 {p99:.0f} us exceeds half the frame period")
    level = ERROR if errors else WARN if warns else OK
    message = "; ".join(errors + warns) or "running"
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
        ("stale_signals", ",".join(snap.stale)),
        ("stale_count", str(len(snap.stale))),
        ("type_mismatch", mismatch),
        ("type_mismatch_count", str(len(snap.type_mismatch))),
    ]
    values += [(key, str(snap.totals.get(key, 0))) for key in COUNTERS]
    values += [("bundle_version", str(snap.bundle_version)),
               ("bundle_sha256", snap.bundle_sha256),
               ("bundle_path", snap.bundle_path),
               ("bundle_error", snap.bundle_error),
               ("bundle_swaps", str(snap.bundle_swaps))]
    return values
