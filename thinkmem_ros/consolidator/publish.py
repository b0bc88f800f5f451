"""Versioned, signed publication of gated bundles, with a history, and the push frame.

Layout under ``PublishConfig.root``::

    history/v000002/{bundle.json, policy.onnx, bundle.sig}   one folder per version
    current -> history/v000002                                the published bundle

A version is assembled and signed in a hidden staging folder next to ``history/v*``,
fsynced, verified against the signing key's public half, and only then renamed into
place; ``current`` is swapped with ``os.replace`` on a fresh symlink. A crash (even
SIGKILL) therefore leaves either the old or the new version visible, never a half-written
one; leftover staging folders are removed on the next start. Versions only grow: the
next one is above both ``current`` and every folder in ``history`` (a version that was
written but not yet linked is never reused for different bytes).

Key rotation: ``PublishConfig.endorsements`` (a chain file from ``thinkmem keys --rotate``
/ ``--revoke``) is the chain of key endorsements from the fleet's first signing key to
this one. The publisher writes it into every manifest it signs, as
``extras.endorsements``, so robots that know only an older key apply the chain before
they check the signature (``robot/trust_store``). Inside the manifest rather than in a
new frame field or a separate file: the BUNDLE_PUSH wire format stays as it is (older
robots ignore an unknown extras key), each published version records the chain it was
shipped with, and a robot restarting re-reads the chain from its installed bundle. That
the bundle signature also covers the chain adds nothing to its trust (each endorsement
is trusted for its own signature, checked before the bundle's); it only keeps the
manifest in one piece.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import nacl.signing

from thinkmem_ros.link import protocol
from thinkmem_ros.link.key_endorsement import (
    ENDORSEMENTS_KEY,
    EndorsementError,
    KeyEndorsement,
    check_chain,
    load_chain,
    public_hex,
    verify_bundle_with_any,
)
from thinkmem_ros.link.security import (
    SIGNATURE_FILE,
    load_signing_key,
    sign_bundle,
)
from thinkmem_ros.policy.anticipation_rules import RULES_FILES
from thinkmem_ros.policy.bundle import (
    MANIFEST,
    MAX_MODEL_VERSION,
    ONNX_FILE,
    Bundle,
    BundleError,
    fsync_dir,
    load_bundle,
    parse_manifest,
    write_bundle,
)
from thinkmem_ros.policy.memctl_heads import MEMCTL_JSON, MEMCTL_NPZ
from thinkmem_ros.policy.value_table import VALUES_JSON, VALUES_NPZ

log = logging.getLogger(__name__)

HISTORY = "history"
CURRENT = "current"
ARTEFACTS_KEY = "artefacts"  # manifest extras key the robot reads (thinking_gates)
ARTEFACT_FILES: dict[str, tuple[str, ...]] = {"values": (VALUES_NPZ, VALUES_JSON),
                                              "memctl": (MEMCTL_NPZ, MEMCTL_JSON),
                                              "rules": RULES_FILES}
"""Each artefact kind a bundle may carry and its files (data + sidecar)."""
_VERSION_DIR = re.compile(r"v(\d{6,})")
SIGNATURE_BYTES = 64
"""Size of ``bundle.sig`` (an Ed25519 signature): counted before it is written."""


class PublishError(RuntimeError):
    """A bundle cannot be published (wrong version, unreadable, signing failed)."""


@dataclass
class PublishConfig:
    """Where publications live and which Ed25519 key signs them."""

    root: Path | str
    signing_key: Path | str | nacl.signing.SigningKey
    keep_history: int = 20
    # chain file (or endorsements) from the fleet's first key to signing_key; None = none
    endorsements: Path | str | list[KeyEndorsement] | None = None

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        if self.keep_history < 1:
            raise ValueError(f"PublishConfig.keep_history must be >= 1, got "
                             f"{self.keep_history}")
        if not isinstance(self.signing_key, nacl.signing.SigningKey):
            self.signing_key = load_signing_key(self.signing_key)  # fail now, not at publish
        self.chain: tuple[KeyEndorsement, ...] = ()
        if self.endorsements is not None:
            try:
                chain = (load_chain(self.endorsements)
                         if isinstance(self.endorsements, (str, Path))
                         else list(self.endorsements))
                final = check_chain(chain)
            except EndorsementError as exc:
                raise ValueError(f"PublishConfig.endorsements: {exc}") from None
            if public_hex(self.signing_key) not in final.keys:
                raise ValueError(f"PublishConfig.endorsements: the chain ends trusting "
                                 f"{[k[:16] + '..' for k in final.keys]}, not the signing "
                                 "key: robots would refuse every bundle it signs")
            self.chain = tuple(sorted(chain, key=lambda e: e.serial))

    def known_keys(self) -> tuple[nacl.signing.VerifyKey, ...]:
        """The signing key, then every key the chain names: what our own history is signed by."""
        hexes = [public_hex(self.signing_key)]
        for endorsement in self.chain:
            hexes += [h for h in (endorsement.signer, endorsement.key) if h not in hexes]
        return tuple(nacl.signing.VerifyKey(bytes.fromhex(h)) for h in hexes)


@dataclass(frozen=True)
class Publication:
    """A published version: where it lies, its hash, and how many robots it was pushed to."""

    version: int
    path: Path
    sha256: str
    pushed_to: int | None


class Publisher:
    """Keeps ``root/current`` and ``root/history``; the initial bundle is version zero's base."""

    def __init__(self, config: PublishConfig, initial_bundle: Path | str) -> None:
        self.config = config
        self.root: Path = config.root
        # made by the first publication, not here: a consolidator refused at start left an
        # empty publish folder behind (the checks that refuse it need this object)
        self.history = self.root / HISTORY
        for stale in self.history.glob(".staging-*"):  # a crash mid-publication left these
            shutil.rmtree(stale, ignore_errors=True)
        self.initial = load_bundle(initial_bundle)
        self.verify_key = config.signing_key.verify_key
        # a rotated publisher still reads its history, signed by the chain's older keys
        self.known_keys = config.known_keys()

    def current(self) -> Bundle:
        """Return the published bundle (verified), or the initial one before any publication."""
        link = self.root / CURRENT
        if link.is_symlink() or link.exists():
            try:
                bundle = verify_bundle_with_any(link.resolve(), self.known_keys)
                verified_artefacts(bundle)
            except (BundleError, PublishError) as exc:
                raise PublishError(f"{link}: published bundle does not verify: {exc}") from exc
            return bundle
        return self.initial

    def versions(self) -> list[int]:
        """Versions present in the history, ascending (none before the first publication)."""
        if not self.history.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.history.iterdir()
                      if (m := _VERSION_DIR.fullmatch(p.name)) and p.is_dir())

    def next_version(self) -> int:
        """One above everything published or written so far; ``PublishError`` past the cap.

        Why refuse: a round published v2^63 and only then failed on SQLite's INTEGER
        overflow, leaving ``current`` on a version no experience or push frame can carry.
        """
        version = max([self.current().version, *self.versions()]) + 1
        if version > MAX_MODEL_VERSION:
            raise PublishError(f"{self.root}: the next version would be v{version}, past the "
                               f"highest a bundle may carry ({MAX_MODEL_VERSION}); start a "
                               f"new line from a bundle trained with a lower --model-version")
        return version

    def publish(self, staged: Bundle, push: Callable[[bytes], int] | None = None,
                link: bool = True) -> Publication:
        """Sign ``staged`` into ``history/v<version>``, point ``current`` at it, push it.

        ``link=False`` (a canary) leaves ``current`` where it is: the version is signed
        into the history and pushed, but is not yet what the whole fleet runs (receive-only
        processes push ``current``); ``promote`` links it later.
        """
        version = staged.version
        expected = self.next_version()
        if version != expected:
            raise PublishError(f"staged bundle is v{version}, the next version is v{expected}")
        staged = load_bundle(staged.path)  # re-verify: the staging folder may have changed
        target = self.history / f"v{version:06d}"
        self.history.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.history))
        try:
            # value/memctl artefacts listed (with sha256) in extras.artefacts travel along;
            # the signature over the manifest covers them (thinking_gates.attach_artefacts)
            listed = _listed_artefacts(staged)
            for name in (MANIFEST, ONNX_FILE, *listed):
                shutil.copyfile(staged.path / name, staging / name)
            if self.config.chain:  # the key chain rides in the manifest it signs
                _write_chain(staging / MANIFEST, self.config.chain)
            check_pushable(staging, version, (MANIFEST, ONNX_FILE, *listed), SIGNATURE_BYTES)
            sign_bundle(staging, self.config.signing_key)
            for name in (MANIFEST, ONNX_FILE, SIGNATURE_FILE, *listed):
                _fsync(staging / name)
            verified_artefacts(verify_bundle_with_any(staging, (self.verify_key,)))
            staging.rename(target)
        except (OSError, BundleError) as exc:
            raise PublishError(f"cannot publish v{version}: {exc}") from exc
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        fsync_dir(self.history)
        if link:
            self._link(target)
        self._prune()
        log.info("published v%d (sha256 %s) at %s%s", version, staged.manifest.sha256[:12],
                 target, "" if link else " (not linked as current)")
        pushed = push(push_frame(target)) if push is not None else None
        return Publication(version, target, staged.manifest.sha256, pushed)

    def promote(self, version: int, push: Callable[[bytes], int] | None = None
                ) -> Publication:
        """Point ``current`` at an already published ``version`` (verified), push it."""
        target = self.history / f"v{version:06d}"
        try:
            bundle = verify_bundle_with_any(target, self.known_keys)
        except BundleError as exc:
            raise PublishError(f"cannot promote v{version}: {exc}") from exc
        if version < self.current().version:
            raise PublishError(f"cannot promote v{version}: current is "
                               f"v{self.current().version}")
        check_pushable(target, version, (MANIFEST, ONNX_FILE, SIGNATURE_FILE,
                                         *_listed_artefacts(bundle)))
        self._link(target)
        log.info("promoted v%d to current", version)
        pushed = push(push_frame(target)) if push is not None else None
        return Publication(version, target, bundle.manifest.sha256, pushed)

    def _link(self, target: Path) -> None:
        tmp = self.root / f".{CURRENT}.tmp"
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        os.symlink(os.path.relpath(target, self.root), tmp)
        os.replace(tmp, self.root / CURRENT)
        fsync_dir(self.root)

    def _prune(self) -> None:
        current = self.current().version
        for version in self.versions()[:-self.config.keep_history]:
            if version != current:
                shutil.rmtree(self.history / f"v{version:06d}", ignore_errors=True)


