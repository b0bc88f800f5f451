"""Anticipation, value rerank and memory-control gates between the policy and the activation.

Why a module of its own: the node is a thin rclpy shell; what it does with a bundle's rules
(``rules.json``), value table (``values.npz``) and memory-control probes (``memctl.npz``)
after each inference is plain Python (numpy only), tested here without ROS.

Per frame (``ThinkingGates.apply``, on the inference thread, no I/O, no waits):
  * anticipation (when the bundle ships ``rules.json`` and ``anticipation`` is not
    ``off``): the ``AnticipationTracker`` (``policy/anticipation.py``), fed every event by
    ``on_event``, says which ``consider:C`` labels have an open A...B prefix within its
    horizon at the frame's time. ``rules`` (the default) makes the tracker decide the labels
    its rules cover: an anticipated label is added, and the policy's own activation of a
    covered label without an open prefix is dropped (``suppressed``: ``not_anticipated``).
    Why not OR the policy in (``or``): replayed through the node's SituationBuffer on
    episodes with 2..300 s gaps (``bench/anticipation.compare_with_policy``, a round's
    retrained bundle, live signals), the policy's ``consider:C`` covered 5 % of the B..C
    frames, fired in every B...A episode and on 1.3 % of the frames with no open prefix;
    OR-ing it in raised frame recall only from 0.80 to 0.82 and brought those false fires
    with it. Labels no rule covers keep the policy's decision. This runs first, so the
    value table still ranks and may suppress an anticipated label; the record carries
    ``anticipating`` {label: {rule, since, remaining_s}}.
  * values (when the bundle has a table and ``value_mode`` is not ``off``): ``deploy``
    applies ``ValueTable.rerank`` (greedy: the documented suppression rule, which never
    suppresses a ``SAFETY_LABELS`` label the policy activated); ``learn`` uses
    ``ValueTable.explore`` (decayed epsilon-greedy, eps0 0.95, beta 6 over
    ``value_horizon`` frames: with probability eps_t everything the policy activated is
    kept). ``active`` becomes the kept labels in rank order; ``suppressed`` says why each
    dropped label went.
  * memory control (when the bundle has probes): ``MemoryController.step`` computes
    p_compress / p_recall from the embedding, with PaMER's fallback rules (a missing id
    passes through and is recorded; a head failure is recorded and skips both decisions,
    the activation is published regardless). RECALL submits a request to
    ``BackgroundRecall`` (never blocks; a newer request replaces a waiting one); finished
    results are collected on later frames by ``take_evidence`` and published by the node
    on ``/thinking/evidence``. A recall failure publishes nothing and is counted.
  * COMPRESS, what it does now: the decision (``compress`` and p_compress) is published in
    the activation JSON and travels with the frame to the experience builder. The node
    itself keeps only the K-frame window, so it releases nothing locally yet; the shipper
    does not summarise on it yet either. ``memctl.LocalHistory`` implements the
    all-or-nothing summarise-and-release step for a robot that keeps a longer raw buffer.

Artefacts are loaded by ``load_gate_artefacts`` on the hot-swap thread together with the
bundle; when the bundle's manifest lists ``extras["artefacts"]`` ({file: sha256}, covered by
the bundle signature) every listed file must match, otherwise the artefact is refused and
the policy runs without it (the error is kept for the diagnostics).
"""

from __future__ import annotations

import hashlib
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from thinkmem_ros.core.vocabulary import EPISODE_START_EVENT
from thinkmem_ros.policy.anticipation import AnticipationTracker, TrackerConfig
from thinkmem_ros.policy.anticipation_rules import (
    RULES_FILES,
    RULES_JSON,
    RULES_META,
    RulesArtefactError,
    RuleSet,
)
from thinkmem_ros.policy.bundle import read_bundle_file
from thinkmem_ros.policy.memctl_heads import (
    MEMCTL_JSON,
    MEMCTL_NPZ,
    MemctlArtefactError,
    MemctlHeads,
)
from thinkmem_ros.policy.value_table import VALUES_JSON, VALUES_NPZ, ValueArtefactError, ValueTable
from thinkmem_ros.robot.memory_control import MemoryController, Situation

