"""The discovery-only sweep: its loops run the real discovery and report what they promise."""

from __future__ import annotations

import json

import pytest

from thinkmem_ros.bench import discovery_sweep


def test_condition_sweep_reports_f1_and_false_relations_per_cell():
    out = discovery_sweep.condition_sweep(["sparse"], [8], 1)
    row = out["sparse.8"]
    assert 0.0 <= row["statistics_only"] <= 1.0 and 0.0 <= row["proposed"] <= 1.0
    assert row["false_relations"] >= 0 and len(row["proposed_per_seed"]) == 1
    assert row["statistics_only"] >= 0.5  # eight repetitions in the sparse world are found


def test_main_writes_json_and_refuses_bad_arguments(tmp_path, capsys):
    path = tmp_path / "sweep.json"
    assert discovery_sweep.main(["conditions", "--conditions", "zipf", "--reps", "8",
                                 "--seeds", "1", "--json", str(path)]) == 0
    assert "zipf.8" in json.loads(path.read_text())
    assert "zipf.8" in capsys.readouterr().out
    for bad in (["conditions", "--reps", "x"], ["rounds", "--seeds", "0"], ["nothing"]):
        with pytest.raises(SystemExit) as err:
            discovery_sweep.main(bad)
        assert err.value.code == 2
