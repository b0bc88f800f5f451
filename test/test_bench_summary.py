"""The README's result tables are rendered from benchmark JSON by a command."""

import json

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
    assert main([]) == 2