def check_pushable(folder: Path, version: int, names: Iterable[str], unwritten: int = 0
                   ) -> None:
    """Refuse a bundle whose files (plus ``unwritten`` bytes to come) one push cannot carry.

    Why before signing and linking: the push is the last step of a publication, so a bundle
    past the wire's limit used to be signed and made ``current`` first and fail only then:
    no robot could ever get that version and every receive-only process failed on it at
    each check. Summing file sizes against ``protocol.MAX_BUNDLE_BYTES`` bounds the frame
    without building it, so a normal bundle pays a few ``stat`` calls.
    """
    try:
        size = sum((folder / name).stat().st_size for name in names) + unwritten
    except OSError as exc:
        raise PublishError(f"v{version} cannot be pushed: {exc}") from exc
    if size > protocol.MAX_BUNDLE_BYTES:
        raise PublishError(f"v{version} cannot be pushed: its files total {size} bytes, more "
                           f"than the {protocol.MAX_BUNDLE_BYTES} one push can carry (frame "
                           f"limit {protocol.MAX_FRAME_BYTES}); current and history untouched")


def push_frame(folder: Path | str) -> bytes:
    """Build the BUNDLE_PUSH frame for a published (signed) bundle folder.

    The value/memctl artefacts the manifest lists travel in the frame too: without them a
    robot would install the policy but run without the value table it was gated with.
    Each is checked against its listed sha256 here, so a corrupted file on the
    consolidator fails loudly at push time instead of being refused by every robot.
    """
    folder = Path(folder)
    bundle = load_bundle(folder)
    artefacts = verified_artefacts(bundle)
    return protocol.bundle_push(bundle.version, (folder / MANIFEST).read_bytes(),
                                (folder / ONNX_FILE).read_bytes(),
                                (folder / SIGNATURE_FILE).read_bytes(), artefacts)


