"""Hostile input to ``demo``, ``keys``, ``knowledge``, ``bench`` and the bundle writer.

The rule (as in test_cli_bad_input.py): one line on stderr, a non-zero exit, no traceback,
no hang, and above all no user data deleted. The demo is tested at the step level with
small inputs (a full run takes minutes); FIFO cases run in a subprocess with a timeout so
that a regression fails instead of blocking the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_checks import assert_one_line, run
from rich.console import Console

from thinkmem_ros import cli
from thinkmem_ros.core.vocabulary import SIGNALS, THINKING
from thinkmem_ros.demo import DemoConfig, DemoContext
from thinkmem_ros.demo.own_folders import MARKER
from thinkmem_ros.policy.bundle import BundleManifest, load_bundle, write_bundle

REPO = Path(__file__).resolve().parent.parent
STATE = ("keys", "consolidator", "node_state")






def _manifest(model_version: int = 3) -> BundleManifest:
    return BundleManifest(
        model_version=model_version, sha256="", labels=list(THINKING), signals=list(SIGNALS),
        window=8, frame_rate_hz=10.0,
        normalisation={"mean": [0.0] * len(SIGNALS), "std": [1.0] * len(SIGNALS)},
        thresholds={label: 0.5 for label in THINKING})


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (links followed) and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def context(out: Path) -> DemoContext:
    return DemoContext(config=DemoConfig(out_dir=out, quiet=True), console=Console(quiet=True))


@pytest.fixture
def user_out(tmp_path, capsys):
    """An --out holding what a user keeps: real key pairs and a consolidator store."""
    out = tmp_path / "dk"
    assert cli.main(["keys", "--out", str(out / "keys"), "--name", "consolidator",
                     "--robot", "robot1"]) == 0
    (out / "consolidator").mkdir()
    (out / "consolidator" / "consolidator.db").write_text("precious experiences")
    capsys.readouterr()
    return out


# ------------------------------------------------------------------ demo: a user's folders stay

def test_demo_keys_step_refuses_a_users_keys_and_store(user_out):
    from thinkmem_ros.demo.round import keys_step

    before = snapshot(user_out)
    with pytest.raises(ValueError, match=f"{user_out / 'keys'}.*not made by thinkmem demo"):
        keys_step(context(user_out))
    assert snapshot(user_out) == before


@pytest.mark.parametrize("name", ["keys", "consolidator", "node_state", "bag", "bag_after"])
def test_the_round_job_checks_every_folder_it_replaces_first(tmp_path, name):
    from thinkmem_ros.demo.round import round_steps

    (tmp_path / name).mkdir()
    (tmp_path / name / "mine.txt").write_text("keep me")
    first = round_steps()[0]
    with pytest.raises(ValueError, match=f"{tmp_path / name} .*pick another --out"):
        first.run(context(tmp_path))
    assert (tmp_path / name / "mine.txt").read_text() == "keep me"


def test_the_plain_ros_job_checks_its_bag_first(tmp_path):
    from thinkmem_ros.demo.ros import ros_steps

    (tmp_path / "bag").mkdir()
    (tmp_path / "bag" / "metadata.yaml").write_text("a user's recording")
    with pytest.raises(ValueError, match="bag was not made by thinkmem demo"):
        ros_steps()[0].run(context(tmp_path))


def test_demo_keys_step_refuses_a_symlinked_folder_and_keeps_its_target(tmp_path):
    from thinkmem_ros.demo.round import keys_step

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / MARKER).write_text("even a marked target is not followed")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "node_state").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="node_state is a symlink"):
        keys_step(context(tmp_path / "out"))
    assert (tmp_path / "elsewhere" / MARKER).exists()
    assert not (tmp_path / "out" / "keys").exists()  # nothing replaced before the refusal


def test_demo_replaces_the_folders_it_made_and_empty_ones(tmp_path):
    from thinkmem_ros.demo.round import keys_step

    out = tmp_path / "out"
    (out / "node_state").mkdir(parents=True)  # empty: nothing to lose
    keys_step(context(out))
    stale = out / "consolidator" / "store.db"
    stale.write_text("the previous run's store")
    first_key = (out / "keys" / "consolidator.sign.key").read_bytes()
    keys_step(context(out))
    assert not stale.exists()
    assert (out / "keys" / "consolidator.sign.key").read_bytes() != first_key
    assert all((out / name / MARKER).is_file() for name in STATE)


def test_an_earlier_demos_folders_are_replaced_after_an_upgrade(tmp_path):
    """Folders a demo made before the mark sit beside that demo's summary.json: ``make
    demo`` after an upgrade replaces them instead of stopping on its own output."""
    import json

    from thinkmem_ros.demo.round import keys_step

    out = tmp_path / "out"
    (out / "keys").mkdir(parents=True)
    (out / "keys" / "consolidator.sign.key").write_text("an earlier demo's key")
    (out / "summary.json").write_text(json.dumps({"mode": "round", "steps": [], "bundle": {}}))
    keys_step(context(out))
    assert (out / "keys" / MARKER).is_file()
    assert (out / "keys" / "consolidator.sign.key").read_bytes() != b"an earlier demo's key"
    (out / "summary.json").write_text("{}")  # not a demo's summary: a user's folder
    (out / "keys" / MARKER).unlink()
    with pytest.raises(ValueError, match="not made by thinkmem demo"):
        keys_step(context(out))


def test_demo_bag_replaces_only_its_own_bag(tmp_path):
    from thinkmem_ros.demo.ros import write_own_bag
    from thinkmem_ros.playback.bag_files import bag_info, write_stream
    from thinkmem_ros.world.streams import generate_stream

    stream = generate_stream("mixed", 2.0, 10.0, np.random.default_rng(0))
    users = tmp_path / "bag"
    write_stream(stream, users)  # a recording of the user's, a valid rosbag2 folder
    before = snapshot(users)
    with pytest.raises(ValueError, match="bag was not made by thinkmem demo"):
        write_own_bag(stream, users)
    assert snapshot(users) == before
    own = tmp_path / "own"
    write_own_bag(stream, own)
    info = write_own_bag(stream, own)  # the demo's own: replaced, still a readable bag
    assert (own / MARKER).is_file() and bag_info(own).message_count == info.message_count


def test_demo_command_refuses_an_out_with_a_users_keys_in_one_line(user_out, capsys,
                                                                   monkeypatch):
    """Through the CLI, running only the steps up to the keys (the rest takes minutes)."""
    import thinkmem_ros.demo as demo

    real = demo.run_steps
    monkeypatch.setattr(demo, "_ros_missing", lambda: None)
    monkeypatch.setattr(demo, "run_steps", lambda steps, ctx: real(
        [s for s in steps if s.name in ("check out", "keys")], ctx))
    before = snapshot(user_out)
    code, err = run(capsys, "demo", "--quiet", "--out", user_out)
    assert_one_line(code, err, "thinkmem demo: error:", str(user_out / "keys"),
                    "not made by thinkmem demo")
    assert snapshot(user_out) == before


# ------------------------------------------------------------------ bundle writer and symlinks

def test_write_bundle_at_a_symlink_replaces_the_link_not_its_target(tmp_path):
    write_bundle(tmp_path / "real", b"one", _manifest(model_version=1))
    before = snapshot(tmp_path / "real")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    write_bundle(tmp_path / "link", b"two", _manifest(model_version=2))
    assert snapshot(tmp_path / "real") == before and load_bundle(tmp_path / "real").version == 1
    assert not (tmp_path / "link").is_symlink() and load_bundle(tmp_path / "link").version == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]  # no .link.old


def test_replacing_a_bundle_never_deletes_through_a_symlink_inside_it(tmp_path):
    write_bundle(tmp_path / "b", b"one", _manifest(model_version=1))
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "data.txt").write_text("not the bundle's")
    (tmp_path / "b" / "artefacts").symlink_to(tmp_path / "precious")
    (tmp_path / "b" / "notes.txt").symlink_to(tmp_path / "precious" / "data.txt")
    write_bundle(tmp_path / "b", b"two", _manifest(model_version=2))
    assert (tmp_path / "precious" / "data.txt").read_text() == "not the bundle's"
    assert load_bundle(tmp_path / "b").version == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "precious"]


@pytest.mark.parametrize("target", ["loop", "missing"])
def test_write_bundle_at_a_dangling_or_looping_link_replaces_it(tmp_path, target):
    (tmp_path / "out").symlink_to(tmp_path / ("out" if target == "loop" else "missing"))
    assert write_bundle(tmp_path / "out", b"one", _manifest()).version == 3
    assert not (tmp_path / "out").is_symlink()


# ------------------------------------------------------------------ keys: contradictions, --out

@pytest.mark.parametrize("argv, names", [
    (["--no-sign", "--sign-name", "foo"], ["--no-sign", "--sign-name foo"]),
    (["--name", "a", "--name", "a"], ["--name a", "more than once"]),
    (["--robot", "r1", "--robot", "r1"], ["--robot r1", "more than once"]),
    (["--name", "r1", "--robot", "r1"], ["r1", "--name and --robot"]),
], ids=["no-sign-sign-name", "name-twice", "robot-twice", "name-and-robot"])
def test_keys_refuses_contradictory_or_duplicate_options(tmp_path, capsys, argv, names):
    code, err = run(capsys, "keys", "--out", tmp_path / "k", *argv)
    assert_one_line(code, err, "thinkmem keys:", *names)
    assert not (tmp_path / "k").exists()


@pytest.mark.parametrize("argv, names", [
    (["--no-sign"], ["--no-sign", "--rotate"]),
    (["--sign-name", "x"], ["--sign-name", "--revoke"]),
], ids=["rotate-no-sign", "revoke-sign-name"])
def test_keys_rotation_refuses_options_it_would_ignore(tmp_path, capsys, argv, names):
    assert cli.main(["keys", "--out", str(tmp_path / "k"), "--name", "c"]) == 0
    capsys.readouterr()
    step = (["--rotate", tmp_path / "k" / "c.sign.key"] if argv[0] == "--no-sign" else
            ["--revoke", tmp_path / "k" / "c.sign.pub", "--signing-key",
             tmp_path / "k" / "c.sign.key"])
    code, err = run(capsys, "keys", "--out", tmp_path / "k2", *step, *argv)
    assert_one_line(code, err, "thinkmem keys:", *names)
    assert not (tmp_path / "k2").exists()


def test_keys_out_that_is_a_file_says_so(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    code, err = run(capsys, "keys", "--out", tmp_path / "afile")
    assert_one_line(code, err, "thinkmem keys:", f"--out {tmp_path / 'afile'}", "not a folder")
    assert "Errno" not in err


# ------------------------------------------------------------------ FIFOs: refused, never a hang

def _fifo_argv(tmp_path: Path, where: str) -> list[str]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    if where == "knowledge --db":
        return ["knowledge", "list", "--db", str(fifo)]
    assert cli.main(["keys", "--out", str(tmp_path / "k"), "--name", "c"]) == 0
    key = str(tmp_path / "k" / "c.sign.key")
    if where == "keys --rotate":
        return ["keys", "--out", str(tmp_path / "k9"), "--rotate", str(fifo)]
    return ["keys", "--out", str(tmp_path / "k9"), "--rotate", key, "--chain", str(fifo)]


@pytest.mark.parametrize("where", ["knowledge --db", "keys --rotate", "keys --chain"])
def test_a_fifo_input_is_refused_at_once(tmp_path, capsys, where):
    argv = _fifo_argv(tmp_path, where)
    capsys.readouterr()
    try:
        done = subprocess.run([sys.executable, "-m", "thinkmem_ros.cli", *argv], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"thinkmem {where} FIFO: still blocked after 60 s")
    assert_one_line(done.returncode, done.stderr, where.split()[1], "is a FIFO")


# ------------------------------------------------------------------ bench --plot format

def test_bench_refuses_a_plot_format_matplotlib_cannot_save_before_running(tmp_path, capsys,
                                                                          monkeypatch):
    def never(name):
        raise AssertionError(f"benchmark {name} started before --plot was checked")

    monkeypatch.setattr("thinkmem_ros.commands.bench.load", never)
    code, err = run(capsys, "bench", "latency", "--quick", "--seeds", "1", "--json",
                    tmp_path / "lat.json", "--plot", tmp_path / "lat.txt")
    assert_one_line(code, err, f"--plot {tmp_path / 'lat.txt'}", "'.txt'", ".png")


@pytest.mark.parametrize("name", ["x.png", "x.SVG", "x.pdf", "x"])
def test_plot_formats_matplotlib_saves_pass_the_check(tmp_path, name):
    from thinkmem_ros.commands import check_plot

    assert check_plot(tmp_path / name, "--plot") == tmp_path / name


# ------------------------------------------------------------------ a FIFO as an output

def test_a_fifo_nobody_reads_is_refused_as_an_output_before_running(tmp_path, capsys,
                                                                    monkeypatch):
    """The report used to be written after the whole run, into a FIFO that blocked it."""
    def never(name):
        raise AssertionError(f"benchmark {name} started before --json was checked")

    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    monkeypatch.setattr("thinkmem_ros.commands.bench.load", never)
    code, err = run(capsys, "bench", "latency", "--quick", "--json", fifo)
    assert_one_line(code, err, f"--json {fifo}", "is a FIFO nobody reads")


def test_a_fifo_with_a_reader_is_a_fine_output(tmp_path):
    """``--json >(jq .)`` hands the command a pipe that someone reads."""
    from thinkmem_ros.commands import check_output

    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert check_output(fifo, "--json") == fifo
    finally:
        os.close(reader)


# ------------------------------------------------------------------ demo: a user's files stay

@pytest.mark.parametrize("name", ["summary.json", "node.log", "timeline.png"])
def test_the_demo_refuses_to_write_over_a_users_file_in_out(tmp_path, name):
    from thinkmem_ros.demo.round import round_steps

    (tmp_path / name).write_text("a user's file")
    with pytest.raises(ValueError, match=f"{tmp_path / name} was not written by thinkmem "
                                         "demo.*pick another --out"):
        round_steps()[0].run(context(tmp_path))
    assert (tmp_path / name).read_text() == "a user's file"
    assert not (tmp_path / MARKER).exists()


def test_the_demo_writes_over_its_own_files_and_an_earlier_demos(tmp_path):
    """The first step marks --out; a run from before the mark is known by its summary."""
    import json

    from thinkmem_ros.demo.ros import ros_steps

    first = ros_steps()[0]
    first.run(context(tmp_path / "a"))  # an empty --out: marked
    (tmp_path / "a" / "node.log").write_text("the previous run's log")
    first.run(context(tmp_path / "a"))
    old = tmp_path / "b"
    old.mkdir()
    (old / "summary.json").write_text(json.dumps({"mode": "ros", "steps": [], "bundle": {}}))
    (old / "node.log").write_text("an earlier demo's log")
    first.run(context(old))
    assert (old / MARKER).is_file()
