"""Options that conflict, or that a command would silently ignore, are refused in one line.

Each case returns in well under a few seconds: the refusal comes before any work starts.
"""

from __future__ import annotations

import functools
import importlib

import pytest
from cli_checks import assert_one_line, run

# ------------------------------------------------------------------ bench


@pytest.mark.parametrize("argv, says", [
    (["exp2", "--bundle", "models/default"], "exp2 does not take --bundle"),
    (["latency", "--preset", "streaming"], "latency does not take --preset"),
], ids=["exp2-bundle", "latency-preset"])
def test_bench_option_the_benchmark_does_not_take_is_an_error_line(capsys, monkeypatch,
                                                                     argv, says):
    """The line read ``thinkmem bench exp2 does not take --bundle``, without ``error:``."""
    module = importlib.import_module(f"thinkmem_ros.bench.{argv[0]}")

    @functools.wraps(module.run)  # its signature, which decides what it takes, is kept
    def never(**_):
        raise AssertionError("the benchmark started")

    monkeypatch.setattr(module, "run", never)
    code, err = run(capsys, "bench", *argv)
    assert_one_line(code, err, says)
    assert err.startswith("thinkmem bench: error: "), err


# ------------------------------------------------------------------ knowledge


@pytest.mark.parametrize("make", [None, "folder", "not-a-database"])
def test_knowledge_list_names_a_path_with_a_newline_on_one_line(tmp_path, capsys, make):
    """The path was printed as given, so a newline in it split the error over two lines."""
    db = tmp_path / "a\nb.db"
    if make == "folder":
        db.mkdir()
    elif make == "not-a-database":
        db.write_bytes(b"not sqlite at all, " * 10)
    code, err = run(capsys, "knowledge", "list", "--db", db)
    assert_one_line(code, err, "thinkmem knowledge: error:", "a b.db")
    assert code == 2, err


# ------------------------------------------------------------------ consolidator canary


@pytest.fixture
def consolidator_start(tmp_path, capsys, monkeypatch):
    """Run ``thinkmem consolidator`` (serving) with canary options, stopped where it would
    make its service: a refusal comes before, options that agree reach it."""
    class Started(Exception):
        pass

    def started(*_, **__):
        raise Started("the consolidator started")

    monkeypatch.setattr("thinkmem_ros.consolidator.service.ConsolidatorService", started)

    def start(*canary):
        return run(capsys, "consolidator", "--db", tmp_path / "s.db", "--signing-key",
                   tmp_path / "none.sign.key", "--publish-dir", tmp_path / "pub", *canary)
    return start


@pytest.mark.parametrize("canary, says", [
    (["--canary-fraction", "0.5", "--canary-robots", "a"],
     "--canary-fraction and --canary-robots both choose the canaries"),
    (["--canary-fraction", "0.5", "--canary-robots", "a,b,c"],
     "--canary-fraction and --canary-robots both choose the canaries"),
    (["--canary-robots", "a"],
     "list at least 2 robots or lower --canary-min-robots"),
    (["--canary-robots", "a,b", "--canary-min-robots", "3"],
     "list at least 3 robots or lower --canary-min-robots"),
], ids=["fraction-and-robots", "fraction-and-enough-robots", "one-robot", "two-of-three"])
def test_consolidator_refuses_canary_options_that_cannot_work_at_start(consolidator_start,
                                                                      canary, says):
    """The fraction was silently ignored beside a list, and a list shorter than
    --canary-min-robots only warned at the push, then held every canary after its wait."""
    code, err = consolidator_start(*canary)
    assert_one_line(code, err, "thinkmem consolidator: error:", says)
    assert code == 2, err


@pytest.mark.parametrize("canary", [
    ["--canary-robots", "a,b"], ["--canary-fraction", "0", "--canary-robots", "a,b"],
    ["--canary-robots", "a", "--canary-min-robots", "1"], ["--canary-fraction", "0.5"]],
    ids=["two-robots", "fraction-zero", "min-robots-one", "fraction-alone"])
