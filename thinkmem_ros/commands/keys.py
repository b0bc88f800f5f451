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
"""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

from thinkmem_ros.link.experience import ExperienceError, check_robot_id
from thinkmem_ros.link.security import write_curve_keypair, write_signing_keypair

HELP = "generate CURVE and signing key pairs and the robots' allow-list"
ALLOWED_DIR = "allowed"
_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]+")


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


def main(args: argparse.Namespace) -> int:
    """Write the requested key files and list them; exit code 2 on a refused overwrite."""
    out = Path(args.out)
    robots = getattr(args, "robot", None) or []
    names = args.name or ([] if robots else ["thinkmem"])
    sign_name = args.sign_name or (names[0] if names else "thinkmem")
    for name in [*names, sign_name]:
        if not _NAME_RE.fullmatch(name):
            raise SystemExit(f"--name {name!r}: use letters, digits, '_', '.', '-' only")
    for robot in robots:
        try:
            check_robot_id(robot)
        except ExperienceError as exc:
            raise SystemExit(f"--robot {robot!r}: not a valid robot id ({exc})") from None
        if not _NAME_RE.fullmatch(robot):
            raise SystemExit(f"--robot {robot!r}: use letters, digits, '_', '.', '-' only")
    pairs = [*names, *robots]
    planned = [out / f"{n}{suffix}" for n in pairs for suffix in (".key", ".key_secret")]
    planned += [out / ALLOWED_DIR / f"{r}.key" for r in robots]
    if not args.no_sign:
        planned += [out / f"{sign_name}.sign.pub", out / f"{sign_name}.sign.key"]
    existing = [str(p) for p in planned if p.exists()]
    if existing and not args.force:
        print(f"refusing to overwrite {existing} (use --force)")
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
