"""Outputs never destroy what is already there: reports, plots, bags and the demo's files.

Each case is a real command or the real function the command calls; the victims are real
files (a SQLite store, a recording, a folder of configs). Found by an audit of every verb
with hostile paths: ``--json`` onto a store replaced it with a report, ``bag convert
--overwrite`` deleted the old bag before finding the new one would fail, a YAML alias
bomb in a params file ran until killed.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from thinkmem_ros.commands import check_output, check_plot, json_report
from thinkmem_ros.core.label_rules import RulesError, load_rules
from thinkmem_ros.core.yaml_numbers import MAX_EXPANDED_VALUES, load_numbers_yaml
from thinkmem_ros.demo.steps import DemoConfig
from thinkmem_ros.playback.bag_files import BagError, write_stream
from thinkmem_ros.playback.recording import load_signal_map
from thinkmem_ros.world.streams import generate_stream

REPO = Path(__file__).resolve().parents[1]


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The command from this tree, wherever it runs (``cwd`` elsewhere too)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "thinkmem_ros.cli", *args],
                          capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


def _store(path: Path) -> bytes:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE experiences (id INTEGER)")
        conn.execute("INSERT INTO experiences VALUES (1)")
    return path.read_bytes()


def _one_line_refusal(out: subprocess.CompletedProcess, says: str) -> None:
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], out.stderr
    assert "Traceback" not in out.stderr


def test_a_json_report_never_replaces_a_store(tmp_path):
    store = tmp_path / "fleet.db"
    before = _store(store)
    out = _cli("bench", "latency", "--quick", "--seeds", "1", "--json", str(store))
    _one_line_refusal(out, "is not a JSON report")
    out = _cli("calibrate", str(tmp_path / "no.bag"), "--params", str(tmp_path / "p.yaml"),
               "--json", str(store))
    _one_line_refusal(out, "is not a JSON report")
    assert store.read_bytes() == before


@pytest.mark.parametrize("argv", [
    ("bench", "latency", "--quick", "--json", "/proc/nowhere/x.json"),
    ("train", "--out", "/proc/nowhere"),
    ("demo", "--offline", "--out", "/proc/nowhere")], ids=lambda a: a[0])
def test_a_shared_output_check_names_the_command_that_refused(argv):
    """The check knows only the option: its line used to start '--json /proc/...'."""
    out = _cli(*argv)
    _one_line_refusal(out, f"{argv[-2]} /proc/nowhere")
    assert out.stderr.startswith(f"thinkmem {argv[0]}: error: {argv[-2]} /proc/nowhere"), \
        out.stderr


def test_an_output_on_a_device_that_cannot_take_it_is_refused_before_the_run():
    """--json /dev/full failed (no space left) only after the whole run; a disk would have
    had a report written over its first bytes. /dev/null still discards it."""
    with pytest.raises(SystemExit, match="every write fails") as refused:
        check_output("/dev/full", "--json", replaces=json_report("experiment"))
    assert str(refused.value.code).startswith("--json /dev/full: ")
    assert check_output("/dev/null", "--json", replaces=json_report("experiment"))
    disks = [p for p in Path("/dev").glob("loop[0-9]*") if p.is_block_device()]
    if disks:  # only stat()ed, never opened; some containers have no loop device
        with pytest.raises(SystemExit, match="is a block device"):
            check_output(disks[0], "--json", replaces=json_report("experiment"))


def test_an_earlier_report_of_the_same_kind_is_replaced(tmp_path):
    bench = tmp_path / "lat.json"
    bench.write_text(json.dumps({"experiment": "latency", "results": {}}))
    assert check_output(bench, "--json", replaces=json_report("experiment")) == bench
    other = tmp_path / "config.json"  # JSON, but someone else's
    other.write_text(json.dumps({"robots": 3}))
    with pytest.raises(SystemExit, match="is not a JSON report"):
        check_output(other, "--json", replaces=json_report("experiment"))
    link = tmp_path / "link.json"  # through a link the target is what is judged
    link.symlink_to(other)
    with pytest.raises(SystemExit, match="is not a JSON report"):
        check_output(link, "--json", replaces=json_report("experiment"))
    (tmp_path / "empty.json").write_text("")
    assert check_output(tmp_path / "empty.json", "--json", replaces=json_report("x"))


def test_a_plot_never_replaces_a_file_that_is_not_an_image(tmp_path):
    store = tmp_path / "plot.png"
    before = _store(store)
    with pytest.raises(SystemExit, match="is not an image"):
        check_plot(store, "--plot")
    assert store.read_bytes() == before
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name in ("old.png", "old.pdf", "old.svg"):
        plt.figure().savefig(tmp_path / name)
        assert check_plot(tmp_path / name, "--plot") == tmp_path / name
    plt.close("all")
    # without a suffix matplotlib writes plot + ".png": the file named plot is not touched
    _store(tmp_path / "fleet")
    assert check_plot(tmp_path / "fleet", "--plot") == tmp_path / "fleet"


def test_the_offline_demo_keeps_a_users_files_in_out(tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    (out / "summary.json").write_text('{"mine": true}')
    store = out / "timeline.png"
    before = _store(store)
    res = _cli("demo", "--offline", "--quiet", "--duration", "5", "--out", str(out))
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "move it away or pick another --out" in res.stderr
    assert (out / "summary.json").read_text() == '{"mine": true}'
    assert store.read_bytes() == before


def test_demo_options_of_the_round_are_refused_where_no_round_runs(tmp_path):
    res = _cli("demo", "--offline", "--missions", "5", "--epochs", "3", "--out",
               str(tmp_path / "o"))
    assert res.returncode == 2
    _one_line_refusal(res, "--missions, --epochs shape the consolidation round")
    res = _cli("demo", "--no-consolidation", "--lr", "0.1", "--out", str(tmp_path / "o"))
    _one_line_refusal(res, "--lr shape the consolidation round")


def test_more_missions_than_the_stream_holds_is_refused_before_any_is_made():
    with pytest.raises(ValueError, match="shorter than 2 s each"):
        DemoConfig(out_dir=Path("x"), missions=10**22)
    with pytest.raises(ValueError, match="after_missions"):
        DemoConfig(out_dir=Path("x"), after_missions=49, after_duration_s=96.0)
    DemoConfig(out_dir=Path("x"), after_missions=48, after_duration_s=96.0)
    DemoConfig(out_dir=Path("x"), duration_s=5.0, offline=True)  # no round: no missions


BOMB = "\n".join(["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"] + [
    f"{k}: &{k} [{', '.join(['*' + p] * 9)}]" for p, k in zip("abcdefgh", "bcdefghi")])


def test_a_yaml_alias_bomb_is_refused_in_linear_time(tmp_path):
    with pytest.raises(yaml.YAMLError, match=f"more than {MAX_EXPANDED_VALUES} values"):
        load_numbers_yaml(BOMB)
    params = tmp_path / "p.yaml"
    params.write_text(BOMB + "\n/**:\n  ros__parameters:\n    frame_rate_hz: 10.0\n"
                      "    signals:\n      speed: {topic: *i}\n")
    with pytest.raises(ValueError, match="aliases"):
        load_signal_map(params)
    rules = tmp_path / "r.yaml"
    rules.write_text(BOMB + "\nlabels:\n  x: {signal: *i, above: 1}\n")
    with pytest.raises(RulesError, match="aliases"):
        load_rules(rules)
    # a merge key (what aliases are for in a rules file) still reads
    assert load_numbers_yaml("d: &d {above: 1}\nx: {<<: *d, signal: s}\n")["x"] == {
        "above": 1, "signal": "s"}


def _bag(path: Path, seconds: float = 4.0, **kw):
    stream = generate_stream("mixed", seconds, 10.0, np.random.default_rng(0))
    return write_stream(stream, path, **kw)


def test_a_bag_is_replaced_only_once_the_new_one_is_written(tmp_path, monkeypatch):
    old = _bag(tmp_path / "run")
    files = sorted(p.name for p in old.path.iterdir())
    count = old.message_count

    def fail(*args, **kwargs):  # the write dies half-way (a Ctrl-C, a full disk)
        raise KeyboardInterrupt

    from thinkmem_ros.playback import bag_files

    monkeypatch.setattr(bag_files, "_write_frames", fail)  # a fault injected: see docstring
    with pytest.raises(KeyboardInterrupt):
        _bag(tmp_path / "run", seconds=8.0, overwrite=True)
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == files
    assert bag_files.bag_info(tmp_path / "run").message_count == count
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # no partial folder left
    again = _bag(tmp_path / "run", seconds=8.0, overwrite=True)
    assert again.message_count > count


def test_overwrite_refuses_a_folder_of_configs_and_the_folder_it_runs_in(tmp_path):
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "robot.yaml").write_text("a: 1\n")
    with pytest.raises(BagError, match="not a rosbag2 folder"):
        _bag(configs, overwrite=True)
    assert (configs / "robot.yaml").read_text() == "a: 1\n"
    bag = _bag(tmp_path / "b").path
    res = _cli("bag", "write", "--scenario", "mixed", "--duration", "2", "--out", ".",
               "--overwrite", cwd=bag)
    _one_line_refusal(res, "must name a bag folder of its own")
    assert (bag / "metadata.yaml").exists()


def test_train_refuses_the_current_folder_as_out_before_training(tmp_path):
    for out in (".", ""):
        res = _cli("train", "--duration", "30", "--streams", "1", "--epochs", "1",
                   "--out", out, cwd=tmp_path)
        _one_line_refusal(res, "name the bundle's folder")
    assert list(tmp_path.iterdir()) == []  # no staging folder left behind


def test_the_results_summary_refuses_what_is_no_report(tmp_path):
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "bin.json").write_bytes(bytes(range(256)))
    for path, says in ((tmp_path / "missing.json", "not a benchmark report"),
                       (tmp_path, "is a folder, not a file"),  # refused before it is opened
                       (tmp_path / "list.json", "not a benchmark report"),
                       (tmp_path / "bin.json", "not a benchmark report")):
        res = subprocess.run([sys.executable, "-m", "thinkmem_ros.bench.summary", str(path)],
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
        assert res.returncode == 2 and res.stdout == ""
        _one_line_refusal(res, says)



@pytest.mark.parametrize("option", ["--streams", "--window", "--stride", "--max-events",
                                    "--group-seconds", "--epochs", "--seed"])
def test_train_refuses_numbers_past_any_run_before_building_data(tmp_path, option):
    res = _cli("train", option, str(10**23), "--out", str(tmp_path / "b"))
    _one_line_refusal(res, option)
    assert not (tmp_path / "b").exists()


def test_consolidator_counts_and_an_empty_rehearsal_file_are_refused_in_one_line(tmp_path):
    from thinkmem_ros.consolidator.rehearsal import RehearsalError, load_npz
    from thinkmem_ros.consolidator.trigger import TriggerConfig

    with pytest.raises(ValueError, match="buffer_limit must be in"):
        TriggerConfig(buffer_limit=10**23, buffer_capacity=10**23)
    (tmp_path / "empty.npz").write_bytes(b"")
    with pytest.raises(RehearsalError, match="not a rehearsal npz"):
        load_npz(tmp_path / "empty.npz")


def test_options_that_would_be_ignored_or_make_hidden_files_are_refused(tmp_path):
    res = _cli("consolidator", "--db", str(tmp_path / "c.db"), "--train-workers", "4")
    _one_line_refusal(res, "--train-workers applies only with --engine ray")
    for option in ("--name", "--robot"):
        res = _cli("keys", "--out", str(tmp_path / "k"), option, ".hidden")
        _one_line_refusal(res, "not starting with '.'")
    assert not (tmp_path / "k").exists() or not any((tmp_path / "k").iterdir())
    res = _cli("bench", "latency", "--seeds", str(10**23))
    _one_line_refusal(res, "--seeds must be in [1, 1000]")


def test_output_cut_short_by_its_reader_exits_quietly(tmp_path):
    """``thinkmem bag info BAG | head`` ended with "error: Broken pipe" and exit 1; other
    tools stop quietly when the pipe closes (status 141, as if SIGPIPE ended them)."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_KILTED)
    data = bytes(store.serialize_cdr(store.types["std_msgs/msg/Float32"](data=1.0),
                                     "std_msgs/msg/Float32"))
    with Writer(tmp_path / "many", version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        for k in range(600):  # ~200 bytes a line: more than a pipe's 64 KiB buffer holds
            conn = writer.add_connection(f"/robot/sensor_group_{k:04d}/{'long_name' * 16}",
                                         "std_msgs/msg/Float32", typestore=store)
            writer.write(conn, 1_700_000_000 * 10**9 + k, data)
    info = subprocess.Popen([sys.executable, "-m", "thinkmem_ros.cli", "bag", "info",
                             str(tmp_path / "many")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert info.stdout.readline().startswith(b"bag:")
    info.stdout.close()  # as head does after its lines
    err = info.stderr.read().decode()
    assert info.wait(timeout=120) == 141 and err == "", err
