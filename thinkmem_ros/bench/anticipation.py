"""Anticipation that holds: ``consider:C`` from A...B until C or the learned horizon.

Reproduce (working tree): ``PYTHONPATH=. .venv/bin/python -m thinkmem_ros.bench.anticipation
[--quick] [--seeds N] [--json x.json] [--plot x.png]``; the plain functions below are what
``bench rounds`` (or the demo) call with their own episodes and per-frame activations.

The world: episodes of events on one node-clock timeline, each opened by an
``episode_start`` marker, ~20 background events per episode drawn from 45 codes (Poisson
count, uniform times), and one kind of rule evidence per episode for the rule A...B...C:

=============  ==========================================================================
kind           planted events (gaps drawn from the condition's gap law, 2..300 s)
=============  ==========================================================================
``rule``       A ... B ... C (a quarter of them with an extra, earlier A)
``prefix``     A ... B, no C (the episode runs on past the longest B -> C gap)
``reversed``   B ... A
``a_alone``    A; ``b_alone`` B; ``c_alone`` C
``a_c``        A ... C without B; ``b_c`` B ... C without A
``expired``    A, then B 2-3x the longest A -> B gap later, then C
=============  ==========================================================================

The rule's bounds are learned as a round learns them: ``reps`` training episodes of kind
``rule`` (fresh draws) -> ``consolidator.anticipation_export.build_rules`` -> ``RuleSet``;
the test episodes are other draws. Frames at 10 Hz run ``policy.anticipation
.AnticipationTracker`` exactly as the node does (every event fed at its time, the frame
queried at its time, the marker resetting the episode).

Scores (``score_frames``, any per-frame source of ``consider:C``):
  * ``anticipation_frame_recall``: frames strictly between B and C of ``rule`` episodes
    with the label active (the demo's ``frame_recall``);
  * ``false_fire_rate``: active frames among the frames where no A...B prefix is open within
    the generator's longest B -> C gap (rule frames outside B..C, prefix frames after B +
    longest gap, every frame of every other kind) -- stricter than the issue's definition,
    which measures against the learned horizon (``false_fire_rate_learned``, also reported);
  * ``reversed_order_fire_rate``: ``reversed`` episodes with any active frame, and the same
    per kind in ``kind_fire_rate``; ``missions_anticipated`` / ``missions_held``: rule
    episodes with any / >= 80 % of their B..C frames active.

Conditions vary the gap law (log-uniform 2-300 s, uniform 2-300 s, log-uniform 60-300 s)
and the training repetitions (4, 8, 16). ``policy_fired`` plays the same episodes through
the node's ``SituationBuffer`` and a bundle's policy, for the policy-versus-tracker
comparison (not run by default: it needs a bundle trained on the rule).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from thinkmem_ros.bench import MAX_SEEDS
from thinkmem_ros.bench.common import check_report_outputs
from thinkmem_ros.consolidator.anticipation_export import ExportConfig, build_rules
from thinkmem_ros.consolidator.knowledge import KnowledgeUnit
from thinkmem_ros.core.arguments import OneLineParser
from thinkmem_ros.core.metrics import mean_std
from thinkmem_ros.core.vocabulary import EPISODE_START_EVENT
from thinkmem_ros.policy.anticipation import AnticipationTracker, TrackerConfig
from thinkmem_ros.policy.anticipation_rules import RuleSet

KINDS = ("rule", "prefix", "reversed", "a_alone", "b_alone", "c_alone", "a_c", "b_c",
         "expired")
GAP_LAWS = ("loguniform", "uniform")
RULE = ("E900", "E901", "E902")


@dataclass
class WorldConfig:
    """The event world of one condition (see the module docstring)."""

    codes: tuple[str, ...] = tuple(f"E{i:03d}" for i in range(45))
    rule: tuple[str, str, str] = RULE
    background: float = 20.0  # mean background events per episode
    gap_law: str = "loguniform"
    gap_lo_s: float = 2.0
    gap_hi_s: float = 300.0
    lead_s: tuple[float, float] = (5.0, 60.0)  # first planted event after the marker
    tail_s: tuple[float, float] = (30.0, 450.0)  # the episode continues after the last event
    repeat_a: float = 0.25  # rule/prefix episodes with an extra, earlier A

    def __post_init__(self) -> None:
        self.codes, self.rule = tuple(self.codes), tuple(self.rule)
        if len(self.rule) != 3 or len(set(self.rule)) != 3 or set(self.rule) & set(self.codes):
            raise ValueError(f"rule must be 3 distinct codes outside the background, got "
                             f"{self.rule}")
        if self.gap_law not in GAP_LAWS:
            raise ValueError(f"gap_law must be one of {GAP_LAWS}, got {self.gap_law!r}")
        if not 0 < self.gap_lo_s < self.gap_hi_s:
            raise ValueError(f"need 0 < gap_lo_s < gap_hi_s, got {self.gap_lo_s}, "
                             f"{self.gap_hi_s}")
        if self.background < 0 or not self.codes:
            raise ValueError(f"background must be >= 0 with codes, got {self.background}")

    @property
    def label(self) -> str:
        """The thinking the rule asks for."""
        return f"consider:{self.rule[2]}"

    def gap(self, rng: np.random.Generator) -> float:
        """One gap in seconds from the condition's law."""
        if self.gap_law == "uniform":
            return float(rng.uniform(self.gap_lo_s, self.gap_hi_s))
        return float(math.exp(rng.uniform(math.log(self.gap_lo_s), math.log(self.gap_hi_s))))


