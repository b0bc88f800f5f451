"""Memory control: probes, artefact, label rules and every PaMER fallback rule."""

from __future__ import annotations

import numpy as np
import pytest

from thinkmem_ros.consolidator.memctl_train import (
    compress_targets,
    fit_memctl_heads,
    recall_targets,
    set_frequencies,
)
from thinkmem_ros.policy.memctl_heads import MemctlArtefactError, MemctlHeads, ProbeHead
from thinkmem_ros.robot.memory_control import (
    FolderSummaryStore,
    LocalHistory,
    MemoryController,
    Situation,
)
from thinkmem_ros.robot.recall import RecallClient

D, F, K = 6, 3, 4


def _heads(compress_bias: float = 5.0, recall_bias: float = -5.0) -> MemctlHeads:
    return MemctlHeads(ProbeHead(np.zeros(D), compress_bias), ProbeHead(np.zeros(D), recall_bias))


def _history(frames: int = 80) -> LocalHistory:
    hist = LocalHistory(block_frames=16, n_features=F)
    for t in range(frames):
        hist.append(np.full(F, float(t)))
    return hist


def _situation(**kw) -> Situation:
    base = dict(robot_id="r1", session_id="s1", window=np.zeros((K, F), np.float32),
                embedding=np.ones(D, np.float32))
    base.update(kw)
    return Situation(**base)


def test_fitted_probes_separate_and_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, D))
    yc = (x[:, 0] > 0).astype(int)
    yr = (x[:, 1] + x[:, 2] > 0.5).astype(int)
    heads = fit_memctl_heads(x * 3 + 1, yc, yr, seed=0)
    pc = heads.compress.probability(x * 3 + 1)
    assert ((pc >= 0.5) == yc).mean() > 0.95
    assert ((heads.recall.probability(x * 3 + 1) >= 0.5) == yr).mean() > 0.9
    heads.save(tmp_path)
    loaded = MemctlHeads.load(tmp_path)
    np.testing.assert_allclose(loaded.compress.probability(x), heads.compress.probability(x))
    (tmp_path / "memctl.npz").write_bytes(b"junk")
    with pytest.raises(MemctlArtefactError, match="sha256"):
        MemctlHeads.load(tmp_path)


def test_label_rules_from_ground_truth():
    labels = np.zeros((100, 3))
    labels[50:55, 1] = 1  # an episode at frames 50..54
    ends = np.array([20, 52, 60, 80, 99])
    # window 4 + horizon 10 frames at 1 Hz, horizon_s=10
    c = compress_targets(labels, ends, window=4, rate_hz=1.0, horizon_s=10.0)
    assert c.tolist() == [1, 0, 0, 1, 1]
    freq = set_frequencies(labels)
    r = recall_targets(labels, ends, 1.0, freq, rare_frac=0.02, transition_s=3.0)
    assert r.tolist() == [0, 1, 0, 0, 0]  # transition near 52; 5 % set is not rare
    r = recall_targets(labels, ends, 1.0, freq, rare_frac=0.10, transition_s=1.0)
    assert r.tolist() == [0, 1, 0, 0, 0]  # frame 52 is inside the rare (5 %) set


def test_compress_rule_ignores_state_only_thinking():
    names = ["trend", "hazard", "cause"]
    labels = np.zeros((100, 3))
    labels[50:55, 1] = 1  # hazard only: a state condition, no history needed
    labels[70:72, 2] = 1  # cause: a change whose evidence lies in older frames
    ends = np.array([52, 60, 73, 80])
    c = compress_targets(labels, ends, window=4, rate_hz=1.0, horizon_s=10.0, label_names=names)
    assert c.tolist() == [1, 1, 0, 0]
    every = compress_targets(labels, ends, window=4, rate_hz=1.0, horizon_s=10.0)
    assert every.tolist() == [0, 0, 0, 0]
    # default horizon = one window span (4 frames): frame 80 is past the cause episode
    assert compress_targets(labels, ends, 4, 1.0, label_names=names).tolist() == [1, 1, 0, 1]


