"""The consolidator service: receive, store, trigger, discover, retrain, gate, sign, push.

One process wraps the pieces others built: ``ExperienceReceiver`` (ROUTER, commit before
ACK) feeds ``ExperienceStore`` and, through its ``on_stored`` hook, the
``ConsolidationTrigger``'s temporary buffer. When the trigger fires (period, buffer size,
novelty, repeated failure) -- or when ``run_round()`` is called directly -- a round runs:

1. read the store: each episode's event history, and the experiences that are new to the
   running bundle (rows after its mark, ``round_marks``; every row for a bundle without
   one) plus a bounded reservoir of older episodes (``round_read``);
2. discovery over the episodes (``discovery.discover``), folded into the persistent
   knowledge units (``knowledge.consolidate`` + ``KnowledgeStore``, same SQLite file);
3. material D U D_dir U D_disc: D is the training set behind the published bundle
   (``rehearsal.load_rehearsal``: saved by the round that published it, or rebuilt from
   the shipped bundle's recipe), D_dir and D_disc the round's new direct and discovered
   material; anchored warm-start retraining from the published bundle on all of it
   (``retrain.anchored_finetune``: distillation from the running bundle, its weights at a
   small learning rate), export of the candidate to ``<publish_dir>/staging``, and the
   new D (capped) staged beside it;
4. the validation gate (``gate.validate``): fresh world streams replayed through the
   node's SituationBuffer plus the held-out direct episodes and the held-out slice of D
   (``RetrainConfig.rehearsal_heldout_fraction``), a paired non-inferiority test on the
   base labels, rule probes. When it refuses the retrained candidate, the running policy
   itself (``retrain.keep_running``: same weights, silent rows for the new labels) is
   gated with the round's rules instead, so a round whose retraining would cost base
   skills still ships what it learned (rules, values, memory control) without making the
   robot worse (``RoundReport.policy`` / ``attempts`` say so);
5. on pass, the artefacts the bundle ships with are fitted from what the round read in the
   candidate's embedding and attached to it (values.npz from the rewards, memctl.npz from
   the hindsight labels; a kind the store cannot fit carries the running bundle's copy
   over, ``RoundReport.artefacts`` says which); the new D (held-out slice included) moves
   to ``<publish_dir>/rehearsal/v<N>.npz`` (its sha256 is in the signed manifest), signed
   publication as version N = current+1 (artefacts listed with their sha256 in the
   signed manifest) and a push to every robot connection the receiver has seen -- or,
   with ``ConsolidatorConfig.canary`` on, to the canary robots only: the loop then runs
   no round until the live figures promote the version to everyone, roll it back or hold
   (``consolidator.canary``).

Novelty score of a stored experience (for the trigger): 1.0 when its event history holds
a code this process has not seen before, else 0.0.

Shutdown: SIGTERM/SIGINT set a stop flag; a round in progress stops at its next step
boundary (never between writing and linking a bundle: publication is atomic), the
receiver finishes its batch and closes the store; exit status 0. Store commits are
transactions and bundles are renamed into place, so even SIGKILL leaves nothing half-written.
A store file found damaged or not writable (at start, by a write or by a round) stops the
service with one line naming it and exit status 2 (``ConsolidatorService.store_damaged``).
"""

from __future__ import annotations

if __name__ == "__main__":  # ``python -m``: a Ctrl-C while the imports below load exits 0
    import signal as _signal  # (the console script guards it in ``entry``)

    def _stop_while_loading(*_) -> None:
        raise SystemExit(0)

    _signal.signal(_signal.SIGINT, _stop_while_loading)

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from thinkmem_ros.consolidator.anticipation_export import build_rules, event_times
from thinkmem_ros.consolidator.canary import CanaryConfig, CanaryController, Decision
from thinkmem_ros.consolidator.discovery import DiscoveryConfig, discover
from thinkmem_ros.consolidator.discovery_log import (
    DEFAULT_DISCOVERY_EVENTS,
    carried_histories,
    log_from_rows,
)
from thinkmem_ros.consolidator.engine import ENGINES, make_engine
from thinkmem_ros.consolidator.gate import GateConfig, GateReport
from thinkmem_ros.consolidator.ingest import SignalSetFilter, open_receiver
from thinkmem_ros.consolidator.knowledge import KnowledgeConfig, KnowledgeStore, consolidate
from thinkmem_ros.consolidator.line_episodes import RefusedEpisodes, line_histories
from thinkmem_ros.consolidator.recall_server import (
    DEFAULT_MAX_AGE_S,
    DEFAULT_RECALL_EXPERIENCES,
    RecallServer,
    index_store,
)
from thinkmem_ros.consolidator.receive import check_store, option_message
from thinkmem_ros.consolidator.rehearsal import RehearsalConfig, RehearsalError
from thinkmem_ros.consolidator.retrain import NothingToTrain, RetrainConfig
from thinkmem_ros.consolidator.round_lock import RoundLock
from thinkmem_ros.consolidator.round_marks import RoundMarkError, RoundMarks
from thinkmem_ros.consolidator.round_read import (
    DEFAULT_RESERVOIR,
    DEFAULT_ROUND_EXPERIENCES,
    Reservoir,
    read_round,
)
from thinkmem_ros.consolidator.scan_cost import MAX_HISTORY_COST
from thinkmem_ros.consolidator.store import (
    DEFAULT_FLUSH_ROWS,
    ExperienceStore,
    StoreDamaged,
    StoreReadOnly,
    holds_store,
    is_damage,
    is_fatal,
)
from thinkmem_ros.consolidator.trigger import ConsolidationTrigger, TriggerConfig
from thinkmem_ros.core.arguments import OneLineParser
from thinkmem_ros.core.data import SituationSet
from thinkmem_ros.core.open_files import raise_open_files_limit
from thinkmem_ros.link.experience import LIMITS, Experience, check_robot_ids
from thinkmem_ros.link.receiver import ExperienceReceiver, ReceiverConfig
from thinkmem_ros.link.security import SecurityError, curve_enabled, curve_keys_problem
from thinkmem_ros.policy.anticipation_rules import RuleSet
from thinkmem_ros.policy.bundle import load_bundle

log = logging.getLogger(__name__)

MAX_CHECK_S = 3600.0
"""Longest trigger poll: the loop also decides canaries then, so longer is a stalled service."""
MAX_CANARY_WAIT_S = 30 * 86400.0
"""Longest canary wait: rounds stop while a canary is undecided, so 1e308 s (accepted while
inf was refused) held them back for good just the same."""
MAX_SEED = 2**32 - 1
"""Largest seed (numpy's legacy bound; torch takes it too): one seed for every generator."""
MAX_ENGINE_THREADS = 256
"""Most discovery threads: each holds one part's temporaries (~0.1-0.2 GB)."""


class RoundAborted(RuntimeError):
    """The service was asked to stop while a round was running; nothing was published."""


