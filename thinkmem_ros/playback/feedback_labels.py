"""Labels from recorded hindsight: the ``/thinking/feedback`` a robot received, as training labels.

A rules file says what each label means before any model is trained. A robot that already
ran with a judge (an operator, an LLM, the demo's oracle) has something better recorded in
its bag: on ``/thinking/feedback`` the judge said, activation by activation, which thinking
each situation needed (``{"stamp": s, "required": [labels], "reward": r}``, a
``std_msgs/String``). This module turns that hindsight into labels on the frames of
:func:`thinkmem_ros.playback.recording.read_recording`, so ``thinkmem train --labels
feedback`` can train a bundle from it.

Parsing is the node's own (:func:`thinkmem_ros.robot.experience_builder.parse_feedback`):
the recording holds whatever any publisher sent, so a malformed message (not JSON, a
missing or wrong-typed field, an undecodable message) is counted under its reason and
skipped, never fatal. A feedback with ``required: null`` (a reward only) says nothing about
labels and is counted as ``reward_only``; ``required: []`` is a real answer (the situation
needed none of the labels) and labels its frame all-negative.

Alignment. Frame k of a recording sits at ``k / rate`` seconds after the bag's first
message. A feedback's ``stamp`` is the stamp of the activation it judges, which the node
sets to its frame's time on the node's ROS clock; it is matched to the frame nearest in
time within half a frame period (the node's rule, ``ExperienceBuilder``). Which clock the
stamps are on is decided once per bag, not per message (``clock="auto"``):

- ``stamp``: at least half of the labelling feedbacks have stamps inside the bag's span
  (give or take half a frame period). A robot recording itself live stamps activations
  and records messages with the same system clock, so this is the usual case and it is
  exact up to the node's tick phase. A stamp outside the span then judges a situation the
  bag does not hold (an activation from before the recorder started) and is counted as
  ``outside_bag``, never moved onto a frame it is not about.
- ``record``: most stamps are outside the span, so the node ran on another clock than the
  recorder (``use_sim_time`` with a simulator or a replayed ``--clock``, a node clock
  started at 0). The stamps cannot be placed on the bag's time line, and the message's
  record time is the only time the bag offers: the feedback labels the latest frame at or
  before its arrival (feedback never comes before its frame). This is late by the judge's
  latency (milliseconds for the demo's oracle, seconds for an LLM), so the report says
  how many feedbacks were placed this way and the CLI warns.

Deciding per bag keeps one stray message from being relocated by the other rule. The
choice can be forced with ``FeedbackConfig.clock``.

Several feedbacks on one frame merge as the node merges them: their ``required`` labels
are united. Frames that received no feedback are *unlabelled*, not negative: their label
row is NaN and no training window ends there (:func:`labelled_ends`), and held-out scoring
counts labelled frames only (:func:`score_labelled`). Label names are the union of every
``required`` list over all bags, sorted (so the bundle's label order does not depend on
which bag or message came first), optionally restricted to the names the user gives.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from thinkmem_ros.core.data import SignalStream
from thinkmem_ros.playback.bag_files import BagError, check_bag_path, some_topics
from thinkmem_ros.playback.recording import _messages, score_recording
from thinkmem_ros.robot.experience_builder import FeedbackError, parse_feedback

FEEDBACK_TOPIC = "/thinking/feedback"
"""The topic the demo's oracle publishes and the node listens to (absolute form)."""

FEEDBACK_TYPE = "std_msgs/msg/String"
CLOCKS = ("auto", "stamp", "record")
MIN_LABELLED_FRAMES = 20
"""Fewest labelled training windows ``thinkmem train --labels feedback`` accepts: below it
a validation split and a few optimiser steps have nothing to learn from."""


class FeedbackLabelError(ValueError):
    """The recorded feedback cannot label a recording; the message says why, in one line."""


@dataclass
class FeedbackConfig:
    """Where the hindsight is recorded, which labels to keep and which clock its stamps use."""

    topic: str = FEEDBACK_TOPIC
    labels: tuple[str, ...] | None = None  # None = every label the feedback names
    clock: str = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str) or not self.topic.strip("/"):
            raise ValueError(f"the feedback topic must be a topic name, got {self.topic!r}")
        if not self.topic.startswith("/"):
            self.topic = "/" + self.topic
        if self.labels is not None:
            self.labels = tuple(self.labels)
            if not self.labels or not all(isinstance(n, str) and n for n in self.labels):
                raise ValueError(f"the feedback labels must be non-empty names, "
                                 f"got {self.labels!r}")
        if self.clock not in CLOCKS:
            raise ValueError(f"the feedback clock must be one of {CLOCKS}, "
                             f"got {self.clock!r}")


@dataclass(frozen=True)
class FeedbackRecord:
    """One parsed feedback that carries labels: its stamp and when the bag recorded it."""

    stamp_s: float  # the activation's stamp, node clock, seconds
    record_s: float  # record time, seconds after the bag's first message
    required: tuple[str, ...]


