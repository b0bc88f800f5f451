"""Ingest: the consolidator's experience receiver, writing into the SQLite experience store.

``open_receiver`` joins the wire end (``link.receiver``) to the offboard store, so code that
receives experiences names one function. Run a bare receiver (what the transport benchmark
and the kill tests start as a separate process)::

    python -m thinkmem_ros.consolidator.ingest serve --db PATH --bind ENDPOINT

A store file found damaged while a batch is written stops the receiver (``StopOnDamage``);
the process that owns it exits non-zero with one line naming the file.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterable

from thinkmem_ros.consolidator.store import (
    DEFAULT_FLUSH_ROWS,
    ExperienceStore,
    StoreDamaged,
    StoreError,
    StoreReadOnly,
)
from thinkmem_ros.core.arguments import OneLineParser
from thinkmem_ros.link.experience import Experience
from thinkmem_ros.link.receiver import ExperienceReceiver, ReceiverConfig, SinkError
from thinkmem_ros.policy.bundle import Bundle, signal_set_fingerprint

log = logging.getLogger(__name__)


class SignalSetFilter:
    """Which experiences belong to the bundle line this consolidator serves.

    A window only means something next to the signals, units and rate it was assembled
    for, so experiences of a robot with another signal set must never reach this line's
    discovery or retraining. The filter knows the signal-set fingerprint of every bundle
    of the line (the initial one and each published version) and decides per experience:

    - one that carries a fingerprint (``signal_set``, wire version 3) is accepted when the
      fingerprint is served and its window has that signal set's number of columns,
      whatever bundle produced it: the fingerprint, not the bundle, is what makes windows
      comparable, so a robot running a bundle its engineer trained locally on the same
      signals (never published here, its hash unknown) still feeds the line. The width
      check costs nothing and refuses a record whose window contradicts its own claim;
    - one without a fingerprint (an older robot) is judged by its bundle hash
      (``bundle_sha256``): accepted when it is a bundle of the line with a served
      fingerprint, since an unknown hash says nothing about the signals;
    - one with neither is accepted when its window has the line's number of signals.

    Everything else is refused with a counted reason (``refused``): ``signal_set``,
    ``unknown_bundle`` or ``window_width``. Refused experiences are rejected by index in
    the batch's ACK with that reason: the robot logs why and drops them (its spool does
    not resend them forever), instead of seeing an ACK that stored nothing.
    """

    def __init__(self, bundles: Iterable[Bundle]) -> None:
        self._lock = threading.Lock()
        self.served: dict[str, int] = {}  # served fingerprint -> its number of signals
        self.known: dict[str, str] = {}  # bundle sha256 -> signal-set fingerprint
        self.widths: set[int] = set()
        self.refused: dict[str, int] = {}
        for bundle in bundles:
            self.serve(bundle)

    def serve(self, bundle: Bundle) -> None:
        """Add a bundle of the served line (a new publication keeps the line's set)."""
        fingerprint = bundle.manifest.signal_set or signal_set_fingerprint(bundle.manifest)
        with self._lock:
            self.served[fingerprint] = len(bundle.manifest.signals)
            self.known[bundle.manifest.sha256] = fingerprint
            self.widths.add(len(bundle.manifest.signals))

    def reason(self, experience: Experience) -> str | None:
        """Why ``experience`` is refused, or None when it belongs to a served line."""
        fingerprint, sha = experience.signal_set, experience.bundle_sha256
        width = int(experience.window.shape[1])
        with self._lock:
            if fingerprint:
                if fingerprint not in self.served:
                    return "signal_set"
                return None if self.served[fingerprint] == width else "window_width"
            if sha:
                if sha not in self.known:
                    return "unknown_bundle"
                return None if self.known[sha] in self.served else "signal_set"
            return None if width in self.widths else "window_width"

    def refusal(self, experience: Experience) -> str | None:
        """The receiver's screen: None when accepted, else the reason the robot is told.

        The reason goes into the ACK's rejected list; it is counted under ``refused``.
        """
        why = self.reason(experience)
        if why is None:
            return None
        with self._lock:
            self.refused[why] = self.refused.get(why, 0) + 1
        return (f"not of this consolidator's signal set ({why}: fingerprint "
                f"{experience.signal_set[:12] or '-'}, bundle "
                f"{experience.bundle_sha256[:12] or '-'}, {experience.window.shape[1]} "
                f"signals); run a consolidator for that line")


class StopOnDamage:
    """The store as a receiver's sink, which stops the receiver once its file is damaged.

    Why stop rather than serve on: once SQLite calls the file malformed, every later batch
    fails the same way, so serving on means robots re-sending forever to a process that
    looks alive, and writing on into a damaged b-tree can spread the damage to pages that
    hold acknowledged rows. Stopping loses nothing: a batch is acknowledged only after its
    commit, the one that met the damage is not (``StoreDamaged`` is a ``SinkError``), so
    the robots keep every unacknowledged batch in their spools and re-send it to the
    restored store, where duplicates die at insert. The receiver logs that batch's one
    ERROR (the store's message names the file); ``on_damaged`` tells the owning process,
    which exits non-zero so its supervisor and operator see it, and a restart is refused
    at open (``quick_check``) with one line until the file is restored. A store that
    cannot be written (``StoreReadOnly``) stops it the same way: no retry mends it.
    """

    def __init__(self, store: ExperienceStore, stop: Callable[[], None],
                 on_damaged: Callable[[StoreDamaged], None] | None = None) -> None:
        self._store = store
        self._stop = stop
        self._on_damaged = on_damaged
        self.damaged: StoreDamaged | None = None

    def insert_many(self, rows):
        """Store a batch; refuse it (no ACK) without a write once the file is damaged."""
        if self.damaged is not None:  # batches already read before the receiver stops
            raise SinkError(f"{self._store.path}: not written, the store file was found "
                            f"damaged or read-only; the receiver is stopping")
        try:
            return self._store.insert_many(rows)
        except (StoreDamaged, StoreReadOnly) as exc:  # no later batch could be written
            self.damaged = exc
            self._stop()
            if self._on_damaged is not None:
                self._on_damaged(exc)
            raise

    def close(self) -> None:
        """Close the store (the receiver calls it when it stops)."""
        self._store.close()


def open_receiver(config: ReceiverConfig, accept: SignalSetFilter | None = None,
                  flush_rows: int = DEFAULT_FLUSH_ROWS,
                  on_damaged: Callable[[StoreDamaged], None] | None = None
                  ) -> ExperienceReceiver:
    """Bind a receiver whose batches go into the experience store at ``config.db_path``.

    With ``accept`` only experiences of the served signal set are stored (see
    ``SignalSetFilter``); without it every valid experience is. ``flush_rows``: tail rows
    that move the tail into the store's lake (0 = never). A store found damaged stops
    the receiver and is reported to ``on_damaged`` (``StopOnDamage``).
    """
    def store() -> StopOnDamage:
        opened = ExperienceStore(config.db_path, flush_rows=flush_rows)
        try:  # a store it cannot write: refused at start, not batch after batch
            opened.check_writable()
        except StoreError:
            opened.close()
            raise
        return StopOnDamage(opened, receiver._stop.set, on_damaged)

    receiver = ExperienceReceiver(config, open_store=store,
                                  screen=accept.refusal if accept is not None else None)
    return receiver


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m thinkmem_ros.consolidator.ingest")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run an experience receiver until SIGTERM/SIGINT")
    serve.add_argument("--db", required=True, help="SQLite experience store")
    serve.add_argument("--bind", default="tcp://127.0.0.1:5755", help="ZeroMQ endpoint")
    serve.add_argument("--curve", default="auto", choices=("auto", "on", "off"))
    serve.add_argument("--server-key", help="consolidator .key_secret file (CURVE)")
    serve.add_argument("--allow", help="allow-list (CURVE): a folder of <robot_id>.key "
                       "files, a TOML [robots] map, or one <robot_id>.key; re-read on change")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """``serve``: bind, print ``READY <endpoint>`` on stdout, serve until SIGTERM."""
    args = _parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:  # before READY: a store that cannot be opened or written is one line
        with ExperienceStore(args.db, flush_rows=0) as store:
            store.check_writable()
    except StoreError as exc:
        print(f"ingest: {exc}".splitlines()[0], file=sys.stderr)
        return 2
    damaged: list[StoreDamaged] = []
    receiver = open_receiver(ReceiverConfig(
        bind=args.bind, db_path=args.db, curve=args.curve, server_secret_file=args.server_key,
        allowed_clients=args.allow), on_damaged=damaged.append)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: receiver._stop.set())
    print(f"READY {receiver.endpoint}", flush=True)
    receiver.serve_forever()
    if damaged:
        print(f"ingest: {damaged[0]}".splitlines()[0], file=sys.stderr)
        return 2
    log.info("receiver stopped cleanly: %s", receiver.stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
