"""Canary publishing: a new version reaches a few robots first, live figures decide the rest.

A round that passes the offline gate has only been judged on replayed streams. A fleet
should not get it everywhere at once: the round's version v goes to the **canary**
robots only, the others keep running the version they run (v-1), and what the robots ship
afterwards decides.

**Who is a canary.** ``CanaryConfig.robots`` names them explicitly; otherwise a robot is a
canary when a stable hash of its id (sha256, read as a number in [0, 1)) is below
``fraction``. The hash does not depend on the round or on which robots happen to be
connected, so the same robots are canaries round after round and a restart changes
nothing. With few robots no hash may fall below the fraction: then the connected robot
with the smallest hash is one anyway (at least one canary), and when every connected
robot would be a canary, the one with the largest hash is not (someone must keep v-1 to
compare with).

**Live figures.** From the experiences stored after the push, per group, where the group
is the version the experience says produced it (``bundle_version``; its
``bundle_sha256``, when given, must be that version's), never the role the robot was
assigned: a canary that had not installed v yet, or refused it, still ran v-1.

- micro-F1 of the activation (each label whose probability is >= the bundle's threshold)
  against ``required`` (what hindsight says the situation needed), over the labels both
  bundles emit: a new label the baseline cannot emit would otherwise count as the
  baseline's miss and hide a regression on the skills both have (the offline gate judges
  the new labels; this check is about not getting worse). Only experiences with
  ``required`` count (``judged``).
- mean ``reward``, where present.

**The decision: a margin rule with a minimum sample, not a significance test.** The two
groups are different robots in different situations (unpaired), and the unit that is
independent is the robot or the episode, not the experience: with 10 % of a small fleet
as canaries, a test over robots has one or two samples and never rejects, while a test
over experiences treats hundreds of correlated frames of one episode as independent and
rejects on noise. A margin on the point estimates, taken only once each group has
``min_feedback`` judged experiences, states the operator's tolerance directly and is easy
to audit:

- ``wait`` while either group has fewer than ``min_feedback`` judged experiences (and,
  for the reward criterion, rewarded ones) and ``max_wait_s`` has not passed;
- ``rollback`` when the canary's micro-F1 is below the others' by more than ``margin``,
  or (with ``reward_margin`` set and enough rewards) its mean reward by more than
  ``reward_margin``: v-1's model is republished as version v+1 (signed, history kept,
  ``extras.rolled_back_from = v``; robots refuse a lower version than they run, so the
  old content needs a new, higher number) and pushed to the canaries;
- ``promote`` otherwise: ``current`` moves to v and v is pushed to every robot;
- ``hold`` when ``max_wait_s`` passes without enough evidence: nothing is pushed, v is
  not promoted (promoting unproven is what the canary exists to prevent) and not rolled
  back (nothing shows it is worse, and it passed the offline gate). The canaries keep v,
  the rest keep v-1 (``current``), rounds resume, and the next round's version goes to
  the canaries again.

While a canary is undecided the service runs no round: a round on top of an undecided
version would stack a second unproven change on it. The undecided canary is written to
``STATE_FILE`` beside ``current`` (with the store's last row id at the push), so a
restarted consolidator resumes it from the store instead of forgetting it (``resume``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from thinkmem_ros.consolidator.publish import ARTEFACTS_KEY, Publication, Publisher
from thinkmem_ros.consolidator.rehearsal import rehearsal_path
from thinkmem_ros.link.experience import Experience
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
    min_feedback: int = 50  # judged experiences per group before a decision
    margin: float = 0.02  # micro-F1 the canary may lose against the rest and still promote
    reward_margin: float | None = None  # mean reward it may lose; None = reported only
    max_wait_s: float = 3600.0  # then hold (see the module docstring)

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
        if not chosen and known:
            chosen = known[:1]  # at least one canary
        if len(known) > 1 and len(chosen) == len(known):
            chosen = chosen[:-1]  # at least one robot left on the running version
        return cls(frozenset(chosen), config.fraction)


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

@dataclass
class GroupFigures:
    """What one group's experiences show: counts for micro-F1 and the reward mean."""

    versions: tuple[int, ...]
    experiences: int = 0
    judged: int = 0  # experiences with ``required`` (hindsight)
    tp: int = 0
    fp: int = 0
    fn: int = 0
    rewarded: int = 0
    reward_sum: float = 0.0
    robots: set[str] = field(default_factory=set)

    @property
    def micro_f1(self) -> float | None:
        """Micro-F1 of activations against ``required``; None before any judged one."""
        if not self.judged:
            return None
        if self.tp + self.fp + self.fn == 0:
            return 1.0  # nothing needed, nothing activated
        return 2 * self.tp / (2 * self.tp + self.fp + self.fn)

    @property
    def mean_reward(self) -> float | None:
        """Mean reward of the experiences that carry one."""
        return self.reward_sum / self.rewarded if self.rewarded else None

    def add(self, experience: Experience, thresholds: dict[str, float],
            labels: frozenset[str]) -> None:
        """Count one experience of this group."""
        self.experiences += 1
        self.robots.add(experience.robot_id)
        if experience.reward is not None and math.isfinite(experience.reward):
            self.rewarded += 1
            self.reward_sum += float(experience.reward)
        if experience.required is None:
            return
        active = {label for label, p in zip(experience.labels,
                                            experience.probabilities.tolist(), strict=False)
                  if label in labels and p >= thresholds[label]}
        needed = set(experience.required) & labels
        self.judged += 1
        self.tp += len(active & needed)
        self.fp += len(active - needed)
        self.fn += len(needed - active)

    def to_dict(self) -> dict:
        """JSON-ready form, with the derived figures."""
        out = asdict(self)
        out["robots"] = sorted(self.robots)
        out["micro_f1"] = None if self.micro_f1 is None else round(self.micro_f1, 4)
        out["mean_reward"] = None if self.mean_reward is None else round(self.mean_reward, 4)
        return out


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

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"action": self.action, "reason": self.reason,
                "canary": self.canary.to_dict(), "control": self.control.to_dict(),
                "waited_s": round(self.waited_s, 3), "version": self.version,
                "published_version": self.published_version, "pushed_to": self.pushed_to}


