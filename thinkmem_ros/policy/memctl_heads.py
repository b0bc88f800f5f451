"""The memory-control probes shipped beside the policy (``memctl.npz`` + ``memctl.json``).

Why a module of its own: the probes are a bundle artefact. The consolidator fits and saves
them (``consolidator/memctl_train.py``), the robot loads and runs them
(``robot/memory_control.py``); both import this file, so neither side imports the other.
Two logistic probes read the policy's pooled embedding: COMPRESS (the raw frames behind
the window are no longer needed) and RECALL (fetch explicit past episodes). numpy only.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from thinkmem_ros.policy.bundle import read_artefact_files, read_npz, verify_artefact

MEMCTL_NPZ = "memctl.npz"
MEMCTL_JSON = "memctl.json"
ARTEFACT_VERSION = 1
HEADS = ("compress", "recall")


class MemctlError(RuntimeError):
    """A memory-control step failed; the caller keeps the original situation."""


class MemctlArtefactError(ValueError):
    """The probe artefact is missing, malformed or does not match its hash."""


@dataclass
class ProbeHead:
    """A logistic probe on the (unnormalised) embedding: p = sigmoid(w . e + b)."""

    weights: np.ndarray  # (d,) float64 (standardisation folded in)
    bias: float
    threshold: float = 0.5

    def __post_init__(self) -> None:
        self.weights = np.asarray(self.weights, dtype=np.float64).reshape(-1)
        if not np.isfinite(self.weights).all() or not math.isfinite(self.bias):
            raise MemctlArtefactError("probe weights/bias contain NaN or inf")
        if not 0.0 <= self.threshold <= 1.0:
            raise MemctlArtefactError(f"probe threshold must be in [0, 1], got {self.threshold}")

    def probability(self, embedding: np.ndarray) -> np.ndarray:
        """P(head fires) for (d,) or (B, d) embeddings; raises MemctlError on bad input."""
        e = np.asarray(embedding, dtype=np.float64)
        if e.shape[-1:] != self.weights.shape or e.ndim not in (1, 2):
            raise MemctlError(f"embedding shape {e.shape} does not fit a probe of "
                              f"dimension {self.weights.shape[0]}")
        if not np.isfinite(e).all():
            raise MemctlError("embedding contains NaN or inf")
        z = np.clip(e @ self.weights + self.bias, -60.0, 60.0)
        return 1.0 / (1.0 + np.exp(-z))


@dataclass
class MemctlHeads:
    """The COMPRESS and RECALL probes plus what they were fitted on."""

    compress: ProbeHead
    recall: ProbeHead
    info: dict = field(default_factory=dict)

    def save(self, folder: Path | str) -> Path:
        """Write ``memctl.npz`` + ``memctl.json`` (with the npz's sha256) into ``folder``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        npz = folder / MEMCTL_NPZ
        tmp = folder / (MEMCTL_NPZ + ".tmp.npz")
        np.savez(tmp, **{f"{h}_w": getattr(self, h).weights for h in HEADS},
                 **{f"{h}_b": np.array([getattr(self, h).bias]) for h in HEADS})
        tmp.replace(npz)
        meta = {"artefact_version": ARTEFACT_VERSION,
                "dim": int(self.compress.weights.shape[0]),
                "thresholds": {h: getattr(self, h).threshold for h in HEADS},
                "sha256": hashlib.sha256(npz.read_bytes()).hexdigest(), "info": self.info}
        (folder / MEMCTL_JSON).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        return npz

    @classmethod
    def load(cls, folder: Path | str) -> MemctlHeads:
        """Read the probes (numpy only), verifying the npz against the recorded sha256.

        Any malformed content (a missing or empty array, thresholds that are not a map of
        numbers, a file that is not an npz) is a MemctlArtefactError naming the file, so
        the node skips the probes with one line instead of failing to start.
        """
        folder = Path(folder)
        files = read_artefact_files(folder, (MEMCTL_JSON, MEMCTL_NPZ), MemctlArtefactError,
                                    "memctl")
        return cls.from_files(folder, files)

    @classmethod
    def from_files(cls, folder: Path | str, files: dict[str, bytes]) -> MemctlHeads:
        """Parse the probes from bytes already read: {memctl.json: ..., memctl.npz: ...}.

        Why: a caller that checked these bytes (against a bundle's signed list) must get
        the probes those bytes hold; reading the files again would load whatever replaced
        them meanwhile. ``folder`` only names the files in errors (as ``load``).
        """
        folder = Path(folder)
        meta, raw = verify_artefact(folder, files, MEMCTL_JSON, MEMCTL_NPZ, ARTEFACT_VERSION,
                                    MemctlArtefactError, "memctl")
        thresholds = _thresholds(meta, folder / MEMCTL_JSON)
        try:
            heads = _heads(read_npz(raw), thresholds)
        except Exception as exc:  # noqa: BLE001 - numpy/zipfile raise many kinds on bad bytes
            raise MemctlArtefactError(f"{folder / MEMCTL_NPZ}: {type(exc).__name__}: "
                                      f"{exc}") from None
        info = meta.get("info", {})
        return cls(heads["compress"], heads["recall"], info if isinstance(info, dict) else {})

    @property
    def dim(self) -> int:
        """Embedding width the probes read (the policy's must match)."""
        return int(self.compress.weights.shape[0])


def _thresholds(meta: dict, source: Path) -> dict[str, float]:
    """{head: threshold in [0, 1]} from the sidecar; MemctlArtefactError naming it otherwise."""
    found = meta.get("thresholds")
    if not isinstance(found, dict):
        raise MemctlArtefactError(f"{source}: thresholds must be a map {{head: number}}, "
                                  f"got {type(found).__name__}")
    out = {}
    for h in HEADS:
        tau = found.get(h)
        if isinstance(tau, bool) or not isinstance(tau, (int, float)) \
                or not 0.0 <= tau <= 1.0:
            raise MemctlArtefactError(f"{source}: thresholds.{h} must be a number in "
                                      f"[0, 1], got {tau!r}")
        out[h] = float(tau)
    return out


def _heads(arrays: dict[str, np.ndarray], thresholds: dict[str, float]) -> dict[str, ProbeHead]:
    """Build both probes from the npz arrays; raises (the caller names the file) on a flaw."""
    heads = {}
    for h in HEADS:
        weights, bias = arrays.get(f"{h}_w"), arrays.get(f"{h}_b")
        if weights is None or bias is None:
            raise ValueError(f"lacks {h}_w or {h}_b (has {sorted(arrays)})")
        if weights.ndim != 1 or weights.size == 0 or bias.shape != (1,):
            raise ValueError(f"{h}_w must be (d,) and {h}_b (1,), got {weights.shape} and "
                             f"{bias.shape}")
        heads[h] = ProbeHead(weights, float(bias[0]), thresholds[h])
    if heads["compress"].weights.shape != heads["recall"].weights.shape:
        raise ValueError("compress_w and recall_w differ in width")
    return heads
