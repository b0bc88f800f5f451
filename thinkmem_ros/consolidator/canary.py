"""Canary publishing: a new version reaches a few robots first, live figures decide the rest.

A round that passes the offline gate has only been judged on replayed streams. A fleet
should not get it everywhere at once: the round's version v goes to the **canary**
robots only, the others keep running the version they run (v-1), and what the robots ship
afterwards decides.

**Who is a canary.** ``CanaryConfig.robots`` names them explicitly; otherwise a robot is a
canary when a stable hash of its id (sha256, read as a number in [0, 1)) is below
``fraction``. The hash does not depend on the round or on which robots happen to be
connected, so the same robots are canaries round after round and a restart changes
nothing. With few robots too few hashes may fall below the fraction: then the connected
robots with the smallest hashes are canaries anyway, up to ``min_robots`` of them when the
others can still number ``min_robots`` (a decision needs that many per group), and at
least one; when every connected robot would be a canary, the one with the largest hash
is not (someone must keep v-1 to compare with).

**Who counts in which group: the consolidator's side, checked against the record.** A
record counts for the canary group only when its robot is one the consolidator pushed v to
(the push's ``CanarySelector``), its ``bundle_version`` is v and its ``bundle_sha256`` is
v's; for the control group only when its robot is not a canary and it states v-1 (or the
version whose model v-1 republished) with that bundle's sha256. Anything else is left out
and counted by reason (``LiveFigures.ignored_by``, ``Decision.ignored``): another version
(a pinned robot, an older bundle), a non-canary claiming v, a canary still on v-1 (not
installed yet, or refused: it is not what the others run either), no sha256, another
sha256 (a bundle of the robot's own under that number). A robot cannot join the group it
likes by saying so.

**Live figures, per robot.** Each robot's own figures, over the labels both bundles emit
(a new label the baseline cannot emit would otherwise count as the baseline's miss and hide
a regression on the skills both have; the offline gate judges the new labels):

- micro-F1 of the activation (each label whose probability is >= the bundle's threshold)
  against ``required`` (what hindsight says the situation needed); only experiences with
  ``required`` count (``judged``);
- mean ``reward``, each reward clipped to [-1, 1] first (the wire allows up to 1e15: one
  record must not outweigh a robot's others).

A robot counts once it has ``min_feedback`` judged (for reward: rewarded) experiences:
``min_feedback`` is **per robot**, so a robot's figure has a known precision and one robot
cannot stand in for many. Pooled figures per group (``GroupFigures.micro_f1``,
``mean_reward``) are still reported, but they do not decide.

**The decision: medians over robots, a margin and a one-sided test.** The unit that is
independent is the robot, not the experience (hundreds of frames of one episode are not
independent samples), and a robot sending many records must weigh one. Per figure, once
both groups have ``min_robots`` robots that count, the groups' **medians** of the robots'
figures are compared (one robot with an extreme figure moves a median of three or more
robots by one rank at most; with two, the median is their mean, and a bounded figure
moves it by half the range at most). The difference is tested one-sided over robots
(``p_value``): t = difference / standard error, on Student's t with n_canary + n_control -
2 degrees of freedom, where a robot's variance is the larger of the robots' robust spread
(1.4826 MAD around their group's median) and the mean sampling variance of their figures
(binomial with pseudo-counts for micro-F1, the clipped rewards' variance for reward), so
neither one outlying robot nor a few lucky agreeing robots decide it:

- ``wait`` while either group has fewer than ``min_robots`` robots with ``min_feedback``
  judged experiences (and, for the reward criterion, rewarded ones), or while a figure is
  worse by more than its margin but its p-value is not below ``alpha`` (it could be noise:
  more experiences per robot tighten it), and ``max_wait_s`` has not passed;
- ``rollback`` when the canaries' median micro-F1 is below the others' by more than
  ``margin`` with a p-value below ``alpha``, or (with ``reward_margin`` set and enough
  rewarded robots) their median mean reward by more than ``reward_margin``, likewise:
  v-1's model is republished as version v+1 (signed, history kept,
  ``extras.rolled_back_from = v``; robots refuse a lower version than they run, so the
  old content needs a new, higher number) and pushed to the canaries;
- ``promote`` when every figure both groups have enough robots for is within its margin
  (micro-F1 alone suffices when rewards are short): ``current`` moves to v and v is pushed
  to every robot;
- ``hold`` when ``max_wait_s`` passes without enough evidence (too few robots, or worse
  but possibly noise): nothing is pushed, v is not promoted (promoting unproven is what
  the canary exists to prevent) and not rolled back (nothing shows it is worse beyond
  noise, and it passed the offline gate). The canaries keep v, the rest keep v-1
  (``current``), rounds resume, and the next round's version goes to the canaries again.

Two canaries are enough for a test: the robots' spread is pooled over both groups (the
canaries are assumed to vary like the others), and each robot's sampling variance bounds
it from below. The test is repeated at every check while a canary looks worse but not
significantly so, which raises the chance of a rollback on noise above ``alpha``; lower
``alpha`` when a needless rollback costs more than a late one.

While a canary is undecided the service runs no round: a round on top of an undecided
version would stack a second unproven change on it. The undecided canary is written to
``STATE_FILE`` beside ``current`` (with the store's last row id at the push), so a
restarted consolidator resumes it from the store instead of forgetting it (``resume``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import os
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from thinkmem_ros.consolidator.publish import ARTEFACTS_KEY, Publication, Publisher
from thinkmem_ros.consolidator.rehearsal import rehearsal_path
from thinkmem_ros.link.experience import Experience, learned_reward
from thinkmem_ros.policy.bundle import ONNX_FILE, Bundle, load_bundle, write_bundle

log = logging.getLogger(__name__)

ROLLED_BACK_FROM = "rolled_back_from"  # manifest extras: the version a rollback replaced
REPUBLISHED_FROM = "republished_from"  # manifest extras: the version whose model it carries
DECISIONS = ("wait", "promote", "rollback", "hold")
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


# ------------------------------------------------------------------ live figures

F1 = "micro-F1"  # the figures compared (``Comparison.figure``)
REWARD = "mean reward"
IGNORED_REASONS = ("other_version", "not_a_canary", "canary_on_previous", "no_sha256",
                   "wrong_sha256")
"""Why ``LiveFigures`` left a record out (``Decision.ignored``), in the order it checks."""


@dataclass
class _Counts:
    """Judged and rewarded counts, for a group pooled or for one of its robots."""

    judged: int = 0  # experiences with ``required`` (hindsight)
    tp: int = 0
    fp: int = 0
    fn: int = 0
    rewarded: int = 0
    reward_sum: float = 0.0  # of rewards clipped to [-1, 1]
    reward_sq_sum: float = 0.0

    @property
    def micro_f1(self) -> float | None:
        """Micro-F1 of activations against ``required``; None before any judged one."""
        return _micro_f1(self.judged, self.tp, self.fp, self.fn)

    @property
    def mean_reward(self) -> float | None:
        """Mean of the clipped rewards of the experiences that carry one."""
        return self.reward_sum / self.rewarded if self.rewarded else None

    def count_reward(self, reward: float) -> None:
        """Add one clipped reward."""
        self.rewarded += 1
        self.reward_sum += reward
        self.reward_sq_sum += reward * reward

    def count_judged(self, tp: int, fp: int, fn: int) -> None:
        """Add one judged experience's label counts."""
        self.judged += 1
        self.tp += tp
        self.fp += fp
        self.fn += fn


