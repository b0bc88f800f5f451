"""Key endorsements: signed statements that change which Ed25519 keys may sign bundles.

A robot starts trusting exactly one bundle-signing key (``bundle_signing_public_key``).
To rotate that key without touching every robot, the holder of a trusted key signs a
small JSON document, an *endorsement*::

    {"format": 1, "action": "add", "key": "<new public key, hex>", "serial": 1,
     "issued": "2026-12-01T04:00:00+00:00", "signer": "<public key, hex>",
     "signature": "<Ed25519 signature, hex>"}

``action`` is ``add`` (trust ``key`` from now on) or ``revoke`` (stop trusting it). The
signature covers every other field, serialised canonically (sorted keys, no spaces) and
prefixed with ``DOMAIN``, so the same Ed25519 key can sign bundles and endorsements without
one ever passing for the other (a bundle signature is over ``bundle.json``, which cannot
start with that prefix). ``signer`` names the key that signed, so a verifier picks it
from its trust list instead of trying every key.

A ``TrustList`` (the keys and the serial of the last endorsement applied) changes only
through ``TrustList.apply``, which accepts an endorsement when

1. it is well formed (format 1, known fields only, hex keys of the right length);
2. its ``serial`` is higher than the last one applied (no replay, no rollback);
3. its ``signer`` is trusted now and the signature verifies with it;
4. a revoke leaves at least one key trusted (revoking a key that is not trusted changes
   nothing but still uses up the serial; adding a trusted key likewise).

A *key chain* is the list of endorsements from the fleet's first key to the key that
signs now, in serial order; the consolidator ships it inside every bundle manifest it
signs (``extras.endorsements``, see ``consolidator/publish.py``) and the robot applies it
before it checks the bundle's signature. Endorsements are self-authenticating: each is
trusted for its own signature, never for the bundle signature around it (which, for the
first bundle of a new key, the robot could not check yet).

Chain files (``thinkmem keys --rotate/--revoke`` write them) hold
``{"format": 1, "endorsements": [...]}``; ``load_chain`` also reads one endorsement.
This module is shared wire code: it imports neither the robot nor the consolidator.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import nacl.exceptions
import nacl.signing

from thinkmem_ros.core.input_files import input_file
from thinkmem_ros.link.security import (
    SecurityError,
    SignatureError,
    load_verify_key,
    verify_signed_bundle,
)
from thinkmem_ros.policy.bundle import Bundle, unique_keys_object

ENDORSEMENT_FORMAT = 1
CHAIN_FORMAT = 1
ACTIONS = ("add", "revoke")
DOMAIN = b"thinkmem-key-endorsement\n"
"""Prefix of the signed bytes: an endorsement signature is never a bundle signature."""
ENDORSEMENTS_KEY = "endorsements"
"""Manifest ``extras`` key holding the key chain a bundle travels with."""
MAX_CHAIN = 256
"""Most endorsements one chain may hold (a rotation a year needs two)."""
MAX_CHAIN_FILE_BYTES = 1 << 20
_FIELDS = ("format", "action", "key", "serial", "issued", "signer", "signature")


class EndorsementError(SecurityError):
    """An endorsement or chain is malformed, or cannot be applied (``kind`` says why).

    Kinds: ``malformed``, ``stale`` (serial not above the last applied), ``untrusted``
    (signer not trusted), ``signature`` (does not verify), ``revoke`` (would leave no key
    trusted).
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def public_hex(key: nacl.signing.VerifyKey | nacl.signing.SigningKey | bytes | str | Path
               ) -> str:
    """The 64-hex-digit form of a public key (from a key object, raw bytes, hex or a file)."""
    if isinstance(key, nacl.signing.SigningKey):
        key = key.verify_key
    return bytes(load_verify_key(key)).hex()