@dataclass
class ConsolidatorConfig:
    """Everything the service needs; nested configs are validated by their own classes."""

    db_path: Path | str = "consolidator.db"
    publish_dir: Path | str = "consolidator_bundles"
    signing_key: Path | str | None = None  # Ed25519 .sign.key from `thinkmem keys`
    # key chain (`thinkmem keys --rotate`) from the robots' first key to signing_key
    endorsements: Path | str | None = None
    initial_bundle: Path | str = ""  # '' = the shipped models/default
    bind: str = "tcp://127.0.0.1:5755"
    curve: str = "auto"
    server_secret_file: Path | str | None = None
    allowed_clients: Path | str | None = None
    max_frame_bytes: int = 8 * 1024 * 1024
    check_s: float = 1.0  # how often the loop asks the trigger
    partitions: int = 4  # temporal partitions of the episodes for discovery's stability test
    seed: int = 0
    trigger: TriggerConfig = field(default_factory=TriggerConfig)
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    knowledge: KnowledgeConfig = field(default_factory=KnowledgeConfig)
    retrain: RetrainConfig = field(default_factory=RetrainConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    rehearsal: RehearsalConfig = field(default_factory=RehearsalConfig)
    canary: CanaryConfig = field(default_factory=CanaryConfig)  # off by default
    # serve episodic recall (RECALL_REQ) here, e.g. tcp://0.0.0.0:5757; None = not served
    recall_bind: str | None = None
    # the recall index holds the newest this many experiences (0 = every stored one): it
    # is re-embedded by every new bundle and held in memory (~1.8 KB each at d = 448)
    recall_experiences: int = DEFAULT_RECALL_EXPERIENCES
    # a recall request still waiting this long is dropped unanswered (its robot gave up)
    recall_max_age_s: float = DEFAULT_MAX_AGE_S
    flush_rows: int = DEFAULT_FLUSH_ROWS  # stored rows that move into the lake (0 = never)
    # experiences a round decodes at most (whole episodes, seeded sample; 0 = every one)
    round_experiences: int = DEFAULT_ROUND_EXPERIENCES
    # a round on a bundle this store trained reads the rows after its mark plus at most
    # this many experiences of older episodes (``round_read``); False: every round reads
    # the whole store (within round_experiences), as a first round does
    incremental_rounds: bool = True
    round_reservoir: int = DEFAULT_RESERVOIR
    # discovery reads each robot's newest episode histories up to this many events in all,
    # as the scan counts them (an event among many distinct names counts more; ``scan_cost``),
    # whole episodes shared fairly between robots (0 = every episode the store carries):
    # its memory and time stay bounded as the store grows, whatever robots send; older
    # evidence lives on in the knowledge units' confidences
    discovery_events: int = DEFAULT_DISCOVERY_EVENTS
    # where discovery's passes over the log's parts, material building and retraining run:
    # "embedded" (this process) or "ray" (tasks and Ray Train workers on the Ray cluster at
    # engine_address; None = a local one)
    engine: str = "embedded"
    engine_address: str | None = None
    # threads of this process that discovery's passes and tests use (0 = the cores it may
    # run on, at most 4); each holds one part's or bucket's temporaries
    engine_threads: int = 0
    train_workers: int = 2  # with engine "ray": Ray Train workers (torch DDP) that retrain
    # when the gate refuses the retrained candidate, gate the running policy with the
    # round's rules and artefacts instead (``RoundReport.policy``)
    keep_policy_fallback: bool = True

    @property
    def recall_curve(self) -> bool:
        """True when recall answers only allow-listed CURVE keys (the receiver's keys)."""
        return self.server_secret_file is not None and self.allowed_clients is not None

    def _check_recall_curve(self) -> None:
        """Refuse a recall endpoint others can reach without keys, as the receiver's bind.

        Why: the answers name the fleet's robots, episodes, labels and rewards.
        """
        if self.recall_bind is None:
            return
        try:
            curve_enabled(self.curve, self.recall_bind, self.recall_curve)
        except SecurityError as exc:
            raise ValueError(f"ConsolidatorConfig.recall_bind: {exc}") from None

    def __post_init__(self) -> None:
        self.db_path, self.publish_dir = Path(self.db_path), Path(self.publish_dir)
        if self.signing_key is None:
            raise ValueError("ConsolidatorConfig.signing_key is required: robots refuse "
                             "unsigned bundles (create one with `thinkmem keys`)")
        if not self.bind or "://" not in self.bind:
            raise ValueError(f"ConsolidatorConfig.bind must look like tcp://host:port, "
                             f"got {self.bind!r}")
        problem = curve_keys_problem("ConsolidatorConfig", self.curve,
                                     self.server_secret_file, self.allowed_clients)
        if problem:
            raise ValueError(problem)
        if self.recall_bind is not None and "://" not in self.recall_bind:
            raise ValueError(f"ConsolidatorConfig.recall_bind must look like "
                             f"tcp://host:port, got {self.recall_bind!r}")
        self._check_recall_curve()
        if not 0 < self.recall_max_age_s <= 60:
            raise ValueError(f"ConsolidatorConfig.recall_max_age_s must be in (0, 60], got "
                             f"{self.recall_max_age_s!r}")
        # flush_rows, round_experiences: 0 = off; engine_threads: 0 = automatic
        for name, low in (("flush_rows", 0), ("partitions", 1), ("train_workers", 1),
                          ("round_experiences", 0), ("engine_threads", 0),
                          ("round_reservoir", 0), ("recall_experiences", 0),
                          ("discovery_events", 0)):
            if getattr(self, name) < low:
                raise ValueError(f"ConsolidatorConfig.{name} must be >= {low}, got "
                                 f"{getattr(self, name)}")
        if isinstance(self.discovery_events, bool) or not isinstance(self.discovery_events,
                                                                     int):
            raise ValueError(f"ConsolidatorConfig.discovery_events must be a whole number, "
                             f"got {self.discovery_events!r}")
        if 0 < self.discovery_events < MAX_HISTORY_COST:
            # a robot's newest episode alone could cost more: that robot would be read not
            # at all
            raise ValueError(f"ConsolidatorConfig.discovery_events must be 0 (every episode) "
                             f"or at least {MAX_HISTORY_COST} (what one history of "
                             f"{LIMITS['max_events']} events can cost the scan), got "
                             f"{self.discovery_events}")
        if self.engine not in ENGINES:
            raise ValueError(f"ConsolidatorConfig.engine must be one of {', '.join(ENGINES)}, "
                             f"got {self.engine!r}")
        if self.engine_address is not None and self.engine != "ray":
            raise ValueError("ConsolidatorConfig.engine_address only applies to engine 'ray'")
        for name, kind in (("trigger", TriggerConfig), ("discovery", DiscoveryConfig),
                           ("knowledge", KnowledgeConfig), ("retrain", RetrainConfig),
                           ("gate", GateConfig), ("rehearsal", RehearsalConfig),
                           ("canary", CanaryConfig)):
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"ConsolidatorConfig.{name} must be a {kind.__name__}, got "
                                 f"{type(getattr(self, name)).__name__}")
        self._check_bounds()

    def _check_bounds(self) -> None:
        """Refuse durations, seeds and thread counts that pass ``> 0`` but cannot work.

        Why: ``check_s`` inf or 1e12 passed, the service printed READY and then died on an
        OverflowError from the loop's wait; an infinite (or 1e308 s) canary wait blocks
        every round for good; a negative seed failed only in a round (numpy refuses it);
        100,000 threads exhaust the process long before they speed discovery up.
        """
        if not 0 < self.check_s <= MAX_CHECK_S:  # NaN too
            raise ValueError(f"ConsolidatorConfig.check_s must be > 0 and <= "
                             f"{MAX_CHECK_S:g} seconds, got {self.check_s}")
        if not self.canary.max_wait_s <= MAX_CANARY_WAIT_S:  # inf and NaN too
            raise ValueError(f"CanaryConfig.max_wait_s must be a finite number of seconds, at "
                             f"most {MAX_CANARY_WAIT_S:g} (30 days: an undecided canary holds "
                             f"back every round until then), got {self.canary.max_wait_s}")
        if not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"ConsolidatorConfig.seed must be in [0, {MAX_SEED}], got "
                             f"{self.seed}")
        if self.engine_threads > MAX_ENGINE_THREADS:
            raise ValueError(f"ConsolidatorConfig.engine_threads must be in [0, "
                             f"{MAX_ENGINE_THREADS}] (0 = the cores this process may use), "
                             f"got {self.engine_threads}")
        if self.train_workers > MAX_ENGINE_THREADS:  # each is a process holding a model copy
            raise ValueError(f"ConsolidatorConfig.train_workers must be in [1, "
                             f"{MAX_ENGINE_THREADS}], got {self.train_workers}")


