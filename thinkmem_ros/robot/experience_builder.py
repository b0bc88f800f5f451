"""Turn the node's published frames and later feedback into shippable ``Experience`` records.

Why a builder between the node and the shipper: hindsight arrives *after* a frame. An
LLM, an operator or a ground-truth source says on ``/thinking/feedback`` which thinking
the situation needed (``required``, the g_i of direct material) and what the activated
thinking was worth (``reward``). So each frame waits in a small pending buffer for
``feedback_window_s`` (wall-clock, monotonic) before it becomes an ``Experience`` and is
handed to the sink (``ExperienceShipper.ship``).

Cost on the tick: ``add_frame`` is an O(1) append under a lock; the record is built
(arrays copied, names validated) in ``release``, which the node calls from its own
low-rate thread. Nothing here touches disk or network.

Feedback matching: a feedback's ``stamp`` names the activation it is about (the ``stamp``
of ``/thinking/activation``, node clock). It attaches to the pending frame with the nearest
stamp within half a frame period; feedback that arrives before its frame waits (up to
``feedback_window_s``) for it, at most ``max_early_feedback`` of it: beyond, the oldest
waiting one is dropped and counted as ``feedback_dropped``, so a flood of feedback stamped
in the future (a broken or hostile publisher) costs bounded memory and bounded matching
work per frame. Several feedbacks on one frame merge: ``required`` labels are
united (first-seen order), the latest non-null ``reward`` wins. Feedback for a frame that
was already released is counted as ``feedback_late``; feedback that never finds its frame
as ``feedback_unmatched``.

Shipping every n-th frame (``ship_every_n_frames``) thins the stream, but a frame that
received feedback is always shipped: hindsight is the scarce part.

Episode rule: a new episode starts at the first frame, when an ``episode_start`` event
arrives on the events topic, when frame stamps jump back (a restarted bag or sim clock)
or when they leave a gap longer than ``episode_gap_s`` (the node was stopped or paused).
Episode ids are ``<robot_id>.<boot_id>.<n>``; ``boot_id`` is the wall-clock seconds when
the builder was made and six random hex digits (``1796185737-3fa9c1``): unique across
restarts, and across processes started in the same second (two nodes launched together
under one robot_id must never merge into one episode at the consolidator). Each experience
carries its episode's event history up to its frame, oldest first, capped at the newest
``max_events`` names, which is what the consolidator's discovery reads; the
``episode_start`` marker itself is not recorded.
"""

from __future__ import annotations

import json
import logging
import math
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from thinkmem_ros.core.vocabulary import EPISODE_START_EVENT
from thinkmem_ros.link.experience import LIMITS, Experience, ExperienceError, valid_name
from thinkmem_ros.policy.bundle import unique_keys_object
from thinkmem_ros.robot.activation import FrameResult

log = logging.getLogger(__name__)

BOOT_ID_CHARS = 17
"""Length of a generated boot id: 10 digits of seconds, '-', 6 hex digits."""
MAX_EPISODE_N_DIGITS = 10
MAX_ROBOT_ID_CHARS = LIMITS["max_id"] - (1 + BOOT_ID_CHARS + 1 + MAX_EPISODE_N_DIGITS)
"""Longest robot id whose episode ids (``<robot_id>.<boot_id>.<n>``) stay valid ids."""


def new_boot_id() -> str:
    """``<wall-clock seconds>-<6 random hex digits>``: one per builder, never shared."""
    return f"{int(time.time())}-{secrets.token_hex(3)}"


class FeedbackError(ValueError):
    """A feedback message is malformed; the message names the field."""


@dataclass(frozen=True)
class Feedback:
    """Hindsight on one activation: the thinking it needed and what it was worth."""

    stamp: float
    required: tuple[str, ...] | None = None
    reward: float | None = None


MAX_FEEDBACK_CHARS = 65536
"""Longest feedback text parsed: a stamp, up to ``max_labels`` labels and a reward fit in a
few kilobytes, so anything longer is refused before the JSON parser spends time on it."""