@dataclass(frozen=True)
class KeyEndorsement:
    """One signed add/revoke statement about a public key (fields as in the JSON)."""

    action: str
    key: str  # hex public key the statement is about
    serial: int
    issued: str
    signer: str  # hex public key that signed
    signature: str  # hex, 64 bytes
    format: int = ENDORSEMENT_FORMAT

    def body(self) -> dict:
        """Every field except the signature: what is signed."""
        return {"format": self.format, "action": self.action, "key": self.key,
                "serial": self.serial, "issued": self.issued, "signer": self.signer}

    def signed_bytes(self) -> bytes:
        """``DOMAIN`` + canonical JSON of ``body()``: the exact bytes the signature covers."""
        return DOMAIN + _canonical(self.body())

    def to_dict(self) -> dict:
        """The JSON document (body plus signature)."""
        return {**self.body(), "signature": self.signature}

    @property
    def digest(self) -> str:
        """sha256 of the whole canonical document: tells a re-sent endorsement from another."""
        return hashlib.sha256(_canonical(self.to_dict())).hexdigest()

    def describe(self) -> str:
        """Short human form for logs: ``#3 revoke 1a2b3c4d.. by 5e6f7a8b..``."""
        return f"#{self.serial} {self.action} {self.key[:8]}.. by {self.signer[:8]}.."

    @classmethod
    def from_dict(cls, data: object, source: str = "endorsement") -> KeyEndorsement:
        """Parse strictly (no signature check yet); EndorsementError('malformed') naming it."""
        if not isinstance(data, dict):
            raise EndorsementError("malformed", f"{source}: expected a JSON object, got "
                                                f"{type(data).__name__}")
        keys = set(map(str, data))
        if keys != set(_FIELDS):
            extra, missing = sorted(keys - set(_FIELDS)), sorted(set(_FIELDS) - keys)
            raise EndorsementError("malformed", f"{source}: fields {sorted(keys)}; missing "
                                                f"{missing}, unknown {extra}")
        if data["format"] != ENDORSEMENT_FORMAT or type(data["format"]) is not int:
            raise EndorsementError("malformed", f"{source}: format {data['format']!r} is not "
                                                f"supported (this reads {ENDORSEMENT_FORMAT})")
        if data["action"] not in ACTIONS:
            raise EndorsementError("malformed", f"{source}: action {data['action']!r} is not "
                                                f"one of {list(ACTIONS)}")
        if type(data["serial"]) is not int or data["serial"] < 1:
            raise EndorsementError("malformed", f"{source}: serial {data['serial']!r} must be "
                                                "an integer >= 1")
        if not isinstance(data["issued"], str) or len(data["issued"]) > 64:
            raise EndorsementError("malformed", f"{source}: issued must be an ISO time string")
        for name, length in (("key", 64), ("signer", 64), ("signature", 128)):
            if not _is_hex(data[name], length):
                raise EndorsementError("malformed", f"{source}: {name} must be {length} hex "
                                                    f"digits, got {str(data[name])[:80]!r}")
        return cls(action=data["action"], key=data["key"].lower(), serial=data["serial"],
                   issued=data["issued"], signer=data["signer"].lower(),
                   signature=data["signature"].lower())


def endorse(signing_key: nacl.signing.SigningKey, key: object, action: str, serial: int,
            issued: str | None = None) -> KeyEndorsement:
    """Sign an ``action`` ("add"/"revoke") about ``key`` with ``signing_key``."""
    if action not in ACTIONS:
        raise ValueError(f"action must be one of {list(ACTIONS)}, got {action!r}")
    if isinstance(serial, bool) or not isinstance(serial, int) or serial < 1:
        raise ValueError(f"serial must be an integer >= 1, got {serial!r}")
    issued = issued or datetime.now(UTC).isoformat(timespec="seconds")
    unsigned = KeyEndorsement(action, public_hex(key), serial, issued,
                              public_hex(signing_key), "0" * 128)
    signature = signing_key.sign(unsigned.signed_bytes()).signature.hex()
    return KeyEndorsement(action, unsigned.key, serial, issued, unsigned.signer, signature)


