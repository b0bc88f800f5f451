"""The folders the demo replaces under ``--out``, and the one rule for deleting any of them.

Each run starts its bags, keys, consolidator store and node state afresh (a stale signed
v2 or store must not be reused), so it deletes what the previous run left there. It used
to ``rm -rf`` ``<out>/keys``, ``consolidator`` and ``node_state`` whatever they held:
``--out .`` in a folder holding a user's key pairs, allow-list and signing key (made by
``thinkmem keys --out keys``) or a consolidator store destroyed them without a word.

The rule: the demo deletes only a folder it made itself, marked by a ``.thinkmem-demo``
file it writes into the folder when it makes it, or an empty one (nothing to lose). Any
other folder, file or symlink at one of those names is refused in one line naming it,
before any step has run; the user moves it away or picks another ``--out``. A folder of
a demo older than this rule carries no mark: it is taken as the demo's own when ``--out``
holds that demo's ``summary.json`` (so ``make demo`` after an upgrade does not stop on the
folder the previous ``make demo`` left), and refused like any other folder otherwise.

The files the demo writes into ``--out`` itself (``OUTPUT_FILES``) follow the same rule:
written over only where ``--out`` carries the mark (the first step puts it there) or an
earlier demo's summary.json.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path

from thinkmem_ros.demo.steps import DemoContext, Step

MARKER = ".thinkmem-demo"
MARKER_TEXT = ("made by thinkmem demo: a later demo run with the same --out deletes this "
               "folder and makes it afresh\n")


def _not_replaceable(path: Path) -> str | None:
    """Why the demo must not delete ``path`` (None: absent, empty, or marked as its own)."""
    if path.is_symlink():
        return "is a symlink"
    if not path.exists():
        return None
    if not path.is_dir():
        return "is not a folder"
    if ((path / MARKER).is_file() or not any(path.iterdir())
            or _demo_summary(path.parent / "summary.json")):  # a demo's from before the mark
        return None
    return f"was not made by thinkmem demo (no {MARKER} in it)"


def _demo_summary(path: Path) -> bool:
    """Whether ``path`` is a summary.json a demo run wrote."""
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and {"mode", "steps", "bundle"} <= summary.keys()


OUT_MARKER_TEXT = ("used by thinkmem demo as --out: a later demo run writes its summary.json, "
                   "timeline.png, before_after.png and node.log here again\n")
OUTPUT_FILES = ("summary.json", "timeline.png", "before_after.png", "node.log")
"""Files the demo writes straight into ``--out`` (the same names every run)."""


def _not_overwritable(path: Path) -> str | None:
    """Why the demo must not write over the file ``path`` (None: absent or the demo's).

    The demo's own: ``--out`` carries the mark (a run made or used it) or an earlier demo's
    summary.json (a run from before the mark). A user's ``summary.json`` or ``node.log`` in
    a folder given as ``--out`` used to be overwritten without a word.
    """
    if path.is_symlink():
        return "is a symlink"
    if not path.exists():
        return None
    if not path.is_file():
        return "is not a file"
    out = path.parent
    if (out / MARKER).is_file() or _demo_summary(out / "summary.json"):
        return None
    return f"was not written by thinkmem demo (no {MARKER} in {out})"


def check_replaceable(path: Path) -> None:
    """ValueError naming ``path`` when the demo may not delete it (see the module's rule)."""
    why = _not_replaceable(path)
    if why:
        raise ValueError(f"{path} {why}; the demo would delete it to start afresh: move it "
                         "away or pick another --out")


def remove_own(path: Path) -> None:
    """Delete ``path`` if the demo made it; refuse (ValueError) anything else there."""
    check_replaceable(path)
    if path.exists():
        shutil.rmtree(path)  # a real, marked folder: symlinks inside are unlinked, not followed


def mark(path: Path) -> Path:
    """Mark ``path`` (a folder the demo just made) as the demo's own to replace next run."""
    (path / MARKER).write_text(MARKER_TEXT, encoding="utf-8")
    return path


def fresh_folder(path: Path) -> Path:
    """An empty, marked folder at ``path``, replacing the demo's previous one."""
    remove_own(path)
    path.mkdir(parents=True)
    return mark(path)


def check_out_step(names: Iterable[str]) -> Step:
    """A first step refusing the run when any of ``<out>/name`` is not the demo's to replace.

    Without it a user's folder would be met only by the step that replaces it, minutes
    into the run and after earlier folders were already replaced.
    """
    names = tuple(names)

    def check(ctx: DemoContext) -> None:
        out = ctx.config.out_dir
        for name in names:
            check_replaceable(out / name)
        for name in OUTPUT_FILES:
            why = _not_overwritable(out / name)
            if why:
                raise ValueError(f"{out / name} {why}; the demo writes its own {name} there: "
                                 "move it away or pick another --out")
        out.mkdir(parents=True, exist_ok=True)
        if not (out / MARKER).exists():  # its files here are the demo's to replace next run
            (out / MARKER).write_text(OUT_MARKER_TEXT, encoding="utf-8")

    return Step("check out", check, _check_out_description(names))


def _check_out_description(folders: tuple[str, ...]) -> str:
    """The step's line, naming every folder (``bag/``) and file it checks.

    The files are always there, so the sentence reads right when a run replaces no
    folder: the offline demo's was "--out's  are the demo's to replace".
    """
    shown = [f"{name}/" for name in folders] + list(OUTPUT_FILES)
    return f"--out's {', '.join(shown[:-1])} and {shown[-1]} are the demo's to replace"