@dataclass
class RoundReport:
    """What one round did; logged as one line and returned to callers (tests, demo)."""

    reason: str
    experiences: int = 0  # what the round read (at most round_experiences)
    # how it read: {"since_id", "through_id", "new", "reservoir"} (``round_read.RoundRead``)
    read: dict = field(default_factory=dict)
    episodes: int = 0
    stored_experiences: int = 0  # what the store held (every signal set)
    engine: str = ""  # where retraining ran: "embedded", or "ray (N Ray Train workers)"
    candidates: int = 0
    accepted: int = 0
    promoted: list[str] = field(default_factory=list)
    # significant relations refused only until the history can judge them (an element no
    # real case tests yet): more missions may promote them (``Relation.waiting``)
    waiting: list[str] = field(default_factory=list)
    material: dict = field(default_factory=dict)
    gate: GateReport | None = None
    published_version: int | None = None
    pushed_to: int | None = None
    outcome: str = ""
    seconds: float = 0.0
    # seconds per step ("read_s", "discovery_s", "material_s", "retrain_s", "gate_s",
    # "artefacts_s", "publish_s"); discovery's own split: "discovery_scan_s" (candidates
    # and the family-wide tests), "discovery_checks_s" (per-pattern checks),
    # "discovery_redundancy_s"
    timings: dict = field(default_factory=dict)
    # per artefact kind ("values", "memctl") of a gated candidate: {"status": "fitted"}
    # (learned from the store this round, with what it saw), "carried" (the store lacked
    # what the fit needs; the running bundle's copy ships again, "reason" says why) or
    # "none" (neither: the bundle ships without it, "reason" says why)
    artefacts: dict = field(default_factory=dict)
    # the policy the candidate carries: "retrained", or "kept v<N>" when the gate refused
    # the retrained one and the round shipped its rules and artefacts with the running
    # policy (``retrain.keep_running``); ``attempts`` holds each refused candidate's reasons
    policy: str = ""
    attempts: list = field(default_factory=list)
    canaries: list[str] | None = None  # the robots a canary publication went to

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return asdict(self)


