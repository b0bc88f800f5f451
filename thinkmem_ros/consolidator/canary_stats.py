"""The canary decision's statistics: per-robot figures, medians, a one-sided test.

Why apart from the controller (``consolidator.canary``, whose docstring gives the rule):
these are pure functions of counts, tested and reasoned about without a publisher, a
store or a clock.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from thinkmem_ros.consolidator.canary_selection import CanaryConfig
from thinkmem_ros.link.experience import Experience, learned_reward

F1 = "micro-F1"  # the figures compared (``Comparison.figure``)
REWARD = "mean reward"


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
