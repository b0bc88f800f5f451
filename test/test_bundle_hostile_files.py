"""Hostile files in a bundle folder: refused with one line naming them, never a crash.

A bundle is outside input (a hand-placed folder, a signed push from a buggy consolidator):
a malformed optional artefact is skipped with its error and the policy runs without it;
a special file (FIFO, /dev/zero) is refused without blocking; a graph that loads but
cannot run, odd manifest names and out-of-range thresholds are BundleErrors.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import types
from pathlib import Path

import numpy as np
import pytest
from conftest import copy_bundle, run_bounded

from thinkmem_ros.bench.hostile_graphs import hostile_bundle
from thinkmem_ros.policy import bundle as bundle_module
from thinkmem_ros.policy.anticipation_rules import RULES_JSON, RULES_META
from thinkmem_ros.policy.bundle import (
    BundleError,
    load_bundle,
    parse_manifest,
    read_manifest,
)
from thinkmem_ros.policy.memctl_heads import MemctlHeads, ProbeHead
from thinkmem_ros.policy.runtime import PolicyRuntime
from thinkmem_ros.policy.value_table import ValueTable
from thinkmem_ros.robot.hotswap import load_policy
from thinkmem_ros.robot.thinking_gates import load_gate_artefacts

REPO = Path(__file__).resolve().parent.parent
NAME_CHARS = 128  # bundle.MAX_NAME_CHARS (a literal: the cases are built at collection)


# ------------------------------------------------------------------ helpers
def npz_bytes(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def replace_data(folder: Path, data_name: str, meta_name: str, raw: bytes,
                 edit=None) -> None:
    """Write ``raw`` as the data file and re-record its sha256 (the hash check passes)."""
    (folder / data_name).write_bytes(raw)
    meta = json.loads((folder / meta_name).read_text())
    meta["sha256"] = hashlib.sha256(raw).hexdigest()
    if edit is not None:
        edit(meta)
    (folder / meta_name).write_text(json.dumps(meta))


def arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


@pytest.fixture
def with_artefacts(window_bundle, tmp_path) -> Path:
    """A window bundle copy with a valid value table and memctl probes (embedding width)."""
    folder = copy_bundle(window_bundle, tmp_path / "bundle")
    manifest = load_bundle(folder).manifest
    dim = PolicyRuntime(folder).embedding_dim
    table = ValueTable(manifest.labels, dim)
    for seed in range(3):
        table.update(table.assign(np.random.default_rng(seed).normal(size=dim)),
                     manifest.labels[0], 1.0)
    table.save(folder)
    MemctlHeads(ProbeHead(np.full(dim, 0.01), 0.0), ProbeHead(np.full(dim, 0.01), 0.0)
                ).save(folder)
    return folder



def release_fifo(path: Path) -> None:
    """Unblock a reader stuck on ``path`` (only the pre-fix code ever is)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    except OSError:
        pass


# ------------------------------------------------------------------ defect 1: malformed files
def _values(f):
    return arrays(f / "values.npz")


def _memctl(f):
    return arrays(f / "memctl.npz")


