"""Receive-only process: one more receiver writing into the consolidator's shared store.

A fleet outgrows one receiver long before it outgrows one store: ``thinkmem consolidator
receive`` runs only the ingest half of the consolidator (ROUTER, ZAP allow-list, the
same ``SignalSetFilter``, commit before ACK) against the SQLite file the consolidator
runs its rounds on. Several of them (processes or hosts on one filesystem) and the
consolidator share

- one exactly-once index: ``UNIQUE(robot_id, seq)`` in the one store, so a batch a robot
  re-sends to another receiver after a failover is a counted duplicate, never a second
  row (robots name every receiver in ``consolidator_endpoint`` and fail over in order,
  see ``link.shipper``);
- one allow-list and one server key pair: every receiver is started with the same
  ``--server-key`` and ``--allow`` (re-read on change by each), so a robot's CURVE
  identity holds wherever it lands;
- one bundle line: the filter serves the initial bundle and every version in
  ``--publish-dir``; the folder is watched, and a version the consolidator publishes is
  served and pushed to the robots connected here (the consolidator pushes only to its
  own connections). A robot offline across a publication gets it with the next one.
  An undecided canary (``canary.STATE_FILE`` in the publish dir) is pushed to the canaries
  connected here only, chosen by the same selector as the consolidator's, so a robot's
  role does not depend on which receiver it landed on.

SQLite serialises writers: receivers wait for each other through the store's busy
timeout (each batch is one short transaction), readers never block them (WAL), and a new
file's migration runs once whoever opens it first (``consolidator.store``). The file
must be on a local filesystem (WAL needs shared memory), so receivers on other hosts
need the store on theirs: this scales connections, CURVE and decoding, not disk writes.

Run: ``thinkmem consolidator receive --bind tcp://0.0.0.0:5756 --db cons.db`` (plus
``--server-key``/``--allow`` and the consolidator's ``--initial-bundle``/
``--publish-dir``). It prints ``READY <endpoint>`` once bound, serves until
SIGTERM/SIGINT and exits 0 after closing the store; bad options exit 2 with one line, and
so does a store file found damaged, at open or by a write (``ingest.StopOnDamage``).
"""

from __future__ import annotations

import argparse
import logging
import re
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from thinkmem_ros.consolidator.canary import CanaryStateError, read_state
from thinkmem_ros.consolidator.ingest import SignalSetFilter, open_receiver
from thinkmem_ros.consolidator.publish import CURRENT, HISTORY, push_frame
from thinkmem_ros.consolidator.store import (
    DEFAULT_FLUSH_ROWS,
    ExperienceStore,
    StoreDamaged,
    StoreError,
)
from thinkmem_ros.core.arguments import OneLineParser
from thinkmem_ros.core.open_files import raise_open_files_limit
from thinkmem_ros.core.paths import resolve_bundle_path
from thinkmem_ros.link.receiver import (
    MAX_INBOUND_FRAME_BYTES,
    ExperienceReceiver,
    ReceiverConfig,
)
from thinkmem_ros.link.security import curve_keys_problem
from thinkmem_ros.policy.bundle import Bundle, load_bundle

log = logging.getLogger(__name__)


@dataclass
class ReceiveConfig:
    """Settings of one receive-only process (the consolidator's options, ingest part)."""

    db_path: Path | str
    bind: str
    curve: str = "auto"
    server_secret_file: Path | str | None = None
    allowed_clients: Path | str | None = None
    initial_bundle: Path | str = ""  # '' = the shipped models/default, as the service
    publish_dir: Path | str | None = None  # the consolidator's; None = initial bundle only
    watch_s: float = 2.0  # how often publish_dir/current is checked for a new version
    max_frame_bytes: int = MAX_INBOUND_FRAME_BYTES
    name: str = "receiver"
    flush_rows: int = DEFAULT_FLUSH_ROWS  # tail rows that move into the lake (0 = never)

    def __post_init__(self) -> None:
        if not str(self.db_path):
            raise ValueError("ReceiveConfig.db_path must not be empty")
        if not self.bind or "://" not in self.bind:
            raise ValueError(f"ReceiveConfig.bind must look like tcp://host:port, "
                             f"got {self.bind!r}")
        if self.watch_s <= 0:
            raise ValueError(f"ReceiveConfig.watch_s must be > 0, got {self.watch_s}")
        if self.flush_rows < 0:
            raise ValueError(f"ReceiveConfig.flush_rows must be >= 0, got {self.flush_rows}")
        problem = curve_keys_problem("ReceiveConfig", self.curve, self.server_secret_file,
                                     self.allowed_clients)
        if problem:
            raise ValueError(problem)


