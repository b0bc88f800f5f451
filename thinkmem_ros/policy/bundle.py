"""The model bundle: ``policy.onnx`` plus ``bundle.json``, the contract between sides.

The trainer writes bundles, the consolidator publishes them and the node loads them; this
module is the only place that knows the layout, so a bundle written by one side is
always readable by the others. Loading verifies the ONNX file's sha256 before anything
touches it: a truncated or tampered file is refused, never half-loaded.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import math
import os
import re
import shutil
import stat
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from thinkmem_ros.core.input_files import file_kind

FORMAT_VERSION = 2
"""2 adds ``streaming``: a per-frame update with explicit state (policy/streaming_runtime)."""
SUPPORTED_FORMATS = (1, 2)
MANIFEST = "bundle.json"
ONNX_FILE = "policy.onnx"
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
"""Largest ``bundle.json`` read; real ones are a few kilobytes (metrics included)."""
MAX_ARTEFACT_BYTES = 32 * 1024 * 1024
"""Largest artefact file (values, memctl, rules and their sidecars) read from a bundle: the
wire's frame limit (``link.protocol.MAX_FRAME_BYTES``, written out because policy sits
below the link and may not import it; a test holds the two equal). No file a push could
carry is refused, and a hand-placed huge file is refused instead of filling memory."""
MAX_UNPACKED_BYTES = 8 * MAX_ARTEFACT_BYTES
"""Largest total an artefact ``.npz`` may unpack to (256 MiB): a small compressed file must
not expand into gigabytes (a zip bomb); real value tables unpack to a few megabytes."""
MAX_NAME_CHARS = 128
"""Longest signal, label or event name a manifest may hold; wire names are 64 at most."""
NAME_KEYS = ("signals", "labels", "event_vocabulary")
"""Manifest keys whose items become topic/parameter names and column keys on the robot."""
MAX_MODEL_VERSION = 2**63 - 1
"""Highest model_version: experiences, round marks and the push frame carry it as a signed
64-bit integer, so a bundle past it could ship nothing and no round could record it."""


class BundleError(RuntimeError):
    """A bundle is missing, unreadable, of an unknown format, or does not match its hash."""


@dataclass
class BundleManifest:
    """What ``bundle.json`` holds; the node checks these against the ONNX graph."""

    model_version: int
    sha256: str
    labels: list[str]
    signals: list[str]
    window: int
    frame_rate_hz: float
    normalisation: dict[str, list[float]]  # {"mean": [F], "std": [F]}
    thresholds: dict[str, float]  # label -> tau
    event_vocabulary: list[str] = field(default_factory=list)
    max_events: int = 1
    training_fingerprint: str = ""
    created_at: str = ""
    preset: str = ""
    model_config: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    extras: dict = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    streaming: dict = field(default_factory=dict)  # {} = a window policy (format 1 graph)
    signal_units: dict[str, str] = field(default_factory=dict)  # signal -> unit ('' unknown)
    signal_ranges: dict[str, list[float]] = field(default_factory=dict)  # signal -> [p1, p99]
    signal_set: str = ""  # signal_set_fingerprint(); filled by write_bundle when empty

    def __post_init__(self) -> None:
        if self.format_version not in SUPPORTED_FORMATS:
            raise BundleError(
                f"bundle format_version {self.format_version} is not supported; "
                f"this thinkmem_ros reads {list(SUPPORTED_FORMATS)}")
        if self.window < 1:
            raise BundleError(f"bundle window must be >= 1, got {self.window}")
        if not self.labels:
            raise BundleError("bundle has no thinking labels")
        missing = [label for label in self.labels if label not in self.thresholds]
        if missing:
            raise BundleError(f"bundle thresholds lack labels {missing}")
        if self.streaming and self.format_version < 2:
            raise BundleError("a streaming bundle needs format_version >= 2, got "
                              f"{self.format_version}")
        for key in ("mean", "std"):
            if len(self.normalisation.get(key, [])) != len(self.signals):
                raise BundleError(
                    f"bundle normalisation[{key!r}] must have {len(self.signals)} values")
        for key in ("signal_units", "signal_ranges"):
            stray = sorted(set(getattr(self, key)) - set(self.signals))
            if stray:
                raise BundleError(f"bundle {key} name signals {stray} it does not have")

    def to_json(self) -> str:
        """Canonical JSON (sorted keys) so signatures over it are reproducible."""
        return json.dumps(asdict(self), sort_keys=True, indent=2)

    @classmethod
    def from_dict(cls, data: dict, source: str = MANIFEST) -> BundleManifest:
        """Build a manifest, naming the file and the key when something is wrong."""
        if not isinstance(data, dict):
            raise BundleError(f"{source}: expected a JSON object")
        if "format_version" in data and data["format_version"] not in SUPPORTED_FORMATS:
            raise BundleError(
                f"{source}: format_version {_kind(data['format_version'])} is not supported; "
                f"this thinkmem_ros reads {list(SUPPORTED_FORMATS)}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(map(str, set(data) - known))
        if unknown:
            raise BundleError(f"{source}: unknown keys {unknown[:8]}")
        for key, value in data.items():
            _check_field(source, key, value)
        for key in NAME_KEYS:
            _check_names(source, key, data.get(key, []))
        try:
            return cls(**data)
        except TypeError as exc:
            raise BundleError(f"{source}: {exc}") from exc


def _is_number(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_names(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


_FIELD_TYPES: dict[str, tuple[Callable[[object], bool], str]] = {
    "model_version": (lambda v: _is_int(v) and 0 <= v <= MAX_MODEL_VERSION,
                      f"an integer in [0, {MAX_MODEL_VERSION}]"),
    "sha256": (lambda v: isinstance(v, str), "a string"),
    "labels": (_is_names, "a list of strings"),
    "signals": (_is_names, "a list of strings"),
    "window": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "frame_rate_hz": (lambda v: _is_number(v) and v > 0, "a finite number > 0"),
    "normalisation": (lambda v: isinstance(v, dict) and all(
        isinstance(k, str) and isinstance(xs, list) and all(_is_number(x) for x in xs)
        for k, xs in v.items()), "an object of number lists {mean: [..], std: [..]}"),
    "thresholds": (lambda v: isinstance(v, dict) and all(
        isinstance(k, str) and _is_number(x) for k, x in v.items()),
        "an object {label: number}"),
    "event_vocabulary": (_is_names, "a list of strings"),
    "max_events": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "training_fingerprint": (lambda v: isinstance(v, str), "a string"),
    "created_at": (lambda v: isinstance(v, str), "a string"),
    "preset": (lambda v: isinstance(v, str), "a string"),
    "model_config": (lambda v: isinstance(v, dict), "an object"),
    "metrics": (lambda v: isinstance(v, dict), "an object"),
    "extras": (lambda v: isinstance(v, dict), "an object"),
    "format_version": (_is_int, "an integer"),
    "streaming": (lambda v: isinstance(v, dict), "an object"),
    "signal_units": (lambda v: isinstance(v, dict) and all(
        isinstance(k, str) and isinstance(x, str) for k, x in v.items()),
        "an object {signal: unit}"),
    "signal_ranges": (lambda v: isinstance(v, dict) and all(
        isinstance(k, str) and isinstance(xs, list) and len(xs) == 2
        and all(_is_number(x) for x in xs) for k, xs in v.items()),
        "an object {signal: [low, high]}"),
    # '' or a fingerprint: robots send it in every experience, whose wire check is the same
    "signal_set": (lambda v: isinstance(v, str) and re.fullmatch(r"(|[0-9a-f]{64})", v)
                   is not None, "'' or 64 lowercase hex characters"),
}
"""What each ``bundle.json`` key must hold: a manifest is outside input (a file on disk, a
push), so a wrong type is refused naming the key instead of failing later in a traceback."""


def _check_field(source: str, key: str, value: object) -> None:
    check, expected = _FIELD_TYPES[key]
    if not check(value):
        raise BundleError(f"{source}: {key} must be {expected}, got {_kind(value)}")


def _check_names(source: str, key: str, names: list[str]) -> None:
    """Refuse empty, duplicate, over-long or unprintable names, naming the key and the item.

    Why: a signal name becomes ROS parameter and topic names (a NUL cut it short, a
    duplicate declared a parameter twice and stopped the node) and every name is a column
    key, so two equal labels would silently share one threshold.
    """
    seen: set[str] = set()
    for index, name in enumerate(names):
        if not name or len(name) > MAX_NAME_CHARS or not name.isprintable():
            raise BundleError(f"{source}: {key}[{index}] must be a non-empty printable name "
                              f"of at most {MAX_NAME_CHARS} characters (no control "
                              f"characters), got {_kind(name)}")
        if name in seen:
            raise BundleError(f"{source}: {key}[{index}] {name!r} is listed twice")
        seen.add(name)


def _kind(value: object) -> str:
    if isinstance(value, (dict, list)):
        return f"a {type(value).__name__} of {len(value)} items"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass
class Bundle:
    """A verified bundle on disk: its folder, its manifest and the ONNX bytes' path."""

    path: Path
    manifest: BundleManifest

    @property
    def onnx_path(self) -> Path:
        """Location of the verified ONNX graph."""
        return self.path / ONNX_FILE

    @property
    def version(self) -> int:
        """Monotonic model version; the node never swaps to a lower one from a push."""
        return self.manifest.model_version