@dataclass
class FeedbackReport:
    """What was found on the feedback topic of one bag and what became of it."""

    bag: str
    messages: int = 0
    malformed: Counter = field(default_factory=Counter)  # reason -> messages skipped
    reward_only: int = 0
    clock: str = ""
    matched: int = 0
    outside_bag: int = 0
    labelled_frames: int = 0
    first_error: str = ""

    @property
    def skipped(self) -> int:
        """Messages that could not be parsed at all."""
        return sum(self.malformed.values())

    def line(self) -> str:
        """One line for the CLI: counts and the clock used."""
        bad = ", ".join(f"{n} {reason}" for reason, n in sorted(self.malformed.items()))
        text = (f"{self.bag}: {self.messages} feedback message(s), {self.matched} matched "
                f"to {self.labelled_frames} frame(s) by {self.clock or '-'} time; "
                f"{self.skipped} malformed skipped{f' ({bad})' if bad else ''}, "
                f"{self.reward_only} reward-only, {self.outside_bag} outside the bag")
        return text + (f"; first malformed: {self.first_error}" if self.first_error else "")


@dataclass
class BagFeedback:
    """The labelling feedback of one bag, with the bag's span (its own clock, ns)."""

    records: list[FeedbackRecord]
    start_ns: int
    end_ns: int
    report: FeedbackReport


def _reason(exc: FeedbackError) -> str:
    """A short, countable reason: the field named, or the kind of JSON problem."""
    text = str(exc)
    head, _, rest = text.partition(":")
    if head != "feedback":
        return head.removeprefix("feedback.")
    rest = rest.strip()
    for kind in ("not JSON", "unknown keys", "expected an object", "carries neither"):
        if rest.startswith(kind):
            return {"carries neither": "no required or reward"}.get(kind, kind)
    return "too long" if "exceed" in rest else "other"


def read_feedback(path: Path | str, config: FeedbackConfig | None = None) -> BagFeedback:
    """Parse every message on the feedback topic of a bag (rosbag2 folder or ROS 1 .bag).

    Raises FeedbackLabelError when the topic is not in the bag or is not
    ``std_msgs/String``, BagError when the bag cannot be read; malformed messages are
    counted in the report, never raised.
    """
    config = config or FeedbackConfig()
    path = check_bag_path(path)
    if not path.exists():
        raise BagError(f"bag not found: {path}")
    messages, types, start_ns, end_ns = _messages(path, {config.topic})
    if config.topic not in types:
        raise FeedbackLabelError(f"{path}: feedback topic {config.topic!r} is not in the bag; "
                                 f"it has {some_topics(types)} (set --feedback-topic)")
    if types[config.topic] != FEEDBACK_TYPE:
        raise FeedbackLabelError(f"{path}: {config.topic!r} is recorded as "
                                 f"{types[config.topic]!r}, feedback is {FEEDBACK_TYPE!r}")
    report = FeedbackReport(bag=str(path))
    records: list[FeedbackRecord] = []
    for _, _, t_ns, msg in messages:
        report.messages += 1
        text = getattr(msg, "data", None)
        try:
            if msg is None:
                raise FeedbackError("undecodable: the message could not be deserialised")
            feedback = parse_feedback(text)
        except FeedbackError as exc:
            report.malformed[_reason(exc)] += 1
            report.first_error = report.first_error or str(exc)[:120]
            continue
        if feedback.required is None:
            report.reward_only += 1
            continue
        records.append(FeedbackRecord(feedback.stamp, (t_ns - start_ns) / 1e9,
                                      feedback.required))
    return BagFeedback(records, start_ns, end_ns, report)