@dataclass(frozen=True)
class Episode:
    """One episode on the shared timeline: its planted A/B/C times and all its events."""

    kind: str
    start_s: float
    end_s: float
    rule: tuple[str, str, str]
    planted: dict = field(default_factory=dict)  # "A"/"B"/"C" -> time (s)
    events: tuple[tuple[float, str], ...] = ()  # (time, name) sorted, marker first

    @property
    def label(self) -> str:
        """The rule's thinking label."""
        return f"consider:{self.rule[2]}"


def _planted(kind: str, cfg: WorldConfig, t0: float, rng: np.random.Generator
             ) -> list[tuple[float, str]]:
    """Planted (time, role) pairs of one kind, the first at ``t0``."""
    if kind == "rule":
        b = t0 + cfg.gap(rng)
        return [(t0, "A"), (b, "B"), (b + cfg.gap(rng), "C")]
    if kind == "prefix":
        return [(t0, "A"), (t0 + cfg.gap(rng), "B")]
    if kind == "reversed":
        return [(t0, "B"), (t0 + cfg.gap(rng), "A")]
    if kind in ("a_alone", "b_alone", "c_alone"):
        return [(t0, kind[0].upper())]
    if kind in ("a_c", "b_c"):
        return [(t0, kind[0].upper()), (t0 + cfg.gap(rng), "C")]
    if kind == "expired":
        b = t0 + cfg.gap_hi_s * rng.uniform(2.0, 3.0)
        return [(t0, "A"), (b, "B"), (b + cfg.gap(rng), "C")]
    raise ValueError(f"unknown episode kind {kind!r}; expected one of {KINDS}")


def make_episodes(kinds: Sequence[str], cfg: WorldConfig, rng: np.random.Generator,
                  start_s: float = 0.0) -> list[Episode]:
    """Episodes of ``kinds`` laid end to end from ``start_s`` (each opened by the marker)."""
    out = []
    t = start_s
    roles = dict(zip("ABC", cfg.rule, strict=True))
    for kind in kinds:
        t0 = t + rng.uniform(*cfg.lead_s)
        planted = _planted(kind, cfg, t0, rng)
        if kind in ("rule", "prefix") and rng.random() < cfg.repeat_a:
            planted.append((t + rng.uniform(0.5, t0 - t), "A"))  # an earlier, extra A
        last = max(p for p, _ in planted)
        tail = rng.uniform(*cfg.tail_s)
        if kind == "prefix":  # run past the longest gap so the horizon has to expire
            tail = max(tail, cfg.gap_hi_s * 1.5)
        end = last + tail
        n_bg = int(rng.poisson(cfg.background))
        bg = [(float(x), str(c)) for x, c in zip(rng.uniform(t, end, n_bg),
                                                  rng.choice(cfg.codes, n_bg), strict=True)]
        events = sorted([(p, roles[r]) for p, r in planted] + bg)
        times = {}
        for p, r in sorted(planted):
            times[r] = p  # the latest of a role (the planted A after an extra one)
        out.append(Episode(kind, t, end, cfg.rule, times,
                           ((t, EPISODE_START_EVENT), *events)))
        t = end
    return out


