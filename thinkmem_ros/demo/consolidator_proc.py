"""The demo's consolidator process: the real ``ConsolidatorService`` plus a line protocol.

Why not the plain ``thinkmem_consolidator`` script: the demo must run *one* round at a
known moment (after the "before" playback reached the store) and see its report, and the
round must run inside the serving process, because only that process holds the robot
connections a bundle push goes out on (``--once`` publishes without pushing). So this
wraps the same service with the same options and reads commands on stdin, one per line:

=========  ==============================================================================
command    reply on stdout (one line)
=========  ==============================================================================
``count``  ``COUNT {"experiences", "episodes", "with_feedback", "last_stamp"}``
``round``  ``ROUND {RoundReport + "units": [knowledge units]}`` after the round finished
``quit``   ``BYE``, then a clean exit (EOF on stdin or SIGTERM does the same)
=========  ==============================================================================

A failing command answers ``ERROR <reason>`` and the process keeps serving. Start-up
prints ``READY <endpoint>`` once the receiver is bound; logs go to stderr.

Run: ``python -m thinkmem_ros.demo.consolidator_proc --signing-key K --db D
--publish-dir P --initial-bundle B --bind tcp://127.0.0.1:*``.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from dataclasses import replace

from thinkmem_ros.consolidator.gate import MIN_HELDOUT_ROWS
from thinkmem_ros.consolidator.knowledge import KnowledgeStore
from thinkmem_ros.consolidator.retrain import RetrainConfig
from thinkmem_ros.consolidator.service import ConsolidatorService, add_arguments, config_from_args
from thinkmem_ros.consolidator.store import ExperienceStore
from thinkmem_ros.core.arguments import OneLineParser

log = logging.getLogger("thinkmem_ros.demo.consolidator")


def _counts(service: ConsolidatorService) -> dict:
    """Count what the store holds now (own short-lived connection: one store per thread)."""
    with ExperienceStore(service.config.db_path) as store:
        episodes = store.episodes()
        return {"experiences": store.count(), "episodes": len(episodes),
                "with_feedback": len(store.rewards()),
                "last_stamp": max((e.last_stamp for e in episodes), default=0.0)}


def unit_rows(db_path) -> list[dict]:
    """Every knowledge unit in the store as a JSON-ready row, promoted first."""
    with KnowledgeStore(db_path) as kstore:
        units = list(kstore.units().values())
    units.sort(key=lambda u: (not u.active, -u.confidence, u.key))
    return [{"pattern": list(u.pattern), "relation": u.relation, "thinking": u.thinking,
             "confidence": round(u.confidence, 4), "status": u.status,
             "support_episodes": len(u.experiences), "last_support": round(u.last_support, 4),
             "constraints": u.constraints} for u in units]


def _round(service: ConsolidatorService) -> dict:
    report = service.run_round("demo").to_dict()
    report["units"] = unit_rows(service.config.db_path)
    return report


def _jsonable(value: object) -> object:
    """Numpy scalars as Python numbers, anything else unknown as its text."""
    item = getattr(value, "item", None)
    return item() if callable(item) else str(value)


COMMANDS = {"count": _counts, "round": _round}


def serve_commands(service: ConsolidatorService, stdin=sys.stdin, stdout=sys.stdout,
                   busy: threading.Event | None = None) -> None:
    """Answer commands from ``stdin`` until ``quit``, EOF or a stop request.

    ``busy`` is set while a command runs, so a signal handler knows whether it may end
    the process at once (idle, blocked on stdin) or must let a round stop at its next
    step boundary.
    """
    busy = busy or threading.Event()
    for line in stdin:
        command = line.strip()
        if service.stop_event.is_set() or command == "quit":
            break
        if not command:
            continue
        handler = COMMANDS.get(command)
        if handler is None:
            print(f"ERROR unknown command {command!r}; expected one of "
                  f"{sorted([*COMMANDS, 'quit'])}", file=stdout, flush=True)
            continue
        busy.set()
        try:
            reply = handler(service)
        except Exception as exc:  # noqa: BLE001 - report and keep serving the node
            log.exception("command %s failed", command)
            print(f"ERROR {command}: {type(exc).__name__}: {exc}".replace("\n", " "),
                  file=stdout, flush=True)
            continue
        finally:
            busy.clear()
        print(f"{command.upper()} {json.dumps(reply, default=_jsonable)}", file=stdout, flush=True)
    print("BYE", file=stdout, flush=True)


def gate_overrides(items: list[str]) -> dict[str, float | int | bool]:
    """Parse ``KEY=VALUE`` gate overrides; a bad item raises ValueError naming it."""
    from dataclasses import fields

    from thinkmem_ros.consolidator.gate import GateConfig

    known = {f.name: f.type for f in fields(GateConfig)}
    out: dict[str, float | int | bool] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in known:
            raise ValueError(f"--gate {item!r}: expected KEY=VALUE with KEY one of "
                             f"{sorted(known)}")
        if known[key] in (bool, "bool"):
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"--gate {item!r}: expected true or false")
            out[key] = value.lower() in ("true", "1")
            continue
        try:
            out[key] = int(value) if known[key] in (int, "int") else float(value)
        except ValueError:
            raise ValueError(f"--gate {item!r}: {value!r} is not a number") from None
    return out


def main(argv: list[str] | None = None) -> int:
    """Start the service, print READY, answer commands, stop cleanly."""
    parser = OneLineParser(prog="thinkmem-demo-consolidator",
                                     description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument("--patience", type=int, default=4, help="retraining early stop")
    parser.add_argument("--lr", type=float, default=RetrainConfig.lr,
                        help="retraining peak learning rate")
    parser.add_argument("--val-fraction", type=float, default=0.0,
                        help="retraining validation split (default 0: with a few episodes, "
                        "early stopping on it restores a near-initial model that never "
                        "learns the new event rule; the gate's held-out episodes judge)")
    parser.add_argument("--gate", action="append", default=[], metavar="KEY=VALUE",
                        help="override one GateConfig field (repeatable), e.g. "
                        "f1_tolerance=0.05; default: the gate as configured by the service")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        config = config_from_args(args)
        # the demo rehearses D, so it can and must judge regression on >= 200 held-out rows
        gate = replace(config.gate, **{"min_heldout": MIN_HELDOUT_ROWS,
                                       **gate_overrides(args.gate)})
        config = replace(config,
                         retrain=RetrainConfig(epochs=args.epochs, patience=args.patience,
                                               lr=args.lr, val_fraction=args.val_fraction,
                                               seed=args.seed),
                         gate=gate)
        service = ConsolidatorService(config).start()
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"ERROR start: {exc}".replace("\n", " "), flush=True)
        return 2
    busy = threading.Event()

    def on_signal(*_: object) -> None:
        service.stop()  # a running round stops at its next step boundary, nothing published
        if not busy.is_set():
            raise SystemExit(0)  # idle: leave the blocking stdin read now

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    print(f"READY {service.endpoint}", flush=True)
    try:
        serve_commands(service, busy=busy)
    except SystemExit:
        pass
    finally:
        service.close()
    log.info("demo consolidator stopped cleanly after %d rounds", len(service.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
