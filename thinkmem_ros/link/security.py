"""Keys, CURVE/ZAP client authentication, and Ed25519 signatures on model bundles.

Transport: CURVE encrypts every link, but CURVE alone accepts *any* client key; the ZAP
handler here (pyzmq's ``ThreadAuthenticator``, one per process Context) admits only the
configured client public keys and logs and counts every refusal, so an unauthorised robot
is visible on the server. The client side detects the refusal through socket-monitor
events (see ``transport``), because a refused CURVE client otherwise looks like a dead
server. CURVE is on by default for non-loopback endpoints (``curve_enabled``).

Identity: every allowed key is bound to exactly one robot id (``AllowList``), and ZAP
stamps each message with its sender's key (the ZeroMQ ``User-Id`` property), so the
receiver can refuse a key that speaks in another robot's name on every message, not only
at the handshake. The allow-list is one of:

* a folder of ``<robot_id>.key`` files (what ``thinkmem keys --robot ID`` writes into
  ``allowed/``): each file's key may speak only for the robot its file is named after;
* a TOML file mapping robot ids to keys, several keys per robot for a rotation::

      [robots]
      robot1 = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
      "dock.2" = ["old Z85 key...", "new Z85 key..."]

* one ``<robot_id>.key`` file (a fleet of one).

A key listed for two robot ids, a file name that is no valid robot id, or a malformed key
is refused at load with the file named. Without CURVE (loopback development) nothing is
authenticated: a robot id is whatever the peer says.

Key files use pyzmq's certificate format: ``NAME.key`` (public) and ``NAME.key_secret``
(public + secret, mode 0600). Signing keys are hex text: ``NAME.sign.pub`` and
``NAME.sign.key`` (the 32-byte Ed25519 seed, mode 0600).

Bundles: the consolidator signs the exact bytes of ``bundle.json`` (which carry the ONNX
file's sha256) with Ed25519 (PyNaCl) and writes the 64-byte detached signature to
``bundle.sig``; ``verify_signed_bundle`` checks the signature, then the ONNX hash.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import threading
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import nacl.exceptions
import nacl.signing
import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from thinkmem_ros.core.input_files import input_file, input_path
from thinkmem_ros.link.experience import ExperienceError, check_robot_id
from thinkmem_ros.policy.bundle import (
    MANIFEST,
    MAX_MANIFEST_BYTES,
    Bundle,
    BundleError,
    BundleManifest,
    load_bundle,
    parse_manifest,
    read_bundle_file,
)

log = logging.getLogger(__name__)

SIGNATURE_FILE = "bundle.sig"
SIGNATURE_BYTES = 64
"""Size of a detached Ed25519 signature: ``bundle.sig`` is read to this cap and no further."""
CURVE_MODES = ("auto", "on", "off")


class SecurityError(RuntimeError):
    """A key file is missing or malformed, or CURVE is required but not configured."""


class SignatureError(BundleError):
    """A bundle's signature is missing, malformed, or does not verify with the given key."""


# ----------------------------------------------------------------------------- CURVE keys

def _key_file(path: Path | str, what: str) -> None:
    """Refuse a key path that is a FIFO, a device or a folder, in one line.

    Why: reading a FIFO blocks until a writer comes, so a mistyped key path hung the
    command with no output; ``os.stat`` answers without opening it.
    """
    try:
        input_file(path, what)
    except ValueError as exc:
        raise SecurityError(f"{exc}") from None


def _secret_key_file(path: Path | str, what: str) -> None:
    """``_key_file``, and refuse a secret key others may write, in one line.

    Why: a .sign.key or .key_secret that group or others can write can be swapped for
    their own key (bundles signed by it, a server or robot identity taken over), and it
    was used without a word. ``thinkmem keys`` writes them 0600.
    """
    _key_file(path, what)
    try:
        mode = os.stat(path).st_mode
    except OSError:  # the read that follows names what is wrong
        return
    if mode & 0o022:
        who = " and ".join(w for w, bit in (("group", 0o020), ("others", 0o002)) if mode & bit)
        raise SecurityError(f"{path}: the {what} file is writable by {who} (mode "
                            f"{mode & 0o777:o}), so it could be replaced; make it 600 "
                            f"(chmod 600 {path})")


