"""Where installed data lives, so the same code works from a venv, colcon or a checkout."""

from __future__ import annotations

import os
import sys
from pathlib import Path

PACKAGE = "thinkmem_ros"


def share_dirs() -> list[Path]:
    """Candidate ``share/thinkmem_ros`` folders, most specific first.

    Order: every prefix on ``AMENT_PREFIX_PATH`` (a ROS install or overlay), then this
    interpreter's prefix (a pip install into a venv), then the source checkout itself.
    """
    prefixes = [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    prefixes.append(sys.prefix)
    dirs = [Path(prefix) / "share" / PACKAGE for prefix in prefixes]
    dirs.append(Path(__file__).resolve().parents[2])  # checkout root
    return dirs


def find_data(relative: str) -> Path:
    """First existing ``relative`` path under the share dirs; the error lists where it looked."""
    tried = []
    for base in share_dirs():
        candidate = base / relative
        if candidate.exists():
            return candidate
        tried.append(str(candidate))
    raise FileNotFoundError(f"{relative} not found; looked in: {', '.join(tried)}")


def default_bundle() -> Path:
    """The shipped default model bundle (``models/default``)."""
    return find_data("models/default")


def window_bundle() -> Path:
    """The shipped window-form bundle ``models/window`` (the default before the streaming one).

    Kept so format-1 bundles stay exercised and benchmarked beside the default.
    """
    return find_data("models/window")


def resolve_bundle_path(path: str | Path) -> Path:
    """'' -> the shipped default bundle; anything else as given (made absolute)."""
    return default_bundle() if str(path) == "" else Path(path).expanduser().resolve()


def default_params() -> Path:
    """The shipped default parameter file (``config/thinkmem.yaml``)."""
    return find_data("config/thinkmem.yaml")
