"""Smoke tests: benchmarks run end to end at a tiny internal size and emit the JSON contract.

Sizes are far below anything meaningful; these check wiring and keys, never figures.
"""

import json

import numpy as np
import pytest
import torch

from thinkmem_ros.bench import exp1, exp3
from thinkmem_ros.bench.common import METHODS, epochs_for, finish_report

torch.set_num_threads(1)


def check_cell(cell):
    assert set(cell) == {"mean", "std"}
    assert np.isfinite(cell["mean"]) and cell["std"] >= 0


def test_exp3_tiny_writes_the_design_json_and_a_png(tmp_path):
    result = exp3.run(quick=True, seeds=1, size="tiny")
    report = finish_report(result, name="exp3", quick=True, seeds=1,
                           json_path=tmp_path / "exp3.json")
    loaded = json.loads((tmp_path / "exp3.json").read_text())
    assert loaded["experiment"] == "exp3" and loaded["metric"] == "micro_f1"
    assert {"cpu", "threads"} <= set(loaded["machine"])
    for table in ("results", "results_precision", "results_recall"):
        assert set(loaded[table]) == set(METHODS)
        for cell in loaded[table].values():
            check_cell(cell)
            assert 0.0 <= cell["mean"] <= 1.0
    exp3.plot(report, tmp_path / "exp3.png")
    assert (tmp_path / "exp3.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_exp1_tiny_has_every_curve_keyed_by_history_size(tmp_path):
    result = exp1.run(quick=True, seeds=1, size="tiny")
    for key in ("summary_rag_f1", "sequence_rag_f1", "proposed_f1", "sequence_rag_bytes",
                "proposed_bytes", "sequence_rag_ms", "proposed_ms", "proposed_fast_f1",
                "proposed_fast_ms", "sequence_rag_cpu_ms", "proposed_cpu_ms"):
        assert set(result["curves"][key]) == {"100", "300"}, key
        for cell in result["curves"][key].values():
            check_cell(cell)
    bytes_ = result["curves"]["sequence_rag_bytes"]
    assert bytes_["300"]["mean"] > bytes_["100"]["mean"]  # the index grows with history
    assert result["curves"]["proposed_bytes"]["100"]["mean"] > 0
    res = result["results"]
    assert res["crossover_n"] == pytest.approx(
        res["proposed_model_bytes"] / res["sequence_rag_bytes_per_record"], abs=1)
    assert res["speedup_at_300"] > 0 and res["speedup_cpu_at_300_fast"] > 0
    assert "family" in result
    exp1.plot(result, tmp_path / "exp1.png")
    assert (tmp_path / "exp1.png").stat().st_size > 1000


def test_small_histories_get_more_epochs_but_never_fewer_than_the_base():
    assert epochs_for(100, 10, min_steps=400) == 400  # one step per epoch, capped
    assert epochs_for(10000, 10, min_steps=400) == 10
    assert epochs_for(1000, 10, min_steps=400) > 10


def test_exp1_family_repeats_situations_met_before_with_quiet_nuisance():
    from thinkmem_ros.world.families import order_only
    from thinkmem_ros.world.shapes import CH

    histories, test = exp1.make_pool(300, 40, seed=0)
    temp = CH["temperature"]
    others = [c for c in range(7) if c != temp]
    # nuisance 0: every row holds the same constant values on the six other channels
    assert np.ptp(histories.signals[:, :, others], axis=(0, 1)).max() == 0.0
    seen = {row.tobytes() for row in histories.signals[:, :, temp]}
    assert all(row.tobytes() in seen for row in test.signals[:, :, temp])
    assert set(np.unique(test.groups)) <= set(np.unique(histories.groups))
    # the default keeps the nominal variation; values outside [0, 1] are refused
    noisy = order_only(20, np.random.default_rng(1))
    assert np.ptp(noisy.signals[:, :, others], axis=(0, 1)).min() > 0.0
    with pytest.raises(ValueError, match="nuisance"):
        order_only(5, np.random.default_rng(1), nuisance=1.5)


def test_latency_tiny_times_default_paper_and_fast(tmp_path):
    from thinkmem_ros.bench import latency

    result = latency.run(quick=True, seeds=1, size="tiny")
    res = result["results"]
    for name in ("default", "paper", "fast"):
        row = res[name]
        assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["p999_ms"], name
        assert row["cpu_ms_per_query"] > 0 and row["batch64_per_s"] > 0, name
    # the presets really differ in size: paper > default > fast
    assert res["paper"]["onnx_bytes"] > res["default"]["onnx_bytes"] > res["fast"]["onnx_bytes"]
    latency.plot(result, tmp_path / "latency.png")
    assert (tmp_path / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
