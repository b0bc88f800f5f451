"""Who is a canary, and the undecided canary's state file.

Why a module of its own: the receive-only processes (``consolidator.receive``) push a
version on trial to the canaries connected to them, so they need the state file and the
rule that picks the canaries (a stable hash of the robot id, or the configured list; see
``consolidator.canary``), not the decision's statistics or the publisher.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

STATE_FILE = "canary.json"
"""The undecided canary, kept beside ``current`` so a restarted consolidator resumes it."""


class CanaryStateError(ValueError):
    """``STATE_FILE`` exists but cannot be read as a canary state."""


@dataclass
class CanaryConfig:
    """How a new version reaches the fleet: canaries first, then everyone or a rollback."""

    fraction: float = 0.0  # share of robots that get a new version first; 0 = off
    robots: tuple[str, ...] = ()  # explicit canary robot ids; overrides ``fraction``
    min_feedback: int = 50  # judged (rewarded) experiences per robot before it counts
    margin: float = 0.02  # micro-F1 the canary may lose against the rest and still promote
    reward_margin: float | None = None  # mean reward it may lose; None = reported only
    max_wait_s: float = 3600.0  # then hold (see the module docstring)
    min_robots: int = 2  # robots per group with min_feedback each before a decision
    alpha: float = 0.01  # a rollback needs a one-sided p-value below this

    def __post_init__(self) -> None:
        if isinstance(self.robots, str):
            self.robots = tuple(r.strip() for r in self.robots.split(",") if r.strip())
        self.robots = tuple(self.robots)
        if not (isinstance(self.fraction, (int, float)) and 0.0 <= self.fraction < 1.0):
            raise ValueError(f"CanaryConfig.fraction must be in [0, 1) (1 would leave no "
                             f"robot on the running version to compare with), got "
                             f"{self.fraction!r}")
        bad = [r for r in self.robots if not isinstance(r, str) or not r.strip()]
        if bad:
            raise ValueError(f"CanaryConfig.robots must be non-empty robot ids, got {bad!r}")
        if not isinstance(self.min_feedback, int) or self.min_feedback < 1:
            raise ValueError(f"CanaryConfig.min_feedback must be an integer >= 1, got "
                             f"{self.min_feedback!r}")
        if not isinstance(self.min_robots, int) or self.min_robots < 1:
            raise ValueError(f"CanaryConfig.min_robots must be an integer >= 1, got "
                             f"{self.min_robots!r}")
        if not (isinstance(self.alpha, (int, float)) and 0.0 < self.alpha < 1.0):
            raise ValueError(f"CanaryConfig.alpha must be in (0, 1), got {self.alpha!r}")
        if not (isinstance(self.margin, (int, float)) and 0.0 <= self.margin <= 1.0):
            raise ValueError(f"CanaryConfig.margin must be in [0, 1] (micro-F1), got "
                             f"{self.margin!r}")
        if self.reward_margin is not None and not (
                isinstance(self.reward_margin, (int, float)) and math.isfinite(self.reward_margin)
                and self.reward_margin >= 0):
            raise ValueError(f"CanaryConfig.reward_margin must be None or a finite number "
                             f">= 0, got {self.reward_margin!r}")
        if not (isinstance(self.max_wait_s, (int, float)) and self.max_wait_s > 0):
            raise ValueError(f"CanaryConfig.max_wait_s must be > 0, got {self.max_wait_s!r}")

    @property
    def enabled(self) -> bool:
        """Whether new versions go to canaries first (else to every robot at once)."""
        return self.fraction > 0 or bool(self.robots)


# ------------------------------------------------------------------ who is a canary

def robot_score(robot_id: str) -> float:
    """A stable number in [0, 1) per robot id (sha256): the same on every run and host."""
    digest = hashlib.sha256(robot_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64


@dataclass(frozen=True)
class CanarySelector:
    """Predicate on robot ids: the canaries of one push (robots connected later included)."""

    chosen: frozenset[str]  # decided among the robots known at push time
    fraction: float = 0.0  # robots not known then: canary when their score is below it
    explicit: bool = False  # ``chosen`` is the configured list: nobody else

    def __call__(self, robot_id: str) -> bool:
        if robot_id in self.chosen:
            return True
        return not self.explicit and robot_score(robot_id) < self.fraction

    @classmethod
    def choose(cls, known: Iterable[str], config: CanaryConfig) -> CanarySelector:
        """Canaries among ``known`` robots (see the module docstring for the rule)."""
        if config.robots:
            return cls(frozenset(config.robots), explicit=True)
        known = sorted(set(known), key=robot_score)
        chosen = [r for r in known if robot_score(r) < config.fraction]
        # enough canaries to decide on, if the rest can still reach min_robots; at least one
        floor = max(1, min(config.min_robots, len(known) - config.min_robots))
        if len(chosen) < floor:
            chosen = known[:floor]  # the hash-chosen are the smallest: a prefix of known
        if len(known) > 1 and len(chosen) == len(known):
            chosen = chosen[:-1]  # at least one robot left on the running version
        return cls(frozenset(chosen), config.fraction)

    @classmethod
    def configured(cls, config: CanaryConfig) -> CanarySelector:
        """The canaries ``config`` names, before any robot is known (its list, else hashes)."""
        if config.robots:
            return cls(frozenset(config.robots), explicit=True)
        return cls(frozenset(), config.fraction)


@dataclass(frozen=True)
class CanaryState:
    """What ``STATE_FILE`` says about the undecided canary."""

    version: int
    baseline_version: int
    selector: CanarySelector
    started_unix: float
    store_mark: int

    def to_json(self) -> str:
        """The text ``read_state`` parses back."""
        return json.dumps({"version": self.version, "baseline_version": self.baseline_version,
                           "chosen": sorted(self.selector.chosen),
                           "fraction": self.selector.fraction,
                           "explicit": self.selector.explicit,
                           "started_unix": self.started_unix, "store_mark": self.store_mark},
                          indent=1)


def read_state(publish_dir: Path | str) -> CanaryState | None:
    """The undecided canary of ``publish_dir``, None when there is none.

    Raises ``CanaryStateError`` naming the file when it exists but does not parse.
    """
    path = Path(publish_dir) / STATE_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CanaryStateError(f"{path}: {exc}") from exc
    try:
        state = json.loads(text)
        return CanaryState(
            int(state["version"]), int(state["baseline_version"]),
            CanarySelector(frozenset(str(r) for r in state["chosen"]),
                           float(state["fraction"]), bool(state["explicit"])),
            float(state["started_unix"]), int(state["store_mark"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise CanaryStateError(f"{path}: not a canary state ({exc!r})") from exc