class ReceiveProcess:
    """A receiver on the shared store plus a watcher of the consolidator's publications."""

    def __init__(self, config: ReceiveConfig) -> None:
        self.config = config
        self.publish_dir = None if config.publish_dir is None else Path(config.publish_dir)
        self.stop_event = threading.Event()
        self._started = False
        self.accept = SignalSetFilter(self._line_bundles())
        self._current = self._current_target()  # published before we started: not pushed
        self._canary: int | None = None  # the canary version pushed from here, if any
        self.failure: StoreDamaged | None = None  # why it stopped itself, if it did
        self.receiver: ExperienceReceiver = open_receiver(ReceiverConfig(
            bind=config.bind, db_path=config.db_path, curve=config.curve,
            server_secret_file=config.server_secret_file,
            allowed_clients=config.allowed_clients, max_frame_bytes=config.max_frame_bytes,
            name=config.name), accept=self.accept, flush_rows=config.flush_rows,
            on_damaged=self._store_damaged)

    @property
    def endpoint(self) -> str:
        """The bound endpoint (with the real port when bound to ``:*``)."""
        return self.receiver.endpoint

    def _line_bundles(self) -> list[Bundle]:
        """The initial bundle and every version in the publish history (as the service)."""
        bundles = [load_bundle(resolve_bundle_path(self.config.initial_bundle))]
        history = None if self.publish_dir is None else self.publish_dir / HISTORY
        if history is not None and history.is_dir():
            for folder in sorted(history.glob("v[0-9]*")):
                try:
                    bundles.append(load_bundle(folder))
                except Exception:  # noqa: BLE001 - an unreadable old version serves no robot
                    log.warning("history version %s unreadable; its robots are refused",
                                folder.name)
        return bundles

    def _current_target(self) -> Path | None:
        if self.publish_dir is None:
            return None
        link = self.publish_dir / CURRENT
        return link.resolve() if link.is_symlink() or link.exists() else None

    def check_publications(self) -> bool:
        """Serve and push a version published since the last check; True if one was."""
        target = self._current_target()
        if target is None or target == self._current:
            return False
        if not self._serve_and_push(target, "published", None):
            return False
        self._current = target
        return True

    def check_canary(self) -> bool:
        """Push an undecided canary version to the canaries connected here; True if pushed.

        The receiver remembers a push meant for some robots, so a canary that connects
        here later gets it on HELLO, as it would from the consolidator.
        """
        if self.publish_dir is None:
            return False
        try:
            state = read_state(self.publish_dir)
        except CanaryStateError as exc:
            log.error("canary not pushed from here: %s", exc)
            return False
        if state is None or state.version == self._canary:
            return False
        folder = self.publish_dir / HISTORY / f"v{state.version:06d}"
        if not self._serve_and_push(folder, "canary", state.selector):
            return False
        self._canary = state.version
        return True

    def _serve_and_push(self, folder: Path, what: str, robots) -> bool:
        """Serve the bundle in ``folder`` and push it (to ``robots`` only, if given)."""
        try:
            bundle = load_bundle(folder)
            frame = push_frame(folder)
        except Exception as exc:  # noqa: BLE001 - keep receiving; retried next check
            log.error("%s bundle %s unreadable, not pushed: %s", what, folder, exc)
            return False
        self.accept.serve(bundle)
        sent = self.receiver.push_bundle(frame, robots=robots)
        log.info("pushed %s v%d to %d robot connections", what, bundle.version, sent)
        return True

    def start(self) -> ReceiveProcess:
        """Open the store and receive on the receiver's thread (idempotent)."""
        if not self._started:
            self.receiver.start()
            self._started = True
        return self

    def serve(self) -> None:
        """Receive on the receiver's thread and watch publications here until ``stop()``."""
        self.start()
        try:
            while not self.stop_event.wait(self.config.watch_s):
                self.check_publications()
                self.check_canary()
        finally:
            self.receiver.stop()

    def stop(self) -> None:
        """Ask ``serve`` to return: the receiver finishes its batch and closes the store."""
        self.stop_event.set()

    def _store_damaged(self, exc: StoreDamaged) -> None:
        """Stop with the damage kept for ``run``'s exit line (why: ``StopOnDamage``)."""
        self.failure = self.failure or exc
        self.stop()