@dataclass
class RobotFigures(_Counts):
    """One robot's counts, so that each robot weighs one in the comparison."""

    def f1_noise(self) -> float:
        """Sampling variance of ``micro_f1``: binomial, with one pseudo-success and failure.

        The pseudo-counts keep a robot whose few experiences all agree (F1 exactly 1 or 0)
        from counting as noise-free.
        """
        p = (self.micro_f1 * self.judged + 1) / (self.judged + 2)
        return p * (1 - p) / self.judged

    def reward_noise(self) -> float:
        """Sampling variance of ``mean_reward``, with one pseudo-observation 1 off the mean.

        Like ``f1_noise``'s pseudo-counts: a few equal rewards are not proof of no spread.
        """
        n, mean = self.rewarded, self.reward_sum / self.rewarded
        squares = max(0.0, self.reward_sq_sum - n * mean * mean)
        return (squares + 1.0) / (n + 1) / n


def _micro_f1(judged: int, tp: int, fp: int, fn: int) -> float | None:
    """Micro-F1 from counts; 1 when nothing was needed nor activated, None when unjudged."""
    if not judged:
        return None
    if tp + fp + fn == 0:
        return 1.0
    return 2 * tp / (2 * tp + fp + fn)


@dataclass(kw_only=True)
class GroupFigures(_Counts):
    """One group's experiences: pooled counts (reported) and per-robot counts (decide)."""

    versions: tuple[int, ...]
    experiences: int = 0
    robots: set[str] = field(default_factory=set)
    per_robot: dict[str, RobotFigures] = field(default_factory=dict)

    def add(self, experience: Experience, thresholds: dict[str, float],
            labels: frozenset[str]) -> None:
        """Count one experience of this group, pooled and under its robot."""
        self.experiences += 1
        self.robots.add(experience.robot_id)
        robot = self.per_robot.setdefault(experience.robot_id, RobotFigures())
        if experience.reward is not None and math.isfinite(experience.reward):
            reward = learned_reward(experience.reward)
            self.count_reward(reward)
            robot.count_reward(reward)
        if experience.required is None:
            return
        active = {label for label, p in zip(experience.labels,
                                            experience.probabilities.tolist(), strict=False)
                  if label in labels and p >= thresholds[label]}
        needed = set(experience.required) & labels
        tp, fp, fn = len(active & needed), len(active - needed), len(needed - active)
        self.count_judged(tp, fp, fn)
        robot.count_judged(tp, fp, fn)

    def robot_figures(self, figure: str, need: int) -> list[tuple[float, float]]:
        """(figure, its sampling variance) of each robot with ``need`` experiences for it.

        ``figure`` is ``"micro-F1"`` (counted: judged experiences) or ``"mean reward"``
        (counted: rewarded ones). A robot with fewer does not count yet: its figure would
        be mostly noise, and a robot cannot stand in for many by sending a few records.
        """
        if figure == F1:
            return [(r.micro_f1, r.f1_noise()) for r in self.per_robot.values()
                    if r.judged >= need]
        return [(r.mean_reward, r.reward_noise()) for r in self.per_robot.values()
                if r.rewarded >= need]

    def to_dict(self) -> dict:
        """JSON-ready form, with the derived figures (per-robot counts left out: size)."""
        out = {name: getattr(self, name) for name in (
            "versions", "experiences", "judged", "tp", "fp", "fn", "rewarded", "reward_sum")}
        out["versions"] = list(self.versions)
        out["robots"] = sorted(self.robots)
        out["micro_f1"] = None if self.micro_f1 is None else round(self.micro_f1, 4)
        out["mean_reward"] = None if self.mean_reward is None else round(self.mean_reward, 4)
        return out


