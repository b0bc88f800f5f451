"""Hidden long-range rules A...B...C overlaid on signal streams, in missions (episodes).

Why: the world's signal scenarios have no regularity that spans unrelated events far
apart, so a consolidation round would have nothing to discover. The overlay adds some, the
way seed 000's Exp 6 does, without touching the signals or the per-frame thinking ground
truth: a stream is cut into missions (each opened by an ``episode_start`` marker on the
events topic, so the node starts a new episode there), and each mission gets one *kind* of
evidence for one rule on the events topic:

=============  ===================================================================
kind           events added to the mission (times as fractions of its length)
=============  ===================================================================
``rule``       A at 0.10-0.25, B at 0.35-0.50, C at 0.75-0.90  (A...B...C)
``prefix``     A, B as above, no C            (counterexample: A...B not followed)
``reversed``   B at 0.10-0.25, A at 0.35-0.50 (reverse-order evidence B...A)
``isolated``   one of A, B or C alone
``neutral``    nothing
=============  ===================================================================

The stream's natural events stay where they are, between and around the planted ones, so
A...B...C is long-range: other events separate its steps. The rules are predictive
regularities the world hides, not causes; a round must find them from experiences alone.
The demo plants one rule, ``thinkmem bench rounds`` several (a new one each round).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from thinkmem_ros.core.data import SignalStream
from thinkmem_ros.core.vocabulary import DISCOVERED_PREFIX, EPISODE_START_EVENT

KINDS = ("rule", "prefix", "reversed", "isolated", "neutral")
"""Kinds of rule evidence a mission can carry (see the module docstring)."""
HELD_SHARE = 0.8
"""A rule mission is *held* when ``consider:C`` is active on this share of its B..C frames."""


@dataclass(frozen=True)
class PlantedRule:
    """A planted regularity: antecedent (A, B) and consequence C, as event names."""

    first: str
    second: str
    consequence: str

    def __post_init__(self) -> None:
        names = (self.first, self.second, self.consequence)
        if len(set(names)) != 3 or not all(names):
            raise ValueError(f"a rule needs three distinct non-empty event names, got {names}")
        if EPISODE_START_EVENT in names:
            raise ValueError(f"a rule cannot use the episode marker {EPISODE_START_EVENT!r}")

    @property
    def pattern(self) -> tuple[str, str, str]:
        """A, B, C in order."""
        return (self.first, self.second, self.consequence)

    @property
    def thinking(self) -> str:
        """The discovered thinking a round should add: consider the consequence."""
        return f"{DISCOVERED_PREFIX}{self.consequence}"


@dataclass(frozen=True)
class Mission:
    """One episode of a planted stream: its span, its kind, its rule, the times of A/B/C."""

    start_s: float
    end_s: float
    kind: str
    times: dict[str, float] = field(default_factory=dict)  # event name -> time (s)
    rule: PlantedRule | None = None


def mission_kinds(n: int, rng: np.random.Generator, *, rule_share: float = 0.625) -> list[str]:
    """Kinds for ``n`` missions: ``rule_share`` of them A...B...C, the rest counter-evidence.

    The counter-evidence cycles through prefix, reversed, isolated, neutral so even a short
    history holds each kind of evidence discovery weighs against a candidate; the order is
    shuffled by ``rng`` so rule missions spread over time (discovery wants stability across
    temporal partitions).
    """
    if n < 1:
        raise ValueError(f"mission count must be >= 1, got {n}")
    if not 0.0 <= rule_share <= 1.0:
        raise ValueError(f"rule_share must be in [0, 1], got {rule_share}")
    n_rule = int(round(rule_share * n))
    others = [KINDS[1 + i % 4] for i in range(n - n_rule)]
    kinds = ["rule"] * n_rule + others
    return [kinds[i] for i in rng.permutation(n)]


def _place(kind: str, rule: PlantedRule, start: float, length: float,
           rng: np.random.Generator) -> dict[str, float]:
    """Event times of one mission of ``kind`` (see the table in the module docstring)."""
    def at(lo: float, hi: float) -> float:
        return float(start + length * rng.uniform(lo, hi))

    a, b, c = rule.pattern
    if kind == "rule":
        return {a: at(0.10, 0.25), b: at(0.35, 0.50), c: at(0.75, 0.90)}
    if kind == "prefix":
        return {a: at(0.10, 0.25), b: at(0.35, 0.50)}
    if kind == "reversed":
        return {b: at(0.10, 0.25), a: at(0.35, 0.50)}
    if kind == "isolated":
        return {str(rng.choice(rule.pattern)): at(0.20, 0.80)}
    if kind == "neutral":
        return {}
    raise ValueError(f"unknown mission kind {kind!r}; expected one of {KINDS}")


MIN_MISSION_S = 2.0
"""Shortest mission a rule's A...B...C (and its counter-evidence) is planted in."""


