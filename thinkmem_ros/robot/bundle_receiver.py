"""Robot side of the model push: accept a pushed bundle only when it is verified and newer.

The consolidator pushes ``BUNDLE_PUSH`` frames (``protocol.bundle_push``) over the
shipper's connection. Whatever arrives is untrusted: a push is installed only when

1. the body has exactly the expected fields and types and fits ``max_bytes``;
2. it is signed (an empty signature is refused as *unsigned*);
3. with ``pin_version`` set, its version is the pinned one (else *pinned*);
4. the Ed25519 signature over ``bundle.json`` verifies with a key of the robot's trust
   list (``robot/trust_store``: the configured public key until key endorsements change
   it). The key chain the manifest carries in ``extras.endorsements`` is applied to the
   trust list first, each endorsement on its own signature, so the first bundle signed by
   a rotated key verifies on a robot that knew only the old key;
5. the ONNX bytes hash to the sha256 the signed manifest names;
6. the signed ``model_version`` equals the frame's and is strictly higher than the version
   running (no rollback, no replay); an exact replay of the running bundle is ignored;
7. the value/memctl artefacts (``artefacts`` field) are exactly the files the signed
   manifest lists in ``extras.artefacts`` ({file: sha256}), each with that sha256: a
   listed file that is missing or differs, or a file that is not listed, refuses the whole
   push (``rejected_artefact``), so the node never runs a policy with a value table it was
   not signed with. Artefacts are written only after they are verified.

Files are staged in a hidden folder under ``bundles_dir``, verified there, then renamed to
``bundles_dir/v<version>`` and the ``current`` link is swapped with ``os.replace``, so a
crash never leaves a half-written bundle under a visible name. Only then is the
``on_install`` callback (the node's hot-swap) handed the folder. Every refusal is logged
with its reason and counted (``stats()`` for ``/diagnostics``); the running bundle is
never touched by a refused push. No torch here: this runs on the robot.

Power loss or a failing disk can damage ``current`` or the folder it names. The receiver
then stands on the newest ``v<version>`` folder that is still intact (one ERROR line), and
its rollback floor never drops below the highest version folder name on disk
(``installed_floor``), so a damaged file cannot reopen the door to a replayed older push.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from thinkmem_ros.link.protocol import (
    MAX_BUNDLE_BYTES,
    ProtocolError,
    check_artefact_name,
    check_artefacts,
)
from thinkmem_ros.link.security import (
    SIGNATURE_FILE,
    SignatureError,
    load_verify_key,
)
from thinkmem_ros.link.sockets import RateLimitedLog
from thinkmem_ros.policy.bundle import (
    MANIFEST,
    ONNX_FILE,
    Bundle,
    BundleError,
    fsync_dir,
    load_bundle,
)
from thinkmem_ros.robot.trust_store import TrustStore, TrustStoreConfig, log_outcome

log = logging.getLogger(__name__)

CURRENT_LINK = "current"
_VERSION_DIR = re.compile(r"v(\d{6,})")
_FIELDS = {"version": int, "manifest": bytes, "onnx": bytes, "signature": bytes}
_OPTIONAL = "artefacts"  # {file: bytes}; absent in frames from older consolidators
ARTEFACTS_KEY = "artefacts"  # manifest extras key (thinking_gates.ARTEFACTS_KEY, no import:
# thinking_gates pulls in the value/memctl stack, which the receiver does not need)
REJECT_REASONS = ("malformed", "unsigned", "pinned", "signature", "hash", "version",
                  "artefact", "install")
"""Counter names of the refusal kinds (``rejected_<reason>`` in ``stats()``)."""


class PushRejected(Exception):
    """A pushed bundle was refused; ``kind`` is one of ``REJECT_REASONS``."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind


