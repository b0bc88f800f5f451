"""Knowledge units k = (P, R, Delta, g, c, E) and their life cycle across consolidation rounds.

Discovery says what the CURRENT buffer supports; knowledge is what survives across rounds.
Each round, every unit's confidence moves as c <- rho * c + (1 - rho) * Support (seed 000,
eq. 11), where Support is the share of the round's antecedent episodes (A...B) that the
consequence C followed when the relation passed the statistical acceptance rule, and 0
otherwise. A new relation enters as a ``candidate`` with c = Support. Status rules:

- candidate or demoted -> ``promoted`` when c >= promote_at (its material is trained);
- promoted -> ``demoted`` when c < demote_below (kept, no longer trained);
- any status -> ``retired`` when c < retire_below (archived, never deleted: a retired unit
  that is accepted again re-enters as a candidate with its history kept);
- promoted -> ``demoted`` at once, whatever c, when the round re-read every episode the
  unit was accepted on and its family-wide test no longer finds the pattern significant
  (``refuted``).

Why the last rule: a round reads each robot's history within the discovery horizon, so it
re-tests the same episodes with more beside them. Keeping a unit promoted because an
earlier, smaller sample passed the FDR-controlled test made the promoted set the union of
the last rounds' significant sets, and that union holds more false triples than each
round's test allows (over 30 seeds of the exp6 worlds, ~half of the false relations were
such units). A unit that is still significant but fails a per-pattern check keeps
persistence: those checks refuse a rule whose episodes all lie in one period of the
history (a regularity that held and then stopped being exercised) or one a stronger
pattern now explains, which is what knowledge across rounds is for. A unit whose
evidence left the horizon, or whose codes the round did not test, decays by rho.

The SQLite tables are this module's own (``knowledge_*``) so they can share a database file
with the experience store without touching its schema.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from thinkmem_ros.consolidator.discovery import (
    DiscoveryConfig,
    DiscoveryResult,
    Relation,
    pairs_inside,
)
from thinkmem_ros.consolidator.store import not_a_store
from thinkmem_ros.core.input_files import input_file
from thinkmem_ros.core.vocabulary import DISCOVERED_PREFIX
from thinkmem_ros.link.experience import LIMITS, valid_name

STATUSES: tuple[str, ...] = ("candidate", "promoted", "demoted", "retired")
SCHEMA_VERSION = 1


@dataclass
class KnowledgeConfig:
    """Persistence rho and the promotion / demotion / retirement thresholds."""

    rho: float = 0.5
    promote_at: float = 0.5
    demote_below: float = 0.3
    retire_below: float = 0.1

    def __post_init__(self) -> None:
        if not 0 <= self.rho < 1:
            raise ValueError(f"rho must be in [0, 1), got {self.rho}")
        if not 0 <= self.retire_below <= self.demote_below <= self.promote_at <= 1:
            raise ValueError(
                "need 0 <= retire_below <= demote_below <= promote_at <= 1, got "
                f"retire_below={self.retire_below}, demote_below={self.demote_below}, "
                f"promote_at={self.promote_at}")


RELATION_LENGTHS = (2, 3)
"""Events in a pattern discovery can find: pairs A...B and triples A...B...C."""


@dataclass
class KnowledgeUnit:
    """One discovered relation as reusable thinking knowledge."""

    pattern: tuple[str, ...]  # P: ordered antecedent + consequence codes
    relation: str  # R: "sequence3" (A...B...C) or "sequence2" (A...B)
    constraints: dict  # Delta: gap bounds searched and gaps observed per step
    thinking: str  # g: e.g. "consider:E030"
    confidence: float = 0.0  # c
    experiences: tuple[int, ...] = ()  # E: supporting episode / experience ids
    status: str = "candidate"
    rounds: int = 0  # consolidation rounds this unit has been scored in
    supported_rounds: int = 0
    last_support: float = 0.0
    created_round: int = 0
    updated_round: int = 0
    statement: str = ""  # optional natural-language phrasing (LLM consolidation)
    history: list[tuple[int, float, float, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.pattern = tuple(self.pattern)
        if len(self.pattern) < 2:
            raise ValueError(f"pattern needs >= 2 events, got {self.pattern}")
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")
        if not 0 <= self.confidence <= 1:
            raise ValueError(f"confidence must be in [0, 1], got {self.confidence}")

    @property
    def key(self) -> str:
        """Stable identity: the ordered pattern joined with '>'."""
        return ">".join(self.pattern)

    @property
    def antecedent(self) -> tuple[str, ...]:
        """The prefix that should trigger the thinking (A...B)."""
        return self.pattern[:-1]

    @property
    def consequence(self) -> str:
        """The event the thinking anticipates (C)."""
        return self.pattern[-1]

    @property
    def active(self) -> bool:
        """Promoted units are the ones internalised into the policy."""
        return self.status == "promoted"

    def update(self, support: float, round_index: int, cfg: KnowledgeConfig,
               refuted: bool = False) -> None:
        """Apply c <- rho*c + (1-rho)*support and the status rules for one round.

        ``refuted``: the round re-read all of the unit's evidence and its family-wide test
        refused the pattern (see the module docstring).
        """
        if not 0 <= support <= 1:
            raise ValueError(f"support must be in [0, 1], got {support}")
        if refuted and support > 0:
            raise ValueError("a refuted unit has no support in the round")
        if self.status == "retired" and support > 0:
            self.status = "candidate"  # reactivated; keeps its confidence history
        self.confidence = cfg.rho * self.confidence + (1 - cfg.rho) * support
        self._after(support, round_index, cfg, refuted)

    def _after(self, support: float, round_index: int, cfg: KnowledgeConfig,
               refuted: bool = False) -> None:
        self.rounds += 1
        self.supported_rounds += int(support > 0)
        self.last_support = support
        self.updated_round = round_index
        c = self.confidence
        if c < cfg.retire_below:
            self.status = "retired"
        elif refuted:
            if self.status == "promoted":
                self.status = "demoted"
        elif self.status in ("candidate", "demoted") and c >= cfg.promote_at:
            self.status = "promoted"
        elif self.status == "promoted" and c < cfg.demote_below:
            self.status = "demoted"
        self.history.append((round_index, support, c, self.status))


def unit_from_relation(rel: Relation, round_index: int, cfg: KnowledgeConfig,
                       discovery: DiscoveryConfig) -> KnowledgeUnit:
    """A new candidate unit whose first confidence is the relation's support."""
    unit = KnowledgeUnit(
        pattern=rel.pattern, relation=rel.relation,
        constraints={"min_gap": discovery.min_gap,
                     "max_gap": None if discovery.max_gap == float("inf") else discovery.max_gap,
                     "observed_gaps": [list(g) for g in rel.gaps]},
        thinking=f"{DISCOVERED_PREFIX}{rel.pattern[-1]}", confidence=rel.confidence,
        experiences=rel.episodes, created_round=round_index)
    unit._after(rel.confidence, round_index, cfg)
    return unit


