"""Promoted knowledge units -> the ``rules.json`` artefact the robot's tracker runs.

Why bounds learned here: the robot holds ``consider:C`` from the completion of A...B until
C or a horizon, and drops an A once it is older than the rule's largest A -> B gap. Both
numbers come from the gaps between the rule's events in the experiences that supported it,
in seconds of the node clock, measured with ``policy.anticipation_rules.chain_gaps`` (the
tracker's own chaining, with unbounded gaps), so the bound is about exactly what the
tracker will meet. Per step the bound is ``quantile(gaps, q) * margin`` (times
``(max/min) ** (tail / n)`` when ``tail`` > 0, the upper-end estimate of a log-uniform law
from n samples), clipped to [``min_s``, ``max_s``].

Why the defaults (q = 1, A -> B margin 2, B -> C margin 1.25, no tail), measured with
``bench/anticipation.py`` (gaps log-uniform 2..300 s, 6 seeds, 40 rule episodes and 10 of
every other kind each): with n = 8 supporting chains the longest gap seen is below 150 s
about a third of the time. A too-short A -> B bound loses the whole mission, while an
A -> B bound that is too long only chains an A that is older than any seen, so that margin
is wide (2 reaches 95 % of rule missions at n = 8 and 100 % at n = 16; 1.25 reached 91 %
and 98 %). A horizon that is too long holds ``consider:C`` past the longest real B -> C gap
on every A...B that C never follows, so that margin stays small: 1.25 gives frame recall
0.956 / 0.997 (n = 8 / 16) at 0.8 % / 0.5 % false-fire frames (counted against the
generator's longest gap, the strict reading), the tail estimate 0.956 / 0.998 at 2.7 % /
0.9 %. A unit with no timed chain (experiences lost, or an episode longer than the history
the node ships) gets ``default_s``, the longest bound the tracker will hold, and
``samples`` 0 in the artefact so an operator can tell.

Event times come from the experiences themselves (``event_times``): each experience
carries its episode's event history up to its frame, so an event's time is the stamp of the
first experience whose history holds it (late by at most one shipped frame period).

Where it runs: in the consolidation round, after retraining, with the round's promoted units
and experiences: ``write_rules(folder, promoted, event_times(experiences))``, then the two
files are listed (sha256) in the candidate bundle's ``extras.artefacts`` beside the value
and memctl artefacts, so the bundle signature covers them.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from thinkmem_ros.consolidator.knowledge import KnowledgeUnit
from thinkmem_ros.link.experience import Experience
from thinkmem_ros.policy.anticipation_rules import (
    RULES_FILES,
    AnticipationRule,
    RuleSet,
    chain_gaps,
)

Timeline = list[tuple[float, str]]  # (node-clock seconds, event name), arrival order


@dataclass
class ExportConfig:
    """How observed gaps become the shipped bounds (see the module docstring)."""

    quantile: float = 1.0
    gap_margin: float = 2.0  # antecedent steps (A -> B)
    gap_tail: float = 0.0
    horizon_margin: float = 1.25  # last step (B -> C)
    horizon_tail: float = 0.0  # widen by (max/min) ** (tail / n): few samples, wider bound
    min_s: float = 5.0
    max_s: float = 900.0
    default_s: float = 900.0
    min_samples: int = 1

    def __post_init__(self) -> None:
        if not 0.0 < self.quantile <= 1.0:
            raise ValueError(f"ExportConfig.quantile must be in (0, 1], got {self.quantile}")
        for key in ("gap_margin", "horizon_margin"):
            if not (math.isfinite(getattr(self, key)) and getattr(self, key) >= 1.0):
                raise ValueError(f"ExportConfig.{key} must be >= 1, got {getattr(self, key)}")
        for key in ("gap_tail", "horizon_tail"):
            if not (math.isfinite(getattr(self, key)) and getattr(self, key) >= 0.0):
                raise ValueError(f"ExportConfig.{key} must be >= 0, got {getattr(self, key)}")
        if not (math.isfinite(self.max_s) and 0.0 < self.min_s <= self.max_s):
            raise ValueError(f"ExportConfig needs 0 < min_s <= max_s (finite), got "
                             f"min_s={self.min_s}, max_s={self.max_s}")
        if not self.min_s <= self.default_s <= self.max_s:
            raise ValueError(f"ExportConfig.default_s must be in [min_s, max_s], got "
                             f"{self.default_s}")
        if isinstance(self.min_samples, bool) or not isinstance(self.min_samples, int) \
                or self.min_samples < 1:
            raise ValueError(f"ExportConfig.min_samples must be an integer >= 1, got "
                             f"{self.min_samples!r}")


def event_times(experiences: Iterable[Experience]) -> dict[tuple[str, str], Timeline]:
    """Each episode's events with the stamp of the first experience that carries them.

    Histories are capped at the node's ``max_events``; when a capped history has shifted,
    the new events are found by the longest overlap of the previous history's tail with
    the new history's head.
    """
    by_episode: dict[tuple[str, str], list[Experience]] = {}
    for exp in experiences:
        by_episode.setdefault((exp.robot_id, exp.episode_id), []).append(exp)
    out: dict[tuple[str, str], Timeline] = {}
    for key, exps in by_episode.items():
        exps.sort(key=lambda e: (e.stamp, e.seq))
        seen: list[str] = []
        timeline: Timeline = []
        for exp in exps:
            events = list(exp.events)
            if events[:len(seen)] == seen:
                new = events[len(seen):]
            else:
                new = events[_overlap(seen, events):]
            timeline.extend((float(exp.stamp), name) for name in new)
            seen = events
        out[key] = timeline
    return out


def _overlap(previous: list[str], current: list[str]) -> int:
    """Length of the longest tail of ``previous`` that is a head of ``current``."""
    for n in range(min(len(previous), len(current)), 0, -1):
        if previous[-n:] == current[:n]:
            return n
    return 0


def observed_gaps(unit: KnowledgeUnit, timelines: Iterable[Timeline]
                  ) -> list[tuple[float, ...]]:
    """Every closed chain's gaps (A->B, ..., last->C) over the episodes, in seconds."""
    out: list[tuple[float, ...]] = []
    for timeline in timelines:
        out.extend(chain_gaps(unit.antecedent, unit.consequence, list(timeline)))
    return out