@dataclass
class BundleReceiverConfig:
    """Where verified bundles go and whose signature they need."""

    bundles_dir: Path | str
    public_key: Path | str | bytes  # the consolidator's Ed25519 ``.sign.pub`` (or raw/hex)
    current_version: int = 0  # version the node runs now (its shipped bundle's)
    current_sha256: str = ""
    keep: int = 3  # installed versions kept on disk (older ones pruned)
    max_bytes: int = MAX_BUNDLE_BYTES  # the most one push can carry, as the publisher checks
    pin_version: int = 0  # > 0: refuse every push of another version (0 = off)

    def __post_init__(self) -> None:
        self.bundles_dir = Path(self.bundles_dir)
        if isinstance(self.current_version, bool) or not isinstance(self.current_version, int) \
                or self.current_version < 0:
            raise ValueError(f"BundleReceiverConfig.current_version must be an int >= 0, "
                             f"got {self.current_version!r}")
        if self.keep < 1:
            raise ValueError(f"BundleReceiverConfig.keep must be >= 1, got {self.keep}")
        if self.max_bytes <= 0:
            raise ValueError(f"BundleReceiverConfig.max_bytes must be > 0, got {self.max_bytes}")
        if isinstance(self.pin_version, bool) or not isinstance(self.pin_version, int) \
                or self.pin_version < 0:
            raise ValueError(f"BundleReceiverConfig.pin_version must be an int >= 0, "
                             f"got {self.pin_version!r}")
        self.verify_key = load_verify_key(self.public_key)  # fail at startup, not at push


@dataclass
class _Counters:
    pushes: int = 0
    accepted: int = 0
    replayed: int = 0
    callback_errors: int = 0
    endorsements: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("applied", "refused", "untrusted", "stale"), 0))
    rejected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REJECT_REASONS, 0))


