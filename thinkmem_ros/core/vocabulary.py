"""The one definition of signal names and thinking labels shared by every side.

A bundle carries its own label list (retraining may add discovered labels such as
``consider:E016``); the tuples here are the base vocabulary the world generator and the
shipped default bundle use.
"""

from __future__ import annotations

SIGNALS: tuple[str, ...] = (
    "temperature",
    "current",
    "vibration",
    "distance",
    "visibility",
    "motion",
    "load",
)
"""Signal channels in the order every window, bag and bundle uses."""

THINKING: tuple[str, ...] = (
    "trend",
    "cause",
    "hazard",
    "future_impact",
    "information_seeking",
    "temp_current_inconsistency",
    "visibility_distance_check",
    "vibration_load_comparison",
    "late_change_inspection",
    "recovery_confirmation",
)
"""Base thinking vocabulary; see README 'Thinking vocabulary' for what each asks the LLM."""

THINKING_DESCRIPTIONS: dict[str, str] = {
    "trend": "analyse the direction and rate of change of the signals",
    "cause": "look for what is driving the change",
    "hazard": "assess whether the situation is becoming unsafe",
    "future_impact": "project where the situation is heading and what it affects",
    "information_seeking": "gather more evidence before deciding",
    "temp_current_inconsistency": "compare temperature against current: do they agree?",
    "visibility_distance_check": "examine visibility jointly with object distance",
    "vibration_load_comparison": "compare vibration against load",
    "late_change_inspection": "inspect a change that appeared late in the window",
    "recovery_confirmation": "confirm that the system is really recovering",
}

SAFETY_LABELS: frozenset[str] = frozenset({"hazard"})
"""Labels that value-based suppression must never remove once the policy activated them."""

DISCOVERED_PREFIX = "consider:"
"""Prefix of labels learned from discovered A...B...C rules ("consider possible C")."""


def signal_index(name: str) -> int:
    """Return the column of ``name`` in a window, raising a ValueError that lists valid names."""
    try:
        return SIGNALS.index(name)
    except ValueError:
        raise ValueError(f"unknown signal {name!r}; expected one of {list(SIGNALS)}") from None


def label_index(name: str, labels: tuple[str, ...] = THINKING) -> int:
    """Return the output column of ``name`` in ``labels`` with an error naming the bad label."""
    try:
        return labels.index(name)
    except ValueError:
        raise ValueError(
            f"unknown thinking label {name!r}; expected one of {list(labels)}") from None


EPISODE_START_EVENT = "episode_start"
"""Event on the events topic that opens a new episode (mission) on the robot."""