class ConsolidatorService:
    """The offboard consolidator; ``run_round()`` for one round, ``serve()`` for the loop."""

    def __init__(self, config: ConsolidatorConfig) -> None:
        from thinkmem_ros.consolidator.publish import PublishConfig, Publisher
        from thinkmem_ros.core.paths import resolve_bundle_path

        self.config = config
        self.stop_event = threading.Event()
        self.trigger = ConsolidationTrigger(config.trigger)
        self._trigger_lock = threading.Lock()
        self._engine = None  # discovery's engine, made on the first round
        self._seen_events: set[str] = set()
        self._refused = RefusedEpisodes()  # episodes of other lines, judged once each
        self.publisher = Publisher(PublishConfig(config.publish_dir, config.signing_key,
                                                 endorsements=config.endorsements),
                                   resolve_bundle_path(config.initial_bundle))
        self.receiver: ExperienceReceiver | None = None
        self.rounds: list[RoundReport] = []
        # this service is one bundle line: experiences of other signal sets are refused
        # (counted in ``accept.refused``); run one consolidator per signal set
        self.accept = SignalSetFilter(self._line_bundles())
        self.canary = CanaryController(config.canary, self.publisher)
        self.recall: RecallServer | None = None
        self._recall_version = -1
        self.failure: str | None = None  # why the service stopped itself (a damaged store)
        self.canary.resume(self._stored_after)

    # ---- lifecycle
    def start(self) -> ConsolidatorService:
        """Bind the receiver and start ingesting on its thread."""
        cfg = self.config
        self.receiver = open_receiver(ReceiverConfig(
            bind=cfg.bind, db_path=cfg.db_path, curve=cfg.curve,
            server_secret_file=cfg.server_secret_file, allowed_clients=cfg.allowed_clients,
            max_frame_bytes=cfg.max_frame_bytes, on_stored=self._on_stored),
            accept=self.accept, flush_rows=cfg.flush_rows,
            on_damaged=self.store_damaged).start()
        if cfg.recall_bind is not None:
            current = self.publisher.current()
            self.recall = RecallServer(
                index_store(cfg.db_path, current, limit=cfg.recall_experiences),
                cfg.recall_bind, max_age_s=cfg.recall_max_age_s,
                **self._recall_keys()).start()
            self._recall_version = current.version
            log.info("recall served on %s (%d experiences, embedded by v%d)",
                     self.recall.endpoint, len(self.recall.index), current.version)
        return self

    def _recall_keys(self) -> dict:
        """The receiver's key pair and allow-list for the recall socket (none: no CURVE).

        The allow-list is the receiver's, read at each turn, so a key revoked by an
        edit the receiver picked up is refused by recall too.
        """
        if not self.config.recall_curve:
            return {}
        receiver = self.receiver
        return {"server_secret_file": self.config.server_secret_file,
                "allowed_clients": lambda: receiver.allow_list}

    def refresh_recall(self) -> bool:
        """Rebuild the recall index when ``current`` moved; True if it was rebuilt.

        Robots ask with their running model's embedding, so the index is re-embedded by
        the new ``current`` (and picks up the experiences stored since the last build).
        """
        if self.recall is None:
            return False
        current = self.publisher.current()
        if current.version == self._recall_version:
            return False
        self.recall.replace_index(index_store(self.config.db_path, current,
                                              limit=self.config.recall_experiences))
        self._recall_version = current.version
        log.info("recall index rebuilt by v%d: %d experiences", current.version,
                 len(self.recall.index))
        return True

    def _line_bundles(self) -> list:
        """The initial bundle and every published version still in the history."""
        bundles = [self.publisher.initial]
        for version in self.publisher.versions():
            try:
                bundles.append(load_bundle(self.publisher.history / f"v{version:06d}"))
            except Exception:  # noqa: BLE001 - an unreadable old version serves no robot
                log.warning("history version %d unreadable; its robots are refused", version)
        return bundles

    @property
    def endpoint(self) -> str:
        """The bound endpoint (with the real port when bound to ``:*``)."""
        if self.receiver is None:
            raise RuntimeError("service not started")
        return self.receiver.endpoint

    def stop(self) -> None:
        """Ask the loop and any running round to stop; the receiver closes its store."""
        self.stop_event.set()

    def store_damaged(self, exc: BaseException) -> None:
        """Stop the service: the store file is damaged or cannot be written (a write, a round).

        Serving on would refuse every batch and fail every round on the same file while
        looking healthy, and could spread the damage with more writes. Stopping loses
        nothing (robots keep what was not acknowledged) and the non-zero exit makes the
        supervisor and the operator see it; ``failure`` is the one line the exit prints.
        """
        text = " ".join(str(exc).split()) or type(exc).__name__
        if self.failure is None:
            self.failure = text if isinstance(exc, (StoreDamaged, StoreReadOnly)) else (
                f"{self.config.db_path}: the store file is damaged (SQLite: {text})"
                if is_damage(exc) else
                f"{self.config.db_path}: the store cannot be written (SQLite: {text})")
        self.stop()

    def _discovery_engine(self):
        """The engine discovery's passes run on, started on first use (Ray takes seconds)."""
        if self._engine is None:
            self._engine = make_engine(self.config.engine, self.config.engine_address,
                                       threads=self.config.engine_threads or None)
        return self._engine

    def close(self) -> None:
        """Stop and release the receiver, the recall server and the engine (idempotent)."""
        self.stop()
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        if self.receiver is not None:
            self.receiver.stop()
            self.receiver = None
        if self.recall is not None:
            self.recall.close()
            self.recall = None

    def __enter__(self) -> ConsolidatorService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def serve(self) -> None:
        """Run rounds whenever the trigger fires, until ``stop()`` (SIGTERM/SIGINT)."""
        while not self.stop_event.wait(self.config.check_s):
            if self.canary.pending is not None:  # no round on top of an undecided version
                self.check_canary()
                continue
            with self._trigger_lock:
                reason = self.trigger.reason()
            if reason is None:
                continue
            try:
                self.run_round(reason)
            except RoundAborted:
                log.info("round aborted: stopping")
            except RehearsalError as exc:  # the bundle's material: said in one line, no trace
                log.error("consolidation round failed: %s", exc)
            except Exception as exc:  # keep serving; the next trigger retries
                if is_fatal(exc):  # no retry mends it: stop (``store_damaged``)
                    self.store_damaged(exc)
                    return
                log.exception("consolidation round failed")

    # ---- ingestion hook (receiver thread)
    def _on_stored(self, experiences: list[Experience]) -> None:
        experiences = [e for e in experiences if self.accept.reason(e) is None]
        with self._trigger_lock:
            for exp in experiences:
                novel = any(e not in self._seen_events for e in exp.events)
                self._seen_events.update(exp.events)
                self.trigger.observe(exp.key, novelty=1.0 if novel else 0.0, reward=exp.reward)
        self.canary.observe(experiences)

    def _stored_after(self, mark: int) -> Iterator[Experience]:
        """Experiences of this line stored after row id ``mark``."""
        with ExperienceStore(self.config.db_path) as store:
            yield from (e for e in store.iter_all(after_id=mark)
                        if self.accept.reason(e) is None)

    def check_canary(self) -> Decision | None:
        """Decide on a pending canary and act on it (promote, roll back, hold, or wait)."""
        push = self.receiver.push_bundle if self.receiver is not None else None
        try:
            decision = self.canary.check(push)
        except Exception:  # keep serving; the next check retries
            log.exception("canary check failed")
            return None
        if decision is not None and decision.published_version is not None:
            self.accept.serve(load_bundle(self.publisher.history
                                          / f"v{decision.published_version:06d}"))
            self._refresh_recall_safely()
        return decision

    def _refresh_recall_safely(self) -> None:
        try:
            self.refresh_recall()
        except Exception:  # keep serving the old index; the next publication retries
            log.exception("recall index not rebuilt; the previous one is still served")

    # ---- one round
    def run_round(self, reason: str = "manual") -> RoundReport:
        """Discover, internalise, gate and publish once; returns what happened."""
        start = time.perf_counter()
        report = RoundReport(reason=reason)
        if self.canary.pending is not None:  # the trigger keeps its buffer for later
            report.outcome = f"skipped: canary v{self.canary.pending.version} undecided"
            self.rounds.append(report)
            self._log(report)
            return report
        try:
            self._round(report)
        except RoundAborted:
            report.outcome = "aborted (stop requested): nothing published"
            raise
        finally:
            report.seconds = round(time.perf_counter() - start, 3)
            with self._trigger_lock:
                self.trigger.consolidated()
            self.rounds.append(report)
            self._log(report)
        if report.published_version is not None and report.canaries is None:
            self._refresh_recall_safely()
        return report

    def _check_stop(self) -> None:
        if self.stop_event.is_set():
            raise RoundAborted("stop requested")

    def _round(self, report: RoundReport) -> None:
        from thinkmem_ros.consolidator.gate import validate
        from thinkmem_ros.consolidator.rehearsal import (
            cap,
            install,
            load_rehearsal,
            save_rehearsal,
        )
        from thinkmem_ros.consolidator.retrain import (
            assemble,
            export_candidate,
            keep_running,
            retrain,
        )

        cfg = self.config
        t = time.perf_counter()
        current = self.publisher.current()
        previous = load_rehearsal(current, cfg.publish_dir, cfg.rehearsal)
        with ExperienceStore(cfg.db_path) as store:
            since, carried = self._mark(current, previous)
            if since > store.last_id():  # no row id of this store: damaged, read it all
                log.warning("the round mark %d is past the store's newest row %d: this "
                            "round reads the whole store", since, store.last_id())
                since, carried = 0, None
            read = read_round(store, cfg.round_experiences, cfg.seed,
                              lambda e: self.accept.reason(e) is None,  # another line's
                              since_id=since, reservoir=cfg.round_reservoir, carried=carried)
            experiences = read.experiences
            # discovery's input: the histories carried in the store, the new rows folded in,
            # of this line's episodes only
            histories, folded = line_histories(
                store, *carried_histories(store, cfg.discovery_events),
                self._refused.of(store, frozenset(self.accept.served)), cfg.discovery_events)
            log_, _ = log_from_rows(histories, cfg.partitions)
            del histories
        report.experiences, report.episodes = len(experiences), len(log_.episode_ids)
        report.stored_experiences = read.stored
        report.read = {"since_id": read.since_id, "through_id": read.through_id,
                       "new": read.new, "reservoir": read.reservoir,
                       "histories": folded}
        report.timings["read_s"] = round(time.perf_counter() - t, 3)
        self._check_stop()
        t = time.perf_counter()
        with KnowledgeStore(cfg.db_path) as kstore:
            units = kstore.units()
            round_index = max((u.updated_round for u in units.values()), default=0) + 1
            if log_.n_codes and len(log_.episode_ids) >= 2:
                rng = np.random.default_rng([cfg.seed, round_index])
                result = discover(log_, cfg.discovery, rng, engine=self._discovery_engine())
                report.candidates = sum(len(c) for c in result.candidates.values())
                report.accepted = len(result.accepted)
                report.waiting = [">".join(r.pattern) for r in result.scored if r.waiting]
                report.timings.update({f"discovery_{step}_s": round(seconds, 3) for
                                       step, seconds in result.notes["step_s"].items()})
                consolidate(units, result, round_index, cfg.knowledge)
                kstore.save(units.values())
        promoted = [u for u in units.values() if u.active]
        report.promoted = [u.key for u in promoted]
        report.timings["discovery_s"] = round(time.perf_counter() - t, 3)
        self._check_stop()
        t = time.perf_counter()
        try:
            material = assemble(experiences, promoted, current, cfg.retrain,
                                rehearsal=previous.data,
                                engine=None if cfg.engine == "embedded"
                                else self._discovery_engine())
        except NothingToTrain as exc:
            report.outcome = f"no retraining: {exc}"
            return
        report.material = {**material.counts, "rehearsal_source": previous.source}
        report.timings["material_s"] = round(time.perf_counter() - t, 3)
        self._check_stop()
        t = time.perf_counter()
        if cfg.engine == "ray":
            from thinkmem_ros.consolidator.retrain_ray import retrain_on_ray

            self._discovery_engine()  # joins the engine's cluster
            trained = retrain_on_ray(material, current, cfg.retrain, workers=cfg.train_workers)
            report.engine = f"ray ({cfg.train_workers} Ray Train workers)"
        else:
            trained = retrain(material, current, cfg.retrain)
            report.engine = "embedded"
        report.timings["retrain_s"] = round(time.perf_counter() - t, 3)
        self._check_stop()
        t = time.perf_counter()
        version = self.publisher.next_version()
        staging = cfg.publish_dir / "staging" / f"v{version:06d}"
        kept = staging.with_name(staging.name + ".rehearsal.npz")  # D U D_dir U D_disc
        # the held-out slice of D was only set aside for this round's gate: it stays in D
        grown = [p for p in (material.train, material.heldout_rehearsal) if p is not None]
        kept_data = cap(SituationSet.concat(grown) if len(grown) > 1 else grown[0],
                        cfg.rehearsal.max_rows, np.random.default_rng([cfg.seed, 4, round_index]))
        sha = save_rehearsal(kept_data, kept)
        rehearsal_info = {"sha256": sha, "rows": len(kept_data), "trained_rows":
                          len(material.train), "previous": previous.source,
                          "previous_rows": len(previous)}
        candidate = export_candidate(trained, staging, model_version=version, current=current,
                                     material=material,
                                     extras={"round": round_index, "rehearsal": rehearsal_info})
        # the promoted units as the robot will track them, bounds from the observed gaps
        rules = build_rules(promoted, event_times(experiences), info={"round": round_index})
        report.gate = validate(candidate, current, trained, material.heldout, promoted,
                               cfg.gate, np.random.default_rng([cfg.seed, 2, round_index]),
                               rehearsal_heldout=material.heldout_rehearsal, rules=rules)
        report.policy = "retrained"
        if not report.gate.passed and cfg.keep_policy_fallback:
            # the retrained policy is not shown to be as good as the running one: ship what
            # the round learned (rules, values, memory control) with the running policy
            report.attempts.append({"policy": "retrained", "passed": False,
                                    "reasons": list(report.gate.reasons)})
            kept_policy = keep_running(material, current)
            candidate = export_candidate(
                kept_policy, staging, model_version=version, current=current,
                material=material, extras={"round": round_index, "rehearsal": rehearsal_info,
                                           "policy_kept_from": current.version})
            report.gate = validate(candidate, current, kept_policy, material.heldout, promoted,
                                   cfg.gate, np.random.default_rng([cfg.seed, 2, round_index]),
                                   rehearsal_heldout=material.heldout_rehearsal, rules=rules)
            report.policy = f"kept v{current.version}"
        report.timings["gate_s"] = round(time.perf_counter() - t, 3)
        if not report.gate.passed:
            kept.unlink(missing_ok=True)
            report.outcome = "rejected by the gate"
            return
        self._check_stop()
        t = time.perf_counter()
        report.artefacts = self._artefacts(experiences, candidate, current, staging, rules)
        candidate = load_bundle(staging)
        report.timings["artefacts_s"] = round(time.perf_counter() - t, 3)
        self._check_stop()
        t = time.perf_counter()
        # D goes in place before the bundle is linked: a published version always has its D
        install(kept, cfg.publish_dir, version)
        push = self.receiver.push_bundle if self.receiver is not None else None
        if cfg.canary.enabled and self.receiver is not None:
            with ExperienceStore(cfg.db_path) as store:
                mark = store.last_id()
            publication = self.canary.publish(candidate, current, self.receiver.peers.values(),
                                              push, store_mark=mark)
            report.canaries = sorted(self.canary.pending.selector.chosen)
        else:
            publication = self.publisher.publish(candidate, push=push)
        report.published_version, report.pushed_to = publication.version, publication.pushed_to
        try:  # D now covers the rows this round read
            with RoundMarks(cfg.db_path) as marks:
                marks.record(sha, read.through_id, publication.version, read.next_reservoir,
                             cfg.round_reservoir, cfg.seed)
        except RoundMarkError as exc:  # published all the same; the next round reads it all
            log.warning("%s: the next round reads the whole store", exc)
        self.accept.serve(load_bundle(publication.path))
        report.timings["publish_s"] = round(time.perf_counter() - t, 3)
        report.outcome = "published" if report.canaries is None else "published to canaries"

    def _mark(self, current, previous) -> tuple[int, Reservoir | None]:
        """The running bundle's mark (0: read the whole store) and recorded reservoir.

        The mark is the row id it learned through; the reservoir None means: choose one
        from the row counts. Only a bundle whose D this store's rounds saved
        (``previous.source == "saved"``) has a mark: D is what carries the older rows'
        direct material into the round.
        """
        cfg = self.config
        if not cfg.incremental_rounds or previous.source != "saved":
            return 0, None
        sha = ((current.manifest.extras or {}).get("rehearsal") or {}).get("sha256")
        try:
            with RoundMarks(cfg.db_path) as marks:
                since = marks.through(sha)
                try:
                    return since, marks.reservoir(sha, cfg.round_reservoir, cfg.seed)
                except RoundMarkError as exc:  # the mark stands; the reservoir is chosen
                    log.warning("%s: the reservoir is chosen again", exc)
                    return since, None
        except RoundMarkError as exc:  # reading everything is slower, never wrong
            log.warning("%s: this round reads the whole store", exc)
            return 0, None

    def _artefacts(self, experiences: list[Experience], candidate, current, staging: Path,
                   rules: RuleSet) -> dict:
        """Fit the value table and memory-control probes the candidate ships with; add rules.

        The rule set (the promoted units with gap bounds learned from the store) always
        ships, even empty: a bundle without rules tells the robot to stop anticipating the
        previous bundle's.

        Both are learned in the candidate's embedding (the robot keys them with the policy
        it runs) from what the round read: the rows new to the running bundle and the
        reservoir of older episodes (``round_read``). A kind the store cannot fit (too few
        rewards or judged experiences, one class only, a failed fit) carries the running
        bundle's copy over when it has one, with the reason in the report: the robot keeps
        what it had rather than losing it with the swap. A carried table was learned in the
        previous policy's embedding; clusters match less well until a round can refit it.
        """
        import shutil

        from thinkmem_ros.consolidator.memctl_train import fit_round_memctl
        from thinkmem_ros.consolidator.publish import attach_artefacts, listed_artefact_kinds
        from thinkmem_ros.consolidator.values import fit_round_values
        from thinkmem_ros.policy.runtime import PolicyRuntime

        work = staging.with_name(staging.name + ".artefacts")
        shutil.rmtree(work, ignore_errors=True)
        runtime = PolicyRuntime(candidate, threads=1)
        fits = {"values": lambda folder: fit_round_values(experiences, runtime, folder),
                "memctl": lambda folder: fit_round_memctl(experiences, runtime, folder,
                                                          seed=self.config.seed)}
        previous = set(listed_artefact_kinds(current))
        sources: dict[str, Path] = {}
        out: dict[str, dict] = {}
        for kind, fit in fits.items():
            try:
                info = fit(work / kind)
            except Exception as exc:  # noqa: BLE001 - a failed fit must not cost the round
                log.exception("fitting %s failed", kind)
                info = {"status": "missing", "reason": f"fit failed: {type(exc).__name__}: "
                        f"{exc}"}
            if info["status"] == "fitted":
                sources[kind] = work / kind
            elif kind in previous:
                info = {"status": "carried", "from_version": current.version,
                        "reason": info["reason"]}
                sources[kind] = current.path
            else:
                info = {"status": "none", "reason": f"{info['reason']}; bundle "
                        f"v{current.version} has none to carry over"}
            out[kind] = info
        rules.save(work / "rules")
        sources["rules"] = work / "rules"
        out["rules"] = {"status": "fitted", "rules": [r.key for r in rules.rules],
                        "horizons_s": {r.key: round(r.horizon_s, 2) for r in rules.rules}}
        attach_artefacts(staging, sources)
        shutil.rmtree(work, ignore_errors=True)
        return out

    @staticmethod
    def _log(report: RoundReport) -> None:
        gate = "n/a" if report.gate is None else (
            "pass" if report.gate.passed else "REJECT: " + "; ".join(report.gate.reasons))
        read = report.read or {}
        how = (f"{read.get('new', 0)} after row {read['since_id']} + "
               f"{read.get('reservoir', 0)} reservoir" if read.get("since_id") else "whole store")
        horizon = (read.get("histories") or {}).get("horizon") or {}
        refused = (read.get("histories") or {}).get("refused_episodes")
        episodes = (f"{report.episodes} episodes ({horizon['left_out_episodes']} left out "
                    f"beyond the {horizon['max_events']:,}-event horizon)"
                    if horizon.get("left_out_episodes") else f"{report.episodes} episodes")
        if refused:
            episodes += f" ({refused} of other signal sets not read)"
        log.info("round (trigger %s): %d of %d stored experiences read (%s), %s; %d "
                 "candidates, %d "
                 "accepted, promoted %s, waiting for more evidence %s; material %s; gate %s "
                 "(policy %s); artefacts %s; %s%s in %.2f s",
                 report.reason, report.experiences, report.stored_experiences, how,
                 episodes, report.candidates,
                 report.accepted, report.promoted or "none", _capped(report.waiting),
                 report.material or "none", gate,
                 report.policy or "n/a",
                 {k: v["status"] for k, v in report.artefacts.items()} or "n/a",
                 report.outcome, _pushed(report), report.seconds)


