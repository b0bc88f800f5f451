"""What a robot's dense episodes cost a round's discovery, with and without the limit.

Why: candidate generation costs about n·w² rows per episode (n events, w distinct codes
around each), and a robot can send episodes of up to 1,024 event names drawn from names
the rest of the fleet reports. This runs discovery on 4 honest robots (100 episodes of 20
events over a shared vocabulary) plus one robot's dense episodes, each case in a fresh
process with a memory cap, and reports seconds, peak memory and what the limit left out.

    python -m thinkmem_ros.bench.dense_episodes
    python -m thinkmem_ros.bench.dense_episodes --max-episode-codes 0   # the limit off
"""

from __future__ import annotations

import multiprocessing
import resource
import sys
import time
from dataclasses import dataclass, replace

import numpy as np

from thinkmem_ros.core.arguments import OneLineParser

CASES = ((0, 0, 0), (2, 1024, 300), (20, 256, 300), (20, 1024, 300), (20, 1024, 64),
         (200, 1024, 64))
"""(dense episodes, events each, distinct names each) beside the honest fleet."""


@dataclass
class _Episode:
    episode_id: int
    partition: int
    events: list


def fleet_log(dense: int, events: int, width: int, vocabulary: int = 300):
    """4 honest robots' episodes plus ``dense`` episodes of a fifth robot."""
    from thinkmem_ros.consolidator.discovery import EventLog

    rng = np.random.default_rng(0)
    names = [f"ev{i:03d}" for i in range(vocabulary)]
    eps, source = [], []
    for robot in range(4):
        for _ in range(100):
            eps.append(_Episode(len(eps), robot, list(enumerate(rng.choice(names, 20)))))
            source.append(robot)
    for k in range(dense):
        own = rng.choice(names, min(width, vocabulary), replace=False)
        eps.append(_Episode(len(eps), k % 4, list(enumerate(rng.choice(own, events)))))
        source.append(4)
    eps = [_Episode(e.episode_id, e.partition, [(float(t), str(x)) for t, x in e.events])
           for e in eps]
    return replace(EventLog.from_episodes(eps), source=np.asarray(source))


def _case(args: tuple[int, int, int, int, float]) -> dict:
    dense, events, width, limit, cap_gb = args
    from thinkmem_ros.consolidator.discovery import DiscoveryConfig, discover

    cap = int(cap_gb * 2 ** 30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    log = fleet_log(dense, events, width)
    started = time.perf_counter()
    try:
        result = discover(log, DiscoveryConfig(max_episode_codes=limit),
                          np.random.default_rng(1))
    except MemoryError:
        return {"out_of_memory": True}
    return {"seconds": round(time.perf_counter() - started, 2),
            "peak_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, 2),
            "left_out": result.notes["episodes_too_dense"], "parts": result.notes["parts"]}


def run(limit: int, cap_gb: float, cases=CASES) -> list[dict]:
    """One row per case, each measured in a fresh process (its own peak memory)."""
    rows = []
    spawn = multiprocessing.get_context("spawn")
    for dense, events, width in cases:
        with spawn.Pool(1, maxtasksperchild=1) as pool:
            out = pool.apply(_case, ((dense, events, width, limit, cap_gb),))
        rows.append({"dense_episodes": dense, "events": events, "names": width, **out})
        shown = ("out of memory at the cap" if out.get("out_of_memory") else
                 f"{out['seconds']} s, {out['peak_gb']} GB, {out['left_out']} left out, "
                 f"{out['parts']} parts")
        print(f"{dense} x {events} events of {width} names: {shown}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m thinkmem_ros.bench.dense_episodes",
                           description=__doc__.splitlines()[0])
    parser.add_argument("--max-episode-codes", type=int, default=64,
                        help="discovery's limit (0: off, every episode scanned)")
    parser.add_argument("--cap-gb", type=float, default=12.0,
                        help="address-space cap of each case's process")
    args = parser.parse_args(argv)
    if args.max_episode_codes < 0 or not 0 < args.cap_gb <= 1024:
        parser.error("--max-episode-codes must be >= 0 and --cap-gb in (0, 1024]")
    run(args.max_episode_codes, args.cap_gb)
    return 0


if __name__ == "__main__":
    sys.exit(main())