def write_curve_keypair(folder: Path | str, name: str) -> tuple[Path, Path]:
    """Create ``NAME.key`` (0644) and ``NAME.key_secret`` (0600); returns both paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    old = os.umask(0o077)  # the secret file is never world-readable, not even briefly
    try:
        public, secret = zmq.auth.create_certificates(str(folder), name)
    finally:
        os.umask(old)
    os.chmod(public, 0o644)
    os.chmod(secret, 0o600)
    return Path(public), Path(secret)


def load_curve_keypair(secret_file: Path | str) -> tuple[bytes, bytes]:
    """``(public, secret)`` Z85 keys from a ``.key_secret`` file."""
    _secret_key_file(secret_file, "CURVE key pair")
    try:
        public, secret = zmq.auth.load_certificate(str(secret_file))
    except (OSError, ValueError) as exc:
        raise SecurityError(f"{secret_file}: cannot read CURVE key pair: {exc}") from exc
    if not secret:
        raise SecurityError(f"{secret_file}: has no secret-key (pass the .key_secret file)")
    return public, secret


def load_curve_public(key_file: Path | str) -> bytes:
    """Read the Z85 public key from a ``.key`` or ``.key_secret`` file."""
    _key_file(key_file, "CURVE public key")
    try:
        public, _ = zmq.auth.load_certificate(str(key_file))
    except (OSError, ValueError) as exc:
        raise SecurityError(f"{key_file}: cannot read CURVE public key: {exc}") from exc
    return public


@dataclass(frozen=True)
class AllowList:
    """Client keys allowed to connect, each bound to the one robot id it may speak for."""

    robots: Mapping[bytes, str]  # Z85 public key -> robot id
    source: str = ""
    signature: tuple = field(default=(), compare=False)  # what the files looked like

    def robot_of(self, key: bytes | str | None) -> str | None:
        """Return the robot id ``key`` (Z85) is bound to, or None when it is not allowed."""
        if key is None:
            return None
        if isinstance(key, str):
            key = key.encode("ascii", "replace")
        return self.robots.get(key)


def load_allow_list(source: Path | str | Mapping[bytes, str] | AllowList) -> AllowList:
    """Read an allow-list: a folder of ``<robot_id>.key`` files, a TOML map, or one ``.key``.

    A mapping ``{Z85 key: robot id}`` is taken as it is (after the same checks). Raises
    ``SecurityError`` naming the file and entry for anything ambiguous or malformed.
    """
    if isinstance(source, AllowList):
        return source
    if isinstance(source, Mapping):
        robots: dict[bytes, str] = {}
        for key, robot in source.items():
            _bind(robots, _check_key(key, "allow-list"), robot, "allow-list")
        return AllowList(robots, "allow-list")
    if isinstance(source, (set, frozenset, list, tuple)):
        raise SecurityError("allowed client keys need robot ids: pass {key: robot_id}, a "
                            "folder of <robot_id>.key files or a TOML allow-list")
    path = Path(source)
    try:
        input_path(path, "allow-list")  # a FIFO "was not found", and blocked a reload
    except ValueError as exc:
        raise SecurityError(f"{exc}") from None
    signature = allow_list_signature(path)
    robots = {}
    if path.is_dir():
        for key_file in sorted(path.glob("*.key")):
            _bind(robots, load_curve_public(key_file), key_file.stem, str(key_file))
    elif path.is_file() and path.suffix == ".toml":
        robots = _load_toml(path)
    elif path.is_file():
        _bind(robots, load_curve_public(path), path.stem, str(path))
    else:
        raise SecurityError(f"allowed client keys not found: {path}")
    if not robots:
        raise SecurityError(f"{path}: no client public keys (*.key or [robots]) found")
    return AllowList(robots, str(path), signature)


def load_allowed_keys(source: Path | str | Mapping[bytes, str]) -> set[bytes]:
    """Client public keys allowed to connect (the keys of ``load_allow_list``)."""
    return set(load_allow_list(source).robots)


def allow_list_signature(source: Path | str) -> tuple:
    """What the allow-list's files look like now (names, sizes, mtimes): cheap to compare.

    The receiver polls this to notice an edit (a key added or revoked) without a restart.
    """
    path = Path(source)
    try:
        if path.is_dir():
            return tuple(sorted((p.name, st.st_size, st.st_mtime_ns, st.st_ino)
                                for p in path.glob("*.key")
                                for st in (p.stat(),)))
        st = path.stat()
        return ((path.name, st.st_size, st.st_mtime_ns, st.st_ino),)
    except OSError:  # gone, or a file vanished mid-listing: treat as changed
        return (("<unreadable>",),)


def write_allow_list(path: Path | str, robots: Mapping[str, bytes | list[bytes]]) -> Path:
    """Write a TOML allow-list ``{robot id: key or [keys]}`` atomically (0644)."""
    path = Path(path)
    lines = ["# thinkmem allow-list: the robot id each CURVE client key may speak for.",
             "# robot id = \"Z85 public key\"  or  robot id = [\"old key\", \"new key\"]",
             "[robots]"]
    for robot, keys in robots.items():
        check_robot_id(robot)
        keys = [keys] if isinstance(keys, bytes) else list(keys)
        quoted = [json.dumps(_check_key(k, str(path)).decode("ascii")) for k in keys]
        value = quoted[0] if len(quoted) == 1 else "[" + ", ".join(quoted) + "]"
        lines.append(f"{json.dumps(robot)} = {value}")
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.chmod(staging, 0o644)
    os.replace(staging, path)
    return path


def _load_toml(path: Path) -> dict[bytes, str]:
    _key_file(path, "allow-list")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SecurityError(f"{path}: cannot read allow-list: {exc}") from exc
    unknown = sorted(set(data) - {"robots"})
    if unknown:
        raise SecurityError(f"{path}: unknown top-level keys {unknown} (expected [robots])")
    table = data.get("robots", {})
    if not isinstance(table, dict):
        raise SecurityError(f"{path}: 'robots' must be a table of robot id = key(s)")
    robots: dict[bytes, str] = {}
    for robot, keys in table.items():
        where = f"{path} [robots] {robot!r}"
        if isinstance(keys, str):
            keys = [keys]
        if not isinstance(keys, list) or not keys:
            raise SecurityError(f"{where}: expected a Z85 key or a list of keys")
        for key in keys:
            _bind(robots, _check_key(key, where), robot, where)
    return robots


def _check_key(key: object, where: str) -> bytes:
    """A Z85 CURVE public key (40 characters that decode to 32 bytes), as bytes."""
    if isinstance(key, str):
        key = key.encode("ascii", "replace")
    if not isinstance(key, bytes) or len(key) != 40:
        raise SecurityError(f"{where}: {key!r} is no Z85 CURVE public key (40 characters)")
    try:
        z85.decode(key)
    except (ValueError, KeyError, TypeError) as exc:
        raise SecurityError(f"{where}: {key!r} is no Z85 CURVE public key") from exc
    return key


def _bind(robots: dict[bytes, str], key: bytes, robot: object, where: str) -> None:
    try:
        check_robot_id(robot)
    except ExperienceError as exc:
        raise SecurityError(f"{where}: {robot!r} is no valid robot id ({exc}); name key "
                            "files <robot_id>.key") from None
    other = robots.get(key)
    if other is not None and other != robot:
        raise SecurityError(f"{where}: the same key is listed for robots {other!r} and "
                            f"{robot!r}; a key may speak for one robot only")
    robots[key] = robot


def tcp_port_problem(endpoint: str) -> str | None:
    """What is wrong with a ``tcp://`` endpoint's port, or None (other schemes: None).

    ZeroMQ takes a port it cannot use (99999) as "any port" and binds a random one, so a
    typo would leave robots shipping to an address nobody listens on.
    """
    if not endpoint.startswith("tcp://"):
        return None
    port = endpoint.rsplit(":", 1)[-1] if endpoint.count(":") >= 2 else ""
    if port == "*":
        return None
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"the port must be 1-65535 or '*', got {port!r} in {endpoint!r}"
    return None


def is_loopback(endpoint: str) -> bool:
    """Tell whether an endpoint is local (ipc, inproc, 127.0.0.0/8, ::1, localhost)."""
    scheme = endpoint.split("://", 1)[0]
    if scheme in ("ipc", "inproc"):
        return True
    host = urlsplit(endpoint).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # an interface name, '*' or a DNS name: treat as exposed
        return False


def curve_enabled(mode: str, endpoint: str, have_keys: bool) -> bool:
    """Decide whether a socket uses CURVE; raises SecurityError when keys are missing.

    ``auto`` (default): on for non-loopback endpoints, and on loopback when keys are given;
    ``on``: always (keys required); ``off``: never (an explicit, logged opt-out).
    """
    if mode not in CURVE_MODES:
        raise ValueError(f"curve must be one of {CURVE_MODES}, got {mode!r}")
    if mode == "off":
        if not is_loopback(endpoint):
            log.warning("CURVE is off on non-loopback endpoint %s: traffic is plaintext",
                        endpoint)
        return False
    wanted = mode == "on" or not is_loopback(endpoint) or have_keys
    if wanted and not have_keys:
        raise SecurityError(
            f"CURVE is required for {endpoint} (curve={mode!r}) but no keys are configured; "
            "generate them with `thinkmem keys` or set curve='off' on loopback")
    return wanted


def curve_keys_problem(owner: str, mode: str, server_secret_file: object,
                       allowed_clients: object) -> str | None:
    """Why a server's CURVE settings contradict each other (None: they do not).

    ``owner`` names the config whose fields these are (``ConsolidatorConfig``), so a
    command can name its options. Why: CURVE authenticates only with both the server's
    key pair and the allow-list, and ``off`` turns it off whatever else was given, so a
    server key or allow-list passed with ``off`` (or one without the other, on loopback)
    ran unauthenticated, exit 0, with the allow-list the user passed not enforced.
    """
    given = [name for name, value in (("server_secret_file", server_secret_file),
                                      ("allowed_clients", allowed_clients))
             if value is not None]
    if given and mode == "off":
        named = " and ".join(f"{owner}.{name}" for name in given)
        return (f"{owner}.curve off contradicts {named}: with CURVE off no robot is "
                f"authenticated and no allow-list is enforced; drop "
                f"{'it' if len(given) == 1 else 'them'}, or keep CURVE on")
    if len(given) == 1:
        other = ({"server_secret_file", "allowed_clients"} - set(given)).pop()
        return (f"{owner}.{given[0]} needs {owner}.{other}: CURVE authenticates robots "
                f"with both the server's key pair and the allow-list")
    return None


class _AllowList:
    """ZAP credentials callback: admits the allow-list's keys, logs and counts refusals.

    ``allow`` is replaced as a whole when the allow-list file changes (one reference
    assignment, atomic for the ZAP thread), so a revoked key is refused at its next
    handshake.
    """

    def __init__(self, allow: AllowList, label: str) -> None:
        self.allow = allow
        self.label = label
        self.denied = 0
        self.allowed = 0

    @property
    def keys(self) -> set[bytes]:
        """The keys admitted now."""
        return set(self.allow.robots)

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.allow.robots:
            self.allowed += 1
            return True
        self.denied += 1
        log.warning("%s: REFUSED CURVE client with unauthorised key %s (domain %s, %d refused)",
                    self.label, key.decode("ascii", "replace"), domain, self.denied)
        return False


_AUTH_LOCK = threading.Lock()
_AUTHENTICATORS: dict[int, ThreadAuthenticator] = {}


def authorise_clients(context: zmq.Context, domain: str,
                      allow: AllowList | Mapping[bytes, str], label: str = "receiver"
                      ) -> _AllowList:
    """Register an allow-list for ZAP ``domain`` on the process's single authenticator.

    One ``ThreadAuthenticator`` serves the whole Context (ZAP binds one inproc endpoint per
    Context); each server socket uses its own domain, so several receivers can coexist.
    Each admitted message carries the client's Z85 key as its ``User-Id``.
    """
    allow = load_allow_list(allow)
    with _AUTH_LOCK:
        auth = _AUTHENTICATORS.get(id(context))
        if auth is None:
            auth = ThreadAuthenticator(context, log=logging.getLogger(f"{__name__}.zap"))
            auth.start()
            _AUTHENTICATORS[id(context)] = auth
        provider = _AllowList(allow, label)
        auth.configure_curve_callback(domain, credentials_provider=provider)
        return provider


def release_domain(context: zmq.Context, domain: str) -> None:
    """Forget a ZAP domain (clients connecting to it are then refused)."""
    with _AUTH_LOCK:
        auth = _AUTHENTICATORS.get(id(context))
        if auth is not None:
            auth.credentials_providers.pop(domain, None)


# ----------------------------------------------------------------------- bundle signatures

def write_signing_keypair(folder: Path | str, name: str) -> tuple[Path, Path]:
    """Create ``NAME.sign.pub`` (0644) and ``NAME.sign.key`` (0600, hex seed)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    key = nacl.signing.SigningKey.generate()
    public = folder / f"{name}.sign.pub"
    secret = folder / f"{name}.sign.key"
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(bytes(key).hex() + "\n")
    os.chmod(secret, 0o600)
    public.write_text(bytes(key.verify_key).hex() + "\n", encoding="ascii")
    os.chmod(public, 0o644)
    return public, secret


