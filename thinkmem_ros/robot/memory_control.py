"""Pre-action memory control (PaMER) from the policy's hidden state, numpy only.

Why: the pooled embedding the policy computes before it activates thinking already says
whether the raw frames behind the current window are still needed (COMPRESS) and whether
the situation is novel or uncertain enough to fetch explicit past episodes (RECALL).
Two logistic probes read it; their weights ship in the bundle folder as ``memctl.npz`` +
``memctl.json`` (fitted offboard by ``consolidator/memctl_train.py``).

Fallback rules (PaMER), enforced by ``MemoryController.step`` and each tested:
  1. a missing robot or session id passes the situation through unchanged; the event is
     recorded (``Record.rule == "missing_id"``);
  2. a head failure (wrong shape, NaN/inf, an exception) skips compression (and recall),
     records the error (``"head_error"``) and returns the situation unchanged;
  3. a failure of summary, embedding or storage during compression commits no partial
     memory, deletes no raw block and returns the original situation (``"compress_error"``);
  4. a recall failure (timeout, refused, bad reply) returns the original situation with no
     evidence, never a partial list (``"recall_error"``).

Compression is a two-phase step on ``LocalHistory``: every summary and its embedding are
built first, the store commits them all at once, and only then are the raw blocks released.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from thinkmem_ros.policy.memctl_heads import MemctlError, MemctlHeads

# ---------------------------------------------------------------------------- local history

@dataclass
class SummaryRecord:
    """A compressed block: per-channel statistics of its raw frames plus an embedding."""

    block_id: int
    start_frame: int
    frames: int
    stats: np.ndarray  # (4, F): mean, std, min, max over observed values
    embedding: np.ndarray  # (e,)

    @property
    def nbytes(self) -> int:
        """Bytes this summary keeps in memory."""
        return int(self.stats.nbytes + self.embedding.nbytes) + 24


def summarise_block(frames: np.ndarray) -> np.ndarray:
    """Per-channel mean/std/min/max of a raw (n, F) block; NaN-free blocks only."""
    frames = np.asarray(frames, dtype=np.float32)
    if frames.ndim != 2 or frames.shape[0] == 0:
        raise MemctlError(f"summary needs a non-empty (n, F) block, got shape {frames.shape}")
    if not np.isfinite(frames).all():
        raise MemctlError("summary: block holds NaN/inf; dropouts must be masked before")
    return np.stack([frames.mean(0), frames.std(0), frames.min(0), frames.max(0)])


def embed_summary(stats: np.ndarray) -> np.ndarray:
    """Return a unit-length embedding of summary statistics, for later episodic lookup."""
    flat = np.asarray(stats, dtype=np.float32).reshape(-1)
    if not np.isfinite(flat).all():
        raise MemctlError("summary embedding: statistics contain NaN/inf")
    norm = float(np.linalg.norm(flat))
    return flat / norm if norm > 0 else flat


class SummaryStore(Protocol):
    """Where summaries are committed; ``commit`` stores all of them or raises."""

    def commit(self, records: list[SummaryRecord]) -> None:
        """Store every record atomically or raise, storing none."""


class FolderSummaryStore:
    """Summaries as one npz file per commit, written to a temp file then renamed (atomic)."""

    def __init__(self, folder: Path | str) -> None:
        self.folder = Path(folder)
        self.commits = 0

    def commit(self, records: list[SummaryRecord]) -> None:
        """Write all records to ``summaries-<n>.npz`` at once; an OSError stores nothing."""
        arrays = {}
        for r in records:
            arrays[f"b{r.block_id}_stats"] = r.stats
            arrays[f"b{r.block_id}_embedding"] = r.embedding
            arrays[f"b{r.block_id}_span"] = np.array([r.start_frame, r.frames])
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".summaries.", suffix=".npz", dir=self.folder)
            with os.fdopen(fd, "wb") as handle:
                np.savez(handle, **arrays)
            os.replace(tmp, self.folder / f"summaries-{self.commits:06d}.npz")
        except OSError as exc:
            raise MemctlError(f"summary storage failed in {self.folder}: {exc}") from exc
        self.commits += 1


class LocalHistory:
    """The node's raw frame buffer in fixed-size blocks, plus committed summaries."""

    def __init__(self, block_frames: int, n_features: int) -> None:
        if block_frames < 1 or n_features < 1:
            raise ValueError(f"block_frames and n_features must be >= 1, got "
                             f"{block_frames}, {n_features}")
        self.block_frames = block_frames
        self.n_features = n_features
        self.blocks: dict[int, np.ndarray] = {}  # block id -> (block_frames, F) raw
        self.summaries: list[SummaryRecord] = []
        self._open: list[np.ndarray] = []
        self._next_id = 0
        self.frames_seen = 0

    def append(self, frame: np.ndarray) -> None:
        """Add one raw frame; a full block is sealed."""
        frame = np.asarray(frame, dtype=np.float32).reshape(-1)
        if frame.shape[0] != self.n_features:
            raise ValueError(f"frame has {frame.shape[0]} values, expected {self.n_features}")
        self._open.append(frame)
        self.frames_seen += 1
        if len(self._open) == self.block_frames:
            self.blocks[self._next_id] = np.stack(self._open)
            self._next_id += 1
            self._open = []

    def behind(self, window: int) -> list[int]:
        """Sealed blocks lying wholly before the last ``window`` frames (oldest first)."""
        first_in_window = self.frames_seen - window
        return [b for b in sorted(self.blocks)
                if (b + 1) * self.block_frames <= first_in_window]

    @property
    def nbytes(self) -> int:
        """Bytes held: raw blocks, the open block and summaries."""
        raw = sum(b.nbytes for b in self.blocks.values()) + 4 * self.n_features * len(self._open)
        return raw + sum(s.nbytes for s in self.summaries)

    def compress(self, window: int, store: SummaryStore,
                 summarise: Callable[[np.ndarray], np.ndarray] = summarise_block,
                 embed: Callable[[np.ndarray], np.ndarray] = embed_summary) -> int:
        """Summarise and release the blocks behind the window; all or nothing.

        Phase 1 builds every summary and embedding (nothing changes yet); phase 2 commits
        them to ``store``; phase 3 drops the raw blocks. Any exception in phases 1-2 leaves
        the history exactly as it was. Returns the number of blocks released.
        """
        ids = self.behind(window)
        if not ids:
            return 0
        try:
            records = []
            for b in ids:
                stats = np.asarray(summarise(self.blocks[b]), dtype=np.float32)
                emb = np.asarray(embed(stats), dtype=np.float32)
                records.append(SummaryRecord(b, b * self.block_frames, self.block_frames,
                                             stats, emb))
            store.commit(records)
        except MemctlError:
            raise
        except Exception as exc:  # a user-supplied summariser/embedder may raise anything
            raise MemctlError(f"compression failed: {type(exc).__name__}: {exc}") from exc
        self.summaries.extend(records)
        for b in ids:
            del self.blocks[b]
        return len(ids)