def learn_rules(cfg: WorldConfig, reps: int, rng: np.random.Generator,
                export: ExportConfig | None = None) -> RuleSet:
    """The rule's bounds learned from ``reps`` rule episodes, as a round learns them."""
    train = make_episodes(["rule"] * reps, cfg, rng)
    unit = KnowledgeUnit(pattern=cfg.rule, relation="sequence3", constraints={},
                         thinking=cfg.label, confidence=1.0, status="promoted")
    timelines = [[e for e in ep.events if e[1] != EPISODE_START_EVENT] for ep in train]
    return build_rules([unit], timelines, export)


def frame_times(episodes: Sequence[Episode], rate_hz: float) -> np.ndarray:
    """Frame stamps k / rate over the whole timeline."""
    end = max(ep.end_s for ep in episodes)
    return np.arange(0.0, end, 1.0 / rate_hz)


def tracker_frames(rules: RuleSet, episodes: Sequence[Episode], rate_hz: float = 10.0,
                   config: TrackerConfig | None = None) -> tuple[np.ndarray, dict]:
    """Run the node's tracker over the timeline: (frame times, {label: fired (T,) bool})."""
    cfg = config or TrackerConfig(reset_events=(EPISODE_START_EVENT,))
    tracker = AnticipationTracker(cfg, rules)
    events = sorted((e for ep in episodes for e in ep.events), key=lambda e: e[0])
    times = frame_times(episodes, rate_hz)
    labels = list(rules.labels)
    fired = {label: np.zeros(times.size, dtype=bool) for label in labels}
    i = 0
    for k, t in enumerate(times.tolist()):
        while i < len(events) and events[i][0] <= t:
            tracker.observe(events[i][1], events[i][0])
            i += 1
        for label in tracker.active(t):
            fired[label][k] = True
    return times, fired


def tracker_active(bundle, events: Sequence[tuple[float, str]], times_s: np.ndarray,
                   config: TrackerConfig | None = None) -> list[frozenset[str]]:
    """Labels the node's tracker holds at each frame time, for the rules ``bundle`` ships.

    ``bundle`` is a bundle folder; its ``rules.json`` is loaded as the node loads it (listed
    in the manifest's ``extras.artefacts`` when there is such a list), so a bundle without
    rules (or with refused ones) holds nothing. ``events`` (time, name) in stream seconds,
    ``episode_start`` markers included. Combine with the policy's activation through
    ``robot.thinking_gates.merge_anticipation`` with the labels of ``bundle_rules``.
    """
    rules = bundle_rules(bundle)
    tracker = AnticipationTracker(config or TrackerConfig(reset_events=(EPISODE_START_EVENT,)),
                                  rules)
    ordered = sorted(events, key=lambda e: e[0])
    out: list[frozenset[str]] = []
    i = 0
    for t in np.asarray(times_s, dtype=np.float64).tolist():
        while i < len(ordered) and ordered[i][0] <= t + 1e-9:
            tracker.observe(ordered[i][1], float(ordered[i][0]))
            i += 1
        out.append(frozenset(tracker.active(t)))
    return out


def bundle_rules(bundle) -> RuleSet:
    """The rules a node would track for ``bundle`` (empty without a valid rules artefact)."""
    from thinkmem_ros.policy.bundle import read_manifest
    from thinkmem_ros.robot.thinking_gates import load_gate_artefacts

    arts = load_gate_artefacts(bundle, read_manifest(bundle).extras)
    return arts.rules or RuleSet()


def _learned_open(ep: Episode, times: np.ndarray, rules: RuleSet) -> np.ndarray:
    """Frames where A...B is open within the learned bounds (the issue's definition)."""
    out = np.zeros(times.size, dtype=bool)
    a, b, c = (ep.planted.get(r) for r in "ABC")
    if ep.kind not in ("rule", "prefix", "expired") or a is None or b is None or a > b:
        return out
    for rule in rules.rules:
        if rule.key != ">".join(ep.rule) or b - a > rule.max_gaps_s[0]:
            continue
        win = (times >= b) & (times <= b + rule.horizon_s)
        if c is not None:
            win &= times < c
        out |= win
    return out