def test_consolidator_canary_options_that_agree_still_start(consolidator_start, canary):
    code, err = consolidator_start(*canary)
    assert "the consolidator started" in err, err


# ------------------------------------------------------------------ demo


@pytest.fixture
def demo_start(tmp_path, capsys, monkeypatch):
    """Run ``thinkmem demo`` stopped where the demo would start: what reaches it is kept."""
    reached = []

    def run_demo(config):
        reached.append(config)
        raise RuntimeError("the demo started")

    monkeypatch.setattr("thinkmem_ros.demo.run_demo", run_demo)

    def start(*argv):
        code, err = run(capsys, "demo", "--out", tmp_path / "out", *argv)
        return code, err, reached
    return start


@pytest.mark.parametrize("trigger", ["samples", "timer"])
def test_demo_offline_refuses_an_explicit_trigger(demo_start, trigger):
    """--offline runs no ROS node, so its frame_trigger was silently ignored."""
    code, err, reached = demo_start("--offline", "--trigger", trigger)
    assert_one_line(code, err, "thinkmem demo: error:", "--trigger", "--offline")
    assert code == 2 and not reached, err


@pytest.mark.parametrize("argv, trigger", [
    (["--offline"], "timer"), (["--trigger", "samples"], "samples"), ([], "timer")],
    ids=["offline", "ros-samples", "ros-default"])
def test_demo_trigger_still_reaches_the_node(demo_start, argv, trigger):
    code, err, reached = demo_start(*argv)
    assert "the demo started" in err and len(reached) == 1, err
    assert reached[0].frame_trigger == trigger


# ------------------------------------------------------------------ train --streams

TRAIN_QUICK = ["--epochs", "1", "--test-duration", "0", "--no-progress"]


@pytest.mark.parametrize("argv", [
    ["--streams", "1", "--duration", "60"],
    ["--streams", "1", "--duration", "130", "--group-seconds", "200"]],
    ids=["one-minute", "one-chunk"])
def test_train_refuses_one_validation_group_before_building_data(tmp_path, capsys, argv):
    """It built the data, then failed with the trainer's hint 'Give SituationSet.groups or
    pass val_fraction=0', which names no option of the command."""
    code, err = run(capsys, "train", *argv, *TRAIN_QUICK, "--out", tmp_path / "b")
    assert_one_line(code, err, "thinkmem train: error:", "--streams >= 2", "--group-seconds")
    assert "training on" not in err and "SituationSet" not in err, err
    assert not (tmp_path / "b").exists()


def _train_args(*argv):
    from thinkmem_ros import cli
    from thinkmem_ros.commands.train import resolve_defaults

    args = cli.build_parser("train").parse_args(["train", *argv, "--out", "unused"])
    resolve_defaults(args)
    return args


@pytest.mark.parametrize("duration, window, stride, group_seconds, one_group", [
    (60, 32, 3, 60, True), (61, 32, 3, 60, False), (64, 64, 3, 6, False),
    (9, 32, 1, 6, False), (3.2, 32, 1, 3, True), (12, 8, 70, 6, False),
    (12, 8, 200, 6, True), (130, 64, 3, 60, False)])
def test_train_refuses_exactly_the_streams_the_recipe_gives_one_group(
        duration, window, stride, group_seconds, one_group):
    """The check before building agrees with the groups StreamRecipe.windows makes."""
    import numpy as np

    from thinkmem_ros.commands.train import check_validation_groups
    from thinkmem_ros.world.recipe import StreamRecipe

    args = _train_args("--streams", "1", "--duration", str(duration), "--window", str(window),
                       "--stride", str(stride), "--group-seconds", str(group_seconds))
    groups = len(np.unique(StreamRecipe.from_args(args).windows().groups))
    try:
        check_validation_groups(args)
        refused = False
    except SystemExit:
        refused = True
    assert (groups < 2) == one_group, groups  # the case is what it says
    assert refused == one_group
