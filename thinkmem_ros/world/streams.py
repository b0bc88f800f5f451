"""Continuous robot signal streams with per-frame thinking ground truth and events.

A stream is rendered in three layers: a *clean* signal (slow nominal drift plus scenario
episodes drawn as piecewise-linear profiles), *labels* computed from the clean signal by the
rule table below, and the *observed* values (clean + sensor noise, plus NaN dropout bursts
in ``mixed``). Labels never look at noise, so a window model can learn them exactly.

Label rules
-----------
Every frame t is labelled from the clean signal in the 3.2 s window ending at t, i.e. the
K=32 frames at 10 Hz a policy sees. Only three frames of that window matter:
``X1`` = value at t, ``X0`` = value 3.1 s earlier (first frame of the window) and
``Xq`` = value 0.8 s earlier (start of the last quarter, frame -9). With
``dX = X1 - X0``, ``late X = X1 - Xq``, ``early X = Xq - X0`` (T temperature degC,
I current A, V vibration mm/s, D distance m, S visibility 0..1):

==========================  ====================================================
label                       active when
==========================  ====================================================
trend                       abs(dT) >= 4  or  abs(dV) >= 2
cause                       dT >= 4  or  dV >= 2
hazard                      T1 >= 65  or  V1 >= 7  or  D1 <= 1.5
future_impact               late T >= 4.5  or  (D0 - D1 >= 2.5 and D1 <= 5)
information_seeking         late T >= 4.5  or  (S1 <= 0.5 and D1 <= 5)
temp_current_inconsistency  dT >= 4 and dI < 0.1 * dT
visibility_distance_check   S1 <= 0.5 and D1 <= 5
vibration_load_comparison   V1 >= 5
late_change_inspection      (abs(late I) >= 2 and abs(early I) < 1)
                            or (late T >= 4.5 and early T <= late T)
recovery_confirmation       dT <= -4 and T0 >= 55
==========================  ====================================================

Frames in the first 3.1 s use the first frame of the stream in place of the missing past.
Scenario dynamics cross these thresholds quickly (ramps of >= 2.5 degC/s against a 4 degC
threshold, instantaneous current steps of >= 2.6 A, obstacles closing at >= 1.3 m/s) and
stay well clear of them otherwise: nominal drift moves T by < 0.4 degC per window, the
steepest linear heating moves ``late T`` by < 2.8 degC, heat plateaus end >= 67 degC,
vibration plateaus >= 7.8 mm/s, obstacles stop at <= 1.3 m, fog at <= 0.3 and the nominal
distance stays >= 5.7 m. Few frames are therefore borderline, and a K=32 window model can
learn the table from the noisy, partly missing observations. Measured: the rule applied
to the raw noisy ``mixed`` values (dropouts forward-filled) scores 0.991 micro-F1; the
``default`` policy preset trained 25 epochs on 30 mixed streams of 200 s at 10 Hz (stride
3, about 17k windows) scores 0.980 on four held-out 300 s streams.

Events
------
Threshold events are derived from the clean signal with hysteresis: ``temperature_high``
(T rises through 65) / ``temperature_normal`` (falls through 60), ``vibration_high`` (V
through 7) / ``vibration_normal`` (below 5), ``visibility_low`` (S below 0.5) /
``visibility_restored`` (above 0.7), ``obstacle_near`` (D below 1.5) / ``obstacle_clear``
(above 3), ``robot_stop`` (motion below 0.05 m/s) / ``robot_start`` (above 0.1 m/s).
Operational events come from the generator: ``payload_change`` (load changes, both the
small nominal ones and the overload episodes), ``door_open`` / ``door_close`` (nuisance,
no effect on any signal).

``stream_windows`` cuts a stream into a SituationSet whose ``events`` hold the ids
(1-based into ``EVENT_VOCABULARY``) of the last ``max_events`` events at or before each
window's last frame, oldest first, left-padded with 0.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from thinkmem_ros.core.data import SignalStream, SituationSet
from thinkmem_ros.core.vocabulary import SIGNALS, THINKING
from thinkmem_ros.world.shapes import CH, clip_physical, nominal_levels, render_knots, sensor_noise

RULE_RATE_HZ = 10.0
"""Frame rate the label rules are stated at."""
RULE_WINDOW = 32
"""Frames per rule window at RULE_RATE_HZ (3.2 s)."""
SPAN_S = (RULE_WINDOW - 1) / RULE_RATE_HZ
"""Seconds between the first and the last frame of a rule window (3.1 s)."""
LATE_S = 8 / RULE_RATE_HZ
"""Seconds covered by the last quarter of a rule window (0.8 s, frames -9 .. -1)."""

EVENT_VOCABULARY: tuple[str, ...] = (
    "temperature_high", "temperature_normal", "vibration_high", "vibration_normal",
    "visibility_low", "visibility_restored", "obstacle_near", "obstacle_clear",
    "robot_stop", "robot_start", "payload_change", "door_open", "door_close",
)
"""Every event name streams emit; SituationSet event ids index this from 1 (0 = padding)."""

_L = {name: i for i, name in enumerate(THINKING)}


# --------------------------------------------------------------------------- label rules

def rule_labels(first: np.ndarray, late_start: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Apply the module's rule table to clean frames X0, Xq, X1 of shape (..., F).

    Returns a boolean (..., L) array over ``vocabulary.THINKING``.
    """
    t0, tq, t1 = first[..., CH["temperature"]], late_start[..., CH["temperature"]], \
        last[..., CH["temperature"]]
    i0, iq, i1 = first[..., CH["current"]], late_start[..., CH["current"]], \
        last[..., CH["current"]]
    v0, v1 = first[..., CH["vibration"]], last[..., CH["vibration"]]
    d0, d1 = first[..., CH["distance"]], last[..., CH["distance"]]
    s1 = last[..., CH["visibility"]]
    d_t, d_v, d_i = t1 - t0, v1 - v0, i1 - i0
    late_t, early_t = t1 - tq, tq - t0
    heating, cooling = d_t >= 4.0, d_t <= -4.0
    vib_up, vib_down = d_v >= 2.0, d_v <= -2.0
    onset = late_t >= 4.5
    fog_near = (s1 <= 0.5) & (d1 <= 5.0)
    closing = (d0 - d1 >= 2.5) & (d1 <= 5.0)
    current_step = (np.abs(i1 - iq) >= 2.0) & (np.abs(iq - i0) < 1.0)
    out = np.zeros(first.shape[:-1] + (len(THINKING),), dtype=bool)
    out[..., _L["trend"]] = heating | cooling | vib_up | vib_down
    out[..., _L["cause"]] = heating | vib_up
    out[..., _L["hazard"]] = (t1 >= 65.0) | (v1 >= 7.0) | (d1 <= 1.5)
    out[..., _L["future_impact"]] = onset | closing
    out[..., _L["information_seeking"]] = onset | fog_near
    out[..., _L["temp_current_inconsistency"]] = heating & (d_i < 0.1 * d_t)
    out[..., _L["visibility_distance_check"]] = fog_near
    out[..., _L["vibration_load_comparison"]] = v1 >= 5.0
    out[..., _L["late_change_inspection"]] = current_step | (onset & (early_t <= late_t))
    out[..., _L["recovery_confirmation"]] = cooling & (t0 >= 55.0)
    return out