def score_frames(episodes: Sequence[Episode], times: np.ndarray, fired: dict,
                 truth_horizon_s: float, rules: RuleSet | None = None) -> dict:
    """Score per-frame activations of each episode's ``consider:C`` (module docstring).

    ``fired`` maps labels to (T,) bool arrays over ``times``; a label missing from it never
    fired. Frames outside every episode are ignored.
    """
    times = np.asarray(times)
    exp_n = exp_hit = out_n = out_hit = learned_n = learned_hit = 0
    kind_any: dict[str, list[bool]] = {k: [] for k in KINDS}
    held, anticipated, leads = [], [], []
    for ep in episodes:
        lo, hi = np.searchsorted(times, [ep.start_s, ep.end_s])
        t = times[lo:hi]
        f = np.asarray(fired.get(ep.label, np.zeros(times.size, bool)))[lo:hi]
        expected = np.zeros(t.size, dtype=bool)
        excused = np.zeros(t.size, dtype=bool)
        b, c = ep.planted.get("B"), ep.planted.get("C")
        if ep.kind == "rule":
            expected = (t > b) & (t < c)
        elif ep.kind == "prefix":
            excused = (t > b) & (t <= b + truth_horizon_s)
        outside = ~expected & ~excused
        exp_n += int(expected.sum())
        exp_hit += int((expected & f).sum())
        out_n += int(outside.sum())
        out_hit += int((outside & f).sum())
        if rules is not None:
            open_ = _learned_open(ep, t, rules)
            learned_n += int((~open_).sum())
            learned_hit += int((~open_ & f).sum())
        kind_any[ep.kind].append(bool((outside & f).any()))
        if ep.kind == "rule" and expected.any():
            hits = t[expected & f]
            anticipated.append(bool(hits.size))
            held.append(float((expected & f).sum() / expected.sum()) >= 0.8)
            if hits.size:
                leads.append(float(c - hits.min()))
    rate = {k: (float(np.mean(v)) if v else None) for k, v in kind_any.items()}
    return {
        "anticipation_frame_recall": exp_hit / exp_n if exp_n else 0.0,
        "false_fire_rate": out_hit / out_n if out_n else 0.0,
        "false_fire_rate_learned": (learned_hit / learned_n if learned_n else 0.0)
        if rules is not None else None,
        "reversed_order_fire_rate": rate["reversed"],
        "kind_fire_rate": rate,
        "missions_anticipated": float(np.mean(anticipated)) if anticipated else 0.0,
        "missions_held": float(np.mean(held)) if held else 0.0,
        "mean_lead_s": float(np.mean(leads)) if leads else 0.0,
        "frames_expected": exp_n, "frames_outside": out_n,
    }


def policy_fired(bundle, episodes: Sequence[Episode], rate_hz: float = 10.0,
                 signals: np.ndarray | None = None, label: str | None = None,
                 event_horizon_s: float = 0.0) -> tuple[np.ndarray, dict]:
    """The policy's own ``consider:C`` per frame, through the node's ``SituationBuffer``.

    ``signals`` (T, F) are offered at the frame times (None: no signal ever arrives, every
    row masked, so the output only changes when an event does and the policy runs once per
    event). Events are offered as the node offers them (the marker, unknown to the bundle's
    vocabulary, is dropped there too).
    """
    from thinkmem_ros.policy.runtime import PolicyRuntime
    from thinkmem_ros.policy.situation import BufferConfig, SituationBuffer

    runtime = PolicyRuntime(bundle)
    m = runtime.bundle.manifest
    label = label or episodes[0].label
    col = list(m.labels).index(label)
    tau = float(m.thresholds[label])
    buf = SituationBuffer(BufferConfig(signals=tuple(m.signals), window=m.window,
                                       stale_after_s=0.5, max_events=m.max_events,
                                       event_vocabulary=tuple(m.event_vocabulary),
                                       event_horizon_s=event_horizon_s))
    events = sorted((e for ep in episodes for e in ep.events), key=lambda e: e[0])
    times = frame_times(episodes, rate_hz)
    fired = np.zeros(times.size, dtype=bool)
    i, current = 0, None
    for k, t in enumerate(times.tolist()):
        changed = False
        while i < len(events) and events[i][0] <= t:
            buf.offer_event(events[i][1], now=events[i][0], stamp=None)
            i += 1
            changed = True
        if signals is not None:
            for j in range(len(m.signals)):
                buf.offer(j, float(signals[k, j]), now=t, stamp=t)
        if signals is None and not changed and current is not None and event_horizon_s == 0:
            fired[k] = current
            continue
        frame = buf.assemble(t)
        probs = runtime.predict_one(frame.signals, frame.mask, frame.events).probabilities[0]
        current = bool(probs[col] >= tau)
        fired[k] = current
    return times, {label: fired}