def feedback_label_names(bags: list[BagFeedback],
                         only: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """Sorted union of the labels the feedback requires, or ``only`` (each must occur)."""
    seen = sorted({name for bag in bags for r in bag.records for name in r.required})
    if only is None:
        return tuple(seen)
    missing = [name for name in only if name not in seen]
    if missing:
        raise FeedbackLabelError(f"labels {missing} never appear in the feedback; it names "
                                 f"{seen}")
    return tuple(dict.fromkeys(only))


def choose_clock(bag: BagFeedback, rate_hz: float) -> str:
    """'stamp' when at least half of the stamps fall in the bag's span, else 'record'."""
    if not bag.records:
        return "stamp"
    half = 0.5 / rate_hz
    lo, hi = bag.start_ns / 1e9 - half, bag.end_ns / 1e9 + half
    inside = sum(lo <= r.stamp_s <= hi for r in bag.records)
    return "stamp" if 2 * inside >= len(bag.records) else "record"


def align_feedback(bag: BagFeedback, frames: int, rate_hz: float,
                   label_names: tuple[str, ...], clock: str = "auto") -> np.ndarray:
    """(frames, L) float32 labels: 1/0 on frames with feedback, NaN on frames without.

    ``stamp`` clock: the frame nearest the stamp within half a frame period; ``record``
    clock: the latest frame at or before the record time (module docstring). Fills the
    report's ``clock``, ``matched``, ``outside_bag`` and ``labelled_frames``.
    """
    if frames < 1 or not (math.isfinite(rate_hz) and rate_hz > 0):
        raise ValueError(f"frames must be >= 1 and rate_hz > 0, got {frames}, {rate_hz!r}")
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
    clock = choose_clock(bag, rate_hz) if clock == "auto" else clock
    index = {name: j for j, name in enumerate(label_names)}
    merged: dict[int, dict[str, None]] = {}
    report = bag.report
    report.clock, report.matched, report.outside_bag = clock, 0, 0
    for record in bag.records:
        if clock == "stamp":
            t = (round(record.stamp_s * 1e9) - bag.start_ns) / 1e9
            k = math.floor(t * rate_hz + 0.5)  # nearest frame: within half a period
        else:
            k = math.floor(record.record_s * rate_hz + 1e-6)  # latest frame at or before
        if not 0 <= k < frames:
            report.outside_bag += 1
            continue
        report.matched += 1
        merged.setdefault(k, {}).update(dict.fromkeys(record.required))  # the node's union
    labels = np.full((frames, len(label_names)), np.nan, dtype=np.float32)
    for k, required in merged.items():
        labels[k] = 0.0
        for name in required:
            if name in index:
                labels[k, index[name]] = 1.0
    report.labelled_frames = len(merged)
    return labels


def with_labels(stream: SignalStream, labels: np.ndarray,
                label_names: tuple[str, ...]) -> SignalStream:
    """``stream`` with its label rows replaced (NaN rows = unlabelled frames)."""
    if labels.shape != (stream.values.shape[0], len(label_names)):
        raise ValueError(f"labels {labels.shape} do not fit {stream.values.shape[0]} frames "
                         f"x {len(label_names)} labels")
    return SignalStream(rate_hz=stream.rate_hz, values=stream.values, labels=labels,
                        events=list(stream.events), label_names=tuple(label_names),
                        signal_names=stream.signal_names, scenario=stream.scenario)


def labelled_ends(stream: SignalStream, window: int) -> np.ndarray:
    """Frames with feedback where a full window ends (t >= window - 1): the training rows."""
    labelled = np.isfinite(np.asarray(stream.labels)).all(axis=1)
    if stream.labels.shape[1] == 0:
        labelled = np.zeros(stream.values.shape[0], dtype=bool)
    labelled[:max(0, window - 1)] = False
    return np.flatnonzero(labelled)


def score_labelled(bundle, stream: SignalStream, *, stale_after_s: float = 0.5) -> dict:
    """Play ``stream`` into ``bundle`` the node's way; score only the frames with feedback."""
    return score_recording(bundle, stream, stale_after_s=stale_after_s, labelled_only=True)


class HindsightLabels:
    """Feedback of several bags read up front, so every bag is labelled with one label set.

    The CLI reads all bags' feedback first (the label names are the union over all of
    them), then labels each bag's resampled stream with :meth:`label` as it reads it.
    """

    def __init__(self, bags: list[Path | str], config: FeedbackConfig | None = None) -> None:
        self.config = config or FeedbackConfig()
        self.bags = [read_feedback(bag, self.config) for bag in bags]
        for bag in self.bags:
            if not bag.records:
                r = bag.report
                first = f"; first malformed: {r.first_error}" if r.first_error else ""
                raise FeedbackLabelError(
                    f"{r.bag}: no feedback with labels on {self.config.topic!r} "
                    f"({r.messages} message(s): {r.skipped} malformed, {r.reward_only} "
                    f"reward-only){first}")
        self.label_names = feedback_label_names(self.bags, self.config.labels)

    def label(self, stream: SignalStream, index: int) -> SignalStream:
        """Bag ``index``'s stream labelled by its feedback (NaN rows where it has none)."""
        bag = self.bags[index]
        labels = align_feedback(bag, stream.values.shape[0], stream.rate_hz,
                                self.label_names, self.config.clock)
        if not bag.report.matched:
            raise FeedbackLabelError(f"{bag.report.line()}: no feedback falls on a frame")
        return with_labels(stream, labels, self.label_names)

    def report_lines(self) -> list[str]:
        """One line per bag, plus a warning per bag labelled by record time."""
        lines = []
        for bag in self.bags:
            lines.append(bag.report.line())
            if bag.report.clock == "record":
                lines.append(f"WARN {bag.report.bag}: the feedback stamps are not on the "
                             f"bag's clock (sim time?); frames were labelled by record "
                             f"time, late by the judge's latency")
        return lines

    @staticmethod
    def check(rows: int, groups: int, window: int) -> None:
        """FeedbackLabelError unless enough labelled windows in >= 2 groups remain."""
        if rows < MIN_LABELLED_FRAMES or groups < 2:
            raise FeedbackLabelError(
                f"too few labelled frames to train: {rows} frame(s) with feedback after "
                f"the first full window (--window {window}) in the training part, over "
                f"{groups} stretch(es) of the recording; need at least {MIN_LABELLED_FRAMES} "
                f"in at least 2 stretches")