def window_labels(clean_window: np.ndarray) -> np.ndarray:
    """Labels of one clean (32, F) window at 10 Hz (or a batch (N, 32, F)) as float32."""
    w = np.asarray(clean_window, dtype=np.float64)
    if w.shape[-2] != RULE_WINDOW:
        raise ValueError(f"rule windows have {RULE_WINDOW} frames, got shape {w.shape}")
    return rule_labels(w[..., 0, :], w[..., -9, :], w[..., -1, :]).astype(np.float32)


def frame_labels(clean: np.ndarray, rate_hz: float) -> np.ndarray:
    """Labels for every frame of a clean (T, F) stream at ``rate_hz``, as float32 (T, L)."""
    n = clean.shape[0]
    idx = np.arange(n)
    first = np.maximum(idx - int(round(SPAN_S * rate_hz)), 0)
    late = np.maximum(idx - int(round(LATE_S * rate_hz)), 0)
    return rule_labels(clean[first], clean[late], clean).astype(np.float32)


# --------------------------------------------------------------------------- episodes

@dataclass
class Episode:
    """One scenario occurrence: per-channel piecewise-linear profiles relative to its start.

    ``add`` profiles are offsets added to the nominal signal; ``cap`` profiles bound the
    signal from above (an approaching object caps the nearest distance, fog caps visibility).
    """

    duration_s: float
    add: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    cap: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    events: list[tuple[float, str]] = field(default_factory=list)


