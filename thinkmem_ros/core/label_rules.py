"""Labelling rules written in YAML: threshold, trend and co-occurrence over a signal stream.

A robot's own recordings carry no ground-truth thinking, so a user states what each label
means in a small rules file, the way the synthetic world labels its streams in code::

    labels:
      turning:                       # |yaw rate| above 0.08 rad/s, and 1 s after it
        threshold: {signal: yaw_rate, above: 0.08, absolute: true, hold_s: 1.0}
      slowing_down:                  # least-squares slope of speed over the last 2 s
        trend: {signal: speed, window_s: 2.0, slope_below: -0.08}
      rough_turn:                    # both labels seen within the last 3 s
        co_occurrence: {all: [turning, rough_ground], within_s: 3.0}

Every rule is causal (frame t looks only at frames <= t), so the label of a window is
decided by what the window's policy could have seen. Times are in seconds and converted
at the stream's frame rate, so the same file labels a recording resampled at any rate.
NaN (a missing sample) never satisfies a condition: a threshold on a dropped frame is 0,
and a trend needs at least half of its window observed.

Parsing is strict: an unknown key, a rule of two kinds, an unknown signal or a
co-occurrence naming a label not defined above it raises a ValueError naming
``labels.<label>.<kind>.<key>``, so a typo cannot silently produce an all-zero label.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

RULE_KINDS: tuple[str, ...] = ("threshold", "trend", "co_occurrence")
THRESHOLD_KEYS = frozenset({"signal", "above", "below", "absolute", "hold_s"})
TREND_KEYS = frozenset({"signal", "window_s", "slope_above", "slope_below"})
CO_OCCURRENCE_KEYS = frozenset({"all", "within_s"})
TOP_KEYS = frozenset({"labels", "description"})
MAX_RULES_BYTES = 256 * 1024
"""A rules file larger than this is refused before parsing (real ones are a few lines)."""
MAX_SECONDS = 7 * 24 * 3600.0
"""Largest ``hold_s``, ``window_s`` or ``within_s``: a week, far past any recording's
situations; beyond it a hold keeps a label on for the whole recording (1e300 did)."""


class RulesError(ValueError):
    """A rules file that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class ThresholdRule:
    """Positive while ``signal`` (optionally its absolute value) is above/below a level.

    ``hold_s`` keeps the label on for that long after the condition was last true: a
    turn just finished is still worth thinking about, and the policy has to remember it.
    """

    signal: str
    above: float | None = None
    below: float | None = None
    absolute: bool = False
    hold_s: float = 0.0

    def __post_init__(self) -> None:
        if (self.above is None) == (self.below is None):
            raise ValueError("a threshold rule takes exactly one of 'above' or 'below'")
        if not math.isfinite(self.hold_s) or self.hold_s < 0:
            raise ValueError(f"hold_s must be a finite number >= 0, got {self.hold_s!r}")
        if self.hold_s > MAX_SECONDS:
            raise ValueError(f"hold_s must be at most {MAX_SECONDS:g} s (a week), "
                             f"got {self.hold_s!r}")

    def signals(self) -> tuple[str, ...]:
        """Signals this rule reads."""
        return (self.signal,)

    def apply(self, values: dict[str, np.ndarray], done: dict[str, np.ndarray],
              rate_hz: float) -> np.ndarray:
        """(T,) bool: the condition at each frame, held for ``hold_s``."""
        x = values[self.signal]
        x = np.abs(x) if self.absolute else x
        with np.errstate(invalid="ignore"):
            on = x > self.above if self.above is not None else x < self.below
        return _hold(on & np.isfinite(x), _frames(self.hold_s, rate_hz))