# ------------------------------------------------------------------ the comparison


@dataclass
class Comparison:
    """One figure compared across robots: medians, their difference and its p-value."""

    figure: str  # F1 or REWARD
    margin: float
    canary_robots: int
    control_robots: int
    canary_median: float
    control_median: float
    p_value: float  # one-sided: of a difference this large if the canary were not worse
    alpha: float

    @property
    def difference(self) -> float:
        """How much the canary is worse (control median - canary median)."""
        return self.control_median - self.canary_median

    @property
    def worse(self) -> bool:
        """Worse by more than the margin on the point estimates."""
        return self.difference > self.margin

    @property
    def significant(self) -> bool:
        """The difference is unlikely under noise alone."""
        return self.p_value < self.alpha

    def describe(self) -> str:
        """One phrase for the decision's reason."""
        return (f"{self.figure} {self.canary_median:.3f} vs {self.control_median:.3f} "
                f"(medians over {self.canary_robots} and {self.control_robots} robots, "
                f"margin {self.margin:g}, p {self.p_value:.3g})")

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"figure": self.figure, "margin": self.margin,
                "canary_robots": self.canary_robots, "control_robots": self.control_robots,
                "canary_median": round(self.canary_median, 4),
                "control_median": round(self.control_median, 4),
                "difference": round(self.difference, 4), "p_value": round(self.p_value, 6),
                "alpha": self.alpha, "worse": self.worse, "significant": self.significant}


