"""Promoted A...B...C rules shipped beside the policy (``rules.json`` + ``rules.meta.json``).

Why an artefact and not only training material: the policy sees the last M event ids
without their times, so during a long B -> C gap A falls out of view and ``consider:C``
flickers instead of holding. The rules themselves are tiny (a few codes and three numbers
each), so the consolidator ships them with the bundle and the robot tracks A...B progress
with real event times (``policy/anticipation.py``). The consolidator writes the artefact
(``consolidator/anticipation_export.py``), the robot reads it; both import this module,
which is plain Python (no numpy, no torch).

One rule: ``antecedent`` (the ordered codes A, B, ...), ``consequent`` C, ``thinking``
(``consider:C``), ``max_gaps_s`` (per consecutive antecedent step, the longest gap that
still counts as the same chain) and ``horizon_s`` (how long after the last antecedent
event the thinking stays active when C does not come). Both bounds are learned from the
gaps observed in the supporting episodes (a high quantile times a margin, clipped).

``RuleProgress`` is the one definition of "an A...B prefix is open": the robot's tracker
runs it per rule, and the consolidator runs it with unbounded gaps to measure the gaps it
learns the bounds from, so the bounds describe exactly what the tracker will see.
Semantics, per event at time t (events in arrival order):

- C while the full antecedent is complete closes the anticipation and consumes the chain:
  every stage is cleared, a new A is needed for the next one (A, B, C, B does not re-open);
- an antecedent code a_k extends the latest chain that ended in a_(k-1) when
  t - t_(k-1) <= max_gaps_s[k-1] (the latest earlier end is always the best candidate);
  stages are visited from the last to the first, so one event never fills two stages
  (A...A...C needs two A's), and a_1 always (re)starts a chain: a repeated A refreshes it;
- the anticipation is open from the completion of the antecedent for ``horizon_s``; a
  later completion (B again, with an A still within its gap) restarts the horizon.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from thinkmem_ros.policy.bundle import read_artefact_files, unique_keys_object, verify_artefact

RULES_JSON = "rules.json"
RULES_META = "rules.meta.json"
RULES_FILES = (RULES_JSON, RULES_META)
"""Both files travel in the bundle; list them in ``extras.artefacts`` so the signature covers
them."""
ARTEFACT_VERSION = 1
MAX_RULES = 4096
MAX_ANTECEDENT = 8
MAX_NAME = 128
MAX_SECONDS = 7 * 24 * 3600.0  # a gap or horizon beyond a week is a unit error, not a rule


class RulesArtefactError(ValueError):
    """The rules artefact is missing, malformed or does not match its hash."""


def _name(value: object, what: str) -> str:
    if type(value) is not str or not value or len(value) > MAX_NAME or value != value.strip():
        raise RulesArtefactError(f"{what} must be a non-empty name of <= {MAX_NAME} characters "
                                 f"without surrounding spaces, got {value!r}")
    return value


def _seconds(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and 0.0 < value <= MAX_SECONDS):
        raise RulesArtefactError(f"{what} must be a number of seconds in (0, {MAX_SECONDS:g}], "
                                 f"got {value!r}")
    return float(value)


@dataclass(frozen=True)
class AnticipationRule:
    """One promoted unit as the robot needs it: what opens, what closes, how long."""

    antecedent: tuple[str, ...]
    consequent: str
    thinking: str
    max_gaps_s: tuple[float, ...]  # len(antecedent) - 1
    horizon_s: float
    confidence: float = 0.0
    samples: int = 0  # supporting chains the bounds were learned from (0 = default bounds)

    def __post_init__(self) -> None:
        ante = self.antecedent
        if isinstance(ante, str) or not isinstance(ante, (tuple, list)):
            raise RulesArtefactError(f"antecedent must be a list of codes, got {ante!r}")
        if not 1 <= len(ante) <= MAX_ANTECEDENT:
            raise RulesArtefactError(f"antecedent must hold 1..{MAX_ANTECEDENT} codes, got "
                                     f"{len(ante)}")
        object.__setattr__(self, "antecedent",
                           tuple(_name(c, "antecedent code") for c in ante))
        _name(self.consequent, "consequent")
        _name(self.thinking, "thinking")
        gaps = self.max_gaps_s
        if isinstance(gaps, str) or not isinstance(gaps, (tuple, list)) or \
                len(gaps) != len(ante) - 1:
            raise RulesArtefactError(f"max_gaps_s must hold {len(ante) - 1} gap(s) for "
                                     f"antecedent {list(ante)}, got {gaps!r}")
        object.__setattr__(self, "max_gaps_s",
                           tuple(_seconds(g, "max_gaps_s entry") for g in gaps))
        object.__setattr__(self, "horizon_s", _seconds(self.horizon_s, "horizon_s"))
        c = self.confidence
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0.0 <= c <= 1.0:
            raise RulesArtefactError(f"confidence must be in [0, 1], got {c!r}")
        object.__setattr__(self, "confidence", float(c))
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or \
                self.samples < 0:
            raise RulesArtefactError(f"samples must be an integer >= 0, got {self.samples!r}")

    @property
    def key(self) -> str:
        """The pattern joined with '>' (the knowledge unit's key)."""
        return ">".join((*self.antecedent, self.consequent))

    @property
    def span_s(self) -> float:
        """Longest time from the first antecedent event to the end of the horizon."""
        return sum(self.max_gaps_s) + self.horizon_s

    def to_dict(self) -> dict:
        """JSON-ready form (field order fixed)."""
        return {"antecedent": list(self.antecedent), "consequent": self.consequent,
                "thinking": self.thinking, "max_gaps_s": list(self.max_gaps_s),
                "horizon_s": self.horizon_s, "confidence": self.confidence,
                "samples": self.samples}

    @classmethod
    def from_dict(cls, data: object) -> AnticipationRule:
        """Build from ``to_dict`` output; RulesArtefactError names what is wrong."""
        if not isinstance(data, dict):
            raise RulesArtefactError(f"a rule must be a JSON object, got {type(data).__name__}")
        known = {"antecedent", "consequent", "thinking", "max_gaps_s", "horizon_s",
                 "confidence", "samples"}
        if unknown := sorted(set(data) - known):
            raise RulesArtefactError(f"unknown rule keys {unknown}")
        if missing := sorted({"antecedent", "consequent", "thinking", "max_gaps_s",
                              "horizon_s"} - set(data)):
            raise RulesArtefactError(f"rule lacks keys {missing}")
        return cls(antecedent=data["antecedent"], consequent=data["consequent"],
                   thinking=data["thinking"], max_gaps_s=data["max_gaps_s"],
                   horizon_s=data["horizon_s"], confidence=data.get("confidence", 0.0),
                   samples=data.get("samples", 0))


@dataclass(frozen=True)
class RuleSet:
    """The rules one bundle ships, plus free-form provenance (round, gap statistics)."""

    rules: tuple[AnticipationRule, ...] = ()
    info: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rules", tuple(self.rules))
        if len(self.rules) > MAX_RULES:
            raise RulesArtefactError(f"{len(self.rules)} rules exceed {MAX_RULES}")
        keys = [r.key for r in self.rules]
        if len(set(keys)) != len(keys):
            dup = sorted({k for k in keys if keys.count(k) > 1})
            raise RulesArtefactError(f"duplicate rules {dup}")

    @property
    def labels(self) -> tuple[str, ...]:
        """Thinking labels the rules decide, first-seen order."""
        return tuple(dict.fromkeys(r.thinking for r in self.rules))

    def rules_json(self) -> str:
        """Canonical text of ``rules.json`` (its hash is the rule set's identity)."""
        return json.dumps({"rules": [r.to_dict() for r in self.rules], "info": self.info},
                          sort_keys=True, indent=1) + "\n"

    @property
    def digest(self) -> str:
        """sha256 of the rules alone (not ``info``): equal digests = the same behaviour."""
        text = json.dumps([r.to_dict() for r in self.rules], sort_keys=True)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def save(self, folder: Path | str) -> Path:
        """Write ``rules.json`` then ``rules.meta.json`` (with its sha256) into ``folder``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        raw = self.rules_json().encode("utf-8")
        path = folder / RULES_JSON
        tmp = folder / (RULES_JSON + ".tmp")
        tmp.write_bytes(raw)
        os.replace(tmp, path)
        meta = {"artefact_version": ARTEFACT_VERSION, "sha256": hashlib.sha256(raw).hexdigest(),
                "rules": len(self.rules), "labels": list(self.labels), "digest": self.digest}
        (folder / RULES_META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, folder: Path | str) -> RuleSet:
        """Read and validate the rules, verifying ``rules.json`` against the recorded sha256."""
        folder = Path(folder)
        files = read_artefact_files(folder, (RULES_META, RULES_JSON), RulesArtefactError,
                                    "anticipation rules")
        return cls.from_files(folder, files)

    @classmethod
    def from_files(cls, folder: Path | str, files: dict[str, bytes]) -> RuleSet:
        """Parse the rules from bytes already read: {rules.meta.json: ..., rules.json: ...}.

        Why: a caller that checked these bytes (against a bundle's signed list) must get
        the rules those bytes hold; reading the files again would load whatever replaced
        them meanwhile. ``folder`` only names the files in errors (as ``load``).
        """
        folder = Path(folder)
        _, raw = verify_artefact(folder, files, RULES_META, RULES_JSON, ARTEFACT_VERSION,
                                 RulesArtefactError, "anticipation rules")
        data = _rules_document(raw, folder / RULES_JSON)
        rules = []
        for i, item in enumerate(data["rules"]):
            try:
                rules.append(AnticipationRule.from_dict(item))
            except RulesArtefactError as exc:
                raise RulesArtefactError(f"{folder / RULES_JSON}: rule {i}: {exc}") from None
        info = data.get("info", {})
        try:
            return cls(tuple(rules), info if isinstance(info, dict) else {})
        except RulesArtefactError as exc:
            raise RulesArtefactError(f"{folder / RULES_JSON}: {exc}") from None


def _rules_document(raw: bytes, source: Path) -> dict:
    """``{'rules': [...], ...}`` parsed from verified bytes; RulesArtefactError naming ``source``.

    Why the length check before any rule is built: the count bound must hold however large
    the list, so a file of a million rules is refused without constructing them.
    """
    try:
        data = json.loads(raw.decode("utf-8"), object_pairs_hook=unique_keys_object)
    except RecursionError:
        raise RulesArtefactError(f"{source}: nested too deeply") from None
    except ValueError as exc:  # UnicodeDecodeError, JSONDecodeError
        raise RulesArtefactError(f"{source}: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        raise RulesArtefactError(f"{source}: expected {{'rules': [...]}}")
    if len(data["rules"]) > MAX_RULES:
        raise RulesArtefactError(f"{source}: {len(data['rules'])} rules exceed {MAX_RULES}")
    return data


class RuleProgress:
    """Where one rule stands on an event stream (semantics in the module docstring).

    ``ends[k]`` is the time the latest valid chain a_1..a_(k+1) ended, or None; ``starts``
    the chain's event times (for gap measurement). Plain Python, O(len(antecedent)) per event.
    """

    __slots__ = ("antecedent", "consequent", "max_gaps", "ends", "chains")

    def __init__(self, antecedent: tuple[str, ...], consequent: str,
                 max_gaps: tuple[float, ...]) -> None:
        if len(max_gaps) != len(antecedent) - 1:
            raise ValueError(f"need {len(antecedent) - 1} max gaps, got {len(max_gaps)}")
        self.antecedent = tuple(antecedent)
        self.consequent = consequent
        self.max_gaps = tuple(max_gaps)
        self.ends: list[float | None] = [None] * len(self.antecedent)
        self.chains: list[tuple[float, ...]] = [()] * len(self.antecedent)

    @classmethod
    def for_rule(cls, rule: AnticipationRule) -> RuleProgress:
        """Progress with the rule's learned gaps."""
        return cls(rule.antecedent, rule.consequent, rule.max_gaps_s)

    @property
    def open_since(self) -> float | None:
        """When the full antecedent last completed (None: no open prefix)."""
        return self.ends[-1]

    def reset(self) -> None:
        """Forget every partial and complete chain."""
        n = len(self.antecedent)
        self.ends = [None] * n
        self.chains = [()] * n

    def observe(self, name: str, t: float) -> tuple[float, ...] | None:
        """Advance on one event; returns the closed chain's times (A, ..., B, C) when C closes."""
        closed = None
        if name == self.consequent and self.ends[-1] is not None:
            closed = (*self.chains[-1], t)
            self.reset()
        for k in range(len(self.antecedent) - 1, -1, -1):
            if self.antecedent[k] != name:
                continue
            if k == 0:
                self.ends[0], self.chains[0] = t, (t,)
                continue
            prev = self.ends[k - 1]
            if prev is not None and t - prev <= self.max_gaps[k - 1]:
                self.ends[k], self.chains[k] = t, (*self.chains[k - 1], t)
        return closed


def chain_gaps(antecedent: tuple[str, ...], consequent: str,
               events: list[tuple[float, str]]) -> list[tuple[float, ...]]:
    """Gaps (A->B, ..., last->C) of every chain C closed in one episode, unbounded gaps.

    ``events`` are (time, name) in arrival order. This is ``RuleProgress`` with infinite
    gaps, so the gaps are the ones the robot's tracker would measure on the same stream.
    """
    progress = RuleProgress(tuple(antecedent), consequent,
                            (math.inf,) * (len(antecedent) - 1))
    out = []
    for t, name in events:
        closed = progress.observe(name, t)
        if closed is not None:
            out.append(tuple(b - a for a, b in zip(closed, closed[1:])))
    return out