def verify_endorsement(endorsement: KeyEndorsement, trusted: Iterable[str]) -> None:
    """Raise EndorsementError unless the signer is in ``trusted`` (hex) and it verifies."""
    if endorsement.signer not in set(trusted):
        raise EndorsementError("untrusted", f"endorsement {endorsement.describe()}: signer "
                                            f"{endorsement.signer[:16]}.. is not a trusted key")
    try:
        nacl.signing.VerifyKey(bytes.fromhex(endorsement.signer)).verify(
            endorsement.signed_bytes(), bytes.fromhex(endorsement.signature))
    except (nacl.exceptions.BadSignatureError, ValueError) as exc:
        raise EndorsementError("signature", f"endorsement {endorsement.describe()}: signature "
                                            "does not verify (tampered or forged)") from exc


@dataclass(frozen=True)
class TrustList:
    """The keys trusted to sign bundles (hex, in the order they were added) and the serial."""

    keys: tuple[str, ...]
    serial: int = 0
    applied: tuple[tuple[int, str], ...] = field(default=())  # (serial, digest) history

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("TrustList.keys must name at least one key")
        if any(not _is_hex(k, 64) for k in self.keys):
            raise ValueError(f"TrustList.keys must be 64-hex-digit keys, got {self.keys!r}")
        if isinstance(self.serial, bool) or not isinstance(self.serial, int) or self.serial < 0:
            raise ValueError(f"TrustList.serial must be an integer >= 0, got {self.serial!r}")

    @classmethod
    def starting_with(cls, key: object) -> TrustList:
        """A list of one key (the configured one) before any endorsement."""
        return cls((public_hex(key),))

    def verify_keys(self) -> tuple[nacl.signing.VerifyKey, ...]:
        """The trusted keys as PyNaCl verify keys."""
        return tuple(nacl.signing.VerifyKey(bytes.fromhex(k)) for k in self.keys)

    def was_applied(self, endorsement: KeyEndorsement) -> bool:
        """Whether exactly this endorsement was applied before (a chain re-sent, not a replay)."""
        return (endorsement.serial, endorsement.digest) in self.applied

    def apply(self, endorsement: KeyEndorsement) -> TrustList:
        """Return the list after ``endorsement``; EndorsementError (with ``kind``) if refused."""
        if endorsement.serial <= self.serial:
            raise EndorsementError("stale", f"endorsement {endorsement.describe()}: serial "
                                            f"{endorsement.serial} is not above the last "
                                            f"applied {self.serial} (replay or rollback)")
        verify_endorsement(endorsement, self.keys)
        keys = list(self.keys)
        if endorsement.action == "add":
            if endorsement.key not in keys:
                keys.append(endorsement.key)
        elif endorsement.key in keys:  # revoking an untrusted key: nothing to remove
            keys.remove(endorsement.key)
            if not keys:
                raise EndorsementError("revoke", f"endorsement {endorsement.describe()}: "
                                                 "would leave no trusted key")
        return TrustList(tuple(keys), endorsement.serial,
                         (*self.applied, (endorsement.serial, endorsement.digest)))


def parse_chain(items: object, source: str = "chain") -> list[KeyEndorsement]:
    """A list of endorsement dicts as KeyEndorsements, sorted by serial; strict."""
    if not isinstance(items, list):
        raise EndorsementError("malformed", f"{source}: expected a list of endorsements, got "
                                            f"{type(items).__name__}")
    if len(items) > MAX_CHAIN:
        raise EndorsementError("malformed", f"{source}: {len(items)} endorsements exceed "
                                            f"{MAX_CHAIN}")
    chain = [KeyEndorsement.from_dict(item, f"{source}[{i}]") for i, item in enumerate(items)]
    serials = [e.serial for e in chain]
    if len(set(serials)) != len(serials):
        raise EndorsementError("malformed", f"{source}: serials {serials} repeat")
    return sorted(chain, key=lambda e: e.serial)