def _median_variance_factor(n: int) -> float:
    """Variance of a median over that of a mean of n robots (normal figures).

    With two robots or fewer the median is the mean; beyond, pi/2 (the large-sample value,
    a little above the small-sample ones: it errs towards waiting).
    """
    return 1.0 if n <= 2 else math.pi / 2


def _robot_spread(canary: list[float], control: list[float]) -> float:
    """Robust variance of one robot's figure around its group: (1.4826 MAD)^2.

    Deviations from each group's own median, pooled over groups of two robots or more
    (one robot has no spread to show): one robot with an extreme figure moves it little.
    """
    deviations = [abs(x - statistics.median(group))
                  for group in (canary, control) if len(group) > 1 for x in group]
    if not deviations:
        return 0.0
    return (1.4826 * statistics.median(deviations)) ** 2


def p_value(canary: list[tuple[float, float]], control: list[tuple[float, float]]) -> float:
    """One-sided p-value of control median - canary median under "the canary is no worse".

    Robots are the samples. A robot's variance is the larger of the robots' robust spread
    and the mean sampling variance of their figures (too few experiences per robot is
    noise even when the robots happen to agree); the medians' variances follow
    (``_median_variance_factor``), and t = difference / its standard error is read on
    Student's t with n_canary + n_control - 2 degrees of freedom. 1.0 when there are not
    enough robots for any degree of freedom: nothing can be told from noise then.
    """
    from scipy.special import stdtr

    df = len(canary) + len(control) - 2
    if df < 1:
        return 1.0
    can, ctl = [x for x, _ in canary], [x for x, _ in control]
    noise = statistics.fmean(v for _, v in canary + control)
    variance = max(_robot_spread(can, ctl), noise)
    se = math.sqrt(variance * (_median_variance_factor(len(can)) / len(can)
                               + _median_variance_factor(len(ctl)) / len(ctl)))
    difference = statistics.median(ctl) - statistics.median(can)
    if se == 0.0:
        return 0.0 if difference > 0 else 1.0
    return float(stdtr(df, -difference / se))


def compare(canary: GroupFigures, control: GroupFigures, figure: str, margin: float,
            config: CanaryConfig) -> Comparison | None:
    """``figure`` of the two groups over robots; None while a group has too few robots."""
    can = canary.robot_figures(figure, config.min_feedback)
    ctl = control.robot_figures(figure, config.min_feedback)
    if len(can) < config.min_robots or len(ctl) < config.min_robots:
        return None
    return Comparison(figure, margin, len(can), len(ctl),
                      statistics.median(x for x, _ in can),
                      statistics.median(x for x, _ in ctl), p_value(can, ctl), config.alpha)


@dataclass
class Decision:
    """One look at the evidence: the action, why, and the figures it was taken on."""

    action: str  # one of DECISIONS
    reason: str
    canary: GroupFigures
    control: GroupFigures
    waited_s: float = 0.0
    version: int | None = None  # the canary version
    published_version: int | None = None  # v (promote) or the rollback version
    pushed_to: int | None = None
    comparisons: list[Comparison] = field(default_factory=list)  # the figures ready
    ignored: dict[str, int] = field(default_factory=dict)  # records left out, by reason

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"action": self.action, "reason": self.reason,
                "canary": self.canary.to_dict(), "control": self.control.to_dict(),
                "waited_s": round(self.waited_s, 3), "version": self.version,
                "published_version": self.published_version, "pushed_to": self.pushed_to,
                "comparisons": [c.to_dict() for c in self.comparisons],
                "ignored": dict(self.ignored)}


def _comparisons(canary: GroupFigures, control: GroupFigures,
                 config: CanaryConfig) -> list[Comparison]:
    """The figures both groups have enough robots for (reward only with its margin)."""
    wanted = [(F1, config.margin)]
    if config.reward_margin is not None:
        wanted.append((REWARD, config.reward_margin))
    found = (compare(canary, control, figure, margin, config) for figure, margin in wanted)
    return [c for c in found if c is not None]