def consolidate(units: dict[str, KnowledgeUnit], result: DiscoveryResult, round_index: int,
                cfg: KnowledgeConfig) -> dict[str, KnowledgeUnit]:
    """Fold one discovery round into ``units`` (updated in place and returned)."""
    accepted = {">".join(r.pattern): r for r in result.accepted}
    read = None if result.episode_ids is None else set(result.episode_ids.tolist())
    scored = {">".join(r.pattern): r for r in result.scored}
    for key, unit in units.items():
        rel = accepted.pop(key, None)
        if rel is None:
            unit.update(0.0, round_index, cfg,
                        refuted=_reread(unit, read) and _insignificant(unit, scored, result))
        else:
            unit.update(rel.confidence, round_index, cfg)
            unit.experiences = tuple(sorted(set(unit.experiences) | set(rel.episodes)))
            unit.constraints["observed_gaps"] = [list(g) for g in rel.gaps]
    for key, rel in accepted.items():
        units[key] = unit_from_relation(rel, round_index, cfg, result.config)
    _fold_into_triples(units, round_index)
    return units


def _reread(unit: KnowledgeUnit, read: set[int] | None) -> bool:
    """Whether the round read every episode the unit was ever accepted on."""
    return read is not None and bool(unit.experiences) and read.issuperset(unit.experiences)


