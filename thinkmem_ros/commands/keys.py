"""``thinkmem keys``: generate CURVE key pairs, the allow-list, and an Ed25519 signing pair.

Typical setup: ``thinkmem keys --out keys --name consolidator --robot robot1 --robot robot2``
on the consolidator host writes the consolidator's pair, one pair per robot, the signing
pair, and the allow-list ``keys/allowed/`` with ``robot1.key`` and ``robot2.key``: each
robot's public key, bound to the robot id its file is named after (the consolidator
refuses a key that sends in another robot's name). Pass ``--allow keys/allowed`` to the
consolidator; copy ``robot1.key_secret`` and ``consolidator.key`` to robot1 (whose
``robot_id`` must be ``robot1``) and ``consolidator.sign.pub`` to every robot. Revoke a
robot by deleting its file from ``allowed/``: the consolidator notices within a second.
Secret files are written with mode 0600; existing files are never overwritten unless
``--force`` is given, so a slip cannot lock robots out.

Rotating the bundle-signing key (robots keep their ``bundle_signing_public_key``)::

    thinkmem keys --rotate keys/consolidator.sign.key --out keys2 --sign-name signer2
    thinkmem keys --revoke keys/consolidator.sign.pub --signing-key keys2/signer2.sign.key \
        --out keys2

``--rotate`` writes the new pair, ``NEW.endorsement.json`` (the new public key endorsed by
the old key) and appends it to the key chain ``OUT/key_chain.json`` (``--chain`` names
another); run the consolidator with the new ``--signing-key`` and ``--endorsements
OUT/key_chain.json``. ``--revoke`` appends the old key's retirement, signed by the new
key, once every robot took a bundle of the new key. Serials grow by one per endorsement.
Every refusal is one line on stderr and exit code 1 (2 for a refused overwrite).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path

from thinkmem_ros.commands import check_output, one_line
from thinkmem_ros.core.input_files import input_file
from thinkmem_ros.link.experience import check_robot_ids
from thinkmem_ros.link.key_endorsement import (
    KeyEndorsement,
    check_chain,
    endorse,
    load_chain,
    public_hex,
    write_chain,
    write_json_atomic,
)
from thinkmem_ros.link.security import (
    SecurityError,
    load_signing_key,
    write_curve_keypair,
    write_signing_keypair,
)

HELP = "generate CURVE and signing key pairs and the robots' allow-list"
ALLOWED_DIR = "allowed"
CHAIN_FILE = "key_chain.json"
_NAME_RE = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]*")  # no leading '.': hidden files


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Output folder, key names, robot ids and the signing key's name."""
    parser.add_argument("--out", required=True, help="folder to write the key files into")
    parser.add_argument("--name", action="append", default=None,
                        help="CURVE key pair name, e.g. the consolidator (repeatable; "
                             "default: thinkmem when no --robot is given)")
    parser.add_argument("--robot", action="append", default=None,
                        help="robot id: writes its CURVE pair and adds its public key to "
                             f"OUT/{ALLOWED_DIR}/ROBOT.key, bound to that id (repeatable)")
    parser.add_argument("--sign-name", default=None,
                        help="Ed25519 signing pair name (default: the first --name)")
    parser.add_argument("--no-sign", action="store_true", help="skip the signing key pair")
    parser.add_argument("--force", action="store_true", help="overwrite existing key files")
    rotation = parser.add_argument_group("bundle-signing key rotation")
    rotation.add_argument("--rotate", metavar="OLD.sign.key", default=None,
                          help="write a new signing pair (--sign-name, default OLD's name "
                               "plus today's date) and its endorsement signed by OLD")
    rotation.add_argument("--revoke", metavar="OLD.sign.pub", default=None,
                          help="write the endorsement retiring OLD, signed by --signing-key")
    rotation.add_argument("--signing-key", metavar="NEW.sign.key", default=None,
                          help="with --revoke: the (new) key that signs the retirement")
    rotation.add_argument("--chain", default=None,
                          help=f"key chain file to extend (default OUT/{CHAIN_FILE})")
    rotation.add_argument("--serial", type=int, default=None,
                          help="endorsement serial (default: one above the chain's last)")


