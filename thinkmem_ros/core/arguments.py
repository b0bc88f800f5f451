"""The argument parser every command uses: a usage error is one line, as other errors are.

Why: argparse answers a bad option with its whole usage block (2-12 lines, more for
``thinkmem bench``) before the one line that says what was wrong. The project's rule for
bad input is one line on stderr and a non-zero exit; the usage stays one ``--help`` away,
and the line says so.
"""

from __future__ import annotations

import argparse
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors print one line (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def non_negative_int(text: str) -> int:
    """Argparse type: an integer >= 0 (a seed, a count).

    Raising ``ArgumentTypeError`` lets argparse put the option's name in front ("argument
    --seed: must be ..."); numpy's own refusal of a negative seed came only later and
    said "expected non-negative integer" without naming the option.
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value
