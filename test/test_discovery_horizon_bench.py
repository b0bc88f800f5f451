"""The horizon measurement builds real stores and runs a round's discovery both ways, each
in its own process (``python -m thinkmem_ros.bench.discovery_horizon``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from thinkmem_ros.bench.discovery_horizon import RULE, build_store
from thinkmem_ros.consolidator.store import ExperienceStore


def test_the_store_holds_the_events_asked_for_and_the_rule_among_the_newest(tmp_path):
    build_store(tmp_path / "c.db", 4000, horizon=2000)
    with ExperienceStore(tmp_path / "c.db") as store:
        store.fold_histories()
        rows, horizon = store.histories_within(0)
    assert horizon.events == 4000 and horizon.episodes == 200
    with_rule = [r for r in rows if all(name in r[3].split("\n") for name in RULE)]
    assert len(with_rule) == 16 and min(float(r[2]) for r in with_rule) >= 200 - 50


def test_the_report_reads_the_horizon_flat_and_the_whole_store_growing(tmp_path):
    out = tmp_path / "h.json"
    done = subprocess.run([sys.executable, "-m", "thinkmem_ros.bench.discovery_horizon",
                           "--sizes", "3000,6000", "--horizon", "2000", "--json", str(out),
                           "--plot", str(tmp_path / "h.png")], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())["results"]["rows"]
    assert [r["horizon"]["events_read"] for r in rows] == [2000, 2000]
    assert [r["whole"]["events_read"] for r in rows] == [3000, 6000]
    assert all(r[way]["peak_rss_gb"] > 0 for r in rows for way in ("horizon", "whole"))
    assert (tmp_path / "h.png").stat().st_size > 0


def test_bad_options_are_one_line():
    done = subprocess.run([sys.executable, "-m", "thinkmem_ros.bench.discovery_horizon",
                           "--sizes", "3000,x"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def _refused(monkeypatch, capsys, argv: list[str]) -> str:
    """The one line ``main(argv)`` exits 2 with, the run (patched to fail) never started."""
    from thinkmem_ros.bench import discovery_horizon

    def no_run(*_args, **_kwargs):
        raise AssertionError("the run started before the outputs were checked")

    monkeypatch.setattr(discovery_horizon, "run", no_run)
    with pytest.raises(SystemExit) as exited:
        discovery_horizon.main(["--sizes", "1000", "--horizon", "1024", *argv])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and len(err.strip().splitlines()) == 1, err
    return err


def test_a_users_file_at_json_or_plot_is_refused_before_the_run(tmp_path, monkeypatch,
                                                                   capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("my notes\n")
    assert "refusing to overwrite" in _refused(monkeypatch, capsys, ["--json", str(victim)])
    fake = tmp_path / "old.png"
    fake.write_text("not an image\n")
    assert "refusing to overwrite" in _refused(monkeypatch, capsys, ["--plot", str(fake)])
    assert victim.read_text() == "my notes\n" and fake.read_text() == "not an image\n"


def test_a_folder_or_a_format_not_png_is_refused_before_the_run(tmp_path, monkeypatch,
                                                                  capsys):
    assert "is a folder" in _refused(monkeypatch, capsys, ["--json", str(tmp_path)])
    assert ".png" in _refused(monkeypatch, capsys, ["--plot", str(tmp_path / "victim.yaml")])
    assert not (tmp_path / "victim.yaml").exists()


def test_an_earlier_report_is_replaced(tmp_path, monkeypatch):
    from thinkmem_ros.bench import discovery_horizon

    out = tmp_path / "h.json"
    out.write_text(json.dumps({"experiment": "discovery_horizon", "results": {}}))
    monkeypatch.setattr(discovery_horizon, "run", lambda *a: {"rows": []})
    assert discovery_horizon.main(["--sizes", "1000", "--horizon", "1024",
                                   "--json", str(out)]) == 0
    assert json.loads(out.read_text())["results"] == {"rows": []}