def _evidence(canary: GroupFigures, control: GroupFigures, config: CanaryConfig) -> str:
    """What is missing, for a wait or hold: robots with enough judged (rewarded) ones."""
    need = config.min_feedback
    kinds = [(F1, "judged")] + ([(REWARD, "rewarded")] if config.reward_margin is not None
                                else [])
    said = []
    for figure, counted in kinds:
        counts = [len(g.robot_figures(figure, need)) for g in (canary, control)]
        said.append(f"robots with >= {need} {counted} experiences: canary {counts[0]}, "
                    f"others {counts[1]}")
    return "; ".join(said) + f"; {config.min_robots} each needed"


def _undecided(comparisons: list[Comparison], canary: GroupFigures, control: GroupFigures,
               config: CanaryConfig) -> str:
    """Why neither rollback nor promote: a possible-noise regression, or too few robots."""
    unclear = [c for c in comparisons if c.worse]
    if unclear:
        return (f"worse by more than the margin but could be noise (alpha {config.alpha:g}): "
                + "; ".join(c.describe() for c in unclear))
    return _evidence(canary, control, config)


def decide(canary: GroupFigures, control: GroupFigures, config: CanaryConfig,
           waited_s: float) -> Decision:
    """Medians over robots, a margin and a one-sided test (module docstring: why).

    Rollback needs a figure worse by more than its margin *and* unlikely as noise; a
    figure worse by the margin that could still be noise waits for more experiences.
    """
    comparisons = _comparisons(canary, control, config)

    def decision(action: str, reason: str) -> Decision:
        return Decision(action, reason, canary, control, waited_s, comparisons=comparisons)

    regressed = [c for c in comparisons if c.worse and c.significant]
    if regressed:
        return decision("rollback", "canary worse: "
                        + "; ".join(c.describe() for c in regressed))
    if comparisons and not any(c.worse for c in comparisons):
        return decision("promote", "canary not worse by more than the margin: "
                        + "; ".join(c.describe() for c in comparisons))
    evidence = _undecided(comparisons, canary, control, config)
    if waited_s < config.max_wait_s:
        return decision("wait", evidence)
    return decision("hold", f"max wait {config.max_wait_s:g} s passed without enough "
                    f"evidence ({evidence}): neither promoted nor rolled back")


def _as_selector(canaries: Callable[[str], bool] | Iterable[str]) -> Callable[[str], bool]:
    """A predicate on robot ids from a predicate or a list of ids."""
    if callable(canaries):
        return canaries
    return CanarySelector(frozenset(canaries), explicit=True)