def _pushed(report: RoundReport) -> str:
    """What the log line says of a publication: the version and where it went.

    Why: a round with no receiver in its process (``--once``, a caller's ``run_round``)
    pushes to nobody, and the line read "published v2 to None robots".
    """
    if report.published_version is None:
        return ""
    version, robots = report.published_version, report.pushed_to
    if robots is None:
        return (f" v{version}, pushed to no robot from this process (it runs no receiver: "
                f"one serving the publish dir pushes it)")
    return f" v{version} to {robots} robot{'' if robots == 1 else 's'}"


LOGGED_NAMES = 8
"""Names a round's log line lists of a long list; the report keeps them all."""


def _capped(names: list[str]) -> str:
    """``names`` for one log line: the first ``LOGGED_NAMES`` and how many more."""
    if not names:
        return "none"
    shown = ", ".join(names[:LOGGED_NAMES])
    more = len(names) - LOGGED_NAMES
    return f"[{shown}{f' and {more} more' if more > 0 else ''}]"


# ------------------------------------------------------------------------------ entry point

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``thinkmem_consolidator`` and ``thinkmem consolidator``."""
    parser.add_argument("--db", default="consolidator.db", help="SQLite store (experiences, "
                        "knowledge)")
    parser.add_argument("--publish-dir", default="consolidator_bundles",
                        help="published bundles: history/ and the current link")
    # checked by ConsolidatorConfig (one-line error), not argparse: `thinkmem consolidator
    # receive` shares these options and signs nothing
    parser.add_argument("--signing-key", default=None,
                        help="Ed25519 .sign.key file (required to run rounds)")
    parser.add_argument("--endorsements", default=None,
                        help="key chain file (`thinkmem keys --rotate`): shipped in every "
                             "bundle so robots that know an older key accept the new one")
    parser.add_argument("--initial-bundle", default="", help="bundle the robots run at first "
                        "(default: the shipped models/default)")
    parser.add_argument("--bind", default="tcp://127.0.0.1:5755", help="ZeroMQ endpoint")
    parser.add_argument("--curve", default="auto", choices=("auto", "on", "off"))
    parser.add_argument("--server-key", help="consolidator .key_secret file (CURVE)")
    parser.add_argument("--allow", help="allow-list (CURVE): a folder of <robot_id>.key "
                        "files, a TOML [robots] map, or one <robot_id>.key")
    parser.add_argument("--period-s", type=float, default=300.0,
                        help="trigger: seconds between periodic rounds (inf: none, the other "
                        "triggers only)")
    parser.add_argument("--buffer-limit", type=int, default=2000,
                        help="trigger: new experiences that fire a round")
    parser.add_argument("--check-s", type=float, default=1.0, help="trigger poll interval")
    parser.add_argument("--epochs", type=int, default=RetrainConfig.epochs,
                        help="retraining epochs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rehearsal-npz", help="training set D to rehearse (npz from a "
                        "round); default: the one saved with the published bundle, or "
                        "rebuilt from the shipped bundle's recipe")
    parser.add_argument("--rehearsal-rows", type=int, default=RehearsalConfig.max_rows,
                        help="cap on D kept and rehearsed per round (stratified subsample)")
    parser.add_argument("--no-rehearsal", action="store_true",
                        help="train a round on its new material alone (forgets base skills)")
    canary = CanaryConfig()
    parser.add_argument("--canary-fraction", type=float, default=canary.fraction,
                        help="share of robots that get a new version first (stable hash of "
                        "the robot id, at least one robot); 0 = every robot at once")
    parser.add_argument("--canary-robots", default="",
                        help="comma-separated canary robot ids (instead of the fraction)")
    parser.add_argument("--canary-min-feedback", type=int, default=canary.min_feedback,
                        help="judged experiences a robot needs before its figure counts in "
                        "the canary decision")
    parser.add_argument("--canary-min-robots", type=int, default=canary.min_robots,
                        help="robots per group, each with --canary-min-feedback, before the "
                        "canary is decided")
    parser.add_argument("--canary-alpha", type=float, default=canary.alpha,
                        help="a rollback needs the canaries' regression to have a one-sided "
                        "p-value (over robots) below this")
    parser.add_argument("--canary-margin", type=float, default=canary.margin,
                        help="micro-F1 the canaries may lose against the rest and still "
                        "be promoted (more: rolled back)")
    parser.add_argument("--canary-reward-margin", type=float, default=None,
                        help="mean reward the canaries may lose (default: reward is only "
                        "reported)")
    parser.add_argument("--canary-max-wait-s", type=float, default=canary.max_wait_s,
                        help="then hold: neither promote nor roll back, resume rounds")
    parser.add_argument("--recall-bind", default=None,
                        help="serve episodic recall to the robots here (their "
                             "recall_endpoint), e.g. tcp://0.0.0.0:5757; default: not served")
    parser.add_argument("--recall-experiences", type=int,
                        default=DEFAULT_RECALL_EXPERIENCES,
                        help="the newest this many stored experiences are recalled from "
                        "(re-embedded by each new bundle; 0 = every stored experience)")
    parser.add_argument("--flush-rows", type=int, default=DEFAULT_FLUSH_ROWS,
                        help="stored rows that move the store's tail into its Parquet lake "
                        "(<db>.lake/; 0 = keep everything in SQLite)")
    parser.add_argument("--round-experiences", type=int, default=DEFAULT_ROUND_EXPERIENCES,
                        help="experiences a round decodes at most: beyond that, a seeded "
                        "sample of whole episodes (0 = every stored experience)")
    parser.add_argument("--round-reservoir", type=int, default=DEFAULT_RESERVOIR,
                        help="a round on a bundle this store trained reads the experiences "
                        "new to it plus at most this many of older episodes")
    parser.add_argument("--discovery-events", type=int, default=DEFAULT_DISCOVERY_EVENTS,
                        help="discovery reads each robot's newest episodes up to this "
                        "many events in all, shared fairly between robots (whole episodes; "
                        "an event among many distinct names counts more; 0 = every "
                        "episode the store holds)")
    parser.add_argument("--whole-store-rounds", action="store_true",
                        help="every round reads the whole store (within "
                        "--round-experiences) instead of what is new to the running bundle")
    parser.add_argument("--engine", choices=ENGINES, default="embedded",
                        help="where discovery's passes over the log's parts run: this "
                        "process, or Ray tasks (ray: pip install ray==2.60.0)")
    parser.add_argument("--address", default=None,
                        help="with --engine ray: the Ray cluster to join (e.g. "
                        "ray://head:10001 or host:6379; default: start a local one)")
    parser.add_argument("--threads", type=int, default=0,
                        help="threads of the consolidator process for discovery's passes "
                        "and tests (0 = the cores it may use, at most 4); each holds one "
                        "part's temporaries")
    parser.add_argument("--train-workers", type=int, default=None,
                        help="with --engine ray: Ray Train workers that retrain the policy "
                        "(torch DDP; default 2)")
    parser.add_argument("--once", action="store_true",
                        help="run one round on what the store holds and exit")


def canary_robots(text: str) -> tuple[str, ...]:
    """The robot ids of ``--canary-robots`` (comma-separated); ValueError naming the option.

    Why: ``,,,`` parsed as no robots and quietly left the canary off, and an id no robot
    can carry would wait for a canary that never reports.
    """
    robots = tuple(r.strip() for r in text.split(",") if r.strip())
    if text.strip() and not robots:
        raise ValueError(f"--canary-robots {text!r} names no robot id")
    return check_robot_ids(robots, "--canary-robots")


def check_canary_choice(canary: CanaryConfig) -> None:
    """Refuse canary options that could not work together; ValueError naming them.

    Why: with ``--canary-robots`` a ``--canary-fraction`` was silently ignored (the list
    overrides it), and fewer listed robots than ``--canary-min-robots`` could never reach
    a decision: the push only warned, and every canary held after its longest wait.
    """
    robots = canary.robots
    if robots and canary.fraction > 0:
        raise ValueError("--canary-fraction and --canary-robots both choose the canaries; "
                         "give one of them")
    if robots and len(robots) < canary.min_robots:
        raise ValueError(f"--canary-robots lists {len(robots)} robot"
                         f"{'' if len(robots) == 1 else 's'} but a canary decision needs "
                         f"--canary-min-robots {canary.min_robots} per group: list at "
                         f"least {canary.min_robots} robots or lower --canary-min-robots")


def config_from_args(args: argparse.Namespace) -> ConsolidatorConfig:
    """Build the validated config from parsed options."""
    buffer_limit = args.buffer_limit
    if args.train_workers is not None and args.engine != "ray":
        raise ValueError("--train-workers applies only with --engine ray (the embedded engine "
                         "retrains in this process)")
    return ConsolidatorConfig(
        db_path=args.db, publish_dir=args.publish_dir, signing_key=args.signing_key,
        endorsements=args.endorsements,
        initial_bundle=args.initial_bundle, bind=args.bind, curve=args.curve,
        server_secret_file=args.server_key, allowed_clients=args.allow,
        check_s=args.check_s, seed=args.seed,
        trigger=TriggerConfig(period_s=args.period_s, buffer_limit=buffer_limit,
                              buffer_capacity=max(10000, buffer_limit)),
        retrain=RetrainConfig(epochs=args.epochs, seed=args.seed),
        rehearsal=RehearsalConfig(max_rows=args.rehearsal_rows, npz=args.rehearsal_npz,
                                  enabled=not args.no_rehearsal, seed=args.seed),
        canary=CanaryConfig(fraction=args.canary_fraction,
                            robots=canary_robots(args.canary_robots),
                            min_feedback=args.canary_min_feedback, margin=args.canary_margin,
                            reward_margin=args.canary_reward_margin,
                            max_wait_s=args.canary_max_wait_s,
                            min_robots=args.canary_min_robots, alpha=args.canary_alpha),
        recall_bind=args.recall_bind, recall_experiences=args.recall_experiences,
        flush_rows=args.flush_rows,
        round_experiences=args.round_experiences, engine=args.engine,
        round_reservoir=args.round_reservoir, incremental_rounds=not args.whole_store_rounds,
        discovery_events=args.discovery_events,
        engine_address=args.address, engine_threads=args.threads,
        train_workers=2 if args.train_workers is None else args.train_workers)


def check_inputs(config: ConsolidatorConfig, once: bool, publisher=None) -> None:
    """Open --rehearsal-npz, the models, the published bundle and the store before serving.

    A round meets them only once it has started: a garbage npz, a --db that is not a
    database or a published bundle that no longer verifies (edited, truncated, its
    signature gone, ``current`` pointing at nothing) would be a traceback after the
    round's log line, or fail every served round after READY.
    """
    from thinkmem_ros.consolidator.rehearsal import load_npz

    rehearsal = None if config.rehearsal.npz is None else load_npz(config.rehearsal.npz)
    _check_store(config, once)
    _check_bundles(config, publisher, rehearsal)
    if Path(config.db_path).is_file():  # a newer or damaged knowledge schema: refused now
        with KnowledgeStore(config.db_path, read_only=True) as knowledge:
            knowledge.load()


def _check_store(config: ConsolidatorConfig, once: bool) -> None:
    """Refuse a store a round cannot read (--once) or that no one can write."""
    if once and not Path(config.db_path).exists():  # a typo made an empty store and exit 0
        raise ValueError(f"--db {config.db_path}: no such store (a round reads a store "
                         f"the serving consolidator filled)")
    # an empty file too; holds_store only reads, and refuses another program's database
    if once and not holds_store(config.db_path):
        raise ValueError(f"--db {config.db_path}: holds no store yet (a round reads a "
                         f"store the serving consolidator filled)")
    check_store(config.db_path)  # a damaged or read-only one, or a folder: one line here


def check_publish_dir(publish_dir: Path) -> None:
    """Refuse a --publish-dir no round can publish into; ValueError naming the option.

    Why: a file given as the folder came out as "[Errno 20] Not a directory:
    'pub/history'", naming no option, and a folder this user cannot write failed only
    once the lock or a round's publication tried to write it.
    """
    from thinkmem_ros.consolidator.publish import HISTORY

    history = publish_dir / HISTORY
    if history.exists() and not history.is_dir():
        raise ValueError(f"--publish-dir {publish_dir}: {history} is not a folder")
    found = next(p for p in (publish_dir, *publish_dir.absolute().parents)
                 if p.exists() or p.is_symlink())  # a dangling link cannot become a folder
    where = "" if found == publish_dir else f"{found}: "
    if not found.is_dir():
        raise ValueError(f"--publish-dir {publish_dir}: {where}not a folder")
    if not os.access(found, os.W_OK | os.X_OK):
        raise ValueError(f"--publish-dir {publish_dir}: {where}cannot be written")


def _check_bundles(config: ConsolidatorConfig, publisher, rehearsal: SituationSet | None
                   ) -> None:
    """Load the initial model, verify the published bundle, fit --rehearsal-npz to it."""
    from thinkmem_ros.consolidator.rehearsal import check_fits
    from thinkmem_ros.core.paths import resolve_bundle_path
    from thinkmem_ros.policy.runtime import PolicyRuntime

    # the bundle robots run before the first round: its model must load, not only hash
    PolicyRuntime(resolve_bundle_path(config.initial_bundle), threads=1)
    if publisher is None:
        return
    publisher.next_version()  # every round starts from current: verified, room after it
    if rehearsal is not None:  # a round rehearses it in current's signals and window
        manifest = publisher.current().manifest
        try:
            check_fits(rehearsal, manifest.signals, manifest.window, manifest.max_events)
        except RehearsalError as exc:
            raise RehearsalError(f"{config.rehearsal.npz}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    """Run the service from parsed options; prints ``READY <endpoint>`` once bound.

    SIGTERM/SIGINT stop it with exit 0 at any point. Why the stop handlers come before
    the inputs load: the initial model takes ~1-2 s to load (numba), and a Ctrl-C then
    ended in a KeyboardInterrupt traceback and exit 130.
    """
    made: list[ConsolidatorService] = []  # the service, once there is one to close
    raise_open_files_limit()  # a socket per connected robot, receiver and recall
    try:
        lock, previous = _prepare(args, made)
    except KeyboardInterrupt:  # before the stop handlers exist: as clean as after them
        _close(made)
        return 0
    except (ValueError, OSError, RuntimeError) as exc:  # bad options, keys, bundle: exit 2
        _close(made)
        print(f"thinkmem consolidator: error: {option_message(exc, args)}", file=sys.stderr)
        return 2
    with lock:
        try:
            return _run_locked(made[0], args, lock)
        finally:  # an in-process caller (``thinkmem consolidator``, tests) gets its own back
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _prepare(args: argparse.Namespace, made: list[ConsolidatorService]
             ) -> tuple[RoundLock, dict]:
    """Check the options and inputs, take the round lock, then let signals stop the service.

    Returns the lock and the signal handlers it replaced. The service goes into ``made``
    as soon as it exists, so whatever stops this midway can close it.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config = config_from_args(args)
    if args.once and config.canary.enabled:
        raise ValueError("--canary-* needs the serving consolidator (its live figures "
                         "decide), not --once")
    if args.once and (served := serving_options(args)):
        raise ValueError(f"{', '.join(served)}: --once runs one round on the store and "
                         "exits, it serves no robots; drop "
                         f"{'it' if len(served) == 1 else 'them'}")
    check_canary_choice(config.canary)
    check_publish_dir(config.publish_dir)
    made.append(ConsolidatorService(config))
    if config.engine != "embedded":  # a cluster that cannot be reached fails here
        made[0]._discovery_engine()
    check_inputs(config, once=args.once, publisher=made[0].publisher)
    lock = RoundLock(config.db_path, config.publish_dir)
    previous = {signum: signal.signal(signum, lambda *_: made[0].stop())
                for signum in (signal.SIGTERM, signal.SIGINT)}
    return lock, previous


