"""``thinkmem consolidator``: the consolidator service (same as ``thinkmem_consolidator``).

Receives experiences over ZeroMQ, stores them, and on the consolidation trigger runs a
round: discovery, knowledge units, warm-start retraining, the validation gate, signed
publication and the push to robots. ``--once`` runs one round over the store and exits.

``thinkmem consolidator receive --bind ENDPOINT --db PATH [--allow ... --server-key ...]
[--initial-bundle ... --publish-dir ...]`` runs only a receiver writing into the same
store (``consolidator.receive``): several of them and the consolidator share one SQLite
file, and robots spread over them (a comma-separated ``consolidator_endpoint``).
"""

from __future__ import annotations

import argparse

HELP = "run the offboard consolidator service"

_RECEIVE_OPTIONS = ("db", "bind", "curve", "server_key", "allow", "initial_bundle",
                    "publish_dir", "flush_rows")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the service's options (``thinkmem_ros.consolidator.service.add_arguments``).

    An optional leading ``receive`` runs a receive-only process instead; it takes the
    service's ingest options (``--db --bind --curve --server-key --allow
    --initial-bundle --publish-dir --flush-rows``), so one option set describes both.
    """
    from thinkmem_ros.consolidator.service import add_arguments as service_arguments

    parser.add_argument("mode", nargs="?", default="serve", choices=("serve", "receive"),
                        help="serve (default): receive and run rounds; receive: only "
                        "receive into the shared store")
    service_arguments(parser)


def main(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT (exit 0), or one round with ``--once``; 2 on bad options."""
    if args.mode == "receive":
        import sys

        from thinkmem_ros.consolidator.receive import run as receive
        from thinkmem_ros.consolidator.service import add_arguments as service_arguments

        defaults = argparse.ArgumentParser(add_help=False)
        service_arguments(defaults)
        extra = [k for k, v in vars(args).items() if k not in ("mode", "verb",
                 *_RECEIVE_OPTIONS) and v != defaults.get_default(k)]
        if extra:  # a round option here would be silently ignored: say so instead
            print(f"thinkmem consolidator receive: error: options for rounds only: "
                  f"{', '.join('--' + k.replace('_', '-') for k in extra)}", file=sys.stderr)
            return 2
        return receive(args)
    from thinkmem_ros.consolidator.service import run

    return run(args)
