"""The compiled terms of the per-pattern checks equal the Python reference, term by term.

``check_kernels`` re-states ``occurrences`` and ``contrasts`` in numba loops; a relation's
figures may only change if these sums and lists do. Worlds are chosen to reach every
branch: many copies of a code (the order test's union bound, the large-episode paths),
a positive ``min_gap``, a finite ``max_gap`` and a short ``max_lookback``, infinite scales
(the contrast's single room stratum), pairs and triples, codes absent from an episode.
"""

import itertools
from dataclasses import dataclass

import numpy as np
import pytest

from thinkmem_ros.consolidator.discovery import DiscoveryConfig, EventLog, checks, discover
from thinkmem_ros.consolidator.discovery.contrasts import ROOM_STRATA
from thinkmem_ros.consolidator.discovery.episodes import _Episodes
from thinkmem_ros.consolidator.discovery.occurrences import _episodes_with
from thinkmem_ros.world.event_worlds import world


@dataclass
class _Episode:
    episode_id: int
    partition: int
    events: list


def _crowded(rng: np.random.Generator) -> EventLog:
    """Four codes, 30 events an episode: many copies of every code."""
    return EventLog.from_episodes(
        _Episode(i, i % 4, [(float(t), f"c{int(x)}") for t, x in
                            zip(np.sort(rng.uniform(0, 100, 30)), rng.integers(0, 4, 30))])
        for i in range(40))


def _condition(name: str):
    def log(rng: np.random.Generator) -> EventLog:
        w = world(name, 8, rng)
        return EventLog.from_episodes(w.episodes, w.codes)
    return log


WORLDS = [
    ("sparse", _condition("sparse"), DiscoveryConfig()),
    ("heartbeat", _condition("heartbeat"), DiscoveryConfig()),
    ("zipf", _condition("zipf"), DiscoveryConfig()),
    ("shared_short_window", _condition("shared"),
     DiscoveryConfig(min_gap=3.0, max_gap=200.0, max_lookback=6)),
    ("crowded", _crowded, DiscoveryConfig()),
    ("crowded_short_window", _crowded, DiscoveryConfig(min_gap=1.0, max_gap=30.0,
                                                        max_lookback=5)),
]


def _gathered(ctx, codes, g, use_kernel):
    length = len(codes)
    others = [p for p in itertools.permutations(range(length)) if p != tuple(range(length))]
    rows = np.unique(np.concatenate([
        _episodes_with(ctx, tuple(x for i, x in enumerate(codes) if i != w))
        for w in range(length)]))
    held = np.zeros(rows.size, bool)
    held[::2] = True  # which episodes support the pattern comes from step 2; any will do
    if use_kernel:
        got = checks._gather_rows(ctx, codes, g, rows, held, others)
        assert got is not None, "numba is a dependency: the kernel must be there"
        return got
    return checks._gather_each(ctx, codes, g, rows, held, others)


@pytest.mark.parametrize(("name", "make", "cfg"), WORLDS, ids=[w[0] for w in WORLDS])
def test_compiled_terms_equal_the_python_reference(name, make, cfg):
    log = make(np.random.default_rng(11))
    ctx = _Episodes(log, cfg)
    rng = np.random.default_rng(5)
    seen_many_copies = False
    for _ in range(100):
        length = int(rng.integers(2, 4))
        codes = tuple(int(x) for x in rng.choice(log.n_codes, length, replace=False))
        g = float(rng.choice(ctx.scales))
        kernel = _gathered(ctx, codes, g, True)
        python = _gathered(ctx, codes, g, False)
        assert repr(kernel) == repr(python), (codes, g)
        seen_many_copies |= bool(ctx.copies(np.arange(ctx.n_ep), np.full(ctx.n_ep, codes[0]))
                                 .max() > 4)
    if name.startswith("crowded"):
        assert seen_many_copies  # the union-bound and large-episode paths were reached


def test_the_kernel_has_the_contrast_strata_of_the_python_side():
    from thinkmem_ros.consolidator.discovery import check_kernels

    assert check_kernels.ROOM_STRATA == ROOM_STRATA


def test_every_relation_is_the_same_with_the_checks_in_python(monkeypatch):
    w = world("heartbeat", 8, np.random.default_rng(2))
    log = EventLog.from_episodes(w.episodes, w.codes)
    compiled = discover(log, DiscoveryConfig(), np.random.default_rng(0))
    monkeypatch.setattr(checks, "USE_KERNEL", False)
    python = discover(log, DiscoveryConfig(), np.random.default_rng(0))
    assert any(r.accepted for r in compiled.scored)
    assert len(compiled.scored) > 20
    assert [repr(r) for r in compiled.scored] == [repr(r) for r in python.scored]


def test_compiled_tails_equal_the_python_ones_to_the_bit():
    from thinkmem_ros.consolidator.discovery.tails import _sign_flip_tail, pb_tail

    rng = np.random.default_rng(8)
    for _ in range(300):
        probs = rng.uniform(0, 1, int(rng.integers(1, 200))) ** rng.uniform(0.5, 8)
        observed = int(rng.integers(0, probs.size + 2))
        python = float(pb_tail([probs], np.array([observed]))[0])
        assert checks._one_tail(probs.tolist(), observed) == python
        d = rng.integers(-6, 7, int(rng.integers(1, 120)))
        assert checks._flip_tail(d) == _sign_flip_tail(d)


def test_without_the_compiled_kernels_the_checks_run_in_python_with_a_warning(
        monkeypatch, caplog):
    """A numba that cannot load (faked: the real one loads here) costs speed, not results."""
    import builtins

    real_import = builtins.__import__

    def refuse(name, globals=None, locals=None, fromlist=(), level=0):
        if fromlist and "check_kernels" in fromlist:
            raise RuntimeError("cannot cache function: no locator available")
        return real_import(name, globals, locals, fromlist, level)

    w = world("sparse", 8, np.random.default_rng(4))
    log = EventLog.from_episodes(w.episodes, w.codes)
    compiled = discover(log, DiscoveryConfig(), np.random.default_rng(0))
    monkeypatch.setattr(checks, "_KERNEL_ERROR", [])
    monkeypatch.setattr(builtins, "__import__", refuse)
    with caplog.at_level("WARNING"):
        python = discover(log, DiscoveryConfig(), np.random.default_rng(0))
    assert "compiled checks unavailable" in caplog.text and "no locator" in caplog.text
    assert checks._kernel() is None
    assert [repr(r) for r in compiled.scored] == [repr(r) for r in python.scored]