MALFORMED = {
    "values_missing_key": ("values", lambda f: npz_bytes(**{
        k: v for k, v in _values(f).items() if k != "q"}), None),
    "values_not_a_zip": ("values", lambda f: b"PK\x03\x04garbage" * 10, None),
    "values_zero_length": ("values", lambda f: b"", None),
    "values_archived_1d": ("values", lambda f: npz_bytes(**{
        **_values(f), "archived": np.array([1, 2, 3], np.int32)}), None),
    "values_archived_out_of_range": ("values", lambda f: npz_bytes(**{
        **_values(f), "archived": np.array([[999, 999]], np.int32)}), None),
    "values_meta_dim_text": ("values", lambda f: (f / "values.npz").read_bytes(),
                             lambda m: m.update(dim="x")),
    "memctl_missing_recall_b": ("memctl", lambda f: npz_bytes(**{
        k: v for k, v in _memctl(f).items() if k != "recall_b"}), None),
    "memctl_empty_bias": ("memctl", lambda f: npz_bytes(**{
        **_memctl(f), "recall_b": np.zeros(0)}), None),
    "memctl_thresholds_list": ("memctl", lambda f: (f / "memctl.npz").read_bytes(),
                               lambda m: m.update(thresholds=[0.5, 0.5])),
    "memctl_thresholds_missing": ("memctl", lambda f: (f / "memctl.npz").read_bytes(),
                                  lambda m: m.pop("thresholds")),
    "memctl_not_a_zip": ("memctl", lambda f: b"PK\x03\x04garbage" * 10, None),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_artefact_is_skipped_naming_its_file(case, with_artefacts):
    kind, make, edit = MALFORMED[case]
    replace_data(with_artefacts, f"{kind}.npz", f"{kind}.json", make(with_artefacts), edit)
    arts = load_gate_artefacts(with_artefacts)  # never raises
    assert len(arts.errors) == 1, arts.errors
    error = arts.errors[0]
    assert error.startswith(f"{kind}: ") and f"{kind}." in error and "\n" not in error
    if kind == "values":
        assert arts.table is None and arts.heads is not None
    else:
        assert arts.heads is None and arts.table is not None


def test_valid_artefacts_still_load(with_artefacts):
    arts = load_gate_artefacts(with_artefacts, embedding_dim=64)
    assert arts.errors == [] and arts.table is not None and arts.heads is not None


def test_a_loader_bug_in_one_artefact_does_not_escape(with_artefacts, monkeypatch):
    def broken(folder):
        raise KeyError("boom")

    monkeypatch.setattr(MemctlHeads, "load", broken)
    arts = load_gate_artefacts(with_artefacts)
    assert arts.heads is None and arts.table is not None
    assert arts.errors == ["memctl: KeyError: 'boom'"]


# ------------------------------------------------------------------ defect 3: special files
@pytest.mark.parametrize("name, kind", [("values.json", "values"), (RULES_JSON, "rules")])
def test_a_fifo_artefact_is_refused_without_blocking(name, kind, with_artefacts):
    if kind == "rules":
        (with_artefacts / RULES_META).write_text(json.dumps(
            {"artefact_version": 1, "sha256": "0" * 64}))
    path = with_artefacts / name
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    try:
        finished, arts = run_bounded(lambda: load_gate_artefacts(with_artefacts))
    finally:
        release_fifo(path)
    assert finished, f"reading the FIFO {name} blocked"
    errors = [e for e in arts.errors if e.startswith(f"{kind}:")]
    assert len(errors) == 1 and str(path) in errors[0] and "FIFO" in errors[0], arts.errors


def test_a_dev_zero_artefact_is_refused_without_reading_it(with_artefacts):
    (with_artefacts / "memctl.npz").unlink()
    os.symlink("/dev/zero", with_artefacts / "memctl.npz")
    finished, arts = run_bounded(lambda: load_gate_artefacts(with_artefacts))
    assert finished, "reading memctl.npz -> /dev/zero did not stop"
    assert arts.heads is None and arts.table is not None
    assert len(arts.errors) == 1 and "memctl.npz" in arts.errors[0]
    assert "character device" in arts.errors[0]


def test_a_signed_listing_does_not_read_a_special_file(with_artefacts):
    """_read_signed reads the files it checks against the list: the same refusal there."""
    (with_artefacts / "values.npz").unlink()
    os.symlink("/dev/zero", with_artefacts / "values.npz")
    extras = {"artefacts": {"values.npz": "0" * 64, "values.json": "0" * 64}}
    finished, arts = run_bounded(lambda: load_gate_artefacts(with_artefacts, extras))
    assert finished and arts.table is None
    assert any("values.npz" in e and "character device" in e for e in arts.errors)


def test_read_bundle_file_refuses_folders_and_caps_size(tmp_path):
    (tmp_path / "sub").mkdir()
    with pytest.raises(OSError, match="not a regular file \\(a folder\\)"):
        bundle_module.read_bundle_file(tmp_path / "sub")
    (tmp_path / "big").write_bytes(b"x" * 11)
    with pytest.raises(OSError, match="larger than 10 bytes"):
        bundle_module.read_bundle_file(tmp_path / "big", limit=10)
    assert bundle_module.read_bundle_file(tmp_path / "big", limit=11) == b"x" * 11


def test_a_zip_bomb_values_npz_is_refused_before_unpacking(with_artefacts, monkeypatch):
    monkeypatch.setattr(bundle_module, "MAX_UNPACKED_BYTES", 1000)
    arts = load_gate_artefacts(with_artefacts)
    assert arts.table is None and any("unpacks to" in e for e in arts.errors), arts.errors


# ------------------------------------------------------------------ defect 5: widths, NaN
def test_artefacts_of_another_embedding_width_are_refused(with_artefacts):
    arts = load_gate_artefacts(with_artefacts, embedding_dim=32)
    assert arts.table is None and arts.heads is None
    assert any("values.npz" in e and "width 64" in e for e in arts.errors), arts.errors
    assert any("memctl.npz" in e and "width 64" in e for e in arts.errors), arts.errors


def test_a_value_table_full_of_nan_is_refused(with_artefacts):
    data = _values(with_artefacts)
    replace_data(with_artefacts, "values.npz", "values.json",
                 npz_bytes(**{**data, "q": np.full_like(data["q"], np.nan)}))
    arts = load_gate_artefacts(with_artefacts)
    assert arts.table is None and any("q contains NaN" in e for e in arts.errors)


# ------------------------------------------------------------------ defect 2: load-time run
@pytest.mark.parametrize("mode, match", [
    ("runtime_fail", "load-time test inference failed"),
    ("prob_5", "outside \\[0, 1\\]"),
    ("emb_nan", "NaN/inf"),
])
def test_a_graph_that_fails_its_test_inference_is_a_one_line_bundle_error(
        mode, match, window_bundle, tmp_path, capfd):
    folder = hostile_bundle(window_bundle, tmp_path / mode, mode)
    PolicyRuntime(folder)  # the graph itself loads
    with pytest.raises(BundleError, match=match) as info:
        load_policy(folder)
    assert "\n" not in str(info.value) and str(folder) in str(info.value)
    err = capfd.readouterr().err
    assert "onnxruntime" not in err and "\x1b[" not in err, err  # ORT's own log kept quiet


def test_bench_bundle_runs_the_load_time_check(window_bundle, tmp_path):
    from thinkmem_ros.commands.bench import _bundle_arg

    module = types.SimpleNamespace(run=lambda quick, seeds, bundle=None: None)
    folder = hostile_bundle(window_bundle, tmp_path / "rt", "runtime_fail")
    with pytest.raises(SystemExit) as info:
        _bundle_arg("rounds", module, str(folder))
    text = str(info.value.code)
    assert text.startswith(f"--bundle {folder}: ") and "test inference failed" in text
    assert "\n" not in text
    assert _bundle_arg("rounds", module, str(window_bundle)) == str(window_bundle)


# ------------------------------------------------------------------ defect 4: manifest names
def manifest_text(window_bundle: Path, key: str, edit) -> str:
    data = json.loads((window_bundle / "bundle.json").read_text())
    edit(data[key])
    return json.dumps(data)


@pytest.mark.parametrize("key, edit, match", [
    ("signals", lambda xs: xs.__setitem__(0, "temp\x00erature"), "signals\\[0\\].*printable"),
    ("signals", lambda xs: xs.__setitem__(1, xs[0]), "signals\\[1\\] 'temperature' is listed"),
    ("signals", lambda xs: xs.__setitem__(2, ""), "signals\\[2\\] must be a non-empty"),
    ("labels", lambda xs: xs.__setitem__(3, xs[0]), "labels\\[3\\] .* listed twice"),
    ("labels", lambda xs: xs.__setitem__(0, "a\nb"), "labels\\[0\\].*control"),
    ("event_vocabulary", lambda xs: xs.append("x" * (NAME_CHARS + 1)),
     "event_vocabulary\\[\\d+\\].*at most 128"),
    ("event_vocabulary", lambda xs: xs.append(xs[0]), "event_vocabulary\\[\\d+\\] .* twice"),
], ids=["nul", "dup_signal", "empty", "dup_label", "newline", "long_event", "dup_event"])
def test_bad_manifest_names_are_refused_naming_the_key(key, edit, match, window_bundle):
    with pytest.raises(BundleError, match=match):
        parse_manifest(manifest_text(window_bundle, key, edit), source="bundle.json")


def test_shipped_bundles_and_long_names_still_parse():
    assert bundle_module.MAX_NAME_CHARS == NAME_CHARS
    for folder in sorted((REPO / "models").iterdir()):
        if (folder / "bundle.json").is_file():
            read_manifest(folder)
    data = json.loads((REPO / "models" / "window" / "bundle.json").read_text())
    data["event_vocabulary"].append("é" * NAME_CHARS)  # printable, at the bound
    parse_manifest(json.dumps(data))


# ------------------------------------------------------------------ defect 6
@pytest.mark.parametrize("thresholds", [None, {"hazard": 1.5}, {"nope": 0.5}])
def test_thresholds_out_of_range_are_a_bundle_error(thresholds, window_bundle, tmp_path):
    folder = copy_bundle(window_bundle, tmp_path / "b")
    if thresholds is None:  # the manifest's own threshold out of range
        data = json.loads((folder / "bundle.json").read_text())
        data["thresholds"][data["labels"][0]] = 1.5
        (folder / "bundle.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match="threshold") as info:
        PolicyRuntime(folder, thresholds=thresholds)
    assert isinstance(info.value, ValueError)  # old callers catching ValueError still do


def test_last_reason_is_cleared_when_a_push_is_accepted(window_bundle, tmp_path):
    from thinkmem_ros.consolidator.publish import push_frame
    from thinkmem_ros.link.protocol import decode_frame
    from thinkmem_ros.link.security import sign_bundle, write_signing_keypair
    from thinkmem_ros.robot.bundle_receiver import BundleReceiver, BundleReceiverConfig

    pub, key = write_signing_keypair(tmp_path / "keys", "consolidator")
    rx = BundleReceiver(BundleReceiverConfig(tmp_path / "robot", pub, current_version=1))
    folder = copy_bundle(window_bundle, tmp_path / "v2", model_version=2)
    sign_bundle(folder, key)
    body = decode_frame(push_frame(folder)).body
    assert rx.handle_push({**body, "signature": b""}) is None
    assert rx.last_reason.startswith("unsigned")
    assert rx.handle_push(body) is not None
    assert rx.last_reason == "accepted: v2" and rx.stats()["last_reason"] == "accepted: v2"


# ------------------------------------------------------------------ the node
def test_start_falls_back_to_bundle_path_on_any_installed_bundle_failure(monkeypatch,
                                                                        tmp_path):
    """_load_start_policy: an installed bundle failing with a non-BundleError falls back."""
    node_module = pytest.importorskip("thinkmem_ros.robot.node")
    installed, configured = tmp_path / "installed", tmp_path / "configured"
    lines: list[str] = []

    def load(path, **kwargs):
        if Path(path) == installed:
            raise KeyError("recall_b is not a file in the archive")
        return f"loaded {path}"

    fake = types.SimpleNamespace(
        _load_with_artefacts=load, _verify_key=None,
        config=types.SimpleNamespace(signal_map={}, thresholds={}, inference_threads=1,
                                     bundle_path=str(configured)),
        get_logger=lambda: types.SimpleNamespace(error=lines.append, info=lines.append))
    monkeypatch.setattr(node_module, "newer_installed_bundle", lambda *a: installed)
    assert node_module.ThinkingNode._load_start_policy(fake) == f"loaded {configured}"
    assert len(lines) == 1 and str(installed) in lines[0] and "KeyError" in lines[0]


def broken_memctl_push(window_bundle: Path, tmp_path: Path):
    """A signed v2 whose signed memctl.npz lacks recall_b, installed by the receiver."""
    from thinkmem_ros.consolidator.publish import push_frame
    from thinkmem_ros.link.protocol import decode_frame
    from thinkmem_ros.link.security import sign_bundle, write_signing_keypair
    from thinkmem_ros.robot.bundle_receiver import BundleReceiver, BundleReceiverConfig
    from thinkmem_ros.robot.thinking_gates import attach_artefacts

    pub, key = write_signing_keypair(tmp_path / "keys", "consolidator")
    arts = tmp_path / "arts"
    MemctlHeads(ProbeHead(np.full(64, 0.01), 0.0), ProbeHead(np.full(64, 0.01), 0.0)
                ).save(arts)
    replace_data(arts, "memctl.npz", "memctl.json", npz_bytes(**{
        k: v for k, v in arrays(arts / "memctl.npz").items() if k != "recall_b"}))
    folder = copy_bundle(window_bundle, tmp_path / "v2", model_version=2)
    attach_artefacts(folder, arts)
    sign_bundle(folder, key)
    rx = BundleReceiver(BundleReceiverConfig(tmp_path / "bundles", pub, current_version=1))
    assert rx.handle_push(decode_frame(push_frame(folder)).body) is not None
    return pub


@pytest.mark.ros
@pytest.mark.slow
def test_node_starts_an_installed_push_with_a_broken_memctl_without_it(
        ros_env, window_bundle, tmp_path):
    from test_node_process import NodeProcess, node_cmd

    pub = broken_memctl_push(window_bundle, tmp_path)
    v1 = copy_bundle(window_bundle, tmp_path / "v1", model_version=1)
    node = NodeProcess(node_cmd("-p", f"bundle_path:={v1}", "-p",
                                f"bundles_dir:={tmp_path / 'bundles'}", "-p",
                                f"bundle_signing_public_key:={pub}"), ros_env)
    node.wait_for("ready:", timeout=60.0)
    node.proc.send_signal(signal.SIGINT)
    assert node.finish() == 0, node.output
    assert "Traceback" not in node.output and "ready: bundle v2" in node.output, node.output
    assert "memctl.npz" in node.output and "memctl: absent" in node.output, node.output


@pytest.mark.ros
@pytest.mark.slow
def test_node_refuses_a_graph_failing_its_test_inference_in_one_line(
        ros_env, window_bundle, tmp_path):
    from test_node_process import NodeProcess, node_cmd

    folder = hostile_bundle(window_bundle, tmp_path / "rt", "runtime_fail")
    node = NodeProcess(node_cmd("-p", f"bundle_path:={folder}"), ros_env)
    assert node.finish(timeout=60.0) == 2, node.output
    refusal = [line for line in node.lines if "refusing to start" in line]
    assert len(refusal) == 1 and "test inference failed" in refusal[0], node.output
    assert "Traceback" not in node.output and "\x1b[" not in node.output, node.output



def test_a_push_that_cannot_run_is_refused_before_the_version_floor_moves(window_bundle,
                                                                         tmp_path):
    """Checked after install, it moved the floor: the fix could not ship as that version."""
    from thinkmem_ros.consolidator.publish import push_frame
    from thinkmem_ros.link.protocol import decode_frame
    from thinkmem_ros.link.security import sign_bundle, write_signing_keypair
    from thinkmem_ros.robot.bundle_receiver import BundleReceiver, BundleReceiverConfig
    from thinkmem_ros.robot.hotswap import load_policy

    pub, key = write_signing_keypair(tmp_path / "keys", "consolidator")
    rx = BundleReceiver(BundleReceiverConfig(tmp_path / "robot", pub, current_version=1),
                        check=load_policy)
    bad = hostile_bundle(window_bundle, tmp_path / "bad", "runtime_fail")
    manifest = json.loads((bad / "bundle.json").read_text())
    (bad / "bundle.json").write_text(json.dumps({**manifest, "model_version": 2}))
    sign_bundle(bad, key)
    assert rx.handle_push(decode_frame(push_frame(bad)).body) is None
    assert rx.last_reason.startswith("malformed") and "cannot run here" in rx.last_reason
    assert rx.version == 1 and "\n" not in rx.last_reason
    good = copy_bundle(window_bundle, tmp_path / "v2", model_version=2)
    sign_bundle(good, key)
    assert rx.handle_push(decode_frame(push_frame(good)).body) is not None  # the same v2
    assert rx.version == 2