def _insignificant(unit: KnowledgeUnit, scored: dict, result: DiscoveryResult) -> bool:
    """Whether the round tested the unit's pattern and its family-wide test refused it.

    A scored relation says so itself; a candidate the round did not score had p above
    alpha. A pattern that was no candidate (its codes left out, or the family's budget)
    was not tested, so it says nothing.
    """
    rel = scored.get(unit.key)
    if rel is not None:
        return rel.significant is False
    return result.is_candidate(unit.pattern)


def _fold_into_triples(units: dict[str, KnowledgeUnit], round_index: int) -> None:
    """Demote promoted pairs that a promoted triple contains (in its order).

    Discovery folds an accepted pair into an accepted triple of the same round; a pair
    promoted in an earlier round, before the triple's A was seen often enough, would
    otherwise stay promoted beside it and make the robot consider C after every B, A or
    not. ``bench rounds`` (seed 3) shows it: ``pressure_spike>pump_trip`` promoted in
    round 1, the rule ``valve_stuck>pressure_spike>pump_trip`` in round 2, and the gate
    then refused every candidate (``consider:pump_trip`` on 65 % of histories without
    valve_stuck). The pair is kept, demoted, and comes back if the triple goes.
    """
    covered = pairs_inside(u.pattern for u in units.values()
                           if u.active and len(u.pattern) == 3)
    for unit in units.values():
        if unit.active and len(unit.pattern) == 2 and unit.pattern in covered:
            unit.status = "demoted"
            if unit.history and unit.history[-1][0] == round_index:
                unit.history[-1] = unit.history[-1][:3] + ("demoted",)


class KnowledgeStoreError(RuntimeError):
    """The knowledge tables cannot be opened or are from a newer schema."""


