"""The training-set recipe: which world streams, windowed how, make a bundle's training set.

One definition, because two callers must agree to the row: ``thinkmem train`` builds its
training set from it, and the consolidator rebuilds a shipped bundle's rehearsal set D from
the recipe recorded in the bundle (``extras.command``). Two copies could drift apart and
rehearse on data the bundle was never trained on. Groups are ``group_seconds`` chunks of
each stream, so validation never shares a chunk with training.
"""

from __future__ import annotations

import argparse
import math
import shlex
from dataclasses import dataclass, fields
from typing import NoReturn

import numpy as np

from thinkmem_ros.core.arguments import non_negative_int
from thinkmem_ros.core.data import SituationSet
from thinkmem_ros.world.streams import generate_stream, stream_windows


class RecipeError(ValueError):
    """A recorded recipe cannot be read back."""


TRAINING_OPTIONS = ("--test-duration", "--preset", "--epochs", "--batch-size", "--lr",
                    "--patience", "--threads", "--model-version", "--out", "--signal-drop")
"""Options of a world ``thinkmem train`` command (besides the recipe's and the flag
``--no-progress``) that take a value and leave its training set as it is. A recorded
command with any other option is not a world recipe (``StreamRecipe.from_command``)."""


class _RecipeParser(argparse.ArgumentParser):
    """A parser whose every error raises ``argparse.ArgumentError``.

    ``exit_on_error=False`` alone still printed usage to stderr and exited for an
    ambiguous abbreviation.
    """

    def error(self, message: str) -> NoReturn:
        raise argparse.ArgumentError(None, message)


@dataclass(frozen=True)
class StreamRecipe:
    """World streams and windowing of a training set (the data half of ``thinkmem train``)."""

    scenario: str = "mixed"
    duration: float = 900.0
    streams: int = 8
    rate: float = 10.0
    window: int = 32
    max_events: int = 8
    stride: int = 3
    group_seconds: float = 60.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("duration", "streams", "rate", "window", "stride", "group_seconds"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):  # NaN passes a plain `<= 0`
                raise RecipeError(f"recipe {name} must be a finite number > 0, got {value}")
        frames = self.group_seconds * self.rate  # rounded to 0, a group divides by zero
        if not (math.isfinite(frames) and frames > 0.5):
            raise RecipeError(f"recipe group_seconds {self.group_seconds} is not a whole "
                              f"number of frames >= 1 at {self.rate} Hz")

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """The recipe's command-line options.

        The defaults here are the ones ``thinkmem train`` had when it recorded commands
        without every option (8 streams, K = 32): ``from_command`` must read those back as
        they were meant. ``thinkmem train`` sets its own defaults over them.
        """
        parser.add_argument("--scenario", default="mixed",
                            help="world scenario (streams.SCENARIOS)")
        parser.add_argument("--duration", type=float, default=900.0,
                            help="seconds per training stream")
        parser.add_argument("--streams", type=int, default=8, help="number of training streams")
        parser.add_argument("--rate", type=float, default=10.0, help="frame rate in Hz")
        parser.add_argument("--window", type=int, default=32, help="frames per situation (K)")
        parser.add_argument("--max-events", type=int, default=8, help="event slots (M)")
        parser.add_argument("--stride", type=int, default=3,
                            help="frames between training windows")
        parser.add_argument("--group-seconds", type=float, default=60.0,
                            help="stream chunk length that forms one validation group")
        parser.add_argument("--seed", type=non_negative_int, default=0)

    def arguments(self) -> list[str]:
        """The recipe as ``thinkmem train`` options, every one spelt out."""
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            out += [f"--{f.name.replace('_', '-')}",
                    f"{value:g}" if isinstance(value, float) else str(value)]
        return out

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> StreamRecipe:
        """The recipe part of parsed ``thinkmem train`` options."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})

    @classmethod
    def from_command(cls, command: str) -> StreamRecipe | None:
        """Read back a recorded ``thinkmem train ...`` command; None if it is not one.

        Only a command that trains on the synthetic world has a recipe: one that names an
        option this recipe does not know (``--bag``, ``--params``, ``--labels``: a robot's
        own recordings), or a stray argument, is None, as a command of another verb is.
        Why: the recipe's defaults filled in whatever such a command lacked, so a bundle
        trained on a Husky's recordings read back as 8 streams of the synthetic world,
        and a round rehearsed world data its policy was never trained on. A world command
        this parser cannot read (a bad value, an ambiguous abbreviation, broken quoting)
        raises ``RecipeError``.
        """
        try:
            tokens = shlex.split(command)
        except ValueError as exc:  # an unclosed quote
            raise RecipeError(f"cannot parse the recipe {command!r}: {exc}") from exc
        if tokens[:2] != ["thinkmem", "train"]:
            return None
        parser = _RecipeParser(add_help=False, exit_on_error=False)
        cls.add_arguments(parser)
        for option in TRAINING_OPTIONS:  # they train the policy, the data stays the same
            parser.add_argument(option)
        parser.add_argument("--no-progress", action="store_true")
        try:
            args, rest = parser.parse_known_args(tokens[2:])
        except (argparse.ArgumentError, SystemExit) as exc:
            raise RecipeError(f"cannot parse the recipe {command!r}: {exc}") from exc
        if rest:  # not a world training command: no recipe rebuilds its training set
            return None
        return cls.from_args(args)

    def rng_children(self) -> list[np.random.Generator]:
        """One generator per training stream plus one for the held-out stream (last)."""
        return np.random.default_rng(self.seed).spawn(self.streams + 1)

    def windows(self, streams: int | None = None) -> SituationSet:
        """The first ``streams`` training streams, windowed and grouped as training saw them."""
        children = self.rng_children()
        count = self.streams if streams is None else min(streams, self.streams)
        parts = []
        for i in range(count):
            stream = generate_stream(self.scenario, self.duration, self.rate, children[i])
            part = stream_windows(stream, self.window, stride=self.stride,
                                  max_events=self.max_events)
            group_frames = int(round(self.group_seconds * self.rate))
            chunk = np.asarray(part.meta["end_frames"]) // group_frames
            part.groups = i * 1_000_000 + chunk.astype(np.int64)
            parts.append(part)
        return SituationSet.concat(parts)
