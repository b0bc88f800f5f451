"""Smoke tests: the values and memctl benchmarks run at a tiny size and emit the JSON contract."""

from __future__ import annotations

import json

import numpy as np
import pytest

from thinkmem_ros.bench import BENCHMARKS, load
from thinkmem_ros.bench.common import finish_report

pytest.importorskip("torch")


def test_registered():
    assert {"values", "memctl"} <= set(BENCHMARKS)
    assert load("values").__name__ == "thinkmem_ros.bench.values"
    assert load("memctl").__name__ == "thinkmem_ros.bench.memctl"


def test_reward_model_marks_redundant_thinking():
    from thinkmem_ros.bench.values import reward, useful_matrix
    from thinkmem_ros.core.vocabulary import THINKING

    labels = list(THINKING)
    truth = np.zeros((1, len(labels)))
    truth[0, [labels.index("trend"), labels.index("cause"), labels.index("hazard")]] = 1
    useful = useful_matrix(truth, labels)
    assert not useful[0, labels.index("trend")] and useful[0, labels.index("cause")]
    rng = np.random.default_rng(0)
    assert reward(truth[0], useful[0], labels.index("trend"), rng) < 0.5
    assert reward(truth[0], useful[0], labels.index("cause"), rng) > 0.5
    assert reward(truth[0], useful[0], labels.index("late_change_inspection"), rng) < 0


def test_values_tiny(tmp_path):
    from thinkmem_ros.bench import values

    report = finish_report(values.run(quick=True, seeds=1, size="tiny"), name="values",
                           quick=True, seeds=1, json_path=tmp_path / "v.json")
    res = json.loads((tmp_path / "v.json").read_text())["results"]
    assert set(res) == {"policy_only", "value_aware", "no_q", "no_epsilon", "no_forgetting"}
    for row in res.values():
        for key in ("useful_recall", "wasted_per_1000", "table_entries"):
            assert set(row[key]) == {"mean", "std"}
    assert res["policy_only"]["table_entries"]["mean"] == 0
    # suppression only removes: value-aware never wastes more than the policy alone
    assert res["value_aware"]["wasted_per_1000"]["mean"] <= \
        res["policy_only"]["wasted_per_1000"]["mean"]
    assert res["no_forgetting"]["archived"]["mean"] == 0
    values.plot(report, tmp_path / "v.png")
    assert (tmp_path / "v.png").stat().st_size > 1000


def test_memctl_tiny(tmp_path):
    from thinkmem_ros.bench import memctl

    report = finish_report(memctl.run(quick=True, seeds=1, size="tiny"), name="memctl",
                           quick=True, seeds=1, json_path=tmp_path / "m.json")
    res = json.loads((tmp_path / "m.json").read_text())["results"]
    for key in ("compress_auroc", "compress_baseline_auroc", "recall_auroc",
                "recall_baseline_auroc", "bytes_kept_ratio", "compress_auprc", "recall_auprc"):
        assert 0.0 <= res[key]["mean"] <= 1.0, key
    assert res["bytes_kept_ratio"]["mean"] <= 1.0
    assert res["activation_f1_with"] == res["activation_f1_without"]
    memctl.plot(report, tmp_path / "m.png")
    assert (tmp_path / "m.png").stat().st_size > 1000
