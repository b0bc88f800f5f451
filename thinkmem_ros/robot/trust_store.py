"""The robot's trusted bundle-signing keys: a file next to the installed bundles.

A robot is configured with one key (``bundle_signing_public_key``); the consolidator's key
may later be rotated by key endorsements (``link/key_endorsement``) that travel inside
pushed bundle manifests. ``TrustStore`` keeps the resulting trust list in
``bundles_dir/trusted_signing_keys.json``:

* while the file does not exist, the list is the configured key alone (serial 0);
* it changes only through ``apply_chain``, and is written atomically (synced temporary
  file, ``os.replace``, synced folder) *before* the new list is used, so a crash leaves
  either the old or the new list;
* once it exists, the file wins over ``bundle_signing_public_key``: a revoked key must
  not come back because the parameter file still names it. Deleting the file starts
  over from the configured key (the way to re-flash a robot by hand).

A chain is applied in serial order; each endorsement is

* **known**: exactly this one was applied before (every push re-sends the whole chain);
* **stale**: its serial is not above the last applied one (a replay, a rollback, or
  history from before this robot's key): never applied;
* **untrusted**: its signer is not trusted (yet): not applied, the rest still considered,
  so a robot flashed with a newer key skips the chain's older links;
* **refused**: malformed, a signature that does not verify, or a revoke that would leave
  no key: not applied, and nothing after it in that chain is (a later endorsement must
  never overtake a refused one and make it stale);
* **applied**.

A corrupt trust file raises ``TrustStoreError`` (a ValueError, so the node refuses to
start naming the file) instead of silently falling back to the configured key, which
might be one that was revoked. A file that is well formed but cannot be this robot's own
list is refused with one ERROR line and the configured key alone is trusted (the next
applied endorsement rewrites the file): a symlink or a file group or others may write
(anyone could list their own key), and a state no applied endorsements lead to from the
configured key (``_unreachable``). No torch here: this runs on the robot.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import nacl.signing

from thinkmem_ros.link.key_endorsement import (
    ENDORSEMENTS_KEY,
    MAX_CHAIN_FILE_BYTES,
    EndorsementError,
    KeyEndorsement,
    TrustList,
    parse_chain,
    public_hex,
    verify_bundle_with_any,
    write_json_atomic,
)
from thinkmem_ros.link.security import SecurityError
from thinkmem_ros.policy.bundle import (
    MAX_MANIFEST_BYTES,
    Bundle,
    read_bundle_file,
    unique_keys_object,
)

log = logging.getLogger(__name__)
_REFUSALS_SAID: set[tuple[str, str]] = set()
"""Trust-file refusals already logged by this process: each is said once, not per read."""

TRUST_FILE = "trusted_signing_keys.json"
STORE_FORMAT = 1


class TrustStoreError(ValueError):
    """The trust file is unreadable or malformed, or the configured key is no key."""


@dataclass
class TrustStoreConfig:
    """Where the trust file lives and the key trusted before any endorsement."""

    folder: Path | str  # the robot's bundles_dir
    initial_key: nacl.signing.VerifyKey | bytes | str | Path  # bundle_signing_public_key

    def __post_init__(self) -> None:
        self.folder = Path(self.folder)
        try:
            self.initial_hex = public_hex(self.initial_key)
        except SecurityError as exc:
            raise ValueError(f"TrustStoreConfig.initial_key: {exc}") from None


@dataclass
class ChainOutcome:
    """What one chain did to the trust list (reasons are one line each, for the log)."""

    applied: list[KeyEndorsement] = field(default_factory=list)
    known: int = 0
    stale: list[str] = field(default_factory=list)
    untrusted: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


class TrustStore:
    """The trust list of one robot, loaded from (and saved to) ``folder/TRUST_FILE``."""

    def __init__(self, config: TrustStoreConfig) -> None:
        self.config = config
        self.path: Path = config.folder / TRUST_FILE
        self.refused = ""  # why the trust file was not used ('' when it was, or is absent)
        self.trust = self._load()
        if config.initial_hex not in self.trust.keys:
            log.warning("bundle_signing_public_key %s.. is not in the trust list %s (rotated "
                        "away by endorsement #%d); pushes verify against the list's %d "
                        "key(s). Delete the file to start over from the configured key",
                        config.initial_hex[:16], self.path, self.trust.serial,
                        len(self.trust.keys))

    # ---- reading
    @property
    def keys(self) -> tuple[nacl.signing.VerifyKey, ...]:
        """The keys a bundle signature may verify with now."""
        return self.trust.verify_keys()

    @property
    def serial(self) -> int:
        """Serial of the last endorsement applied (0 = none)."""
        return self.trust.serial

    def verify_bundle(self, folder: Path | str) -> Bundle:
        """Verify a bundle folder's signature with any trusted key, then its ONNX hash."""
        return verify_bundle_with_any(folder, self.keys)

    # ---- changing
    def apply_manifest(self, manifest: bytes) -> ChainOutcome:
        """Apply the chain in an (unverified) manifest's ``extras.endorsements``, if any.

        The manifest is not trusted here: each endorsement is checked on its own signature
        (that is what lets the first bundle of a new key carry the key's endorsement).
        Unparsable manifests carry no chain; the signature check refuses them later.
        """
        if len(manifest) > MAX_MANIFEST_BYTES:
            return ChainOutcome()
        try:
            data = json.loads(manifest)
        except (ValueError, RecursionError):
            return ChainOutcome()
        extras = data.get("extras") if isinstance(data, dict) else None
        if not isinstance(extras, dict) or ENDORSEMENTS_KEY not in extras:
            return ChainOutcome()
        return self.apply_chain(extras[ENDORSEMENTS_KEY], f"extras.{ENDORSEMENTS_KEY}")

    def apply_chain(self, items: object, source: str = "key chain") -> ChainOutcome:
        """Apply a list of endorsement dicts (see the module doc); saves before it returns.

        Raises OSError when the new list cannot be written (then nothing changed).
        """
        outcome = ChainOutcome()
        try:
            chain = parse_chain(items, source)
        except EndorsementError as exc:
            outcome.refused.append(str(exc))
            return outcome
        trust = self.trust
        for endorsement in chain:
            if trust.was_applied(endorsement):
                outcome.known += 1
                continue
            try:
                trust = trust.apply(endorsement)
            except EndorsementError as exc:
                if exc.kind == "stale":
                    outcome.stale.append(str(exc))
                    continue
                if exc.kind == "untrusted":
                    outcome.untrusted.append(str(exc))
                    continue
                outcome.refused.append(str(exc))
                break  # nothing may overtake a refused endorsement (it would turn stale)
            outcome.applied.append(endorsement)
        if outcome.applied:
            self._save(trust)
            self.trust = trust
        return outcome

    # ---- the file
    def _load(self) -> TrustList:
        """The saved list; the configured key alone when there is none or it is refused."""
        try:
            mode = os.lstat(self.path).st_mode
        except FileNotFoundError:
            return TrustList.starting_with(self.config.initial_hex)
        except OSError as exc:
            raise TrustStoreError(f"trust list {self.path}: cannot read: {exc}{_HINT}") from None
        problem = _unsafe(self.path, mode)
        if problem:
            return self._refuse(problem)
        data, trust = self._read()
        problem = _unreachable(data, trust, self.config.initial_hex)
        if problem:
            return self._refuse(f"{self.path}: {problem}")
        return trust

    def _read(self) -> tuple[dict, TrustList]:
        """Parse the file; TrustStoreError naming it when it is unreadable or malformed."""
        where = f"trust list {self.path}"
        try:  # capped, no special files: a FIFO here blocked the start, /dev/zero filled memory
            data = json.loads(read_bundle_file(self.path, MAX_CHAIN_FILE_BYTES).decode("utf-8"),
                              object_pairs_hook=unique_keys_object)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise TrustStoreError(f"{where}: cannot read: {exc}{_HINT}") from None
        except RecursionError:  # damage or a hostile file, not a bug: one line, no traceback
            raise TrustStoreError(f"{where}: cannot read: JSON nested too deeply{_HINT}") from None
        if not isinstance(data, dict) or data.get("format") != STORE_FORMAT:
            raise TrustStoreError(f"{where}: not a format-{STORE_FORMAT} trust list{_HINT}")
        try:
            applied = tuple((int(serial), str(digest))
                            for serial, digest in data.get("applied", []))
            return data, TrustList(tuple(str(k).lower() for k in data["keys"]), data["serial"],
                                   applied)
        except (KeyError, TypeError, ValueError) as exc:
            raise TrustStoreError(f"{where}: malformed: {exc}{_HINT}") from None

    def _refuse(self, problem: str) -> TrustList:
        """Trust the configured key alone and say so once, instead of refusing to start.

        Why not raise as for a corrupt file: this file was not damaged but cannot be ours,
        and the configured key is the one trust that does not come from it. A push whose
        chain applies rewrites the file (a regular 0644 file, replacing a link).
        """
        self.refused = problem
        said = (problem, self.config.initial_hex)
        if said not in _REFUSALS_SAID:  # the node reads the list afresh at start and per swap
            _REFUSALS_SAID.add(said)
            log.error("REFUSED trust list %s; trusting only bundle_signing_public_key %s.. "
                      "until an endorsement is applied", problem, self.config.initial_hex[:16])
        return TrustList.starting_with(self.config.initial_hex)

    def _save(self, trust: TrustList) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path, {
            "format": STORE_FORMAT, "keys": list(trust.keys), "serial": trust.serial,
            "applied": [list(pair) for pair in trust.applied],
            "configured_key": self.config.initial_hex,
            "updated": datetime.now(UTC).isoformat(timespec="seconds")})