def load_signing_key(path: Path | str) -> nacl.signing.SigningKey:
    """Read the Ed25519 signing key from a ``.sign.key`` file.

    Both halves of a pair are 32 bytes of hex, so a public key passed by mistake would
    read as a valid (and unrelated) secret seed and sign bundles no robot trusts: a
    ``.pub`` file is refused by its name.
    """
    if Path(path).name.endswith(".pub"):
        raise SecurityError(f"{path}: this is a public key; sign with the matching secret "
                            f"key (NAME.sign.key)")
    _secret_key_file(path, "Ed25519 signing key")
    try:
        return nacl.signing.SigningKey(bytes.fromhex(Path(path).read_text().strip()))
    except (OSError, ValueError, nacl.exceptions.CryptoError) as exc:
        raise SecurityError(f"{path}: cannot read Ed25519 signing key: {exc}") from exc


def load_verify_key(key: nacl.signing.VerifyKey | bytes | str | Path) -> nacl.signing.VerifyKey:
    """Make a verify key from a VerifyKey, 32 raw bytes, a hex string, or a ``.sign.pub`` path."""
    if isinstance(key, nacl.signing.VerifyKey):
        return key
    try:
        if isinstance(key, bytes):
            return nacl.signing.VerifyKey(key)
        text = str(key)
        if isinstance(key, Path) or not _is_hex(text):
            _key_file(text, "Ed25519 public key")
            text = Path(text).read_text().strip()
        return nacl.signing.VerifyKey(bytes.fromhex(text))
    except (OSError, ValueError, TypeError, nacl.exceptions.CryptoError) as exc:
        raise SecurityError(f"cannot read Ed25519 public key {key!r}: {exc}") from exc


