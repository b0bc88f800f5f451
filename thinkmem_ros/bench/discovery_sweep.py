"""Discovery alone, over more seeds than ``bench exp6`` and over the rounds' own event logs.

Why: the quick exp6 run has 2 seeds per cell, too few to see a power loss of one rule in
six; and ``bench rounds`` takes half an hour because it trains and gates every round. These
two loops run only what decides which units are promoted (``discover`` and the knowledge
life cycle), so a change to the statistics can be judged on both worlds in minutes.

    python -m thinkmem_ros.bench.discovery_sweep conditions --seeds 6
    python -m thinkmem_ros.bench.discovery_sweep rounds --seeds 3

``conditions``: relation F1 (single pass and after the knowledge rounds) and false relations
per run, per exp6 condition and repetition count (``bench.exp6._condition``, probes off).
``rounds``: the missions ``bench rounds`` plants (same seeds, same plans), cut into episodes
at their ``episode_start`` markers with time = position in the history as the consolidator
builds it, every round's episodes kept, 4 temporal partitions in the order of the fleet's
clock (round after round, as ``bench rounds`` stamps them) and each episode's robot as
its source; per round the promoted units classified as in ``bench rounds`` (planted,
planted_part, natural, spurious).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, replace

import numpy as np

from thinkmem_ros.bench import MAX_SEEDS
from thinkmem_ros.core.arguments import OneLineParser
from thinkmem_ros.core.output_files import REPORT_READ_LIMIT, check_output, one_line


@dataclass
class _Episode:
    episode_id: int
    partition: int
    events: list[tuple[float, str]]


def condition_sweep(conditions: list[str], reps: list[int], seeds: int, progress=None,
                    placement: bool = True) -> dict:
    """Mean F1 and false relations per (condition, repetitions) over ``seeds`` worlds.

    ``placement`` False: without discovery's placement check (what it costs or saves).
    """
    from thinkmem_ros.bench.exp6 import _condition
    from thinkmem_ros.consolidator.discovery import DiscoveryConfig
    from thinkmem_ros.consolidator.knowledge import KnowledgeConfig

    cfg, kcfg = DiscoveryConfig(placement=placement), KnowledgeConfig()
    out = {}
    for c in conditions:
        for r in reps:
            rows = []
            for s in range(seeds):
                rows.append(_condition(c, s, r, cfg, kcfg, False))
                if progress is not None:
                    progress()
            out[f"{c}.{r}"] = {
                "statistics_only": float(np.mean([x["statistics_only"] for x in rows])),
                "proposed": float(np.mean([x["proposed"] for x in rows])),
                "false_relations": float(np.mean([x["false_relations"] for x in rows])),
                "proposed_per_seed": [round(x["proposed"], 3) for x in rows]}
    return out


def _mission_episodes(stream) -> list[list[str]]:
    """Event names of each mission, split at the ``episode_start`` markers."""
    from thinkmem_ros.core.vocabulary import EPISODE_START_EVENT

    out: list[list[str]] = []
    for _, name in sorted(stream.events, key=lambda e: e[0]):
        if name == EPISODE_START_EVENT:
            out.append([])
        elif out:
            out[-1].append(name)
    return out


def rounds_replay(seed: int, progress=None, rounds: int | None = None,
                  compare_python: bool = False) -> list[dict]:
    """Per round of ``bench rounds`` (quick size): the units promoted, classified.

    Each row has the round's discovery seconds. ``rounds`` past the bench's five bring no
    new rule (the plan repeats the known ones). ``compare_python`` also runs every
    round's discovery with the checks' terms in Python (``checks.USE_KERNEL`` off), right
    after, and says whether every scored relation came out the same.
    """
    from thinkmem_ros.bench.rounds import SIZES, classify_unit, planted_stream, round_plan
    from thinkmem_ros.consolidator.discovery import DiscoveryConfig, EventLog, checks, discover
    from thinkmem_ros.consolidator.knowledge import KnowledgeConfig, consolidate

    size = SIZES[True]
    history: list[tuple[float, int, int, list[str]]] = []  # (start stamp, robot, round, names)
    units: dict = {}
    rows = []
    for r in range(1, (rounds or size["rounds"]) + 1):
        for k in range(size["robots"]):
            rng = np.random.default_rng([seed, r, k])
            stream, missions = planted_stream(size["robot_s"],
                                              round_plan(r, size["missions"], rng), rng)
            history += [(m.start_s, k, r, names)
                        for m, names in zip(missions, _mission_episodes(stream), strict=True)]
        # the fleet's clock runs on across rounds: each round's missions come after the
        # last round's, and the robot is each episode's source (as the consolidator has it)
        order = sorted(range(len(history)), key=lambda i: (history[i][2], *history[i][:2]))
        part = {i: rank * 4 // len(history) for rank, i in enumerate(order)}
        log = replace(EventLog.from_episodes(
            _Episode(i, part[i], [(float(j), n) for j, n in enumerate(h[3])])
            for i, h in enumerate(history)), source=np.array([h[1] for h in history]))
        started = time.perf_counter()
        result = discover(log, DiscoveryConfig(), np.random.default_rng([seed, r]))
        timing = {"discovery_s": round(time.perf_counter() - started, 3)}
        if compare_python:
            started = time.perf_counter()
            checks.USE_KERNEL = False
            try:
                plain = discover(log, DiscoveryConfig(), np.random.default_rng([seed, r]))
            finally:
                checks.USE_KERNEL = True
            timing["discovery_s_python_terms"] = round(time.perf_counter() - started, 3)
            # repr: a NaN field (a pair's middle lift) is never == itself
            timing["same_relations"] = ([repr(x) for x in plain.scored]
                                        == [repr(x) for x in result.scored])
        consolidate(units, result, r, KnowledgeConfig())
        kinds = {u.key: classify_unit(u.key) for u in units.values() if u.active}
        rows.append({"round": r, "episodes": len(history), **timing,
                     **{kind: sorted(k for k, v in kinds.items() if v == kind)
                        for kind in ("planted", "planted_part", "natural", "spurious")}})
        if progress is not None:
            progress()
    return rows


MAX_ROUNDS = 100
"""Most rounds replayed: every round's episodes stay in the history discovery reads (round
5 of the quick fleet takes seconds, each later one more), and past 5 no new rule is planted."""
DEFAULT_CONDITIONS = "sparse,zipf,heartbeat,shared,chain,decoy"
DEFAULT_REPS = "4,8,16"


def _parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m thinkmem_ros.bench.discovery_sweep",
                           description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("conditions", "rounds"))
    parser.add_argument("--seeds", type=int, default=6, help=f"1 to {MAX_SEEDS}")
    parser.add_argument("--conditions", default=None,
                        help=f"conditions: comma-separated (default {DEFAULT_CONDITIONS})")
    parser.add_argument("--reps", default=None,
                        help=f"conditions: repetitions per rule (default {DEFAULT_REPS})")
    parser.add_argument("--rounds", type=int, default=None,
                        help=f"rounds: how many, 1 to {MAX_ROUNDS} (default 5; past 5 no "
                             "new rule is planted)")
    parser.add_argument("--compare-python", action="store_true",
                        help="rounds: also time each round's discovery with the checks' "
                             "terms in Python (the reference the compiled ones equal)")
    parser.add_argument("--no-placement", action="store_true",
                        help="conditions: without discovery's placement check (to measure it)")
    parser.add_argument("--json", help="also write the figures to this file")
    return parser


def _options(parser: OneLineParser, argv: list[str] | None):
    """Parsed options, every one checked before anything runs (``parser.error``: exit 2).

    Why up front: an unknown condition, a repetition count no world can hold or an
    unwritable --json failed with a traceback, the last only after the whole run; an
    option of the other loop was ignored and an empty list ran nothing with exit 0.
    """
    args = parser.parse_args(argv)
    if not 1 <= args.seeds <= MAX_SEEDS:
        parser.error(f"--seeds must be in [1, {MAX_SEEDS}], got {args.seeds}")
    other = (["--conditions", "--reps", "--no-placement"] if args.what == "rounds"
             else ["--rounds", "--compare-python"])
    given = [o for o in other if getattr(args, o[2:].replace("-", "_")) not in (None, False)]
    if given:
        parser.error(f"{', '.join(given)}: not an option of the {args.what} loop")
    if args.what == "rounds":
        args.rounds = 5 if args.rounds is None else args.rounds
        if not 1 <= args.rounds <= MAX_ROUNDS:
            parser.error(f"--rounds must be in [1, {MAX_ROUNDS}], got {args.rounds}")
    else:
        args.conditions = _names(parser, "--conditions", args.conditions or DEFAULT_CONDITIONS)
        args.reps = _repetitions(parser, args.conditions, args.reps or DEFAULT_REPS)
    if args.json:  # the checks ``thinkmem bench`` runs, as this parser's one line, exit 2
        try:
            check_output(args.json, "--json", replaces=("a JSON report of this sweep", _ours))
        except SystemExit as refused:
            parser.error(str(refused.code))
    return args


def _names(parser: OneLineParser, option: str, text: str) -> list[str]:
    """The comma-separated conditions of ``text``, each one a world knows."""
    from thinkmem_ros.world.event_worlds import CONDITIONS

    names = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in names if c not in CONDITIONS]
    if not names or unknown:
        parser.error(f"{option} {text!r}: " + (f"unknown {unknown}" if unknown else
                     "names none") + f"; choose from {', '.join(CONDITIONS)}")
    return names


def _repetitions(parser: OneLineParser, conditions: list[str], text: str) -> list[int]:
    """The comma-separated repetition counts of ``text``, each one every condition holds."""
    from thinkmem_ros.world.event_worlds import condition_config

    try:
        reps = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--reps must be integers separated by commas, got {text!r}")
    if not reps:
        parser.error(f"--reps {text!r} names no repetition count")
    for condition in conditions:
        room = condition_config(condition).n_episodes  # bounds the episodes built below
        for r in reps:
            if not 1 <= r <= room:
                parser.error(f"--reps {r}: must be in [1, {room}] ({condition} worlds have "
                             f"{room} episodes)")
            try:
                condition_config(condition, repetitions=r)
            except ValueError as exc:
                parser.error(f"--reps {r} in {condition} worlds: {exc}")
    return reps


def _ours(path) -> bool:
    """Whether an existing --json holds a report of this sweep (replacing it loses nothing)."""
    try:
        if path.stat().st_size > REPORT_READ_LIMIT:
            return False
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and bool(doc) and all(
        (isinstance(v, dict) and "proposed" in v) or (isinstance(v, list) and all(
            isinstance(row, dict) and "round" in row for row in v)) for v in doc.values())


def main(argv: list[str] | None = None) -> int:
    """Run one loop and print its figures; bad options exit 2 with one line before it runs."""
    parser = _parser()
    args = _options(parser, argv)
    result = _conditions(args) if args.what == "conditions" else _rounds(args)
    if args.json:
        try:
            with open(args.json, "w") as fh:
                json.dump(result, fh, indent=1)
        except OSError as exc:  # checked at start; a disk that filled up since
            print(f"{parser.prog}: --json {args.json}: {one_line(exc)}", file=sys.stderr)
            return 1
    return 0


def _conditions(args) -> dict:
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task("conditions", total=len(args.conditions) * len(args.reps)
                            * args.seeds)
        result = condition_sweep(args.conditions, args.reps, args.seeds,
                                 lambda: bar.advance(task), not args.no_placement)
    for key, row in result.items():
        print(f"{key:14s} F1 single pass {row['statistics_only']:.2f}  after rounds "
              f"{row['proposed']:.2f}  false relations/run {row['false_relations']:.2f}")
    return result


def _rounds(args) -> dict:
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task("rounds", total=args.rounds * args.seeds)
        result = {str(s): rounds_replay(s, lambda: bar.advance(task), args.rounds,
                                        args.compare_python)
                  for s in range(args.seeds)}
    for s, rows in result.items():
        spurious = sorted({k for row in rows for k in row["spurious"]})
        print(f"seed {s}: planted at the last round {len(rows[-1]['planted'])}, "
              f"spurious units promoted {len(spurious)} {spurious}")
        print("  planted rules promoted by round: " + " ".join(
            str(len(row["planted"])) for row in rows))
        print("  discovery s per round: " + " ".join(
            f"{row['discovery_s']:.1f}" for row in rows))
        if args.compare_python:
            print("  checks' terms in Python: " + " ".join(
                f"{row['discovery_s_python_terms']:.1f}" for row in rows)
                + ("  (same relations)" if all(row["same_relations"] for row in rows)
                   else "  (RELATIONS DIFFER)"))
    return result


if __name__ == "__main__":
    sys.exit(main())
