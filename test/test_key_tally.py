"""Exact key counts over parts, in memory and spilled to disk (real files, no mocks)."""

import numpy as np
import pytest

from thinkmem_ros.consolidator.bucket_files import BucketFiles, ParkedArray
from thinkmem_ros.consolidator.key_tally import KeyTally


def _parts(seed: int, n_parts: int = 12):
    rng = np.random.default_rng(seed)
    for _ in range(n_parts):
        keys = rng.integers(0, 3_000, size=rng.integers(0, 800))
        keys[: keys.size // 4] = rng.integers(0, 2**40, size=keys.size // 4)  # sparse range
        yield keys, rng.integers(1, 4, size=keys.size)


def _expected(seed: int, floor: int):
    keys = np.concatenate([k for k, _ in _parts(seed)])
    counts = np.concatenate([c for _, c in _parts(seed)])
    uniq, inverse = np.unique(keys, return_inverse=True)
    sums = np.bincount(inverse, weights=counts).astype(np.int64)
    return uniq[sums >= floor], sums[sums >= floor]


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("span", [None, 2**40])
@pytest.mark.parametrize("memory_rows", [10**9, 700, 1])
def test_counts_are_exact_whether_or_not_they_spill(tmp_path, memory_rows, span, threads):
    tally = KeyTally(memory_rows=memory_rows, buckets=16, directory=str(tmp_path), span=span,
                     threads=threads)
    for keys, counts in _parts(3):
        tally.add(keys, counts)
    assert tally.spilled == (memory_rows < 10**9)
    keys, counts = tally.counted(3)
    want_keys, want_counts = _expected(3, 3)
    assert np.array_equal(keys, want_keys) and np.array_equal(counts, want_counts)
    assert not keys.flags.writeable  # at the floor: the kept arrays, shared, not copied
    # a higher floor is served from what was kept; the files are gone
    assert np.array_equal(tally.at_least(5), _expected(3, 5)[0])
    assert list(tmp_path.iterdir()) == []


def test_a_lower_floor_after_finishing_is_refused():
    tally = KeyTally(memory_rows=1, buckets=4)
    tally.add(np.array([1, 2, 2]), np.ones(3, np.int64))
    assert tally.at_least(2).tolist() == [2]
    with pytest.raises(RuntimeError, match="floor 2"):
        tally.at_least(1)
    with pytest.raises(RuntimeError, match="after finish"):
        tally.add(np.array([1]), np.ones(1, np.int64))


def test_a_key_outside_the_span_is_refused():
    tally = KeyTally(memory_rows=1, buckets=4, span=100)
    with pytest.raises(ValueError, match="span"):
        tally.add(np.array([5, 100]), np.ones(2, np.int64))
    tally.close()


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="power of two"):
        KeyTally(buckets=3)
    with pytest.raises(ValueError, match="buckets"):
        BucketFiles(0, np.int64)


def test_bucket_files_keep_append_order_per_bucket(tmp_path):
    with BucketFiles(3, np.dtype([("a", np.int32)]), str(tmp_path)) as files:
        for step in range(3):
            files.append(np.arange(6) % 3, a=np.arange(6) + 10 * step)
        assert files.read(1)["a"].tolist() == [1, 4, 11, 14, 21, 24]
        assert files.rows == 18
        files.drop(1)
        assert files.read(1).size == 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("array", [np.arange(5, dtype=np.int64) * 7_000_000_001,
                                   np.zeros(0, np.int64), np.linspace(0, 1, 9)])
def test_a_parked_array_comes_back_as_it_was_and_leaves_no_file(tmp_path, array):
    parked = ParkedArray(array, str(tmp_path))
    assert len(list(tmp_path.rglob("*.bin"))) == 1  # on disk, not in this object
    back = parked.load()
    assert back.dtype == array.dtype and np.array_equal(back, array)
    assert list(tmp_path.iterdir()) == []
    ParkedArray(array, str(tmp_path)).close()
    assert list(tmp_path.iterdir()) == []