def check_store(db_path: Path | str) -> None:
    """Refuse a --db no receiver can write, before anything binds; StoreError naming it.

    Why: the receiver opens its store on its own thread once bound, so a folder given as
    --db logged "receiver bound to ..." first and was refused on a second line. A store
    that does not exist yet is made by the receiver, folders and all, if it can be.
    """
    path = Path(db_path)
    try:
        if path.exists() or path.is_symlink():
            with ExperienceStore(path) as store:
                store.check_writable()
        elif not (found := next(p for p in path.absolute().parents if p.exists())).is_dir():
            raise StoreError(f"{found} is not a folder")
    except StoreError as exc:
        raise StoreError(f"--db {path}: {str(exc).removeprefix(f'{path}: ')}") from None


_CONFIG_FIELD = re.compile(r"\b([A-Z][A-Za-z]*)Config\.([a-z_]+)")
# config fields whose option is not ``--<field>`` or ``--<owner>-<field>``; an owner-qualified
# key ("rehearsal.max_rows") wins over a bare field name
_FIELD_OPTIONS = {"engine_threads": "threads", "engine_address": "address", "db_path": "db",
                  "server_secret_file": "server_key", "allowed_clients": "allow",
                  "rehearsal.max_rows": "rehearsal_rows"}


def option_message(exc: BaseException, args: argparse.Namespace) -> str:
    """The first line of ``exc``'s message, naming the command-line options behind it.

    Configs check their fields and say ``RehearsalConfig.max_rows``; the user typed
    ``--rehearsal-rows``, so each ``<Owner>Config.<field>`` that one of ``args``'
    options filled becomes that option (the consolidator and this process share them).
    """
    def option(match: re.Match) -> str:
        owner, name = match.group(1).lower(), match.group(2)
        for dest in (_FIELD_OPTIONS.get(f"{owner}.{name}"), _FIELD_OPTIONS.get(name, name),
                     f"{owner}_{name}"):
            if dest is not None and dest in vars(args):
                return "--" + dest.replace("_", "-")
        return match.group(0)

    text = f"{exc}".splitlines()[0] if f"{exc}" else type(exc).__name__
    return _CONFIG_FIELD.sub(option, text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of a bare ``python -m thinkmem_ros.consolidator.receive``."""
    parser.add_argument("--db", required=True, help="the consolidator's SQLite store")
    parser.add_argument("--bind", required=True, help="ZeroMQ endpoint, e.g. tcp://0.0.0.0:5756")
    parser.add_argument("--curve", default="auto", choices=("auto", "on", "off"))
    parser.add_argument("--server-key", help="the consolidator's .key_secret (CURVE)")
    parser.add_argument("--allow", help="the consolidator's allow-list (CURVE)")
    parser.add_argument("--initial-bundle", default="", help="the consolidator's initial "
                        "bundle (default: the shipped models/default)")
    parser.add_argument("--publish-dir", default=None, help="the consolidator's publish "
                        "dir: its versions are served and pushed to robots connected here")
    parser.add_argument("--flush-rows", type=int, default=DEFAULT_FLUSH_ROWS,
                        help="stored rows that move the store's tail into its Parquet lake "
                        "(0 = keep everything in SQLite)")


def run(args: argparse.Namespace, prog: str = "thinkmem consolidator receive") -> int:
    """Bind, print ``READY <endpoint>``, serve until SIGTERM/SIGINT (0); 2 on bad options."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    raise_open_files_limit()  # a socket per connected robot
    try:
        return _start_and_serve(args, prog)
    except KeyboardInterrupt:  # before the stop handlers exist (loading the bundles, ~1-2 s):
        return 0  # as clean as a Ctrl-C after READY; the sockets go with the process


def _start_and_serve(args: argparse.Namespace, prog: str) -> int:
    try:
        config = ReceiveConfig(
            db_path=args.db, bind=args.bind, curve=args.curve,
            server_secret_file=args.server_key, allowed_clients=args.allow,
            initial_bundle=args.initial_bundle, publish_dir=args.publish_dir,
            flush_rows=args.flush_rows)
        check_store(config.db_path)  # before the receiver binds and says so
        process = ReceiveProcess(config)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: process.stop())
        process.start()  # opens the store: a bad --db fails here, by name
    except Exception as exc:  # noqa: BLE001 - bad options, keys, bundle, bind, store
        print(f"{prog}: error: {option_message(exc, args)}", file=sys.stderr)
        return 2
    print(f"READY {process.endpoint}", flush=True)
    process.serve()
    if process.failure is not None:
        print(f"{prog}: error: stopped: {process.failure}".splitlines()[0], file=sys.stderr)
        return 2
    log.info("receiver stopped cleanly: %s", process.receiver.stats)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m thinkmem_ros.consolidator.receive --db PATH --bind ENDPOINT ...``."""
    parser = OneLineParser(prog="python -m thinkmem_ros.consolidator.receive",
                                     description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv), prog=parser.prog)


if __name__ == "__main__":
    sys.exit(main())