def main(args: argparse.Namespace) -> int:
    """Write the requested key files and list them; exit code 2 on a refused overwrite.

    An unreadable key or an --out that cannot be written (a file, /proc/x) is one line
    on stderr, exit 1, in either mode: never a traceback.
    """
    try:
        _out_folder(args.out)
        if getattr(args, "rotate", None) or getattr(args, "revoke", None):
            return _rotation(args)
        unused = [f"--{k.replace('_', '-')}" for k in ("signing_key", "chain", "serial")
                  if getattr(args, k, None) is not None]
        if unused:  # silently ignored, the user would believe a rotation happened
            raise _refusal(f"{', '.join(unused)} only with --rotate or "
                             f"--revoke")
        return _pairs(args)
    except (SecurityError, OSError) as exc:
        raise _refusal(f"{one_line(exc)}") from None


def _refusal(message: str) -> SystemExit:
    """The one-line exit of every refusal here, in the form argparse's own take."""
    return SystemExit(f"thinkmem keys: error: {message}")


def _out_folder(out: str) -> None:
    """Refuse an --out that cannot be the keys' folder before anything is read or written.

    A file there surfaced as mkdir's bare "[Errno 17] File exists", which names neither
    the option nor what is wrong.
    """
    if Path(out).is_symlink() and not Path(out).exists():
        raise _refusal(f"--out {out}: a symlink to nothing, not a folder")
    try:
        check_output(out, "--out", folder=True)
    except SystemExit as exc:
        raise _refusal(f"{exc.code}") from None


def _input(path: str | Path, option: str) -> str | Path:
    """``path`` unless it is a FIFO, device or socket: reading one would block forever."""
    try:
        input_file(path, option)
    except ValueError as exc:
        raise _refusal(f"{exc}") from None
    return path


def _check_pair_options(args: argparse.Namespace, names: list[str], robots: list[str]) -> None:
    """Refuse options that contradict each other, or ask for one pair twice.

    Each was silently resolved before: --sign-name was dropped under --no-sign, and a
    repeated name (or one given as --name and --robot) wrote and listed the same pair twice.
    """
    if args.no_sign and args.sign_name:
        raise _refusal(f"--sign-name {args.sign_name} names the signing pair "
                         "that --no-sign skips; give one of them")
    for option, values in (("--name", names), ("--robot", robots)):
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise _refusal(f"{option} {', '.join(twice)} given more than once")
    both = sorted(set(names) & set(robots))
    if both:
        raise _refusal(f"{', '.join(both)} given as both --name and --robot; "
                         "give a robot's pair once, as --robot (which also allow-lists it)")


def _pairs(args: argparse.Namespace) -> int:
    """CURVE pairs for --name and --robot, the robots' allow-list and the signing pair."""
    out = Path(args.out)
    robots = getattr(args, "robot", None) or []
    names = args.name or ([] if robots else ["thinkmem"])
    _check_pair_options(args, names, robots)
    sign_name = args.sign_name or (names[0] if names else "thinkmem")
    for name in [*names, sign_name]:
        if not _NAME_RE.fullmatch(name):
            raise SystemExit(f"--name {name!r}: use letters, digits, '_', '.', '-' only, "
                             "not starting with '.'")
    try:
        check_robot_ids(robots, "--robot")
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    for robot in robots:
        if not _NAME_RE.fullmatch(robot):
            raise SystemExit(f"--robot {robot!r}: use letters, digits, '_', '.', '-' only, "
                             "not starting with '.'")
    pairs = [*names, *robots]
    planned = [out / f"{n}{suffix}" for n in pairs for suffix in (".key", ".key_secret")]
    planned += [out / ALLOWED_DIR / f"{r}.key" for r in robots]
    if not args.no_sign:
        planned += [out / f"{sign_name}.sign.pub", out / f"{sign_name}.sign.key"]
    if _refused(planned, args.force):
        return 2
    written: list[Path] = []
    for name in pairs:
        written += write_curve_keypair(out, name)
    for robot in robots:  # the allow-list entry: this key may speak for this robot only
        (out / ALLOWED_DIR).mkdir(parents=True, exist_ok=True)
        entry = out / ALLOWED_DIR / f"{robot}.key"
        shutil.copyfile(out / f"{robot}.key", entry)
        entry.chmod(0o644)
        written.append(entry)
    if not args.no_sign:
        written += write_signing_keypair(out, sign_name)
    for path in written:
        print(f"{oct(path.stat().st_mode & 0o777)} {path}")
    return 0


# ------------------------------------------------------------------ key rotation