VALUE_MODES = ("off", "deploy", "learn")
ANTICIPATION_MODES = ("off", "rules", "or")
ARTEFACTS_KEY = "artefacts"


def artefact_hashes(folder: Path | str) -> dict[str, str]:
    """Return {file: sha256} of the value/memctl/rules artefacts present in ``folder``.

    Put this under ``extras["artefacts"]`` of a bundle's manifest so its signature covers
    them (``policy.export.export_bundle(..., extras={"artefacts": ...})``).
    """
    folder = Path(folder)
    return {name: hashlib.sha256(read_bundle_file(folder / name)).hexdigest()
            for name in (VALUES_NPZ, VALUES_JSON, MEMCTL_NPZ, MEMCTL_JSON, *RULES_FILES)
            if (folder / name).is_file()}


def attach_artefacts(bundle_folder: Path | str, artefact_folder: Path | str) -> dict[str, str]:
    """Copy the artefacts into a bundle and list their sha256 in its manifest's extras.

    ``write_bundle`` replaces the whole folder, so the new manifest and the artefacts are
    assembled in a sibling folder and swapped in by rename: the node never sees a manifest
    that lists files which are not there yet. Returns the {file: sha256} listed.
    """
    from thinkmem_ros.policy.bundle import load_bundle, write_bundle

    bundle_folder, artefact_folder = Path(bundle_folder), Path(artefact_folder)
    hashes = artefact_hashes(artefact_folder)
    bundle = load_bundle(bundle_folder)
    manifest = bundle.manifest
    manifest.extras = {**manifest.extras, ARTEFACTS_KEY: hashes}
    staging = bundle_folder.with_name(f".{bundle_folder.name}.artefacts")
    if staging.exists():
        shutil.rmtree(staging)
    write_bundle(staging, bundle.onnx_path.read_bytes(), manifest)
    for name in hashes:
        shutil.copyfile(artefact_folder / name, staging / name)
    retired = bundle_folder.with_name(f".{bundle_folder.name}.retired")
    if retired.exists():
        shutil.rmtree(retired)
    bundle_folder.rename(retired)
    staging.rename(bundle_folder)
    shutil.rmtree(retired, ignore_errors=True)
    return hashes


def _read_signed(folder: Path, names: tuple[str, ...], listed: dict) -> dict[str, bytes]:
    """{name: bytes} of each file, read once and matched against the manifest's signed list.

    Why return the bytes: the loader must parse the very bytes that were hashed. Hashing the
    files and letting the loader open them again let a file swapped in between pass the
    signature. Raises ValueError for an unlisted or mismatching file, OSError when unreadable.
    """
    files = {}
    for name in names:
        want = listed.get(name)
        if want is None:
            raise ValueError(f"{folder / name}: not listed in the manifest's "
                             f"extras.{ARTEFACTS_KEY}; refusing an unsigned artefact")
        raw = read_bundle_file(folder / name)
        got = hashlib.sha256(raw).hexdigest()
        if got != want:
            raise ValueError(f"{folder / name}: sha256 {got[:12]} does not match the "
                             f"manifest's {str(want)[:12]}")
        files[name] = raw
    return files


@dataclass
class GateArtefacts:
    """What one bundle folder carries besides the policy (any may be None)."""

    table: ValueTable | None = None
    heads: MemctlHeads | None = None
    rules: RuleSet | None = None
    errors: list[str] = field(default_factory=list)


