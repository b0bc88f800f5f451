"""Validation gate: publish a retrained candidate only when it is safe to swap in.

A round retrains on whatever the robots sent; nothing guarantees the result is better.
Every check below must pass, and each failure is a sentence in ``GateReport.reasons``:

1. compatibility: same window K, signal order and event length M as the running bundle
   (the node's hot-swap refuses anything else), and no label of the running bundle lost;
2. ONNX parity: ONNX Runtime (what the robot runs) and the torch model agree within
   ``parity_tol`` on every probe situation (held-out direct rows and rule prefixes);
3. no regression: micro-F1 of the candidate over the labels the running bundle knows is
   at least the running bundle's minus ``f1_tolerance`` (0.02), both scored with ONNX
   Runtime at their own thresholds on the SAME rows (the running bundle sees the events
   re-encoded into its own vocabulary, unknown ones dropped as the node does). The rows
   are the held-out direct episodes PLUS the held-out slice of the rehearsal set D (a
   seeded fraction of D's rows not trained on in this round, ``retrain.split_rehearsal``).
   Why both: one held-out episode is ~120 rows, where a single row moves micro-F1 by
   ~0.01, so the 0.02 tolerance was a coin toss (the demo missed by 0.004 where offline
   replays of the same data passed); the D slice adds hundreds of rows of the base
   skills, which is exactly what a warm-started round can forget. The running bundle
   was trained on D, so on that slice the comparison leans towards it: conservative.
   Fewer than ``min_heldout`` rows in all fail the check with a reason (unless
   ``allow_no_heldout``); per-source row counts and F1 go to ``checks``;
4. new rules active: for each promoted unit, fresh held-out prefixes A...B (not the
   training draws) raise ``consider:C`` in at least ``rule_recall`` of cases, and
   histories without the antecedent (filler, B alone, B...A) raise it in at most
   ``rule_false_rate``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from thinkmem_ros.consolidator.knowledge import KnowledgeUnit
from thinkmem_ros.consolidator.material import filler_codes, prefix_events, situations_from_events
from thinkmem_ros.core.data import SituationSet
from thinkmem_ros.core.metrics import micro_scores
from thinkmem_ros.policy.bundle import Bundle

MIN_HELDOUT_ROWS = 200  # a meaningful floor for min_heldout when D is rehearsed


@dataclass
class GateConfig:
    """Tolerances of the validation gate."""

    parity_tol: float = 1e-4
    f1_tolerance: float = 0.02
    # held-out rows (direct + rehearsal) needed to judge regression. 1 keeps small unit
    # tests and rehearsal-less rounds judgeable; the demo's consolidator asks for
    # ``MIN_HELDOUT_ROWS``, below which one row moves micro-F1 by > 1/4 of the tolerance
    min_heldout: int = 1
    allow_no_heldout: bool = False  # pass the regression check when there is nothing to judge
    rule_recall: float = 0.8
    rule_false_rate: float = 0.2
    rule_probes: int = 20

    def __post_init__(self) -> None:
        if self.parity_tol <= 0:
            raise ValueError(f"GateConfig.parity_tol must be > 0, got {self.parity_tol}")
        if not 0 <= self.f1_tolerance <= 1:
            raise ValueError(f"GateConfig.f1_tolerance must be in [0, 1], got "
                             f"{self.f1_tolerance}")
        for name in ("rule_recall", "rule_false_rate"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"GateConfig.{name} must be in [0, 1], got "
                                 f"{getattr(self, name)}")
        if self.min_heldout < 1 or self.rule_probes < 1:
            raise ValueError(f"GateConfig.min_heldout and rule_probes must be >= 1, got "
                             f"{self.min_heldout}, {self.rule_probes}")


@dataclass
class GateReport:
    """The decision, every failed check as a sentence, and the measured numbers."""

    passed: bool
    reasons: list[str] = field(default_factory=list)
    checks: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-ready form (for the round log and the bundle's metrics)."""
        return asdict(self)


def reencode_events(events: np.ndarray, source: Sequence[str], target: Sequence[str]
                    ) -> np.ndarray:
    """Event ids from vocabulary ``source`` to ``target``; unknown names dropped, re-aligned."""
    names = ("",) + tuple(source)
    lookup = {name: i + 1 for i, name in enumerate(target)}
    out = np.zeros_like(events)
    width = events.shape[1]
    for row, ids in enumerate(events):
        kept = [lookup[names[i]] for i in ids if i > 0 and names[i] in lookup][-width:]
        if kept:
            out[row, width - len(kept):] = kept
    return out


