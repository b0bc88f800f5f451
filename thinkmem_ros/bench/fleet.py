"""``thinkmem bench fleet``: discovery at fleet scale, receivers under load, bytes on the wire.

Reproduce: ``thinkmem bench fleet [--quick] --json bench_results/fleet.json --plot ...png``.

Discovery. A fleet's event stream: episodes of ~20 background events (Poisson) from a
vocabulary of ``N_CODES`` codes, spread over ``ROBOTS`` robot ids and shuffled in time, with
``N_RULES`` rules A...B...C planted 8-16 times each (log-uniform gaps of 2-300 s, their
counter-evidence episodes too; ``world/event_worlds.py``). Each size runs in its own
process (so its peak RSS is its own, read as VmHWM after the log is built, the high-water
mark reset first) with the consolidator's default ``DiscoveryConfig``: analytic exact
tails, no permutations, logs above ``part_events`` scanned in parts. Reported per size:
seconds, peak RSS, planted-rule recall and false relations (accepted triples not planted).
``results.embedded.discovery_s_1e7`` / ``peak_rss_gb`` and ``results.rule_recall_1e7`` /
``false_relations_1e7`` come from the 10^7-event size (full run only; ``--quick`` stops
at 10^6 and reports those keys as null). A ``small_vocabulary`` point runs 3 x 10^5 events
with 48 codes, where every code is frequent and each candidate's evidence is spread over
thousands of episodes (the costliest case per event).

Ingest (``bench/fleet_ingest.py``): robots in their own processes shipping to one and two
receive-only processes on one store (``ingest_per_s_1`` / ``_2``, no target on 2 cores),
one of two receivers SIGKILLed mid-stream (``receiver_kill.lost`` / ``.duplicated``), and
wire bytes per experience before and after delta batches.

Not measured: the distributed (Ray) engine does not exist yet, so ``results.ray.*`` are
null; robot ids label episodes here but do not enter discovery's statistics.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import time
import traceback
from pathlib import Path

import numpy as np

ROBOTS = 1000
SEEDS_APPLY = False
"""Each size is one long run of one stream: ``--seeds`` is refused rather than ignored."""
N_CODES = 5000
N_RULES = 10
BACKGROUND = 20.0
SIZES = (100_000, 300_000, 1_000_000, 3_000_000, 10_000_000)
QUICK_SIZES = (100_000, 300_000, 1_000_000)
RAY_SIZE, QUICK_RAY_SIZE = 10_000_000, 1_000_000  # the Ray engine's run, against embedded's
# stored experiences before a round (``bench.round_read``), then 5,000 new ones arrive
READ_SIZES, QUICK_READ_SIZES = (50_000, 200_000, 800_000), (20_000, 80_000)
READ_NEW = 5_000
SMALL_VOCABULARY = 48
SMALL_VOCABULARY_EVENTS = 300_000  # 48 codes cost ~1 ms per event: 10^6 takes ~20 min


def fleet_log(n_events: int, n_codes: int, seed: int):
    """An ``EventLog`` of ~``n_events`` events, its rule world, and the episodes' robot ids.

    Rule episodes (and their counter-evidence) come from ``generate_world``; the rest is
    background drawn in arrays (Python objects for 10^7 events would dwarf what discovery
    itself needs). Episodes are then shuffled in time and cut into 4 temporal partitions.
    """
    from thinkmem_ros.consolidator.discovery import EventLog
    from thinkmem_ros.world.event_worlds import WorldConfig, generate_world

    rng = np.random.default_rng([seed, n_events, n_codes])
    reps = tuple(int(r) for r in rng.integers(8, 17, size=N_RULES))
    rule_eps = sum(reps) * 2 + 50
    w = generate_world(WorldConfig(n_codes=n_codes, n_rules=N_RULES, repetitions=reps,
                                   n_episodes=rule_eps, n_partitions=1,
                                   background=BACKGROUND), rng)
    lookup = {c: i for i, c in enumerate(w.codes)}
    r_ep = np.concatenate([[i] * len(e.events) for i, e in enumerate(w.episodes)]).astype(
        np.int64)
    r_t = np.array([t for e in w.episodes for t, _ in e.events], np.float64)
    r_c = np.array([lookup[c] for e in w.episodes for _, c in e.events], np.int64)
    n_bg = max(0, int(round(n_events / BACKGROUND)) - rule_eps)
    counts = rng.poisson(BACKGROUND, n_bg)
    b_ep = np.repeat(np.arange(rule_eps, rule_eps + n_bg, dtype=np.int64), counts)
    b_t = rng.uniform(0.0, w.config.duration, b_ep.size)
    b_c = rng.integers(0, n_codes, b_ep.size)
    n_ep = rule_eps + n_bg
    place = rng.permutation(n_ep)  # episode -> position in time
    episode = place[np.concatenate((r_ep, b_ep))]
    t = np.concatenate((r_t, b_t))
    code = np.concatenate((r_c, b_c))
    del r_ep, r_t, r_c, b_ep, b_t, b_c
    order = np.lexsort((t, episode))
    log = EventLog(episode=episode[order], time=t[order], code=code[order],
                   partition=np.arange(n_ep, dtype=np.int64) * 4 // n_ep,
                   episode_ids=np.arange(n_ep, dtype=np.int64), codes=w.codes)
    robot_of = np.arange(n_ep) % ROBOTS
    return log, w, robot_of


def _reset_peak() -> bool:
    """Reset this process's peak RSS (Linux ``clear_refs``); False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _peak_rss_gb() -> float:
    """Peak RSS since the last reset (VmHWM), or the whole process's where unavailable."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


MEMORY_CAP_GB = 14.0  # address space per size: a size that needs more fails, reported
SIZE_TIMEOUT_S = {10_000_000: 5400.0}  # the rest: 3600 s


def _discovery_child(n_events: int, n_codes: int, seed: int, engine_name: str, out) -> None:
    """One size in a fresh process: build the stream, then time discovery alone."""
    import resource

    from thinkmem_ros.consolidator.discovery import DiscoveryConfig, discover
    from thinkmem_ros.consolidator.engine import make_engine
    from thinkmem_ros.world.event_worlds import score_triples

    if engine_name == "embedded":  # Ray's own processes would inherit the cap
        cap = int(MEMORY_CAP_GB * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    engine = None
    try:
        start = time.perf_counter()
        log, w, robot_of = fleet_log(n_events, n_codes, seed)
        build_s = time.perf_counter() - start
        log_gb = sum(a.nbytes for a in (log.episode, log.time, log.code)) / 2**30
        start = time.perf_counter()
        engine = make_engine(engine_name, num_cpus=os.cpu_count())
        engine_start_s = time.perf_counter() - start
        reset = _reset_peak()
        cfg = DiscoveryConfig()
        start = time.perf_counter()
        result = discover(log, cfg, np.random.default_rng(seed), engine=engine)
        seconds = time.perf_counter() - start
        score = score_triples(result.accepted_patterns(3), w)
        out.put({"n_events": int(log.code.size), "n_episodes": len(log.episode_ids),
                 "n_codes": n_codes, "robots": int(robot_of.max()) + 1,
                 "repetitions": list(w.config.rule_repetitions), "seconds": round(seconds, 2),
                 "peak_rss_gb": round(_peak_rss_gb(), 3), "peak_reset": reset,
                 "log_gb": round(log_gb, 3), "build_s": round(build_s, 2),
                 "parts": result.notes.get("parts", 1), "rule_recall": score["recall"],
                 "false_relations": score["fp"], "accepted": len(result.accepted),
                 "engine": engine_name, "engine_start_s": round(engine_start_s, 2),
                 "pass_s": {k: round(v, 1) for k, v in result.notes.get("pass_s", {}).items()},
                 "family_budget": result.notes.get("family_budget") or None,
                 "patterns": sorted(">".join(r.pattern) for r in result.accepted)})
    except Exception as exc:  # noqa: BLE001 - reported as the size's outcome
        where = traceback.extract_tb(exc.__traceback__)[-3:]
        out.put({"n_events": n_events, "n_codes": n_codes, "engine": engine_name,
                 "error": f"{type(exc).__name__}: {exc}"[:300],
                 "where": [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in where],
                 "peak_rss_gb": round(_peak_rss_gb(), 3)})
    finally:
        if engine is not None:
            engine.close()


def discovery_at(n_events: int, n_codes: int = N_CODES, seed: int = 0,
                 timeout_s: float = 3600.0, engine: str = "embedded") -> dict:
    """Run one size in a spawned process; its row (``error`` when it failed or timed out).

    ``engine="ray"`` runs discovery's passes as tasks on a local Ray instance the child
    starts with every core (its peak RSS is the driver's; the workers are other processes).
    """
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_discovery_child, args=(n_events, n_codes, seed, engine, out))
    proc.start()
    try:
        row = out.get(timeout=timeout_s)
    except Exception:  # noqa: BLE001 - queue.Empty: the child ran out of time
        row = {"n_events": n_events, "n_codes": n_codes,
               "error": f"did not finish in {timeout_s:.0f} s"}
    proc.join(30)
    if proc.is_alive():
        proc.kill()
    if proc.exitcode not in (0, None) and "error" not in row:
        row["error"] = f"exit code {proc.exitcode}"
    return row


def _ray_results(ray_row: dict, rows: list[dict]) -> dict:
    """The Ray engine's run against the embedded run of the same size."""
    same = next((r for r in rows if r["n_events"] == ray_row["n_events"]), None)
    ok = "seconds" in ray_row
    both = ok and same is not None and "patterns" in same
    embedded_s = same.get("seconds") if same is not None else None
    return {
        "n_events": ray_row["n_events"],
        f"discovery_s_{'1e7' if ray_row['n_events'] >= 9_000_000 else '1e6'}":
            ray_row.get("seconds"),
        "discovery_s_1e7": ray_row.get("seconds") if ray_row["n_events"] >= 9_000_000 else None,
        "embedded_s_same_size": embedded_s,
        "speedup": round(embedded_s / ray_row["seconds"], 2) if ok and embedded_s else None,
        "same_patterns": (ray_row["patterns"] == same["patterns"]) if both else None,
        "driver_peak_rss_gb": ray_row.get("peak_rss_gb"),
        "engine_start_s": ray_row.get("engine_start_s"),
        "cluster": f"local Ray instance, {os.cpu_count()} CPUs, started by the run",
        "error": ray_row.get("error"),
    }


def _failed(row: dict | None) -> str | None:
    return None if row is None else row.get("error")


def _linear_exponent(rows: list[dict]) -> float | None:
    """Slope of log(seconds) against log(events) over the sizes that ran: 1 = linear."""
    ok = [r for r in rows if "seconds" in r and r["seconds"] > 0]
    if len(ok) < 2:
        return None
    x = np.log([r["n_events"] for r in ok])
    y = np.log([r["seconds"] for r in ok])
    return round(float(np.polyfit(x, y, 1)[0]), 3)


def run(quick: bool, seeds: int) -> dict:
    """Discovery over the sizes (one seed: each size is one long run), then ingest."""
    from thinkmem_ros.bench import fleet_ingest
    from thinkmem_ros.bench.common import bench_progress
    from thinkmem_ros.bench.round_read import read_scaling
    from thinkmem_ros.consolidator.round_read import DEFAULT_RESERVOIR

    del seeds  # each discovery size is a single run; ingest repeats are its own
    sizes = QUICK_SIZES if quick else SIZES
    rows: list[dict] = []
    with bench_progress() as progress:
        task = progress.add_task("fleet", total=len(sizes) + 7)
        for n in sizes:
            rows.append(discovery_at(n, timeout_s=SIZE_TIMEOUT_S.get(n, 3600.0)))
            progress.advance(task)
        ray_n = QUICK_RAY_SIZE if quick else RAY_SIZE
        ray_row = discovery_at(ray_n, timeout_s=SIZE_TIMEOUT_S.get(ray_n, 3600.0),
                               engine="ray")
        progress.advance(task)
        small = discovery_at(SMALL_VOCABULARY_EVENTS, SMALL_VOCABULARY)
        progress.advance(task)
        records = 8000 if quick else 20000
        one = fleet_ingest.ingest_rate(1, robots=4, records=records)
        progress.advance(task)
        two = fleet_ingest.ingest_rate(2, robots=4, records=records)
        progress.advance(task)
        kill = fleet_ingest.receiver_kill(robots=4, records=records)
        progress.advance(task)
        wire = fleet_ingest.bytes_per_experience(records=2000, ship_every=1)
        progress.advance(task)
        reads = read_scaling(QUICK_READ_SIZES if quick else READ_SIZES, READ_NEW,
                             DEFAULT_RESERVOIR)
        progress.advance(task)
    big = next((r for r in rows if r["n_events"] >= 9_000_000), None)
    top = big if big is not None and "seconds" in big else None
    from thinkmem_ros.consolidator.discovery import DiscoveryConfig

    cfg = DiscoveryConfig()
    results = {
        "embedded": {"discovery_s_1e7": None if top is None else top["seconds"],
                     "peak_rss_gb": None if top is None else top["peak_rss_gb"],
                     "time_exponent": _linear_exponent(rows),
                     "failed_1e7": _failed(big)},
        "ray": _ray_results(ray_row, rows),
        "permutations": 0,
        "rule_recall_1e7": None if top is None else top["rule_recall"],
        "false_relations_1e7": None if top is None else top["false_relations"],
        "ingest_per_s_1": one["ingest_per_s"], "ingest_per_s_2": two["ingest_per_s"],
        "receiver_kill": {"lost": kill["lost"], "duplicated": kill["duplicated"],
                          "failovers": kill["failovers"]},
        "bytes_per_experience": {"before": round(wire["before"], 1),
                                 "after": round(wire["after"], 1),
                                 "ratio": round(wire["ratio"], 2)},
        "small_vocabulary": small,
        # a round's read: the whole store against the rows after the running bundle's
        # mark plus the reservoir; time at the largest store over time at the smallest
        "round_read": {"growth_whole": reads["growth_whole"],
                       "growth_incremental": reads["growth_incremental"],
                       "growth_incremental_counted": reads["growth_incremental_counted"],
                       "growth_histories_scan": reads["growth_histories_scan"],
                       "growth_histories_fold": reads["growth_histories_fold"],
                       "store_growth": round(reads["rows"][-1]["stored_before"]
                                             / reads["rows"][0]["stored_before"], 1)},
    }
    return {
        "metric": "embedded.discovery_s_1e7",
        "results": results,
        "curves": {"discovery": rows, "ray": [ray_row]},
        "ingest": {"one_receiver": one, "two_receivers": two, "receiver_kill": kill,
                   "bytes": wire},
        "round_read": reads,
        "settings": {"sizes": list(sizes), "robots": ROBOTS, "n_codes": N_CODES,
                     "n_rules": N_RULES, "background_per_episode": BACKGROUND,
                     "discovery": {k: (list(v) if isinstance(v, tuple) else
                                       (None if isinstance(v, float) and math.isinf(v) else v))
                                   for k, v in cfg.__dict__.items()},
                     "p_values": "analytic exact tails (no permutations)",
                     "cores": os.cpu_count(), "ingest_records": records},
    }


def plot(report: dict, path) -> None:
    """Discovery seconds and peak RSS against events (log-log), targets marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["curves"]["discovery"] if "seconds" in r]
    fig, (left, right, reads) = plt.subplots(1, 3, figsize=(15, 4))
    if rows:
        n = [r["n_events"] for r in rows]
        left.loglog(n, [r["seconds"] for r in rows], "o-", label="embedded (parts)")
        right.loglog(n, [r["peak_rss_gb"] for r in rows], "o-", label="peak RSS")
        right.loglog(n, [r["log_gb"] for r in rows], "s--", label="the event log itself")
        ref = np.array([n[0], n[-1]], float)
        left.loglog(ref, rows[0]["seconds"] * ref / n[0], ":", color="grey",
                    label="linear from the smallest")
    for r in report["curves"].get("ray", []):
        if "seconds" in r:
            left.loglog([r["n_events"]], [r["seconds"]], "D", color="tab:purple",
                        label=f"Ray engine ({os.cpu_count()} CPUs, local)")
    for r in report["curves"]["discovery"]:
        if "error" in r and r.get("peak_rss_gb"):  # a size that failed: where it stopped
            right.plot([r["n_events"]], [r["peak_rss_gb"]], "rx", markersize=10,
                       label=f"{r['n_events']:.0e} failed: {r['error'].split(':')[0]}")
    left.axhline(600, color="r", linestyle="--", label="target at 1e7: 600 s")
    right.axhline(2.0, color="r", linestyle="--", label="target: 2 GB")
    read_rows = (report.get("round_read") or {}).get("rows", [])
    if read_rows:
        stored = [r["stored_before"] for r in read_rows]
        reads.plot(stored, [r["whole_s"] for r in read_rows], "o-",
                   label="whole store (what every round read before)")
        reads.plot(stored, [r["incremental_s"] for r in read_rows], "s-",
                   label=f"new rows + carried reservoir ({read_rows[0]['new']:,} new)")
        if "incremental_counted_s" in read_rows[0]:
            reads.plot(stored, [r["incremental_counted_s"] for r in read_rows], "^--",
                       label="new rows + reservoir counted over older rows")
        if "histories_scan_s" in read_rows[0]:  # discovery's input, in milliseconds
            ms = reads.twinx()
            ms.plot(stored, [1000 * r["histories_scan_s"] for r in read_rows], "v:",
                    color="tab:gray", label="event histories: every row scanned (ms)")
            ms.plot(stored, [1000 * r["histories_fold_s"] for r in read_rows], "d:",
                    color="tab:olive", label="event histories: carried, new rows folded (ms)")
            ms.set(ylabel="ms", ylim=(0, None))
            ms.legend(fontsize=7, loc="center right")
        reads.set(xlabel="experiences stored before the round", ylabel="seconds",
                  title="a round's read", ylim=(0, None))
        reads.xaxis.set_major_formatter(lambda x, _: f"{x / 1000:.0f}k")
        reads.legend(fontsize=8)
        reads.grid(True, alpha=0.3)
    left.set(xlabel="events", ylabel="discovery seconds", title="time")
    right.set(xlabel="events", ylabel="GB", title="memory")
    for ax in (left, right):
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
    res = report["results"]
    recall = res["rule_recall_1e7"]
    fig.suptitle(f"bench fleet: rule recall @1e7 "
                 f"{'not measured' if recall is None else recall}, false "
                 f"{res['false_relations_1e7']}; ingest 1/2 receivers "
                 f"{res['ingest_per_s_1']:.0f}/{res['ingest_per_s_2']:.0f} per s; kill lost "
                 f"{res['receiver_kill']['lost']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