# ------------------------------------------------------------------ the benchmark

CONDITIONS = {
    "loguniform_2_300": {"gap_law": "loguniform", "gap_lo_s": 2.0, "gap_hi_s": 300.0},
    "uniform_2_300": {"gap_law": "uniform", "gap_lo_s": 2.0, "gap_hi_s": 300.0},
    "loguniform_60_300": {"gap_law": "loguniform", "gap_lo_s": 60.0, "gap_hi_s": 300.0},
}
REPS = (4, 8, 16)
MAIN = ("loguniform_2_300", 8)


def kinds_for(per_kind: int, rule_episodes: int) -> list[str]:
    """Kinds of a test timeline: ``rule_episodes`` rule ones, ``per_kind`` of each other."""
    return ["rule"] * rule_episodes + [k for k in KINDS[1:] for _ in range(per_kind)]


def run(quick: bool = False, seeds: int = 3) -> dict:
    """Every condition x training repetitions, over ``seeds`` seeds (module docstring)."""
    per_kind, rule_eps = (6, 24) if quick else (20, 80)
    keys = ("anticipation_frame_recall", "false_fire_rate", "false_fire_rate_learned",
            "reversed_order_fire_rate", "missions_anticipated", "missions_held")
    curves: dict[str, dict] = {}
    main_rows: list[dict] = []
    for name, law in CONDITIONS.items():
        for reps in REPS:
            rows = []
            for seed in range(seeds):
                rng = np.random.default_rng([seed, reps, sorted(CONDITIONS).index(name)])
                cfg = WorldConfig(**law)
                rules = learn_rules(cfg, reps, rng)
                kinds = [kinds_for(per_kind, rule_eps)[i]
                         for i in rng.permutation(rule_eps + per_kind * (len(KINDS) - 1))]
                episodes = make_episodes(kinds, cfg, rng)
                times, fired = tracker_frames(rules, episodes)
                row = score_frames(episodes, times, fired, cfg.gap_hi_s, rules)
                row["horizon_s"] = rules.rules[0].horizon_s
                row["max_gap_s"] = rules.rules[0].max_gaps_s[0]
                rows.append(row)
            for key in (*keys, "horizon_s", "max_gap_s"):
                curves.setdefault(f"{key}.{name}", {})[str(reps)] = mean_std(
                    [r[key] for r in rows])
            if (name, reps) == MAIN:
                main_rows = rows
    results = {key: mean_std([r[key] for r in main_rows]) for key in keys}
    results["kind_fire_rate"] = {k: mean_std([r["kind_fire_rate"][k] for r in main_rows])
                                 for k in KINDS[1:]}
    results["condition"] = {"gap_law": MAIN[0], "reps": MAIN[1], "frame_rate_hz": 10.0}
    return {"experiment": "anticipation", "metric": "anticipation_frame_recall",
            "quick": quick, "seeds": seeds, "results": results, "curves": curves,
            "targets": {"anticipation_frame_recall": ">= 0.8", "false_fire_rate": "<= 0.01",
                        "reversed_order_fire_rate": "<= 0.05"}}


