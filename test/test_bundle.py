"""Bundle format: atomic writes, hash verification and clear refusals."""

import json

import pytest

from thinkmem_ros.core.vocabulary import SIGNALS, THINKING
from thinkmem_ros.policy.bundle import (
    BundleError,
    BundleManifest,
    load_bundle,
    read_manifest,
    sha256_file,
    write_bundle,
)


def _manifest(**overrides) -> BundleManifest:
    fields = dict(
        model_version=3, sha256="", labels=list(THINKING), signals=list(SIGNALS), window=8,
        frame_rate_hz=10.0,
        normalisation={"mean": [0.0] * len(SIGNALS), "std": [1.0] * len(SIGNALS)},
        thresholds={label: 0.5 for label in THINKING})
    fields.update(overrides)
    return BundleManifest(**fields)


def test_write_then_load_roundtrip(tmp_path):
    bundle = write_bundle(tmp_path / "b", b"onnx-bytes", _manifest())
    assert bundle.version == 3
    assert bundle.manifest.sha256 == sha256_file(bundle.onnx_path)
    assert bundle.manifest.created_at
    assert read_manifest(tmp_path / "b").labels == list(THINKING)


def test_rewrite_replaces_atomically_and_leaves_no_staging(tmp_path):
    write_bundle(tmp_path / "b", b"one", _manifest(model_version=1))
    write_bundle(tmp_path / "b", b"two", _manifest(model_version=2))
    assert load_bundle(tmp_path / "b").version == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


def test_tampered_model_names_file_and_expected_hash(tmp_path):
    bundle = write_bundle(tmp_path / "b", b"original", _manifest())
    bundle.onnx_path.write_bytes(b"origina")  # truncated
    with pytest.raises(BundleError) as err:
        load_bundle(tmp_path / "b")
    assert str(bundle.onnx_path) in str(err.value)
    assert bundle.manifest.sha256 in str(err.value)


def test_missing_folder_and_missing_model(tmp_path):
    with pytest.raises(BundleError, match="not found"):
        load_bundle(tmp_path / "nope")
    bundle = write_bundle(tmp_path / "b", b"x", _manifest())
    bundle.onnx_path.unlink()
    with pytest.raises(BundleError, match="policy.onnx"):
        load_bundle(tmp_path / "b")


def test_unknown_format_version_is_refused(tmp_path):
    write_bundle(tmp_path / "b", b"x", _manifest())
    path = tmp_path / "b" / "bundle.json"
    data = json.loads(path.read_text())
    data["format_version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(BundleError, match="format_version 99"):
        load_bundle(tmp_path / "b")


def test_corrupt_manifest_and_unknown_keys(tmp_path):
    write_bundle(tmp_path / "b", b"x", _manifest())
    path = tmp_path / "b" / "bundle.json"
    data = json.loads(path.read_text())
    data["surprise"] = 1
    path.write_text(json.dumps(data))
    with pytest.raises(BundleError, match="surprise"):
        load_bundle(tmp_path / "b")
    path.write_text("{not json")
    with pytest.raises(BundleError, match="cannot parse"):
        load_bundle(tmp_path / "b")


def test_manifest_validation_names_the_problem():
    with pytest.raises(BundleError, match="thresholds lack"):
        _manifest(thresholds={})
    with pytest.raises(BundleError, match="normalisation"):
        _manifest(normalisation={"mean": [0.0], "std": [1.0]})
    with pytest.raises(BundleError, match="window"):
        _manifest(window=0)


def test_a_model_version_past_what_an_experience_carries_is_refused(tmp_path):
    """10^30 loaded, and ``bench rounds`` then scored a fleet that could ship nothing."""
    write_bundle(tmp_path / "b", b"x", _manifest(model_version=2**63 - 1))
    assert load_bundle(tmp_path / "b").version == 2**63 - 1
    path = tmp_path / "b" / "bundle.json"
    for version in (2**63, 10**30):
        path.write_text(json.dumps({**json.loads(path.read_text()), "model_version": version}))
        with pytest.raises(BundleError, match=r"model_version must be an integer in "
                                              r"\[0, 9223372036854775807\]"):
            load_bundle(tmp_path / "b")


def test_written_bundle_is_world_readable(tmp_path):
    bundle = write_bundle(tmp_path / "b", b"x", _manifest())
    assert bundle.path.stat().st_mode & 0o755 == 0o755
