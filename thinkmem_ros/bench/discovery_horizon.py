"""What a round's discovery costs as the store grows, with and without its horizon.

Why: every round read every episode history the store carried and ran discovery over all of
them, so a round's memory and time grew with the fleet's whole history, with no bound. With
``discovery_events`` (``--discovery-events``) a round reads each robot's newest whole
episodes up to that many events in all, shared fairly between robots
(``consolidator/histories.py``). This builds stores of growing size through
the real ingest (SQLite, one record per episode carrying its history, 8 robots, 20 events per
episode over 2,000 names, one rule A…B…C planted in 16 of the newest episodes), then times
what a round does for discovery (read the carried histories, build the log, discover) both
ways, each in a fresh process for its own peak memory. The stores' histories are folded
when built, as the round before would have left them.

    python -m thinkmem_ros.bench.discovery_horizon
        --json docs/results/discovery_horizon.json --plot docs/results/discovery_horizon.png
"""

from __future__ import annotations

import json
import multiprocessing
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from thinkmem_ros.bench.common import check_report_outputs
from thinkmem_ros.core.arguments import OneLineParser

SIZES = (100_000, 300_000, 1_000_000, 3_000_000)  # events the store carries before the round
HORIZON = 100_000
PER_EPISODE = 20
ROBOTS = 8
VOCABULARY = 2000
RULE = ("rule_a", "rule_b", "rule_c")
RULE_EPISODES = 16