def load_gate_artefacts(folder: Path | str, extras: dict | None = None,
                        embedding_dim: int | None = None) -> GateArtefacts:
    """Load the value table, probes and rules next to a bundle; a bad one is skipped, noted.

    Never raises: these files are optional, so any failure (unsigned, unreadable,
    malformed, or keyed on an embedding of another width than ``embedding_dim``, the
    policy's) leaves that artefact out with one line in ``errors`` naming the file.
    """
    folder = Path(folder)
    listed = (extras or {}).get(ARTEFACTS_KEY)
    if listed is not None and not isinstance(listed, dict):
        listed = {}
    out = GateArtefacts()
    if (folder / VALUES_JSON).exists():
        out.table = _load_one(out, "values", lambda: _load_table(folder, listed, embedding_dim))
    if (folder / MEMCTL_JSON).exists():
        out.heads = _load_one(out, "memctl", lambda: _load_heads(folder, listed, embedding_dim))
    if (folder / RULES_META).exists() or (folder / RULES_JSON).exists():
        out.rules = _load_one(out, "rules", lambda: _load_rules(folder, listed))
    return out


def _load_one(out: GateArtefacts, kind: str, load: Callable[[], object]) -> object | None:
    """Run one artefact's loader; any exception becomes a line in ``out.errors`` and None."""
    try:
        return load()
    except (ValueArtefactError, MemctlArtefactError, RulesArtefactError, ValueError,
            OSError) as exc:
        out.errors.append(f"{kind}: {exc}")
    except Exception as exc:  # noqa: BLE001 - an optional file must never stop the node
        out.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
    return None


def _load_checked(kind, names: tuple[str, ...], folder: Path, listed: dict | None):
    """``kind.load(folder)``, or with a signed list ``kind.from_files`` on the checked bytes.

    Why never ``load`` after the check: it would open the files a second time, and a file
    swapped in between would be loaded although the signature covered the one before it.
    """
    if listed is None:
        return kind.load(folder)
    return kind.from_files(folder, _read_signed(folder, names, listed))


def _load_keyed(kind, names: tuple[str, str], folder: Path, listed: dict | None,
                width: int | None):
    """Load a value table or probes (``kind``) keyed on embeddings of ``width``."""
    loaded = _load_checked(kind, names, folder, listed)
    if width is not None and loaded.dim != width:
        raise ValueError(f"{folder / names[0]}: keyed on embeddings of width {loaded.dim}, "
                         f"the policy's are {width}")
    return loaded


def _load_table(folder: Path, listed: dict | None, width: int | None) -> ValueTable:
    return _load_keyed(ValueTable, (VALUES_NPZ, VALUES_JSON), folder, listed, width)


def _load_heads(folder: Path, listed: dict | None, width: int | None) -> MemctlHeads:
    return _load_keyed(MemctlHeads, (MEMCTL_NPZ, MEMCTL_JSON), folder, listed, width)


def _load_rules(folder: Path, listed: dict | None) -> RuleSet:
    return _load_checked(RuleSet, RULES_FILES, folder, listed)


def merge_anticipation(active: list[str], held: list[str], covered: frozenset[str] | set[str],
                       mode: str = "rules") -> tuple[list[str], list[str], list[str]]:
    """The activation after anticipation: (active, dropped, added), order kept.

    ``held``: labels the tracker holds now; ``covered``: labels the rules decide. ``rules``
    drops a covered label the tracker does not hold and appends held ones; ``or`` only
    appends; ``off`` changes nothing. Benchmarks replaying the node call this too.
    """
    if mode not in ANTICIPATION_MODES:
        raise ValueError(f"anticipation must be one of {list(ANTICIPATION_MODES)}, "
                         f"got {mode!r}")
    if mode == "off":
        return list(active), [], []
    dropped = [g for g in active if g in covered and g not in held] if mode == "rules" else []
    kept = [g for g in active if g not in dropped]
    added = [g for g in held if g not in kept]
    return kept + added, dropped, added