_HINT = "; delete it to start over from bundle_signing_public_key (this trusts that key again)"


def _unsafe(path: Path, mode: int) -> str:
    """Why the trust file's kind or mode lets others choose the trusted keys ('' if not).

    Why: whoever can write the file, or the file a symlink names, decides which keys sign
    the bundles this robot runs, with no endorsement at all. ``_save`` writes it 0644.
    """
    if stat.S_ISLNK(mode):
        return (f"{path}: the trust list is a symlink (to {_link_target(path)!r}), so "
                f"whoever controls its target chooses the signing keys; replace it with a "
                f"file or delete it")
    if mode & 0o022:
        who = " and ".join(w for w, bit in (("group", 0o020), ("others", 0o002)) if mode & bit)
        return (f"{path}: the trust list file is writable by {who} (mode {mode & 0o777:o}), "
                f"so it could be replaced; make it 644 (chmod 644 {path})")
    return ""


def _link_target(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:  # replaced since the lstat: the message still says it was a link
        return "?"


def _unreachable(data: dict, trust: TrustList, initial_hex: str) -> str:
    """Why no applied endorsements lead from the configured key to ``trust`` ('' if some may).

    The file records the key it started from, the keys, the serial and the (serial,
    digest) of each endorsement applied, not the endorsements themselves, so this checks
    what those allow: the same starting key; with serial 0 (none applied) that key alone;
    otherwise applied serials that rise to ``serial`` and no more keys than one per
    endorsement. Why: a serial-0 list naming another key replaced the configured key
    without any endorsement, and the only sign was a warning that it had been rotated away.
    """
    started = data.get("configured_key")
    if not isinstance(started, str):
        return "it does not record the key it was started from (configured_key)"
    if started.lower() != initial_hex:
        return (f"it was started from key {started[:16]}.., not from "
                f"bundle_signing_public_key {initial_hex[:16]}..")
    if trust.serial == 0:
        if trust.keys != (initial_hex,) or trust.applied:
            return (f"with serial 0 (no endorsement applied) it must list "
                    f"bundle_signing_public_key alone, but lists {len(trust.keys)} key(s) "
                    f"and {len(trust.applied)} applied endorsement(s)")
        return ""
    serials = [serial for serial, _ in trust.applied]
    if (not serials or serials[0] < 1 or serials[-1] != trust.serial
            or any(b <= a for a, b in zip(serials, serials[1:], strict=False))):
        return (f"its applied endorsement serials {serials[:8]} do not rise to its serial "
                f"{trust.serial}")
    if len(set(trust.keys)) != len(trust.keys) or len(trust.keys) > 1 + len(serials):
        return (f"it lists {len(trust.keys)} key(s) after {len(serials)} endorsement(s); "
                f"each adds at most one new key")
    return ""


def log_outcome(outcome: ChainOutcome, logger: logging.Logger | None = None) -> None:
    """One log line per endorsement that did something or was turned away."""
    logger = logger or log
    for endorsement in outcome.applied:
        logger.info("applied key endorsement %s: bundles now verify against the updated "
                    "trust list", endorsement.describe())
    for reason in outcome.refused:
        logger.warning("REFUSED key endorsement: %s", reason)
    for reason in outcome.untrusted:
        logger.info("skipped key endorsement: %s", reason)
    for reason in outcome.stale:
        logger.info("skipped key endorsement: %s", reason)