class BundleReceiver:
    """Verifies and installs pushed bundles; plug ``handle_push`` into the shipper.

    Usage on the robot::

        receiver = BundleReceiver(BundleReceiverConfig(dir, pub_key, current_version=v),
                                  on_install=hot_swapper.request)   # gets the folder Path
        ShipperConfig(..., on_bundle_push=receiver.handle_push)
        receiver.stats()   # counters and the last refusal reason for /diagnostics
    """

    def __init__(self, config: BundleReceiverConfig,
                 on_install: Callable[[Path], object] | None = None,
                 check: Callable[[Path], object] | None = None) -> None:
        self.config = config
        self.on_install = on_install
        # Loads the verified staging folder as the robot would before it is installed: a
        # signed graph that fails its test inference must not move the version floor (the
        # robot would keep its bundle, and a fixed push of the same version be refused).
        self.check = check
        self._lock = threading.Lock()
        self._counters = _Counters()
        self._refusal_log = RateLimitedLog(log, 100)  # a flood of bad pushes: first, every 100th
        self.last_reason = ""
        self.bundles_dir: Path = config.bundles_dir
        self.bundles_dir.mkdir(parents=True, exist_ok=True)
        self._clean_staging()
        # the keys pushes may be signed with: the configured one until endorsements say
        # otherwise (a corrupt trust file raises ValueError: the node refuses to start)
        self.trust = TrustStore(TrustStoreConfig(self.bundles_dir, config.verify_key))
        self.version = config.current_version
        self.sha256 = config.current_sha256
        installed = self._installed_bundle()
        if installed is not None and installed.version > self.version:
            self.version, self.sha256 = installed.version, installed.manifest.sha256
        # survive restarts and damage: never accept below what was ever installed here
        self.floor = max(self.version, installed_floor(self.bundles_dir))

    # ---- API
    def installed(self) -> Path | None:
        """Return the bundle this receiver stands on (``bundles_dir/current``), or None.

        When ``current`` is lost or damaged (power loss, a failing disk), the newest intact
        ``v<version>`` folder is what was last installed and can still run; an unreadable
        file (EIO) counts as damage, so it never stops the node from starting.
        """
        bundle = self._installed_bundle()
        return None if bundle is None else bundle.path

    def set_running(self, version: int, sha256: str = "") -> None:
        """Tell the receiver what the node runs (e.g. after a manual bundle change)."""
        with self._lock:
            self.version, self.sha256 = version, sha256

    def handle_push(self, body: dict) -> Path | None:
        """Verify and install one BUNDLE_PUSH body; returns the installed folder or None."""
        with self._lock:
            self._counters.pushes += 1
            try:
                path = self._install(body)
            except PushRejected as exc:
                self._counters.rejected[exc.kind] += 1
                self.last_reason = f"{exc.kind}: {exc}"
                self._refusal_log(logging.WARNING, "REFUSED pushed bundle (%s): %s; keeping v%d",
                                  exc.kind, exc, self.version)
                return None
            if path is None:
                return None
            self._counters.accepted += 1
            self.last_reason = f"accepted: v{self.version}"  # an old refusal no longer applies
        log.info("installed pushed bundle v%d at %s", self.version, path)
        if self.on_install is not None:
            try:
                self.on_install(path)
            except Exception:  # the node's swap failing must not break the shipper thread
                self._counters.callback_errors += 1
                log.exception("on_install callback failed for %s", path)
        return path

    def stats(self) -> dict[str, int | str]:
        """Counters for ``/diagnostics``: pushes, accepted, replayed, rejected_<reason>."""
        c = self._counters
        out: dict[str, int | str] = {"pushes": c.pushes, "accepted": c.accepted,
                                     "replayed": c.replayed,
                                     "callback_errors": c.callback_errors,
                                     "running_version": self.version,
                                     "last_reason": self.last_reason,
                                     "trusted_keys": len(self.trust.trust.keys),
                                     "trust_serial": self.trust.serial}
        out.update({f"rejected_{k}": v for k, v in c.rejected.items()})
        out.update({f"endorsements_{k}": v for k, v in c.endorsements.items()})
        return out

    # ---- steps
    def _installed_bundle(self) -> Bundle | None:
        bundle, problem = intact_installed(self.bundles_dir, load_bundle)
        if problem:
            instead = (f"standing on v{bundle.version} ({bundle.path}), the newest intact one"
                       if bundle is not None else "no intact installed bundle is left")
            log.error("installed bundle %s %s; %s", self.bundles_dir / CURRENT_LINK, problem,
                      instead)
        return bundle

    def _install(self, body: dict) -> Path | None:
        version, manifest, onnx, signature, artefacts = _check_body(body,
                                                                    self.config.max_bytes)
        if not signature:
            raise PushRejected("unsigned", f"bundle v{version} carries no signature")
        self._apply_endorsements(manifest)
        pin = self.config.pin_version
        if pin and version != pin:
            raise PushRejected("pinned", f"v{version} is not the pinned v{pin} "
                                         "(pin_bundle_version)")
        sha = hashlib.sha256(onnx).hexdigest()
        if version == self.version and sha == self.sha256:
            self._counters.replayed += 1
            self.last_reason = f"replay: v{version} is already running"
            log.info("ignored a replay of the running bundle v%d", version)
            return None
        if version <= self.version:  # cheap check first; re-checked on the signed manifest
            raise PushRejected("version", f"v{version} is not newer than the running "
                                          f"v{self.version} (rollback/replay)")
        if version < self.floor:  # the newest install was damaged: only it may come back
            raise PushRejected("version", f"v{version} is older than v{self.floor}, installed "
                                          f"here before (rollback/replay)")
        staging: Path | None = None
        try:  # a full or failing disk is a counted refusal, never an escaping OSError
            staging = Path(tempfile.mkdtemp(prefix=".incoming-", dir=self.bundles_dir))
            for name, data in ((MANIFEST, manifest), (ONNX_FILE, onnx),
                               (SIGNATURE_FILE, signature)):
                _write_synced(staging / name, data)
            bundle = _verify(staging, self.trust)
            signed = bundle.manifest.model_version
            if signed != version:
                raise PushRejected("version", f"frame says v{version} but the signed "
                                              f"manifest says v{signed}")
            for name in _check_artefacts(artefacts, bundle.manifest.extras, version):
                _write_synced(staging / name, artefacts[name])
            self._check_runs(staging, version)
            target = self._publish(staging, version)
        except OSError as exc:
            raise PushRejected("install", f"cannot stage v{version} under "
                                          f"{self.bundles_dir}: {exc}") from exc
        finally:
            if staging is not None and staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        self.version, self.sha256 = version, bundle.manifest.sha256
        self.floor = max(self.floor, version)
        try:
            self._prune()
        except OSError as exc:  # installed and linked already: pruning can wait
            log.warning("cannot prune old bundles in %s: %s", self.bundles_dir, exc)
        return target

    def _check_runs(self, staging: Path, version: int) -> None:
        """Refuse a verified bundle that cannot run here (``check`` raised), in one line."""
        if self.check is None:
            return
        try:
            self.check(staging)
        except Exception as exc:  # noqa: BLE001 - whatever the loader raises refuses the push
            text = " ".join(str(exc).replace(str(staging), "<push>").split())[:300]
            raise PushRejected("malformed", f"v{version} cannot run here: {text}") from None

    def _apply_endorsements(self, manifest: bytes) -> None:
        """Apply the manifest's key chain to the trust list before its signature is checked.

        Each endorsement is verified on its own signature against the keys trusted now, so
        an untrusted manifest cannot smuggle a key in; a chain the robot already applied is
        a no-op. A refused endorsement does not refuse the push: the bundle's signature
        then decides, against the list as it stands.
        """
        try:
            outcome = self.trust.apply_manifest(manifest)
        except OSError as exc:  # the new list could not be saved: nothing changed
            raise PushRejected("install", f"cannot save the trust list "
                                          f"{self.trust.path}: {exc}") from exc
        counts = self._counters.endorsements
        counts["applied"] += len(outcome.applied)
        counts["refused"] += len(outcome.refused)
        counts["untrusted"] += len(outcome.untrusted)
        counts["stale"] += len(outcome.stale)
        log_outcome(outcome, log)

    def _publish(self, staging: Path, version: int) -> Path:
        target = self.bundles_dir / f"v{version:06d}"
        try:
            if target.exists():  # left by a crash before the link moved, or damaged
                shutil.rmtree(target)
            fsync_dir(staging)  # the entries first: after power loss v<N> is whole or absent
            staging.rename(target)
            fsync_dir(self.bundles_dir)
            aside = point_current(self.bundles_dir, target.name)
        except OSError as exc:
            raise PushRejected("install", f"cannot install v{version}: {exc}") from exc
        if aside is not None:
            log.warning("%s was not a link: moved it to %s", self.bundles_dir / CURRENT_LINK,
                        aside.name)
        return target

    def _prune(self) -> None:
        versions = [(n, p) for n, p in version_folders(self.bundles_dir) if p.is_dir()]
        for number, path in versions[self.config.keep:]:
            if number != self.version:
                shutil.rmtree(path, ignore_errors=True)

    def _clean_staging(self) -> None:
        for path in self.bundles_dir.glob(".incoming-*"):  # a crash mid-push left these
            shutil.rmtree(path, ignore_errors=True)


