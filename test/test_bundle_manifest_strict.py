"""A bundle.json that holds a key twice is refused, not read last-wins."""

from __future__ import annotations

import json

import pytest

from thinkmem_ros.core.vocabulary import SIGNALS, THINKING
from thinkmem_ros.policy.bundle import (
    MANIFEST,
    BundleError,
    BundleManifest,
    load_bundle,
    parse_manifest,
    read_manifest,
    write_bundle,
)


def _bundle(tmp_path):
    manifest = BundleManifest(
        model_version=1, sha256="", labels=list(THINKING), signals=list(SIGNALS), window=8,
        frame_rate_hz=10.0,
        normalisation={"mean": [0.0] * len(SIGNALS), "std": [1.0] * len(SIGNALS)},
        thresholds={label: 0.5 for label in THINKING}, metrics={"train": {"situations": 5}})
    return write_bundle(tmp_path / "b", b"onnx-bytes", manifest).path


def test_a_repeated_top_level_key_is_refused_naming_file_and_key(tmp_path):
    """``"frame_rate_hz": 3.0, "frame_rate_hz": 10.0`` loaded as 10 Hz in calibrate and node."""
    folder = _bundle(tmp_path)
    path = folder / MANIFEST
    text = path.read_text(encoding="utf-8")
    assert load_bundle(folder).manifest.frame_rate_hz == 10.0
    path.write_text(text.replace('"frame_rate_hz": 10.0',
                                 '"frame_rate_hz": 3.0, "frame_rate_hz": 10.0', 1),
                    encoding="utf-8")
    assert text != path.read_text(encoding="utf-8")
    for read in (load_bundle, read_manifest):
        with pytest.raises(BundleError) as err:
            read(folder)
        message = str(err.value)
        assert message.startswith(f"{path}: key 'frame_rate_hz' appears twice")
        assert "\n" not in message


def test_a_repeated_nested_key_is_refused_too(tmp_path):
    folder = _bundle(tmp_path)
    text = (folder / MANIFEST).read_text(encoding="utf-8")
    doubled = text.replace('"situations": 5', '"situations": 5, "situations": 9', 1)
    assert doubled != text
    with pytest.raises(BundleError, match=r"^src: key 'situations' appears twice"):
        parse_manifest(doubled, source="src")
    assert parse_manifest(text, source="src").metrics == {"train": {"situations": 5}}
    assert json.loads(text)["frame_rate_hz"] == 10.0