def compare_with_policy(bundle, *, quick: bool = True, seeds: int = 2, reps: int = 8,
                        with_signals: bool = True) -> dict:
    """Tracker alone, the policy alone and both OR-ed, on the same episodes and frames.

    ``bundle`` must carry ``consider:C`` for a rule whose codes are in its event vocabulary;
    the rule is read from the manifest's ``extras.knowledge_units`` (the first triple) and
    the background codes are the rest of the vocabulary. ``with_signals`` offers a fresh
    ``mixed`` world stream at every frame (what the robot sees); otherwise every signal is
    masked (the form the discovered training rows take, the policy's best case).
    """
    from thinkmem_ros.policy.bundle import load_bundle
    from thinkmem_ros.world.streams import generate_stream

    manifest = load_bundle(bundle).manifest
    triples = [k.split(">") for k in manifest.extras.get("knowledge_units", [])
               if k.count(">") == 2]
    if not triples:
        raise ValueError(f"{bundle}: no A>B>C knowledge unit in extras.knowledge_units")
    rule = tuple(triples[0])
    codes = tuple(c for c in manifest.event_vocabulary if c not in rule)
    per_kind, rule_eps = (4, 16) if quick else (10, 40)
    rate = 10.0
    rows: dict[str, list[dict]] = {"rules": [], "policy": [], "or": []}
    for seed in range(seeds):
        rng = np.random.default_rng([seed, 31])
        cfg = WorldConfig(codes=codes, rule=rule)
        rules = learn_rules(cfg, reps, rng)
        kinds = kinds_for(per_kind, rule_eps)
        episodes = make_episodes([kinds[i] for i in rng.permutation(len(kinds))], cfg, rng)
        times, tracked = tracker_frames(rules, episodes, rate)
        signals = None
        if with_signals:
            stream = generate_stream("mixed", float(times.size) / rate + 1.0, rate, rng)
            cols = [stream.signal_names.index(n) for n in manifest.signals]
            signals = stream.values[:times.size, cols]
        _, policy = policy_fired(bundle, episodes, rate, signals, cfg.label)
        both = {cfg.label: tracked[cfg.label] | policy[cfg.label]}
        for name, fired in (("rules", tracked), ("policy", policy), ("or", both)):
            rows[name].append(score_frames(episodes, times, fired, cfg.gap_hi_s, rules))
    keys = ("anticipation_frame_recall", "false_fire_rate", "false_fire_rate_learned",
            "reversed_order_fire_rate", "missions_anticipated", "missions_held")
    out = {name: {key: mean_std([r[key] for r in rs]) for key in keys}
           for name, rs in rows.items()}
    for name, rs in rows.items():
        out[name]["kind_fire_rate"] = {k: mean_std([r["kind_fire_rate"][k] for r in rs])
                                       for k in KINDS[1:]}
    return {"bundle": str(bundle), "rule": list(rule), "with_signals": with_signals,
            "reps": reps, "seeds": seeds, "methods": out}


def plot(result: dict, path) -> None:
    """Frame recall and false-fire rate per condition against training repetitions."""
    from thinkmem_ros.bench.plots import new_figure, save

    fig, axes = new_figure(2, "Anticipation held by the tracker")
    for ax, key in zip(np.ravel(axes), ("anticipation_frame_recall", "false_fire_rate"),
                       strict=False):
        for name in CONDITIONS:
            series = result["curves"].get(f"{key}.{name}", {})
            xs = sorted(series, key=int)
            ax.errorbar([int(x) for x in xs], [series[x]["mean"] for x in xs],
                        yerr=[series[x]["std"] for x in xs], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("training repetitions")
        ax.set_title(key)
        ax.legend(fontsize=7)
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    """Run from the command line (the working tree, without registering a benchmark)."""
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--json")
    parser.add_argument("--plot")
    parser.add_argument("--policy-bundle", help="also compare with this bundle's own "
                        "consider:C (tracker alone / policy alone / OR)")
    args = parser.parse_args(argv)
    if not 1 <= args.seeds <= MAX_SEEDS:
        parser.error(f"--seeds must be in [1, {MAX_SEEDS}], got {args.seeds}")
    check_report_outputs(parser, args)  # written after the run: refused before it
    if args.policy_bundle:
        from thinkmem_ros.policy.bundle import BundleError

        try:
            for with_signals in (True, False):
                comparison = compare_with_policy(args.policy_bundle, quick=args.quick,
                                                 seeds=args.seeds, with_signals=with_signals)
                print(json.dumps(comparison, indent=1))
        except (BundleError, ValueError, OSError) as exc:
            print(f"{parser.prog}: --policy-bundle: {exc}".splitlines()[0], file=sys.stderr)
            return 2
        return 0
    result = run(args.quick, args.seeds)
    text = json.dumps(result, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    if args.plot:
        plot(result, args.plot)
    print(json.dumps(result["results"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