class KnowledgeStore:
    """Knowledge units in SQLite (WAL); may share a file with the experience store."""

    def __init__(self, path: str | Path, timeout_s: float = 5.0, *,
                 read_only: bool = False) -> None:
        """Open (and migrate) the knowledge tables, or only look at them.

        ``read_only`` is for looking (``thinkmem knowledge list``): the file is never
        created, migrated or written, and one without knowledge tables holds no units.
        """
        self.path = Path(path)
        self._tables = True
        try:
            input_file(self.path, "knowledge store")  # a FIFO blocked the open forever
        except ValueError as exc:
            raise KnowledgeStoreError(f"{exc}") from None
        try:
            if read_only:
                self._conn = sqlite3.connect(f"{self.path.absolute().as_uri()}?mode=ro",
                                             uri=True, timeout=timeout_s)
                self._refuse_foreign()
                self._tables = self._version() is not None
            else:
                self._conn = sqlite3.connect(str(self.path), timeout=timeout_s)
                self._refuse_foreign()
                self._conn.execute("PRAGMA journal_mode=WAL")
                self._migrate()
        except sqlite3.Error as err:
            raise KnowledgeStoreError(f"{self.path}: cannot open knowledge tables: {err}") from err

    def _refuse_foreign(self) -> None:
        """Refuse another program's database before anything reads or writes it.

        Why: knowledge tables were added to any SQLite file named (``store.not_a_store``),
        and looking at one listed "no knowledge units" with exit 0 as if it were a store.
        """
        problem = not_a_store(self._conn)
        if problem is not None:
            self._conn.close()
            raise KnowledgeStoreError(f"{self.path}: not a thinkmem store ({problem})")

    def _version(self) -> int | None:
        """The knowledge schema version (None: no knowledge tables); refuses a newer one."""
        listed = self._conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND"
                                    " name = 'knowledge_schema_version'").fetchone()
        if listed is None:
            return None
        current = self._conn.execute(
            "SELECT MAX(version) FROM knowledge_schema_version").fetchone()[0] or 0
        if current > SCHEMA_VERSION:
            raise KnowledgeStoreError(f"{self.path}: knowledge schema {current} is newer than "
                                      f"supported {SCHEMA_VERSION}")
        return current

    def _migrate(self) -> None:
        with self._conn:
            self._conn.execute("CREATE TABLE IF NOT EXISTS knowledge_schema_version "
                               "(version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
        current = self._version() or 0
        if current < 1:
            with self._conn:
                self._conn.execute(
                    "CREATE TABLE knowledge_units (key TEXT PRIMARY KEY, pattern TEXT NOT NULL,"
                    " relation TEXT NOT NULL, constraints TEXT NOT NULL, thinking TEXT NOT NULL,"
                    " confidence REAL NOT NULL, status TEXT NOT NULL, experiences TEXT NOT NULL,"
                    " rounds INTEGER NOT NULL, supported_rounds INTEGER NOT NULL,"
                    " last_support REAL NOT NULL, created_round INTEGER NOT NULL,"
                    " updated_round INTEGER NOT NULL, statement TEXT NOT NULL,"
                    " history TEXT NOT NULL, updated_at REAL NOT NULL)")
                self._conn.execute("INSERT INTO knowledge_schema_version VALUES (?, ?)",
                                   (1, time.time()))

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

    def __enter__(self) -> KnowledgeStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def save(self, units: Iterable[KnowledgeUnit]) -> int:
        """Insert or replace ``units`` in one transaction; returns how many were written."""
        rows = [(u.key, json.dumps(list(u.pattern)), u.relation, json.dumps(u.constraints),
                 u.thinking, float(u.confidence), u.status, json.dumps(list(u.experiences)),
                 u.rounds, u.supported_rounds, float(u.last_support), u.created_round,
                 u.updated_round, u.statement, json.dumps(u.history), time.time())
                for u in units]
        with self._conn:
            self._conn.executemany(
                "INSERT OR REPLACE INTO knowledge_units VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        return len(rows)

    def load(self, status: str | None = None) -> list[KnowledgeUnit]:
        """All units (or those with ``status``), highest confidence first."""
        if status is not None and status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        if not self._tables:  # read-only, on a store no round has written knowledge to
            return []
        query = ("SELECT pattern, relation, constraints, thinking, confidence, status, "
                 "experiences, rounds, supported_rounds, last_support, created_round, "
                 "updated_round, statement, history, key FROM knowledge_units")
        params: tuple = ()
        if status is not None:
            query += " WHERE status = ?"
            params = (status,)
        query += " ORDER BY confidence DESC, key"
        try:
            rows = self._conn.execute(query, params).fetchall()
        except sqlite3.Error as exc:
            raise KnowledgeStoreError(f"{self.path}: cannot read the knowledge units: "
                                      f"{exc}") from exc
        return [self._unit(row) for row in rows]

    def _unit(self, row: tuple) -> KnowledgeUnit:
        """One stored unit; a row another program damaged is named, not a traceback.

        Every column's type is checked, not only that its JSON parses: a pattern stored as
        the string ``"EAB"`` parsed as the pattern E, A, B and was shipped to robots.
        """
        try:
            _typed(row[1], str, "relation"), _typed(row[3], str, "thinking")
            _typed(row[12], str, "statement")
            for index, name in ((7, "rounds"), (8, "supported_rounds"),
                                (10, "created_round"), (11, "updated_round")):
                _typed(row[index], int, name)
            _typed(row[9], (int, float), "last_support")
            _typed(row[4], (int, float), "confidence")
            unit = KnowledgeUnit(
                pattern=tuple(_json(row[0], "pattern", list, str)), relation=row[1],
                constraints=_json(row[2], "constraints", dict), thinking=row[3],
                confidence=row[4], status=row[5],
                experiences=tuple(_json(row[6], "experiences", list, int)), rounds=row[7],
                supported_rounds=row[8], last_support=row[9], created_round=row[10],
                updated_round=row[11], statement=row[12],
                history=_history(row[13]))
            _consistent(unit, row[14])
            return unit
        except (ValueError, TypeError) as exc:  # JSONDecodeError is a ValueError
            reason = " ".join(str(exc).split())
            raise KnowledgeStoreError(f"{self.path}: a malformed knowledge unit (pattern "
                                      f"{str(row[0])[:60]!r}): {reason}") from exc

    def units(self) -> dict[str, KnowledgeUnit]:
        """All units keyed by pattern key, ready for :func:`consolidate`."""
        return {u.key: u for u in self.load()}


def _consistent(unit: KnowledgeUnit, key: object) -> None:
    """Refuse a row whose relation kind or key disagrees with its pattern.

    Why: an unknown kind (``"sequence9; DROP"``) loaded and was listed as knowledge, and a
    key other than the pattern's made the next save add a second row for the same pattern,
    of which :meth:`KnowledgeStore.units` then kept the lower-confidence one. A pattern of
    any length or of names no record can carry (a 10,000-character code, 500 codes) loaded
    too, and only the round's rules export refused it, after retraining, with no word of
    which row.
    """
    if len(unit.pattern) not in RELATION_LENGTHS:
        raise ValueError(f"a pattern of {len(unit.pattern)} events (discovery finds "
                         f"{' or '.join(map(str, RELATION_LENGTHS))})")
    bad = next((code for code in unit.pattern if not valid_name(code)), None)
    if bad is not None:
        raise ValueError(f"event {str(bad)[:40]!r} is not a name the robot's records carry "
                         f"(1..{LIMITS['max_name']} of A-Z a-z 0-9 _ . : - /)")
    if len(set(unit.pattern)) != len(unit.pattern):
        raise ValueError("an event repeats within the pattern")
    kind = f"sequence{len(unit.pattern)}"
    if unit.relation != kind:
        raise ValueError(f"relation {unit.relation[:40]!r} is not {kind!r}, the kind of a "
                         f"{len(unit.pattern)}-event pattern")
    if key != unit.key:
        raise ValueError(f"key {str(key)[:40]!r} is not the pattern's {unit.key[:40]!r}")


def _history(text: object) -> list[tuple]:
    """The unit's rounds, each ``[round, support, confidence, status]`` as ``_after`` wrote it.

    Why each entry is checked: entries of any shape (``[1, NaN, "x"]``, ``[]``) loaded
    silently and went back into the store at the next save as if a round had written them.
    """
    entries = _json(text, "history", list, list)
    for entry in entries:
        if not _history_entry(entry):
            raise ValueError(f"history entry {json.dumps(entry)[:40]} is not "
                             f"[round, support, confidence, status]")
    return [tuple(entry) for entry in entries]


def _history_entry(entry: list) -> bool:
    """Whether ``entry`` is [int round, support and confidence in [0, 1], a status]."""
    if len(entry) != 4:
        return False
    round_index, support, confidence, status = entry
    shares = all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1
                 for v in (support, confidence))
    return (isinstance(round_index, int) and not isinstance(round_index, bool) and shares
            and isinstance(status, str) and status in STATUSES)


def _typed(value: object, kind: type | tuple[type, ...], name: str) -> None:
    """Refuse a column of the wrong type (SQLite stores whatever a writer gave it)."""
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{name} is {type(value).__name__}, not "
                        f"{getattr(kind, '__name__', 'a number')}")