@dataclass
class GateConfig:
    """The node's gate parameters (copied from NodeConfig)."""

    value_mode: str = "deploy"
    value_horizon: int = 10_000
    seed: int = 0
    anticipation: str = "rules"

    def __post_init__(self) -> None:
        if self.value_mode not in VALUE_MODES:
            raise ValueError(f"value_mode must be one of {list(VALUE_MODES)}, "
                             f"got {self.value_mode!r}")
        if isinstance(self.value_horizon, bool) or not isinstance(self.value_horizon, int) \
                or self.value_horizon < 1:
            raise ValueError(f"value_horizon must be an integer >= 1, got "
                             f"{self.value_horizon!r}")
        if self.anticipation not in ANTICIPATION_MODES:
            raise ValueError(f"anticipation must be one of {list(ANTICIPATION_MODES)}, "
                             f"got {self.anticipation!r}")


@dataclass
class GateOutcome:
    """One frame's gate decisions, as they go into the activation JSON."""

    active: list[str]  # kept labels, in rank order
    suppressed: dict[str, str] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)
    uncertainties: dict[str, float] = field(default_factory=dict)
    cluster: int | None = None
    explored: bool = False
    value_mode: str = "off"
    p_compress: float | None = None
    p_recall: float | None = None
    compress: bool = False
    recall: bool = False
    memctl_error: str = ""
    anticipating: dict[str, dict] | None = None  # None: no rules (the key is left out)

    def record(self) -> dict:
        """JSON-ready fields added to the activation record."""
        out: dict = {"ranked": list(self.active), "suppressed": dict(self.suppressed),
                     "values": {k: round(v, 4) for k, v in self.values.items()},
                     "uncertainties": {k: round(v, 4) for k, v in self.uncertainties.items()},
                     "value_mode": self.value_mode}
        if self.cluster is not None:
            out["cluster"] = self.cluster
            out["explored"] = self.explored
        if self.p_compress is not None or self.memctl_error:
            out["memctl"] = {
                "p_compress": None if self.p_compress is None else round(self.p_compress, 5),
                "p_recall": None if self.p_recall is None else round(self.p_recall, 5),
                "compress": self.compress, "recall": self.recall,
                "error": self.memctl_error}
        if self.anticipating is not None:
            out["anticipating"] = dict(self.anticipating)
        return out


