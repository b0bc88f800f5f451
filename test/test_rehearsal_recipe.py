"""Which recorded ``thinkmem train`` commands a round rebuilds rehearsal material from.

Only a world training command has a recipe. A bundle trained on a robot's own recordings
(``thinkmem train --bag``) read back as the synthetic world's default recipe (8 streams,
K = 32), so every round on it rehearsed world data it was never trained on: it failed on
the signal names, and would have trained on that data silently had they matched.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_real_recording import BAG, PARAMS, RULES

from thinkmem_ros.consolidator.rehearsal import (
    RehearsalConfig,
    RehearsalError,
    load_rehearsal,
    recipe,
)
from thinkmem_ros.policy.bundle import load_bundle
from thinkmem_ros.world.recipe import StreamRecipe


@pytest.fixture(scope="module")
def husky_bundle(tmp_path_factory) -> Path:
    """A bundle trained by ``thinkmem train --bag`` on the Husky recording (short run)."""
    torch = pytest.importorskip("torch")
    from thinkmem_ros import cli

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("husky") / "bundle"
    argv = ["train", "--bag", str(BAG), "--params", str(PARAMS), "--labels", str(RULES),
            "--window", "32", "--augment", "0", "--epochs", "1", "--min-steps", "0",
            "--batch-size", "64", "--out", str(out), "--no-progress"]
    with pytest.MonkeyPatch.context() as patch:  # the command line it records, as typed
        patch.setattr("sys.argv", ["thinkmem", *argv])
        code = cli.main(argv)
    assert code == 0
    return out


def with_command(bundle: Path, folder: Path, command: str | None) -> Path:
    """A copy of ``bundle`` whose recorded command is ``command`` (None: no command)."""
    shutil.copytree(bundle, folder)
    manifest = json.loads((folder / "bundle.json").read_text())
    if command is None:
        del manifest["extras"]["command"]
    else:
        manifest["extras"]["command"] = command
    (folder / "bundle.json").write_text(json.dumps(manifest))
    return folder


def test_a_bag_trained_bundle_rehearses_no_world_material(husky_bundle, tmp_path):
    bundle = load_bundle(husky_bundle)
    command = bundle.manifest.extras["command"]
    assert command.startswith("thinkmem train --bag ") and "--window 32" in command
    assert StreamRecipe.from_command(command) is None
    assert recipe(bundle) is None
    got = load_rehearsal(bundle, tmp_path / "pub", RehearsalConfig())
    # exactly what a bundle that records no command gets: the round's new material alone
    bare = load_bundle(with_command(husky_bundle, tmp_path / "bare", None))
    expected = load_rehearsal(bare, tmp_path / "pub", RehearsalConfig())
    assert (got.data, got.source, got.detail) == (None, "none",
                                                   "no saved material and no recipe")
    assert (got.data, got.source, got.detail) == (expected.data, expected.source,
                                                  expected.detail)


@pytest.mark.parametrize("options", [
    "--bag a.bag --params p.yaml --labels rules.yaml --out o",  # as train_bags records it
    "--out o --bag a.bag",  # the bag last: the world options before it are no recipe
    "--duration 120 --labels feedback",
    "--duration 120 --frobnicate 3",  # an option no world training command has
    "--duration 120 extra",  # a stray argument
    "--duration 120 --bag=a.bag",
])
def test_a_command_that_is_not_world_training_has_no_recipe(options):
    assert StreamRecipe.from_command(f"thinkmem train {options}") is None


def test_every_world_training_option_still_reads_back_as_the_recipe():
    """Each option of ``thinkmem train`` outside its own-recordings group is part of a
    world recipe's command: one missing here would stop rounds rehearsing silently."""
    from thinkmem_ros.commands import train

    parser = argparse.ArgumentParser(add_help=False)
    train.add_arguments(parser)
    own = next(g for g in parser._action_groups if g.title.startswith("training on your own"))
    world_options = [a for a in parser._actions
                     if a.option_strings and a not in own._group_actions]
    assert len(world_options) > 15
    tokens = []
    for action in world_options:
        tokens.append(action.option_strings[-1])
        if action.nargs != 0:
            tokens.append("7")
    got = StreamRecipe.from_command("thinkmem train " + " ".join(tokens))
    assert got == StreamRecipe(scenario="7", duration=7.0, streams=7, rate=7.0, window=7,
                               max_events=7, stride=7, group_seconds=7.0, seed=7)


@pytest.mark.parametrize(("command", "says"), [
    ("thinkmem train --streams many", "--streams"),
    ("thinkmem train --duration nan", "duration"),
    ("thinkmem train --s 3", "ambiguous"),
    ("thinkmem train --out 'unclosed", "closing quotation"),
    ("thinkmem train --scenario nowhere --duration 30", "unknown scenario 'nowhere'"),
    ("thinkmem train --duration 1 --window 32", "fewer than window=32"),
])
def test_a_world_recipe_that_cannot_be_rebuilt_is_a_rehearsal_error(
        husky_bundle, tmp_path, capsys, command, says):
    bundle = load_bundle(with_command(husky_bundle, tmp_path / "b", command))
    with pytest.raises(RehearsalError) as refused:
        load_rehearsal(bundle, tmp_path / "pub", RehearsalConfig(rebuild_streams=1))
    text = str(refused.value)
    assert says in text and text.startswith(f"bundle v{bundle.version}: ")
    assert "\n" not in text
    assert capsys.readouterr().err == ""  # argparse printed its usage before raising


def test_consolidator_once_says_an_unbuildable_recipe_in_one_line(husky_bundle, tmp_path,
                                                                  capsys):
    """It reached the CLI's last net: 'RehearsalError: ...', exit 1, as if a bug."""
    from cli_checks import assert_one_line, run

    from thinkmem_ros.consolidator.store import ExperienceStore
    from thinkmem_ros.link.experience import Experience, encode_experience
    from thinkmem_ros.link.security import write_signing_keypair

    bundle = with_command(husky_bundle, tmp_path / "b",
                          "thinkmem train --scenario nowhere --duration 30")
    m = load_bundle(bundle).manifest
    rng = np.random.default_rng(0)
    records = [Experience(
        robot_id="husky1", episode_id=f"husky1.b.{ep}", seq=ep * 5 + i,
        stamp=float(ep * 100 + i), labels=list(m.labels),
        window=rng.normal(0, 1, (m.window, len(m.signals))).astype(np.float32),
        probabilities=np.zeros(len(m.labels), np.float32), bundle_version=m.model_version,
        bundle_sha256=m.sha256, signal_set=m.signal_set, events=[],
        required=[label for label in m.labels if rng.random() < 0.3])
        for ep in range(40) for i in range(5)]
    with ExperienceStore(tmp_path / "c.db") as store:
        store.insert_many([(e, encode_experience(e)) for e in records])
    _, key = write_signing_keypair(tmp_path / "keys", "c")
    code, err = run(capsys, "consolidator", "--once", "--db", tmp_path / "c.db",
                    "--signing-key", key, "--publish-dir", tmp_path / "pub",
                    "--initial-bundle", bundle, "--epochs", "1")
    assert code == 2, err
    assert_one_line(code, err, "thinkmem consolidator: error:", "unknown scenario 'nowhere'")
    assert "RehearsalError" not in err
