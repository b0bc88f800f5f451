"""Ingest: the consolidator's experience receiver, writing into the SQLite experience store.

``open_receiver`` joins the wire end (``link.receiver``) to the offboard store, so code that
receives experiences names one function. Run a bare receiver (what the transport benchmark
and the kill tests start as a separate process)::

    python -m thinkmem_ros.consolidator.ingest serve --db PATH --bind ENDPOINT
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from thinkmem_ros.consolidator.store import ExperienceStore
from thinkmem_ros.link.receiver import ExperienceReceiver, ReceiverConfig

log = logging.getLogger(__name__)


def open_receiver(config: ReceiverConfig) -> ExperienceReceiver:
    """Bind a receiver whose batches go into the experience store at ``config.db_path``."""
    return ExperienceReceiver(config, open_store=lambda: ExperienceStore(config.db_path))


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m thinkmem_ros.consolidator.ingest")
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
    receiver = open_receiver(ReceiverConfig(
        bind=args.bind, db_path=args.db, curve=args.curve, server_secret_file=args.server_key,
        allowed_clients=args.allow))
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: receiver._stop.set())
    print(f"READY {receiver.endpoint}", flush=True)
    receiver.serve_forever()
    log.info("receiver stopped cleanly: %s", receiver.stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
