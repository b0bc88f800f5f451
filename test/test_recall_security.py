"""Security of episodic recall: who may ask, what a hostile peer can cost, what it breaks.

Every test runs real ZeroMQ sockets (and real CURVE keys where authentication is
checked) against a ``RecallServer`` over a synthetic index; no model is needed.
"""

from __future__ import annotations

import numpy as np
import pytest

from thinkmem_ros.consolidator.recall_server import EpisodeRef, RecallIndex

D = 16


def _index(n: int, dim: int = D, seed: int = 0) -> tuple[RecallIndex, np.ndarray]:
    emb = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    index = RecallIndex(dim)
    index.add(emb, [EpisodeRef("r0", f"e{i}", i, float(i), [], None) for i in range(n)])
    return index, emb


@pytest.mark.parametrize("scale", [1.0, 1e20, 1e-25, 1e37, 1e-36])
def test_a_query_finds_its_own_row_at_any_finite_scale(scale):
    index, emb = _index(50)
    items = index.query(emb[5] * np.float32(scale), 3)
    assert items[0]["seq"] == 5
    assert items[0]["score"] == pytest.approx(1.0, abs=1e-5)


def test_rows_of_extreme_magnitude_are_indexed_by_direction():
    index, emb = _index(20)
    huge = RecallIndex(D)
    huge.add(emb * np.float32(1e30), index.refs)
    assert huge.query(emb[3], 1)[0]["seq"] == 3
    assert huge.query(emb[3], 1)[0]["score"] == pytest.approx(1.0, abs=1e-5)