def serving_options(args: argparse.Namespace) -> list[str]:
    """The options given that only a serving consolidator uses.

    Why: ``--once`` took them and never used them, so a mistyped command (``--once`` left
    in a service file) ran one round and exited 0 while the robots found nobody listening.
    """
    given = (("--bind", args.bind != ConsolidatorConfig.bind),
             ("--server-key", args.server_key is not None),
             ("--allow", args.allow is not None),
             ("--recall-bind", args.recall_bind is not None))
    return [name for name, present in given if present]


def _close(made: list[ConsolidatorService]) -> None:
    for service in made:
        service.close()


def _run_locked(service: ConsolidatorService, args: argparse.Namespace, lock: RoundLock
                ) -> int:
    """One round (``--once``) or serve until stopped, holding the round lock.

    A start refused here (an address in use) discards the lock's files: refused, nothing
    is left behind.
    """
    if service.stop_event.is_set():  # stopped while the inputs loaded: nothing started
        return 0
    if args.once:
        return _run_once(service)
    try:
        service.start()
    except Exception as exc:  # noqa: BLE001 - a bind that fails (address in use), a bad store
        service.close()
        lock.discard()
        print(f"thinkmem consolidator: error: {exc}".splitlines()[0], file=sys.stderr)
        return 2
    if not service.stop_event.is_set():
        print(f"READY {service.endpoint}", flush=True)
    try:
        service.serve()
    finally:
        service.close()
    if service.failure is not None:
        print(f"thinkmem consolidator: stopped: {service.failure}", file=sys.stderr)
        return 2
    log.info("consolidator stopped cleanly after %d rounds", len(service.rounds))
    return 0


def _run_once(service: ConsolidatorService) -> int:
    """``--once``: one round; stopped by a signal, it publishes nothing and exits 0."""
    try:
        service.run_round("once")
    except RoundAborted:  # the round's log line says it was aborted
        return 0
    except RehearsalError as exc:  # e.g. a recorded recipe that no longer builds
        print(f"thinkmem consolidator: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if not is_fatal(exc):
            raise
        service.store_damaged(exc)
        print(f"thinkmem consolidator: error: {service.failure}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the ``thinkmem_consolidator`` console script (a Ctrl-C while parsing: exit 0)."""
    try:
        parser = OneLineParser(prog="thinkmem_consolidator",
                               description=__doc__.splitlines()[0])
        add_arguments(parser)
        args = parser.parse_args(argv)
    except KeyboardInterrupt:  # ``run`` takes over from here
        return 0
    try:
        return run(args)
    except KeyboardInterrupt:  # in the instant after ``run`` put the default handler back
        return 0


if __name__ == "__main__":
    from thinkmem_ros.entry import exit_quietly

    signal.signal(signal.SIGINT, signal.default_int_handler)  # main's own handling from here
    sys.exit(exit_quietly(main()))