def version_folders(bundles_dir: Path) -> list[tuple[int, Path]]:
    """The ``v<version>`` entries of ``bundles_dir``, newest first (none when unreadable)."""
    try:
        entries = list(bundles_dir.iterdir())
    except OSError:
        return []
    return sorted(((int(m.group(1)), p) for p in entries
                   if (m := _VERSION_DIR.fullmatch(p.name))), reverse=True)


def installed_floor(bundles_dir: Path) -> int:
    """The highest version ever installed here: the rollback floor after a restart.

    Taken from the version folder names, not from a file of its own: a name is written by
    the same synced rename that installs the bundle, so it is exactly as durable as the
    install, and damage to the files inside (a truncated graph, a NUL-filled manifest)
    cannot lower it. A floor file would be one more file a power cut can damage, and a
    damaged one would have to fall back to something else anyway; pruning never removes
    the highest version, so the names always hold it.
    """
    return max((number for number, _ in version_folders(bundles_dir)), default=0)


def intact_installed(bundles_dir: Path, check: Callable[[Path], Bundle]
                     ) -> tuple[Bundle | None, str]:
    """The bundle ``current`` names, else the newest version folder ``check`` accepts.

    ``check`` verifies a folder (raising BundleError, OSError or ValueError when it must
    not run). Returns the bundle and, when ``current`` itself failed, what was wrong with
    it in a few words ('' when it passed, or when nothing was ever installed here).
    """
    link = bundles_dir / CURRENT_LINK
    versions = version_folders(bundles_dir)
    if not os.path.lexists(link) and not versions:
        return None, ""
    problem, failed = _link_problem(link), None
    if not problem:
        failed = link.resolve()
        try:
            return check(failed), ""
        except OSError as exc:
            problem = f"is unreadable: {exc}"
        except (BundleError, ValueError) as exc:
            problem = f"does not verify: {exc}"
    root = bundles_dir.resolve()
    for _, folder in versions:
        if root / folder.name == failed:
            continue  # refused above already
        try:
            return check(root / folder.name), problem
        except (BundleError, OSError, ValueError):
            continue
    return None, problem


def _link_problem(link: Path) -> str:
    if not os.path.lexists(link):
        return "is missing"
    if link.is_symlink() and not link.exists():
        return f"points to {os.readlink(link)}, which is missing"
    if not link.is_dir():
        return "is not a link to a bundle folder"
    return ""