class LiveFigures:
    """Accumulates the two groups' figures from experiences (thread-safe, O(robots) memory).

    ``versions`` are the canary version and the control versions (the running version
    and any version carrying the same model, i.e. what a rollback republished); each
    version's thresholds and ONNX sha256. ``canaries`` are the robots the consolidator
    pushed the canary version to (a ``CanarySelector``, or their ids). A record counts
    only where the consolidator's side and the record agree (module docstring); the
    others are counted in ``ignored`` and, by reason, in ``ignored_by``.
    """

    def __init__(self, canary_version: int, control_versions: Iterable[int],
                 thresholds: dict[int, dict[str, float]],
                 sha256: dict[int, str] | None = None, *,
                 canaries: Callable[[str], bool] | Iterable[str]) -> None:
        self.canary_version = canary_version
        self.control_versions = frozenset(control_versions) - {canary_version}
        if not self.control_versions:
            raise ValueError("LiveFigures needs at least one control version")
        versions = {canary_version, *self.control_versions}
        missing = sorted(versions - set(thresholds))
        if missing:
            raise ValueError(f"LiveFigures: no thresholds for versions {missing}")
        self.sha256 = dict(sha256 or {})
        unknown = sorted(v for v in versions if not self.sha256.get(v))
        if unknown:
            raise ValueError(f"LiveFigures: no sha256 for versions {unknown} (a record "
                             f"proves the bundle it ran by its sha256)")
        self.thresholds = thresholds
        self.canaries = _as_selector(canaries)
        shared = set(thresholds[canary_version])
        for version in self.control_versions:
            shared &= set(thresholds[version])
        self.labels = frozenset(shared)
        self.canary = GroupFigures(versions=(canary_version,))
        self.control = GroupFigures(versions=tuple(sorted(self.control_versions)))
        self.ignored = 0
        self.ignored_by = dict.fromkeys(IGNORED_REASONS, 0)
        self._lock = threading.Lock()

    def group_of(self, experience: Experience) -> GroupFigures | str:
        """The group ``experience`` counts in, or why it counts in none.

        The role is the consolidator's (``canaries``), the version and the bundle's sha256
        the record's; all three must agree. A canary still on the previous version (not
        installed yet, or refused) is in neither group: it is not what the others run.
        """
        version, canary = experience.bundle_version, self.canaries(experience.robot_id)
        if version == self.canary_version:
            group = self.canary if canary else "not_a_canary"
        elif version in self.control_versions:
            group = "canary_on_previous" if canary else self.control
        else:
            return "other_version"
        if isinstance(group, str):
            return group
        if not experience.bundle_sha256:
            return "no_sha256"
        if experience.bundle_sha256 != self.sha256[version]:
            return "wrong_sha256"  # a bundle of the robot's own under that number
        return group

    def observe(self, experiences: Iterable[Experience]) -> None:
        """Count each experience in its group, or as ignored with the reason."""
        with self._lock:
            for exp in experiences:
                group = self.group_of(exp)
                if isinstance(group, str):
                    self.ignored += 1
                    self.ignored_by[group] += 1
                    continue
                group.add(exp, self.thresholds[exp.bundle_version], self.labels)

    def snapshot(self) -> tuple[GroupFigures, GroupFigures]:
        """Copies of (canary, control) figures, consistent with each other."""
        with self._lock:
            return (copy.deepcopy(self.canary), copy.deepcopy(self.control))

    def ignored_counts(self) -> dict[str, int]:
        """Records left out so far, by reason (non-zero ones) and in total."""
        with self._lock:
            counts = {reason: n for reason, n in self.ignored_by.items() if n}
            counts["total"] = self.ignored
            return counts


def _live_figures(candidate: Bundle, running: Bundle,
                  canaries: Callable[[str], bool]) -> LiveFigures:
    """Figures of ``candidate`` (canary) against what ``running`` stands for (control).

    The control group is the running version and, when that is a rollback's republished
    model, the version whose model it carries: robots still on it run the same model.
    """
    version = candidate.version
    original = running.manifest.extras.get(REPUBLISHED_FROM, running.version)
    control = {running.version, original}
    thresholds = {v: dict(running.manifest.thresholds) for v in control}
    thresholds[version] = dict(candidate.manifest.thresholds)
    sha = {v: running.manifest.sha256 for v in control}
    sha[version] = candidate.manifest.sha256
    return LiveFigures(version, control, thresholds, sha, canaries=canaries)


def evaluate(experiences: Sequence[Experience], canary_version: int,
             control_versions: Iterable[int], thresholds: dict[int, dict[str, float]],
             config: CanaryConfig, waited_s: float,
             sha256: dict[int, str] | None = None,
             canaries: Callable[[str], bool] | Iterable[str] | None = None) -> Decision:
    """Live figures from ``experiences`` and the decision on them (the pure entry point).

    ``canaries`` defaults to what ``config`` says (its ``robots``, else the hash rule for
    ``fraction``), never to what the records claim.
    """
    if canaries is None:
        canaries = CanarySelector.configured(config)
    figures = LiveFigures(canary_version, control_versions, thresholds, sha256,
                          canaries=canaries)
    figures.observe(experiences)
    decision = decide(figures.canary, figures.control, config, waited_s)
    decision.version = canary_version
    decision.ignored = figures.ignored_counts()
    return decision


# ------------------------------------------------------------------ rollback

