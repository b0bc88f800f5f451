"""``thinkmem consolidator``: the consolidator service (same as ``thinkmem_consolidator``).

Receives experiences over ZeroMQ, stores them, and on the consolidation trigger runs a
round: discovery, knowledge units, warm-start retraining, the validation gate, signed
publication and the push to robots. ``--once`` runs one round over the store and exits.
"""

from __future__ import annotations

import argparse

HELP = "run the offboard consolidator service"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the service's options (``thinkmem_ros.consolidator.service.add_arguments``)."""
    from thinkmem_ros.consolidator.service import add_arguments as service_arguments

    service_arguments(parser)


def main(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT (exit 0), or one round with ``--once``; 2 on bad options."""
    from thinkmem_ros.consolidator.service import run

    return run(args)