def test_compression_releases_blocks_behind_window(tmp_path):
    hist = _history()  # 5 sealed blocks of 16 frames; the window of 4 frames is in block 4
    before = hist.nbytes
    ctl = MemoryController(_heads(), hist, FolderSummaryStore(tmp_path))
    out = ctl.step(_situation())
    assert out.compressed_blocks == 4 and sorted(hist.blocks) == [4]
    assert hist.nbytes < before and len(list(tmp_path.glob("summaries-*.npz"))) == 1
    assert out.records == []


def test_rule1_missing_id_passes_through_and_records():
    hist = _history()
    ctl = MemoryController(_heads(recall_bias=5.0), hist, FolderSummaryStore("/nonexistent"),
                           recall=lambda e, r: [{"x": 1}])
    for kw in ({"robot_id": None}, {"session_id": ""}):
        sit = _situation(**kw)
        out = ctl.step(sit)
        assert out.situation is sit and out.evidence == [] and out.compressed_blocks == 0
        assert [r.rule for r in out.records] == ["missing_id"]
    assert len(hist.blocks) == 5 and len(ctl.records) == 2


@pytest.mark.parametrize("embedding", [np.ones(D + 1), np.full(D, np.nan), None])
def test_rule2_head_failure_skips_compression(tmp_path, embedding):
    hist = _history()
    ctl = MemoryController(_heads(), hist, FolderSummaryStore(tmp_path))
    sit = _situation(embedding=embedding)
    out = ctl.step(sit)
    assert out.situation is sit and out.compressed_blocks == 0 and len(hist.blocks) == 5
    assert out.records[0].rule == "head_error" and not list(tmp_path.iterdir())


def test_rule3_summary_failure_commits_nothing(tmp_path):
    hist = _history()
    hist.blocks[1][0, 0] = np.nan  # a real bad block: the summariser refuses NaN
    raw = {b: a.copy() for b, a in hist.blocks.items()}
    ctl = MemoryController(_heads(), hist, FolderSummaryStore(tmp_path))
    sit = _situation()
    out = ctl.step(sit)
    assert out.situation is sit and out.compressed_blocks == 0
    assert out.records[0].rule == "compress_error" and "NaN" in out.records[0].detail
    assert hist.summaries == [] and not list(tmp_path.iterdir())
    assert sorted(hist.blocks) == sorted(raw)
    for b in raw:
        np.testing.assert_array_equal(hist.blocks[b], raw[b])


def test_rule3_embedding_failure_commits_nothing(tmp_path):
    hist = _history()
    projection = np.ones((5, 7))  # a real shape mismatch with the (4*F,) statistics

    def embed(stats):
        return projection @ stats.reshape(-1)

    ctl = MemoryController(_heads(), hist, FolderSummaryStore(tmp_path), embed=embed)
    out = ctl.step(_situation())
    assert out.records[0].rule == "compress_error" and len(hist.blocks) == 5
    assert hist.summaries == [] and not list(tmp_path.iterdir())


def test_rule3_storage_failure_deletes_no_raw_block(tmp_path):
    blocker = tmp_path / "store"
    blocker.write_text("a file where the store folder should be")  # real OSError on commit
    hist = _history()
    ctl = MemoryController(_heads(), hist, FolderSummaryStore(blocker))
    out = ctl.step(_situation())
    assert out.records[0].rule == "compress_error" and "storage" in out.records[0].detail
    assert len(hist.blocks) == 5 and hist.summaries == []


def test_rule4_recall_failure_returns_original_situation():
    # a real client with nobody listening: the deadline passes and RecallError is raised
    client = RecallClient("tcp://127.0.0.1:1", "r1", deadline_s=0.05)
    try:
        ctl = MemoryController(_heads(compress_bias=-5.0, recall_bias=5.0),
                               recall=lambda e, r: client.recall(e, r))
        sit = _situation()
        out = ctl.step(sit)
    finally:
        client.close()
    assert out.situation is sit and out.evidence == [] and not out.recalled
    assert out.records[0].rule == "recall_error" and "timed out" in out.records[0].detail


def test_recall_success_attaches_evidence():
    ctl = MemoryController(_heads(compress_bias=-5.0, recall_bias=5.0),
                           recall=lambda e, r: [{"episode_id": "e1", "score": 0.9}])
    out = ctl.step(_situation())
    assert out.recalled and out.evidence == [{"episode_id": "e1", "score": 0.9}]
    assert out.p_recall > 0.99 and out.p_compress < 0.01