def _json(text: object, name: str, kind: type, item: type | None = None):
    """Decode a JSON column and check its shape: a list of ``item`` or a ``kind``."""
    if not isinstance(text, str):
        raise TypeError(f"{name} is {type(text).__name__}, not JSON text")
    value = _strict_json(text, name)
    if not isinstance(value, kind) or (item is not None and any(
            isinstance(v, bool) or not isinstance(v, item) for v in value)):
        what = f"a JSON {kind.__name__}" + (f" of {item.__name__}" if item else "")
        raise TypeError(f"{name} must be {what}, got {text[:40]!r}")
    return value


def _strict_json(text: str, name: str):
    """Parse JSON as the standard has it: NaN, Infinity and numbers past a float refused.

    Why: Python's decoder takes the non-standard constants (and reads 1e400 as infinity),
    and ``thinkmem knowledge list --json`` printed them back as invalid JSON with exit 0.
    """
    def refuse(token: str):
        raise ValueError(f"{name} holds {token}, not a finite JSON number")

    def finite(token: str) -> float:
        number = float(token)
        return number if math.isfinite(number) else refuse(token)

    try:
        return json.loads(text, parse_constant=refuse, parse_float=finite)
    except RecursionError:  # it reached the command's last net, naming no file or column
        raise ValueError(f"{name} is JSON nested too deeply") from None