def parse_feedback(text: str) -> Feedback:
    """Parse ``{"stamp": s, "required": [labels], "reward": r|null}``; FeedbackError naming it.

    The text comes from any publisher on the feedback topic, so nothing it holds may raise
    anything but FeedbackError: its length is bounded, nesting too deep for the parser, huge
    integers and numbers beyond float range are refused like any other malformed value.
    """
    if not isinstance(text, str):
        raise FeedbackError(f"feedback: expected text, got {type(text).__name__}")
    if len(text) > MAX_FEEDBACK_CHARS:
        raise FeedbackError(f"feedback: {len(text)} characters exceed {MAX_FEEDBACK_CHARS}")
    try:
        data = json.loads(text, object_pairs_hook=unique_keys_object)
    except RecursionError:
        raise FeedbackError("feedback: not JSON (nested too deeply)") from None
    except ValueError as exc:  # JSONDecodeError, and int strings beyond Python's digit limit
        raise FeedbackError(f"feedback: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise FeedbackError(f"feedback: expected an object, got {type(data).__name__}")
    unknown = sorted(set(data) - {"stamp", "required", "reward"})
    if unknown:
        raise FeedbackError(f"feedback: unknown keys {unknown[:8]}")
    stamp = _finite(data.get("stamp"))
    if stamp is None or stamp < 0:
        raise FeedbackError("feedback.stamp: expected a finite number >= 0, got "
                            f"{_short(data.get('stamp'))}")
    required = data.get("required")
    if required is not None:
        if not isinstance(required, list) or len(required) > LIMITS["max_labels"]:
            raise FeedbackError("feedback.required: expected a list of at most "
                                f"{LIMITS['max_labels']} labels")
        for label in required:
            if not valid_name(label):
                raise FeedbackError(f"feedback.required: bad label {_short(label)}")
        required = tuple(dict.fromkeys(required))
    reward = data.get("reward")
    if reward is not None:
        reward = _finite(reward)
        if reward is None:
            raise FeedbackError("feedback.reward: expected a finite number or null, got "
                                f"{_short(data.get('reward'))}")
    if required is None and reward is None:
        raise FeedbackError("feedback: carries neither 'required' nor 'reward'")
    return Feedback(stamp, required, reward)


def _finite(value: object) -> float | None:
    """``value`` as a finite float, or None (bools, non-numbers, overflow, NaN, inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer literal beyond float range
        return None
    return number if math.isfinite(number) else None


def _short(value: object) -> str:
    """The repr of a refused value, cut so a log line stays one line."""
    text = repr(value) if not isinstance(value, (list, dict)) else type(value).__name__
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass
class BuilderConfig:
    """How frames become experiences; validated so a bad parameter fails at start."""

    robot_id: str
    frame_period_s: float  # feedback matches within half of it
    feedback_window_s: float = 2.0
    ship_every_n_frames: int = 1
    episode_gap_s: float = 5.0
    max_pending: int = 20000  # frames waiting for feedback; beyond, the oldest is dropped
    # feedback waiting for its frame (normally a handful: it overtook the frame's hand-off);
    # beyond, the oldest is dropped. Each may hold 256 labels (~30 kB): ~30 MB at most.
    max_early_feedback: int = 1024
    max_events: int = LIMITS["max_events"]

    def __post_init__(self) -> None:
        for key in ("frame_period_s", "episode_gap_s"):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{key} must be a number > 0, got {value!r}")
        if not (isinstance(self.feedback_window_s, (int, float))
                and math.isfinite(self.feedback_window_s) and self.feedback_window_s >= 0):
            raise ValueError(f"feedback_window_s must be a number >= 0, "
                             f"got {self.feedback_window_s!r}")
        for key, low in (("ship_every_n_frames", 1), ("max_pending", 1), ("max_events", 1),
                         ("max_early_feedback", 1)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{key} must be an integer >= {low}, got {value!r}")
        if self.max_events > LIMITS["max_events"]:
            raise ValueError(f"max_events must be <= {LIMITS['max_events']}, "
                             f"got {self.max_events}")


@dataclass
class _Pending:
    """A frame waiting for feedback; ``events``/``n_events`` snapshot the episode history."""

    result: FrameResult
    arrived: float  # monotonic
    episode_id: str
    events: list[str]
    n_events: int
    ordinal: int  # frame counter, for ship_every_n_frames
    required: list[str] | None = None
    reward: float | None = None


@dataclass
class _Counters:
    frames: int = 0
    shipped: int = 0
    skipped: int = 0  # thinned out by ship_every_n_frames
    sink_refused: int = 0  # the shipper's queue was full
    build_errors: int = 0
    dropped_pending: int = 0
    feedback: int = 0
    feedback_matched: int = 0
    feedback_late: int = 0
    feedback_unmatched: int = 0
    feedback_dropped: int = 0  # waited for its frame beyond max_early_feedback: oldest dropped
    feedback_invalid: int = 0
    events: int = 0
    events_invalid: int = 0
    episodes: int = 0


class ExperienceBuilder:
    """Pending frames -> Experiences with feedback attached -> ``sink`` (the shipper)."""

    def __init__(self, config: BuilderConfig, sink: Callable[[Experience], bool], *,
                 boot_id: str | None = None) -> None:
        self.config = config
        self._sink = sink
        self._boot = boot_id or new_boot_id()
        self._lock = threading.Lock()
        self._pending: deque[_Pending] = deque()
        self._early: deque[tuple[float, Feedback]] = deque()  # (arrived, feedback) w/o frame
        self._released_until = -math.inf  # newest stamp already handed on
        self._counters = _Counters()
        self._episode_n = 0
        self._episode_id = ""
        self._history: list[str] = []
        self._last_stamp: float | None = None
        self._rotate_pending = True  # the first frame opens the first episode

    # ---- inputs (any thread, O(1) or O(pending) under the lock)
    @property
    def episode_id(self) -> str:
        """The current episode ('' before the first frame)."""
        return self._episode_id

    def add_frame(self, result: FrameResult, *, now: float) -> None:
        """Hold one published frame for feedback (O(1); never builds or ships here)."""
        with self._lock:
            c = self._counters
            c.frames += 1
            last = self._last_stamp
            tol = 0.5 * self.config.frame_period_s
            if (self._rotate_pending or last is None or result.stamp < last - tol
                    or result.stamp - last > self.config.episode_gap_s):
                self._new_episode()
            self._last_stamp = result.stamp
            if len(self._pending) >= self.config.max_pending:
                self._pending.popleft()
                c.dropped_pending += 1
            entry = _Pending(result, now, self._episode_id, self._history, len(self._history),
                             c.frames)
            self._pending.append(entry)
            if self._early:
                self._match_early(entry)

    def add_event(self, name: str, stamp: float) -> None:
        """Record an event of the events topic in the episode history (or rotate the episode)."""
        with self._lock:
            if name == EPISODE_START_EVENT:
                self._rotate_pending = True
                return
            if not valid_name(name):
                self._counters.events_invalid += 1
                return
            self._counters.events += 1
            history = self._history
            if len(history) >= 4 * self.config.max_events:
                # a fresh list: pending frames keep their snapshot of the old one
                history = self._history = history[-self.config.max_events:]
            history.append(name)

    def add_feedback(self, feedback: Feedback, *, now: float) -> bool:
        """Attach feedback to its frame; True when it matched a pending frame now."""
        with self._lock:
            self._counters.feedback += 1
            entry = self._nearest(feedback.stamp)
            if entry is not None:
                self._attach(entry, feedback)
                return True
            if feedback.stamp <= self._released_until + 0.5 * self.config.frame_period_s:
                self._counters.feedback_late += 1
            else:
                self._hold_early(feedback, now)  # its frame may still come
            return False

    def feedback_invalid(self) -> None:
        """Count a feedback message the node could not parse."""
        with self._lock:
            self._counters.feedback_invalid += 1

    # ---- output (the node's release thread)
    def release(self, now: float, *, everything: bool = False) -> int:
        """Build and hand on every frame held ``feedback_window_s``; returns how many shipped."""
        due: list[_Pending] = []
        with self._lock:
            horizon = now - self.config.feedback_window_s
            while self._pending and (everything or self._pending[0].arrived <= horizon):
                entry = self._pending.popleft()
                self._released_until = max(self._released_until, entry.result.stamp)
                due.append(entry)
            while self._early and (everything or self._early[0][0] <= horizon):
                self._early.popleft()
                self._counters.feedback_unmatched += 1
        shipped = 0
        for entry in due:  # outside the lock: building copies arrays and validates
            shipped += self._ship(entry)
        return shipped

    def stats(self) -> dict[str, int | str]:
        """Counters and gauges for ``/diagnostics``."""
        with self._lock:
            c = self._counters
            out: dict[str, int | str] = dict(vars(c))
            out.update(pending=len(self._pending), feedback_waiting=len(self._early),
                       episode_id=self._episode_id)
        return out

    # ---- internals
    def _new_episode(self) -> None:
        self._episode_n += 1
        self._counters.episodes += 1
        self._episode_id = f"{self.config.robot_id}.{self._boot}.{self._episode_n}"
        self._history = []
        self._rotate_pending = False

    def _nearest(self, stamp: float) -> _Pending | None:
        tol = 0.5 * self.config.frame_period_s
        best, best_gap = None, math.inf
        for entry in reversed(self._pending):  # feedback is usually about recent frames
            gap = abs(entry.result.stamp - stamp)
            if gap < best_gap:
                best, best_gap = entry, gap
            elif entry.result.stamp < stamp - tol:
                break
        return best if best_gap <= tol else None

    def _hold_early(self, feedback: Feedback, now: float) -> None:
        if len(self._early) >= self.config.max_early_feedback:
            self._early.popleft()
            self._counters.feedback_dropped += 1
        self._early.append((now, feedback))

    def _match_early(self, entry: _Pending) -> None:
        tol = 0.5 * self.config.frame_period_s
        keep: deque[tuple[float, Feedback]] = deque()
        for arrived, feedback in self._early:
            if abs(feedback.stamp - entry.result.stamp) <= tol:
                self._attach(entry, feedback)
            else:
                keep.append((arrived, feedback))
        self._early = keep

    def _attach(self, entry: _Pending, feedback: Feedback) -> None:
        self._counters.feedback_matched += 1
        if feedback.required is not None:
            merged = dict.fromkeys(entry.required or [])
            merged.update(dict.fromkeys(feedback.required))
            entry.required = list(merged)
        if feedback.reward is not None:
            entry.reward = feedback.reward

    def _ship(self, entry: _Pending) -> int:
        has_feedback = entry.required is not None or entry.reward is not None
        if not has_feedback and (entry.ordinal - 1) % self.config.ship_every_n_frames:
            with self._lock:
                self._counters.skipped += 1
            return 0
        try:
            experience = self._build(entry)
        except ExperienceError as exc:  # a frame that cannot be a valid record: count, go on
            with self._lock:
                self._counters.build_errors += 1
            log.warning("frame %d not shipped: %s", entry.result.seq, exc)
            return 0
        accepted = bool(self._sink(experience))
        with self._lock:
            if accepted:
                self._counters.shipped += 1
            else:
                self._counters.sink_refused += 1
        return int(accepted)

    def _build(self, entry: _Pending) -> Experience:
        r = entry.result
        mask = np.asarray(r.mask) > 0
        window = np.where(mask & np.isfinite(r.signals), r.signals, 0.0).astype(np.float32)
        start = max(0, entry.n_events - self.config.max_events)
        return Experience(
            robot_id=self.config.robot_id, episode_id=entry.episode_id, stamp=float(r.stamp),
            window=window, mask=mask.astype(np.uint8), events=entry.events[start:entry.n_events],
            labels=list(r.labels), probabilities=np.asarray(r.probabilities, np.float32),
            bundle_version=int(r.bundle_version), bundle_sha256=r.bundle_sha256,
            signal_set=r.signal_set, reward=entry.reward, required=entry.required)