def rollback_bundle(publisher: Publisher, source: Bundle, rolled_back_from: int,
                    staging: Path) -> Bundle:
    """Stage ``source``'s model as the next version, marked as a rollback of a version.

    The ONNX graph, thresholds and listed artefacts are ``source``'s, byte for byte; only
    the version and ``extras`` (``rolled_back_from``, ``republished_from``: the version
    whose model this is, followed through earlier rollbacks) change. The publisher signs it.
    """
    version = publisher.next_version()
    manifest = load_bundle(source.path).manifest
    original = manifest.extras.get(REPUBLISHED_FROM, source.version)
    manifest.model_version = version
    manifest.created_at = ""
    manifest.extras = {**manifest.extras, ROLLED_BACK_FROM: rolled_back_from,
                       REPUBLISHED_FROM: original}
    folder = staging / f"v{version:06d}"
    bundle = write_bundle(folder, (source.path / ONNX_FILE).read_bytes(), manifest)
    for name in (manifest.extras.get(ARTEFACTS_KEY) or {}):
        shutil.copyfile(source.path / name, folder / name)
    return bundle


def copy_rehearsal(publish_dir: Path, source_version: int, version: int) -> bool:
    """Give a rollback version the training set D of the version whose model it carries.

    The next round rehearses the D saved for ``current``; its sha256 (recorded in the
    copied manifest) matches since the file is copied unchanged. False when the source
    has none (it then rebuilds from the recipe, as the source would have).
    """
    src = rehearsal_path(publish_dir, source_version)
    if not src.is_file():
        return False
    dst = rehearsal_path(publish_dir, version)
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.copyfile(src, tmp)
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, dst)
    return True


# ------------------------------------------------------------------ the service's part

Push = Callable[..., int]  # receiver.push_bundle(frame, robots=None) -> connections


@dataclass
class CanaryRun:
    """One undecided canary: which version, for whom, since when, and what it shows."""

    version: int
    baseline: Bundle  # what the others run (``current``)
    selector: CanarySelector
    figures: LiveFigures
    started: float  # time.monotonic()


