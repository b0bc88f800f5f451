"""Rehearsal material: the training set D that produced the running bundle, kept across rounds.

Seed 000 grows the training set, D <- D U D_dir U D_disc; a round does not train on its new
material alone. Warm-starting on a few hundred rows from one short playback makes the
policy forget the base skills (measured in the demo: held-out micro-F1 0.975 -> 0.913,
which the gate rightly refuses), so each round also rehearses what the running bundle
learned from. Where D comes from, first match wins:

1. ``RehearsalConfig.npz``: an explicit file (an operator's curated set);
2. ``<publish_dir>/rehearsal/v<version>.npz``: saved by the round that published the running
   bundle (``save_rehearsal``); its sha256 is recorded in that bundle's signed manifest
   (``extras.rehearsal.sha256``) and checked on load, so a file left by another
   history is never mixed in;
3. rebuilt from the bundle's recorded recipe (``extras.command``, a ``thinkmem train``
   command line, as the shipped ``models/default`` carries): the first
   ``rebuild_streams`` of its training streams are regenerated from the same seeded child
   generators (``np.random.default_rng(seed).spawn(streams + 1)``, stream i from child i),
   windowed with its stride, window and event length, and subsampled. A subset of the
   recipe's streams is the same distribution at a fraction of the cost; the regeneration
   is exact as long as the world simulator has not changed since the bundle was trained;
4. nothing: the round trains on D_dir U D_disc alone (a bundle of unknown provenance).

Size: D is capped at ``max_rows`` (the round's retraining time is linear in it) by a
stratified subsample: half of the budget is shared equally among labels (each label keeps
up to ``max_rows / (2 L)`` of its positives, rarest label first), the rest is drawn
uniformly from the remaining rows. A label seen in 2 % of rows keeps its positives, where
a uniform draw would thin it with everything else; a discovered ``consider:X`` label
with a few dozen rows survives every later round's cap.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from thinkmem_ros.core.data import SituationSet
from thinkmem_ros.core.input_files import input_file
from thinkmem_ros.policy.bundle import Bundle
from thinkmem_ros.world.recipe import RecipeError, StreamRecipe

log = logging.getLogger(__name__)

REHEARSAL_DIR = "rehearsal"
SOURCES = ("rebuilt", "saved", "explicit", "none")


class RehearsalError(RuntimeError):
    """Rehearsal material exists but cannot be used (shape, hash or recipe mismatch)."""


@dataclass
class RehearsalConfig:
    """Where the previous training set comes from and how large it may be."""

    max_rows: int = 2000  # cap on D kept per bundle (and used per round)
    rebuild_streams: int = 2  # recipe streams regenerated for a bundle without saved D
    npz: Path | str | None = None  # explicit D; overrides saved and rebuilt material
    enabled: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_rows < 1:
            raise ValueError(f"RehearsalConfig.max_rows must be >= 1, got {self.max_rows}")
        if self.rebuild_streams < 1:
            raise ValueError(f"RehearsalConfig.rebuild_streams must be >= 1, got "
                             f"{self.rebuild_streams}")
        if self.npz is not None:
            self.npz = Path(self.npz)


@dataclass
class Rehearsal:
    """The previous training set (None when there is none) and where it came from."""

    data: SituationSet | None
    source: str
    detail: str = ""

    def __len__(self) -> int:
        return 0 if self.data is None else len(self.data)


# ------------------------------------------------------------------ stratified cap

def stratified_indices(labels: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """Row indices (sorted) of at most ``n`` rows; rare labels keep their positives."""
    rows = labels.shape[0]
    if rows <= n:
        return np.arange(rows)
    chosen = np.zeros(rows, dtype=bool)
    positive = labels > 0.5
    quota = n // (2 * max(labels.shape[1], 1))
    for j in np.argsort(positive.sum(axis=0), kind="stable"):  # rarest label first
        have = int((chosen & positive[:, j]).sum())
        free = np.flatnonzero(positive[:, j] & ~chosen)
        take = min(max(quota - have, 0), len(free))
        if take:
            chosen[rng.choice(free, size=take, replace=False)] = True
    rest = np.flatnonzero(~chosen)
    fill = max(n - int(chosen.sum()), 0)
    chosen[rng.choice(rest, size=min(fill, len(rest)), replace=False)] = True
    return np.flatnonzero(chosen)


def cap(data: SituationSet, max_rows: int, rng: np.random.Generator) -> SituationSet:
    """``data`` limited to ``max_rows`` rows by ``stratified_indices``."""
    if len(data) <= max_rows:
        return data
    return data.subset(stratified_indices(data.labels, max_rows, rng))


# ------------------------------------------------------------------ aligning names

def check_fits(data: SituationSet, signal_names: Sequence[str], window: int,
               max_events: int) -> None:
    """Raise ``RehearsalError`` unless a bundle of these shapes can rehearse ``data``."""
    if tuple(data.signal_names) != tuple(signal_names) or data.window != window:
        raise RehearsalError(f"rehearsal material has K={data.window}, signals "
                             f"{data.signal_names}; the bundle needs K={window}, {signal_names}")
    if data.events.shape[1] > max_events:
        raise RehearsalError(f"rehearsal material keeps {data.events.shape[1]} events, the "
                             f"bundle {max_events}")


def aligned(data: SituationSet, label_names: Sequence[str], event_vocabulary: Sequence[str],
            signal_names: Sequence[str], window: int, max_events: int) -> SituationSet:
    """``data`` in the round's label order and event ids; a shape mismatch raises."""
    from thinkmem_ros.consolidator.gate import reencode_events

    check_fits(data, signal_names, window, max_events)
    labels = np.zeros((len(data), len(label_names)), np.float32)
    for j, name in enumerate(label_names):
        if name in data.label_names:
            labels[:, j] = data.labels[:, data.label_names.index(name)]
    events = np.pad(data.events, ((0, 0), (max_events - data.events.shape[1], 0)))
    events = reencode_events(events, data.event_vocabulary, event_vocabulary)
    return SituationSet(signals=data.signals, labels=labels, mask=data.mask, events=events,
                        groups=data.groups, label_names=tuple(label_names),
                        signal_names=tuple(signal_names),
                        event_vocabulary=tuple(event_vocabulary), meta={"source": "rehearsal"})