def build_store(path: Path, events: int, horizon: int = HORIZON, seed: int = 0) -> None:
    """A store whose carried histories hold ``events`` events (see the module docstring).

    The rule's episodes are among the newest half of ``horizon``'s, so both ways can find it.
    """
    from thinkmem_ros.consolidator.store import ExperienceStore
    from thinkmem_ros.link.experience import Experience, encode_experience

    rng = np.random.default_rng(seed)
    n_ep = events // PER_EPISODE
    names = np.asarray([f"ev{i:04d}" for i in range(VOCABULARY)])
    newest = np.arange(max(0, n_ep - horizon // PER_EPISODE // 2), n_ep)
    planted = set(rng.choice(newest, min(RULE_EPISODES, newest.size), replace=False).tolist())
    window = np.zeros((2, 2), np.float32)
    with ExperienceStore(path, flush_rows=0) as store:
        for lo in range(0, n_ep, 5000):
            batch = []
            for ep in range(lo, min(lo + 5000, n_ep)):
                history = rng.choice(names, PER_EPISODE).tolist()
                if ep in planted:  # A…B…C in order, at random places of the episode
                    at = np.sort(rng.choice(PER_EPISODE, 3, replace=False))
                    for name, i in zip(RULE, at.tolist(), strict=True):
                        history[i] = name
                e = Experience(robot_id=f"robot{ep % ROBOTS}", episode_id=f"ep{ep:07d}",
                               seq=ep, stamp=float(ep), window=window, labels=["trend"],
                               probabilities=[0.5], bundle_version=1, events=history)
                batch.append((e, encode_experience(e)))
            store.insert_many(batch)
        store.fold_histories()  # the round before this one carried them


def _case(args: tuple[str, int]) -> dict:
    """A round's discovery on the store at ``path`` with horizon ``max_events`` (0: none)."""
    path, max_events = args
    from thinkmem_ros.consolidator.discovery import DiscoveryConfig, discover
    from thinkmem_ros.consolidator.discovery_log import carried_histories, log_from_rows
    from thinkmem_ros.consolidator.store import ExperienceStore

    started = time.perf_counter()
    with ExperienceStore(path) as store:
        rows, _ = carried_histories(store, max_events)
    log, _ = log_from_rows(rows, 4)
    del rows
    read_s = time.perf_counter() - started
    result = discover(log, DiscoveryConfig(), np.random.default_rng(1))
    return {"seconds": round(time.perf_counter() - started, 2), "read_s": round(read_s, 2),
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
            "events_read": int(log.code.size), "episodes_read": len(log.episode_ids),
            "rule_found": RULE in result.accepted_patterns(3),
            "false_triples": len(result.accepted_patterns(3) - {RULE})}


def run(sizes=SIZES, horizon: int = HORIZON, progress=None) -> dict:
    """Per store size, the round's discovery with the horizon and over every episode."""
    spawn = multiprocessing.get_context("spawn")
    rows = []
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix="horizon-") as tmp:
            path = Path(tmp) / "c.db"
            build_store(path, size, horizon)
            row: dict = {"stored_events": size}
            for name, cap in (("horizon", horizon), ("whole", 0)):
                with spawn.Pool(1, maxtasksperchild=1) as pool:
                    row[name] = pool.apply(_case, ((str(path), cap),))
        rows.append(row)
        if progress is not None:
            progress(row)
    return {"horizon_events": horizon, "rows": rows,
            "growth_stored": round(rows[-1]["stored_events"] / rows[0]["stored_events"], 2),
            "growth_horizon_s": _ratio(rows, "horizon", "seconds"),
            "growth_whole_s": _ratio(rows, "whole", "seconds"),
            "growth_horizon_rss": _ratio(rows, "horizon", "peak_rss_gb"),
            "growth_whole_rss": _ratio(rows, "whole", "peak_rss_gb")}


def _ratio(rows: list[dict], way: str, key: str) -> float | None:
    first, last = rows[0][way][key], rows[-1][way][key]
    return round(last / first, 2) if len(rows) > 1 and first > 0 else None


def plot(report: dict, path: str | Path) -> None:
    """Seconds and peak memory against the events stored, both ways."""
    from thinkmem_ros.bench.plots import new_figure, save, series_panel

    fig, (ax_t, ax_m) = new_figure(2, f"A round's discovery, horizon "
                                      f"{report['horizon_events']:,} events")
    for ax, key, label in ((ax_t, "seconds", "seconds"), (ax_m, "peak_rss_gb", "peak RSS (GB)")):
        curves = {way: {r["stored_events"]: r[way][key] for r in report["rows"]}
                  for way in ("horizon", "whole")}
        series_panel(ax, curves, {"horizon": "each robot's newest, within the horizon",
                                  "whole": "every episode"}, ylabel=label)
        ax.set_xlabel("events the store carries")
    save(fig, path)


def _options(argv: list[str] | None):
    """Parsed and checked options (sizes, horizon, outputs): bad ones exit 2 in one line."""
    parser = OneLineParser(prog="python -m thinkmem_ros.bench.discovery_horizon",
                           description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES),
                        help="events the stores carry, comma-separated")
    parser.add_argument("--horizon", type=int, default=HORIZON,
                        help="the round's --discovery-events")
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--plot", help="write the PNG here")
    args = parser.parse_args(argv)
    try:
        args.sizes = tuple(int(s) for s in args.sizes.split(","))
    except ValueError:
        parser.error(f"--sizes {args.sizes!r} is not a comma-separated list of integers")
    if not args.sizes or min(args.sizes) < 1000 or args.horizon < 1024:
        parser.error("--sizes must be >= 1000 events each and --horizon >= 1024")
    check_report_outputs(parser, args)
    return parser, args


def _shown(row: dict) -> None:
    print(f"{row['stored_events']:,} events stored: " + "; ".join(
        f"{way} {row[way]['seconds']} s, {row[way]['peak_rss_gb']} GB, "
        f"{row[way]['events_read']:,} read, rule found {row[way]['rule_found']}"
        for way in ("horizon", "whole")), flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run, print each size's row, write the outputs (checked before the run)."""
    from thinkmem_ros.core.output_files import one_line

    parser, args = _options(argv)
    report = run(args.sizes, args.horizon, _shown)
    try:
        if args.json:
            from thinkmem_ros.bench.common import finish_report

            report = finish_report({"results": report}, name="discovery_horizon",
                                   quick=False, seeds=1, json_path=args.json)
        else:
            print(json.dumps(report, indent=2))
        if args.plot:
            plot(report.get("results", report), args.plot)
    except OSError as exc:  # checked at start; a disk that filled up since
        print(f"{parser.prog}: {one_line(exc)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