def verified_artefacts(bundle: Bundle) -> dict[str, bytes]:
    """Each artefact the manifest lists, read and checked against its signed sha256.

    The signature covers the manifest, the manifest lists each artefact's sha256, so a
    file changed after signing is caught only by hashing it: done wherever a bundle is
    published, taken as the running one, or pushed, not only by the robots that refuse it.
    """
    artefacts: dict[str, bytes] = {}
    for name, want in _listed_artefacts(bundle).items():
        try:
            data = (bundle.path / name).read_bytes()
        except OSError as exc:
            raise PublishError(f"{bundle.path}: listed artefact {name} unreadable: "
                               f"{exc}") from exc
        if hashlib.sha256(data).hexdigest() != str(want).lower():
            raise PublishError(f"{bundle.path / name}: sha256 does not match the manifest "
                               "(changed after signing)")
        artefacts[name] = data
    return artefacts


def _listed_artefacts(bundle: Bundle) -> dict[str, str]:
    """The manifest's {file: sha256} artefact list, with names safe to open in the folder."""
    listed = bundle.manifest.extras.get("artefacts") or {}
    if not isinstance(listed, dict):
        raise PublishError(f"{bundle.path}: extras.artefacts is not a map")
    try:
        return {protocol.check_artefact_name(name): want
                for name, want in sorted(listed.items())}
    except protocol.ProtocolError as exc:
        raise PublishError(f"{bundle.path}: {exc}") from exc