# ------------------------------------------------------------------ npz files

def rehearsal_path(publish_dir: Path | str, version: int) -> Path:
    """Where the round that published ``version`` saved its training set."""
    return Path(publish_dir) / REHEARSAL_DIR / f"v{version:06d}.npz"


def save_rehearsal(data: SituationSet, path: Path | str) -> str:
    """Write ``data`` as an npz (atomically: temp file + rename); returns its sha256."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as handle:
        np.savez_compressed(
            handle, signals=data.signals, labels=data.labels, mask=data.mask,
            events=data.events, groups=data.groups,
            label_names=np.array(data.label_names, dtype=str),
            signal_names=np.array(data.signal_names, dtype=str),
            event_vocabulary=np.array(data.event_vocabulary, dtype=str))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return file_sha256(path)


def install(staged: Path | str, publish_dir: Path | str, version: int) -> Path:
    """Move a staged D to its published place (same filesystem: an atomic rename)."""
    target = rehearsal_path(publish_dir, version)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staged, target)
    return target


def load_npz(path: Path | str) -> SituationSet:
    """Read a training set written by ``save_rehearsal``."""
    try:
        input_file(path, "rehearsal set")  # np.load on a FIFO waited for a writer forever
    except ValueError as exc:
        raise RehearsalError(f"{exc}") from None
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {name: f[name] for name in ARRAYS}
            names = {name: tuple(str(x) for x in f[name])
                     for name in ("label_names", "signal_names", "event_vocabulary")}
            data = SituationSet(**arrays, **names,
                                meta={"source": "rehearsal", "path": str(path)})
    except (OSError, KeyError, ValueError, EOFError) as exc:  # EOFError: an empty file
        raise RehearsalError(f"{path}: not a rehearsal npz ({exc})") from exc
    problem = contents_problem(arrays, len(names["event_vocabulary"]))
    if problem is not None:
        raise RehearsalError(f"{path}: not a usable rehearsal set: {problem}")
    return data


ARRAYS = ("signals", "labels", "mask", "events", "groups")
"""The numeric arrays of a rehearsal npz (beside its three name lists)."""


def contents_problem(arrays: dict[str, np.ndarray], vocabulary: int) -> str | None:
    """Why these arrays cannot be trained on, or None (checked before any cast to int64).

    Why: NaN signals and event ids past the vocabulary failed only inside a round, after
    discovery ran (a traceback); negative or fractional ids, NaN labels and labels of 2.0
    were trained on without a word.
    """
    for name in ARRAYS:
        values = arrays[name]
        if values.dtype.kind not in "biuf":
            return f"{name} holds {values.dtype} values, not numbers"
        if values.dtype.kind == "f" and not np.isfinite(values).all():
            return f"{name} holds NaN or infinite values"
        if name in ("events", "groups") and values.dtype.kind == "f" and (
                values != np.trunc(values)).any():
            return f"{name} must be whole numbers, found {values[values != np.trunc(values)][0]:g}"
    rows = len(arrays["signals"])
    if rows == 0:
        return "it holds no rows"
    if arrays["groups"].shape != (rows,):
        return f"groups must be one per row, shape ({rows},), got {arrays['groups'].shape}"
    for name, low, high in (("labels", 0, 1), ("mask", 0, 1), ("events", 0, vocabulary)):
        values = arrays[name]
        if values.size and (values.min() < low or values.max() > high):
            return (f"{name} must lie in [{low}, {high}], found [{values.min():g}, "
                    f"{values.max():g}]")
    return None


def file_sha256(path: Path | str) -> str:
    """sha256 of a file's bytes (ties a saved D to the bundle it trained)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ------------------------------------------------------------------ rebuilding from a recipe