def point_current(bundles_dir: Path, target: str) -> Path | None:
    """Point ``current`` at the folder ``target`` atomically; returns where a non-link went.

    ``os.replace`` cannot put a link over a directory, so a ``current`` that became a real
    folder (a backup restored by a copy that followed links) would refuse every install.
    Whatever is there and is not a link is renamed aside, never deleted: it was not made
    here. None when ``current`` was a link or absent.
    """
    link = bundles_dir / CURRENT_LINK
    aside = _move_aside(link) if os.path.lexists(link) and not link.is_symlink() else None
    link_tmp = bundles_dir / f".{CURRENT_LINK}.tmp"
    if link_tmp.is_dir() and not link_tmp.is_symlink():
        _move_aside(link_tmp)
    elif os.path.lexists(link_tmp):
        link_tmp.unlink()
    os.symlink(target, link_tmp)
    os.replace(link_tmp, link)
    fsync_dir(bundles_dir)
    return aside


def _move_aside(path: Path) -> Path:
    aside = path.with_name(f"{path.name.lstrip('.')}.moved-{time.strftime('%Y%m%dT%H%M%S')}")
    while os.path.lexists(aside):  # rename() would replace an empty folder silently
        aside = aside.with_name(aside.name + "+")
    path.rename(aside)
    return aside


def _check_body(body: object, max_bytes: int
                ) -> tuple[int, bytes, bytes, bytes, dict[str, bytes]]:
    if not isinstance(body, dict):
        raise PushRejected("malformed", f"body is a {type(body).__name__}, not a map")
    if set(body) - {_OPTIONAL} != set(_FIELDS):
        raise PushRejected("malformed", f"fields {sorted(map(str, body))}, expected "
                                        f"{sorted(_FIELDS)} (+ optional {_OPTIONAL!r})")
    for name, kind in _FIELDS.items():
        if type(body[name]) is not kind:
            raise PushRejected("malformed", f"{name}: expected {kind.__name__}, got "
                                            f"{type(body[name]).__name__}")
    try:  # names that could escape the bundle folder are refused before anything is written
        artefacts = check_artefacts(body.get(_OPTIONAL, {}))
    except ProtocolError as exc:
        raise PushRejected("artefact", str(exc)) from exc
    size = sum(len(body[n]) for n in ("manifest", "onnx", "signature"))
    size += sum(len(data) for data in artefacts.values())
    if size > max_bytes:
        raise PushRejected("malformed", f"{size} bytes exceed max_bytes {max_bytes}")
    if body["version"] < 1:
        raise PushRejected("malformed", f"version {body['version']} < 1")
    return body["version"], body["manifest"], body["onnx"], body["signature"], artefacts


def _check_artefacts(artefacts: dict[str, bytes], extras: dict, version: int) -> list[str]:
    """Return the artefact names to write once they match the signed manifest exactly."""
    listed = extras.get(ARTEFACTS_KEY) or {}
    if not isinstance(listed, dict):
        raise PushRejected("artefact", f"v{version}: signed extras.{ARTEFACTS_KEY} is a "
                                       f"{type(listed).__name__}, not a map")
    try:  # the manifest is signed, but a name in it must still be safe to create here
        for name in listed:
            check_artefact_name(name)
    except ProtocolError as exc:
        raise PushRejected("artefact", f"v{version}: signed manifest lists {exc}") from exc
    if unlisted := sorted(set(artefacts) - set(listed)):
        raise PushRejected("artefact", f"v{version}: {unlisted} not listed in the signed "
                                       f"manifest's extras.{ARTEFACTS_KEY}")
    if missing := sorted(set(listed) - set(artefacts)):
        raise PushRejected("artefact", f"v{version}: listed artefacts {missing} were not "
                                       f"pushed")
    for name, want in sorted(listed.items()):
        got = hashlib.sha256(artefacts[name]).hexdigest()
        if got != str(want).lower():
            raise PushRejected("artefact", f"v{version}: {name} sha256 {got[:12]} does not "
                                           f"match the signed manifest's {str(want)[:12]}")
    return sorted(listed)


def _verify(folder: Path, trust: TrustStore) -> object:
    try:
        return trust.verify_bundle(folder)
    except SignatureError as exc:
        raise PushRejected("signature", str(exc)) from exc
    except BundleError as exc:  # signature fine, but the ONNX bytes are not the signed ones
        kind = "hash" if "sha256" in str(exc) else "malformed"
        raise PushRejected(kind, str(exc)) from exc


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())