def _runtime(bundle: Bundle):
    from thinkmem_ros.policy.runtime import PolicyRuntime

    return PolicyRuntime(bundle, threads=1)


def _compatibility(candidate: Bundle, current: Bundle) -> list[str]:
    c, r = candidate.manifest, current.manifest
    reasons = []
    if c.window != r.window or c.max_events != r.max_events or c.signals != r.signals:
        reasons.append(f"incompatible shapes: K={c.window}, M={c.max_events}, signals "
                       f"{c.signals} vs running K={r.window}, M={r.max_events}, {r.signals}")
    lost = [name for name in r.labels if name not in c.labels]
    if lost:
        reasons.append(f"candidate drops running labels {lost}")
    if c.model_version <= r.model_version:
        reasons.append(f"candidate v{c.model_version} is not newer than v{r.model_version}")
    return reasons


def rule_probes(units: Sequence[KnowledgeUnit], vocabulary: Sequence[str], max_events: int,
                n: int, rng: np.random.Generator) -> list[tuple[KnowledgeUnit, list, list]]:
    """Per unit: ``n`` positive prefixes and ``n`` histories without the antecedent."""
    filler = filler_codes(vocabulary, units)
    out = []
    for unit in units:
        ante = list(unit.antecedent)
        # "B alone" only for 2+ codes: for A -> C it is the antecedent itself (a positive)
        negatives = [[]] + ([[ante[-1]], list(reversed(ante))] if len(ante) > 1 else [])
        pos = [prefix_events(ante, filler, max_events, rng) for _ in range(n)]
        neg = [prefix_events(negatives[i % len(negatives)], filler, max_events, rng)
               for i in range(n)]
        out.append((unit, pos, neg))
    return out


def combined_heldout(heldout: SituationSet, rehearsal_heldout: SituationSet | None
                     ) -> tuple[SituationSet, dict[str, np.ndarray]]:
    """Held-out direct rows + held-out rows of D as one set, and each source's row mask."""
    n_dir = len(heldout)
    if rehearsal_heldout is None or len(rehearsal_heldout) == 0:
        return heldout, {"direct": np.ones(n_dir, bool)}
    if (rehearsal_heldout.label_names != heldout.label_names
            or rehearsal_heldout.event_vocabulary != heldout.event_vocabulary):
        raise ValueError("held-out rehearsal rows are not aligned with the held-out direct "
                         "rows (label names or event vocabulary differ)")
    both = SituationSet.concat([heldout, rehearsal_heldout]) if n_dir else rehearsal_heldout
    is_dir = np.arange(len(both)) < n_dir
    return both, {"direct": is_dir, "rehearsal": ~is_dir}


def validate(candidate: Bundle, current: Bundle, trained, heldout: SituationSet,
             units: Sequence[KnowledgeUnit], cfg: GateConfig,
             rng: np.random.Generator,
             rehearsal_heldout: SituationSet | None = None) -> GateReport:
    """Run every check; ``trained`` is the candidate's torch model (for parity).

    ``rehearsal_heldout`` (the held-out slice of D, ``Material.heldout_rehearsal``) joins
    ``heldout`` in the parity and regression checks.
    """
    from thinkmem_ros.policy.training.train import predict_proba

    reasons = _compatibility(candidate, current)
    checks: dict = {"candidate_version": candidate.version, "running_version": current.version}
    if reasons:
        return GateReport(False, reasons, checks)
    heldout, sources = combined_heldout(heldout, rehearsal_heldout)
    cand_rt = _runtime(candidate)
    m = candidate.manifest
    probes = rule_probes([u for u in units if u.thinking in m.labels], m.event_vocabulary,
                         m.max_events, cfg.rule_probes, rng) if units else []
    histories = [h for _, pos, neg in probes for h in (*pos, *neg)]
    prefix_set = situations_from_events(
        histories, np.zeros((len(histories), len(m.labels)), np.float32), tuple(m.labels),
        tuple(m.event_vocabulary), m.max_events, m.window) if histories else None
    if prefix_set is not None:
        shape = (len(prefix_set), m.window, len(m.signals))
        prefix_set = SituationSet(np.zeros(shape, np.float32), prefix_set.labels,
                                  np.zeros(shape, np.float32), prefix_set.events,
                                  label_names=tuple(m.labels), signal_names=tuple(m.signals),
                                  event_vocabulary=tuple(m.event_vocabulary))
    # 2. parity
    parity = 0.0
    cand_heldout = None
    for data in (heldout, prefix_set):
        if data is None or len(data) == 0:
            continue
        onnx_p = cand_rt.predict(data.signals, data.mask, data.events).probabilities
        torch_p = predict_proba(trained, data)
        parity = max(parity, float(np.abs(onnx_p - torch_p).max()))
        if data is heldout:
            cand_heldout = onnx_p
    checks["parity_max_abs"] = parity
    if parity > cfg.parity_tol:
        reasons.append(f"ONNX/torch parity {parity:.2e} exceeds {cfg.parity_tol:.0e}")
    # 3. regression on held-out direct material
    reasons += _regression(cand_rt, cand_heldout, current, heldout, sources, cfg, checks)
    # 4. rules
    if probes:
        probs = cand_rt.predict(prefix_set.signals, prefix_set.mask,
                                prefix_set.events).probabilities
        reasons += _rules(probes, probs, cand_rt.thresholds, list(m.labels), cfg, checks)
    return GateReport(not reasons, reasons, checks)