@dataclass(frozen=True)
class TrendRule:
    """Positive while the least-squares slope (units per second) over ``window_s`` is past a level.

    Only the frames inside the window count; the label is 0 until the stream has a full
    window and whenever fewer than half of the window's frames were observed.
    """

    signal: str
    window_s: float
    slope_above: float | None = None
    slope_below: float | None = None

    def __post_init__(self) -> None:
        if (self.slope_above is None) == (self.slope_below is None):
            raise ValueError("a trend rule takes exactly one of 'slope_above' or 'slope_below'")
        if not math.isfinite(self.window_s) or self.window_s <= 0:
            raise ValueError(f"window_s must be a finite number > 0, got {self.window_s!r}")
        if self.window_s > MAX_SECONDS:
            raise ValueError(f"window_s must be at most {MAX_SECONDS:g} s (a week), "
                             f"got {self.window_s!r}")

    def signals(self) -> tuple[str, ...]:
        """Signals this rule reads."""
        return (self.signal,)

    def apply(self, values: dict[str, np.ndarray], done: dict[str, np.ndarray],
              rate_hz: float) -> np.ndarray:
        """(T,) bool: the slope condition at each frame."""
        slope = trend_slope(values[self.signal], max(2, _frames(self.window_s, rate_hz) + 1),
                            rate_hz)
        with np.errstate(invalid="ignore"):
            on = slope > self.slope_above if self.slope_above is not None \
                else slope < self.slope_below
        return on & np.isfinite(slope)


@dataclass(frozen=True)
class CoOccurrenceRule:
    """Positive when every label in ``all`` was positive at some frame in the last ``within_s``."""

    all: tuple[str, ...]
    within_s: float = 0.0

    def __post_init__(self) -> None:
        if len(self.all) < 2:
            raise ValueError(f"'all' must name at least 2 labels, got {list(self.all)}")
        repeated = sorted({n for n in self.all if self.all.count(n) > 1})
        if repeated:
            raise ValueError(f"'all' names {repeated} more than once; it must name at least "
                             f"2 different labels, got {list(self.all)}")
        if not math.isfinite(self.within_s) or self.within_s < 0:
            raise ValueError(f"within_s must be a finite number >= 0, got {self.within_s!r}")
        if self.within_s > MAX_SECONDS:
            raise ValueError(f"within_s must be at most {MAX_SECONDS:g} s (a week), "
                             f"got {self.within_s!r}")

    def signals(self) -> tuple[str, ...]:
        """Signals this rule reads (none: it reads labels)."""
        return ()

    def apply(self, values: dict[str, np.ndarray], done: dict[str, np.ndarray],
              rate_hz: float) -> np.ndarray:
        """(T,) bool: all named labels seen within the window."""
        hold = _frames(self.within_s, rate_hz)
        out = np.ones_like(done[self.all[0]], dtype=bool)
        for name in self.all:
            out &= _hold(done[name], hold)
        return out


Rule = ThresholdRule | TrendRule | CoOccurrenceRule


@dataclass(frozen=True)
class LabelRules:
    """An ordered set of named rules; ``apply`` turns frames into per-frame labels."""

    rules: tuple[tuple[str, Rule], ...]
    source: str = "rules"

    def __post_init__(self) -> None:
        if not self.rules:
            raise ValueError(f"{self.source}: no labels defined")

    @property
    def label_names(self) -> tuple[str, ...]:
        """Label names in file order (the bundle's output order)."""
        return tuple(name for name, _ in self.rules)

    @property
    def signals(self) -> tuple[str, ...]:
        """Every signal some rule reads, in first-use order."""
        seen: dict[str, None] = {}
        for _, rule in self.rules:
            seen.update(dict.fromkeys(rule.signals()))
        return tuple(seen)

    def check_signals(self, signal_names: tuple[str, ...] | list[str]) -> None:
        """Raise RulesError naming a rule whose signal is not among ``signal_names``."""
        for name, rule in self.rules:
            for signal in rule.signals():
                if signal not in signal_names:
                    raise RulesError(
                        f"{self.source}: labels.{name}: unknown signal {signal!r}; the "
                        f"recording has {list(signal_names)}")

    def apply(self, values: np.ndarray, signal_names: tuple[str, ...] | list[str],
              rate_hz: float) -> np.ndarray:
        """(T, L) float32 labels in {0, 1} for frames ``values`` (T, F) at ``rate_hz``."""
        values = np.asarray(values, dtype=np.float64)
        if values.ndim != 2 or values.shape[1] != len(signal_names):
            raise ValueError(f"values must be (T, {len(signal_names)}), got {values.shape}")
        if not math.isfinite(rate_hz) or rate_hz <= 0:
            raise ValueError(f"rate_hz must be a finite number > 0, got {rate_hz!r}")
        self.check_signals(signal_names)
        columns = {name: values[:, i] for i, name in enumerate(signal_names)}
        done: dict[str, np.ndarray] = {}
        for name, rule in self.rules:
            done[name] = rule.apply(columns, done, rate_hz)
        return np.stack([done[name] for name in self.label_names], axis=1).astype(np.float32)


