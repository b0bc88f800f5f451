"""Hold ``consider:C`` from the moment A...B is complete until C happens or a horizon passes.

Why on the robot and not (only) in the policy: the policy sees the last M event ids without
their times, so during a long B -> C gap A leaves its view and the thinking flickers. The
bundle ships its promoted rules (``policy/anticipation_rules.RuleSet``: the ordered codes,
the largest A -> B gap and the B -> C horizon learned from the observed gaps) and this
tracker follows A...B progress with the events' times. Plain Python, no numpy, no ROS.

Per event (``observe``, executor thread): every rule that mentions the code advances its
``RuleProgress`` (semantics in ``policy/anticipation_rules``: a repeated A refreshes the
chain, an A older than the rule's max gap no longer extends it, C closes and consumes the
chain). Per frame (``active(now)``, inference thread): the labels of rules whose antecedent
completed at most ``horizon_s`` ago and has not been closed.

Time: stamps are the node clock (ROS time, so bag playback and sim time work). The stream
only moves forward:

- an event stamped more than ``backwards_reset_s`` before the newest stamp seen, or a query
  at such a ``now``, is a clock jump backwards (a restarted bag, a reset sim clock): all
  progress and the event history are forgotten and tracking starts again from there;
- an event slightly older than the newest (within ``backwards_reset_s``) cannot be put back
  in order reliably, so it is taken as arriving now (its stamp is clamped to the newest)
  and counted ``out_of_order``;
- the same (name, stamp) seen again among the last ``dedup`` events (and not older than
  ``backwards_reset_s``, which reads as a jump) is a duplicate delivery and is dropped; a
  code repeated at another time is a real repetition (the node stamps events on arrival,
  so there only a clock jump repeats a stamp);
- a ``reset_events`` code (the node passes ``episode_start``) ends the episode: progress is
  forgotten, as discovery never chains events across episodes;
- non-finite stamps are refused.

Rule sets: ``set_rules`` with the same rules (same digest) keeps all progress. A different
rule set (a hot-swapped bundle) rebuilds every rule's progress by replaying the retained
event history (events of the current episode, at most ``history_s`` old, at most
``max_history``), so a rule that arrives while A...B is already under way anticipates C at
once, and a rule that left stops at once. Everything is under one lock.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass

from thinkmem_ros.policy.anticipation_rules import AnticipationRule, RuleProgress, RuleSet

ACCEPTED = "accepted"
DUPLICATE = "duplicate"
OUT_OF_ORDER = "out_of_order"
INVALID = "invalid"
RESET = "reset"


@dataclass
class TrackerConfig:
    """Time handling of the tracker (see the module docstring)."""

    backwards_reset_s: float = 2.0
    history_s: float = 3600.0
    max_history: int = 4096
    dedup: int = 64
    reset_events: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.reset_events = tuple(self.reset_events)
        for key in ("backwards_reset_s", "history_s"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    math.isfinite(value) and value > 0):
                raise ValueError(f"TrackerConfig.{key} must be a number > 0, got {value!r}")
        for key in ("max_history", "dedup"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TrackerConfig.{key} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class Anticipation:
    """One active anticipation: the label, the rule behind it, since when, until when."""

    label: str
    rule: str
    since: float  # node-clock time the antecedent completed
    until: float  # since + horizon_s

    def record(self, now: float) -> dict:
        """JSON-ready form for the activation record."""
        return {"rule": self.rule, "since": round(self.since, 3),
                "remaining_s": round(max(self.until - now, 0.0), 3)}


class AnticipationTracker:
    """A...B progress of every shipped rule, fed with (name, stamp) events."""

    def __init__(self, config: TrackerConfig | None = None,
                 rules: RuleSet | None = None) -> None:
        self.config = config or TrackerConfig()
        self._lock = threading.Lock()
        self._rules: tuple[AnticipationRule, ...] = ()
        self._digest = ""
        self._progress: list[RuleProgress] = []
        self._by_code: dict[str, list[int]] = {}
        self._open: set[int] = set()
        self._history: deque[tuple[float, str]] = deque()
        self._recent: deque[tuple[str, float]] = deque()
        self._recent_set: set[tuple[str, float]] = set()
        self._newest = -math.inf
        # active() between changes: the answer only changes at an event or at the earliest
        # horizon end, so a frame in between costs a comparison and a dict copy
        self._version = 0
        self._cache: tuple[int, float, dict[str, Anticipation]] | None = None
        self.counters = {"events": 0, "duplicates": 0, "out_of_order": 0, "invalid": 0,
                         "backwards_resets": 0, "episode_resets": 0, "rule_set_changes": 0,
                         "opened": 0, "closed": 0, "expired": 0}
        if rules is not None:
            self.set_rules(rules)

    # ------------------------------------------------------------------ rules
    @property
    def rules(self) -> tuple[AnticipationRule, ...]:
        """The rules tracked now."""
        return self._rules

    @property
    def labels(self) -> frozenset[str]:
        """Thinking labels the current rules decide."""
        return frozenset(r.thinking for r in self._rules)

    def set_rules(self, rules: RuleSet | None) -> bool:
        """Adopt a rule set; True when it differs from the current one (progress replayed)."""
        rules = rules or RuleSet()
        with self._lock:
            if rules.digest == self._digest:
                return False
            self._digest = rules.digest
            self._rules = rules.rules
            self._progress = [RuleProgress.for_rule(r) for r in rules.rules]
            self._by_code = {}
            for i, rule in enumerate(rules.rules):
                for code in dict.fromkeys((*rule.antecedent, rule.consequent)):
                    self._by_code.setdefault(code, []).append(i)
            self._open = set()
            self._version += 1
            self.counters["rule_set_changes"] += 1
            for t, name in self._history:
                self._advance(name, t, count=False)
            return True

    # ------------------------------------------------------------------ events
    def _forget(self, why: str) -> None:
        for p in self._progress:
            p.reset()
        self._open.clear()
        self._history.clear()
        self._recent.clear()
        self._recent_set.clear()
        self._newest = -math.inf
        self._version += 1
        self.counters[why] += 1

    def _advance(self, name: str, t: float, count: bool) -> None:
        self._version += 1
        for i in self._by_code.get(name, ()):
            progress = self._progress[i]
            before = progress.open_since
            closed = progress.observe(name, t)
            if closed is not None:
                self._open.discard(i)
                if count:
                    self.counters["closed"] += 1
            after = progress.open_since
            if after is not None and after != before:
                self._open.add(i)
                if count:
                    self.counters["opened"] += 1

    def observe(self, name: str, stamp: float) -> str:
        """Feed one event (node clock); returns what happened to it (module docstring)."""
        cfg = self.config
        with self._lock:
            if not isinstance(stamp, (int, float)) or not math.isfinite(stamp):
                self.counters["invalid"] += 1
                return INVALID
            key = (name, float(stamp))
            verdict = ACCEPTED
            t = float(stamp)
            if t < self._newest - cfg.backwards_reset_s:  # before dedup: a looped bag
                self._forget("backwards_resets")  # repeats its (name, stamp) pairs
                verdict = RESET
            elif key in self._recent_set:
                self.counters["duplicates"] += 1
                return DUPLICATE
            elif t < self._newest:
                t = self._newest
                self.counters["out_of_order"] += 1
                verdict = OUT_OF_ORDER
            self._newest = t
            self._recent.append(key)
            self._recent_set.add(key)
            if len(self._recent) > cfg.dedup:
                self._recent_set.discard(self._recent.popleft())
            self.counters["events"] += 1
            if name in cfg.reset_events:
                self._forget("episode_resets")
                self._newest = t
                return RESET
            self._advance(name, t, count=True)
            self._history.append((t, name))
            while self._history and (len(self._history) > cfg.max_history
                                     or t - self._history[0][0] > cfg.history_s):
                self._history.popleft()
            return verdict

    # ------------------------------------------------------------------ frames
    def active(self, now: float) -> dict[str, Anticipation]:
        """Labels anticipated at ``now`` (node clock), each with its latest-ending rule."""
        out: dict[str, Anticipation] = {}
        with self._lock:
            if not isinstance(now, (int, float)) or not math.isfinite(now):
                return out
            if now < self._newest - self.config.backwards_reset_s:
                self._forget("backwards_resets")
                return out
            cache = self._cache
            if cache is not None and cache[0] == self._version and now <= cache[1]:
                return dict(cache[2])
            for i in sorted(self._open):
                rule, since = self._rules[i], self._progress[i].open_since
                if since is None:  # defensive: closed without leaving the open set
                    self._open.discard(i)
                    continue
                until = since + rule.horizon_s
                if now > until:
                    self._open.discard(i)
                    self.counters["expired"] += 1
                    continue
                best = out.get(rule.thinking)
                if best is None or until > best.until:
                    out[rule.thinking] = Anticipation(rule.thinking, rule.key, since, until)
            valid_until = min((self._progress[i].open_since + self._rules[i].horizon_s
                               for i in self._open), default=math.inf)
            self._cache = (self._version, valid_until, dict(out))
        return out

    def reset(self) -> None:
        """Forget all progress and history (counted as an episode reset)."""
        with self._lock:
            self._forget("episode_resets")

    def stats(self) -> dict:
        """Cumulative counters plus the number of rules and open anticipations."""
        with self._lock:
            return {**self.counters, "rules": len(self._rules), "open": len(self._open)}