def _regression(cand_rt, cand_probs, current: Bundle, heldout: SituationSet,
                sources: dict[str, np.ndarray], cfg: GateConfig, checks: dict) -> list[str]:
    checks["heldout_rows"] = len(heldout)
    checks["heldout_rows_by_source"] = {k: int(v.sum()) for k, v in sources.items()}
    if len(heldout) < cfg.min_heldout:
        checks["regression"] = "skipped"
        if cfg.allow_no_heldout:
            return []
        counts = ", ".join(f"{v} {k}" for k, v in checks["heldout_rows_by_source"].items())
        return [f"only {len(heldout)} held-out rows ({counts}; < min_heldout "
                f"{cfg.min_heldout}): too few to show the candidate does not regress"]
    run_rt = _runtime(current)
    r = current.manifest
    events = reencode_events(heldout.events, heldout.event_vocabulary, r.event_vocabulary)
    run_probs = run_rt.predict(heldout.signals, heldout.mask, events).probabilities
    cols = [heldout.label_names.index(name) for name in r.labels]
    cand_cols = [list(cand_rt.manifest.labels).index(name) for name in r.labels]
    truth = heldout.labels[:, cols]
    f1_run = micro_scores(truth, run_probs >= run_rt.thresholds)["f1"]
    f1_cand = micro_scores(truth, cand_probs[:, cand_cols]
                           >= cand_rt.thresholds[cand_cols])["f1"]
    cand_pred = cand_probs[:, cand_cols] >= cand_rt.thresholds[cand_cols]
    run_pred = run_probs >= run_rt.thresholds
    f1_all = micro_scores(heldout.labels, cand_probs >= cand_rt.thresholds)["f1"]
    checks.update(f1_running=f1_run, f1_candidate=f1_cand, f1_candidate_all_labels=f1_all)
    checks["f1_by_source"] = {  # for the log; the decision uses all rows together
        k: {"running": micro_scores(truth[rows], run_pred[rows])["f1"],
            "candidate": micro_scores(truth[rows], cand_pred[rows])["f1"]}
        for k, rows in sources.items() if rows.any()}
    if f1_cand < f1_run - cfg.f1_tolerance:
        return [f"held-out micro-F1 regressed: {f1_cand:.3f} < running {f1_run:.3f} - "
                f"tolerance {cfg.f1_tolerance}"]
    return []


def _rules(probes, probs: np.ndarray, tau: np.ndarray, labels: list[str], cfg: GateConfig,
           checks: dict) -> list[str]:
    reasons, per_unit, row = [], {}, 0
    for unit, pos, neg in probes:
        j = labels.index(unit.thinking)
        fired = probs[row:row + len(pos), j] >= tau[j]
        row += len(pos)
        false = probs[row:row + len(neg), j] >= tau[j]
        row += len(neg)
        recall, false_rate = float(fired.mean()), float(false.mean())
        per_unit[unit.key] = {"recall": recall, "false_rate": false_rate}
        if recall < cfg.rule_recall:
            reasons.append(f"rule {unit.key}: {unit.thinking} fires on {recall:.0%} of "
                           f"held-out prefixes (< {cfg.rule_recall:.0%})")
        if false_rate > cfg.rule_false_rate:
            reasons.append(f"rule {unit.key}: {unit.thinking} fires on {false_rate:.0%} of "
                           f"histories without the antecedent (> {cfg.rule_false_rate:.0%})")
    checks["rules"] = per_unit
    return reasons
