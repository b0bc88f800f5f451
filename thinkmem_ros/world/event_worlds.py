"""Harder event worlds for discovery: dense vocabularies, frequent events, shared codes.

``event_episodes.py`` reproduces the paper's Experiment 6 (300 codes, a sparse background,
gaps of 20-60 time units). The worlds here are built to break a discovery method that only
works there. One generator, :func:`generate_world`, driven by :class:`WorldConfig`; the
named conditions in :data:`CONDITIONS` are overrides of that config, never copies of it:

- ``sparse``: 48 codes drawn uniformly (each code is in about a third of all episodes, so
  any three codes co-occur in ~5 of 120 episodes by chance);
- ``zipf``: background codes with Zipf(1) frequencies (a few codes fire several times in
  every episode);
- ``heartbeat``: one code fires ~4 times per episode and, half the time, 1-20 s before
  every planted consequence C (so A...H...C and B...H...C ride on the real rules);
- ``shared``: the rules A...B...C, A...D...E and X...B...C share events;
- ``chain``: A...B...C and C...D...E (one rule's consequence starts the next), plus an
  independent rule;
- ``decoy``: two extra triples repeated 8 times inside one temporal partition (a burst);
- ``sparse_300`` / ``zipf_300``: the same with 300 codes;
- ``phased``: 30 % of the codes keep to a phase of the episode (normal around a
  position of their own, spread 8 % of its length), as start-up, docking or shift-change
  events do on a robot: a condition the within-episode null, which takes every slot of an
  episode as exchangeable, does not hold (``docs/discovery.md``, Known limits).

Every run has 120 episodes of ``duration`` seconds with ~20 Poisson background events each.
Each rule is planted complete in ``repetitions`` episodes of its own, with A->B and B->C gaps
drawn from ``gap_law`` (log-uniform on 2-300 s by default). Counter-evidence comes at a
quarter of the repetitions per kind: A...B without C, the reversed B...A, A...C without B
and B...C without A. Codes of planted rules are drawn among codes whose background rate is
at most ``rule_code_max_rate`` per episode: a code that fires several times in every
episode is the frequent event whose cost is measured, not a rule anyone can discover.

Scoring (:func:`score_triples`): an accepted triple is true only if planted; a triple that
contains the heartbeat code is false; pairs are not scored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from thinkmem_ros.world.event_episodes import Episode, code_names

GAP_LAWS: tuple[str, ...] = ("loguniform", "uniform", "exponential")
CODE_LAWS: tuple[str, ...] = ("uniform", "zipf")
STRUCTURES: tuple[str, ...] = ("independent", "shared", "chain")
COUNTER_KINDS: tuple[str, ...] = ("ab_without_c", "reversed_ba", "ac_without_b",
                                  "bc_without_a")
"""Counter-evidence episode kinds planted beside every rule."""


@dataclass
class WorldConfig:
    """One event world; the defaults are the ``sparse`` condition at 8 repetitions."""

    n_codes: int = 48
    n_episodes: int = 120
    n_rules: int = 3
    repetitions: int | tuple[int, ...] = 8  # rule episodes per rule (one value per rule)
    background: float = 20.0  # mean background events per episode (Poisson)
    duration: float = 1800.0  # seconds per episode (one background event every ~90 s)
    gap_law: str = "loguniform"
    gap_min: float = 2.0
    gap_max: float = 300.0
    counter_share: float = 0.25  # counter episodes per kind = ceil(share * repetitions)
    code_law: str = "uniform"
    zipf_exponent: float = 1.0
    rule_code_max_rate: float = 0.5  # rule codes fire at most this often in the background
    structure: str = "independent"
    heartbeat: float = 0.0  # mean heartbeat events per episode (0: no heartbeat code)
    heartbeat_lead: tuple[float, float] = (1.0, 20.0)  # seconds before a planted C
    heartbeat_share: float = 0.5  # share of planted Cs that get a heartbeat just before
    n_decoys: int = 0
    decoy_repetitions: int = 8  # all inside one partition
    n_partitions: int = 4
    null_stream: bool = False  # background (and heartbeat) only, same number of episodes
    phased_share: float = 0.0  # share of codes whose background events keep to one phase
    phase_spread: float = 0.08  # their spread around it, as a share of the episode

    def __post_init__(self) -> None:
        for key in ("n_codes", "n_episodes", "n_partitions"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        for key in ("n_rules", "n_decoys", "decoy_repetitions"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)}")
        reps = self.rule_repetitions
        if len(reps) != self.n_rules or any(r < 0 for r in reps):
            raise ValueError(f"repetitions must be one int >= 0 or one per rule, got "
                             f"{self.repetitions} for {self.n_rules} rules")
        if self.gap_law not in GAP_LAWS:
            raise ValueError(f"gap_law must be one of {GAP_LAWS}, got {self.gap_law!r}")
        if self.code_law not in CODE_LAWS:
            raise ValueError(f"code_law must be one of {CODE_LAWS}, got {self.code_law!r}")
        if self.structure not in STRUCTURES:
            raise ValueError(f"structure must be one of {STRUCTURES}, got {self.structure!r}")
        if self.structure != "independent" and self.n_rules != 3:
            raise ValueError(f"structure {self.structure!r} plants exactly 3 rules, got "
                             f"n_rules={self.n_rules}")
        if not 0 < self.gap_min <= self.gap_max:
            raise ValueError(f"need 0 < gap_min <= gap_max, got {self.gap_min}, {self.gap_max}")
        if 2 * self.gap_max >= self.duration:
            raise ValueError(f"duration {self.duration} must exceed 2 * gap_max = "
                             f"{2 * self.gap_max}")
        if self.background < 0 or self.heartbeat < 0:
            raise ValueError(f"background and heartbeat must be >= 0, got {self.background}, "
                             f"{self.heartbeat}")
        if not 0 <= self.counter_share <= 1 or not 0 <= self.heartbeat_share <= 1:
            raise ValueError(f"counter_share and heartbeat_share must be in [0, 1], got "
                             f"{self.counter_share}, {self.heartbeat_share}")
        lo, hi = self.heartbeat_lead
        if not 0 <= lo <= hi:
            raise ValueError(f"heartbeat_lead must be 0 <= lo <= hi, got {self.heartbeat_lead}")
        if not (0 <= self.phased_share <= 1 and 0 < self.phase_spread):
            raise ValueError(f"need phased_share in [0, 1] and phase_spread > 0, got "
                             f"{self.phased_share}, {self.phase_spread}")
        if self.rule_code_max_rate <= 0:
            raise ValueError(f"rule_code_max_rate must be > 0, got {self.rule_code_max_rate}")
        needed = len(self.specs_count())
        if not self.null_stream and needed > self.n_episodes:
            raise ValueError(f"{needed} rule, counter and decoy episodes do not fit in "
                             f"n_episodes={self.n_episodes}")

    @property
    def rule_repetitions(self) -> tuple[int, ...]:
        """Repetitions of each rule."""
        if isinstance(self.repetitions, int | np.integer):
            return (int(self.repetitions),) * self.n_rules
        return tuple(int(r) for r in self.repetitions)

    def counter_per_kind(self, reps: int) -> int:
        """Counter-evidence episodes of each kind beside a rule planted ``reps`` times."""
        return math.ceil(self.counter_share * reps - 1e-9)

    def specs_count(self) -> list[str]:
        """Kinds of the non-neutral episodes (used to check that they fit)."""
        out = []
        for reps in self.rule_repetitions:
            out += ["rule"] * reps + ["counter"] * (4 * self.counter_per_kind(reps))
        return out + ["decoy"] * (self.n_decoys * self.decoy_repetitions)


CONDITIONS: dict[str, dict] = {
    "sparse": {},
    "zipf": {"code_law": "zipf"},
    "heartbeat": {"heartbeat": 4.0},
    "shared": {"structure": "shared"},
    "chain": {"structure": "chain"},
    "decoy": {"n_decoys": 2},
    "sparse_300": {"n_codes": 300},
    "zipf_300": {"n_codes": 300, "code_law": "zipf"},
    "phased": {"phased_share": 0.3},
}
"""Named conditions: overrides of :class:`WorldConfig` (one generator, no copies)."""


@dataclass
class World:
    """A generated history with its ground truth."""

    episodes: list[Episode]
    rules: list[tuple[str, str, str]]
    decoys: list[tuple[str, str, str]]
    codes: tuple[str, ...]
    config: WorldConfig
    heartbeat: str | None = None
    rates: np.ndarray = field(default_factory=lambda: np.zeros(0))  # background per episode

    @property
    def n_events(self) -> int:
        """Total number of events."""
        return sum(len(ep.events) for ep in self.episodes)

    def kinds(self) -> dict[str, int]:
        """Episodes per kind."""
        out: dict[str, int] = {}
        for ep in self.episodes:
            out[ep.kind] = out.get(ep.kind, 0) + 1
        return out


def condition_config(condition: str, **overrides) -> WorldConfig:
    """The config of a named condition, with further overrides (e.g. repetitions)."""
    if condition not in CONDITIONS:
        raise ValueError(f"unknown condition {condition!r}; expected one of "
                         f"{tuple(CONDITIONS)}")
    return WorldConfig(**{**CONDITIONS[condition], **overrides})


def _code_rates(cfg: WorldConfig, rng: np.random.Generator) -> np.ndarray:
    """Background events per episode of each code (Zipf ranks are a random permutation)."""
    if cfg.code_law == "uniform":
        weights = np.ones(cfg.n_codes)
    else:
        weights = np.empty(cfg.n_codes)
        weights[rng.permutation(cfg.n_codes)] = 1.0 / np.arange(1, cfg.n_codes + 1) ** \
            cfg.zipf_exponent
    return cfg.background * weights / weights.sum()


def _rule_codes(cfg: WorldConfig, rates: np.ndarray, excluded: set[int],
                rng: np.random.Generator) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """Code triples of the rules (shaped by ``structure``) and of the decoys."""
    pool = [c for c in range(cfg.n_codes)
            if c not in excluded and rates[c] <= cfg.rule_code_max_rate]
    distinct = {"independent": 3 * cfg.n_rules, "shared": 7, "chain": 8}[cfg.structure]
    need = distinct + 3 * cfg.n_decoys
    if len(pool) < need:
        raise ValueError(f"only {len(pool)} codes fire at most {cfg.rule_code_max_rate} per "
                         f"episode; {need} are needed for the rules and decoys")
    picks = [int(c) for c in rng.choice(pool, size=need, replace=False)]
    head, tail = picks[:distinct], picks[distinct:]
    if cfg.structure == "shared":
        a, b, c, d, e, x = head[:6]
        rules = [(a, b, c), (a, d, e), (x, b, c)]
    elif cfg.structure == "chain":
        a, b, c, d, e, f, g, h = head
        rules = [(a, b, c), (c, d, e), (f, g, h)]
    else:
        rules = [tuple(head[3 * i:3 * i + 3]) for i in range(cfg.n_rules)]
    decoys = [tuple(tail[3 * i:3 * i + 3]) for i in range(cfg.n_decoys)]
    return rules, decoys


def _gaps(cfg: WorldConfig, n: int, rng: np.random.Generator) -> np.ndarray:
    lo, hi = cfg.gap_min, cfg.gap_max
    if cfg.gap_law == "loguniform":
        return np.exp(rng.uniform(math.log(lo), math.log(hi), size=n))
    if cfg.gap_law == "uniform":
        return rng.uniform(lo, hi, size=n)
    return np.minimum(lo + rng.exponential((hi - lo) / 5.0, size=n), hi)


def _chain(cfg: WorldConfig, items: tuple[int, ...], rng: np.random.Generator,
           gaps: np.ndarray | None = None) -> list[tuple[float, int]]:
    """``items`` in order with gaps from the gap law, starting anywhere that still fits."""
    gaps = _gaps(cfg, len(items) - 1, rng) if gaps is None else gaps
    t = float(rng.uniform(0.0, cfg.duration - float(gaps.sum())))
    out = [(t, items[0])]
    for item, gap in zip(items[1:], gaps):
        t += float(gap)
        out.append((t, item))
    return out


def _planted(kind: str, triple: tuple[int, ...], cfg: WorldConfig,
             rng: np.random.Generator) -> list[tuple[float, int]]:
    a, b, c = triple
    if kind in ("rule", "decoy"):
        return _chain(cfg, (a, b, c), rng)
    if kind == "ab_without_c":
        return _chain(cfg, (a, b), rng)
    if kind == "reversed_ba":
        return _chain(cfg, (b, a), rng)
    if kind == "bc_without_a":
        return _chain(cfg, (b, c), rng)
    # A...C without B: the span of a rule instance with its middle left out
    return _chain(cfg, (a, c), rng, gaps=np.array([_gaps(cfg, 2, rng).sum()]))


def _phases(cfg: WorldConfig, rng: np.random.Generator) -> np.ndarray | None:
    """Each code's phase in the episode (NaN: none); None when no code keeps one.

    Nothing is drawn for worlds without phased codes, so their seeds give the worlds they
    always gave.
    """
    if cfg.phased_share <= 0:
        return None
    phase = np.full(cfg.n_codes, np.nan)
    chosen = rng.permutation(cfg.n_codes)[:round(cfg.phased_share * cfg.n_codes)]
    phase[chosen] = rng.uniform(0.05, 0.95, chosen.size)
    return phase


def _keep_phase(events: list[tuple[float, int]], phase: np.ndarray, cfg: WorldConfig,
                rng: np.random.Generator) -> list[tuple[float, int]]:
    """Background events of phased codes moved near their code's phase of the episode."""
    out = []
    for t, code in events:
        if not math.isnan(phase[code]):
            t = float(np.clip(rng.normal(phase[code], cfg.phase_spread), 0.0, 1.0)
                      * cfg.duration)
        out.append((t, code))
    return out


