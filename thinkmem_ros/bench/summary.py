"""Render benchmark JSON files as Markdown tables, so README figures come from a command.

    python -m thinkmem_ros.bench.summary bench_results/*.json > bench_results/RESULTS.md

Generic on purpose: every benchmark writes the JSON the README's "Benchmarks" section
describes (``results`` rows of ``{"mean", "std"}`` or plain numbers, ``curves`` keyed by x),
so one renderer serves all.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from thinkmem_ros.core.arguments import OneLineParser
from thinkmem_ros.core.input_files import input_file


def _cell(value) -> str:
    if isinstance(value, dict) and "mean" in value:
        return f"{value['mean']:.4g} ± {value.get('std', 0.0):.2g}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _flatten(prefix: str, value, out: list[tuple[str, str]], depth: int = 0) -> None:
    if isinstance(value, dict) and "mean" not in value and depth < 2:
        for key, sub in value.items():
            if isinstance(sub, (dict, int, float, str, bool)) and not isinstance(sub, list):
                _flatten(f"{prefix}.{key}" if prefix else key, sub, out, depth + 1)
    elif isinstance(value, (dict, int, float, str, bool)):
        out.append((prefix, _cell(value)))


def render(report: dict, source: str) -> str:
    """One Markdown section: header line, results table, one table per curve family."""
    machine = report.get("machine", {})
    lines = [f"### {report.get('experiment', source)}",
             f"`{source}` — quick={report.get('quick')}, seeds={report.get('seeds')}, "
             f"cpu={machine.get('cpu', '?')}, load={machine.get('load_avg_1_5_15', '?')}", "",
             "| result | value |", "|---|---|"]
    rows: list[tuple[str, str]] = []
    _flatten("", report.get("results", {}), rows)
    lines += [f"| {key} | {value} |" for key, value in rows]
    curves = report.get("curves", {})
    if curves:
        xs = sorted({x for series in curves.values() if isinstance(series, dict) for x in series},
                    key=lambda x: (float(x) if _is_number(x) else 0.0, x))
        lines += ["", "| curve | " + " | ".join(xs) + " |", "|---" * (len(xs) + 1) + "|"]
        for name, series in curves.items():
            if isinstance(series, dict):
                cells = [_cell(series[x]) if x in series else "" for x in xs]
                lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _reports(argv: list[str] | None) -> list[Path]:
    """The report paths of the command line, each a file; else one line, exit 2.

    Why a parser: every argument was taken for a report, so ``--help`` was refused as a
    missing file. Why the kind checked first: a FIFO blocked the open for ever, waiting for
    a writer, and sections already printed before a bad path came later.
    """
    parser = OneLineParser(prog="python -m thinkmem_ros.bench.summary",
                           description=__doc__.split("\n\n")[0],
                           epilog=__doc__.split("\n\n", 1)[1],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", metavar="REPORT.json",
                        help="benchmark JSON files (thinkmem bench NAME --json ...)")
    args = parser.parse_args(argv)
    try:
        return [input_file(p, "report") for p in args.reports]
    except ValueError as exc:
        parser.error(str(exc))


def main(argv: list[str] | None = None) -> int:
    """Print one section per JSON file given on the command line."""
    for path in _reports(argv):
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(report, dict):
                raise ValueError("not a JSON object")
            text = render(report, str(path))
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            print(f"summary: {path}: not a benchmark report: {' '.join(str(reason).split())}",
                  file=sys.stderr)
            return 2
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