def decide(canary: GroupFigures, control: GroupFigures, config: CanaryConfig,
           waited_s: float) -> Decision:
    """The margin rule with a minimum sample (module docstring: why not a test)."""
    need = config.min_feedback
    f1_ready = canary.judged >= need and control.judged >= need
    reward_ready = (config.reward_margin is not None and canary.rewarded >= need
                    and control.rewarded >= need)
    if not (f1_ready or reward_ready):
        evidence = (f"judged experiences: canary {canary.judged}, others {control.judged}, "
                    f"{need} each needed")
        if waited_s < config.max_wait_s:
            return Decision("wait", evidence, canary, control, waited_s)
        return Decision("hold", f"max wait {config.max_wait_s:g} s passed without enough "
                        f"evidence ({evidence}): neither promoted nor rolled back",
                        canary, control, waited_s)
    worse = []
    if f1_ready and control.micro_f1 - canary.micro_f1 > config.margin:
        worse.append(f"micro-F1 {canary.micro_f1:.3f} vs {control.micro_f1:.3f} "
                     f"(margin {config.margin:g})")
    if reward_ready and control.mean_reward - canary.mean_reward > config.reward_margin:
        worse.append(f"mean reward {canary.mean_reward:.3f} vs {control.mean_reward:.3f} "
                     f"(margin {config.reward_margin:g})")
    if worse:
        return Decision("rollback", "canary worse: " + "; ".join(worse), canary, control,
                        waited_s)
    said = []
    if f1_ready:
        said.append(f"micro-F1 {canary.micro_f1:.3f} vs {control.micro_f1:.3f}")
    if reward_ready:
        said.append(f"mean reward {canary.mean_reward:.3f} vs {control.mean_reward:.3f}")
    return Decision("promote", "canary not worse by more than the margin: "
                    + "; ".join(said), canary, control, waited_s)