class CanaryController:
    """Publishes to canaries, collects live figures, then promotes, rolls back or holds.

    The consolidator service calls ``publish`` instead of ``Publisher.publish``,
    ``observe`` from its receiver hook and ``check`` from its loop; nothing here opens a
    socket (``push`` is the receiver's ``push_bundle``), so it is tested without one.
    """

    def __init__(self, config: CanaryConfig, publisher: Publisher,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.config = config
        self.publisher = publisher
        self.clock = clock
        self.wall = wall
        self.run: CanaryRun | None = None
        self.decisions: list[Decision] = []  # acted-on decisions (not the waits)
        self.state_path = Path(publisher.root) / STATE_FILE

    @property
    def pending(self) -> CanaryRun | None:
        """The undecided canary, if any."""
        return self.run

    def publish(self, candidate: Bundle, running: Bundle, known_robots: Iterable[str],
                push: Push | None, store_mark: int = 0) -> Publication:
        """Sign ``candidate`` into the history (``current`` stays) and push it to canaries.

        ``store_mark`` is the store's last row id before the push: a restarted consolidator
        replays the rows after it to rebuild the live figures (``resume``).
        """
        selector = CanarySelector.choose(known_robots, self.config)
        send = None if push is None else (lambda frame: push(frame, robots=selector))
        # counting starts before the push, so no experience of a fast canary is missed
        self.run = CanaryRun(candidate.version, running, selector,
                             _live_figures(candidate, running, selector), self.clock())
        try:
            publication = self.publisher.publish(candidate, push=send, link=False)
        except BaseException:
            self.run = None
            raise
        self._save(self.run, store_mark)
        self._warn_if_undecidable(selector, known_robots)
        log.info("canary: v%d pushed to %s robot connections of canaries %s (others stay on "
                 "v%d)", publication.version, publication.pushed_to,
                 sorted(selector.chosen) or "none connected yet", running.version)
        return publication

    def _warn_if_undecidable(self, selector: CanarySelector, known: Iterable[str]) -> None:
        """Say so when the robots connected now cannot give min_robots per group.

        The canary then waits for robots that connect later, or holds at max wait: an
        operator of a small fleet wants to know before the hour has passed.
        """
        known = set(known)
        canaries = sum(1 for r in known if selector(r))
        need = self.config.min_robots
        if canaries < need or len(known) - canaries < need:
            log.warning("canary: %d canary and %d other robots connected, %d per group "
                        "needed to decide (--canary-min-robots); until more connect it can "
                        "only hold after max wait", canaries, len(known) - canaries, need)

    def observe(self, experiences: Iterable[Experience]) -> None:
        """Count experiences stored since the push (receiver thread)."""
        run = self.run
        if run is not None:
            run.figures.observe(experiences)

    def check(self, push: Push | None) -> Decision | None:
        """Decide on the pending canary and act; None when there is none."""
        run = self.run
        if run is None:
            return None
        canary, control = run.figures.snapshot()
        decision = decide(canary, control, self.config, self.clock() - run.started)
        decision.version = run.version
        decision.ignored = run.figures.ignored_counts()
        if decision.action == "wait":
            return decision
        if decision.action == "promote":
            publication = self.publisher.promote(run.version, push=push)
        elif decision.action == "rollback":
            publication = self._rollback(run, push)
        else:
            publication = None
        if publication is not None:
            decision.published_version = publication.version
            decision.pushed_to = publication.pushed_to
        self.run = None
        self._forget()
        self.decisions.append(decision)
        log.log(logging.WARNING if decision.action != "promote" else logging.INFO,
                "canary v%d: %s%s: %s (canary %s, others %s, records ignored %s)",
                run.version, decision.action.upper(),
                "" if publication is None else f" as v{publication.version}",
                decision.reason, decision.canary.to_dict(), decision.control.to_dict(),
                decision.ignored)
        return decision

    def resume(self, stored_after: Callable[[int], Iterable[Experience]]) -> CanaryRun | None:
        """Take up the canary a previous process left undecided (``STATE_FILE``).

        ``stored_after(mark)`` yields the experiences stored after row id ``mark``: the live
        figures are rebuilt from them, and the wait counts from the original push. A state
        that no longer matches the history (the version is gone, or ``current`` moved on) is
        dropped with a warning: deciding it now could undo what an operator did since.
        """
        try:
            state = read_state(self.state_path.parent)
        except CanaryStateError as exc:
            log.warning("canary: ignoring an unreadable state (%s); no canary resumed", exc)
            self._forget()
            return None
        if state is None:
            return None
        if not self.config.enabled:
            log.warning("canary: %s names an undecided canary, but canary publishing is "
                        "off now; not resumed", self.state_path)
            self._forget()
            return None
        version, baseline = state.version, state.baseline_version
        running = self.publisher.current()
        folder = self.publisher.history / f"v{version:06d}"
        if running.version != baseline or not folder.is_dir() or version <= baseline:
            log.warning("canary: %s names v%d over v%d, but current is v%d; not resumed",
                        self.state_path, version, baseline, running.version)
            self._forget()
            return None
        figures = _live_figures(load_bundle(folder), running, state.selector)
        figures.observe(stored_after(state.store_mark))
        waited = max(0.0, self.wall() - state.started_unix)
        self.run = CanaryRun(version, running, state.selector, figures, self.clock() - waited)
        canary, control = figures.snapshot()
        log.info("canary: resumed v%d (over v%d, %.0f s since the push; %d canary and %d "
                 "other experiences so far)", version, baseline, waited, canary.experiences,
                 control.experiences)
        return self.run

    def _save(self, run: CanaryRun, store_mark: int) -> None:
        """Write the undecided canary beside ``current`` (atomically)."""
        state = CanaryState(run.version, run.baseline.version, run.selector, self.wall(),
                            int(store_mark))
        tmp = self.state_path.with_name(self.state_path.name + ".tmp")
        tmp.write_text(state.to_json())
        os.replace(tmp, self.state_path)

    def _forget(self) -> None:
        self.state_path.unlink(missing_ok=True)

    def _rollback(self, run: CanaryRun, push: Push | None) -> Publication:
        """Republish the baseline's model as a new version and push it to the canaries."""
        root = Path(self.publisher.root)
        staging = root / "staging"
        bundle = rollback_bundle(self.publisher, run.baseline, run.version, staging)
        # D first, as a round does: a linked version always has its training set
        copy_rehearsal(root, run.baseline.version, bundle.version)
        send = None if push is None else (lambda frame: push(frame, robots=run.selector))
        try:
            return self.publisher.publish(bundle, push=send)
        finally:
            shutil.rmtree(bundle.path, ignore_errors=True)
