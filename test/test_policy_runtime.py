"""Robot-side runtime: bad input, bad bundles, and importing without torch."""

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from thinkmem_ros.core.data import SituationSet
from thinkmem_ros.policy.bundle import (
    MANIFEST,
    ONNX_FILE,
    BundleError,
    read_manifest,
    write_bundle,
)
from thinkmem_ros.policy.config import PolicyConfig
from thinkmem_ros.policy.runtime import InputError, PolicyRuntime
from thinkmem_ros.policy.training.export import export_bundle
from thinkmem_ros.policy.training.train import train_policy

K, M = 6, 3
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    data = SituationSet(rng.normal(size=(40, K, 7)), (rng.random((40, 10)) > 0.5),
                        events=rng.integers(0, 3, size=(40, M)), event_vocabulary=("a", "b"))
    config = PolicyConfig(window=K, n_labels=10, d_model=8, n_layers=1, n_heads=2, d_ff=16,
                          max_events=M, n_event_vocab=2)
    trained = train_policy(data, config, epochs=1, progress=False, val_fraction=0.0)
    return export_bundle(trained, tmp_path_factory.mktemp("rt") / "tiny")


@pytest.fixture()
def runtime(bundle):
    return PolicyRuntime(bundle)


def ok_signals(batch: int | None = None) -> np.ndarray:
    shape = (K, 7) if batch is None else (batch, K, 7)
    return np.ones(shape, np.float32)


@pytest.mark.parametrize("signals, message", [
    (np.ones((K + 1, 7), np.float32), r"signals must have shape \(B, 6, 7\).*got \(1, 7, 7\)"),
    (np.ones((K, 6), np.float32), r"got \(1, 6, 6\)"),
    (np.ones((2, 2, K, 7), np.float32), r"got \(2, 2, 6, 7\)"),
    (np.ones((K, 7), np.int32), "float dtype, got int32"),
    (np.array([["x"] * 7] * K), "float dtype"),
])
def test_wrong_shapes_and_dtypes_are_rejected(runtime, signals, message):
    with pytest.raises(InputError, match=message):
        runtime.predict(signals)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_are_rejected_with_the_masking_rule(runtime, bad):
    signals = ok_signals(3)
    signals[1, 2, 4] = bad
    with pytest.raises(InputError, match="NaN or inf; missing values must be 0 with mask 0"):
        runtime.predict(signals)
    with pytest.raises(InputError, match="NaN or inf"):
        runtime.predict_one(signals[1])


def test_bad_mask_and_events_are_rejected(runtime):
    with pytest.raises(InputError, match="mask must have shape"):
        runtime.predict(ok_signals(2), mask=np.ones((3, K, 7)))
    with pytest.raises(InputError, match=r"mask must hold values in \[0, 1\]"):
        runtime.predict(ok_signals(), mask=np.full((K, 7), 2.0))
    with pytest.raises(InputError, match=r"event ids must be in \[0, 2\]"):
        runtime.predict(ok_signals(), events=np.array([0, 0, 5]))
    with pytest.raises(InputError, match="at most 3"):
        runtime.predict_one(ok_signals(), events=np.zeros(4, np.int64))
    with pytest.raises(InputError, match="integer ids"):
        runtime.predict(ok_signals(), events=np.zeros(3, np.float32))
    with pytest.raises(InputError, match="must be a numpy array"):
        runtime.predict_one([[1.0] * 7] * K)


def test_thresholds_override_changes_the_active_set(bundle):
    everything = PolicyRuntime(bundle, thresholds={name: 0.0 for name in
                                                   bundle.manifest.labels})
    nothing = PolicyRuntime(bundle, thresholds={name: 1.0 for name in bundle.manifest.labels})
    assert everything.predict_one(ok_signals()).active == [bundle.manifest.labels]
    assert nothing.predict_one(ok_signals()).active == [[]]
    with pytest.raises(ValueError, match="unknown labels \\['nope'\\]"):
        PolicyRuntime(bundle, thresholds={"nope": 0.3})