def trend_slope(x: np.ndarray, frames: int, rate_hz: float) -> np.ndarray:
    """Causal least-squares slope (units/s) over the last ``frames`` frames, NaN-aware.

    NaN where the stream has fewer than ``frames`` frames so far or fewer than half of
    them (and fewer than 2) are observed.
    """
    x = np.asarray(x, dtype=np.float64)
    t = x.shape[0]
    out = np.full(t, np.nan)
    if t < frames:
        return out
    view = np.lib.stride_tricks.sliding_window_view(x, frames)  # (T-frames+1, frames)
    seen = np.isfinite(view)
    n = seen.sum(1)
    time = np.arange(frames, dtype=np.float64) / rate_hz
    w = seen.astype(np.float64)
    safe_n = np.maximum(n, 1)
    tm = (w * time).sum(1) / safe_n
    xv = np.where(seen, view, 0.0)
    xm = xv.sum(1) / safe_n
    dt = (time[None, :] - tm[:, None]) * w
    denom = (dt ** 2).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = (dt * (xv - xm[:, None])).sum(1) / denom
    slope[(n < max(2, frames / 2)) | (denom <= 0)] = np.nan
    out[frames - 1:] = slope
    return out


def _frames(seconds: float, rate_hz: float) -> int:
    return int(round(seconds * rate_hz))