def generate_world(cfg: WorldConfig, rng: np.random.Generator) -> World:
    """Draw codes, rules and episodes from ``rng``; the same seed gives the same world."""
    codes = code_names(cfg.n_codes)
    rates = _code_rates(cfg, rng)
    heart = int(rng.integers(cfg.n_codes)) if cfg.heartbeat > 0 else -1
    if heart >= 0:
        rates[heart] = 0.0  # the heartbeat is drawn separately, at its own rate
        rates *= cfg.background / rates.sum()
    rules, decoys = ([], []) if cfg.null_stream else _rule_codes(cfg, rates, {heart}, rng)

    specs: list[tuple[str, int]] = []
    for r, reps in enumerate(() if cfg.null_stream else cfg.rule_repetitions):
        specs += [("rule", r)] * reps
        for kind in COUNTER_KINDS:
            specs += [(kind, r)] * cfg.counter_per_kind(reps)
    n_decoy_eps = len(decoys) * cfg.decoy_repetitions
    specs += [("neutral", -1)] * (cfg.n_episodes - len(specs) - n_decoy_eps)
    order = rng.permutation(len(specs))
    blocks = [[specs[int(i)] for i in blk] for blk in np.array_split(order, cfg.n_partitions)]
    for d in range(len(decoys)):  # a decoy bursts inside one partition only
        part = int(rng.integers(cfg.n_partitions))
        for _ in range(cfg.decoy_repetitions):
            blocks[part].insert(int(rng.integers(len(blocks[part]) + 1)), ("decoy", d))

    probs = rates / rates.sum() if rates.sum() > 0 else None
    phase = _phases(cfg, rng)
    episodes: list[Episode] = []
    for part, block in enumerate(blocks):
        for kind, idx in block:
            n_bg = int(rng.poisson(cfg.background))
            events = list(zip(rng.uniform(0.0, cfg.duration, n_bg).tolist(),
                              rng.choice(cfg.n_codes, size=n_bg, p=probs).tolist()))
            if phase is not None:
                events = _keep_phase(events, phase, cfg, rng)
            planted: list[tuple[float, int]] = []
            if kind not in ("neutral",):
                source = decoys[idx] if kind == "decoy" else rules[idx]
                planted = _planted(kind, source, cfg, rng)
            if heart >= 0:
                n_h = int(rng.poisson(cfg.heartbeat))
                events += [(t, heart) for t in rng.uniform(0.0, cfg.duration, n_h).tolist()]
                consequences = {r[2] for r in rules}
                lo, hi = cfg.heartbeat_lead
                for t, c in planted:
                    if c in consequences and kind != "decoy" and rng.random() < \
                            cfg.heartbeat_share:
                        events.append((max(0.0, t - float(rng.uniform(lo, hi))), heart))
            events += planted
            events.sort(key=lambda e: e[0])
            eid = len(episodes)
            episodes.append(Episode(episode_id=eid, partition=part,
                                    start_time=eid * cfg.duration, kind=kind, rule=idx,
                                    events=[(float(t), codes[int(c)]) for t, c in events]))
    def name(triple: tuple[int, ...]) -> tuple[str, ...]:
        return tuple(codes[i] for i in triple)

    return World(episodes=episodes, rules=[name(r) for r in rules],
                 decoys=[name(d) for d in decoys], codes=codes, config=cfg,
                 heartbeat=codes[heart] if heart >= 0 else None, rates=rates)


def world(condition: str, repetitions: int, rng: np.random.Generator, **overrides) -> World:
    """Generate one run of a named condition at ``repetitions`` per rule."""
    return generate_world(condition_config(condition, repetitions=repetitions, **overrides),
                          rng)


def score_triples(found: set[tuple[str, ...]], w: World) -> dict[str, float]:
    """Precision / recall / F1 of accepted triples; pairs are ignored, heartbeat is false."""
    triples = {p for p in found if len(p) == 3}
    truth = set(w.rules)
    true = {p for p in triples if p in truth and (w.heartbeat is None or w.heartbeat not in p)}
    false = triples - true
    tp, fp, fn = len(true), len(false), len(truth - true)
    return {"tp": tp, "fp": fp, "fn": fn,
            "precision": tp / (tp + fp) if tp + fp else (1.0 if not truth else 0.0),
            "recall": tp / (tp + fn) if tp + fn else 1.0,
            "f1": 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 1.0}


def with_repetitions(cfg: WorldConfig, repetitions: int | tuple[int, ...]) -> WorldConfig:
    """``cfg`` at another number of repetitions (validated again)."""
    return replace(cfg, repetitions=repetitions)
