"""``thinkmem keys``: generate CURVE key pairs and an Ed25519 bundle-signing key pair.

Typical setup: ``thinkmem keys --out keys --name consolidator --name robot1`` on the
consolidator host, then copy ``robot1.key_secret`` and ``consolidator.key`` to the robot,
``consolidator.sign.pub`` to every robot, and put ``robot1.key`` into the consolidator's
allowed-clients folder. Secret files are written with mode 0600; existing files are never
overwritten unless ``--force`` is given, so a slip cannot lock robots out.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from thinkmem_ros.link.security import write_curve_keypair, write_signing_keypair

HELP = "generate CURVE and signing key pairs"
_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]+")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Output folder, key names and the signing key's name."""
    parser.add_argument("--out", required=True, help="folder to write the key files into")
    parser.add_argument("--name", action="append", default=None,
                        help="CURVE key pair name (repeatable; default: thinkmem)")
    parser.add_argument("--sign-name", default=None,
                        help="Ed25519 signing pair name (default: the first --name)")
    parser.add_argument("--no-sign", action="store_true", help="skip the signing key pair")
    parser.add_argument("--force", action="store_true", help="overwrite existing key files")


def main(args: argparse.Namespace) -> int:
    """Write the requested key files and list them; exit code 2 on a refused overwrite."""
    out = Path(args.out)
    names = args.name or ["thinkmem"]
    sign_name = args.sign_name or names[0]
    for name in [*names, sign_name]:
        if not _NAME_RE.fullmatch(name):
            raise SystemExit(f"--name {name!r}: use letters, digits, '_', '.', '-' only")
    planned = [out / f"{n}{suffix}" for n in names for suffix in (".key", ".key_secret")]
    if not args.no_sign:
        planned += [out / f"{sign_name}.sign.pub", out / f"{sign_name}.sign.key"]
    existing = [str(p) for p in planned if p.exists()]
    if existing and not args.force:
        print(f"refusing to overwrite {existing} (use --force)")
        return 2
    written: list[Path] = []
    for name in names:
        written += write_curve_keypair(out, name)
    if not args.no_sign:
        written += write_signing_keypair(out, sign_name)
    for path in written:
        print(f"{oct(path.stat().st_mode & 0o777)} {path}")
    return 0