def _quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) without numpy."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _bound(values: Sequence[float], cfg: ExportConfig, margin: float, tail: float) -> float:
    raw = _quantile(values, cfg.quantile) * margin
    low, high = max(min(values), 1e-3), max(max(values), 1e-3)
    if tail > 0 and len(values) > 1:
        raw *= (high / low) ** (tail / len(values))
    return float(min(max(raw, cfg.min_s), cfg.max_s))


def rule_for(unit: KnowledgeUnit, gaps: Sequence[tuple[float, ...]],
             cfg: ExportConfig) -> AnticipationRule:
    """One unit's rule with bounds from its observed chain gaps (defaults without any)."""
    steps = len(unit.pattern) - 1  # A->B, ..., last->C
    usable = [g for g in gaps if len(g) == steps and all(math.isfinite(x) for x in g)]
    if len(usable) >= cfg.min_samples:
        bounds = [_bound([g[k] for g in usable], cfg, cfg.gap_margin, cfg.gap_tail)
                  for k in range(steps - 1)]
        bounds.append(_bound([g[-1] for g in usable], cfg, cfg.horizon_margin,
                             cfg.horizon_tail))
    else:
        bounds = [cfg.default_s] * steps
        usable = []
    return AnticipationRule(antecedent=unit.antecedent, consequent=unit.consequence,
                            thinking=unit.thinking, max_gaps_s=tuple(bounds[:-1]),
                            horizon_s=bounds[-1],
                            confidence=min(max(float(unit.confidence), 0.0), 1.0),
                            samples=len(usable))


def build_rules(units: Iterable[KnowledgeUnit],
                timelines: dict[object, Timeline] | Iterable[Timeline],
                config: ExportConfig | None = None, info: dict | None = None) -> RuleSet:
    """The rule set of the promoted units (others are skipped), bounds from the timelines."""
    cfg = config or ExportConfig()
    episodes = list(timelines.values()) if isinstance(timelines, dict) else list(timelines)
    rules = []
    for unit in units:
        if not unit.active:
            continue
        rules.append(rule_for(unit, observed_gaps(unit, episodes), cfg))
    rules.sort(key=lambda r: r.key)
    return RuleSet(tuple(rules), {"export": asdict(cfg), "episodes": len(episodes),
                                  **(info or {})})


def write_rules(folder: Path | str, units: Iterable[KnowledgeUnit],
                timelines: dict[object, Timeline] | Iterable[Timeline],
                config: ExportConfig | None = None, info: dict | None = None) -> RuleSet:
    """Build the promoted units' rules and save ``rules.json`` + ``rules.meta.json`` there.

    An empty rule set is written too: a bundle that ships no rule tells the robot to stop
    anticipating the previous bundle's rules.
    """
    rules = build_rules(units, timelines, config, info)
    rules.save(folder)
    return rules


def listed_files(folder: Path | str) -> dict[str, str]:
    """{file: sha256} of the rules artefact in ``folder``, for ``extras["artefacts"]``.

    The consolidator cannot import the robot's ``thinking_gates.attach_artefacts``; a round
    puts this map (merged with the value/memctl files') into the candidate's extras when it
    exports the bundle and copies the files next to ``policy.onnx``.
    """
    folder = Path(folder)
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
            for name in RULES_FILES if (folder / name).is_file()}
