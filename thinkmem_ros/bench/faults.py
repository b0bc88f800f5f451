"""Hostile input and faults against real processes: nothing crashes, nothing is lost.

Reproduce: ``thinkmem bench faults [--quick] --json bench_results/faults.json --plot
bench_results/faults.png`` (the full-disk probe mounts a 2 MiB tmpfs and needs root; it is
reported as skipped otherwise).

Two probe families, each a plain function that starts real processes on loopback and
returns one record (``bench/fault_probes_link.py``, ``bench/fault_probes_node.py``):

- link: spoofed batches and HELLOs in another robot's name, a revoked key, floods of huge
  ``robot_id`` fields, oversized and malformed frames, msgpack bombs, a 600 MB reply to
  the robot, a spool on a full disk with the consolidator away;
- node: hostile feedback (deep nesting, oversize, malformed), far-future stamps, clock
  jumps and looping sim-time playback, bad params files and bundle manifests, refused
  parameter sets, all-stale input, the player interrupted, a full disk under a push.

``results``: ``probes`` (how many ran), ``crashes`` (a process died or a probe raised),
``lost`` (experiences accepted by ``ship()`` that were neither stored, nor still spooled,
nor counted as shed), ``spoofed_accepted``, ``unbounded_growth_mb`` (largest RSS growth
of any process over its probe), ``misbehaved`` (probes that survived but did not do what
the product promises), ``skipped``; ``probe_table`` has every record.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

SEEDS_APPLY = False
"""Each probe is one fault, run once: ``--seeds`` is refused rather than ignored."""


def _link(quick: bool) -> list[dict]:
    from thinkmem_ros.bench.fault_probes_link import run_probes

    return [dict(r, family="link") for r in run_probes(quick=quick)]


def _node(workdir: Path) -> list[dict]:
    from thinkmem_ros.bench.fault_probes_node import ProbeContext, run_probes

    return [dict(r, family="node") for r in run_probes(ProbeContext(workdir))]


def summarise(records: list[dict]) -> dict:
    """The pinned ``results`` keys over every probe record."""
    ran = [r for r in records if not str(r.get("detail", "")).startswith("skipped")]
    return {
        "probes": len(ran),
        "skipped": len(records) - len(ran),
        "crashes": sum(bool(r.get("crashed")) for r in ran),
        "lost": sum(int(r.get("lost", 0)) for r in ran),
        "spoofed_accepted": sum(int(r.get("spoofed_accepted", 0)) for r in ran),
        "unbounded_growth_mb": round(max((float(r.get("rss_growth_mb") or 0.0) for r in ran),
                                         default=0.0), 2),
        "misbehaved": sum(r.get("ok") is False and not r.get("crashed") for r in ran),
    }


def run(quick: bool, seeds: int) -> dict:
    """Run every probe once (``seeds`` does not apply: each probe is one fault)."""
    from rich.console import Console

    console = Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="thinkmem-faults-") as tmp:
        with console.status("link probes (ZeroMQ, SQLite, shipper/receiver processes)"):
            records = _link(quick)
        with console.status("node probes (thinking_node over DDS, player, params files)"):
            records += _node(Path(tmp))
    table = [{k: r.get(k) for k in ("family", "probe", "crashed", "ok", "lost",
                                    "spoofed_accepted", "rss_growth_mb", "detail")}
             for r in records]
    return {"experiment": "faults", "metric": "crashes", "results": {
        **summarise(records), "probe_table": table}, "curves": {}}


def plot(result: dict, path: str | Path) -> None:
    """RSS growth per probe (bars), crashed or misbehaving probes in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["results"]["probe_table"]
    names = [r["probe"] for r in rows]
    growth = [float(r.get("rss_growth_mb") or 0.0) for r in rows]
    colours = ["tab:red" if r.get("crashed") or r.get("ok") is False else
               ("tab:blue" if r["family"] == "link" else "tab:green") for r in rows]
    fig, ax = plt.subplots(figsize=(10, max(4, 0.28 * len(rows))))
    ax.barh(names, growth, color=colours)
    ax.axvline(50, ls="--", c="grey", label="50 MB bound")
    ax.set(xlabel="RSS growth over the probe (MB)",
           title=f"{result['results']['probes']} probes: {result['results']['crashes']} "
                 f"crashes, {result['results']['lost']} lost, "
                 f"{result['results']['spoofed_accepted']} spoofed accepted\n"
                 "(red = crashed or misbehaved; blue link, green node)")
    ax.invert_yaxis()
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