def _rotation(args: argparse.Namespace) -> int:
    """``--rotate`` or ``--revoke``: one endorsement, appended to the key chain."""
    if args.rotate and args.revoke:
        raise _refusal("--rotate and --revoke are separate steps; give one")
    if getattr(args, "name", None) or getattr(args, "robot", None):
        raise _refusal("--name/--robot make CURVE pairs; not with "
                         "--rotate/--revoke")
    if getattr(args, "no_sign", False):
        raise _refusal("--no-sign skips the signing pair; --rotate and "
                         "--revoke are about signing keys")
    if args.revoke and args.sign_name:
        raise _refusal("--sign-name names the pair --rotate writes; --revoke "
                         "writes none")
    for option in ("rotate", "revoke", "signing_key"):
        if getattr(args, option, None):
            _input(getattr(args, option), f"--{option.replace('_', '-')}")
    out = Path(args.out)
    chain_path = Path(_input(args.chain, "--chain") if args.chain
                      else _input(out / CHAIN_FILE, "key chain"))
    chain = load_chain(chain_path) if chain_path.exists() else []
    if args.chain and not chain_path.exists():
        raise _refusal(f"--chain {chain_path}: no such file")
    if chain:
        check_chain(chain)  # a broken chain on disk must not be extended
    serial = _serial(args.serial, chain)
    if args.rotate:
        if args.signing_key:
            raise _refusal("--signing-key goes with --revoke (--rotate signs "
                             "with the OLD key it is given)")
        old = load_signing_key(args.rotate)
        _require_trusted(public_hex(old), chain, chain_path, "--rotate")
        name = args.sign_name or _next_name(Path(args.rotate))
        if not _NAME_RE.fullmatch(name):
            raise _refusal(f"--sign-name {name!r}: use letters, digits, "
                             "'_', '.', '-' only, not starting with '.'")
        single = out / f"{name}.endorsement.json"
        planned = [out / f"{name}.sign.pub", out / f"{name}.sign.key", single]
        if _refused(planned, args.force):
            return 2
        written = list(write_signing_keypair(out, name))
        new = load_signing_key(out / f"{name}.sign.key")
        endorsement = endorse(old, new.verify_key, "add", serial)
    else:
        if not args.signing_key:
            raise _refusal("--revoke needs --signing-key NEW.sign.key (the "
                             "key that stays trusted)")
        if str(args.revoke).endswith(".sign.key"):
            raise _refusal(f"--revoke {args.revoke}: pass the public key "
                             "(.sign.pub), not the secret one")
        if not chain:
            raise _refusal(f"no key chain at {chain_path}: --revoke extends "
                             "the chain that --rotate wrote (or give --chain)")
        retired = public_hex(Path(args.revoke))
        signer = load_signing_key(args.signing_key)
        _require_trusted(public_hex(signer), chain, chain_path, "--signing-key")
        single = out / f"{Path(args.revoke).name.removesuffix('.sign.pub')}.revoke.json"
        if _refused([single], args.force):
            return 2
        written = []
        endorsement = endorse(signer, retired, "revoke", serial)
    grown = [*chain, endorsement]
    check_chain(grown)  # e.g. a revoke that would leave no key is refused here, not on robots
    out.mkdir(parents=True, exist_ok=True)
    written.append(write_json_atomic(single, endorsement.to_dict()))
    written.append(write_chain(chain_path, grown))
    for path in written:
        print(f"{oct(path.stat().st_mode & 0o777)} {path}")
    print(f"endorsement {endorsement.describe()}; key chain {chain_path} now holds "
          f"{len(grown)} endorsement(s)")
    return 0


def _serial(requested: int | None, chain: list[KeyEndorsement]) -> int:
    last = max((e.serial for e in chain), default=0)
    if requested is None:
        return last + 1
    if requested <= last:
        raise _refusal(f"--serial {requested} must be above the chain's last "
                         f"serial {last} (robots refuse replays)")
    return requested


def _require_trusted(key_hex: str, chain: list[KeyEndorsement], chain_path: Path,
                     option: str) -> None:
    """The signer must be trusted where the chain ends (or be its first key)."""
    if not chain:
        return
    trusted = check_chain(chain).keys
    if key_hex not in trusted:
        raise _refusal(f"{option} key {key_hex[:16]}.. is not trusted at the "
                         f"end of {chain_path} (trusted: {[k[:16] + '..' for k in trusted]})")


def _next_name(old: Path) -> str:
    base = re.sub(r"-\d{8}$", "", old.name.removesuffix(".sign.key"))
    return f"{base}-{datetime.now(UTC):%Y%m%d}"


def _refused(planned: list[Path], force: bool) -> bool:
    existing = [str(p) for p in planned if p.exists()]
    if existing and not force:
        print(f"thinkmem keys: error: refusing to overwrite {existing} (use --force)",
              file=sys.stderr)
        return True
    return False
