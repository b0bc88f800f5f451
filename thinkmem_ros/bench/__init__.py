"""Benchmarks behind ``thinkmem bench NAME``; each module has ``run`` and ``plot``.

``run(quick: bool, seeds: int) -> dict`` returns the DESIGN.md §4 JSON minus ``machine``
(added by the command); ``plot(result, path)`` draws the PNG a person reads next to it.
"""

BENCHMARKS: dict[str, str] = {
    "exp1": "thinkmem_ros.bench.exp1",
    "exp2": "thinkmem_ros.bench.exp2",
    "exp3": "thinkmem_ros.bench.exp3",
    "exp5": "thinkmem_ros.bench.exp5",
    "exp6": "thinkmem_ros.bench.exp6",
    "latency": "thinkmem_ros.bench.latency",
    "node": "thinkmem_ros.bench.node",
    "transport": "thinkmem_ros.bench.transport",
    "values": "thinkmem_ros.bench.values",
    "memctl": "thinkmem_ros.bench.memctl",
}