def signal_set_fingerprint(manifest: BundleManifest) -> str:
    """sha256 over the signal names, their order, declared units and the frame rate.

    Two robots can share experiences and bundles only when their windows mean the same
    thing: the same columns, in the same units, at the same rate. The consolidator groups
    experiences by this value and retrains each group for its own bundle line; a bundle
    without declared units fingerprints its units as '' (the synthetic world's signals).
    """
    return signal_set_key(manifest.signals, manifest.signal_units, manifest.frame_rate_hz)


def signal_set_key(signals: list[str] | tuple[str, ...], units: dict[str, str],
                   frame_rate_hz: float) -> str:
    """The fingerprint of ``signal_set_fingerprint`` from its parts (for a robot's config)."""
    text = json.dumps({"signals": list(signals),
                       "units": [units.get(name, "") for name in signals],
                       "frame_rate_hz": round(float(frame_rate_hz), 6)}, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, streamed so large graphs do not sit in memory twice."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(folder: Path | str) -> BundleManifest:
    """Parse ``bundle.json`` without checking the ONNX file (for listing and diffing)."""
    manifest_path = Path(folder) / MANIFEST
    if not manifest_path.is_file():
        raise BundleError(f"bundle manifest not found: {manifest_path}")
    try:
        size = manifest_path.stat().st_size
        if size > MAX_MANIFEST_BYTES:
            raise BundleError(f"{manifest_path}: {size} bytes exceed {MAX_MANIFEST_BYTES}")
        text = manifest_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BundleError(f"{manifest_path}: cannot read: {exc}") from exc
    return parse_manifest(text, source=str(manifest_path))


def parse_manifest(text: str | bytes, source: str = MANIFEST) -> BundleManifest:
    """Parse manifest text; anything malformed (deep nesting included) is a BundleError."""
    if len(text) > MAX_MANIFEST_BYTES:
        raise BundleError(f"{source}: {len(text)} bytes exceed {MAX_MANIFEST_BYTES}")
    try:
        data = json.loads(text, object_pairs_hook=unique_keys_object)
    except DuplicateKeyError as exc:
        key = repr(exc.key) if len(exc.key) <= 60 else repr(exc.key[:57]) + "..."
        raise BundleError(f"{source}: key {key} appears twice in one JSON object; "
                          "a reader would keep only the last value") from None
    except RecursionError:
        raise BundleError(f"{source}: cannot parse JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, over-long int literals
        raise BundleError(f"{source}: cannot parse JSON: {exc}") from None
    return BundleManifest.from_dict(data, source=source)


class DuplicateKeyError(ValueError):
    """A JSON object that holds one key twice; ``key`` is that key."""

    def __init__(self, key: str) -> None:
        super().__init__(f"key {key!r} appears twice in one JSON object")
        self.key = key


def unique_keys_object(pairs: list[tuple[str, object]]) -> dict:
    """``json.loads`` object_pairs_hook that refuses a repeated key (DuplicateKeyError).

    Plain ``json.loads`` keeps the last of two equal keys, so a manifest with
    ``"frame_rate_hz": 3.0, "frame_rate_hz": 10.0`` read as 10 Hz without a word, while
    another reader (or a reviewer) may take the first.
    """
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(key)
        out[key] = value
    return out


def load_bundle(folder: Path | str) -> Bundle:
    """Read and verify a bundle; raises BundleError naming the file and expected sha256."""
    folder = Path(folder)
    if not folder.is_dir():
        raise BundleError(f"bundle folder not found: {folder}")
    manifest = read_manifest(folder)
    onnx_path = folder / ONNX_FILE
    if not onnx_path.is_file():
        raise BundleError(
            f"bundle model not found: {onnx_path} (expected sha256 {manifest.sha256})")
    actual = sha256_file(onnx_path)
    if actual != manifest.sha256:
        raise BundleError(
            f"{onnx_path}: sha256 {actual} does not match the manifest's expected sha256 "
            f"{manifest.sha256}; the file is truncated, corrupted or tampered with")
    return Bundle(path=folder, manifest=manifest)


def write_bundle(folder: Path | str, onnx_bytes: bytes, manifest: BundleManifest) -> Bundle:
    """Write a bundle atomically: files land in a temp folder that is then renamed.

    The manifest's ``sha256`` and ``created_at`` are filled in here so no caller can
    forget them. An existing bundle at ``folder`` is replaced only once the new one is
    complete, so a crash never leaves a half-written bundle behind.

    ``folder`` is a name: when it is a symlink, the link itself is replaced by the new
    bundle (as ``rename`` does) and the folder it pointed to is left as it was. Writing
    through the link would delete a bundle the user may keep elsewhere, and refusing
    would throw away a training run that has already finished; this loses neither.
    """
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    manifest.sha256 = hashlib.sha256(onnx_bytes).hexdigest()
    if not manifest.signal_set:
        manifest.signal_set = signal_set_fingerprint(manifest)
    if not manifest.created_at:
        manifest.created_at = datetime.now(UTC).isoformat(timespec="seconds")
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    staging.chmod(0o755)  # mkdtemp makes 0700; a bundle must be readable by the node's user
    (staging / ONNX_FILE).write_bytes(onnx_bytes)
    (staging / MANIFEST).write_text(manifest.to_json() + "\n", encoding="utf-8")
    for name in (ONNX_FILE, MANIFEST):
        with open(staging / name, "rb") as handle:
            os.fsync(handle.fileno())
    if folder.exists() or folder.is_symlink():  # a dangling or looping link included
        retired = folder.with_name(f".{folder.name}.old")
        if retired.exists() or retired.is_symlink():
            _remove_tree(retired)
        folder.rename(retired)
        staging.rename(folder)
        _remove_tree(retired)
    else:
        staging.rename(folder)
    return load_bundle(folder)


def read_bundle_file(path: Path | str, limit: int = MAX_ARTEFACT_BYTES) -> bytes:
    """Read one regular file of at most ``limit`` bytes; OSError naming it otherwise.

    A bundle folder is outside input: a FIFO there blocked the hot-swap thread forever and
    a symlink to /dev/zero filled memory. The file is opened without blocking and checked
    on the open descriptor (no race with a swap of the name), then read to ``limit`` + 1
    bytes so a file that grows after the check is refused too.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"not a regular file ({file_kind(mode)}); refused",
                          str(path))
        chunks, size = [], 0
        while size <= limit and (chunk := os.read(fd, min(1 << 20, limit + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes; refused", str(path))
    return b"".join(chunks)


def read_artefact_files(folder: Path | str, names: tuple[str, ...], error: type[Exception],
                        what: str) -> dict[str, bytes]:
    """{name: bytes} of an artefact's files, each read exactly once.

    Why once: whatever checks the bytes (the sidecar's sha256, a bundle's signed list) must
    check the bytes that get parsed. ``read_bundle_file`` keeps the size cap and refuses
    FIFOs and devices; a failure is ``error`` naming the file.
    """
    folder = Path(folder)
    files = {}
    for name in names:
        try:
            files[name] = read_bundle_file(folder / name)
        except OSError as exc:
            why = exc.strerror or exc
            raise error(f"{folder / name}: cannot read {what} artefact: {why}") from exc
    return files


def verify_artefact(folder: Path | str, files: dict[str, bytes], meta_name: str,
                    data_name: str, version: int, error: type[Exception],
                    what: str) -> tuple[dict, bytes]:
    """(sidecar, data bytes) of an artefact read into memory, after its version and hash checks.

    Value tables, memory-control heads and rules ship beside the ONNX graph as a data file
    plus a json sidecar that records the data's sha256; every loader must refuse a
    corrupted or tampered artefact the same way, so the check lives here, once. Both are
    taken from ``files``, never from disk, so the checked data is the parsed data. Raises
    ``error`` naming the file otherwise.
    """
    folder = Path(folder)
    path = folder / meta_name
    try:
        meta = json.loads(files[meta_name].decode("utf-8"), object_pairs_hook=unique_keys_object)
    except RecursionError:
        raise error(f"{path}: cannot parse JSON: nested too deeply") from None
    except ValueError as exc:  # UnicodeDecodeError, JSONDecodeError included
        raise error(f"{path}: cannot read {what} artefact: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("artefact_version") != version:
        found = meta.get("artefact_version") if isinstance(meta, dict) else None
        raise error(f"{path}: artefact_version {found!r} is not {version}")
    raw = files[data_name]
    if hashlib.sha256(raw).hexdigest() != meta.get("sha256"):
        raise error(f"{folder / data_name}: sha256 does not match {meta_name}; "
                    "corrupted or tampered with")
    return meta, raw


def read_npz(raw: bytes, limit: int | None = None) -> dict:
    """Return {name: array} of verified ``.npz`` bytes; ValueError when they unpack too big.

    No pickles (object arrays are refused by numpy) and the members' declared sizes are
    summed first: zipfile never returns more than a member declares, so this bounds memory.
    Other malformed bytes raise whatever numpy or zipfile raise; callers name the file.
    """
    import numpy as np

    limit = MAX_UNPACKED_BYTES if limit is None else limit
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        total = sum(info.file_size for info in archive.infolist())
    if total > limit:
        raise ValueError(f"unpacks to {total} bytes, more than {limit}")
    with np.load(io.BytesIO(raw), allow_pickle=False) as data:
        return {name: np.asarray(data[name]) for name in data.files}


def fsync_dir(path: Path) -> None:
    """Flush a directory entry so a rename into it survives a crash (publish, install)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_tree(path: Path) -> None:
    """Delete ``path``, never what a symlink in it points to: a link is only unlinked.

    A retired bundle may be a symlink (``folder`` was one) or hold one (a hand-made
    ``artefacts -> /data/x``); following either emptied folders outside the bundle.
    """
    if path.is_symlink() or not path.is_dir():
        path.unlink()
    else:
        shutil.rmtree(path)  # unlinks symlinks inside instead of descending into them