def test_missing_bundle_names_the_path(tmp_path):
    with pytest.raises(BundleError, match="bundle folder not found: .*nowhere"):
        PolicyRuntime(tmp_path / "nowhere")


def copy_bundle(bundle, folder: Path) -> Path:
    folder.mkdir()
    for name in (ONNX_FILE, MANIFEST):
        (folder / name).write_bytes((bundle.path / name).read_bytes())
    return folder


def test_truncated_onnx_names_file_and_expected_sha(bundle, tmp_path):
    folder = copy_bundle(bundle, tmp_path / "cut")
    data = (folder / ONNX_FILE).read_bytes()
    (folder / ONNX_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(BundleError) as info:
        PolicyRuntime(folder)
    assert str(folder / ONNX_FILE) in str(info.value)
    assert f"expected sha256 {bundle.manifest.sha256}" in str(info.value)


def test_missing_onnx_names_file_and_expected_sha(bundle, tmp_path):
    folder = copy_bundle(bundle, tmp_path / "gone")
    (folder / ONNX_FILE).unlink()
    with pytest.raises(BundleError, match=f"{ONNX_FILE}.*expected sha256 "
                                          f"{bundle.manifest.sha256}"):
        PolicyRuntime(folder)


def test_garbage_onnx_with_matching_hash_is_refused(bundle, tmp_path):
    manifest = replace(read_manifest(bundle.path))
    written = write_bundle(tmp_path / "junk", b"not an onnx graph", manifest)
    with pytest.raises(BundleError, match="ONNX Runtime cannot load the model.*sha256"):
        PolicyRuntime(written)


def test_unknown_format_version_is_refused(bundle, tmp_path):
    folder = copy_bundle(bundle, tmp_path / "future")
    data = json.loads((folder / MANIFEST).read_text())
    data["format_version"] = 99
    (folder / MANIFEST).write_text(json.dumps(data))
    with pytest.raises(BundleError, match="format_version 99 is not supported"):
        PolicyRuntime(folder)


@pytest.mark.parametrize("change, words", [
    ({"window": K + 2}, "graph input 'signals'.*manifest expects tensor\\(float\\) "
                        "\\[batch, 8, 7\\]"),
    ({"max_events": M + 1}, "graph input 'events'"),
])
def test_manifest_that_disagrees_with_graph_is_refused(bundle, tmp_path, change, words):
    manifest = replace(read_manifest(bundle.path), **change)
    written = write_bundle(tmp_path / "mismatch", bundle.onnx_path.read_bytes(), manifest)
    with pytest.raises(BundleError, match=words):
        PolicyRuntime(written)


def test_manifest_with_other_labels_is_refused(bundle, tmp_path):
    labels = bundle.manifest.labels + ["consider:E9"]
    manifest = replace(read_manifest(bundle.path), labels=labels,
                       thresholds={name: 0.5 for name in labels})
    written = write_bundle(tmp_path / "labels", bundle.onnx_path.read_bytes(), manifest)
    with pytest.raises(BundleError, match="graph output 'probabilities'.*\\[batch, 11\\]"):
        PolicyRuntime(written)


def test_session_does_not_spin_by_default(runtime):
    config = runtime.session.get_session_options().get_session_config_entry
    assert config("session.intra_op.allow_spinning") == "0"
    assert runtime.session.get_session_options().intra_op_num_threads == 1


def robot_side_modules() -> list[str]:
    """Every module that runs on the robot: robot/, link/, core/ and the torch-free policy."""
    files = [p for pkg in ("robot", "link", "core", "playback")
             for p in sorted((REPO / "thinkmem_ros" / pkg).glob("*.py"))]
    files += [REPO / "thinkmem_ros" / "policy" / f"{name}.py"
              for name in ("runtime", "config", "bundle", "value_table", "memctl_heads",
                           "situation", "anticipation", "anticipation_rules", "replay")]
    names = [".".join(p.relative_to(REPO).with_suffix("").parts) for p in files]
    return [n.removesuffix(".__init__") for n in names]


def test_robot_side_imports_and_predicts_with_torch_unimportable(bundle):
    present = robot_side_modules()
    assert "thinkmem_ros.robot.node" in present and "thinkmem_ros.link.shipper" in present
    script = textwrap.dedent(f"""
        import sys, importlib, importlib.abc
        class BlockTorch(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError("torch is blocked in this test")
        sys.meta_path.insert(0, BlockTorch())
        for name in {present!r}:
            importlib.import_module(name)
        from thinkmem_ros.policy.runtime import PolicyRuntime
        import numpy as np
        rt = PolicyRuntime({str(bundle.path)!r})
        print(rt.predict_one(np.ones(({K}, 7), np.float32)).probabilities.shape)
        assert "torch" not in sys.modules
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                            text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    assert "(1, 10)" in result.stdout


def test_an_event_list_longer_than_the_model_knows_is_refused(source_bundle, tmp_path):
    """The node maps each listed name to an id: one past the model's table made every
    frame fail for as long as that event stayed in the history."""
    manifest = read_manifest(source_bundle)
    if not manifest.streaming:
        pytest.skip("the shipped default is a streaming policy; this one is not")
    longer = replace(manifest, event_vocabulary=[*manifest.event_vocabulary,
                                                 *(f"extra_{i}" for i in range(20))])
    onnx = (source_bundle / ONNX_FILE).read_bytes()
    written = write_bundle(tmp_path / "longer", onnx, longer)
    with pytest.raises(BundleError, match="event_vocabulary lists"):
        PolicyRuntime(written)


@pytest.mark.parametrize("engine", ["auto", "ort"])
def test_an_absurd_but_finite_sample_never_makes_the_output_nan(source_bundle, engine):
    """A broken driver's 3e38 overflowed the recurrent state: ~60 frames of NaN after it."""
    runtime = PolicyRuntime(source_bundle, engine=engine)
    if runtime.engine is None:
        pytest.skip("the shipped default is a streaming policy; this one is not")
    k, f = runtime.window, len(runtime.manifest.signals)
    base = np.asarray(runtime.manifest.normalisation["mean"], np.float32)
    window = np.tile(base, (k, 1))
    mask, events = np.ones((k, f), np.float32), np.zeros(runtime.max_events, np.int64)
    finite = []
    for t in range(120):
        window = np.roll(window, -1, axis=0)
        window[-1] = base
        if t == 40:
            window[-1, 1] = 3e38
        out = runtime.predict_frame(window, mask, events, t=t * 0.1, seq=t + 1)
        finite.append(bool(np.isfinite(out.probabilities).all()))
    assert all(finite), f"non-finite on {finite.count(False)} frames"


@pytest.mark.parametrize("change", [
    lambda m: replace(m, streaming={**m.streaming, "state": {**m.streaming["state"], "h": 64}}),
    lambda m: replace(m, model_config={**m.model_config, "taps": [10**9]}),
    lambda m: replace(m, streaming={**m.streaming, "gap_s": float("nan")}),
    lambda m: replace(m, streaming={**m.streaming, "gap_s": 0}),
], ids=["state-shape-not-a-list", "taps-past-any-memory", "gap-nan", "gap-zero"])
def test_a_malformed_streaming_manifest_is_a_bundle_error(source_bundle, tmp_path, change):
    """Each was a TypeError or a 52 GiB MemoryError traceback when the node started."""
    manifest = read_manifest(source_bundle)
    if not manifest.streaming:
        pytest.skip("the shipped default is a streaming policy; this one is not")
    onnx = (source_bundle / ONNX_FILE).read_bytes()
    written = write_bundle(tmp_path / "bad", onnx, change(manifest))
    with pytest.raises(BundleError):
        PolicyRuntime(written)