def _hold(on: np.ndarray, frames: int) -> np.ndarray:
    """True at t when ``on`` was true at any of frames t-frames..t (causal dilation)."""
    if frames <= 0:
        return on.copy()
    last = np.where(on, np.arange(on.size), -np.iinfo(np.int64).max // 2)
    last = np.maximum.accumulate(last)
    return np.arange(on.size) - last <= frames


# ------------------------------------------------------------------ parsing

def parse_rules(raw: Any, source: str = "rules",
                signal_names: tuple[str, ...] | list[str] | None = None) -> LabelRules:
    """Build LabelRules from parsed YAML; RulesError names ``labels.<label>.<kind>.<key>``.

    With ``signal_names`` the rules' signals are checked against them too.
    """
    if not isinstance(raw, dict):
        raise RulesError(f"{source}: expected a mapping with a 'labels' key")
    unknown = sorted(map(str, set(raw) - TOP_KEYS))
    if unknown:
        raise RulesError(f"{source}: unknown keys {unknown}; a rules file takes "
                         f"{sorted(TOP_KEYS)}")
    labels = raw.get("labels")
    if not isinstance(labels, dict) or not labels:
        raise RulesError(f"{source}: 'labels' must be a non-empty mapping label -> rule")
    rules: list[tuple[str, Rule]] = []
    for name, spec in labels.items():
        if not isinstance(name, str) or not name or not name.replace("_", "").isalnum():
            raise RulesError(f"{source}: label name {name!r} must be letters, digits and _")
        rules.append((name, _parse_rule(source, name, spec, [n for n, _ in rules])))
    try:
        out = LabelRules(tuple(rules), source=source)
    except ValueError as exc:
        raise RulesError(str(exc)) from None
    if signal_names is not None:
        out.check_signals(signal_names)
    return out


def load_rules(path: Path | str,
               signal_names: tuple[str, ...] | list[str] | None = None) -> LabelRules:
    """Read and parse a YAML rules file (RulesError naming the file on any problem)."""
    import yaml

    from thinkmem_ros.core.yaml_numbers import load_numbers_yaml

    path = Path(path)
    try:
        if path.stat().st_size > MAX_RULES_BYTES:
            raise RulesError(f"{path}: larger than {MAX_RULES_BYTES} bytes")
        raw = load_numbers_yaml(path.read_text(encoding="utf-8"), unique_keys=True)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise RulesError(f"{path}: cannot read rules: {' '.join(str(exc).split())}") from None
    except ValueError as exc:  # e.g. int() of an integer past Python's 4300-digit limit
        why = "a number has too many digits" if "integer string conversion" in str(exc) \
            else " ".join(str(exc).split())
        raise RulesError(f"{path}: cannot read rules: {why}") from None
    return parse_rules(raw, source=str(path), signal_names=signal_names)


_KEYS = {"threshold": THRESHOLD_KEYS, "trend": TREND_KEYS,
         "co_occurrence": CO_OCCURRENCE_KEYS}
_NUMBERS = {"above", "below", "hold_s", "window_s", "slope_above", "slope_below", "within_s"}
_SECONDS = {"hold_s", "window_s", "within_s"}


def _parse_rule(source: str, name: str, spec: Any, defined: list[str]) -> Rule:
    where = f"{source}: labels.{name}"
    if not isinstance(spec, dict) or len(spec) != 1:
        raise RulesError(f"{where} must be a mapping with exactly one of {list(RULE_KINDS)}, "
                         f"got {spec!r}")
    (kind, body), = spec.items()
    if kind not in RULE_KINDS:
        raise RulesError(f"{where}: unknown rule kind {kind!r}; expected one of "
                         f"{list(RULE_KINDS)}")
    where = f"{where}.{kind}"
    if not isinstance(body, dict):
        raise RulesError(f"{where} must be a mapping, got {body!r}")
    unknown = sorted(map(str, set(body) - _KEYS[kind]))
    if unknown:
        raise RulesError(f"{where}: unknown keys {unknown}; {kind} takes "
                         f"{sorted(_KEYS[kind])}")
    for key, value in body.items():
        if key in _NUMBERS and not _is_finite_number(value):
            raise RulesError(f"{where}.{key} must be a finite number, got {_short(value)}")
        if key in _SECONDS and value > MAX_SECONDS:
            raise RulesError(f"{where}.{key} must be at most {MAX_SECONDS:g} seconds (a week), "
                             f"got {value!r}")
        if key == "signal" and (not isinstance(value, str) or not value):
            raise RulesError(f"{where}.signal must be a signal name, got {value!r}")
        if key == "absolute" and not isinstance(value, bool):
            raise RulesError(f"{where}.absolute must be true or false, got {value!r}")
    if kind == "co_occurrence":
        names = body.get("all")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise RulesError(f"{where}.all must be a list of label names, got {names!r}")
        later = [n for n in names if n not in defined]
        if later:
            raise RulesError(f"{where}.all: {later} are not labels defined above {name!r} "
                             f"(defined: {defined})")
        body = {**body, "all": tuple(names)}
    if kind == "threshold" and body.get("absolute") is True:
        above, below = body.get("above"), body.get("below")
        if above is not None and above < 0:
            raise RulesError(f"{where}.above: with absolute: true every observed frame is "
                             f"above {above!r}, so the label is never off; a label needs "
                             "negatives to teach anything")
        if below is not None and below <= 0:
            raise RulesError(f"{where}.below: with absolute: true no frame is below "
                             f"{below!r}, so the label is never on")
    if "signal" not in body and kind != "co_occurrence":
        raise RulesError(f"{where}: missing 'signal'")
    if kind == "trend" and "window_s" not in body:
        raise RulesError(f"{where}: missing 'window_s'")
    cls = {"threshold": ThresholdRule, "trend": TrendRule,
           "co_occurrence": CoOccurrenceRule}[kind]
    try:
        return cls(**{k: (float(v) if k in _NUMBERS else v) for k, v in body.items()})
    except ValueError as exc:
        raise RulesError(f"{where}: {exc}") from None


def _is_finite_number(value: Any) -> bool:
    """True for a finite int or float; an integer too large for a float is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # math.isfinite of an integer past the float range
        return False


def _short(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, so a 400-digit number stays one line."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 1024:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