def sign_bundle(folder: Path | str, signing_key: nacl.signing.SigningKey | Path | str) -> Path:
    """Sign ``bundle.json``'s bytes and write the detached signature ``bundle.sig``."""
    folder = Path(folder)
    if not isinstance(signing_key, nacl.signing.SigningKey):
        signing_key = load_signing_key(signing_key)
    manifest = (folder / MANIFEST).read_bytes()
    signature = signing_key.sign(manifest).signature
    target = folder / SIGNATURE_FILE
    staging = folder / f".{SIGNATURE_FILE}.tmp"
    staging.write_bytes(signature)
    os.replace(staging, target)
    return target


def verify_bundle_signature(folder: Path | str,
                            public_key: nacl.signing.VerifyKey | bytes | str | Path
                            ) -> BundleManifest:
    """Check ``bundle.sig`` over ``bundle.json`` and parse the manifest from those bytes.

    Raises ``SignatureError`` with the reason when anything does not verify.
    """
    folder = Path(folder)
    verify_key = load_verify_key(public_key)
    manifest, signature = _signed_files(folder)
    if len(signature) != SIGNATURE_BYTES:
        raise SignatureError(f"{folder / SIGNATURE_FILE}: {len(signature)} bytes, expected "
                             f"{SIGNATURE_BYTES}")
    try:
        verify_key.verify(manifest, signature)
    except nacl.exceptions.BadSignatureError as exc:
        raise SignatureError(
            f"{folder}: bundle.json signature does not verify with the configured key "
            "(tampered manifest or wrong signer)") from exc
    try:  # the one reading every loader uses: a key given twice is refused, not last-wins
        return parse_manifest(manifest, source=str(folder / MANIFEST))
    except (BundleError, ValueError) as exc:
        raise SignatureError(f"{folder / MANIFEST}: signed but unparsable: {exc}") from exc