def plant_rules(stream: SignalStream, plan: list[tuple[str, PlantedRule]],
                rng: np.random.Generator) -> tuple[SignalStream, list[Mission]]:
    """Cut ``stream`` into ``len(plan)`` equal missions; mission i gets ``plan[i]``'s evidence.

    Returns a new stream (signals and labels shared, events extended and re-sorted) and
    the missions. Natural events that already use one of a rule's names are left in
    place: they are genuine noise the discovery statistics have to live with.
    """
    if not plan:
        raise ValueError("need at least one mission")
    length = stream.duration_s / len(plan)
    if length < MIN_MISSION_S:
        raise ValueError(f"missions of {length:.2f} s are too short (need >= "
                         f"{MIN_MISSION_S:g} s each)")
    events = list(stream.events)
    missions = []
    for i, (kind, rule) in enumerate(plan):
        start = i * length
        times = _place(kind, rule, start, length, rng)
        events.append((start, EPISODE_START_EVENT))
        events.extend((t, name) for name, t in times.items())
        missions.append(Mission(start, start + length, kind, times, rule))
    events.sort(key=lambda e: (e[0], e[1] != EPISODE_START_EVENT))  # marker first at a tie
    return replace(stream, events=events), missions


def plant_rule(stream: SignalStream, kinds: list[str], rule: PlantedRule,
               rng: np.random.Generator) -> tuple[SignalStream, list[Mission]]:
    """One rule in every mission: ``kinds[i]`` is mission i's kind of evidence."""
    return plant_rules(stream, [(kind, rule) for kind in kinds], rng)


def anticipation(missions: list[Mission], rule: PlantedRule, times_s: np.ndarray,
                 fired: np.ndarray, evaluated: np.ndarray) -> dict:
    """How often ``consider:C`` fired after B and before C, and how often it fired elsewhere.

    ``fired`` (T,) says whether the activation matched to each frame held the rule's
    thinking; ``evaluated`` (T,) which frames got an activation at all. Only missions of
    ``rule`` count (a mission planted with another rule is "elsewhere"). A rule mission
    counts as *anticipated* when any evaluated frame strictly between B and C fired, and as
    *held* when at least ``HELD_SHARE`` of those frames did (a flicker is not held). The
    false-fire rate is over evaluated frames outside every B..C interval of a rule mission
    and outside the rest of prefix missions after B (where A...B did occur, so the
    thinking is what the rule asks for even though C never came).
    """
    a, b, c = rule.pattern
    times_s = np.asarray(times_s)
    fired = np.asarray(fired, dtype=bool)
    evaluated = np.asarray(evaluated, dtype=bool)
    expected = np.zeros(times_s.shape, dtype=bool)
    excused = np.zeros(times_s.shape, dtype=bool)
    rows = []
    for m in missions:
        if m.rule is not None and m.rule != rule:
            continue
        if m.kind == "rule":
            window = (times_s > m.times[b]) & (times_s < m.times[c]) & evaluated
            expected |= window
            lead = times_s[window & fired]
            rows.append({"start_s": round(m.start_s, 3), "b_s": round(m.times[b], 3),
                         "c_s": round(m.times[c], 3), "frames": int(window.sum()),
                         "fired_frames": int((window & fired).sum()),
                         "anticipated": bool(lead.size),
                         "held": bool(window.any()
                                      and (window & fired).sum() >= HELD_SHARE * window.sum()),
                         "lead_s": round(float(m.times[c] - lead.min()), 3)
                         if lead.size else 0.0})
        elif m.kind == "prefix":
            excused |= (times_s > m.times[b]) & (times_s < m.end_s)
    outside = evaluated & ~expected & ~excused
    n_rule = len(rows)
    return {
        "pattern": list(rule.pattern), "thinking": rule.thinking, "rule_missions": n_rule,
        "anticipated": sum(r["anticipated"] for r in rows),
        "anticipation_rate": (sum(r["anticipated"] for r in rows) / n_rule) if n_rule else 0.0,
        "held": sum(r["held"] for r in rows),
        "frame_recall": (float((expected & fired).sum() / expected.sum())
                         if expected.any() else 0.0),
        "expected_frames": int(expected.sum()),
        "false_fire_rate": float((outside & fired).sum() / outside.sum()) if outside.any()
        else 0.0,
        "missions": rows,
    }