class ThinkingGates:
    """Applies one bundle's artefacts per frame and counts what happened."""

    def __init__(self, config: GateConfig, robot_id: str, session_id: str,
                 recall: Callable[[object, np.ndarray], None] | None = None,
                 rng: np.random.Generator | None = None) -> None:
        self.config = config
        self.robot_id = robot_id
        self.session_id = session_id
        self._submit = recall  # BackgroundRecall.submit, or None (no recall endpoint)
        self._rng = rng or np.random.default_rng(config.seed)
        self._lock = threading.Lock()
        self.artefacts = GateArtefacts()
        self._controller: MemoryController | None = None
        self._t = 0
        self.last_recall_error = ""  # '' while the latest recall succeeded (or none ran)
        self.counters = {"value_suppressed": 0, "value_explored": 0, "memctl_compress": 0,
                         "memctl_recall": 0, "memctl_head_errors": 0,
                         "memctl_missing_id": 0, "recall_evidence": 0, "recall_errors": 0,
                         "anticipation_added": 0, "anticipation_dropped": 0}
        self.tracker = AnticipationTracker(TrackerConfig(reset_events=(EPISODE_START_EVENT,)))

    def use(self, artefacts: GateArtefacts) -> None:
        """Adopt a (newly swapped-in) bundle's artefacts; new rules replay the event history."""
        self.artefacts = artefacts
        self._controller = (MemoryController(artefacts.heads)
                            if artefacts.heads is not None else None)
        self.tracker.set_rules(artefacts.rules)

    def on_event(self, name: str, stamp: float) -> None:
        """Feed one event of the events topic (node clock) to the anticipation tracker."""
        self.tracker.observe(name, stamp)

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counters[key] += n

    def apply(self, seq: int, active: tuple[str, ...] | list[str], embedding: np.ndarray,
              probabilities: dict[str, float], now: float | None = None) -> GateOutcome:
        """Decide what to keep and whether to compress/recall for one frame (never raises).

        ``now`` is the frame's node-clock stamp; without it anticipation is skipped.
        """
        out = GateOutcome(active=list(active))
        if now is not None and self.artefacts.rules is not None \
                and self.config.anticipation != "off":
            self._anticipate(out, now)
        table = self.artefacts.table
        if table is not None and self.config.value_mode != "off":
            out.value_mode = self.config.value_mode
            self._values(out, table, list(out.active), embedding, probabilities)
        if self._controller is not None:
            self._memory(out, seq, embedding)
        return out

    def _anticipate(self, out: GateOutcome, now: float) -> None:
        held = self.tracker.active(now)
        out.anticipating = {label: a.record(now) for label, a in held.items()}
        out.active, dropped, added = merge_anticipation(
            out.active, list(held), self.tracker.labels, self.config.anticipation)
        for label in dropped:
            out.suppressed[label] = "not_anticipated"
        if dropped:
            self._count("anticipation_dropped", len(dropped))
        if added:
            self._count("anticipation_added", len(added))

    def epsilon(self, table: ValueTable) -> float:
        """eps_t = eps0 * exp(-beta * t / value_horizon) (eps0, beta from the table's config)."""
        cfg = table.config
        return float(cfg.eps0 * np.exp(-cfg.beta * self._t / self.config.value_horizon))

    def _values(self, out: GateOutcome, table: ValueTable, active, embedding,
                probabilities: dict[str, float]) -> None:
        try:
            ranked = table.rerank(embedding, list(active), probabilities)
        except ValueError as exc:  # a malformed embedding: keep the policy's activation
            out.value_mode = f"{self.config.value_mode} (skipped: {exc})"
            return
        explored = False
        if self.config.value_mode == "learn":
            explored = bool(self._rng.random() < self.epsilon(table))
            self._t += 1
        out.cluster, out.explored = ranked.cluster, explored
        out.values, out.uncertainties = ranked.worth, ranked.uncertainty
        if explored:  # exploration keeps every activation, still ranked
            out.active = ranked.kept + [g for g in active if g in ranked.suppressed]
            self._count("value_explored")
            return
        out.active = ranked.kept
        out.suppressed = {**out.suppressed, **ranked.suppressed}
        if ranked.suppressed:
            self._count("value_suppressed", len(ranked.suppressed))

    def _memory(self, out: GateOutcome, seq: int, embedding: np.ndarray) -> None:
        situation = Situation(self.robot_id, self.session_id, np.zeros((0, 0)), embedding)
        result = self._controller.step(situation)
        for rec in result.records:
            if rec.rule == "head_error":
                self._count("memctl_head_errors")
                out.memctl_error = rec.detail
            elif rec.rule == "missing_id":
                self._count("memctl_missing_id")
                out.memctl_error = rec.detail
        if result.p_compress is None:
            return
        heads = self.artefacts.heads
        out.p_compress, out.p_recall = result.p_compress, result.p_recall
        out.compress = result.p_compress >= heads.compress.threshold
        out.recall = result.p_recall >= heads.recall.threshold
        if out.compress:
            self._count("memctl_compress")
        if out.recall:
            self._count("memctl_recall")
            if self._submit is not None:
                self._submit(seq, embedding)

    def record_recall(self, evidence: list[dict] | None, error: str | None) -> None:
        """Count one finished recall (evidence published, or a failure)."""
        ok = error is None and evidence is not None
        self._count("recall_evidence" if ok else "recall_errors")
        with self._lock:
            self.last_recall_error = "" if ok else (error or "no evidence")

    def stats(self) -> dict:
        """Cumulative counters for /diagnostics, plus the latest recall error ('' = none)."""
        tracker = {f"anticipation_{k}": v for k, v in self.tracker.stats().items()}
        with self._lock:
            return {**self.counters, **tracker, "last_recall_error": self.last_recall_error}