# ---------------------------------------------------------------------------- controller

@dataclass(frozen=True)
class Situation:
    """What the node hands to memory control each tick (never modified by it)."""

    robot_id: str | None
    session_id: str | None
    window: np.ndarray  # (K, F)
    embedding: np.ndarray | None  # (d,) pooled policy state


@dataclass
class Record:
    """One fallback or error event, kept for diagnostics."""

    rule: str
    detail: str


@dataclass
class MemoryOutcome:
    """What memory control decided; ``situation`` is the caller's own object."""

    situation: Situation
    p_compress: float | None = None
    p_recall: float | None = None
    compressed_blocks: int = 0
    recalled: bool = False
    evidence: list[dict] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)


RecallFn = Callable[[np.ndarray, str], list[dict]]
"""``recall(embedding, robot_id) -> evidence``; raises on timeout or error (see recall.py)."""


class MemoryController:
    """Runs the probes and applies PaMER's fallback rules around compression and recall."""

    def __init__(self, heads: MemctlHeads, history: LocalHistory | None = None,
                 store: SummaryStore | None = None, recall: RecallFn | None = None,
                 summarise: Callable[[np.ndarray], np.ndarray] = summarise_block,
                 embed: Callable[[np.ndarray], np.ndarray] = embed_summary,
                 max_records: int = 1024) -> None:
        self.heads = heads
        self.history = history
        self.store = store
        self.recall_fn = recall
        self.summarise = summarise
        self.embed = embed
        self.records: list[Record] = []  # bounded diagnostics log
        self.max_records = max_records

    def _record(self, outcome: MemoryOutcome, rule: str, detail: str) -> None:
        rec = Record(rule, detail[:512])
        outcome.records.append(rec)
        self.records.append(rec)
        del self.records[:-self.max_records]

    def step(self, situation: Situation) -> MemoryOutcome:
        """Decide COMPRESS and RECALL for one situation; never raises for the rules above."""
        out = MemoryOutcome(situation=situation)
        if not situation.robot_id or not situation.session_id:
            self._record(out, "missing_id", f"robot_id={situation.robot_id!r} "
                         f"session_id={situation.session_id!r}: passed through")
            return out
        try:
            if situation.embedding is None:
                raise MemctlError("no embedding")
            pc = float(self.heads.compress.probability(situation.embedding))
            pr = float(self.heads.recall.probability(situation.embedding))
        except Exception as exc:  # rule 2: any head failure skips compression
            self._record(out, "head_error", f"{type(exc).__name__}: {exc}")
            return out
        out.p_compress, out.p_recall = pc, pr
        if pc >= self.heads.compress.threshold and self.history is not None \
                and self.store is not None:
            try:
                out.compressed_blocks = self.history.compress(
                    situation.window.shape[0], self.store, self.summarise, self.embed)
            except MemctlError as exc:  # rule 3: nothing committed, nothing deleted
                self._record(out, "compress_error", str(exc))
                return MemoryOutcome(situation=situation, p_compress=pc, p_recall=pr,
                                     records=out.records)
        if pr >= self.heads.recall.threshold and self.recall_fn is not None:
            try:
                evidence = self.recall_fn(situation.embedding, situation.robot_id)
                if not isinstance(evidence, list):
                    raise MemctlError(f"recall returned {type(evidence).__name__}, not a list")
            except Exception as exc:  # rule 4: the original situation, no partial evidence
                self._record(out, "recall_error", f"{type(exc).__name__}: {exc}")
                return out
            out.evidence = evidence
            out.recalled = True
        return out
