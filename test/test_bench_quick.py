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


def test_exp1_tiny_has_every_curve_keyed_by_memory_size(tmp_path):
    result = exp1.run(quick=True, seeds=1, size="tiny")
    for key in ("proposed_f1", "sequence_rag_f1", "faiss_flat_f1", "hnsw_f1", "exact_f1",
                "proposed_ms", "sequence_rag_ms", "faiss_flat_ms", "hnsw_ms", "exact_ms",
                "proposed_cpu_ms", "hnsw_recall_at_4", "hnsw_ef", "sequence_rag_bytes",
                "proposed_bytes", "hnsw_bytes"):
        assert set(result["curves"][key]) == {"200", "600"}, key
        for cell in result["curves"][key].values():
            check_cell(cell)
    bytes_ = result["curves"]["sequence_rag_bytes"]
    assert bytes_["600"]["mean"] > bytes_["200"]["mean"]  # the index grows with history
    res = result["results"]
    assert res["memory_distinct_fraction"] == 1.0 and res["queries_found_in_memory"] == 0
    assert res["memory_dim"] == result["bundle"]["window"] * 7  # the seven default signals
    ms = {key[:-3]: cells["600"]["mean"] for key, cells in result["curves"].items()
          if key.endswith("_ms") and not key.endswith(("cpu_ms", "p50_ms", "p99_ms"))}
    assert res["speedup_vs_hnsw_at_600"] == pytest.approx(ms["hnsw"] / ms["proposed"])
    assert res["hnsw_recall_at_4_tuning_600"] >= 0.95 or res["hnsw_ef_600"] == 2048
    assert ms["exact"] == min(ms["sequence_rag"], ms["faiss_flat"])
    assert res["crossover_n"] == pytest.approx(
        res["proposed_model_bytes"] / res["sequence_rag_bytes_per_record"], abs=1)
    exp1.plot(result, tmp_path / "exp1.png")
    assert (tmp_path / "exp1.png").stat().st_size > 1000


def test_small_histories_get_more_epochs_but_never_fewer_than_the_base():
    assert epochs_for(100, 10, min_steps=400) == 400  # one step per epoch, capped
    assert epochs_for(10000, 10, min_steps=400) == 10
    assert epochs_for(1000, 10, min_steps=400) > 10


def test_latency_tiny_times_default_paper_and_fast(tmp_path):
    from thinkmem_ros.bench import latency

    result = latency.run(quick=True, seeds=1, size="tiny")
    res = result["results"]
    for name in ("default", "paper", "fast"):
        row = res[name]
        assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["p999_ms"], name
        assert row["cpu_ms_per_query"] > 0 and row["batch64_per_s"] > 0, name
    # each form is timed on the shipped bundle of that form: ``streaming`` is what the robot
    # runs per frame (the default, two staggered states), the window Transformer is
    # models/window; one state of the same shapes is reported beside them
    assert res["streaming"]["source"] == "shipped models/default"
    assert res["default"]["source"] == "shipped models/window"
    assert res["streaming_one_state"]["source"].startswith("untrained 'streaming' preset")
    assert not result["targets"]["streaming_p50_met"] or res["streaming"]["p50_us"] <= 5.0
    # the presets really differ in size: paper > default > fast
    assert res["paper"]["onnx_bytes"] > res["default"]["onnx_bytes"] > res["fast"]["onnx_bytes"]
    latency.plot(result, tmp_path / "latency.png")
    assert (tmp_path / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, says", [
    (["exp2", "--bundle", "models/default"], "does not take --bundle"),
    (["latency", "--bundle", "/nonexistent/bundle"], "bundle folder not found"),
    (["exp1", "--preset", "streaming"], "does not take --preset"),
    (["exp2", "--preset", "nosuch"], "unknown; choose one of"),
])
def test_bench_bundle_option_refuses_in_one_line(argv, says):
    """--bundle only where the benchmark times a given bundle, and only a bundle that loads;
    --preset only where it trains the policy, and only a preset that exists."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "thinkmem_ros.cli", "bench", *argv],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], out.stderr


def test_bench_bundle_option_reaches_the_benchmarks_that_run_a_bundle():
    """The fleet of ``bench rounds`` can start on a given bundle (the window one, say)."""
    from thinkmem_ros.bench import load
    from thinkmem_ros.commands.bench import _bundle_arg

    for name in ("exp1", "latency", "node", "rounds"):
        assert _bundle_arg(name, load(name), "models/window") == "models/window"


def test_exp3_tiny_trains_the_policy_of_the_preset_it_is_given():
    """``--preset`` reaches the policy the benchmark trains (the default is the shipped
    bundle's streaming preset; here the window one), and the JSON says which."""
    assert exp3.run.__defaults__[-1] == "streaming-restart"
    result = exp3.run(quick=True, seeds=1, size="tiny", preset="default")
    assert result["setup"]["preset"] == "default"
    assert 0.0 <= result["results"]["proposed"]["mean"] <= 1.0
