"""The README's result tables are rendered from benchmark JSON by a command."""

import json
import os
import threading

import pytest

from thinkmem_ros.bench.summary import main, render


def test_render_results_and_curves(tmp_path, capsys):
    report = {"experiment": "exp5", "quick": True, "seeds": 2,
              "results": {"proposed": {"mean": 0.98, "std": 0.01}, "speedup": 21.5},
              "curves": {"proposed": {"250": {"mean": 0.96, "std": 0.02},
                                      "100": {"mean": 0.8, "std": 0.1}}},
              "machine": {"cpu": "x", "load_avg_1_5_15": [1.0, 1.0, 1.0]}}
    text = render(report, "r.json")
    assert "| proposed | 0.98 ± 0.01 |" in text
    assert "| speedup | 21.5 |" in text
    assert "| curve | 100 | 250 |" in text  # x sorted numerically
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    assert main([str(path)]) == 0
    assert "### exp5" in capsys.readouterr().out


def _exit(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    out, err = capsys.readouterr()
    return exited.value.code, out, err


def test_help_prints_the_usage_and_where_the_format_is_described(capsys):
    code, out, _ = _exit(["--help"], capsys)
    assert code == 0 and out.startswith("usage:") and "REPORT.json" in out
    assert "README" in out and "DESIGN.md" not in out


def test_no_report_is_one_line_exit_2(capsys):
    code, out, err = _exit([], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1


def test_a_fifo_is_refused_before_it_is_opened(tmp_path, capsys):
    """Opening the FIFO would block for a writer; a watchdog opens one so a failure ends."""
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"experiment": "x"}))
    watchdog = threading.Timer(5.0, lambda: open(fifo, "w").close())
    watchdog.start()
    try:
        code, out, err = _exit([str(good), str(fifo)], capsys)
    finally:
        watchdog.cancel()
    assert code == 2 and "FIFO" in err and len(err.strip().splitlines()) == 1
    assert out == ""  # refused before any report was rendered
