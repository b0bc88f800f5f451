"""Benchmarks behind ``thinkmem bench NAME``; each module has ``run`` and ``plot``.

``run(quick: bool, seeds: int) -> dict`` returns the README's benchmark JSON (Benchmarks)
minus ``machine`` (added by the command); ``plot(result, path)`` draws the PNG a person
reads next to it.
"""

BENCHMARKS: tuple[str, ...] = (
    "exp1", "exp2", "exp3", "exp5", "exp6", "latency",
    "node", "transport", "values", "memctl", "rounds", "faults", "real", "fleet",
)

MAX_SEEDS = 1000
"""More seeds than any benchmark here needs (30 already takes hours for some)."""


def load(name: str):
    """Import one benchmark's module; static imports, so the import contracts see every edge."""
    match name:
        case "exp1":
            from thinkmem_ros.bench import exp1 as module
        case "exp2":
            from thinkmem_ros.bench import exp2 as module
        case "exp3":
            from thinkmem_ros.bench import exp3 as module
        case "exp5":
            from thinkmem_ros.bench import exp5 as module
        case "exp6":
            from thinkmem_ros.bench import exp6 as module
        case "latency":
            from thinkmem_ros.bench import latency as module
        case "node":
            from thinkmem_ros.bench import node as module
        case "transport":
            from thinkmem_ros.bench import transport as module
        case "values":
            from thinkmem_ros.bench import values as module
        case "memctl":
            from thinkmem_ros.bench import memctl as module
        case "rounds":
            from thinkmem_ros.bench import rounds as module
        case "faults":
            from thinkmem_ros.bench import faults as module
        case "real":
            from thinkmem_ros.bench import real as module
        case "fleet":
            from thinkmem_ros.bench import fleet as module
        case _:
            raise KeyError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    return module