def _signed_files(folder: Path) -> tuple[bytes, bytes]:
    """``bundle.json`` and ``bundle.sig`` as bytes, each capped; SignatureError otherwise.

    Why: installed bundles are re-verified at every start and by the consolidator's
    ``Publisher.current``; a FIFO there blocked the start forever and a link to /dev/zero
    filled memory. ``read_bundle_file`` refuses special files without blocking and stops
    one byte past the cap, so such a bundle is refused in one line like any bad signature.
    """
    try:
        return (read_bundle_file(folder / MANIFEST, MAX_MANIFEST_BYTES),
                read_bundle_file(folder / SIGNATURE_FILE, SIGNATURE_BYTES))
    except OSError as exc:
        raise SignatureError(f"{folder}: cannot read manifest or signature: {exc}") from exc


def verify_signed_bundle(folder: Path | str,
                         public_key: nacl.signing.VerifyKey | bytes | str | Path) -> Bundle:
    """Signature first, then the ONNX hash; the hash must be the one that was signed."""
    signed = verify_bundle_signature(folder, public_key)
    bundle = load_bundle(folder)
    if bundle.manifest.sha256 != signed.sha256:
        raise SignatureError(f"{folder}: bundle.json changed while it was being verified")
    return bundle


def _is_hex(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdefABCDEF" for c in text)