def _knots(*pairs: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    t, v = zip(*pairs, strict=True)
    return np.asarray(t, dtype=np.float64), np.asarray(v, dtype=np.float64)


def _heat_profile(rng: np.random.Generator, amplitude: tuple[float, float],
                  hold: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """Linear heating to a plateau and linear cooling back: rates 2.5-3.5 degC/s."""
    amp = rng.uniform(*amplitude)
    up = amp / rng.uniform(2.5, 3.5)
    top = up + rng.uniform(*hold)
    down = amp / rng.uniform(2.5, 3.5)
    return _knots((0.0, 0.0), (up, amp), (top, amp), (top + down, 0.0))


def episode_overheat(rng: np.random.Generator) -> Episode:
    """Temperature climbs 30-42 degC above nominal while the current stays flat."""
    kt, kv = _heat_profile(rng, (30.0, 42.0), (3.0, 8.0))
    return Episode(float(kt[-1]), add={"temperature": (kt, kv)})


def episode_recovery(rng: np.random.Generator) -> Episode:
    """Heating explained by a current rise (work), then falling back from high."""
    kt, kv = _heat_profile(rng, (32.0, 42.0), (2.0, 5.0))
    ratio = rng.uniform(0.22, 0.3)  # A per degC: dI >= 0.22 dT, far from the 0.1 rule
    return Episode(float(kt[-1]), add={"temperature": (kt, kv), "current": (kt, kv * ratio)})


def episode_late_current_change(rng: np.random.Generator) -> Episode:
    """Step the current instantly by 2.6-4 A (either sign), hold 4-10 s, step back."""
    step = rng.uniform(2.6, 4.0) * rng.choice([-1.0, 1.0])
    hold = rng.uniform(4.0, 10.0)
    eps = 1e-6
    kt, kv = _knots((0.0, 0.0), (0.5, 0.0), (0.5 + eps, step), (0.5 + hold, step),
                    (0.5 + hold + eps, 0.0), (1.0 + hold, 0.0))
    return Episode(float(kt[-1]), add={"current": (kt, kv)})


def episode_overload(rng: np.random.Generator) -> Episode:
    """Load a heavy payload (20-35 kg) while vibration climbs 6.5-8.5 mm/s above nominal."""
    payload = rng.uniform(20.0, 35.0)
    amp = rng.uniform(6.5, 8.5)  # plateau >= 7.8 mm/s: clear of the 5 and 7 thresholds
    rise = amp / rng.uniform(2.0, 3.0)
    hold = rng.uniform(4.0, 10.0)
    fall = amp / rng.uniform(2.0, 3.0)
    top = 1.0 + rise + hold
    end = top + fall
    load = _knots((0.0, 0.0), (1.0, payload), (top, payload), (top + 1.0, 0.0), (end, 0.0))
    vib = _knots((0.0, 0.0), (1.0, 0.0), (1.0 + rise, amp), (top, amp), (end, 0.0))
    return Episode(end, add={"load": load, "vibration": vib},
                   events=[(0.0, "payload_change"), (top, "payload_change")])


def episode_fog_obstacle(rng: np.random.Generator) -> Episode:
    """Visibility drops (fog, dust) while an object closes in to under 1.3 m, then clears.

    A quarter of episodes have the object without fog and a sixth fog without an object,
    so the joint visibility-distance rule is not implied by either signal alone.
    """
    kind = rng.choice(["both", "object", "fog"], p=[0.6, 0.25, 0.15])
    fog_in = rng.uniform(1.5, 3.0)
    start = fog_in + rng.uniform(0.0, 1.0)
    far = rng.uniform(7.5, 9.5)
    near = rng.uniform(0.6, 1.3)
    arrive = start + (far - near) / rng.uniform(1.3, 2.0)
    leave = arrive + rng.uniform(2.0, 4.0)
    gone = leave + (10.0 - near) / 2.5
    clear = gone + rng.uniform(2.0, 4.0)
    cap = {}
    if kind in ("both", "object"):
        cap["distance"] = _knots((0.0, 30.0), (start, 30.0), (start + 1e-6, far),
                                 (arrive, near), (leave, near), (gone, 10.0), (clear, 30.0))
    if kind in ("both", "fog"):
        low = rng.uniform(0.1, 0.3)
        cap["visibility"] = _knots((0.0, 1.0), (fog_in, low), (gone, low), (clear, 1.0))
    return Episode(clear, cap=cap)


def episode_rare_onset(rng: np.random.Generator) -> Episode:
    """After a normal stretch, temperature accelerates (quadratic) to a plateau, then cools."""
    accel = rng.uniform(1.5, 2.5)  # degC/s^2
    amp = rng.uniform(30.0, 40.0)
    tau = np.sqrt(amp / accel)
    ts = np.linspace(0.0, tau, 40)
    hold = tau + rng.uniform(2.0, 4.0)
    end = hold + amp / rng.uniform(2.5, 3.5)
    kt = np.concatenate([ts, [hold, end]])
    kv = np.concatenate([accel * ts**2, [amp, 0.0]])
    return Episode(float(end), add={"temperature": (kt, kv)})


EPISODES: dict[str, Callable[[np.random.Generator], Episode]] = {
    "overheat": episode_overheat,
    "recovery": episode_recovery,
    "late_current_change": episode_late_current_change,
    "overload": episode_overload,
    "fog_obstacle": episode_fog_obstacle,
    "rare_onset": episode_rare_onset,
}


# --------------------------------------------------------------------------- scenarios

@dataclass(frozen=True)
class Scenario:
    """Which episodes each independent track plays, with nominal gaps between them.

    Tracks own disjoint channels (thermal: temperature/current, mechanical:
    vibration/load, perception: distance/visibility), so tracks overlap freely in time.
    """

    description: str
    tracks: tuple[tuple[tuple[str, float], ...], ...] = ()
    gap_s: tuple[float, float] = (4.0, 12.0)
    dropouts_per_s: float = 0.0


SCENARIOS: dict[str, Scenario] = {
    "nominal": Scenario("normal operation: drift, noise, stops, payload and door events"),
    "overheat": Scenario("temperature climbs while current stays flat",
                         ((("overheat", 1.0),),)),
    "overload": Scenario("heavy payload with vibration climbing past 5-7 mm/s",
                         ((("overload", 1.0),),)),
    "fog_obstacle": Scenario("visibility drops while an object closes in",
                             ((("fog_obstacle", 1.0),),)),
    "recovery": Scenario("work heats the motor, then temperature falls back from high",
                         ((("recovery", 1.0),),)),
    "late_current_change": Scenario("sudden current steps up or down",
                                    ((("late_current_change", 1.0),),)),
    "rare_onset": Scenario("long normal stretches, then an accelerating temperature onset",
                           ((("rare_onset", 1.0),),), gap_s=(10.0, 25.0)),
    "mixed": Scenario(
        "all episodes on three overlapping tracks, sensor noise and NaN dropout bursts",
        ((("overheat", 0.3), ("recovery", 0.25), ("late_current_change", 0.3),
          ("rare_onset", 0.15)),
         (("overload", 1.0),),
         (("fog_obstacle", 1.0),)),
        gap_s=(4.0, 20.0), dropouts_per_s=1.0 / 15.0),
}
"""Registry of stream scenarios by name; ``mixed`` is the demo's default."""


def _scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; expected one of {sorted(SCENARIOS)}") \
            from None


def _baseline(times: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Nominal levels with slow sinusoidal drift (periods >= 60 s), (T, F)."""
    levels = nominal_levels(1, rng)[0]
    amp = {"temperature": 1.0, "current": 0.3, "vibration": 0.2, "distance": 0.8,
           "visibility": 0.04, "load": 0.0, "motion": 0.0}
    out = np.empty((times.size, len(SIGNALS)))
    for name, col in CH.items():
        period = rng.uniform(60.0, 180.0)
        phase = rng.uniform(0.0, 2 * np.pi)
        out[:, col] = levels[col] + amp[name] * np.sin(2 * np.pi * times / period + phase)
    out[:, CH["distance"]] = np.minimum(out[:, CH["distance"]], 9.8)
    return out


def _operational(times: np.ndarray, clean: np.ndarray, rng: np.random.Generator,
                 events: list[tuple[float, str]]) -> None:
    """Add robot stops, small payload changes and door events (nuisance) in place."""
    duration = times[-1] if times.size else 0.0
    speed = clean[:, CH["motion"]].copy()
    t = rng.uniform(5.0, 30.0)
    while t < duration:  # stops: decelerate 1 s, stand 2-6 s, accelerate 1 s
        stand = rng.uniform(2.0, 6.0)
        kt, kv = _knots((0.0, 1.0), (1.0, 0.0), (1.0 + stand, 0.0), (2.0 + stand, 1.0))
        cover, factor = render_knots(times, t, kt, kv)
        speed[cover] *= factor
        t += 2.0 + stand + rng.uniform(15.0, 60.0)
    clean[:, CH["motion"]] = speed
    t = rng.uniform(10.0, 60.0)
    offset = 0.0
    while t < duration:  # small payload changes, pulled back towards the nominal load
        sign = -np.sign(offset) if abs(offset) > 5.0 else rng.choice([-1.0, 1.0])
        delta = rng.uniform(2.0, 6.0) * sign
        offset += delta
        cover = slice(int(np.searchsorted(times, t)), None)
        kt, kv = _knots((0.0, 0.0), (0.5, delta))
        clean[cover, CH["load"]] += np.interp(times[cover] - t, kt, kv)
        events.append((float(t), "payload_change"))
        t += rng.uniform(30.0, 90.0)
    t = rng.uniform(5.0, 40.0)
    while t < duration:
        events.append((float(t), "door_open"))
        events.append((float(t + rng.uniform(3.0, 10.0)), "door_close"))
        t += rng.uniform(20.0, 60.0)


def _play_track(times: np.ndarray, clean: np.ndarray, choices: tuple[tuple[str, float], ...],
                gap_s: tuple[float, float], rng: np.random.Generator,
                events: list[tuple[float, str]]) -> None:
    """Place episodes one after another with nominal gaps and render them into ``clean``."""
    names = [c[0] for c in choices]
    weights = np.array([c[1] for c in choices], dtype=np.float64)
    weights /= weights.sum()
    duration = times[-1] if times.size else 0.0
    t = rng.uniform(max(gap_s[0], SPAN_S + 0.5), gap_s[1])
    while t < duration:
        episode = EPISODES[names[int(rng.choice(len(names), p=weights))]](rng)
        for name, (kt, kv) in episode.add.items():
            cover, vals = render_knots(times, t, kt, kv)
            clean[cover, CH[name]] += vals
        for name, (kt, kv) in episode.cap.items():
            cover, vals = render_knots(times, t, kt, kv)
            clean[cover, CH[name]] = np.minimum(clean[cover, CH[name]], vals)
        events.extend((float(t + dt), name) for dt, name in episode.events)
        t += episode.duration_s + rng.uniform(*gap_s)


def _crossings(times: np.ndarray, x: np.ndarray, on: float, off: float, rising: bool,
               names: tuple[str, str]) -> list[tuple[float, str]]:
    """Hysteresis events: ``names[0]`` when x passes ``on``, ``names[1]`` when back past off."""
    high = x >= on if rising else x <= on
    low = x < off if rising else x > off
    code = np.where(high, 2, np.where(low, 0, 1))
    out: list[tuple[float, str]] = []
    active = bool(high[0]) if x.size else False
    for i in np.flatnonzero(np.diff(code)) + 1:
        if not active and code[i] == 2:
            active = True
            out.append((float(times[i]), names[0]))
        elif active and code[i] == 0:
            active = False
            out.append((float(times[i]), names[1]))
    return out


def _threshold_events(times: np.ndarray, clean: np.ndarray) -> list[tuple[float, str]]:
    """All rule-derived threshold events of a clean stream (see module docstring)."""
    out = _crossings(times, clean[:, CH["temperature"]], 65.0, 60.0, True,
                     ("temperature_high", "temperature_normal"))
    out += _crossings(times, clean[:, CH["vibration"]], 7.0, 5.0, True,
                      ("vibration_high", "vibration_normal"))
    out += _crossings(times, clean[:, CH["visibility"]], 0.5, 0.7, False,
                      ("visibility_low", "visibility_restored"))
    out += _crossings(times, clean[:, CH["distance"]], 1.5, 3.0, False,
                      ("obstacle_near", "obstacle_clear"))
    out += _crossings(times, clean[:, CH["motion"]], 0.05, 0.1, False,
                      ("robot_stop", "robot_start"))
    return out


def _dropouts(values: np.ndarray, rate_hz: float, per_s: float,
              rng: np.random.Generator) -> None:
    """Blank random channels with NaN for 0.3-1.5 s bursts (Poisson in time), in place."""
    n = values.shape[0]
    count = rng.poisson(per_s * n / rate_hz)
    for _ in range(count):
        start = int(rng.integers(0, max(n, 1)))
        length = int(round(rng.uniform(0.3, 1.5) * rate_hz))
        values[start:start + length, int(rng.integers(0, len(SIGNALS)))] = np.nan


MAX_FRAMES = 50_000_000
"""Most frames one simulated stream may hold (~20 GB of float64 working arrays): a typo'd
duration or rate gets a message instead of a memory error minutes later."""


def simulate_stream(scenario: str, duration_s: float, rate_hz: float,
                    rng: np.random.Generator) -> tuple[SignalStream, np.ndarray]:
    """Like ``generate_stream`` but also return the clean (T, F) signal the labels come from."""
    spec = _scenario(scenario)
    if not (duration_s > 0 and rate_hz > 0):  # NaN fails too
        raise ValueError(f"duration_s and rate_hz must be > 0, got {duration_s}, {rate_hz}")
    frames = duration_s * rate_hz
    if not 1 <= frames <= MAX_FRAMES:
        raise ValueError(f"{duration_s:g} s at {rate_hz:g} Hz is {frames:.3g} frames; a "
                         f"simulated stream holds 1 to {MAX_FRAMES:.0e} (a day at 100 Hz is "
                         f"8.6e+06)")
    n = int(round(frames))
    times = np.arange(n, dtype=np.float64) / rate_hz
    events: list[tuple[float, str]] = []
    clean = _baseline(times, rng)
    _operational(times, clean, rng, events)
    for track in spec.tracks:
        _play_track(times, clean, track, spec.gap_s, rng, events)
    clean = clip_physical(clean)
    labels = frame_labels(clean, rate_hz)
    events += _threshold_events(times, clean)
    events = sorted(e for e in events if e[0] < duration_s)
    values = clip_physical(clean + sensor_noise(clean.shape, rng))
    if spec.dropouts_per_s > 0:
        _dropouts(values, rate_hz, spec.dropouts_per_s, rng)
    stream = SignalStream(rate_hz=float(rate_hz), values=values.astype(np.float32),
                          labels=labels, events=events, scenario=scenario)
    return stream, clean.astype(np.float32)


def generate_stream(scenario: str, duration_s: float, rate_hz: float,
                    rng: np.random.Generator) -> SignalStream:
    """Render ``duration_s`` seconds of ``scenario`` at ``rate_hz`` with rule labels."""
    return simulate_stream(scenario, duration_s, rate_hz, rng)[0]


# --------------------------------------------------------------------------- windows

def stream_group(stream: SignalStream) -> int:
    """Return a stable id for a stream (CRC32 of its values) so splits keep it together."""
    return int(zlib.crc32(np.ascontiguousarray(stream.values).tobytes()) & 0x7FFFFFFF)


def stream_windows(stream: SignalStream, window: int, stride: int = 1,
                   max_events: int = 8, group: int | None = None) -> SituationSet:
    """Cut ``stream`` into windows ending at each frame t >= window-1 (every ``stride``).

    Labels are those of the window's last frame; NaN becomes value 0 with mask 0.
    ``events`` holds the last ``max_events`` event ids at or before the last frame.
    """
    if window < 1 or stride < 1 or max_events < 1:
        raise ValueError(f"window, stride, max_events must be >= 1, got "
                         f"{window}, {stride}, {max_events}")
    values = np.asarray(stream.values, dtype=np.float32)
    if values.shape[0] < window:
        raise ValueError(f"stream has {values.shape[0]} frames, fewer than window={window}")
    ends = np.arange(window - 1, values.shape[0], stride)
    view = np.lib.stride_tricks.sliding_window_view(values, window, axis=0)  # (T-K+1, F, K)
    signals = np.transpose(view[ends - window + 1], (0, 2, 1))
    mask = np.isfinite(signals).astype(np.float32)
    signals = np.where(mask > 0, signals, 0.0).astype(np.float32)
    vocab = EVENT_VOCABULARY + tuple(sorted({n for _, n in stream.events}
                                            - set(EVENT_VOCABULARY)))
    event_ids = np.array([vocab.index(n) + 1 for _, n in stream.events], dtype=np.int64)
    event_times = np.array([t for t, _ in stream.events], dtype=np.float64)
    # an event at time s belongs to frame ceil(s * rate): the first frame at or after it
    seen = np.searchsorted(event_times, ends / stream.rate_hz, side="right")
    events = np.zeros((ends.size, max_events), dtype=np.int64)
    for j in range(max_events):
        pos = seen - max_events + j
        ok = pos >= 0
        events[ok, j] = event_ids[pos[ok]]
    gid = stream_group(stream) if group is None else int(group)
    return SituationSet(
        signals=signals, labels=stream.labels[ends], mask=mask, events=events,
        groups=np.full(ends.size, gid, dtype=np.int64), label_names=stream.label_names,
        signal_names=stream.signal_names, event_vocabulary=vocab,
        meta={"family": "stream", "scenario": stream.scenario, "rate_hz": stream.rate_hz,
              "end_frames": ends})


def resample_stream(stream: SignalStream, rate_hz: float) -> SignalStream:
    """Keep every n-th frame so a fast stream matches a slower policy rate.

    Labels stay valid because the rule table is stated in seconds, not frames.
    """
    step = stream.rate_hz / rate_hz
    if step < 1 or abs(step - round(step)) > 1e-9:
        raise ValueError(f"rate_hz={rate_hz} must divide the stream rate {stream.rate_hz}")
    k = int(round(step))
    return SignalStream(rate_hz=float(rate_hz), values=stream.values[::k],
                        labels=stream.labels[::k], events=list(stream.events),
                        label_names=stream.label_names, signal_names=stream.signal_names,
                        scenario=stream.scenario)