def _write_chain(manifest_path: Path, chain: tuple[KeyEndorsement, ...]) -> None:
    """Set ``extras.endorsements`` in a staged manifest (canonical JSON, as write_bundle)."""
    manifest = parse_manifest(manifest_path.read_bytes(), source=str(manifest_path))
    manifest.extras = {**manifest.extras, ENDORSEMENTS_KEY: [e.to_dict() for e in chain]}
    manifest_path.write_text(manifest.to_json() + "\n", encoding="utf-8")


def _fsync(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())



def attach_artefacts(bundle_folder: Path | str, sources: dict[str, Path | str]) -> dict[str, str]:
    """Copy artefacts into an unsigned (staged) bundle and list their sha256 in its manifest.

    ``sources`` maps an ``ARTEFACT_FILES`` kind to the folder holding its files. The
    manifest's ``extras.artefacts`` ({file: sha256}) is what the publisher signs and copies
    and what the robot checks every received file against; artefacts listed before (other
    kinds, attached by an earlier step) stay listed, a kind attached again is replaced. The
    robot side has the same step for hand-made bundles
    (``robot.thinking_gates.attach_artefacts``); the consolidator may not import robot
    code, hence this one. Returns every listed {file: sha256}.
    """
    bundle_folder = Path(bundle_folder)
    bundle = load_bundle(bundle_folder)
    files: dict[str, Path] = {}
    for kind, folder in sources.items():
        if kind not in ARTEFACT_FILES:
            raise PublishError(f"unknown artefact kind {kind!r}; expected one of "
                               f"{sorted(ARTEFACT_FILES)}")
        for name in ARTEFACT_FILES[kind]:
            path = Path(folder) / name
            if not path.is_file():
                raise PublishError(f"artefact {kind}: {path} is missing")
            files[name] = path
    hashes = {name: hashlib.sha256(path.read_bytes()).hexdigest()
              for name, path in sorted(files.items())}
    manifest = bundle.manifest
    kept = {name: (bundle_folder / name).read_bytes() for name in _listed_artefacts(bundle)
            if name not in hashes}  # artefacts attached before (other kinds) stay listed
    listed = {**_listed_artefacts(bundle), **hashes}
    manifest.extras = {**manifest.extras, ARTEFACTS_KEY: dict(sorted(listed.items()))}
    # write_bundle swaps in a fresh folder (manifest + ONNX), so the files are copied after
    write_bundle(bundle_folder, bundle.onnx_path.read_bytes(), manifest)
    for name, data in kept.items():
        (bundle_folder / name).write_bytes(data)
    for name, path in files.items():
        shutil.copyfile(path, bundle_folder / name)
    return dict(sorted(listed.items()))


def listed_artefact_kinds(bundle: Bundle) -> list[str]:
    """Artefact kinds whose every file the bundle's manifest lists (and its folder holds)."""
    listed = bundle.manifest.extras.get(ARTEFACTS_KEY) or {}
    if not isinstance(listed, dict):
        return []
    return [kind for kind, names in ARTEFACT_FILES.items()
            if all(n in listed and (bundle.path / n).is_file() for n in names)]
