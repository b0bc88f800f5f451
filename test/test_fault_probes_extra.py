"""Fault probes that mirror faults tested elsewhere: run as ``thinkmem bench faults`` runs them.

Each probe starts what it tests for real (a robot's bundle receiver, the node as a process,
the bag CLI, shipper and consolidator processes) and returns the record the benchmark
aggregates; a probe that misjudges or crashes fails here before it skews the table.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def probe_ctx(ros_env, source_bundle, tmp_path):
    from thinkmem_ros.bench.fault_probes_node import ProbeContext

    return ProbeContext(tmp_path / "probes", bundle=source_bundle, start_timeout_s=30.0)


def test_tampered_pushes_are_all_refused_and_the_running_bundle_kept(probe_ctx):
    from thinkmem_ros.bench.fault_probes_node import PROBES

    record = PROBES["tampered_bundle_pushes"](probe_ctx)
    assert record["ok"] and not record["crashed"], record["detail"]
    assert "accepted none" in record["detail"] and "v5 afterwards installed" in record["detail"]


@pytest.mark.ros
def test_a_truncated_onnx_at_start_is_one_line_exit_2(probe_ctx):
    from thinkmem_ros.bench.fault_probes_node import PROBES

    record = PROBES["truncated_onnx_at_start"](probe_ctx)
    assert record["ok"] and not record["crashed"], record["detail"]
    assert "policy.onnx" in record["detail"]


def test_a_killed_spooling_shipper_ships_exactly_once_after_restart():
    from thinkmem_ros.bench.fault_probes_link import run_probes

    (record,) = run_probes(["link_shipper_kill9_with_spool"], quick=True)
    assert record["ok"] and not record["crashed"], record["detail"]
    assert record["lost"] == 0 and "doubled 0" in record["detail"], record["detail"]


def test_a_damaged_store_is_refused_by_the_receiver_in_one_line():
    from thinkmem_ros.bench.fault_probes_link import run_probes

    (record,) = run_probes(["link_store_damaged_at_open"])
    assert record["ok"] and not record["crashed"], record["detail"]
    assert "exit 2" in record["detail"] and "damaged" in record["detail"]