def recipe(bundle: Bundle) -> StreamRecipe | None:
    """The bundle's training-data recipe from ``extras.command``, or None."""
    command = (bundle.manifest.extras or {}).get("command")
    if not isinstance(command, str):
        return None
    try:
        return StreamRecipe.from_command(command)
    except RecipeError as exc:
        raise RehearsalError(f"bundle v{bundle.version}: {exc}") from exc


def rebuild(bundle: Bundle, streams: int) -> SituationSet | None:
    """The first ``streams`` training streams of the bundle's recipe, windowed as it did."""
    found = recipe(bundle)
    if found is None:
        return None
    try:
        data = found.windows(streams)
    except ValueError as exc:  # an unknown scenario, fewer frames than its window
        raise RehearsalError(f"bundle v{bundle.version}: its recipe cannot be rebuilt: "
                             f"{exc}") from exc
    data.meta = {"source": "rehearsal", "recipe": bundle.manifest.extras["command"],
                 "streams": min(streams, found.streams)}
    return data


# ------------------------------------------------------------------ the round's entry point

def load_rehearsal(current: Bundle, publish_dir: Path | str, cfg: RehearsalConfig
                   ) -> Rehearsal:
    """D for a round on top of ``current`` (see the module docstring for the order)."""
    if not cfg.enabled:
        return Rehearsal(None, "none", "disabled")
    rng = np.random.default_rng([cfg.seed, 3])
    if cfg.npz is not None:
        return Rehearsal(cap(load_npz(cfg.npz), cfg.max_rows, rng), "explicit", str(cfg.npz))
    saved = rehearsal_path(publish_dir, current.version)
    if saved.exists():
        recorded = ((current.manifest.extras or {}).get("rehearsal") or {}).get("sha256")
        actual = file_sha256(saved)
        if recorded != actual:
            raise RehearsalError(f"{saved}: sha256 {actual[:12]} is not the one bundle "
                                 f"v{current.version} records ({str(recorded)[:12]})")
        return Rehearsal(cap(load_npz(saved), cfg.max_rows, rng), "saved", str(saved))
    rebuilt = rebuild(current, cfg.rebuild_streams)
    if rebuilt is not None:
        return Rehearsal(cap(rebuilt, cfg.max_rows, rng), "rebuilt",
                         current.manifest.extras["command"])
    log.warning("bundle v%d has no saved training set and no recipe: the round trains on its "
                "new material alone", current.version)
    return Rehearsal(None, "none", "no saved material and no recipe")
