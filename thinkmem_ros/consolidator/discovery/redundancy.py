"""Self-sufficiency (step 4): a triple must stand without stronger overlapping ones.

Why: a real rule A...B...C makes X...B...C significant for codes X near A; removing the
episodes a stronger accepted triple explains and testing again keeps only what adds.
Part of ``consolidator.discovery``; its package docstring gives the four steps.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from thinkmem_ros.consolidator.discovery.episodes import _Episodes
from thinkmem_ros.consolidator.discovery.model import Relation, pairs_inside
from thinkmem_ros.consolidator.discovery.significance import _null_probs, _observed_scores, _Tested
from thinkmem_ros.consolidator.discovery.tails import _score_tail, two_statistic_tail


def _self_sufficient(ctx: _Episodes, tested: _Tested, relations: list[Relation],
                     cutoff: float) -> tuple[list[Relation], list[Relation]]:
    """Keep a triple only if it stays significant without stronger overlapping triples.

    Strongest first (weakest link: the largest of its p-values, then support): the episodes
    where an accepted triple sharing two codes with it occurs (at any gap) are removed and
    its multi-scale within-episode test is redone on the remaining frames; it must still
    pass the family cutoff. Strength can mislead when two triples explain each other: a
    code that by chance sits before A in several of a rule's episodes makes Y...A...B, whose
    checks may all be a little stronger than the rule's own. So a triple that fails against
    the kept ones is asked the question back: where every kept triple that explains it is
    itself explained by it (fails without its episodes), keeps less evidence of its own
    (a larger residual p-value) and is weaker in the family-wide test, the kept ones give
    way to it. (Without that last condition a frequent code's triple, which occurs at some
    gap in nearly every episode of a rule, displaced the rule itself.)
    Returns (accepted, all scored).
    """
    lookup = {name: c for c, name in enumerate(ctx.log.codes)}

    def index(pattern: tuple[str, ...]) -> int:
        key = 0
        for name in pattern:
            key = key * ctx.v + lookup[name]
        return int(np.searchsorted(tested.keys, key))

    def occurring(i: int) -> set[int]:
        """Episodes where candidate i occurs at all (any gap up to max_gap)."""
        lo, hi = tested.frame_start[i], tested.frame_start[i + 1]
        return set(tested.frame_ep[lo:hi][tested.frame_m[lo:hi] <= ctx.scales[-1]].tolist())

    def residual(i: int, explained: set[int]) -> tuple[float, int]:
        """Weighted p-value and support of candidate i without the ``explained`` episodes."""
        lo, hi = tested.frame_start[i], tested.frame_start[i + 1]
        keep = ~np.isin(tested.frame_ep[lo:hi], np.fromiter(explained, np.int64))
        m = tested.frame_m[lo:hi][keep]
        pe = _null_probs(ctx, tested.frame_ep[lo:hi][keep], tested.frame_k[lo:hi][keep])
        obs = int((m <= ctx.scales[-1]).sum())
        if obs < ctx.cfg.accept_support:
            return 1.0, obs
        z = int(_observed_scores(m, pe, ctx.scales).sum())
        z_levels = int((m[:, None] <= ctx.scales[None, :]).sum())
        p = two_statistic_tail(pe, z, z_levels)
        if p != p:  # too large for the joint law: twice the smaller tail (a union bound)
            p = 2.0 * min(float(_score_tail([pe], np.array([z]))[0]),
                          float(_score_tail([pe], np.array([z_levels]), bits=False)[0]))
        return min(p, 1.0) / tested.weight[i], obs

    order = sorted(range(len(relations)), key=lambda r: (_weakest_link(relations[r]),
                                                        -relations[r].support))
    kept: list[int] = []
    out = list(relations)
    for r in order:
        rel = relations[r]
        if not rel.accepted:
            continue
        overlapping = [k for k in kept
                       if len(set(relations[k].pattern) & set(rel.pattern)) >= 2]
        if overlapping:
            i = index(rel.pattern)
            explained = set().union(*(occurring(index(relations[k].pattern))
                                      for k in overlapping))
            p_rel, obs = residual(i, explained)
            if not p_rel <= cutoff:
                mine = occurring(i)
                back = [residual(index(relations[k].pattern), mine)[0] for k in overlapping]
                if all(not pk <= cutoff and pk > p_rel and relations[k].p_value > rel.p_value
                       for k, pk in zip(overlapping, back)):
                    for k in overlapping:
                        kept.remove(k)
                        out[k] = replace(relations[k], accepted=False, reasons=relations[
                            k].reasons + (f"explained by the overlapping triple "
                                          f"{'>'.join(rel.pattern)}, which keeps more "
                                          f"evidence without it",))
                else:
                    out[r] = replace(rel, accepted=False, reasons=rel.reasons + (
                        f"explained by stronger overlapping triples (residual support {obs}, "
                        f"p {p_rel:.3g})",))
                    continue
        kept.append(r)
    return [out[k] for k in kept], out


def _weakest_link(rel: Relation) -> float:
    """A pattern is as strong as its least significant necessary part."""
    parts = [rel.p_value, rel.p_order, *rel.p_adds]
    return max(p for p in parts if not math.isnan(p))


def _fold(accepted: list[Relation]) -> list[Relation]:
    """Drop accepted pairs that an accepted triple already contains (in the same order)."""
    covered = pairs_inside(r.pattern for r in accepted if len(r.pattern) == 3)
    kept = [r for r in accepted if len(r.pattern) == 3 or r.pattern not in covered]
    return sorted(kept, key=lambda r: (-len(r.pattern), r.p_value, -r.support, r.pattern))