def check_chain(chain: Sequence[KeyEndorsement], root: object | None = None) -> TrustList:
    """Apply a whole chain from ``root`` (default: the first endorsement's signer).

    Returns the trust list at its end, or raises EndorsementError naming the first
    endorsement that does not follow: a chain that a robot trusting ``root`` would refuse.
    """
    if not chain:
        raise EndorsementError("malformed", "the key chain is empty")
    chain = sorted(chain, key=lambda e: e.serial)
    trust = TrustList.starting_with(root if root is not None else chain[0].signer)
    for endorsement in chain:
        trust = trust.apply(endorsement)
    return trust


def load_chain(path: Path | str) -> list[KeyEndorsement]:
    """Read a chain file (``{"format": 1, "endorsements": [...]}``) or one endorsement."""
    path = Path(path)
    try:
        input_file(path, "key chain")  # a FIFO blocked the read forever
    except ValueError as exc:
        raise EndorsementError("malformed", f"{exc}") from None
    try:
        if path.stat().st_size > MAX_CHAIN_FILE_BYTES:
            raise EndorsementError("malformed", f"{path}: larger than {MAX_CHAIN_FILE_BYTES} "
                                                "bytes")
        data = json.loads(path.read_text(encoding="utf-8"),
                          object_pairs_hook=unique_keys_object)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise EndorsementError("malformed", f"{path}: cannot read key chain: {reason}") from None
    if isinstance(data, dict) and "endorsements" in data:
        if data.get("format") != CHAIN_FORMAT or set(data) != {"format", "endorsements"}:
            raise EndorsementError("malformed", f"{path}: a chain file holds exactly "
                                                f"{{'format': {CHAIN_FORMAT}, "
                                                "'endorsements': [...]}")
        return parse_chain(data["endorsements"], str(path))
    return [KeyEndorsement.from_dict(data, str(path))]


def write_json_atomic(path: Path | str, data: object, mode: int = 0o644) -> Path:
    """Write JSON to ``path`` via a synced temporary file and ``os.replace`` (crash-safe)."""
    path = Path(path)
    staging = path.with_name(f".{path.name}.tmp")
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(staging, mode)
    os.replace(staging, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:  # the rename itself must survive a power cut
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def write_chain(path: Path | str, chain: Sequence[KeyEndorsement]) -> Path:
    """Write a chain file atomically, endorsements in serial order."""
    ordered = sorted(chain, key=lambda e: e.serial)
    return write_json_atomic(path, {"format": CHAIN_FORMAT,
                                    "endorsements": [e.to_dict() for e in ordered]})


def verify_bundle_with_any(folder: Path | str, keys: Sequence[nacl.signing.VerifyKey]
                           ) -> Bundle:
    """``verify_signed_bundle`` with the first of ``keys`` whose signature verifies.

    A signature failure tries the next key; anything else (the ONNX hash, a missing file)
    is the bundle's own fault and raised at once. SignatureError when no key verifies.
    """
    if not keys:
        raise SignatureError(f"{folder}: no trusted signing key")
    for key in keys:
        try:
            return verify_signed_bundle(folder, key)
        except SignatureError as exc:
            last = exc
            if not isinstance(exc.__cause__, nacl.exceptions.BadSignatureError):
                raise  # unreadable or short signature, unparsable manifest: no key helps
    raise SignatureError(f"{folder}: bundle.json signature does not verify with any of the "
                         f"{len(keys)} trusted key(s) (tampered manifest or untrusted "
                         "signer)") from last


def _canonical(data: dict) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=True).encode("ascii")


def _is_hex(value: object, length: int) -> bool:
    return (isinstance(value, str) and len(value) == length
            and all(c in "0123456789abcdefABCDEF" for c in value))
