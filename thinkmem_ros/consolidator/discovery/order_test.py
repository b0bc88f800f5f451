"""The order check: is the order of A...B...C specific, or do its codes only come together.

Part of ``consolidator.discovery`` (step 3, the per-pattern checks). The family-wide test
says the codes sit closer than chance; codes that come together in no fixed order (three
alarms of one fault, logged in whatever order their drivers flush) pass it too, and in a
given history one of their L! orders looks tightest by chance. The question here is
therefore not "closer than chance" but "this order rather than the others".

Null: the codes' roles are exchangeable. Relabelling the codes maps each order onto
another, so in every episode holding all of them forward's fit is a uniform draw from the
fits of all L! orders, independently per episode (``tails.relabel_tail``, exact). A
cluster of one copy of each code stays one copy of each under a relabelling; permuting the
labels over the codes' slots, as this check did before, gave it a second copy as often as
not, which made the order it happened to show look rare, and it was read at the scale the
family-wide stage had chosen for that very order. Each order is scored by the family's own
statistics, the surprise of its tightest occurrence's level in that episode in quarter
bits (``tails._level_scores``) plus the level itself: a map that is the same for every
order of an episode, so the relabelling test stays exact. The bits make tight fits count
for far more than the coarse fits every order reaches somewhere in a long episode; the
level keeps the evidence of short missions, whose null makes every level likely enough to
score 0 bits (the demo's planted rule had an order p of 1 on bits alone).

The order tested is the one the data made significant, the best of L! by selection, so its
p-value is multiplied by L! (Bonferroni over the orders): an unordered cluster then
passes as one order at most at the check's level, not L! times that. Measured with it
(``docs/discovery.md``, Order): a false ordered triple from an unordered cluster in 0 of
12 runs of the project's test world against 5 of 12 before, and exp6's relation F1 at 8
repetitions 0.91-0.99 over 30 seeds in every condition, as before within 0.01.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from thinkmem_ros.consolidator.discovery.episodes import _Episodes
from thinkmem_ros.consolidator.discovery.significance import _null_probs
from thinkmem_ros.consolidator.discovery.tails import _level_scores, relabel_tail

STEPS_PER_BIT = 4
"""Score resolution of the order check's bits: a quarter bit. Whole bits floor every level
a short, dense mission's null makes likelier than 1/2 to 0 (on bits alone, the rounds'
round-2 rule waited until round 5 on one seed); the relabelling law only grows with it."""


def orders(length: int) -> list[tuple[int, ...]]:
    """Every order other than forward, as index permutations (the checks' ``others``)."""
    return [p for p in itertools.permutations(range(length)) if p != tuple(range(length))]


def order_p(ctx: _Episodes, codes: tuple[int, ...], rows: np.ndarray, levels: np.ndarray,
            diffs: np.ndarray) -> float:
    """P-value of forward's order against the pattern's other orders, times L!.

    ``rows``: the episodes holding every code; ``levels`` forward's fitted scales there,
    ``diffs`` (rows, L! - 1) forward's less each other order's (``orders``).
    """
    if not len(rows):
        return 1.0
    rows = np.asarray(rows, np.int64)
    fitted = np.asarray(levels, np.int64)[:, None] - np.concatenate(
        (np.zeros((len(rows), 1), np.int64), np.asarray(diffs, np.int64)), axis=1)
    # sorted: the score map must be the same under every relabelling, and the exact order
    # probability at the widest scale depends on which code has how many copies
    copies = np.sort(np.stack([ctx.copies(rows, np.full(rows.size, c)) for c in codes],
                             axis=1), axis=1)
    score = np.concatenate((np.zeros((rows.size, 1), np.int64), _level_scores(
        _null_probs(ctx, rows, copies), STEPS_PER_BIT)), axis=1)
    steps = np.take_along_axis(score, fitted, axis=1) + fitted
    p = relabel_tail(steps[:, :1] - steps[:, 1:])
    return min(1.0, p * math.factorial(len(codes)))