class LiveFigures:
    """Accumulates the two groups' figures from experiences (thread-safe, O(1) memory).

    ``versions`` are the canary version and the control versions (the running version
    and any version carrying the same model, i.e. what a rollback republished); each
    version's thresholds and, when known, its ONNX sha256. Experiences of any other
    version (a pinned robot, one still on an older bundle) are counted in ``ignored``.
    """

    def __init__(self, canary_version: int, control_versions: Iterable[int],
                 thresholds: dict[int, dict[str, float]],
                 sha256: dict[int, str] | None = None) -> None:
        self.canary_version = canary_version
        self.control_versions = frozenset(control_versions) - {canary_version}
        if not self.control_versions:
            raise ValueError("LiveFigures needs at least one control version")
        missing = sorted({canary_version, *self.control_versions} - set(thresholds))
        if missing:
            raise ValueError(f"LiveFigures: no thresholds for versions {missing}")
        self.thresholds = thresholds
        self.sha256 = dict(sha256 or {})
        shared = set(thresholds[canary_version])
        for version in self.control_versions:
            shared &= set(thresholds[version])
        self.labels = frozenset(shared)
        self.canary = GroupFigures((canary_version,))
        self.control = GroupFigures(tuple(sorted(self.control_versions)))
        self.ignored = 0
        self._lock = threading.Lock()

    def observe(self, experiences: Iterable[Experience]) -> None:
        """Count each experience in the group of the version that produced it."""
        with self._lock:
            for exp in experiences:
                version = exp.bundle_version
                if version == self.canary_version:
                    group = self.canary
                elif version in self.control_versions:
                    group = self.control
                else:
                    self.ignored += 1
                    continue
                known = self.sha256.get(version)
                if exp.bundle_sha256 and known and exp.bundle_sha256 != known:
                    self.ignored += 1  # a bundle of the robot's own under that number
                    continue
                group.add(exp, self.thresholds[version], self.labels)

    def snapshot(self) -> tuple[GroupFigures, GroupFigures]:
        """Copies of (canary, control) figures, consistent with each other."""
        with self._lock:
            return (_copy(self.canary), _copy(self.control))


def _live_figures(candidate: Bundle, running: Bundle) -> LiveFigures:
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
    return LiveFigures(version, control, thresholds, sha)


def _copy(figures: GroupFigures) -> GroupFigures:
    return GroupFigures(**{**asdict(figures), "robots": set(figures.robots)})


def evaluate(experiences: Sequence[Experience], canary_version: int,
             control_versions: Iterable[int], thresholds: dict[int, dict[str, float]],
             config: CanaryConfig, waited_s: float,
             sha256: dict[int, str] | None = None) -> Decision:
    """Live figures from ``experiences`` and the decision on them (the pure entry point)."""
    figures = LiveFigures(canary_version, control_versions, thresholds, sha256)
    figures.observe(experiences)
    decision = decide(figures.canary, figures.control, config, waited_s)
    decision.version = canary_version
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
                             _live_figures(candidate, running), self.clock())
        try:
            publication = self.publisher.publish(candidate, push=send, link=False)
        except BaseException:
            self.run = None
            raise
        self._save(self.run, store_mark)
        log.info("canary: v%d pushed to %s robot connections of canaries %s (others stay on "
                 "v%d)", publication.version, publication.pushed_to,
                 sorted(selector.chosen) or "none connected yet", running.version)
        return publication

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
                "canary v%d: %s%s: %s (canary %s, others %s)", run.version,
                decision.action.upper(),
                "" if publication is None else f" as v{publication.version}",
                decision.reason, decision.canary.to_dict(), decision.control.to_dict())
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
        figures = _live_figures(load_bundle(folder), running)
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
