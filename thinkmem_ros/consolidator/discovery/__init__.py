"""Cross-experience discovery of long-range ordered relations A...B...C and A...B.

``docs/discovery.md`` gives the reasoning and the measured figures; in short, four steps,
every statistic a sum over episodes (counts and null expectations), so a history split into
partitions can be scored from per-partition sums.

1. Candidates. For every episode, every ordered triple of DISTINCT codes (a, b, c) that
   occurs as slots i < j < k with each step's gap in [min_gap, max_gap] (and at most
   ``max_lookback`` events apart) is recorded once per episode, with its tightest
   occurrence: m_e = min over occurrences of max(t_j - t_i, t_k - t_j). Only the nearest
   a before and the nearest c after each b can be tightest, so an episode yields at most
   n * u^2 rows (n events, u distinct codes) however often a code repeats; a triple whose
   pairs (a, b) or (b, c) occur in fewer than ``candidate_support`` episodes is never built.

2. Significance (family-wide, FDR). Null hypothesis: within each episode the codes are
   arranged at random over that episode's own time slots (the episode's multiset of codes
   and its timing are kept; which code sits in which slot is random). Under it, episode e
   holds the pattern at scale g with probability p_e(g) <= k_a k_b k_c T_e(g) / n(n-1)(n-2)
   (k_x copies of each code, T_e(g) slot triples whose two gaps fit in [min_gap, g]); at
   g = infinity with min_gap = 0 p_e is exact (a small dynamic programme over the copies).
   Scales: ``scales`` times the median gap between consecutive events (a sqrt(2) ladder,
   continued until it reaches the median episode span), plus max_gap. An episode's level
   is the number of scales its tightest occurrence fits in, P(level >= l) is p_e at the
   l-th largest scale, and the episode scores the surprise
   of its level in bits, Z_e = floor(-log2 P(level >= l)) (0 when absent): a tight, rare
   occurrence weighs far more than a chance frame that merely holds the pattern somewhere.
   The map from level to bits depends only on the null probabilities, episodes are
   independent, so the exact upper tail of Z = sum_e Z_e (a dynamic programme; a Chernoff
   bound where that would be too large) is a p-value - no permutation floor, no
   Bonferroni over scales. The same tail of the summed level itself (suits short missions
   where a rule's and a chance frame's tails differ by less than a bit) is the second
   statistic; the pattern's p-value is the exact tail of the better of the two (their
   joint law; twice the smaller, a union bound, far from the level).
   Family: every ordered pattern whose codes co-occur in >= ``accept_support`` episodes,
   less Tarone's untestable ones (smallest achievable p-value above the level);
   Benjamini-Hochberg at q = ``alpha``, weighted (mean weight 1) by how much more often the
   code set co-occurs than independent codes would - a statistic of the multisets the null
   holds fixed, so the weights keep the FDR guarantee while bringing in the between-episode
   evidence the within-episode test cannot see. Once step 3 has run, the cutoff is worked
   out again counting only the patterns that passed every check (a refused pattern's p
   taken as 1 is still a valid p-value): riders and phase-ordered code sets reject the
   within-episode null without being relations, and counted by BH they loosened the
   cutoff for the chance sets that got through the checks.

3. Per-pattern checks on the significant set, each an exact conditional test; Holm's
   step-down at ``alpha`` over that set on the largest of their p-values:
   - order (``order_test``): the codes' roles relabelled, forward's surprise in bits in
     each episode holding them is a uniform draw from all L! orders' (exact); its tail
     times L! (the order tested is the best of L! by selection), so codes that come
     together in no fixed order are not taken for one of their orders;
   - each element adds: with the other two codes where they are, the element's own
     occurrences are treated as landing on slots at its base rate f_x (its share of all
     events): P(x on one of the m_e slots that would complete the pattern) =
     1 - (1 - f_x)^m_e. C must follow A...B more often than C's base rate allows (kills a
     real pair A...B plus a common C), B must sit between A and C more often than chance
     (kills a heartbeat or a frequent middle), A must precede B...C (kills Y...B...C);
   - productivity (Webb): each element needs evidence that position alone cannot earn
     (the tests above take slots as exchangeable, so a code at a fixed phase of most
     episodes gains from its position): its contrast with real cases without it (first
     element: C follows a B that A preceded more often than a B no A preceded; middle
     element: the pattern completes from an A followed by B more often than C follows an A
     no B followed, stratified by the room left in the episode) or its binding to its
     neighbours (B follows A in A's episodes more often than B turns up without A), twice
     the smaller p-value (Fisher's exact test, refined by Boschloo's where borderline); a
     test that cannot reach the level is no evidence and is left out; with neither, a
     first element waits for more evidence (a code at a fixed phase of nearly every
     mission fools the tests above), a middle one stands on them, a pair is refused;
     rules that share B...C shield each other's cases from the first element's "without"
     side; the first contrasts of riders are Holm-adjusted in families (pairs sharing C,
     unbound X...B...C sharing B...C, triples sharing X that wait on X alone: a code at
     a fixed phase is tried in front of every natural pair after it);
   - placement (``placement``): the slot-exchangeable tests above cannot tell a rule
     from codes that keep to a phase of the episode. Each element in turn gets a
     placement (its copies' times as fractions of the episode's span, or none) drawn
     from its code's placements over all episodes, the others staying put; the exact
     law of the summed levels (a convolution over the episodes) gives a p-value per
     element, the largest is the check's, and a Holm of its own runs over the patterns
     Holm passed on the checks above;
   - stability: support (at g*, where the evidence is) in >= ``min_partitions`` temporal
     partitions, no partition holding more than ``max_partition_share`` of it (a burst
     is not a regularity);
   - support >= ``accept_support`` and confidence >= ``min_confidence``.

4. Redundancy (self-sufficiency). Triples are taken strongest first (their weakest
   p-value); the episodes where a stronger accepted triple sharing two codes occurs are
   removed, and the triple must stay significant at the family cutoff on what is left
   (unless the stronger one is explained by it in turn and weaker family-wide: then the
   stronger one gives way).
   Accepted pairs inside an accepted triple are folded into it. Relations are predictive
   regularities, never causes.

Relation fields are measured at the scale g* where the checks run: the scale where the
pattern's support is most surprising, widened while a wider finite scale holds more cases
at nearly the same surprise (``_check_scale``): support, antecedent (A...B within g*),
confidence = support / antecedent, gaps (``max_gap`` = g*). ``scored`` holds every
pattern with p <= alpha before correction, with the reasons it was or was not accepted.

Where each step lives: ``model`` (configuration, ``EventLog``, ``Relation``, the result),
``episodes`` (the per-episode index), ``candidates`` (step 1), ``significance``, ``tails``
and ``family`` (step 2), ``occurrences``, ``contrasts``, ``placement`` and ``checks`` (step 3),
``examine`` (step 3's families and the reasons), ``redundancy`` (step 4), ``scan`` and
``spill`` (the passes over a log, whole or part by part; ``engine.py`` runs the parts),
``vocabulary`` and ``density`` (codes too few robots report, episodes too dense to scan),
``arrays`` (sorted-key helpers). ``discover`` below ties them together.
"""

from __future__ import annotations

import math
import time as _time
from dataclasses import replace

import numpy as np

from thinkmem_ros.consolidator.discovery.arrays import _lookup, _sorted_set_key
from thinkmem_ros.consolidator.discovery.density import scan_weights, without_dense
from thinkmem_ros.consolidator.discovery.examine import _examine
from thinkmem_ros.consolidator.discovery.family import _cooccurrence_weights, tarone_bh
from thinkmem_ros.consolidator.discovery.model import (
    DiscoveryConfig,
    DiscoveryResult,
    EventLog,
    Relation,
    pairs_inside,
    relation_f1,
)
from thinkmem_ros.consolidator.discovery.redundancy import _fold, _self_sufficient
from thinkmem_ros.consolidator.discovery.scan import _parts, _scan_parts, _scan_whole
from thinkmem_ros.consolidator.discovery.tails import pb_tail, poisson_tail_bound
from thinkmem_ros.consolidator.discovery.vocabulary import fleet_log
from thinkmem_ros.consolidator.engine import EmbeddedEngine

__all__ = ["DiscoveryConfig", "DiscoveryResult", "EventLog", "Relation", "discover",
           "pairs_inside", "pb_tail", "poisson_tail_bound", "relation_f1", "tarone_bh"]


# ----------------------------------------------------------------------------- discover
def discover(log: EventLog, cfg: DiscoveryConfig, rng: np.random.Generator,
             progress=None, engine=None) -> DiscoveryResult:
    """Find the relations of ``log`` (see the module docstring for the four steps).

    ``rng`` is accepted for a stable signature; the tests are analytic and deterministic.
    ``engine`` runs the passes over a log's parts (``consolidator/engine.py``; default: in
    this process).
    """
    del rng
    start = _time.perf_counter()
    log, excluded = fleet_log(log, cfg)
    log, too_dense, distinct = without_dense(log, cfg)
    weights = scan_weights(log, cfg, distinct)
    parts = _parts(log, cfg.part_events, weights)
    if len(parts) < 2:
        ctx, candidates, by_length = _scan_whole(log, cfg, parts)
    else:
        engine = engine or EmbeddedEngine()
        # parts that run side by side in this process are smaller, so that together they
        # hold what one part did (the sums do not depend on where parts are cut)
        share = max(1, getattr(engine, "concurrent_parts", 1))
        parts = _parts(log, max(1, cfg.part_events // share), weights)
        ctx, candidates, by_length = _scan_parts(log, cfg, parts, engine)
    v = ctx.v
    # where a round's discovery time goes, for the round report: the scan with the
    # family-wide tests, the per-pattern checks, the redundancy step
    step_s = {"scan": _time.perf_counter() - start, "checks": 0.0, "redundancy": 0.0}
    notes: dict = {"scales": ctx.scales.tolist(), "median_gap": ctx.delta,
                   "codes_too_few_robots": excluded, "episodes_too_dense": too_dense,
                   "parts": len(parts), "pass_s": dict(ctx.pass_s),
                   "family_budget": dict(ctx.family), "step_s": step_s}
    if progress is not None:
        progress()
    scored: list[Relation] = []
    accepted_triples: list[Relation] = []
    for length, (tested, set_keys, set_counts) in by_length.items():
        if tested.weight.size != tested.keys.size:  # a scan in parts brings them looked up
            set_weight = _cooccurrence_weights(ctx, set_keys, set_counts, length)
            tested.weight = _lookup(set_keys, set_weight, _sorted_set_key(tested.codes, v),
                                    1.0) if tested.keys.size else np.ones(0)
        family = math.factorial(length) * int(set_keys.size)
        cutoff, k_star, m = tarone_bh(tested.p / tested.weight, tested.minp / tested.weight,
                                      family, cfg.alpha, tested.other_minp)
        notes[f"family_{length}"] = {"sets": int(set_keys.size), "hypotheses": family,
                                     "tarone_k": k_star, "testable": m, "cutoff": cutoff}
        started = _time.perf_counter()
        relations, checked = _examine(ctx, tested, length, cutoff, m)
        notes[f"family_{length}"]["cutoff_checked"] = checked
        step_s["checks"] += _time.perf_counter() - started
        if length == 3:
            started = _time.perf_counter()
            accepted_triples, relations = _self_sufficient(ctx, tested, relations, checked)
            step_s["redundancy"] += _time.perf_counter() - started
        scored += relations
    accepted = _fold(accepted_triples + [r for r in scored if len(r.pattern) == 2
                                         and r.accepted])
    accepted_keys = {r.pattern for r in accepted}
    scored = [r if r.pattern in accepted_keys or not r.accepted else
              replace(r, accepted=False, reasons=r.reasons + ("folded into an accepted "
                                                              "triple",))
              for r in scored]
    return DiscoveryResult(accepted=accepted, scored=scored, candidates=candidates,
                           null_max={}, config=cfg, n_events=int(log.code.size),
                           n_episodes=int(len(log.episode_ids)),
                           seconds=_time.perf_counter() - start, codes=log.codes, notes=notes,
                           episode_ids=log.episode_ids)
